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


def _wheel(d, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal real wheel (what pip's resolver reads: METADATA, WHEEL, RECORD)."""
    import zipfile

    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n"
                                                                                for r in requires)
    with zipfile.ZipFile(d / f"{name}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}/__init__.py", "")
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


def test_the_lock_pins_the_closure_by_hash_and_changes_with_the_code(tmp_path):
    """requirements.lock holds joulesched and the requirements' closure, each with its SHA-256; new bytes in
    the joulesched wheel (new code, same version) give a new lock, which is what the role keys on."""
    import hashlib

    from joulesched.infra.wheelhouse import LOCK_NAME, project_version, write_lock

    wh = tmp_path / "wh"
    wh.mkdir()
    _wheel(wh, "alpha", "1.0", ("beta>=2",))
    _wheel(wh, "beta", "2.1")
    _wheel(wh, "gamma", "3.0")  # in the wheelhouse, not required: not in the lock
    js = wh / f"joulesched-{project_version()}-py3-none-any.whl"
    js.write_bytes(b"first build")
    lock = write_lock(wh, js, ["alpha"]).read_text()
    sha = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in wh.glob("*.whl")}
    assert f"alpha==1.0 \\\n    --hash=sha256:{sha['alpha-1.0-py3-none-any.whl']}" in lock
    assert f"beta==2.1 \\\n    --hash=sha256:{sha['beta-2.1-py3-none-any.whl']}" in lock
    assert f"joulesched=={project_version()} \\\n    --hash=sha256:{sha[js.name]}" in lock
    assert "gamma" not in lock
    js.write_bytes(b"second build, same version")
    assert write_lock(wh, js, ["alpha"]).read_text() != lock
    tar = archive_wheelhouse(wh)
    with tarfile.open(tar) as t:
        assert LOCK_NAME in t.getnames()
