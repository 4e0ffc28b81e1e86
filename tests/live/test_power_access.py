"""The operator decides where power is switched (live/actuators/access.py), credentials are keyed by node or
host with no default for annotated addresses, credential files and Secret mounts are permission-checked, and
no error carries an address's password."""

from __future__ import annotations

import os
import re

import pytest

from joulesched.live.actuators.access import AccessError, AddressPolicy, host_matches
from joulesched.live.actuators.base import AddressError, Target, parse_address
from joulesched.live.actuators.credentials import Credentials, CredentialsError, Login


def resolve(policy, nodes, addresses=None):
    return policy.resolve_all(nodes, addresses or {})


def test_nothing_annotated_is_allowed_by_default():
    nodes = {"a": ("redfish://10.0.9.7/redfish/v1/Systems/1", ""), "b": ("ipmi://10.0.9.8", ""),
             "c": ("wol://52:54:00:12:34:56?ssh=10.0.2.3", ""), "d": ("aws://i-0abc", "aws:///us-east-1a/i-0abc"),
             "e": ("libvirt:///e", "")}
    out = resolve(AddressPolicy(), nodes)
    assert all(r.address is None and r.source == "annotation" and r.refused for r in out.values())
    assert "allow-list" in out["a"].refused and "allow-list" in out["d"].refused


def test_allow_lists_per_scheme():
    pol = AddressPolicy.from_options(["redfish=10.0.9.0/24", "ipmi=bmc-8.example:623", "wol=10.0.2.3",
                                      "wol=10.0.2.255", "aws=*", "libvirt=*"])
    # BMCs named by host name are resolved apart: with others named by IP, any of them could be one of those.
    named = resolve(pol, {"b": ("ipmi://BMC-8.example:623", ""), "b2": ("ipmi://bmc-8.example:624", "")})  # port
    assert named["b"].address is not None and named["b2"].address is None
    nodes = {"a": ("redfish://10.0.9.7/redfish/v1/Systems/1", ""),
             "a2": ("redfish://10.0.8.7/redfish/v1/Systems/1", ""),  # outside the CIDR
             "c": ("wol://52:54:00:12:34:56?ssh=10.0.2.3&broadcast=10.0.2.255", ""),
             "c2": ("wol://52:54:00:12:34:57?ssh=10.0.2.3", ""),  # default broadcast not listed
             "d": ("aws://i-0abc", "aws:///us-east-1a/i-0abc"), "d2": ("aws://i-0def", "aws:///us-east-1a/i-0abc"),
             "d3": ("aws://i-0aaa", ""),  # no providerID: an annotation cannot be checked against it
             "e": ("libvirt:///e", ""), "e2": ("libvirt:///control-plane", "")}
    out = resolve(pol, nodes)
    assert {n for n, r in out.items() if r.address is not None} == {"a", "c", "d", "e"}
    assert "10.0.2.255" not in out["c2"].refused and "255.255.255.255" in out["c2"].refused
    assert "providerID" in out["d2"].refused and "own name" in out["e2"].refused


def test_the_map_wins_and_owns_its_machines():
    pol = AddressPolicy.from_options(["ipmi=10.0.9.0/24"])
    out = resolve(pol, {"a": ("ipmi://10.0.9.8", ""), "b": ("ipmi://10.0.9.9", ""), "c": ("ipmi://10.0.9.5", ""),
                        "d": ("ipmi://10.0.9.5", "")},
                  {"a": "ipmi://10.0.9.7", "x": "ipmi://10.0.9.9"})
    assert out["a"].address.host == "10.0.9.7" and out["a"].source == "map"
    assert out["b"].address is None and "gives that machine to node x" in out["b"].refused  # another node's BMC
    assert out["c"].address is None and "claim the same machine" in out["c"].refused
    aws = resolve(AddressPolicy(), {"m": ("", "aws:///z/i-1"), "n": ("", "")}, {"m": "aws://i-2", "n": "aws://i-3"})
    assert aws["m"].address is None and "providerID" in aws["m"].refused and aws["n"].address.host == "i-3"


POLICY = ["ipmi=10.0.9.0/24", "ipmi=::ffff:0:0/96", "redfish=10.0.9.0/24", "wol=10.0.2.0/24",
          "wol=255.255.255.255"]
MAP = {"z": "ipmi://10.0.9.7", "r": "redfish://10.0.9.8/redfish/v1/Systems/1",
       "w": "wol://52:54:00:00:00:0a?ssh=10.0.2.9"}


