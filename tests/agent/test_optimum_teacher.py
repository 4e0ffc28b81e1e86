"""The optimum as a teacher (agent/optimum_teacher.py, issue 27): its labels follow the MIP's schedule of the very
episode, a run that leaves it is re-solved from its own past (DAgger), episodes the MIP cannot state fall back to
``clairvoyant`` and sit out of a teacher pool, and solved schedules are cached on disk.

HiGHS (highspy) is the real solver; nothing here is mocked except where a test says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from joulesched.agent import optimum as opt
from joulesched.agent import optimum_teacher as ot
from joulesched.agent.config import DQNConfig
from joulesched.agent.policy import PolicyError
from joulesched.agent.registry import BASELINES, entry, make_policy
from joulesched.agent.runner import run_policy
from joulesched.agent.train import episode_teacher
from joulesched.cluster.scenario import Scenario, load_scenario
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload
from tests.agent.test_optimum import make

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "tests" / "support" / "scenarios" / "heldout-hetero-sleep-12.yaml"


def four_nodes(tmp: Path, seed: int, pods: int = 10) -> Scenario:
    """Two pairs of identical nodes that sleep (a small, low-idle pair and a large one), ``pods`` random jobs:
    instances the MIP solves in seconds, where the choice of node pays."""
    rng = np.random.default_rng(seed)
    rows, t = [], 0.0
    for _ in range(pods):
        t += float(rng.choice([0.0, 15.0, 45.0]))
        cpu = int(rng.choice([250, 500, 750]))
        rows.append((t, float(rng.choice([40.0, 90.0, 160.0])), cpu, 128, 0.9 * cpu))
    idle = {"mode": "sleep", "sleep_after_s": 20.0, "sleep_watts": 5.0, "wake_s": 15.0}
    big = [90.0 + 10.0 * k for k in range(11)]
    small = [40.0 + 8.0 * k for k in range(11)]
    return make(tmp, rows, [{"count": 2, "power_watts": small},
                            {"count": 2, "cpu_m": 3000, "memory_mib": 4096, "power_watts": big}], idle, 600.0)


def _run(sc: Scenario, spec: str, every: int = 0, seed: int = 0):
    """Run ``spec`` in the twin; with ``every`` > 0 every ``every``-th decision goes to another feasible node than
    its answer (a learner exploring). The run's result, the policy and the (pod, node) pairs of the run."""
    twin = Twin(sc, build_workload(sc, sc.seed))
    pol = make_policy(spec)
    pol.attach(twin)
    rng = np.random.default_rng(seed)
    twin.begin()
    k, pairs = 0, []
    while (d := twin.next_decision()) is not None:
        if k == 0:
            pol.reset(d.state, rng)
        a = pol.choose(d.state, d.pod, d.mask)
        k += 1
        if every and k % every == 0:
            other = np.flatnonzero(d.mask & (np.arange(len(d.mask)) != a))
            if other.size:
                a = int(other[rng.integers(other.size)])
        pairs.append((int(d.key), a))
        twin.bind(d, a)
    return twin.result(), pol, pairs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_its_labels_are_the_optimum_schedule_and_follow_it_to_the_joule(tmp_path, seed):
    sc = four_nodes(tmp_path, seed)
    res = opt.solve(opt.instance(sc, 0), time_limit=30.0)
    assert res.status == "optimal"
    run, pol, pairs = _run(sc, "optimum:time_limit=30")
    # Every decision answered from the schedule: its node, or the lowest-index node interchangeable with it.
    assert pol.stats["labels"] == len(pairs) and pol.stats["fallbacks"] == 0
    kinds = opt.instance(sc, 0).kinds
    assert all(kinds[n] == kinds[res.assignment[p]] for p, n in pairs)
    assert run.energy_joules == pytest.approx(res.energy_joules, rel=1e-9)
    for spec in ("awake-first:fit=efficient", "clairvoyant", "pabfd"):
        assert run.energy_joules <= run_policy(Twin(sc, build_workload(sc, sc.seed)), make_policy(spec), 0) \
            .energy_joules * (1 + 1e-9)


