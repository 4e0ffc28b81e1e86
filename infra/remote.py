"""Host-side pipeline steps on bare-metal or KVM hosts, over SSH with fabric.

Keys only and host keys checked: a connection authenticates with the inventory's key file, the default keys
in ``~/.ssh`` when none is given, or the SSH agent, and never with a password; the server's host key must
already be in a known_hosts file (fabric's own default, ``AutoAddPolicy``, accepts any key and is replaced by
``RejectPolicy``). A host whose key is unknown or changed is refused with a message saying how to pin it.

Steps (each takes an open connection from :func:`connect`):

- :func:`calibrate`: ``joulesched power calibrate`` on the host, the profile fetched, validated and written
  atomically, stamped with the inventory host it came from;
- :func:`read_exporter`: the power exporter's ``/metrics`` read on the host from 127.0.0.1 (it binds
  loopback), with the host's python3, so the exporter never has to be exposed;
- :func:`collect_logs`: ``journalctl -u UNIT`` per unit into one file per host and unit.

Hosts come from an Ansible inventory (:func:`hosts_from_inventory`), read with ansible-core itself, so
``group_vars``, patterns and templated variables mean what they mean to ``ansible-playbook``.

Every remote command is an argument list joined with :func:`shlex.join`, so each argument is quoted for the
remote shell; a command that fails raises :class:`RemoteError` with the host, the command and its stderr.
"""

from __future__ import annotations

import getpass
import io
import logging
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut

from joulesched.core.errors import UsageError
from joulesched.core.fsio import atomic_path

log = logging.getLogger(__name__)

#: Where the power_exporter role installs joulesched: ``{{ power_exporter_install_dir }}/.venv/bin/joulesched``
#: (playbooks/roles/power_exporter: defaults ``power_exporter_install_dir: /opt/joulesched``, vars
#: ``_power_exporter_venv``), the path the hardened unit's ExecStart runs.
INSTALL_DIR_VAR = "power_exporter_install_dir"
DEFAULT_INSTALL_DIR = "/opt/joulesched"
DEFAULT_JOULESCHED = f"{DEFAULT_INSTALL_DIR}/.venv/bin/joulesched"
#: Inventory variable naming the joulesched executable outright (hosts not installed by the role).
JOULESCHED_BIN_VAR = "joulesched_bin"
#: The role's unit (``_power_exporter_service``) and the node_exporter role's (``_node_exporter_service``).
DEFAULT_UNITS = ("joulesched-power-exporter", "prometheus-node-exporter")
DEFAULT_EXPORTER_PORT = 9102  # power_exporter_listen: 127.0.0.1:9102

_STDERR_LINES = 8
_NOTE = "# joulesched: "


class RemoteError(UsageError):
    """A host-side step failed; the message names the host (or inventory file) and what to do."""


