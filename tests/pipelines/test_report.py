"""The report reads at a glance (issue 32): one colour per policy in every figure, labels that never touch,
legends outside the data, the verdict table first, and a page that renders in a real browser.

The figures and the page come from a real benchmark (every default policy and the shipped DQN on two small
scenarios, two seeds); the layout checks also run on the same results spread over the standard suite's
thirteen scenario names, the demo's size.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.image as mimage
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from joulesched.agent.registry import DEFAULT_POLICIES, HEURISTIC_FAMILIES, default_policies, family_of
from joulesched.core.plots import plain_text_figures
from joulesched.pipelines import report
from joulesched.pipelines.benchmark import load_results, run_benchmark, summarize
from joulesched.pipelines.results import OptimumRun, Results, ScenarioRun, dump, from_dict
from joulesched.pipelines.suite import REPO_ROOT, SCENARIOS_DIR, standard_suite

DQN = f"dqn={REPO_ROOT / 'models' / 'v2.pt'}"
POLICIES = [*DEFAULT_POLICIES, DQN]
ARTEFACTS = REPO_ROOT / "out" / "test-artefacts"  # out/ is gitignored


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    run_benchmark([SCENARIOS_DIR / "tiny.yaml", SCENARIOS_DIR / "small" / "sleep-mixed.yaml"], POLICIES, 2, out)
    report.write_report(out)
    return out


def _inputs(out: Path) -> tuple[Results, dict, dict]:
    return (load_results(out / "results.json"), dict(np.load(out / "timelines.npz")),
            json.loads((out / "nodes.json").read_text()))


def _suite_sized(res: Results) -> Results:
    """The run's per-seed results under each of the standard suite's scenario names (13, some long), so the
    layout is checked at the demo's size without running the whole suite."""
    doc = res.model_dump(exclude_unset=True)
    names = [p.stem for p in standard_suite()]
    big = {**doc, "scenarios": []}
    for k, name in enumerate(names):
        src = doc["scenarios"][2 * (k % 2): 2 * (k % 2) + 2]  # both seeds of one of the two real scenarios
        big["scenarios"] += [{**copy.deepcopy(e), "name": name} for e in src]
    big["summary"] = summarize(big)
    return from_dict(big)


def _policy_colours(fig) -> dict[str, set[str]]:
    """What each artist standing for a policy (its gid) is painted in: bars, scatter points, lines."""
    seen: dict[str, set[str]] = {}
    for a in fig.findobj(lambda a: a.get_gid() is not None):
        if isinstance(a, Rectangle):
            c = [a.get_facecolor()]
        elif isinstance(a, PathCollection):
            c = list(a.get_facecolors())
        elif isinstance(a, Line2D):
            c = [a.get_color()]
        else:
            continue
        seen.setdefault(a.get_gid(), set()).update(mcolors.to_hex(x) for x in c)
    return seen


def _lab(colour: str) -> np.ndarray:
    """CIE L*a*b* (D65) of an sRGB colour, to measure how far apart two colours look."""
    rgb = np.array(mcolors.to_rgb(colour))
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ lin
    xyz = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _min_delta_e(colours) -> float:
    return min(float(np.linalg.norm(_lab(a) - _lab(b))) for a, b in itertools.combinations(colours, 2))


def test_each_policy_has_one_distinct_colour_in_every_figure(run):
    doc, tl, nodes = _inputs(run)
    per_policy: dict[str, set[str]] = {}
    figs_with = {}
    for fname, _, fig in report.figures(doc, tl, nodes):
        colours = _policy_colours(fig)
        figs_with[fname] = set(colours)
        for p, c in colours.items():
            per_policy.setdefault(p, set()).update(c)
        plt.close(fig)
    # The summary plots and each scenario's power plot draw every policy.
    for fname in ("energy_ratio.png", "energy_vs_service.png", "power_0.png", "power_1.png"):
        assert figs_with[fname] == set(POLICIES), fname
    assert all(len(c) == 1 for c in per_policy.values()), {p: c for p, c in per_policy.items() if len(c) > 1}
    colour = {p: next(iter(c)) for p, c in per_policy.items()}
    assert len(set(colour.values())) == len(POLICIES) == len(DEFAULT_POLICIES) + 1
    # Distinct to the eye, not merely different hex codes: at least 15 CIE76 units apart (2.3 is a just
    # noticeable difference).
    assert _min_delta_e(colour.values()) >= 15
    assert colour["default-k8s"] == report.DEFAULT_K8S_COLOR and colour[DQN] == report.LEARNED_COLOR
    # The tables' swatches are the figures' colours.
    html = (run / "report.html").read_text()
    for p in POLICIES:
        assert f'background:{colour[p]}"></span>{report._breakable(p)}' in html, p
    # The unplaced column says what it counts, so that its numbers add up with the pods (#33).
    assert html.count("placed + unplaced = each seed's pods, mean over seeds: ") \
        == html.count('title="unplaced pods') >= 1


