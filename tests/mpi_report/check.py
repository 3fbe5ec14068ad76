#!/usr/bin/env python3
"""TAP checks of the MPI plugin's report (run by report.mpish).

Every run is 4 ranks of report_prog under $MPIRUN, in a fresh directory.
The program's allocations are known per rank (see report_prog.c), so every
number of the report is checked against what each rank did."""

import csv
import io
import json
import math
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
MIB, KIB = 1 << 20, 1 << 10
TIMEOUT = 120  # seconds per run: a hang is a failure, not a stuck CI

builddir = os.environ.get("RKT_BUILDDIR", ".")
mpirun = os.environ["MPIRUN"]
prog = os.path.join(builddir, "tests", "mpi_report", "report_prog")



FLAGS = taplib.launcher_flags(mpirun)


def base_env():
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("RANKMEM_") or k in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID",
                                             "FLUX_JOB_ID", "COBALT_JOBID"):
            del env[k]
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               # containers often forbid Open MPI's cross-process copies
               OMPI_MCA_btl_vader_single_copy_mechanism="none",
               RANKMEM_QUIET="1")
    # An ASan build: MPI libraries leak by design.
    asan = env.get("ASAN_OPTIONS")
    env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "detect_leaks=0:verify_asan_link_order=0"
    return env


def run(cwd, env_extra=None, args=(), rank_env=None, mpmd=None):
    """Runs the program under the launcher with a time limit. Settings go
    to the ranks through env(1), whatever the launcher forwards; rank_env is
    set in the ranks only (a batch system's job id, which the launcher must
    not see). mpmd: a list of (nprocs, settings) app contexts instead of
    one of NP ranks. Returns (exit status or "timeout", stdout, stderr)."""
    settings = dict(env_extra or {})
    settings.update(rank_env or {})
    env = base_env()
    env.update(env_extra or {})
    cmd = [mpirun] + FLAGS
    for i, (n, e) in enumerate(mpmd or [(NP, {})]):
        e = dict(settings, **e)
        if i:
            cmd.append(":")
        cmd += ["-np", str(n), "env"] + ["%s=%s" % kv for kv in e.items()] + [prog] + list(args)
    # A session of its own, so that a hang is killed whole (launcher and ranks).
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


def results(err):
    """RESULT lines of the ranks, by rank."""
    res = {}
    for line in err.splitlines():
        if line.startswith("RESULT "):
            d = dict(kv.split("=", 1) for kv in line.split()[1:])
            res[int(d["rank"])] = d
    return res


def expected(r, phase):
    """What rank r's stats say at a phase: "peak" (before any free) or "end"."""
    a = (r + 1) * MIB + 1000 * r
    b = (r + 1) * 256 * KIB
    c = (r + 1) * 8 * KIB if r % 2 else 0
    if phase == "peak":
        return dict(bytes_peak=a + b, bytes_current=a + b, bytes_total=a + b, count_total=2,
                    count_peak=2, count_current=2)
    return dict(bytes_peak=a + b, bytes_current=c, bytes_total=a + b + c,
                count_total=2 + r % 2, count_peak=2, count_current=r % 2)


def close(x, y):
    if x is None or y is None:
        return x is y
    return abs(x - y) <= 1e-9 * max(1.0, abs(y))


# The aggregates of observed memory (issue 19) come from nested values.
AGG_PATHS = {"observed_gpu_peak": ("observed", "gpu", "peak"),
             "observed_served_peak": ("observed", "served", "peak")}
# The headline (schema 4, issue 29): each record's "memory"; nothing is
# observed here, so it is what the chain served (checked below).
AGG_PATHS.update({"memory_" + k: ("memory", k)
                  for k in ("peak", "current", "total", "count", "live")})
SERVED = {"peak": "bytes_peak", "current": "bytes_current", "total": "bytes_total",
          "count": "count_total", "live": "count_current"}


def value_of(rec, key):
    v = rec
    for k in AGG_PATHS.get(key, (key,)):
        v = v[k]
    return v


