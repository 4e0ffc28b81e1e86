"""DQN checkpoints: one safetensors file with JSON metadata in its header. Nothing in it can run code.

Layout of the file (whatever its extension, ``models/small.pt`` included):

* tensors ``q.*`` (the online network, all that inference needs), ``target.*`` and ``optim.*`` (Adam state,
  for ``--resume``);
* header metadata ``{"joulesched": "<json>"}`` with ``format``, ``format_version``, ``feature_schema``,
  ``features`` (column names), ``config`` (:class:`agent.dqn.DQNConfig`), ``reward``, ``training``
  (scenarios, seed, steps, episodes, wall time, dates) and ``tensors_sha256`` (:func:`tensors_digest`; files
  written before 2026-12-06 have none and are not checked).

A readable copy of the metadata is written next to the file as ``NAME.json``; it is informational only, the loader
reads the header. Loading refuses, with :class:`agent.policy.PolicyError`: missing files and anything not a
regular file, pickles and ``torch.save`` archives (detected by their magic bytes, before any parser sees them;
they are never unpickled), files that are not valid safetensors, tensors that do not match their checksum, a
missing, foreign or oversized header, a feature schema this code does not know, and tensors that do not fit the
network (names, float32 dtype and shapes are checked from the header, before any tensor is read). Schema 1
(``models/small.pt``), schema 2 and schema 3 (schema 2 plus GPU columns, agent/features_gpu.py) load: the network,
the features and the predictor follow the schema the file records.
"""

from __future__ import annotations

import hashlib
import json
import math
import stat
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from joulesched.agent.config import DQNConfig, RewardConfig, from_metadata
from joulesched.agent.dqn import DQN, make_network
from joulesched.agent.features import feature_names as schema_feature_names
from joulesched.agent.policy import PolicyError
from joulesched.core.errors import JouleschedError
from joulesched.core.fsio import atomic_path, atomic_write_text

FORMAT = "joulesched-dqn"
FORMAT_VERSION = 1
#: The feature schemas this code reads (agent/features.py).
KNOWN_SCHEMAS = (1, 2, 3)
META_KEY = "joulesched"
MAX_HEADER_BYTES = 16 * 1024 * 1024
#: The JSON metadata's cap (a trained model's is about 12 kB; each --resume adds a line to training.runs).
MAX_META_BYTES = 1024 * 1024
#: Adam's state per parameter (agent/dqn.py's optimizer), as :func:`save_checkpoint` writes it.
_OPTIM_KEYS = ("step", "exp_avg", "exp_avg_sq")


class CheckpointError(JouleschedError):
    """A model that must not be written (non-finite weights: training diverged); the file is left as it was."""


@dataclass
class Checkpoint:
    config: DQNConfig
    meta: dict
    tensors: dict[str, torch.Tensor]

    def state(self, prefix: str) -> dict[str, torch.Tensor]:
        k = len(prefix) + 1
        return {name[k:]: t for name, t in self.tensors.items() if name.startswith(prefix + ".")}


def feature_names(schema: int = 1) -> list[str]:
    return schema_feature_names(schema)


def check_model_path(path: str | Path) -> Path:
    """Refuse a model path that its own readable copy, ``NAME.json``, would overwrite (a ``.json`` model: the
    metadata was written over the weights, and the run reported success)."""
    path = Path(path)
    if path.with_suffix(".json") == path:
        raise PolicyError(f"{path}: a model file cannot end in .json (its readable metadata copy, NAME.json, would "
                          f"overwrite it); use e.g. {path.with_suffix('.pt')}")
    return path


