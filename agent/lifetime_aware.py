"""A lifetime-aware sleep-aware packer: the strongest heuristic that knows what the DQN knows.

NILAS/LAVA-style (Barbalho et al., "LAVA: Lifetime-Aware VM Allocation with Learned Distributions and Adaptation
to Mispredictions", MLSys 2025: NILAS scores hosts by how a VM's predicted exit time fits the host's), on the
DQN's own online predictor (agent/predictor.py: learned only from the binds and ends the backend reports while
the run goes, re-predicted as pods age), so a learned policy that only matches it has learned nothing that a
rule on the same knowledge does not.

The waking rule is awake-first's (agent/sleep_aware.py): never wake a node while an awake one (on or waking)
can take the pod; when one must be woken, the fewest watts per core at full load, ties toward the larger node.
Among awake nodes, lower is better, in this order:

1. ``ExtendJ``: the awake time the pod would add to the node, priced at the node's idle draw:
   ``max(0, life - empty_in) x idle watts``, on log-2 classes of a minute at the cluster's largest idle draw
   (predictions are coarse; exact joules would let noise decide). ``life`` is the pod's predicted life,
   ``empty_in`` the node's predicted time until it holds no pod (0 when empty). A long-lived pod goes to a node
   that will stay awake anyway; an empty awake node (about to sleep) is the last awake choice for a long pod.
2. ``WattsPerCoreAwake``: the efficient node first (what makes ``awake-first:fit=efficient`` the strongest
   sleep-aware packer on heterogeneous clusters).
3. ``FitClass``: best fit, coarsely: the free CPU share left after placement in ``fit_classes`` classes (8:
   eighths of the node).
4. ``SlackClass``: within a fit class, among nodes the pod does not outlive, the one predicted to empty soonest
   after it (log-2 classes of ``empty_in - life``): pods that end together share nodes, and the nodes that stay
   up longest keep their room for long-lived pods (co-location by predicted end).
5. Exact best fit on CPU then memory requests (kube's non-zero requests), as awake-first.

Co-location first (no fit class) lost 1.5-3 % to best fit on the suite; inside eighths it gains 0.3-2 %
(docs/PERFORMANCE.md, "The lifetime-aware heuristic"). ``prediction=0`` drops the predictor (every life and
emptying time is unknown, so keys 1 and 4 tie and the classes only coarsen the best fit): the policy is then
exactly ``awake-first:fit=efficient``, the ablation that says what the prediction is worth.

``gpu-lifetime-aware`` (:class:`GpuLifetimeAware`) is the same rule on a GPU cluster, where the strongest rule
without prediction is ``gpu-energy``: keys 2 and 3 become ``gpu-energy``'s (CPU plus GPU watts added, then GPU
packing), the awake time is priced at the node's CPU and GPU idle draw, and it wakes as ``gpu-energy`` does; with
``prediction=0`` it is exactly ``gpu-energy``.
"""

from __future__ import annotations

import numpy as np

from joulesched.agent import fused
from joulesched.agent.baselines import _int_opt
from joulesched.agent.gpu_policies import gpu_energy_keys, gpu_wake_key, node_idle_watts
from joulesched.agent.predictor import PodPredictor, PredictorFeed
from joulesched.agent.sleep_aware import _SleepAware, free_shares, watts_per_core
from joulesched.cluster.state import ClusterState, PodRequest

#: Width of the lowest log-2 class: within a minute of awake time (or slack) the keys tie.
CLASS_S = 60.0


def log2_class(x: np.ndarray, unit: np.ndarray | float) -> np.ndarray:
    """0 for ``x <= unit``, else ``1 + floor(log2(x / unit))``: coarse classes that prediction noise rarely moves."""
    r = np.asarray(x, dtype=np.float64) / np.maximum(unit, 1e-12)
    with np.errstate(divide="ignore"):
        return np.where(r <= 1.0, 0.0, 1.0 + np.floor(np.log2(np.maximum(r, 1.0))))


#: What the keys after the lifetime ones know of power: ``cpu`` (``lifetime-aware``), watts per core and best fit
#: in classes; ``gpu`` (``gpu-lifetime-aware``), ``gpu-energy``'s keys (CPU plus GPU watts added, GPU packing,
#: best fit) and waking order, with the awake time a pod adds priced at the node's CPU and GPU idle draw.
POWER_KEYS = ("cpu", "gpu")


