"""`joulesched infra ...`: environments (Pulumi Automation API), libvirt guests without Pulumi, Ansible.

    joulesched infra preview|up|destroy --stack cluster|kvm|aws
    joulesched infra kvm up|down [--config Pulumi.kvm.yaml] [--ssh-public-key ~/.ssh/id_ed25519.pub]
    joulesched infra provision --inventory inventory/hosts.yml [--limit HOST] [--json]
    joulesched infra wheelhouse --out DIR [--python-version 3.11] [--platform TAG ...]

Bad input (a stack config the program would refuse included) prints one red line and exits 2; a failed run
(play, guest, Pulumi update) exits 1.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml
from rich.table import Table

from joulesched.core import yamlio
from joulesched.core.fsio import read_text_input
from joulesched.core.names import is_dns_label
from joulesched.pipelines.cli.common import err, errors, out
from joulesched.pipelines.cli.common import fail as _fail
from joulesched.pipelines.suite import REPO_ROOT

REPO = REPO_ROOT


app = typer.Typer(help="Environments with Pulumi, libvirt guests, and bare-metal hosts with Ansible.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
kvm_app = typer.Typer(help="libvirt guests from the kvm stack config, without Pulumi.", no_args_is_help=True,
                      rich_markup_mode=None)
app.add_typer(kvm_app, name="kvm")


# ------------------------------------------------------------------------------------------ Pulumi stacks
StackOpt = Annotated[str, typer.Option("--stack", "-s", help="Stack name: its settings are Pulumi.<NAME>.yaml.")]


def _stack(name: str):
    """Select (or create) the stack through the Automation API; exit 2 without a pulumi binary."""
    from joulesched.infra.stack import StackError, open_stack

    try:
        return open_stack(name, REPO)
    except StackError as e:
        _fail(str(e))


def _check_stack_config(stack: str) -> None:
    """Validate Pulumi.<stack>.yaml as the program will (``pulumi config set`` writes there too), so that a bad
    config is bad input, exit 2, before Pulumi runs anything. A secret value cannot be read without Pulumi: then
    the program's own check (the same ``load``) reports it, and the run exits 1."""
    from joulesched.infra.config import AWS_REGION, DictReader, InfraConfigError, load

    path = REPO / f"Pulumi.{stack}.yaml"
    values = _stack_config(path)
    if any(isinstance(v, dict) and "secure" in v for v in values.values()):
        return
    try:
        hint = f'pulumi config set --stack {stack} sshPublicKey "$(cat ~/.ssh/id_ed25519.pub)"'
        cfg = load(DictReader(values, where=path.name, hints={"sshPublicKey": hint}))
    except InfraConfigError as e:
        _fail(f"--stack {stack}: {e}")
    region = values.get("aws:region")
    if cfg.target == "aws" and not (isinstance(region, str) and AWS_REGION.match(region)):
        _fail(f"--stack {stack}: aws:region is required, a region such as eu-central-1"
              + ("" if region is None else f", got {region!r}")
              + f": pulumi config set --stack {stack} aws:region eu-central-1")


def _pulumi_op(op: str, stack: str, *, confirm: str | None = None, **kw) -> None:
    """Run ``op`` on the stack; ``confirm`` is asked only once the stack is known to be usable."""
    s = _stack(stack)
    if op != "destroy":  # destroy runs no program: it must work whatever the config has become
        _check_stack_config(stack)
    if confirm is not None and not typer.confirm(confirm):
        raise typer.Exit(1)
    from pulumi.automation import errors

    try:
        result = getattr(s, op)(on_output=out.print, color="never", **kw)
    except errors.CommandError as e:
        _fail(f"pulumi {op} on stack {stack} failed: {str(e).strip().splitlines()[-1]}", 1)
    summary = getattr(result, "summary", None)
    if summary is not None:
        out.print(f"{op} {stack}: {summary.result}, {summary.resource_changes}")


