! rankmem for Fortran: the core C API of librankmem through iso_c_binding.
!
!   use rankmem
!   type(c_ptr) :: mr, p
!   real(c_double), pointer :: x(:)
!   if (rankmem_resource_from_spec('stats>pool>cuda', mr) /= RANKMEM_SUCCESS) &
!       print *, rankmem_last_error()
!   if (rankmem_allocate(mr, n * c_sizeof(0.0_c_double), 0_c_size_t, p) == RANKMEM_SUCCESS) &
!       call c_f_pointer(p, x, [n])
!
! Every function returns an integer(c_int) status (RANKMEM_SUCCESS = 0, or
! one of the RANKMEM_ERR_* codes below) and writes its outputs only on
! success, as in C. Resources are type(c_ptr) handles; sizes are
! integer(c_size_t). Strings go in as ordinary Fortran strings and come
! back as character(:), allocatable. Functions that take no string are the
! C functions themselves (bind(C) interfaces); the others are thin wrappers.
!
! Build: the library installs rankmem.mod next to rankmem.h and links as
!   gfortran prog.f90 -I$PREFIX/include -L$PREFIX/lib -lrankmem_fortran -lrankmem
! The .mod file is specific to the compiler (and its version) that built it.
! See docs/fortran.md and rankmem(7).
module rankmem
  use, intrinsic :: iso_c_binding
  implicit none
  private

  ! ---- status codes (rankmem/status.h) ----
  integer(c_int), parameter, public :: RANKMEM_SUCCESS = 0
  integer(c_int), parameter, public :: RANKMEM_ERR_INVALID_ARGUMENT = 1
  integer(c_int), parameter, public :: RANKMEM_ERR_OUT_OF_MEMORY = 2
  integer(c_int), parameter, public :: RANKMEM_ERR_INVALID_POINTER = 3
  integer(c_int), parameter, public :: RANKMEM_ERR_NOT_SUPPORTED = 4
  integer(c_int), parameter, public :: RANKMEM_ERR_NO_DEVICE = 5
  integer(c_int), parameter, public :: RANKMEM_ERR_DEVICE = 6
  integer(c_int), parameter, public :: RANKMEM_ERR_LIMIT = 7
  integer(c_int), parameter, public :: RANKMEM_ERR_CONFIG = 8
  integer(c_int), parameter, public :: RANKMEM_ERR_BUSY = 9
  integer(c_int), parameter, public :: RANKMEM_ERR_WRONG_DEVICE = 10
  integer(c_int), parameter, public :: RANKMEM_ERR_INTERNAL = 11

  ! ---- rankmem_resource_query (rankmem/resource.h) ----
  integer(c_int), parameter, public :: RANKMEM_QUERY_RESERVED_CURRENT = 0
  integer(c_int), parameter, public :: RANKMEM_QUERY_RESERVED_HIGH = 1
  integer(c_int), parameter, public :: RANKMEM_QUERY_USED_CURRENT = 2
  integer(c_int), parameter, public :: RANKMEM_QUERY_USED_HIGH = 3
  integer(c_int), parameter, public :: RANKMEM_QUERY_POOL_MAX = 4
  integer(c_int), parameter, public :: RANKMEM_QUERY_LIVE_COUNT = 5
  integer(c_int), parameter, public :: RANKMEM_QUERY_FREE_BLOCKS = 6
  integer(c_int), parameter, public :: RANKMEM_QUERY_LIMIT = 7

  ! ---- resource properties, device of a host resource ----
  integer(c_int), parameter, public :: RANKMEM_PROP_DEVICE_ACCESSIBLE = 1
  integer(c_int), parameter, public :: RANKMEM_PROP_HOST_ACCESSIBLE = 2
  integer(c_int), parameter, public :: RANKMEM_PROP_STREAM_ORDERED = 4
  integer(c_int), parameter, public :: RANKMEM_DEVICE_HOST = -1
  ! Alignment used when 0 is passed (what cudaMalloc guarantees).
  integer(c_size_t), parameter, public :: RANKMEM_DEFAULT_ALIGNMENT = 256

  ! ---- stats adaptor counters (rankmem/adaptors.h, struct rankmem_stats) ----
  integer(c_int), parameter, public :: RANKMEM_STATS_VERSION = 1
  type, bind(C), public :: rankmem_stats_t
    integer(c_size_t) :: size = 0        ! set by rankmem_stats_get
    integer(c_int) :: version = 0        ! unsigned in C
    integer(c_size_t) :: bytes_current = 0, bytes_peak = 0, bytes_total = 0
    integer(c_size_t) :: count_current = 0, count_peak = 0, count_total = 0
    integer(c_size_t) :: failures = 0
  end type rankmem_stats_t

  public :: rankmem_version, rankmem_have_cuda, rankmem_clear_error
  public :: rankmem_status_string, rankmem_last_error
  public :: rankmem_resource_from_spec, rankmem_resource_describe, rankmem_resource_name
  public :: rankmem_resource_retain, rankmem_resource_release
  public :: rankmem_allocate, rankmem_deallocate
  public :: rankmem_allocate_async, rankmem_deallocate_async
  public :: rankmem_resource_query, rankmem_resource_trim
  public :: rankmem_resource_device, rankmem_resource_properties
  public :: rankmem_device_count, rankmem_current_device
  public :: rankmem_get_current_resource, rankmem_set_current_resource
  public :: rankmem_get_device_resource, rankmem_set_device_resource
  public :: rankmem_system_create, rankmem_stats_create
  public :: rankmem_stats_get, rankmem_stats_push, rankmem_stats_pop
  public :: rankmem_parse_size

  ! ---- the C functions that take no string: called directly ----
  interface
    function rankmem_version(major, minor, patch) bind(C, name='rankmem_version') result(st)
      import :: c_int
      integer(c_int), intent(inout) :: major, minor, patch
      integer(c_int) :: st
    end function rankmem_version

    ! Nonzero when the library was built with CUDA.
    function rankmem_have_cuda() bind(C, name='rankmem_have_cuda') result(yes)
      import :: c_int
      integer(c_int) :: yes
    end function rankmem_have_cuda

    subroutine rankmem_clear_error() bind(C, name='rankmem_clear_error')
    end subroutine rankmem_clear_error

    function rankmem_resource_retain(mr) bind(C, name='rankmem_resource_retain') result(st)
      import :: c_ptr, c_int
      type(c_ptr), value :: mr
      integer(c_int) :: st
    end function rankmem_resource_retain

    ! Drops a reference; the last one frees the chain. RANKMEM_ERR_BUSY:
    ! live allocations were reclaimed (a leak, reported).
    function rankmem_resource_release(mr) bind(C, name='rankmem_resource_release') result(st)
      import :: c_ptr, c_int
      type(c_ptr), value :: mr
      integer(c_int) :: st
    end function rankmem_resource_release

    ! alignment 0: RANKMEM_DEFAULT_ALIGNMENT. Free with the same bytes and alignment.
    function rankmem_allocate(mr, bytes, alignment, ptr) bind(C, name='rankmem_allocate') result(st)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: mr
      integer(c_size_t), value :: bytes, alignment
      type(c_ptr), intent(inout) :: ptr
      integer(c_int) :: st
    end function rankmem_allocate

    function rankmem_deallocate(mr, ptr, bytes, alignment) &
        bind(C, name='rankmem_deallocate') result(st)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: mr, ptr
      integer(c_size_t), value :: bytes, alignment
      integer(c_int) :: st
    end function rankmem_deallocate

    ! stream: a cudaStream_t as type(c_ptr) (c_null_ptr: the default stream).
    function rankmem_allocate_async(mr, bytes, alignment, stream, ptr) &
        bind(C, name='rankmem_allocate_async') result(st)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: mr
      integer(c_size_t), value :: bytes, alignment
      type(c_ptr), value :: stream
      type(c_ptr), intent(inout) :: ptr
      integer(c_int) :: st
    end function rankmem_allocate_async

    function rankmem_deallocate_async(mr, ptr, bytes, alignment, stream) &
        bind(C, name='rankmem_deallocate_async') result(st)
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: mr, ptr
      integer(c_size_t), value :: bytes, alignment
      type(c_ptr), value :: stream
      integer(c_int) :: st
    end function rankmem_deallocate_async

    ! what: RANKMEM_QUERY_*. RANKMEM_ERR_NOT_SUPPORTED when the resource does not know.
    function rankmem_resource_query(mr, what, value) bind(C, name='rankmem_resource_query') &
        result(st)
      import :: c_ptr, c_int, c_size_t
      type(c_ptr), value :: mr
      integer(c_int), value :: what
      integer(c_size_t), intent(inout) :: value
      integer(c_int) :: st
    end function rankmem_resource_query

    function rankmem_resource_trim(mr, keep_bytes) bind(C, name='rankmem_resource_trim') result(st)
      import :: c_ptr, c_int, c_size_t
      type(c_ptr), value :: mr
      integer(c_size_t), value :: keep_bytes
      integer(c_int) :: st
    end function rankmem_resource_trim

    function rankmem_resource_device(mr, device) bind(C, name='rankmem_resource_device') result(st)
      import :: c_ptr, c_int
      type(c_ptr), value :: mr
      integer(c_int), intent(inout) :: device
      integer(c_int) :: st
    end function rankmem_resource_device

    ! props: RANKMEM_PROP_* bits (iand(props, RANKMEM_PROP_HOST_ACCESSIBLE) /= 0).
    function rankmem_resource_properties(mr, props) bind(C, name='rankmem_resource_properties') &
        result(st)
      import :: c_ptr, c_int
      type(c_ptr), value :: mr
      integer(c_int), intent(inout) :: props
      integer(c_int) :: st
    end function rankmem_resource_properties

    function rankmem_device_count(count) bind(C, name='rankmem_device_count') result(st)
      import :: c_int
      integer(c_int), intent(inout) :: count
      integer(c_int) :: st
    end function rankmem_device_count

    function rankmem_current_device(device) bind(C, name='rankmem_current_device') result(st)
      import :: c_int
      integer(c_int), intent(inout) :: device
      integer(c_int) :: st
    end function rankmem_current_device

    ! Borrowed: the registry keeps its reference (retain to keep it longer).
    function rankmem_get_current_resource(mr) bind(C, name='rankmem_get_current_resource') &
        result(st)
      import :: c_ptr, c_int
      type(c_ptr), intent(inout) :: mr
      integer(c_int) :: st
    end function rankmem_get_current_resource

    function rankmem_set_current_resource(mr) bind(C, name='rankmem_set_current_resource') &
        result(st)
      import :: c_ptr, c_int
      type(c_ptr), value :: mr
      integer(c_int) :: st
    end function rankmem_set_current_resource

    function rankmem_get_device_resource(device, mr) bind(C, name='rankmem_get_device_resource') &
        result(st)
      import :: c_ptr, c_int
      integer(c_int), value :: device
      type(c_ptr), intent(inout) :: mr
      integer(c_int) :: st
    end function rankmem_get_device_resource

    function rankmem_set_device_resource(device, mr) bind(C, name='rankmem_set_device_resource') &
        result(st)
      import :: c_ptr, c_int
      integer(c_int), value :: device
      type(c_ptr), value :: mr
      integer(c_int) :: st
    end function rankmem_set_device_resource

    function rankmem_system_create(mr) bind(C, name='rankmem_system_create') result(st)
      import :: c_ptr, c_int
      type(c_ptr), intent(inout) :: mr
      integer(c_int) :: st
    end function rankmem_system_create

    function rankmem_stats_create(upstream, mr) bind(C, name='rankmem_stats_create') result(st)
      import :: c_ptr, c_int
      type(c_ptr), value :: upstream
      type(c_ptr), intent(inout) :: mr
      integer(c_int) :: st
    end function rankmem_stats_create

    function rankmem_stats_push(mr) bind(C, name='rankmem_stats_push') result(st)
      import :: c_ptr, c_int
      type(c_ptr), value :: mr
      integer(c_int) :: st
    end function rankmem_stats_push
  end interface

  ! ---- the C side of the wrappers below ----
  interface
    function c_status_string(st) bind(C, name='rankmem_status_string') result(s)
      import :: c_int, c_ptr
      integer(c_int), value :: st
      type(c_ptr) :: s
    end function c_status_string

    function c_last_error() bind(C, name='rankmem_last_error') result(s)
      import :: c_ptr
      type(c_ptr) :: s
    end function c_last_error

    function c_from_spec(spec, mr) bind(C, name='rankmem_resource_from_spec') result(st)
      import :: c_char, c_ptr, c_int
      character(kind=c_char), intent(in) :: spec(*)
      type(c_ptr), intent(inout) :: mr
      integer(c_int) :: st
    end function c_from_spec

    function c_describe(mr, buf, len, needed) bind(C, name='rankmem_resource_describe') result(st)
      import :: c_ptr, c_char, c_size_t, c_int
      type(c_ptr), value :: mr
      character(kind=c_char), intent(out) :: buf(*)
      integer(c_size_t), value :: len
      integer(c_size_t), intent(inout) :: needed
      integer(c_int) :: st
    end function c_describe

    function c_resource_name(mr, name) bind(C, name='rankmem_resource_name') result(st)
      import :: c_ptr, c_int
      type(c_ptr), value :: mr
      type(c_ptr), intent(inout) :: name
      integer(c_int) :: st
    end function c_resource_name

    function c_stats_get(mr, stats) bind(C, name='rankmem_stats_get') result(st)
      import :: c_ptr, c_int, rankmem_stats_t
      type(c_ptr), value :: mr
      type(rankmem_stats_t), intent(inout) :: stats
      integer(c_int) :: st
    end function c_stats_get

    function c_stats_pop(mr, stats) bind(C, name='rankmem_stats_pop') result(st)
      import :: c_ptr, c_int, rankmem_stats_t
      type(c_ptr), value :: mr
      type(rankmem_stats_t), intent(inout) :: stats
      integer(c_int) :: st
    end function c_stats_pop

    function c_parse_size(text, percent_base, bytes) bind(C, name='rankmem_parse_size') result(st)
      import :: c_char, c_size_t, c_int
      character(kind=c_char), intent(in) :: text(*)
      integer(c_size_t), value :: percent_base
      integer(c_size_t), intent(inout) :: bytes
      integer(c_int) :: st
    end function c_parse_size

    function c_strlen(s) bind(C, name='strlen') result(n)
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: n
    end function c_strlen
  end interface