class LifetimeAware(_SleepAware):
    """Lifetime-aware packer (NILAS/LAVA-style) on the DQN's online lifetime predictor, with awake-first's waking
    rule: among awake nodes, least predicted awake time added (priced at idle watts), then watts per core, then
    best fit in eighths, then the node emptying soonest after the pod, then exact best fit; wakes the most
    efficient sleeping node only when none fits.

    :param headroom: as awake-first's (0 < h <= 1, default 1).
    :param empty: ``awake`` or ``asleep``, how an awake node without pods ranks (agent/sleep_aware.py).
    :param prediction: 0 drops the predictor (then the policy is awake-first:fit=efficient, the ablation).
    :param fit_classes: how coarse the best fit is before co-location by predicted end decides (1-1000).
    """

    name = "lifetime-aware"
    #: Which power the keys after the lifetime ones know (:data:`POWER_KEYS`).
    power = "cpu"
    #: choose() is handed the pod's metadata: the predictor keys lifetimes by app, QoS class and kind.
    uses_meta = True

    # No horizon_s option: the predictor's load horizon feeds only its load share, which these keys do not read
    # (a review: every value made the same decisions, so a sweep over it measured nothing).
    def __init__(self, headroom: str | float = "1", prediction: str = "1", fit_classes: str | int = "8",
                 empty: str = "awake") -> None:
        super().__init__(headroom, empty)
        self.fit_classes = _int_opt(self.name, "fit_classes", str(fit_classes), 1, 1000)
        use = _int_opt(self.name, "prediction", str(prediction), 0, 1)
        self.feed = PredictorFeed(PodPredictor() if use else None)
        self._meta = None
        self._names: list[str] | None = None

    # ---- the predictor's feed (run_policy calls these) ------------------------------------------------------
    def attach(self, backend: object) -> None:
        self.feed.attach(backend)
        self._names = None

    def detach(self, backend: object) -> None:
        self.feed.detach(backend)

    def warm(self) -> None:
        """Compile the predictor's view (agent/fused.py; once per process) before the first decision: a live
        scheduler calls it with no lock held, :meth:`reset` otherwise."""
        if self.feed.predictor is not None:
            fused.warm()

    def reset(self, state: ClusterState, rng: np.random.Generator) -> None:
        super().reset(state, rng)
        self.warm()
        p = self.feed.predictor
        if p is not None and self._names != state.names:
            p.set_nodes(state.names)
            self._names = list(state.names)

    # ---- keys ---------------------------------------------------------------------------------------------
    def _wake_key(self, st, pod, idx):
        return gpu_wake_key(st, pod, idx) if self.power == "gpu" else super()._wake_key(st, pod, idx)

    def _inner(self, st: ClusterState, pod: PodRequest, idx: np.ndarray) -> dict[str, np.ndarray]:
        lives = self._lives(st, idx)
        gpu = self.power == "gpu"
        if lives is None:
            extend = slack = np.zeros(idx.size)
        else:
            e, life = lives
            # A node kept awake draws its GPUs' idle too.
            idle = node_idle_watts(st, idx) if gpu else st.idle_watts[idx].astype(np.float64)
            top = float(node_idle_watts(st, np.arange(len(st))).max()) if gpu else float(st.idle_watts.max())
            # One unit for the whole cluster (a minute at the largest idle draw), so that an hour on a small node
            # costs less than an hour on a big one.
            extend = log2_class(self._added(e, life) * idle, CLASS_S * top)
            # Slack only orders the nodes the pod does not outlive; an extended node's slack is 0 (the extension
            # already ranks it).
            slack = np.where(extend == 0.0, log2_class(np.maximum(e - life, 0.0), CLASS_S), 0.0)
        if gpu:
            g = gpu_energy_keys(st, pod, idx)
            return {"ExtendJ": extend, "PowerIncreaseW": g["PowerIncreaseW"], "GpuPackingTier": g["GpuPackingTier"],
                    "SlackClass": slack, "FreeGpuShare": g["FreeGpuShare"], "FreeCpuShare": g["FreeCpuShare"]}
        free_cpu, free_mem = free_shares(st, pod, idx)
        wpc = watts_per_core(st, idx)
        fit_class = np.floor(np.clip(free_cpu, 0.0, 1.0) * self.fit_classes)
        return {"ExtendJ": extend, "WattsPerCoreAwake": wpc, "FitClass": fit_class, "SlackClass": slack,
                "FreeCpuShare": free_cpu, "FreeMemShare": free_mem}

    def _added(self, empty_in: np.ndarray, life: float | np.ndarray) -> np.ndarray:
        """The awake time the deciding pod adds to each node: its life (one, or one per node) past the node's
        emptying time."""
        return np.maximum(life - empty_in, 0.0)

    def _lives(self, st: ClusterState, idx: np.ndarray) -> tuple[np.ndarray, float] | None:
        """The predictor's view: per node of ``idx`` the seconds until it holds no pod (0: empty), and the
        deciding pod's life; None without the predictor."""
        p = self.feed.sync(st)
        if p is None:
            return None
        empty_in, _ = p.nodes(st.now, len(st))
        return empty_in[idx], float(p.pod_remaining(self._meta, 0.0))

    def node_scores(self, st, pod, idx, meta=None):
        self._meta = meta
        return super().node_scores(st, pod, idx)

    def choose(self, st: ClusterState, pod: PodRequest, mask: np.ndarray, meta=None) -> int:
        self._meta = meta
        return super().choose(st, pod, mask)


class GpuLifetimeAware(LifetimeAware):
    """``lifetime-aware`` that knows GPU power: the predictor-aware rule with what the schema-3 DQN reads. Among
    awake nodes, least predicted awake time added (priced at the node's CPU and GPU idle draw), then
    ``gpu-energy``'s keys: CPU plus GPU watts added, GPU packing's tiers, then the node predicted to empty soonest
    after the pod, then the least free GPU and CPU share; when no awake node fits, ``gpu-energy``'s waking rule
    (the fewest watts at full load per GPU, per core for a pod without GPUs).

    :param headroom: as awake-first's (0 < h <= 1, default 1).
    :param empty: ``awake`` or ``asleep``, how an awake node without pods ranks (agent/sleep_aware.py).
    :param prediction: 0 drops the predictor: the policy is then exactly ``gpu-energy``, the ablation.
    """

    name = "gpu-lifetime-aware"
    power = "gpu"
    wake_label = "WattsPerUnit"

    def __init__(self, headroom: str | float = "1", prediction: str = "1", empty: str = "awake") -> None:
        super().__init__(headroom, prediction, empty=empty)  # no best fit in classes: watts decide