def test_default_k8s_the_dqn_and_every_default_policy_keep_their_colours_in_any_report():
    others = [p for p in DEFAULT_POLICIES if p != "default-k8s"]
    for policies in (["default-k8s", "dqn=a.pt"], [*reversed(others), "dqn=b.pt", "default-k8s"],
                     ["dqn=c.pt", "most-allocated", "default-k8s", "dqn=d.pt"]):
        colours = report.policy_colors(policies)
        assert colours["default-k8s"] == report.DEFAULT_K8S_COLOR
        assert colours[next(p for p in policies if p.startswith("dqn="))] == report.LEARNED_COLOR
        assert len(set(colours.values())) == len(policies)
    # Every default policy keeps its colour from one report to the next, whatever else runs beside it.
    a = report.policy_colors(list(DEFAULT_POLICIES))
    b = report.policy_colors(["my-plugin", "pabfd", "dqn=e.pt", "awake-first:fit=efficient", "most-allocated"])
    assert all(b[p] == a[p] for p in ("pabfd", "awake-first:fit=efficient", "most-allocated"))
    assert b["my-plugin"] not in {a[p] for p in ("pabfd", "awake-first:fit=efficient", "most-allocated")}
    # Past the palette (30 policies) every policy still gets a colour of its own.
    many = ["default-k8s", *(f"target-load-packing:x={x}" for x in range(29))]
    assert len(set(report.policy_colors(many).values())) == 30


def _texts(fig) -> list[tuple[str, object]]:
    renderer = fig.canvas.get_renderer()
    out = []
    for t in fig.findobj(Text):
        if t.get_visible() and t.get_text().strip() and (t.axes is None or t.axes.get_visible()):
            out.append((t.get_text(), t.get_window_extent(renderer)))
    return out


def _overlaps(a, b) -> bool:
    # Strict overlap: boxes that merely touch at an edge of a pixel still count as apart.
    return a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5 and b.y0 < a.y1 - 0.5


def _one_scenario(res: Results) -> Results:
    """The run's first scenario alone (a measured run's shape: one narrow figure)."""
    doc = res.model_dump(exclude_unset=True)
    one = {**doc, "scenarios": [e for e in doc["scenarios"] if e["name"] == doc["scenarios"][0]["name"]]}
    one["summary"] = summarize(one)
    return from_dict(one)


@pytest.mark.parametrize("fname", ["energy_ratio.png", "energy_vs_service.png"])
@pytest.mark.parametrize("shape,panels", [(_suite_sized, 13), (_one_scenario, 1)])
def test_summary_plots_have_no_touching_labels_and_legends_outside_the_data(run, fname, shape, panels):
    doc, tl, nodes = _inputs(run)
    doc = shape(doc)
    fig = next(f for name, _, f in report.figures(doc, tl, nodes) if name == fname)
    fig.canvas.draw()
    texts = _texts(fig)
    names = {e.name for e in doc.scenarios}
    assert names <= {t.replace("\n", "") for t, _ in texts}  # every scenario named (long names wrap at hyphens)
    assert sum(1 for ax in fig.axes if ax.get_visible() and ax.get_title()) == panels
    clashes = [(ta, tb) for (ta, a), (tb, b) in itertools.combinations(texts, 2) if _overlaps(a, b)]
    assert not clashes, clashes[:5]
    renderer = fig.canvas.get_renderer()
    data = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
    for leg in fig.legends:
        box = leg.get_window_extent(renderer)
        assert not any(_overlaps(box, ax) for ax in data)
    plt.close(fig)


class _Page(HTMLParser):
    """The order of tables and images on the page, and the verdict table's rows."""

    def __init__(self):
        super().__init__()
        self.order: list[str] = []
        self.verdict: dict[str, str] = {}
        self.cells: dict[str, list[str]] = {}
        self._row: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("table", "img"):
            self.order.append(a.get("id") or tag)
        if tag == "tr" and "data-scenario" in a:
            self.verdict[a["data-scenario"]] = a["data-best"]
            self._row = a["data-scenario"]
            self.cells[self._row] = []
        if tag == "td" and self._row:
            self.cells[self._row].append("")

    def handle_endtag(self, tag):
        if tag in ("tr", "table"):
            self._row = None

    def handle_data(self, data):
        if self._row and self.cells[self._row]:
            self.cells[self._row][-1] += data


