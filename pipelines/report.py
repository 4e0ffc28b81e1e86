"""The HTML report: a ratio table per scenario and the plots people would rather look at than read."""

from __future__ import annotations

import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: reports are written on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from jinja2 import Environment, select_autoescape  # noqa: E402

from joulesched.core.fsio import atomic_savefig, atomic_write_text  # noqa: E402
from joulesched.pipelines.benchmark import load_results  # noqa: E402

_PALETTE = ["#1b6ca8", "#d1495b", "#edae49", "#00798c", "#66a182", "#8d6a9f", "#7f7f7f", "#30343f", "#e07a5f",
            "#3d405b"]


def fmt_energy(joules: float) -> str:
    """Joules in the unit that keeps three significant digits: a cluster-day is kWh, a short measured run J."""
    if joules >= 3.6e5:
        return f"{joules / 3.6e6:.2f} kWh"
    if joules >= 1e3:
        return f"{joules / 1e3:.1f} kJ"
    return f"{joules:.0f} J"


def _color(policies: list[str], p: str) -> str:
    return _PALETTE[policies.index(p) % len(_PALETTE)]


def _plot_energy_ratio(doc: dict, path: Path) -> None:
    summ, policies = doc["summary"], doc["policies"]
    names = list(summ)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(names) + 3.5), 4.2))
    width = 0.8 / len(policies)
    ref = "default-k8s" if "default-k8s" in policies else policies[0]
    for k, p in enumerate(policies):
        vals = [summ[n]["policies"][p]["energy_joules"] / summ[n]["policies"][ref]["energy_joules"] for n in names]
        ax.bar(np.arange(len(names)) + (k - (len(policies) - 1) / 2) * width, vals, width, label=p,
               color=_color(policies, p))
    # A measured run (the kube path) has no lower bound: lower_bound_joules is null there.
    lb = [(k, summ[n]["lower_bound_joules"] / summ[n]["policies"][ref]["energy_joules"]) for k, n in enumerate(names)
          if summ[n].get("lower_bound_joules")]
    if lb:
        ax.scatter([k for k, _ in lb], [v for _, v in lb], marker="_", s=900, color="black", zorder=5,
                   label="lower bound")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(np.arange(len(names)), names)
    ax.set_ylabel(f"energy / {ref}")
    ax.set_title("Energy relative to " + ref + " (lower is better)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_ylim(0, max(1.15, ax.get_ylim()[1]))
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def _plot_energy_vs_service(doc: dict, path: Path) -> None:
    """Energy against mean pending time (and against SLO violations when any policy has some): the cost in
    service quality of each policy's saving. Pending time keeps the plot readable when no pod misses its SLO."""
    summ, policies = doc["summary"], doc["policies"]
    ref = "default-k8s" if "default-k8s" in policies else policies[0]
    slo = any((r["slo_violation_rate"] or 0) > 0 for s in summ.values() for r in s["policies"].values())
    panels = [("mean_pending_s", "mean pending time per pod (s)", 1.0)]
    if slo:
        panels.append(("slo_violation_rate", "pods violating their SLO (%)", 100.0))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels) + 2, 4.2), squeeze=False, sharey=True)
    markers = "osD^v<>p*h"
    for ax, (key, label, scale) in zip(axes[0], panels):
        for j, n in enumerate(summ):
            for p in policies:
                r = summ[n]["policies"][p]
                ax.scatter(scale * (r[key] or 0.0), r["energy_joules"] / summ[n]["policies"][ref]["energy_joules"],
                           color=_color(policies, p), marker=markers[j % len(markers)], s=40,
                           label=p if j == 0 and ax is axes[0][-1] else None)
            if ax is axes[0][-1]:
                ax.scatter([], [], color="black", marker=markers[j % len(markers)], label=n)
        # Pending times span orders of magnitude (0.1 s for a spreader, minutes for a packer that waits for
        # wake-ups): a symmetric log axis keeps zero and both ends visible.
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel(label)
    axes[0][0].set_ylabel(f"energy / {ref}")
    fig.suptitle("Energy against service quality (bottom left is best)")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def _plot_power(doc: dict, tl: dict, i: int, name: str, path: Path, seed: int) -> bool:
    policies = doc["policies"]
    key = f"{i}/bin_s"
    if key not in tl:
        return False
    bin_s = float(tl[key][0])
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 5), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    for p in policies:
        w = tl.get(f"{i}/{p}/watts")
        if w is None:
            continue
        t = np.arange(w.size) * bin_s / 3600
        ax.plot(t, w / 1000, lw=1.1, label=p, color=_color(policies, p))
        ax2.plot(t, tl[f"{i}/{p}/awake"], lw=1.0, color=_color(policies, p))
    ax.set_ylabel("cluster power (kW)")
    ax.set_title(f"{name}: power over time (workload seed {seed})")
    ax.legend(fontsize=7, ncol=3)
    ax2.set_ylabel("nodes awake")
    ax2.set_xlabel("time (h)")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return True


