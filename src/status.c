/* Status strings and the thread-local detailed last error. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static const char *const status_names[RANKMEM_STATUS_COUNT] = {
    [RANKMEM_SUCCESS] = "success",
    [RANKMEM_ERR_INVALID_ARGUMENT] = "invalid argument",
    [RANKMEM_ERR_OUT_OF_MEMORY] = "out of memory",
    [RANKMEM_ERR_INVALID_POINTER] = "invalid pointer",
    [RANKMEM_ERR_NOT_SUPPORTED] = "not supported",
    [RANKMEM_ERR_NO_DEVICE] = "no device",
    [RANKMEM_ERR_DEVICE] = "device runtime error",
    [RANKMEM_ERR_LIMIT] = "limit reached",
    [RANKMEM_ERR_CONFIG] = "bad configuration",
    [RANKMEM_ERR_BUSY] = "live allocations reclaimed",
    [RANKMEM_ERR_WRONG_DEVICE] = "wrong device",
    [RANKMEM_ERR_INTERNAL] = "internal error",
};

const char *rankmem_status_string(rankmem_status_t status)
{
    if ((unsigned)status >= RANKMEM_STATUS_COUNT)
        return "unknown status";
    return status_names[status];
}

/* One buffer per thread: the detail survives until the thread's next failure. */
static _Thread_local char last_error[512];

const char *rankmem_last_error(void) { return last_error; }

void rankmem_clear_error(void) { last_error[0] = '\0'; }

rankmem_status_t rk_error(rankmem_status_t status, const char *fmt, ...)
{
    int n = snprintf(last_error, sizeof last_error, "%s: ", rankmem_status_string(status));
    if (n < 0 || (size_t)n >= sizeof last_error)
        return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
    return status;
}

rankmem_status_t rankmem_version(int *major_p, int *minor_p, int *patch_p)
{
    if (!major_p || !minor_p || !patch_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_version: NULL output");
    *major_p = RANKMEM_VERSION_MAJOR;
    *minor_p = RANKMEM_VERSION_MINOR;
    *patch_p = RANKMEM_VERSION_PATCH;
    return RANKMEM_SUCCESS;
}

int rankmem_have_cuda(void)
{
#if HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

int rankmem_have_hip(void)
{
#if HAVE_HIP
    return 1;
#else
    return 0;
#endif
}
