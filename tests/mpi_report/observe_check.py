#!/usr/bin/env python3
"""TAP checks of observed memory in the MPI plugin's report (run by observe.mpish).

observe_prog feeds the recorder known allocations on 4 ranks (see
observe_prog.c); every observed number of the report is checked against
them: per-rank peaks by kind, leaks grouped by call site across ranks,
the timeline's shape, the phases (names, peaks, the MPI_Pcontrol mark)."""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import taplib  # noqa: E402
from taplib import ok, diag  # noqa: E402

NP = 4
KIB, MIB = 1 << 10, 1 << 20
B = 64
TIMEOUT = 120

builddir = os.environ.get("RKT_BUILDDIR", ".")
srcdir = os.environ.get("RKT_SRCDIR", ".")
mpirun = os.environ["MPIRUN"]
prog = os.path.join(builddir, "tests", "mpi_report", "observe_prog")
source = os.path.join(srcdir, "tests", "mpi_report", "observe_prog.c")



def run(cwd, settings):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("RANKMEM_"):
            del env[k]
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    asan = env.get("ASAN_OPTIONS")
    env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "detect_leaks=0:verify_asan_link_order=0"
    cmd = [mpirun] + taplib.launcher_flags(mpirun) + ["-np", str(NP), "env"] + \
        ["%s=%s" % kv for kv in settings.items()] + [prog]
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        out, err = p.communicate()
        return "timeout", out or "", err or ""


def expected(r):
    """What rank r fed (observe_prog.c)."""
    a, t = (r + 1) * MIB, 4 * (r + 1) * MIB
    leak = 2 * 64 * KIB + (MIB if r % 2 == 0 else 0)
    nleak = 2 + (r % 2 == 0)
    return dict(
        device_peak=a + 2 * MIB + t, managed_peak=512 * KIB, pinned_peak=256 * KIB,
        gpu_peak=a + 2 * MIB + 512 * KIB + t, setup_peak=a + 2 * MIB + 512 * KIB,
        gpu_current=leak, gpu_live=nleak, device_count=3 + nleak,
        gpu_total=a + 2 * MIB + 512 * KIB + t + leak)


def source_line(marker):
    with open(source) as f:
        for i, line in enumerate(f, 1):
            if marker in line:
                return i
    return -1


def main():
    top = tempfile.mkdtemp(prefix="rankmem-observe-test-")
    try:
        tests(top)
        on = os.path.join(top, "on")
        os.mkdir(on)
        tests_headline(on)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print("1..%d" % taplib.count, flush=True)
    return 1 if taplib.failed else 0


