"""The sim pipeline's report copies the model's training curve into plots/ atomically: a copy that fails part
way leaves the previous plot (or none), never a truncated PNG under the final name."""

from __future__ import annotations

import shutil

import pytest

from joulesched.pipelines.sim_pipeline import copy_training_curve

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64


def _model(tmp_path):
    model = tmp_path / "models" / "dqn.pt"
    model.parent.mkdir()
    (model.parent / "dqn.curve.png").write_bytes(PNG)
    return model


def test_a_copy_that_fails_part_way_leaves_the_old_plot_and_no_temporary_file(tmp_path, monkeypatch):
    out = tmp_path / "out"
    old = out / "plots" / "training_curve.png"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"previous plot")
    model = _model(tmp_path)

    def half_then_fail(src, dst):
        with open(dst, "wb") as f:
            f.write(open(src, "rb").read()[: len(PNG) // 2])
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(shutil, "copyfile", half_then_fail)
        with pytest.raises(OSError, match="No space left"):
            copy_training_curve(model, out)
    assert old.read_bytes() == b"previous plot"
    assert [p.name for p in old.parent.iterdir()] == ["training_curve.png"]
    # Then a copy that succeeds replaces it whole; no curve beside a model, nothing to copy.
    assert copy_training_curve(model, out) == old and old.read_bytes() == PNG
    assert copy_training_curve(tmp_path / "none.pt", out) is None


def test_a_model_without_a_curve_removes_an_earlier_models_plot(tmp_path):
    """A review: the report showed the previous model's training curve for a model that has none."""
    out = tmp_path / "run"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "training_curve.png").write_bytes(b"v2's")
    model = tmp_path / "nocurve.pt"
    model.write_bytes(b"")
    assert copy_training_curve(model, out) is None
    assert not (out / "plots" / "training_curve.png").exists()
