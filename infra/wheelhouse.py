"""Build the wheelhouse the power_exporter role installs from with `pip install --no-index` (air-gapped hosts).

It holds joulesched's own wheel (built from this checkout, without touching it), the exporter's runtime
requirements, read from the role's defaults so there is one list, and ``requirements.lock``: exactly what the
role installs, each pinned by version and SHA-256, for ``pip install --require-hashes``. The lock's own hash is
the wheelhouse's content hash, which the role keys its install on: new code under an unchanged version number
gives a new wheel, so a new lock, so a reinstall. Fetching the requirements needs an index once, on the
controller; the hosts never do.

The joulesched wheel is built with ``SOURCE_DATE_EPOCH`` fixed, so the same source gives the same bytes (and no
needless reinstall on the hosts).

The wheels are the hosts' (:class:`WheelTarget`, by default :data:`HOSTS`), never the controller's: numpy and the
other compiled requirements ship one wheel per Python version and platform, and a wheelhouse resolved for a
controller on another Python or OS would hold wheels the hosts cannot install.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml

from joulesched.core.errors import JouleschedError
from joulesched.core.fsio import atomic_path, atomic_write_text

REPO = Path(__file__).resolve().parent.parent
ROLE_DEFAULTS = REPO / "playbooks" / "roles" / "power_exporter" / "defaults" / "main.yml"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
LOCK_NAME = "requirements.lock"
#: 1980-01-01, the earliest time a zip entry can carry.
SOURCE_DATE_EPOCH = "315532800"


class WheelhouseError(JouleschedError, RuntimeError):
    pass


_PYTHON_VERSION = re.compile(r"^3\.[0-9]{1,2}\Z")
_PLATFORM_TAG = re.compile(r"^[a-z0-9_]+\Z")


@dataclass(frozen=True)
class WheelTarget:
    """The interpreter and platform the hosts install the wheels on: pip's ``--python-version``,
    ``--implementation``, ``--platform`` (each given one is accepted; pip does not widen a manylinux_X_Y tag to
    older ones, so the list names them) and, when given, ``--abi``. Always binary only: pip refuses the target
    options otherwise, and a source build would run on the controller, for the controller."""

    python_version: str = "3.11"
    implementation: str = "cp"
    # Every glibc from 2.28 (bookworm has 2.36) down to 2.17: pip takes the tags as given and does not count
    # lower glibc versions in (only manylinux2014 brings 2010 and 1 with it).
    platforms: tuple[str, ...] = (*(f"manylinux_2_{v}_x86_64" for v in range(28, 16, -1)), "manylinux2014_x86_64")
    abis: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _PYTHON_VERSION.match(self.python_version):
            raise ValueError(f"python version {self.python_version!r}: expected 3.N, such as 3.11")
        if not self.platforms:
            raise ValueError("at least one platform tag is needed, such as manylinux_2_17_x86_64")
        for tag in (self.implementation, *self.platforms, *self.abis):
            if not _PLATFORM_TAG.match(tag):
                raise ValueError(f"{tag!r} is not a wheel tag (lower-case letters, digits and _)")

    def pip_args(self) -> list[str]:
        args = ["--only-binary", ":all:", "--python-version", self.python_version,
                "--implementation", self.implementation]
        for platform in self.platforms:
            args += ["--platform", platform]
        for abi in self.abis:
            args += ["--abi", abi]
        return args

    def describe(self) -> str:
        return f"{self.implementation}{self.python_version} on {', '.join(self.platforms)}"


#: The power_exporter role's hosts (its meta/main.yml): CPython 3.11, Debian bookworm's, on glibc x86_64, the
#: same target as scripts/download-wheels.sh. Hosts on another Python (Ubuntu noble's 3.12) need a wheelhouse built
#: for it (``joulesched infra wheelhouse --python-version 3.12``) and ``power_exporter_python_version`` set to
#: match, which the role's preflight checks against the host's python3.
HOSTS = WheelTarget()


def exporter_requirements() -> list[str]:
    return list(yaml.safe_load(ROLE_DEFAULTS.read_text())["power_exporter_requirements"])


def _pip(*args: str, what: str, env: dict[str, str] | None = None) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                       text=True, timeout=900, env={**os.environ, **(env or {})})
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


def download_argv(out: Path, reqs: list[str], target: WheelTarget = HOSTS) -> list[str]:
    """pip's arguments fetching the wheels of ``reqs`` (and their closure) for ``target`` into ``out``."""
    return ["download", "--dest", str(out), "--find-links", str(out), *target.pip_args(), *reqs]


