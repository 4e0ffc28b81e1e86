"""A model file's metadata builds the network and the replay buffer: asking for huge sizes is refused before
anything is allocated, with a message naming the field; the checkpoint and its JSON sidecar are written
atomically (a failed write leaves the old pair and no temporary file). A hostile file (a foreign or huge tensor,
garbled metadata, weights of another dtype, a FIFO or device) is refused with a PolicyError, never read."""

from __future__ import annotations

import json
import math
import os
import re
import struct
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from joulesched.agent.checkpoint import MAX_META_BYTES, META_KEY, load_checkpoint, save_checkpoint, tensors_digest
from joulesched.agent.config import LIMITS, DQNConfig
from joulesched.agent.dqn import DQN, make_network
from joulesched.agent.policy import PolicyError
from joulesched.pipelines.cli import app

TINY = Path(__file__).resolve().parents[2] / "scenarios" / "tiny.yaml"


@pytest.fixture
def model(tmp_path):
    agent = DQN(DQNConfig(hidden=8, buffer_size=32, batch_size=8), seed=0)
    return save_checkpoint(tmp_path / "m.pt", agent, {"scenarios": ["tiny"], "seed": 0, "steps": 1, "wall_s": 0.1})


def _rewrite(model, path, **config):
    with safe_open(str(model), framework="pt") as f:
        meta = json.loads(f.metadata()[META_KEY])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta["config"].update(config)
    save_file(tensors, str(path), metadata={META_KEY: json.dumps(meta)})
    return path


@pytest.mark.parametrize("field, value", [("hidden", 10**9), ("buffer_size", 10**12), ("batch_size", 10**5),
                                          ("replay_memory_mb", 10**7), ("n_step", 10**6)])
def test_a_model_asking_for_huge_sizes_is_refused(model, tmp_path, field, value):
    extra = {"buffer_size": LIMITS["buffer_size"]} if field == "batch_size" else {}  # so batch <= buffer holds
    bad = _rewrite(model, tmp_path / "huge.pt", **{**extra, field: value})
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=rf"bad hyperparameters in model metadata \({field} must be <= "
                                          rf"{LIMITS[field]:,}, got {value:,}"):
        load_checkpoint(bad)
    assert time.monotonic() - t0 < 5  # refused from the header, nothing of that size was built


def test_sizes_at_the_limits_are_accepted_by_the_config():
    cfg = DQNConfig(hidden=LIMITS["hidden"], buffer_size=LIMITS["buffer_size"], batch_size=128)
    assert cfg.hidden == LIMITS["hidden"]


