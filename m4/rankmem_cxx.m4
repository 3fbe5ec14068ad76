# rankmem_cxx.m4 -- the C++ compiler for include/rankmem.hpp's tests.
# RANKMEM_CXX: filled in by the C++ header issue.
AC_DEFUN([RANKMEM_CXX], [
])