@pytest.mark.parametrize("claim", [
    "ipmi://10.0.9.7:623",  # the map's BMC with its default port written out
    "ipmi://[::ffff:10.0.9.7]",  # IPv4-mapped IPv6
    "redfish://10.0.9.8:443/redfish/v1/Systems/1/",  # default port, trailing slash
    "redfish://10.0.9.8/redfish/v1/Systems//1",
    "wol://52:54:00:00:00:01?ssh=10.0.2.9",  # another MAC, but the SSH endpoint that suspends w
    "wol://52:54:00:00:00:02?ssh=10.0.2.9:22",
    "wol://52-54-00-00-00-0A?ssh=10.0.2.200",  # w's MAC in another spelling
    # A review: one BMC serves IPMI and Redfish, HTTPS and plain HTTP, for one machine
    "redfish://10.0.9.7/redfish/v1/Systems/1",  # z's BMC, by the other protocol
    "ipmi://10.0.9.8",  # r's BMC, likewise
])
def test_no_spelling_of_a_mapped_machine_lets_another_node_claim_it(claim):
    out = resolve(AddressPolicy.from_options(POLICY), {"y": (claim, ""), **{n: ("", "") for n in MAP}}, MAP)
    assert out["y"].address is None and "gives that machine to node" in out["y"].refused, out["y"]
    assert all(out[n].address is not None for n in MAP)  # the map's own stand


@pytest.mark.parametrize("claim", [
    "ipmi://10.0.9.7:6230",  # VirtualBMC: one port per VM on one host
    "redfish://10.0.9.8/redfish/v1/Systems/2",  # a chassis manager or sushy-tools: one system per path
    "wol://52:54:00:00:00:0b?ssh=10.0.2.9:2202",  # one SSH port per machine forwarded by a gateway
])
def test_other_machines_behind_one_host_are_not_refused(claim):
    out = resolve(AddressPolicy.from_options(POLICY), {"y": (claim, ""), **{n: ("", "") for n in MAP}}, MAP)
    assert out["y"].address is not None and out["y"].source == "annotation", out["y"]


def test_two_annotations_naming_one_machine_differently_are_both_refused():
    pol = AddressPolicy.from_options(["ipmi=10.0.9.0/24", "redfish=10.0.9.0/24", "wol=10.0.2.0/24",
                                      "wol=255.255.255.255"])
    out = resolve(pol, {"a": ("ipmi://10.0.9.5", ""), "b": ("ipmi://10.0.9.5:623", ""),
                        "c": ("wol://52:54:00:00:00:03?ssh=10.0.2.4", ""),
                        "d": ("wol://52:54:00:00:00:04?ssh=10.0.2.4:22", ""),
                        "e": ("ipmi://10.0.9.6", ""), "f": ("ipmi://10.0.9.6:6230", ""),
                        "g": ("ipmi://10.0.9.11", ""), "h": ("redfish://10.0.9.11/redfish/v1/Systems/1", "")})
    for n in "abcdgh":
        assert out[n].address is None and "claim the same machine" in out[n].refused, (n, out[n])
    assert out["e"].address is not None and out["f"].address is not None  # machines nobody else names


@pytest.mark.parametrize("first, second", [
    ("redfish://10.0.0.5/redfish/v1/Systems/1", "redfish://10.0.0.5:443/redfish/v1/Systems/1/"),
    ("ipmi://10.0.0.9", "ipmi://10.0.0.9:623"),
])
def test_two_map_entries_naming_one_machine_are_refused(tmp_path, first, second):
    """A review: the map took the last of two entries naming one machine however written, so an idle worker-2
    switched off worker-1's machine, pods and all. The file is refused (the last good map stays in force); a map
    given in memory leaves both nodes without an address."""
    from joulesched.live.daemon import DaemonInputError
    from joulesched.live.nodepower import load_addresses

    p = tmp_path / "map.yaml"
    p.write_text(f"worker-1: {first}\nworker-2: {second}\nworker-3: ipmi://10.0.0.10\n")
    with pytest.raises(DaemonInputError, match="nodes worker-1 and worker-2 name the same machine"):
        load_addresses(str(p), AddressPolicy())
    got = AddressPolicy().resolve_all({n: ("", "") for n in ("worker-1", "worker-2", "worker-3")},
                                      {"worker-1": first, "worker-2": second, "worker-3": "ipmi://10.0.0.10"})
    assert got["worker-1"].address is None and "node worker-2's" in got["worker-1"].refused
    assert got["worker-2"].address is None and "node worker-1's" in got["worker-2"].refused
    assert got["worker-3"].address is not None


