#!/usr/bin/env python3
"""TAP checks of rankmem-report (run by tool.rtsh).

The tool is run on the committed reports (written by the MPI plugin, 4 ranks
on a machine without a GPU) and on synthetic ones made here (a GPU job of
5000 ranks, a pair of runs to compare, broken files). Every number the tool
prints or draws is checked against values computed here from the report's
records, independently of the tool (and, for the committed JSON, against the
plugin's own aggregates)."""

import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from fractions import Fraction
sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import taplib  # noqa: E402
from taplib import ok, diag  # noqa: E402

TOOL = os.environ["RANKMEM_REPORT_TOOL"]
SRC = os.path.join(os.environ.get("RKT_SRCDIR", "."), "tests", "report_tool")
TMP = tempfile.mkdtemp(prefix="rankmem-report-test-")
SVGNS = "{http://www.w3.org/2000/svg}"
GIB, MIB, KIB = 1 << 30, 1 << 20, 1 << 10

FIELDS = ["bytes_peak", "bytes_current", "bytes_total", "count_total", "count_peak",
          "count_current", "reserved_peak", "alloc_ns", "staged_bytes", "staged_messages",
          "observed_gpu_peak", "observed_served_peak"]
LABELS = ["peak bytes", "leaked bytes", "total bytes", "allocations", "peak allocations",
          "live allocations", "reserved peak", "alloc time", "staged bytes", "staged messages",
          "observed GPU peak", "served peak"]
UNITS = ["B", "B", "B", "n", "n", "n", "B", "ns", "B", "n", "B", "B"]
# Schema 2's aggregated values that sit in a record's "observed" object
# (0 in a report written before it).
NESTED = {"observed_gpu_peak": ("observed", "gpu", "peak"),
          "observed_served_peak": ("observed", "served", "peak")}


# The headline (schema 4, issue 29): the program's observed GPU memory
# where observation was on, else what the chain served; as rm_headline().
MEM = {"memory_peak": ("peak", "bytes_peak"), "memory_current": ("current", "bytes_current"),
       "memory_total": ("total", "bytes_total"), "memory_count": ("count", "count_total"),
       "memory_live": ("live", "count_current")}
HEAD = list(MEM)
HEAD_LABELS = ["peak bytes", "leaked bytes", "total bytes", "allocations", "live allocations"]
SERVED_LABELS = {"bytes_peak": "served peak", "bytes_current": "served leaked",
                 "bytes_total": "served total", "count_total": "served allocs",
                 "count_peak": "served peak allocs", "count_current": "served live allocs",
                 "observed_served_peak": "intercepted peak"}


def observed(rec):
    o = rec.get("observed")
    return int(rec.get("version", 0)) >= 2 and isinstance(o, dict) and o.get("state") == "on"


def source_of(recs):
    nobs = sum(observed(r) for r in recs)
    nact = sum(int(r.get("version", 1)) != 0 for r in recs)
    return "served" if nobs == 0 else "observed" if nobs >= nact else "mixed"


def label_of(src):
    return {"observed": "device memory as the program saw it (observed)",
            "served": "memory rankmem served"}.get(
        src, "device memory as the program saw it (observed) where observed, else memory "
             "rankmem served")


def chain_is_device(rec):
    """The chain serves device memory: a GPU, and a leaf that is not host."""
    if rec.get("host_fallback"):
        return False
    leaf = rec.get("spec", "").split(">")[-1]
    if re.match(r"(system|pinned)(\(|$)", leaf):
        return False
    return not (leaf.startswith("vmm(") and "backend=host" in leaf)


# The chain's counters beside the observed "served" ones (what interception
# served is in both): the part served through rankmem's API alone.
CHAIN_MINUS = {"current": ("bytes_current", "current"), "total": ("bytes_total", "total"),
               "count": ("count_total", "count"), "live": ("count_current", "live")}


def value_of(rec, key):
    if key in MEM:
        if observed(rec):
            what = MEM[key][0]
            v = int(rec["observed"]["gpu"].get(what, 0))
            if chain_is_device(rec):
                if what == "peak":
                    v = max(v, int(rec.get("bytes_peak", 0)))
                else:
                    mine, theirs = CHAIN_MINUS[what]
                    v += max(0, int(rec.get(mine, 0)) -
                             int(rec["observed"].get("served", {}).get(theirs, 0)))
            return v
        return int(rec.get(MEM[key][1], 0))
    v = rec
    for k in NESTED.get(key, (key,)):
        if not isinstance(v, dict) or k not in v:
            return 0
        v = v[k]
    return v



def run(*args, stdin=None):
    """Runs the tool; returns (status, stdout, stderr)."""
    env = dict(os.environ)
    # An ASan build: any leak or error makes the tool fail loudly.
    p = subprocess.run([TOOL] + list(args), capture_output=True, text=True, env=env,
                       input=stdin, timeout=120)
    return p.returncode, p.stdout, p.stderr


def no_crash(rc, err):
    """A clean exit: 0, 1 or 2, and nothing from a sanitizer."""
    return rc in (0, 1, 2) and "Sanitizer" not in err and "runtime error" not in err


# ---- the numbers, computed here ------------------------------------------------------

def fmt_bytes(v):
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    if v < 1024:
        return "%.0f B" % v
    u = 0
    v = float(v)
    while v >= 1024 and u < 6:
        v /= 1024
        u += 1
    return "%.2f %s" % (v, units[u])


def fmt_ns(ns):
    if ns < 1e3:
        return "%.0f ns" % ns
    if ns < 1e6:
        return "%.2f us" % (ns / 1e3)
    if ns < 1e9:
        return "%.2f ms" % (ns / 1e6)
    return "%.3f s" % (ns / 1e9)


def fmt(unit, v, exact):
    if unit == "B":
        return fmt_bytes(v)
    if unit == "ns":
        return fmt_ns(v)
    return ("%.0f" if exact else "%.1f") % v


