"""The sleep-aware baselines, worked out by hand: which node each rule picks, and why."""

import numpy as np
import pytest
from typer.testing import CliRunner

from joulesched.agent.policy import PolicyError
from joulesched.agent.registry import HEURISTICS, SLEEP_AWARE_HEURISTICS, family_of, make_policy
from joulesched.agent.runner import run_policy
from joulesched.cluster.state import ASLEEP, WAKING, ClusterState, PodRequest
from joulesched.cluster.twin import Twin
from joulesched.pipelines.cli import app
from joulesched.pipelines.explain import explain
from tests.helpers import scenario, workload

LINEAR = [100.0 + 10.0 * k for k in range(11)]  # 100 W idle, 200 W at full load


def cluster(cpu, curves=None, asleep=(), waking=()):
    n = len(cpu)
    st = ClusterState([f"n{i}" for i in range(n)], cpu, [65536] * n, [110] * n, curves or [LINEAR] * n,
                      sleep_watts=[5.0] * n, can_sleep=True, wake_s=60)
    for i in asleep:
        st.power_state[i] = ASLEEP
    for i in waking:
        st.power_state[i] = WAKING
    return st


def pick(spec, st, pod, seed=0):
    pol = make_policy(spec)
    pol.reset(st, np.random.default_rng(seed))
    return pol.choose(st, pod, st.feasible(pod))


def test_they_are_sleep_aware_heuristics_in_every_best_heuristic_ratio():
    assert set(SLEEP_AWARE_HEURISTICS) == {"awake-first", "pabfd", "lifetime-aware"}
    assert set(SLEEP_AWARE_HEURISTICS) <= set(HEURISTICS)
    assert family_of("awake-first:fit=efficient,headroom=0.8") == "sleep-aware"


def test_awake_first_best_fit_among_awake_nodes_before_a_better_sleeping_one():
    # n0: 4 cores, 1 used; n1: 4 cores, 3 used; n2: asleep, 8 cores and the most efficient (25 W/core vs 50).
    st = cluster([4000, 4000, 8000], [LINEAR, LINEAR, [100.0 + 10 * k for k in range(11)]], asleep=[2])
    st.bind(0, PodRequest(1000, 100))
    st.bind(1, PodRequest(3000, 100))
    # 500m leaves 500m free on n1 (1/8 of it) and 2500m on n0 (5/8): best fit is n1; n2 stays asleep.
    assert pick("awake-first", st, PodRequest(500, 100)) == 1
    # 1500m fits n0 only among the awake ones: still not n2.
    assert pick("awake-first", st, PodRequest(1500, 100)) == 0


def test_a_waking_node_counts_as_awake():
    st = cluster([4000, 8000], waking=[0], asleep=[1])
    assert pick("awake-first", st, PodRequest(500, 100)) == 0
    assert pick("pabfd", st, PodRequest(500, 100)) == 0


def test_awake_first_wakes_the_most_efficient_sleeping_node_ties_to_the_larger():
    big = [50.0 + 15.0 * k for k in range(11)]  # 200 W at 8 cores: 25 W/core
    small = [40.0 + 6.0 * k for k in range(11)]  # 100 W at 4 cores: 25 W/core, a tie
    dear = [40.0 + 10.0 * k for k in range(11)]  # 140 W at 4 cores: 35 W/core
    st = cluster([2000, 4000, 8000, 4000], [LINEAR, small, big, dear], asleep=[1, 2, 3])
    st.bind(0, PodRequest(1800, 100))
    # Nothing awake fits 500m; n1 and n2 both cost 25 W/core at full load, n2 is larger.
    assert pick("awake-first", st, PodRequest(500, 100)) == 2
    assert pick("pabfd", st, PodRequest(500, 100)) == 2
    # Without n2, n1 (25 W/core) beats n3 (35 W/core).
    st.bind(2, PodRequest(8000, 100))
    assert pick("awake-first", st, PodRequest(500, 100)) == 1


