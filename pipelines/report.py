"""The HTML report: the verdict first, then plots people would rather look at than read, then the tables.

Every figure of a report draws a policy in one colour (:func:`policy_colors`: default-k8s and the DQN always the
same two, a qualitative palette for the rest) and every artist that stands for a policy carries the policy's
name as its matplotlib ``gid``, so tests read the colours back from the figures. Many scenarios become small
multiples (one panel per scenario, shared axes) rather than one crowded chart.
"""

from __future__ import annotations

import colorsys
import functools
import itertools
import json
import math
import os
import re
import shutil
import tempfile
import textwrap
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: reports are written on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from jinja2 import Environment, select_autoescape  # noqa: E402
from markupsafe import Markup, escape  # noqa: E402
from matplotlib.colors import to_hex, to_rgb  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from joulesched.agent.registry import DEFAULT_POLICIES, family_of, heuristics_among  # noqa: E402
from joulesched.core.fsio import atomic_path, atomic_savefig, atomic_write_text, read_text_input  # noqa: E402
from joulesched.core.plots import plain_text_figures  # noqa: E402
from joulesched.pipelines.results import (PolicySummary, Results, ResultsError, ScenarioRun, load_results,  # noqa: E402
                                          parse_json, weakest_optimum_label)
from joulesched.pipelines.stats import mean_ci, ratios  # noqa: E402
from joulesched.pipelines.report_files import check_report_outputs, report_plots  # noqa: E402,F401

#: "Equal service" as the project's goals state it (docs/dqn.md, docs/PERFORMANCE.md): at most default-k8s's SLO
#: violation rate plus half a percentage point.
SLO_SLACK = 0.005
#: default-k8s, the reference every ratio divides by: a neutral dark grey.
DEFAULT_K8S_COLOR = "#4d4d4d"
#: The (first) learned policy, the one a reader looks for: red, which no other policy gets.
LEARNED_COLOR = "#d62728"
# matplotlib's tab10 without its red and grey, then four darker tab20b/c hues, then tab20's light tints: the
# first twelve policies of a report (the demo's count) are at least 25 CIE76 units apart, all eighteen at least 17.
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#393b79",
            "#e7ba52", "#637939", "#7b4173", "#aec7e8", "#ffbb78", "#98df8a", "#f7b6d2", "#9edae5", "#c49c94")
#: The default policies' own palette slots, in the registry's order.
_FIXED_SLOTS = tuple(p for p in DEFAULT_POLICIES if p != "default-k8s")
#: How far (CIE76) a colour past the palette stays from the DQN's red and default-k8s's grey, which a reader looks
#: for: about ten just noticeable differences.
_FIXED_COLOR_GAP = 30.0
_DPI = 110


def fmt_energy(joules: float) -> str:
    """Joules in the unit that keeps three significant digits: a cluster-day is kWh, a short measured run J."""
    if joules >= 3.6e5:
        return f"{joules / 3.6e6:.2f} kWh"
    if joules >= 1e3:
        return f"{joules / 1e3:.1f} kJ"
    return f"{joules:.0f} J"


def policy_colors(policies: list[str]) -> dict[str, str]:
    """One colour per policy, for every figure and table of a report.

    default-k8s is always :data:`DEFAULT_K8S_COLOR` and the first learned policy :data:`LEARNED_COLOR`; each
    other default policy has its own palette slot (so most-allocated looks the same in every report), and the
    remaining policies take the lowest free slots. Past the palette (more than 20 policies) come
    :func:`_extra_colors`, each as far from those before it as a dense grid of colours allows.
    """
    colors: dict[str, str] = {}
    if "default-k8s" in policies:
        colors["default-k8s"] = DEFAULT_K8S_COLOR
    learned = [p for p in policies if family_of(p) == "learned"]
    if learned:
        colors[learned[0]] = LEARNED_COLOR
    slots = {p: _FIXED_SLOTS.index(p) for p in policies if p in _FIXED_SLOTS and p not in colors}
    free = (k for k in itertools.count() if k not in slots.values())
    slots.update({p: next(free) for p in policies if p not in colors and p not in slots})
    extra = _extra_colors(max(0, max(slots.values(), default=0) + 1 - len(_PALETTE)))
    for p, k in slots.items():
        colors[p] = _PALETTE[k] if k < len(_PALETTE) else extra[k - len(_PALETTE)]
    return {p: colors[p] for p in policies}


def _lab(colors) -> np.ndarray:
    """CIE L*a*b* (D65) of sRGB colours, a row each: the distance between two rows (CIE76) is how different the
    colours look, 2.3 a just noticeable difference."""
    rgb = np.array([to_rgb(c) for c in colors])
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = lin @ np.array([[0.4124, 0.2126, 0.0193], [0.3576, 0.7152, 0.1192], [0.1805, 0.0722, 0.9505]])
    xyz /= (0.95047, 1.0, 1.08883)
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz * (29 / 6) ** 2 / 3 + 4 / 29)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], axis=1)


@functools.cache
def _extra_colors(n: int) -> tuple[str, ...]:
    """``n`` colours for the policies past the palette, in order: each, among a dense grid of hues, lightnesses
    and saturations, the one farthest (CIE76) from the palette, the red, the grey and the colours before it;
    none within :data:`_FIXED_COLOR_GAP` of the red or the grey, nor a pale tint that a white page washes out.
    Deterministic, so a policy keeps its colour from one report of as many policies to the next."""
    grid = itertools.product(np.arange(72) / 72, (0.3, 0.4, 0.5, 0.6, 0.7), (0.5, 0.75, 1.0))
    cands = sorted({to_hex(colorsys.hls_to_rgb(h, light, sat)) for h, light, sat in grid})
    lab = _lab(cands)
    fixed = _lab([LEARNED_COLOR, DEFAULT_K8S_COLOR])
    keep = (np.linalg.norm(lab[:, None] - fixed, axis=2).min(axis=1) >= _FIXED_COLOR_GAP) & (lab[:, 0] <= 85)
    cands, lab = [c for c, k in zip(cands, keep) if k], lab[keep]
    gap = np.linalg.norm(lab[:, None] - _lab([*_PALETTE, LEARNED_COLOR, DEFAULT_K8S_COLOR]), axis=2).min(axis=1)
    out = []
    for _ in range(n):  # greedy farthest point; past ~900 policies colours repeat
        k = int(np.argmax(gap))
        out.append(cands[k])
        gap = np.minimum(gap, np.linalg.norm(lab - lab[k], axis=1))
    return tuple(out)


def short_label(policy: str, width: int = 32) -> str:
    """A policy name that fits a legend or an axis: a ``dqn=PATH`` spec keeps its start and its file name."""
    return policy if len(policy) <= width else f"{policy[:10]}…{policy[-(width - 11):]}"


def _reference(policies: list[str]) -> str:
    return "default-k8s" if "default-k8s" in policies else policies[0]


