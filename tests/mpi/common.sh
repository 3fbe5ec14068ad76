# Sourced by tests/mpi/*.mpish: TAP output, and running a program under
# the MPI launcher with a time limit. The driver (am/mpi.am) sets MPIRUN,
# MPIFC, RKT_BUILDDIR and RKT_SRCDIR.
#
# Each script prints "ok - ..." / "not ok - ..." lines without numbers
# (its own and those of the programs it runs) and the plan at the end.

B=${RKT_BUILDDIR:?RKT_BUILDDIR is not set (run through make check)}
S=${RKT_SRCDIR:?RKT_SRCDIR is not set (run through make check)}
T=$B/tests/mpi
ntests=0

# Running as root, with more ranks than cores (as .ci/run sets them).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Containers often forbid the cross-process copies of Open MPI's shared
# memory transport; plain copies work everywhere.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# The tests read what they check; the no-GPU notice and the report go away
# unless a test asks for them.
export RANKMEM_QUIET=1 RANKMEM_REPORT=off
# An ASan build: MPI libraries leak by design, and a preloaded plugin comes
# before the ASan runtime.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0:verify_asan_link_order=0"

tap_ok() { ntests=$((ntests + 1)); echo "ok - $*"; }
tap_not_ok() { ntests=$((ntests + 1)); echo "not ok - $*"; }
tap_skip() { ntests=$((ntests + 1)); echo "ok - # SKIP $*"; }
tap_end() { echo "1..$ntests"; exit 0; }
skip_all() { echo "1..0 # SKIP $*"; exit 0; }
# check DESCRIPTION COMMAND...: one result from a command's status.
check() {
    _d=$1
    shift
    if "$@"; then tap_ok "$_d"; else tap_not_ok "$_d"; fi
}
# A file's lines as TAP comments.
show() { [ -s "$1" ] && sed 's/^/#   /' "$1" | head -n "${2:-40}"; return 0; }

[ -n "$MPIRUN" ] || skip_all "no MPI launcher (configure found none; set MPIRUN)"
command -v timeout >/dev/null 2>&1 || skip_all "no timeout(1) to guard against hangs"
mpirun_flags=
if "$MPIRUN" --version 2>&1 | grep -qi 'open mpi\|open-mpi\|openrte'; then
    mpirun_flags=--oversubscribe
    # More ranks than cores: a rank that waits gives its core away instead
    # of spinning (2.6 times faster on 2 cores for 4 ranks; no other effect).
    OMPI_MCA_mpi_yield_when_idle=${OMPI_MCA_mpi_yield_when_idle:-1}
    export OMPI_MCA_mpi_yield_when_idle
fi
limit=${RKT_TIMEOUT:-120}
# RKT_MPI_SHORT=1: the long matrices on their smallest job only (CI's
# second and third builds of the same sources: distcheck, sanitizers).
short=${RKT_MPI_SHORT:-0}
# RKT_MPI_SHORT=2: the short form, and the staging matrix cut to one run per
# protocol (CI's sanitizer and MPICH builds, which the 20 minutes allow no
# more).
smoke=0
if [ "$short" = 2 ]; then
    smoke=1
    short=1
fi

# mpi_run TAG NP [VAR=VALUE...] PROGRAM [ARGS...]: run under the launcher
# (through env(1), so that the settings reach every rank whatever the
# launcher forwards); stdout in $T/TAG.out, stderr in $T/TAG.err, exit
# status in $rc. 124 or 137: it hung and was killed.
mpi_run() {
    _tag=$1 _np=$2
    shift 2
    _file=$(echo "$_tag" | tr -c 'A-Za-z0-9_.\n-' '-')
    out=$T/$_file.out err=$T/$_file.err
    # shellcheck disable=SC2086
    timeout -k 10 "$limit" "$MPIRUN" $mpirun_flags -np "$_np" env "$@" >"$out" 2>"$err" </dev/null
    rc=$?
    return 0
}

# The programs' TAP lines from the last run, counted; anything else as a comment.
pass_through() {
    _n=0 _other=0
    while IFS= read -r _line; do
        case $_line in
        "ok "* | "not ok "*)
            echo "$_line [$_tag]"
            ntests=$((ntests + 1))
            _n=$((_n + 1))
            ;;
        "#"*) echo "$_line" ;;
        *)
            # Other output (a report on stdout): the start of it.
            _other=$((_other + 1))
            [ "$_other" -le 12 ] && echo "# | $_line"
            ;;
        esac
    done <"$out"
    if [ "$rc" -ne 0 ]; then
        tap_not_ok "$_tag: exit status $rc"
        show "$err"
    elif [ "$_n" -eq 0 ]; then
        tap_not_ok "$_tag: no result"
        show "$err"
    fi
}

# Did the last run stop cleanly with a failure (not a hang, not success)?
failed_cleanly() { [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ]; }

# How many distinct ranks printed a plugin line matching the pattern.
ranks_saying() {
    grep -o "rankmem-mpi\[rank [0-9]*\]: .*$1" "$err" | sed 's/\].*//' | sort -u | wc -l
}

# Number of visible GPUs (the helper program needs no launcher).
ngpu=$("$T/gpu_bind" --count 2>/dev/null) || ngpu=0
case $ngpu in '' | *[!0-9]*) ngpu=0 ;; esac
