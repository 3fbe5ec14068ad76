#!/bin/sh
# The full generated matrix (dt_matrix.c: every family, counts 0 to 65,530,
# every memory kind) on the GPU machine, JOBS families at a time, each on
# NP ranks in its own mpirun (a crash in one hides no other). Run from the
# build directory:  sh ../tests/mpi_staging/dt_full.sh [JOBS] [NP] [FAMILIES]
# (FAMILIES: comma-separated, as dt_gpu --list names them; all by default).
# Prints one line per family and the totals; exits non-zero on a failure.
jobs=${1:-4}
np=${2:-2}
prog=${DT_PROG:-tests/mpi_staging/dt_gpu}
out=${DT_OUT:-dt-full}
mkdir -p "$out"
fams=${3:-$("$prog" --list 2>/dev/null | sed -n 's/^# calls: //p')}
[ -n "$fams" ] || { echo "dt_full: $prog --list named no family"; exit 2; }
# Each family's TAP lines go to $out/progress as it ends (what a run cut
# short by a time limit still shows), the slowest families first.
order=$(echo "$fams" | tr ' ,' '\n\n' | grep . | awk '/alltoall|allgather|gather|scatter|bcast/ {print 0, $0; next} {print 1, $0}' |
    sort -s -k1,1 | cut -d' ' -f2)
: > "$out/progress"
echo "$order" |
    xargs -P "$jobs" -I{} sh -c "mpirun -np $np $prog --full --calls {} > $out/{}.log 2>&1; rc=\$?; { grep -E '^(ok|not ok) - |^# ' $out/{}.log | grep -v '^# dt_matrix'; echo \"# {} rc=\$rc\"; } >> $out/progress; echo \"{} rc=\$rc\" >> $out/rc"
cases=0 failed=0 bad=0
for f in $out/*.log; do
    line=$(grep -E '^(ok|not ok) - ' "$f" | head -n 1)
    echo "$(basename "$f" .log): $line"
    n=$(echo "$line" | sed -n 's/.* - [a-z_]*: \([0-9]*\) cases, \([0-9]*\) failed.*/\1 \2/p')
    set -- $n
    cases=$((cases + ${1:-0}))
    failed=$((failed + ${2:-0}))
    case "$line" in ok*) ;; *) bad=$((bad + 1)) ;; esac
done
echo "dt_full: $cases cases, $failed failed, $bad families not ok ($np ranks)"
[ "$bad" -eq 0 ]