@app.command()
def preview(stack: StackOpt) -> None:
    """Show what `up` would change."""
    _pulumi_op("preview", stack)


@app.command()
def up(stack: StackOpt,
       yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before changing anything.")] = False
       ) -> None:
    """Create or update the environment of a stack."""
    _pulumi_op("up", stack, confirm=None if yes else f"update stack {stack}?")


@app.command()
def destroy(stack: StackOpt,
            yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before deleting.")] = False) -> None:
    """Delete every resource of a stack."""
    _pulumi_op("destroy", stack, confirm=None if yes else f"destroy everything in stack {stack}?")


# ------------------------------------------------------------------------------------------ kvm (no Pulumi)
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="A stack file (its config: block) for the guests.")]
KeyOpt = Annotated[Optional[Path], typer.Option(
    "--ssh-public-key", help="Public key for the guests' admin user (overrides sshPublicKey in --config).")]


def _stack_config(config: Path) -> dict:
    """The ``config:`` block of a stack file. A file that is missing, unreadable, not YAML or not a mapping is
    bad input: one line naming the file, exit 2."""
    if config.is_dir():
        _fail(f"--config {config} is a directory, not a Pulumi stack file (Pulumi.<stack>.yaml)")
    if not config.is_file():
        _fail(f"--config {config} does not exist")
    try:
        with config.open(encoding="utf-8") as f:
            doc = yamlio.load(f)  # a stream: YAML's errors name the file and line
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        _fail(f"--config {config}: not a readable YAML stack file: {' '.join(str(e).split())}")
    doc = {} if doc is None else doc  # an empty file: every setting at its default
    if not isinstance(doc, dict):
        _fail(f"--config {config}: the top level must be a mapping with a config: block, not a {type(doc).__name__}")
    values = {} if doc.get("config") is None else doc["config"]
    if not isinstance(values, dict):
        _fail(f"--config {config}: config: must be a mapping of settings, not a {type(values).__name__}")
    return values


def _kvm_config(config: Path, ssh_public_key: Path | None, prefix: str | None):
    from joulesched.infra.config import PROJECT, DictReader, InfraConfigError, load

    values = _stack_config(config)
    if ssh_public_key is not None:
        if not ssh_public_key.is_file():
            _fail(f"--ssh-public-key {ssh_public_key} does not exist")
        with errors():
            values["joulesched:sshPublicKey"] = read_text_input(ssh_public_key, "an SSH public key").strip()
    if prefix is not None:  # '' too: refused as no DNS label, not taken for "the config's"
        values["joulesched:namePrefix"] = prefix
    values["joulesched:target"] = "kvm"
    try:
        return load(DictReader(values, where=str(config), hints={
            "sshPublicKey": f"pass --ssh-public-key ~/.ssh/id_ed25519.pub, or set {PROJECT}:sshPublicKey in {config}"}))
    except InfraConfigError as e:
        _fail(str(e))


PrefixOpt = Annotated[Optional[str], typer.Option(help="Guest name prefix (default namePrefix, joulesched).")]


