#!/bin/sh
# rankmem-info tells the truth about the MPI plugin (issue 19, item 5):
# built or not as the build tree shows, the MPI library, whether it is
# CUDA-aware as ompi_info says, what staging does for each RANKMEM_STAGING,
# whether observation and serving are possible here, and the same in
# --json. Run by make check from the top of the build tree (TAP).
: "${srcdir:=.}"
unset RANKMEM_REPLAY RANKMEM_STAGING RANKMEM_OBSERVE RANKMEM_INTERCEPT RANKMEM_CUPTI_LIB
export RANKMEM_WARN_UNKNOWN=0
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $*"; }
skip() { n=$((n + 1)); echo "ok $n # SKIP $*"; }
check() {
    _d=$1
    shift
    if "$@"; then ok "$_d"; else not_ok "$_d"; fi
}
info=./tools/rankmem-info
[ -x "$info" ] || { echo "1..0 # SKIP no $info"; exit 0; }
tmp=${TMPDIR:-/tmp}/rankmem-info-test.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
has() { grep -q -- "$2" "$1"; }

"$info" >"$tmp/out" 2>"$tmp/err"
check "rankmem-info exits 0" test $? -eq 0
sed 's/^/# /' "$tmp/out"
check "it no longer says the plugin is 'not built yet'" sh -c "! grep -q 'not built yet' '$tmp/out'"

so=mpi/.libs/librankmem_mpi.so
if [ -f "$so" ]; then
    check "the build line says the plugin is built, and against which MPI" \
        grep -q '^  MPI plugin:  built (librankmem_mpi.so), against [A-Za-z]' "$tmp/out"
    check "it names the plugin in this build tree" \
        grep -qF "  build tree:  $(pwd)/$so" "$tmp/out"
else
    check "the build line says the plugin is not built, with configure's reason" \
        grep -q '^  MPI plugin:  not built (configure: ' "$tmp/out"
fi

# CUDA-aware: what ompi_info says, when the plugin's MPI is Open MPI.
if grep -q 'against Open MPI' "$tmp/out" && command -v ompi_info >/dev/null 2>&1; then
    want=$(ompi_info --parsable --all 2>/dev/null |
        sed -n 's/^mca:mpi:base:param:mpi_built_with_cuda_support:value://p' | head -n 1)
    case $want in true) want=yes ;; false) want=no ;; *) want=unknown ;; esac
    check "CUDA-aware: $want, as ompi_info says, and how it was decided" \
        grep -q "^  CUDA-aware:  $want (.*ompi_info" "$tmp/out"
else
    check "it says whether the MPI is CUDA-aware, and how it knows" \
        grep -q '^  CUDA-aware:  [a-z]* (..*)' "$tmp/out"
fi

# Staging: each setting and its consequence.
if [ -f "$so" ]; then
    aware=$(sed -n 's/^  CUDA-aware:  \([a-z]*\) .*/\1/p' "$tmp/out")
    case $aware in
    no) check "RANKMEM_STAGING=auto with an MPI that is not CUDA-aware: staging on" \
        grep -q '^  staging:     RANKMEM_STAGING=auto: on: ' "$tmp/out" ;;
    yes) check "RANKMEM_STAGING=auto with a CUDA-aware MPI: staging off" \
        grep -q '^  staging:     RANKMEM_STAGING=auto: off: ' "$tmp/out" ;;
    *) check "RANKMEM_STAGING=auto with an MPI of unknown kind: decided at MPI_Init" \
        grep -q '^  staging:     RANKMEM_STAGING=auto: decided at MPI_Init' "$tmp/out" ;;
    esac
    RANKMEM_STAGING=off "$info" >"$tmp/off" 2>&1
    check "RANKMEM_STAGING=off: device buffers go straight to MPI" \
        grep -q '^  staging:     RANKMEM_STAGING=off: off: device buffers go straight to MPI' "$tmp/off"
    if [ "$aware" = no ]; then
        check "... and it warns that this MPI will fail on them" grep -q 'will fail on them' "$tmp/off"
    fi
    RANKMEM_STAGING=on "$info" >"$tmp/on" 2>&1
    check "RANKMEM_STAGING=on: staged whatever the MPI" \
        grep -q '^  staging:     RANKMEM_STAGING=on: on: .*whatever the MPI' "$tmp/on"
    RANKMEM_STAGING=sometimes "$info" >"$tmp/bad" 2>&1
    check "a bad RANKMEM_STAGING: every rank would stop" grep -q 'a bad value' "$tmp/bad"
    # MPS: whether its control pipe is there, and what sharing a GPU costs without it.
    mkdir -p "$tmp/mps"
    CUDA_MPS_PIPE_DIRECTORY="$tmp/mps" "$info" >"$tmp/nomps" 2>/dev/null
    check "MPS not running: it says so, what ranks sharing a GPU pay, and how to start it" \
        sh -c "grep -q '^  MPS:  *not running (no control pipe at $tmp/mps/control)' '$tmp/nomps' &&
               grep -q 'nvidia-cuda-mps-control -d' '$tmp/nomps'"
    : >"$tmp/mps/control"
    CUDA_MPS_PIPE_DIRECTORY="$tmp/mps" "$info" >"$tmp/mps.out" 2>/dev/null
    check "MPS running (its control pipe there): it says so" grep -q '^  MPS:  *running' "$tmp/mps.out"
    CUDA_MPS_PIPE_DIRECTORY="$tmp/mps" "$info" --json >"$tmp/mps.json" 2>/dev/null
    check "--json: mpi.mps.running" grep -q '"mps": {"running": true' "$tmp/mps.json"
    # The run-time awareness query under the plugin (mpi/mpix.c): 1 where
    # a rank stages, the MPI's own answer where none can.
    if grep -q '^  no GPU: ' "$tmp/out"; then
        case $aware in
        no | yes)
            [ "$aware" = yes ] && a=1 || a=0
            check "no GPU: MPIX query answers the MPI's own $a" \
                grep -q "^  MPIX query:  MPIX_Query_[a-z]*_support() answers $a: the MPI's own" "$tmp/out"
            ;;
        *) check "an MPIX query line" grep -q '^  MPIX query:  MPIX_Query_[a-z]*_support() ' "$tmp/out" ;;
        esac
    else
        check "a GPU and RANKMEM_STAGING=on: MPIX query answers 1" \
            grep -q '^  MPIX query:  MPIX_Query_[a-z]*_support() answers 1: staging' "$tmp/on"
    fi