def flatten(rec, prefix=""):
    """A record's nested objects as dotted keys: the CSV's columns."""
    out = {}
    for k, v in rec.items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def check_aggregates(doc, recs, what):
    good = True
    for key, agg in doc["aggregates"].items():
        vals = [(value_of(r, key), r["rank"]) for r in recs]
        n = len(vals)
        mx = max(v for v, _ in vals)
        mn = min(v for v, _ in vals)
        mean = sum(v for v, _ in vals) / n
        std = math.sqrt(sum((v - mean) ** 2 for v, _ in vals) / n)
        want = dict(min=mn, max=mx, sum=sum(v for v, _ in vals),
                    max_rank=min(rk for v, rk in vals if v == mx),
                    min_rank=min(rk for v, rk in vals if v == mn))
        for k, v in want.items():
            if agg[k] != v:
                good = False
                diag("%s: aggregates.%s.%s = %r, want %r" % (what, key, k, agg[k], v))
        for k, v in (("mean", mean), ("std", std), ("imbalance", mx / mean if mean else None)):
            if not close(agg[k], v):
                good = False
                diag("%s: aggregates.%s.%s = %r, want %r" % (what, key, k, agg[k], v))
    return good


def check_json(path, res, phase, ranks, what, jobid=None):
    """Every field of a JSON report against what each rank did."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        ok(False, "%s: JSON parses (%s)" % (what, e))
        return None
    ok(doc.get("schema") == 4 and doc.get("record_version") == 3,
       "%s: schema 4, record version 3" % what)
    job = doc["job"]
    hosts = sorted({res[r]["host"][:63] for r in ranks})
    ok(job["ranks"] == len(ranks) and job["world_size"] == NP and job["nodes"] == len(hosts),
       "%s: job: %d ranks of %d, %d node(s)" % (what, len(ranks), NP, len(hosts)))
    if jobid:
        ok(job["id"] == jobid[1] and job["id_source"] == jobid[0],
           "%s: job id %s from %s" % (what, jobid[1], jobid[0]))
    else:
        ok(job["id"] == "nojob" and job["id_source"] is None, "%s: no job id: nojob" % what)
    ok(job["writer_pid"] == int(res[ranks[0]]["pid"]), "%s: written by rank 0's pid" % what)
    ok(isinstance(job["wall_s"], float) and job["wall_s"] > 0, "%s: wall time > 0" % what)
    ok(doc["phase"] == phase, "%s: phase %s" % (what, phase))
    recs = doc["ranks"]
    ok([r["rank"] for r in recs] == ranks, "%s: one record per rank, in order" % what)
    stage = "peak" if phase == "report1" else "end"
    bad = []
    for rec in recs:
        r = rec["rank"]
        want = expected(r, stage)
        mine = res[r]
        want.update(size=NP, host=mine["host"][:63], device=int(mine["device"]),
                    local_rank=int(mine["local_rank"]), local_size=NP,
                    staged_bytes=0, staged_messages=0, version=3)
        if int(mine["device"]) < 0:
            want.update(host_fallback=True, node_devices=0, device_name="", pci_bus_id="",
                        dev_total_init=0, dev_free_init=0, dev_total_final=0, dev_free_final=0)
        for k, v in want.items():
            if rec.get(k) != v:
                bad.append("rank %d: %s = %r, want %r" % (r, k, rec.get(k), v))
        if rec["env_local_rank"] not in (-1, rec["local_rank"]):
            bad.append("rank %d: env_local_rank %r" % (r, rec["env_local_rank"]))
        if not (rec["reserved_peak"] == 0 or rec["reserved_peak"] >= rec["bytes_peak"]):
            bad.append("rank %d: reserved_peak %r < peak" % (r, rec["reserved_peak"]))
        # The rank's memory is what the chain served: the program allocates
        # through rankmem's API alone (with observation on, on a GPU, CUDA
        # saw only the chain's own calls, which the headline adds as the
        # program's: the same values)
        src = "observed" if rec.get("observed", {}).get("state") == "on" else "served"
        if rec["memory"] != dict(source=src, **{k: rec[v] for k, v in SERVED.items()}):
            bad.append("rank %d: memory %r is not what the chain served" % (r, rec["memory"]))
        if rec["alloc_ns"] <= 0 or not rec["spec"] or not rec["bind_mode"]:
            bad.append("rank %d: alloc_ns %r, spec %r, bind %r" %
                       (r, rec["alloc_ns"], rec["spec"], rec["bind_mode"]))
        if rec["wall_s"] <= 0 or rec["wall_s"] > job["wall_s"]:
            bad.append("rank %d: wall_s %r (job %r)" % (r, rec["wall_s"], job["wall_s"]))
    ok(not bad, "%s: every field of every rank's record is what the rank did" % what)
    for b in bad:
        diag(b)
    ok(check_aggregates(doc, recs, what), "%s: aggregates (min, max, rank, mean, std, max/mean)"
       % what)
    peaks = sorted(ranks, key=lambda r: (-expected(r, stage)["bytes_peak"], r))
    ok(doc["top_by_peak"] == peaks[:10], "%s: top ranks by peak %s" % (what, peaks))
    cur = {r: expected(r, stage)["bytes_current"] for r in ranks}
    leak = sorted((r for r in ranks if cur[r]), key=lambda r: (-cur[r], r))
    ok([x["rank"] for x in doc["leaked_ranks"]] == leak and
       all(x["bytes"] == cur[x["rank"]] for x in doc["leaked_ranks"]),
       "%s: ranks with live bytes %s" % (what, leak))
    nodes = doc["nodes"]
    node_ok = [n["host"] for n in nodes] == hosts
    for n in nodes:
        rs = [r for r in ranks if res[r]["host"][:63] == n["host"]]
        pk = {r: expected(r, stage)["bytes_peak"] for r in rs}
        node_ok &= n["ranks"] == rs
        node_ok &= n["bytes_peak_sum"] == sum(pk.values())
        node_ok &= n["bytes_peak_max"] == max(pk.values())
        node_ok &= n["bytes_peak_max_rank"] == max(rs, key=lambda r: (pk[r], -r))
        node_ok &= n["bytes_current_sum"] == sum(cur[r] for r in rs)
    ok(node_ok, "%s: per-node summary" % what)
    if not node_ok:
        diag(json.dumps(nodes, indent=1))
    devs = [int(res[r]["device"]) for r in ranks]
    ok(job["flags"]["host_fallback_ranks"] == sum(d < 0 for d in devs),
       "%s: host fallback counted on %d ranks" % (what, sum(d < 0 for d in devs)))
    return doc


def check_csv(path, doc, what):
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        ok(False, "%s: CSV readable (%s)" % (what, e))
        return
    header, body = rows[0], rows[1:]
    ok(len(body) == len(doc["ranks"]) and all(len(r) == len(header) for r in body),
       "%s: CSV: a header and one row per rank, %d columns each" % (what, len(header)))
    bad = []
    for row, rec in zip(body, doc["ranks"]):
        d = dict(zip(header, row))
        for k, v in flatten(rec).items():
            if k not in d:
                bad.append("column %s missing" % k)
            elif isinstance(v, bool):
                if d[k] != str(int(v)):
                    bad.append("rank %d %s: %r vs %r" % (rec["rank"], k, d[k], v))
            elif isinstance(v, float):
                if abs(float(d[k]) - v) > 1e-5:
                    bad.append("rank %d %s: %r vs %r" % (rec["rank"], k, d[k], v))
            elif d[k] != str(v):
                bad.append("rank %d %s: %r vs %r" % (rec["rank"], k, d[k], v))
    ok(not bad, "%s: CSV rows say what the JSON records say" % what)
    for b in sorted(set(bad))[:20]:
        diag(b)


def check_text(text, doc, what, jobid=None):
    phase = doc["phase"]
    fin = phase == "finalize"
    n = doc["job"]["ranks"]
    # each table's header says which memory
    lab = (": device memory as the program saw it (observed)"
           if doc["ranks"][0].get("memory", {}).get("source") == "observed"
           else ": memory rankmem served")
    heads = ["==== rankmem memory report (%s) ====" % phase, "job", "nodes (%d)%s" %
             (doc["job"]["nodes"], lab), "aggregates over %d ranks%s" % (n, lab),
             "%s (%d of %d)%s" % ("ranks that leaked" if fin else "ranks with live allocations",
                                  len(doc["leaked_ranks"]), n, lab), "top ranks by peak" + lab]
    lines = text.splitlines()
    ok(all(h in lines for h in heads), "%s: text: every section (%s)" % (what, ", ".join(heads)))
    want_job = "%s (%s)" % (jobid[1], jobid[0]) if jobid else "nojob (no launcher job id)"
    ok(any(re.match(r"  job id +%s$" % re.escape(want_job), l) for l in lines),
       "%s: text: job id line says %s" % (what, want_job))
    ok(any(re.match(r"  ranks +%d on %d nodes? " % (n, doc["job"]["nodes"]), l) for l in lines),
       "%s: text: ranks and nodes" % what)
    agg = doc["aggregates"]
    good = True
    for key, label in (("bytes_peak", "peak bytes"), ("bytes_total", "total bytes"),
                       ("bytes_current", "leaked bytes" if fin else "live bytes"),
                       ("count_total", "allocations")):
        row = [l for l in lines if l.startswith("  " + label + " ")]
        cols = row[0][19:].split() if row else []
        # min (2 words for bytes) max (2) rank ...
        if key.startswith("bytes"):
            rank_col = cols[4] if len(cols) > 4 else None
        else:
            rank_col = cols[2] if len(cols) > 2 else None
        if rank_col != str(agg[key]["max_rank"]):
            good = False
            diag("%s: text row %r: rank column %r, want %r" % (what, label, rank_col,
                                                              agg[key]["max_rank"]))
    ok(good, "%s: text: aggregates name the rank of each max" % what)
    top = lines.index("top ranks by peak" + lab) if "top ranks by peak" + lab in lines else -1
    got = [int(l.split()[0]) for l in lines[top + 2:top + 2 + len(doc["top_by_peak"])]] \
        if top >= 0 else []
    ok(got == doc["top_by_peak"], "%s: text: top ranks %s" % (what, got))
    lk = [l for l in lines if l.startswith("ranks that leaked") or
          l.startswith("ranks with live")]
    if lk and doc["leaked_ranks"]:
        i = lines.index(lk[0])
        got = [int(l.split()[0]) for l in lines[i + 2:i + 2 + len(doc["leaked_ranks"])]]
        ok(got == [x["rank"] for x in doc["leaked_ranks"]],
           "%s: text: leaking ranks listed, largest first %s" % (what, got))
    else:
        ok(not doc["leaked_ranks"] and lk, "%s: text: no leak section rows" % what)
    if doc["job"]["flags"]["host_fallback_ranks"]:
        ok(any("host fallback" in l for l in lines), "%s: text: host fallback flagged" % what)


def same_as_tool(text, json_path, what):
    """The plugin's text is rankmem-report's renderer (report/text.c) over the
    plugin's JSON: the two agree line for line below the first line."""
    tool = os.path.join(os.environ.get("RKT_BUILDDIR", "."), "tools", "rankmem-report")
    if not os.path.exists(tool):
        ok(True, "# SKIP %s: rankmem-report not built" % what)
        return
    p = subprocess.run([tool, json_path], capture_output=True, text=True, timeout=120)
    mine, theirs = text.splitlines()[1:], p.stdout.splitlines()[1:]
    same = p.returncode == 0 and mine == theirs and len(mine) > 20
    ok(same, "%s: the plugin's text is rankmem-report's over the same JSON (%d lines)"
       % (what, len(mine)))
    if not same:
        for i, (x, y) in enumerate(zip(mine, theirs)):
            if x != y:
                diag("line %d: plugin %r, tool %r" % (i + 2, x, y))
                break
        diag("plugin %d lines, tool %d lines, tool rc %d %s" % (len(mine), len(theirs),
                                                             p.returncode, p.stderr[-300:]))


