#!/usr/bin/env python3
"""A synthetic per-rank report (JSON schema 2) of many ranks, for rankmem-report.

    bench/mpi-report-bench.py [RANKS] [OUT]      (default 100000 ranks, to stdout)

Every rank a record as the plugin writes it (observed memory included), 4
ranks per node, the job's leaks by call site, a timeline of 64 buckets per
rank and a few phases. docs/report.md ("Size") uses it for the 100,000-rank
figures; tests/report_tool runs it with fewer ranks."""

import json
import random
import sys

B = 64
KINDS = ("device", "managed", "pinned", "vmm")


def counts(peak, rng, with_peak_s=True):
    c = {"current": peak // 2, "peak": peak, "total": peak * 3, "count": rng.randint(10, 99),
         "live": rng.randint(0, 9)}
    if with_peak_s:
        c["peak_s"] = round(rng.uniform(1, 50), 6)
    return c


def record(rank, size, rng):
    peak = (1 << 30) + rng.randint(0, 1 << 28) + (rank % 7) * (1 << 26)
    obs = {"state": "on", "why": ""}
    for k in KINDS:
        obs[k] = counts(peak if k == "device" else 0, rng)
    obs["gpu"] = counts(peak, rng)
    obs["served"] = counts(peak // 4, rng, False)
    obs["rankmem"] = {"current": 1 << 20, "peak": 1 << 24}
    obs.update(events=rng.randint(1000, 99999), unmatched_frees=0, untracked=0)
    return {
        "rank": rank, "size": size, "host": "node%05d" % (rank // 4), "local_rank": rank % 4,
        "local_size": 4, "env_local_rank": rank % 4, "device": rank % 4, "node_devices": 4,
        "device_name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "0000:%02x:00.0" % (rank % 4 + 0x1b),
        "bind_mode": "auto", "spec": "stats>pool(initial=2GiB)>async", "flags": 0,
        "host_fallback": False, "shared_gpu": False, "bind_mismatch": False, "bind_none": False,
        "bytes_peak": peak // 2, "bytes_current": 0 if rank % 10 else 4096, "bytes_total": peak,
        "count_total": 100, "count_peak": 10, "count_current": 0 if rank % 10 else 1,
        "reserved_peak": 2 << 30, "alloc_ns": rng.randint(10000, 99999), "staged_bytes": 0,
        "staged_messages": 0, "dev_total_init": 85 << 30, "dev_free_init": 84 << 30,
        "dev_total_final": 85 << 30, "dev_free_final": 80 << 30, "staged_ns": 0,
        "wall_s": 60.0 + rng.random(), "version": 2, "observed": obs,
    }


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
    out = open(sys.argv[2], "w") if len(sys.argv) > 2 else sys.stdout
    rng = random.Random(19)
    w = out.write
    w('{\n  "schema": 2,\n  "record_version": 2,\n  "generator": "mpi-report-bench.py",\n'
      '  "phase": "finalize",\n  "trigger": "MPI_Finalize",\n')
    w('  "job": %s,\n' % json.dumps({
        "id": "synthetic", "id_source": None, "ranks": n, "world_size": n,
        "nodes": (n + 3) // 4, "wall_s": 61.0, "time": "2026-11-25T12:00:00+0000",
        "writer_pid": 1, "writer_host": "node00000"}))
    w('  "leaks": %s,\n' % json.dumps([
        {"site": "cudaMalloc at solver.c:%d (main < run_step)" % (200 + i), "api": "cudaMalloc",
         "kind": "device", "ranks": n // (i + 1), "bytes": (n // (i + 1)) << 20,
         "count": n // (i + 1), "first_rank": i} for i in range(20)]))
    w('  "timeline": {"t_end_s": 61.0, "buckets": %d, "bytes": [' % B)
    for r in range(n):
        base = (1 << 30) + (r % 7) * (1 << 26)
        row = [base * min(k, 40) // 40 for k in range(B)]
        w("%s\n    [%s]" % ("," if r else "", ", ".join(map(str, row))))
    w("\n  ]},\n")
    names = ["start", "setup", "solve", "output", "teardown"]
    w('  "phases": %s,\n' % json.dumps([
        {"name": nm, "t_start_s": 12.0 * i, "t_end_s": 12.0 * (i + 1), "peak_min": 1 << 29,
         "peak_max": (1 << 30) + (6 << 26), "peak_max_rank": 6, "peak_mean": float(1 << 30),
         "ranks": n} for i, nm in enumerate(names)]))
    w('  "ranks": [')
    for r in range(n):
        w("%s\n    %s" % ("," if r else "", json.dumps(record(r, n, rng))))
    w("\n  ]\n}\n")
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()
