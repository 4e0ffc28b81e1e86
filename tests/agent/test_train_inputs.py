"""What `joulesched train` and the checkpoint loader refuse, and what a run never writes (a review, 2026-12-06).

Knobs that would hang the loop or quietly break the update, a model file whose metadata or training state is
garbled (refused with its reason, exit 2, before any work), weights that are not finite (never written over a
model), a resumed run's own episodes, and the Ctrl-C message of `train`.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from joulesched.agent.checkpoint import CheckpointError, load_agent, load_checkpoint, save_checkpoint, tensors_digest
from joulesched.agent.config import ConfigError, DQNConfig, TrainConfig, with_overrides
from joulesched.agent.dqn import DQN
from joulesched.agent.policy import PolicyError
from joulesched.agent.train import SerialExecutor, TrainingDiverged, Validator, episode_specs, train
from joulesched.cluster.scenario import load_scenario
from joulesched.pipelines.cli import app

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "tiny.yaml"
runner = CliRunner()
SMALL_NET = dict(hidden=8, attention_dim=4, head_hidden=4, inducing_points=2)


@pytest.mark.parametrize("override", [
    "dqn.eval_every_steps=0",  # validated forever: `while steps >= next_eval: next_eval += 0`
    "dqn.eval_every_steps=-5",
    "dqn.max_grad_norm=-1",  # clip_grad_norm_ scaled every gradient by a negative factor: ascent on the loss
    "dqn.max_grad_norm=0",  # ... or zeroed it: no learning at all
    "dqn.huber_delta=0",  # F.huber_loss refused it at the first update, a traceback after the demonstrations
    "dqn.learning_rate=.nan",  # NaN passed `<= 0`; Adam then raised a traceback (exit 1)
    "dqn.bc_weight=.nan",
    "reward.scale_seconds=.inf",
    "reward.slo_joules_per_pod_s=.nan",
    "dqn.load_scales=[0]",  # ZeroDivisionError in scale_load
    "dqn.validation_load_scales=[1.0, 30]",
    "dqn.learning_starts=-1",
    "dqn.validation_seeds=[-1]",  # numpy refused it at the first validation, a traceback after training began
    "dqn.replay_memory_mb=0",
    "dqn.replay_memory_mb=-5",
    "dqn.hidden=true",  # pydantic's lax mode read it as 1: a one-unit network trained without a word
    "dqn.attention=1",  # ... and a number, or "no", as a switch
    "dqn.load_scales=[true, 2.0]",
    "reward.scale_seconds=true",
])
def test_config_refuses_knobs_that_break_training(override):
    with pytest.raises(ConfigError, match=override.split(".")[1].split("=")[0]):
        with_overrides(TrainConfig(), [override])
    r = runner.invoke(app, ["train", "--set", override, "--show-config"])
    assert r.exit_code == 2 and "invalid training config" in r.output, r.output


def _model(tmp_path: Path, name: str = "m.pt", **cfg) -> Path:
    """A small schema-2 model with optimizer state, as `joulesched train` writes it."""
    agent = DQN(DQNConfig(**SMALL_NET, **cfg), seed=0)
    agent.optimizer.zero_grad()
    sum(p.sum() for p in agent.q.parameters()).backward()
    agent.optimizer.step()  # Adam state for every parameter
    return save_checkpoint(tmp_path / name, agent, {"steps": 10, "episodes": 1, "wall_s": 1.0, "runs": []},
                           reward={"slo_joules_per_pod_s": 200.0})


def _rewrite(src: Path, dst: Path, meta_edit=None, tensor_edit=None) -> Path:
    with safe_open(str(src), "pt") as f:
        meta = json.loads(f.metadata()["joulesched"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if meta_edit:
        meta_edit(meta)
    if tensor_edit:
        tensor_edit(tensors)
        meta["tensors_sha256"] = tensors_digest(tensors)  # a file garbled as written, not corrupted after
    save_file(tensors, str(dst), metadata={"joulesched": json.dumps(meta)})
    return dst


def test_metadata_hyperparameters_are_type_checked(tmp_path):
    src = _model(tmp_path)
    bad = _rewrite(src, tmp_path / "bad.pt", meta_edit=lambda m: m["config"].update(hidden=8.5))
    # Was a TypeError from torch's empty() (a traceback, exit 1) in `test`, `explain` and --resume.
    with pytest.raises(PolicyError, match="hidden"):
        load_checkpoint(bad)
    r = runner.invoke(app, ["test", "--model", str(bad), "-s", str(TINY), "--no-bound", "--no-optimum"])
    assert r.exit_code == 2 and "bad hyperparameters" in r.output, r.output
    with pytest.raises(ValueError, match="attention"):
        DQNConfig.from_dict({"attention": "perhaps"})
    with pytest.raises(ValueError, match="attention: expected true or false"):
        DQNConfig.from_dict({"attention": "no"})  # pydantic's lax mode read it as False
    with pytest.raises(ValueError, match="hidden: expected a number"):
        DQNConfig.from_dict({"hidden": True})
    assert DQNConfig.from_dict({"load_scales": [1, 2]}).load_scales == (1.0, 2.0)
    # Strict, as the docs say: pydantic's lax mode read these as numbers (a file we wrote holds none of them).
    for field, value in (("hidden", "48"), ("hidden", 48.0), ("learning_rate", "0.001")):
        with pytest.raises(ValueError, match=field):
            DQNConfig.from_dict({field: value})
    # true == 1.0 == 1 in Python: a format version or schema of true or 1.0 loaded as 1 (a review).
    for edit, words in ((lambda m: m.update(format_version=True), "model file format True"),
                        (lambda m: m.update(format_version=1.0), "model file format 1.0"),
                        (lambda m: m.update(feature_schema=True), "feature schema True"),
                        (lambda m: m.pop("config"), "config is NoneType, not a mapping")):
        with pytest.raises(PolicyError, match=re.escape(words)):
            load_checkpoint(_rewrite(src, tmp_path / "meta.pt", meta_edit=edit))
    quoted = _rewrite(src, tmp_path / "quoted.pt", meta_edit=lambda m: m["config"].update(hidden="8"))
    with pytest.raises(PolicyError, match="bad hyperparameters in model metadata.*hidden"):
        load_checkpoint(quoted)


def _set_target_nan(t: dict) -> None:
    t["target.embed.0.weight"] = torch.full_like(t["target.embed.0.weight"], float("nan"))


def _shrink_optim(t: dict) -> None:
    t["optim.1.exp_avg"] = t["optim.1.exp_avg"][:1].clone()


def _shrink_target(t: dict) -> None:
    t["target.embed.0.weight"] = t["target.embed.0.weight"][:3].clone()


@pytest.mark.parametrize("what, meta_edit, tensor_edit, match", [
    ("training record", lambda m: m.update(training=[1]), None, "training is list"),
    ("step counter", lambda m: m["training"].update(steps="many"), None, "training.steps"),
    ("scenario list", lambda m: m["training"].update(scenarios=5), None, "training.scenarios"),
    ("seed", lambda m: m["training"].update(seed="7"), None, "training.seed"),
    ("reward weights", lambda m: m.update(reward={"bogus": 1.0}), None, "reward weights"),
    ("reward weight's type", lambda m: m.update(reward={"scale_seconds": "600"}), None, "reward weights"),
    ("reward weight as a switch", lambda m: m.update(reward={"invalid_action_penalty": True}), None,
     "reward weights"),
    ("target weights", None, _set_target_nan, "non-finite target"),
    ("target shape", None, _shrink_target, r"target network does not fit \(size mismatch for embed.0.weight"),
    ("optimizer state", None, _shrink_optim, "optimizer state does not fit"),
])
def test_resume_refuses_a_garbled_training_state(tmp_path, what, meta_edit, tensor_edit, match):
    """Each was a traceback (AttributeError, TypeError, or a RuntimeError at Adam's first step, exit 1), or for
    NaN target weights a run that trained on NaN targets and then could not save or load its model."""
    bad = _rewrite(_model(tmp_path), tmp_path / "bad.pt", meta_edit, tensor_edit)
    load_checkpoint(bad)  # inference needs none of it: `test` and `dqn=PATH` still load the model
    with pytest.raises(PolicyError, match=match):
        load_agent(bad)
    before = bad.read_bytes()
    r = runner.invoke(app, ["train", "-s", str(TINY), "--model", str(bad), "--resume", "--steps", "1",
                            "--no-progress"])
    assert r.exit_code == 2 and match.split()[0] in r.output, r.output
    assert bad.read_bytes() == before


def test_non_finite_weights_are_never_written_over_a_model(tmp_path):
    path = _model(tmp_path)
    before, meta_before = path.read_bytes(), path.with_suffix(".json").read_text()
    agent, _ = load_agent(path)
    with torch.no_grad():
        next(agent.q.parameters()).fill_(float("nan"))
    with pytest.raises(CheckpointError, match="non-finite"):
        save_checkpoint(path, agent, {"steps": 1})
    assert path.read_bytes() == before and path.with_suffix(".json").read_text() == meta_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.pt"]  # no temp file left
    # Nor non-finite optimizer state, which --resume refuses.
    agent, _ = load_agent(path)
    state = next(iter(agent.optimizer.state.values()))
    state["exp_avg"].fill_(float("inf"))
    with pytest.raises(CheckpointError, match=r"optim\.\d+\.exp_avg holds non-finite"):
        save_checkpoint(path, agent, {"steps": 1})
    assert path.read_bytes() == before


def test_a_diverged_loss_stops_the_run(monkeypatch):
    cfg = DQNConfig(**SMALL_NET, pretrain_episodes=1, pretrain_updates=5, randomize=0.0, max_episode_decisions=50)
    agent = DQN(cfg, seed=0)
    monkeypatch.setattr(agent, "update", lambda *a, **k: float("nan"))
    with pytest.raises(TrainingDiverged, match="nan"):
        train([load_scenario(TINY)], agent, total_steps=50)


class _Recording(SerialExecutor):
    def __init__(self) -> None:
        self.seeds: list[tuple[int, int]] = []

    def map_async(self, fn, tasks):
        self.seeds += [(t.spec.workload_seed, t.spec.seed) for t in tasks if hasattr(t, "spec")]
        return super().map_async(fn, tasks)


def test_a_resumed_run_keeps_the_teachers_weight_where_it_ended(monkeypatch):
    """The margin loss's weight restarted at bc_weight (1.0) on --resume: a fine-tune was pulled back toward the
    teacher at 20x the weight its first run ended with (a review). It now stays at bc_weight_end."""
    cfg = DQNConfig(**SMALL_NET, pretrain_episodes=1, pretrain_updates=3, randomize=0.0, max_episode_decisions=40,
                    learning_starts=10, batch_size=8, episodes_per_round=1, exploration_fraction=1.0)
    seen: list[float] = []
    real = DQN.update

    def update(self, batch, bc_weight=0.0, **kw):
        seen.append(bc_weight)
        return real(self, batch, bc_weight=bc_weight, **kw)

    monkeypatch.setattr(DQN, "update", update)
    train([load_scenario(TINY)], DQN(cfg, seed=0), total_steps=80, seed=0)
    assert seen[0] == cfg.bc_weight  # a first run starts from the teacher's full weight
    seen.clear()
    agent = DQN(cfg, seed=0)
    agent.updates = 50
    train([load_scenario(TINY)], agent, total_steps=80, seed=0, resumed=True)
    assert seen and max(seen) == pytest.approx(cfg.bc_weight_end)


def test_validation_has_one_case_per_distinct_workload():
    """A load factor changes only a synthetic workload and a seed nothing of a trace replayed as it is: the
    validation counted such a trace once per seed and factor, each the training workload itself (a review)."""
    trace = load_scenario(ROOT / "scenarios" / "small" / "trace-sleep.yaml")
    assert trace.workload.replay
    v = Validator([trace, load_scenario(TINY)], DQNConfig(**SMALL_NET), seeds=(10_007, 10_009),
                  load_scales=(1.0, 1.5), random_clusters=0)
    assert len(v.cases) == 1 + 2 * 2  # the trace once; tiny (synthetic) at each seed and factor


def test_a_resumed_run_draws_its_own_episodes():
    """A resumed run with the same --seed replayed the first run's workloads and exploration, round for round."""
    cfg = DQNConfig(**SMALL_NET, pretrain_episodes=0, randomize=0.0, max_episode_decisions=40, learning_starts=10,
                    batch_size=8, episodes_per_round=1)
    sc = [load_scenario(TINY)]
    runs = []
    for resumed in (False, True, True):
        agent = DQN(cfg, seed=0)
        agent.updates = 0 if not resumed else 7 * len(runs)  # a resumed model has had updates (its file says)
        ex = _Recording()
        train(sc, agent, total_steps=80, seed=0, resumed=resumed, executor=ex)
        runs.append(ex.seeds)
    assert runs[0] and runs[1] and runs[2]
    assert not set(runs[0]) & set(runs[1]) and not set(runs[1]) & set(runs[2])
    # A fresh run's stream is the seed's alone, as it always was: the recipes of the shipped models reproduce.
    assert runs[0][0] == (episode_specs(cfg, sc, 0, 0, 1)[0].workload_seed, episode_specs(cfg, sc, 0, 0, 1)[0].seed)
    # ... and a resume is as reproducible as a first run.
    agent = DQN(cfg, seed=0)
    agent.updates = 7
    ex = _Recording()
    train(sc, agent, total_steps=80, seed=0, resumed=True, executor=ex)
    assert ex.seeds == runs[1]


def test_ctrl_c_in_train_says_what_was_lost(tmp_path, monkeypatch):
    import joulesched.pipelines.training as training

    def interrupted_run(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", interrupted_run)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        model = tmp_path / "new.pt"
        r = runner.invoke(app, ["train", "-s", str(TINY), "--model", str(model), "--steps", "10", "--no-progress"])
        assert r.exit_code == 130
        text = " ".join(r.output.split())
        # Was "Re-run the same command to resume", which starts over: nothing of the run is kept.
        assert "nothing was written" in text and "was not created" in text and "training is lost" in text, text
        old = _model(tmp_path, "old.pt")
        r = runner.invoke(app, ["train", "-s", str(TINY), "--model", str(old), "--steps", "10", "--resume",
                                "--no-progress"])
        assert r.exit_code == 130
        assert "is as it was before this run" in " ".join(r.output.split())

        def saved_then_interrupted(scenarios, path, **k):  # Ctrl-C while the side files are written
            path.write_bytes(b"the new model")
            raise KeyboardInterrupt

        monkeypatch.setattr(training, "train", saved_then_interrupted)
        r = runner.invoke(app, ["train", "-s", str(TINY), "--model", str(old), "--steps", "10", "--resume",
                                "--no-progress"])
        text = " ".join(r.output.split())
        # A review: "nothing was written" was said of a model already replaced, and a re-run advised.
        assert r.exit_code == 130 and "was saved before the interrupt" in text and "Do not re-run" in text, text
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert not model.exists()


def test_each_set_of_weights_is_validated_once():
    """A round that crossed several validation steps validated the same weights once per step crossed (and the
    last one again at the end): identical rows, each a full set of greedy runs."""
    from joulesched.agent.train import Validator

    cfg = DQNConfig(**SMALL_NET, pretrain_episodes=0, randomize=0.0, max_episode_decisions=40, learning_starts=10,
                    batch_size=8, episodes_per_round=1, eval_every_steps=15, validation_random=0,
                    validation_load_scales=(1.0,))
    sc = [load_scenario(TINY)]
    log = train(sc, DQN(cfg, seed=0), total_steps=80, seed=0, validator=Validator(sc, cfg))
    at = [r.step for r in log.rows if r.scenario == "validation"]
    assert at == sorted(set(at)) and at[0] == 0 and at[-1] == log.steps, at


def test_resume_show_config_prints_the_models_config(tmp_path):
    """`--resume --show-config` printed the defaults, not the hyperparameters the resumed run trains with."""
    model = _model(tmp_path, eval_every_steps=300, learning_starts=100)
    r = runner.invoke(app, ["train", "--model", str(model), "--resume", "--show-config"])
    assert r.exit_code == 0, r.output
    assert "eval_every_steps: 300" in r.output and "learning_starts: 100" in r.output and "hidden: 8" in r.output
    r = runner.invoke(app, ["train", "--model", str(model), "--resume", "--show-config", "--set", "dqn.hidden=3"])
    assert r.exit_code == 2 and "keeps the model's hyperparameters" in r.output, r.output
    r = runner.invoke(app, ["train", "--model", str(tmp_path / "none.pt"), "--resume", "--show-config"])
    assert r.exit_code == 2 and "not found" in r.output, r.output


def test_a_json_model_path_is_refused_before_training(tmp_path):
    """`--model NAME.json` trained, wrote the model, then wrote its metadata copy NAME.json over it and reported
    success: the file no longer loaded."""
    model = tmp_path / "m.json"
    r = runner.invoke(app, ["train", "-s", str(TINY), "--model", str(model), "--steps", "10", "--no-progress",
                            "--set", "dqn.pretrain_episodes=1", "--set", "dqn.pretrain_updates=5", "--set",
                            "dqn.randomize=0", "--set", "dqn.validation_random=0"])
    assert r.exit_code == 2 and "cannot end in .json" in r.output, r.output
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(PolicyError, match=r"\.json"):
        save_checkpoint(model, DQN(DQNConfig(**SMALL_NET)), {})
    assert list(tmp_path.iterdir()) == []
    # The pipeline calls train() without the CLI: it trained for its minutes, then failed on save.
    import joulesched.pipelines.training as training

    with pytest.raises(PolicyError, match=r"\.json"):
        training.train([TINY], model, minutes=30.0, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_training_a_gpu_blind_model_on_gpus_is_warned(tmp_path, monkeypatch):
    """The default feature schema (2) has no GPU columns: `train -s <a GPU cluster>` trained a model blind to the
    GPUs without a word."""
    import joulesched.pipelines.training as training

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", stop)
    gpu = str(ROOT / "scenarios" / "openb" / "mini" / "openb-mini-w10000k.yaml")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        outs = {}
        for schema in (2, 3):
            r = runner.invoke(app, ["train", "-s", gpu, "--model", str(tmp_path / "m.pt"), "--steps", "10",
                                    "--no-progress", "--set", f"dqn.feature_schema={schema}"])
            assert r.exit_code == 130, r.output
            outs[schema] = " ".join(r.output.split())
        r = runner.invoke(app, ["train", "-s", str(TINY), "--model", str(tmp_path / "m.pt"), "--steps", "10",
                                "--no-progress"])
        assert r.exit_code == 130 and "warning" not in r.output, r.output
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert "has GPUs, but a schema-2 model sees no GPU columns" in outs[2] and "feature_schema=3" in outs[2]
    assert "no GPU columns" not in outs[3]
    assert "replays a trace as it is: its validation case is the workload it trains on" in outs[3]  # OpenB mini


def test_the_best_weights_keep_their_own_optimizer_state():
    """The best validated weights were restored with the optimizer moments of the last update, so the file (and
    --resume) paired weights with another point's Adam state."""
    import copy

    cfg = DQNConfig(**SMALL_NET, pretrain_episodes=1, pretrain_updates=5, randomize=0.0, max_episode_decisions=40,
                    learning_starts=10, batch_size=8, episodes_per_round=1, eval_every_steps=40)
    agent = DQN(cfg, seed=0)
    seen = []

    class FirstIsBest:  # the weights after the demonstrations score best; every later set worse
        def score(self, agent_, executor=None):
            seen.append((copy.deepcopy(agent_.q.state_dict()), copy.deepcopy(agent_.optimizer.state_dict())))
            return 0.5 if len(seen) == 1 else 1.0

    log = train([load_scenario(TINY)], agent, total_steps=80, seed=0, validator=FirstIsBest())
    assert log.best_step == 0 and len(seen) > 1
    weights, opt = seen[0]
    assert all(torch.equal(v, agent.q.state_dict()[k]) for k, v in weights.items())
    now = agent.optimizer.state_dict()["state"]
    assert now.keys() == opt["state"].keys()
    for pid, st in opt["state"].items():
        assert all(torch.equal(st[name], now[pid][name]) for name in ("step", "exp_avg", "exp_avg_sq"))


def test_a_seed_beyond_torchs_range_is_refused(tmp_path):
    """`--seed 99999999999999999999` was a ValueError traceback from torch.manual_seed (exit 1)."""
    r = runner.invoke(app, ["train", "-s", str(TINY), "--model", str(tmp_path / "m.pt"), "--steps", "5",
                            "--no-progress", "--seed", str(2**64)])
    assert r.exit_code == 2 and "--seed" in r.output, r.output


def test_worker_and_seed_counts_are_bounded_as_the_benchmarks_are(tmp_path, monkeypatch):
    """`train --workers` and `test --seeds` had no upper bound (benchmark's --jobs stops at 256, --seeds at 1000):
    `--workers 100000` went on to start that many processes."""
    import joulesched.pipelines.training as training

    def stop(*a, **k):  # what the unbounded option reached: never the pool itself here
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", stop)
    monkeypatch.setattr(training, "evaluate", stop)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        r = runner.invoke(app, ["train", "-s", str(TINY), "--model", str(tmp_path / "m.pt"), "--steps", "5",
                                "--no-progress", "--workers", "257"])
        assert r.exit_code == 2 and "--workers" in r.output, r.output
        r = runner.invoke(app, ["test", "-s", str(TINY), "--seeds", "1001"])
        assert r.exit_code == 2 and "--seeds" in r.output, r.output
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)


class _Eps(SerialExecutor):
    def __init__(self) -> None:
        self.eps: list[float] = []

    def map_async(self, fn, tasks):
        self.eps += [t.epsilon for t in tasks]
        return super().map_async(fn, tasks)


def test_the_curve_logs_the_epsilon_each_episode_ran_with(monkeypatch):
    """With a time budget the curve logged an epsilon computed after the round's updates, later on the clock (so
    lower) than the one its episodes explored with."""
    import joulesched.agent.train as train_mod

    class Clock:  # every reading is a second later: the schedule moves between submit and record
        t = 0.0

        def perf_counter(self) -> float:
            self.t += 1.0
            return self.t

    monkeypatch.setattr(train_mod, "time", Clock())
    cfg = DQNConfig(**SMALL_NET, pretrain_episodes=0, randomize=0.0, max_episode_decisions=30, learning_starts=10,
                    batch_size=8, episodes_per_round=1, eps_start=1.0, eps_end=0.0, exploration_fraction=1.0)
    ex = _Eps()
    log = train([load_scenario(TINY)], DQN(cfg, seed=0), total_seconds=150.0, seed=0, executor=ex)
    logged = [r.epsilon for r in log.rows if r.scenario != "validation"]
    assert len(logged) >= 3 and logged == ex.eps[:len(logged)], (logged, ex.eps)


def test_a_validation_reference_of_0_joules_is_refused_with_its_case(tmp_path):
    """Curves that draw nothing below 90 % load run a light workload on 0 J: the validation score (energy / the
    reference's) divided by 0 and training ended in a ZeroDivisionError traceback."""
    sc = tmp_path / "dark.yaml"
    sc.write_text(TINY.read_text().replace("power_watts: hp-ml110-g5", "power_watts: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]")
                  .replace("power_watts: ibm-x3250-x3470", "power_watts: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]"))
    model = tmp_path / "m.pt"
    r = runner.invoke(app, ["train", "-s", str(sc), "--model", str(model), "--steps", "10", "--no-progress"])
    assert r.exit_code == 2, r.output
    assert "validation case tiny: " in r.output and "draws 0 J" in r.output and "Traceback" not in r.output
    assert not model.exists()


def test_test_on_a_cluster_that_draws_0_joules_leaves_the_ratios_out(tmp_path):
    """`test` divided the DQN's energy by default-k8s's 0 J: a ZeroDivisionError traceback, exit 1 (a review);
    the benchmark writes null there, and `test` now leaves such a ratio out."""
    sc = tmp_path / "dark.yaml"
    sc.write_text(TINY.read_text().replace("power_watts: hp-ml110-g5", "power_watts: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]")
                  .replace("power_watts: ibm-x3250-x3470", "power_watts: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]"))
    r = runner.invoke(app, ["test", "--model", str(_model(tmp_path)), "-s", str(sc), "--no-bound", "--no-optimum",
                            "--json"])
    assert r.exit_code == 0, r.output
    entry = json.loads(r.output)["scenarios"][0]
    assert entry["rows"]["default-k8s"]["energy_joules"] == 0
    assert "ratio_vs_default" not in entry
    sa = entry["rows"][entry["best_sleep_aware"]]["energy_joules"]
    assert ("ratio_vs_best_sleep_aware" in entry) == (sa > 0)


def test_nan_or_infinity_in_a_models_metadata_is_refused(tmp_path):
    """json.loads read NaN and Infinity, and `test --json` wrote them back out, which no strict parser reads (a
    review)."""
    bad = _rewrite(_model(tmp_path), tmp_path / "bad.pt", meta_edit=lambda m: m["training"].update(note=float("nan")))
    with pytest.raises(PolicyError, match="NaN is not a JSON value"):
        load_checkpoint(bad)
    r = runner.invoke(app, ["test", "--model", str(bad), "-s", str(TINY), "--no-bound", "--no-optimum", "--json"])
    assert r.exit_code == 2 and "NaN is not a JSON value" in r.output, r.output


def test_json_text_writes_null_for_what_json_cannot_carry():
    from joulesched.pipelines.cli.common import json_text

    assert json.loads(json_text({"a": float("nan"), "b": [1.5, float("inf")], "c": (2,)})) == {
        "a": None, "b": [1.5, None], "c": [2]}
