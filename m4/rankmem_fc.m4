# rankmem_fc.m4 -- the Fortran module (fortran/rankmem.f90) and its example.
#
# RANKMEM_FC (before LT_INIT, like AC_PROG_CXX: LT_INIT then sets up
# ----------  libtool's Fortran tag for the compiler found here; after it,
#             libtool's hook on AC_PROG_FC makes autoconf warn)
# --disable-fortran   do not build the module even when a compiler is found.
#
# Looks for a Fortran compiler (FC, precious; gfortran first), and checks
# that it compiles free-form .f90 with iso_c_binding and bind(C)
# interfaces (Fortran 2003), and how it is told where modules go and where
# to find them.
#
#   AM_CONDITIONAL  RANKMEM_FORTRAN   build librankmem_fortran, install
#                                     rankmem.mod, build and test the example
#   AC_SUBST        FC_MODINC         flag that adds a module search directory (-I)
#                   FC_MODOUT         flag that sets where .mod files are written
#                                     (gfortran, flang: -J; Intel, NVIDIA: -module )
#                   FCFLAGS_f90       what the compiler needs to take .f90 (usually empty)
#
# Without a compiler (or with one that cannot do the above) the module is
# left out, quietly unless --enable-fortran asked for it. Sets
# rankmem_fc_msg for the configure summary.

AC_DEFUN([RANKMEM_FC], [
AC_ARG_ENABLE([fortran],
    [AS_HELP_STRING([--disable-fortran],
        [do not build the Fortran module rankmem (default: build it when a Fortran 2003 compiler is found)])],
    [], [enable_fortran=auto])

dnl AC_PROG_FC only looks: with no compiler found FC is empty and
dnl configure goes on. Required (not expanded here) because AC_FC_SRCEXT
dnl below requires it too; its own list of names starts with gfortran.
AC_REQUIRE([AC_PROG_FC])

rankmem_fc=no
rankmem_fc_err=
AS_IF([test "x$enable_fortran" = xno], [rankmem_fc_err="--disable-fortran"],
      [test -z "$FC"], [rankmem_fc_err="no Fortran compiler found (set FC)"])

AS_IF([test -z "$rankmem_fc_err"], [
    AC_LANG_PUSH([Fortran])
    AC_FC_SRCEXT([f90], [], [rankmem_fc_err="$FC does not compile .f90 files"])
    AS_IF([test -z "$rankmem_fc_err"], [
        AC_CACHE_CHECK([whether $FC compiles iso_c_binding and bind(C) interfaces],
                       [rankmem_cv_fc_c_binding], [
            AC_COMPILE_IFELSE([AC_LANG_SOURCE([[
module rankmem_conftest
  use, intrinsic :: iso_c_binding
  implicit none
  type, bind(C) :: pair
    integer(c_size_t) :: size
    integer(c_int) :: tag
  end type pair
  interface
    function c_strlen(s) bind(C, name='strlen') result(n)
      import :: c_char, c_size_t
      character(kind=c_char), intent(in) :: s(*)
      integer(c_size_t) :: n
    end function c_strlen
  end interface
contains
  function fstr(c) result(s)
    type(c_ptr), intent(in) :: c
    character(:), allocatable :: s
    s = ''
    if (c_associated(c)) s = 'x'
  end function fstr
end module rankmem_conftest
]])], [rankmem_cv_fc_c_binding=yes], [rankmem_cv_fc_c_binding=no])
            rm -f rankmem_conftest.mod])
        AS_IF([test "x$rankmem_cv_fc_c_binding" != xyes],
              [rankmem_fc_err="$FC does not compile Fortran 2003 iso_c_binding"])
    ])
    AS_IF([test -z "$rankmem_fc_err"], [
        AC_FC_MODULE_FLAG([], [rankmem_fc_err="cannot tell $FC where modules are"])
    ])
    AS_IF([test -z "$rankmem_fc_err"], [
        AC_FC_MODULE_OUTPUT_FLAG([], [rankmem_fc_err="cannot tell $FC where to write modules"])
    ])
    AC_LANG_POP([Fortran])
])

AS_IF([test -z "$rankmem_fc_err"], [rankmem_fc=yes])
AS_IF([test "x$enable_fortran" = xyes && test "x$rankmem_fc" != xyes],
      [AC_MSG_ERROR([--enable-fortran: $rankmem_fc_err])])
AM_CONDITIONAL([RANKMEM_FORTRAN], [test "x$rankmem_fc" = xyes])
AC_SUBST([FC_MODINC])
AC_SUBST([FC_MODOUT])
AS_IF([test "x$rankmem_fc" = xyes], [rankmem_fc_msg="yes ($FC; module rankmem.mod in \$(includedir))"],
      [rankmem_fc_msg="no ($rankmem_fc_err)"])
])