def _plot_util(doc: dict, tl: dict, nodes: dict, i: int, name: str, path: Path, seed: int) -> bool:
    policies = doc["policies"]
    summ = doc["summary"][name]["policies"]
    best = min(policies, key=lambda p: summ[p]["energy_joules"])
    show = [p for p in dict.fromkeys(["default-k8s", best]) if f"{i}/{p}/util" in tl]
    if not show or f"{i}/bin_s" not in tl:
        return False
    bin_s = float(tl[f"{i}/bin_s"][0])
    fig, axes = plt.subplots(1, len(show), figsize=(5.2 * len(show), 4.2), squeeze=False)
    groups = nodes.get(str(i), {}).get("node_groups", [])
    for ax, p in zip(axes[0], show):
        u = tl[f"{i}/{p}/util"].astype(np.float32)
        im = ax.imshow(u.T, aspect="auto", origin="lower", vmin=0, vmax=1, cmap="viridis", interpolation="nearest",
                       extent=(0, u.shape[0] * bin_s / 3600, 0, u.shape[1]))
        ax.set_title(f"{p}", fontsize=10)
        ax.set_xlabel("time (h)")
        # Label node groups instead of node numbers, and mark their boundaries, so heterogeneity is visible.
        starts = [k for k in range(len(groups)) if k == 0 or groups[k] != groups[k - 1]]
        ends = starts[1:] + [len(groups)]
        for k in starts[1:]:
            ax.axhline(k, color="white", lw=0.6)
        if groups:
            ax.set_yticks([(a + b) / 2 for a, b in zip(starts, ends)], [groups[a] for a in starts], fontsize=7)
        else:
            ax.set_ylabel("node")
    fig.colorbar(im, ax=axes[0].tolist(), label="CPU utilisation")
    fig.suptitle(f"{name}: per-node utilisation (workload seed {seed})")
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return True


def _plot_placement(entry: dict, policies: list[str], i: int, name: str, path: Path) -> bool:
    """Measured runs: pods per node for each policy (where each scheduler put the workload)."""
    used = {p: entry["policies"][p].get("nodes_used") or {} for p in policies}
    nodes = sorted({n for u in used.values() for n in u})
    if not nodes:
        return False
    m = np.array([[used[p].get(n, 0) for n in nodes] for p in policies], dtype=float)
    # constrained layout makes room for long policy names (dqn=PATH) where tight_layout gives up
    fig, ax = plt.subplots(figsize=(max(5.0, 0.7 * len(nodes) + 3), 0.5 * len(policies) + 1.8), layout="constrained")
    im = ax.imshow(m, aspect="auto", cmap="Blues", vmin=0)
    ax.set_xticks(range(len(nodes)), nodes, rotation=45, ha="right", fontsize=7)
    # A dqn=PATH spec can be a long absolute path: keep its start and end so the axes still fit.
    ax.set_yticks(range(len(policies)), [p if len(p) <= 40 else f"{p[:14]}…{p[-25:]}" for p in policies],
                  fontsize=8)
    for (r, c), v in np.ndenumerate(m):
        ax.text(c, r, f"{v:g}", ha="center", va="center", fontsize=7, color="black" if v < m.max() / 2 else "white")
    fig.colorbar(im, ax=ax, label="pods")
    ax.set_title(f"{name}: placements per node")
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return True


def _plot_node_power(entry: dict, policies: list[str], name: str, path: Path) -> bool:
    """Measured runs: each node's power over each policy's window, from Prometheus."""
    shown = [p for p in policies if entry["policies"][p].get("node_power")]
    if not shown:
        return False
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 2.4 * len(shown) + 0.6), squeeze=False, sharey=True)
    for ax, p in zip(axes[:, 0], shown):
        for node, series in sorted(entry["policies"][p]["node_power"].items()):
            t, w = zip(*series) if series else ((), ())
            ax.plot(t, w, lw=1.1, label=node)
        ax.set_title(p, fontsize=9)
        ax.set_ylabel("W")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, ncol=4)
    axes[-1, 0].set_xlabel("seconds since the policy's pods were created")
    fig.suptitle(f"{name}: power per node (measured)")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return True


