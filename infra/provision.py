"""Run playbooks/site.yml through ansible-runner and summarise it per host (what `joulesched infra provision`
prints). Host-key checking is left as configured (on by default); nothing here turns it off."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from joulesched.core.errors import JouleschedError, UsageError

REPO = Path(__file__).resolve().parent.parent
PLAYBOOKS = REPO / "playbooks"


class ProvisionError(JouleschedError, RuntimeError):
    pass


class InventoryError(ProvisionError, UsageError):
    """The inventory is not one Ansible can use (malformed, or it gives the playbook no host): bad input, exit 2."""


@dataclass(frozen=True)
class HostResult:
    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0


@dataclass
class ProvisionResult:
    rc: int
    status: str
    hosts: list[HostResult] = field(default_factory=list)
    stdout: str = ""

    @property
    def changed(self) -> int:
        return sum(h.changed for h in self.hosts)

    @property
    def failed(self) -> int:
        return sum(h.failed + h.unreachable for h in self.hosts)

    @property
    def succeeded(self) -> bool:
        return self.rc == 0 and self.failed == 0

    def summary(self) -> dict:
        """What `joulesched infra provision --json` prints: the overall status and the per-host counts (not
        Ansible's output, which goes to stderr)."""
        return {"status": self.status, "rc": self.rc, "succeeded": self.succeeded, "changed": self.changed,
                "failed": self.failed, "hosts": [asdict(h) for h in self.hosts]}


def check_vars_files(inventory: Path) -> None:
    """Parse the inventory's plain group_vars/ and host_vars/ YAML before the run: Ansible reports a broken one as
    a play that failed with an empty summary and no file name. Vault-encrypted files are skipped (only
    ansible-playbook can read them); Ansible's own tags (``!vault``, ``!unsafe``) are taken as plain values."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    base = inventory if inventory.is_dir() else inventory.parent
    for folder in ("group_vars", "host_vars"):
        root = base / folder
        if not root.is_dir():
            continue
        for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in ("", ".yml", ".yaml", ".json")):
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise InventoryError(f"{path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
            if text.lstrip().startswith("$ANSIBLE_VAULT;"):
                continue
            try:
                doc = yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f" (line {mark.line + 1})" if mark is not None else ""
                raise InventoryError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
            if doc is not None and not isinstance(doc, dict):
                raise InventoryError(f"{path}: variables must be a mapping, not a {type(doc).__name__}")


def provision(inventory: Path, *, playbook: str = "site.yml", limit: str | None = None,
              extravars: dict | None = None, envvars: dict[str, str] | None = None, tags: str | None = None,
              check: bool = False, quiet: bool = True, timeout_s: int = 3600) -> ProvisionResult:
    """Run `playbook` from playbooks/ against `inventory`; return per-host counts (never raises on a failed
    play: look at `.succeeded`). Raises ProvisionError when ansible-runner is missing or cannot start, and
    bad input (a RemoteError or InventoryError, both UsageErrors) when the inventory does not parse, `limit`
    matches none of its hosts, or no play of the playbook targets any of them.

    Ansible itself only warns about an inventory it cannot parse and then runs against no host, "successfully":
    the inventory's hosts and groups are read first (not its variables, which may be vault-encrypted), and the run
    is told to fail on an unparsed source, so a bad inventory never reads as a successful run with an empty summary."""
    try:
        import ansible_runner
    except ImportError:
        raise ProvisionError("ansible-runner is not installed: pip install -e '.[infra]'") from None
    inventory = Path(inventory).resolve()
    if not inventory.exists():
        raise ProvisionError(f"inventory {inventory} does not exist")
    if not (PLAYBOOKS / playbook).is_file():
        raise ProvisionError(f"playbook {PLAYBOOKS / playbook} does not exist")
    from joulesched.infra.remote import RemoteError, inventory_host_names

    try:  # hosts and groups only: host vars (vault-encrypted ones too) are ansible-playbook's to read
        inventory_host_names(inventory, limit)
    except RemoteError as e:  # names the file: not a valid Ansible inventory: ...
        raise InventoryError(str(e)) from None
    check_vars_files(inventory)
    cmdline = []
    if check:
        cmdline.append("--check")
    with tempfile.TemporaryDirectory(prefix="js-runner-") as tmp:
        # The ansible-playbook next to this interpreter (the venv's), whether or not the venv is activated.
        venv_bin = str(Path(sys.executable).parent)
        env = {"ANSIBLE_ROLES_PATH": str(PLAYBOOKS / "roles"), "ANSIBLE_NOCOLOR": "1",
               "ANSIBLE_FORCE_COLOR": "0", "PATH": venv_bin + os.pathsep + os.environ.get("PATH", "")}
        env.update(envvars or {})
        # ansible-runner sets ANSIBLE_HOST_KEY_CHECKING=False unless the caller sets it, and Ansible then passes
        # `-o StrictHostKeyChecking=no` ahead of the inventory's ssh args, where it wins. Host keys are always
        # checked here, whatever a caller's envvars say.
        env["ANSIBLE_HOST_KEY_CHECKING"] = "True"
        env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "True"  # an inventory source that does not parse is an error
        saved_path = os.environ.get("PATH", "")
        os.environ["PATH"] = env["PATH"]  # ansible-runner looks the binary up in this process's PATH
        try:
            r = ansible_runner.run(private_data_dir=tmp, project_dir=str(PLAYBOOKS), playbook=playbook,
                                   inventory=str(inventory), limit=limit, extravars=extravars or {},
                                   envvars=env, tags=tags, cmdline=" ".join(cmdline) or None, quiet=quiet,
                                   timeout=timeout_s)
        finally:
            os.environ["PATH"] = saved_path
        stdout = r.stdout.read() if r.stdout else ""
        stats = r.stats or {}
    names = sorted({h for v in stats.values() if isinstance(v, dict) for h in v})
    if not names and r.status == "successful":
        raise InventoryError(f"{inventory}: no play of {playbook} matched any of its hosts"
                             + (f" (--limit {limit!r})" if limit else "")
                             + "; put them in the groups the playbook targets (see inventory/hosts.yml)")
    hosts = [HostResult(h, ok=stats.get("ok", {}).get(h, 0), changed=stats.get("changed", {}).get(h, 0),
                        failed=stats.get("failures", {}).get(h, 0), unreachable=stats.get("dark", {}).get(h, 0),
                        skipped=stats.get("skipped", {}).get(h, 0)) for h in names]
    return ProvisionResult(rc=r.rc, status=r.status, hosts=hosts, stdout=stdout)