@pytest.mark.parametrize("seed", [1, 3])
def test_interchangeable_nodes_are_one_label_and_taking_another_of_them_keeps_the_schedule(tmp_path, seed):
    # The label among interchangeable nodes is the lowest index (a network's tie); a run that takes the highest
    # instead has not left the schedule: the two nodes' futures are swapped, nothing is re-solved, and the
    # run meters the optimum's energy all the same.
    sc = four_nodes(tmp_path, seed)
    res = opt.solve(opt.instance(sc, 0), time_limit=30.0)
    twin = Twin(sc, build_workload(sc, sc.seed))
    pol = make_policy("optimum:time_limit=30,resolve=50")
    pol.attach(twin)
    twin.begin()
    pol.reset(twin.state, np.random.default_rng(0))
    other = 0
    while (d := twin.next_decision()) is not None:
        label = pol.choose(d.state, d.pod, d.mask)
        assert label == min(pol._twins)
        a = max(pol._twins)
        other += a != label
        twin.bind(d, a)
    assert other >= 1
    assert pol.stats["left_schedule"] == 0 and pol.stats["resolves"] == 0
    assert twin.result().energy_joules == pytest.approx(res.energy_joules, rel=1e-9)


def test_a_run_that_leaves_the_schedule_is_re_solved_from_its_own_past(tmp_path):
    sc = four_nodes(tmp_path, 4, pods=14)
    _, pol, _ = _run(sc, "optimum:time_limit=20,resolve=50,resolve_s=3", every=4)
    assert pol.stats["left_schedule"] >= 2 and pol.stats["resolves"] == pol.stats["left_schedule"]
    assert pol.stats["resolve_failures"] == 0 and pol.stats["fallbacks"] == 0


def test_solve_rest_holds_the_past_and_never_ends_above_its_start(tmp_path):
    sc = four_nodes(tmp_path, 5, pods=14)
    wl = build_workload(sc, sc.seed)
    inst = opt.instance(sc, 0, workload=wl)
    # A past: the first six pods on the big nodes in turn (not what the optimum does), then best fit.
    twin = Twin(sc, wl)
    twin.begin()
    k = 0
    while (d := twin.next_decision()) is not None and k < 6:
        big = [i for i in (2, 3) if d.mask[i]]
        twin.bind(d, big[k % len(big)] if big else int(np.flatnonzero(d.mask)[0]))
        k += 1
    pol = make_policy("optimum:time_limit=20")
    pol.attach(twin)
    past = pol._past()
    assert past is not None and len(past) == 6
    hint = pol._continued(past)
    assert hint is not None and all(hint.assignment[p] == n for p, (n, _) in past.items())
    start = opt.replay(sc, 0, hint.assignment, wl).energy_joules
    rest = opt.solve_rest(inst, past, hint, time_limit=5.0)
    assert rest is not None and all(rest[p] == n for p, (n, _) in past.items())
    assert opt.replay(sc, 0, rest, wl).energy_joules <= start * (1 + 1e-9)
    moved = dict(hint.assignment)
    p0 = next(iter(past))
    moved[p0] = 1 - past[p0][0] if past[p0][0] < 2 else 5 - past[p0][0]
    with pytest.raises(ValueError, match="moves pod"):
        opt.solve_rest(inst, past, opt.Schedule("moved", moved, hint.starts), time_limit=2.0)


def test_episodes_the_mip_cannot_state_are_taught_as_clairvoyant_and_sit_out_of_a_pool():
    sc = load_scenario(HELDOUT)  # more nodes than the MIP takes
    twin = Twin(sc, build_workload(sc, 3))
    pol = make_policy("optimum")
    assert not pol.accepts(twin)
    a = run_policy(Twin(sc, twin.workload), make_policy("optimum"), 0)
    b = run_policy(Twin(sc, twin.workload), make_policy("clairvoyant"), 0)
    assert a.energy_joules == b.energy_joules
    cfg = DQNConfig(teacher_pool=("auto", "optimum"))
    assert episode_teacher(cfg, twin, 5) == "awake-first:fit=efficient"
    assert episode_teacher(DQNConfig(teacher_pool=("optimum",)), twin, 5) == "awake-first:fit=efficient"


def test_a_pool_takes_the_optimum_where_it_runs_the_episode_best(tmp_path):
    sc = four_nodes(tmp_path, 1)
    twin = Twin(sc, build_workload(sc, sc.seed))
    assert make_policy("optimum").accepts(twin)
    best = run_policy(Twin(sc, twin.workload), make_policy("awake-first:fit=efficient"), 5).energy_joules
    got = episode_teacher(DQNConfig(teacher_pool=("auto", "optimum:time_limit=30")), twin, 5)
    mine = run_policy(Twin(sc, twin.workload), make_policy("optimum:time_limit=30"), 5).energy_joules
    assert mine < 0.95 * best  # on this episode the optimum is 12 % below the heuristic
    assert got == "optimum:time_limit=30"


