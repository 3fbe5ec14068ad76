"""TAP for rankmem's Python test scripts (tests/mpi_report/*.py,
tests/report_tool/check.py): one ok() line per check, diagnostics as
comments, and the launcher's flags. Counts live here: taplib.count and
taplib.failed."""
import subprocess
import sys

count = 0
failed = 0


def ok(cond, name):
    global count, failed
    count += 1
    if not cond:
        failed += 1
    print("%sok %d - %s" % ("" if cond else "not ", count, name), flush=True)
    return cond


def diag(text):
    for line in str(text).splitlines():
        print("# " + line)
    sys.stdout.flush()


def launcher_version(mpirun):
    """What the launcher's --version prints ("" when it cannot say)."""
    try:
        return subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def launcher_flags(mpirun):
    """--oversubscribe where the launcher is Open MPI's (4 ranks, 2 cores)."""
    out = launcher_version(mpirun)
    return ["--oversubscribe"] if ("Open MPI" in out or "OpenRTE" in out) else []