def tests(top):
    rc, out, err = run(top, {"RANKMEM_OBSERVE": "on", "RANKMEM_QUIET": "1",
                             "RANKMEM_REPORT": os.path.join(top, "r"),
                             "RANKMEM_REPORT_FORMAT": "text,json,timeline"})
    res = {}
    for line in err.splitlines():
        if line.startswith("RESULT "):
            d = dict(kv.split("=", 1) for kv in line.split()[1:])
            res[int(d["rank"])] = d
    if not ok(rc == 0 and sorted(res) == list(range(NP)), "4 ranks ran (exit %r)" % rc):
        diag(err[-3000:])
    ok(all(d.get("bad_input") == "ok" for d in res.values()),
       "rankmem_mpi_observe_alloc(NULL, ...) and rankmem_mpi_phase(NULL): an error status")
    ok(all(d.get("feeding") == "ok" for d in res.values()), "every feeding call succeeded")
    try:
        with open(os.path.join(top, "r.json")) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        ok(False, "the report parses (%s)" % e)
        return
    ok(doc["schema"] == 4 and doc["record_version"] == 3, "schema 4, record version 3")
    recs = doc["ranks"]
    obs = [r["observed"] for r in recs]
    states = {o["state"] for o in obs}
    ok(states <= {"on", "unavailable"} and len(states) == 1,
       "observation started on every rank (state %s)" % ", ".join(sorted(states)))

    bad = []
    for rec in recs:
        r, o, want = rec["rank"], rec["observed"], expected(rec["rank"])
        got = dict(device_peak=o["device"]["peak"], managed_peak=o["managed"]["peak"],
                   pinned_peak=o["pinned"]["peak"], gpu_peak=o["gpu"]["peak"],
                   gpu_current=o["gpu"]["current"], gpu_live=o["gpu"]["live"],
                   device_count=o["device"]["count"], gpu_total=o["gpu"]["total"])
        for k, v in got.items():
            if v != want[k]:
                bad.append("rank %d: %s = %r, want %r" % (r, k, v, want[k]))
        if o["vmm"]["peak"] != 0 or o["served"]["peak"] != 0 or o["unmatched_frees"] != 1:
            bad.append("rank %d: vmm %r, served %r, unmatched frees %r" % (
                r, o["vmm"]["peak"], o["served"]["peak"], o["unmatched_frees"]))
        if not o["gpu"]["peak_s"] > 0:
            bad.append("rank %d: peak_s %r" % (r, o["gpu"]["peak_s"]))
    ok(not bad, "per-rank observed peaks, current, live, counts by kind are exact")
    for b in bad:
        diag(b)

    agg = doc["aggregates"]["observed_gpu_peak"]
    peaks = [expected(r)["gpu_peak"] for r in range(NP)]
    ok(agg["max"] == max(peaks) and agg["max_rank"] == NP - 1 and agg["min"] == min(peaks) and
       agg["min_rank"] == 0 and abs(agg["mean"] - sum(peaks) / NP) < 1e-6,
       "aggregates.observed_gpu_peak: min/max(rank)/mean over ranks")

    nodes = doc["nodes"]
    ok(len(nodes) >= 1 and sum(n["observed_gpu_peak_sum"] for n in nodes) == sum(peaks) and
       max(n["observed_gpu_peak_max"] for n in nodes) == max(peaks),
       "nodes: observed GPU peak sum and max per node")

    # leaks by call site
    leaks = doc.get("leaks", [])
    ok(len(leaks) == 2, "two leak sites across ranks (%d)" % len(leaks))
    by_ranks = sorted(leaks, key=lambda x: -x["ranks"])
    if len(by_ranks) == 2:
        a, b = by_ranks
        ok(a["ranks"] == NP and a["bytes"] == NP * 128 * KIB and a["count"] == 2 * NP and
           a["first_rank"] == 0, "leak_a: %d of %d ranks, %d bytes in %d blocks" %
           (a["ranks"], NP, a["bytes"], a["count"]))
        ok(b["ranks"] == NP // 2 and b["bytes"] == NP // 2 * MIB and b["count"] == NP // 2 and
           b["first_rank"] == 0, "leak_b: %d of %d ranks (the even ones), %d bytes" %
           (b["ranks"], NP, b["bytes"]))
        ok(a["site"] != b["site"] and a["kind"] == "device",
           "distinct sites: %r, %r" % (a["site"], b["site"]))
        # Named by file and line where addr2line finds them (the program has -g).
        la, lb = source_line("leak site A"), source_line("leak site B")
        named = ("observe_prog.c:%d" % la in a["site"] and "observe_prog.c:%d" % lb in b["site"])
        by_symbol = "leak_a" in a["site"] and "leak_b" in b["site"]
        if named or by_symbol:
            ok(True, "sites name where the leaks were made")
        else:
            ok(True, "# SKIP sites without lines or symbols here: %r, %r" % (a["site"], b["site"]))
    else:
        for _ in range(4):
            ok(False, "leak sites")
        diag(json.dumps(leaks, indent=1))

    # timeline
    tl = doc["timeline"]
    rows = tl["bytes"]
    ok(tl["buckets"] == B and len(rows) == NP and all(len(x) == B for x in rows) and
       tl["t_end_s"] > 0.2, "timeline: %d ranks x %d buckets over %.3f s" %
       (len(rows), tl["buckets"], tl["t_end_s"]))
    good = all(max(rows[r]) == expected(r)["gpu_peak"] for r in range(NP))
    ok(good, "timeline: each rank's max is its observed peak")
    ok(all(rows[r][-1] == expected(r)["gpu_current"] for r in range(NP)),
       "timeline: each rank ends at its leaked bytes")
    # the peak comes after the start and before the end (the pauses)
    ok(all(0 < rows[r].index(max(rows[r])) < B - 1 for r in range(NP)),
       "timeline: the peak is inside the run, not at an edge")
    try:
        with open(os.path.join(top, "r-timeline.csv"), newline="") as f:
            trows = list(csv.DictReader(f))
        ok(len(trows) == NP * B and
           all(int(x["bytes"]) == rows[int(x["rank"])][int(x["bucket"])] for x in trows),
           "the timeline CSV says what the JSON says (%d rows)" % len(trows))
    except (OSError, KeyError, ValueError) as e:
        ok(False, "the timeline CSV (%s)" % e)

    # phases: start, setup, solve, checkpoint (MPI_Pcontrol), finish
    ph = doc["phases"]
    names = [p["name"] for p in ph]
    ok(names == ["start", "setup", "solve", "checkpoint", "finish"],
       "phases in order, MPI_Pcontrol(3, label) among them: %s" % names)
    if len(ph) == 5:
        setup, solve, fin = ph[1], ph[2], ph[4]
        sp = [expected(r)["setup_peak"] for r in range(NP)]
        ok(setup["peak_min"] == min(sp) and setup["peak_max"] == max(sp) and
           setup["peak_max_rank"] == NP - 1 and abs(setup["peak_mean"] - sum(sp) / NP) < 1e-6,
           "phase setup: peak min/max(rank)/mean")
        ok(solve["peak_max"] == max(peaks) and solve["peak_min"] == min(peaks) and
           solve["peak_max_rank"] == NP - 1, "phase solve: the job's peak")
        fp = [expected(r)["gpu_current"] for r in range(NP)]
        ok(fin["peak_max"] == max(fp) and fin["peak_max_rank"] == 0 and fin["peak_min"] == min(fp),
           "phase finish: the leaks, largest on rank 0")
        ok(all(ph[i]["t_start_s"] <= ph[i + 1]["t_start_s"] for i in range(4)),
           "phases start in order")
    else:
        for _ in range(4):
            ok(False, "phases")
        diag(json.dumps(ph, indent=1))

    # the text report
    try:
        with open(os.path.join(top, "r.txt")) as f:
            text = f.read()
    except OSError as e:
        text = ""
        diag(e)
    unobserved = states == {"unavailable"}
    ok(("device allocations not observed: " in text and "(4 of 4 ranks)" in text) ==
       unobserved, "text: one 'not observed' line when observation is unavailable")
    ok(re.search(r"\n  .+: 4 of 4 ranks, 512\.00 KiB in 8 blocks", text) is not None and
       re.search(r"\n  .+: 2 of 4 ranks, 2\.00 MiB in 2 blocks", text) is not None,
       "text: leaks by call site with rank counts and bytes")
    # rankmem-report reads what the plugin wrote (one field table for both)
    tool = os.path.join(builddir, "tools", "rankmem-report")
    if os.path.exists(tool):
        p = subprocess.run([tool, os.path.join(top, "r.json"), "--all"], capture_output=True,
                           text=True, timeout=120)
        want_sites = [l for l in text.splitlines() if re.match(r"  .+: \d+ of 4 ranks, ", l)]
        got_sites = [l for l in p.stdout.splitlines() if re.match(r"  .+: \d+ of 4 ranks, ", l)]
        ok(p.returncode == 0 and want_sites and got_sites == want_sites and
           "observed device memory" in p.stdout and "\n  solve " in p.stdout,
           "rankmem-report reads the plugin's schema-2 report: the same leak sites, phases")
        if p.returncode:
            diag(p.stderr)
    else:
        ok(True, "# SKIP rankmem-report not built")
    if taplib.failed:
        diag(text[-4000:])



