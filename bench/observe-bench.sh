#!/bin/sh
# What observation and serving add to an unmodified program's allocations
# (issue 19): bench/observe-bench run without rankmem, then with the MPI
# plugin in LD_PRELOAD under each setting; prints a Markdown table (ns per
# pair, and what each setting adds to RANKMEM_OBSERVE=off) and the targets.
#
#   bench/observe-bench.sh [BUILDDIR] [-- observe-bench options]
#
# Run from anywhere on the GPU machine after `make bench` (BUILDDIR, default
# ".", is the build tree). MPIRUN (default mpirun) and NP (default 1) choose
# the launcher and the ranks. Exit status 0; 1 when a run fails; 77 without
# a GPU.
B=.
if [ $# -gt 0 ] && [ "$1" != "--" ]; then B=$1; shift; fi
[ "$1" = "--" ] && shift
prog=$B/bench/observe-bench
plugin=$B/mpi/.libs/librankmem_mpi.so
for f in "$prog" "$plugin"; do
    [ -f "$f" ] || { echo "observe-bench.sh: no $f (make bench in a build with CUDA and MPI)" >&2; exit 1; }
done
plugin=$(cd "$(dirname "$plugin")" && pwd)/$(basename "$plugin")
MPIRUN=${MPIRUN:-mpirun}
NP=${NP:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
flags=
"$MPIRUN" --version 2>&1 | grep -qi 'open mpi\|open-mpi\|openrte' && flags=--oversubscribe
tmp=${TMPDIR:-/tmp}/observe-bench.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT

# run NAME [VAR=VALUE...]: one setting; its two figures in $tmp/NAME.
run() {
    _name=$1
    shift
    # shellcheck disable=SC2086
    "$MPIRUN" $flags -np "$NP" env RANKMEM_REPORT=off RANKMEM_QUIET=1 "$@" "$prog" $bench_args \
        >"$tmp/$_name" 2>"$tmp/$_name.err"
    _rc=$?
    if [ "$_rc" -eq 77 ] || grep -q 'observe-bench: no GPU' "$tmp/$_name.err"; then
        echo "observe-bench.sh: no GPU" >&2
        exit 77
    fi
    if [ "$_rc" -ne 0 ] || ! grep -q '^malloc_pair_ns ' "$tmp/$_name"; then
        echo "observe-bench.sh: the run '$_name' failed (exit status $_rc):" >&2
        sed 's/^/  /' "$tmp/$_name.err" >&2
        exit 1
    fi
    echo "  $_name: $(grep '_pair_ns ' "$tmp/$_name" | tr '\n' ' ')" >&2
}
bench_args=$*
val() { sed -n "s/^$2 //p" "$tmp/$1"; }

echo "observe-bench: $NP rank(s), $prog ${bench_args}" >&2
run none
run off LD_PRELOAD="$plugin" RANKMEM_OBSERVE=off
run on-nobt LD_PRELOAD="$plugin" RANKMEM_OBSERVE=on RANKMEM_OBSERVE_BACKTRACE=0
run on LD_PRELOAD="$plugin" RANKMEM_OBSERVE=on
run serve-off LD_PRELOAD="$plugin" RANKMEM_INTERCEPT=cuda RANKMEM_OBSERVE=off
run serve-on LD_PRELOAD="$plugin" RANKMEM_INTERCEPT=cuda RANKMEM_OBSERVE=on

dev=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
echo "### Observation and serving of an unmodified program (bench/observe-bench.sh)"
echo
echo "Device: ${dev:-unknown}; $NP rank(s); $(grep '^#' "$tmp/none" | sed 's/^# //')."
echo "Host time per pair, median of the repeats on rank 0; \"added\" is against the plugin with"
echo "RANKMEM_OBSERVE=off."
echo
echo "| setting | cudaMalloc+cudaFree (ns/pair) | added | cudaMallocAsync+cudaFreeAsync (ns/pair) | added |"
echo "| --- | ---: | ---: | ---: | ---: |"
m0=$(val off malloc_pair_ns)
a0=$(val off async_pair_ns)
for s in "none|no rankmem" "off|plugin, RANKMEM_OBSERVE=off" \
    "on-nobt|observe on, RANKMEM_OBSERVE_BACKTRACE=0" "on|observe on, backtrace 8 frames (default)" \
    "serve-off|RANKMEM_INTERCEPT=cuda, observe off" "serve-on|RANKMEM_INTERCEPT=cuda, observe on"; do
    name=${s%%|*}
    label=${s#*|}
    m=$(val "$name" malloc_pair_ns)
    a=$(val "$name" async_pair_ns)
    awk -v l="$label" -v m="$m" -v a="$a" -v m0="$m0" -v a0="$a0" -v n="$name" 'BEGIN {
        if (n == "off") { dm = "-"; da = "-" } else { dm = sprintf("%+.0f", m - m0); da = sprintf("%+.0f", a - a0) }
        printf "| %s | %.0f | %s | %.0f | %s |\n", l, m, dm, a, da }'
done
echo
awk -v m0="$m0" -v a0="$a0" -v m="$(val on malloc_pair_ns)" -v a="$(val on async_pair_ns)" \
    -v s="$(val serve-off malloc_pair_ns)" -v so="$(val serve-on malloc_pair_ns)" 'BEGIN {
    printf "Targets (issue 19):\n\n"
    printf "- observation adds <= 1 us per cudaMalloc+cudaFree pair: %+.0f ns, %s\n", m - m0, (m - m0 <= 1000 ? "met" : "NOT met")
    printf "- observation adds <= 300 ns per cudaMallocAsync+cudaFreeAsync pair: %+.0f ns, %s\n", a - a0, (a - a0 <= 300 ? "met" : "NOT met")
    printf "- a served cudaMalloc+cudaFree pair costs <= 200 ns: %.0f ns with observation off, %s (%.0f ns with it on)\n", s, (s <= 200 ? "met" : "NOT met"), so
}'
