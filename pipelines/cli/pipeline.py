"""`joulesched pipeline`: one command that (calibrates,) trains and benchmarks, on the twin or on a cluster.

    joulesched pipeline [--env sim] [--model M | --minutes N] [--node-profile P] --out DIR
    joulesched pipeline --env kube (--stack NAME | --kubeconfig K --prometheus URL --target URL) --out DIR
    ... [--hosts INVENTORY] [--calibrate]      host-side steps over SSH (fabric; keys only, host keys checked)

Every stage is resumable: a re-run skips stages whose outputs exist and whose inputs are unchanged. Ctrl-C
stops the running stage cleanly (a cluster run deletes its pods first), leaves DIR consistent and exits 130.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from joulesched.pipelines.cli.common import command_line, errors, float_option, interrupted, out
from joulesched.pipelines.cli.common import fail as _fail
from joulesched.pipelines.progress import StageDisplay
from joulesched.pipelines.suite import standard_suite


class Env(str, Enum):
    sim = "sim"
    kube = "kube"


@contextlib.contextmanager
def _kubeconfig_file(content: str) -> Iterator[str]:
    """A stack's inline kubeconfig as a private file (0600) that lives only as long as the run."""
    fd, path = tempfile.mkstemp(prefix="joulesched-kubeconfig-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(content)
        yield path
    finally:
        os.unlink(path)


#: Options that only one --env reads (given with the other they would do nothing), and those of --sleep.
_KUBE_ONLY = ("kubeconfig", "context", "prometheus", "target", "load_seconds", "pods", "policy", "load_driver",
              "start_scheduler", "energy_selector", "energy_source", "sleep", "sleep_actuator", "sleep_after")
_SIM_ONLY = ("seeds", "jobs")
_SLEEP_ONLY = ("sleep_actuator", "sleep_after")


def _given(ctx: typer.Context, names: tuple[str, ...]) -> list[str]:
    """The options among ``names`` given on the command line, as their flags."""
    flags = {p.name: p.opts[0] for p in ctx.command.params}
    # By the source's name: typer vendors its own click, whose ParameterSource is not click's.
    return [flags[n] for n in names
            if getattr(ctx.get_parameter_source(n), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")]


def pipeline(
    ctx: typer.Context,
    env: Annotated[Env, typer.Option(help="Where to run: the embedded twin (sim) or a real cluster (kube).")] = Env.sim,
    scenario: Annotated[Optional[list[Path]], typer.Option(
        "--scenario", "-s", help="Scenario YAML (repeatable). Default: the standard suite in scenarios/.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output folder (resumable).")] = Path("out/pipeline"),
    model: Annotated[Optional[Path], typer.Option(help="Model to load; trained into it when missing.")] = None,
    train_scenario: Annotated[Optional[list[Path]], typer.Option(
        help="Scenarios to train on (default: the benchmark scenarios).")] = None,
    minutes: Annotated[Optional[float], float_option(help="Training budget in wall-clock minutes.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training budget in decisions.")] = None,
    seeds: Annotated[int, typer.Option(min=1, help="Benchmark seeds per scenario.")] = 1,
    jobs: Annotated[int, typer.Option(min=1, help="Benchmark worker processes.")] = 1,
    node_profile: Annotated[Optional[Path], typer.Option(
        help="Calibrated node profile (`joulesched power calibrate`) applied to every scenario's nodes.")] = None,
    force: Annotated[bool, typer.Option(help="Re-run every stage even if its inputs are unchanged.")] = False,
    stack: Annotated[Optional[str], typer.Option(
        help="Read the environment from this Pulumi stack's outputs (kubeconfig, Prometheus, test app, SSH "
             "hosts); explicit options override them. Needs the pulumi CLI.")] = None,
    hosts: Annotated[Optional[Path], typer.Option(
        help="Ansible inventory of the hosts for host-side steps over SSH (calibration, exporter check, logs).")] = None,
    limit: Annotated[str, typer.Option(
        help="Inventory hosts/groups to use (Ansible pattern). Default: power_hosts, where site.yml installs the "
             "exporter (not the load generators).")] = "power_hosts",
    known_hosts: Annotated[Optional[Path], typer.Option(
        help="known_hosts file the hosts' keys are checked against (default: ~/.ssh/known_hosts).")] = None,
    ssh_key: Annotated[Optional[Path], typer.Option(
        help="Private key for hosts without ansible_ssh_private_key_file (default: your agent and ~/.ssh keys).")] = None,
    calibrate: Annotated[bool, typer.Option(
        help="Measure each host's power curve first (`joulesched power calibrate` there, over SSH) and train "
             "and benchmark the twin on those curves.")] = False,
    calibrate_step_seconds: Annotated[float, float_option(min=0.05, help="Seconds per 10 % load step.")] = 10.0,
    collect_logs: Annotated[bool, typer.Option(help="Fetch the hosts' exporter and scheduler journals at the end.")] = True,
    kubeconfig: Annotated[Optional[Path], typer.Option(help="kube: kubeconfig of the cluster.")] = None,
    context: Annotated[Optional[str], typer.Option(help="kube: kubeconfig context (default: current).")] = None,
    prometheus: Annotated[Optional[str], typer.Option(
        help="kube: URL of the Prometheus that scrapes the power exporter.")] = None,
    target: Annotated[Optional[str], typer.Option(help="kube: URL of the test app's Service to drive load at.")] = None,
    load_seconds: Annotated[int, typer.Option(min=1, help="kube: seconds of load per policy.")] = 30,
    pods: Annotated[int, typer.Option(min=1, help="kube: pods created per policy.")] = 4,
    policy: Annotated[Optional[list[str]], typer.Option(
        "--policy", "-p", help="kube: policy to measure (repeatable). default-k8s runs under kube-scheduler, "
        "any other under `joulesched serve --policy P`. Default: the default set (`joulesched policies --long`), "
        "and the DQN when --model or a training budget is given.")] = None,
    load_driver: Annotated[str, typer.Option(help="kube: locust or jmeter.")] = "locust",
    start_scheduler: Annotated[bool, typer.Option(
        help="kube: run `joulesched serve --policy P` here for each policy (else one already runs in the cluster).")] = True,
    energy_selector: Annotated[Optional[str], typer.Option(
        help="kube: PromQL series summed for node energy (default: the exporter's RAPL packages + DRAM, or the "
             "model's platform, and its GPUs; a selector given here is summed as it is, GPUs only if it "
             "matches joulesched_node_gpu_joules_total).")] = None,
    energy_source: Annotated[str, typer.Option(
        help="kube: where node energy comes from: joulesched (the power exporter, --energy-selector) or kepler "
             "(Kepler 0.11's package+DRAM, GPU and platform metrics; docs/power.md).")] = "joulesched",
    sleep: Annotated[bool, typer.Option(
        "--sleep", help="kube: run the node power controller beside the scheduler for every policy (idle nodes "
        "sleep, pending pods wake them); the report shows the nodes awake over time.")] = False,
    sleep_actuator: Annotated[str, typer.Option(
        help="kube, with --sleep: the controller's actuator (none, auto, libvirt, redfish, ipmi, wol, aws, "
             "metal3, rufio).")] = "none",
    sleep_after: Annotated[float, float_option(
        min=0.0, help="kube, with --sleep: seconds a node must be empty before it sleeps.")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results' summary as JSON on stdout (the "
                                          "progress stays on stderr).")] = False,
) -> None:
    """Calibrate (optional), train or load the DQN, benchmark it against every baseline and the bound, report.

    With --env kube: each policy in turn deploys pods, drives load, reads energy from Prometheus, tears down."""
    if minutes is not None and steps is not None:
        _fail("give at most one of --minutes and --steps")
    if sleep and env is not Env.kube:
        _fail("--sleep runs the node power controller on a cluster: it needs --env kube (in the twin, sleep is "
              "the scenario's idle_policy)")
    # Options the chosen --env does not read: given anyway they would be silently ignored.
    if env is not Env.kube and (kube_only := _given(ctx, _KUBE_ONLY)):
        _fail(f"{', '.join(kube_only)} {'is' if len(kube_only) == 1 else 'are'} for --env kube; the twin "
              "(--env sim) benchmarks the default policy set and the DQN")
    if env is Env.kube:
        if sim_only := _given(ctx, _SIM_ONLY):
            _fail(f"{', '.join(sim_only)} {'is' if len(sim_only) == 1 else 'are'} for --env sim; a cluster run "
                  "measures each policy once")
        if not sleep and (sleep_only := _given(ctx, _SLEEP_ONLY)):
            _fail(f"{', '.join(sleep_only)} {'is' if len(sleep_only) == 1 else 'are'} for --sleep")
        if node_profile is not None and model is None and minutes is None and steps is None:
            _fail("--node-profile on a cluster is what the DQN trains on: give --minutes or --steps (or --model "
                  "to train into)")
    if load_driver not in ("locust", "jmeter"):
        _fail(f"--load-driver must be locust or jmeter, not {load_driver!r}")
    environment = None
    if stack:
        from joulesched.infra.stack import StackError, stack_outputs
        from joulesched.infra.stack import environment as read_environment

        try:
            environment = read_environment(stack, stack_outputs(stack))
        except StackError as e:
            _fail(str(e))
    if calibrate and node_profile is not None:
        _fail("give --calibrate (measure the hosts now) or --node-profile (measured before), not both")
    host_list = None
    if hosts is not None or calibrate:
        from joulesched.pipelines.host_steps import resolve_hosts

        with errors():
            host_list = resolve_hosts(hosts, limit if hosts is not None else None, environment, ssh_key)
    with contextlib.ExitStack() as stack_ctx:
        if env is Env.kube:
            if environment is not None:
                if kubeconfig is None and environment.kubeconfig_content:
                    kubeconfig = Path(stack_ctx.enter_context(_kubeconfig_file(environment.kubeconfig_content)))
                kubeconfig = kubeconfig or (Path(environment.kubeconfig) if environment.kubeconfig else None)
                context = context or environment.kube_context
                prometheus = prometheus or environment.prometheus_url
                target = target or environment.target_url
                if kubeconfig is None:  # the stack names a context in the user's own kubeconfig
                    default = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]).expanduser()
                    kubeconfig = default if default.is_file() else None
            _pipeline_kube(out_dir, kubeconfig=kubeconfig, context=context, prometheus=prometheus, target=target,
                           load_seconds=load_seconds, pods=pods, policy=policy, load_driver=load_driver,
                           start_scheduler=start_scheduler, energy_selector=energy_selector,
                           energy_source=energy_source, force=force,
                           model=model, minutes=minutes, steps=steps, scenario=scenario,
                           train_scenario=train_scenario, hosts=host_list, known_hosts=known_hosts,
                           calibrate=calibrate, calibrate_step_seconds=calibrate_step_seconds,
                           collect_logs=collect_logs, stack=stack, node_profile=node_profile, as_json=as_json,
                           sleep={"actuator": sleep_actuator, "sleep_after_s": sleep_after} if sleep else None)
            return
        _pipeline_sim(out_dir, scenario=scenario, model=model, train_scenario=train_scenario, minutes=minutes,
                      steps=steps, seeds=seeds, jobs=jobs, node_profile=node_profile, force=force, hosts=host_list,
                      known_hosts=known_hosts, calibrate=calibrate, calibrate_step_seconds=calibrate_step_seconds,
                      collect_logs=collect_logs, as_json=as_json)


