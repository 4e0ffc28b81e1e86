"""Attribution by the Kepler 0.10 formula on synthetic powercap and /proc trees, with a hand-moved clock."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from joulesched.power.monitor import PowerMonitor, Snapshot
from joulesched.power.powercap import PowercapMeter
from joulesched.power.procfs import PodRef
from tests.support.sysfs import FakeProcess, SyntheticPowercap, SyntheticProc, pod_cgroup_v1, pod_cgroup_v2

UID_A = "11111111-2222-4333-8444-555555555555"
UID_B = "66666666-7777-4888-9999-aaaaaaaaaaaa"
C1, C2, C3 = ("1" * 64), ("2" * 64), ("3" * 64)


def _setup(powercap: SyntheticPowercap, proc: SyntheticProc):
    powercap.add("intel-rapl:0", "package-0")
    powercap.add("intel-rapl:0:0", "core")
    powercap.add("intel-rapl:0:2", "dram")
    proc.add(FakeProcess(100, "plain"))
    proc.add(FakeProcess(200, "app", cgroup=pod_cgroup_v2(UID_A, C1)))
    proc.add(FakeProcess(201, "sidecar", cgroup=pod_cgroup_v2(UID_A, C2)))
    proc.add(FakeProcess(300, "legacy", cgroup=pod_cgroup_v1(UID_B, C3)))
    proc.add(FakeProcess(400, "qemu-system-x86", cmdline=b"/usr/bin/qemu-system-x86_64\0-name\0"
                                                         b"guest=vm-7,debug-threads=on\0-m\0512\0"))


def test_kepler_split_and_shares(powercap, proc, clock):
    _setup(powercap, proc)
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock, top_n=3)
    first = mon.refresh()
    assert all(z.joules_total == 0 for z in first.zones.values())

    clock.advance(2.0)
    powercap.advance("intel-rapl:0", 10_000_000)  # 10 J package
    powercap.advance("intel-rapl:0:0", 6_000_000)  # 6 J core, inside the package
    powercap.advance("intel-rapl:0:2", 2_000_000)  # 2 J dram
    proc.tick(user=50, system=10, idle=30, iowait=10)  # usage ratio 0.6
    for pid, ticks in ((100, 30), (200, 10), (201, 5), (300, 10), (400, 5)):  # 60 ticks in all
        proc.run(pid, utime=ticks - 2, stime=2)
    s = mon.refresh()

    assert s.usage_ratio == pytest.approx(0.6)
    pkg = s.zones["package-0"]
    assert (pkg.joules_total, pkg.active_joules_total, pkg.idle_joules_total) == pytest.approx((10, 6, 4))
    assert pkg.watts == pytest.approx(5.0)
    assert s.zones["core-0"].active_joules_total == pytest.approx(3.6)
    # Workloads share the package's active energy only (6 J), by CPU time, never core or dram on top.
    procs = {p.pid: p.joules_total for p in s.processes}
    assert list(procs) == [100, 200, 300]  # top 3 by energy
    assert procs[100] == pytest.approx(6 * 30 / 60)
    assert s.pods[PodRef(UID_A, C1)].joules_total == pytest.approx(6 * 10 / 60)
    assert s.pods[PodRef(UID_A, C2)].joules_total == pytest.approx(6 * 5 / 60)
    assert s.pods[PodRef(UID_B, C3)].joules_total == pytest.approx(6 * 10 / 60)  # cgroup v1
    assert s.vms["vm-7"].joules_total == pytest.approx(6 * 5 / 60)
    assert s.vms["vm-7"].watts == pytest.approx(6 * 5 / 60 / 2)


def test_idle_node_attributes_nothing(powercap, proc, clock):
    _setup(powercap, proc)
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock)
    mon.refresh()
    clock.advance(1)
    powercap.advance("intel-rapl:0", 5_000_000)
    proc.tick(idle=100)
    s = mon.refresh()
    assert s.zones["package-0"].idle_joules_total == pytest.approx(5.0)
    assert s.processes == () and not s.pods and not s.vms


def test_pid_reuse_and_exit(powercap, proc, clock):
    _setup(powercap, proc)
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock,
                       stale_after_s=5)
    proc.run(100, utime=1000)  # lifetime CPU before the baseline: must not count
    mon.refresh()
    clock.advance(1)
    powercap.advance("intel-rapl:0", 4_000_000)
    proc.tick(user=100)
    proc.run(100, utime=10)
    proc.run(200, utime=10)
    s = mon.refresh()
    assert {p.pid: p.joules_total for p in s.processes} == {100: pytest.approx(2), 200: pytest.approx(2)}

    # pid 100 exits and its number is reused by a process that started later: a new counter from zero.
    proc.remove(100)
    proc.add(FakeProcess(100, "reused", utime=7, start_time=555))
    proc.remove(200)  # the pod's only process exits: the pod counter stays until stale
    clock.advance(1)
    powercap.advance("intel-rapl:0", 1_000_000)
    proc.tick(user=100)
    s = mon.refresh()
    assert [(p.pid, p.comm, p.joules_total) for p in s.processes] == [(100, "reused", pytest.approx(1.0))]
    assert s.pods[PodRef(UID_A, C1)].joules_total == pytest.approx(2)
    clock.advance(10)
    proc.tick(idle=100)
    assert PodRef(UID_A, C1) not in mon.refresh().pods


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(
    st.integers(0, 50_000_000),  # package µJ
    st.integers(0, 200), st.integers(0, 200), st.integers(0, 200),  # user, idle, iowait ticks
    st.lists(st.integers(0, 300), min_size=5, max_size=5),  # per-process ticks
), min_size=1, max_size=6))
def test_attribution_invariants(tmp_path_factory, steps):
    """Whatever the deltas: active + idle = total, processes share at most the active energy, counters never
    decrease (the package starts just below its wrap point, so most runs cross it)."""
    root = tmp_path_factory.mktemp("t")
    pc, proc = SyntheticPowercap(root / "pc"), SyntheticProc(root / "proc")
    _setup(pc, proc)
    pc.set("intel-rapl:0", 262_143_328_850 - 30_000_000)
    clock = [0.0]
    mon = PowerMonitor(PowercapMeter(str(pc.root)), proc_root=str(proc.root), clock=lambda: clock[0], top_n=100)
    prev = mon.refresh()
    injected = 0
    for uj, user, idle, iowait, ticks in steps:
        clock[0] += 1
        pc.advance("intel-rapl:0", uj)
        injected += uj
        proc.tick(user=user, idle=idle, iowait=iowait)
        for pid, t in zip((100, 200, 201, 300, 400), ticks):
            proc.run(pid, utime=t)
        s = mon.refresh()
        pkg = s.zones["package-0"]
        assert pkg.joules_total == pytest.approx(injected / 1e6)
        assert pkg.active_joules_total + pkg.idle_joules_total == pytest.approx(pkg.joules_total)
        assert sum(p.joules_total for p in s.processes) <= pkg.active_joules_total + 1e-9
        assert sum(e.joules_total for e in s.pods.values()) <= pkg.active_joules_total + 1e-9
        for z, e in s.zones.items():
            old = prev.zones[z]
            assert e.joules_total >= old.joules_total and e.active_joules_total >= old.active_joules_total
            assert e.idle_joules_total >= old.idle_joules_total
        prev = s


def test_snapshot_is_immutable(powercap, proc, clock):
    _setup(powercap, proc)
    s = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock).refresh()
    with pytest.raises(TypeError):
        s.zones["x"] = None  # type: ignore[index]
    with pytest.raises(AttributeError):
        s.usage_ratio = 1.0  # type: ignore[misc]


def test_an_idle_pod_or_vm_keeps_its_series_while_a_process_lives(powercap, proc, clock):
    """Staleness counts from the last process, not the last CPU tick: a pod (or VM) that sits idle for longer than
    ``stale_after_s`` keeps its counter, so it never comes back from zero (increase() would lose its joules)."""
    _setup(powercap, proc)
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock, stale_after_s=5)
    mon.refresh()
    clock.advance(1)
    powercap.advance("intel-rapl:0", 4_000_000)
    proc.tick(user=100)
    proc.run(100, utime=10)
    proc.run(200, utime=10)  # pod A's container C1
    proc.run(400, utime=20)  # vm-7
    s = mon.refresh()
    pod, vm = s.pods[PodRef(UID_A, C1)].joules_total, s.vms["vm-7"].joules_total
    assert (pod, vm) == (pytest.approx(1.0), pytest.approx(2.0))
    for _ in range(4):  # 20 s idle, four times the staleness window, the processes alive
        clock.advance(5)
        powercap.advance("intel-rapl:0", 1_000_000)
        proc.tick(user=100)
        proc.run(100, utime=10)
        s = mon.refresh()
        assert s.pods[PodRef(UID_A, C1)] == (pytest.approx(pod), 0.0) and s.vms["vm-7"] == (pytest.approx(vm), 0.0)
    clock.advance(1)
    powercap.advance("intel-rapl:0", 4_000_000)
    proc.tick(user=100)
    proc.run(200, utime=10)
    s = mon.refresh()
    assert s.pods[PodRef(UID_A, C1)].joules_total == pytest.approx(pod + 4.0)  # counting on, not from zero
    proc.remove(200)  # its last process gone: kept for the window, then dropped
    clock.advance(5)
    proc.tick(idle=100)
    assert PodRef(UID_A, C1) in mon.refresh().pods
    clock.advance(1)
    proc.tick(idle=100)
    assert PodRef(UID_A, C1) not in mon.refresh().pods


def test_children_that_exit_between_reads_count_for_their_pod(powercap, proc, clock):
    """A pod's short-lived workers (exited and reaped within a refresh) were never read: their CPU time was lost
    and their active energy went to the processes that survived (a review: pod A 150 J, pod B nothing, for a
    true 15 J / 135 J). Their time is now read from the parent's cutime/cstime, without counting twice what a
    child that lived across a read had already been credited."""
    powercap.add("intel-rapl:0", "package-0")
    proc.add(FakeProcess(200, "long", cgroup=pod_cgroup_v2(UID_A, C1)))
    proc.add(FakeProcess(300, "shell", cgroup=pod_cgroup_v2(UID_B, C3)))
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock)
    mon.refresh()
    for k in range(3):  # each second: 100 J in the package, the node half busy (100 of 200 ticks)
        clock.advance(1.0)
        powercap.advance("intel-rapl:0", 100_000_000)
        proc.tick(user=100, idle=100)
        proc.run(200, utime=10)
        child = proc.add(FakeProcess(1000 + k, "worker", ppid=300, start_time=200 + k,
                                     cgroup=pod_cgroup_v2(UID_B, C3)))
        proc.run(child.pid, utime=90)
        proc.reap(child.pid)  # exited and waited for before the next read
        s = mon.refresh()
    assert s.pods[PodRef(UID_A, C1)].joules_total == pytest.approx(15.0)
    assert s.pods[PodRef(UID_B, C3)].joules_total == pytest.approx(135.0)
    # A child read while alive, then reaped: its 40 ticks seen before are not counted again in the parent
    clock.advance(1.0)
    powercap.advance("intel-rapl:0", 100_000_000)
    proc.tick(user=100, idle=100)
    child = proc.add(FakeProcess(2000, "worker", ppid=300, start_time=300, cgroup=pod_cgroup_v2(UID_B, C3)))
    proc.run(child.pid, utime=40)
    proc.run(200, utime=60)
    mon.refresh()  # 50 J active: A 60 of 100 ticks, B's child 40
    clock.advance(1.0)
    powercap.advance("intel-rapl:0", 100_000_000)
    proc.tick(user=100, idle=100)
    proc.run(child.pid, utime=50)
    proc.run(200, utime=50)
    proc.reap(child.pid)  # 90 ticks in all moved to the shell's cutime, 50 of them new
    s = mon.refresh()
    assert s.pods[PodRef(UID_A, C1)].joules_total == pytest.approx(15.0 + 30.0 + 25.0)
    assert s.pods[PodRef(UID_B, C3)].joules_total == pytest.approx(135.0 + 20.0 + 25.0)


def test_a_grandchild_reaped_through_a_parent_that_is_gone_too_is_not_credited_twice(powercap, proc, clock):
    """A container's end: its long-lived process exits, its ``sh -c`` parent reaps it and exits, and the shim
    reaps that, all within one read. The shim's cutime then holds the grandchild's whole life, already credited
    while it ran (a review: the shim took 99 J of the last 100, the other busy process 1)."""
    powercap.add("intel-rapl:0", "package-0")
    proc.add(FakeProcess(10, "containerd-shim", ppid=1))
    proc.add(FakeProcess(20, "sh", ppid=10, cgroup=pod_cgroup_v2(UID_A, C1)))
    proc.add(FakeProcess(30, "train", ppid=20, cgroup=pod_cgroup_v2(UID_A, C1)))
    proc.add(FakeProcess(40, "other", ppid=1, cgroup=pod_cgroup_v2(UID_B, C3)))
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock)

    def second() -> None:  # 100 J, train and other one core each
        clock.advance(1.0)
        powercap.advance("intel-rapl:0", 100_000_000)
        proc.tick(user=200, idle=0)
        proc.run(30, utime=100)
        proc.run(40, utime=100)

    mon.refresh()
    for _ in range(20):
        second()
        mon.refresh()
    second()  # the last one: train runs it, then exits; sh reaps it and exits; the shim reaps sh
    proc.reap(30)
    proc.reap(20)
    s = mon.refresh()
    watts = {p.comm: p.watts for p in s.processes}
    assert watts["other"] == pytest.approx(50.0) and watts["containerd-shim"] == pytest.approx(50.0)


def test_an_exec_or_a_move_into_a_pods_cgroup_is_seen(powercap, proc, clock):
    """Identity was read once per process for its whole life (a review): libvirtd's child found before it
    execs qemu stayed no VM, and ``runc init`` found before it is moved into its pod's cgroup stayed no pod's.
    An exec (a new comm) is read again at once; a process of no pod or VM every 10 s."""
    powercap.add("intel-rapl:0", "package-0")
    proc.add(FakeProcess(50, "libvirtd", cmdline=b"/usr/sbin/libvirtd\0", cgroup="0::/system.slice/libvirtd.service\n"))
    runc = proc.add(FakeProcess(60, "runc:[2:INIT]", cmdline=b"runc\0init\0",
                                cgroup="0::/system.slice/containerd.service\n"))
    mon = PowerMonitor(PowercapMeter(str(powercap.root)), proc_root=str(proc.root), clock=clock)

    def second() -> Snapshot:
        clock.advance(1.0)
        powercap.advance("intel-rapl:0", 100_000_000)
        proc.tick(user=100)
        proc.run(50, utime=50)
        proc.run(60, utime=50)
        return mon.refresh()

    mon.refresh()
    second()  # both seen: neither a VM nor a pod's
    vm = proc.processes[50]
    vm.comm, vm.cmdline = "qemu-system-x86", b"/usr/bin/qemu-system-x86_64\0-name\0guest=vm-1,debug-threads=on\0"
    proc.add(vm)  # the exec: same pid and start time, a new program
    (proc.root / "60" / "cgroup").write_text(pod_cgroup_v2(UID_A, C1))  # runc moved into the pod's cgroup
    s = second()
    assert "vm-1" in s.vms and s.vms["vm-1"].watts == pytest.approx(50.0)
    assert PodRef(UID_A, C1) not in s.pods  # the same program: looked at again within 10 s
    for _ in range(10):
        s = second()
    assert s.pods[PodRef(UID_A, C1)].watts == pytest.approx(50.0) and runc.comm == "runc:[2:INIT]"