def test_fit_efficient_orders_awake_nodes_by_watts_per_core_first():
    eff = [50.0 + 5.0 * k for k in range(11)]  # 100 W at 8 cores: 12.5 W/core, against 50 W/core for LINEAR
    st = cluster([4000, 8000], [LINEAR, eff])
    st.bind(0, PodRequest(3000, 100))
    assert pick("awake-first", st, PodRequest(500, 100)) == 0  # tightest: 500m left on n0
    assert pick("awake-first:fit=efficient", st, PodRequest(500, 100)) == 1


def test_headroom_keeps_requests_below_h_while_another_node_can_take_the_pod():
    st = cluster([4000, 4000, 4000], asleep=[2])
    st.bind(0, PodRequest(3000, 100))
    st.bind(1, PodRequest(1000, 100))
    pod = PodRequest(500, 100)
    assert pick("awake-first", st, pod) == 0  # best fit fills n0 to 3.5 of 4 cores
    assert pick("awake-first:headroom=0.8", st, pod) == 1  # 3.5/4 > 0.8; n1 would be at 1.5/4
    st.bind(1, PodRequest(2000, 100))  # n1 at 3/4: 3.5/4 > 0.8 on both awake nodes
    assert pick("awake-first:headroom=0.8", st, pod) == 2  # so the sleeping node is woken
    st.bind(2, PodRequest(3500, 100))  # n2 woken with 3.5 of 4 cores: no node within the headroom now
    st.power_state[2] = WAKING
    assert pick("awake-first:headroom=0.8", st, pod) == 2  # past the headroom, best fit; never left unplaced


def test_pabfd_picks_the_least_power_increase_on_requests():
    # n0 linear: 500m of 4000 adds 12.5 W. n1 idle-heavy then flat: 0-10 % costs 40 W, 10-20 % costs 2 W;
    # n1 already holds 400m (10 %), so 500m more (to 22.5 %) adds 2 + 0.25 * 2 = 2.5 W. PABFD picks n1,
    # best fit (tightest) would pick n0 whose 3000m requests leave 500m.
    steep = [60.0, 100.0, 102.0, 104.0, 106.0, 108.0, 110.0, 112.0, 114.0, 116.0, 118.0]
    st = cluster([4000, 4000], [LINEAR, steep])
    st.bind(0, PodRequest(3000, 100))
    st.bind(1, PodRequest(400, 100))
    pod = PodRequest(500, 100)
    assert pick("pabfd", st, pod) == 1
    assert pick("awake-first", st, pod) == 0
    scores = make_policy("pabfd").node_scores(st, pod, np.array([0, 1]))
    assert scores.plugins["PowerIncreaseW"][1].tolist() == pytest.approx([12.5, 2.5])


def test_scores_explain_the_choice():
    st = cluster([4000, 4000, 8000], asleep=[2])
    st.bind(1, PodRequest(3000, 100))
    pod = PodRequest(500, 100)
    for spec in ("awake-first", "pabfd"):
        res = explain(make_policy(spec), st, pod, 0)
        totals = {n["name"]: n["total"] for n in res["nodes"]}
        assert res["chosen"] == max(totals, key=totals.get)
        assert totals["n2"] < max(totals.values())  # the sleeping node scores below the awake ones


def test_ties_are_broken_by_the_run_generator():
    st = cluster([4000, 4000, 4000])
    picks = {pick("awake-first", st, PodRequest(500, 100), seed) for seed in range(20)}
    assert picks == {0, 1, 2}


