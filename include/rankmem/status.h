/* rankmem: status codes and the thread-local last error. */
#ifndef RANKMEM_STATUS_H
#define RANKMEM_STATUS_H

#include <rankmem/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every public function returns one of these (or documents why not).
 * Output parameters are written only on RANKMEM_SUCCESS. */
typedef enum rankmem_status {
    RANKMEM_SUCCESS = 0,
    RANKMEM_ERR_INVALID_ARGUMENT = 1, /* NULL where a value is needed, bad alignment, ... */
    RANKMEM_ERR_OUT_OF_MEMORY = 2,    /* the resource (or its upstream) has no memory left */
    RANKMEM_ERR_INVALID_POINTER = 3,  /* double free, foreign pointer, wrong size */
    RANKMEM_ERR_NOT_SUPPORTED = 4,    /* not built in, or not available on this device */
    RANKMEM_ERR_NO_DEVICE = 5,        /* no usable GPU */
    RANKMEM_ERR_DEVICE = 6,           /* the CUDA/HIP runtime returned an error */
    RANKMEM_ERR_LIMIT = 7,            /* a configured limit was reached */
    RANKMEM_ERR_CONFIG = 8,           /* bad configuration value or spec string */
    RANKMEM_ERR_BUSY = 9,             /* released with live allocations (they were reclaimed) */
    RANKMEM_ERR_WRONG_DEVICE = 10,    /* a device resource used while another device is current */
    RANKMEM_ERR_INTERNAL = 11         /* a bug in rankmem: please report it */
} rankmem_status_t;

#define RANKMEM_STATUS_COUNT 12

/* Short constant name of a status ("out of memory"); never NULL, also for unknown values. */
RANKMEM_API const char *rankmem_status_string(rankmem_status_t status);

/* Detail of the last failure on the calling thread: what failed, with which
 * sizes, and the CUDA error string where there was one. Never NULL; "" when no
 * failure was recorded. Valid until the thread's next rankmem call. */
RANKMEM_API const char *rankmem_last_error(void);

/* Forget the calling thread's last error. */
RANKMEM_API void rankmem_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