def files_in(d):
    return sorted(os.listdir(d))


def main():
    if not os.access(prog, os.X_OK):
        print("1..0 # SKIP %s not built" % prog)
        return 0
    top = tempfile.mkdtemp(prefix="rankmem-report-test.")
    try:
        return tests(top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def tests(top):
    # ---- 1. files in all three formats, mid-run reports, every field ----
    d = os.path.join(top, "full")
    os.mkdir(d)
    tmpl = os.path.join(d, "rep-%j-%n-%p-%%-%t")
    sub = os.path.join(d, "even-%n.json")
    jobid = ("COBALT_JOBID", "4242")
    rc, out, err = run(d, {"RANKMEM_REPORT": tmpl, "RANKMEM_REPORT_FORMAT": "text,json,csv",
                           "RKT_SUB_REPORT": sub}, ["midrun"], rank_env={jobid[0]: jobid[1]})
    res = results(err)
    if not ok(rc == 0 and sorted(res) == list(range(NP)),
              "4 ranks ran and exited 0 (rc %s)" % rc):
        diag(err[-3000:])
        print("Bail out! the program does not run under %s" % mpirun)
        return 1
    ok(all(res[r]["bad_comm"] == "1" for r in res),
       "rankmem_mpi_report(MPI_COMM_NULL) is RANKMEM_ERR_INVALID_ARGUMENT on every rank")
    ok(all(res[r]["at_peak"] == "0" for r in res), "rankmem_mpi_report mid-run: success")
    ok(all(res[r]["sub"] == "0" for r in res if r % 2 == 0),
       "rankmem_mpi_report over a sub-communicator: success")
    names = files_in(d)
    pid = res[0]["pid"]
    pat = re.compile(r"^rep-4242-4-%s-%%-(\d{8}-\d{6})(-report1|-phase1|-after_setup)?"
                     r"\.(txt|json|csv)$" % pid)
    groups = {}
    for nm in names:
        m = pat.match(nm)
        if m:
            groups.setdefault(m.group(2) or "", []).append(m.group(3))
    ok(sorted(groups) == ["", "-after_setup", "-phase1", "-report1"] and
       all(sorted(v) == ["csv", "json", "txt"] for v in groups.values()),
       "path template: %j %n %p %% %t expanded; phases suffixed; 3 formats each")
    if not ok(len(names) == 4 * 3 + 3, "nothing else written (no temporary file left): %d files"
              % len(names)):
        diag("\n".join(names))
    stamps = {pat.match(nm).group(1) for nm in names if pat.match(nm)}
    ok(len(stamps) >= 1 and all(re.match(r"^20\d{6}-\d{6}$", s) for s in stamps),
       "%%t is YYYYmmdd-HHMMSS (%s)" % ", ".join(sorted(stamps)))

    def path_of(suffix, ext):
        for nm in names:
            m = pat.match(nm)
            if m and (m.group(2) or "") == suffix and m.group(3) == ext:
                return os.path.join(d, nm)
        return os.path.join(d, "missing" + suffix + "." + ext)

    ranks = list(range(NP))
    for suffix, phase in (("", "finalize"), ("-report1", "report1"), ("-phase1", "phase1"),
                          ("-after_setup", "after_setup")):
        what = phase
        doc = check_json(path_of(suffix, "json"), res, phase, ranks, what, jobid)
        if doc is None:
            continue
        if phase in ("finalize", "report1"):
            check_csv(path_of(suffix, "csv"), doc, what)
            with open(path_of(suffix, "txt")) as f:
                text = f.read()
            check_text(text, doc, what, jobid)
            same_as_tool(text, path_of(suffix, "json"), what)
    ok("report (finalize) written to " + path_of("", "txt") in err,
       "stderr names the files written")
    # The report over the even ranks, to the path given in the call.
    even = [os.path.join(d, "even-2" + e) for e in (".txt", ".json", ".csv")]
    ok(all(os.path.exists(p) for p in even),
       "rankmem_mpi_report(comm, path): the call's path, %n = 2")
    if os.path.exists(even[1]):
        check_json(even[1], res, "report2", [0, 2], "even ranks", jobid)

    # ---- 2. an existing file is never overwritten ----
    d = os.path.join(top, "keep")
    os.mkdir(d)
    with open(os.path.join(d, "fixed.json"), "w") as f:
        f.write("precious\n")
    env = {"RANKMEM_REPORT": os.path.join(d, "fixed"), "RANKMEM_REPORT_FORMAT": "json,csv"}
    rc1 = run(d, env)[0]
    rc2 = run(d, env)[0]
    with open(os.path.join(d, "fixed.json")) as f:
        kept = f.read() == "precious\n"
    ok(rc1 == 0 and rc2 == 0 and kept, "an existing report file is left as it was")
    ok(files_in(d) == ["fixed.1.csv", "fixed.1.json", "fixed.2.csv", "fixed.2.json",
                       "fixed.json"],
       "one number for the set: .1 then .2 (%s)" % ", ".join(files_in(d)))
    try:
        with open(os.path.join(d, "fixed.2.json")) as f:
            ok(json.load(f)["job"]["ranks"] == NP, "the numbered file is a whole report")
    except (OSError, ValueError) as e:
        ok(False, "the numbered file is a whole report (%s)" % e)

    # ---- 3. an extension in the template picks the format ----
    d = os.path.join(top, "ext")
    os.mkdir(d)
    rc, out, err = run(d, {"RANKMEM_REPORT": os.path.join(d, "r-%n.csv")})
    ok(rc == 0 and files_in(d) == ["r-4.csv"], "RANKMEM_REPORT=r-%%n.csv alone: CSV only (%s)"
       % ", ".join(files_in(d)))

    # ---- 4. an unwritable path: a warning, the text on stderr, exit 0 ----
    d = os.path.join(top, "bad-path")
    os.mkdir(d)
    missing = os.path.join(d, "no-such-dir", "rep")
    rc, out, err = run(d, {"RANKMEM_REPORT": missing, "RANKMEM_REPORT_FORMAT": "text,json"})
    ok(rc == 0, "unwritable path: exit 0 (rc %s)" % rc)
    ok(err.count("cannot write '%s.txt'" % missing) == 1 and
       err.count("cannot write '%s.json'" % missing) == 1,
       "unwritable path: one warning per file, naming it")
    ok("==== rankmem memory report (finalize) ====" in err,
       "unwritable path: the text report goes to stderr instead")
    ok(files_in(d) == [], "unwritable path: nothing created")

    # ---- 5. RANKMEM_REPORT=off: nothing at all ----
    d = os.path.join(top, "off")
    os.mkdir(d)
    rc, out, err = run(d, {"RANKMEM_REPORT": "off", "RANKMEM_REPORT_FORMAT": "text,json,csv"},
                       ["midrun"])
    ok(rc == 0 and files_in(d) == [] and "rankmem memory report" not in out + err and
       "report" not in err.replace("RESULT", ""),
       "RANKMEM_REPORT=off: no file, no report, no message (mid-run calls included)")
    res = results(err)
    ok(len(res) == NP and all(res[r]["at_peak"] == "0" for r in res) and
       all(res[r]["sub"] == "0" for r in (0, 2)),
       "RANKMEM_REPORT=off: rankmem_mpi_report still succeeds")

    # ---- 6. the default: the text report on stderr, no file ----
    d = os.path.join(top, "default")
    os.mkdir(d)
    rc, out, err = run(d)
    ok(rc == 0 and files_in(d) == [] and err.count("==== rankmem memory report (finalize)") == 1
       and re.search(r"^top ranks by peak: (memory rankmem served|device memory as the program "
                     r"saw it \(observed\))$", err, re.M),
       "default: one text report on stderr, no file")

    # ---- 7. stdout, JSON ----
    rc, out, err = run(d, {"RANKMEM_REPORT": "stdout", "RANKMEM_REPORT_FORMAT": "json"})
    try:
        doc = json.loads(out[out.index("{"):])
        good = doc["job"]["ranks"] == NP and len(doc["ranks"]) == NP
    except ValueError as e:
        good = False
        diag("stdout: %s\n%s" % (e, out[:2000]))
    ok(rc == 0 and good, "RANKMEM_REPORT=stdout RANKMEM_REPORT_FORMAT=json: JSON on stdout")

    # ---- 8. bad RANKMEM_REPORT_FORMAT ----
    d = os.path.join(top, "bad-format")
    os.mkdir(d)
    rc, out, err = run(d, {"RANKMEM_REPORT": os.path.join(d, "r"),
                           "RANKMEM_REPORT_FORMAT": "bogus,json"})
    ok(rc == 0 and err.count("unknown format 'bogus' ignored") == 1 and
       files_in(d) == ["r.json"], "RANKMEM_REPORT_FORMAT=bogus,json: warned once, JSON written")
    rc, out, err = run(d, {"RANKMEM_REPORT": os.path.join(d, "s"),
                           "RANKMEM_REPORT_FORMAT": "xml"})
    ok(rc == 0 and err.count("RANKMEM_REPORT_FORMAT") == 1 and "s.txt" in files_in(d),
       "RANKMEM_REPORT_FORMAT=xml: warned once, falls back to text")

    # ---- 9. a bad template ----
    d = os.path.join(top, "bad-template")
    os.mkdir(d)
    rc, out, err = run(d, {"RANKMEM_REPORT": os.path.join(d, "r-%q")})
    ok(rc == 0 and err.count("unknown escape '%q'") == 1 and files_in(d) == [] and
       "==== rankmem memory report (finalize)" in err,
       "RANKMEM_REPORT with %q: one warning, the text report on stderr, no file")

    # ---- 10. only rank 0's settings count (the ranks still agree) ----
    d = os.path.join(top, "mpmd")
    os.mkdir(d)
    path = os.path.join(d, "m")
    rc, out, err = run(d, mpmd=[(1, {"RANKMEM_REPORT": "off"}),
                                (NP - 1, {"RANKMEM_REPORT": path})])
    ok(rc == 0 and files_in(d) == [], "rank 0 off, the others on: no report, no hang")
    rc, out, err = run(d, mpmd=[(1, {"RANKMEM_REPORT": path}),
                                (NP - 1, {"RANKMEM_REPORT": "off"})])
    ok(rc == 0 and files_in(d) == ["m.txt"], "rank 0 on, the others off: rank 0's report")

    print("1..%d" % taplib.count)
    return 1 if taplib.failed else 0


if __name__ == "__main__":
    sys.exit(main())
