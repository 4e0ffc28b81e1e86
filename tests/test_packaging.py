"""The installed shape of joulesched: one top-level import name, every package folder in the wheel."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from joulesched.infra.wheelhouse import package_folders

ROOT = Path(__file__).resolve().parent.parent


def _declared() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def test_every_package_folder_is_declared_and_nothing_else():
    """pyproject.toml lists packages by hand (the namespace maps folders); a new subpackage must be added."""
    found = set()
    for top in package_folders():
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            found.add("joulesched." + ".".join(rel.parts))
    assert found == _declared()
    assert "tests" not in package_folders() and "bench" not in package_folders()


def test_every_package_docstring_says_what_it_holds():
    for name in sorted(_declared()):
        init = ROOT.joinpath(*name.split(".")[1:], "__init__.py")
        doc = init.read_text().split('"""')
        assert len(doc) >= 3, f"{init}: no docstring"
        text = " ".join(doc[1].split())
        assert len(text) > 40 and not text.lower().rstrip(".").endswith(" package"), f"{init}: {text!r}"


@pytest.mark.slow
def test_the_wheel_has_only_joulesched_at_top_level(tmp_path):
    from joulesched.infra.wheelhouse import build_wheelhouse

    wheel = build_wheelhouse(tmp_path, requirements=[])
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert z.read(top_level).decode().split() == ["joulesched"]
        tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
        assert tops == {"joulesched"}, tops
        assert "joulesched/agent/baselines.py" in names and "joulesched/live/scheduler.py" in names
        assert not any(n.startswith("joulesched/tests/") or "kube_emulator" in n for n in names)
    # Installed on its own (no site-packages, so no editable finder), it imports under its one name.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(target), str(wheel)], check=True, timeout=300)
    code = ("import sys; sys.path[:0] = [sys.argv[1]]; import joulesched.core.errors, joulesched; "
            "print(list(joulesched.__path__))")
    r = subprocess.run([sys.executable, "-S", "-c", code, str(target)], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0 and str(target / "joulesched") in r.stdout, r.stdout + r.stderr
