"""Host-side pipeline steps over SSH (pipelines/remote.py) against a REAL OpenSSH server on loopback.

The "host" is this machine: sshd (tests/support/sshd.py) runs on 127.0.0.1 with per-run keys, so the remote
joulesched is this checkout's. Calibration runs the real ``joulesched power calibrate`` (real burner, real
/proc/stat) against a synthetic powercap tree whose package counter a thread here advances in real time at a
constant 100 W, since these machines have no RAPL.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import paramiko
import pytest
import yaml

from joulesched.infra.remote import (
    DEFAULT_JOULESCHED,
    DEFAULT_UNITS,
    HostSpec,
    RemoteError,
    calibrate,
    collect_logs,
    connect,
    hosts_from_inventory,
    read_exporter,
    run,
)
from tests.support.procs import free_port, stop_process, wait_for
from tests.support.sshd import keygen, known_hosts_line, sshd_server
from tests.support.sysfs import SyntheticPowercap

REPO = Path(__file__).resolve().parents[2]
JOULESCHED = str(Path(sys.executable).parent / "joulesched")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    with sshd_server(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_agent(monkeypatch):
    """Keys come from the spec only: an agent of the person running the tests must not help."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def _spec(sshd, **kw) -> HostSpec:
    fields = dict(name="testhost", address=sshd.address, port=sshd.port, user=sshd.user, key_file=sshd.client_key,
                  joulesched=JOULESCHED)
    return HostSpec(**(fields | kw))


@pytest.fixture
def conn(sshd):
    c = connect(_spec(sshd), sshd.known_hosts)
    yield c
    c.close()


def _fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


def _new_log(sshd, since: int) -> str:
    return sshd.log_text()[since:]


# ------------------------------------------------------------------------------------------- connecting

def test_connects_with_the_key_checks_the_host_key_and_quotes_arguments(sshd, conn):
    assert isinstance(conn.client._policy, paramiko.RejectPolicy)  # fabric's AutoAddPolicy is gone
    tricky = "a b; echo INJECTED $HOME 'q' \"d\" `id`"
    assert run(conn, ["printf", "%s", tricky]).stdout == tricky
    assert "Accepted publickey for root" in sshd.log_text()


def test_an_unknown_host_key_is_refused(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(RemoteError) as e:
        connect(_spec(sshd), empty)
    msg = str(e.value)
    assert "testhost" in msg and "host key is unknown" in msg and "refusing to connect" in msg
    assert _fingerprint(sshd.host_key_pub) in msg  # what to compare with the host's own key
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1" in msg and str(empty) in msg
    assert empty.read_text() == ""  # refused, not learned


def test_a_changed_host_key_is_refused(sshd, tmp_path):
    other = keygen(tmp_path / "other_host_key")
    wrong = tmp_path / "known_hosts"
    wrong.write_text(known_hosts_line("127.0.0.1", sshd.port, Path(f"{other}.pub")))
    with pytest.raises(RemoteError) as e:
        connect(_spec(sshd), wrong)
    msg = str(e.value)
    assert "host key does NOT match" in msg and "refusing to connect" in msg
    assert _fingerprint(sshd.host_key_pub) in msg and _fingerprint(Path(f"{other}.pub")) in msg
    assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}'" in msg


def test_a_missing_known_hosts_file_is_an_error_not_a_blank_check(sshd, tmp_path):
    with pytest.raises(RemoteError, match="known_hosts file .* does not exist; check the host's key"):
        connect(_spec(sshd), tmp_path / "nope")


def test_without_a_file_the_users_known_hosts_decides(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(RemoteError, match="host key is unknown"):
        connect(_spec(sshd), None)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "known_hosts").write_text(sshd.known_hosts.read_text())
    with connect(_spec(sshd), None) as c:
        assert run(c, ["true"]).exited == 0