def _host_stages(out_dir: Path, hosts, known_hosts, calibrate: bool, step_seconds: float, force: bool, show):
    """The host-side stages before a run: the exporter check, and calibration (returns the node profile)."""
    from joulesched.pipelines.host_steps import calibrate_hosts, check_exporters

    check_exporters(out_dir, hosts, known_hosts, on_event=show.event)
    if calibrate:
        return calibrate_hosts(out_dir, hosts, known_hosts, step_seconds=step_seconds, force=force,
                               on_event=show.event)
    return None


def _pipeline_sim(out_dir: Path, *, scenario, model, train_scenario, minutes, steps, seeds, jobs, node_profile,
                  force, hosts, known_hosts, calibrate, calibrate_step_seconds, collect_logs, as_json=False) -> None:
    from joulesched.pipelines.cli.bench import print_summary
    from joulesched.pipelines.sim_pipeline import run_sim

    with errors(), interrupted(out_dir), StageDisplay() as show:
        if hosts:
            node_profile = _host_stages(out_dir, hosts, known_hosts, calibrate, calibrate_step_seconds, force,
                                        show) or node_profile
        doc = run_sim(scenario or standard_suite(), out_dir, model=model, train_scenarios=train_scenario,
                      minutes=minutes, steps=steps, seeds=seeds, jobs=jobs, node_profile=node_profile,
                      force=force, command=command_line(), **show.callbacks())
        if hosts and collect_logs:
            from joulesched.pipelines.host_steps import collect_host_logs

            collect_host_logs(out_dir, hosts, known_hosts, on_event=show.event)
    print_summary(doc, as_json, out_dir)