def test_redfish_http_only_with_the_flag():
    nodes = {"a": ("", "")}
    amap = {"a": "redfish+http://10.0.9.7/redfish/v1/Systems/1"}
    assert resolve(AddressPolicy(), nodes, amap)["a"].address is None
    assert resolve(AddressPolicy(allow_redfish_http=True), nodes, amap)["a"].address is not None
    with pytest.raises(AccessError, match="--allow-redfish-http"):
        AddressPolicy().check_map_entry("a", parse_address(amap["a"]))


@pytest.mark.parametrize("bad", ["redfish", "gopher=10.0.0.1", "ipmi=", "ipmi=10.0.0.0/33"])
def test_bad_patterns_are_named(bad):
    with pytest.raises(AccessError, match="--allow-annotated"):
        AddressPolicy.from_options([bad])


def test_host_matching():
    assert host_matches("10.0.0.5:623", "10.0.0.0/24") and not host_matches("bmc:623", "10.0.0.0/24")
    assert host_matches("[fe80::1]:623", "fe80::1") and host_matches("Bmc.Example", "bmc.example")
    assert not host_matches("10.0.0.5:623", "10.0.0.5:624") and host_matches("10.0.0.5:623", "10.0.0.5")


def test_addresses_never_echo_a_password():
    with pytest.raises(AddressError) as e:
        parse_address("redfish://admin:hunter2-secret@bmc/redfish/v1/Systems/1")
    assert "hunter2-secret" not in str(e.value) and "<redacted>@bmc" in str(e.value)
    with pytest.raises(AddressError) as e:
        parse_address("gopher://u:hunter2-secret@bmc/")
    assert "hunter2-secret" not in str(e.value)


def test_logins_by_node_then_host_and_no_default_for_annotations(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("nodes: {w7: {username: n, password: p1}}\n"
                 "hosts: {'10.0.0.5:623': {username: h, password: p2}}\n"
                 "default: {username: d, password: p3}\n")
    f.chmod(0o600)
    c = Credentials.load(f)
    t = lambda node, host, src: Target(node, parse_address(f"ipmi://{host}"), source=src)  # noqa: E731
    assert c.login(t("w7", "10.0.0.9", "annotation")).username == "n"
    assert c.login(t("w1", "10.0.0.5:623", "annotation")).username == "h"
    assert c.login(t("w1", "10.0.0.6", "annotation")) is None  # nobody listed it: no silent default
    assert c.login(t("w1", "10.0.0.6", "map")).username == "d"


def _secret_mount(root, mode):
    """A Secret volume as the kubelet's atomic writer makes it: ..data -> ..TIMESTAMP/, keys -> ..data/KEY."""
    ts = root / "..2026_12_01_20_00_00.1"
    ts.mkdir(parents=True)
    for k, v in (("username", "root"), ("password", "pw")):
        (ts / k).write_text(v)
        (ts / k).chmod(mode)
    os.symlink(ts.name, root / "..data")
    for k in ("username", "password"):
        os.symlink(f"..data/{k}", root / k)
    return root


def test_credential_directories_and_secret_mounts_are_permission_checked(tmp_path):
    ok = _secret_mount(tmp_path / "ok", 0o440)  # defaultMode 0440 with fsGroup: group-readable is fine
    assert Credentials.load(ok).default.password == "pw"
    world = _secret_mount(tmp_path / "world", 0o444)
    with pytest.raises(CredentialsError, match="readable by other users"):
        Credentials.load(world)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "username").write_text("root")
    (plain / "username").chmod(0o640)
    with pytest.raises(CredentialsError, match="readable by other users"):
        Credentials.load(plain)  # not a Secret mount: group-readable is refused
    # A symlink whose text contains "..data" but which leaves its directory is not a Secret mount.
    outside = tmp_path / "elsewhere" / "..data"
    outside.mkdir(parents=True)
    (outside / "creds.yaml").write_text("default: {username: a, password: b}\n")
    (outside / "creds.yaml").chmod(0o644)
    link = tmp_path / "creds.yaml"
    os.symlink(outside / "creds.yaml", link)
    with pytest.raises(CredentialsError, match="readable by other users"):
        Credentials.load(link)


