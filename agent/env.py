"""A Gymnasium environment over the twin: one step is one placement decision.

Spaces
------
The node count must be fixed per env instance, so observations are padded to ``max_nodes`` (by default the
largest cluster among the env's scenarios):

* ``observation["nodes"]``: float32 ``(max_nodes, n_features)``, one row per node (agent/features.py names
  every column of each schema; ``schema=2``, the default, or 1); rows past the cluster's real node count are
  zero. With schema 2 the env keeps the episode's lifetime predictor (agent/predictor.py), fed by the twin's
  binds and ends as they happen (``Twin.observe_pods``), and hands the pod's metadata to the features.
* ``observation["action_mask"]``: int8 ``(max_nodes,)``, 1 where the node is real and fits the pod.
* ``action_space``: ``Discrete(max_nodes)``. The same mask is in ``info["action_mask"]`` (bool) and
  :meth:`SchedulingEnv.action_masks` (the sb3-contrib convention).

A masked agent never picks an infeasible node. If one is given anyway (``check_env`` samples blindly), the pod
goes to the lowest-index feasible node, ``info["invalid_action"]`` is True and the reward carries
``RewardConfig.invalid_action_penalty``; the twin itself is never asked to break its filter.

Reward
------
Between two decisions the twin advances event by event. The reward of a decision is::

    r = -(dE + slo_j * V * dt + pending_j * P * dt) / scale      (+ the invalid-action penalty)

* ``dE``: joules the whole cluster used from this decision to the next (the twin's exact integral);
* ``V``: pods bound to nodes whose CPU demand exceeds allocatable / ``slo_fraction`` (their pods are served
  below the SLO fraction), measured right after the placement, and ``dt`` the seconds to the next decision;
* ``P``: pods pending (in the twin's queue, or bound to a node that is still waking), measured the same way;
* ``scale``: the largest node peak watts times ``reward.scale_seconds`` (600 s by default), i.e. "one big node
  for ten minutes", so that a reward unit means the same at 3 nodes and at 5,000.

``slo_j`` and ``pending_j`` turn pod-seconds into joule-equivalents (defaults: 200 J per pod-second below the
SLO, 10 J per pod-second pending; docs/dqn.md explains the choice). ``info["dt_s"]`` holds the simulated
seconds to the next decision, used for time-based discounting (a semi-MDP).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from joulesched.agent.config import LOAD_SCALE_RANGE, RewardConfig
from joulesched.agent.features import FeatureBuilder, FeatureBuilderV2, n_features
from joulesched.agent.features_gpu import FeatureBuilderV3
from joulesched.agent.predictor import PodPredictor
from joulesched.cluster.scenario import Scenario, load_scenario
from joulesched.cluster.state import WAKING
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload

OBS_LOW, OBS_HIGH = -1.0, 4.0


def scale_load(scenario: Scenario, factor: float) -> Scenario:
    """``scenario`` with ``factor`` times the pods arriving ``factor`` times as fast (synthetic workloads only;
    a trace workload is returned unchanged)."""
    syn = scenario.workload.synthetic
    if factor == 1.0 or syn is None:
        return scenario
    syn = syn.model_copy(update={"pods": max(1, int(round(syn.pods * factor))),
                                 "mean_interarrival_s": syn.mean_interarrival_s / factor})
    return scenario.model_copy(update={"workload": scenario.workload.model_copy(update={"synthetic": syn})})


class SchedulingEnv(gym.Env):
    """Place each pod of a twin run; episodes are whole runs of one scenario with a fresh workload seed.

    :param scenarios: scenario paths or loaded scenarios; each episode picks one uniformly (seeded).
    :param max_nodes: padded node dimension; default the largest scenario's node count. Must be >= it.
    :param reward: reward weights (:class:`RewardConfig`).
    :param workload_seeds: if given, episode workload seeds are drawn from this list; else any 31-bit seed.
    :param max_decisions: truncate an episode after this many placements (None: run to the end).
    :param load_scales: per episode, one factor ``f`` is drawn from this list and a synthetic workload gets ``f``
        times the pods at ``f`` times the arrival rate (domain randomisation: heavier load exposes overload and
        SLO violations that the nominal scenarios rarely show). ``(1.0,)`` keeps scenarios as written.

    :param schema: feature schema, 2 (default), 3 (schema 2 plus GPU columns, agent/features_gpu.py) or 1.
    :param predictor: schema 2's lifetime predictor (reset at every episode; ``"default"``: one with the default
        settings); None: the predicted columns are 0.

    ``reset(options={"scenario": i, "workload_seed": s, "load_scale": f})`` pins an episode's scenario and
    workload.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    scenarios: list[Scenario]
    max_nodes: int
    twin: Twin | None

    def __init__(self, scenarios: Sequence[Scenario | str | Path], *, max_nodes: int | None = None,
                 reward: RewardConfig | None = None, workload_seeds: Sequence[int] | None = None,
                 max_decisions: int | None = None, load_scales: Sequence[float] = (1.0,), schema: int = 2,
                 predictor: PodPredictor | None | str = "default") -> None:
        super().__init__()
        if schema not in (1, 2, 3):
            raise ValueError(f"schema must be 1, 2 or 3, got {schema}")
        self.schema = schema
        if isinstance(predictor, str):
            if predictor != "default":
                raise ValueError("predictor must be a PodPredictor, None or 'default'")
            predictor = PodPredictor()
        self.predictor = predictor if schema >= 2 else None
        self.n_features = n_features(schema)[0]
        if not scenarios:
            raise ValueError("SchedulingEnv needs at least one scenario")
        self.scenarios = [s if isinstance(s, Scenario) else load_scenario(s) for s in scenarios]
        biggest = max(s.node_count for s in self.scenarios)
        self.max_nodes = biggest if max_nodes is None else int(max_nodes)
        if self.max_nodes < biggest:
            raise ValueError(f"max_nodes={self.max_nodes} is smaller than the largest scenario ({biggest} nodes)")
        if max_decisions is not None and max_decisions < 1:
            raise ValueError("max_decisions must be >= 1")
        self.reward_cfg = reward or RewardConfig()
        self.workload_seeds = list(workload_seeds) if workload_seeds is not None else None
        self.max_decisions = max_decisions
        self.load_scales = [float(f) for f in load_scales]
        lo, hi = LOAD_SCALE_RANGE
        if not self.load_scales or any(not (lo <= f <= hi) for f in self.load_scales):
            raise ValueError(f"load_scales must be a non-empty list of factors in [{lo:g}, {hi:g}]")
        self.observation_space = spaces.Dict({
            "nodes": spaces.Box(OBS_LOW, OBS_HIGH, shape=(self.max_nodes, self.n_features), dtype=np.float32),
            "action_mask": spaces.MultiBinary(self.max_nodes),
        })
        self.action_space = spaces.Discrete(self.max_nodes)
        self.twin = None
        self._feat: FeatureBuilder | None = None
        self._obs = np.zeros((self.max_nodes, self.n_features), dtype=np.float32)
        self._mask = np.zeros(self.max_nodes, dtype=bool)
        self._twins: dict[tuple[int, int], Twin] = {}
        self.scenario_index = 0
        self.workload_seed = 0
        self.load_scale = 1.0
        self.decisions = 0
        self.decision = None

    # ---- gymnasium API --------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        i = options.get("scenario")
        i = int(self.np_random.integers(len(self.scenarios))) if i is None else int(i)
        ws = options.get("workload_seed")
        if ws is None:
            ws = (int(self.np_random.choice(self.workload_seeds)) if self.workload_seeds
                  else int(self.np_random.integers(2**31 - 1)))
        f = options.get("load_scale")
        f = (float(self.load_scales[int(self.np_random.integers(len(self.load_scales)))]) if f is None
             else float(f))
        self.scenario_index, self.workload_seed, self.load_scale = i, int(ws), f
        sc = scale_load(self.scenarios[i], f)
        key = (i, self.workload_seed, f)
        twin = self._twins.get(key)
        if twin is None:
            if len(self._twins) > 64:  # bounded cache: workloads are cheap to rebuild
                self._twins.clear()
            twin = self._twins[key] = Twin(sc, build_workload(sc, self.workload_seed))
        twin.reset()
        self.twin = twin
        if self.schema >= 2:
            builder = FeatureBuilderV3 if self.schema == 3 else FeatureBuilderV2
            self._feat = builder(twin.state, prediction=self.predictor is not None)
            if self.predictor is not None:
                self.predictor.reset()
                self.predictor.set_nodes(twin.state.names)
            twin.observe_pods(self.predictor)
        else:
            self._feat = FeatureBuilder(twin.state)
        self._scale = float(twin.state.peak_watts.max()) * self.reward_cfg.scale_seconds
        self._slo_limit = twin.state.alloc_cpu / twin.scenario.slo_fraction
        self.decisions = 0
        self.decision = twin.next_decision()
        if self.decision is None:
            raise RuntimeError(f"scenario {sc.name!r} (workload seed {ws}) has no pod to place")
        return self._observe(), self._info(dt=0.0, invalid=False)

    def step(self, action):
        tw = self.twin
        if tw is None or tw.done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        cfg = self.reward_cfg
        a = int(action)
        n = len(tw.state)
        invalid = not (0 <= a < n and bool(tw.mask[a]))
        if invalid:
            a = int(np.argmax(tw.mask))
        tw.place(a)
        self.decisions += 1
        st = tw.state
        viol = int(st.pods[st.usage_cpu > self._slo_limit].sum())
        pend = tw.pending_pods + int(st.pods[st.power_state == WAKING].sum())
        e0, t0 = tw.energy_joules, tw.now
        self.decision = tw.next_decision()
        terminated = self.decision is None
        de, dt = tw.energy_joules - e0, tw.now - t0
        reward = -(de + (cfg.slo_joules_per_pod_s * viol + cfg.pending_joules_per_pod_s * pend) * dt) / self._scale
        if invalid:
            reward -= cfg.invalid_action_penalty
        truncated = (not terminated and self.max_decisions is not None and self.decisions >= self.max_decisions)
        obs = self._observe() if not terminated else self._terminal_obs()
        info = self._info(dt=dt, invalid=invalid)
        info.update(energy_j=de, slo_pods=viol, pending_pods=pend)
        return obs, float(reward), terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """Bool (max_nodes,): True where the current pod may go."""
        return self._mask.copy()

    # ---- helpers ----------------------------------------------------------------------------------------------
    def _observe(self) -> dict[str, np.ndarray]:
        tw = self.twin
        n = len(tw.state)
        if self.schema >= 2:
            self._feat.build(tw.state, tw.request, tw.mask, out=self._obs[:n], meta=self.decision.meta,
                             predictor=self.predictor)
        else:
            self._feat.build(tw.state, tw.request, tw.mask, out=self._obs[:n])
        self._mask[:n] = tw.mask
        self._mask[n:] = False
        return {"nodes": self._obs.copy(), "action_mask": self._mask.astype(np.int8)}

    def _terminal_obs(self) -> dict[str, np.ndarray]:
        self._obs[:] = 0.0
        self._mask[:] = False
        return {"nodes": self._obs.copy(), "action_mask": self._mask.astype(np.int8)}

    def _info(self, *, dt: float, invalid: bool) -> dict[str, Any]:
        return {"action_mask": self._mask.copy(), "dt_s": float(dt), "time_s": float(self.twin.now),
                "invalid_action": invalid, "n_nodes": len(self.twin.state), "scenario": self.scenario_index}
