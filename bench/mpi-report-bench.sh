#!/bin/sh
# What the per-rank report adds to MPI_Finalize (docs/benchmarks.md).
#
#   bench/mpi-report-bench.sh [NP] [RUNS] [PROGRAM]
#   bench/mpi-report-bench.sh tool [RANKS]
#
# NP ranks (default 64, oversubscribed under Open MPI), RUNS runs of each
# setting (default 9), interleaved: RANKMEM_REPORT=off, then the report in
# text, json and csv to files. Per run the slowest rank's MPI_Finalize
# counts; the medians over runs and their difference are printed. Then the
# report alone: 20 calls of rankmem_mpi_report in one run, median as rank 0
# sees it. MPIRUN (default mpirun) is the launcher.
set -eu

# "tool": rankmem-report over a synthetic report of RANKS ranks (default
# 100000; bench/mpi-report-bench.py writes it), with --svg and --html: wall
# time and maximum resident memory (docs/report-tool.md, "Size").
if [ "${1:-}" = tool ]; then
    ranks=${2:-100000}
    here=$(dirname "$0")
    tool=${RANKMEM_REPORT_TOOL:-tools/rankmem-report}
    dir=$(mktemp -d "${TMPDIR:-/tmp}/rankmem-report-tool-bench.XXXXXX")
    trap 'rm -rf "$dir"' EXIT INT TERM
    python3 "$here/mpi-report-bench.py" "$ranks" "$dir/r.json"
    echo "report: $ranks ranks, $(wc -c < "$dir/r.json") bytes of JSON"
    /usr/bin/time -v "$tool" "$dir/r.json" --svg "$dir/r.svg" --html "$dir/r.html" \
        > "$dir/out.txt" 2> "$dir/time.txt"
    grep -E 'Elapsed|Maximum resident|User time|System time' "$dir/time.txt" | sed 's/^[[:space:]]*/  /'
    echo "  SVG $(wc -c < "$dir/r.svg") bytes, HTML $(wc -c < "$dir/r.html") bytes"
    exit 0
fi

np=${1:-64}
runs=${2:-9}
prog=${3:-bench/mpi-report-bench}
mpirun=${MPIRUN:-mpirun}
flags=
if "$mpirun" --version 2>/dev/null | grep -q -e 'Open MPI' -e OpenRTE; then
    flags=--oversubscribe
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/rankmem-report-bench.XXXXXX")
trap 'rm -rf "$dir"' EXIT INT TERM

# max over ranks of "finalize_us <rank> <us>"
slowest() { awk '$1 == "finalize_us" && $3 > m { m = $3 } END { printf "%.1f\n", m }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

: > "$dir/off"
: > "$dir/on"
mkdir -p "$dir/files"
i=0
while [ "$i" -lt "$runs" ]; do
    RANKMEM_REPORT=off "$mpirun" $flags -np "$np" "$prog" finalize 2>/dev/null | slowest >> "$dir/off"
    RANKMEM_REPORT="$dir/files/r-%p" RANKMEM_REPORT_FORMAT=text,json,csv \
        "$mpirun" $flags -np "$np" "$prog" finalize 2>/dev/null | slowest >> "$dir/on"
    i=$((i + 1))
done
off=$(median < "$dir/off")
on=$(median < "$dir/on")
nfiles=$(ls "$dir/files" | wc -l)
echo "ranks: $np, runs: $runs each (slowest rank's MPI_Finalize per run)"
echo "finalize, RANKMEM_REPORT=off:            median $off us  (runs: $(tr '\n' ' ' < "$dir/off"))"
echo "finalize, text+json+csv to files:        median $on us  (runs: $(tr '\n' ' ' < "$dir/on"))"
awk -v a="$on" -v b="$off" 'BEGIN { printf "added by the report (difference of medians): %.1f us\n", a - b }'
echo "files written: $nfiles (3 per run expected: $((3 * runs)))"

mkdir -p "$dir/direct"
RANKMEM_REPORT_FORMAT=text,json,csv "$mpirun" $flags -np "$np" "$prog" direct 21 "$dir/direct" \
    2>/dev/null > "$dir/direct.out"
col() { awk -v c="$1" '$1 == "direct_us" { print $c }' "$dir/direct.out" | median; }
echo "in one run, 21 rounds, medians at rank 0:"
echo "  rankmem_mpi_report to 3 files (what MPI_Finalize runs): $(col 3) us"
echo "  rankmem_mpi_report with off (the broadcast alone):      $(col 4) us"
echo "  bare MPI_Bcast + MPI_Gather of the same sizes:          $(col 5) us"
