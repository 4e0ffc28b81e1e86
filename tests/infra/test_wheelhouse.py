"""The wheelhouse archive the power_exporter role can copy as one file: reproducible, so a second converge sees
nothing to unpack. (Building the wheelhouse itself is exercised by the container and guest tests.)"""

from __future__ import annotations

import tarfile
import time
from pathlib import Path

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


def _option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == option]


def test_both_pip_calls_take_the_hosts_python_and_platform_not_the_controllers():
    """pip download and the lock's dry-run resolve without --python-version/--platform chose wheels for the
    controller's interpreter: a controller on Python 3.12 or macOS built a wheelhouse the hosts (CPython 3.11,
    glibc x86_64) could not install. Both argvs name the hosts' target, binary only."""
    from joulesched.infra.wheelhouse import HOSTS, download_argv, resolve_argv

    for argv in (download_argv(Path("/wh"), ["numpy>=1.26"]),
                 resolve_argv(Path("/wh"), ["numpy>=1.26"], Path("/r.json"))):
        assert _option_values(argv, "--python-version") == ["3.11"], argv
        assert _option_values(argv, "--implementation") == ["cp"], argv
        platforms = _option_values(argv, "--platform")  # pip does not count lower glibc versions in itself
        assert platforms[0] == "manylinux_2_28_x86_64" and "manylinux_2_24_x86_64" in platforms, argv
        assert platforms[-2:] == ["manylinux_2_17_x86_64", "manylinux2014_x86_64"], argv
        assert _option_values(argv, "--only-binary") == [":all:"], argv
        assert argv[-1] == "numpy>=1.26"
    assert HOSTS.python_version == "3.11"


def test_build_wheelhouse_passes_its_target_to_download_and_resolve(tmp_path, monkeypatch):
    """What build_wheelhouse hands pip (pip itself stood in for: no index, no build)."""
    import json

    from joulesched.infra import wheelhouse as wh
    from joulesched.infra.wheelhouse import WheelTarget, build_wheelhouse, project_version

    calls: list[list[str]] = []

    def pip(*args, what, env=None):
        calls.append(list(args))
        if args[0] == "wheel":  # the joulesched wheel, built from the checkout
            out = Path(args[args.index("--wheel-dir") + 1])
            out.mkdir(parents=True, exist_ok=True)
            (out / f"joulesched-{project_version()}-py3-none-any.whl").write_bytes(b"wheel")
        elif args[0] == "install":  # the dry run: its report, installing nothing more
            Path(args[args.index("--report") + 1]).write_text(json.dumps({"install": []}))

    monkeypatch.setattr(wh, "_pip", pip)
    target = WheelTarget(python_version="3.12", platforms=("manylinux_2_39_x86_64",))
    build_wheelhouse(tmp_path / "wh", requirements=["numpy>=1.26"], target=target)
    by_cmd = {c[0]: c for c in calls}
    for cmd in ("download", "install"):
        assert _option_values(by_cmd[cmd], "--python-version") == ["3.12"], by_cmd[cmd]
        assert _option_values(by_cmd[cmd], "--platform") == ["manylinux_2_39_x86_64"], by_cmd[cmd]
    assert "cp3.12" in (tmp_path / "wh" / "requirements.lock").read_text()


@pytest.mark.parametrize("kw, words", [({"python_version": "3"}, "expected 3.N"),
                                       ({"python_version": "2.7"}, "expected 3.N"),
                                       ({"platforms": ()}, "at least one platform"),
                                       ({"platforms": ("linux x86_64",)}, "not a wheel tag")])
def test_a_bad_target_is_refused(kw, words):
    from joulesched.infra.wheelhouse import WheelTarget

    with pytest.raises(ValueError, match=words):
        WheelTarget(**kw)


def test_the_cli_refuses_a_bad_target_with_exit_2(tmp_path):
    from typer.testing import CliRunner

    from joulesched.pipelines.cli.infra import app

    r = CliRunner().invoke(app, ["wheelhouse", "--out", str(tmp_path / "wh"), "--python-version", "311"])
    assert r.exit_code == 2 and "expected 3.N, such as 3.11" in r.output, r.output
    assert not (tmp_path / "wh").exists()


def test_the_lock_resolve_names_a_target_folder_as_pip_before_23_3_demands():
    """pip before 23.3 refuses platform options on `install --dry-run` without --target ("Can not use any
    platform or abi specific options unless installing via '--target'")."""
    from joulesched.infra.wheelhouse import resolve_argv

    argv = resolve_argv(Path("/wh"), ["numpy>=1.26"], Path("/tmp/x/r.json"))
    assert _option_values(argv, "--target") == ["/tmp/x/target"] and "--dry-run" in argv