@dataclass(frozen=True)
class HostSpec:
    name: str                           # inventory hostname
    address: str                        # ansible_host (the name when unset)
    port: int = 22                      # ansible_port
    user: str = ""                      # ansible_user (the local user when unset)
    key_file: Optional[Path] = None     # ansible_ssh_private_key_file (else ~/.ssh defaults and the agent)
    joulesched: str = DEFAULT_JOULESCHED  # joulesched on the host
    exporter_port: int = DEFAULT_EXPORTER_PORT  # the port of power_exporter_listen
    calibrate_args: tuple[str, ...] = ()  # joulesched_calibrate_args: extra `power calibrate` options (--meter msr)

    def __post_init__(self) -> None:
        if not self.user:
            object.__setattr__(self, "user", getpass.getuser())

    @property
    def target(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"


# ---------------------------------------------------------------------------------------------- inventory

# Each field and the inventory variables that set it, first found wins (ansible's own aliases).
_VARS = {
    "address": ("ansible_host", "ansible_ssh_host"),
    "port": ("ansible_port", "ansible_ssh_port"),
    "user": ("ansible_user", "ansible_ssh_user"),
    "key_file": ("ansible_ssh_private_key_file", "ansible_private_key_file"),
    "joulesched": (JOULESCHED_BIN_VAR,),
    "install_dir": (INSTALL_DIR_VAR,),
    "listen": ("power_exporter_listen",),
}
#: Inventory variable with extra `joulesched power calibrate` arguments for a host (a list of strings).
CALIBRATE_ARGS_VAR = "joulesched_calibrate_args"


_NO_ANSIBLE = "reading an Ansible inventory needs ansible-core; install the infra extra: pip install 'joulesched[infra]'"


def _ansible():
    try:
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar
        from ansible.vars.manager import VariableManager
    except ImportError as e:
        raise RemoteError(f"{_NO_ANSIBLE} ({e})") from None

    class Inventory(InventoryManager):
        """Remembers whether the source parsed (ansible only warns when it does not)."""

        parsed = False

        def parse_source(self, source, cache=False):
            self.parsed = super().parse_source(source, cache=cache)  # the outermost call returns last
            return self.parsed

    return AnsibleError, Inventory, DataLoader, Templar, VariableManager


def _why_unparsed(path: Path) -> str:
    if path.suffix in (".yml", ".yaml"):
        import yaml

        try:
            with path.open(encoding="utf-8") as f:
                data = yaml.safe_load(f)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            return "invalid YAML: " + " ".join(str(e).split())
        if not isinstance(data, dict):
            return "the top level must be a mapping of groups (all: {hosts: ..., children: ...})"
    return "no Ansible inventory plugin could parse it (ansible's warnings above say why)"


def hosts_from_inventory(path: str | Path, limit: Optional[str] = None) -> list[HostSpec]:
    """The hosts of an Ansible inventory (file or directory, with its group_vars/host_vars), as
    ``ansible-playbook -i path [--limit limit]`` would target them, in inventory order.

    Read in a child process: importing ansible-core patches interpreter globals (``sys.intern``), after which
    torch can no longer be imported in the same process, and the pipeline trains after reading hosts.
    """
    return _in_child(_hosts_from_inventory, path, limit)


def inventory_host_names(path: str | Path, limit: Optional[str] = None) -> list[str]:
    """The names of the hosts ``ansible-playbook -i path [--limit limit]`` would target, in inventory order,
    from the inventory's hosts and groups alone: no host or group variable is read or templated, so
    vault-encrypted group_vars/host_vars (which only ansible-playbook, given the vault password, can decrypt)
    do not stand in the way. The up-front check of `joulesched infra provision`; raises :class:`RemoteError`
    naming the file when the inventory does not parse or `limit` matches no host."""
    return _in_child(_host_names, path, limit)


def _in_child(fn: Callable, path: str | Path, limit: Optional[str]):
    import importlib.util
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if importlib.util.find_spec("ansible") is None:  # say so here rather than from a child's traceback
        raise RemoteError(_NO_ANSIBLE)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, str(path), limit).result()


def _targeted(path: Path, limit: Optional[str], AnsibleError, Inventory, DataLoader):
    """The parsed inventory, its loader and the hosts `limit` selects (all of them without one)."""
    if not path.exists():
        raise RemoteError(f"{path}: inventory does not exist")
    loader = DataLoader()
    try:
        inventory = Inventory(loader=loader, sources=[str(path)])
    except AnsibleError as e:
        raise RemoteError(f"{path}: not a valid Ansible inventory: {e}".replace("\n", " ")) from None
    if not inventory.parsed:
        raise RemoteError(f"{path}: not a valid Ansible inventory: {_why_unparsed(path)}")
    every = [h.name for h in inventory.get_hosts()]
    if not every:
        raise RemoteError(f"{path}: the inventory lists no hosts")
    if not limit:
        return inventory, loader, inventory.get_hosts()
    try:
        inventory.subset(limit)
        hosts = inventory.get_hosts()
    except AnsibleError as e:
        raise RemoteError(f"{path}: --limit {limit!r}: {e}".replace("\n", " ")) from None
    if not hosts:
        groups = sorted(g for g in inventory.groups if g not in ("all", "ungrouped"))
        raise RemoteError(f"{path}: --limit {limit!r} matches no host; hosts: {', '.join(every)}"
                          + (f"; groups: {', '.join(groups)}" if groups else ""))
    return inventory, loader, hosts


