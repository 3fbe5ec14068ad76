! fortran_demo: rankmem from Fortran through the rankmem module
! (fortran/rankmem.f90). Builds a chain from a spec string, allocates an
! array from it, reads the stats adaptor's counters, and shows a refused
! spec. Without a GPU the chain runs on host memory (a 'system' leaf), so
! the demo also runs on any CPU.
!
!   gfortran fortran_demo.f90 -I$PREFIX/include -L$PREFIX/lib -lrankmem_fortran -lrankmem
!
! Exit status: 0 when every step did what it should, 1 otherwise.
program fortran_demo
  use, intrinsic :: iso_c_binding
  use rankmem
  implicit none

  integer(c_int) :: st, major, minor, patch, ndev, props
  type(c_ptr) :: mr, cur, p, bad
  type(rankmem_stats_t) :: stats
  real(c_double), pointer :: x(:)
  integer(c_size_t), parameter :: n = 1000
  integer(c_size_t) :: bytes, used
  character(:), allocatable :: spec, text, name
  integer :: failures, i

  failures = 0
  st = rankmem_version(major, minor, patch)
  call expect(st, 'rankmem_version')
  print '(a,i0,a,i0,a,i0)', 'fortran_demo: rankmem ', major, '.', minor, '.', patch

  st = rankmem_device_count(ndev)
  call expect(st, 'rankmem_device_count')
  ! The current resource: cudaMalloc on a GPU, host memory without one.
  st = rankmem_get_current_resource(cur)
  call expect(st, 'rankmem_get_current_resource')
  st = rankmem_resource_name(cur, name)
  call expect(st, 'rankmem_resource_name')
  print '(a,i0,a,a)', 'fortran_demo: ', ndev, ' GPU(s); current resource: ', name

  ! A chain: stats over a pool over the device, or over host memory.
  if (ndev > 0) then
    spec = 'stats>pool(initial=16MiB)>cuda'
  else
    spec = 'stats>pool(initial=16MiB)>system'
  end if
  st = rankmem_resource_from_spec(spec, mr)
  call expect(st, 'rankmem_resource_from_spec('//spec//')')
  if (st /= RANKMEM_SUCCESS) stop 1
  st = rankmem_resource_describe(mr, text)
  call expect(st, 'rankmem_resource_describe')
  print '(a,a)', 'fortran_demo: chain ', text

  ! An array of n doubles from the chain.
  bytes = n * c_sizeof(0.0_c_double)
  st = rankmem_allocate(mr, bytes, 0_c_size_t, p)
  call expect(st, 'rankmem_allocate')
  if (st /= RANKMEM_SUCCESS) stop 1
  st = rankmem_resource_properties(mr, props)
  call expect(st, 'rankmem_resource_properties')
  if (iand(props, RANKMEM_PROP_HOST_ACCESSIBLE) /= 0) then
    ! Host memory: Fortran may use it as an array.
    call c_f_pointer(p, x, [n])
    x = [(real(i, c_double), i = 1, int(n))]
    print '(a,f0.1)', 'fortran_demo: sum of the array ', sum(x)
    if (abs(sum(x) - real(n * (n + 1) / 2, c_double)) > 0.5_c_double) &
        call fail('the array does not hold 1..n')
  else
    print '(a)', 'fortran_demo: device memory (a kernel or OpenACC would use it)'
  end if

  st = rankmem_resource_query(mr, RANKMEM_QUERY_USED_CURRENT, used)
  if (st == RANKMEM_SUCCESS) print '(a,i0,a)', 'fortran_demo: ', used, ' bytes in use'
  st = rankmem_stats_get(mr, stats)
  call expect(st, 'rankmem_stats_get')
  print '(a,i0,a,i0,a)', 'fortran_demo: stats: ', stats%bytes_current, ' bytes live, ', &
      stats%count_total, ' allocation(s)'
  if (stats%bytes_current /= bytes .or. stats%count_total /= 1) &
      call fail('stats do not count the one allocation')

  st = rankmem_deallocate(mr, p, bytes, 0_c_size_t)
  call expect(st, 'rankmem_deallocate')
  ! A second free of the same block is refused, and changes nothing.
  st = rankmem_deallocate(mr, p, bytes, 0_c_size_t)
  print '(a,a)', 'fortran_demo: freeing it twice: ', rankmem_status_string(st)
  if (st /= RANKMEM_ERR_INVALID_POINTER) call fail('a double free was not refused')
  st = rankmem_stats_get(mr, stats)
  print '(a,i0,a,i0,a)', 'fortran_demo: stats: ', stats%bytes_current, ' bytes live, peak ', &
      stats%bytes_peak, ' bytes'
  if (stats%bytes_current /= 0 .or. stats%bytes_peak /= bytes) call fail('stats after the free')

  ! A misspelt option: a clear status and message, no abort.
  bad = c_null_ptr
  st = rankmem_resource_from_spec('pool(intial=1GiB)>system', bad)
  print '(a,a)', 'fortran_demo: a misspelt spec: ', rankmem_status_string(st)
  print '(a,a)', 'fortran_demo:   ', rankmem_last_error()
  if (st /= RANKMEM_ERR_CONFIG .or. c_associated(bad)) call fail('a bad spec was not refused')

  ! No resource at all: refused as well.
  st = rankmem_allocate(c_null_ptr, bytes, 0_c_size_t, p)
  print '(a,a)', 'fortran_demo: allocating from no resource: ', rankmem_status_string(st)
  if (st /= RANKMEM_ERR_INVALID_ARGUMENT) call fail('a null resource was not refused')

  st = rankmem_parse_size('64MiB', 0_c_size_t, bytes)
  call expect(st, 'rankmem_parse_size')
  if (bytes /= 64_c_size_t * 1024 * 1024) call fail('64MiB is not 2^26 bytes')

  st = rankmem_resource_release(mr)
  call expect(st, 'rankmem_resource_release')
  ! Strings from the module are allocatable: give them back too.
  deallocate (spec, text, name)
  if (failures > 0) then
    print '(a,i0,a)', 'fortran_demo: ', failures, ' step(s) failed'
    stop 1
  end if
  print '(a)', 'fortran_demo: done'

contains

  subroutine expect(status, what)
    integer(c_int), intent(in) :: status
    character(*), intent(in) :: what
    if (status /= RANKMEM_SUCCESS) &
        call fail(what//': '//rankmem_status_string(status)//' ('//rankmem_last_error()//')')
  end subroutine expect

  subroutine fail(why)
    character(*), intent(in) :: why
    print '(a,a)', 'fortran_demo: FAILED: ', why
    failures = failures + 1
  end subroutine fail

end program fortran_demo
