"""Library functions behind `joulesched train` and `joulesched test`.

``train`` creates the model when the file is missing (refusing to overwrite one unless ``resume`` or
``overwrite`` is set), trains it on the twin and writes, next to the model:

* ``NAME.json``: the checkpoint's metadata (hyperparameters, scenarios, seed, steps, wall time);
* ``NAME.curve.csv`` and ``NAME.curve.png``: the training curve (episode returns, validation score).

``evaluate`` runs the model greedily beside every baseline on the same workloads (seed ``s`` of a scenario is
workload seed ``scenario.seed + s``, as in the benchmark) and returns a JSON-ready table with the ratios to
default-k8s, to the best heuristic, to the best sleep-aware heuristic and to the optimum or the best proven
bound (agent/optimum.py: the MIP on small constant-usage instances, the LP and fluid bounds elsewhere,
``unsupported`` for services and usage profiles).

Rollouts and validation runs go to an executor: in this process (``workers=1``), a local process pool
(``executor="local"``, ``workers=N``) or Ray (``executor="ray"``). The tasks carry their seeds and weights and
are collected in order, so a run gives the same model on any of them (agent/train.py).
"""

from __future__ import annotations

import copy
import csv
import io
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from joulesched.agent.checkpoint import check_model_path, load_agent, load_checkpoint, save_checkpoint
from joulesched.agent.config import DQNConfig, RewardConfig, TrainConfig
from joulesched.agent.dqn import DQN
from joulesched.agent.registry import (
    BEST_HEURISTIC_CANDIDATES,
    default_policies,
    family_of,
    heuristics_among,
    make_policy,
)
from joulesched.agent.runner import run_policy
from joulesched.agent.train import SerialExecutor, Validator
from joulesched.agent.train import train as train_loop
from joulesched.cluster.scenario import Scenario, load_scenario
from joulesched.cluster.twin import Twin
from joulesched.cluster.workload import build_workload
from joulesched.core.errors import UsageError
from joulesched.core.fsio import atomic_savefig, atomic_write_text, check_output_file
from joulesched.core.names import check_ray_address
from joulesched.core.plots import plain_text_figures
from joulesched.pipelines.progress import progress_bar
from joulesched.pipelines.stats import mean_ci
from joulesched.pipelines.suite import REPO_ROOT

logger = logging.getLogger(__name__)


class TrainError(UsageError):
    """Bad train/test arguments; the message says how to fix them."""


EXECUTORS = ("local", "ray")
#: The sleep-aware heuristics "the best sleep-aware heuristic" is taken over (the headroom table's set).
SLEEP_AWARE = tuple(h for h in BEST_HEURISTIC_CANDIDATES if family_of(h) == "sleep-aware")