def aggregates(recs):
    """Per field: min, min_rank, max, max_rank (lowest rank on ties), sum, mean,
    std (population), imbalance (None when the mean is 0); exact fractions."""
    out = {}
    for key in HEAD + FIELDS:
        vals = [(value_of(r, key), r["rank"]) for r in recs]
        mx = max(v for v, _ in vals)
        mn = min(v for v, _ in vals)
        s = sum(v for v, _ in vals)
        mean = Fraction(s, len(vals))
        var = sum((Fraction(v) - mean) ** 2 for v, _ in vals) / len(vals)
        out[key] = dict(min=mn, max=mx, sum=s, mean=float(mean), std=math.sqrt(var),
                        max_rank=min(rk for v, rk in vals if v == mx),
                        min_rank=min(rk for v, rk in vals if v == mn),
                        imbalance=float(mx / mean) if mean > 0 else None)
    return out


def expected_aggregate_lines(recs, final=True):
    lines = []
    agg = aggregates(recs)
    src = source_of(recs)
    dup = ("bytes_peak", "bytes_current", "bytes_total", "count_total", "count_current")
    for key, label, unit in zip(HEAD + FIELDS, HEAD_LABELS + LABELS, ["B"] * 3 + ["n"] * 2 + UNITS):
        if src == "served" and key in dup:
            continue  # the same numbers as the headline's rows
        if key in SERVED_LABELS and not (src == "served" and key == "count_peak"):
            label = SERVED_LABELS[key]
        if key == "memory_current" and not final:
            label = "live bytes"
        if key == "bytes_current" and not final:
            label = "served live"
        g = agg[key]
        imb = "%.2f" % g["imbalance"] if g["imbalance"] is not None else "-"
        lines.append("  %-17s %12s %12s %6d %12s %12s %9s" % (
            label, fmt(unit, g["min"], True), fmt(unit, g["max"], True), g["max_rank"],
            fmt(unit, g["mean"], False), fmt(unit, g["std"], False), imb))
    return lines


