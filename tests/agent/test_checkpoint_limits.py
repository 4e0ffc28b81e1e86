"""A model file's metadata builds the network and the replay buffer: asking for huge sizes is refused before
anything is allocated, with a message naming the field; the checkpoint and its JSON sidecar are written
atomically (a failed write leaves the old pair and no temporary file)."""

from __future__ import annotations

import json
import os
import time

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from joulesched.agent.checkpoint import META_KEY, load_checkpoint, save_checkpoint
from joulesched.agent.config import LIMITS, DQNConfig
from joulesched.agent.dqn import DQN
from joulesched.agent.policy import PolicyError


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
