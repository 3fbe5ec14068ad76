#!/bin/sh
# examples/fortran_demo (the rankmem Fortran module in use): it must run to
# the end and print what each step found. Skipped when configure found no
# Fortran compiler (the module and the example are not built then).
# Run by make check from the top of the build tree.
demo=./examples/fortran_demo
[ -x "$demo" ] || { echo "1..0 # SKIP no Fortran compiler (the module rankmem is not built)"; exit 0; }

# Set by the .sh tests' driver for another test: not an option of ours.
unset RANKMEM_REPLAY
out=${TMPDIR:-/tmp}/rankmem-fortran-demo.$$
trap 'rm -f "$out"' EXIT
RANKMEM_QUIET=1 "$demo" >"$out" 2>&1
rc=$?
n=0
result() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }
has() { grep -q "$1" "$out"; echo $?; }

sed 's/^/# /' "$out"
result "$([ $rc -eq 0 ]; echo $?)" "fortran_demo exits 0 (got $rc)"
result "$(has '^fortran_demo: chain stats>pool(initial=16MiB)>')" "a chain built from a spec string and described back"
result "$(has 'stats: 8000 bytes live, 1 allocation')" "rankmem_stats_get through the module: one allocation of 8000 bytes"
result "$(has 'freeing it twice: invalid pointer')" "a double free is refused with RANKMEM_ERR_INVALID_POINTER"
result "$(has "unknown option 'intial' for pool")" "a misspelt spec: RANKMEM_ERR_CONFIG, and rankmem_last_error() says why"
result "$(has 'allocating from no resource: invalid argument')" "a null resource: RANKMEM_ERR_INVALID_ARGUMENT"
result "$([ "$(has FAILED)" -ne 0 ]; echo $?)" "no step says FAILED"
echo "1..$n"
