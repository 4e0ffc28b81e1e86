"""Build the wheelhouse the power_exporter role installs from with `pip install --no-index` (air-gapped hosts).

It holds joulesched's own wheel (built from this checkout, without touching it) and the exporter's runtime
requirements, read from the role's defaults so there is one list. Fetching those needs an index once, on the
controller; the hosts never do.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

from joulesched.core.errors import JouleschedError

REPO = Path(__file__).resolve().parent.parent
ROLE_DEFAULTS = REPO / "playbooks" / "roles" / "power_exporter" / "defaults" / "main.yml"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


class WheelhouseError(JouleschedError, RuntimeError):
    pass


def exporter_requirements() -> list[str]:
    return list(yaml.safe_load(ROLE_DEFAULTS.read_text())["power_exporter_requirements"])


def _pip(*args: str, what: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0:
        raise WheelhouseError(f"{what} failed: {(r.stderr or r.stdout).strip()[-2000:]}")


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())


def project_version() -> str:
    return _pyproject()["project"]["version"]


def package_folders() -> list[str]:
    """The folders that install as ``joulesched.<folder>`` (pyproject.toml's package list)."""
    return sorted({name.split(".")[1] for name in _pyproject()["tool"]["setuptools"]["packages"]})


def build_wheelhouse(out: Path, *, requirements: list[str] | None = None, all_deps: bool = False) -> Path:
    """Write joulesched-<version>-py3-none-any.whl and the requirements' wheels into `out`; return the wheel.

    Reuses wheels already in `out` (pip download skips what it has), so a cached wheelhouse refreshes fast."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="js-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for f in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / f, src / f)
        for pkg in package_folders():
            if (REPO / pkg).is_dir():
                shutil.copytree(REPO / pkg, src / pkg, ignore=_IGNORE)
        _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(src),
             what="building the joulesched wheel")
    wheel = out / f"joulesched-{project_version()}-py3-none-any.whl"
    if not wheel.is_file():
        raise WheelhouseError(f"expected {wheel} after the build")
    reqs = [str(wheel)] if all_deps else (requirements if requirements is not None else exporter_requirements())
    if reqs:
        _pip("download", "--dest", str(out), "--find-links", str(out), "--only-binary", ":all:", *reqs,
             what="downloading the requirements' wheels")
    return wheel


def archive_wheelhouse(wheelhouse: Path, out: Path | None = None) -> Path:
    """One reproducible tar of the wheelhouse (default: ``<wheelhouse>.tar``), for the role to copy as a single
    file: Ansible copies a directory file by file, several module runs each, which costs minutes on slow hosts.

    Reproducible (sorted names, mtime 0, root-owned, 0644) so that the same wheels make the same bytes, and the
    role's unarchive sees nothing to change on a second run."""
    wheelhouse = Path(wheelhouse)
    out = Path(out) if out is not None else wheelhouse.with_name(wheelhouse.name + ".tar")
    wheels = sorted(wheelhouse.glob("*.whl"))
    if not wheels:
        raise WheelhouseError(f"{wheelhouse}: no wheels to archive")
    tmp = out.with_name(out.name + ".partial")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for w in wheels:
            info = tar.gettarinfo(str(w), arcname=w.name)
            info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = 0, 0o644, 0, 0, "root", "root"
            with w.open("rb") as f:
                tar.addfile(info, f)
    tmp.replace(out)
    return out