def test_the_verdict_table_comes_first_and_names_the_least_energy_policy_within_the_slo_budget(run):
    doc = load_results(run / "results.json")
    page = _Page()
    page.feed((run / "report.html").read_text())
    assert page.order[0] == "verdict"  # before every plot and every other table
    assert set(page.verdict) == {"tiny", "small-sleep-mixed"}
    for name, s in doc.summary.items():
        rows = s.policies
        budget = rows["default-k8s"].slo_violation_rate + 0.005
        within = {p: r.energy_joules for p, r in rows.items() if r.slo_violation_rate <= budget}
        assert page.verdict[name] == min(within, key=within.get)
        # The DQN against the best heuristic, per seed, with its interval and n (the summary's figures).
        r = rows[DQN]
        want = f"{r.energy_vs_best_heuristic:.3f} ± {r.energy_vs_best_heuristic_ci95:.3f} (n = 2)"
        cells = [c.strip() for c in page.cells[name]]
        assert want in cells
        # And the fluid bound against the best heuristic (no --optimum in this run), per seed.
        heur = [p for p in POLICIES if family_of(p) in HEURISTIC_FAMILIES]
        ratio = np.mean([e.lower_bound_joules / min(e.policies[h].energy_joules for h in heur)
                         for e in doc.runs(name)])
        assert any(c.startswith(f"{ratio:.3f} ± ") and c.endswith("(fluid bound)") for c in cells)


def test_without_the_optimum_the_headroom_shows_the_fluid_bound_and_no_empty_columns(run):
    # A run without --optimum has no optimum, no MIP/LP bound and no share of a gap: columns and a table of
    # dashes only (tests/agent/test_optimum.py checks them with --optimum).
    html = (run / "report.html").read_text()
    section = html[html.index("<h2>Headroom</h2>"):html.index("<h2>", html.index("<h2>Headroom</h2>") + 1)]
    assert "<th>fluid bound</th>" in section and "--optimum" in section
    assert 'id="gap-shares"' not in section and "bound, bind-on-arrival" not in section
    assert "gap closed by learned" not in section
    doc = load_results(run / "results.json")
    for name in doc.summary:
        row = re.search(rf"<tr><td>{re.escape(name)}</td>(.*?)</tr>", section, re.S)
        assert row, name
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
        assert len(cells) == 5 and all(c.strip() not in ("", "—") for c in cells), cells  # each column has a figure


def test_the_verdict_takes_the_optimum_where_solved_else_the_best_proven_bound():
    def run(lower_bound, **optimum):
        opt = OptimumRun(name="s", seed=0, nodes=2, pods=3, **optimum) if optimum else None
        return ScenarioRun(name="s", seed=0, nodes=2, pods=3, lower_bound_joules=lower_bound, optimum=opt,
                           policies={})

    assert report._target_joules(run(80.0)) == (80.0, "fluid bound")
    solved = {"optimum_joules": 95.0, "bound_joules": 95.0, "lp_bound_joules": 95.0}
    assert report._target_joules(run(80.0, status="optimal", **solved)) == (95.0, "optimum")
    # proven in the MIP's class only: no bound every run obeys meets it
    assert report._target_joules(run(80.0, status="optimal", **{**solved, "lp_bound_joules": 90.0})) == (
        95.0, "optimum, bind-on-arrival")
    assert report._target_joules(run(80.0, status="time_limit", **solved)) == (95.0, "optimum*")
    unsolved = {"optimum_joules": None, "bound_joules": None, "lp_bound_joules": 88.0}
    assert report._target_joules(run(80.0, status="skipped", **unsolved)) == (88.0, "bound")
    assert report._target_joules(run(None)) == (None, "")


def test_the_verdict_says_which_runs_a_bound_holds_for_and_an_optimum_only_when_the_twin_replayed_it():
    """The MIP's own bound and the bind-on-arrival LP's hold only for runs that bind every pod when it arrives (a
    run that queues may use less, docs/optimum.md): the verdict names such a target so instead of calling it a
    bound no policy can beat. An optimum is the schedule as the twin replays it, and proven only where the row's
    certificate says so (a replay that differs from the MIP's claim leaves it feasible)."""
    def run(**optimum):
        opt = OptimumRun(name="s", seed=0, nodes=2, pods=3, **optimum)
        return ScenarioRun(name="s", seed=0, nodes=2, pods=3, lower_bound_joules=80.0, optimum=opt, policies={})

    mip_bound = {"status": "time_limit", "optimum_joules": None, "bound_joules": 93.0, "lp_bound_joules": 88.0}
    assert report._target_joules(run(**mip_bound)) == (93.0, "bound, bind-on-arrival")
    boa_lp = {"status": "skipped", "optimum_joules": None, "bound_joules": None, "lp_bound_joules": 88.0,
              "boa_bound_joules": 91.0}
    assert report._target_joules(run(**boa_lp)) == (91.0, "bound, bind-on-arrival")
    assert report._target_joules(run(**{**boa_lp, "boa_bound_joules": 85.0})) == (88.0, "bound")
    # The MIP said optimal, but the twin meters its schedule at 96 J: the twin's figure, not proven.
    replayed = {"status": "optimal", "optimum_joules": 95.0, "bound_joules": 95.0, "lp_bound_joules": 90.0,
                "replay_joules": 96.0, "schedule_joules": 96.0, "certificate": "feasible"}
    assert report._target_joules(run(**replayed)) == (96.0, "optimum*")
    agreed = {**replayed, "replay_joules": 95.0, "schedule_joules": 95.0, "certificate": "optimal",
              "lp_bound_joules": 95.0}
    assert report._target_joules(run(**agreed)) == (95.0, "optimum")
    note = " ".join(report._TEMPLATE.split())
    assert "<em>bound, bind-on-arrival</em>: the MIP's own or the bind-on-arrival LP's, which only the runs" in note


