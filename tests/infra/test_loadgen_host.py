"""Host checks for a provisioned load generator (testinfra), the jmeter role's result. Runs against any inventory:

    pytest tests/infra/test_loadgen_host.py --hosts=ansible://all --ansible-inventory=inventory/hosts.yml

Hosts outside the `loadgen` group are skipped (each says so). Without --hosts every test skips: they check a
remote host, never the machine running pytest by accident.
"""

from __future__ import annotations

import pytest

DEFAULTS = {"jmeter_plan_dir": "/opt/joulesched/jmeter", "jmeter_test_plans": ["test-app.jmx"]}


@pytest.fixture
def settings(request, host) -> dict:
    if not request.config.getoption("hosts", None):
        pytest.skip("host checks need a target: --hosts=ansible://all --ansible-inventory=INVENTORY "
                    "(tests/infra/test_systemd_target.py runs them against a container it provisions)")
    values = dict(DEFAULTS)
    if host.backend.NAME == "ansible":
        v = host.ansible.get_variables()
        if "loadgen" not in v.get("group_names", []):
            pytest.skip(f"{v.get('inventory_hostname')} is not in the loadgen group")
        values.update({k: v[k] for k in DEFAULTS if k in v})
    return values


def test_jmeter_and_a_jre_are_installed(host, settings):
    for pkg in ("jmeter", "jmeter-http", "default-jre-headless"):
        assert host.package(pkg).is_installed, pkg


def test_jmeter_runs_on_the_jre(host, settings):
    r = host.run("jmeter --version")
    assert r.rc == 0, r.stderr
    assert "2.13" in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_test_plans_are_in_place(host, settings):
    d = host.file(settings["jmeter_plan_dir"])
    assert d.is_directory and d.user == "root" and d.mode == 0o755
    for plan in settings["jmeter_test_plans"]:
        f = host.file(f"{settings['jmeter_plan_dir']}/{plan.rsplit('/', 1)[-1]}")
        assert f.is_file and f.mode == 0o644, plan
        assert "<jmeterTestPlan" in f.content_string, plan
