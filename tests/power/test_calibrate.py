"""Calibration: curve fitting, sample files, the burner, and the CLI's profile output and error handling."""

from __future__ import annotations

import json
import random

import pytest
import yaml
from typer.testing import CliRunner

from joulesched.pipelines.cli import app
from joulesched.power.calibrate import CalibrationError, Sample, _pava, fit_curve, read_samples_csv
from joulesched.power.curves import SPECPOWER, interp

runner = CliRunner()
TRUE = SPECPOWER["ibm-x3550-m3-x5670"]  # strongly non-linear at the low end


def _noisy_samples(curve, n=400, noise_w=2.0, seed=1):
    rng = random.Random(seed)
    return [Sample(u, interp(curve, u) + rng.gauss(0, noise_w)) for u in (rng.random() for _ in range(n))]


def test_fit_recovers_a_known_curve_from_noisy_samples():
    fit = fit_curve(_noisy_samples(TRUE))
    assert max(abs(a - b) for a, b in zip(fit.curve, TRUE)) < 2.0
    assert 1.5 < fit.rmse_w < 2.5  # the noise, not the model, is what is left
    assert fit.unsupported_knots == ()
    assert list(fit.curve) == sorted(fit.curve)


def test_fit_is_exact_on_noise_free_knots_and_extrapolates_gaps():
    exact = fit_curve([Sample(k / 10, TRUE[k]) for k in range(11)])
    assert exact.curve == pytest.approx(TRUE, abs=0.05) and exact.rmse_w < 0.05
    # Only 20..60 % measured on a straight line: allowed, the rest is extrapolated linearly and flagged.
    line = [Sample(u / 100, 50 + u) for u in range(20, 61, 5)]
    fit = fit_curve(line, allow_extrapolation=True)
    assert fit.curve == pytest.approx([50 + 10 * k for k in range(11)], abs=0.5)
    assert fit.unsupported_knots == (0, 1, 7, 8, 9, 10)
    assert "extrapolated at 0%" in fit.summary()


def test_fit_is_monotone_even_when_the_data_dip():
    dip = [Sample(k / 10, w) for k, w in enumerate([100, 120, 115, 130, 140, 150, 160, 170, 180, 190, 200])]
    fit = fit_curve(dip)
    assert list(fit.curve) == sorted(fit.curve)
    assert _pava([3.0, 1.0, 2.0], [1.0, 1.0, 1.0]).tolist() == [2.0, 2.0, 2.0]


def test_fit_rejects_degenerate_input():
    with pytest.raises(CalibrationError, match="at least 2"):
        fit_curve([Sample(0.5, 100)])
    with pytest.raises(CalibrationError, match="one utilisation"):
        fit_curve([Sample(0.5, 100), Sample(0.51, 101)])
    # A meter whose counter never advanced reads 0 W everywhere: a curve of zeros made every energy 0 and the DQN's
    # reward scale 0 (a ZeroDivisionError in training, seen once in a loaded CI run)
    with pytest.raises(CalibrationError, match="the meter read no power"):
        fit_curve([Sample(k / 10, 0.0) for k in range(11)])


def test_a_node_curve_must_draw_something_busy_a_gpu_curve_may_not():
    from joulesched.power.curves import validate_curve

    with pytest.raises(ValueError, match="0 W at full load"):
        validate_curve([0.0] * 11)
    assert validate_curve([0.0] * 11, busy_draw=False) == (0.0,) * 11  # the GPUs of a node that has none
    assert validate_curve([0.0] + [10.0] * 10)[0] == 0.0  # an idle of 0 W is a curve


@pytest.mark.parametrize("samples", [
    [Sample(0.0, 100), Sample(0.06, 106)],  # two noisy samples: 9 of 11 knots would be made up
    [Sample(0.30, 150), Sample(0.36, 160), Sample(0.33, 140)],
    [Sample(u / 100, 50 + u) for u in range(0, 46, 5)],  # dense, but over 45 % only
])
def test_fit_refuses_samples_that_do_not_cover_the_curve(samples):
    with pytest.raises(CalibrationError, match="too little to fit a power curve to.*--allow-extrapolation"):
        fit_curve(samples)
    assert len(fit_curve(samples, allow_extrapolation=True).curve) == 11