def _made_up(energies: list[dict[str, float]], optimum: dict | list[dict] | None = None,
             metrics: dict[str, dict] | None = None, pods: list[int] | None = None,
             seed_metrics: list[dict[str, dict]] | None = None) -> Results:
    """Results of scenario ``s`` with one seed per dict of ``energies`` (policy -> joules), every other metric
    alike but for ``metrics`` (policy -> its metrics on every seed) and ``seed_metrics`` (per seed, policy -> its
    metrics there); ``optimum``: each seed's optimum row (or one per seed); ``pods``: each seed's pod count (3)."""
    if isinstance(optimum, dict):
        optimum = [optimum] * len(energies)
    pods = pods or [3] * len(energies)
    alike = {"slo_violation_rate": 0.0, "unschedulable_pods": 0, "mean_pending_s": 0.0, "placements": 3,
             "decision_us_p99": 1.0, "mean_throttling": 0.0, "end_s": 100.0, "completed_pods": 3}
    runs = [{"name": "s", "seed": k, "nodes": 2, "pods": pods[k], "lower_bound_joules": 80.0,
             **({"optimum": {"name": "s", "seed": k, "nodes": 2, "pods": 3, **optimum[k]}} if optimum else {}),
             "policies": {p: {"energy_joules": e, **alike, **(metrics or {}).get(p, {}),
                              **(seed_metrics[k].get(p, {}) if seed_metrics else {})} for p, e in seed.items()}}
            for k, seed in enumerate(energies)]
    doc = {"schema_version": 2, "command": "", "created_unix": 0.0, "wall_s": 0.0, "policies": list(energies[0]),
           "seeds": len(energies), "scenarios": runs}
    doc["summary"] = summarize(doc)
    return from_dict(doc)


def test_the_headroom_optimum_is_the_replayed_schedule_and_proven_only_with_its_certificate():
    from joulesched.pipelines.benchmark import headroom

    opt = {"status": "optimal", "optimum_joules": 95.0, "bound_joules": 95.0, "lp_bound_joules": 90.0, "gap": 0.0,
           "replay_joules": 96.0, "schedule_joules": 96.0, "certificate": "feasible"}
    row = headroom(_made_up([{"default-k8s": 200.0, "most-allocated": 100.0}], opt))["s"]
    assert row["optimum"] == pytest.approx(96.0 / 200.0) and row["optimal"] is False
    assert row["target_kind"] == "best schedule"
    assert row["optimum_gap"] == pytest.approx((96.0 - 95.0) / 96.0) and row["gap_conflict"] is False
    # certify() stated no gap (a bound above the schedule): the headroom states none either, and says why
    conflict = {**opt, "boa_bound_joules": 120.0, "best_bound_joules": 120.0, "best_gap": None}
    row = headroom(_made_up([{"default-k8s": 200.0, "most-allocated": 100.0}], conflict))["s"]
    assert row["optimum_gap"] is None and row["gap_conflict"] is True


