"""The trained DQN as a Policy: ``--policy dqn=models/small.pt`` works wherever the baselines do.

Greedy (epsilon = 0) always: exploration exists only inside agent/train.py. Each decision builds the feature
rows (numpy, no Python loop over nodes) and scores the feasible ones in one batched forward pass of the shared
scorer's trunk and advantage head under ``torch.inference_mode``; ties go to the lowest index. Empty nodes
whose rows repeat a lower-index empty node's row are scored once (exact: same argmax).

The model file's feature schema decides the rest. Schema 1 (``models/small.pt``) reads the state alone, the
twin's true departure times included: clairvoyant, it runs in the twin only (:meth:`DQNPolicy.attach`).
Schema 2 also reads the pod's metadata (``uses_meta``) and keeps an online lifetime predictor
(agent/predictor.py) fed by the backend: :meth:`DQNPolicy.attach`, which ``run_policy`` calls before a run,
subscribes it to the twin's binds and ends (``Twin.add_pod_observer``) or, on a cluster, to the scheduler cache's
pod events (``KubeCache.add_pod_listener``, through :class:`~joulesched.agent.predictor.KubePodFeed`). Its
attention reads every node; identical empty nodes are read once with their multiplicity (exact).

``sample=auto`` (or ``sample=PCT``) bounds the work per decision as kube-scheduler's percentageOfNodesToScore
does (issue 28): of a big cluster's busy nodes, the attention reads and the policy scores only a sample of
``k = num_nodes_to_score(N)`` columns (adaptive: ``max(5, 50 - N/125)`` % of the nodes, at least 100). The
sample always holds what matters to energy: the two heuristics' picks, the feasible awake nodes that fit the
pod most tightly and the most efficient busy ones (watts per core); every empty node is still read exactly
through its group of identical empty nodes (FeatureBuilderV2.groups: so the most efficient sleepers and
empty awake nodes of every kind are always candidates). The rest of the sample is a stride through the other
busy nodes from a start that rotates between decisions, each read with the weight of the nodes it stands for
(a log-count in the attention, as a group's), so the attention's summaries estimate the full ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from joulesched.agent import fused
from joulesched.agent.checkpoint import feature_names, load_model
from joulesched.agent.config import DQNConfig
from joulesched.agent.dqn import QNetwork, limit_threads
from joulesched.agent.features import FeatureBuilder, FeatureBuilderV2
from joulesched.agent.features_gpu import FeatureBuilderV3
from joulesched.agent.kube_scoring import num_nodes_to_score
from joulesched.agent.policy import NodeScores, PolicyError, Scorer
from joulesched.agent.predictor import PodPredictor, PredictorFeed
from joulesched.cluster.state import ClusterState, PodRequest


def make_predictor(cfg: DQNConfig) -> PodPredictor | None:
    """The predictor a schema-2 config asks for (None for schema 1 or without prediction)."""
    if cfg.feature_schema < 2 or not cfg.prediction:
        return None
    return PodPredictor(cfg.prediction_horizon_s, cfg.predictor_shrink, cfg.predictor_prior_s)

#: From this many feasible nodes on, empty nodes identical to a lower-index empty node are not scored again
#: (FeatureBuilder.candidates): same choice, far fewer rows in big, lightly loaded clusters.
DEDUPE_MIN = 64
#: With sampling, the busy nodes always in the sample: this many of the tightest fits and of the most efficient
#: (each at most an eighth of the sample), and of each heuristic's picks (an exact tie names every tied node:
#: thousands on a uniform cluster; the lowest-index ones are kept).
SAMPLE_FIT, SAMPLE_EFFICIENT, SAMPLE_PICKS = 32, 16, 16


def parse_sample(value: str | int | None) -> int | None:
    """The ``sample`` option: None (``off``: every node), 0 (``auto``: kube's adaptive percentage) or 1..100."""
    v = str(value).strip().lower() if value is not None else "off"
    if v in ("off", "none", "false", "no"):
        return None
    if v in ("auto", "0", "adaptive"):
        return 0
    try:
        pct = int(v)
    except ValueError:
        pct = -1
    if not 1 <= pct <= 100:
        raise PolicyError(f"policy 'dqn': option sample={value!r} must be off, auto or a percentage 1..100")
    return pct


#: The most intra-op threads a policy may ask for (the CLI's --workers has the same cap).
MAX_THREADS = 256


class DQNPolicy:
    """Greedy placement by a trained :class:`agent.dqn.QNetwork`.

    :param path: a checkpoint written by ``joulesched train`` (safetensors; anything else is refused).
    :param threads: torch's intra-op threads and numpy's BLAS threads, set when a run starts (:meth:`reset`;
        :func:`~joulesched.agent.dqn.limit_threads`): 1 is fastest for this small network, and a BLAS pool on
        every core spins beside the informer and binding threads. ``0`` leaves both alone.
    :param net, config: a network in memory and its config (training's validation), instead of a file.
    :param sample: ``off`` (every node), ``auto`` (kube-scheduler's adaptive percentageOfNodesToScore) or a
        percentage: schema 2's attention and scoring over a sample of the busy nodes (module docstring).
    """

    name = "dqn"
    net: torch.nn.Module
    meta: dict

    def __init__(self, path: str | None = None, threads: str | int = 1, net: torch.nn.Module | None = None,
                 config: DQNConfig | None = None, sample: str | int | None = "off") -> None:
        if net is None:
            if not path:
                raise PolicyError("policy 'dqn' needs a model file: dqn=models/NAME.pt")
            net, config, meta = load_model(Path(path))
        else:
            meta = {}
            if config is None:
                config = DQNConfig(feature_schema=1 if isinstance(net, QNetwork) else 2)
        self.cfg = config
        self.schema = config.feature_schema
        #: Schema 2 reads the pod's metadata (its predicted life, kind and QoS class).
        self.uses_meta = self.schema >= 2
        self.predictor = make_predictor(config)
        self.feed = PredictorFeed(self.predictor)
        try:
            threads = int(threads)
        except ValueError:
            raise PolicyError(f"policy 'dqn': option threads={threads!r} is not an integer") from None
        if not 0 <= threads <= MAX_THREADS:  # torch and OpenMP start them all: 99999 segfaulted, 1e12 overflowed
            raise PolicyError(f"policy 'dqn': option threads={threads} must be 0 (leave them) to {MAX_THREADS}")
        #: Applied when a run starts (:meth:`reset`, on the thread and in the process that decides), not here:
        #: building a policy only to check its spec, or in one process to run it in another, changes nothing.
        self.threads = threads
        self.net, self.meta, self.path = net, meta, path
        #: A model loaded from a file is this policy's alone and never trained: its folded inference weights are
        #: made once (:meth:`reset`) instead of checking 40 parameters' versions per decision.
        self._folded: dict | None = None
        self._feat: FeatureBuilder | None = None
        #: None: every node; 0: kube's adaptive percentage; else that percentage (schema 2 and later).
        self.sample_pct = parse_sample(sample)  # checked for every schema: a typo is never ignored
        if self.schema < 2 and self.sample_pct is not None:
            raise PolicyError(f"policy 'dqn': option sample={sample} needs a schema-2 or later model; {path} is "
                              f"schema {self.schema} (it scores every node)")
        #: A policy that samples itself: serve leaves its feasible set alone (``ServeConfig.sample_pct``).
        self.kube_sampling = self.sample_pct is not None
        self._sample_start = 0

    @property
    def scorer(self) -> Scorer:
        return self

    @property
    def twin_only(self) -> bool:
        """Whether it reads what only the twin knows (schema 1: pods' true end times); a cluster refuses it."""
        return self.schema < 2

    # ---- the predictor's feed -----------------------------------------------------------------------------
    def attach(self, backend: object) -> None:
        """Before a run (``run_policy``): a fresh predictor, subscribed to ``backend``'s pod events: the twin's
        ``add_pod_observer``, beside any other observer, or a live scheduler's cache
        (``backend.cache.add_pod_listener``; subscribed once per cache, the cache has no way to unsubscribe).
        Schema 1 runs in the twin only: its ``departure_soon`` column reads the twin's true end times of pods that
        have not ended (agent/features.py), which no cluster knows, so on one it would see a column it never
        trained on (always 1)."""
        if self.schema < 2 and not callable(getattr(backend, "due_ends", None)):
            raise PolicyError(f"policy 'dqn': {self.path or 'this model'} is a schema-1 model, which reads the "
                              "twin's true pod end times (clairvoyant): it runs in the twin only, not on "
                              f"{type(backend).__name__}; serve a schema-2 or later model (models/v2.pt)")
        self.feed.attach(backend)

    def detach(self, backend: object) -> None:
        """After a run: the twin stops reporting to this policy's predictor."""
        self.feed.detach(backend)

    def _builder(self, state: ClusterState) -> FeatureBuilder:
        if self.schema >= 2:
            builder = FeatureBuilderV3 if self.schema == 3 else FeatureBuilderV2
            feat: FeatureBuilder = builder(state, prediction=self.predictor is not None)
            if self.predictor is not None:
                self.predictor.set_nodes(state.names)
        else:
            feat = FeatureBuilder(state)
        self._feat = feat
        return feat

    def _rows(self, state: ClusterState, pod: PodRequest, mask: np.ndarray, meta=None) -> np.ndarray:
        feat = self._feat if self._feat is not None and self._feat.matches(state) else self._builder(state)
        if self.schema < 2:
            return feat.build(state, pod, mask)
        self.feed.sync(state)
        return feat.build(state, pod, mask, meta=meta, predictor=self.predictor)

    def warm(self) -> None:
        """Compile the decision path's loops (agent/fused.py; a few seconds, once per process). A live scheduler
        calls it before its first decision, with no lock held; :meth:`reset` does it otherwise."""
        if self.schema >= 2:
            fused.warm()

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None:
        # Before the cap: compiling loads a BLAS library of its own (scipy's), which a cap applied earlier would
        # not reach.
        self.warm()
        if self.threads > 0:
            limit_threads(self.threads)
        if self.path and self.schema >= 2:
            self._folded = self.net._folded_np()
        self._builder(state)

    def node_scores(self, state: ClusterState, pod: PodRequest, idx: np.ndarray, top: int = 3,
                    meta=None) -> NodeScores:
        """Each candidate's Q-value and advantage (the greedy choice maximises the advantage, which ranks nodes as
        Q does), and the ``top`` features that moved its advantage most: gradient x value, signed, per feature
        (the contribution relative to an all-zero row). ``meta``: the pod's metadata, as :meth:`choose` has it
        (schema 2 reads it: without it the rows, and so the scores shown, are not the ones the choice read)."""
        mask = np.zeros(len(state), dtype=bool)
        mask[idx] = True
        rows = torch.from_numpy(self._rows(state, pod, mask, meta).copy())
        with torch.inference_mode():
            q = self.net(rows[None], torch.from_numpy(mask)[None])[0].numpy().astype(np.float64)
        x = rows[torch.from_numpy(idx)].clone().requires_grad_(True)
        with torch.enable_grad():
            if self.schema >= 2:
                # The cluster's summaries are held fixed (read from every row), so each candidate's gradient is
                # the effect of its own row.
                adv = self._adv_with_fixed_summaries(rows, x)
            else:
                adv = self.net.advantages(x)
            adv.sum().backward()  # rows are scored independently, so each row's gradient is its own
        contrib = (x.grad * x).detach().numpy()
        a = adv.detach().numpy().astype(np.float64)
        names = feature_names(self.schema)
        feats = []
        for k in range(len(idx)):
            order = np.argsort(-np.abs(contrib[k]))[:top]
            feats.append([{"name": names[j], "value": float(x.detach()[k, j]), "contribution": float(contrib[k, j])}
                          for j in order])
        # The total is the advantage (Q = V + A ranks the nodes alike); Q is shown beside it, weight 0.
        return NodeScores(idx, {"Advantage": (1, a), "Q": (0, q[idx])}, a, feats)

    def _adv_with_fixed_summaries(self, rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        net = self.net
        s = net._summaries(net.embed(rows).detach(), None, None) if net.attention else None
        return net.adv(net._heads(net.embed(x), s)).squeeze(-1)

    @torch.inference_mode()
    def scores(self, state: ClusterState, pod: PodRequest, mask: np.ndarray, meta=None) -> np.ndarray:
        """Advantage of every node (higher is better); infeasible nodes get -inf."""
        rows = self._rows(state, pod, mask, meta)
        a = self.net.score(torch.from_numpy(rows), torch.arange(rows.shape[0])).numpy().astype(np.float64)
        return np.where(mask, a, -np.inf)

    @torch.inference_mode()
    def choose(self, state: ClusterState, pod: PodRequest, mask: np.ndarray, meta=None) -> int:
        idx = np.flatnonzero(mask)
        if idx.size == 1:
            return int(idx[0])
        if self.schema < 2:
            rows = self._rows(state, pod, mask, meta)
            feat = self._feat
            if idx.size >= DEDUPE_MIN:
                idx = feat.candidates(state, idx)
            if idx.size < rows.shape[0]:
                rows = rows[idx]
            a = self.net.advantages(torch.from_numpy(rows))
            return int(idx[int(torch.argmax(a))])
        feat = self._feat if self._feat is not None and self._feat.matches(state) else self._builder(state)
        self.feed.sync(state)
        groups = feat.groups(state, mask) if len(state) >= DEDUPE_MIN else None
        if self.sample_pct is not None and groups is not None:
            sampled = self._sample(feat, state, pod, mask, groups)
            if sampled is not None:
                cols, w, pos, picks = sampled
                node_t, ctx = self._columns(feat, state, pod, mask, cols, meta, picks)
                a = self.net.score_parts_np(node_t, ctx, pos, np.log(w).astype(np.float32), self._folded)
                return int(cols[pos[int(np.argmax(a))]])
        logw, pos = None, idx
        if groups is not None and groups[0].size < len(state):  # identical empty nodes read once (exact)
            reps, cnt = groups
            idx = feat.candidates(state, idx)
            node_t, ctx = self._columns(feat, state, pod, mask, reps, meta)
            logw = np.log(cnt).astype(np.float32)
            pos = np.searchsorted(reps, idx)
        else:
            node_t, ctx = feat.parts(state, pod, mask, meta=meta, predictor=self.predictor)
        a = self.net.score_parts_np(node_t, ctx, pos, logw, self._folded)
        return int(idx[int(np.argmax(a))])

    def _columns(self, feat, st: ClusterState, pod: PodRequest, mask: np.ndarray, cols: np.ndarray, meta,
                 picks=None) -> tuple[np.ndarray, np.ndarray]:
        """The node columns ``cols`` (and the shared ones): built for those columns only by schema 2's builder,
        or all built and then selected where a subclass adds columns of its own."""
        if type(feat).parts is FeatureBuilderV2.parts:
            return feat.parts_at(st, pod, mask, cols, meta=meta, predictor=self.predictor, picks=picks)
        node_t, ctx = feat.parts(st, pod, mask, meta=meta, predictor=self.predictor)
        return np.ascontiguousarray(node_t[:, cols]), ctx

    def _sample(self, feat, st: ClusterState, pod: PodRequest, mask: np.ndarray, groups=None) -> tuple | None:
        """The sampled columns (sorted), the number of nodes each stands for, the positions of the feasible
        ones among them and the heuristics' picks; None when the exact grouping alone is within the budget
        (module docstring). Compiled passes (agent/fused.py)."""
        n = len(st)
        k = num_nodes_to_score(n, self.sample_pct or 0)
        reps, cnt = feat.groups(st, mask) if groups is None else groups
        if reps.size <= k:  # the busy nodes and one column per empty group: within the budget
            return None
        empty = st.pods[reps] == 0
        picks = feat.compiled_picks(st, pod, mask)
        quota = max(1, k // 8)
        cols, w, pos, self._sample_start = fused.sample(
            mask, st.power_state, st.pods, feat.wpc, st.alloc_cpu, st.nz_cpu, pod.nz_cpu, picks[0], picks[1],
            reps[empty], cnt[empty], k, self._sample_start, SAMPLE_PICKS, min(SAMPLE_FIT, quota),
            min(SAMPLE_EFFICIENT, quota))
        return cols, w, pos, picks

