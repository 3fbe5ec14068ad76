# rankmem_hip.m4 -- find the HIP runtime (AMD GPUs) for the C library.
#
# RANKMEM_CHECK_HIP (after RANKMEM_CHECK_CUDA)
# -----------------
# --with-hip[=DIR]   build the GPU resources against HIP instead of CUDA. DIR
#                    is the install root holding include/hip and the library
#                    (default: /opt/rocm when it exists, else /usr, where
#                    Debian's libamdhip64-dev puts them). Default: no.
#
# HIP and CUDA are exclusive: --with-hip turns the automatic CUDA default off
# (m4/rankmem_cuda.m4 looks at with_hip), and --with-hip together with an
# explicit --with-cuda is an error. No hipcc is needed: the library is plain C
# built by $CC against hip_runtime_api.h (-D__HIP_PLATFORM_AMD__). The GPU
# tests, benchmarks and examples that have kernels are .cu files for nvcc and
# stay CUDA-only (HAVE_CUDA).
#
# When HIP is found:
#   config.h           HAVE_HIP 1
#   AM_CONDITIONAL     HAVE_HIP
#   AC_SUBST           HIP_DIR, HIP_CPPFLAGS (-D__HIP_PLATFORM_AMD__ -I...),
#                      HIP_LDFLAGS (-L... -Wl,-rpath,... unless a system dir),
#                      HIP_LIBS (-lamdhip64)
# Either runtime:
#   config.h           HAVE_GPU 1 (CUDA or HIP: "a GPU runtime exists")
#   AM_CONDITIONAL     HAVE_GPU
# Sets rankmem_hip (yes/no) and rankmem_hip_msg (for the configure summary).

AC_DEFUN([RANKMEM_CHECK_HIP], [
AC_ARG_WITH([hip],
    [AS_HELP_STRING([--with-hip@<:@=DIR@:>@],
        [build against the HIP runtime (AMD GPUs) installed under DIR instead of CUDA
         (default DIR: /opt/rocm when it exists, else /usr)])],
    [], [with_hip=no])

rankmem_hip=no
rankmem_hip_msg="no"
HIP_DIR=
HIP_CPPFLAGS=
HIP_LDFLAGS=
HIP_LIBS=

AS_CASE([$with_hip],
    [no],  [],
    [yes], [AS_IF([test -d /opt/rocm/include/hip], [HIP_DIR=/opt/rocm], [HIP_DIR=/usr])],
    [HIP_DIR=`echo "$with_hip" | sed 's,//*$,,'`])

AS_IF([test -n "$HIP_DIR"], [
    AS_IF([test "x$rankmem_cuda" = xyes],
          [AC_MSG_ERROR([--with-hip and --with-cuda are exclusive: choose one GPU runtime])])
    rankmem_hip_err=
    HIP_CPPFLAGS="-D__HIP_PLATFORM_AMD__"
    AS_IF([test "x$HIP_DIR" != x/usr], [HIP_CPPFLAGS="$HIP_CPPFLAGS -I$HIP_DIR/include"])

    rankmem_save_CPPFLAGS=$CPPFLAGS
    rankmem_save_LDFLAGS=$LDFLAGS
    rankmem_save_LIBS=$LIBS
    CPPFLAGS="$rankmem_save_CPPFLAGS $HIP_CPPFLAGS"

    dnl The runtime header, with the stream-ordered allocator (HIP >= 5.2). It
    dnl must be DIR's own, not one the compiler finds elsewhere.
    AC_MSG_CHECKING([for hip/hip_runtime_api.h with memory pools in $HIP_DIR])
    AS_IF([test ! -f "$HIP_DIR/include/hip/hip_runtime_api.h"], [
        AC_MSG_RESULT([no])
        rankmem_hip_err="$HIP_DIR/include/hip/hip_runtime_api.h not found"
    ], [AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <hip/hip_runtime_api.h>]],
        [[hipMemPool_t p = 0; hipMemPoolProps props = {0}; void *d = 0;
          (void)hipMemPoolCreate(&p, &props);
          (void)hipMallocFromPoolAsync(&d, 1, p, 0);
          (void)hipMemPoolTrimTo(p, 0);]])],
        [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no])
         rankmem_hip_err="$HIP_DIR/include/hip/hip_runtime_api.h has no hipMemPoolCreate (HIP 5.2 or newer is needed)"])])

    dnl The shared runtime library: DIR/lib or DIR/lib64; for /usr, also the
    dnl compiler's own path (Debian: /usr/lib/x86_64-linux-gnu).
    AS_IF([test -z "$rankmem_hip_err"], [
        AC_MSG_CHECKING([for libamdhip64])
        rankmem_hip_libdir=none
        LIBS="-lamdhip64 $rankmem_save_LIBS"
        rankmem_hip_dirs="$HIP_DIR/lib $HIP_DIR/lib64"
        AS_IF([test "x$HIP_DIR" = x/usr], [rankmem_hip_dirs="default"])
        for rankmem_d in $rankmem_hip_dirs; do
            AS_IF([test "x$rankmem_d" = xdefault],
                  [LDFLAGS=$rankmem_save_LDFLAGS],
                  [test -d "$rankmem_d"],
                  [LDFLAGS="$rankmem_save_LDFLAGS -L$rankmem_d"],
                  [continue])
            AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <hip/hip_runtime_api.h>]],
                                            [[int n = 0; return (int)hipGetDeviceCount(&n);]])],
                [rankmem_hip_libdir=$rankmem_d; break])
        done
        AS_CASE([$rankmem_hip_libdir],
            [none], [AC_MSG_RESULT([no])
                     rankmem_hip_err="cannot link with -lamdhip64 (looked in: $rankmem_hip_dirs)"],
            [default], [AC_MSG_RESULT([yes (default path)])],
            [AC_MSG_RESULT([$rankmem_hip_libdir])
             dnl System directories need neither -L nor an rpath.
             AS_CASE([$rankmem_hip_libdir],
                 [/usr/lib|/usr/lib64], [],
                 [HIP_LDFLAGS="-L$rankmem_hip_libdir -Wl,-rpath,$rankmem_hip_libdir"])])
    ])

    CPPFLAGS=$rankmem_save_CPPFLAGS
    LDFLAGS=$rankmem_save_LDFLAGS
    LIBS=$rankmem_save_LIBS

    AS_IF([test -z "$rankmem_hip_err"], [
        rankmem_hip=yes
        HIP_LIBS="-lamdhip64"
        rankmem_hip_msg="yes ($HIP_DIR; GPU tests with kernels are CUDA-only)"
    ], [
        dnl Asked for explicitly (the only way HIP is on): not finding it is an error.
        AC_MSG_ERROR([--with-hip: $rankmem_hip_err])
    ])
])

AS_IF([test "x$rankmem_hip" = xyes],
      [AC_DEFINE([HAVE_HIP], [1], [Define to 1 to build the GPU resources against HIP.])])
AS_IF([test "x$rankmem_hip" = xyes || test "x$rankmem_cuda" = xyes],
      [AC_DEFINE([HAVE_GPU], [1], [Define to 1 when a GPU runtime (CUDA or HIP) is used.])])
AM_CONDITIONAL([HAVE_HIP], [test "x$rankmem_hip" = xyes])
AM_CONDITIONAL([HAVE_GPU], [test "x$rankmem_hip" = xyes || test "x$rankmem_cuda" = xyes])
AC_SUBST([HIP_DIR])
AC_SUBST([HIP_CPPFLAGS])
AC_SUBST([HIP_LDFLAGS])
AC_SUBST([HIP_LIBS])
])
