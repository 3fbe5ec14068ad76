#!/bin/sh
# TAP test of rankmem-replay: malformed logs are refused with their line
# number; a tiny trace replays with exact peaks; --simulate replays more
# than the machine has; the repository's traces replay over host memory.
#
# make check runs it with RANKMEM_REPLAY set to the built program (am/replay.am)
# and srcdir set; by hand: RANKMEM_REPLAY=bench/rankmem-replay srcdir=SRC sh SRC/tests/replay.sh
replay=${RANKMEM_REPLAY:-./bench/rankmem-replay}
srcdir=${srcdir:-.}
traces=$srcdir/bench/traces

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rankmem-replay.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

echo "1..42"
n=0
ok() { # ok STATUS DESCRIPTION
    n=$((n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
    return "$1"
}
diag() { sed 's/^/# /' "$@"; }

header='Thread,Time,Action,Pointer,Size,Stream'

# refuse NAME LINE PATTERN DESCRIPTION (trace body on stdin, header added unless NAME ends in -raw)
refuse() {
    f=$tmp/$1.csv
    case $1 in *-raw) cat >"$f" ;; *) { echo "$header"; cat; } >"$f" ;; esac
    "$replay" --spec system "$f" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -eq 1 ] && grep -q "^$f:$2: $3" "$tmp/err"; then
        ok 0 "$4 (line $2)"
    else
        ok 1 "$4 (line $2): exit $rc"
        diag "$tmp/err"
    fi
}

refuse columns 3 'expected 6 columns' 'a line with 5 columns is refused' <<'EOF'
0,0,allocate,0x1000,100,0x0
0,1,free,0x1000,100
EOF
refuse size 2 "bad Size '12x'" 'a bad size is refused' <<'EOF'
0,0,allocate,0x1000,12x,0x0
EOF
refuse pointer 2 "bad Pointer '1000'" 'a pointer without 0x is refused' <<'EOF'
0,0,allocate,1000,100,0x0
EOF
refuse time 3 "bad Time '1.2.3'" 'a bad time is refused' <<'EOF'
0,0,allocate,0x1000,100,0x0
0,1.2.3,free,0x1000,100,0x0
EOF
refuse action 2 "bad Action 'alloc'" 'an unknown action is refused' <<'EOF'
0,0,alloc,0x1000,100,0x0
EOF
refuse never 3 'free of 0x2000, which was never allocated' 'a free of an unknown pointer is refused' <<'EOF'
0,0,allocate,0x1000,100,0x0
0,1,free,0x2000,100,0x0
EOF
refuse double 4 'free of 0x1000, which was already freed at line 3' 'a double free is refused' <<'EOF'
0,0,allocate,0x1000,100,0x0
0,1,free,0x1000,100,0x0
0,2,free,0x1000,100,0x0
EOF
refuse live 3 'allocate of 0x1000, which is still live (allocated at line 2' 'an allocate of a live pointer is refused' <<'EOF'
0,0,allocate,0x1000,100,0x0
0,1,allocate,0x1000,200,0x0
EOF
refuse mismatch 4 'free of 0x1000 with size 99, but it was allocated with size 100 at line 2' \
    'a free with the wrong size is refused' <<'EOF'
0,0,allocate,0x1000,100,0x0
0,1,allocate,0x2000,100,0x0
0,2,free,0x1000,99,0x0
EOF
refuse backwards 3 'Time 5 is earlier than line 2' "a thread's time going back is refused" <<'EOF'
0,10,allocate,0x1000,100,0x0
0,5,free,0x1000,100,0x0
EOF
refuse header-raw 1 'expected the header' 'a missing header is refused' <<'EOF'
0,0,allocate,0x1000,100,0x0
EOF
refuse empty-raw 1 'empty file' 'an empty file is refused' </dev/null

# Every trace is checked before any replays: a bad second file stops the run.
"$replay" --spec system "$traces/example-recorded.csv" "$tmp/double.csv" >"$tmp/out" 2>"$tmp/err"
rc=$?
test "$rc" -eq 1 && test ! -s "$tmp/out" && grep -q "double.csv:4:" "$tmp/err"
ok $? 'a malformed second trace stops the run before anything replays'

# A 5-line trace with a known peak: 1000 + 3000 live at once.
tiny=$tmp/tiny.csv
cat >"$tiny" <<EOF
$header
0,0,allocate,0x1000,1000,0x0
0,1,allocate,0x2000,3000,0x10
0,2,free,0x1000,1000,0x0
0,3.5,allocate,0x3000,500,0x0
0,4,free,0x2000,3000,0x10
EOF
# jget FILE KEY: the number after "KEY": in the JSON output
jget() { sed -n "s/.*\"$2\": \\([0-9][0-9.]*\\).*/\\1/p" "$1" | head -n 1; }

"$replay" --spec system --repeat 1 --json "$tiny" >"$tmp/j" 2>"$tmp/err"
ok $? 'the tiny trace replays over system'
test "$(jget "$tmp/j" ops)" = 5 && test "$(jget "$tmp/j" allocations)" = 3 &&
    test "$(jget "$tmp/j" frees)" = 2 && test "$(jget "$tmp/j" streams)" = 2