@kvm_app.command("up")
def kvm_up(config: ConfigOpt = REPO / "Pulumi.kvm.yaml", ssh_public_key: KeyOpt = None,
           prefix: PrefixOpt = None) -> None:
    """Create the master and workers of the kvm config as libvirt guests (a fresh token per run; the master
    makes the cluster CA, and the workers pin the hash it prints on its serial console)."""
    from joulesched.infra.cloudinit import CaHashTimeout, wait_for_ca_hash
    from joulesched.infra.kvm import CA_HASH_TIMEOUT_S, guest_spec, plan
    from joulesched.infra.libvirt_guests import GuestError, check_connection, create_guest, delete_guest, domain_active
    from joulesched.infra.pki import new_token

    cfg = _kvm_config(config, ssh_public_key, prefix)
    base = Path(cfg.kvm.base_image)
    if not base.is_file():  # before anything is created: nothing to undo
        _fail(f"--config {config}: baseImage {base} does not exist (download a cloud image there, or set "
              "joulesched:baseImage to one)")
    try:
        check_connection(cfg.kvm.uri)  # create_guest checks it too; here it is bad input, before anything is made
    except GuestError as e:
        _fail(f"--config {config}: joulesched:libvirtUri {e}")
    planned = plan(cfg.name_prefix, cfg.kvm)
    token = new_token()
    new_dirs = _missing_dirs(Path(cfg.kvm.pool_dir))  # what the first guest creates: removed again on failure
    made = []
    ca_hash = ""
    table = Table("guest", "role", "address", "virt type", "console log")
    try:
        for g in planned:
            info = create_guest(guest_spec(cfg.name_prefix, cfg.kvm, g, planned[0], token, ca_hash))
            made.append(g.hostname)
            table.add_row(g.hostname, g.role, g.address or f"127.0.0.1:{g.ssh_port}", info.virt_type,
                          info.console_log)
            if g.role == "master" and len(planned) > 1:
                out.print(f"waiting for {g.hostname} to make the cluster CA (console: {info.console_log}) ...")
                ca_hash = wait_for_ca_hash(info.console_log, CA_HASH_TIMEOUT_S,
                                           alive=lambda g=g: domain_active(cfg.kvm.uri, g.hostname))
    except BaseException as e:  # all or nothing: a libvirt error, a tool's timeout, Ctrl-C in the CA wait
        for name in made:
            try:
                delete_guest(cfg.kvm.uri, name, cfg.kvm.pool_dir)
            except Exception as undo:  # go on with the others; say which is left
                err.print(f"[red]error:[/red] could not remove {name}: {undo}; remove it by hand "
                          f"(joulesched infra kvm down)", soft_wrap=True)
        for d in new_dirs:  # the poolDir (and its parents) this run created, unless something else is in it now
            try:
                d.rmdir()
            except OSError:
                break
        if isinstance(e, (GuestError, CaHashTimeout)):
            _fail(str(e), 1)
        raise  # Ctrl-C (exit 130) or a bug: the guests made are gone either way
    out.print(table)
    if ca_hash:
        out.print(f"CA pin for joins: {ca_hash}")