def _grid(n: int, max_cols: int = 4) -> tuple[int, int]:
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


def _save(fig: Figure, path: Path) -> None:
    atomic_savefig(fig, path, dpi=_DPI)
    plt.close(fig)


def _wrap(text: str, width: int = 26) -> str:
    """A scenario name on lines of at most about ``width`` characters, broken after hyphens where it can be."""
    return "\n".join(line.replace("- ", "-") for line in textwrap.wrap(text.replace("-", "- "), width))


def _plain_number(v: float, _pos=None) -> str:
    """A tick label in plain text: 0, 1, 10, 1,000. A log axis's own labels are mathtext, which reports turn off
    (:func:`plain_text_figures`): they would print as ``$\\mathdefault{10^{0}}$``."""
    if v == 0:
        return "0"  # not "-0"
    return (f"{v:,.0f}" if abs(v) >= 1 else f"{v:g}").replace("-", "\N{MINUS SIGN}")


def _slo_budget(rows: dict[str, PolicySummary]) -> float:
    """The SLO violation rate a policy may reach and still count as equal service: default-k8s's plus
    :data:`SLO_SLACK` (without default-k8s in the run, the lowest rate of the run plus it)."""
    ref = rows["default-k8s"] if "default-k8s" in rows else min(rows.values(), key=lambda r: r.slo_violation_rate)
    return ref.slo_violation_rate + SLO_SLACK


def _within_budget(rows: dict[str, PolicySummary]) -> list[str]:
    """The policies that give equal service: within the SLO budget (:func:`_slo_budget`), and leaving no more pods
    unplaced than default-k8s (mean over seeds; without default-k8s, than the fewest of the run). A policy that
    leaves pods unplaced runs less work and so burns less: it must not win on that. Should no policy meet both
    (possible only without default-k8s), the SLO budget alone."""
    budget = _slo_budget(rows)
    cap = (rows["default-k8s"] if "default-k8s" in rows else min(rows.values(),
                                                                 key=lambda r: r.unschedulable_pods)).unschedulable_pods
    slo_ok = [p for p, r in rows.items() if r.slo_violation_rate <= budget + 1e-12]
    return [p for p in slo_ok if rows[p].unschedulable_pods <= cap + 1e-9] or slo_ok


def _least_energy_within_budget(doc: Results, name: str) -> str:
    """The verdict's pick, which each scenario's table highlights too: the least-energy policy of equal service
    (:func:`_within_budget`; the first of equals in ``doc.policies``' order), ranked by what the page shows beside
    it, energy / the reference per seed then averaged (:func:`_ratios_to_reference`). Mean joules over seeds can
    rank otherwise (a seed of larger energies weighs more; a review: the pick showed a worse ratio than another
    policy of equal service). Where the reference drew nothing there is no ratio: then mean joules."""
    rows = {p: doc.summary[name].policies[p] for p in doc.policies}
    within = _within_budget(rows)
    vs_ref = _ratios_to_reference(doc, name)
    if all(math.isfinite(vs_ref[p]) for p in within):
        return min(within, key=lambda p: vs_ref[p])
    return min(within, key=lambda p: rows[p].energy_joules)


def _ratios_to_reference(doc: Results, name: str) -> dict[str, float]:
    """Energy / the reference per policy, per seed then averaged (the tables' ``vs default-k8s``)."""
    ref = _reference(doc.policies)
    entries = doc.runs(name)
    base = [e.policies[ref].energy_joules for e in entries]
    # NaN where the reference drew nothing (curves that start at 0 W): no bar or point, a dash in the verdict.
    return {p: float(np.mean(r)) if (r := ratios([e.policies[p].energy_joules for e in entries], base)) else math.nan
            for p in doc.policies}


def bound_ratios(doc: Results, name: str) -> dict[str, float]:
    """Scenario ``name``'s fluid lower bound and, where it was solved, the optimum, as energy / the reference
    (default-k8s where it ran): per seed, then averaged, as every policy's ratio (the ratio of two means differs
    where the seeds' energies differ)."""
    ref = _reference(doc.policies)
    entries = doc.runs(name)
    base = [e.policies[ref].energy_joules for e in entries]
    out = {}
    lb = [e.lower_bound_joules for e in entries]
    if all(v for v in lb) and (r := ratios(lb, base)):  # a measured run (the kube path) has no lower bound
        out["fluid lower bound"] = float(np.mean(r))
    opt = [e.optimum.schedule_energy if e.optimum else None for e in entries]
    if all(v for v in opt) and (r := ratios(opt, base)):
        # named as the tables name it: a schedule not proven on every seed is the best found, not the optimum
        kind = weakest_optimum_label({e.optimum_label() for e in entries})
        out[{"optimum": "optimum (MIP)", "optimum*": "best schedule (MIP)"}.get(kind, f"{kind} (MIP)")] = \
            float(np.mean(r))
    return out


_BOUND_STYLE = {"fluid lower bound": {"color": "black", "lw": 1.4, "ls": "-"},
                "optimum (MIP)": {"color": "black", "lw": 1.2, "ls": ":"}}


def _panels(n: int, panel_w: float, panel_h: float, extra_w: float, extra_h: float):
    """Small multiples: one panel per scenario on a grid of at most four columns, shared axes, constrained
    layout (which keeps titles, tick labels and outside legends from overlapping)."""
    rows, cols = _grid(n)
    fig, axes = plt.subplots(rows, cols, figsize=(panel_w * cols + extra_w, panel_h * rows + extra_h), sharex=True,
                             sharey=True, squeeze=False, layout="constrained")
    # Room between panels for half a tick label on each side: the last x label of one panel and the first of
    # the next would otherwise touch.
    fig.get_layout_engine().set(wspace=0.08)
    for k in range(n, rows * cols):  # the last row's empty slots: their neighbours above show the x ticks
        axes.flat[k].set_visible(False)
        axes.flat[k - cols].xaxis.set_tick_params(labelbottom=True)
    return fig, axes


