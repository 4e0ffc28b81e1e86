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

from joulesched.power.curves import MAX_WATTS, validate_curve

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

#: model -> relative speed (a V100 = 1), what a GPU job's run time divides by where a scenario sets
#: ``gpu_runtime`` (docs/twin.md, "GPU speed"). The proxy is datasheet memory bandwidth (V100 SXM2 900 GB/s, T4
#: 320, P100 PCIe 16 GB 732, A10 600, A100 40 GB SXM 1,555): deep-learning kernels are mostly memory-bound, and
#: unlike peak FLOPS it does not credit the T4's or A10's tensor figures, which their 70 W / 150 W limits do not
#: sustain. A first-order model, not a measurement; a node group overrides it with ``gpu_speed``.
GPU_SPEED: dict[str, float] = {
    "T4": 320 / 900, "P100": 732 / 900, "V100M16": 1.0, "V100M32": 1.0, "V100": 1.0, "A10": 600 / 900,
    "A100": 1555 / 900, "G1": 1.0, "G2": 1.0, "G3": 1.0,  # undisclosed OpenB models: a V100's (an assumption)
}
#: A GPU whose model is not in the table: a V100's speed.
DEFAULT_GPU_SPEED = 1.0


def gpu_speed(model: str, speed: float | None = None) -> float:
    """One GPU's relative speed: ``speed`` as given, else the model's table entry."""
    return float(speed) if speed is not None else GPU_SPEED.get(model, DEFAULT_GPU_SPEED)


def gpu_curve(model: str, watts: Sequence[float] | None = None) -> tuple[float, ...]:
    """One GPU's watts at 0, 10, ..., 100 % of its share: ``watts`` as given (2 values: idle and max, linear
    between; 11 values: the curve), else the model's table entry, linear."""
    if watts is not None and len(watts) == 11:
        return validate_curve(watts, busy_draw=False)
    if watts is not None and len(watts) != 2:
        raise ValueError(f"GPU power is [idle, max] or 11 watts (0..100 %), got {len(watts)} values")
    idle, peak = (watts if watts is not None else GPU_POWER.get(model, DEFAULT_GPU_POWER))
    if not 0 <= idle <= peak <= MAX_WATTS:
        raise ValueError(f"GPU power needs 0 <= idle <= max <= {MAX_WATTS:g}, got {idle}, {peak}")
    return tuple(float(idle + (peak - idle) * k / 10.0) for k in range(11))