def test_no_usable_key_fails_cleanly_and_no_password_is_ever_tried(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh keys, and no agent (fixture)
    start = len(sshd.log_text())
    with pytest.raises(RemoteError) as e:
        connect(_spec(sshd, key_file=None), sshd.known_hosts)
    assert "no key was accepted" in str(e.value) and "passwords are never used" in str(e.value)

    stranger = keygen(tmp_path / "not_authorized")  # a key the host does not know
    with pytest.raises(RemoteError, match="no key was accepted \\(key file .*not_authorized"):
        connect(_spec(sshd, key_file=stranger), sshd.known_hosts)

    # A control, after both: a client that does offer a password shows up in the same log. Once its attempt
    # is logged, everything our two clients did is logged too.
    with paramiko.Transport((sshd.address, sshd.port)) as t:
        t.start_client(timeout=10)
        with pytest.raises(paramiko.BadAuthenticationType):
            t.auth_password("root", "not-a-real-password")
    wait_for(lambda: "password" in _methods_tried(sshd, start), 10, "sshd to log the control's password")
    tried = _methods_tried(sshd, start)
    assert tried.count("password") == 1 and "keyboard-interactive" not in tried, tried  # the control's only
    assert "Failed publickey for root from 127.0.0.1" in sshd.log_text()[start:]
    assert _fingerprint(Path(f"{stranger}.pub")) in sshd.log_text()[start:]


def _methods_tried(sshd, start: int) -> list[str]:
    """Authentication methods clients asked sshd for since log offset ``start`` (sshd logs each at DEBUG1)."""
    return [line.split(" method ")[1].split()[0] for line in _new_log(sshd, start).splitlines()
            if "userauth-request for user" in line]


def test_a_missing_key_file_is_named(sshd, tmp_path):
    with pytest.raises(RemoteError, match="key file .*/absent does not exist"):
        connect(_spec(sshd, key_file=tmp_path / "absent"), sshd.known_hosts)


def test_a_failing_command_names_host_command_and_stderr(conn):
    with pytest.raises(RemoteError) as e:
        run(conn, ["sh", "-c", "echo first >&2; echo 'last words' >&2; exit 3"])
    msg = str(e.value)
    assert msg.startswith("testhost: `sh -c ") and "exited with 3" in msg and "first | last words" in msg


def test_nothing_listens_means_cannot_connect(tmp_path, sshd):
    spec = _spec(sshd, port=free_port())
    with pytest.raises(RemoteError, match=f"testhost \\(root@127.0.0.1:{spec.port}\\): cannot connect"):
        connect(spec, sshd.known_hosts, timeout=5)


# ------------------------------------------------------------------------------------------- calibrate

class ConstantPackage:
    """A synthetic RAPL package whose counter a thread advances in real time at ``WATTS``: whatever load the
    burner (or anything else on this shared machine) puts on, calibration must read back that power."""

    WATTS, STEP_S = 100.0, 0.01

    def __init__(self, root: Path) -> None:
        self.pc = SyntheticPowercap(root)
        self.pc.add("intel-rapl:0", "package-0")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="test-rapl-package", daemon=True)

    def _loop(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(self.STEP_S):
            t1 = time.monotonic()
            self.pc.advance("intel-rapl:0", round(self.WATTS * (t1 - t0) * 1e6))
            t0 = t1

    def __enter__(self) -> "ConstantPackage":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def made_dirs(monkeypatch) -> list[Path]:
    """The remote temp folders calibrate makes (mktemp's answers), recorded as it runs. The host is this machine,
    so each can be looked for afterwards; only this calibrate's own (another test module's calibrate over SSH
    may run beside this one and make and remove its own)."""
    from joulesched.infra import remote

    made: list[Path] = []
    real = remote.run

    def run(conn, argv, *args, **kw):
        r = real(conn, argv, *args, **kw)
        if list(argv[:2]) == ["mktemp", "-d"]:
            made.append(Path(r.stdout.strip()))
        return r

    monkeypatch.setattr(remote, "run", run)
    return made


def _cleaned_up(made: list[Path]) -> bool:
    return len(made) == 1 and str(made[0]).startswith("/tmp/joulesched-calibrate.") and not made[0].exists()


def test_calibrate_over_ssh_writes_a_valid_profile_naming_the_host(conn, tmp_path, made_dirs):
    out = tmp_path / "node-profile.yaml"
    with ConstantPackage(tmp_path / "powercap") as package:
        calibrate(conn, conn.spec, out, meter="powercap", powercap_root=str(package.pc.root),
                  step_seconds=0.4, settle_seconds=0.1, sample_seconds=0.2, workers=2, timeout=120)
    text = out.read_text()
    assert text.startswith("# joulesched: calibrated on inventory host testhost (root@127.0.0.1:")
    assert "Source: powercap meter on" in text  # calibrate's own header, kept
    group = yaml.safe_load(text)
    assert group["name_prefix"] == "testhost" and group["count"] == 1
    curve = group["power_watts"]
    assert len(curve) == 11 and curve == sorted(curve)
    # Every knot the measured utilisations reached reads the injected power back. (Which knots those are
    # depends on what else loads this machine; calibrate lists the extrapolated ones.)
    match = re.search(r"extrapolated at ([0-9%, ]+)", text)
    extrapolated = {int(k) // 10 for k in re.findall(r"(\d+)%", match.group(1))} if match else set()
    measured = [curve[k] for k in range(11) if k not in extrapolated]
    assert measured and all(abs(w - ConstantPackage.WATTS) < 15 for w in measured), (curve, extrapolated)
    assert _cleaned_up(made_dirs), made_dirs  # the remote temp folder is gone
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no local temp left

    from joulesched.pipelines.sim_pipeline import profile_curve

    assert profile_curve(out) == curve


def test_a_failing_calibration_raises_leaves_the_old_profile_and_cleans_up(conn, tmp_path, made_dirs):
    out = tmp_path / "node-profile.yaml"
    out.write_text("old: profile\n")
    with pytest.raises(RemoteError) as e:
        calibrate(conn, conn.spec, out, meter="powercap", powercap_root=str(tmp_path / "no-rapl"),
                  step_seconds=0.1, timeout=60)
    msg = str(e.value)
    assert msg.startswith("testhost: `") and "power calibrate --out /tmp/joulesched-calibrate." in msg
    assert "exited with 2" in msg and "error:" in msg
    assert out.read_text() == "old: profile\n"
    assert _cleaned_up(made_dirs), made_dirs


def test_an_invalid_profile_from_the_host_is_refused(sshd, tmp_path, made_dirs):
    """A joulesched on the host whose calibrate writes a 3-point curve: nothing is written here."""
    fake = tmp_path / "joulesched"
    fake.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done\n'
                    'echo "power_watts: [1, 2, 3]" > "$out"\necho "wrote $out"\n')
    fake.chmod(0o755)
    spec = _spec(sshd, joulesched=str(fake))
    out = tmp_path / "node-profile.yaml"
    out.write_text("old: profile\n")
    with connect(spec, sshd.known_hosts) as c, pytest.raises(RemoteError) as e:
        calibrate(c, spec, out, timeout=30)
    assert "testhost: calibrate's profile is invalid" in str(e.value) and "needs 11 points" in str(e.value)
    assert "wrote /tmp/joulesched-calibrate." in str(e.value)  # what the host said
    assert out.read_text() == "old: profile\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["joulesched", "node-profile.yaml"]
    assert _cleaned_up(made_dirs), made_dirs


def test_calibrate_with_a_wrong_joulesched_path_says_so(sshd, tmp_path):
    spec = _spec(sshd, joulesched="/nonexistent/bin/joulesched")
    with connect(spec, sshd.known_hosts) as c, pytest.raises(RemoteError, match="exited with 127.*No such file"):
        calibrate(c, spec, tmp_path / "p.yaml", timeout=30)


# ---------------------------------------------------------------------------------------------- exporter

def test_read_exporter_reads_metrics_on_the_hosts_loopback(conn, tmp_path):
    port = free_port()
    log = open(tmp_path / "exporter.log", "wb")
    proc = subprocess.Popen([JOULESCHED, "power", "exporter", "--listen", f"127.0.0.1:{port}", "--interval", "0.2",
                             "--meter", "model", "--curve", "hp-ml110-g5"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def serving() -> bool:
            assert proc.poll() is None, (tmp_path / "exporter.log").read_text()
            try:
                return b"joulesched_node_joules_total" in urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/metrics", timeout=1).read()
            except OSError:
                return False

        wait_for(serving, 30, "the exporter to serve")
        text = read_exporter(conn, port)
        assert 'joulesched_node_joules_total{source="model",zone="platform"}' in text
        assert "# TYPE joulesched_node_watts gauge" in text
    finally:
        stop_process(proc, timeout=10)
        log.close()


def test_read_exporter_with_nothing_listening_raises(conn):
    port = free_port()
    with pytest.raises(RemoteError, match=f"^testhost: `python3 -c <script> http://127.0.0.1:{port}/metrics 5` "
                                          f"exited with 1: cannot read http://127.0.0.1:{port}/metrics: "
                                          ".*Connection refused"):
        read_exporter(conn, port, timeout=5)
    with pytest.raises(RemoteError, match="not a TCP port"):
        read_exporter(conn, 70000)


# -------------------------------------------------------------------------------------------------- logs

def test_collect_logs_writes_one_file_per_unit_with_notes(conn, tmp_path):
    files = collect_logs(conn, conn.spec, tmp_path / "logs", units=("joulesched-power-exporter", "no-such-unit"))
    assert [f.name for f in files] == ["testhost-joulesched-power-exporter.log", "testhost-no-such-unit.log"]
    for f, unit in zip(files, ("joulesched-power-exporter", "no-such-unit")):
        text = f.read_text()
        # This machine runs no systemd journal: journalctl answers "-- No entries --", which is said plainly.
        assert f"# joulesched: no journal entries for {unit}" in text or "-- Logs begin" in text, text
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == sorted(f.name for f in files)  # no temps


def test_collect_logs_on_a_host_without_journalctl_writes_a_note(tmp_path):
    """A second real sshd whose sessions get a PATH without journalctl, as on a host without systemd."""
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    with sshd_server(tmp_path / "sshd", extra_config=f"SetEnv PATH={empty_bin}") as server:
        spec = _spec(server, name="bare-host")
        with connect(spec, server.known_hosts) as c:
            files = collect_logs(c, spec, tmp_path / "logs", units=("joulesched-power-exporter",))
    text = files[0].read_text()
    assert files[0].name == "bare-host-joulesched-power-exporter.log"
    assert text.startswith("# joulesched: journalctl not found on bare-host: no systemd journal to read")
    assert "not found" in text.splitlines()[0].split("(", 1)[1]  # the shell's own words


# --------------------------------------------------------------------------------------------- inventory

def _role(file: str) -> dict:
    return yaml.safe_load((REPO / "playbooks/roles/power_exporter" / file).read_text())


def test_defaults_match_the_power_exporter_role():
    install_dir = _role("defaults/main.yml")["power_exporter_install_dir"]
    assert _role("vars/main.yml")["_power_exporter_venv"] == "{{ power_exporter_install_dir }}/.venv"
    assert DEFAULT_JOULESCHED == f"{install_dir}/.venv/bin/joulesched"
    assert _role("vars/main.yml")["_power_exporter_service"] in DEFAULT_UNITS


def test_the_sample_inventory_gives_its_hosts_with_group_vars():
    hosts = hosts_from_inventory(REPO / "inventory/hosts.yml")
    assert [h.name for h in hosts] == ["node1.example.internal", "node2.example.internal",
                                       "loadgen.example.internal"]
    node1 = hosts[0]
    assert (node1.address, node1.port, node1.user, node1.key_file, node1.joulesched) == \
        ("node1.example.internal", 22, "joulesched", None, DEFAULT_JOULESCHED)  # user from group_vars/all.yml
    assert [h.name for h in hosts_from_inventory(REPO / "inventory/hosts.yml", limit="power_hosts")] == \
        ["node1.example.internal", "node2.example.internal"]


def test_inventory_variables_and_templates(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    inv = tmp_path / "hosts.yml"
    inv.write_text("""\
all:
  vars:
    lab_domain: lab.internal
  children:
    power_hosts:
      hosts:
        a:
          ansible_host: "{{ inventory_hostname }}.{{ lab_domain }}"
          ansible_port: 2222
          ansible_user: ops
          ansible_ssh_private_key_file: ~/keys/lab
          power_exporter_install_dir: /srv/joulesched/
        b:
          ansible_host: 10.0.0.7
          joulesched_bin: /usr/local/bin/joulesched
          power_exporter_listen: "127.0.0.1:9200"
          joulesched_calibrate_args: [--meter, msr, --workers, 4]
""")
    a, b = hosts_from_inventory(inv)
    assert a == HostSpec(name="a", address="a.lab.internal", port=2222, user="ops",
                         key_file=tmp_path / "keys/lab", joulesched="/srv/joulesched/.venv/bin/joulesched")
    assert (b.address, b.port, b.joulesched) == ("10.0.0.7", 22, "/usr/local/bin/joulesched")
    assert (a.exporter_port, a.calibrate_args) == (9102, ())
    assert (b.exporter_port, b.calibrate_args) == (9200, ("--meter", "msr", "--workers", "4"))
    assert type(a.name) is str and type(a.address) is str  # plain str: no ansible types leak out of the child


@pytest.mark.parametrize("text, message", [
    ("all:\n  hosts:\n    a: {ansible_host: [1,\n", "not a valid Ansible inventory: invalid YAML: .* line 4"),
    ("all: {}\n", "the inventory lists no hosts"),
    ("all:\n  hosts:\n    a: {ansible_port: ssh}\n", "host a: ansible_port 'ssh' is not a TCP port"),
    ("all:\n  hosts:\n    a: {ansible_host: '{{ undefined_var }}'}\n", "host a: ansible_host: .*undefined_var"),
    ("all:\n  hosts:\n    a: {power_exporter_listen: 'loopback'}\n", "host a: power_exporter_listen 'loopback'"),
    ("all:\n  hosts:\n    a: {joulesched_calibrate_args: '--meter msr'}\n",
     "host a: joulesched_calibrate_args must be a list of strings"),
])
def test_bad_inventories_name_the_file_and_problem(tmp_path, text, message):
    inv = tmp_path / "bad.yml"
    inv.write_text(text)
    with pytest.raises(RemoteError, match=f"^{tmp_path}/bad.yml: {message}"):
        hosts_from_inventory(inv)


def test_unknown_limit_and_missing_file(tmp_path):
    with pytest.raises(RemoteError, match="--limit 'gpu_hosts' matches no host; hosts: node1.example.internal, "
                                          ".*groups: kube_master, kube_workers, loadgen, monitoring, power_hosts"):
        hosts_from_inventory(REPO / "inventory/hosts.yml", limit="gpu_hosts")
    with pytest.raises(RemoteError, match="missing.yml: inventory does not exist"):
        hosts_from_inventory(tmp_path / "missing.yml")


def test_without_ansible_core_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ansible", None)  # import fails as if not installed
    with pytest.raises(RemoteError, match=r"needs ansible-core; .*pip install 'joulesched\[infra\]'"):
        hosts_from_inventory(REPO / "inventory/hosts.yml")


def test_vault_encrypted_group_vars_are_read_with_the_playbooks_vault_password(monkeypatch, tmp_path):
    # ansible-playbook decrypts them with ANSIBLE_VAULT_PASSWORD_FILE: the hosts the pipeline reads must too
    # (an ansible_host kept in a vault is common). Without the password: an error naming the file, no traceback.
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    a: {}\n")
    (inv / "group_vars" / "all.yml").write_text("ansible_host: 10.0.0.9\nansible_user: ops\n")
    password = tmp_path / "vault-pass"
    password.write_text("correct horse\n")
    subprocess.run([str(Path(sys.executable).parent / "ansible-vault"), "encrypt", "--vault-password-file",
                    str(password), str(inv / "group_vars" / "all.yml")], check=True, capture_output=True)
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    with pytest.raises(RemoteError, match=f"^{inv}: its host or group variables cannot be read: .*vault"):
        hosts_from_inventory(inv)
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password))
    (a,) = hosts_from_inventory(inv)
    assert (a.name, a.address, a.user) == ("a", "10.0.0.9", "ops")