class PoolExecutor:
    """Rollouts on a local pool of spawned worker processes (pipelines/pool.py: one Ctrl-C stops them all)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._ctx = None
        self.pool = None

    def __enter__(self) -> "PoolExecutor":
        from joulesched.pipelines.pool import process_pool

        self._ctx = process_pool(self.workers)
        self.pool = self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> bool | None:
        return self._ctx.__exit__(*exc)

    def map_async(self, fn, tasks):
        from joulesched.pipelines.pool import map_async

        return map_async(self.pool, fn, tasks)  # a worker that dies is an error, not a wait for ever


class _RayPending:
    def __init__(self, refs) -> None:
        self.refs = refs

    def get(self) -> list:
        import ray

        return ray.get(self.refs)


class RayExecutor:
    """Rollouts as Ray tasks, on ``address`` or on a local Ray started with ``workers`` CPUs (no dashboard,
    nothing listening off-host), shut down afterwards if this started it."""

    def __init__(self, workers: int, address: str | None = None) -> None:
        self.workers, self.address = workers, address
        self._started = False
        self._remote: dict = {}

    def __enter__(self) -> "RayExecutor":
        try:
            import ray
        except ModuleNotFoundError:
            raise TrainError("--executor ray needs Ray: pip install 'joulesched[sweep]' (or ray)") from None
        if not ray.is_initialized():
            kw = {} if self.address else {"num_cpus": self.workers}
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False, configure_logging=False,
                     **kw)
            self._started = True
        return self

    def __exit__(self, *exc) -> None:
        if self._started:
            import ray

            ray.shutdown()

    def map_async(self, fn, tasks):
        import ray

        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = ray.remote(num_cpus=1)(fn)
        return _RayPending([remote.remote(t) for t in tasks])


#: More decisions than any recipe here trains (v2: 400,000 in 27 minutes): a typo's extra digits, not a plan.
MAX_STEPS = 1_000_000_000


def make_executor(workers: int = 1, executor: str = "local", ray_address: str | None = None):
    """A context manager giving the executor (module docstring): serial for one local worker."""
    import contextlib

    if executor not in EXECUTORS:
        raise TrainError(f"unknown executor {executor!r}; use {' or '.join(EXECUTORS)}")
    if workers < 1:
        raise TrainError(f"--workers must be >= 1, got {workers}")
    if executor == "ray":
        return RayExecutor(workers, ray_address)
    if workers == 1:
        return contextlib.nullcontext(SerialExecutor())
    return PoolExecutor(workers)


@dataclass
class TrainSummary:
    model: str
    steps: int
    total_steps: int
    episodes: int
    wall_s: float
    best_validation_score: float
    best_step: int
    curve_csv: str
    curve_png: str | None
    resumed: bool


def _shown_path(p) -> str:
    """A scenario's path as the model's record keeps it: relative to the repository when inside it (so a
    shipped model's record does not name the machine it was trained on)."""
    p = Path(p)
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def _curve_paths(model: Path) -> tuple[Path, Path]:
    stem = model.with_suffix("")
    return Path(f"{stem}.curve.csv"), Path(f"{stem}.curve.png")


def check_teachers(cfg: DQNConfig) -> None:
    """The teacher and the teacher pool are policies that can be built (:class:`TrainError` naming the field)."""
    for field_, specs in (("dqn.teacher", [cfg.teacher]), ("dqn.teacher_pool", list(cfg.teacher_pool))):
        for t_spec in specs:
            try:
                make_policy(t_spec) if t_spec != "auto" else None
            except UsageError as e:
                raise TrainError(f"{field_}: {e}") from None


def load_resumed(model: Path, seed: int = 0) -> tuple[DQN, dict, RewardConfig]:
    """What ``--resume`` trains with: the model's agent (its hyperparameters, not the defaults), its metadata, and
    the reward weights it stored (checked by :func:`load_agent`; ``{}``, the defaults, where it stored none)."""
    agent, meta = load_agent(model, seed=seed)
    return agent, meta, RewardConfig(**meta["reward"])


def check_budget(minutes: float | None, steps: int | None) -> None:
    """A training budget: exactly one of ``minutes`` (0, 1440] and ``steps`` 1..:data:`MAX_STEPS`; else
    :class:`TrainError`. Pipelines check it before they touch their folder."""
    if (minutes is None) == (steps is None):
        raise TrainError("give exactly one of --minutes or --steps")
    if minutes is not None and not (0 < minutes <= 24 * 60):
        raise TrainError(f"--minutes must be in (0, 1440], got {minutes}")
    if steps is not None and steps < 1:
        raise TrainError(f"--steps must be >= 1, got {steps}")
    if steps is not None and steps > MAX_STEPS:
        raise TrainError(f"--steps must be at most {MAX_STEPS:,} (some 45 days of training on 2 cores), got {steps}")


def train(scenarios: Sequence[Path | Scenario], model: Path, *, minutes: float | None = None,
          steps: int | None = None, resume: bool = False, overwrite: bool = False, seed: int = 0,
          progress: bool = True, config: TrainConfig | None = None, validate: bool = True, threads: int = 1,
          on_progress: Callable[[int, float, float], None] | None = None, workers: int = 1,
          executor: str = "local", ray_address: str | None = None) -> TrainSummary:
    """Train (or resume) a DQN on ``scenarios`` (files or loaded scenarios) for ``minutes`` of wall time or
    ``steps`` decisions, with ``config`` (default: :class:`~joulesched.agent.config.TrainConfig`'s defaults),
    its rollouts on ``workers`` processes of ``executor`` (the same model whichever)."""
    check_budget(minutes, steps)
    if not scenarios:
        raise TrainError("give at least one --scenario")
    if seed < 0:
        raise TrainError(f"--seed must be >= 0, got {seed}")
    if executor not in EXECUTORS:
        raise TrainError(f"unknown executor {executor!r}; use {' or '.join(EXECUTORS)}")
    if ray_address is not None and executor != "ray":
        raise TrainError("--ray-address needs --executor ray")
    check_ray_address(ray_address)
    if workers < 1:
        raise TrainError(f"--workers must be >= 1, got {workers}")
    # Before any work (the pipeline calls this too, not only `train`): NAME.json is the model's metadata copy.
    model = check_model_path(check_output_file(model, "--model"))
    for side in (model.with_suffix(".json"), *_curve_paths(model)):  # written beside it once training is over
        check_output_file(side, f"--model {model}: its")
    if resume and not model.exists():
        raise TrainError(f"--resume: {model} does not exist; drop --resume to create it")
    if model.exists() and not resume and not overwrite:
        raise TrainError(f"{model} exists; pass --resume to continue training it or --overwrite to replace it")
    loaded = [s if isinstance(s, Scenario) else load_scenario(s) for s in scenarios]  # errors name the field
    for sc in loaded:  # the model written over a scenario or its trace replaced it with a safetensors file
        check_output_file(model, "--model", inputs=sc.input_files)
    if threads > 0:
        torch.set_num_threads(threads)
    prev_training: dict = {}
    if resume:
        if config is not None:
            raise TrainError("--resume keeps the model's hyperparameters; do not pass a config")
        agent, meta, reward = load_resumed(model, seed)
        prev_training = meta.get("training", {})
    else:
        config = config or TrainConfig()
        agent, reward = DQN(config.dqn, seed=seed), config.reward
    cfg: DQNConfig = agent.cfg
    check_teachers(cfg)
    validator = Validator(loaded, cfg) if validate else None

    bar_cb, bar_ctx = _progress_bar(progress, steps, minutes)
    cb = on_progress
    if bar_cb is not None:
        cb = bar_cb if on_progress is None else (lambda s, r, e: (bar_cb(s, r, e), on_progress(s, r, e)))
    t0 = time.perf_counter()
    with bar_ctx, make_executor(workers, executor, ray_address) as ex:
        log = train_loop(loaded, agent, total_steps=steps,
                         total_seconds=None if minutes is None else minutes * 60.0, seed=seed, resumed=resume,
                         validator=validator, progress=cb, reward=reward, executor=ex)
    wall = time.perf_counter() - t0
    total_steps = int(prev_training.get("steps", 0)) + log.steps
    training = {
        "scenarios": [_shown_path(s.source) if s.source else s.name for s in loaded],
        "scenario_names": [s.name for s in loaded], "seed": seed,
        # The curves the twin trained on: a calibrated scenario exists only in memory, so this is its record.
        "node_curves": {s.name: {g.name_prefix: list(g.curve) for g in s.nodes} for s in loaded},
        "steps": total_steps, "episodes": int(prev_training.get("episodes", 0)) + log.episodes,
        "wall_s": round(float(prev_training.get("wall_s", 0.0)) + wall, 1),
        "runs": list(prev_training.get("runs", [])) + [{
            "steps": log.steps, "wall_s": round(wall, 1), "resumed": resume, "seed": seed,
            "workers": workers, "executor": executor, "scenarios": [s.name for s in loaded],
            "budget": {"minutes": minutes, "steps": steps}, "best_step": log.best_step,
            "best_validation_score": None if math.isinf(log.best_score) else round(log.best_score, 5),
            "teachers": dict(log.teachers),
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__}],
        "workload_seeds": f"{cfg.train_seed_range[0]}..{cfg.train_seed_range[1] - 1} (validation "
                          f"{', '.join(map(str, cfg.validation_seeds))}; benchmark seeds are scenario.seed + 0..k)",
    }
    save_checkpoint(model, agent, training, reward=asdict(reward))
    csv_path, png_path = _curve_paths(model)
    _write_curve(csv_path, log.rows, append=resume, offset=total_steps - log.steps,
                 wall_offset=float(prev_training.get("wall_s", 0.0)))
    png = _plot_curve(csv_path, png_path)
    return TrainSummary(str(model), log.steps, total_steps, log.episodes, round(wall, 1),
                        log.best_score, log.best_step, str(csv_path), str(png) if png else None, resume)


def _progress_bar(enabled: bool, steps: int | None, minutes: float | None):
    import contextlib

    if not enabled:
        return None, contextlib.nullcontext()
    prog = progress_bar(percent=True)
    total = float(steps) if steps is not None else float(minutes) * 60.0
    task = prog.add_task("training", total=total, item="")
    t0 = time.perf_counter()

    def cb(step: int, running: float, eps: float) -> None:
        done = step if steps is not None else time.perf_counter() - t0
        stat = f"step {step:,}  reward(20 ep) {running:,.1f}  eps {eps:.2f}" if not math.isnan(running) else \
            f"step {step:,}  eps {eps:.2f}"
        prog.update(task, completed=min(done, total), item=stat)

    return cb, prog


_CURVE_FIELDS = ["step", "episode", "wall_s", "scenario", "episode_return", "epsilon", "loss", "eval_score"]


def _write_curve(path: Path, rows, append: bool, offset: int = 0, wall_offset: float = 0.0) -> None:
    """The training curve, written whole through a temp file: on a resumed run, the earlier runs' rows (kept
    only if the file is a curve: one that is not is replaced, with a warning, never half-appended to), then
    this run's, whose steps and wall seconds count on from the model's (``offset``, ``wall_offset``: what it
    had trained before this run)."""
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(_CURVE_FIELDS)
    if append and path.exists():
        try:
            with path.open(encoding="utf-8", newline="") as fh:
                old = list(csv.reader(fh))
            if not old or old[0] != _CURVE_FIELDS or any(len(r) != len(_CURVE_FIELDS) for r in old[1:]):
                raise ValueError("not a training curve")
            w.writerows(old[1:])
        except (OSError, UnicodeDecodeError, ValueError, csv.Error) as e:
            logger.warning("%s: %s; it is replaced by this run's curve", path, e)
    for r in rows:
        d = asdict(r)
        d["step"] += offset
        d["wall_s"] += wall_offset
        w.writerow(["" if isinstance(d[k], float) and math.isnan(d[k]) else
                    (round(d[k], 5) if isinstance(d[k], float) else d[k]) for k in _CURVE_FIELDS])
    atomic_write_text(path, out.getvalue())


def _plot_curve(csv_path: Path, png_path: Path) -> Path | None:
    with csv_path.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        return None
    with plain_text_figures():  # scenario names are text: a "$" is no mathtext
        return _draw_curve(rows, png_path)


def _draw_curve(rows: list[dict], png_path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    by_sc: dict[str, list[tuple[int, float]]] = {}
    val: list[tuple[int, float]] = []
    for r in rows:
        if r["scenario"] == "validation":
            if r["eval_score"]:
                val.append((int(r["step"]), float(r["eval_score"])))
        elif r["episode_return"]:
            # One legend entry per scenario (load factors and every randomised cluster's own label folded in),
            # one for the teacher's demonstrations: the legend stays readable.
            name = r["scenario"]
            if name.startswith("demo "):
                name = "demonstrations (teacher)"
            elif name.startswith("random-"):
                name = "randomised clusters"
            else:
                name = name.split(" x")[0]
            by_sc.setdefault(name, []).append((int(r["step"]), float(r["episode_return"])))
    for name, pts in by_sc.items():
        x, y = zip(*pts)
        ax1.plot(x, y, ".-", label=name, alpha=0.8)
    ax1.set_ylabel("episode return")
    if by_sc:
        ax1.legend(fontsize=8)
    ax1.set_title("DQN training curve")
    if val:
        x, y = zip(*val)
        ax2.plot(x, y, "o-", color="black")
    ax2.set_ylabel("validation: energy / best\nsleep-aware heuristic (+ SLO,\npending penalties), lower is better",
                   fontsize=8)
    ax2.set_xlabel("decisions (environment steps)")
    fig.tight_layout()
    atomic_savefig(fig, png_path, dpi=90)
    plt.close(fig)
    return png_path


# ---- evaluation -----------------------------------------------------------------------------------------------
def evaluate(model: Path, scenarios: Sequence[Path], seeds: int = 1, *, baselines: Sequence[str] | None = None,
             lower: bool = True, optimum: bool = True, optimum_time_limit: float = 20.0) -> dict:
    """Greedy runs of the model beside ``baselines`` (None: the default set, every baseline and variant, with the
    GPU-aware ones on a scenario with GPUs) and every sleep-aware heuristic on ``seeds`` workloads of each scenario.

    Returns ``{"model", "training", "scenarios": [{"name", "nodes", "seed", "rows": {policy: metrics},
    "ratio_vs_default", "ratio_vs_best_heuristic", "best_heuristic", "ratio_vs_best_sleep_aware",
    "best_sleep_aware", "ratio_vs_lower_bound", "optimum": {...}, "ratio_vs_optimum", "ratio_vs_bound",
    "gap_closed"}], "summary"}``. With ``optimum``, agent/optimum.py's entry per scenario and seed: the MIP's
    best schedule on instances it takes, as the twin replays it (``ratio_vs_optimum``), the best proven bound
    (MIP, bind-on-arrival LP, LP or fluid: ``ratio_vs_bound``), ``unsupported`` for services and usage profiles;
    ``gap_closed`` is (best sleep-aware - dqn) / (best sleep-aware - optimum, or the bound where there is none).
    """
    from joulesched.agent.lower_bound import lower_bound
    from joulesched.agent.optimum import check_time_limit, optimum_entry, window_with_schedule

    if seeds < 1:
        raise TrainError("--seeds must be >= 1")
    if optimum:
        check_time_limit(optimum_time_limit, "--optimum-time-limit")
    model = Path(model)
    meta = load_checkpoint(model).meta  # PolicyError on a bad file, before any work
    spec = f"dqn={model}"
    out = {"model": str(model), "training": meta.get("training", {}), "feature_schema": meta.get("feature_schema"),
           "scenarios": []}
    built: dict[str, object] = {}  # each spec built once (the model read once), copied for each run as benchmark does
    for p in scenarios:
        sc = load_scenario(p)
        base = default_policies(sc.has_gpus) if baselines is None else baselines
        policies = [spec] + [b for b in base if b != spec]
        policies += [h for h in SLEEP_AWARE if h not in policies]
        for k in range(seeds):
            seed = sc.seed + k
            wl = build_workload(sc, seed)
            twin = Twin(sc, wl)
            runs = {}
            for pol in policies:
                proto = built[pol] if pol in built else built.setdefault(pol, make_policy(pol))
                runs[pol] = run_policy(twin, copy.deepcopy(proto), seed)
            opt, replay = None, []
            if optimum:
                opt = optimum_entry(sc, k, time_limit=optimum_time_limit, workload=wl, on_replay=replay.append)
            rows = {}  # every policy and the optimum's schedule metered over one window, as the benchmark does
            for pol, r in window_with_schedule(runs, opt, replay[0] if replay else None).items():
                rows["dqn" if pol == spec else pol] = {
                    "energy_joules": r.energy_joules, "slo_violation_rate": r.slo_violation_rate,
                    "mean_pending_s": r.mean_pending_s, "unschedulable_pods": r.unschedulable_pods,
                    "decision_us_p99": r.decision_us_p99}
            entry = {"name": sc.name, "nodes": sc.node_count, "seed": seed, "rows": rows}
            e = rows["dqn"]["energy_joules"]
            if "default-k8s" in rows and rows["default-k8s"]["energy_joules"] > 0:  # 0 J: curves that draw nothing
                entry["ratio_vs_default"] = e / rows["default-k8s"]["energy_joules"]
                entry["slo_vs_default_pp"] = 100 * (rows["dqn"]["slo_violation_rate"]
                                                    - rows["default-k8s"]["slo_violation_rate"])
            heur = [h for h in heuristics_among(rows) if h != "dqn"]
            if heur:
                best = min(heur, key=lambda h: rows[h]["energy_joules"])
                entry["best_heuristic"] = best
                if rows[best]["energy_joules"] > 0:
                    entry["ratio_vs_best_heuristic"] = e / rows[best]["energy_joules"]
            # Every GPU-aware heuristic is sleep-aware too (the same frame): on a GPU cluster they are its best.
            sleepy = [h for h in rows if h in SLEEP_AWARE or (sc.has_gpus and family_of(h) == "gpu-aware")]
            best_sa = min(sleepy, key=lambda h: rows[h]["energy_joules"])
            entry["best_sleep_aware"] = best_sa
            e_sa = rows[best_sa]["energy_joules"]
            if e_sa > 0:  # a ratio to 0 J is no ratio: left out, as the benchmark writes null
                entry["ratio_vs_best_sleep_aware"] = e / e_sa
            entry["pending_vs_best_sleep_aware"] = (rows["dqn"]["mean_pending_s"]
                                                    - rows[best_sa]["mean_pending_s"])
            if lower:
                lb = lower_bound(twin.state, twin.fastest_workload(), sc.duration_s, twin.placeable)
                entry["lower_bound_joules"] = lb.joules
                if lb.joules > 0:  # (curves that start at 0 W can make it 0)
                    entry["ratio_vs_lower_bound"] = e / lb.joules
            if opt is not None:
                entry["optimum"] = opt
                if opt["status"] != "unsupported":
                    # As agent/optimum.py's certify states them: the schedule as the twin meters it, and the
                    # best bound (the MIP's, the bind-on-arrival LP's, the LP's or the fluid one).
                    ref, bound = opt.get("schedule_joules"), opt.get("best_bound_joules")
                    if ref:
                        entry["ratio_vs_optimum"] = e / ref
                    if bound:
                        entry["ratio_vs_bound"] = e / bound
                    target = ref if ref else bound
                    if target is not None and e_sa - target > 1e-9 * e_sa:
                        entry["gap_closed"] = (e_sa - e) / (e_sa - target)
            out["scenarios"].append(entry)
    out["summary"] = _summary(out["scenarios"])
    return out


RATIOS = ("ratio_vs_default", "ratio_vs_best_heuristic", "ratio_vs_best_sleep_aware", "ratio_vs_lower_bound",
          "ratio_vs_optimum", "ratio_vs_bound", "gap_closed")


def _summary(entries: list[dict]) -> dict:
    """Per scenario, each DQN ratio's mean over the seeds with its Student-t 95 % half-width and n."""
    by_name: dict[str, list[dict]] = {}
    for e in entries:
        by_name.setdefault(e["name"], []).append(e)
    return {name: {k: mean_ci([e[k] for e in es]) for k in RATIOS if all(k in e for e in es)}
            for name, es in by_name.items()}


def format_table(result: dict) -> str:
    """A plain-text table: per scenario and seed, every policy's energy ratio to default-k8s and SLO rate, then
    the DQN's ratios to the best heuristic, the best sleep-aware heuristic and the optimum or bound."""
    lines = []
    for s in result["scenarios"]:
        ref = s["rows"].get("default-k8s", {}).get("energy_joules")
        lines.append(f"{s['name']} ({s['nodes']} nodes, seed {s['seed']})")
        lines.append(f"  {'policy':30s} {'energy kWh':>11s} {'vs default':>10s} {'SLO viol %':>10s} {'pending s':>9s}")
        for name, m in sorted(s["rows"].items(), key=lambda kv: kv[1]["energy_joules"]):
            ratio = f"{m['energy_joules'] / ref:.3f}" if ref else "-"
            lines.append(f"  {name:30s} {m['energy_joules'] / 3.6e6:11.2f} {ratio:>10s} "
                         f"{100 * m['slo_violation_rate']:10.2f} {m['mean_pending_s']:9.1f}")
        extra = []
        if "ratio_vs_best_heuristic" in s:
            extra.append(f"dqn / best heuristic ({s['best_heuristic']}) = {s['ratio_vs_best_heuristic']:.3f}")
        if "ratio_vs_best_sleep_aware" in s:
            extra.append(f"dqn / best sleep-aware ({s['best_sleep_aware']}) = {s['ratio_vs_best_sleep_aware']:.3f}")
        if "ratio_vs_lower_bound" in s:
            extra.append(f"dqn / lower bound = {s['ratio_vs_lower_bound']:.3f}")
        if extra:
            lines.append("  " + "; ".join(extra))
        opt = s.get("optimum")
        if opt is not None:
            if opt["status"] == "unsupported":
                lines.append("  optimum: unsupported (services or usage profiles; the lower bound above still holds)")
            else:
                parts = []
                if "ratio_vs_optimum" in s:
                    gap = f", gap {100 * opt['gap']:.1f} %" if opt.get("gap") is not None else ""
                    parts.append(f"dqn / optimum ({opt['status']}{gap}) = {s['ratio_vs_optimum']:.3f}")
                if "ratio_vs_bound" in s:
                    parts.append(f"dqn / best bound = {s['ratio_vs_bound']:.3f}")
                if "gap_closed" in s:
                    parts.append(f"share of the sleep-aware heuristic's gap closed = {100 * s['gap_closed'] + 0.0:.0f} %")
                lines.append("  " + "; ".join(parts))
    for name, ratios in result.get("summary", {}).items():
        if any(r["n"] > 1 for r in ratios.values()):
            parts = [f"{k.removeprefix('ratio_vs_').replace('_', ' ')} {r['mean']:.3f}"
                     + (f" ± {r['ci95']:.3f}" if r["ci95"] is not None else "") for k, r in ratios.items()]
            n = max(r["n"] for r in ratios.values())
            lines.append(f"{name}, dqn over {n} seeds (mean ± Student-t 95 %): " + "; ".join(parts))
    return "\n".join(lines)


__all__ = ["TrainError", "TrainSummary", "evaluate", "format_table", "train"]