def _pipeline_kube(out_dir: Path, *, kubeconfig: Optional[Path], context: Optional[str], prometheus: Optional[str],
                   target: Optional[str], load_seconds: int, pods: int, policy: Optional[list[str]],
                   load_driver: str, start_scheduler: bool, energy_selector: Optional[str], energy_source: str,
                   force: bool,
                   model: Optional[Path], minutes: Optional[float], steps: Optional[int],
                   scenario: Optional[list[Path]], train_scenario: Optional[list[Path]], hosts, known_hosts,
                   calibrate: bool, calibrate_step_seconds: float, collect_logs: bool, stack: Optional[str],
                   sleep: Optional[dict] = None, node_profile: Optional[Path] = None, as_json: bool = False) -> None:
    from joulesched.pipelines.kube_pipeline import run_kube
    from joulesched.power.energy_sources import energy_source as source_named

    if energy_selector and energy_source != "joulesched":
        _fail(f"--energy-selector and --energy-source {energy_source} both say where energy comes from; give one")
    with errors():
        source = source_named(energy_source)
    missing = [o for o, v in (("--kubeconfig", kubeconfig), ("--prometheus", prometheus), ("--target", target)) if not v]
    if missing:
        via = f" (stack {stack} does not export them)" if stack else ""
        _fail(f"--env kube needs {', '.join(missing)}{via}")
    if calibrate and model is None and minutes is None and steps is None:
        _fail("--calibrate on a cluster trains the DQN on the measured curves: give --minutes or --steps")
    command = command_line()
    try:
        with errors(), interrupted(out_dir), StageDisplay() as show:
            if hosts:  # (--calibrate and --node-profile together were refused)
                node_profile = _host_stages(out_dir, hosts, known_hosts, calibrate, calibrate_step_seconds, force,
                                            show) or node_profile
            from joulesched.agent.registry import DEFAULT_POLICIES

            policies = list(policy or DEFAULT_POLICIES)
            if model is not None or minutes is not None or steps is not None:
                model_path = _train_for_cluster(out_dir, model, minutes, steps, scenario, train_scenario,
                                                node_profile, force, show)
                spec = f"dqn={model_path}"
                if not any(p.startswith("dqn=") for p in policies):  # the model it trained is measured too
                    policies.append(spec)
            doc = run_kube(out_dir, kubeconfig=str(kubeconfig), prometheus_url=prometheus or "", target=target or "",
                           policies=policies, pods=pods, load_seconds=load_seconds, driver=load_driver,  # type: ignore[arg-type]
                           command=command, start_scheduler=start_scheduler, kube_context=context, force=force,
                           **({"energy_selector": energy_selector or source}
                              if energy_selector or energy_source != "joulesched" else {}),
                           **({"sleep": sleep} if sleep is not None else {}),
                           on_event=show.event, on_plan=show.plan)
            if hosts and collect_logs:
                from joulesched.pipelines.host_steps import collect_host_logs

                collect_host_logs(out_dir, hosts, known_hosts, on_event=show.event)
    except Exception as e:  # the cluster, Prometheus or the load driver failed mid-run: one line, exit 1
        from kubernetes.client.rest import ApiException
        from prometheus_api_client import PrometheusApiClientException
        from requests import RequestException

        from joulesched.workloads.load.results import DriverError

        if not isinstance(e, (ApiException, PrometheusApiClientException, RequestException, DriverError)):
            raise
        what = f"{e.status} {e.reason}" if isinstance(e, ApiException) else str(e)
        _fail(f"kube pipeline failed: {what}", 1)
    if as_json:
        from joulesched.pipelines.cli.bench import print_summary

        print_summary(doc, True, out_dir)
        return
    for name, s in doc.summary.items():
        # Names are the user's text, not rich markup (a `dqn=/m/[/x].pt` spec raised MarkupError after the run).
        t = Table(title=f"{escape(name)} (measured on a real cluster)", title_justify="left")
        for col in ("policy", "joules", "×default", "errors", "p99 ms", "unplaced"):
            t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
        for p, r in s.policies.items():
            vs = r.energy_vs_default
            t.add_row(escape(p), f"{r.energy_joules:.1f}", "—" if vs is None else f"{vs:.3f}",
                      f"{100 * r.slo_violation_rate:.2f}%", f"{r.latency_p99_ms:.1f}", f"{r.unschedulable_pods:g}")
        out.print(t)
    out.print(f"results: {escape(str(out_dir / 'results.json'))}   report: {escape(str(out_dir / 'report.html'))}")


def _train_for_cluster(out_dir: Path, model: Optional[Path], minutes, steps, scenario, train_scenario,
                       node_profile: Optional[Path], force: bool, show) -> Path:
    """The model the cluster run measures: loaded, or trained on the twin (on the hosts' measured curves when
    --calibrate ran: sim-to-real, closed) as a resumable stage."""
    from joulesched.pipelines.sim_pipeline import train_stage

    return train_stage(out_dir, model=model, minutes=minutes, steps=steps,
                       scenarios=list(train_scenario or scenario or standard_suite()), node_profile=node_profile,
                       force=force, on_event=show.event, on_train=show.train)