def test_checkpoint_and_sidecar_are_written_atomically(model, tmp_path, monkeypatch):
    before = (model.read_bytes(), model.with_suffix(".json").read_text())
    import joulesched.agent.checkpoint as ck

    def broken(*a, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(ck, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(model, DQN(DQNConfig(hidden=8, buffer_size=32, batch_size=8)), {"steps": 2})
    assert (model.read_bytes(), model.with_suffix(".json").read_text()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.pt"]
    assert oct(os.stat(model).st_mode & 0o777) != oct(0o600)  # an ordinary file, not mkstemp's private mode


def test_a_flipped_bit_in_the_weights_is_refused(model, tmp_path):
    # The lowest bit of a float's first byte: the weight stays finite, only the checksum can tell.
    data = bytearray(model.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start] ^= 1
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    with pytest.raises(PolicyError, match="do not match the checksum"):
        load_checkpoint(bad)
    assert load_checkpoint(model).meta["tensors_sha256"]


def test_a_model_written_before_the_checksum_still_loads(model, tmp_path):
    with safe_open(str(model), framework="pt") as f:
        meta = json.loads(f.metadata()[META_KEY])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    del meta["tensors_sha256"]
    old = tmp_path / "old.pt"
    save_file(tensors, str(old), metadata={META_KEY: json.dumps(meta)})
    assert "tensors_sha256" not in load_checkpoint(old).meta


# ---- hostile files: refused from the header, before any tensor is read (a review, 2026-12-07) ----------------------
def _meta_and_tensors(model):
    with safe_open(str(model), framework="pt") as f:
        return json.loads(f.metadata()[META_KEY]), {k: f.get_tensor(k) for k in f.keys()}


def _write_raw(path, meta, tensors, declared=None, raw_meta=None):
    """A safetensors file written by hand: ``tensors`` as float32, then ``declared`` ({name: (dtype, shape,
    nbytes)}) whose bytes are a sparse hole (no disk used); ``raw_meta`` replaces the JSON metadata string."""
    header = {"__metadata__": {META_KEY: raw_meta if raw_meta is not None else json.dumps(meta)}}
    blobs, off = [], 0
    for name, t in tensors.items():
        b = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    for name, (dtype, shape, n) in (declared or {}).items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        fh.truncate(8 + len(h) + off)
    return path


@pytest.mark.parametrize("name, dtype, shape", [
    ("evil.blob", "U8", [64 << 20]),  # a name the model does not have: was read (64 MiB) and ignored
    ("target.adv.bias", "F32", [16 << 20]),  # the target's bias, 16M elements instead of 1: was read too
])
def test_a_foreign_or_huge_tensor_is_refused_from_the_header(model, tmp_path, name, dtype, shape):
    meta, tensors = _meta_and_tensors(model)
    del meta["tensors_sha256"]  # as files written before the checksum: nothing but the header to check
    tensors.pop(name, None)
    size = math.prod(shape) * (1 if dtype == "U8" else 4)
    bad = _write_raw(tmp_path / "bad.pt", meta, tensors, {name: (dtype, shape, size)})
    with pytest.raises(PolicyError, match=re.escape(f"tensor {name!r}")):
        load_checkpoint(bad)
    r = CliRunner().invoke(app, ["test", "--model", str(bad), "-s", str(TINY), "--no-bound", "--no-optimum"])
    assert r.exit_code == 2 and name in r.output, r.output


def test_a_file_without_its_weights_is_refused_before_the_network_is_built(model, tmp_path, monkeypatch):
    # Metadata asking for the largest network allowed (about 450 MB of float32) and no tensor at all: the
    # network was built at full size before load_state_dict found every weight missing.
    meta, _ = _meta_and_tensors(model)
    del meta["tensors_sha256"]
    meta["config"].update(hidden=LIMITS["hidden"], head_hidden=LIMITS["head_hidden"],
                          attention_dim=LIMITS["attention_dim"], inducing_points=LIMITS["inducing_points"])
    bad = _write_raw(tmp_path / "bad.pt", meta, {})
    import joulesched.agent.checkpoint as ck
    built = []

    def counted(cfg):
        net = make_network(cfg)
        built.append(next(net.parameters()).device.type)
        return net

    monkeypatch.setattr(ck, "make_network", counted)
    with pytest.raises(PolicyError, match=r"weights do not fit the network \(missing .* and \d+ more\)"):
        load_checkpoint(bad)
    assert built == ["meta"]  # shapes only: nothing of that size was allocated


@pytest.mark.parametrize("raw, match", [
    ("[" * 100_000 + "]" * 100_000, "recursion"),  # was a RecursionError traceback (exit 1)
    ('{"format": "joulesched-dqn", "x": 1' + "0" * 5_000 + "}", "digits"),  # was a ValueError traceback
    (None, "bytes, at most"),  # the real metadata padded past the cap
])
def test_garbled_metadata_is_refused(model, tmp_path, raw, match):
    meta, tensors = _meta_and_tensors(model)
    if raw is None:
        raw = json.dumps(dict(meta, pad="x" * MAX_META_BYTES))
    bad = _write_raw(tmp_path / "bad.pt", meta, tensors, raw_meta=raw)
    with pytest.raises(PolicyError, match=rf"corrupt model metadata \(.*{match}"):
        load_checkpoint(bad)


def test_only_regular_files_are_read(model, tmp_path):
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    errors = []
    reader = threading.Thread(target=lambda: errors.append(pytest.raises(PolicyError, load_checkpoint, fifo)),
                              daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked in open(): let it go (EOF), then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("load_checkpoint blocked on a FIFO")
    assert "not a regular file" in str(errors[0].value)
    for target in ("/dev/zero", str(tmp_path)):
        link = tmp_path / f"link{len(target)}.pt"
        link.symlink_to(target)
        with pytest.raises(PolicyError, match="not a regular file"):
            load_checkpoint(link)
    link = tmp_path / "link.pt"
    link.symlink_to(model)  # a link to a model is fine
    assert load_checkpoint(link).meta["format"] == "joulesched-dqn"


@pytest.mark.parametrize("name, dtype", [("q.adv.weight", torch.float16), ("q.adv.bias", torch.int64),
                                         ("target.adv.weight", torch.float64), ("optim.0.exp_avg", torch.float16)])
def test_weights_of_another_dtype_are_refused(tmp_path, name, dtype):
    """load_state_dict casts: int64 weights (rounded) or float16 ones loaded silently, checksum and all."""
    agent = DQN(DQNConfig(hidden=8, buffer_size=32, batch_size=8), seed=0)
    sum(p.sum() for p in agent.q.parameters()).backward()
    agent.optimizer.step()  # Adam state for every parameter
    path = save_checkpoint(tmp_path / "m.pt", agent, {"steps": 1})
    meta, tensors = _meta_and_tensors(path)
    tensors[name] = tensors[name].to(dtype)
    meta["tensors_sha256"] = tensors_digest(tensors)
    bad = tmp_path / "bad.pt"
    save_file(tensors, str(bad), metadata={META_KEY: json.dumps(meta)})
    with pytest.raises(PolicyError, match=re.escape(f"tensor {name!r} is ")):
        load_checkpoint(bad)