def test_schedules_are_cached_on_disk_and_a_bad_cache_file_is_named(tmp_path, monkeypatch):
    sc = four_nodes(tmp_path, 2)
    cache = tmp_path / "labels"
    ot._PLANS.clear()
    first, _, pairs = _run(sc, f"optimum:time_limit=30,cache={cache}")
    files = list(cache.glob("*.json"))
    assert len(files) == 1 and not list(cache.glob("*.tmp*"))
    doc = json.loads(files[0].read_text())
    assert {int(k): v for k, v in doc["assignment"].items()} == dict(pairs)
    ot._PLANS.clear()
    monkeypatch.setattr(opt, "solve", lambda *a, **k: pytest.fail("solved again despite the cache"))
    again, _, pairs2 = _run(sc, f"optimum:time_limit=30,cache={cache}")
    assert pairs2 == pairs and again.energy_joules == first.energy_joules
    ot._PLANS.clear()
    files[0].write_text("{not json")
    with pytest.raises(PolicyError, match=files[0].name):
        _run(sc, f"optimum:time_limit=30,cache={cache}")


def test_it_is_a_twin_only_reference_with_checked_options():
    e = entry("optimum")
    assert e.family == "clairvoyant" and "optimum" not in BASELINES
    for bad in ("optimum:time_limit=0", "optimum:resolve=-1", "optimum:resolve_s=nan", "optimum:nope=1"):
        with pytest.raises(PolicyError):
            make_policy(bad)
    with pytest.raises(PolicyError, match="cache=.* is a file; it names a folder"):  # was FileExistsError mid-run
        make_policy(f"optimum:cache={Path(__file__)}")
    with pytest.raises(PolicyError, match="twin only"):
        make_policy("optimum").attach(object())


def test_the_small_suites_arms_never_train_on_an_evaluation_workload():
    # The small suite is judged on its scenarios' seeds + 0..2; its trace replays have one workload whatever
    # the seed, so training on them would be training on the evaluation. The arms take the synthetic ones only,
    # on workload seeds that none of the evaluation's can be; the optimum arms are taught by `optimum`, the
    # planner's by `rollout` on the generators' model.
    from bench.dqn_ablation import ARMS, DEFAULT_ARMS, SMALL_ARMS, train_command
    from joulesched.agent.config import TrainConfig, with_overrides

    assert not set(SMALL_ARMS) & set(DEFAULT_ARMS) and set(SMALL_ARMS) <= set(ARMS)
    for arm, (scenarios, sets) in SMALL_ARMS.items():
        cmd = train_command(arm, 0, 100, Path("m.pt"))
        files = [cmd[k + 1] for k, x in enumerate(cmd) if x == "-s"]
        assert files and all(load_scenario(f).workload.synthetic is not None for f in files)
        cfg = with_overrides(TrainConfig(), list(sets)).dqn
        lo, hi = cfg.train_seed_range
        evaluation = {load_scenario(f).seed + k for f in (ROOT / "scenarios" / "small").glob("*.yaml")
                      for k in range(3)}
        assert not any(lo <= s < hi for s in evaluation)
        assert cfg.teacher.startswith("optimum:") == ("optimum" in arm)
        assert cfg.teacher.startswith("rollout:") == ("rollout" in arm)
        if cfg.teacher.startswith("optimum:"):
            assert make_policy(cfg.teacher).time_limit == 10.0  # the spec builds, with the documented budget
        elif cfg.teacher.startswith("rollout:"):  # the generators' model: what the arm trains on, not the run
            assert make_policy(cfg.teacher).future == "model"


def test_an_episode_that_swaps_nodes_leaves_the_cached_schedule_as_solved(tmp_path):
    # The schedule is cached per process; an episode's swaps among interchangeable nodes are its own.
    sc = four_nodes(tmp_path, 1)
    ot._PLANS.clear()
    twin = Twin(sc, build_workload(sc, sc.seed))
    pol = make_policy("optimum:time_limit=30")
    pol.attach(twin)
    (cached,) = ot._PLANS.values()
    snapshot = dict(cached)
    twin.begin()
    pol.reset(twin.state, np.random.default_rng(0))
    while (d := twin.next_decision()) is not None:
        pol.choose(d.state, d.pod, d.mask)
        twin.bind(d, max(pol._twins))
    assert pol._plan != snapshot  # the episode swapped nodes' futures ...
    assert ot._PLANS[next(iter(ot._PLANS))] == snapshot  # ... in its own copy
