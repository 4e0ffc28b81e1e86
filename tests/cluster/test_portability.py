"""Results do not depend on which SIMD kernels the machine has (issue 30).

numpy picks its kernels at import from the CPU's features (AVX-512 and AVX2 families on x86, through
``NPY_DISABLE_CPU_FEATURES`` one can turn dispatched ones off), and torch likewise (``ATEN_CPU_CAPABILITY``). The
standard suite is run three times in separate processes: as this machine runs it, without the AVX-512 family,
and without the AVX2 and AVX-512 families (torch on its portable kernels), and the results must agree to
``RTOL``. That is what a machine of another kind would compute, so a change that makes the suite depend on the
last bits of a float cannot land unseen. Identical bits are expected only on one machine (docs/twin.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Energies and pending times agree to this; counts and SLO rates exactly (they are ratios of integers).
RTOL = 1e-9
#: The policies whose arithmetic differs most: integer kube scores, float packing scores, the DQN (torch).
POLICIES = ("default-k8s", "awake-first:fit=efficient", "dqn=models/v2.pt")
#: Dispatched feature names per family, across numpy versions (2.4 groups them as X86_V3 / X86_V4).
AVX512 = ("X86_V4", "AVX512_ICL", "AVX512_SPR", "AVX512F", "AVX512CD", "AVX512_KNL", "AVX512_KNM", "AVX512_SKX",
          "AVX512_CLX", "AVX512_CNL")
AVX2 = ("X86_V3", "AVX2", "FMA3", "AVX", "F16C")


def _dispatchable(names: tuple[str, ...]) -> list[str]:
    """The names numpy can turn off here: dispatched, and not part of its compiled baseline."""
    from numpy._core._multiarray_umath import __cpu_baseline__, __cpu_dispatch__

    return [n for n in names if n in __cpu_dispatch__ and n not in __cpu_baseline__]


def _suite(out: Path, env_extra: dict[str, str]) -> dict:
    cmd = [sys.executable, "-m", "joulesched.pipelines.cli", "benchmark", "--no-report", "--json", "-o", str(out)]
    for p in POLICIES:
        cmd += ["-p", p]
    env = {**os.environ, **env_extra}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)["summary"]


def _compare(base: dict, other: dict, label: str) -> list[str]:
    bad = []
    assert base.keys() == other.keys(), label
    for scen, s in base.items():
        for pol, m in s["policies"].items():
            o = other[scen]["policies"][pol]
            for key in ("energy_joules", "mean_pending_s"):
                if not np.isclose(o[key], m[key], rtol=RTOL, atol=1e-9):
                    bad.append(f"{label} {scen} {pol} {key}: {m[key]!r} vs {o[key]!r}")
            for key in ("slo_violation_rate", "unschedulable_pods"):
                if o[key] != m[key]:
                    bad.append(f"{label} {scen} {pol} {key}: {m[key]!r} vs {o[key]!r}")
    return bad


@pytest.mark.slow
def test_standard_suite_agrees_across_cpu_feature_levels(tmp_path):
    if np.lib.NumpyVersion(np.__version__) < "1.22.0":
        pytest.skip("NPY_DISABLE_CPU_FEATURES needs numpy >= 1.22")
    no512 = _dispatchable(AVX512)
    no_avx = _dispatchable(AVX2 + AVX512)
    if not no_avx:
        pytest.skip("this numpy build dispatches no AVX2 or AVX-512 kernels that could be turned off")
    runs = {"default": {}, "no-avx512": {"NPY_DISABLE_CPU_FEATURES": " ".join(no512)},
            "no-avx2": {"NPY_DISABLE_CPU_FEATURES": " ".join(no_avx), "ATEN_CPU_CAPABILITY": "default"}}
    if not no512:
        del runs["no-avx512"]
    # The variable took: numpy in a child process reports those features off.
    probe = "from numpy._core._multiarray_umath import __cpu_features__ as f; print(sorted(k for k, v in f.items() if v))"
    child = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **runs["no-avx2"]},
                           capture_output=True, text=True, check=True).stdout
    assert not set(no_avx) & set(json.loads(child.replace("'", '"'))), child
    with ThreadPoolExecutor(len(runs)) as pool:
        res = dict(zip(runs, pool.map(lambda kv: _suite(tmp_path / kv[0], kv[1]), runs.items())))
    assert len(res["default"]) >= 10, "the standard suite ran"
    bad = [line for name in runs if name != "default" for line in _compare(res["default"], res[name], name)]
    assert not bad, "results depend on the CPU's SIMD kernels:\n" + "\n".join(bad[:10])
