# rankmem_cuda.m4 -- find the CUDA toolkit (runtime headers, libcudart, nvcc).
#
# RANKMEM_CHECK_CUDA
# ------------------
# --with-cuda[=DIR]   DIR is the toolkit root (default: /usr/local/cuda when
#                     it exists); --without-cuda turns CUDA off.
#
# When CUDA is found:
#   config.h           HAVE_CUDA 1
#   AM_CONDITIONAL     HAVE_CUDA
#   AC_SUBST           CUDA_DIR       toolkit root
#                      CUDA_CPPFLAGS  -I$CUDA_DIR/include
#                      CUDA_LDFLAGS   -L$libdir -Wl,-rpath,$libdir (libdir: lib64 or lib)
#                      CUDA_LIBS      -lcudart (shared)
#                      NVCC           $CUDA_DIR/bin/nvcc (precious)
#                      NVCC_ARCH      -gencode ... (precious)
#                      NVCCFLAGS      extra nvcc flags (precious, empty)
#                      NVCC_LIBS      what objects from nvcc need when $CC links
#                                     them (the host C++ runtime: -lstdc++)
# Otherwise every CUDA_* variable is empty and HAVE_CUDA is false.
#
# Asking for CUDA explicitly (--with-cuda or --with-cuda=DIR) and not finding
# it is an error; the automatic default only prints why CUDA is off.
# --with-hip turns the automatic default off (HIP and CUDA are exclusive).
# nvcc is required: the GPU tests and the benchmarks are built with it.
#
# Sets the shell variables rankmem_cuda (yes/no) and rankmem_cuda_msg (for the
# configure summary).

AC_DEFUN([RANKMEM_CHECK_CUDA], [
AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@],
        [use the CUDA toolkit installed in DIR (default: /usr/local/cuda when it exists)])],
    [], [with_cuda=auto])
AC_ARG_VAR([NVCC], [CUDA compiler (default: DIR/bin/nvcc of --with-cuda)])
AC_ARG_VAR([NVCC_ARCH], [nvcc code generation flags
    (default: -gencode arch=compute_75,code=compute_75 -gencode arch=compute_90,code=sm_90)])
AC_ARG_VAR([NVCCFLAGS], [extra flags for nvcc])
AS_IF([test "x${NVCC_ARCH+set}" != xset],
      [NVCC_ARCH="-gencode arch=compute_75,code=compute_75 -gencode arch=compute_90,code=sm_90"])

rankmem_cuda=no
rankmem_cuda_msg="no"
rankmem_cuda_explicit=no
CUDA_DIR=
CUDA_CPPFLAGS=
CUDA_LDFLAGS=
CUDA_LIBS=
NVCC_LIBS=

dnl --with-hip (m4/rankmem_hip.m4) picks the other GPU runtime: no automatic CUDA then.
AS_IF([test "x$with_cuda" = xauto && test -n "$with_hip" && test "x$with_hip" != xno],
      [with_cuda=no; rankmem_cuda_msg="no (--with-hip)"])

AS_CASE([$with_cuda],
    [no],   [AS_IF([test "x$rankmem_cuda_msg" = xno], [rankmem_cuda_msg="no (--without-cuda)"])],
    [auto], [AS_IF([test -d /usr/local/cuda],
                   [CUDA_DIR=/usr/local/cuda],
                   [rankmem_cuda_msg="no (/usr/local/cuda not found; use --with-cuda=DIR)"])],
    [yes],  [CUDA_DIR=/usr/local/cuda; rankmem_cuda_explicit=yes],
    [CUDA_DIR=$with_cuda; rankmem_cuda_explicit=yes])