def fig_energy_ratio(doc: Results, colors: dict[str, str]) -> Figure:
    """Energy / default-k8s per policy, one panel per scenario (horizontal bars, so policy names never collide),
    with the lower bound and the optimum where it was solved."""
    summ, policies = doc.summary, doc.policies
    ref = _reference(policies)
    names = list(summ)
    fig, axes = _panels(len(names), 2.6, 0.17 * len(policies) + 0.85, 2.3, 0.9)
    y = np.arange(len(policies))
    shown: dict[str, dict] = {}
    for ax, n in zip(axes.flat, names):
        vals = _ratios_to_reference(doc, n)
        bars = ax.barh(y, [vals[p] for p in policies], height=0.75, color=[colors[p] for p in policies])
        for bar, p in zip(bars, policies):
            bar.set_gid(p)
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        for label, v in bound_ratios(doc, n).items():
            style = _BOUND_STYLE.get(label, _BOUND_STYLE["optimum (MIP)"])
            ax.axvline(v, **style)
            shown[label] = style
        ax.set_title(_wrap(n), fontsize=9)
        ax.grid(axis="x", lw=0.4, alpha=0.5)
        ax.tick_params(labelsize=8)
    axes[0, 0].set_yticks(y, [short_label(p) for p in policies])
    axes[0, 0].invert_yaxis()  # the first policy on top, as in the tables
    axes[0, 0].set_xlim(left=0)
    handles = [Line2D([], [], color="grey", lw=0.8, ls="--", label=f"{ref} = 1")]
    handles += [Line2D([], [], label=k, **v) for k, v in shown.items()]
    # Intervals stay in the tables: with two seeds a 95 % Student-t whisker is wider than the differences.
    fig.supxlabel(f"energy / {ref}, mean over seeds (lower is better)", fontsize=9)
    fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), frameon=False, fontsize=8)
    return fig


def fig_energy_vs(doc: Results, colors: dict[str, str], key: str, label: str, scale: float) -> Figure:
    """Energy / default-k8s against a service metric, one panel per scenario on shared axes; a cross marks a
    policy short of equal service (over the scenario's SLO budget, or more pods unplaced: :func:`_within_budget`)."""
    summ, policies = doc.summary, doc.policies
    ref = _reference(policies)
    names = list(summ)
    # The legend (a line per policy, outside on the right) sets the least height: a few panels of many
    # policies would otherwise push it over the x label.
    legend_h = 0.19 * (len(policies) + 2) + 0.9
    panels_h = 2.3 * _grid(len(names))[0]
    fig, axes = _panels(len(names), 2.7, 2.3, 2.6, max(0.8, legend_h - panels_h))
    for ax, n in zip(axes.flat, names):
        rows = summ[n].policies
        vals = _ratios_to_reference(doc, n)
        within = set(_within_budget(rows))
        for p in policies:
            ok = p in within
            ax.scatter(scale * (getattr(rows[p], key) or 0.0), vals[p], s=34 if ok else 46, marker="o" if ok else "X",
                       color=colors[p], edgecolors="white", linewidths=0.5, zorder=3, gid=p)
        # Pending times span orders of magnitude (0.1 s for a spreader, minutes for a packer that waits for
        # wake-ups): a symmetric log axis keeps zero and both ends visible.
        ax.set_xscale("symlog", linthresh=1.0)
        ax.xaxis.set_major_formatter(FuncFormatter(_plain_number))  # minor ticks stay unlabelled
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(_wrap(n), fontsize=9)
        ax.grid(lw=0.4, alpha=0.5)
        ax.tick_params(labelsize=8)
    handles = [Line2D([], [], ls="", marker="o", color=colors[p], label=short_label(p)) for p in policies]
    handles += [Line2D([], [], ls="", marker="o", color="#999999", label="within the SLO budget"),
                Line2D([], [], ls="", marker="X", color="#999999", label="over it, or more pods unplaced")]
    # Zero and at least one decade on every panel: a run whose pods all waited under a second would otherwise
    # get symlog ticks such as 6.69e-3.
    xmax = max(scale * (getattr(summ[n].policies[p], key) or 0.0) for n in names for p in policies)
    axes[0, 0].set_xlim(-0.2, max(10.0, 2 * xmax))
    fig.supxlabel(f"{label}; bottom left is best", fontsize=9)
    fig.supylabel(f"energy / {ref}", fontsize=9)
    fig.legend(handles=handles, loc="outside right upper", frameon=False, fontsize=8)
    return fig


def fig_power(doc: Results, tl: dict, key: str, name: str, seed: int, colors: dict[str, str]) -> Figure | None:
    """Cluster power and nodes awake over time, per policy, on the scenario's first seed."""
    if f"{key}/bin_s" not in tl:
        return None
    bin_s = float(tl[f"{key}/bin_s"][0])
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]},
                                  layout="constrained")
    for p in doc.policies:
        w = tl.get(f"{key}/{p}/watts")
        if w is None:
            continue
        t = np.arange(w.size) * bin_s / 3600
        ax.plot(t, w / 1000, lw=1.1, label=short_label(p), color=colors[p], gid=p)
        ax2.plot(t, tl[f"{key}/{p}/awake"], lw=1.0, color=colors[p], gid=p)
    ax.set_ylabel("cluster power (kW)")
    ax.set_title(f"{name}: power over time (workload seed {seed})", fontsize=10)
    ax2.set_ylabel("nodes awake")
    # A count: from zero (a margin below, so that asleep stretches are not hidden under the axis) with integer
    # ticks (no 2.5 nodes; a flat line got 2.9, 3.0, 3.1), few enough for the short panel.
    ax2.set_ylim(bottom=-0.05 * max(ax2.get_ylim()[1], 1.0))
    ax2.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 5, 10], integer=True))
    ax2.set_xlabel("time (h)")
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    return fig


def _spaced(centers: list[float], min_gap: float) -> list[int]:
    """Indices of the labels to show so that no two are closer than ``min_gap`` (the rest are dropped)."""
    keep: list[int] = []
    for k, c in enumerate(centers):
        if not keep or c - centers[keep[-1]] >= min_gap:
            keep.append(k)
    return keep


def fig_util(doc: Results, tl: dict, nodes: dict, key: str, name: str, seed: int) -> Figure | None:
    """Per-node CPU utilisation over time for default-k8s and the verdict's pick (the least energy within the SLO
    budget), the policy the scenario's table highlights."""
    best = _least_energy_within_budget(doc, name)
    show = [p for p in dict.fromkeys(["default-k8s", best]) if f"{key}/{p}/util" in tl]
    if not show or f"{key}/bin_s" not in tl:
        return None
    bin_s = float(tl[f"{key}/bin_s"][0])
    height = 4.2
    fig, axes = plt.subplots(1, len(show), figsize=(5.2 * len(show) + 1.2, height), squeeze=False,
                             layout="constrained")
    groups = nodes.get(key, {}).get("node_groups", [])
    for ax, p in zip(axes[0], show):
        u = tl[f"{key}/{p}/util"].astype(np.float32)
        im = ax.imshow(u.T, aspect="auto", origin="lower", vmin=0, vmax=1, cmap="viridis", interpolation="nearest",
                       extent=(0, u.shape[0] * bin_s / 3600, 0, u.shape[1]))
        ax.set_title(short_label(p), fontsize=10)
        ax.set_xlabel("time (h)")
        # Label node groups instead of node numbers, and mark their boundaries, so heterogeneity is visible;
        # a label that would touch the one below it (a group of few nodes) is left out.
        starts = [k for k in range(len(groups)) if k == 0 or groups[k] != groups[k - 1]]
        ends = starts[1:] + [len(groups)]
        for k in starts[1:]:
            ax.axhline(k, color="white", lw=0.6)
        if groups:
            centers = [(a + b) / 2 for a, b in zip(starts, ends)]
            keep = _spaced(centers, len(groups) * 11 / (72 * (height - 1.0)))  # 11 pt per label, axes ~3.2 in
            ax.set_yticks([centers[k] for k in keep], [groups[starts[k]] for k in keep], fontsize=7)
        else:
            ax.set_ylabel("node")
    fig.colorbar(im, ax=axes[0].tolist(), label="CPU utilisation")
    fig.suptitle(f"{name}: per-node utilisation (workload seed {seed})", fontsize=10)
    return fig