def save_checkpoint(path: str | Path, agent: DQN, training: dict, reward: dict | None = None) -> Path:
    """Write ``agent`` atomically to ``path`` (and the readable ``.json`` copy). Returns the path."""
    path = check_model_path(path)
    tensors: dict[str, torch.Tensor] = {}
    for prefix, net in (("q", agent.q), ("target", agent.q_target)):
        for name, t in net.state_dict().items():
            tensors[f"{prefix}.{name}"] = t.detach().contiguous().clone()
    opt = agent.optimizer.state_dict()
    for pid, st in opt["state"].items():
        for key, val in st.items():
            val = val if torch.is_tensor(val) else torch.tensor(float(val))
            tensors[f"optim.{pid}.{key}"] = val.detach().reshape(val.shape).contiguous().clone().float()
    for name, t in tensors.items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            # The loader (and --resume) refuses such a file: writing it would replace a model that loads with one
            # that does not.
            raise CheckpointError(f"{path}: not written: {name} holds non-finite values (training diverged; try a "
                                  "smaller dqn.learning_rate or dqn.max_grad_norm)")
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "feature_schema": agent.cfg.feature_schema,
        "features": feature_names(agent.cfg.feature_schema), "config": agent.cfg.to_dict(), "reward": reward or {},
        "training": {**training, "updates": agent.updates}, "tensors_sha256": tensors_digest(tensors),
    }
    with atomic_path(path) as tmp:  # a model is an ordinary file: the umask's mode, not mkstemp's 0600
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta, sort_keys=True, allow_nan=False)})
    atomic_write_text(path.with_suffix(".json"), json.dumps(meta, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return path


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order: written into the metadata, so
    that a flipped bit in the weights (a finite value still) is refused on load rather than served."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the tensor's own buffer: no copy of its bytes
    return h.hexdigest()


def _sniff(path: Path) -> None:
    """Refuse what is not a regular file (a FIFO would block the read forever, a device never end), pickles and
    torch.save archives by their first bytes; check the safetensors header length."""
    try:
        mode = path.stat().st_mode  # follows symlinks: a link to a model is fine
        if not stat.S_ISREG(mode):
            raise PolicyError(f"{path}: not a regular file; a model is a file written by `joulesched train`")
        with path.open("rb") as fh:
            head = fh.read(8)
            size = path.stat().st_size
    except FileNotFoundError:
        raise PolicyError(f"{path}: model file not found; train one with `joulesched train --model {path}`") from None
    except OSError as e:
        raise PolicyError(f"{path}: cannot read model file: {e}") from None
    n = int.from_bytes(head.ljust(8, b"\0"), "little")
    plausible = len(head) == 8 and 1 < n <= MAX_HEADER_BYTES and 8 + n <= size
    if not plausible and (head[:2] == b"PK" or head[:1] == b"\x80"):
        raise PolicyError(f"{path}: looks like a pickle or torch.save file; refusing to load it (unpickling can run "
                          "code). joulesched models are safetensors files written by `joulesched train`")
    if not plausible:
        raise PolicyError(f"{path}: corrupt model file (not a safetensors file, or truncated; {size} bytes)")


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read and validate a checkpoint; raises :class:`PolicyError` with the reason and the fix.

    Everything is checked from the header (metadata, tensor names, dtypes and shapes) before any tensor is read:
    a file declaring a tensor the network does not have, or a huge one, is refused without allocating it."""
    path = Path(path)
    _sniff(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = _metadata(path, f.metadata() or {})
            cfg = _config(path, meta)
            with torch.device("meta"):  # shapes only: a file without its weights must not allocate the largest
                shapes = make_network(cfg)  # network its metadata may ask for (about 450 MB) before it is refused
            _check_specs(path, shapes, {k: (f.get_slice(k).get_dtype(), f.get_slice(k).get_shape()) for k in f.keys()})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            net = make_network(cfg)  # as large as the weights the file holds
    except PolicyError:  # a ValueError too: already says what is wrong
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise PolicyError(f"{path}: corrupt model file ({e})") from None
    digest = meta.get("tensors_sha256")  # absent from models written before 2026-12-06: not checked
    if digest is not None and digest != tensors_digest(tensors):
        raise PolicyError(f"{path}: corrupt model file (its tensors do not match the checksum in its metadata)")
    ckpt = Checkpoint(cfg, meta, tensors)
    try:
        net.load_state_dict(ckpt.state("q"), strict=True)
    except RuntimeError as e:
        # torch's first line is only "Error(s) in loading state_dict for X:"; the next ones name keys and shapes.
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = "; ".join(lines[1:3]) or lines[0] if lines else type(e).__name__
        raise PolicyError(f"{path}: weights do not fit the network ({detail[:300]})") from None
    for t in ckpt.state("q").values():
        if not torch.isfinite(t).all():
            raise PolicyError(f"{path}: corrupt model file (non-finite weights)")
    return ckpt


def _metadata(path: Path, header: dict) -> dict:
    """The header's joulesched metadata, checked as far as the network needs it."""
    raw = header.get(META_KEY)
    if raw is None:
        raise PolicyError(f"{path}: a safetensors file without joulesched metadata; not a joulesched DQN model")
    if len(raw) > MAX_META_BYTES:
        raise PolicyError(f"{path}: corrupt model metadata ({len(raw):,} bytes, at most {MAX_META_BYTES:,})")
    try:
        meta = json.loads(raw, parse_constant=_no_constant)  # NaN and Infinity are no JSON (a review: they
        # were read, and `test --json` then wrote them back out, which no strict parser reads)
    except (ValueError, RecursionError) as e:  # also too deep a nesting, or an integer of too many digits
        raise PolicyError(f"{path}: corrupt model metadata ({str(e)[:200] or type(e).__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        fmt = meta.get("format") if isinstance(meta, dict) else None
        raise PolicyError(f"{path}: not a joulesched DQN model (format {fmt!r})")
    version = meta.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:  # true == 1.0 == 1 in Python: a type check first
        raise PolicyError(f"{path}: model file format {version!r}, this joulesched reads {FORMAT_VERSION!r}; "
                          "re-train it")
    schema = meta.get("feature_schema")
    if type(schema) is not int or schema not in KNOWN_SCHEMAS:
        raise PolicyError(f"{path}: trained on feature schema {schema!r}, which this joulesched does not know (it "
                          f"reads schemas {', '.join(map(str, KNOWN_SCHEMAS))}); use the joulesched that wrote it, or "
                          f"re-train with `joulesched train --model {path} --overwrite`")
    if meta.get("features") != feature_names(schema):
        raise PolicyError(f"{path}: its feature columns are not schema {schema}'s; re-train with "
                          f"`joulesched train --model {path} --overwrite`")
    return meta


def _config(path: Path, meta: dict) -> DQNConfig:
    """The stored hyperparameters, within :data:`agent.config.LIMITS`: the network they build is bounded too."""
    try:
        # Schema-1 files predate the schema knob: the file's schema is the truth. A model saved before the replay
        # kept compacted states trained on the old layout: --resume goes on with it. (One saved compacted before
        # bc_margin_twins trained without the twins' margin: the default.)
        if not isinstance(meta.get("config"), dict):  # every model train writes has one: the defaults are no model's
            raise ValueError(f"config is {type(meta.get('config')).__name__}, not a mapping of hyperparameters")
        config = {"compact_replay": False, **meta["config"], "feature_schema": meta["feature_schema"]}
        return DQNConfig.from_dict(config)
    except (TypeError, ValueError) as e:
        raise PolicyError(f"{path}: bad hyperparameters in model metadata ({e})") from None


def _check_specs(path: Path, net: torch.nn.Module, specs: dict[str, tuple[str, list[int]]]) -> None:
    """Refuse, from the header alone, a tensor the network (or its target and Adam state) does not have, one not
    float32 (load_state_dict would cast it silently), and q weights not of the network's shape. Target and Adam
    state need only be no larger than their parameter: inference does not read them, --resume checks them.
    Every q weight must be there (``net`` may be on the meta device: only shapes are read)."""
    want = {name: tuple(t.shape) for name, t in net.state_dict().items()}
    if missing := sorted(k for k in want if f"q.{k}" not in specs):
        raise PolicyError(f"{path}: weights do not fit the network (missing {', '.join(missing[:3])}"
                          f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''})")
    params = [tuple(p.shape) for p in net.parameters()]  # the optimizer's parameter order (agent/dqn.py)
    for name in sorted(specs, key=lambda n: (not n.startswith("q."), n)):  # the network's own weights first
        dtype, shape = specs[name]
        prefix, _, key = name.partition(".")
        pid, _, slot = key.partition(".")
        if prefix in ("q", "target") and key in want:
            expect = want[key]
        elif prefix == "optim" and pid.isdigit() and int(pid) < len(params) and slot in _OPTIM_KEYS:
            expect = () if slot == "step" else params[int(pid)]
        elif prefix == "q":
            raise PolicyError(f"{path}: weights do not fit the network (unexpected tensor {name!r})")
        else:
            raise PolicyError(f"{path}: corrupt model file (tensor {name!r} is not one of the network's)")
        if dtype != "F32":
            raise PolicyError(f"{path}: corrupt model file (tensor {name!r} is {dtype}, not F32)")
        if prefix == "q" and tuple(shape) != expect:
            raise PolicyError(f"{path}: weights do not fit the network (size mismatch for {key}: shape "
                              f"{tuple(shape)} in the file, {expect} in the network)")
        if math.prod(shape) > math.prod(expect):
            raise PolicyError(f"{path}: corrupt model file (tensor {name!r} has shape {tuple(shape)}, larger than "
                              f"the network's {expect})")


def load_network(path: str | Path) -> tuple[torch.nn.Module, dict]:
    """The online network, in eval mode, and the metadata: what inference needs."""
    net, _, meta = load_model(path)
    return net, meta


def load_model(path: str | Path) -> tuple[torch.nn.Module, DQNConfig, dict]:
    """The online network (eval mode), its :class:`DQNConfig` (schema, predictor settings) and the metadata."""
    ckpt = load_checkpoint(path)
    net = make_network(ckpt.config)
    net.load_state_dict(ckpt.state("q"))
    net.eval()
    net.requires_grad_(False)
    return net, ckpt.config, ckpt.meta


def load_agent(path: str | Path, seed: int = 0) -> tuple[DQN, dict]:
    """A :class:`DQN` restored for further training (online, target and optimizer state when present)."""
    ckpt = load_checkpoint(path)
    training, reward = _training_record(path, ckpt.meta)
    agent = DQN(ckpt.config, seed=seed)
    agent.q.load_state_dict(ckpt.state("q"))
    target = ckpt.state("target")
    try:
        agent.q_target.load_state_dict(target if target else ckpt.state("q"), strict=True)
    except RuntimeError as e:  # torch's first line is only "Error(s) in loading state_dict for ...:"
        detail = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), str(e).strip())
        raise PolicyError(f"{path}: target network does not fit ({detail[:300]}); train without --resume") from None
    if not all(torch.isfinite(t).all() for t in target.values()):
        raise PolicyError(f"{path}: corrupt model file (non-finite target weights); train without --resume")
    optim = ckpt.state("optim")
    if optim:
        sd = agent.optimizer.state_dict()
        params = [p for group in agent.optimizer.param_groups for p in group["params"]]
        state: dict[int, dict] = {}
        try:
            for key, t in optim.items():
                pid, name = key.split(".", 1)
                state.setdefault(int(pid), {})[name] = t
            for pid, st in state.items():
                # Adam does not check its state against the parameters: a wrong shape would fail at the first step.
                if not 0 <= pid < len(params) or set(st) != {"step", "exp_avg", "exp_avg_sq"}:
                    raise ValueError(f"unexpected optimizer state {pid}: {sorted(st)}")
                st["step"] = st["step"].reshape(())
                for name in ("exp_avg", "exp_avg_sq"):
                    if st[name].shape != params[pid].shape:
                        raise ValueError(f"optim.{pid}.{name} has shape {tuple(st[name].shape)}, its parameter "
                                         f"{tuple(params[pid].shape)}")
                if not all(torch.isfinite(v).all() for v in st.values()):
                    raise ValueError(f"optim.{pid} holds non-finite values")
            sd["state"] = state
            agent.optimizer.load_state_dict(sd)
        except (ValueError, KeyError, RuntimeError) as e:
            raise PolicyError(f"{path}: optimizer state does not fit ({e}); train without --resume") from None
    agent.updates = training.get("updates", 0)
    return agent, {**ckpt.meta, "training": training, "reward": reward}


