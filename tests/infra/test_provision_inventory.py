"""`joulesched infra provision` with an inventory Ansible cannot use: the real ansible-runner, against hosts that
are local connections. Ansible only warns about an inventory it cannot parse and then runs against no host,
"successfully"; provisioning says what is wrong with the file and exits 2 instead of printing an empty table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from joulesched.pipelines.cli.infra import app

pytest.importorskip("ansible_runner", reason="ansible-runner not installed (pip install -e '.[infra]')")

runner = CliRunner()


@pytest.mark.parametrize("text, message", [
    ("all:\n  hosts:\n    a: {ansible_host: [1,\n", "not a valid Ansible inventory: invalid YAML"),
    ("all:\n  children: [power_hosts, kube_workers]\n", "not a valid Ansible inventory"),
    ("- power_hosts\n", "not a valid Ansible inventory: the top level must be a mapping"),
])
def test_an_inventory_that_does_not_parse_exits_2_naming_the_file(tmp_path, text, message):
    inv = tmp_path / "bad.yml"
    inv.write_text(text)
    r = runner.invoke(app, ["provision", "--inventory", str(inv), "--check"])
    assert r.exit_code == 2, r.output
    assert f"{inv}: {message}" in " ".join(r.output.split())
    assert "status=successful" not in r.output


def test_hosts_that_no_play_targets_exit_2(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    lone: {ansible_connection: local, "
                   f"ansible_python_interpreter: {sys.executable}}}\n")
    r = runner.invoke(app, ["provision", "--inventory", str(inv), "--check"])
    assert r.exit_code == 2, r.output
    assert "no play of site.yml matched any of its hosts" in " ".join(r.output.split())
    assert "status=successful" not in r.output


def test_ansible_itself_is_told_to_fail_on_an_unparsed_inventory(monkeypatch, tmp_path):
    """Past the up-front check (patched out here), the run itself fails rather than running against no host."""
    from joulesched.infra.provision import provision

    monkeypatch.setattr("joulesched.infra.remote.inventory_host_names", lambda path, limit=None: [])
    inv = tmp_path / "bad.yml"
    inv.write_text("all:\n  children: [power_hosts]\n")
    r = provision(inv, check=True, timeout_s=120)
    assert r.rc != 0 and not r.succeeded and r.status == "failed", r.stdout[-3000:]


def test_json_with_verbose_keeps_ansibles_stream_off_stdout(tmp_path):
    """The real ansible-runner streams the play to stdout with --verbose; under --json it goes to stderr and stdout
    is one JSON document (a tag no task has: the play gathers facts on the local host and nothing else)."""
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    power_hosts:\n      hosts:\n        lone: {ansible_connection: local, "
                   f"ansible_python_interpreter: {sys.executable}}}\n")
    r = runner.invoke(app, ["provision", "--inventory", str(inv), "--check", "--tags", "no_such_tag", "--json",
                            "--verbose"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["status"] == "successful" and doc["succeeded"] is True and doc["failed"] == 0
    assert [h["host"] for h in doc["hosts"]] == ["lone"] and doc["hosts"][0]["ok"] >= 1
    assert "PLAY RECAP" in r.stderr


@pytest.mark.parametrize("name, text, message", [
    ("all.yml", "ansible_user: [unclosed\n", "all.yml: not valid YAML (line 2)"),
    ("power_hosts/main.yml", "- a list\n", "main.yml: variables must be a mapping, not a list"),
])
def test_a_broken_group_vars_file_exits_2_naming_it(tmp_path, name, text, message):
    """Ansible reported it as a failed play with an empty summary and no file name (exit 1)."""
    inv = tmp_path / "inv"
    (inv / "group_vars" / Path(name).parent).mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yml").write_text("all:\n  children:\n    power_hosts:\n      hosts:\n        h1.invalid: {}\n")
    (inv / "group_vars" / name).write_text(text)
    (inv / "group_vars" / "tagged.yml").write_text("secret: !unsafe '{{ not templated }}'\n")  # Ansible's tags pass
    r = runner.invoke(app, ["provision", "--inventory", str(inv), "--check"])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()) and "Traceback" not in r.output


def test_vault_encrypted_group_vars_pass_the_up_front_check(monkeypatch, tmp_path):
    """The up-front check reads hosts and groups only: group_vars that only ansible-playbook can decrypt (given
    ANSIBLE_VAULT_PASSWORD_FILE) do not stop the run. The vault is made with the ansible-vault CLI, so this
    process never imports ansible (which would break a later torch import)."""
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  children:\n    power_hosts:\n      hosts:\n        lone: {}\n")
    (inv / "group_vars" / "all.yml").write_text(
        f"ansible_connection: local\nansible_python_interpreter: {sys.executable}\nsecret_token: s3cret\n")
    password = tmp_path / "vault-pass"
    password.write_text("correct horse\n")
    subprocess.run([str(Path(sys.executable).parent / "ansible-vault"), "encrypt", "--vault-password-file",
                    str(password), str(inv / "group_vars" / "all.yml")], check=True, capture_output=True)
    assert (inv / "group_vars" / "all.yml").read_text().startswith("$ANSIBLE_VAULT;")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password))
    r = runner.invoke(app, ["provision", "--inventory", str(inv), "--limit", "power_hosts", "--check", "--tags",
                            "no_such_tag", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["succeeded"] is True and [h["host"] for h in doc["hosts"]] == ["lone"]
