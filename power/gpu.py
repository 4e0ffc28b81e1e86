"""GPU board power per model: idle and maximum draw and the curve between them (docs/power.md, "GPU power").

Max is the vendor datasheet's board power (TDP). Idle is what NVML's ``nvmlDeviceGetPowerUsage`` reads on an
idle GPU with a context loaded (P0/P2 rather than P8: a GPU that holds a pod's memory does not drop to its
deepest state), from published measurements; it varies with driver, clocks and memory held, so a scenario
may override both per node group (``gpu_power_watts``). G1-G3 are OpenB's undisclosed internal models: they
get the V100 SXM2's figures, an assumption the docs state.

Between idle and max the draw is linear in the allocated share (a GPU running its pods flat out at their
share). Linear in SM utilisation is the usual first-order model of board power (e.g. the measurements in
Yang et al., "Part-time Power Measurements: nvidia-smi's Lack of Attention", arXiv 2312.02741); it is a model,
not a measurement of these traces, whose pods report no GPU usage.
"""

from __future__ import annotations

from collections.abc import Sequence

#: model -> (idle W, max W). Max: datasheet TDP; idle: published idle readings with a context loaded.
GPU_POWER: dict[str, tuple[float, float]] = {
    "T4": (10.0, 70.0),  # datasheet 70 W; ~9-10 W idle (P8) is NVML's usual idle reading
    "P100": (30.0, 250.0),  # P100 PCIe 250 W; ~25-30 W idle with memory held (the Pascal P0 idle quirk)
    "V100M16": (40.0, 300.0),  # V100 SXM2 300 W; ~40 W idle
    "V100M32": (40.0, 300.0),
    "V100": (40.0, 300.0),
    "A10": (20.0, 150.0),  # datasheet 150 W; ~15-20 W idle
    "A100": (55.0, 400.0),  # A100 SXM 400 W; ~50-60 W idle
    "G1": (40.0, 300.0),  # undisclosed OpenB models: V100 SXM2's figures (an assumption)
    "G2": (40.0, 300.0),
    "G3": (40.0, 300.0),
}
#: A GPU whose model is not in the table (or has none) and no gpu_power_watts: a V100-class board.
DEFAULT_GPU_POWER = (40.0, 300.0)


def gpu_curve(model: str, watts: Sequence[float] | None = None) -> tuple[float, ...]:
    """One GPU's watts at 0, 10, ..., 100 % of its share: ``watts`` as given (2 values: idle and max, linear
    between; 11 values: the curve), else the model's table entry, linear."""
    if watts is not None and len(watts) == 11:
        return tuple(float(w) for w in watts)
    if watts is not None and len(watts) != 2:
        raise ValueError(f"GPU power is [idle, max] or 11 watts (0..100 %), got {len(watts)} values")
    idle, peak = (watts if watts is not None else GPU_POWER.get(model, DEFAULT_GPU_POWER))
    if not 0 <= idle <= peak:
        raise ValueError(f"GPU power needs idle <= max, got {idle}, {peak}")
    return tuple(float(idle + (peak - idle) * k / 10.0) for k in range(11))
