"""A key given twice in a file a user writes is an error naming its lines, in every reader (core/yamlio.py)."""

from __future__ import annotations

import os

import pytest

from joulesched.core import yamlio
from joulesched.core.errors import UsageError


def test_a_key_given_twice_names_both_lines_at_any_depth():
    with pytest.raises(yamlio.DuplicateKeyError, match=r"key 'a' is given twice \(lines 1 and 3\)") as e:
        yamlio.load("a: 1\nb: 2\na: 3\n")
    assert e.value.key == "a" and e.value.lines == (1, 3)
    assert str(e.value) == "key 'a' is given twice (lines 1 and 3)"  # nothing of the file's text after it
    with pytest.raises(yamlio.DuplicateKeyError, match=r"key 'lr' is given twice \(line 2\)"):
        yamlio.load("dqn:\n  {lr: 1, lr: 2}\n")
    with pytest.raises(yamlio.DuplicateKeyError, match="key 1 is given twice"):
        yamlio.load("- {1: a, 1: b}\n")


def test_what_safe_load_reads_is_read_the_same():
    # Merge keys may be overridden (that is what merging is for); equal keys in sibling mappings are fine.
    text = "base: &b {cpu_m: 1000, count: 2}\ngroups:\n  - <<: *b\n    count: 3\n  - {<<: *b, name: x}\n"
    assert yamlio.load(text) == {"base": {"cpu_m": 1000, "count": 2},
                                 "groups": [{"cpu_m": 1000, "count": 3}, {"cpu_m": 1000, "count": 2, "name": "x"}]}
    assert yamlio.load("") is None and yamlio.load("[1, 2]") == [1, 2]
    with pytest.raises(yamlio.yaml.YAMLError):  # still the safe loader
        yamlio.load("!!python/object:os.system x")


def _readers():
    from joulesched.agent.config import load_config
    from joulesched.cluster.fitted import load_fit
    from joulesched.cluster.kube.objects import load_profiles
    from joulesched.live.actuators.credentials import Credentials
    from joulesched.live.autoscaler import load_provider_config
    from joulesched.pipelines.sweep import load_grid
    from joulesched.power.calibrate import read_profile_curve

    curve = "[100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200]"
    return {
        "training config": (load_config, "dqn:\n  lr: 0.001\n  lr: 0.01\n"),
        "sweep grid": (load_grid, "scenarios: [a.yaml]\npolicies: [default-k8s]\nseeds: 1\nseeds: 2\n"),
        "workload fit": (load_fit, "format: joulesched-fitted-apps/1\nformat: joulesched-fitted-apps/1\n"),
        "power profiles": (load_profiles, f"xeon: {curve}\nxeon: {curve}\n"),
        "node profile": (read_profile_curve, f"name_prefix: a\npower_watts: {curve}\npower_watts: {curve}\n"),
        "autoscaler config": (load_provider_config, "nodeGroups: []\nnodeGroups: []\n"),
        "credentials": (Credentials.load, "default: {username: u, password: p}\ndefault: {username: v, password: q}\n"),
    }


@pytest.mark.parametrize("what", ["training config", "sweep grid", "workload fit", "power profiles", "node profile",
                                  "autoscaler config", "credentials"])
def test_every_reader_of_a_users_yaml_refuses_a_key_given_twice(tmp_path, what):
    read, text = _readers()[what]
    path = tmp_path / "in.yaml"
    path.write_text(text)
    os.chmod(path, 0o600)  # the credentials reader refuses a file others can read
    with pytest.raises(UsageError, match=r"given twice \(lines \d and \d\)") as e:
        read(path if what != "power profiles" else str(path))
    assert str(path) in str(e.value)
    if what == "credentials":  # nothing of a credentials file's text reaches the message
        assert "default" not in str(e.value) and "password" not in str(e.value)



def test_exponents_read_as_numbers_as_yaml_1_2_does_and_safe_load_is_left_alone():
    """PyYAML's YAML 1.1 rules read 1e9 as a string: a fit's rate of 1e9 was refused as no number, and
    `--set dqn.hidden=1e9` said "unable to parse string as an integer" (a review)."""
    import yaml

    from joulesched.core import yamlio

    doc = yamlio.load("a: 1e9\nb: 1.0e9\nc: -2E-3\nd: .5e3\ne: 12\nf: 1e\ng: e9\nh: '1e9'\n")
    assert doc == {"a": 1e9, "b": 1e9, "c": -0.002, "d": 500.0, "e": 12, "f": "1e", "g": "e9", "h": "1e9"}
    assert yaml.safe_load("a: 1e9") == {"a": "1e9"}  # the shared SafeLoader's table was not changed
