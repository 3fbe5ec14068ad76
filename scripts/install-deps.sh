#!/bin/sh
# Installs what building and testing rankmem needs on Debian/Ubuntu.
# The CUDA toolkit is not installed here: configure finds it at
# /usr/local/cuda (or --with-cuda=DIR) and builds host-only without it.
set -e
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    autoconf automake libtool pkg-config make gcc g++ libc6-dev \
    libopenmpi-dev openmpi-bin >/dev/null
# MPICH next to Open MPI (CI builds the MPI plugin against both; Debian
# installs them side by side, MPICH's wrappers as mpicc.mpich ...), hwloc for
# RANKMEM_BIND=nearest, gfortran for the plugin's Fortran test.
$SUDO apt-get install -y -qq --no-install-recommends \
    libmpich-dev mpich libhwloc-dev gfortran >/dev/null
# python3: tests/mpi_report/check.py reads the MPI report's JSON and CSV back.
$SUDO apt-get install -y -qq --no-install-recommends python3 >/dev/null
# clang and LLVM's libomp: the OpenMP tests run a second time against libomp.
$SUDO apt-get install -y -qq --no-install-recommends clang libomp-dev >/dev/null
# The HIP runtime's headers and libamdhip64 (HIP 5.2 on Debian 12): CI builds
# the HIP variant (configure --with-hip) and runs its CPU tests.
$SUDO apt-get install -y -qq --no-install-recommends libamdhip64-dev >/dev/null