AS_IF([test -n "$CUDA_DIR"], [
    rankmem_cuda_err=
    CUDA_DIR=`echo "$CUDA_DIR" | sed 's,//*$,,'`
    AS_IF([test -z "$CUDA_DIR"], [CUDA_DIR=/])

    rankmem_save_CPPFLAGS=$CPPFLAGS
    rankmem_save_LDFLAGS=$LDFLAGS
    rankmem_save_LIBS=$LIBS

    dnl The runtime header.
    AC_MSG_CHECKING([for cuda_runtime.h in $CUDA_DIR/include])
    CPPFLAGS="$rankmem_save_CPPFLAGS -I$CUDA_DIR/include"
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime.h>]],
                                       [[cudaError_t e = cudaSuccess; (void)e;]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no])
         rankmem_cuda_err="cuda_runtime.h not found in $CUDA_DIR/include"])

    dnl The shared runtime library, in lib64 or lib.
    AS_IF([test -z "$rankmem_cuda_err"], [
        AC_MSG_CHECKING([for libcudart in $CUDA_DIR])
        rankmem_cuda_libdir=
        for rankmem_d in "$CUDA_DIR/lib64" "$CUDA_DIR/lib"; do
            test -d "$rankmem_d" || continue
            LDFLAGS="$rankmem_save_LDFLAGS -L$rankmem_d"
            LIBS="-lcudart $rankmem_save_LIBS"
            AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime.h>]],
                                            [[int n = 0; return (int)cudaGetDeviceCount(&n);]])],
                [rankmem_cuda_libdir=$rankmem_d; break])
        done
        AS_IF([test -n "$rankmem_cuda_libdir"],
            [AC_MSG_RESULT([$rankmem_cuda_libdir])],
            [AC_MSG_RESULT([no])
             rankmem_cuda_err="cannot link with -lcudart from $CUDA_DIR/lib64 or $CUDA_DIR/lib"])
    ])

    CPPFLAGS=$rankmem_save_CPPFLAGS
    LDFLAGS=$rankmem_save_LDFLAGS
    LIBS=$rankmem_save_LIBS

    dnl The compiler, for the GPU tests and the benchmarks.
    AS_IF([test -z "$rankmem_cuda_err"], [
        AC_PATH_PROG([NVCC], [nvcc], [], [$CUDA_DIR/bin])
        AS_IF([test -z "$NVCC"],
              [rankmem_cuda_err="nvcc not found in $CUDA_DIR/bin (set NVCC=...)"])
    ])

    dnl nvcc compiles host code as C++; linking its objects with $CC needs
    dnl the C++ runtime (static-init guards, exception personality).
    AS_IF([test -z "$rankmem_cuda_err"], [
        AC_MSG_CHECKING([whether $CC links with -lstdc++])
        LIBS="-lstdc++ $rankmem_save_LIBS"
        AC_LINK_IFELSE([AC_LANG_PROGRAM([[]], [[]])],
            [AC_MSG_RESULT([yes]); NVCC_LIBS=-lstdc++],
            [AC_MSG_RESULT([no])
             rankmem_cuda_err="cannot link with -lstdc++ (the C++ runtime nvcc objects need)"])
        LIBS=$rankmem_save_LIBS
    ])

    AS_IF([test -z "$rankmem_cuda_err"], [
        rankmem_cuda=yes
        CUDA_CPPFLAGS="-I$CUDA_DIR/include"
        CUDA_LDFLAGS="-L$rankmem_cuda_libdir -Wl,-rpath,$rankmem_cuda_libdir"
        CUDA_LIBS="-lcudart"
        rankmem_cuda_msg="yes ($CUDA_DIR, $NVCC)"
    ], [test "x$rankmem_cuda_explicit" = xyes], [
        AC_MSG_ERROR([--with-cuda: $rankmem_cuda_err])
    ], [
        AC_MSG_WARN([CUDA disabled: $rankmem_cuda_err])
        rankmem_cuda_msg="no ($rankmem_cuda_err)"
        CUDA_DIR=
    ])
])

AS_IF([test "x$rankmem_cuda" = xyes],
      [AC_DEFINE([HAVE_CUDA], [1], [Define to 1 to build the CUDA resources.])])
AM_CONDITIONAL([HAVE_CUDA], [test "x$rankmem_cuda" = xyes])
AC_SUBST([CUDA_DIR])
AC_SUBST([CUDA_CPPFLAGS])
AC_SUBST([CUDA_LDFLAGS])
AC_SUBST([CUDA_LIBS])
AC_SUBST([NVCC_LIBS])
])
