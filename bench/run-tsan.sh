#!/usr/bin/env bash
# ThreadSanitizer run of the 8-thread stress tests of every resource: an
# out-of-tree build with -fsanitize=thread (no CUDA: the tests run over host
# memory, and the CUDA runtime is not instrumented), then tests/stress.t
# (pool, arena, binning, caching, fixed and vmm, 8 threads each) and the thread
# tests of tests/threads.t (pool), fixed.t, binning.t, caching.t, arena.t, vmm.t and vmm_policy.t, and the
# 16-thread counter tests of stats.t, tracking.t, observe_unit/threads.t (the recorder) and
# mpi/timing_unit.t (the timing layer).
#
#   bench/run-tsan.sh [--long] [--dir DIR] [--jobs J] [TEST...]
#
#   TEST       stress, threads, fixed, binning, caching, arena, vmm (default: all)
#   --long     the long forms: stress.t 200,000 operations a thread,
#              caching.t and arena.t --long
#   --dir DIR  build directory (default ${TMPDIR:-/tmp}/rankmem-tsan)
#   --jobs J   make -j (default 2)
#
# Environment: CC (default gcc). Prints each test's TAP counts and how many
# ThreadSanitizer reports it made. Exit status: 0 all passed and no report,
# 1 a test failed or a report, 2 bad usage or a build failure.
set -u

src=$(cd "$(dirname "$0")/.." && pwd)
dir=${TMPDIR:-/tmp}/rankmem-tsan
long=0
jobs=2
all="stress threads fixed binning caching arena vmm vmm_policy stats tracking observe_unit/threads mpi/timing_unit"
tests=
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --long) long=1; shift ;;
    --dir) dir=${2:-}; shift 2 || usage ;;
    --jobs) jobs=${2:-}; shift 2 || usage ;;
    -*) usage ;;
    *)
        case " $all " in *" $1 "*) ;; *) echo "run-tsan.sh: unknown test '$1' (known: $all)" >&2; exit 2 ;; esac
        tests="$tests $1"; shift ;;
    esac
done
case $jobs in ''|*[!0-9]*|0) usage ;; esac

if [ ! -x "$src/configure" ]; then
    echo "run-tsan.sh: no $src/configure: running autogen.sh there"
    (cd "$src" && ./autogen.sh) || exit 2
fi
mkdir -p "$dir" && cd "$dir" || exit 2
flags='-g -O1 -fsanitize=thread'
if ! grep -q -e "-fsanitize=thread" config.status 2>/dev/null; then
    echo "configuring in $dir: CFLAGS='$flags', --without-cuda"
    if ! "$src/configure" -q --without-cuda CC="${CC:-gcc}" CFLAGS="$flags" \
        LDFLAGS=-fsanitize=thread >configure.log 2>&1; then
        tail -n 30 configure.log >&2
        exit 2
    fi
fi
tests=${tests:-$all}
progs=$(for t in $tests; do printf 'tests/%s.t ' "$t"; done)
# shellcheck disable=SC2086
if ! make -j"$jobs" $progs >make.log 2>&1; then
    tail -n 40 make.log >&2
    echo "run-tsan.sh: build failed" >&2
    exit 2
fi

# Keep going after a report, so that one run shows them all; exit 66 says
# there was one. Tests ask for absurd sizes on purpose and expect
# RANKMEM_ERR_OUT_OF_MEMORY, not a sanitizer abort.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=0:exitcode=66:second_deadlock_stack=1:allocator_may_return_null=1}
# Older ThreadSanitizers do not know the address layout of newer kernels'
# randomized mmap; without address randomization they do.
run=
if tests/threads.t 2>&1 | grep -q 'unexpected memory mapping'; then
    run="setarch $(uname -m) -R"
    echo "(running without address randomization: this ThreadSanitizer needs it here)"
fi

status=0
for t in $tests; do
    args=
    if [ "$long" = 1 ]; then
        case $t in stress) args=200000 ;; caching|arena) args=--long ;; esac
    fi
    start=$(date +%s)
    # shellcheck disable=SC2086
    log=$(printf '%s' "$t" | tr / _).log
    $run tests/$t.t $args >"$log" 2>&1
    rc=$?
    oks=$(grep -c '^ok' "$log")
    bad=$(grep -c '^not ok' "$log")
    reports=$(grep -c '^WARNING: ThreadSanitizer\|ERROR: ThreadSanitizer' "$log")
    verdict=PASS
    if [ "$rc" -ne 0 ] || [ "$bad" -ne 0 ] || [ "$reports" -ne 0 ]; then
        verdict=FAIL
        status=1
    fi
    printf '%-8s %s: %d ok, %d not ok, %d ThreadSanitizer reports, exit %d, %ds (log %s)\n' \
        "$t.t" "$verdict" "$oks" "$bad" "$reports" "$rc" $(( $(date +%s) - start )) "$dir/$log"
    if [ "$verdict" = FAIL ]; then
        grep -m 5 -A 12 'ThreadSanitizer\|^not ok' "$log" | sed 's/^/    /'
    fi
done
exit $status
