#!/bin/sh
# What the failure machinery (issue 29) costs a job that does not fail, and
# how fast a failing one leaves its record; prints Markdown for
# docs/benchmarks.md.
#
#   bench/failure-bench.sh [BUILDDIR]
#
# Run on the GPU machine from anywhere after `make bench` and a `make check`
# that built tests/observe/stencil and oom_static (tests/observe/failure.obsh).
# Three parts, each the same binaries with the setting on and off:
#  1. a served pair and an observed pair (bench/observe-bench, 1 rank) with
#     RANKMEM_ON_FAILURE=off and =report: ns per pair, best of REPEATS runs;
#  2. the stencil (tests/observe/stencil, 2 ranks, 64x1024, 10000 steps): wall time with
#     RANKMEM_ON_FAILURE=off, =report, and RANKMEM_REPORT_INTERVAL=10s and
#     =50ms; the cost of one periodic write per rank is the 50ms run's extra
#     time over the number of writes it made;
#  3. the time from the failing cudaMalloc (oom_static full prints its clock
#     just before the call) to the record's mtime on disk.
# REPEATS (default 5), MPIRUN (default mpirun). Exit status 0, 77 without a GPU.
B=${1:-.}
MPIRUN=${MPIRUN:-mpirun}
REPEATS=${REPEATS:-5}
plugin=$B/mpi/.libs/librankmem_mpi.so
ob=$B/bench/observe-bench
st=$B/tests/observe/stencil
oom=$B/tests/observe/oom_static
for f in "$plugin" "$ob" "$st" "$oom"; do
    [ -f "$f" ] || { echo "failure-bench.sh: no $f" >&2; exit 1; }
done
plugin=$(cd "$(dirname "$plugin")" && pwd)/$(basename "$plugin")
nvidia-smi -L >/dev/null 2>&1 || { echo "failure-bench.sh: no GPU" >&2; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
flags=
"$MPIRUN" --version 2>&1 | grep -qi 'open mpi\|open-mpi\|openrte' && flags=--oversubscribe
tmp=${TMPDIR:-/tmp}/failure-bench.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
now() { date +%s.%N; }
best() { sort -g | head -n 1; }

# pair NAME KEY [VAR=VALUE...]: the best of REPEATS observe-bench runs.
pair() {
    _k=$1
    shift
    for _i in $(seq 1 "$REPEATS"); do
        # shellcheck disable=SC2086
        "$MPIRUN" $flags -np 1 env LD_PRELOAD="$plugin" RANKMEM_REPORT=off RANKMEM_QUIET=1 "$@" \
            "$ob" 2>/dev/null | sed -n "s/^$_k //p"
    done | best
}
# stencil [VAR=VALUE...]: the best wall time of REPEATS runs, in seconds.
stencil() {
    for _i in $(seq 1 "$REPEATS"); do
        rm -rf "$tmp/st"
        mkdir -p "$tmp/st"
        _t0=$(now)
        # shellcheck disable=SC2086
        "$MPIRUN" $flags -np 2 env LD_PRELOAD="$plugin" RANKMEM_REPORT="$tmp/st/rep" \
            RANKMEM_REPORT_FORMAT=json RANKMEM_QUIET=1 "$@" "$st" 64 1024 10000 >/dev/null 2>&1
        _t1=$(now)
        awk -v a="$_t0" -v b="$_t1" 'BEGIN { printf "%.6f\n", b - a }'
    done | best
}

dev=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
echo "### The failure machinery (issue 29, bench/failure-bench.sh)"
echo
echo "Device: ${dev:-unknown}; $(date -u +%Y-%m-%d); best of $REPEATS runs each."
echo
echo "| what | RANKMEM_ON_FAILURE=off | =report (default) | added |"
echo "| --- | ---: | ---: | ---: |"
for s in "served cudaMalloc+cudaFree (ns)|malloc_pair_ns|RANKMEM_INTERCEPT=cuda RANKMEM_OBSERVE=off" \
    "observed cudaMalloc+cudaFree (ns)|malloc_pair_ns|RANKMEM_OBSERVE=on" \
    "observed cudaMallocAsync+cudaFreeAsync (ns)|async_pair_ns|RANKMEM_OBSERVE=on"; do
    label=${s%%|*}
    rest=${s#*|}
    key=${rest%%|*}
    vars=${rest#*|}
    # shellcheck disable=SC2086
    a=$(pair "$key" $vars RANKMEM_ON_FAILURE=off)
    # shellcheck disable=SC2086
    b=$(pair "$key" $vars RANKMEM_ON_FAILURE=report)
    awk -v l="$label" -v a="$a" -v b="$b" 'BEGIN { printf "| %s | %.0f | %.0f | %+.0f |\n", l, a, b, b - a }'
done
t_off=$(stencil RANKMEM_ON_FAILURE=off)
t_on=$(stencil RANKMEM_ON_FAILURE=report)
t_10s=$(stencil RANKMEM_REPORT_INTERVAL=10s)
t_50=$(stencil RANKMEM_REPORT_INTERVAL=50ms)
awk -v a="$t_off" -v b="$t_on" 'BEGIN { printf "| stencil 2 ranks, 64x1024, 10000 steps (s) | %.3f | %.3f | %+.2f%% |\n", a, b, (b - a) / a * 100 }'
echo
echo "| periodic records | stencil wall (s) | against =report |"
echo "| --- | ---: | ---: |"
awk -v a="$t_on" -v b="$t_10s" 'BEGIN { printf "| RANKMEM_REPORT_INTERVAL=10s | %.3f | %+.2f%% |\n", b, (b - a) / a * 100 }'
awk -v a="$t_on" -v b="$t_50" 'BEGIN { n = b / 0.05; printf "| RANKMEM_REPORT_INTERVAL=50ms (about %.0f writes per rank) | %.3f | %+.2f%%, %.0f us per write per rank |\n", n, b, (b - a) / a * 100, (b - a) / n * 1e6 }'
echo

# 3. from the failing call to the record on disk
for _i in $(seq 1 "$REPEATS"); do
    rm -rf "$tmp/oom"
    mkdir -p "$tmp/oom"
    "$MPIRUN" $flags -np 2 env LD_PRELOAD="$plugin" RANKMEM_REPORT="$tmp/oom/rep" RANKMEM_QUIET=1 \
        "$oom" full >"$tmp/oom.out" 2>/dev/null
    t0=$(sed -n 's/^T_FAIL //p' "$tmp/oom.out" | head -n 1)
    f=$(ls "$tmp/oom/"*.rank-1.json 2>/dev/null | head -n 1)
    [ -n "$t0" ] && [ -n "$f" ] &&
        awk -v a="$t0" -v b="$(stat -c %.9Y "$f")" 'BEGIN { printf "%.3f\n", (b - a) * 1000 }'
done | sort -g >"$tmp/lat"
if [ -s "$tmp/lat" ]; then
    awk '{ v[NR] = $1 } END { printf "From the failing cudaMalloc to the failing rank'"'"'s record on disk (its mtime; the record is rewritten at MPI_Abort): %.2f ms best, %.2f ms median of %d runs.\n", v[1], v[int((NR + 1) / 2)], NR }' "$tmp/lat"
else
    echo "From the failing call to the record: no measurement (no T_FAIL line or no record)."
fi
