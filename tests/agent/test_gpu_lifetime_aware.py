"""``gpu-lifetime-aware``, the predictor-aware packer that knows GPU power (agent/lifetime_aware.py), and
``clairvoyant:power=gpu``: the keys worked out by hand, the ablation (no prediction is exactly ``gpu-energy``),
honesty (no decision reads a duration the run has not seen), and its place in every best-heuristic comparison."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from joulesched.agent.policy import PolicyError
from joulesched.agent.registry import (BEST_HEURISTIC_CANDIDATES, DEFAULT_POLICIES, GPU_POLICIES, HEURISTIC_VARIANTS,
                                       family_of, make_policy)
from joulesched.agent.runner import run_policy
from joulesched.cluster.scenario import load_scenario
from joulesched.cluster.state import PodRequest
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import PodMeta, build_workload
from tests.agent.test_gpu_energy import T4, V100, cluster
from tests.support.decisions import decisions, unseen_durations
from tests.support.predictor import taught_policy

ROOT = Path(__file__).resolve().parents[2]
MINI_FITTED = ROOT / "scenarios" / "openb" / "mini" / "openb-mini-fitted.yaml"
LONG = PodMeta(kind="job", owner_kind="Job", app="train", qos_class="Burstable")
SHORT = PodMeta(kind="job", owner_kind="Job", app="etl", qos_class="Burstable")
NEW = PodMeta(kind="job", owner_kind="Job", app="infer", qos_class="Burstable")


def _cluster(counts=(2, 2), curves=(T4, T4), models=("T4", "T4"), asleep=(), cpu_m=None):
    """Two 2-T4 nodes by default; the CPU and GPU curves are linear, so equal requests add equal watts."""
    return cluster(counts, curves, models, asleep, cpu_m)


def test_a_long_gpu_pod_joins_the_node_that_stays_awake_where_gpu_energy_packs_the_shared_gpu():
    st = _cluster()
    pol, pred = taught_policy("gpu-lifetime-aware", st, {LONG: [36000.0] * 20, SHORT: [300.0] * 20, NEW: [7200.0] * 20})
    for node, key, meta, pod in ((0, "a", LONG, PodRequest(4000, 100, gpu=1)),  # a whole T4, ~10 h
                                 (1, "b", SHORT, PodRequest(4000, 100, gpu=1, gpu_milli=500))):  # half a T4, ~5 min
        st.bind(node, pod, key)
        pred.bound(st.now, key, node, meta, 4000.0)
    pod = PodRequest(2000, 100, gpu=1, gpu_milli=300)
    mask = st.feasible(pod)
    # Equal watts added on both (linear curves, equal requests); gpu-energy then packs the partly used GPU.
    assert make_policy("gpu-energy").choose(st, pod, mask) == 1
    # Two hours on n1 would keep it (and its GPUs) awake ~2 h longer; on n0 it adds nothing.
    assert pol.choose(st, pod, mask, meta=NEW) == 0
    scores = pol.node_scores(st, pod, np.flatnonzero(mask), meta=NEW)
    assert list(scores.plugins)[:4] == ["Tier", "ExtendJ", "PowerIncreaseW", "GpuPackingTier"]
    extend = scores.plugins["ExtendJ"][1]
    assert extend[0] == 0.0 and extend[1] > 0.0
    # A pod that outlives neither node: the lifetime keys tie, and it goes where gpu-energy puts it.
    assert pol.choose(st, pod, mask, meta=SHORT) == 1


def test_it_wakes_as_gpu_energy_does_by_watts_per_gpu():
    # The V100 node has twice the cores: the CPU rule (watts per core at full load) would wake it.
    st = _cluster((8, 2), (V100, T4), ("V100", "T4"), asleep=(0, 1), cpu_m=[128000, 64000])
    pod = PodRequest(1000, 100, gpu=1)
    assert make_policy("lifetime-aware").choose(st, pod, st.feasible(pod), meta=NEW) == 0
    pol, _ = taught_policy("gpu-lifetime-aware", st, {})
    assert pol.choose(st, pod, st.feasible(pod), meta=NEW) == 1
    scores = pol.node_scores(st, pod, np.flatnonzero(st.feasible(pod)), meta=NEW)
    assert np.allclose(scores.plugins["WattsPerUnit"][1], [325.0, 170.0])  # (200 + 8 x 300) / 8, (200 + 140) / 2


def test_the_awake_time_it_adds_is_priced_at_the_cpu_and_gpu_idle_draw():
    """Node 0's four GPUs idle at 60 W each and add little when used; node 1's one GPU idles at 5 W and adds much.
    Both empty in about five minutes and a two-hour pod would keep either awake as long: priced at the CPU's idle
    alone the two extensions tie and the smaller watts added (node 0) would win; with the GPUs' idle, keeping
    node 0 awake costs 340 W against 105, a higher class, and the pod goes to node 1."""
    flat = [60.0 + 1.0 * k for k in range(11)]  # 3 W for 0.3 of a GPU
    steep = [5.0 + 20.0 * k for k in range(11)]  # 60 W for 0.3 of a GPU
    st = _cluster((4, 1), (flat, steep), ("A", "B"))
    pol, pred = taught_policy("gpu-lifetime-aware", st, {SHORT: [300.0] * 20, NEW: [7200.0] * 20})
    for node, key in ((0, "a"), (1, "b")):
        st.bind(node, PodRequest(4000, 100), key)
        pred.bound(st.now, key, node, SHORT, 4000.0)
    pod = PodRequest(2000, 100, gpu=1, gpu_milli=300)
    mask = st.feasible(pod)
    scores = pol.node_scores(st, pod, np.flatnonzero(mask), meta=NEW)
    extend, watts = scores.plugins["ExtendJ"][1], scores.plugins["PowerIncreaseW"][1]
    assert extend[0] > extend[1] > 0 and watts[0] < watts[1]
    assert pol.choose(st, pod, mask, meta=NEW) == 1


def test_without_prediction_it_is_exactly_gpu_energy():
    sc = load_scenario(MINI_FITTED)
    wl = build_workload(sc, sc.seed)
    a, b, c = Twin(sc, wl), Twin(sc, wl), Twin(sc, wl)
    ra = run_policy(a, make_policy("gpu-energy:empty=asleep"), 3)
    rb = run_policy(b, make_policy("gpu-lifetime-aware:prediction=0,empty=asleep"), 3)
    run_policy(c, make_policy("gpu-lifetime-aware:empty=asleep"), 3)
    assert list(a.pod_node) == list(b.pod_node) and ra.energy_joules == rb.energy_joules
    # The prediction moves decisions (else the policy would be a renamed gpu-energy).
    assert list(c.pod_node) != list(a.pod_node)


def test_decisions_never_depend_on_durations_not_yet_seen():
    # The real trace's three days on the full cluster: enough long-lived pods run across the cut.
    sc = load_scenario(ROOT / "scenarios" / "openb" / "openb-3days.yaml")
    wl = build_workload(sc, sc.seed)
    twin = Twin(sc, wl)
    base = decisions(twin, make_policy("gpu-lifetime-aware"), 5)
    t_cut, dur, before = unseen_durations(wl, twin, cut=300)
    again = decisions(Twin(sc, dataclasses.replace(wl, duration_s=dur)), make_policy("gpu-lifetime-aware"), 5,
                      until=t_cut)
    assert [n for n, b in zip(again, before) if b] == [n for n, b in zip(base, before) if b]


def test_joulesched_test_and_the_sim_pipeline_compare_with_it_on_a_gpu_cluster(tmp_path):
    """``evaluate`` (``joulesched test``) and ``run_sim`` (``pipeline --env sim``) without a policy list run the
    GPU-aware heuristics where the scenario has GPUs; a policy named again beside them runs once."""
    from joulesched.agent.registry import GPU_DEFAULTS
    from joulesched.pipelines.sim_pipeline import run_sim
    from joulesched.pipelines.training import evaluate

    mini = ROOT / "scenarios" / "openb" / "mini" / "openb-mini-w10000k.yaml"
    model = ROOT / "models" / "gpu.short.pt"
    res = evaluate(model, [mini], lower=False, optimum=False)
    case = res["scenarios"][0]
    assert set(GPU_DEFAULTS) <= set(case["rows"]) and family_of(case["best_heuristic"]) == "gpu-aware"
    # The GPU-aware rules are sleep-aware too: on a GPU cluster the sleep-aware reference is the best of them.
    assert family_of(case["best_sleep_aware"]) == "gpu-aware"
    doc = run_sim([mini], tmp_path / "sim", model=model, extra_policies=["gpu-energy"])
    assert set(GPU_DEFAULTS) <= set(doc.policies) and doc.policies.count("gpu-energy") == 1


def test_it_is_a_gpu_aware_heuristic_in_every_best_heuristic_comparison():
    assert family_of("gpu-lifetime-aware") == "gpu-aware" and "gpu-lifetime-aware" in GPU_POLICIES
    assert "gpu-lifetime-aware" in BEST_HEURISTIC_CANDIDATES
    assert "gpu-lifetime-aware:empty=asleep" in HEURISTIC_VARIANTS
    # In the default set where a scenario has GPUs, as the other GPU-aware ones (on a CPU cluster it would be a
    # lifetime-aware PABFD).
    assert not {"gpu-lifetime-aware", "gpu-lifetime-aware:empty=asleep"} & set(DEFAULT_POLICIES)
    with pytest.raises(PolicyError, match="unknown option 'fit_classes'"):
        make_policy("gpu-lifetime-aware:fit_classes=8")


def test_clairvoyant_with_gpu_keys_reads_the_true_end_and_knows_gpu_power():
    sc = load_scenario(MINI_FITTED)
    wl = build_workload(sc, sc.seed)
    runs = {}
    for spec in ("clairvoyant:power=gpu", "gpu-energy", "clairvoyant"):
        twin = Twin(sc, wl)
        runs[spec] = (run_policy(twin, make_policy(spec), 3).energy_joules, list(twin.pod_node))
    # Not gpu-energy renamed, nor the CPU keys' clairvoyant.
    assert runs["clairvoyant:power=gpu"][1] != runs["gpu-energy"][1]
    assert runs["clairvoyant:power=gpu"][1] != runs["clairvoyant"][1]
    with pytest.raises(PolicyError, match="power='tpu' is not one of cpu, gpu"):
        make_policy("clairvoyant:power=tpu")
    with pytest.raises(PolicyError, match="fit_classes=8 has no effect with power=gpu"):
        make_policy("clairvoyant:power=gpu,fit_classes=8")
