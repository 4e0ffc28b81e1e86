"""The pipeline's host-side steps, over SSH (``pipelines/remote.py``: fabric, keys only, host keys checked).

- :func:`check_exporters`: before a run, each host's power exporter is read on the host itself (it binds
  loopback) and must serve ``joulesched_node_joules_total``; the text is kept in ``DIR/hosts/``.
- :func:`calibrate_hosts`: the resumable ``calibrate-hosts`` stage, ``joulesched power calibrate`` on every
  host, one profile per host in ``DIR/profiles/`` and their fleet profile ``DIR/node-profile.yaml``, which
  the twin used for training and benchmarking then takes (sim-to-real, closed).
- :func:`collect_host_logs`: after a run, the exporter's and node-exporter's journals into ``DIR/logs/hosts``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from joulesched.core.errors import JouleschedError, UsageError
from joulesched.core.fsio import atomic_write_text
from joulesched.pipelines.stages import Stage, StageRunner

Event = Callable[[str, str], None]


class HostStepError(JouleschedError):
    """A host that cannot be reached or whose key is not pinned, or a step that failed on it (exit 1)."""


class HostInputError(HostStepError, UsageError):
    """No hosts, or an inventory, limit or key option that cannot be used (exit 2)."""


def resolve_hosts(inventory: Path | None, limit: str | None, environment=None, ssh_key: Path | None = None):
    """The SSH targets: an Ansible inventory (with ``--limit``), else the ``hosts`` a Pulumi stack exports."""
    from joulesched.infra.remote import HostSpec, RemoteError, hosts_from_inventory

    if inventory is not None:
        try:
            hosts = hosts_from_inventory(inventory, limit)
        except RemoteError as e:
            raise HostInputError(str(e)) from None
    elif environment is not None and environment.hosts:
        if limit:
            raise HostInputError("--limit selects inventory hosts; it needs --hosts INVENTORY")
        hosts = [HostSpec(name=h.name, address=h.address, port=h.port, user=h.user or "") for h in environment.hosts]
    else:
        raise HostInputError("host-side steps (--calibrate) need hosts: --hosts INVENTORY, or a --stack that "
                            "exports hosts")
    if ssh_key is not None:
        if not ssh_key.is_file():
            raise HostInputError(f"--ssh-key {ssh_key} does not exist")
        hosts = [h if h.key_file is not None else dataclasses.replace(h, key_file=ssh_key) for h in hosts]
    return hosts


def _each(hosts: Sequence, known_hosts: Path | None, step: str, fn, on_event: Event) -> None:
    from joulesched.infra.remote import RemoteError, connect

    for h in hosts:
        on_event(f"{step} {h.name}", f"over SSH to {h.address}:{h.port}")
        try:
            with connect(h, known_hosts) as conn:
                fn(conn, h)
        except RemoteError as e:
            raise HostStepError(f"{step} on {h.name}: {e}") from None
        on_event(f"{step} {h.name}", "ok")


def check_exporters(out: Path, hosts: Sequence, known_hosts: Path | None, *, port: int | None = None,
                    on_event: Event | None = None) -> None:
    """Every host's exporter answers on its loopback and exports the energy counter. A check, not a cached
    stage: it runs every time (it is cheap, and a host can fail between runs)."""
    from joulesched.infra.remote import read_exporter

    on_event = on_event or (lambda n, w: None)
    dest = Path(out) / "hosts"
    dest.mkdir(parents=True, exist_ok=True)

    def check(conn, h) -> None:
        text = read_exporter(conn, port or h.exporter_port)
        if "joulesched_node_joules_total" not in text:
            raise HostStepError(f"exporter on {h.name} serves no joulesched_node_joules_total: is it the joulesched "
                                "power exporter (playbooks/site.yml installs it)?")
        atomic_write_text(dest / f"{h.name}.metrics", text)

    _each(hosts, known_hosts, "exporter", check, on_event)


def fleet_profile(profiles: Sequence[Path], out: Path) -> Path:
    """One node group for the twin from per-host profiles: the hosts' pointwise mean curve, the smallest
    capacities. Per-host curves stay in their own files; the twin's node groups all take the mean."""
    from joulesched.core import yamlio
    from joulesched.pipelines.sim_pipeline import profile_curve
    from joulesched.power.calibrate import write_profile

    curves = np.array([profile_curve(p) for p in profiles])  # first: a bad profile is a CalibrationError naming it
    groups = []
    for p in profiles:
        data = yamlio.load(Path(p).read_text(encoding="utf-8"))
        groups.append(data["nodes"][0] if isinstance(data, dict) and "nodes" in data else data)
    mean = np.maximum.accumulate(curves.mean(axis=0))  # a mean of non-decreasing curves is one; guard rounding
    group = {"name_prefix": "hosts", "count": len(groups),
             **{k: int(min(g[k] for g in groups)) for k in ("cpu_m", "memory_mib", "max_pods") if all(k in g for g in groups)},
             "power_watts": [round(float(w), 2) for w in mean]}
    header = "Fleet profile: the mean of the calibrated curves of\n" + "\n".join(f"  {Path(p).name}" for p in profiles)
    write_profile(out, group, header)
    profile_curve(out)
    return out


def calibrate_hosts(out: Path, hosts: Sequence, known_hosts: Path | None, *, step_seconds: float = 10.0,
                    settle_seconds: float | None = None, sample_seconds: float | None = None, force: bool = False,
                    on_event: Event | None = None, calibrate_options: dict | None = None) -> Path:
    """The ``calibrate-hosts`` stage; returns the fleet node profile the twin then uses."""
    from joulesched.infra.remote import calibrate

    out = Path(out)
    on_event = on_event or (lambda n, w: None)
    profiles_dir = out / "profiles"
    profiles = [profiles_dir / f"{h.name}.yaml" for h in hosts]
    fleet = out / "node-profile.yaml"
    options = {"step_seconds": step_seconds, "settle_seconds": settle_seconds, "sample_seconds": sample_seconds,
               **(calibrate_options or {})}

    def run() -> None:
        profiles_dir.mkdir(parents=True, exist_ok=True)
        fleet.unlink(missing_ok=True)
        _each(hosts, known_hosts, "calibrate", lambda conn, h: calibrate(conn, h, profiles_dir / f"{h.name}.yaml",
                                                                         **options), on_event)
        fleet_profile(profiles, fleet)

    params = {"hosts": [[h.name, h.address, h.port, h.user] for h in hosts], **options}
    StageRunner(out, force=force, on_event=on_event).run(Stage("calibrate-hosts", [], params, [*profiles, fleet], run))
    return fleet


def collect_host_logs(out: Path, hosts: Sequence, known_hosts: Path | None, *, on_event: Event | None = None,
                      since: str | None = None) -> None:
    """The exporter's and node-exporter's journals of every host, into ``DIR/logs/hosts``."""
    from joulesched.infra.remote import collect_logs

    dest = Path(out) / "logs" / "hosts"
    dest.mkdir(parents=True, exist_ok=True)
    _each(hosts, known_hosts, "logs", lambda conn, h: collect_logs(conn, h, dest, since=since),
          on_event or (lambda n, w: None))