def test_in_the_twin_a_sleeping_node_is_not_woken_while_an_awake_one_fits():
    # Two nodes asleep after 10 s; pods arrive at 100 s and 200 s, both fit one node. energy-greedy and
    # most-allocated may wake both; awake-first wakes one and keeps it.
    sc = scenario([{"count": 2, "cpu_m": 4000}], duration_s=1000,
                  idle={"mode": "sleep", "sleep_after_s": 10, "sleep_watts": 5, "wake_s": 20})
    wl = workload((100, 300, 1000, 10, 800), (200, 300, 1000, 10, 800))
    tw = Twin(sc, wl)
    r = run_policy(tw, make_policy("awake-first"), 0)
    assert len(set(tw.pod_node)) == 1 and r.completed_pods == 2
    # By hand: both nodes idle (100 W) on [0, 10), then asleep (5 W). The chosen node wakes at 100 (idle to
    # 120), runs p0 on [120, 420) and p1 on [200, 500) (800m of 4000 each: +20 W apiece on the linear curve),
    # is idle until 510 and sleeps again. The other sleeps from 10 to 1000.
    expected = (2 * 100 * 10 + 5 * 990 + 5 * (90 + 490) + 100 * (510 - 100) + 20 * 300 + 20 * 300)
    assert expected == 62850
    assert r.energy_joules == pytest.approx(expected)


@pytest.mark.parametrize("spec,message", [
    ("awake-first:headroom=-0.5", "headroom=-0.5 must be in (0, 1]"),
    ("awake-first:headroom=0", "must be in (0, 1]"),
    ("pabfd:headroom=1.5", "must be in (0, 1]"),
    ("awake-first:headroom=lots", "is not a number"),
    ("awake-first:fit=loosest", "fit='loosest' is not a fit order"),
])
def test_malformed_options_are_refused(spec, message):
    with pytest.raises(PolicyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_policy(spec)


def test_malformed_options_exit_2_in_the_cli(tmp_path):
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["benchmark", "-s", "scenarios/tiny.yaml", "-p", "awake-first:headroom=-1",
                                 "--out", str(out)])
    assert r.exit_code == 2 and "headroom" in r.output
    assert not out.exists()


@pytest.mark.parametrize("spec", ["pabfd", "awake-first:fit=efficient", "lifetime-aware", "gpu-energy"])
def test_empty_asleep_wakes_by_efficiency_rather_than_keep_an_empty_inefficient_node(spec):
    # n0: busy and full; n1: awake, empty, 50 W per core (100-200 W on 4 cores); n2: asleep, 25 W per core.
    big = [50.0 + 15.0 * k for k in range(11)]  # 200 W at 8 cores
    st = cluster([4000, 4000, 8000], [LINEAR, LINEAR, big], asleep=[2])
    st.bind(0, PodRequest(3000, 100), key="a")
    st.bind(0, PodRequest(1000, 100), key="b")
    pod = PodRequest(1000, 100)
    empty = f"{spec}{',' if ':' in spec else ':'}empty=asleep"
    assert pick(spec, st, pod) == 1  # by default an awake node is kept before any sleeping one is woken
    assert pick(empty, st, pod) == 2  # empty=asleep: waking's choice, the efficient node
    # A node with pods stays first, and an empty awake node goes before a sleeping node just like it.
    st.unbind(0, PodRequest(1000, 100), key="b")
    assert pick(empty, st, pod) == 0
    same = cluster([4000, 4000, 4000], asleep=[2])
    same.bind(0, PodRequest(4000, 100))
    assert pick(empty, same, pod) == 1