def fig_placement(entry: ScenarioRun, policies: list[str], name: str) -> Figure | None:
    """Measured runs: pods per node for each policy (where each scheduler put the workload)."""
    used = {p: entry.policies[p].nodes_used or {} for p in policies}
    nodes = sorted({n for u in used.values() for n in u})
    if not nodes:
        return None
    m = np.array([[used[p].get(n, 0) for n in nodes] for p in policies], dtype=float)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.7 * len(nodes) + 3), 0.5 * len(policies) + 1.8), layout="constrained")
    im = ax.imshow(m, aspect="auto", cmap="Blues", vmin=0)
    ax.set_xticks(range(len(nodes)), nodes, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(policies)), [short_label(p, 40) for p in policies], fontsize=8)
    for (r, c), v in np.ndenumerate(m):
        ax.text(c, r, f"{v:g}", ha="center", va="center", fontsize=7, color="black" if v < m.max() / 2 else "white")
    fig.colorbar(im, ax=ax, label="pods")
    ax.set_title(f"{name}: placements per node", fontsize=10)
    return fig


def fig_node_power(entry: ScenarioRun, policies: list[str], name: str) -> Figure | None:
    """Measured runs: each node's power over each policy's window, from Prometheus (colours are nodes here)."""
    shown = [p for p in policies if entry.policies[p].node_power]
    if not shown:
        return None
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 2.4 * len(shown) + 0.6), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, p in zip(axes[:, 0], shown):
        for node, series in sorted(entry.policies[p].node_power.items()):
            t, w = zip(*series) if series else ((), ())
            ax.plot(t, w, lw=1.1, label=node)
        ax.set_title(short_label(p, 60), fontsize=9)
        ax.set_ylabel("W")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    axes[-1, 0].set_xlabel("seconds since the policy's pods were created")
    fig.suptitle(f"{name}: power per node (measured)", fontsize=10)
    return fig


def fig_awake_nodes(entry: ScenarioRun, policies: list[str], name: str, colors: dict[str, str]) -> Figure | None:
    """Measured runs with the node power controller (``pipeline --env kube --sleep``): nodes awake over each
    policy's window, as read from the cluster."""
    shown = [p for p in policies if entry.policies[p].awake_nodes]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(10, 3.2), layout="constrained")
    for p in shown:
        t, n = zip(*entry.policies[p].awake_nodes)
        ax.step(t, n, where="post", lw=1.4, label=short_label(p), color=colors[p], gid=p)
    ax.set_xlabel("seconds since the policy's pods were created")
    ax.set_ylabel("nodes awake")
    ax.set_ylim(bottom=0)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"{name}: nodes awake (measured on the cluster)", fontsize=10)
    return fig