def _host_names(path: str | Path, limit: Optional[str] = None) -> list[str]:
    AnsibleError, Inventory, DataLoader, _, _ = _ansible()
    path = Path(path)
    try:
        _, _, hosts = _targeted(path, limit, AnsibleError, Inventory, DataLoader)
    except AnsibleError as e:  # anything else ansible raises: a RemoteError, which pickles without ansible
        raise RemoteError(f"{path}: not a valid Ansible inventory: {e}".replace("\n", " ")) from None
    return [str(h.name) for h in hosts]


def _hosts_from_inventory(path: str | Path, limit: Optional[str] = None) -> list[HostSpec]:
    AnsibleError, Inventory, DataLoader, Templar, VariableManager = _ansible()
    path = Path(path)
    inventory, loader, hosts = _targeted(path, limit, AnsibleError, Inventory, DataLoader)
    _vault_secrets(loader, path)
    variables = VariableManager(loader=loader, inventory=inventory)
    try:
        return [_spec(path, h.name, variables.get_vars(host=h), loader, Templar, AnsibleError) for h in hosts]
    except AnsibleError as e:  # a vault it cannot open, a vars file that does not parse
        raise RemoteError(f"{path}: its host or group variables cannot be read: {e}".replace("\n", " ")) from None


def _vault_secrets(loader, path: Path) -> None:
    """Give ``loader`` the vault secrets ansible-playbook would use (ANSIBLE_VAULT_PASSWORD_FILE,
    ANSIBLE_VAULT_IDENTITY_LIST, ansible.cfg; never a prompt), so vault-encrypted group_vars read as they do in
    the playbook run."""
    from ansible import constants as C
    from ansible.cli import CLI
    from ansible.errors import AnsibleError

    files = [C.DEFAULT_VAULT_PASSWORD_FILE] if C.DEFAULT_VAULT_PASSWORD_FILE else []
    if not files and not C.DEFAULT_VAULT_IDENTITY_LIST:
        return
    try:
        secrets = CLI.setup_vault_secrets(loader, vault_ids=list(C.DEFAULT_VAULT_IDENTITY_LIST),
                                          vault_password_files=files, ask_vault_pass=False, auto_prompt=False)
    except AnsibleError as e:
        raise RemoteError(f"{path}: the vault password cannot be read: {e}".replace("\n", " ")) from None
    loader.set_vault_secrets(secrets)


