"""The CPU and memory limits of this process's cgroup, which a container's blocker must stay within.

A container sees the host's CPUs and MemAvailable; what it may use is its cgroup's CPU quota and memory limit,
and going past them gets the load throttled or the blocker OOM-killed. Both cgroup v2 (``cpu.max``,
``memory.max``) and v1 (``cpu.cfs_quota_us``, ``memory.limit_in_bytes``) are read, for the process's own cgroup
and every ancestor up to the mount (a limit on a parent, such as a pod's, binds its children too); the tightest
wins. A file that is missing, unreadable or says ``max`` is no limit. ``root`` and ``self_cgroup`` are where
the tree and /proc/self/cgroup are read, so that tests can point them at a synthetic tree.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _stat(path: Path, key: str) -> int:
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _int(value) or 0
    return 0


def is_v2(root: Path) -> bool:
    return (root / "cgroup.controllers").is_file()


def _dirs(controller: str, root: Path, self_cgroup: Path) -> list[Path]:
    """The process's cgroup directory for ``controller`` and its ancestors up to the mount, innermost first."""
    lines = (_read(self_cgroup) or "").splitlines()
    if is_v2(root):
        mount, rel = root, next((ln[3:] for ln in lines if ln.startswith("0::")), "/")
    else:
        found = [(ctrls, rel) for _, ctrls, rel in (ln.split(":", 2) for ln in lines if ln.count(":") >= 2)
                 if controller in ctrls.split(",")]
        if not found:
            return []
        ctrls, rel = found[0]
        mount = root / ctrls if (root / ctrls).is_dir() else root / controller
    # Inside a private cgroup namespace the path climbs above a root we cannot see ("/../..", which normpath
    # drops) or names the directory that is mounted as the root: either way the mount is the process's cgroup.
    rel = os.path.normpath("/" + rel).lstrip("/")
    here = mount / rel if rel and (mount / rel).is_dir() else mount
    out = [here]
    while here != mount and mount in here.parents:
        here = here.parent
        out.append(here)
    return out


def cpu_quota_m(root: Path | None = None, self_cgroup: Path | None = None) -> int | None:
    """Millicores the cgroup quota allows (quota / period), None where no cgroup sets one."""
    root, self_cgroup = root or CGROUP_ROOT, self_cgroup or SELF_CGROUP
    quotas = []
    for d in _dirs("cpu", root, self_cgroup):
        if is_v2(root):
            quota, _, period = (_read(d / "cpu.max") or "max").partition(" ")
            q, p = _int(quota), _int(period)
        else:
            q, p = _int(_read(d / "cpu.cfs_quota_us")), _int(_read(d / "cpu.cfs_period_us"))
        if q is not None and q > 0 and p:  # v1 says -1 for none
            quotas.append(q * 1000 // p)
    return min(quotas, default=None)


def memory_available(root: Path | None = None, self_cgroup: Path | None = None) -> int | None:
    """Bytes the cgroup still lets this process take: its limit less its working set (usage less the inactive
    page cache, which the kernel reclaims before it OOM-kills, as the kubelet counts it); None where no limit."""
    root, self_cgroup = root or CGROUP_ROOT, self_cgroup or SELF_CGROUP
    v2 = is_v2(root)
    limit_f, usage_f, inactive = (("memory.max", "memory.current", "inactive_file") if v2 else
                                  ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
    left = []
    for d in _dirs("memory", root, self_cgroup):
        limit, usage = _int(_read(d / limit_f)), _int(_read(d / usage_f))
        if limit is None or usage is None or limit >= 1 << 62:  # v1 says about 2**63 for none
            continue
        working = max(0, usage - _stat(d / "memory.stat", inactive))
        left.append(max(0, limit - working))
    return min(left, default=None)