def fig_gpu_energy(doc: Results, name: str, colors: dict[str, str]) -> Figure | None:
    """A GPU cluster's energy per policy, split: the CPU side (CPUs, memory, board, sleep) and the GPUs, as
    stacked bars (kWh, mean over seeds); None where the scenario has no GPUs."""
    rows = doc.summary[name].policies
    pols = [p for p in doc.policies if rows[p].gpu_joules is not None]
    if not pols:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 0.28 * len(pols) + 1.3), layout="constrained")
    y = np.arange(len(pols))
    # An older row may lack cpu_joules: the rest of the energy is the CPU side (results.PolicyRun.cpu_joules).
    cpu = [(rows[p].energy_joules - rows[p].gpu_joules if rows[p].cpu_joules is None else rows[p].cpu_joules) / 3.6e6
           for p in pols]
    gpu = [rows[p].gpu_joules / 3.6e6 for p in pols]
    for bar, p in zip(ax.barh(y, cpu, height=0.75, color=[colors[p] for p in pols], alpha=0.45), pols):
        bar.set_gid(f"{p}/cpu")
    for bar, p in zip(ax.barh(y, gpu, left=cpu, height=0.75, color=[colors[p] for p in pols]), pols):
        bar.set_gid(f"{p}/gpu")
    ax.set_yticks(y, [short_label(p) for p in pols], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("kWh: CPU side (light) + GPUs (dark), mean over seeds", fontsize=9)
    ax.set_title(_wrap(f"{name}: CPU vs GPU energy", 60), fontsize=9)
    ax.grid(axis="x", lw=0.4, alpha=0.5)
    return fig


def figures(doc: Results, tl: dict, nodes: dict) -> Iterator[tuple[str, str | None, Figure]]:
    """Every figure of the report as ``(file name, scenario or None for the summary plots, figure)``, one at a
    time (the caller saves and closes each before the next is drawn)."""
    colors = policy_colors(doc.policies)
    yield "energy_ratio.png", None, fig_energy_ratio(doc, colors)
    yield "energy_vs_service.png", None, fig_energy_vs(doc, colors, "mean_pending_s", "mean pending time per pod (s)",
                                                       1.0)
    if any(r.slo_violation_rate > 0 for s in doc.summary.values() for r in s.policies.values()):
        yield "energy_vs_slo.png", None, fig_energy_vs(doc, colors, "slo_violation_rate",
                                                       "pods violating their SLO (%)", 100.0)
    for i, name in enumerate(doc.summary):  # i numbers the plot files only; the data's key is the name
        entry = doc.runs(name)[0]  # timelines are recorded on the scenario's first workload seed
        key = doc.timeline_key(name)
        made = [(f"power_{i}.png", fig_power(doc, tl, key, name, entry.seed, colors)),
                (f"util_{i}.png", fig_util(doc, tl, nodes, key, name, entry.seed)),
                (f"gpu_energy_{i}.png", fig_gpu_energy(doc, name, colors))]
        if doc.env == "kube":
            made += [(f"node_power_{i}.png", fig_node_power(entry, doc.policies, name)),
                     (f"awake_{i}.png", fig_awake_nodes(entry, doc.policies, name, colors)),
                     (f"placement_{i}.png", fig_placement(entry, doc.policies, name))]
        for fname, fig in made:
            if fig is not None:
                yield fname, name, fig


def _target_joules(e: ScenarioRun) -> tuple[float | None, str]:
    """The seed's optimum where the MIP ran and found one (its schedule as the twin replays it, labelled by
    :meth:`ScenarioRun.optimum_label`), else its best proven bound (the bind-on-arrival LP's, the MIP's own where no
    run can overload a node, the LP's or the fluid one, whichever is highest), with what it is: ``bound,
    bind-on-arrival`` where the highest holds only for the runs that bind every pod when it arrives."""
    o = e.optimum
    if o and o.schedule_energy is not None:
        return o.schedule_energy, e.optimum_label() or "optimum*"
    lp, boa = o.bounds if o else (None, None)
    every = [v for v in (lp, e.lower_bound_joules) if v is not None]
    best = max(every + ([boa] if boa is not None else []), default=None)
    if best is None:
        return None, ""
    if not o:
        return best, "fluid bound"
    return best, "bound" if every and best <= max(every) else "bound, bind-on-arrival"


def _target_kind(kinds: set[str]) -> str:
    """What the seeds' targets are together: the one kind they share; ``optimum*`` for schedules not proven on
    every seed; among bounds only, the weakest claim (``bound, bind-on-arrival`` if any seed's is one); ``optimum
    or bound`` only for schedules on some seeds and bounds on others."""
    if len(kinds) == 1:
        return next(iter(kinds))
    schedules = {k for k in kinds if k.startswith("optimum")}
    if schedules == kinds:
        return weakest_optimum_label(kinds)
    if not schedules:
        return "bound, bind-on-arrival" if "bound, bind-on-arrival" in kinds else "bound"
    return "optimum or bound"


def verdict(doc: Results) -> list[dict]:
    """Per scenario, what a reader came for: the least-energy policy of equal service (:func:`_within_budget`),
    each learned policy's energy ÷ the best heuristic (per seed, with its 95 % interval and n), and the optimum or
    best bound ÷ the best heuristic. The best heuristic is the least-energy one on each seed, whatever its SLO
    (as in the tables and docs/dqn.md)."""
    pols = doc.policies
    heur = heuristics_among(pols)
    learned = [p for p in pols if family_of(p) == "learned"]
    out = []
    for name, s in doc.summary.items():
        rows, entries = s.policies, doc.runs(name)
        budget = _slo_budget(rows)
        best = _least_energy_within_budget(doc, name)
        v = {"name": name, "n": len(entries), "replay": s.replay, "budget": budget, "best": best,
             "best_vs_ref": _ratios_to_reference(doc, name)[best], "best_slo": rows[best].slo_violation_rate,
             "learned": {}, "best_heuristic": None, "target": None, "target_kind": ""}
        if heur:
            top = [min(heur, key=lambda h, e=e: e.policies[h].energy_joules) for e in entries]
            best_j = [e.policies[h].energy_joules for e, h in zip(entries, top)]
            v["best_heuristic"] = max(dict.fromkeys(top), key=top.count)  # the one best on most seeds
            for p in learned:  # (absent, printed as a dash, where the heuristic drew nothing)
                if r := ratios([e.policies[p].energy_joules for e in entries], best_j):
                    v["learned"][p] = mean_ci(r)
            targets = [_target_joules(e) for e in entries]
            if all(t is not None for t, _ in targets) and (r := ratios([t for t, _ in targets], best_j)):
                v["target"] = mean_ci(r)
                kinds = {k for _, k in targets}
                v["target_kind"] = _target_kind(kinds)
        out.append(v)
    return out


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>joulesched report</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1280px;margin:2em auto;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:0.6em 0 1.6em;font-size:0.88em}
th,td{border-bottom:1px solid #ddd;padding:4px 8px;text-align:right;vertical-align:top}
th{font-weight:600;background:#fafafa}
th:first-child,td:first-child{text-align:left}
td{white-space:nowrap}
td.pol,th.pol{text-align:left;white-space:normal;overflow-wrap:anywhere;max-width:22em}
td.wrap,th.wrap{white-space:normal;overflow-wrap:anywhere;max-width:16em}
tr.best td{font-weight:600;background:#eef6ee}
td .ci{font-size:0.85em;font-weight:400;color:#555}
.sw{display:inline-block;width:0.8em;height:0.8em;border-radius:2px;margin-right:0.4em;vertical-align:-0.05em}
.meta{color:#666;font-size:0.85em}
.note{font-size:0.88em;color:#444;max-width:60em}
.note.warning{color:#8a4b00}
img{display:block;max-width:100%;height:auto;border:1px solid #eee;margin:0.4em 0 1.2em}
code{background:#f4f4f4;padding:1px 4px;overflow-wrap:anywhere}
</style></head><body>
<h1>joulesched benchmark</h1>
<p class="meta">{{ header }}<br>{{ n_scen }} scenario(s) &times; {{ seeds }} seed(s) &times; {{ policies|length }} policies,
run in {{ "%.1f"|format(wall_s) }} s. Generated {{ when }}.{% if command %}<br>Command: <code>{{ command }}</code>{% endif %}</p>
<h2>Verdict</h2>
<table id="verdict"><tr><th>scenario</th><th>n</th><th class="pol">least energy of equal service</th>
<th>its energy / {{ ref }}</th><th>its SLO violations (budget)</th><th class="pol">best heuristic</th>
{% for p in learned %}<th><span class="sw" style="background:{{ colors[p] }}"></span>{{ p|breakable }} &divide; best heuristic</th>{% endfor %}
<th>optimum or bound &divide; best heuristic</th></tr>
{% for v in verdict %}<tr data-scenario="{{ v.name }}" data-best="{{ v.best }}"><td>{{ v.name }}</td><td>{{ v.n }}{% if v.replay %} (replay){% endif %}</td>
<td class="pol"><span class="sw" style="background:{{ colors[v.best] }}"></span>{{ v.best|breakable }}</td><td>{{ "%.3f"|format(v.best_vs_ref) if v.best_vs_ref == v.best_vs_ref else "—" }}</td>
<td>{{ "%.2f"|format(100 * v.best_slo) }}% (&le; {{ "%.2f"|format(100 * v.budget) }}%)</td>
<td class="pol">{% if v.best_heuristic %}<span class="sw" style="background:{{ colors[v.best_heuristic] }}"></span>{{ v.best_heuristic|breakable }}{% else %}—{% endif %}</td>
{% for p in learned %}<td>{{ fmt_ci(v.learned.get(p)) }}</td>{% endfor %}
<td>{% if v.target %}{{ fmt_ci(v.target) }} ({{ v.target_kind }}){% else %}—{% endif %}</td></tr>
{% endfor %}</table>
<p class="note">The SLO budget is {% if "default-k8s" in policies %}default-k8s's violation rate{% else %}the
lowest violation rate of the scenario's policies (default-k8s did not run){% endif %} plus 0.5 percentage points
(equal service, as the project's goals define it); a policy that leaves more pods unplaced than {% if "default-k8s"
in policies %}default-k8s{% else %}the fewest of the run{% endif %} (mean over seeds) is not picked either: it ran
less work. Ratios are per seed, then averaged; &plusmn; is the half-width
of a 95% Student-t interval over the n seeds (none with one seed; <em>replay</em>: a trace replayed as it is, the
same pods on every seed, so the seeds vary only the policies' tie-breaking and the interval says nothing about
other workloads). The best heuristic is the least-energy heuristic
on each seed, whatever its SLO (named: the one best on most seeds). The optimum is the MIP of
<code>docs/optimum.md</code>
(<code>--optimum</code>; its schedule as the twin replays it, over the same window as the policies; * = not
proven optimal over that window: the solver's time ran out, or the schedule ended earlier and was charged an
idle tail its MIP did not minimise; <em>optimum, bind-on-arrival</em>: proven among the schedules that bind
every pod when it arrives and overload no node, and no more: no bound that every run obeys meets it, so a run that
queues pods, or throttles on an overloaded node, may use less); a bound is
the largest proven lower bound (the LP's or the clairvoyant fluid relaxation of <code>docs/lower-bound.md</code>: no
policy can use less; <em>bound, bind-on-arrival</em>: the MIP's own or the bind-on-arrival LP's, which only the
runs that bind every pod when it arrives cannot beat: one that queues pods may use less; the MIP's own only where
no run can overload a node).</p>
<h2>Energy relative to {{ ref }}</h2>
{% for img in summary_images %}<img src="plots/{{ img.file }}" alt="{{ img.alt }}">{% endfor %}
{% if headroom %}<h2>Headroom</h2>
{% set solved = headroom|selectattr("solved")|list %}
{% if solved %}<p class="note">Energy / default-k8s, per seed then averaged. Optimum: the MIP's schedule, replayed in the twin (*
= not proven optimal over the window on every seed: the best schedule found; &dagger; = optimal among the
schedules that bind every pod on arrival and overload no node, not proven over every run). Gap <em>conflict</em>: a
bound is above the schedule, so one of them is wrong and no gap is stated. <em>Bound, bind-on-arrival</em>: the largest
proven lower bound for the runs that bind every pod when it arrives (the bind-on-arrival LP's, and the MIP's own
where no run can overload a node);
<em>bound, every run</em>: the LP or fluid bound, which queued and throttled runs obey too (the two are equal
where nothing assumes bind-on-arrival). Gap: (optimum &minus; bound) / optimum, per seed. The last column, and
the table below it for every policy, is the share of the best heuristic's distance to the optimum (where none
was solved, to the best bound: then a lower estimate of the share) that a policy closes; negative: it uses more
than the best heuristic.</p>{% else %}<p class="note">Energy / default-k8s, per seed then averaged, beside the
clairvoyant fluid bound (<code>docs/lower-bound.md</code>): no policy can use less. The optimum, the MIP's and
LP's bounds and each policy's share of the best heuristic's distance to them come with <code>--optimum</code>
(small clusters).</p>{% endif %}
<table><tr><th>scenario</th><th>default-k8s</th><th>best upstream heuristic</th><th>best sleep-aware heuristic</th>
<th>learned</th>{% if solved %}<th>optimum</th><th>bound, bind-on-arrival</th><th>bound, every run</th>{% endif %}<th>fluid bound</th>
{% if solved %}<th>gap</th><th>gap closed by learned</th>{% endif %}</tr>
{% for h in headroom %}<tr><td>{{ h.name }}</td><td>1.000</td><td class="wrap">{{ h.up|breakable }}</td><td class="wrap">{{ h.sa|breakable }}</td><td class="wrap">{{ h.learned|breakable }}</td>
{% if solved %}<td>{{ h.opt }}</td><td>{{ h.boa }}</td><td>{{ h.every }}</td>{% endif %}<td>{{ h.fluid }}</td>
{% if solved %}<td>{{ h.gap }}</td><td>{{ h.share }}</td>{% endif %}</tr>
{% endfor %}</table>
{% if solved %}<table id="gap-shares"><tr><th class="pol">share of the gap to</th>
{% for h in headroom %}<th class="wrap">{{ h.name|breakable }}<br>{{ h.target|breakable }}</th>{% endfor %}</tr>
{% for p in headroom_policies %}<tr><td class="pol"><span class="sw" style="background:{{ colors[p] }}"></span>{{ p|breakable }}</td>
{% for h in headroom %}<td>{{ h.shares.get(p, "—") }}</td>{% endfor %}</tr>
{% endfor %}</table>{% endif %}{% endif %}
{% if training_curve %}<h2>Training curve</h2>
<img src="plots/training_curve.png" alt="DQN training curve">{% endif %}
{% for s in scenarios %}
<h2>{{ s.name }}</h2>
<p class="meta">{{ s.nodes }} nodes, {{ s.pods }} pods, n = {{ s.n }} seed(s) ({% if s.replay %}a trace replayed as it is: the same pods on every seed, which vary the policies' tie-breaking only{% else %}workload seeds {{ s.seeds }}{% endif %}); {% if s.lb is not none %}lower bound {{ s.lb }}{% else %}no lower bound (measured run){% endif %}.
Highlighted: the least energy of equal service (the verdict's pick).</p>
{% for w in s.warnings %}<p class="note warning">Warning: {{ w }}</p>
{% endfor %}<table><tr><th class="pol">policy</th><th>energy</th><th>vs default-k8s</th><th>vs best heuristic</th><th>vs lower bound</th><th>SLO violations</th>
<th>mean throttling</th><th>mean pending (s)</th><th title="unplaced pods: placed + unplaced = each seed's pods, mean over seeds">unplaced</th><th>decision p99 (&micro;s)</th></tr>
{% for r in s.rows %}<tr class="{{ 'best' if r.best else '' }}"><td class="pol"><span class="sw" style="background:{{ colors[r.policy] }}"></span>{{ r.policy|breakable }}</td><td>{{ r.energy }}{% if r.energy_ci %}<br><span class="ci">{{ r.energy_ci }}</span>{% endif %}</td>
<td>{{ r.vs_default }}</td><td>{{ r.vs_heur }}</td><td>{{ "%.3f"|format(r.vs_lb) if r.vs_lb is not none else "—" }}</td><td>{{ r.slo }}{% if r.slo_ci %}<br><span class="ci">{{ r.slo_ci }}</span>{% endif %}</td>
<td>{{ "%.2f"|format(r.thr) ~ "%" if r.thr is not none else "n/a" }}</td><td>{{ r.pending }}{% if r.pending_ci %}<br><span class="ci">{{ r.pending_ci }}</span>{% endif %}</td><td>{{ "%g"|format(r.uns) }}</td>
<td>{{ "%.0f"|format(r.p99) if r.p99 is not none else "n/a" }}</td></tr>
{% endfor %}</table>
<p class="meta">Unplaced: pods never bound to a node (placed + unplaced = each seed's pods, mean over seeds: {{ s.pods_mean }}): they fit no node, were still pending at the end, or were services whose stop came before they ran (docs/twin.md, "Counts"); they are not SLO violations.</p>
{% for img in s.images %}<img src="plots/{{ img }}" alt="{{ img }}">{% endfor %}
{% endfor %}
</body></html>
"""

_SUMMARY_ALT = {"energy_ratio.png": "energy relative to the reference, one panel per scenario",
                "energy_vs_service.png": "energy against mean pending time, one panel per scenario",
                "energy_vs_slo.png": "energy against SLO violations, one panel per scenario"}


def _fmt_ci(c: dict | None) -> str:
    """``0.712 ± 0.031 (n = 3)``, or the mean and n alone without an interval."""
    if c is None:
        return "—"
    return f"{c['mean']:.3f}" + (f" ± {c['ci95']:.3f}" if c["ci95"] is not None else "") + f" (n = {c['n']})"


def _breakable(text: str) -> Markup:
    """``text`` escaped, with line-break opportunities after ``/``, ``=`` and ``:``, so that a ``dqn=/long/path``
    spec wraps inside its table cell instead of widening the page."""
    return Markup(re.sub(r"([/=:])", r"\1<wbr>", str(escape(text))))


def _pm(ci: float | None, fmt) -> str:
    """``± half-width`` (Student-t 95 %), under the mean in its cell; nothing without an interval (one seed, or
    an older file)."""
    return "" if ci is None else f"± {fmt(ci)}"


def _ratio(row: PolicySummary, key: str) -> str:
    """``0.712 ± 0.031`` (Student-t 95 % half-width), or the mean alone when there is no interval."""
    v, ci = getattr(row, key), getattr(row, f"{key}_ci95")
    return "—" if v is None else f"{v:.3f}" + (f" ± {ci:.3f}" if ci is not None else "")


def _headroom_rows(doc: Results) -> list[dict]:
    """The headroom table's cells (pipelines/benchmark.py:headroom), formatted."""
    from joulesched.pipelines.benchmark import headroom

    def f(v, name=None, own=None):
        """``0.546 (name)``; where the per-seed best (``v``) is not the named policy's own mean ratio (``own``:
        another policy won some seed), both: ``0.546 (per-seed best; name 0.552)``."""
        if v is None:
            return "—"
        if name and own is not None and abs(own - v) > 5e-7:
            return f"{v:.3f} (per-seed best; {name} {own:.3f})"
        return f"{v:.3f}" + (f" ({name})" if name else "")

    def pct(v, digits=0):
        return "—" if v is None else f"{100 * v:.{digits}f} %"

    rows = []
    for name, h in headroom(doc).items():
        opt = f(h.get("optimum"))
        if h.get("optimum") is not None and not h.get("optimal"):
            opt += "†" if h.get("optimum_kind") == "optimum, bind-on-arrival" else "*"
        shares = h.get("share_of_gap") or {}
        def best(kind, h=h):
            who = h[f"{kind}_policy"]
            return f(h[kind], who, h["policies"].get(who))

        rows.append({"name": name, "solved": "target" in h, "up": best("best_upstream"), "sa": best("best_sleep_aware"),
                     "learned": best("learned"), "opt": opt, "boa": f(h.get("boa_bound")),
                     "every": f(h.get("every_run_bound")), "fluid": f(h["fluid_bound"]),
                     "gap": "conflict" if h.get("gap_conflict") else pct(h.get("optimum_gap"), 1),
                     "share": pct(h.get("learned_share_of_gap")),
                     "target": "—" if "target" not in h else f"{h['target_kind']} {h['target']:.3f}",
                     "shares": {p: pct(v) for p, v in shares.items()}})
    return rows


def _scenario_tables(doc: Results) -> list[dict]:
    scen = []
    for name, s in doc.summary.items():
        entries = doc.runs(name)
        best = _least_energy_within_budget(doc, name)
        rows = []
        for p, r in s.policies.items():
            rows.append({"policy": p, "energy": fmt_energy(r.energy_joules),
                         "energy_ci": _pm(r.energy_joules_ci95, fmt_energy),
                         "vs_default": _ratio(r, "energy_vs_default"), "vs_heur": _ratio(r, "energy_vs_best_heuristic"),
                         "vs_lb": r.energy_vs_lower_bound,
                         "slo": f"{100 * r.slo_violation_rate:.2f}%",
                         "slo_ci": _pm(r.slo_violation_rate_ci95, lambda v: f"{100 * v:.2f}"),
                         "thr": None if r.mean_throttling is None else 100 * r.mean_throttling,
                         "pending": f"{r.mean_pending_s:.1f}",
                         "pending_ci": _pm(r.mean_pending_s_ci95, lambda v: f"{v:.1f}"),
                         "uns": r.unschedulable_pods, "p99": r.decision_us_p99,
                         "best": p == best})
        counts = sorted({e.pods for e in entries})
        mean = s.pods if s.pods is not None else float(np.mean([e.pods for e in entries]))  # an older file: no pods
        scen.append({"name": name, "nodes": entries[0].nodes, "n": s.seeds, "replay": s.replay,
                     # Seeds draw different workloads: their range, and the mean the unplaced column is one of.
                     "pods": f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}",
                     "pods_mean": f"{mean:.0f}" if mean == round(mean) else f"{mean:.1f}",
                     "seeds": ", ".join(str(e.seed) for e in entries), "rows": rows, "images": [],
                     "warnings": list(s.warnings),
                     # 0 J is a bound (a cluster whose curves start at 0 W); None: a measured run has none
                     "lb": fmt_energy(s.lower_bound_joules) if s.lower_bound_joules is not None else None})
    return scen


def _read_inputs(out: Path) -> tuple[Results, dict, dict]:
    """results.json, timelines.npz (``{}`` when absent) and nodes.json (``{}`` when absent) of ``out``, each
    checked before anything is drawn: a :class:`ResultsError` names the file that cannot be read."""
    if out.exists() and not out.is_dir():
        raise ResultsError(f"{out} is a file; give the folder that holds results.json")
    doc = load_results(out / "results.json")
    if not doc.scenarios:
        raise ResultsError(f"{out / 'results.json'}: holds no scenario run; nothing to report")
    tl_path = out / "timelines.npz"
    try:
        tl = dict(np.load(tl_path)) if tl_path.exists() else {}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # truncated, or not an npz at all
        why = "not an .npz archive" if isinstance(e, ValueError) else str(e)  # numpy's ValueError talks pickles
        raise ResultsError(f"{tl_path}: cannot read the timelines ({why}); remove it to render the report "
                           "without the power and utilisation plots") from None
    odd = next((k for k, a in tl.items() if a.dtype.kind not in "biuf"), None)  # strings, complex numbers
    if odd is not None:
        raise ResultsError(f"{tl_path}: {odd}: expected real numbers, got {tl[odd].dtype} values; remove it to "
                           "render the report without the power and utilisation plots")
    nodes_path = out / "nodes.json"
    # As results.json is read: a directory, bad bytes or JSON too deep to parse is one line naming the file.
    nodes = parse_json(read_text_input(nodes_path, "a nodes.json", ResultsError), nodes_path) \
        if nodes_path.exists() else {}
    if not isinstance(nodes, dict):
        raise ResultsError(f"{nodes_path}: expected a JSON object (timeline key -> node groups)")
    for key, entry in nodes.items():
        lists = isinstance(entry, dict) and all(
            isinstance(entry.get(f), list) and all(isinstance(v, str) for v in entry[f]) for f in _NODE_LISTS)
        if not lists:
            raise ResultsError(f"{nodes_path}: scenario {key!r}: expected an object whose node_names and node_groups "
                               f"are lists of strings, got {_clip(json.dumps(entry))}")
    _check_timelines(tl_path, tl, doc, nodes)
    return doc, tl, nodes


def _check_timelines(tl_path: Path, tl: dict, doc: Results, nodes: dict) -> None:
    """Refuse timelines that do not fit results.json (another run's file, arrays of the wrong shape), naming the
    array: a plot drawn from them would be missing without a word, or stop the render with a traceback."""
    if not tl:
        return  # none recorded (a kube run): the page says so
    keys = [doc.timeline_key(name) for name in doc.summary]
    if not any(k.startswith(f"{key}/") for key in keys for k in tl):
        raise ResultsError(f"{tl_path}: holds no timeline of the scenarios in results.json (another run's file?); "
                           "remove it to render the report without the power and utilisation plots")

    def bad(name: str, why: str) -> ResultsError:
        return ResultsError(f"{tl_path}: {name}: {why}")

    for name, key in zip(doc.summary, keys):
        if not any(k.startswith(f"{key}/") for k in tl):
            continue
        ran = doc.runs(name)[0].nodes  # timelines are recorded on the first seed
        bin_s = tl.get(f"{key}/bin_s")
        if bin_s is None or bin_s.shape != (1,) or not np.isfinite(bin_s).all() or not bin_s[0] > 0:
            raise bad(f"{key}/bin_s", "expected one positive number of seconds per bin")
        for p in doc.policies:
            watts, awake, util = (tl.get(f"{key}/{p}/{a}") for a in ("watts", "awake", "util"))
            if watts is None and awake is None and util is None:
                continue  # a policy without timelines is left out of the plots
            if watts is None or watts.ndim != 1 or not np.isfinite(watts).all():
                raise bad(f"{key}/{p}/watts", "expected one finite number of watts per bin")
            if awake is None or awake.shape != watts.shape:
                raise bad(f"{key}/{p}/awake", f"expected one count per bin, as many as watts' {watts.size}")
            if util is None or util.ndim != 2 or util.shape[0] != watts.size:
                raise bad(f"{key}/{p}/util", f"expected bins x nodes ({watts.size} rows, as watts), got shape "
                          f"{None if util is None else util.shape}")
            if util.shape[1] != ran:
                raise bad(f"{key}/{p}/util", f"{util.shape[1]} nodes, but results.json's {name!r} ran on {ran} "
                          "(another run's file?)")
            groups = nodes.get(key, {}).get("node_groups")
            if groups is not None and len(groups) != util.shape[1]:
                raise bad(f"{key}/{p}/util", f"{util.shape[1]} nodes, but nodes.json names {len(groups)}")


#: What each scenario's entry of nodes.json must hold: one name and one group per node (:func:`fig_util`).
_NODE_LISTS = ("node_names", "node_groups")


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def report_summary(out: Path) -> dict:
    """What `joulesched report --json` prints after :func:`write_report`: the page, the plots this render drew,
    the training curve the page shows (``None`` when there is none) and whether there were timelines to draw the
    power and utilisation plots from."""
    out = Path(out)
    curve = out / "plots" / "training_curve.png"
    return {"report": str(out / "report.html"), "plots": [str(p) for p in report_plots(out)],
            "training_curve": str(curve) if curve.is_file() else None, "timelines": has_timelines(out)}


def has_timelines(out: Path) -> bool:
    """Whether ``out/timelines.npz`` holds any array (a kube run writes an empty one): whether the power and
    utilisation plots can be drawn."""
    tl_path = Path(out) / "timelines.npz"
    if not tl_path.is_file():
        return False
    try:
        with np.load(tl_path) as tl:
            return bool(tl.files)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return False


def write_report(out: Path, header: str = "Measured on the embedded twin (simulated cluster).") -> Path:
    """Render ``out/report.html`` and ``out/plots/*.png`` from ``out/results.json`` and its timelines.

    Without ``timelines.npz`` the power and utilisation plots are left out; plots an earlier render drew and this
    one does not are removed, so plots/ never shows a figure of other data than the page's."""
    out = Path(out)
    doc, tl, nodes = _read_inputs(out)
    check_report_outputs(out)
    plots = out / "plots"
    scen = _scenario_tables(doc)
    by_name = {s["name"]: s for s in scen}
    summary_images = []
    drawn = []
    # Every figure is drawn beside plots/ (the same file system, so each moves in with a rename) and moved in
    # only once the page is rendered and written, and before it replaces the old one: a render that fails or is
    # interrupted before leaves the old page and its plots as they were, and a new page never shows plots not
    # yet there.
    staging = Path(tempfile.mkdtemp(prefix=".plots-", dir=out))
    try:
        with plain_text_figures():  # scenario and policy names are the user's text, not mathtext
            for fname, name, fig in figures(doc, tl, nodes):
                _save(fig, staging / fname)
                drawn.append(fname)
                if name is None:
                    summary_images.append({"file": fname, "alt": _SUMMARY_ALT[fname]})
                else:
                    by_name[name]["images"].append(fname)
        pols = doc.policies
        env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
        env.filters["breakable"] = _breakable
        page = env.from_string(_TEMPLATE).render(
            header=header, n_scen=len(scen), seeds=doc.seeds, policies=pols, wall_s=doc.wall_s,
            when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), command=doc.command, scenarios=scen,
            verdict=verdict(doc), learned=[p for p in pols if family_of(p) == "learned"], ref=_reference(pols),
            colors=policy_colors(pols), fmt_ci=_fmt_ci, summary_images=summary_images, headroom=_headroom_rows(doc),
            headroom_policies=[p for p in pols if p != "default-k8s"],
            training_curve=(plots / "training_curve.png").is_file())
        # The page is written in full first (its own atomic write onto the staged name: a full disk fails here,
        # before any plot moved), the figures move in, then the page is renamed over the old one, and only then
        # go the plots it no longer shows (the old page showed them until that rename).
        with atomic_path(out / "report.html") as page_tmp:
            atomic_write_text(page_tmp, page)
            plots.mkdir(exist_ok=True)
            for fname in drawn:
                os.replace(staging / fname, plots / fname)
        for stale in report_plots(out):
            if stale.name not in drawn:
                stale.unlink(missing_ok=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / "report.html"