#: The training record's counters and their types (what --resume adds to).
_COUNTERS = {"steps": int, "episodes": int, "updates": int, "wall_s": (int, float)}


def _training_record(path: Path, meta: dict) -> tuple[dict, dict]:
    """The metadata's ``training`` record and ``reward`` weights, checked: --resume adds to the one and trains
    with the other, so a garbled file is refused here (PolicyError) rather than failing halfway."""
    training = meta.get("training", {})
    if not isinstance(training, dict):
        raise PolicyError(f"{path}: corrupt model metadata (training is {type(training).__name__}, not a mapping)")
    for key, kind in _COUNTERS.items():
        v = training.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, kind) or not v >= 0 or v == float("inf"):
            raise PolicyError(f"{path}: corrupt model metadata (training.{key} = {v!r})")
    if not isinstance(training.get("runs", []), list):
        raise PolicyError(f"{path}: corrupt model metadata (training.runs is not a list)")
    scenarios, seed = training.get("scenarios", []), training.get("seed", 0)
    if not isinstance(scenarios, list) or not all(isinstance(x, str) for x in scenarios):
        raise PolicyError(f"{path}: corrupt model metadata (training.scenarios = {scenarios!r}, not a list of names)")
    if type(seed) is not int:
        raise PolicyError(f"{path}: corrupt model metadata (training.seed = {seed!r}, not a whole number)")
    reward = meta.get("reward") or {}
    try:
        from_metadata(RewardConfig, reward)
    except (TypeError, ValueError) as e:
        raise PolicyError(f"{path}: bad reward weights in model metadata ({e})") from None
    return training, reward


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")
