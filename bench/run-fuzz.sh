#!/usr/bin/env bash
# Fuzz the suballocators: builds tests/fuzz_suballoc.c with clang's
# libFuzzer, AddressSanitizer and UBSan against the library's sources (no
# configure, no CUDA: the harness drives host memory), then runs it for each
# resource until it has done at least --ops operations, and prints the
# operation counts and the result. docs/replay.md says what is checked.
#
#   bench/run-fuzz.sh [--ops N] [--jobs J] [--dir DIR] [--fault] [RESOURCE...]
#
#   RESOURCE   pool, arena, binning, caching, fixed, vmm (default: all six)
#   --ops N    operations per resource (default 10000000; e.g. 200000 for a smoke run)
#   --jobs J   resources fuzzed at once (default 1)
#   --dir DIR  build and corpus directory (default ${TMPDIR:-/tmp}/rankmem-fuzz)
#   --fault    fault injection (FUZZ_FAULT=1: the fault resource under each
#              resource, stats above it, the checks after every injected
#              failure; docs/testing.md); its counts are printed too
#
# Environment: CC (default clang). Exit status: 0 every resource clean,
# 1 a check failed or a sanitizer reported (the log's tail is printed),
# 2 bad usage or a build failure.
set -u

src=$(cd "$(dirname "$0")/.." && pwd)
ops=10000000
jobs=1
dir=${TMPDIR:-/tmp}/rankmem-fuzz
fault=
all="pool arena binning caching fixed vmm"
resources=

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --ops) ops=${2:-}; shift 2 || usage ;;
    --jobs) jobs=${2:-}; shift 2 || usage ;;
    --dir) dir=${2:-}; shift 2 || usage ;;
    --fault) fault=1; shift ;;
    -h|--help) usage ;;
    -*) echo "run-fuzz.sh: unknown option $1" >&2; usage ;;
    *)
        case " $all " in *" $1 "*) ;; *) echo "run-fuzz.sh: unknown resource '$1' (known: $all)" >&2; exit 2 ;; esac
        resources="$resources $1"; shift ;;
    esac
done
case $ops in ''|*[!0-9]*) echo "run-fuzz.sh: --ops needs a count" >&2; exit 2 ;; esac
case $jobs in ''|*[!0-9]*|0) echo "run-fuzz.sh: --jobs needs a count of at least 1" >&2; exit 2 ;; esac
resources=${resources:-$all}
cc=${CC:-clang}

mkdir -p "$dir" || exit 2
dir=$(cd "$dir" && pwd)

# The library's own config.h is made by configure; the sources need only
# HAVE_CUDA from it, and the harness runs on host memory.
mkdir -p "$dir/include"
printf '/* run-fuzz.sh: host-only build */\n#define HAVE_CUDA 0\n' >"$dir/include/config.h"

echo "building $dir/fuzz_suballoc with $cc (libFuzzer, ASan, UBSan) from $src"
# shellcheck disable=SC2086
if ! "$cc" -g -O1 -mcx16 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -fno-omit-frame-pointer -I"$src/include" -I"$src/src" -I"$src/tests" -I"$dir/include" \
    "$src/tests/fuzz_suballoc.c" "$src"/src/*.c -lpthread -o "$dir/fuzz_suballoc" \
    >"$dir/build.log" 2>&1; then
    cat "$dir/build.log" >&2
    echo "run-fuzz.sh: build failed (Debian: apt-get install clang libclang-rt-14-dev)" >&2
    exit 2
fi

if [ -n "$fault" ]; then export FUZZ_FAULT=1; else unset FUZZ_FAULT; fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# Field N of the harness's exit line ("fuzz_suballoc: 123 operations: 45
# allocate (40 served, 0 too large for fixed), 30 free, 20 trim, 10 bad free
# refused; 5 releases with live blocks; ...").
stat_line() { grep '^fuzz_suballoc: [0-9]* operations' "$1" | tail -n 1; }
numbers() { stat_line "$1" | sed 's/; inputs per resource.*//' | tr -c '0-9\n' ' '; }
# The fault line ("fuzz_suballoc: fault: 12 injected, 5 failed a call, 4
# absorbed, 0 refused ..., 1 creations failed cleanly, 9 probes ..., 99
# invariants checked"): its seven numbers.
fault_numbers() { grep '^fuzz_suballoc: fault:' "$1" | tail -n 1 | tr -c '0-9\n' ' '; }
inputs_of() { stat_line "$1" | sed -n "s/.*inputs per resource:.* $2 \([0-9]*\).*/\1/p"; }

