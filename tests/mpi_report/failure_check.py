#!/usr/bin/env python3
"""TAP checks of the record of a rank whose job fails (issue 29, run by failure.mpish).

failure_prog fails one rank of 4 in one way per run (failure_prog.c); each
run's directory must hold that rank's record saying what happened, and
rankmem-report must read it. Singleton runs (no launcher) check that the
process ends with the same status or signal as without rankmem."""

import glob
import json
import os
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
TIMEOUT = 60
builddir = os.path.abspath(os.environ.get("RKT_BUILDDIR", "."))
mpirun = os.environ["MPIRUN"]
if os.sep in mpirun:
    mpirun = os.path.abspath(mpirun)
prog = os.path.join(builddir, "tests", "mpi_report", "failure_prog")
tool = os.path.join(builddir, "tools", "rankmem-report")
LIMIT = "limit(bytes=4MiB)>system"


# MPICH's launcher: its library handles SIGUSR1 itself (the rank goes on).
HYDRA = "HYDRA" in taplib.launcher_version(mpirun)


def env_for(settings):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("RANKMEM_"):
            del env[k]
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", RANKMEM_QUIET="1")
    asan = env.get("ASAN_OPTIONS")
    env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "detect_leaks=0:verify_asan_link_order=0"
    env.update(settings)
    return env


def run(cmd, cwd, settings):
    p = subprocess.Popen(cmd, cwd=cwd, env=env_for(settings), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                         start_new_session=True)
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


def mpi(cwd, args, settings):
    cmd = [mpirun] + taplib.launcher_flags(mpirun) + ["-np", str(NP), prog] + args
    return run(cmd, cwd, settings)


def record(d, rank):
    files = glob.glob(os.path.join(d, "*.rank-%d.json" % rank))
    if len(files) != 1:
        return None
    with open(files[0]) as f:
        return json.load(f)


def fresh():
    d = tempfile.mkdtemp(prefix="rk-fail-")
    return d


def check_failure(name, d, rank, kind, trigger, code, rc, err):
    doc = record(d, rank)
    if not ok(doc is not None, "%s: rank %d left its record" % (name, rank)):
        diag("rc %s; files %s; stderr: %s" % (rc, os.listdir(d), err[-800:]))
        return None
    r = doc["ranks"][0]
    f = r["failure"]
    ok(doc["schema"] == 4 and doc["phase"] == "failure" and r["rank"] == rank,
       "%s: a schema 4 failure document of rank %d" % (name, rank))
    good = f["kind"] == kind and f["trigger"] == trigger and f["code"] == code
    if not ok(good, "%s: the record says %s %s %d" % (name, kind, trigger, code)):
        diag(json.dumps(f))
    # what the rank held: (rank + 1) x 256 KiB through the chain
    ok(r["bytes_current"] == (rank + 1) << 18,
       "%s: the rank's live bytes at the failure (%d)" % (name, r["bytes_current"]))
    return doc