@pytest.mark.parametrize("tail, lp, fluid, policy_j, label", [
    (0.0, 95.0, None, 100.0, "optimum"),  # proven, over its own end, and a bound every run obeys meets it
    (0.0, 90.0, 94.995, 100.0, "optimum"),  # the fluid bound meets it within EVERY_RUN_TOL
    (0.0, 90.0, None, 100.0, "optimum, bind-on-arrival"),  # proven in the MIP's class only, whatever ran beside
    (0.0, 90.0, None, 90.0, "optimum, bind-on-arrival"),  # a run outside the class (queued, throttled) used less
    (5.0, 95.0, None, 100.0, "optimum*"),  # charged an idle tail to the policies' window: the MIP did not minimise
])
def test_the_optimum_is_called_optimal_only_where_it_is_over_the_window(tail, lp, fluid, policy_j, label):
    """Reviews found rows labelled "optimum" that a heuristic beat: the MIP minimises to its own end, and the
    benchmark meters it to the policies' window; and its class is the schedules that bind pods on arrival and
    overload no node, so only a bound every run obeys makes it the optimum of every run (a throttled run that
    no policy beside it made could use less)."""
    from joulesched.pipelines.benchmark import headroom

    opt = {"status": "optimal", "optimum_joules": 95.0, "bound_joules": 95.0, "lp_bound_joules": lp, "gap": 0.0,
           "fluid_joules": fluid, "replay_joules": 95.0, "schedule_joules": 95.0 + tail, "window_tail_joules": tail,
           "certificate": "optimal", "best_gap": 0.0, "best_bound_joules": 95.0}
    doc = _made_up([{"default-k8s": 200.0, "most-allocated": policy_j}], opt)
    assert doc.scenarios[0].optimum_label() == label
    row = headroom(doc)["s"]
    assert row["optimal"] is (label == "optimum")
    assert row["target_kind"] == {"optimum": "optimum", "optimum*": "best schedule"}.get(label, label)
    from joulesched.pipelines.report import verdict

    (v,) = verdict(doc)
    assert v["target_kind"] == label


_PROBE = """<script>
window.addEventListener('load', () => {
  const d = document.documentElement;
  const images = [...document.images].map(i => ({src: i.getAttribute('src'), loaded: i.complete && i.naturalWidth > 0}));
  const wide = [...document.body.querySelectorAll('*')]
    .filter(e => e.getBoundingClientRect().right > d.clientWidth + 0.5).map(e => e.tagName + (e.id ? '#' + e.id : '') + ':' + (e.textContent || '').slice(0, 30)).slice(0, 10);
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify({scrollWidth: d.scrollWidth, clientWidth: d.clientWidth,
                                    scrollHeight: d.scrollHeight, images, wide});
  document.body.appendChild(pre);
});
</script>"""


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    # --no-sandbox: Chromium's sandbox needs user namespaces, which containers and root shells lack; it opens
    # one local file of ours.
    return subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={profile}", "--virtual-time-budget=10000", *args],
                          capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="needs Debian's chromium (in the Makefile's APT_PACKAGES; `make test` installs it as root)")
@pytest.mark.parametrize("width", [1280, 1024])
def test_the_report_renders_in_headless_chromium_with_every_image_and_no_horizontal_overflow(run, tmp_path, width):
    probe = run / f"probe-{width}.html"  # beside report.html, so its relative image paths resolve
    probe.write_text((run / "report.html").read_text().replace("</body>", _PROBE + "</body>"))
    dom = _chromium(f"--window-size={width},900", "--dump-dom", probe.as_uri(), profile=tmp_path / "p1").stdout
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert m, dom[-2000:]
    got = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert len(got["images"]) == len(list((run / "plots").glob("*.png"))) >= 6
    assert all(i["loaded"] for i in got["images"]), [i for i in got["images"] if not i["loaded"]]
    assert not got["wide"], got["wide"]  # the elements that stick out, if any
    assert got["scrollWidth"] <= got["clientWidth"], got
    # The whole page as an artefact, to look at (out/test-artefacts/, gitignored).
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTEFACTS / f"report-chromium-{width}.png"
    height = min(got["scrollHeight"], 16000)
    _chromium(f"--window-size={width},{height}", f"--screenshot={shot}", (run / "report.html").as_uri(),
              profile=tmp_path / "p2")
    img = mimage.imread(shot)
    assert img.shape[:2] == (height, width) and float(img[..., :3].std()) > 0.05  # not a blank page


def test_a_per_seed_best_is_not_shown_as_the_named_policys_own_figure():
    """The headroom's best upstream heuristic is the least energy among them on each seed, averaged, and names the
    one best on average: where another won a seed the two differ, and the cell gives both (it showed 0.525
    beside most-allocated, whose own ratio is 0.575)."""
    res = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0, "target-load-packing": 125.0},
                    {"default-k8s": 200.0, "most-allocated": 130.0, "target-load-packing": 110.0}])
    (row,) = report._headroom_rows(res)
    assert row["up"] == "0.525 (per-seed best; most-allocated 0.575)"
    res = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0, "target-load-packing": 125.0}])
    assert report._headroom_rows(res)[0]["up"] == "0.500 (most-allocated)"


