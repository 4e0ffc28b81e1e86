"""Memory stays flat (issue 17, item 5): the 60-second variant of bench/soak.py. `joulesched serve` (the real
CLI, its own process) against the API emulator (no kube-apiserver can run here) under continuous churn, 300
pods/s created and deleted; after a 20 s warm-up its RSS grows less than 5 %, by less than 150 bytes per pod
bound (the lists serve used to keep cost about 300), and its threads and descriptors stay flat. The 10-minute
run is in docs/PERFORMANCE.md."""

from __future__ import annotations

from bench.soak import soak


def test_serve_memory_threads_and_descriptors_stay_flat_under_churn():
    r = soak(duration=60, warmup=20, rate=300, live=2000, nodes=200, progress=False)
    mib = 2**20
    summary = (f"RSS {r['rss_after_warmup'] / mib:.1f} -> {r['rss_end'] / mib:.1f} MiB, threads {r['threads']}, "
               f"fds {r['fds']}, {r['pods_bound_after_warmup']} pods, {r['bytes_per_pod']:.0f} B/pod")
    assert r["pods_bound_after_warmup"] >= 5000, summary  # the churn really ran through serve
    assert r["rss_growth"] < 0.05, summary
    assert r["bytes_per_pod"] < 150, summary
    assert r["threads"][1] - r["threads"][0] <= 2, summary
    assert r["fds"][1] - r["fds"][0] <= 6, summary