def fmt_bytes(v):
    if v < 1024:
        return "%d B" % v
    units = ["KiB", "MiB", "GiB", "TiB"]
    u = -1
    while v >= 1024 and u < len(units) - 1:
        v /= 1024.0
        u += 1
    return "%.2f %s" % (v, units[u])


def tests_headline(top):
    """Issue 29, "one story": observation on, nothing served by rankmem's
    chain (its counters are 0), the program's memory observed. Every
    headline (text, JSON, CSV, the tool's text and SVG) must be the
    observed one, and the ranks that leaked must be what the leaks by call
    site say."""
    label = "device memory as the program saw it (observed)"
    rc, out, err = run(top, {"RANKMEM_OBSERVE": "on", "RANKMEM_QUIET": "1", "RKT_OBS_ON": "1",
                             "RANKMEM_REPORT": os.path.join(top, "r"),
                             "RANKMEM_REPORT_FORMAT": "text,json,csv"})
    if not ok(rc == 0, "headline: 4 ranks ran with observation on (exit %r)" % rc):
        diag(err[-3000:])
    try:
        with open(os.path.join(top, "r.json")) as f:
            doc = json.load(f)
        with open(os.path.join(top, "r.txt")) as f:
            text = f.read()
        with open(os.path.join(top, "r.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, ValueError) as e:
        ok(False, "headline: the report parses (%s)" % e)
        return
    recs = doc["ranks"]
    exp = {r: expected(r) for r in range(NP)}
    ok(all(x["observed"]["state"] == "on" and x["bytes_peak"] == 0 and
           x["bytes_current"] == 0 for x in recs),
       "headline: observation on, served 0 on every rank (the case of the issue)")
    ok(all(x["memory"] == dict(source="observed", peak=exp[x["rank"]]["gpu_peak"],
                               current=exp[x["rank"]]["gpu_current"],
                               total=exp[x["rank"]]["gpu_total"],
                               count=x["observed"]["gpu"]["count"],
                               live=exp[x["rank"]]["gpu_live"]) for x in recs),
       "headline: each record's memory is the observed GPU memory")
    ok(doc["job"]["memory"] == dict(source="observed", observed_ranks=NP, label=label),
       "headline: the job says its headline is observed")
    peaks = sorted(range(NP), key=lambda r: (-exp[r]["gpu_peak"], r))
    ok(doc["top_by_peak"] == peaks, "headline: top ranks by observed peak %s" % peaks)
    agg = doc["aggregates"]["memory_peak"]
    ok(agg["max"] == exp[peaks[0]]["gpu_peak"] and agg["max_rank"] == peaks[0] and
       agg["min"] == exp[peaks[-1]]["gpu_peak"], "headline: aggregates.memory_peak observed")
    node = doc["nodes"][0] if len(doc["nodes"]) == 1 else None
    ok(node is not None and node["memory_peak_sum"] == sum(e["gpu_peak"] for e in exp.values())
       and node["memory_peak_max_rank"] == peaks[0] and node["bytes_peak_sum"] == 0,
       "headline: the node's peak sum is observed; the served sum (0) kept beside it")
    leak = sorted((r for r in range(NP) if exp[r]["gpu_current"]),
                  key=lambda r: (-exp[r]["gpu_current"], r))
    lr = doc["leaked_ranks"]
    ok([x["rank"] for x in lr] == leak and
       all(x["bytes"] == exp[x["rank"]]["gpu_current"] and x["source"] == "observed" and
           x["served_bytes"] == 0 for x in lr),
       "headline: leaked_ranks are the observed leaks %s (served 0 beside)" % leak)
    # one source: the ranks that leaked and the leaks by call site agree
    ok(doc["leaks"] and sum(x["bytes"] for x in lr) == sum(s["bytes"] for s in doc["leaks"]) and
       sum(x["allocations"] for x in lr) == sum(s["count"] for s in doc["leaks"]) and
       max(s["ranks"] for s in doc["leaks"]) == len(lr),
       "headline: ranks that leaked and leaks by call site count the same blocks")
    ok(len(rows) == NP and all(r["memory.source"] == "observed" and
                               int(r["memory.peak"]) == exp[int(r["rank"])]["gpu_peak"] and
                               int(r["memory.current"]) == exp[int(r["rank"])]["gpu_current"]
                               for r in rows),
       "headline: the CSV's memory.* columns are observed")
    lines = text.splitlines()
    heads = ["nodes (1): " + label, "aggregates over 4 ranks: " + label,
             "ranks that leaked (%d of 4): %s" % (len(leak), label),
             "top ranks by peak: " + label]
    ok(all(h in lines for h in heads), "headline: text: each table says it is observed")

    def rows_after(title, k):
        i = lines.index(title) if title in lines else -1
        return lines[i + 2:i + 2 + k] if i >= 0 else []
    top_rows = rows_after(heads[3], NP)
    ok([int(l.split()[0]) for l in top_rows] == peaks and
       all(fmt_bytes(exp[int(l.split()[0])]["gpu_peak"]) in l for l in top_rows),
       "headline: text: top ranks by peak with their observed peaks")
    lk_rows = rows_after(heads[2], len(leak))
    ok([int(l.split()[0]) for l in lk_rows] == leak and
       all(fmt_bytes(exp[int(l.split()[0])]["gpu_current"]) in l for l in lk_rows),
       "headline: text: ranks that leaked with their observed leaks")
    pk = [l for l in lines if l.startswith("  peak bytes ")]
    ok(pk and fmt_bytes(exp[peaks[0]]["gpu_peak"]) in pk[0] and
       any(l.startswith("  served peak ") for l in lines),
       "headline: text: the peak row is observed, the served peak a row of its own")
    tool = os.path.join(builddir, "tools", "rankmem-report")
    if not os.path.exists(tool):
        ok(True, "# SKIP rankmem-report not built")
        return
    svg = os.path.join(top, "r.svg")
    p = subprocess.run([tool, os.path.join(top, "r.json"), "--svg", svg], capture_output=True,
                       text=True, timeout=120)
    tl = p.stdout.splitlines()
    ok(p.returncode == 0 and all(h in tl for h in heads),
       "headline: rankmem-report's text says the same tables are observed")
    try:
        import xml.etree.ElementTree as ET
        root = ET.parse(svg).getroot()
    except (OSError, ET.ParseError) as e:
        ok(False, "headline: the SVG parses (%s)" % e)
        return
    ns = "{http://www.w3.org/2000/svg}"

    def bars(gid):
        g = root.find(".//%sg[@id='%s']" % (ns, gid))
        return {int(r.get("data-rank")): int(r.get("data-bytes"))
                for r in (g.findall("%srect" % ns) if g is not None else [])
                if r.get("data-rank") is not None}
    title = root.find(".//%stext[@id='peak-title']" % ns)
    ok(title is not None and label in "".join(title.itertext()) and
       bars("peak-panel") == {r: exp[r]["gpu_peak"] for r in range(NP)},
       "headline: SVG: the peak bars are the observed peaks")
    ok(root.find(".//%stext[@id='no-leaks']" % ns) is None and
       bars("leaked-panel") == {r: exp[r]["gpu_current"] for r in range(NP)},
       "headline: SVG: the leaked bars are the observed leaks (no 'no rank leaked')")


if __name__ == "__main__":
    sys.exit(main())