def test_an_optimum_proven_on_some_seeds_only_is_an_unproven_optimum_in_the_verdict():
    solved = {"optimum_joules": 95.0, "bound_joules": 90.0, "lp_bound_joules": 90.0}
    res = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0}] * 2,
                   [{"status": "optimal", **solved}, {"status": "time_limit", **solved}])
    (v,) = report.verdict(res)
    assert v["target_kind"] == "optimum*" and v["target"]["mean"] == pytest.approx(0.95)


def test_seeds_with_bounds_only_are_a_bound_in_the_verdict_the_weakest_one_named():
    # No seed has a schedule: the label is a bound, never "optimum or bound"; bind-on-arrival if any seed's is.
    unsolved = {"status": "time_limit", "optimum_joules": None, "lp_bound_joules": 85.0}
    res = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0}] * 2,
                   [{**unsolved, "bound_joules": 90.0}, {**unsolved, "bound_joules": None}])
    (v,) = report.verdict(res)
    assert v["target_kind"] == "bound, bind-on-arrival" and v["target"]["mean"] == pytest.approx((0.90 + 0.85) / 2)
    res = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0}] * 2,
                   [{**unsolved, "bound_joules": 90.0}, {"status": "optimal", "optimum_joules": 95.0,
                                                        "bound_joules": 95.0, "lp_bound_joules": 90.0}])
    assert report.verdict(res)[0]["target_kind"] == "optimum or bound"


def test_an_older_row_without_schedule_joules_takes_the_replay_not_the_mips_figure():
    opt = {"status": "optimal", "optimum_joules": 95.0, "bound_joules": 95.0, "lp_bound_joules": 90.0,
           "replay_joules": 96.0}
    (e,) = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0}], opt).runs("s")
    assert e.optimum.schedule_energy == 96.0


def test_the_benchmark_summary_gives_the_replayed_schedule_and_its_certificate():
    from joulesched.pipelines.benchmark import _optimum_summary

    row = {"name": "s", "seed": 0, "nodes": 2, "pods": 3, "status": "optimal", "optimum_joules": 95.0,
           "bound_joules": 95.0, "lp_bound_joules": 90.0, "replay_joules": 96.0, "schedule_joules": 96.0,
           "certificate": "feasible"}
    s = _optimum_summary([row, {**row, "seed": 1, "schedule_joules": 98.0}])
    assert s["optimum_joules"] == pytest.approx(97.0) and s["status"] == ["feasible", "feasible"]
    assert s["optimum_bound_joules"] == 95.0 and s["lp_bound_joules"] == 90.0


def _render(doc: Results, out: Path) -> str:
    """``doc`` written to ``out`` and rendered (no timelines): the page."""
    out.mkdir()
    (out / "results.json").write_text(dump(doc))
    return report.write_report(out).read_text()


def _tick_labels(axis) -> list[str]:
    lo, hi = sorted(axis.get_view_interval())
    return [t.label1.get_text() for t in axis.get_major_ticks() if t.label1.get_visible() and lo <= t.get_loc() <= hi]


def test_the_log_pending_axis_labels_its_ticks_in_plain_numbers():
    """Mathtext is off in every figure (user text), so the symlog axis's own labels printed literally as
    ``$\\mathdefault{10^{0}}$``: plain numbers, minor ticks unlabelled."""
    doc = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0}],
                   metrics={"default-k8s": {"mean_pending_s": 0.3}, "most-allocated": {"mean_pending_s": 6000.0}})
    with plain_text_figures():
        fig = report.fig_energy_vs(doc, report.policy_colors(doc.policies), "mean_pending_s", "pending (s)", 1.0)
        fig.canvas.draw()
    xaxis = fig.axes[0].xaxis
    assert _tick_labels(xaxis) == ["0", "1", "10", "100", "1,000", "10,000"]
    assert all(not t.label1.get_visible() or not t.label1.get_text() for t in xaxis.get_minor_ticks())
    plt.close(fig)


