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
#                      MPIFC   MPI Fortran wrapper for the Fortran test (precious),
#                              may be empty
#                      MPI_CPPFLAGS, MPI_CFLAGS, MPI_LDFLAGS, MPI_LIBS
#                              what $MPICC adds to $CC (from -showme:compile and
#                              -showme:link for Open MPI, from -show otherwise),
#                              so that automake can build MPI code with $(CC)
#                              (it has no per-target compiler); empty when
#                              they could not be found
#   AM_CONDITIONAL     HAVE_MPI
#
# Nothing is defined in config.h: the core library is built with $CC and never
# includes <mpi.h>. Asking for MPI explicitly (--with-mpi or --with-mpi=DIR)
# and not finding a working mpicc is an error.
#
# A wrapper with a suffix (mpicc.mpich, mpicc.openmpi: Debian installs both)
# makes the launcher and Fortran wrapper default to the same suffix
# (mpiexec.mpich, mpifort.mpich), so that one MPI is used throughout.
#
# Sets the shell variables rankmem_mpi (yes/no) and rankmem_mpi_msg.

AC_DEFUN([RANKMEM_CHECK_MPI], [
AC_ARG_WITH([mpi],
    [AS_HELP_STRING([--with-mpi@<:@=DIR@:>@],
        [build the MPI parts with MPICC, or DIR/bin/mpicc (default: auto)])],
    [], [with_mpi=auto])
AC_ARG_VAR([MPICC], [MPI C compiler wrapper (default: mpicc)])
AC_ARG_VAR([MPIRUN], [MPI launcher for the tests (default: mpirun or mpiexec)])
AC_ARG_VAR([MPIFC], [MPI Fortran wrapper for the Fortran test (default: mpifort or mpif90)])

rankmem_mpi=no
rankmem_mpi_msg="no (--without-mpi)"
rankmem_mpi_path=$PATH
AS_CASE([$with_mpi],
    [yes|no|auto], [],
    [rankmem_mpi_path="$with_mpi/bin"])

AS_IF([test "x$with_mpi" != xno], [
    dnl A value the user gave wins (AC_PATH_PROGS would search its own list
    dnl of names instead of a bare name such as MPICC=mpicc.mpich).
    RANKMEM_MPI_PROG([MPICC], [mpicc])
    dnl mpicc.mpich -> .mpich: the launcher and Fortran wrapper of the same MPI.
    rankmem_mpi_sfx=
    AS_CASE([`basename "${MPICC%% *}" 2>/dev/null`],
        [mpicc.*], [rankmem_mpi_sfx=.`basename "${MPICC%% *}" | sed 's/^mpicc\.//'`])
    rankmem_mpi_dir=`dirname "${MPICC%% *}" 2>/dev/null`
    AS_CASE([$MPICC], [*/*], [rankmem_mpi_path="$rankmem_mpi_dir$PATH_SEPARATOR$rankmem_mpi_path"])
    AS_IF([test -n "$rankmem_mpi_sfx"], [
        RANKMEM_MPI_PROG([MPIRUN], [mpiexec$rankmem_mpi_sfx mpirun$rankmem_mpi_sfx mpirun mpiexec])
        RANKMEM_MPI_PROG([MPIFC], [mpifort$rankmem_mpi_sfx mpif90$rankmem_mpi_sfx])
    ], [
        RANKMEM_MPI_PROG([MPIRUN], [mpirun mpiexec])
        RANKMEM_MPI_PROG([MPIFC], [mpifort mpif90])
    ])
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
        RANKMEM_MPI_WRAPPER_FLAGS
    ], [test "x$with_mpi" != xauto], [
        AC_MSG_ERROR([--with-mpi: $rankmem_mpi_err])
    ], [
        rankmem_mpi_msg="no ($rankmem_mpi_err)"
    ])
])
AM_CONDITIONAL([HAVE_MPI], [test "x$rankmem_mpi" = xyes])
AC_SUBST([MPI_CPPFLAGS])
AC_SUBST([MPI_CFLAGS])
AC_SUBST([MPI_LDFLAGS])
AC_SUBST([MPI_LIBS])
])

# RANKMEM_MPI_PROG(VARIABLE, NAMES)
# ---------------------------------
# VARIABLE as the user gave it (a bare name is looked up in $PATH; a path
# or a command with arguments is kept as is), else the first of NAMES in
# $rankmem_mpi_path.
AC_DEFUN([RANKMEM_MPI_PROG], [
    AS_IF([test -n "$$1"], [
        AC_MSG_CHECKING([for $1])
        AS_CASE([$$1],
            [*/*|*" "*], [],
            [rankmem_p=`command -v "$$1" 2>/dev/null` && test -n "$rankmem_p" && $1=$rankmem_p])
        AC_MSG_RESULT([$$1])
    ], [
        AC_PATH_PROGS([$1], [$2], [], [$rankmem_mpi_path])
    ])
])

