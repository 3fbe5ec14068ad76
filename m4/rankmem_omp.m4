# rankmem_omp.m4 -- configuration of librankmem_omp (omp/).
# RANKMEM_OMP_PLUGIN: after AC_OPENMP. Filled in by the OpenMP issue.
AC_DEFUN([RANKMEM_OMP_PLUGIN], [
])