def test_login_repr_hides_the_password():
    assert "pw" not in repr(Login("u", "pw")) and "pw" not in repr(Credentials(Login("u", "pw")))


@pytest.mark.parametrize("claim", [
    "redfish://10.0.9.8/redfish/v1/Systems/1/../1",  # sushy's urljoin requests Systems/1
    "redfish://10.0.9.8/redfish/v1/Systems/2/../1",
    "redfish://10.0.9.8/redfish/v1/Systems/./1",
    "redfish://10.0.9.8/redfish/v1/Systems/%31",  # '1', percent-encoded
    "redfish://10.0.9.8:0443/redfish/v1/Systems/1",  # urllib3 reads 0443 as 443
    "ipmi://10.0.9.7:0623",  # int("0623") is 623
    "ipmi://010.0.9.7", "ipmi://167774471", "ipmi://0x0a.0.9.7",  # 10.0.9.7 to the C resolver
])
def test_spellings_a_library_reads_as_a_mapped_machine_are_refused(claim):
    """Found by a review (2026-12-06): each of these passed the one-machine-one-node check, so a node could point
    its own sleeps at the machine the operator's map gives another node. Refused as addresses now, whatever
    their source."""
    with pytest.raises(AddressError):
        parse_address(claim)
    out = resolve(AddressPolicy.from_options(POLICY), {"y": (claim, ""), **{n: ("", "") for n in MAP}}, MAP)
    assert out["y"].address is None and out["y"].refused, out["y"]
    assert all(out[n].address is not None for n in MAP)


@pytest.mark.parametrize("text", ["redfish://[::1", "redfish://[zz]/redfish/v1/Systems/1",
                                  "redfish://bmc\uff03x/redfish/v1/Systems/1", "ipmi://u:secret@[::1"])
def test_an_unparsable_annotation_refuses_that_node_only(text):
    """A kubelet may write its Node's annotations: `redfish://[::1` raised a plain ValueError (from redacting
    the message of the first), which stopped every reconcile pass: nothing slept or woke anywhere."""
    with pytest.raises(AddressError) as e:
        parse_address(text)
    assert "secret" not in str(e.value)
    out = resolve(AddressPolicy.from_options(POLICY), {"y": (text, ""), **{n: ("", "") for n in MAP}}, MAP)
    assert out["y"].address is None and out["y"].source == "annotation" and out["y"].refused
    assert all(out[n].address is not None for n in MAP)


@pytest.mark.parametrize("text,needle", [
    ("ipmi://10.0.0.1:abc", "port 'abc' is not a number in 1..65535"),
    ("ipmi://10.0.0.1:99999", "port '99999'"), ("ipmi://10.0.0.1:", "an empty port"),
    ("wol://zz", "'zz' is not a MAC address"),
    ("wol://52:54:00:00:00:0a?ssh=10.0.2.9:x", "ssh=10.0.2.9:x: port 'x'"),
    ("wol://52:54:00:00:00:0a?broadcast=everyone", "broadcast=everyone: not an IP address"),
    ("wol://52:54:00:00:00:0a?port=0", "port=0: not a number"),
    ("wol://52:54:00:00:00:0a?user=root;x", "not a user name"),
    ("wol://52:54:00:00:00:0a?sssh=10.0.2.9", "unknown parameter(s) sssh"),
    ("wol://52:54:00:00:00:0a?ssh=a&ssh=b", "a parameter is given twice"),
    ("ipmi://10.0.0.1/path", "an IPMI address has no path"),
    ("redfish://bmc/redfish/v1/Systems/1/Actions", "one segment of ID"),
    ("redfish://bmc_1/redfish/v1/Systems/1", "neither an IP address in standard notation nor a host name"),
])
def test_map_entries_that_could_never_work_are_refused_at_load(text, needle, tmp_path):
    """These started the controller and failed at the first sleep, after the node was cordoned and tainted
    (int('abc') in the IPMI actuator): the node was left `sleeping` and unschedulable."""
    from joulesched.live.daemon import DaemonInputError
    from joulesched.live.nodepower import load_addresses

    with pytest.raises(AddressError, match=re.escape(needle)):
        parse_address(text)
    path = tmp_path / "map.yaml"
    path.write_text(f'n1: "{text}"\n')
    with pytest.raises(DaemonInputError, match=f"node n1: .*{re.escape(needle)}"):
        load_addresses(str(path), AddressPolicy())