def resolve_argv(out: Path, reqs: list[str], report: Path, target: WheelTarget = HOSTS) -> list[str]:
    """pip's arguments resolving ``reqs`` from ``out`` alone, as ``target`` would install them (a dry run). The
    ``--target`` folder (beside the report; nothing is written there) is what pip before 23.3 demands with
    platform options."""
    return ["install", "--dry-run", "--ignore-installed", "--no-index", "--find-links", str(out),
            "--target", str(Path(report).parent / "target"), *target.pip_args(), "--quiet", "--report", str(report),
            *reqs]


def build_wheelhouse(out: Path, *, requirements: list[str] | None = None, all_deps: bool = False,
                     source: Path = REPO, target: WheelTarget = HOSTS) -> Path:
    """Write joulesched-<version>-py3-none-any.whl (built from ``source``, a checkout), the requirements' wheels
    for ``target`` and :data:`LOCK_NAME` into `out`; return the wheel.

    Reuses wheels already in `out` (pip download skips what it has), so a cached wheelhouse refreshes fast."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="js-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for f in ("pyproject.toml", "README.md"):
            shutil.copy2(Path(source) / f, src / f)
        for pkg in package_folders():
            if (Path(source) / pkg).is_dir():
                shutil.copytree(Path(source) / pkg, src / pkg, ignore=_IGNORE)
        built = Path(tmp) / "dist"
        _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(built), str(src),
             what="building the joulesched wheel", env={"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH})
        name = f"joulesched-{project_version()}-py3-none-any.whl"
        if not (built / name).is_file():
            raise WheelhouseError(f"expected {name} after the build")
        wheel = out / name
        with atomic_path(wheel, 0o644) as t:  # a reader sees the old wheel or the new one, never half
            shutil.copyfile(built / name, t)
    reqs = [str(wheel)] if all_deps else (requirements if requirements is not None else exporter_requirements())
    if reqs:
        _pip(*download_argv(out, reqs, target), what=f"downloading the requirements' wheels for {target.describe()}")
    write_lock(out, wheel, reqs, all_deps=all_deps, target=target)
    return wheel


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(out: Path, reqs: list[str], target: WheelTarget = HOSTS) -> dict[str, tuple[str, Path]]:
    """``{name: (version, wheel)}``: what pip installs for ``reqs`` from the wheelhouse alone on ``target`` (its
    resolver, a dry run ignoring what this interpreter has; the wheel tags are the target's). pip evaluates
    environment markers against this interpreter, not ``--python-version`` (pypa/pip#11664): build on the hosts'
    Python, or a dependency marked for some versions only may be missing or extra."""
    if not reqs:
        return {}
    with tempfile.TemporaryDirectory(prefix="js-lock-") as tmp:
        report = Path(tmp) / "report.json"
        _pip(*resolve_argv(out, reqs, report, target),
             what=f"resolving the wheelhouse's requirements for {target.describe()}")
        doc = json.loads(report.read_text())
    found = {}
    for item in doc.get("install", []):
        url = item.get("download_info", {}).get("url", "")
        path = Path(unquote(urlsplit(url).path))
        if urlsplit(url).scheme != "file" or not path.is_file():
            raise WheelhouseError(f"the resolver chose {url!r}, not a wheel of {out}")
        meta = item["metadata"]
        found[_canonical(meta["name"])] = (meta["version"], path)
    return found


def write_lock(out: Path, wheel: Path, reqs: list[str], *, all_deps: bool = False,
               target: WheelTarget = HOSTS) -> Path:
    """``out/requirements.lock``: joulesched and the closure of ``reqs`` on ``target``,
    ``name==version --hash=sha256:...`` each, sorted; written atomically. Returns its path."""
    pins = resolve(out, reqs, target)
    if not all_deps:  # joulesched itself goes in without its training dependencies
        pins["joulesched"] = (project_version(), wheel)
    lines = [f"# {LOCK_NAME}: written by `joulesched infra wheelhouse`; install with pip --require-hashes --no-deps.",
             "# Its SHA-256 is the wheelhouse's content hash: the power_exporter role reinstalls when it changes.",
             f"# For {target.describe()} (power_exporter_python_version: \"{target.python_version}\")."]
    for name in sorted(pins):
        version, path = pins[name]
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{sha256_file(path)}")
    return atomic_write_text(Path(out) / LOCK_NAME, "\n".join(lines) + "\n", mode=0o644)


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
    members = wheels + ([wheelhouse / LOCK_NAME] if (wheelhouse / LOCK_NAME).is_file() else [])
    with atomic_path(out, 0o644) as tmp, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for w in members:
            info = tar.gettarinfo(str(w), arcname=w.name)
            info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = 0, 0o644, 0, 0, "root", "root"
            with w.open("rb") as f:
                tar.addfile(info, f)
    return out