ok $? 'it has 5 operations: 3 allocations, 2 frees, 2 streams'
test "$(jget "$tmp/j" peak_live_bytes)" = 4000 && test "$(jget "$tmp/j" peak_live_count)" = 2
ok $? 'peak live: exactly 4000 bytes in 2 blocks'
test "$(jget "$tmp/j" peak_reserved_bytes)" = 4000 && test "$(jget "$tmp/j" ratio)" = 1.0000
ok $? 'peak reserved from system alone: exactly 4000 bytes, ratio 1.0000'
test "$(jget "$tmp/j" live_at_end_bytes)" = 500 && test "$(jget "$tmp/j" replay_failures)" = 0
ok $? '500 bytes live at the end (freed before release), no failure'
grep -q '"release": "success"' "$tmp/j"
ok $? 'the chain is released cleanly after the trace'
grep -q '"reserved_measure": "upstream"' "$tmp/j" && test "$(jget "$tmp/j" peak_upstream_bytes)" = 4000
ok $? 'system answers no RESERVED_HIGH: the measure is the stats probe above the leaf'

"$replay" --spec 'pool(initial=1MiB,growth=1MiB)>system' --repeat 2 --json "$tiny" >"$tmp/j" 2>"$tmp/err"
rc=$?
test "$rc" -eq 0 && test "$(jget "$tmp/j" peak_reserved_bytes)" = 1048576 &&
    test "$(jget "$tmp/j" peak_live_bytes)" = 4000
ok $? 'over pool(initial=1MiB): peak reserved exactly 1 MiB, peak live 4000' ||
    diag "$tmp/j" "$tmp/err"
grep -q '"reserved_measure": "query", "reserved_by": "pool"' "$tmp/j" &&
    test "$(jget "$tmp/j" peak_upstream_bytes)" = 1048576
ok $? "the pool's own RESERVED_HIGH is the measure; the probe saw the same 1 MiB" ||
    diag "$tmp/j"

# The arena takes its whole global arena upfront: what the probe sees is the
# arena's size, its own high-water mark is the superblocks it handed out.
"$replay" --spec 'arena(size=64MiB)>system' --repeat 1 --json "$tiny" >"$tmp/j" 2>"$tmp/err"
rc=$?
r=$(jget "$tmp/j" peak_reserved_bytes)
test "$rc" -eq 0 && grep -q '"reserved_by": "arena"' "$tmp/j" &&
    test "$(jget "$tmp/j" peak_upstream_bytes)" = 67108864 && test -n "$r" &&
    test "$r" -ge 4000 && test "$r" -lt 67108864
ok $? "over an arena: its own high-water mark ($r bytes), not the 64 MiB global arena" ||
    diag "$tmp/j" "$tmp/err"

# --warm: a second pass on the same chain. Over a vmm on the host backend
# the first pass maps one handle and the second maps none.
"$replay" --spec 'vmm(backend=host)' --warm --repeat 1 --json "$tiny" >"$tmp/j" 2>"$tmp/err"
rc=$?
hw=$(sed -n 's/.*"vmm": {"handles_created": \([0-9]*\),.*/\1/p' "$tmp/j")
hc=$(sed -n 's/.*"cold": {"handles_created": \([0-9]*\),.*/\1/p' "$tmp/j")
test "$rc" -eq 0 && grep -q '"warm": true, "cold_ns_per_op": [0-9]' "$tmp/j" &&
    test "$(jget "$tmp/j" peak_live_bytes)" = 4000 && test "$hc" = 1 && test "$hw" = 0
ok $? "--warm over vmm: both passes reported, handles made cold ($hc) and warm ($hw)" ||
    diag "$tmp/j" "$tmp/err"

# A tiny trace under --simulate: 3 x 20 GiB live, on any machine.
big=$tmp/big.csv
cat >"$big" <<EOF
$header
0,0,allocate,0x100000000,21474836480,0x0
0,1,allocate,0x600000000,21474836480,0x0
0,2,allocate,0xb00000000,21474836480,0x0
0,3,free,0x600000000,21474836480,0x0
0,4,allocate failure,0x0,107374182400,0x0
0,5,free,0x100000000,21474836480,0x0
EOF
"$replay" --spec pool --simulate --repeat 1 --json "$big" >"$tmp/j" 2>"$tmp/err"
rc=$?
test "$rc" -eq 0 && test "$(jget "$tmp/j" peak_live_bytes)" = 64424509440 &&
    test "$(jget "$tmp/j" replay_failures)" = 0 && test "$(jget "$tmp/j" failure_lines)" = 1
ok $? '--simulate: 60 GiB live over the simulated upstream, the failure line skipped' ||
    diag "$tmp/j" "$tmp/err"
r=$(jget "$tmp/j" peak_reserved_bytes)
test -n "$r" && test "$r" -ge 64424509440
ok $? "--simulate: peak reserved ($r) covers peak live"

