"""Where the shipped scenarios and model live, and which of them make up the standard suites.

Paths are absolute, from this checkout (an editable install), so every command finds them whatever the
working directory.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIOS_DIR = REPO_ROOT / "scenarios"
MODELS_DIR = REPO_ROOT / "models"
#: The DQN `make demo` benchmarks and `joulesched test` evaluates by default (schema 2, issue 15; models/small.pt is
#: the schema-1 model it replaced, kept for comparison and to show that old models still load).
SHIPPED_MODEL = MODELS_DIR / "v2.pt"
#: The clusters the shipped model trains on beside the randomised ones (20-24 nodes; tiny, large and every trace
#: stay unseen, and training never uses a benchmark seed).
TRAIN_SCENARIO_NAMES = ("heterogeneous-sleep", "heterogeneous", "homogeneous", "services-diurnal-sleep",
                        "mixed-always-on")


def standard_suite() -> list[Path]:
    """The standard suite: every scenario file at the top of scenarios/ (subfolders hold other suites)."""
    return sorted(SCENARIOS_DIR.glob("*.yaml"))


def train_scenarios() -> list[Path]:
    """The default training mix (see :data:`TRAIN_SCENARIO_NAMES`)."""
    return [SCENARIOS_DIR / f"{n}.yaml" for n in TRAIN_SCENARIO_NAMES]


def display(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (for --help defaults and reports)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