# RANKMEM_MPI_WRAPPER_FLAGS
# -------------------------
# Split what $MPICC adds to the compiler into MPI_CPPFLAGS (-I, -D,
# -isystem), MPI_CFLAGS (-pthread), MPI_LDFLAGS (-L, -Wl,..., -Xlinker X,
# -pthread) and MPI_LIBS (-l...). Open MPI answers -showme:compile and
# -showme:link; MPICH, MVAPICH and Intel MPI answer -show with the whole
# command line (its first word, the compiler, is dropped). Other flags of
# the wrapper (optimisation, LTO, hardening) are left out on purpose: they
# are the distribution's choice for its own build, not what MPI needs.
# Sets rankmem_mpi_flags=yes when a program links with $CC and the flags.
AC_DEFUN([RANKMEM_MPI_WRAPPER_FLAGS], [
    AC_MSG_CHECKING([for the flags $MPICC adds to the compiler])
    MPI_CPPFLAGS= MPI_CFLAGS= MPI_LDFLAGS= MPI_LIBS=
    rankmem_mpi_flags=no
    rankmem_mpi_words=
    AS_IF([rankmem_mpi_c=`$MPICC -showme:compile 2>/dev/null` &&
           rankmem_mpi_l=`$MPICC -showme:link 2>/dev/null` &&
           test -n "$rankmem_mpi_c$rankmem_mpi_l"], [
        rankmem_mpi_words="$rankmem_mpi_c $rankmem_mpi_l"
    ], [rankmem_mpi_c=`$MPICC -show 2>/dev/null` && test -n "$rankmem_mpi_c"], [
        dnl drop the first word: the compiler the wrapper calls
        rankmem_mpi_words=`echo "$rankmem_mpi_c" | sed 's/^[[ 	]]*[[^ 	]]*//'`
    ])
    _AS_ECHO_LOG([$MPICC adds: $rankmem_mpi_words])
    rankmem_mpi_next=
    for rankmem_w in $rankmem_mpi_words; do
        AS_CASE([$rankmem_mpi_next],
            [cpp], [MPI_CPPFLAGS="$MPI_CPPFLAGS $rankmem_w"; rankmem_mpi_next=; continue],
            [ld], [MPI_LDFLAGS="$MPI_LDFLAGS $rankmem_w"; rankmem_mpi_next=; continue])
        AS_CASE([$rankmem_w],
            [-I?*|-D?*], [MPI_CPPFLAGS="$MPI_CPPFLAGS $rankmem_w"],
            [-isystem], [MPI_CPPFLAGS="$MPI_CPPFLAGS $rankmem_w"; rankmem_mpi_next=cpp],
            [-pthread], [MPI_CFLAGS="$MPI_CFLAGS $rankmem_w"; MPI_LDFLAGS="$MPI_LDFLAGS $rankmem_w"],
            [-l?*], [MPI_LIBS="$MPI_LIBS $rankmem_w"],
            [-L?*|-Wl,*], [MPI_LDFLAGS="$MPI_LDFLAGS $rankmem_w"],
            [-Xlinker], [MPI_LDFLAGS="$MPI_LDFLAGS $rankmem_w"; rankmem_mpi_next=ld],
            [_AS_ECHO_LOG([$MPICC flag left out: $rankmem_w])])
    done
    dnl strip the leading blank
    MPI_CPPFLAGS=`echo $MPI_CPPFLAGS`
    MPI_CFLAGS=`echo $MPI_CFLAGS`
    MPI_LDFLAGS=`echo $MPI_LDFLAGS`
    MPI_LIBS=`echo $MPI_LIBS`
    AS_IF([test -z "$MPI_LIBS"], [
        AC_MSG_RESULT([none found])
    ], [
        AC_MSG_RESULT([$MPI_CPPFLAGS $MPI_CFLAGS $MPI_LDFLAGS $MPI_LIBS])
        AC_MSG_CHECKING([whether $CC links an MPI program with them])
        rankmem_save_CPPFLAGS=$CPPFLAGS
        rankmem_save_CFLAGS=$CFLAGS
        rankmem_save_LDFLAGS=$LDFLAGS
        rankmem_save_LIBS=$LIBS
        CPPFLAGS="$CPPFLAGS $MPI_CPPFLAGS"
        CFLAGS="$CFLAGS $MPI_CFLAGS"
        LDFLAGS="$LDFLAGS $MPI_LDFLAGS"
        LIBS="$MPI_LIBS $LIBS"
        AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>]],
                                        [[int r = 0; MPI_Init(0, 0);
                                          PMPI_Comm_rank(MPI_COMM_WORLD, &r);
                                          MPI_Finalize(); return r;]])],
            [AC_MSG_RESULT([yes]); rankmem_mpi_flags=yes],
            [AC_MSG_RESULT([no])])
        CPPFLAGS=$rankmem_save_CPPFLAGS
        CFLAGS=$rankmem_save_CFLAGS
        LDFLAGS=$rankmem_save_LDFLAGS
        LIBS=$rankmem_save_LIBS
    ])
    AS_IF([test "x$rankmem_mpi_flags" != xyes], [MPI_CPPFLAGS= MPI_CFLAGS= MPI_LDFLAGS= MPI_LIBS=])
])