# N% is of the simulated memory: a limit of half of 64 GiB (32 GiB) refuses
# the second and the third 20 GiB.
"$replay" --spec 'limit(bytes=50%)>pool>cuda' --simulate --sim-memory 64GiB --repeat 1 --json "$big" \
    >"$tmp/j" 2>"$tmp/err"
rc=$?
test "$rc" -eq 0 && grep -q '"chain": "limit(bytes=32GiB)>pool>stats>simulated"' "$tmp/j" &&
    test "$(jget "$tmp/j" replay_failures)" = 2
ok $? "--simulate: 50% is of the simulated memory; the leaf (cuda) is replaced" ||
    diag "$tmp/j" "$tmp/err"

# Allocation failures are reported, not fatal; their frees are skipped.
"$replay" --spec pool --simulate --sim-memory 50GiB --repeat 1 --json "$big" >"$tmp/j" 2>"$tmp/err"
rc=$?
test "$rc" -eq 0 && test "$(jget "$tmp/j" replay_failures)" -ge 1 && test "$(jget "$tmp/j" skipped_frees)" -ge 0 &&
    grep -q '"first_failure": "line ' "$tmp/j"
ok $? 'a 50 GiB simulated upstream: failures reported, exit 0' ||
    diag "$tmp/j" "$tmp/err"

# Lines of two threads out of time order (as a logging adaptor writes them by
# buffer): sorted by time, replayed on two threads.
two=$tmp/two.csv
cat >"$two" <<EOF
$header
1,2,allocate,0x2000,300,0x20
1,6,free,0x1000,100,0x20
0,1,allocate,0x1000,100,0x0
0,3,free,0x2000,300,0x0
0,4,allocate,0x3000,700,0x0
0,5,free,0x3000,700,0x0
EOF
"$replay" --spec 'stats>system' --repeat 3 --json "$two" >"$tmp/j" 2>"$tmp/err"
rc=$?
test "$rc" -eq 0 && test "$(jget "$tmp/j" threads)" = 2 && test "$(jget "$tmp/j" peak_live_bytes)" = 800 &&
    test "$(jget "$tmp/j" peak_reserved_bytes)" = 800 && test "$(jget "$tmp/j" free_errors)" = 0
ok $? 'two threads out of file order: sorted by time, peak 800, cross-thread frees' ||
    diag "$tmp/j" "$tmp/err"

# Usage.
"$replay" >/dev/null 2>&1
test $? -eq 2
ok $? 'no trace: usage, exit 2'
"$replay" --bogus "$tiny" >/dev/null 2>&1
test $? -eq 2
ok $? 'an unknown option: exit 2'
"$replay" --repeat 0 "$tiny" >/dev/null 2>&1
test $? -eq 2
ok $? '--repeat 0: exit 2'
"$replay" "$tmp/does-not-exist.csv" >/dev/null 2>"$tmp/err"
test $? -eq 1 && grep -q 'cannot open' "$tmp/err"
ok $? 'a missing file: exit 1, says so'
"$replay" --spec 'nonsense>system' "$tiny" >/dev/null 2>"$tmp/err"
test $? -eq 1 && grep -q 'nonsense' "$tmp/err"
ok $? 'a bad spec: exit 1, names it'
"$replay" --spec 'nonsense' --simulate "$tiny" >/dev/null 2>"$tmp/err"
test $? -eq 1 && grep -q 'nonsense' "$tmp/err"
ok $? 'a bad spec under --simulate: exit 1, names it'

# The repository's traces, over host memory.
for t in powerlaw threads growing example-recorded; do
    "$replay" --spec 'pool>system' --repeat 1 --json "$traces/$t.csv" >"$tmp/j" 2>"$tmp/err"
    rc=$?
    test "$rc" -eq 0 && test "$(jget "$tmp/j" replay_failures)" = 0 &&
        test "$(jget "$tmp/j" free_errors)" = 0 && grep -q '"release": "success"' "$tmp/j"
    st=$?
    ok $st "$t.csv replays over pool>system (ratio $(jget "$tmp/j" ratio), $(jget "$tmp/j" ns_per_op) ns/op)" ||
    diag "$tmp/j" "$tmp/err"
done

# The human-readable table.
"$replay" --spec 'pool>system' --repeat 1 "$traces/growing.csv" "$tiny" >"$tmp/out" 2>"$tmp/err"
test $? -eq 0 && grep -q '^growing.csv ' "$tmp/out" && grep -q '^tiny.csv ' "$tmp/out"
ok $? 'the table has a row per trace' ||
    diag "$tmp/out" "$tmp/err"
grep -q "^peak reserved: pool's own high-water mark (RANKMEM_QUERY_RESERVED_HIGH)" "$tmp/out"
ok $? 'the table says which measure peak reserved is' || diag "$tmp/out"
"$replay" --spec 'pool>cuda' --simulate --repeat 1 "$tiny" >"$tmp/out" 2>"$tmp/err"
test $? -eq 0 && grep -q "never touched (in place of 'cuda')" "$tmp/out"
ok $? "--simulate: the table names the leaf it replaced" || diag "$tmp/out" "$tmp/err"
