# rankmem_cupti.m4 -- what the MPI plugin's observation needs to know about
# CUPTI at build time (issue 19). CUPTI is never linked: the plugin and
# rankmem-info dlopen it (mpi/cupti_find.h); the header is only needed to
# compile the callback source (mpi/observe.c).
#
# RANKMEM_CHECK_CUPTI (after RANKMEM_CHECK_CUDA)
# -------------------
# When CUDA was found:
#   config.h   RANKMEM_CUDA_DIR      "DIR", the toolkit root (a last place to look
#                                    for libcupti at run time)
#              HAVE_CUPTI_H 1        cupti.h found in DIR/include or
#                                    DIR/extras/CUPTI/include
#              RANKMEM_CUPTI_SONAME  "libcupti.so.N" of that toolkit
#   AC_SUBST   CUPTI_CPPFLAGS        -I of extras/CUPTI/include when the header is there
# Sets rankmem_cupti_msg for the configure summary.

AC_DEFUN([RANKMEM_CHECK_CUPTI], [
CUPTI_CPPFLAGS=
rankmem_cupti_msg="no (no CUDA)"
AS_IF([test "x$rankmem_cuda" = xyes], [
    AC_DEFINE_UNQUOTED([RANKMEM_CUDA_DIR], ["$CUDA_DIR"],
        [The CUDA toolkit rankmem was configured with.])
    rankmem_save_CPPFLAGS=$CPPFLAGS
    rankmem_cupti_h=no
    for rankmem_inc in "" "-I$CUDA_DIR/extras/CUPTI/include"; do
        AC_MSG_CHECKING([for cupti.h${rankmem_inc:+ with $rankmem_inc}])
        CPPFLAGS="$rankmem_save_CPPFLAGS $CUDA_CPPFLAGS $rankmem_inc"
        AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <cupti.h>]],
                [[CUpti_SubscriberHandle s = 0; CUpti_CallbackData d; (void)s; (void)d;
                  return (int)CUPTI_CBID_RESOURCE_CONTEXT_CREATED;]])],
            [AC_MSG_RESULT([yes]); rankmem_cupti_h=yes; CUPTI_CPPFLAGS=$rankmem_inc],
            [AC_MSG_RESULT([no])])
        test "x$rankmem_cupti_h" = xyes && break
    done
    CPPFLAGS=$rankmem_save_CPPFLAGS
    rankmem_cupti_so=
    for rankmem_d in "$CUDA_DIR/lib64" "$CUDA_DIR/lib" "$CUDA_DIR/extras/CUPTI/lib64"; do
        for rankmem_f in "$rankmem_d"/libcupti.so.[[0-9]]*; do
            test -f "$rankmem_f" || continue
            rankmem_b=`basename "$rankmem_f"`
            dnl The shortest name is the SONAME (libcupti.so.13, not libcupti.so.13.0.85).
            AS_IF([test -z "$rankmem_cupti_so" || test ${#rankmem_b} -lt ${#rankmem_cupti_so}],
                  [rankmem_cupti_so=$rankmem_b])
        done
        test -n "$rankmem_cupti_so" && break
    done
    AS_IF([test -n "$rankmem_cupti_so"],
          [AC_DEFINE_UNQUOTED([RANKMEM_CUPTI_SONAME], ["$rankmem_cupti_so"],
              [The versioned name of the toolkit's libcupti.])])
    AS_IF([test "x$rankmem_cupti_h" = xyes],
          [AC_DEFINE([HAVE_CUPTI_H], [1], [Define to 1 when cupti.h is available.])
           rankmem_cupti_msg="yes (${rankmem_cupti_so:-libcupti.so}, loaded at run time)"],
          [rankmem_cupti_msg="no (cupti.h not found in $CUDA_DIR; observation off)"])
])
AC_SUBST([CUPTI_CPPFLAGS])
])
