# rankmem_omp.m4 -- configuration of librankmem_omp (omp/).
#
# RANKMEM_OMP_PLUGIN (after AC_OPENMP)
# ------------------
# --disable-omp-plugin   do not build librankmem_omp.
#
# librankmem_omp is built once with $(CC) and serves programs of either
# OpenMP runtime; it never links one (it finds the runtime's functions with
# dlsym(RTLD_NEXT)). It needs a shared-library build, dlsym and, for its
# tests, OpenMP in $CC.
#
#   AM_CONDITIONAL  RANKMEM_OMP        build librankmem_omp and its tests
#                   RANKMEM_OMP_CLANG  also build the tests with clang + libomp
#   AC_SUBST        RANKMEM_OMP_DL_LIBS  what dlsym needs (-ldl on old glibc)
#                   OMP_CLANG            clang for the libomp test build (precious)
#                   OMP_CLANG_OPENMP     its OpenMP flag (precious; -fopenmp=libomp)
#
# The clang build is skipped when CFLAGS/LDFLAGS ask for a sanitizer: the
# library would carry $(CC)'s sanitizer runtime, which clang's cannot join.
# Built for CUDA and HIP alike: omp/'s own runtime calls (device memsets and
# copies) go through src/gpu_api.h.
# Sets rankmem_omp_msg for the configure summary.

AC_DEFUN([RANKMEM_OMP_PLUGIN], [
AC_ARG_ENABLE([omp-plugin],
    [AS_HELP_STRING([--disable-omp-plugin],
        [do not build librankmem_omp (OpenMP allocators served by rankmem)])],
    [], [enable_omp_plugin=auto])
AC_ARG_VAR([OMP_CLANG], [clang used to build the OpenMP tests a second time against LLVM's libomp (default: clang)])
AC_ARG_VAR([OMP_CLANG_OPENMP], [OpenMP flag for OMP_CLANG (default: -fopenmp=libomp)])

rankmem_omp=no
rankmem_omp_clang=no
rankmem_omp_err=
RANKMEM_OMP_DL_LIBS=

AS_IF([test "x$enable_omp_plugin" = xno],
        [rankmem_omp_err="--disable-omp-plugin"],
      [test "x$enable_openmp" = xno || test "x$ac_cv_prog_c_openmp" = xunsupported],
        [rankmem_omp_err="no OpenMP in $CC"],
      [test "x$enable_shared" = xno],
        [rankmem_omp_err="needs shared libraries (interposition)"])

AS_IF([test -z "$rankmem_omp_err"], [
    rankmem_save_LIBS=$LIBS
    AC_SEARCH_LIBS([dlsym], [dl],
        [AS_CASE([$ac_cv_search_dlsym], ["none required"], [], [RANKMEM_OMP_DL_LIBS=$ac_cv_search_dlsym])],
        [rankmem_omp_err="no dlsym"])
    LIBS=$rankmem_save_LIBS
])

AS_IF([test -z "$rankmem_omp_err"], [
    AC_CACHE_CHECK([whether $CC $OPENMP_CFLAGS links the OpenMP 5 allocator API], [rankmem_cv_omp_alloc], [
        rankmem_save_CFLAGS=$CFLAGS
        CFLAGS="$CFLAGS $OPENMP_CFLAGS"
        AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <omp.h>]],
            [[omp_alloctrait_t t[1] = {{omp_atk_alignment, 64}};
              omp_allocator_handle_t a = omp_init_allocator(omp_default_mem_space, 1, t);
              void *p = omp_alloc(8, a);
              omp_free(p, a);
              omp_destroy_allocator(a);
              return p == 0;]])],
            [rankmem_cv_omp_alloc=yes], [rankmem_cv_omp_alloc=no])
        CFLAGS=$rankmem_save_CFLAGS])
    AS_IF([test "x$rankmem_cv_omp_alloc" != xyes],
          [rankmem_omp_err="$CC has no OpenMP 5 allocators"])
])

AS_IF([test -z "$rankmem_omp_err"], [rankmem_omp=yes])

dnl The second test build: clang with LLVM's libomp (Debian: clang, libomp-dev).
AS_IF([test "x$rankmem_omp" = xyes], [
    AS_IF([test -z "$OMP_CLANG"], [AC_PATH_PROGS([OMP_CLANG], [clang clang-18 clang-17 clang-16 clang-15 clang-14])])
    AS_IF([test "x${OMP_CLANG_OPENMP+set}" != xset], [OMP_CLANG_OPENMP=-fopenmp=libomp])
    rankmem_omp_sanitize=no
    AS_CASE([" $CFLAGS $LDFLAGS "], [*-fsanitize=*], [rankmem_omp_sanitize=yes])
    AS_IF([test "x$rankmem_omp_sanitize" = xyes], [rankmem_omp_clang_why="skipped: sanitizer flags"],
          [test -z "$OMP_CLANG"], [rankmem_omp_clang_why="no clang"], [
        AC_CACHE_CHECK([whether $OMP_CLANG $OMP_CLANG_OPENMP builds and runs libomp programs], [rankmem_cv_omp_clang], [
            rankmem_cv_omp_clang=no
            cat > conftest-omp.c <<_RKEOF
#include <omp.h>
int main(void) {
    void *p = omp_alloc(64, omp_default_mem_alloc);
    omp_free(p, omp_default_mem_alloc);
    return p == 0;
}
_RKEOF
            AS_IF([$OMP_CLANG $OMP_CLANG_OPENMP conftest-omp.c -o conftest-omp$ac_exeext >&AS_MESSAGE_LOG_FD 2>&1 &&
                   ./conftest-omp$ac_exeext >&AS_MESSAGE_LOG_FD 2>&1],
                  [rankmem_cv_omp_clang=yes])
            rm -f conftest-omp.c conftest-omp$ac_exeext])
        AS_IF([test "x$rankmem_cv_omp_clang" = xyes], [rankmem_omp_clang=yes],
              [rankmem_omp_clang_why="$OMP_CLANG $OMP_CLANG_OPENMP cannot build libomp programs (libomp-dev?)"])
    ])
])

AM_CONDITIONAL([RANKMEM_OMP], [test "x$rankmem_omp" = xyes])
AM_CONDITIONAL([RANKMEM_OMP_CLANG], [test "x$rankmem_omp_clang" = xyes])
AC_SUBST([RANKMEM_OMP_DL_LIBS])
AS_IF([test "x$rankmem_omp" != xyes], [rankmem_omp_msg="no ($rankmem_omp_err)"],
      [test "x$rankmem_omp_clang" = xyes], [rankmem_omp_msg="yes (tests: $CC and $OMP_CLANG + libomp)"],
      [rankmem_omp_msg="yes (tests: $CC only; clang + libomp $rankmem_omp_clang_why)"])
])
