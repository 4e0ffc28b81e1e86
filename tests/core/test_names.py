"""Kubernetes' name and label syntax (core/names.py), and the validators that use it and other anchored
patterns: a value with a trailing newline is refused everywhere (a ``$`` anchor let it through)."""

from __future__ import annotations

import pytest

from joulesched.core.names import is_dns_label, is_host_name, is_label_key, is_label_value


@pytest.mark.parametrize("value,ok", [("default", True), ("a", True), ("a-1", True), ("a" * 63, True),
                                      ("a" * 64, False), ("-a", False), ("a-", False), ("A", False),
                                      ("a_b", False), ("", False), ("default\n", False), ("dé", False)])
def test_dns_label(value, ok):
    assert is_dns_label(value) is ok


def test_dns_label_length_bound():
    assert is_dns_label("a" * 50, 50) and not is_dns_label("a" * 51, 50)


@pytest.mark.parametrize("key,ok", [("app", True), ("kubernetes.io/hostname", True), ("a/b/c", False),
                                    ("Example.com/x", False), ("x.io/" + "n" * 64, False), ("/x", False),
                                    ("x.io/app\n", False), ("app\n", False), ("a" * 254 + "/x", False)])
def test_label_key(key, ok):
    assert is_label_key(key) is ok


@pytest.mark.parametrize("value,ok", [("", True), ("v1.2_3", True), ("-v", False), ("v" * 64, False),
                                      ("v\n", False)])
def test_label_value(value, ok):
    assert is_label_value(value) is ok


def test_validators_refuse_a_trailing_newline():
    from joulesched.cluster.nodepower import DisruptionBudget
    from joulesched.cluster.scenario import Scenario
    from joulesched.workloads.manifests import check_namespace, check_quantity

    with pytest.raises(ValueError, match="not a valid namespace"):
        check_namespace("default\n")
    with pytest.raises(ValueError):
        check_quantity("500m\n", "--cpu")
    with pytest.raises(ValueError, match="a count"):
        DisruptionBudget(nodes="1\n")
    assert DisruptionBudget(nodes="1").nodes == "1"
    with pytest.raises(ValueError, match="label key"):
        Scenario.model_validate({"name": "s", "nodes": [{"name_prefix": "n", "count": 1, "cpu_m": 1000,
                                                         "memory_mi": 1024, "labels": {"app\n": "x"}}]})


def test_host_names_one_check_for_power_addresses_and_egress():
    for good in ("bmc-1", "BMC-1.Rack.example", "bmc.example.", "a" * 63):
        assert is_host_name(good), good
    for bad in ("", ".", "-bmc", "bmc-", "bmc_1", "a" * 64, "a..b", "b" * 254, "bmc/1"):
        assert not is_host_name(bad), bad
    assert is_host_name("my_sink", underscore=True) and not is_host_name("_sink", underscore=True)