def _plot_awake_nodes(entry: dict, policies: list[str], name: str, path: Path) -> bool:
    """Measured runs with the node power controller (``pipeline --env kube --sleep``): nodes awake over each
    policy's window, as read from the cluster."""
    shown = [p for p in policies if entry["policies"][p].get("awake_nodes")]
    if not shown:
        return False
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for p in shown:
        t, n = zip(*entry["policies"][p]["awake_nodes"])
        ax.step(t, n, where="post", lw=1.4, label=p, color=_color(policies, p))
    ax.set_xlabel("seconds since the policy's pods were created")
    ax.set_ylabel("nodes awake")
    ax.set_ylim(bottom=0)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8)
    ax.set_title(f"{name}: nodes awake (measured on the cluster)")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return True


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>joulesched report</title>
<style>
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:0.6em 0 1.6em;font-size:0.9em}
th,td{border-bottom:1px solid #ddd;padding:4px 10px;text-align:right}
th:first-child,td:first-child{text-align:left}
tr.best td{font-weight:600;background:#eef6ee}
.meta{color:#666;font-size:0.85em}
img{max-width:100%;border:1px solid #eee;margin:0.4em 0}
code{background:#f4f4f4;padding:1px 4px}
</style></head><body>
<h1>joulesched benchmark</h1>
<p class="meta">{{ header }}<br>{{ n_scen }} scenario(s) &times; {{ seeds }} seed(s) &times; {{ policies|length }} policies,
run in {{ "%.1f"|format(wall_s) }} s. Generated {{ when }}.{% if command %}<br>Command: <code>{{ command }}</code>{% endif %}</p>
<p>Energy ratios are per seed, then averaged; the &plusmn; is the half-width of a 95% Student-t interval over the n
seeds shown (none with one seed). The lower bound is the clairvoyant fluid relaxation of
<code>docs/lower-bound.md</code>: no policy can use less.</p>
<h2>Energy relative to default-k8s</h2>
<img src="plots/energy_ratio.png" alt="energy ratio per policy and scenario">
<img src="plots/energy_vs_service.png" alt="energy against mean pending time and SLO violations">
{% if headroom %}<h2>Headroom</h2>
<p>Energy / default-k8s, per seed then averaged. The optimum is the MIP of <code>docs/optimum.md</code> where it
was run (<code>--optimum</code>; * = not proven optimal in its time limit); the best bound is the largest proven
lower bound (the MIP's, the LP's or the fluid one). The last column is the share of the best heuristic's distance
to the optimum (or, where none was solved, to the best bound: then a lower estimate) that the learned policy
closes.</p>
<table><tr><th>scenario</th><th>default-k8s</th><th>best upstream heuristic</th><th>best sleep-aware heuristic</th>
<th>learned</th><th>optimum</th><th>best bound</th><th>LP bound</th><th>fluid bound</th><th>gap closed by learned</th></tr>
{% for h in headroom %}<tr><td>{{ h.name }}</td><td>1.000</td><td>{{ h.up }}</td><td>{{ h.sa }}</td><td>{{ h.learned }}</td>
<td>{{ h.opt }}</td><td>{{ h.bound }}</td><td>{{ h.lp }}</td><td>{{ h.fluid }}</td><td>{{ h.share }}</td></tr>
{% endfor %}</table>{% endif %}
{% if training_curve %}<h2>Training curve</h2>
<img src="plots/training_curve.png" alt="DQN training curve">{% endif %}
{% for s in scenarios %}
<h2>{{ s.name }}</h2>
<p class="meta">{{ s.nodes }} nodes, {{ s.pods }} pods, n = {{ s.n }} seed(s) (workload seeds {{ s.seeds }}); {% if s.lb is not none %}lower bound {{ s.lb }}{% else %}no lower bound (measured run){% endif %}.</p>
<table><tr><th>policy</th><th>energy</th><th>vs default-k8s</th><th>vs best heuristic</th><th>vs lower bound</th><th>SLO violations</th>
<th>mean throttling</th><th>mean pending (s)</th><th>never placed</th><th>decision p99 (&micro;s)</th></tr>
{% for r in s.rows %}<tr class="{{ 'best' if r.best else '' }}"><td>{{ r.policy }}</td><td>{{ r.energy }}</td>
<td>{{ r.vs_default }}</td><td>{{ r.vs_heur }}</td><td>{{ "%.3f"|format(r.vs_lb) if r.vs_lb is not none else "—" }}</td><td>{{ "%.2f"|format(r.slo) }}%</td>
<td>{{ "%.2f"|format(r.thr) ~ "%" if r.thr is not none else "n/a" }}</td><td>{{ "%.1f"|format(r.pending) }}</td><td>{{ "%g"|format(r.uns) }}</td>
<td>{{ "%.0f"|format(r.p99) if r.p99 is not none else "n/a" }}</td></tr>
{% endfor %}</table>
{% for img in s.images %}<img src="plots/{{ img }}" alt="{{ img }}">{% endfor %}
{% endfor %}
</body></html>
"""


def _ratio(row: dict, key: str) -> str:
    """``0.712 ± 0.031`` (Student-t 95 % half-width), or the mean alone when there is no interval."""
    if key not in row or row[key] is None:
        return "—"
    ci = row.get(f"{key}_ci95")
    return f"{row[key]:.3f}" + (f" ± {ci:.3f}" if ci is not None else "")


def _headroom_rows(doc: dict) -> list[dict]:
    """The headroom table's cells (pipelines/benchmark.py:headroom), formatted."""
    from joulesched.pipelines.benchmark import headroom

    def f(v, name=None):
        return "—" if v is None else f"{v:.3f}" + (f" ({name})" if name else "")

    rows = []
    for name, h in headroom(doc).items():
        opt = f(h.get("optimum"))
        if h.get("optimum") is not None and not h.get("optimal"):
            opt += "*"
        share = h.get("learned_share_of_gap")
        rows.append({"name": name, "up": f(h["best_upstream"], h["best_upstream_policy"]),
                     "sa": f(h["best_sleep_aware"], h["best_sleep_aware_policy"]),
                     "learned": f(h["learned"], h["learned_policy"]), "opt": opt, "bound": f(h.get("best_bound")),
                     "lp": f(h.get("lp_bound")), "fluid": f(h["fluid_bound"]),
                     "share": "—" if share is None else f"{100 * share:.0f} %"})
    return rows


def write_report(out: Path, header: str = "Measured on the embedded twin (simulated cluster).") -> Path:
    """Render ``out/report.html`` and ``out/plots/*.png`` from ``out/results.json`` and its timelines."""
    out = Path(out)
    doc = load_results(out / "results.json")
    tl_path = out / "timelines.npz"
    tl = dict(np.load(tl_path)) if tl_path.exists() else {}
    nodes_path = out / "nodes.json"
    nodes = json.loads(nodes_path.read_text()) if nodes_path.exists() else {}
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    _plot_energy_ratio(doc, plots / "energy_ratio.png")
    _plot_energy_vs_service(doc, plots / "energy_vs_service.png")
    first_index = {}
    for e in doc["scenarios"]:
        first_index.setdefault(e["name"], len(first_index))
    scen = []
    for name, s in doc["summary"].items():
        i = first_index[name]
        entry = next(e for e in doc["scenarios"] if e["name"] == name)
        seeds = [e.get("seed") for e in doc["scenarios"] if e["name"] == name]
        images = []
        # Timelines are recorded on the scenario's first workload seed (the entry listed first).
        if _plot_power(doc, tl, i, name, plots / f"power_{i}.png", entry.get("seed", 0)):
            images.append(f"power_{i}.png")
        if _plot_util(doc, tl, nodes, i, name, plots / f"util_{i}.png", entry.get("seed", 0)):
            images.append(f"util_{i}.png")
        if doc.get("env") == "kube":
            if _plot_node_power(entry, doc["policies"], name, plots / f"node_power_{i}.png"):
                images.append(f"node_power_{i}.png")
            if _plot_awake_nodes(entry, doc["policies"], name, plots / f"awake_{i}.png"):
                images.append(f"awake_{i}.png")
            if _plot_placement(entry, doc["policies"], i, name, plots / f"placement_{i}.png"):
                images.append(f"placement_{i}.png")
        best = min(s["policies"], key=lambda p: s["policies"][p]["energy_joules"])
        rows = []
        for p, r in s["policies"].items():
            vs = _ratio(r, "energy_vs_default")
            vh = _ratio(r, "energy_vs_best_heuristic")
            rows.append({"policy": p, "energy": fmt_energy(r["energy_joules"]), "vs_default": vs, "vs_heur": vh,
                         "vs_lb": r.get("energy_vs_lower_bound"), "slo": 100 * r["slo_violation_rate"],
                         "thr": None if r["mean_throttling"] is None else 100 * r["mean_throttling"],
                         "pending": r["mean_pending_s"],
                         "uns": r["unschedulable_pods"], "p99": r["decision_us_p99"], "best": p == best})
        scen.append({"name": name, "nodes": entry["nodes"], "pods": entry["pods"], "n": s["seeds"],
                     "seeds": ", ".join(str(x) for x in seeds),
                     "lb": fmt_energy(s["lower_bound_joules"]) if s.get("lower_bound_joules") else None, "rows": rows, "images": images})
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    page = env.from_string(_TEMPLATE).render(headroom=_headroom_rows(doc),
        header=header, n_scen=len(scen), seeds=doc["seeds"], policies=doc["policies"], wall_s=doc.get("wall_s", 0.0),
        when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), command=doc.get("command", ""), scenarios=scen,
        training_curve=(plots / "training_curve.png").is_file())
    return atomic_write_text(out / "report.html", page)
