#!/bin/sh
# MPI bandwidth and latency of device buffers staged by rankmem against
# naive staging, host MPI and pinned copies (bench/mpi-bw.c), 2 ranks on
# this node, one run; prints markdown tables (docs/staging.md).
#
#   bench/mpi-bw.sh [PROGRAM [ARGS...]]     (from the build directory)
#
# PROGRAM defaults to bench/mpi-bw; ARGS go to it (--min, --max, --quick).
# MPIRUN (default mpirun) is the launcher. Both ranks use GPU 0 when the
# node has one GPU (RANKMEM_BIND=auto), as on the H100 machine.
set -eu
prog=${1:-bench/mpi-bw}
[ $# -gt 0 ] && shift
mpirun=${MPIRUN:-mpirun}
flags=
if "$mpirun" --version 2>/dev/null | grep -q -e 'Open MPI' -e OpenRTE; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # Containers often forbid the cross-process copies (CMA) of Open MPI's
    # shared memory transport: plain copies unless told otherwise (=cma to
    # try them). Every mode of the table goes through the same transport.
    export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
fi
exec "$mpirun" $flags -np 2 env RANKMEM_REPORT=off "$prog" "$@"