def _spec(path: Path, name: str, hostvars: dict, loader, Templar, AnsibleError) -> HostSpec:
    templar = Templar(loader=loader, variables=hostvars)
    found: dict[str, str] = {}
    for field, names in _VARS.items():
        for var in names:
            if hostvars.get(var) is None:
                continue
            try:
                value = templar.template(hostvars[var])
            except AnsibleError as e:
                raise RemoteError(f"{path}: host {name}: {var}: {e}".replace("\n", " ")) from None
            if value not in (None, ""):
                found[field] = str(value)
                break
    try:
        port = int(found.get("port", 22))
        if not 0 < port < 65536:
            raise ValueError
    except ValueError:
        raise RemoteError(f"{path}: host {name}: ansible_port {found['port']!r} is not a TCP port") from None
    install_dir = found.get("install_dir", DEFAULT_INSTALL_DIR).rstrip("/")
    listen = found.get("listen", f"127.0.0.1:{DEFAULT_EXPORTER_PORT}")
    try:
        exporter_port = int(listen.rpartition(":")[2])
    except ValueError:
        raise RemoteError(f"{path}: host {name}: power_exporter_listen {listen!r} is not HOST:PORT") from None
    extra = hostvars.get(CALIBRATE_ARGS_VAR) or []
    if not isinstance(extra, list) or not all(isinstance(a, (str, int, float)) for a in extra):
        raise RemoteError(f"{path}: host {name}: {CALIBRATE_ARGS_VAR} must be a list of strings, got {extra!r}")
    name = str(name)  # ansible hands out tagged str subclasses; plain ones pickle without importing ansible
    return HostSpec(name=name, address=found.get("address", name), port=port, user=found.get("user", ""),
                    key_file=Path(found["key_file"]).expanduser() if "key_file" in found else None,
                    joulesched=found.get("joulesched", f"{install_dir}/.venv/bin/joulesched"),
                    exporter_port=exporter_port, calibrate_args=tuple(str(a) for a in extra))


# --------------------------------------------------------------------------------------------- connection

class HostConnection(Connection):
    """A fabric Connection that knows the inventory host it was opened for (for error messages)."""

    spec: Optional[HostSpec] = None  # declared on the class: invoke routes unknown attributes into config


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"{hostname} not found in known_hosts")
        self.hostname, self.key = hostname, key


class _RejectUnknownHost(paramiko.RejectPolicy):
    """RejectPolicy that keeps the offered key, so the refusal can show its fingerprint."""

    def missing_host_key(self, client, hostname, key):
        raise _UnknownHostKey(hostname, key)


def _known_host_name(spec: HostSpec) -> str:
    return spec.address if spec.port == 22 else f"[{spec.address}]:{spec.port}"


def _pin_advice(spec: HostSpec, known_hosts: str) -> str:
    return (f"check the host's key out of band (on its console: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), "
            f"then pin it: ssh-keyscan -p {spec.port} {spec.address} > keys; ssh-keygen -lf keys; "
            f"and if the fingerprints match, cat keys >> {known_hosts}")


def _abandon(conn: Connection) -> None:
    """Close a connection whose opening failed: fabric's close() skips a transport that never became active,
    whose thread would then outlive the refusal."""
    conn.close()
    conn.client.close()


