# rankmem_mpi_plugin.m4 -- configuration of librankmem_mpi (mpi/).
#
# RANKMEM_MPI_PLUGIN (after RANKMEM_CHECK_MPI and RANKMEM_CHECK_CUDA)
# ------------------
# The plugin is built with $(CC) and the flags RANKMEM_CHECK_MPI took from
# the wrapper (MPI_CPPFLAGS ... MPI_LIBS), so it needs those flags to have
# been found. --disable-mpi-plugin turns it off.
#
#   AM_CONDITIONAL  HAVE_MPI_PLUGIN   HAVE_MPI and the wrapper's flags link
#                   HAVE_MPIFC        an MPI Fortran wrapper was found (the
#                                     Fortran test builds with it at run time)
#   AC_SUBST        HWLOC_LIBS        -lhwloc when hwloc (2.x) is used
#                   DL_LIBS           what dlsym needs (-ldl on old glibc)
#   AC_DEFINE       HAVE_HWLOC        RANKMEM_BIND=nearest asks hwloc for the
#                                     GPUs' CPU locality (else sysfs)
#
# --without-hwloc keeps hwloc out even when it is installed. Appends the
# plugin's state to rankmem_mpi_msg for the summary.
AC_DEFUN([RANKMEM_MPI_PLUGIN], [
AC_ARG_ENABLE([mpi-plugin],
    [AS_HELP_STRING([--disable-mpi-plugin],
        [do not build librankmem_mpi (default: build it when MPI is found)])],
    [], [enable_mpi_plugin=auto])
AC_ARG_WITH([hwloc],
    [AS_HELP_STRING([--without-hwloc],
        [RANKMEM_BIND=nearest reads sysfs instead of asking hwloc (default: hwloc when found)])],
    [], [with_hwloc=auto])

rankmem_mpi_plugin=no
rankmem_mpi_plugin_msg=
HWLOC_LIBS=
DL_LIBS=
AS_IF([test "x$enable_mpi_plugin" = xno], [
    rankmem_mpi_plugin_msg="off (--disable-mpi-plugin)"
], [test "x$rankmem_mpi" != xyes], [
    rankmem_mpi_plugin_msg="off (no MPI)"
], [test "x$rankmem_mpi_flags" != xyes], [
    rankmem_mpi_plugin_msg="off (cannot build with \$CC and the flags of $MPICC; see config.log)"
], [
    rankmem_mpi_plugin=yes
    dnl dlsym: the Fortran hooks find the MPI's Fortran PMPI routines at run
    dnl time, so that the plugin does not link the MPI's Fortran library.
    AC_CHECK_FUNC([dlsym], [], [AC_CHECK_LIB([dl], [dlsym], [DL_LIBS=-ldl],
        [rankmem_mpi_plugin=no; rankmem_mpi_plugin_msg="off (no dlsym)"])])
    AS_IF([test "x$with_hwloc" != xno], [
        rankmem_hwloc=no
        AC_CHECK_HEADER([hwloc.h], [
            AC_CHECK_LIB([hwloc], [hwloc_topology_set_io_types_filter],
                         [rankmem_hwloc=yes; HWLOC_LIBS=-lhwloc])])
        AS_IF([test "x$rankmem_hwloc" = xyes], [
            AC_DEFINE([HAVE_HWLOC], [1],
                      [Define to 1 when the MPI plugin asks hwloc (2.x) for GPU locality.])
        ], [test "x$with_hwloc" = xyes], [
            AC_MSG_ERROR([--with-hwloc: hwloc 2.x (hwloc.h, -lhwloc) not found])
        ])
    ])
    AS_IF([test "x$rankmem_mpi_plugin" = xyes], [
        rankmem_near=sysfs
        test -n "$HWLOC_LIBS" && rankmem_near=hwloc
        rankmem_mpi_plugin_msg="librankmem_mpi (nearest: $rankmem_near; Fortran test: ${MPIFC:-no mpifort})"
    ])
])
AS_IF([test "x$enable_mpi_plugin" = xyes && test "x$rankmem_mpi_plugin" != xyes],
      [AC_MSG_ERROR([--enable-mpi-plugin: $rankmem_mpi_plugin_msg])])
rankmem_mpi_msg="$rankmem_mpi_msg; plugin: $rankmem_mpi_plugin_msg"
AM_CONDITIONAL([HAVE_MPI_PLUGIN], [test "x$rankmem_mpi_plugin" = xyes])
AM_CONDITIONAL([HAVE_MPIFC], [test -n "$MPIFC"])
AC_SUBST([HWLOC_LIBS])
AC_SUBST([DL_LIBS])
])
