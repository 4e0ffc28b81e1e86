"""`joulesched explain`: per-node, per-plugin scores for one pod on one cluster snapshot.

What kube-scheduler-simulator shows its users: feasibility with kube-style reasons, every plugin's score,
the weighted total and the chosen node.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from joulesched.agent.policy import Policy
from joulesched.cluster.state import ClusterState, PodRequest
from joulesched.core.errors import UsageError
from joulesched.power.curves import validate_curve


class SnapshotError(UsageError):
    """A snapshot file is malformed; the message names the field."""


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SnapPod(_M):
    cpu_m: int | None = Field(None, ge=0)
    memory_mib: int | None = Field(None, ge=0)


class SnapAlloc(_M):
    cpu_m: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    pods: int = Field(110, ge=0)


class SnapNode(_M):
    name: str = Field(min_length=1)
    allocatable: SnapAlloc
    pods: list[SnapPod] = Field(default_factory=list)
    usage_cpu_m: int = Field(0, ge=0)
    power_watts: list[float]

    @field_validator("power_watts")
    @classmethod
    def _curve(cls, v: list[float]) -> list[float]:
        return list(validate_curve(v))


class Snapshot(_M):
    nodes: list[SnapNode] = Field(min_length=1)
    pod: SnapPod


def load_snapshot(path: Path) -> tuple[ClusterState, PodRequest]:
    """Read a snapshot JSON into a ClusterState and the pod to place."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SnapshotError(f"{path}: snapshot file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SnapshotError(f"{path}: not valid JSON: {e}") from None
    try:
        snap = Snapshot.model_validate(raw)
    except ValidationError as e:
        parts = [f"{'.'.join(map(str, err['loc']))}: {err['msg'].removeprefix('Value error, ')}" for err in e.errors()]
        raise SnapshotError(f"{path}: invalid snapshot: " + "; ".join(parts)) from None
    names = [n.name for n in snap.nodes]
    try:
        st = ClusterState(names, [n.allocatable.cpu_m for n in snap.nodes], [n.allocatable.memory_mib for n in snap.nodes],
                          [n.allocatable.pods for n in snap.nodes], [n.power_watts for n in snap.nodes])
    except ValueError as e:
        raise SnapshotError(f"{path}: {e}") from None
    for i, n in enumerate(snap.nodes):
        for p in n.pods:
            st.bind(i, PodRequest(p.cpu_m, p.memory_mib))
        st.usage_cpu[i] = n.usage_cpu_m
    return st, PodRequest(snap.pod.cpu_m, snap.pod.memory_mib)


def explain(policy: Policy, st: ClusterState, pod: PodRequest, seed: int = 0) -> dict:
    """Every node's feasibility, reasons, scores (from the policy's Scorer) and total, and the chosen node."""
    policy.reset(st, np.random.default_rng(seed))
    mask = st.feasible(pod)
    idx = np.flatnonzero(mask)
    scores = policy.scorer.node_scores(st, pod, idx) if policy.scorer is not None and idx.size else None
    chosen = int(policy.choose(st, pod, mask)) if idx.size else None
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
    out = {"policy": policy.name, "pod": {"cpu_m": pod.cpu_m, "memory_mib": pod.memory_mib},
           "nodes": nodes, "chosen": st.names[chosen] if chosen is not None else None}
    if chosen is None:
        out["message"] = st.unschedulable_message(pod)
    elif idx.size == 1:
        out["message"] = "only one feasible node: chosen without scoring"
    return out


def _num(v) -> int | float:
    """numpy scalars as JSON numbers: integers stay integers (kube's scores are integers)."""
    return int(v) if np.asarray(v).dtype.kind in "iu" else float(v)
