"""The registry: one table of our own policies, third-party ones through entry points, derived policy sets;
and the Backend seam, proved by a backend written in this file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from joulesched.agent.policy import PolicyError
from joulesched.agent.registry import (BASELINES, BEST_HEURISTIC_CANDIDATES, BUILTIN, DEFAULT_POLICIES, GPU_POLICIES,
                                       HEURISTIC_FAMILIES, HEURISTIC_VARIANTS, HEURISTICS, SLEEP_AWARE_HEURISTICS,
                                       UPSTREAM_HEURISTICS, entries, entry, family_of, make_policy, policy_names)
from joulesched.agent.runner import run_policy
from joulesched.cluster.backend import Decision
from joulesched.cluster.state import ClusterState, PodRequest

ROOT = Path(__file__).resolve().parents[2]


def _install_plugin(site: Path) -> None:
    """A distribution with one ``joulesched.policies`` entry point, as ``pip install`` would leave it."""
    dist = site / "joulesched_fullest-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: joulesched-fullest\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[joulesched.policies]\nfullest-first = tests.support.plugin_policy:FullestFirst\n")


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    site = tmp_path / "site"
    _install_plugin(site)
    monkeypatch.syspath_prepend(str(site))
    return site


def test_policy_sets_come_from_the_table_metadata():
    assert BASELINES == [e.name for e in BUILTIN if e.family not in ("learned", "clairvoyant", "planner")]
    assert "dqn" not in BASELINES and "clairvoyant" not in BASELINES and BASELINES[0] == "default-k8s"
    assert "rollout" not in BASELINES  # twin only, seconds per decision
    assert set(UPSTREAM_HEURISTICS) <= set(HEURISTICS)
    assert set(HEURISTICS) == set(UPSTREAM_HEURISTICS) | set(SLEEP_AWARE_HEURISTICS) | set(GPU_POLICIES)
    assert {"fgd", "gpu-best-fit", "gpu-dot-product", "gpu-packing", "gpu-clustering", "gpu-random",
            "gpu-energy", "gpu-lifetime-aware"} == set(GPU_POLICIES)
    assert {"most-allocated", "peaks", "energy-greedy"} <= set(UPSTREAM_HEURISTICS)
    assert not {"default-k8s", "round-robin", "random"} & set(HEURISTICS)


def test_the_default_set_holds_every_baseline_and_every_registered_heuristic_variant():
    assert HEURISTIC_VARIANTS, "no registered variant: the test would prove nothing"
    gpu = [v for v in HEURISTIC_VARIANTS if family_of(v) == "gpu-aware"]  # default_policies(gpus=True) adds them
    assert gpu == ["gpu-energy:empty=asleep", "gpu-lifetime-aware:empty=asleep"]
    assert set(HEURISTIC_VARIANTS) - set(gpu) <= set(DEFAULT_POLICIES) and not set(gpu) & set(DEFAULT_POLICIES)
    assert set(HEURISTIC_VARIANTS) <= set(BEST_HEURISTIC_CANDIDATES)
    plain = [b for b in BASELINES if b not in GPU_POLICIES]  # the GPU heuristics run on GPU scenarios by name
    assert list(DEFAULT_POLICIES[:len(plain)]) == plain and len(set(DEFAULT_POLICIES)) == len(DEFAULT_POLICIES)
    assert set(BEST_HEURISTIC_CANDIDATES) == set(HEURISTICS) | set(HEURISTIC_VARIANTS)
    for v in HEURISTIC_VARIANTS:  # a variant is a heuristic spec that builds, not a new name
        assert family_of(v) in HEURISTIC_FAMILIES and make_policy(v).name == v


def test_descriptions_are_plain_text_with_only_spec_options():
    d = entry("dqn").description()
    assert ":class:" not in d and ":param" not in d and "``" not in d, d
    assert "QNetwork" in d and "MODEL: a checkpoint" in d and "threads:" in d
    assert "net, config" not in d and entry("dqn").options() == {"threads": "1", "sample": "off"}  # not code-only ones
    assert "fit=efficient orders" in entry("awake-first").description()
    with pytest.raises(PolicyError, match="unknown option 'config'"):
        make_policy("dqn:config=x")


def test_building_a_baseline_imports_no_torch():
    code = "import sys; from joulesched.agent.registry import make_policy; make_policy('peaks'); print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_options_and_descriptions_come_from_the_factories():
    assert entry("target-load-packing").options() == {"pct": "0", "x": "40"}
    assert "TargetLoadPacking" in entry("target-load-packing").description()


def test_a_plugin_is_one_module_and_an_entry_point(plugin):
    assert "fullest-first" in policy_names()
    e = entries()["fullest-first"]
    assert e.family == "third-party" and "fullest-first" not in BASELINES
    pol = make_policy("fullest-first:limit=0.5")
    assert pol.name == "fullest-first:limit=0.5" and pol.limit == 0.5
    with pytest.raises(PolicyError, match="unknown option 'cap'; its options: limit"):
        make_policy("fullest-first:cap=1")
    st = ClusterState(["a", "b"], [1000, 1000], [1024, 1024], [110, 110], [[10.0 * k for k in range(11)]] * 2)
    st.bind(1, PodRequest(400, 10))
    assert pol.choose(st, PodRequest(100, 10), st.feasible(PodRequest(100, 10))) == 1


def test_a_plugin_runs_in_the_benchmark_and_the_cli(plugin, tmp_path):
    """The installed plugin is what `joulesched benchmark -p` and `joulesched policies` see, worker processes
    included (spawned, so they find it through the same installed metadata)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), str(ROOT)])}
    out = tmp_path / "bench"
    r = subprocess.run([sys.executable, "-m", "joulesched.pipelines.cli", "benchmark", "-s",
                        str(ROOT / "scenarios" / "tiny.yaml"), "-p", "default-k8s", "-p", "fullest-first",
                        "--jobs", "2", "--no-report", "--json", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]["tiny"]["policies"]
    assert summary["fullest-first"]["energy_joules"] > 0 and "energy_vs_default" in summary["fullest-first"]
    doc = json.loads((out / "results.json").read_text())
    assert doc["scenarios"][0]["policies"]["fullest-first"]["placements"] > 0
    listed = subprocess.run([sys.executable, "-m", "joulesched.pipelines.cli", "policies"], capture_output=True,
                            text=True, env=env, timeout=60)
    assert "fullest-first" in listed.stdout.split()


class ListBackend:
    """The smallest Backend: pods from a list, nodes in a ClusterState, every pod bound where asked."""

    def __init__(self, nodes: int, pods: list[PodRequest], rebuild_after: int | None = None) -> None:
        self.n, self.pods, self.rebuild_after = nodes, pods, rebuild_after
        self.placed: list[int] = []
        self.states: list[ClusterState] = []

    def _state(self) -> ClusterState:
        st = ClusterState([f"n{i}" for i in range(self.n)], [1000] * self.n, [4096] * self.n, [110] * self.n,
                          [[50.0 + 5 * k for k in range(11)]] * self.n)
        for node, pod in zip(self.placed, self.pods):
            st.bind(node, pod)
        self.states.append(st)
        return st

    def begin(self) -> None:
        self.placed, self.states = [], []
        self.state = self._state()

    def next_decision(self) -> Decision | None:
        k = len(self.placed)
        if k == len(self.pods):
            return None
        if self.rebuild_after is not None and k == self.rebuild_after:
            self.state = self._state()  # as a live backend does when its node set changes
        pod = self.pods[k]
        return Decision(self.state, pod, self.state.feasible(pod), k)

    def bind(self, decision: Decision, node: int) -> None:
        assert decision.mask[node]
        decision.state.bind(node, decision.pod)
        self.placed.append(node)

    def abandon(self, decision: Decision, error: BaseException) -> None:
        raise error

    def result(self) -> list[int]:
        return self.placed


def test_run_policy_drives_any_backend():
    pods = [PodRequest(300, 100) for _ in range(6)]
    # LeastAllocated spreads: with 3 equal nodes each gets two pods.
    placed = run_policy(ListBackend(3, pods), make_policy("default-k8s"), seed=0)
    assert sorted(np.bincount(placed, minlength=3)) == [2, 2, 2]
    # MostAllocated packs: three on a node (900m of 1000m), then the next node.
    placed = run_policy(ListBackend(3, pods), make_policy("most-allocated"), seed=0)
    assert sorted(np.bincount(placed, minlength=3)) == [0, 3, 3]


def test_run_policy_resets_the_policy_when_the_backend_hands_out_a_new_state():
    class Counting:
        name, scorer = "counting", None

        def __init__(self):
            self.resets = []

        def reset(self, state, rng):
            self.resets.append(state)

        def choose(self, state, pod, mask):
            return int(np.flatnonzero(mask)[0])

    pol, backend = Counting(), ListBackend(2, [PodRequest(100, 10)] * 4, rebuild_after=2)
    run_policy(backend, pol, seed=1)
    assert pol.resets == backend.states and len(pol.resets) == 2


def test_a_policy_failure_reaches_the_backend():
    class Broken:
        name, scorer = "broken", None

        def reset(self, state, rng):
            pass

        def choose(self, state, pod, mask):
            raise ZeroDivisionError("policy bug")

    with pytest.raises(ZeroDivisionError):
        run_policy(ListBackend(2, [PodRequest(100, 10)]), Broken())


@pytest.mark.parametrize("spec", ["gpu-lifetime-aware:empty=asleep,empty=awake",
                                  "dqn=models/v2.pt:sample=auto,sample=5"])
def test_an_option_given_twice_is_an_error_not_the_last_one_winning(spec):
    with pytest.raises(PolicyError, match="option '(empty|sample)' is given twice"):
        make_policy(spec)


@pytest.mark.parametrize("n", ["-1", "257", "99999", "1000000000000"])
def test_dqn_threads_are_0_to_256(n):
    with pytest.raises(PolicyError, match=f"threads={n} must be 0 .leave them. to 256"):
        make_policy(f"dqn=models/v2.pt:threads={n}")


def test_a_sample_option_a_schema_1_model_cannot_use_is_refused_not_ignored():
    for bad in ("bogus", "auto", "50"):
        with pytest.raises(PolicyError, match="sample"):
            make_policy(f"dqn=models/small.pt:sample={bad}")
    make_policy("dqn=models/small.pt:sample=off")


def test_every_option_of_the_sleep_aware_frame_is_described():
    """policies --long: a policy that takes ``empty`` or ``headroom`` says what it does, whether or not its own
    docstring has the field."""
    for name in ("awake-first", "pabfd", "gpu-energy", "fgd", "gpu-random", "lifetime-aware", "gpu-lifetime-aware"):
        d = entry(name).description()
        assert "empty: awake" in d and "headroom: " in d, (name, d)
    assert "empty:" not in entry("most-allocated").description()  # only the options a policy takes
    # Defaults read as a spec gives them: text, whatever type the factory's default has.
    assert entry("default-k8s").options()["pct"] == "0" and entry("dqn").options()["threads"] == "1"