def section(out, title):
    """The lines of a section of the terminal report, up to the blank line."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(title):
            body = []
            for l in lines[i + 1:]:
                if not l.strip():
                    break
                body.append(l)
            return body
    return None


def histogram(recs, bins):
    peaks = [r["bytes_peak"] for r in recs]
    lo, hi = min(peaks), max(peaks)
    k = min(bins, len(peaks))
    if hi == lo:
        return [len(peaks)]
    k = min(k, hi - lo)
    counts = [0] * k
    for p in peaks:
        counts[min(k - 1, (p - lo) * k // (hi - lo))] += 1
    return counts


def read_csv_records(path):
    import csv
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    recs = []
    for row in rows:
        r = dict(row)
        for k in FIELDS + ["rank", "device", "dev_total_init", "local_rank"]:
            if k in NESTED:  # a CSV column "observed.gpu.peak", if the CSV has it
                col = ".".join(NESTED[k])
                if col in r:
                    r.setdefault("observed", {}).setdefault(NESTED[k][1], {})[NESTED[k][2]] = \
                        int(r[col])
                continue
            r[k] = int(r[k])
        recs.append(r)
    return recs


# ---- synthetic reports -----------------------------------------------------------------

def record(rank, size, host, local, local_size, device, cap, peak, leaked, rng, spec):
    return {
        "rank": rank, "size": size, "host": host, "local_rank": local, "local_size": local_size,
        "env_local_rank": local, "device": device, "node_devices": 4,
        "device_name": "NVIDIA H100 80GB HBM3" if device >= 0 else "",
        "pci_bus_id": "0000:%02x:00.0" % (0x18 + 0x20 * device) if device >= 0 else "",
        "bind_mode": "auto", "spec": spec, "version": 1, "flags": 0 if device >= 0 else 1,
        "host_fallback": device < 0, "shared_gpu": False, "bind_mismatch": False,
        "bind_none": False, "bytes_peak": peak, "bytes_current": leaked,
        "bytes_total": peak + leaked + rng.randrange(1 << 30), "count_total": rng.randrange(10, 5000),
        "count_peak": rng.randrange(1, 400), "count_current": 1 if leaked else 0,
        "reserved_peak": peak + rng.randrange(1 << 28), "alloc_ns": rng.randrange(10 ** 4, 10 ** 9),
        "staged_bytes": rng.randrange(1 << 33), "staged_messages": rng.randrange(10 ** 5),
        "dev_total_init": cap if device >= 0 else 0, "dev_free_init": cap - GIB if device >= 0 else 0,
        "dev_total_final": cap if device >= 0 else 0,
        "dev_free_final": cap - peak - GIB if device >= 0 else 0,
        "staged_ns": rng.randrange(10 ** 9), "wall_s": 100 + rng.random(),
    }


def synthetic(n, seed, cap=80 * GIB, per_node=4, spec="stats>pool>cuda", tweak=None):
    """A GPU job of n ranks, 4 per node, peaks between 20 and 70 GiB, a few leaks."""
    rng = random.Random(seed)
    recs = []
    for r in range(n):
        peak = rng.randrange(20 * GIB, 70 * GIB)
        leaked = rng.randrange(1, 64 * MIB) if rng.random() < 0.05 else 0
        recs.append(record(r, n, "node%04d" % (r // per_node), r % per_node, per_node,
                           r % per_node, cap, peak, leaked, rng, spec))
    if tweak:
        tweak(recs)
    return {
        "schema": 1, "record_version": 1, "generator": "rankmem test", "phase": "finalize",
        "trigger": "MPI_Finalize",
        "job": {"id": "4242", "id_source": "SLURM_JOB_ID", "ranks": n, "world_size": n,
                "nodes": (n + per_node - 1) // per_node, "wall_s": 101.0,
                "time": "2026-11-22T09:00:00+0000", "writer_pid": 1234, "writer_host": "node0000",
                "specs": [{"spec": spec, "ranks": n}], "other_spec_ranks": 0,
                "bind_modes": [{"mode": "auto", "ranks": n}], "other_bind_ranks": 0,
                "flags": {"host_fallback_ranks": 0, "shared_gpu_ranks": 0,
                          "bind_mismatch_ranks": 0, "bind_none_ranks": 0, "inactive_ranks": 0}},
        "nodes": [], "aggregates": {}, "leaked_ranks": [], "top_by_peak": [],
        "ranks": recs,
    }


def write(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def write_json(name, doc):
    return write(name, json.dumps(doc, indent=1))


# ---- the SVG ---------------------------------------------------------------------------

def svg_root(path):
    try:
        return ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        diag("%s: %s" % (path, e))
        return None


def panel_of(root, pid):
    for g in root.iter(SVGNS + "g"):
        if g.get("id") == pid:
            return g
    return None


def y_of(panel, v):
    top, h, smax = (float(panel.get(k)) for k in ("data-top", "data-height", "data-scale-max"))
    return top + h - v / smax * h


def bins_expected(values, nbars):
    """[first, last, min, mean, max] of each bin over values in display order."""
    n = len(values)
    out = []
    for b in range(nbars):
        first = b * n // nbars
        end = n if b + 1 == nbars else (b + 1) * n // nbars
        part = values[first:end]
        out.append((first, end - 1, min(part), Fraction(sum(part), len(part)), max(part)))
    return out


def check_bins(panel, values, nbars, what):
    groups = [g for g in panel.iter(SVGNS + "g") if g.get("class") == "bin"]
    ok(len(groups) == nbars, "%s: %d bins (got %d)" % (what, nbars, len(groups)))
    want = bins_expected(values, nbars)
    bad = 0
    for g, (first, last, mn, mean, mx) in zip(groups, want):
        got = (int(g.get("data-first")), int(g.get("data-last")), int(g.get("data-min")),
               float(g.get("data-mean")), int(g.get("data-max")))
        parts = {r.get("data-part"): r for r in g.iter(SVGNS + "rect")}
        bottom = float(panel.get("data-top")) + float(panel.get("data-height"))
        geo = sorted(parts) == ["max", "mean", "min"] and all(
            abs(float(parts[k].get("y")) - y_of(panel, float(v))) < 0.01 and
            abs(float(parts[k].get("y")) + float(parts[k].get("height")) - bottom) < 0.01
            for k, v in (("max", mx), ("mean", mean), ("min", mn)))
        if got[:3] != (first, last, mn) or got[4] != mx or \
                abs(got[3] - float(mean)) > 1e-9 * float(mean) + 1e-9 or not geo:
            bad += 1
            if bad <= 3:
                diag("%s: bin got %s, want %s (geometry %s)" % (what, got, (first, last, mn,
                     float(mean), mx), geo))
    ok(bad == 0, "%s: every bin's positions, min, mean, max and its three bars agree" % what)


# ---- the tests ---------------------------------------------------------------------------

def test_example_json():
    path = os.path.join(SRC, "example-cpu.json")
    with open(path) as f:
        doc = json.load(f)
    recs = doc["ranks"]
    rc, out, err = run(path)
    ok(rc == 0 and no_crash(rc, err), "example-cpu.json: exit 0")
    if rc:
        diag(err)
    agg = aggregates(recs)
    same = all(doc["aggregates"][k][x] == agg[k][x]
               for k in FIELDS if k in doc["aggregates"]
               for x in ("min", "max", "sum", "max_rank", "min_rank"))
    ok(same, "the values computed here match the plugin's own aggregates in the JSON")
    got = section(out, "aggregates over 4 ranks")
    want = expected_aggregate_lines(recs)
    ok(got is not None and got[1:] == want, "aggregates: min, max, rank of max, mean, std dev, "
       "max/mean of the %d fields, as computed here" % len(FIELDS))
    if got is None or got[1:] != want:
        diag("got:\n%s\nwant:\n%s" % ("\n".join(got or []), "\n".join(want)))
    top = section(out, "top ranks by peak")
    order = [r["rank"] for r in sorted(recs, key=lambda r: (-r["bytes_peak"], r["rank"]))]
    ok(top is not None and [int(l.split()[0]) for l in top[1:]] == order,
       "top ranks by peak, largest first: %s" % order)
    leaked = section(out, "ranks that leaked")
    lk = sorted([r for r in recs if r["bytes_current"]], key=lambda r: (-r["bytes_current"],
                                                                        r["rank"]))
    ok(leaked is not None and out.count("ranks that leaked (%d of 4)" % len(lk)) == 1 and
       [(int(l.split()[0]), l.split()[2] + " " + l.split()[3]) for l in leaked[1:]] ==
       [(r["rank"], fmt_bytes(r["bytes_current"])) for r in lk],
       "ranks that leaked, largest first, with their bytes")
    nodes = section(out, "nodes (1)")
    peaks = [r["bytes_peak"] for r in recs]
    want_node = "  %-20s %5d  %-10s %11s %11s %6d %11s %11s  -" % (
        "vm", 4, "host", fmt_bytes(sum(peaks)), fmt_bytes(max(peaks)),
        agg["bytes_peak"]["max_rank"], fmt_bytes(sum(r["bytes_current"] for r in recs)),
        fmt_bytes(sum(r["reserved_peak"] for r in recs)))
    ok(nodes is not None and nodes[1:] == [want_node], "the node line: sums, max and its rank")
    if nodes is None or nodes[1:] != [want_node]:
        diag("got %r\nwant %r" % (nodes, want_node))
    hist = section(out, "peak bytes histogram")
    counts = [int(l.split()[-1]) for l in hist or []]
    ok(counts == histogram(recs, 10), "histogram counts %s" % counts)
    ok("job id          nojob (no launcher job id)" in out and "phase           finalize "
       "(MPI_Finalize)" in out and "host fallback (no GPU, host memory) on 4 of 4 ranks: 0, 1, "
       "2, 3" in out, "job summary: id, phase, flags")
    return out


def test_example_csv(json_out):
    path = os.path.join(SRC, "example-cpu.csv")
    recs = read_csv_records(path)
    rc, out, err = run(path)
    ok(rc == 0 and no_crash(rc, err), "example-cpu.csv: exit 0")
    got = section(out, "aggregates over 4 ranks")
    ok(got is not None and got[1:] == expected_aggregate_lines(recs),
       "CSV: aggregates as computed here")
    strip = lambda text: [l for l in text.splitlines()[2:] if not l.startswith("  job id")
                          and not l.startswith("  phase") and not l.startswith("  written")
                          and not l.startswith("  wall time")]
    ok(strip(out) == strip(json_out), "CSV and JSON of the same run: the same report "
       "(but for the job fields only the JSON has)")
    ok("rankmem memory report: %s (CSV)" % path in out, "CSV: detected by its content")


def test_midrun():
    for name in ("midrun-report1.json", "midrun-report1.csv"):
        path = os.path.join(SRC, name)
        rc, out, err = run(path)
        ok(rc == 0 and no_crash(rc, err), "%s: exit 0" % name)
        if name.endswith(".json"):
            ok("ranks with live allocations (4 of 4)" in out and "  live bytes " in out,
               "mid-run: live bytes, not leaks")
        else:
            ok("stats>pool(initial=8MiB,max=1GiB)>system" in out,
               "CSV: a quoted spec with a comma is one field")


def test_svg_example():
    path = os.path.join(SRC, "example-cpu.json")
    with open(path) as f:
        recs = json.load(f)["ranks"]
    svg = os.path.join(TMP, "example.svg")
    rc, out, err = run("--svg", svg, "-q", path)
    ok(rc == 0 and no_crash(rc, err) and out == "", "--svg -q: exit 0, nothing on stdout")
    root = svg_root(svg)
    ok(root is not None and root.tag == SVGNS + "svg", "the SVG is well-formed XML, an <svg>")
    if root is None:
        return
    peak = panel_of(root, "peak-panel")
    bars = [e for e in peak.iter(SVGNS + "rect") if e.get("class") == "peak"] if peak else []
    ok(len(bars) == 4 and root.get("data-binned") == "0", "4 ranks: 4 peak bars, not binned")
    want = [(r["rank"], r["bytes_peak"]) for r in sorted(recs, key=lambda r: r["rank"])]
    got = [(int(b.get("data-rank")), int(b.get("data-bytes"))) for b in bars]
    ok(got == want, "--order rank (default): bars in rank order with each rank's peak")
    geo = all(abs(float(b.get("height")) - v / float(peak.get("data-scale-max")) *
                  float(peak.get("data-height"))) < 0.01 and
              abs(float(b.get("y")) - y_of(peak, v)) < 0.01 for b, (_, v) in zip(bars, want))
    ok(geo, "bar heights are the peaks on the panel's scale")
    smax = float(peak.get("data-scale-max"))
    ok(max(r["bytes_peak"] for r in recs) <= smax <= 2 * max(r["bytes_peak"] for r in recs),
       "the scale holds the largest peak and is not more than twice it")
    leak = panel_of(root, "leaked-panel")
    lbars = [e for e in leak.iter(SVGNS + "rect") if e.get("class") == "leaked"] if leak else []
    ok([int(b.get("data-bytes")) for b in lbars] ==
       [r["bytes_current"] for r in sorted(recs, key=lambda r: r["rank"])],
       "the leaked panel: one bar per rank with its leaked bytes")
    caps = [e for e in root.iter() if e.get("id") == "capacity"]
    ok(not caps and "no device capacity" in open(svg).read(),
       "host fallback: no capacity line, a note says why")

    rc, out, err = run("--svg", svg, "--order", "peak", "-q", path)
    root = svg_root(svg)
    bars = [e for e in panel_of(root, "peak-panel").iter(SVGNS + "rect")
            if e.get("class") == "peak"]
    ok([int(b.get("data-rank")) for b in bars] ==
       [r["rank"] for r in sorted(recs, key=lambda r: (-r["bytes_peak"], r["rank"]))],
       "--order peak: largest peak first")

    rc, out, err = run("--svg", svg, "--capacity", "8MiB", "-q", path)
    root = svg_root(svg)
    peak = panel_of(root, "peak-panel")
    cap = [e for e in root.iter() if e.get("id") == "capacity"]
    ok(len(cap) == 1 and int(cap[0].get("data-bytes")) == 8 * MIB and
       abs(float(cap[0].get("y1")) - y_of(peak, 8 * MIB)) < 0.01 and
       float(peak.get("data-scale-max")) >= 8 * MIB,
       "--capacity 8MiB: the line at 8 MiB on the scale")


def test_svg_big():
    doc = synthetic(5000, seed=5)
    path = write_json("big.json", doc)
    recs = doc["ranks"]
    svg = os.path.join(TMP, "big.svg")
    rc, out, err = run("--svg", svg, path)
    ok(rc == 0 and no_crash(rc, err), "5000 ranks: exit 0")
    root = svg_root(svg)
    ok(root is not None, "5000 ranks: well-formed SVG")
    if root is None:
        return
    ok(root.get("data-binned") == "1" and root.get("data-bars") == "200",
       "5000 ranks: binned into 200 bars (the default --max-bars)")
    peak = panel_of(root, "peak-panel")
    ok(not [e for e in peak.iter(SVGNS + "rect") if e.get("data-rank")],
       "binned: no per-rank bar")
    by_rank = sorted(recs, key=lambda r: r["rank"])
    check_bins(peak, [r["bytes_peak"] for r in by_rank], 200, "rank order, peaks")
    check_bins(panel_of(root, "leaked-panel"), [r["bytes_current"] for r in by_rank], 200,
               "rank order, leaks")
    cap = [e for e in root.iter() if e.get("id") == "capacity"]
    ok(len(cap) == 1 and int(cap[0].get("data-bytes")) == 80 * GIB,
       "the capacity line: the device's 80 GiB from dev_total_init")
    if cap:
        y = float(cap[0].get("y1"))
        ok(abs(y - y_of(peak, 80 * GIB)) < 0.01 and cap[0].get("y2") == cap[0].get("y1"),
           "the capacity line is horizontal at 80 GiB on the peak scale (y=%.2f)" % y)
        top, h = float(peak.get("data-top")), float(peak.get("data-height"))
        ok(top <= y <= top + h, "the capacity line is inside the panel")
    mean = [e for e in root.iter() if e.get("id") == "peak-panel-mean"]
    want_mean = float(Fraction(sum(r["bytes_peak"] for r in recs), len(recs)))
    ok(mean and abs(float(mean[0].get("data-bytes")) - want_mean) < 1e-6 * want_mean,
       "the mean line at the mean peak")
    text = open(svg).read()
    ok(len(text) < 400000, "5000 ranks: the SVG stays small (%d bytes)" % len(text))

    rc, out, err = run("--svg", svg, "--order", "peak", "--max-bars", "64", "-q", path)
    root = svg_root(svg)
    peak = panel_of(root, "peak-panel")
    sorted_peaks = [r["bytes_peak"] for r in sorted(recs, key=lambda r: (-r["bytes_peak"],
                                                                         r["rank"]))]
    check_bins(peak, sorted_peaks, 64, "--order peak --max-bars 64")

    # few ranks far below the device: the capacity is named, not drawn
    small = synthetic(8, seed=9, tweak=lambda rs: [r.update(bytes_peak=MIB * (r["rank"] + 1))
                                                   for r in rs])
    rc, out, err = run("--svg", svg, "-q", write_json("small.json", small))
    root = svg_root(svg)
    note = [e for e in root.iter() if e.get("id") == "capacity-note"]
    ok(not [e for e in root.iter() if e.get("id") == "capacity"] and len(note) == 1 and
       int(note[0].get("data-bytes")) == 80 * GIB,
       "peaks under 10%% of the capacity: a note instead of a line that would flatten the bars")
    rc, out, err = run("--svg", svg, "--capacity", "none", "-q", write_json("small.json", small))
    root = svg_root(svg)
    ok(not [e for e in root.iter() if e.get("id") in ("capacity", "capacity-note")],
       "--capacity none: neither")

    # 150 ranks: under the limit, one bar each
    mid = synthetic(150, seed=3)
    rc, out, err = run("--svg", svg, "-q", write_json("mid.json", mid))
    root = svg_root(svg)
    bars = [e for e in panel_of(root, "peak-panel").iter(SVGNS + "rect")
            if e.get("class") == "peak"]
    ok(len(bars) == 150 and root.get("data-binned") == "0", "150 ranks: 150 bars")


def test_html():
    path = os.path.join(SRC, "example-cpu.json")
    html = os.path.join(TMP, "example.html")
    rc, out, err = run("--html", html, path)
    ok(rc == 0 and no_crash(rc, err) and "HTML written to %s" % html in out,
       "--html: exit 0, the summary and where the page went")
    text = open(html).read()
    ok(text.startswith("<!DOCTYPE html>"), "--html: an HTML5 document")
    try:
        root = ET.fromstring(text.split("\n", 1)[1])
    except ET.ParseError as e:
        root = None
        diag(e)
    ok(root is not None and root.tag == "html", "--html: every element closed (parses as XML)")
    if root is None:
        return
    svgs = list(root.iter(SVGNS + "svg"))
    ok(len(svgs) == 1, "--html: the SVG is inline")
    refs = re.findall(r'(?:src|href)\s*=|@import|url\(', text)
    ok(not refs, "--html: no outside resource (stands alone)")
    ok("aggregates over 4 ranks" in text and "top ranks by peak" in text,
       "--html: the aggregates and top ranks tables")


def test_compare():
    old = synthetic(64, seed=11)

    def tweak(recs):
        recs[7]["bytes_peak"] += 3 * GIB          # the biggest mover
        recs[20]["bytes_peak"] -= 2 * GIB
        recs[33].update(bytes_current=5 * MIB, count_current=1)  # a new leak
    new = synthetic(64, seed=11, tweak=tweak)
    po, pn = write_json("old.json", old), write_json("new.json", new)
    rc, out, err = run("--compare", po, pn)
    ok(rc == 0 and no_crash(rc, err), "--compare: exit 0")
    moved = section(out, "ranks whose peak moved most")
    ok(moved is not None and out.count("ranks whose peak moved most (2 of 64 ranks in both "
                                       "changed)") == 1,
       "--compare: 2 ranks' peaks changed")
    if moved:
        r0 = moved[1].split()
        want_old = fmt_bytes(old["ranks"][7]["bytes_peak"])
        want_new = fmt_bytes(new["ranks"][7]["bytes_peak"])
        ok(r0[0] == "7" and " ".join(r0[2:4]) == want_old and " ".join(r0[4:6]) == want_new and
           r0[6] == "+3.00" and r0[7] == "GiB",
           "--compare: rank 7 moved most, %s -> %s (+3.00 GiB)" % (want_old, want_new))
        ok(moved[2].split()[0] == "20" and moved[2].split()[6] == "-2.00",
           "--compare: then rank 20 (-2.00 GiB)")
    ao, an = aggregates(old["ranks"]), aggregates(new["ranks"])
    line = [l for l in out.splitlines() if l.startswith("  peak bytes ")]
    change = 100.0 * (an["bytes_peak"]["mean"] - ao["bytes_peak"]["mean"]) / \
        ao["bytes_peak"]["mean"]
    want = ("%+.1g%%" if abs(change) < 0.05 else "%+.1f%%") % change
    ok(line and want in line[0].split() and fmt_bytes(an["bytes_peak"]["max"]) in line[0],
       "--compare: peak bytes mean change %s, new max" % want)
    leaks = section(out, "ranks whose leaked bytes moved most")
    ok(leaks is not None and leaks[1].split()[0] == "33" and "new" in leaks[1].split(),
       "--compare: rank 33's new leak")
    rc, out2, err = run("--compare", po, po)
    ok(rc == 0 and "ranks whose peak moved most (0 of 64 ranks in both changed)" in out2,
       "--compare of a run with itself: nothing moved")

    fewer = synthetic(60, seed=11)
    rc, out3, err = run("--compare", po, write_json("fewer.json", fewer))
    ok(rc == 0 and "60 in both, 4 only in old (60, 61, 62, 63), 0 only in new" in out3,
       "--compare: ranks only in one run are counted")


def test_schema2():
    """A schema-2 report (bench/mpi-report-bench.py, 2000 ranks): observed
    memory, leaks by call site, phases, the heat map and curves, the CSV of
    the same records, --compare by phase."""
    gen = os.path.join(os.environ.get("RKT_SRCDIR", "."), "bench", "mpi-report-bench.py")
    path = os.path.join(TMP, "s2.json")
    subprocess.run([sys.executable, gen, "2000", path], check=True, timeout=300)
    with open(path) as f:
        doc = json.load(f)
    recs = doc["ranks"]
    svg, html = os.path.join(TMP, "s2.svg"), os.path.join(TMP, "s2.html")
    rc, out, err = run(path, "--svg", svg, "--html", html)
    ok(rc == 0 and no_crash(rc, err), "schema 2, 2000 ranks: exit 0")
    if rc:
        diag(err)
    got = section(out, "aggregates over 2000 ranks")
    want = expected_aggregate_lines(recs)
    ok(got is not None and got[1:] == want, "schema 2: aggregates include the observed GPU and "
       "served peaks, as computed here")
    if got is None or got[1:] != want:
        diag("got:\n%s\nwant:\n%s" % ("\n".join(got or []), "\n".join(want)))
    obs = section(out, "observed device memory (the program's, as CUDA saw it; served: by rankmem)")
    top = sorted(recs, key=lambda r: (-r["observed"]["gpu"]["peak"], r["rank"]))[:10]
    ok(obs is not None and [int(x.split()[0]) for x in obs[1:11]] == [r["rank"] for r in top],
       "schema 2: ranks by observed GPU peak, largest first")
    sites = section(out, "leaks by call site (20)")
    ok(sites is not None and len(sites) == 20 and
       sites[0] == "  cudaMalloc at solver.c:200 (main < run_step): 2000 of 2000 ranks, "
                   "1.95 GiB in 2000 blocks (first rank 0)",
       "schema 2: leaks by call site, with rank counts")
    phases = section(out, "phases (observed GPU peak per phase over ranks)")
    ok(phases is not None and [x.split()[0] for x in phases[1:]] ==
       ["start", "setup", "solve", "output", "teardown"], "schema 2: the phases in order")
    root = svg_root(svg)
    heat = root.find(".//%sg[@id='heatmap']" % SVGNS) if root is not None else None
    ok(heat is not None and heat.get("data-rows") == "128" and heat.get("data-cols") == "64" and
       int(heat.get("data-max")) == max(max(x) for x in doc["timeline"]["bytes"]),
       "SVG: a heat map of 128 binned rows x 64 buckets, scaled to the largest value")
    curves = root.find(".//%sg[@id='curves']" % SVGNS) if root is not None else None
    lines = curves.findall("%spolyline" % SVGNS) if curves is not None else []
    ok(curves is not None and curves.get("data-curves") == "envelope" and len(lines) == 4 and
       all(len(x.get("points").split()) == 64 for x in lines),
       "SVG: 2000 ranks: the max, mean, min and the largest rank's curve, 64 points each")
    marks = root.findall(".//%sline[@class='phase']" % SVGNS) if root is not None else []
    ok(len(marks) == 2 * 5, "SVG: the 5 phase marks on both panels")
    try:
        import xml.etree.ElementTree as ET
        ET.parse(html)
        with open(html) as f:
            h = f.read()
        ok('id="leak-sites"' in h and 'id="phases"' in h and 'id="heatmap"' in h and
           'id="observed"' in h, "HTML: observed memory, leaks by call site, phases, the heat map")
    except Exception as e:  # noqa: BLE001
        ok(False, "HTML well-formed (%s)" % e)
    # a few ranks: one curve each
    small = dict(doc)
    small["ranks"] = recs[:8]
    small["job"] = dict(doc["job"], ranks=8)
    small["timeline"] = dict(doc["timeline"], bytes=doc["timeline"]["bytes"][:8])
    sp = write_json("s2-small.json", small)
    ssvg = os.path.join(TMP, "s2-small.svg")
    rc, out, err = run(sp, "--svg", ssvg, "-q")
    root = svg_root(ssvg) if rc == 0 else None
    curves = root.find(".//%sg[@id='curves']" % SVGNS) if root is not None else None
    ok(curves is not None and curves.get("data-curves") == "ranks" and
       [x.get("data-rank") for x in curves.findall("%spolyline" % SVGNS)] ==
       [str(r) for r in range(8)], "SVG: 8 ranks: one curve per rank")
    # --compare: the solve phase grew by 25% in the new run
    new = json.loads(json.dumps(small))
    for p_ in new["phases"]:
        if p_["name"] == "solve":
            p_["peak_max"] = p_["peak_max"] * 5 // 4
    new["phases"].append({"name": "extra", "t_start_s": 60.0, "t_end_s": 61.0, "peak_min": 0,
                          "peak_max": 1, "peak_max_rank": 0, "peak_mean": 0.5, "ranks": 8})
    np_ = write_json("s2-new.json", new)
    rc, out, err = run("--compare", sp, np_)
    cmp_ = section(out, "peaks per phase")
    rows = {x.split()[0]: x for x in (cmp_ or [])}
    ok(rc == 0 and "solve" in rows and "+25.0%" in rows["solve"] and "setup" in rows and
       rows["setup"].split()[5] == "=" and "extra" in rows and "new" in rows["extra"],
       "--compare: peaks per phase, matched by name")
    if not cmp_:
        diag(out)
    # the same records as CSV read the same (observed columns by name)
    csvp = os.path.join(TMP, "s2.csv")
    import csv as csvmod
    cols = ["rank", "size", "host", "local_rank", "local_size", "env_local_rank", "device",
            "node_devices", "device_name", "pci_bus_id", "bind_mode", "spec", "flags",
            "bytes_peak", "bytes_current", "bytes_total", "count_total", "count_peak",
            "count_current", "reserved_peak", "alloc_ns", "staged_bytes", "staged_messages",
            "dev_total_init", "dev_free_init", "dev_total_final", "dev_free_final", "staged_ns",
            "wall_s", "version", "observed.state", "observed.gpu.peak", "observed.served.peak",
            "observed.gpu.current", "observed.gpu.total", "observed.gpu.count",
            "observed.gpu.live", "observed.served.current", "observed.served.total",
            "observed.served.count", "observed.served.live"]
    with open(csvp, "w", newline="") as f:
        w = csvmod.writer(f)
        w.writerow(cols)
        for r in recs:
            w.writerow([r["observed"]["state"] if c == "observed.state" else
                        r["observed"]["gpu"][c.split(".")[2]] if c.startswith("observed.gpu.") and
                        c != "observed.gpu.peak" else
                        r["observed"]["served"].get(c.split(".")[2], 0)
                        if c.startswith("observed.served.") and c != "observed.served.peak" else
                        value_of(r, {"observed.gpu.peak": "observed_gpu_peak",
                                     "observed.served.peak": "observed_served_peak"}.get(c, c))
                        for c in cols])
    rc, out, err = run(csvp)
    got = section(out, "aggregates over 2000 ranks")
    ok(rc == 0 and got is not None and got[1:] == want,
       "schema 2 as CSV: the observed columns read by name, the same aggregates")
    if rc:
        diag(err)



def expect_refusal(name, path, want, what):
    rc, out, err = run(path)
    good = rc == 1 and no_crash(rc, err) and re.search(want, err) is not None and out == ""
    ok(good, "%s: exit 1 with a clear message" % what)
    if not good:
        diag("rc=%s stderr: %s" % (rc, err.strip()))
    return err


def test_malformed():
    text = open(os.path.join(SRC, "example-cpu.json")).read()
    csvtext = open(os.path.join(SRC, "example-cpu.csv")).read()
    p = write("trunc.json", text[:len(text) // 2])
    expect_refusal("trunc", p, r"trunc\.json:\d+:\d+: .*truncated", "a truncated JSON")
    for cut in (1, 10, len(text) - 3, len(text) - 2):
        p = write("cut.json", text[:cut])
        rc, out, err = run(p)
        ok(rc == 1 and no_crash(rc, err), "JSON cut at %d of %d bytes: exit 1" % (cut, len(text)))

    doc = json.loads(text)
    doc["ranks"][1]["bytes_peak"] = "2622440"
    body = json.dumps(doc, indent=1)
    p = write("types.json", body)
    # where the bad value is, counted here
    lines = body.splitlines()
    ln = [i for i, l in enumerate(lines) if '"bytes_peak": "2622440"' in l][0]
    col = lines[ln].index('"2622440"') + 1
    expect_refusal("types", p, r"types\.json:%d:%d: ranks\[1\]\.bytes_peak: expected a "
                   r"non-negative integer, found a string" % (ln + 1, col),
                   "bytes_peak as a string (line and column of the value)")
    doc = json.loads(text)
    doc["ranks"][2]["host"] = 7
    expect_refusal("types2", write("types2.json", json.dumps(doc)),
                   r"ranks\[2\]\.host: expected a string, found a number", "host as a number")
    doc = json.loads(text)
    doc["ranks"][0]["bytes_current"] = -5
    expect_refusal("neg", write("neg.json", json.dumps(doc)),
                   r"ranks\[0\]\.bytes_current: expected a non-negative integer", "a negative size")
    doc = json.loads(text)
    doc["ranks"][0]["alloc_ns"] = 1.5
    expect_refusal("frac", write("frac.json", json.dumps(doc)), r"alloc_ns: expected a "
                   r"non-negative integer, found 1\.5", "a fraction where an integer goes")
    doc = json.loads(text)
    doc["ranks"] = {"0": 1}
    expect_refusal("arr", write("arr.json", json.dumps(doc)),
                   r"ranks: expected an array, found an object", "ranks as an object")
    doc = json.loads(text)
    del doc["ranks"][3]["bytes_peak"]
    expect_refusal("missing", write("missing.json", json.dumps(doc)),
                   r"ranks\[3\]\.: the object has no \"bytes_peak\"", "a missing field")
    doc = json.loads(text)
    del doc["ranks"][3]
    expect_refusal("count", write("count.json", json.dumps(doc)),
                   r"3 records, but job\.ranks says 4", "fewer records than job.ranks")
    doc = json.loads(text)
    doc["ranks"] = []
    doc["job"]["ranks"] = 0
    expect_refusal("none", write("none.json", json.dumps(doc)), r"ranks: no record",
                   "a report without records")
    doc = json.loads(text)
    doc["ranks"][3]["rank"] = 1
    expect_refusal("dup", write("dup.json", json.dumps(doc)), r"rank 1 appears twice",
                   "a rank twice")

    doc = json.loads(text)
    doc["schema"] = 5
    expect_refusal("s5", write("schema5.json", json.dumps(doc)),
                   r"schema5\.json:1:\d+: report schema 5 is newer than this rankmem-report "
                   r"reads \(schemas 1 to 4\)", "\"schema\": 5 is refused as newer")
    doc["schema"] = 0
    expect_refusal("s0", write("schema0.json", json.dumps(doc)), r"unknown report schema 0",
                   "\"schema\": 0")
    doc["schema"] = "1"
    expect_refusal("s1s", write("schema1s.json", json.dumps(doc)),
                   r"schema: expected a positive integer, found a string", "\"schema\": \"1\"")
    del doc["schema"]
    expect_refusal("s-", write("noschema.json", json.dumps(doc)), r"no \"schema\"",
                   "no schema at all")

    # Unknown keys are ignored, at every level.
    doc = json.loads(text)
    doc["future_section"] = {"x": [1, 2, {"y": None}]}
    doc["job"]["future_key"] = "z"
    for r in doc["ranks"]:
        r["future_counter"] = 12345
    rc, out, err = run(write_json("unknown.json", doc))
    rc0, out0, _ = run(os.path.join(SRC, "example-cpu.json"))
    ok(rc == 0 and out.splitlines()[1:] == out0.splitlines()[1:],
       "unknown keys (top level, job, records) are ignored: the same report")

    expect_refusal("empty", write("empty.json", ""), r"empty\.json: empty file", "an empty file")
    expect_refusal("blank", write("blank.json", "  \n\n"), r"empty file", "a file of blanks")
    expect_refusal("garbage", write("garbage.bin", "\x01\x02garbage\n"), r"not a rankmem report",
                   "garbage")
    expect_refusal("array", write("array.json", "[1, 2]"), r"a JSON array, not a rankmem report",
                   "a JSON array")
    expect_refusal("text", os.path.join(TMP, "nope", "missing.json"), r"cannot open",
                   "a file that is not there")
    expect_refusal("deep", write("deep.json", '{"schema": 1, "x": ' + "[" * 100000),
                   r"nested more than 200 deep", "nesting 100000 deep (no stack overflow)")
    expect_refusal("trail", write("trail.json", text + "}"),
                   r"unexpected '}' after the end of the document", "a byte after the document")
    expect_refusal("comma", write("comma.json", text.replace('"top_by_peak": [3, 2, 1, 0]',
                                                             '"top_by_peak": [3, 2, 1, 0,]')),
                   r"comma\.json:\d+:\d+: not valid JSON: trailing comma before '\]'", "a trailing comma")
    p = os.path.join(TMP, "textreport.txt")
    with open(p, "w") as f:
        f.write("==== rankmem memory report (finalize) ====\n\njob\n")
    expect_refusal("txt", p, r"this is the text report", "the text report")

    lines = csvtext.splitlines(True)
    p = write("trunc.csv", "".join(lines[:3]) + lines[3][:40])
    expect_refusal("trunc.csv", p, r"trunc\.csv:4: \d+ fields, the header has 34 \(a truncated",
                   "a truncated CSV")
    p = write("types.csv", csvtext.replace(",1310720,0,1310720,", ",12x,0,1310720,", 1))
    expect_refusal("types.csv", p, r"types\.csv:2:\d+: column bytes_peak: expected a "
                   r"non-negative integer, found '12x'", "a CSV cell of the wrong type")
    p = write("hdr.csv", lines[0])
    expect_refusal("hdr.csv", p, r"a CSV header and no rank rows", "a CSV header alone")
    p = write("nocol.csv", csvtext.replace("bytes_peak,", "bytes_pk,", 1))
    expect_refusal("nocol.csv", p, r"no column 'bytes_peak'", "a CSV without a needed column")
    p = write("quote.csv", csvtext + '4,4,"vm,0,4\n')
    expect_refusal("quote.csv", p, r"quoted field not closed", "an unclosed quote")
    # a CSV with an extra column and the columns in another order still reads
    import csv as csvmod
    import io
    rows = list(csvmod.reader(io.StringIO(csvtext)))
    cols = list(reversed(rows[0])) + ["future"]
    outbuf = io.StringIO()
    w = csvmod.writer(outbuf, lineterminator="\n")
    w.writerow(cols)
    for row in rows[1:]:
        d = dict(zip(rows[0], row))
        d["future"] = "x"
        w.writerow([d[c] for c in cols])
    rc, out, err = run(write("reordered.csv", outbuf.getvalue()))
    rcj, outj, _ = run(os.path.join(SRC, "example-cpu.csv"))
    ok(rc == 0 and out.splitlines()[1:] == outj.splitlines()[1:],
       "CSV columns in another order, plus an unknown one: the same report")


def test_usage():
    rc, out, err = run()
    ok(rc == 2 and "which report?" in err, "no file: usage error, exit 2")
    rc, out, err = run("--order", "size", os.path.join(SRC, "example-cpu.json"))
    ok(rc == 2 and "--order" in err, "--order size: exit 2")
    rc, out, err = run("--compare", os.path.join(SRC, "example-cpu.json"))
    ok(rc == 2 and "two reports" in err, "--compare with one file: exit 2")
    rc, out, err = run("--bogus", os.path.join(SRC, "example-cpu.json"))
    ok(rc == 2 and "unknown option '--bogus'" in err, "an unknown option: exit 2")
    rc, out, err = run("--capacity", "lots", os.path.join(SRC, "example-cpu.json"))
    ok(rc == 2 and "--capacity" in err, "--capacity lots: exit 2")
    rc, out, err = run("--all=yes", os.path.join(SRC, "example-cpu.json"))
    ok(rc == 2 and "--all takes no value" in err, "--all=yes: exit 2")
    rc, out, err = run("--help")
    ok(rc == 0 and "--compare OLD NEW" in out, "--help")
    rc, out, err = run("--svg", os.path.join(TMP, "nodir", "x.svg"),
                       os.path.join(SRC, "example-cpu.json"))
    ok(rc == 1 and "cannot write" in err, "an unwritable --svg path: exit 1")
    with open(os.path.join(SRC, "example-cpu.csv")) as f:
        rc, out, err = run("-", stdin=f.read())
    ok(rc == 0 and "rankmem memory report: - (CSV)" in out, "- reads stdin")
    rc, out, err = run("--svg", "-", os.path.join(SRC, "example-cpu.json"))
    ok(rc == 0 and out.startswith("<svg") and "aggregates" not in out,
       "--svg -: the SVG alone on stdout")


PLAN = 114


def main():
    print("1..%d" % PLAN, flush=True)
    json_out = test_example_json()
    test_example_csv(json_out)
    test_midrun()
    test_svg_example()
    test_svg_big()
    test_html()
    test_compare()
    test_schema2()
    test_malformed()
    test_usage()
    if taplib.count != PLAN:
        diag("planned %d tests, ran %d" % (PLAN, taplib.count))
    shutil.rmtree(TMP, ignore_errors=True)
    sys.exit(1 if taplib.failed or taplib.count != PLAN else 0)


if __name__ == "__main__":
    main()
