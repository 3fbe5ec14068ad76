# rankmem_mpi.m4 -- find an MPI C compiler wrapper and launcher.
#
# RANKMEM_CHECK_MPI
# -----------------
# --with-mpi[=DIR]    build the MPI parts with $MPICC (default: auto, when an
#                     mpicc that compiles and links an MPI program is found).
#                     DIR: use DIR/bin/mpicc and DIR/bin/mpirun (not $PATH).
#                     --without-mpi turns MPI off.
#
#   AC_SUBST           MPICC   MPI C compiler wrapper (precious; default mpicc)
#                      MPIRUN  MPI launcher (precious; mpirun or mpiexec), may be empty
#   AM_CONDITIONAL     HAVE_MPI
#
# Nothing is defined in config.h: the core library is built with $CC and never
# includes <mpi.h>. Asking for MPI explicitly (--with-mpi or --with-mpi=DIR)
# and not finding a working mpicc is an error.
#
# Sets the shell variables rankmem_mpi (yes/no) and rankmem_mpi_msg.

AC_DEFUN([RANKMEM_CHECK_MPI], [
AC_ARG_WITH([mpi],
    [AS_HELP_STRING([--with-mpi@<:@=DIR@:>@],
        [build the MPI parts with MPICC, or DIR/bin/mpicc (default: auto)])],
    [], [with_mpi=auto])
AC_ARG_VAR([MPICC], [MPI C compiler wrapper (default: mpicc)])
AC_ARG_VAR([MPIRUN], [MPI launcher for the tests (default: mpirun or mpiexec)])

rankmem_mpi=no
rankmem_mpi_msg="no (--without-mpi)"
rankmem_mpi_path=$PATH
AS_CASE([$with_mpi],
    [yes|no|auto], [],
    [rankmem_mpi_path="$with_mpi/bin"])

AS_IF([test "x$with_mpi" != xno], [
    AC_PATH_PROGS([MPICC], [mpicc], [], [$rankmem_mpi_path])
    AC_PATH_PROGS([MPIRUN], [mpirun mpiexec], [], [$rankmem_mpi_path])
    rankmem_mpi_err=
    AS_IF([test -z "$MPICC"], [rankmem_mpi_err="mpicc not found (set MPICC=...)"], [
        AC_MSG_CHECKING([whether $MPICC links an MPI program])
        rankmem_save_CC=$CC
        CC=$MPICC
        AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>]],
                                        [[int r = 0; MPI_Init(0, 0);
                                          MPI_Comm_rank(MPI_COMM_WORLD, &r);
                                          MPI_Finalize(); return r;]])],
            [AC_MSG_RESULT([yes])],
            [AC_MSG_RESULT([no])
             rankmem_mpi_err="$MPICC cannot build an MPI program (see config.log)"])
        CC=$rankmem_save_CC
    ])
    AS_IF([test -z "$rankmem_mpi_err"], [
        rankmem_mpi=yes
        rankmem_mpi_msg="yes ($MPICC, launcher: ${MPIRUN:-none})"
    ], [test "x$with_mpi" != xauto], [
        AC_MSG_ERROR([--with-mpi: $rankmem_mpi_err])
    ], [
        rankmem_mpi_msg="no ($rankmem_mpi_err)"
    ])
])
AM_CONDITIONAL([HAVE_MPI], [test "x$rankmem_mpi" = xyes])
])