def test_no_figure_of_the_report_or_the_training_curve_prints_mathtext_markup(run, tmp_path):
    doc, tl, nodes = _inputs(run)
    with plain_text_figures():
        for fname, _, fig in report.figures(doc, tl, nodes):
            fig.canvas.draw()
            texts = [t.get_text() for t in fig.findobj(Text) if t.get_visible()]
            assert not [t for t in texts if "$" in t or "mathdefault" in t], fname
            plt.close(fig)
    # The training curve's axes (a million decisions: an offset or scientific label, if any, is plain too).
    from joulesched.pipelines import training

    drawn = {}
    real_savefig = training.atomic_savefig

    def keep(fig, path, **kw):
        drawn["texts"] = [t.get_text() for t in fig.findobj(Text) if t.get_visible()]
        return real_savefig(fig, path, **kw)

    curve = tmp_path / "m.curve.csv"
    curve.write_text("step,scenario,episode_return,eval_score\n" + "".join(
        f"{k},tiny,{-1e5 * k},\n{k},validation,,{1 + 1e-4 * k}\n" for k in range(0, 2_000_001, 250_000)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(training, "atomic_savefig", keep)
        training._plot_curve(curve, tmp_path / "m.curve.png")
    assert drawn["texts"] and not [t for t in drawn["texts"] if "$" in t or "mathdefault" in t], drawn["texts"]


@pytest.mark.parametrize("n", [25, 40])
def test_colours_past_the_palette_keep_off_the_dqns_red_and_apart(n):
    """Past the palette, golden-ratio hues came within 16 CIE76 units of the DQN's red (the demo's 25 policies:
    gpu-energy:empty=asleep) and 7 of a palette colour (fgd beside random)."""
    policies = [*default_policies(gpus=True), DQN]
    policies += [f"my-plugin:k={k}" for k in range(n - len(policies))]
    assert len(policies) == n
    colours = report.policy_colors(policies)
    assert colours["default-k8s"] == report.DEFAULT_K8S_COLOR and colours[DQN] == report.LEARNED_COLOR
    assert all(colours[p] == c for p, c in report.policy_colors(list(DEFAULT_POLICIES)).items())  # fixed slots
    red, grey = _lab(report.LEARNED_COLOR), _lab(report.DEFAULT_K8S_COLOR)
    others = [c for p, c in colours.items() if p not in ("default-k8s", DQN)]
    assert min(float(np.linalg.norm(_lab(c) - red)) for c in others) >= 25
    assert min(float(np.linalg.norm(_lab(c) - grey)) for c in others) >= 25
    # Each generated colour at least 25 units from every other colour of the report (the palette's own pairs are
    # as close as 17: their order is fixed).
    made = [c for c in others if c not in report._PALETTE]
    assert len(made) == n - 2 - len(report._PALETTE)
    assert min(float(np.linalg.norm(_lab(a) - _lab(b))) for a in made for b in colours.values() if a != b) >= 25
    assert len(set(colours.values())) == n


def test_the_header_and_the_unplaced_note_give_each_seeds_pods_and_their_mean(tmp_path):
    doc = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0}] * 3, pods=[27, 40, 40])
    page = " ".join(_render(doc, tmp_path / "out").split())
    assert "2 nodes, 27-40 pods, n = 3 seed(s)" in page
    assert "placed + unplaced = each seed's pods, mean over seeds: 35.7)" in page
    same = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0}] * 2, pods=[40, 40])
    page = " ".join(_render(same, tmp_path / "same").split())
    assert "2 nodes, 40 pods, n = 2 seed(s)" in page and "mean over seeds: 40)" in page


def test_the_slo_budget_note_names_where_the_budget_comes_from(tmp_path):
    slo = {"most-allocated": {"slo_violation_rate": 0.05}, "awake-first": {"slo_violation_rate": 0.01}}
    without = _made_up([{"most-allocated": 100.0, "awake-first": 150.0}], metrics=slo)
    page = " ".join(_render(without, tmp_path / "without").split())
    assert "The SLO budget is the lowest violation rate of the scenario's policies (default-k8s did not run) plus 0.5" \
        in page
    assert report.verdict(without)[0]["budget"] == pytest.approx(0.015)  # awake-first's, not most-allocated's
    with_ref = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0}])
    page = " ".join(_render(with_ref, tmp_path / "with").split())
    assert "The SLO budget is default-k8s's violation rate plus 0.5 percentage points" in page


def test_each_scenario_table_highlights_the_verdicts_pick_not_the_least_energy_over_the_budget(tmp_path):
    doc = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0, "awake-first": 150.0}],
                   metrics={"most-allocated": {"slo_violation_rate": 0.10}})
    page = _render(doc, tmp_path / "out")
    assert report.verdict(doc)[0]["best"] == "awake-first"
    highlighted = re.findall(r'<tr class="best"><td class="pol"><span[^>]*></span>([^<]*)</td>', page)
    assert highlighted == ["awake-first"]
    assert "Highlighted: the least energy of equal service (the verdict's pick)." in page


def test_the_verdict_does_not_pick_a_policy_that_leaves_more_pods_unplaced(tmp_path):
    """A review: the verdict budgeted SLO violations only, so a policy that placed fewer pods (less work, less
    energy) could be named the least energy at equal service."""
    doc = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0, "awake-first": 150.0}],
                   metrics={"most-allocated": {"unschedulable_pods": 3.0}})
    assert report.verdict(doc)[0]["best"] == "awake-first"
    page = " ".join(_render(doc, tmp_path / "out").split())
    assert "leaves more pods unplaced than default-k8s (mean over seeds) is not picked either" in page
    same = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0, "awake-first": 150.0}],
                    metrics={"most-allocated": {"unschedulable_pods": 3.0}, "default-k8s": {"unschedulable_pods": 3.0}})
    assert report.verdict(same)[0]["best"] == "most-allocated"  # no more than default-k8s left