def test_fit_allows_two_unmeasured_steps_not_three():
    fit = fit_curve([Sample(u / 100, 50 + u) for u in range(20, 101, 5)])  # a busy host never below 20 %
    assert fit.unsupported_knots == (0, 1) and fit.curve == pytest.approx([50 + 10 * k for k in range(11)], abs=0.5)
    with pytest.raises(CalibrationError, match=r"leave 3 of 11 load steps \(0%, 10%, 20%\)"):
        fit_curve([Sample(u / 100, 50 + u) for u in range(30, 101, 5)])


def _csv(tmp_path, text):
    p = tmp_path / "samples.csv"
    p.write_text(text)
    return p


@pytest.mark.parametrize("text, message", [
    ("u,w\n0.1,100\n", "needs a header with columns utilization,watts"),
    ("utilization,watts\n0.1,100\n0.5,abc\n", "samples.csv:3: utilization and watts must be numbers"),
    ("utilization,watts\n0.1,100\n55,200\n", "samples.csv:3: utilization 55.0 is not a fraction"),
    ("utilization,watts\n0.1,-4\n", "samples.csv:2: watts -4.0 must be finite"),
    ("utilization,watts\n0.1,nan\n", "must be finite"),
    ("", "needs a header"),
    ("utilization,watts\n0.1,100\n0.2,110,5\n", "samples.csv:3: 3 cell(s) where the header has 2"),  # was read
    ("utilization,watts\n0.1\n", "samples.csv:2: 1 cell(s) where the header has 2"),
    ("utilization,watts,watts\n0.1,100,1\n", "column(s) watts given twice"),  # was "got '0.1', None"
])
def test_bad_sample_files_say_where(tmp_path, text, message):
    import re

    with pytest.raises(CalibrationError, match=re.escape(message)):
        read_samples_csv(_csv(tmp_path, text))


def test_cli_from_samples_writes_an_includable_node_group(tmp_path):
    rows = "".join(f"{s.utilization:.4f},{s.watts:.3f}\n" for s in _noisy_samples(TRUE, n=200))
    csv_path = _csv(tmp_path, "Utilization, Watts\n" + rows)
    out = tmp_path / "node-profile.yaml"
    r = runner.invoke(app, ["power", "calibrate", "--from-samples", str(csv_path), "--out", str(out),
                            "--name-prefix", "x3550", "--cpu-m", "24000", "--memory-mib", "65536"])
    assert r.exit_code == 0, r.output
    assert "RMSE" in r.output
    group = yaml.safe_load(out.read_text())
    assert list(group) == ["name_prefix", "count", "cpu_m", "memory_mib", "max_pods", "power_watts"]
    assert group["name_prefix"] == "x3550" and group["cpu_m"] == 24000 and len(group["power_watts"]) == 11
    assert max(abs(a - b) for a, b in zip(group["power_watts"], TRUE)) < 2.5
    assert "fit over 200 samples" in out.read_text()

    # The scenario loader (cluster/) includes it as a node group.
    from joulesched.cluster.scenario import load_scenario

    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"name: calibrated\nseed: 1\nduration_s: 60\nnodes:\n  - include: {out.name}\n    count: 3\n"
                        "workload:\n  synthetic: {pods: 5, mean_interarrival_s: 1}\n")
    sc = load_scenario(scenario)
    assert sc.nodes[0].count == 3 and sc.nodes[0].curve == tuple(group["power_watts"])


