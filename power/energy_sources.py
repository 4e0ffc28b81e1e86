"""Where node energy comes from in Prometheus: the joulesched exporter's counters, or a Kepler preset.

An :class:`EnergySource` is the one definition of a source's PromQL: the joules a whole cluster used over a
window (the kube pipeline's meter), each node's watts (``serve``'s power feed, the report's plots), and the
series whose scrapes say the window's end is in. ``--energy-source NAME`` picks one (:func:`energy_source`).

**joulesched** (``joulesched``, the default). A node's energy is its RAPL packages and DRAM (or the model
meter's ``platform`` zone) from ``joulesched_node_joules_total``, plus every GPU's
``joulesched_node_gpu_joules_total`` (the NVML meter; boards are disjoint from the CPU zones), as Kepler's
package + DRAM + GPU below. The two families carry different labels (``zone`` against ``gpu``), so ``or``
unites their series and the sum counts each once; a node without GPUs has only the CPU series.

**Kepler 0.11** (``kepler``). Node metrics carry the constant label ``node_name``; the ones read are

- ``kepler_node_cpu_joules_total{zone, path}``: RAPL zones ``package``, ``core``, ``uncore``, ``dram``,
  ``psys``. Only ``package`` and ``dram`` are summed: ``core`` and ``uncore`` are parts of a package, ``psys``
  (the platform's SoC domain) contains the packages and DRAM, so adding any of them counts joules twice. Several
  series of one zone (sockets, told apart by ``path``) are disjoint and are summed.
- ``kepler_node_gpu_joules_total{gpu, gpu_uuid}``: each GPU's board energy, summed over GPUs.
- ``kepler_platform_watts{bmc_id, chassis_id, power_control_id}`` (a gauge read from the BMC over Redfish):
  one series per PowerControl entry, and a BMC may list the whole server *and* its CPU or memory subsystems.
  Per chassis the largest entry is taken (the server's total bounds each of its subsystems), then chassis are
  summed. ``bmc_id`` is the BMC's key in Kepler's Redfish configuration (nodes map to BMC keys), and every
  node mapped to one BMC reports that BMC's readings: VMs on one bare-metal host all report the host's
  platform watts (Kepler's EP-001, "Multiple VMs on the same bare metal to report the same platform power").

Per node, the platform reading wins where there is one: it measures the whole machine (CPUs, DRAM, GPUs,
fans, power-supply losses), which contains the CPU and GPU counters, so it is never added to them. Elsewhere
a node's energy is package + DRAM + GPU (or whichever of the two it has). A node's watts (``node_watts``) are
its host's platform watts where it has them, so VMs sharing a host each read the whole host. The cluster's
joules (:meth:`EnergySource.joules`) count each BMC's chassis once, however many nodes report it (summing the
nodes counted a host once per VM), plus package + DRAM + GPU of the nodes with no platform reading. The
platform gauge's energy over a window is its mean over the window times the part of the window it was
reported in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from joulesched.core.errors import UsageError
from joulesched.power.meter import NODE_ZONES

#: Whole-node energy without double counting (:data:`~joulesched.power.meter.NODE_ZONES`): RAPL packages and DRAM,
#: or the model meter's platform zone. Hosts with psys only: pass another selector.
ENERGY_METRIC = f'joulesched_node_joules_total{{zone=~"{NODE_ZONES}"}}'
#: Each GPU's energy (the NVML meter), added to :data:`ENERGY_METRIC` by the ``joulesched`` source.
GPU_ENERGY_METRIC = "joulesched_node_gpu_joules_total"

KEPLER_NODE_LABEL = "node_name"
KEPLER_CPU = 'kepler_node_cpu_joules_total{zone=~"package.*|dram.*"}'
KEPLER_GPU = "kepler_node_gpu_joules_total"
KEPLER_PLATFORM = "kepler_platform_watts"
#: How finely the Kepler preset's energy counts the part of its window a node reported platform watts in.
PLATFORM_STEPS = 100


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


@dataclass(frozen=True)
class EnergySource:
    """PromQL for one source, over a range ``w`` (``"60000ms"``): ``node_joules(w)`` the joules of each series
    (summed for the cluster), ``node_watts(w)`` one series of watts per node, labelled ``node_label``; ``fresh``
    the series whose newest timestamp shows what has been scraped."""

    name: str
    node_label: str
    fresh: str
    node_joules: Callable[[str], str]
    node_watts: Callable[[str], str]
    #: The cluster's joules over ``w`` (sum included) where they are not the sum of ``node_joules``: Kepler's,
    #: whose nodes on one BMC all report its platform watts. None: ``sum(node_joules(w))``.
    cluster_joules: Callable[[str], str] | None = None

    def joules(self, window_s: float) -> str:
        """The cluster's joules over the ``window_s`` seconds before the evaluation time."""
        w = _ms(window_s)
        return self.cluster_joules(w) if self.cluster_joules is not None else f"sum({self.node_joules(w)})"

    def watts(self, rate_window_s: float, label: str | None = None) -> str:
        """Each node's watts (``rate_window_s`` must span two scrapes), with the node's name in ``label``
        (default: the source's own node label)."""
        q = self.node_watts(_ms(rate_window_s))
        if label and label != self.node_label:
            q = f'label_replace({q}, "{label}", "$1", "{self.node_label}", "(.+)")'
        return q