def test_the_gpu_split_takes_the_cpu_side_as_the_rest_where_a_row_has_no_cpu_joules():
    doc = _made_up([{"default-k8s": 7.2e6, "most-allocated": 3.6e6}])
    rows = doc.summary["s"].policies
    for p, gpu in (("default-k8s", 3.6e6), ("most-allocated", 1.8e6)):
        rows[p] = rows[p].model_copy(update={"gpu_joules": gpu, "cpu_joules": None})  # an older row: a TypeError
    fig = report.fig_gpu_energy(doc, "s", report.policy_colors(doc.policies))
    widths = {a.get_gid(): a.get_width() for a in fig.findobj(Rectangle) if a.get_gid()}
    assert widths == pytest.approx({"default-k8s/cpu": 1.0, "default-k8s/gpu": 1.0, "most-allocated/cpu": 0.5,
                                    "most-allocated/gpu": 0.5})
    plt.close(fig)


def test_the_nodes_awake_axis_has_integer_ticks(run):
    doc, tl, _ = _inputs(run)
    for name in doc.summary:
        with plain_text_figures():
            fig = report.fig_power(doc, tl, doc.timeline_key(name), name, 0, report.policy_colors(doc.policies))
            fig.canvas.draw()
        awake = next(ax for ax in fig.axes if ax.get_ylabel() == "nodes awake")
        lo, hi = awake.get_ylim()
        ticks = [v for v in awake.get_yticks() if lo <= v <= hi]
        assert len(ticks) >= 2 and all(float(v).is_integer() for v in ticks), (name, ticks)
        assert all("." not in t for t in _tick_labels(awake.yaxis)), name
        plt.close(fig)


def test_the_utilisation_plot_shows_the_verdicts_pick_beside_default_k8s():
    doc = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0, "awake-first": 150.0}],
                   metrics={"most-allocated": {"slo_violation_rate": 0.10}})
    key = doc.timeline_key("s")
    tl = {f"{key}/bin_s": np.array([60.0]), **{f"{key}/{p}/util": np.zeros((3, 2), np.float16) for p in doc.policies}}
    with plain_text_figures():
        fig = report.fig_util(doc, tl, {}, key, "s", 0)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["default-k8s", "awake-first"]
    plt.close(fig)


def test_slo_pending_time_and_energy_have_their_intervals_in_the_summary_and_the_table():
    """Only the energy ratios had an interval; a reader comparing 13.6 s of pending time with 12.0 s could not
    tell a difference from seed noise (a review's 3-seed run: 20.0, 12.0 and 8.74 s)."""
    from scipy import stats

    from joulesched.pipelines.report import _scenario_tables

    pend = [20.0, 12.0, 8.74]
    doc = _made_up([{"default-k8s": 100.0 + k} for k in range(3)],
                   seed_metrics=[{"default-k8s": {"mean_pending_s": p}} for p in pend])
    row = doc.summary["s"].policies["default-k8s"]
    want = stats.t.ppf(0.975, 2) * np.std(pend, ddof=1) / np.sqrt(3)
    assert row.mean_pending_s_ci95 == pytest.approx(want) and row.slo_violation_rate_ci95 == 0.0
    assert row.energy_joules_ci95 == pytest.approx(stats.t.ppf(0.975, 2) * 1.0 / np.sqrt(3))
    (table,) = _scenario_tables(doc)
    assert table["rows"][0]["pending"] == "13.6" and table["rows"][0]["pending_ci"] == f"± {want:.1f}"
    one = _made_up([{"default-k8s": 100.0}])  # one seed: no interval, and nothing printed for it
    assert one.summary["s"].policies["default-k8s"].mean_pending_s_ci95 is None
    assert _scenario_tables(one)[0]["rows"][0]["pending_ci"] == ""


def test_a_scenarios_warnings_are_on_the_page(tmp_path):
    """The summary's warnings (a measured run's nodes without energy series, a trace's dropped rows) were kept
    in results.json and never shown (a review)."""
    doc = _made_up([{"default-k8s": 200.0, "most-allocated": 100.0}])
    doc.summary["s"].warnings.append("default-k8s: no energy series for node(s) <w1> in its window")
    page = _render(doc, tmp_path / "out")
    assert '<p class="note warning">Warning: default-k8s: no energy series for node(s) &lt;w1&gt; in its window</p>' \
        in page
