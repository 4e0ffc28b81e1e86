"""Tinkerbell Rufio: Rufio owns the BMC; joulesched asks it for power actions.

Address ``rufio://NAMESPACE/NAME`` names a ``Machine`` (bmc.tinkerbell.org/v1alpha1). A power change is a
Rufio ``Job`` in the machine's namespace (``spec.machineRef`` and one task ``{powerAction: ...}``): Rufio runs
its Tasks against the BMC and sets the Job's condition ``Completed`` or ``Failed`` (with a message).

- sleep: a Job with ``soft`` (ACPI shutdown); if it fails or the machine's ``status.powerState`` is not ``off``
  within ``graceful_timeout_s``, and ``force_off`` allows it, a Job with ``off`` (hard power-off). Returns once
  ``status.powerState`` is ``off`` (Rufio refreshes it itself), within the action's deadline.
- wake: a Job with ``on``, returned once it is ``Completed`` (the BMC accepted the command).
- state: ``status.powerState`` (``on``, ``off``; anything else is ``unknown``).

Completed Jobs are deleted; a failed one is left for the operator to read (``kubectl get jobs.bmc``). Names are
``joulesched-<node>-<action>-<6 random hex digits>``, chosen before the create (a create whose answer is lost
may have made the Job), labelled ``app.kubernetes.io/managed-by: joulesched``.
A power-off Job a sleep gave up on before it ended (Rufio down or slow) would still run once Rufio gets to it,
whatever became of the node meanwhile: it is deleted before a wake and when the controller withdraws a failed
sleep (:meth:`RufioActuator.cancel_sleep`), found by listing the namespace's Jobs of ours for the machine, so
that those another replica (or this one before a restart) created are found too.

RBAC: ``get`` on ``machines``; ``create``, ``get``, ``list``, ``delete`` on ``jobs`` (the bare-metal Rufio
component).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from contextlib import nullcontext

from joulesched.live.actuators.base import OFF, ON, UNKNOWN, ActuatorError, NoAnswer, Target, after_power_off, marked
from joulesched.live.actuators.delegate import CustomObjects

log = logging.getLogger(__name__)
GROUP_VERSION = "bmc.tinkerbell.org/v1alpha1"
MANAGED_BY = ("app.kubernetes.io/managed-by", "joulesched")
POWER_OFF_ACTIONS = ("soft", "off")


def _condition(job: dict) -> tuple[str, str]:
    """(``Completed`` | ``Failed`` | ``""``, message) of a Rufio Job."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Completed", "Failed") and c.get("status") == "True":
            return c["type"], str(c.get("message") or "")[:200]
    return "", ""