def test_cli_json_is_the_fit_and_the_profile_written(tmp_path):
    # A straight line measured from 20 to 60 %: exact there, the other knots extrapolated and flagged.
    csv_path = _csv(tmp_path, "utilization,watts\n" + "".join(f"{u / 100},{50 + u}\n" for u in range(20, 61, 5)))
    out = tmp_path / "node-profile.yaml"
    r = runner.invoke(app, ["power", "calibrate", "--from-samples", str(csv_path), "--out", str(out),
                            "--name-prefix", "line", "--cpu-m", "4000", "--memory-mib", "8192", "--json",
                            "--allow-extrapolation"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["profile"] == str(out) and doc["source"] == f"samples from {csv_path}" and doc["samples"] == 9
    assert doc["rmse_w"] < 0.5 and doc["mape_pct"] < 0.5 and doc["max_abs_w"] < 1.0
    assert [k["utilization_pct"] for k in doc["knots"]] == list(range(0, 101, 10))
    assert [k["watts"] for k in doc["knots"]] == pytest.approx([50 + 10 * k for k in range(11)], abs=0.5)
    assert [k["utilization_pct"] for k in doc["knots"] if k["extrapolated"]] == [0, 10, 70, 80, 90, 100]
    assert doc["node_group"] == yaml.safe_load(out.read_text())


def test_cli_bad_input_exits_2_and_leaves_the_old_profile(tmp_path):
    out = tmp_path / "node-profile.yaml"
    out.write_text("old: profile\n")
    bad = _csv(tmp_path, "utilization,watts\n0.2,100\n1.5,120\n")
    r = runner.invoke(app, ["power", "calibrate", "--from-samples", str(bad), "--out", str(out)])
    assert r.exit_code == 2
    assert "error:" in r.output and "not a fraction" in r.output
    assert out.read_text() == "old: profile\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node-profile.yaml", "samples.csv"]  # no temp left

    r = runner.invoke(app, ["power", "calibrate", "--from-samples", str(tmp_path / "missing.csv")])
    assert r.exit_code == 2 and "file not found" in r.output
    r = runner.invoke(app, ["power", "calibrate", "--from-samples", str(bad), "--out", str(tmp_path / "no/dir.yaml")])
    assert r.exit_code == 2


@pytest.mark.parametrize("samples, extra, words", [
    # Samples of absurd watts fitted a curve validate_curve refused: a ValueError traceback (a review).
    ("".join(f"{u / 10},{1e300 if u == 5 else 100 + u}\n" for u in range(11)), [], "the fitted curve is not a node's"),
    # Sizes a scenario refuses were written (exit 0), for every scenario including the profile to fail.
    ("".join(f"{u / 10},{100 + u}\n" for u in range(11)), ["--count", "10000000"],
     "would be refused by a scenario: count"),
    ("".join(f"{u / 10},{100 + u}\n" for u in range(11)), ["--cpu-m", "99999999999999"],
     "would be refused by a scenario: cpu_m"),
    # The model meter's options with nothing to measure were silently ignored.
    ("".join(f"{u / 10},{100 + u}\n" for u in range(11)), ["--curve", "nope"], "--from-samples measures nothing"),
    ("".join(f"{u / 10},{100 + u}\n" for u in range(11)), ["--name-prefix", "Bad_Name"],
     "would be refused by a scenario: name_prefix"),
])
def test_cli_refuses_what_no_scenario_would_read(tmp_path, samples, extra, words):
    src = _csv(tmp_path, "utilization,watts\n" + samples)
    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["power", "calibrate", "--from-samples", str(src), "--out", str(out), *extra])
    assert r.exit_code == 2 and words in " ".join(r.output.split()) and "Traceback" not in r.output, r.output
    assert not out.exists()


def test_a_curve_of_switches_or_words_is_refused():
    from joulesched.power.curves import validate_curve

    for bad in ([True] + [70.0] * 10, ["70"] * 11):  # float() read them as 1 W and 70 W
        with pytest.raises(ValueError, match="points are numbers of watts"):
            validate_curve(bad)


def test_cli_refuses_too_few_samples_with_exit_2_unless_extrapolation_is_allowed(tmp_path):
    few = _csv(tmp_path, "utilization,watts\n0,100\n0.06,106\n")
    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["power", "calibrate", "--from-samples", str(few), "--out", str(out)])
    assert r.exit_code == 2 and "too little to fit a power curve" in r.output, r.output
    assert "Traceback" not in r.output and not out.exists()
    r = runner.invoke(app, ["power", "calibrate", "--from-samples", str(few), "--out", str(out),
                            "--allow-extrapolation", "--json"])
    assert r.exit_code == 0, r.output
    assert sum(k["extrapolated"] for k in json.loads(r.stdout)["knots"]) == 9
    assert "extrapolated at 20%" in out.read_text()


