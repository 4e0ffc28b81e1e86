"""`joulesched explain`: per-node, per-plugin scores for one pod on one cluster snapshot.

What kube-scheduler-simulator shows its users: feasibility with kube-style reasons, every plugin's score,
the total and the chosen node. The cluster comes from a snapshot file (docs/pipelines.md, "explain", has its
format and scenarios/snapshots/example.json is one) or from a scenario: the twin runs the policy up to the first
decision at or after a time, and that decision is explained (and can be saved as a snapshot).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import ConfigDict, Field, ValidationError, field_validator

from joulesched.agent.policy import Policy
from joulesched.cluster.state import (ASLEEP, DEFAULT_CPU_REQUEST_M, DEFAULT_MEMORY_REQUEST_MIB, ON, WAKING, ClusterState,
                                      PodRequest)
from joulesched.cluster.scenario import MAX_CPU_M, MAX_MEMORY_MIB, NoLaxModel
from joulesched.core.errors import UsageError, validation_summary
from joulesched.core.fsio import read_text_input
from joulesched.power.curves import SPECPOWER, validate_curve

POWER_STATES = {"on": ON, "asleep": ASLEEP, "waking": WAKING}


class SnapshotError(UsageError):
    """A snapshot file is malformed; the message names the field."""


class _M(NoLaxModel):
    # No NaN or infinity anywhere in a snapshot: `explain --json` would print them as invalid JSON. Strict (a
    # snapshot is JSON a program wrote): "3600" for a number, true for a count or "yes" for a switch is refused.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class SnapPod(_M):
    cpu_m: int | None = Field(None, ge=0, le=MAX_CPU_M)
    memory_mib: int | None = Field(None, ge=0, le=MAX_MEMORY_MIB)


class SnapAlloc(_M):  # bounded as a scenario's nodes are (10**30 millicores overflowed the state's int64)
    cpu_m: int = Field(ge=0, le=MAX_CPU_M)
    memory_mib: int = Field(ge=0, le=MAX_MEMORY_MIB)
    pods: int = Field(110, ge=0, le=MAX_CPU_M)


class SnapNode(_M):
    name: str = Field(min_length=1)
    allocatable: SnapAlloc
    pods: list[SnapPod] = Field(default_factory=list)
    usage_cpu_m: float = Field(0, ge=0)
    power_watts: list[float] | str  # 11 watts at 0..100 % CPU, or a SPECpower profile name as in a scenario
    power_state: str = "on"  # on, asleep or waking (what the sleep-aware policies read)
    sleep_watts: float | None = Field(None, ge=0)  # draw while asleep (default: the idle watts)
    never_sleep: bool = False  # protected (a control plane, never-sleep): never put to sleep when idle

    @field_validator("power_watts")
    @classmethod
    def _curve(cls, v: list[float] | str) -> list[float]:
        if isinstance(v, str):
            if v not in SPECPOWER:
                raise ValueError(f"unknown power profile {v!r}; known: {', '.join(sorted(SPECPOWER))}")
            return list(SPECPOWER[v])
        return list(validate_curve(v))

    @field_validator("power_state")
    @classmethod
    def _state(cls, v: str) -> str:
        if v not in POWER_STATES:
            raise ValueError(f"{v!r} is not a power state; use {', '.join(POWER_STATES)}")
        return v


class Snapshot(_M):
    nodes: list[SnapNode] = Field(min_length=1)
    pod: SnapPod
    now_s: float = Field(0.0, ge=0)  # the decision's time (a snapshot from a scenario records it)
    wake_s: float = Field(0.0, ge=0)  # seconds a sleeping node takes to wake (where nodes sleep)


def load_snapshot(path: Path) -> tuple[ClusterState, PodRequest]:
    """Read a snapshot JSON into a ClusterState and the pod to place."""
    try:
        raw = json.loads(read_text_input(path, "a snapshot file", SnapshotError,
                                         missing=f"{path}: snapshot file not found"))
    except json.JSONDecodeError as e:
        raise SnapshotError(f"{path}: not valid JSON: {e}") from None
    return _from_raw(raw, path)


def _from_raw(raw: object, path: Path | str) -> tuple[ClusterState, PodRequest]:
    try:
        snap = Snapshot.model_validate(raw)
    except ValidationError as e:
        raise SnapshotError(f"{path}: invalid snapshot: {validation_summary(e)}") from None
    names = [n.name for n in snap.nodes]
    sleeping = any(n.power_state != "on" or n.sleep_watts is not None for n in snap.nodes)
    try:
        st = ClusterState(names, [n.allocatable.cpu_m for n in snap.nodes], [n.allocatable.memory_mib for n in snap.nodes],
                          [n.allocatable.pods for n in snap.nodes], [n.power_watts for n in snap.nodes],
                          sleep_watts=[n.power_watts[0] if n.sleep_watts is None else n.sleep_watts
                                       for n in snap.nodes] if sleeping else None, can_sleep=sleeping,
                          wake_s=snap.wake_s if sleeping else 0.0,
                          may_sleep=[sleeping and not n.never_sleep for n in snap.nodes])
    except ValueError as e:
        raise SnapshotError(f"{path}: {e}") from None
    for i, n in enumerate(snap.nodes):
        for p in n.pods:
            st.bind(i, PodRequest(p.cpu_m, p.memory_mib))
        st.usage_cpu[i] = n.usage_cpu_m
        st.power_state[i] = POWER_STATES[n.power_state]
    st.now = snap.now_s
    return st, PodRequest(snap.pod.cpu_m, snap.pod.memory_mib)


def snapshot_of(st: ClusterState, pod: PodRequest) -> dict:
    """A snapshot (the file format :func:`load_snapshot` reads) of ``st`` and ``pod``: loading it gives the same
    requests, non-zero requests, pod counts, usage and power states, so every policy scores it alike. The
    state holds sums, not pods: each node's pods are written as that many entries that add up to them (those
    without a request stand for the pods kube counts at its 100m / 200 MiB scoring defaults). Labels and taints
    are not part of a snapshot."""
    names = {v: k for k, v in POWER_STATES.items()}
    nodes = []
    for i, name in enumerate(st.names):
        k = int(st.pods[i])
        no_cpu = (int(st.nz_cpu[i]) - int(st.req_cpu[i])) // DEFAULT_CPU_REQUEST_M
        no_mem = (int(st.nz_mem[i]) - int(st.req_mem[i])) // DEFAULT_MEMORY_REQUEST_MIB
        pods = [{"cpu_m": None if j < no_cpu else 0, "memory_mib": None if j < no_mem else 0} for j in range(k)]
        for key, total in (("cpu_m", int(st.req_cpu[i])), ("memory_mib", int(st.req_mem[i]))):
            j = next((j for j, p in enumerate(pods) if p[key] is not None), None)
            if j is not None:
                pods[j][key] = total  # the requests on the first pod that has one; the rest carry 0
        pods = [{key: v for key, v in p.items() if v is not None} for p in pods]
        node = {"name": name, "allocatable": {"cpu_m": int(st.alloc_cpu[i]), "memory_mib": int(st.alloc_mem[i]),
                                              "pods": int(st.alloc_pods[i])},
                "pods": pods, "usage_cpu_m": float(st.usage_cpu[i]), "power_watts": st.curves[i].tolist(),
                "power_state": names[int(st.power_state[i])]}
        if st.can_sleep:
            node["sleep_watts"] = float(st.sleep_watts[i])
            if not st.may_sleep[i]:
                node["never_sleep"] = True
        nodes.append(node)
    want = {k: v for k, v in (("cpu_m", pod.cpu_m), ("memory_mib", pod.memory_mib)) if v is not None}
    doc = {"now_s": float(st.now), **({"wake_s": float(st.wake_s)} if st.can_sleep else {}), "nodes": nodes,
           "pod": want}
    # A snapshot holds CPU, memory, pods, usage and power: a decision that also turns on GPUs, the pod's selectors
    # or a node's taints would be explained as another one (a review: a 2-GPU pod's saved snapshot made the CPU
    # nodes feasible). Refused rather than written.
    lost = ("GPUs" if st.alloc_gpu.any() or getattr(pod, "gpu", 0) else
            "named resources or host ports" if getattr(pod, "named", ()) or getattr(pod, "host_ports", ()) else
            "the pod's constraints" if getattr(pod, "constraints", None) is not None else
            # PreferNoSchedule taints change no feasibility but default-k8s's TaintToleration score
            "the nodes' PreferNoSchedule taints" if st.filter_table.untolerated_prefer_no_schedule(()) is not None
            else "")
    if not lost:
        st2, pod2 = _from_raw(doc, "the snapshot")
        if not np.array_equal(st2.feasible(pod2), st.feasible(pod)):
            lost = "the pod's constraints or the nodes' labels and taints (which nodes are feasible)"
    if lost:
        raise UsageError(f"--save-snapshot: a snapshot cannot hold {lost}, so it would explain another decision; "
                         "explain this one with --scenario and --at")
    return doc


class _StopAt:
    """A twin that ends its run at the first decision at or after ``at`` and keeps it: run_policy drives the
    policy up to there exactly as in a benchmark (its attach/detach and metadata included)."""

    def __init__(self, twin, at: float) -> None:
        self.twin, self.at, self.decision = twin, at, None
        self.decisions = 0  # before ``at``

    def __getattr__(self, name):  # observe_pods and the rest, for a policy that attaches to the twin
        return getattr(self.twin, name)

    def begin(self) -> None:
        self.twin.begin()

    def next_decision(self):
        d = self.twin.next_decision()
        if d is not None and self.twin.now >= self.at:
            self.decision = d
            return None
        self.decisions += d is not None
        return d

    def bind(self, d, node: int) -> None:
        self.twin.bind(d, node)

    def abandon(self, d, error: Exception) -> None:
        self.twin.abandon(d, error)

    def result(self):
        return self.decision


def scenario_decision(scenario: Path, policy: Policy, at_s: float, seed: int | None = None):
    """The decision (its ``state``, ``pod``, ``mask`` and ``meta``) the twin hands ``policy`` first at or after
    ``at_s`` when the policy runs ``scenario`` from its start (workload seed: the scenario's, or ``seed``)."""
    from joulesched.agent.runner import run_policy
    from joulesched.cluster.scenario import load_scenario
    from joulesched.cluster.twin import Twin
    from joulesched.cluster.workload import build_workload

    if not at_s >= 0:
        raise UsageError(f"--at {at_s}: seconds from the scenario's start, at least 0")
    sc = load_scenario(scenario)
    s = sc.seed if seed is None else seed
    twin = Twin(sc, build_workload(sc, s))
    stop = _StopAt(twin, at_s)
    d = run_policy(stop, policy, s)
    if d is None and not stop.decisions:  # no pod fits any node: there is no decision to explain at all
        raise UsageError(f"{scenario}: the run makes no decision ({twin.unschedulable} pod(s) fit no node, even "
                         f"empty); `joulesched validate {scenario}` says why")
    if d is None:
        raise UsageError(f"{scenario}: no decision at or after --at {at_s:g} s (the last one is earlier; the run "
                         f"ends at {twin.now:g} s)")
    if not stop.decisions:  # the run's first decision: run_policy resets the policy on it, with this generator
        policy.reset(d.state, np.random.default_rng(s))
    return d


def explain(policy: Policy, st: ClusterState, pod: PodRequest, seed: int = 0, meta=None, *,
            reset: bool = True) -> dict:
    """Every node's feasibility, reasons, scores (from the policy's Scorer) and total, and the chosen node.
    ``meta``: the pod's metadata, for a policy that reads it (a decision from a scenario has it). ``reset``
    (a snapshot): the policy starts afresh with ``seed``; a decision from a scenario keeps the run's policy as it
    was there (its random generator included: a tie is broken as the run broke it)."""
    if reset:
        policy.reset(st, np.random.default_rng(seed))
    mask = st.feasible(pod)
    idx = np.flatnonzero(mask)
    scorer = getattr(policy, "scorer", None)  # a planner or a third-party policy may have none at all
    with_meta = meta is not None and getattr(policy, "uses_meta", False)
    # The scores shown are those the choice reads: a policy that reads the metadata is scored with it too.
    scores = None
    if scorer is not None and idx.size:
        scores = scorer.node_scores(st, pod, idx, meta=meta) if with_meta else scorer.node_scores(st, pod, idx)
    chosen = (int(policy.choose(st, pod, mask, meta=meta) if with_meta else policy.choose(st, pod, mask))
              if idx.size else None)
    nodes = []
    pos = {int(j): k for k, j in enumerate(idx)}
    for i, name in enumerate(st.names):
        row: dict = {"name": name, "feasible": bool(mask[i]), "reasons": st.filter_reasons(i, pod)}
        if mask[i] and scores is not None:
            k = pos[i]
            row["scores"] = {pl: _num(s[k]) for pl, (w, s) in scores.plugins.items()}
            row["weights"] = {pl: w for pl, (w, _) in scores.plugins.items()}
            row["total"] = _num(scores.total[k])
            if scores.features is not None:
                row["features"] = scores.features[k]
        nodes.append(row)
    want = {"cpu_m": pod.cpu_m, "memory_mib": pod.memory_mib}
    if pod.gpu:
        want.update(gpu=pod.gpu, gpu_milli=pod.gpu_milli,
                    gpu_models=sorted(pod.gpu_models) if pod.gpu_models is not None else None)
    out = {"policy": policy.name, "now_s": float(st.now), "pod": want,
           "nodes": nodes, "chosen": st.names[chosen] if chosen is not None else None}
    if scores is not None:
        # How the plugins make the total (agent/policy.py NodeScores): "sum" of weight x score, or
        # "lexicographic" (compared in order; total = -rank).
        out["rule"] = scores.rule
        if scores.note:
            out["note"] = scores.note
    if chosen is None:
        out["message"] = st.unschedulable_message(pod)
    elif idx.size == 1:
        out["message"] = "only one feasible node: chosen without scoring"
    return out


def _num(v) -> int | float:
    """numpy scalars as JSON numbers: integers stay integers (kube's scores are integers)."""
    return int(v) if np.asarray(v).dtype.kind in "iu" else float(v)
