"""Parsing /proc: stat lines with hostile comm, guest time, pod cgroups (v1, v2), qemu VM names."""

from __future__ import annotations

import pytest

from joulesched.power.procfs import (
    CpuTimes,
    PodRef,
    parse_cgroup,
    parse_cpu_times,
    parse_pid_stat,
    parse_vm_name,
    usage_ratio,
)
from tests.support.sysfs import pod_cgroup_v1, pod_cgroup_v2

UID = "4f1c2b7e-9a3d-4e21-8c55-0d6e7f8a9b10"
CID = "a" * 40 + "0123456789abcdef01234567"


@pytest.mark.parametrize("comm", ["bash", "my prog", "evil) S 1 2 3 (x", "a)b", "((", "kworker/0:1-events"])
def test_pid_stat_parses_after_the_last_paren(comm):
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ... starttime
    line = f"42 ({comm}) R 1 42 42 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 1 0 98765 1000 200\n".encode()
    st = parse_pid_stat(line)
    assert st.comm == comm and st.cpu_ticks == 1234 + 567 and st.start_time == 98765


def test_cpu_times_exclude_guest_which_is_already_user_time():
    t = parse_cpu_times("cpu  100 10 50 800 40 5 5 0 60 0\ncpu0 1 2 3\n")
    assert t == CpuTimes(total=100 + 10 + 50 + 800 + 40 + 5 + 5, idle=800, iowait=40)
    assert t.active == 170
    with pytest.raises(ValueError):
        parse_cpu_times("intr 1 2 3\n")


def test_usage_ratio_is_keplers_and_clamped():
    a = CpuTimes(1000, 600, 100)
    b = CpuTimes(1100, 650, 110)
    assert usage_ratio(a, b) == pytest.approx((100 - 50 - 10) / 100)
    assert usage_ratio(a, a) == 0.0


STATIC = "6d8c7a3e5d1c0f9b8a7e6d5c4b3a2f1e"


@pytest.mark.parametrize("text, expected", [
    (pod_cgroup_v2(UID, CID), PodRef(UID, CID)),
    (pod_cgroup_v2(UID, CID, qos="besteffort"), PodRef(UID, CID)),
    (pod_cgroup_v1(UID, CID), PodRef(UID, CID)),
    # Guaranteed pods have no QoS level in the path.
    (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n", PodRef(UID, CID)),
    (f"11:cpu,cpuacct:/kubepods/pod{UID}/{CID}\n", PodRef(UID, CID)),
    # Docker and CRI-O scope names.
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
     f"docker-{CID}.scope\n", PodRef(UID, CID)),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
     f"crio-{CID}.scope\n", PodRef(UID, CID)),
    # A process in the pod cgroup itself, no container yet.
    (f"0::/kubepods/burstable/pod{UID}\n", PodRef(UID, "")),
    # Read from a private cgroup namespace (the cgroupfs driver): relative, no "kubepods" in sight.
    (f"0::/../../burstable/pod{UID}/{CID}\n", PodRef(UID, CID)),
    (f"0::/../../pod{UID}/{CID}\n", PodRef(UID, CID)),
    (f"11:cpu,cpuacct:/../besteffort/pod{UID}\n", PodRef(UID, "")),
    # Static pods (the control plane's): the kubelet's 32-hex manifest hash is their UID, with either driver
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice/cri-containerd-{CID}.scope\n",
     PodRef(STATIC, CID)),
    (f"0::/kubepods/burstable/pod{STATIC}/{CID}\n", PodRef(STATIC, CID)),
    (f"0::/../../burstable/pod{STATIC}/{CID}\n", PodRef(STATIC, CID)),
    (f"0::/kubepods/burstable/pod{STATIC}0/{CID}\n", None),  # 33 hex digits: no UID
    # Without "kubepods", only a whole pod<uid> component counts: not a name that merely contains one.
    (f"0::/user.slice/mypod{UID}.scope\n", None),
    ("0::/user.slice/user-0.slice/session-3.scope\n", None),
    ("0::/\n", None),
    ("12:memory:/system.slice/containerd.service\n", None),
])
def test_cgroup_pod_paths(text, expected):
    assert parse_cgroup(text) == expected


@pytest.mark.parametrize("cmdline, name", [
    ([b"/usr/bin/qemu-system-x86_64", b"-name", b"guest=web-1,debug-threads=on", b"-m", b"1024"], "web-1"),
    ([b"/usr/bin/qemu-system-x86_64", b"-name", b"guest=db"], "db"),
    ([b"qemu-kvm", b"-name", b"plain-vm"], "plain-vm"),
    ([b"/usr/bin/qemu-system-x86_64", b"-name", b"guest=a,,b,debug-threads=on"], "a,b"),
    ([b"/usr/bin/qemu-system-x86_64", b"-m", b"512"], None),
    ([b"/usr/bin/python3", b"-name", b"guest=not-a-vm"], None),
    ([b""], None),
])
def test_vm_name_from_qemu_cmdline(cmdline, name):
    assert parse_vm_name(b"\0".join(cmdline) + b"\0") == name