def test_cli_live_calibration_needs_a_hardware_meter(tmp_path):
    r = runner.invoke(app, ["power", "calibrate", "--powercap-root", str(tmp_path / "none"),
                            "--dev-root", str(tmp_path / "none"), "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2
    assert "no hardware meter" in r.output and "--from-samples" in r.output
    assert not (tmp_path / "p.yaml").exists()


def test_measure_steps_and_fit_recover_the_hosts_curve(powercap, proc, clock):
    """The step loop against a simulated host whose package draws TRUE(u) watts at utilisation u: the
    measured samples and the fit must give back TRUE, through a counter wrap."""
    from joulesched.power.burner import measure
    from joulesched.power.powercap import PowercapMeter

    powercap.add("intel-rapl:0", "package-0", energy_uj=262_143_328_850 - 100_000_000)
    powercap.add("intel-rapl:0:0", "core")
    host = {"duty": 0.0}

    class FakeBurner:
        def __init__(self, workers):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def set_duty(self, duty):
            host["duty"] = duty

    def sleep(seconds):
        ticks = round(seconds * 200)  # 2 CPUs at 100 Hz
        busy = round(ticks * host["duty"])
        proc.tick(user=busy, idle=ticks - busy)
        powercap.advance("intel-rapl:0", round(interp(TRUE, busy / ticks) * seconds * 1e6))
        powercap.advance("intel-rapl:0:0", 1_000)  # not primary: must not count
        clock.advance(seconds)

    samples = measure(PowercapMeter(str(powercap.root), clock=clock), step_s=2, settle_s=1, sample_s=0.5,
                      proc_root=str(proc.root), clock=clock, sleep=sleep, burner=FakeBurner)
    assert len(samples) == 11 * 4
    assert [round(s.utilization, 2) for s in samples[::4]] == [k / 10 for k in range(11)]
    fit = fit_curve(samples)
    assert fit.curve == pytest.approx(TRUE, abs=0.01) and fit.rmse_w < 0.01


@pytest.mark.slow
def test_live_calibration_with_the_burner(tmp_path):
    """The real burner against the model meter on the real /proc. Each sample pairs the utilisation /proc/stat
    measured with the model's watts over the same interval, so wherever samples landed (other load on a
    shared machine moves them) the fit must reproduce the model curve; and full duty must load the machine."""
    out = tmp_path / "p.yaml"
    name = "ibm-x3250-x3470"
    r = runner.invoke(app, ["power", "calibrate", "--meter", "model", "--curve", name, "--step-seconds", "0.3",
                            "--settle-seconds", "0.1", "--sample-seconds", "0.15", "--out", str(out)],
                      catch_exceptions=False)
    if r.exit_code == 2 and "nothing to fit" in r.output:
        pytest.skip("other processes kept the host at one utilisation at every step; nothing to fit")
    assert r.exit_code == 0, r.output
    assert "smoke test" in r.output
    top = float(r.output.split("load 100%:")[1].split("%")[0])
    assert top > 80, f"full duty reached only {top} % CPU"
    text = out.read_text()
    group = yaml.safe_load(text)
    rmse = float(text.split("RMSE ")[1].split(" W")[0])
    assert rmse < 3.0, text
    extrapolated = set()
    if "extrapolated at" in text:
        extrapolated = {int(p.strip().rstrip("%.")) // 10
                        for p in text.split("extrapolated at ")[1].split("\n")[0].split(",")}
    # Loose: at 0.15 s samples one scheduler tick of skew between the meter's and the calibrator's reads of
    # /proc/stat is ~3 % utilisation, and a knot reached by one sample only is pulled by its neighbours.
    for k in set(range(11)) - extrapolated:
        assert group["power_watts"][k] == pytest.approx(SPECPOWER[name][k], abs=8.0), (k, text)
