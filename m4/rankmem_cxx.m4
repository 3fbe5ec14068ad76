# rankmem_cxx.m4 -- the C++ compiler for include/rankmem.hpp's tests.
#
# RANKMEM_CXX
# -----------
# The library is C; only the tests of the header-only C++ face
# (tests/cxx/, am/cxx.am) need a C++17 compiler. Without one, configure
# goes on and those tests are not built.
#
#   AM_CONDITIONAL  HAVE_CXX      a C++ compiler that builds C++17 with <memory_resource>
#   CXX                           with -std=gnu++17 added when its default is older
#   shell           rankmem_cxx_msg (for the configure summary)
#
# AC_PROG_CXX is expanded for this macro, after LT_INIT: libtool hooks AC_PROG_CXX
# (LT_LANG(CXX) runs with it), so linking C++ programs through libtool works
# either way; with no C++ compiler, libtool only notes that its C++ tag is off.

AC_DEFUN([RANKMEM_CXX], [
dnl Required, not expanded inline: libtool's C++ setup, which AC_PROG_CXX
dnl now runs, requires AC_PROG_CXX itself.
AC_REQUIRE([AC_PROG_CXX])
rankmem_cxx=no
rankmem_cxx_msg="no (no C++ compiler found)"
AS_IF([test -n "$CXX" && test "x$CXX" != xno], [
    AC_LANG_PUSH([C++])
    m4_define([rankmem_cxx17_program], [AC_LANG_PROGRAM([[
#if __cplusplus < 201703L
#error not C++17
#endif
#include <memory_resource>
#include <optional>
]], [[std::pmr::monotonic_buffer_resource r; std::optional<int> o = 1;
      void *p = r.allocate(16, 8); return p && *o == 1 ? 0 : 1;]])])
    AC_CACHE_CHECK([for the option to build C++17 with $CXX], [rankmem_cv_cxx17], [
        rankmem_cv_cxx17=no
        rankmem_save_CXX=$CXX
        for rankmem_opt in '' -std=gnu++17 -std=c++17; do
            CXX="$rankmem_save_CXX $rankmem_opt"
            AC_LINK_IFELSE([rankmem_cxx17_program],
                [AS_IF([test -z "$rankmem_opt"], [rankmem_cv_cxx17="none needed"],
                       [rankmem_cv_cxx17=$rankmem_opt])
                 break])
        done
        CXX=$rankmem_save_CXX])
    AC_LANG_POP([C++])
    AS_CASE([$rankmem_cv_cxx17],
        [no], [rankmem_cxx_msg="no ($CXX does not build C++17 with <memory_resource>)"],
        ["none needed"], [rankmem_cxx=yes],
        [CXX="$CXX $rankmem_cv_cxx17"; rankmem_cxx=yes])
    AS_IF([test "x$rankmem_cxx" = xyes], [rankmem_cxx_msg="yes ($CXX)"])
])
AM_CONDITIONAL([HAVE_CXX], [test "x$rankmem_cxx" = xyes])
])
