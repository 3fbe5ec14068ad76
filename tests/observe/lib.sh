# Sourced by the .obsh scripts of tests/observe: the paths, building a
# program with nvcc as a user would, running it under the plugin and reading
# its report. See gpu.obsh for what the driver sets.
. "$RKT_SRCDIR/tests/mpi/common.sh"
T=$B/tests/observe
mkdir -p "$T"
O=$S/tests/observe
MiB=1048576

[ -n "$NVCC" ] || skip_all "rankmem was configured without CUDA (no nvcc)"
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null 2>&1 || skip_all "no $PYTHON for tests/observe/check.py"
# By its full path: the launcher may put its own bin directory first in the
# ranks' PATH (Open MPI does), where another python3 has no torch.
PYTHON=$(command -v "$PYTHON")
PLUGIN=$B/mpi/.libs/librankmem_mpi.so
[ -f "$PLUGIN" ] || skip_all "no $PLUGIN (a build without the MPI plugin, or static only)"

# ---- building -----------------------------------------------------------
# nvcc takes linker options as -Xlinker (the flags are for $(CC): -Wl,...),
# and -pthread through -Xcompiler.
nvld() { echo "$*" | sed 's/-Wl,/-Xlinker /g; s/-pthread/-Xcompiler -pthread/g'; }
mpi_ld=$(nvld "$MPI_LDFLAGS")
cuda_ld=$(nvld "$CUDA_LDFLAGS")
cuda_lib=
for d in "$CUDA_DIR/lib64" "$CUDA_DIR/lib"; do
    if [ -d "$d" ]; then cuda_lib=$d; break; fi
done

# build NAME SOURCE [NVCC FLAGS...]: $T/NAME, one TAP line.
build() {
    _name=$1 _src=$2
    shift 2
    # shellcheck disable=SC2086
    if $NVCC $NVCC_ARCH -g "$@" $MPI_CPPFLAGS -I"$O" -o "$T/$_name" "$O/$_src" \
        $cuda_ld $mpi_ld $MPI_LIBS >"$T/$_name.build" 2>&1; then
        tap_ok "build $_name ($_src${*:+ $*})"
        return 0
    fi
    tap_not_ok "build $_name ($_src${*:+ $*})"
    show "$T/$_name.build"
    rm -f "$T/$_name"
    return 1
}

# run_app TAG NP [VAR=VALUE...] PROGRAM [ARGS...]: under the plugin, the
# JSON report in $T/TAG.json (stdout, stderr, rc: see mpi_run).
run_app() {
    _t=$1 _np=$2
    shift 2
    rm -f "$T/$_t.json"
    mpi_run "$_t" "$_np" LD_PRELOAD="$PLUGIN" RANKMEM_REPORT="$T/$_t.json" \
        RANKMEM_REPORT_FORMAT=json "$@"
    tag=$_t np=$_np
}

# exited_ok: one TAP line for the last run's exit status.
exited_ok() {
    if [ "$rc" -eq 0 ]; then
        tap_ok "$tag: the job ran ($np ranks)"
    else
        tap_not_ok "$tag: the job ran ($np ranks): exit status $rc"
        show "$err"
    fi
}

# checker [CHECKS...]: check.py on the last run's report, its TAP lines counted.
checker() {
    "$PYTHON" "$O/check.py" "$T/$tag.json" --np "$np" --label "$tag" "$@" >"$T/$tag.check" 2>&1
    while IFS= read -r _line; do
        case $_line in
        "ok - "* | "not ok - "*)
            echo "$_line"
            ntests=$((ntests + 1))
            ;;
        *) echo "# $_line" ;;
        esac
    done <"$T/$tag.check"
}

# A report's observed section, as comments (what the GPU run saw).
observed() {
    "$PYTHON" -c '
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("# (no report: %s)" % e); sys.exit(0)
for r in d.get("ranks", [])[:2]:
    print("#   rank %s observed: %s" % (r.get("rank"), json.dumps(r.get("observed"))[:600]))
for l in (d.get("leaks") or [])[:4]:
    print("#   leak: %s" % json.dumps(l))
' "$T/$tag.json"
}