else
    check "no plugin: no staging" grep -q '^  staging:     .*not built' "$tmp/out"
fi

# Observation and serving: a line each, and "not possible here" without a GPU.
check "an observation line" grep -q '^  observation: RANKMEM_OBSERVE=' "$tmp/out"
check "a CUPTI line" grep -q '^  CUPTI:       ' "$tmp/out"
check "a serving line" grep -q '^  serving:     RANKMEM_INTERCEPT=' "$tmp/out"
if grep -q '^  no GPU: ' "$tmp/out"; then
    check "no GPU: observation is not possible here" \
        grep -q '^  observation: .*: not possible here: ' "$tmp/out"
    check "no GPU: serving is not possible" \
        grep -q '^  serving:     .*: not possible' "$tmp/out"
else
    skip "a GPU is here: the no-GPU wording is not checked"
    skip "a GPU is here: the no-GPU wording is not checked"
fi
RANKMEM_CUPTI_LIB=/nonexistent/libcupti.so "$info" >"$tmp/nocupti" 2>&1
if grep -q '^  CUPTI:       not found (rankmem was built without CUDA)' "$tmp/out"; then
    skip "a build without CUDA: no CUPTI to look for"
else
    check "RANKMEM_CUPTI_LIB naming no file: CUPTI not found, and why" \
        grep -q '^  CUPTI:       not found (RANKMEM_CUPTI_LIB=/nonexistent/libcupti.so: ' "$tmp/nocupti"
fi

# The same in --json.
if command -v python3 >/dev/null 2>&1; then
    "$info" --json >"$tmp/json" 2>/dev/null
    if [ -f "$so" ]; then built=True; else built=False; fi
    python3 - "$tmp/json" "$built" "$tmp/out" >"$tmp/py" 2>&1 <<'EOF'
import json, os, sys
d = json.load(open(sys.argv[1]))
text = open(sys.argv[3]).read()
m = d["mpi"]
built = sys.argv[2] == "True"
assert m["plugin_built"] is built, "plugin_built %r, the build tree says %r" % (m["plugin_built"], built)
assert d["build"]["mpi_plugin"] is built, "build.mpi_plugin"
assert m["cuda_aware"] in ("yes", "no", "unknown") and m["cuda_aware_how"], "cuda_aware"
assert ("  CUDA-aware:  %s (" % m["cuda_aware"]) in text, "the text's CUDA-aware is the JSON's"
assert m["staging"]["setting"] == "auto" and m["staging"]["effect"] in text, "staging"
assert ("  MPIX query:  %s\n" % m["staging"]["mpix_query"]) in text, "the text's MPIX query is the JSON's"
assert isinstance(m["observation"]["possible"], bool) and m["observation"]["effect"] in text
assert isinstance(m["serving"]["possible"], bool) and m["serving"]["effect"] in text
if m["observation"]["cupti"]:
    assert os.path.exists(m["observation"]["cupti"]), "the CUPTI named exists"
    assert isinstance(m["observation"]["cupti_version"], int) and m["observation"]["cupti_version"] > 0
if built:
    assert m["build_tree"] and os.path.samefile(m["build_tree"], "mpi/.libs/librankmem_mpi.so")
    assert m["library"], "the MPI library is named"
print("fine")
EOF
    check "--json: the same facts ($(tail -n 1 "$tmp/py"))" grep -q '^fine$' "$tmp/py"
else
    skip "no python3 to read --json"
fi

# Issue 31, defect 5: values the option check used to pass, refused by -c
# with the allowed values named, and a nonzero exit.
RANKMEM_REPORT_FORMAT=xml "$info" -c >"$tmp/c" 2>&1
check "defect 5: RANKMEM_REPORT_FORMAT=xml: rankmem-info -c exits 1" test $? -eq 1
check "defect 5: and names the allowed formats" \
    grep -qF "RANKMEM_REPORT_FORMAT: unknown item 'xml' in 'xml': expected a comma-separated list of text, json, csv or timeline" "$tmp/c"
RANKMEM_RESOURCE='aligned(alignment=1TiB)>system' "$info" -c >"$tmp/c" 2>&1
check "defect 5: aligned(alignment=1TiB)>system: rankmem-info -c exits 1" test $? -eq 1
check "defect 5: and says the largest alignment" \
    grep -qF "aligned.alignment must be a power of two from 256 to 1GiB" "$tmp/c"
RANKMEM_REPORT_FORMAT='json, CSV' "$info" -c >"$tmp/c" 2>&1
check "defect 5: RANKMEM_REPORT_FORMAT='json, CSV' is fine (exit 0)" test $? -eq 0
echo "1..$n"