@pytest.mark.parametrize("key", ["010", "0x1f", "on", "~", "1.10"])
def test_map_keys_yaml_reads_as_other_names_are_refused(key, tmp_path):
    """010 became node 8 and on became node True: the entry silently applied to another node."""
    from joulesched.live.daemon import DaemonInputError
    from joulesched.live.nodepower import load_addresses

    path = tmp_path / "map.yaml"
    path.write_text(f"{key}: ipmi://10.0.9.7\n")
    with pytest.raises(DaemonInputError, match="not a node name; quote it"):
        load_addresses(str(path), AddressPolicy())
    path.write_text(f'"{key}": ipmi://10.0.9.7\n')
    assert load_addresses(str(path), AddressPolicy()) == {key: "ipmi://10.0.9.7"}
    path.write_text("n1: 5\n")
    with pytest.raises(DaemonInputError, match="must be a string, not int"):
        load_addresses(str(path), AddressPolicy())


def test_an_annotation_may_not_choose_the_ssh_user():
    pol = AddressPolicy.from_options(["wol=10.0.2.0/24", "wol=255.255.255.255"])
    out = resolve(pol, {"a": ("wol://52:54:00:00:00:03?ssh=10.0.2.4&user=root", ""),
                        "b": ("wol://52:54:00:00:00:04?ssh=10.0.2.5", ""), "m": ("", "")},
                  {"m": "wol://52:54:00:00:00:05?ssh=10.0.2.6&user=ops"})
    assert out["a"].address is None and "may not choose the SSH user" in out["a"].refused
    assert out["b"].address is not None and out["m"].address is not None  # the map may


def test_credentials_that_are_not_utf8_are_one_line(tmp_path):
    f = tmp_path / "creds.yaml"
    f.write_bytes(b"default: {username: admin, password: \xff\xfe}\n")
    f.chmod(0o600)
    with pytest.raises(CredentialsError, match="not UTF-8 text") as e:
        Credentials.load(f)
    assert "\\xff" not in str(e.value)
    d = tmp_path / "mount"
    d.mkdir()
    (d / "username").write_text("admin")
    (d / "password").write_bytes(b"\xff\xfe")
    for p in (d / "username", d / "password"):
        p.chmod(0o600)
    with pytest.raises(CredentialsError, match="must be UTF-8 text"):
        Credentials.load(d)


def test_several_nodes_may_be_mapped_to_none(tmp_path):
    """``none`` (cordon only) switches no machine: two nodes mapped to it are no clash (a review: every ``none``
    entry "named the same machine" and the map was refused)."""
    from joulesched.live.nodepower import load_addresses

    p = tmp_path / "map.yaml"
    p.write_text("worker-1: none\nworker-2: none\n")
    assert load_addresses(str(p), AddressPolicy()) == {"worker-1": "none", "worker-2": "none"}
    got = AddressPolicy().resolve_all({"worker-1": ("", ""), "worker-2": ("", "")},
                                      {"worker-1": "none", "worker-2": "none"})
    assert got["worker-1"].address is not None and got["worker-2"].address is not None


def test_the_maps_redfish_system_over_plain_http_is_the_same_machine():
    pol = AddressPolicy.from_options(POLICY, allow_redfish_http=True)
    out = resolve(pol, {"y": ("redfish+http://10.0.9.8/redfish/v1/Systems/1", ""), **{n: ("", "") for n in MAP}},
                  MAP)
    assert out["y"].address is None and "gives that machine to node r" in out["y"].refused, out["y"]


def test_the_map_may_reach_one_host_by_ipmi_for_one_guest_and_redfish_for_another():
    """A hypervisor serving VirtualBMC for some guests and sushy-tools for others: the operator's map says so,
    and it is used; a node's own annotation may not do the same against the map's BMC."""
    amap = {"g1": "ipmi://10.0.9.20:6230", "g2": "redfish://10.0.9.20:8000/redfish/v1/Systems/abc"}
    pol = AddressPolicy.from_options(["ipmi=10.0.9.0/24", "redfish=10.0.9.0/24"])
    out = resolve(pol, {"g1": ("", ""), "g2": ("", ""), "y": ("ipmi://10.0.9.20", ""),
                        "z": ("ipmi://10.0.9.21", "")}, amap)
    assert out["g1"].address is not None and out["g2"].address is not None
    assert out["y"].address is None and "gives that machine to node" in out["y"].refused
    assert out["z"].address is not None  # a BMC of its own, whatever the map's two share
