# rankmem_mpi_info.m4 -- what rankmem-info says about the MPI plugin
# (issue 19): facts only configure knows.
#
# RANKMEM_MPI_INFO (after RANKMEM_MPI_PLUGIN)
# ----------------
#   config.h  RANKMEM_MPI_PLUGIN_BUILT  1 when librankmem_mpi is built, else 0
#             RANKMEM_MPI_PLUGIN_MSG    configure's word on the plugin ("off (no MPI)")
#             RANKMEM_MPI_LIBRARY       the MPI library the plugin is built against,
#                                       "Open MPI 4.1.6", "MPICH 4.2.0" ("" unknown)
#             RANKMEM_MPICC             the wrapper it came from
#             RANKMEM_OMPI_INFO         Open MPI's ompi_info next to the wrapper
#                                       ("" when not Open MPI or not found)
#             RANKMEM_MPI_CUDA_AWARE    "yes", "no" or "" (unknown), and
#             RANKMEM_MPI_CUDA_AWARE_HOW  how configure decided it
#
# The library comes from `$MPICC -showme:version` (Open MPI) or from the
# version macros of its mpi.h (MPICH, MVAPICH2, Intel MPI, Open MPI): no MPI
# program is run at configure time (a singleton MPI_Init may hang on a login
# node). Whether Open MPI was built with CUDA support is asked of its
# ompi_info (mpi_built_with_cuda_support); rankmem-info asks again when run.
AC_DEFUN([RANKMEM_MPI_INFO], [
rankmem_mpi_library=
rankmem_ompi_info=
rankmem_mpi_cuda_aware=
rankmem_mpi_cuda_aware_how="not known at configure time"
AS_IF([test "x$rankmem_mpi" = xyes], [
    AC_MSG_CHECKING([which MPI library $MPICC uses])
    dnl Open MPI: "mpicc: Open MPI 4.1.6 (Language: C)"
    rankmem_v=`$MPICC -showme:version 2>/dev/null | sed -n 's/^[[^:]]*: *\(Open MPI [[0-9.a-z]]*\).*/\1/p' | head -n 1`
    AS_IF([test -z "$rankmem_v"], [
        rankmem_save_CPPFLAGS=$CPPFLAGS
        CPPFLAGS="$CPPFLAGS $MPI_CPPFLAGS"
        AC_PREPROC_IFELSE([AC_LANG_SOURCE([[#include <mpi.h>
#if defined I_MPI_VERSION
rankmem_mpi_is "Intel MPI" I_MPI_VERSION
#elif defined MVAPICH2_VERSION
rankmem_mpi_is "MVAPICH2" MVAPICH2_VERSION
#elif defined MPICH_VERSION
rankmem_mpi_is "MPICH" MPICH_VERSION
#elif defined OMPI_MAJOR_VERSION
rankmem_mpi_is "Open MPI" OMPI_MAJOR_VERSION . OMPI_MINOR_VERSION . OMPI_RELEASE_VERSION
#endif
]])], [
            rankmem_v=`sed -n 's/^rankmem_mpi_is *//p' conftest.i | head -n 1 | tr -d '"' | sed 's/ *\. */./g; s/  */ /g; s/ *$//'`
        ])
        CPPFLAGS=$rankmem_save_CPPFLAGS
    ])
    rankmem_mpi_library=$rankmem_v
    AC_MSG_RESULT([${rankmem_mpi_library:-unknown}])
    AS_CASE([$rankmem_mpi_library], [Open\ MPI*], [
        rankmem_mpi_bindir=`dirname "${MPICC%% *}"`
        AS_IF([test -x "$rankmem_mpi_bindir/ompi_info"],
              [rankmem_ompi_info=$rankmem_mpi_bindir/ompi_info],
              [AC_PATH_PROG([rankmem_ompi_info], [ompi_info], [])])
    ])
    AS_IF([test -n "$rankmem_ompi_info"], [
        AC_MSG_CHECKING([whether Open MPI was built with CUDA support])
        rankmem_w=`"$rankmem_ompi_info" --parsable --all 2>/dev/null | sed -n 's/^mca:mpi:base:param:mpi_built_with_cuda_support:value://p' | head -n 1`
        AS_CASE([$rankmem_w],
            [true|1], [rankmem_mpi_cuda_aware=yes],
            [false|0], [rankmem_mpi_cuda_aware=no])
        AS_IF([test -n "$rankmem_mpi_cuda_aware"],
              [rankmem_mpi_cuda_aware_how="$rankmem_ompi_info at configure time: mpi_built_with_cuda_support = $rankmem_w"])
        AC_MSG_RESULT([${rankmem_mpi_cuda_aware:-unknown}])
    ])
])
AS_IF([test "x$rankmem_mpi_plugin" = xyes],
      [AC_DEFINE([RANKMEM_MPI_PLUGIN_BUILT], [1], [Define to 1 when librankmem_mpi is built.])],
      [AC_DEFINE([RANKMEM_MPI_PLUGIN_BUILT], [0], [Define to 1 when librankmem_mpi is built.])])
AC_DEFINE_UNQUOTED([RANKMEM_MPI_PLUGIN_MSG], ["$rankmem_mpi_plugin_msg"],
    [What configure said about the MPI plugin.])
AC_DEFINE_UNQUOTED([RANKMEM_MPI_LIBRARY], ["$rankmem_mpi_library"],
    [The MPI library the plugin is built against (empty: unknown).])
AC_DEFINE_UNQUOTED([RANKMEM_MPICC], ["$MPICC"], [The MPI C compiler wrapper.])
AC_DEFINE_UNQUOTED([RANKMEM_OMPI_INFO], ["$rankmem_ompi_info"],
    [Open MPI's ompi_info (empty: none).])
AC_DEFINE_UNQUOTED([RANKMEM_MPI_CUDA_AWARE], ["$rankmem_mpi_cuda_aware"],
    [yes or no when configure knew whether the MPI is CUDA-aware, else empty.])
AC_DEFINE_UNQUOTED([RANKMEM_MPI_CUDA_AWARE_HOW], ["$rankmem_mpi_cuda_aware_how"],
    [How configure decided RANKMEM_MPI_CUDA_AWARE.])
])