def main():
    dirs = []

    # ---- out of memory, recovered: the finalize report names it, no file left
    d = fresh()
    dirs.append(d)
    rc, out, err = mpi(d, ["oom", "1"], {"RANKMEM_RESOURCE": LIMIT,
                                         "RANKMEM_REPORT": os.path.join(d, "rep.json")})
    if not ok(rc == 0, "oom: a rank that recovers from an out-of-memory finishes (rc %s)" % rc):
        diag(err[-1500:])
    ok("out of memory: limit reached: 64.00 MiB" in err and err.count("out of memory:") == 1,
       "oom: one sentence of diagnosis on stderr, once")
    ok("detail 'limit reached: limit: allocate of 67108864" in out,
       "oom: the caller still reads the chain's own error detail")
    ok(not glob.glob(os.path.join(d, "*.rank-*.json")),
       "oom: the rank's failure file is gone once the finalize report holds it")
    try:
        with open(os.path.join(d, "rep.json")) as f:
            rep = json.load(f)
        f1 = rep["ranks"][1]["failure"]["oom"]
        ok(f1["count"] == 1 and f1["bytes"] == 64 << 20 and f1["api"] == "rankmem_allocate"
           and "failure_prog.c" in f1["site"], "oom: the finalize report names the event "
           "(count, bytes, API, call site in the program)")
        ok(rep.get("refused_ranks") == [{"rank": 1, "count": 1, "bytes": 64 << 20}],
           "oom: the finalize report lists the rank in refused_ranks")
        ok(all(rep["ranks"][i]["failure"]["oom"]["count"] == 0 for i in (0, 2, 3)),
           "oom: the other ranks have none")
        ok(rep["ranks"][1]["failure"]["diagnosis"].startswith("limit reached"),
           "oom: the diagnosis is in the finalize report")
    except (OSError, ValueError, KeyError) as e:
        ok(False, "oom: the finalize report (%s)" % e)
        for _ in range(3):
            ok(False, "oom: (no report)")
    rc, out, err = run([tool, os.path.join(d, "rep.json")], d, {})
    ok(rc == 0 and "allocations refused (1 rank lived through them)" in out,
       "oom: rankmem-report shows the refused allocation of a finished job")

    # ---- out of memory, then MPI_Abort
    d = fresh()
    dirs.append(d)
    rc, out, err = mpi(d, ["oom-abort", "1"], {"RANKMEM_RESOURCE": LIMIT,
                                               "RANKMEM_REPORT": os.path.join(d, "rep-%j.json")})
    ok(rc != 0, "oom-abort: the job fails (rc %s)" % rc)
    doc = check_failure("oom-abort", d, 1, "abort", "MPI_Abort", 3, rc, err)
    if doc:
        o = doc["ranks"][0]["failure"]["oom"]
        ok(o["count"] == 1 and o["bytes"] == 64 << 20 and o["source"] == "rankmem",
           "oom-abort: the record keeps the refused request")
        ok(doc["job"]["id"] != "nojob", "oom-abort: the launcher's job id (%s from %s)" % (
            doc["job"]["id"], doc["job"]["id_source"]))
    rc, out, err = run([tool, d], d, {})
    ok(rc == 0 and out.startswith("failure:") and "rank 1 (" in out and
       "MPI_Abort (errorcode 3)" in out and "limit reached" in out,
       "oom-abort: rankmem-report on the directory leads with the failure")
    if rc != 0:
        diag(err[-600:])

    # ---- each signal to one rank of 4
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGXCPU,
                signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT):
        d = fresh()
        dirs.append(d)
        name = sig.name
        rc, out, err = mpi(d, ["signal", "2", str(int(sig))],
                           {"RANKMEM_REPORT": os.path.join(d, "rep")})
        if HYDRA and sig == signal.SIGUSR1:
            # MPICH's own handler takes it and the rank goes on: no failure
            ok(rc == 0, "%s (MPICH handles it): the job finishes (rc %s)" % (name, rc))
            ok("malloc called in the signal path" not in err,
               "%s: the signal path called no malloc" % name)
            ok(record(d, 2) is None, "%s (MPICH handles it): no failure record left" % name)
            continue
        ok(rc != 0 and rc != "timeout", "%s: the job fails (rc %s)" % (name, rc))
        ok("malloc called in the signal path" not in err,
           "%s: the signal path called no malloc" % name)
        check_failure(name, d, 2, "signal", name, int(sig), rc, err)

    # ---- a real fault
    d = fresh()
    dirs.append(d)
    rc, out, err = mpi(d, ["segv", "0"], {"RANKMEM_REPORT": os.path.join(d, "rep")})
    check_failure("a real SIGSEGV", d, 0, "signal", "SIGSEGV", 11, rc, err)

    # ---- MPI_Abort, exit(1)
    d = fresh()
    dirs.append(d)
    rc, out, err = mpi(d, ["abort", "3", "7"], {"RANKMEM_REPORT": os.path.join(d, "rep")})
    check_failure("MPI_Abort", d, 3, "abort", "MPI_Abort", 7, rc, err)
    d = fresh()
    dirs.append(d)
    rc, out, err = mpi(d, ["exit", "1", "1"], {})  # default location: the current directory
    doc = check_failure("exit(1)", d, 1, "exit", "exit", 1, rc, err)
    ok(bool(glob.glob(os.path.join(d, "rankmem-failure-*.rank-1.json"))),
       "exit(1): with RANKMEM_REPORT unset the record is rankmem-failure-JOB.rank-N.json here")

    # ---- SIGKILL with RANKMEM_REPORT_INTERVAL: the last periodic record
    d = fresh()
    dirs.append(d)
    rc, out, err = mpi(d, ["kill", "0", "600"], {"RANKMEM_REPORT": os.path.join(d, "rep"),
                                                 "RANKMEM_REPORT_INTERVAL": "100ms"})
    doc = record(d, 0)
    ok(doc is not None and doc["phase"] == "interval" and doc["ranks"][0]["wall_s"] >= 0.3 and
       doc["ranks"][0]["bytes_current"] == 1 << 18,
       "SIGKILL: RANKMEM_REPORT_INTERVAL=100ms left the last periodic record (%s s)" % (
           doc["ranks"][0]["wall_s"] if doc else None))
    ok(not glob.glob(os.path.join(d, ".*tmp*")), "SIGKILL: no temporary file left")
    rc, out, err = run([prog, "finish"], d, {"RANKMEM_REPORT_INTERVAL": "5ms"})
    ok(rc == 1 and "RANKMEM_REPORT_INTERVAL" in err and "'5ms'" in err,
       "RANKMEM_REPORT_INTERVAL=5ms is refused clearly (rc %s)" % rc)
    rc, out, err = run([prog, "finish"], d, {"RANKMEM_ON_FAILURE": "maybe"})
    ok(rc == 1 and "RANKMEM_ON_FAILURE" in err, "RANKMEM_ON_FAILURE=maybe is refused clearly")

    # ---- singletons: the same status or signal as without rankmem
    for args, what in ((["signal", "0", str(int(signal.SIGTERM))], "SIGTERM"),
                       (["signal", "0", str(int(signal.SIGUSR1))], "SIGUSR1"),
                       (["segv", "0"], "a real SIGSEGV"),
                       (["exit", "0", "3"], "exit(3)"),
                       (["signal", "0", str(int(signal.SIGTERM)), "handlers"],
                        "SIGTERM with the program's own handler"),
                       (["segv", "0", "0", "handlers"], "SIGSEGV with the program's own handler")):
        d = fresh()
        dirs.append(d)
        base = run([prog] + args, d, {"RANKMEM_ON_FAILURE": "off"})
        mine = run([prog] + args, d, {"RANKMEM_REPORT": os.path.join(d, "rep")})
        same = base[0] == mine[0] and ("user handler" in base[1]) == ("user handler" in mine[1])
        # MPICH handles SIGUSR1 itself, and so did the GPU machine's Open MPI
        # 4.1.6 singleton: the rank goes on, with or without rankmem
        handled = "SIGUSR1" in what and base[0] == 0
        if not ok(same and (base[0] != 0 or handled),
                  "singleton, %s: ends as without rankmem (%s, %s)" % (
                what, base[0], mine[0])):
            diag(mine[2][-600:])
        if "handlers" in args:
            ok("user handler" in mine[1], "singleton, %s: the program's handler ran" % what)
        if base[0] == 0:  # handled by the MPI library (MPICH's SIGUSR1): the rank went on
            ok(record(d, 0) is None, "singleton, %s: handled, so no failure record left" % what)
        else:
            ok(record(d, 0) is not None, "singleton, %s: the record was written" % what)

    # ---- faults in the report (issue 31): one allocation of the plugin's
    # failing at a time in rankmem_mpi_report, then every one, then every one
    # in the finalize report, on rank 0 (which writes) or rank 1: every rank
    # finishes, every report written is whole, and a missing one is said
    for who in (0, 1):
        d = fresh()
        dirs.append(d)
        rc, out, err = mpi(d, ["report-fault", str(who), d],
                           {"RANKMEM_REPORT": os.path.join(d, "rep"),
                            "RANKMEM_REPORT_FORMAT": "json"})
        name = "report faults on rank %d" % who
        if "report-fault: skipped" in out:
            ok(True, "# SKIP %s: a sanitizer's malloc cannot be replaced" % name)
            continue
        if not ok(rc == 0 and all("rank %d finished" % i in out for i in range(NP)),
                  "%s: every rank finishes (rc %s)" % (name, rc)):
            diag(out[-600:] + err[-1200:])
        k = int(out.split("report allocations ")[1].split()[0]) if "report allocations" in out else 0
        ok(k > 0 and "status" not in out,
           "%s: %d allocations, each failed once; every call returned success or "
           "RANKMEM_ERR_INTERNAL" % (name, k))
        whole, missing, bad = 0, 0, []
        for n in range(1, k + 3):
            f = os.path.join(d, "fault-%d.json" % n)
            if not os.path.exists(f):
                missing += 1
                continue
            try:
                with open(f) as fh:
                    doc = json.load(fh)
                ranks = doc["ranks"]
                good = len(ranks) == NP and all(
                    ranks[i]["bytes_current"] == (i + 1) << 18 for i in range(NP))
            except (ValueError, KeyError, TypeError):
                good = False
            if good:
                whole += 1
            else:
                bad.append(n)
        said = err.count("no report") + err.count("text report follows")
        ok(not bad, "%s: every report written is whole, each rank's live bytes right "
           "(%d whole, %d not written; damaged: %s)" % (name, whole, missing, bad))
        ok(os.path.exists(os.path.join(d, "fault-%d.json" % (k + 1))),
           "%s: with nothing failing the report is written again" % name)
        ok(missing <= said, "%s: each report not written is said on stderr (%d, %d lines)" % (
            name, missing, said))
        ok(not glob.glob(os.path.join(d, "*.rank-*.json")),
           "%s: no failure record left (the job finished)" % name)

    # ---- rankmem-report on missing, truncated and corrupt files
    d = fresh()
    dirs.append(d)
    # Periodic records first: MPICH's launcher ends the other ranks with
    # SIGKILL on MPI_Abort (Open MPI's with SIGTERM, which they record).
    rc, out, err = mpi(d, ["abort", "0", "5"], {"RANKMEM_REPORT": os.path.join(d, "rep"),
                                                "RANKMEM_REPORT_INTERVAL": "100ms",
                                                "RKT_FAIL_DELAY_MS": "400"})
    files = sorted(glob.glob(os.path.join(d, "*.rank-*.json")))
    if len(files) == NP:
        os.unlink(files[1])                      # rank 1: missing
        with open(files[2]) as f:
            text = f.read()
        with open(files[2], "w") as f:           # rank 2: truncated
            f.write(text[:len(text) // 2])
        with open(files[3], "w") as f:           # rank 3: corrupt
            f.write("{\"schema\": 3, garbage")
        rc, out, err = run([tool, d], d, {})
        ok(rc == 1, "damaged files: exit status 1 (rc %s)" % rc)
        ok(os.path.basename(files[2]) in err and os.path.basename(files[3]) in err,
           "damaged files: the truncated and the corrupt file are named")
        ok("MPI_Abort (errorcode 5)" in out and "rank 0 (" in out,
           "damaged files: the rank that could be read is still reported")
        ok("no record from 3 ranks" in out and " 1, 2, 3" in out,
           "damaged files: the ranks without a readable record are listed")
        rc, out, err = run([tool, files[0], files[2]], d, {})
        ok(rc == 1 and "MPI_Abort" in out, "damaged files: the per-rank files given one by one")
        # one rank in two files: its failure record is kept over a periodic one,
        # whichever is read first
        dd = fresh()
        dirs.append(dd)
        with open(files[0]) as f:
            doc = json.load(f)
        shutil.copy(files[0], os.path.join(dd, "b.rank-0.json"))
        doc["phase"] = "interval"
        doc["ranks"][0]["failure"]["kind"] = ""
        with open(os.path.join(dd, "a.rank-0.json"), "w") as f:
            json.dump(doc, f)
        rc, out, err = run([tool, dd], dd, {})
        ok(rc == 0 and "rank 0 is in both" in err and "MPI_Abort (errorcode 5)" in out,
           "one rank in two files: said, and its failure record is the one used")
        if rc != 0 or "rank 0 is in both" not in err:
            diag(err[-600:])
    else:
        diag("abort run left %s" % files)
        for _ in range(5):
            ok(False, "damaged files: (the job left no records)")

    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    print("1..%d" % taplib.count, flush=True)


main()