contains

  ! A NUL-terminated C string as a Fortran string ('' for a null pointer).
  function from_c(p) result(s)
    type(c_ptr), intent(in) :: p
    character(:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    if (.not. c_associated(p)) then
      s = ''
      return
    end if
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate (character(n) :: s)
    do i = 1, n
      s(i:i) = chars(i)
    end do
  end function from_c

  ! Short name of a status ("out of memory"); also for unknown values.
  function rankmem_status_string(st) result(s)
    integer(c_int), intent(in) :: st
    character(:), allocatable :: s
    s = from_c(c_status_string(st))
  end function rankmem_status_string

  ! What the calling thread's last failure was ('' when none).
  function rankmem_last_error() result(s)
    character(:), allocatable :: s
    s = from_c(c_last_error())
  end function rankmem_last_error

  ! A chain from a spec string such as 'stats>pool(initial=1GiB)>cuda'
  ! (trailing blanks ignored). RANKMEM_ERR_CONFIG: rankmem_last_error() says
  ! where and why.
  function rankmem_resource_from_spec(spec, mr) result(st)
    character(*), intent(in) :: spec
    type(c_ptr), intent(inout) :: mr
    integer(c_int) :: st
    type(c_ptr) :: out
    st = c_from_spec(trim(spec)//c_null_char, out)
    if (st == RANKMEM_SUCCESS) mr = out
  end function rankmem_resource_from_spec

  ! The chain in spec syntax; text is left alone on failure.
  function rankmem_resource_describe(mr, text) result(st)
    type(c_ptr), intent(in) :: mr
    character(:), allocatable, intent(inout) :: text
    integer(c_int) :: st
    character(kind=c_char) :: small(1)
    character(kind=c_char), allocatable :: buf(:)
    character(:), allocatable :: out
    integer(c_size_t) :: needed, cap
    integer :: i
    needed = 0
    ! First ask how long it is: a one-byte buffer is too small (and says
    ! how much is needed) unless the description is empty.
    st = c_describe(mr, small, 1_c_size_t, needed)
    if (st /= RANKMEM_SUCCESS .and. needed == 0) return
    cap = needed + 1
    allocate (buf(cap))
    st = c_describe(mr, buf, cap, needed)
    if (st /= RANKMEM_SUCCESS) return
    allocate (character(int(needed)) :: out)
    do i = 1, int(needed)
      out(i:i) = buf(i)
    end do
    text = out
  end function rankmem_resource_describe

  ! The resource's name: 'pool', 'cuda', 'stats', ...
  function rankmem_resource_name(mr, name) result(st)
    type(c_ptr), intent(in) :: mr
    character(:), allocatable, intent(inout) :: name
    integer(c_int) :: st
    type(c_ptr) :: p
    st = c_resource_name(mr, p)
    if (st == RANKMEM_SUCCESS) name = from_c(p)
  end function rankmem_resource_name

  ! Counters of a stats adaptor (mr must have one on top).
  function rankmem_stats_get(mr, stats) result(st)
    type(c_ptr), intent(in) :: mr
    type(rankmem_stats_t), intent(inout) :: stats
    integer(c_int) :: st
    type(rankmem_stats_t) :: tmp
    tmp%size = c_sizeof(tmp)
    st = c_stats_get(mr, tmp)
    if (st == RANKMEM_SUCCESS) stats = tmp
  end function rankmem_stats_get

  ! Ends the scope opened by rankmem_stats_push; its counters in stats.
  function rankmem_stats_pop(mr, stats) result(st)
    type(c_ptr), intent(in) :: mr
    type(rankmem_stats_t), intent(inout) :: stats
    integer(c_int) :: st
    type(rankmem_stats_t) :: tmp
    tmp%size = c_sizeof(tmp)
    st = c_stats_pop(mr, tmp)
    if (st == RANKMEM_SUCCESS) stats = tmp
  end function rankmem_stats_pop

  ! '64MiB', '2^20', '10%' (of percent_base; 0: % not allowed) as bytes.
  function rankmem_parse_size(text, percent_base, bytes) result(st)
    character(*), intent(in) :: text
    integer(c_size_t), intent(in) :: percent_base
    integer(c_size_t), intent(inout) :: bytes
    integer(c_int) :: st
    integer(c_size_t) :: v
    st = c_parse_size(trim(text)//c_null_char, percent_base, v)
    if (st == RANKMEM_SUCCESS) bytes = v
  end function rankmem_parse_size

end module rankmem
