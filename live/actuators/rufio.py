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
``joulesched-<node>-<action>-<random>`` (``generateName``), labelled ``app.kubernetes.io/managed-by: joulesched``.

RBAC: ``get`` on ``machines``; ``create``, ``get``, ``delete`` on ``jobs`` (the bare-metal Rufio component).
"""

from __future__ import annotations

import time

from joulesched.live.actuators.base import OFF, ON, UNKNOWN, ActuatorError, Target
from joulesched.live.actuators.delegate import CustomObjects

GROUP_VERSION = "bmc.tinkerbell.org/v1alpha1"


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

    def _job(self, target: Target, action: str, until: float) -> tuple[str, str]:
        """Run one power action as a Job; (condition, message) once it ends, ("", "") if ``until`` passes."""
        ns, machine = target.address.host, target.address.path
        node = "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in target.node.lower())[:40].strip("-")
        job = self.objects.create(target, "jobs", {
            "apiVersion": GROUP_VERSION, "kind": "Job",
            "metadata": {"generateName": f"joulesched-{node}-{action}-", "namespace": ns,
                         "labels": {"app.kubernetes.io/managed-by": "joulesched"}},
            "spec": {"machineRef": {"name": machine, "namespace": ns}, "tasks": [{"powerAction": action}]}})
        name = job["metadata"]["name"]
        while not (done := _condition(job))[0] and time.monotonic() < until:
            target.pause(self.poll_s)
            job = self.objects.get(target, "jobs", name)
        if done[0] == "Completed":
            self.objects.delete(target, "jobs", name)
        return done

    def sleep(self, target: Target) -> None:
        give_up = time.monotonic() + self.timeout_s
        graceful = min(give_up, time.monotonic() + self.graceful_timeout_s)
        if self.state(target) == OFF:
            return
        cond, msg = self._job(target, "soft", graceful)
        while cond == "Completed" and self.state(target) != OFF and time.monotonic() < graceful:
            target.pause(self.poll_s)
        if self.state(target) == OFF:
            return
        if not self.force_off:
            raise ActuatorError(f"{target.node}: Rufio soft power-off " + (f"failed: {msg}" if cond == "Failed" else
                                f"did not finish in {self.graceful_timeout_s:.0f} s") + " (hard off not allowed)")
        cond, msg = self._job(target, "off", give_up)
        if cond == "Failed":
            raise ActuatorError(f"{target.node}: Rufio power-off failed: {msg}")
        while self.state(target) != OFF:
            if time.monotonic() > give_up:
                raise ActuatorError(f"{target.node}: Machine {target.address.host}/{target.address.path} not off "
                                    f"{self.timeout_s:.0f} s after the power-off was asked")
            target.pause(self.poll_s)

    def wake(self, target: Target) -> None:
        cond, msg = self._job(target, "on", time.monotonic() + self.timeout_s)
        if cond != "Completed":
            raise ActuatorError(f"{target.node}: Rufio power-on " + (f"failed: {msg}" if cond else
                                f"not completed in {self.timeout_s:.0f} s"))

    def state(self, target: Target) -> str:
        machine = self.objects.get(target, "machines", target.address.path)
        power = (machine.get("status") or {}).get("powerState")
        return {"on": ON, "off": OFF}.get(power, UNKNOWN)
