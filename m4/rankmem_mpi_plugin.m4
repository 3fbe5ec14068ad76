# rankmem_mpi_plugin.m4 -- configuration of librankmem_mpi (mpi/).
# RANKMEM_MPI_PLUGIN: after RANKMEM_CHECK_MPI. Filled in by the MPI plugin issue.
AC_DEFUN([RANKMEM_MPI_PLUGIN], [
])
