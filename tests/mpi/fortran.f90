! An MPI Fortran program (mpif.h) that knows nothing of rankmem. It prints
! "local <rank on the node>" so that tests/mpi/fortran.mpish can compare
! with what the plugin said. Argument: init (MPI_INIT) or thread
! (MPI_INIT_THREAD).
program rankmem_fortran
    implicit none
    include 'mpif.h'
    integer :: ierr, rank, lrank, node, provided
    character(len=16) :: how

    call get_command_argument(1, how)
    if (how == 'thread') then
        call MPI_INIT_THREAD(MPI_THREAD_FUNNELED, provided, ierr)
    else
        call MPI_INIT(ierr)
    end if
    if (ierr /= MPI_SUCCESS) stop 1
    call MPI_COMM_RANK(MPI_COMM_WORLD, rank, ierr)
    call MPI_COMM_SPLIT_TYPE(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, node, ierr)
    call MPI_COMM_RANK(node, lrank, ierr)
    call MPI_COMM_FREE(node, ierr)
    write (*, '(a, i0)') 'local ', lrank
    call MPI_FINALIZE(ierr)
    if (ierr /= MPI_SUCCESS) stop 2
end program rankmem_fortran