def _missing_dirs(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    path = path.absolute()
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


@kvm_app.command("down")
def kvm_down(config: ConfigOpt = REPO / "Pulumi.kvm.yaml", prefix: PrefixOpt = None) -> None:
    """Remove every guest named <prefix>-master / <prefix>-worker-N, with its disks and seed."""
    from joulesched.infra.config import DictReader, InfraConfigError
    from joulesched.infra.libvirt_guests import GuestError, delete_guest, list_guests

    try:
        r = DictReader(_stack_config(config), where=str(config))
    except InfraConfigError as e:
        _fail(str(e))
    uri = r.get("libvirtUri") or "qemu:///system"
    pool = r.get("poolDir") or "/var/lib/libvirt/images/joulesched"
    pfx = (r.get("namePrefix") or "joulesched") if prefix is None else prefix
    if not is_dns_label(pfx):  # as `up` checks it: the names are the guests (and folders) this removes
        where = "--prefix" if prefix is not None else f"joulesched:namePrefix in {config}"
        _fail(f"{where} must be a DNS label, got {pfx!r}")
    # Only the names `up` gives: a guest of the user's own called <prefix>-worker-old is not ours to remove.
    ours = re.compile(rf"{re.escape(pfx)}-(master|worker-(0|[1-9][0-9]*))")
    try:
        names = [n for n in list_guests(uri, f"{pfx}-") if ours.fullmatch(n)]
        for name in names:
            delete_guest(uri, name, pool)
    except GuestError as e:
        _fail(str(e), 1)
    out.print(f"removed {len(names)} guest(s): {', '.join(names) or '-'}")


# ------------------------------------------------------------------------------------------ Ansible
@app.command()
def provision(
    inventory: Annotated[Path, typer.Option("--inventory", "-i", help="Ansible inventory (see inventory/hosts.yml).")],
    limit: Annotated[Optional[str], typer.Option("--limit", "-l", help="Only these hosts or groups.")] = None,
    tags: Annotated[Optional[str], typer.Option(help="Only tasks with these tags (e.g. power_exporter_configure).")]
    = None,
    check: Annotated[bool, typer.Option(help="Dry run (ansible --check).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Stream Ansible's output (to stderr with --json).")]
    = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the status and the per-host counts as JSON on stdout.")] = False,
) -> None:
    """Run playbooks/site.yml through ansible-runner and print a changed/failed summary per host."""
    from joulesched.core.errors import UsageError
    from joulesched.infra.provision import ProvisionError
    from joulesched.infra.provision import provision as run

    if not inventory.exists():
        _fail(f"--inventory {inventory} does not exist")
    # With --json stdout holds the one JSON document: Ansible's streamed output (--verbose) goes to stderr.
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        try:
            result = run(inventory, limit=limit, tags=tags, check=check, quiet=not verbose)
        except (ProvisionError, UsageError) as e:  # no ansible-runner, or an inventory it cannot use: exit 2
            _fail(str(e))
    if as_json:
        print(json.dumps({"inventory": str(inventory), **result.summary()}, indent=2))
    else:
        table = Table("host", "ok", "changed", "failed", "unreachable", "skipped")
        for h in result.hosts:
            table.add_row(h.host, str(h.ok), str(h.changed), str(h.failed), str(h.unreachable), str(h.skipped))
        out.print(table)
        out.print(f"changed={result.changed} failed={result.failed} status={result.status}")
    if not result.succeeded:
        if not verbose:
            err.print(result.stdout[-4000:], highlight=False, markup=False)
        _fail(f"provisioning failed (ansible rc {result.rc})", 1)


@app.command()
def wheelhouse(
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for the wheels (reused if present).")],
    all_deps: Annotated[bool, typer.Option(help="Every dependency (torch too), not just the exporter's.")] = False,
    archive: Annotated[bool, typer.Option(
        help="Also write DIR.tar, one reproducible archive for power_exporter_wheelhouse_src (much faster to copy "
             "than a directory).")] = False,
    python_version: Annotated[str, typer.Option(
        help="The hosts' Python (X.Y); the role's power_exporter_python_version must match it.")] = "3.11",
    platform: Annotated[Optional[list[str]], typer.Option(
        help="A wheel platform tag the hosts accept (repeat it); default manylinux_2_28, _2_17 and 2014 x86_64.")]
    = None,
) -> None:
    """Build the wheelhouse power_exporter installs from with `pip --no-index` on air-gapped hosts, and its
    requirements.lock (every wheel pinned by SHA-256, for `pip install --require-hashes`). The wheels are for the
    hosts' Python and platform (--python-version, --platform), whatever this controller runs."""
    from joulesched.core.fsio import check_output_dir
    from joulesched.infra.wheelhouse import (
        HOSTS,
        LOCK_NAME,
        WheelhouseError,
        WheelTarget,
        archive_wheelhouse,
        build_wheelhouse,
    )

    try:
        target = WheelTarget(python_version=python_version, platforms=tuple(platform or HOSTS.platforms))
    except ValueError as e:
        _fail(f"--python-version/--platform: {e}")
    with errors():
        check_output_dir(out_dir, "--out")
    try:
        wheel = build_wheelhouse(out_dir, all_deps=all_deps, target=target)
        tar = archive_wheelhouse(out_dir) if archive else None
    except WheelhouseError as e:
        _fail(str(e), 1)
    out.print(f"wheelhouse {out_dir}: {wheel.name} and {len(list(out_dir.glob('*.whl'))) - 1} requirement wheel(s) "
              f"for {target.describe()}, pinned in {out_dir / LOCK_NAME}" + (f"; archive {tar}" if tar else ""))