def selector_source(selector: str) -> EnergySource:
    """A source of cumulative joule counters (``*_joules_total``) matched by ``selector``: energy is
    ``sum(increase(SELECTOR[W]))``, watts ``sum by (node, instance) (rate(SELECTOR[W]))``."""
    return EnergySource(f"selector:{selector}", "node", selector, lambda w: f"increase({selector}[{w}])",
                        lambda w: f"sum by (node, instance) (rate({selector}[{w}]))")


def _kepler_parts(fn: str, w: str) -> str:
    """Each node's package + DRAM + GPU (or whichever it has) by ``fn`` (increase or rate) over ``w``."""
    by = f"sum by ({KEPLER_NODE_LABEL})"
    cpu = f"{by} ({fn}({KEPLER_CPU}[{w}]))"
    gpu = f"{by} ({fn}({KEPLER_GPU}[{w}]))"
    return f"({cpu} + {gpu}) or {cpu} or {gpu}"


def _kepler(fn: str, w: str) -> str:
    """Kepler's per-node energy (``fn`` = increase) or power (``fn`` = rate) over ``w`` (module docstring)."""
    by = f"sum by ({KEPLER_NODE_LABEL})"
    watts = f"avg_over_time({KEPLER_PLATFORM}[{w}])"
    ms = int(w.removesuffix("ms"))
    if fn == "increase":
        # Watts averaged over the samples there are, times the time the node reported them: a node asleep or
        # gone for part of the window has no samples then (a failed scrape marks its series stale), and
        # multiplying by the whole window charged it its awake watts throughout. The share of the window it
        # reported is counted on a subquery of PLATFORM_STEPS steps.
        step = max(1, -(-ms // PLATFORM_STEPS))
        watts = f"({watts} * clamp_max(count_over_time({KEPLER_PLATFORM}[{w}:{step}ms]) / {ms / step:g}, 1))"
    platform = f"{by} (max by ({KEPLER_NODE_LABEL}, chassis_id) ({watts}))"
    if fn == "increase":  # watts times the window's seconds (scaled above by the share reported)
        platform = f"({platform} * {ms / 1000:g})"
    return f"({platform} or {_kepler_parts(fn, w)})"


def _kepler_cluster(w: str) -> str:
    """The cluster's joules over ``w``: every BMC chassis once, plus the parts of the nodes without a platform
    reading. Nodes mapped to one BMC (VMs on one host) report the same chassis, each: the largest reading of a
    (bmc_id, chassis_id) at each step is the chassis (its server entry, as per node), and its energy is that
    series' mean times the part of the window in which some node reported it (a VM asleep while another on its
    host still reports does not halve the host). The two vectors carry different labels, so ``or`` keeps both."""
    ms = int(w.removesuffix("ms"))
    step = max(1, -(-ms // PLATFORM_STEPS))
    chassis = f"(max by (bmc_id, chassis_id) ({KEPLER_PLATFORM}))[{w}:{step}ms]"
    platform = (f"avg_over_time({chassis}) * clamp_max(count_over_time({chassis}) / {ms / step:g}, 1)"
                f" * {ms / 1000:g}")
    reported = f"count by ({KEPLER_NODE_LABEL}) (count_over_time({KEPLER_PLATFORM}[{w}]))"
    return f"sum(({platform}) or (({_kepler_parts('increase', w)}) unless on ({KEPLER_NODE_LABEL}) {reported}))"


KEPLER = EnergySource("kepler", KEPLER_NODE_LABEL,
                      f'{{__name__=~"kepler_node_cpu_joules_total|{KEPLER_GPU}|{KEPLER_PLATFORM}"}}',
                      lambda w: _kepler("increase", w), lambda w: _kepler("rate", w), _kepler_cluster)


def _joulesched(fn: str, w: str) -> str:
    """The CPU zones' and the GPUs' series of ``fn`` (increase or rate) over ``w``, united (module docstring)."""
    return f"{fn}({ENERGY_METRIC}[{w}]) or {fn}({GPU_ENERGY_METRIC}[{w}])"


# Freshness from the CPU series: every node has them, and the GPUs' come in the same scrape.
JOULESCHED = EnergySource("joulesched", "node", ENERGY_METRIC, lambda w: _joulesched("increase", w),
                          lambda w: f"sum by (node, instance) ({_joulesched('rate', w)})")
SOURCES = {"joulesched": JOULESCHED, "kepler": KEPLER}


def energy_source(name: str) -> EnergySource:
    """The source called ``name`` (:data:`SOURCES`); a bad name raises :class:`UsageError`."""
    try:
        return SOURCES[name]
    except KeyError:
        raise UsageError(f"--energy-source {name!r}: expected one of {', '.join(SOURCES)}") from None
