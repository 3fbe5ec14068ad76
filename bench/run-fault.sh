#!/usr/bin/env bash
# The long form of tests/fault.t (issue 31): every chain of its table with
# OPS random operations (default 10 million), split over J processes, under
# AddressSanitizer+UBSan (an out-of-tree build of its own) or in a build
# you name. Prints each chain's figures and the totals.
#
#   bench/run-fault.sh [--asan] [--build DIR] [--ops N] [--jobs J] [--cap BYTES]
#
#   --asan       build in ${TMPDIR:-/tmp}/rankmem-asan with -fsanitize=address,undefined
#                (no CUDA) and run there; random requests capped at 64 KiB unless
#                --cap says otherwise (larger blocks are an mmap each under ASan)
#   --build DIR  an existing build directory (default: the source tree)
#   --ops N      operations a chain (default 10000000)
#   --jobs J     processes (default: the number of cores)
#   --cap BYTES  largest random request (RANKMEM_FAULT_MAX_BYTES; 0: the chain's)
#
# Exit status: 0 every check held, 1 a check failed or a sanitizer report,
# 2 bad usage or a build failure.
set -u

src=$(cd "$(dirname "$0")/.." && pwd)
build=$src
asan=0
ops=10000000
jobs=$(nproc 2>/dev/null || echo 2)
cap=
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --asan) asan=1; shift ;;
    --build) build=${2:-}; shift 2 || usage ;;
    --ops) ops=${2:-}; shift 2 || usage ;;
    --jobs) jobs=${2:-}; shift 2 || usage ;;
    --cap) cap=${2:-}; shift 2 || usage ;;
    *) usage ;;
    esac
done
case $ops$jobs in *[!0-9]*|'') usage ;; esac

if [ "$asan" = 1 ]; then
    build=${TMPDIR:-/tmp}/rankmem-asan
    [ -n "$cap" ] || cap=65536
    san='-fsanitize=address,undefined'
    mkdir -p "$build" || exit 2
    if [ ! -f "$build/Makefile" ]; then
        (cd "$build" && "$src/configure" --without-cuda --disable-mpi-plugin \
            CFLAGS="-g -O1 $san -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
            LDFLAGS="$san" >configure.log 2>&1) || {
            echo "run-fault.sh: configure failed ($build/configure.log; a source tree configured in place must be" \
                 "cleaned first, or use a clean clone)" >&2
            exit 2
        }
    fi
    # A small quarantine: the default 256 MiB makes every block fresh pages.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=1:allocator_may_return_null=1:quarantine_size_mb=8}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
fi
make -C "$build" -s tests/fault.t >/dev/null || { echo "run-fault.sh: build failed" >&2; exit 2; }
[ -n "$cap" ] && export RANKMEM_FAULT_MAX_BYTES=$cap

out=$(mktemp -d)
t0=$(date +%s)
for ((k = 0; k < jobs; k++)); do
    RANKMEM_FAULT_PART=$k/$jobs "$build/tests/fault.t" "$ops" >"$out/part$k.tap" 2>&1 &
done
wait
t1=$(date +%s)
cat "$out"/part*.tap | grep '^# figures:' | sed 's/^# //'
awk '
/^# figures:/ {
    n++
    for (i = 1; i <= NF; i++) {
        if ($(i+1) == "operations,") ops += $i
        if ($(i+1) == "failures" && $(i+2) == "injected") inj += $i
        if ($(i+1) == "invariants") chk += $i
    }
}
/^ok / { okc++ } /^not ok/ { bad++ }
/AddressSanitizer|UndefinedBehaviorSanitizer|runtime error:/ { san++ }
END {
    printf "chains %d, operations %.0f, failures injected %.0f, invariants checked %.0f; TAP ok %d, not ok %d, sanitizer reports %d\n", n, ops, inj, chk, okc, bad, san
    exit (bad || san) ? 1 : 0
}' "$out"/part*.tap
rc=$?
echo "time: $((t1 - t0)) s on $jobs processes; asan $asan; cap ${cap:-none}; logs in $out"
exit $rc
