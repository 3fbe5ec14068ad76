#!/bin/sh
# rankmem-report on a failed job of many ranks (issue 29): N per-rank failure
# records (default 100,000) in one directory, merged into one report (text,
# then the SVG and HTML pictures); prints the time and the peak memory of
# each as Markdown.
#
#   bench/failure-merge-bench.sh [BUILDDIR] [N]
#
# The records are copies of real ones: tests/mpi_report/failure_prog is run
# once with 2 ranks (rank 1 calls MPI_Abort, rank 0 is ended by SIGTERM) and
# its two records are written again for N ranks over N/64 nodes, each with
# its own rank, host, live bytes and timeline. Needs python3, GNU time
# (/usr/bin/time), MPIRUN (default mpirun) and ~2.5 KiB of disk per rank.
# Exit status 0; 1 when a step fails.
B=${1:-.}
N=${2:-100000}
MPIRUN=${MPIRUN:-mpirun}
prog=$B/tests/mpi_report/failure_prog
tool=$B/tools/rankmem-report
for f in "$prog" "$tool"; do
    [ -x "$f" ] || { echo "failure-merge-bench.sh: no $f (make check in $B builds it)" >&2; exit 1; }
done
[ -x /usr/bin/time ] || { echo "failure-merge-bench.sh: no /usr/bin/time (GNU time)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
tmp=${TMPDIR:-/tmp}/failure-merge.$$
mkdir -p "$tmp/seed" "$tmp/job" || exit 1
trap 'rm -rf "$tmp"' EXIT
flags=
"$MPIRUN" --version 2>&1 | grep -qi 'open mpi\|open-mpi\|openrte' && flags=--oversubscribe
# shellcheck disable=SC2086
timeout 120 "$MPIRUN" $flags -np 2 env RANKMEM_REPORT="$tmp/seed/rep" "$prog" abort 1 5 \
    >"$tmp/seed.out" 2>&1
ls "$tmp/seed/"*.rank-0.json "$tmp/seed/"*.rank-1.json >/dev/null 2>&1 ||
    { echo "failure-merge-bench.sh: the seed job left no records" >&2; cat "$tmp/seed.out" >&2; exit 1; }

python3 - "$tmp/seed" "$tmp/job" "$N" <<'EOF' || exit 1
import glob, json, os, sys
seed, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
docs = [json.load(open(glob.glob(os.path.join(seed, "*.rank-%d.json" % r))[0])) for r in (0, 1)]
for rank in range(n):
    d = docs[1] if rank == n // 2 else docs[0]   # one MPI_Abort, the rest SIGTERM
    d = json.loads(json.dumps(d))
    d["job"]["world_size"] = n
    d["job"]["nodes"] = max(1, n // 64)
    r = d["ranks"][0]
    r["rank"], r["size"] = rank, n
    r["local_rank"], r["local_size"], r["env_local_rank"] = rank % 64, 64, rank % 64
    r["host"] = d["job"]["writer_host"] = "node%05d" % (rank // 64)
    live = (1 + rank % 97) << 16
    for k in ("bytes_current", "bytes_peak", "bytes_total"):
        r[k] = live
    r["memory"].update(current=live, peak=live, total=live)
    d["timeline"]["bytes"] = [[live * (i + 1) // 64 for i in range(64)]]
    with open(os.path.join(out, "rep.rank-%d.json" % rank), "w") as f:
        json.dump(d, f)
EOF

# tm NAME ARGS...: the tool's wall time (s) and peak RSS (KiB) in $tmp/NAME.tm
tm() {
    _n=$1
    shift
    /usr/bin/time -f '%e %M' -o "$tmp/$_n.tm" "$tool" "$@" >"$tmp/$_n.out" 2>"$tmp/$_n.err"
    echo $? >"$tmp/$_n.rc"
}
tm text "$tmp/job"
tm pictures "$tmp/job" --svg "$tmp/job.svg" --html "$tmp/job.html" -q
du=$(du -sk "$tmp/job" | cut -f1)
echo "### rankmem-report on a failed job of $N ranks (bench/failure-merge-bench.sh)"
echo
echo "$(uname -n), $(nproc) cores, $(date -u +%Y-%m-%d); $N per-rank records, $((du / 1024)) MiB on disk."
echo
echo "| output | exit status | wall (s) | peak RSS (MiB) |"
echo "| --- | ---: | ---: | ---: |"
for n in text pictures; do
    read -r t m <"$tmp/$n.tm"
    awk -v n="$n" -v rc="$(cat "$tmp/$n.rc")" -v t="$t" -v m="$m" \
        'BEGIN { printf "| %s | %s | %.2f | %.1f |\n", n, rc, t, m / 1024 }'
done
echo
echo "The text report's first lines:"
echo
head -n 6 "$tmp/text.out" | sed 's/^/    /'