@pytest.mark.parametrize("spec", ["pabfd:empty=asleep", "gpu-energy:empty=asleep", "clairvoyant:empty=asleep"])
def test_empty_asleep_keeps_an_empty_node_that_never_sleeps_in_the_awake_tier(spec):
    # The cluster of the test above: n1 empty and awake, n2 asleep and more efficient. If n1 is protected (or the
    # cluster never sleeps) it is not about to sleep, so it is an awake node like any other.
    big = [50.0 + 15.0 * k for k in range(11)]
    st = cluster([4000, 4000, 8000], [LINEAR, LINEAR, big], asleep=[2])
    st.bind(0, PodRequest(4000, 100), key="a")
    pod = PodRequest(1000, 100)
    if spec.startswith("clairvoyant"):  # it reads the twin's lifetimes: shown here only to take the option
        make_policy(spec)
        return
    assert pick(spec, st, pod) == 2
    st.may_sleep[1] = False
    assert pick(spec, st, pod) == 1
    always_on = ClusterState(["n0", "n1"], [4000, 4000], [65536] * 2, [110] * 2, [LINEAR, big], can_sleep=False)
    assert not always_on.may_sleep.any()
    always_on.bind(1, PodRequest(1000, 100), key="a")
    # n0, empty, adds the fewest watts: the policy's own rule, as without the option (it was n1's, by the wake key).
    assert pick(spec, always_on, pod) == pick(spec.split(":")[0], always_on, pod) == 0


def test_the_twin_marks_protected_nodes_as_never_sleeping():
    nodes = [{"name_prefix": "cp", "never_sleep": True}, {"name_prefix": "w", "count": 2}]
    pods = workload((0.0, 10.0, 100, 100, 50.0))
    sleeping = scenario(nodes, idle={"mode": "sleep", "sleep_after_s": 60, "sleep_watts": 5, "wake_s": 30})
    assert Twin(sleeping, pods).state.may_sleep.tolist() == [False, True, True]
    assert Twin(scenario(nodes), pods).state.may_sleep.tolist() == [False, False, False]


def test_empty_must_be_awake_or_asleep():
    with pytest.raises(PolicyError, match="empty='sleep' is not one of awake, asleep"):
        make_policy("pabfd:empty=sleep")
    assert "asleep or empty" in make_policy("gpu-energy:empty=asleep").node_scores(
        cluster([4000, 4000]), PodRequest(100, 100), np.arange(2)).note


@pytest.mark.parametrize("spec", ["awake-first", "pabfd", "lifetime-aware"])
def test_a_best_effort_pod_does_not_always_go_to_the_most_over_committed_node(spec):
    """A best-effort pod passes the filter anywhere, and counts 100m / 200 MiB in kube's non-zero requests. Best fit
    on the unclipped free share chose the most over-committed node every time (a review: 581 of 584 best-effort
    pods, demand 4.8x capacity there); clipped at 0, as MostAllocated caps it, every full node ties (here memory
    ties too, so that the CPU key alone decides)."""
    st = cluster([1000, 1000])
    st.bind(0, PodRequest(1000, 4000))  # full by its request; 4,000 MiB as the best-effort pods' below
    for _ in range(20):
        st.bind(1, PodRequest(None, None))  # full by 20 best-effort pods' non-zero 100m each: 2x over-committed
    assert st.nz_cpu[1] > st.alloc_cpu[1] >= st.nz_cpu[0]
    chosen = {pick(spec, st, PodRequest(None, None), seed) for seed in range(16)}
    assert chosen == {0, 1}


def test_a_node_of_no_allocatable_cpu_or_memory_is_no_tight_fit():
    """A node reporting 0 allocatable read as 0 % free, the tightest fit: every packer put a pod of no requests
    there first (a review). MostAllocated scores such a resource 0, the least packed: read as wholly free."""
    from joulesched.agent.sleep_aware import free_shares
    from tests.helpers import LINEAR_100_200

    st = ClusterState(["zero", "n"], [0, 8000], [0, 8192], [110, 110], [LINEAR_100_200] * 2)
    cpu, mem = free_shares(st, PodRequest(0, 0), np.arange(2))
    assert cpu.tolist() == [1.0, 1.0] and mem.tolist() == [1.0, 1.0]
    pol = make_policy("awake-first")
    pol.reset(st, np.random.default_rng(1))
    picks = {int(pol.choose(st, PodRequest(0, 0), np.ones(2, dtype=bool))) for _ in range(40)}
    assert picks == {0, 1}  # a tie, drawn at random as kube-scheduler draws among equal scores