def connect(spec: HostSpec, known_hosts: Optional[Path] = None, *, allow_agent: bool = True,
            timeout: float = 15.0) -> HostConnection:
    """An open fabric connection to ``spec`` that has checked its host key.

    Host keys come from ``known_hosts`` when given, else from ``~/.ssh/known_hosts`` and
    ``/etc/ssh/ssh_known_hosts``; an unknown or changed key is refused (RemoteError). Authentication: the
    spec's key file (else the default keys in ``~/.ssh``) and the SSH agent when ``allow_agent``; no password
    is ever sent. Fabric and SSH config files are not read, so the inventory alone decides the target.
    Close it when done (``with connect(...) as conn:``).
    """
    kwargs: dict = {"allow_agent": allow_agent, "look_for_keys": spec.key_file is None, "password": None,
                    "passphrase": None, "auth_timeout": timeout, "banner_timeout": timeout}
    if spec.key_file is not None:
        if not spec.key_file.is_file():
            raise RemoteError(f"{spec.name}: key file {spec.key_file} does not exist")
        kwargs["key_filename"] = [str(spec.key_file)]
    conn = HostConnection(spec.address, user=spec.user, port=spec.port, config=Config(lazy=True),
                          connect_kwargs=kwargs, connect_timeout=max(1, round(timeout)), forward_agent=False)
    conn.spec = spec
    client = conn.client
    client.set_missing_host_key_policy(_RejectUnknownHost())  # fabric set AutoAddPolicy: never keep that
    if known_hosts is not None:
        files = [Path(known_hosts)]
        if not files[0].is_file():
            raise RemoteError(f"{spec.name}: known_hosts file {known_hosts} does not exist; "
                              + _pin_advice(spec, str(known_hosts)))
    else:
        files = [p for p in (Path("~/.ssh/known_hosts").expanduser(), Path("/etc/ssh/ssh_known_hosts"))
                 if p.is_file()]
    where = " and ".join(map(str, files)) or "~/.ssh/known_hosts (missing)"
    for f in files:
        try:
            client.load_system_host_keys(str(f))  # read-only: nothing is ever written back
        except (OSError, paramiko.SSHException) as e:
            raise RemoteError(f"{spec.name}: cannot read known_hosts {f}: {e}") from None
    try:
        conn.open()
    except _UnknownHostKey as e:
        _abandon(conn)
        raise RemoteError(
            f"{spec.name} ({spec.target}): host key is unknown ({e.key.get_name()} "
            f"{e.key.fingerprint}); it is not in {where} as {_known_host_name(spec)}: refusing to connect. "
            + _pin_advice(spec, str(files[0]) if files else "~/.ssh/known_hosts")) from None
    except paramiko.BadHostKeyException as e:
        _abandon(conn)
        raise RemoteError(
            f"{spec.name} ({spec.target}): host key does NOT match known_hosts ({where}): it offered "
            f"{e.key.get_name()} {e.key.fingerprint}, known_hosts has {e.expected_key.fingerprint}. Either the "
            "host was reinstalled or someone is in the middle: refusing to connect. If the change is expected, "
            f"ssh-keygen -R '{_known_host_name(spec)}' -f {files[0] if files else '~/.ssh/known_hosts'}; "
            + _pin_advice(spec, str(files[0]) if files else "~/.ssh/known_hosts")) from None
    except paramiko.PasswordRequiredException:
        _abandon(conn)
        raise RemoteError(f"{spec.name}: key file {spec.key_file} is encrypted; add it to ssh-agent "
                          "(ssh-add) instead: passphrases and passwords are never asked for") from None
    except paramiko.SSHException as e:
        _abandon(conn)
        # paramiko says "No authentication methods available" when it found no key to offer at all.
        if isinstance(e, paramiko.AuthenticationException) or "No authentication methods" in str(e):
            keys = f"key file {spec.key_file}" if spec.key_file else "the default keys in ~/.ssh"
            raise RemoteError(f"{spec.name} ({spec.target}): no key was accepted ({keys}"
                              f"{', the SSH agent' if allow_agent else ''}; passwords are never used): {e}. "
                              f"Install the public key in {spec.user}'s authorized_keys on the host, or set "
                              "ansible_ssh_private_key_file") from None
        raise RemoteError(f"{spec.name} ({spec.target}): cannot connect: {e or type(e).__name__}") from None
    except (OSError, EOFError) as e:
        _abandon(conn)
        raise RemoteError(f"{spec.name} ({spec.target}): cannot connect: {e or type(e).__name__}") from None
    return conn


# ------------------------------------------------------------------------------------------------ running

def _label(conn: Connection) -> str:
    spec = getattr(conn, "spec", None)
    return spec.name if spec is not None else f"{conn.user}@{conn.host}:{conn.port}"


def _tail(text: str, n: int = _STDERR_LINES) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) or "(no stderr)"


def _shown(argv: Sequence[str]) -> str:
    """The command for messages: as sent, but an inline script stands as ``<script>``."""
    return " ".join("<script>" if "\n" in str(a) else shlex.quote(str(a)) for a in argv)