class RufioActuator:
    name = "rufio"

    def __init__(self, *, api_client=None, kubeconfig: str | None = None, context: str | None = None,
                 force_off: bool = True, graceful_timeout_s: float = 120.0, poll_s: float = 2.0,
                 request_timeout_s: float = 15.0, timeout_s: float = 600.0) -> None:
        group, version = GROUP_VERSION.split("/")
        self.objects = CustomObjects(group, version, api_client=api_client, kubeconfig=kubeconfig, context=context,
                                     request_timeout_s=request_timeout_s)
        self.force_off, self.graceful_timeout_s = force_off, graceful_timeout_s
        self.poll_s, self.timeout_s = poll_s, timeout_s
        # (namespace, machine) -> names of the power-off Jobs created and not seen to end
        self._unfinished: dict[tuple[str, str], set[str]] = {}
        self._lock = threading.Lock()

    def _job(self, target: Target, action: str, until: float) -> tuple[str, str]:
        """Run one power action as a Job; (condition, message) once it ends, ("", "") if ``until`` passes."""
        ns, machine = target.address.host, target.address.path
        node = "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in target.node.lower())[:40].strip("-")
        # Named here, not by generateName: a create whose answer is lost may have made the Job, and only a name
        # known beforehand lets cancel_sleep find it.
        name = f"joulesched-{node}-{action}-{secrets.token_hex(3)}"
        off = action != "on"
        if off:
            with self._lock:
                self._unfinished.setdefault((ns, machine), set()).add(name)
        try:
            job = self.objects.create(target, "jobs", {
                "apiVersion": GROUP_VERSION, "kind": "Job",
                "metadata": {"name": name, "namespace": ns, "labels": dict([MANAGED_BY])},
                "spec": {"machineRef": {"name": machine, "namespace": ns}, "tasks": [{"powerAction": action}]}})
        except NoAnswer as e:  # the Job may exist, and Rufio may run it: kept as unfinished
            raise marked(e) if off else e
        except ActuatorError:  # refused (or never sent): there is no Job
            if off:
                self._ended(ns, machine, name)
            raise
        # A power-off Job once created may run whatever fails here: the machine may be going down.
        with after_power_off() if off else nullcontext():
            while not (done := _condition(job))[0] and time.monotonic() < until:
                target.pause(self.poll_s)
                job = self.objects.get(target, "jobs", name)
            if done[0] and off:
                self._ended(ns, machine, name)
            if done[0] == "Completed":
                self.objects.delete(target, "jobs", name)
        return done

    def _ended(self, ns: str, machine: str, name: str) -> None:
        with self._lock:
            names = self._unfinished.get((ns, machine), set())
            names.discard(name)
            if not names:
                self._unfinished.pop((ns, machine), None)

    def cancel_sleep(self, target: Target, *, listed: bool = True) -> None:
        """Delete the power-off Jobs for this machine that a sleep gave up on before they ended: Rufio would run
        them whenever it got to them, switching off a node that has been kept running or woken since. Those this
        process remembers, and every unfinished one of ours the namespace lists for the machine (another replica's,
        or this one's before a restart: a review found them run after a failover, pods and all). A failed list
        raises: the caller keeps the node cordoned. ``listed=False``: a failed list is logged and only the Jobs
        this process remembers are withdrawn (a wake: one unanswered list must not keep pods waiting)."""
        ns, machine = target.address.host, target.address.path
        with self._lock:
            names = set(self._unfinished.get((ns, machine), ()))
        try:
            jobs = self.objects.list(target, "jobs", label_selector="=".join(MANAGED_BY))
        except (ActuatorError, NoAnswer) as e:
            if listed:
                raise
            log.warning("%s: Rufio Jobs could not be listed (%s): only this process's own power-off Jobs are "
                        "withdrawn before the wake", target.node, e)
            jobs = []
        for job in jobs:
            meta, spec = job.get("metadata") or {}, job.get("spec") or {}
            ref = spec.get("machineRef") or {}
            actions = {str((t or {}).get("powerAction")) for t in spec.get("tasks") or [] if isinstance(t, dict)}
            if ((meta.get("labels") or {}).get(MANAGED_BY[0]) == MANAGED_BY[1] and ref.get("name") == machine
                    and (ref.get("namespace") or ns) == ns and actions & set(POWER_OFF_ACTIONS) and meta.get("name")):
                names.add(str(meta["name"]))
        for name in sorted(names):
            job = self.objects.get(target, "jobs", name, missing_ok=True)
            if job and not _condition(job)[0]:  # (one that ended is no threat; a failed one stays to be read)
                self.objects.delete(target, "jobs", name, missing_ok=True)
            self._ended(ns, machine, name)

    def sleep(self, target: Target) -> None:
        give_up = time.monotonic() + self.timeout_s
        graceful = min(give_up, time.monotonic() + self.graceful_timeout_s)
        if self.state(target) == OFF:
            return
        cond, msg = self._job(target, "soft", graceful)
        # A Job Rufio reports Failed switched nothing off; one that completed, or has not run yet, may have.
        accepted = cond != "Failed"
        with after_power_off() if accepted else nullcontext():
            while cond == "Completed" and self.state(target) != OFF and time.monotonic() < graceful:
                target.pause(self.poll_s)
            if self.state(target) == OFF:
                return
            if not self.force_off:
                raise ActuatorError(f"{target.node}: Rufio soft power-off " + (
                    f"failed: {msg}" if cond == "Failed" else f"did not finish in {self.graceful_timeout_s:.0f} s")
                    + " (hard off not allowed)")
            target.before_force()  # never a hard off under a pod that landed on the node since the last check
            # Still under the soft off's mark: that Job may run yet, so a refused or failed hard off leaves the
            # machine possibly going down (a review: a 429 here read as "not sent", the node was uncordoned, and
            # the queued soft off switched it off later, pods and all).
            cond, msg = self._job(target, "off", give_up)
            if cond == "Failed":
                raise ActuatorError(f"{target.node}: Rufio power-off failed: {msg}")
        with after_power_off():
            while self.state(target) != OFF:
                if time.monotonic() > give_up:
                    raise ActuatorError(f"{target.node}: Machine {target.address.host}/{target.address.path} not "
                                        f"off {self.timeout_s:.0f} s after the power-off was asked")
                target.pause(self.poll_s)

    def wake(self, target: Target) -> None:
        self.cancel_sleep(target, listed=False)  # an old power-off Job must not run after this power-on
        cond, msg = self._job(target, "on", time.monotonic() + self.timeout_s)
        if cond != "Completed":
            raise ActuatorError(f"{target.node}: Rufio power-on " + (f"failed: {msg}" if cond else
                                f"not completed in {self.timeout_s:.0f} s"))

    def state(self, target: Target) -> str:
        machine = self.objects.get(target, "machines", target.address.path)
        power = (machine.get("status") or {}).get("powerState")
        return {"on": ON, "off": OFF}.get(power, UNKNOWN)
