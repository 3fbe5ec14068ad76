/* The recorder's public door: rankmem_mpi_observe_alloc/free for memory
 * that no source sees (a custom driver wrapper, an allocator of one's own,
 * the tests' synthetic source) and rankmem_mpi_phase for phase marks. They
 * feed the recorder exactly as the CUPTI callbacks do. */
#include "plugin.h"
#include "recorder.h"

#include <string.h>

static const rk_obs_kind_t kinds[] = {
    [RANKMEM_MPI_MEM_DEVICE] = RK_OBS_DEVICE,
    [RANKMEM_MPI_MEM_MANAGED] = RK_OBS_MANAGED,
    [RANKMEM_MPI_MEM_PINNED] = RK_OBS_PINNED,
    [RANKMEM_MPI_MEM_VMM] = RK_OBS_VMM,
};

rankmem_status_t rankmem_mpi_observe_alloc(const void *ptr, size_t bytes,
                                           rankmem_mpi_mem_kind_t kind)
{
    if (!ptr || !bytes || (unsigned)kind >= sizeof kinds / sizeof kinds[0])
        return RANKMEM_ERR_INVALID_ARGUMENT;
    if (!rk_obs_enabled())
        return RANKMEM_ERR_NOT_SUPPORTED;
    rk_obs_alloc_from(kinds[kind], RK_OBS_PROGRAM, RK_OBS_API_OTHER, (uintptr_t)ptr, bytes,
                      __builtin_return_address(0));
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_mpi_observe_free(const void *ptr)
{
    if (!ptr)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    if (!rk_obs_enabled())
        return RANKMEM_ERR_NOT_SUPPORTED;
    return rk_obs_free((uintptr_t)ptr) ? RANKMEM_SUCCESS : RANKMEM_ERR_INVALID_POINTER;
}

rankmem_status_t rankmem_mpi_phase(const char *name)
{
    if (!name || !*name)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    if (!rk_obs_enabled())
        return RANKMEM_ERR_NOT_SUPPORTED;
    rk_obs_phase(name);
    return RANKMEM_SUCCESS;
}

/* Fortran: CALL RANKMEM_MPI_PHASE('solve') with no interface block: the
 * compilers pass the string's length after the arguments and pad it with
 * blanks, which do not belong to the name. No status comes back (a phase
 * mark that cannot be taken is no error of the program's). */
RK_MPI_EXPORT void rankmem_mpi_phase_(const char *name, size_t len);
RK_MPI_EXPORT void rankmem_mpi_phase__(const char *name, size_t len);

void rankmem_mpi_phase_(const char *name, size_t len)
{
    char buf[RK_OBS_PHASE_NAME];
    if (!name)
        return;
    while (len && name[len - 1] == ' ')
        len--;
    if (len >= sizeof buf)
        len = sizeof buf - 1;
    memcpy(buf, name, len);
    buf[len] = 0;
    (void)rankmem_mpi_phase(buf);
}

void rankmem_mpi_phase__(const char *name, size_t len) { rankmem_mpi_phase_(name, len); }
