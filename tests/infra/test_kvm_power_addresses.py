"""The kvm stack exports each node's power address (its libvirt domain) for the node power controller, under
Pulumi's mocks (the Pulumi CLI cannot be installed here)."""

from __future__ import annotations

import pytest

pytest.importorskip("pulumi_kubernetes", reason="infra extra not installed: pip install -e '.[infra]'")

from joulesched.live.actuators.base import parse_address  # noqa: E402
from joulesched.live.nodepower import load_addresses  # noqa: E402
from tests.infra.pulumi_harness import DYNAMIC, run_main, stack_config  # noqa: E402

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBn1 user@example"


def test_kvm_stack_exports_a_libvirt_address_per_node_naming_its_domain(tmp_path):
    rec = run_main(stack_config("kvm", sshPublicKey=KEY))
    domains = {r.inputs["name"] for r in rec.of_type(DYNAMIC) if "user_data" in r.inputs}
    addrs = rec.exports["power_addresses"]
    workers = {d for d in domains if not d.endswith("-master")}
    assert set(addrs) == workers and len(workers) == len(domains) - 1  # node name = hostname = domain name
    # (the master has no power address: whatever its labels, the controller cannot switch it)
    for node, text in addrs.items():
        a = parse_address(text)
        assert a.actuator == "libvirt" and a.path == node
    # As the controller's address map (a ConfigMap of this output), every entry is accepted.
    f = tmp_path / "addresses.yaml"
    f.write_text("".join(f"{k}: {v}\n" for k, v in addrs.items()))
    assert load_addresses(str(f)) == addrs