# fuzz RESOURCE: chunks of libFuzzer runs (each a process that prints its
# counts at exit) until the sum reaches $ops; writes $dir/RESOURCE.result.
fuzz() {
    local r=$1 corpus=$dir/corpus-$r log=$dir/$r.log
    local total=0 allocs=0 served=0 large=0 frees=0 trims=0 bad=0 busy=0 inputs=0 chunk=0
    local runs=$((ops / 1500 + 10)) t0 rc
    local f_inj=0 f_failed=0 f_abs=0 f_ref=0 f_cre=0 f_probes=0 f_checks=0
    [ "$runs" -gt 2000 ] && runs=2000 # about 1,500 operations an input
    mkdir -p "$corpus"
    if [ -z "$(ls -A "$corpus")" ]; then
        # Long seeds (512 B to 8 KiB, thousands of operations each) keep the
        # time in operations rather than in building resources.
        for i in $(seq 0 31); do
            head -c $((512 + (i * 7919) % 7681)) /dev/urandom >"$corpus/seed$i"
        done
    fi
    : >"$log"
    t0=$(date +%s)
    while [ "$total" -lt "$ops" ]; do
        chunk=$((chunk + 1))
        FUZZ_ONLY=$r "$dir/fuzz_suballoc" -runs="$runs" -seed="$chunk" -max_len=8192 \
            -len_control=0 -print_final_stats=1 "$corpus" >>"$log" 2>"$dir/$r.chunk.log"
        rc=$?
        cat "$dir/$r.chunk.log" >>"$log"
        if [ "$rc" -ne 0 ] || [ -z "$(stat_line "$dir/$r.chunk.log")" ]; then
            echo "$r FAIL after $total operations (exit $rc; log $log)" >"$dir/$r.result"
            tail -n 40 "$dir/$r.chunk.log" >>"$dir/$r.result"
            return 1
        fi
        set -- $(numbers "$dir/$r.chunk.log")
        total=$((total + $1)) allocs=$((allocs + $2)) served=$((served + $3))
        large=$((large + $4)) frees=$((frees + $5)) trims=$((trims + $6))
        bad=$((bad + $7)) busy=$((busy + $8))
        inputs=$((inputs + $(inputs_of "$dir/$r.chunk.log" "$r")))
        if [ -n "$fault" ]; then
            set -- $(fault_numbers "$dir/$r.chunk.log") 0 0 0 0 0 0 0
            f_inj=$((f_inj + $1)) f_failed=$((f_failed + $2)) f_abs=$((f_abs + $3))
            f_ref=$((f_ref + $4)) f_cre=$((f_cre + $5)) f_probes=$((f_probes + $6))
            f_checks=$((f_checks + $7))
        fi
        # Size the next chunk from what this one did per input.
        if [ "$total" -lt "$ops" ] && [ "$inputs" -gt 0 ]; then
            runs=$(( (ops - total) / (total / inputs + 1) + 200 ))
        fi
    done
    printf '%s PASS %d operations in %d inputs, %ds: %d allocate (%d served, %d too large for fixed), %d free, %d trim, %d bad free refused, %d releases with blocks live\n' \
        "$r" "$total" "$inputs" $(( $(date +%s) - t0 )) "$allocs" "$served" "$large" "$frees" \
        "$trims" "$bad" "$busy" >"$dir/$r.result"
    if [ -n "$fault" ]; then
        printf '%s fault: %d injected (%d failed a call, %d absorbed), %d refused for want of room once stopped, %d creations failed cleanly, %d probes against a fresh resource, %d invariants checked\n' \
            "$r" "$f_inj" "$f_failed" "$f_abs" "$f_ref" "$f_cre" "$f_probes" "$f_checks" >>"$dir/$r.result"
    fi
}

echo "fuzzing$(printf ' %s' $resources), at least $ops operations each, $jobs at once; logs in $dir"
running=0
for r in $resources; do
    rm -f "$dir/$r.result"
    fuzz "$r" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait

status=0
for r in $resources; do
    if [ -f "$dir/$r.result" ]; then
        cat "$dir/$r.result"
        case $(head -n 1 "$dir/$r.result") in *" PASS "*) ;; *) status=1 ;; esac
    else
        echo "$r FAIL: no result (log $dir/$r.log)"
        status=1
    fi
done
exit $status
