"""The wheelhouse archive the power_exporter role can copy as one file: reproducible, so a second converge sees
nothing to unpack. (Building the wheelhouse itself is exercised by the container and guest tests.)"""

from __future__ import annotations

import tarfile
import time

import pytest

from joulesched.infra.wheelhouse import WheelhouseError, archive_wheelhouse


def _wheels(d, names=("b-1.0-py3-none-any.whl", "a-2.0-py3-none-any.whl")):
    d.mkdir()
    for n in names:
        (d / n).write_bytes(n.encode() * 100)
    (d / "notes.txt").write_text("not a wheel")
    return d


def test_same_wheels_make_the_same_bytes(tmp_path):
    wh = _wheels(tmp_path / "wh")
    first = archive_wheelhouse(wh).read_bytes()
    time.sleep(1.1)
    for w in wh.glob("*.whl"):  # touched: new mtimes must not change the archive
        w.write_bytes(w.read_bytes())
    assert archive_wheelhouse(wh, tmp_path / "again.tar").read_bytes() == first
    with tarfile.open(tmp_path / "wh.tar") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["a-2.0-py3-none-any.whl", "b-1.0-py3-none-any.whl"]
    assert all((m.mtime, m.mode, m.uid, m.gid) == (0, 0o644, 0, 0) for m in members)
    assert not list(tmp_path.glob("*.partial"))


def test_an_empty_wheelhouse_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(WheelhouseError, match="no wheels to archive"):
        archive_wheelhouse(tmp_path / "empty")
    assert not (tmp_path / "empty.tar").exists()