def run(conn: Connection, argv: Sequence[str], *, timeout: Optional[float] = None,
        ok: Optional[Sequence[int]] = (0,)):
    """Run ``argv`` on the host (each argument quoted for its shell); returns fabric's Result. An exit status
    not in ``ok`` (None: any is fine) raises RemoteError naming the host, the command and its last stderr
    lines."""
    try:
        result = conn.run(shlex.join(str(a) for a in argv), hide=True, warn=True, in_stream=False,
                          timeout=timeout)
    except CommandTimedOut:
        raise RemoteError(f"{_label(conn)}: `{_shown(argv)}` timed out after {timeout:g} s") from None
    except (paramiko.SSHException, OSError, EOFError) as e:
        raise RemoteError(f"{_label(conn)}: `{_shown(argv)}`: SSH failed: {e or type(e).__name__}") from None
    if ok is not None and result.exited not in ok:
        raise RemoteError(f"{_label(conn)}: `{_shown(argv)}` exited with {result.exited}: {_tail(result.stderr)}")
    return result


def _write_atomic(path: Path, data: bytes, check: Optional[Callable[[Path], object]] = None) -> None:
    """Write ``path`` through a temp file in its folder and a rename: never half a file. ``check`` sees the
    complete temp file first; if it raises, ``path`` is left as it was."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
        if check is not None:
            check(tmp)


# -------------------------------------------------------------------------------------------------- steps

def calibrate(conn: Connection, spec: HostSpec, out: Path, *, step_seconds: Optional[float] = None,
              settle_seconds: Optional[float] = None, sample_seconds: Optional[float] = None,
              workers: Optional[int] = None, meter: Optional[str] = None,
              powercap_root: Optional[str] = None, proc_root: Optional[str] = None,
              dev_root: Optional[str] = None, name_prefix: Optional[str] = None, count: Optional[int] = None,
              cpu_m: Optional[int] = None, memory_mib: Optional[int] = None, max_pods: Optional[int] = None,
              timeout: Optional[float] = None) -> Path:
    """Run ``joulesched power calibrate`` on the host and write its node profile to ``out`` (atomically).

    Options left at None take calibrate's defaults, except ``name_prefix``, which defaults to the inventory
    name as a DNS label so the node group says which host it measured; the file's header also names the host.
    The profile is validated (an 11-point curve) before ``out`` is replaced; the remote temp folder is removed
    even when the run fails. ``timeout`` defaults to the 11 steps' time plus two minutes.
    """
    from joulesched.power.calibrate import _dns_prefix, read_profile_curve

    out = Path(out)
    if not out.parent.is_dir():
        raise RemoteError(f"{out}: folder {out.parent} does not exist")
    options = {"--step-seconds": step_seconds, "--settle-seconds": settle_seconds,
               "--sample-seconds": sample_seconds, "--workers": workers, "--meter": meter,
               "--powercap-root": powercap_root, "--proc-root": proc_root, "--dev-root": dev_root,
               "--name-prefix": name_prefix or _dns_prefix(spec.name), "--count": count, "--cpu-m": cpu_m,
               "--memory-mib": memory_mib, "--max-pods": max_pods}
    if timeout is None:
        timeout = 11 * ((settle_seconds if settle_seconds is not None else 2.0)
                        + (step_seconds if step_seconds is not None else 10.0)) + 120
    remote_dir = run(conn, ["mktemp", "-d", "-t", "joulesched-calibrate.XXXXXXXX"]).stdout.strip()
    if not remote_dir.startswith("/"):
        raise RemoteError(f"{spec.name}: mktemp gave {remote_dir!r}, not a path")
    remote_out = f"{remote_dir}/node-profile.yaml"
    argv = [spec.joulesched, "power", "calibrate", "--out", remote_out]
    for flag, value in options.items():
        if value is not None:
            argv += [flag, str(value)]
    argv += list(spec.calibrate_args)
    try:
        result = run(conn, argv, timeout=timeout)
        buf = io.BytesIO()
        try:
            conn.get(remote_out, local=buf)
        except (OSError, paramiko.SSHException) as e:
            raise RemoteError(f"{spec.name}: cannot fetch {remote_out}: {e}") from None
    finally:
        try:
            run(conn, ["rm", "-rf", "--", remote_dir], timeout=60)
        except RemoteError as e:  # the original error, if any, matters more
            log.warning("could not remove %s on %s: %s", remote_dir, spec.name, e)
    header = (f"{_NOTE}calibrated on inventory host {spec.name} ({spec.target}) over SSH, fetched "
              f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n").encode()

    said = f"{result.stdout}\n{result.stderr}"

    def valid(tmp: Path) -> None:
        try:
            read_profile_curve(tmp)
        except ValueError as e:
            raise RemoteError(f"{spec.name}: calibrate's profile is invalid: {e}; its output: "
                              f"{_tail(said)}") from None

    _write_atomic(out, header + buf.getvalue(), check=valid)
    return out


#: Run by the host's python3: GET a URL (no proxy: it is loopback) and copy the body to stdout.
_FETCH = """\
import sys, urllib.request
url, timeout = sys.argv[1], float(sys.argv[2])
try:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        sys.stdout.buffer.write(r.read())
except Exception as e:
    sys.exit(f"cannot read {url}: {e}")
