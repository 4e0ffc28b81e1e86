"""The kube_node role's filter: do two power addresses switch the same machine?

The node power controller refuses a machine that two nodes claim however the addresses are spelled (case, IP
notation, a default port written out or not, a trailing slash; ``joulesched.live.actuators.access.machine_keys``).
The role refuses the same before it writes the map, by the controller's own rule: it ships with joulesched, and
Ansible runs these filters on the controller host, where joulesched is installed.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

try:
    from joulesched.live.actuators.access import machine_keys
    from joulesched.live.actuators.base import AddressError, parse_address
except ImportError as e:  # pragma: no cover - the role is run from joulesched's environment
    raise ImportError(f"the kube_node role's power address checks need joulesched installed where Ansible runs ({e})")


def _keys(address: str, node: str) -> set[tuple[str, str]]:
    return set(machine_keys(parse_address(address), node))


def power_same_machine(address: str, node: str, others: dict) -> list[str]:
    """The labels of ``others`` (label -> address, or label -> [node, address]) whose address switches a machine
    ``address`` (of ``node``) switches. ``address`` malformed: an error naming it; another malformed entry is no
    match (the controller refuses it on its own)."""
    try:
        mine = _keys(str(address), str(node))
    except AddressError as e:
        raise AnsibleFilterError(f"kube_node_power_address of {node}: {e}") from None
    same = []
    for label, value in (others or {}).items():
        other_node, other = (value if isinstance(value, (list, tuple)) else (label, value))
        try:
            if mine & _keys(str(other), str(other_node)):
                same.append(str(label))
        except AddressError:
            continue
    return sorted(same)


class FilterModule:
    def filters(self) -> dict:
        return {"power_same_machine": power_same_machine}