"""


def read_exporter(conn: Connection, port: int = DEFAULT_EXPORTER_PORT, *, timeout: float = 10.0) -> str:
    """The power exporter's /metrics text, fetched on the host from 127.0.0.1:``port`` with its python3
    (no curl needed, nothing exposed beyond loopback)."""
    if not (isinstance(port, int) and 0 < port < 65536):
        raise RemoteError(f"{_label(conn)}: exporter port {port!r} is not a TCP port")
    url = f"http://127.0.0.1:{port}/metrics"
    return run(conn, ["python3", "-c", _FETCH, url, str(timeout)], timeout=timeout + 30).stdout


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._@-]+", "_", name).strip("._") or "_"


def collect_logs(conn: Connection, spec: HostSpec, out_dir: Path, units: Sequence[str] = DEFAULT_UNITS, *,
                 since: Optional[str] = None, journalctl: str = "journalctl",
                 timeout: float = 120.0) -> list[Path]:
    """``journalctl -u UNIT --no-pager`` for each unit into ``out_dir/<host>-<unit>.log`` (atomic writes).

    What a file cannot hold is said in it on ``# joulesched:`` lines: a unit that systemd does not know, a
    journal with no entries, a host without journalctl. Any other failure raises RemoteError.
    Returns the files written.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for unit in units:
        argv = [journalctl, "-u", unit, "--no-pager"] + (["--since", since] if since else [])
        result = run(conn, argv, timeout=timeout, ok=(0, 127))
        notes = []
        if result.exited == 127:  # the shell's "command not found"
            notes.append(f"{journalctl} not found on {spec.name}: no systemd journal to read "
                         f"({_tail(result.stderr, 2)})")
        else:
            notes += [f"journalctl: {ln}" for ln in result.stderr.strip().splitlines() if ln.strip()]
            # Fails where systemd is not PID 1 (containers): then the journal alone has to speak.
            state = run(conn, ["systemctl", "show", "--property=LoadState", "--value", unit], timeout=60, ok=None)
            if state.exited == 0 and state.stdout.strip() == "not-found":
                notes.append(f"unit {unit} is not installed on {spec.name}")
            if result.stdout.strip() in ("", "-- No entries --"):
                notes.append(f"no journal entries for {unit}")
        text = "".join(f"{_NOTE}{n}\n" for n in notes) + (result.stdout if result.exited == 0 else "")
        path = out_dir / f"{_safe(spec.name)}-{_safe(unit)}.log"
        _write_atomic(path, text.encode())
        written.append(path)
    return written


__all__ = ["HostSpec", "HostConnection", "RemoteError", "hosts_from_inventory", "inventory_host_names", "connect",
           "run", "calibrate", "read_exporter", "collect_logs", "DEFAULT_JOULESCHED", "DEFAULT_UNITS",
           "DEFAULT_EXPORTER_PORT"]
