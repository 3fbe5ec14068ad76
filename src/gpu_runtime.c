/* The GPU runtime as the rest of the library sees it: device detection, the
 * current device, cross-stream ordering and CUDA error reporting. Every
 * function works, as "no GPU", in a build without a GPU runtime and on a
 * machine where the runtime cannot start (the build machines: no driver,
 * error 35). CUDA or HIP: gpu_api.h maps the calls. */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>

#if HAVE_GPU
#include "gpu_api.h"

static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
static int gpu_count;           /* written once under gpu_once, read-only after */
static char gpu_reason[256];    /* why gpu_count is 0; "" otherwise */

static void gpu_detect(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        /* Any failure means no usable GPU; keep the runtime's words for users. */
        snprintf(gpu_reason, sizeof gpu_reason, RK_GPU_PREFIX "GetDeviceCount: %s (error %d)",
                 cudaGetErrorString(err), (int)err);
        (void)cudaGetLastError(); /* don't let it surface in the caller's next CUDA call */
        n = 0;
    } else if (n <= 0) {
        snprintf(gpu_reason, sizeof gpu_reason,
                 RK_GPU_PREFIX "GetDeviceCount: no " RK_GPU_RUNTIME " device (0 devices)");
        n = 0;
    }
    gpu_count = n;
}

int rk_gpu_count(void)
{
    pthread_once(&gpu_once, gpu_detect);
    return gpu_count;
}

const char *rk_gpu_absent_reason(void)
{
    pthread_once(&gpu_once, gpu_detect);
    return gpu_reason;
}

int rk_gpu_current(void)
{
    if (rk_gpu_count() == 0)
        return RANKMEM_DEVICE_HOST;
    int dev;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return RANKMEM_DEVICE_HOST;
    }
    return dev;
}

rankmem_status_t rk_gpu_stream_wait(rankmem_stream_t waiter, rankmem_stream_t from,
                                    void **event_p)
{
    /* A stream is already ordered after its own work. */
    if (waiter == from || rk_gpu_count() == 0)
        return RANKMEM_SUCCESS;
    cudaEvent_t ev = (cudaEvent_t)*event_p;
    cudaError_t err;
    if (!ev) {
        /* Timing off: recording such an event is the cheapest ordering primitive. */
        err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (err != cudaSuccess)
            return rk_cuda_error(err, "cudaEventCreateWithFlags", 0);
        *event_p = ev;
    }
    err = cudaEventRecord(ev, (cudaStream_t)from);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "cudaEventRecord", 0);
    err = cudaStreamWaitEvent((cudaStream_t)waiter, ev, 0);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "cudaStreamWaitEvent", 0);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_gpu_stream_sync(rankmem_stream_t stream)
{
    if (rk_gpu_count() == 0)
        return RANKMEM_SUCCESS;
    cudaError_t err = cudaStreamSynchronize((cudaStream_t)stream);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "cudaStreamSynchronize", 0);
    return RANKMEM_SUCCESS;
}

void rk_gpu_event_destroy(void *event)
{
    if (event) {
        /* Fails only during process teardown (runtime unloading): nothing to do then. */
        if (cudaEventDestroy((cudaEvent_t)event) != cudaSuccess)
            (void)cudaGetLastError();
    }
}

rankmem_status_t rk_cuda_error(int cuda_err, const char *what, size_t bytes)
{
    cudaError_t err = (cudaError_t)cuda_err;
    rankmem_status_t st;
    switch (err) {
    case cudaErrorMemoryAllocation:
        st = RANKMEM_ERR_OUT_OF_MEMORY;
        break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        st = RANKMEM_ERR_NO_DEVICE;
        break;
    case cudaErrorNotSupported:
        st = RANKMEM_ERR_NOT_SUPPORTED;
        break;
    default:
        st = RANKMEM_ERR_DEVICE;
        break;
    }
    /* Non-sticky errors stay in the runtime's per-thread slot and would be
     * reported again by the caller's next cudaGetLastError(): clear them. */
    (void)cudaGetLastError();
    if (bytes)
        return rk_error(st, "%s(%zu bytes): %s (%s, error %d)", what, bytes,
                        cudaGetErrorString(err), cudaGetErrorName(err), cuda_err);
    return rk_error(st, "%s: %s (%s, error %d)", what, cudaGetErrorString(err),
                    cudaGetErrorName(err), cuda_err);
}

#else /* !HAVE_GPU */

int rk_gpu_count(void) { return 0; }

int rk_gpu_current(void) { return RANKMEM_DEVICE_HOST; }

const char *rk_gpu_absent_reason(void) { return "built without CUDA"; }

rankmem_status_t rk_gpu_stream_wait(rankmem_stream_t waiter, rankmem_stream_t from,
                                    void **event_p)
{
    (void)waiter;
    (void)from;
    (void)event_p;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_gpu_stream_sync(rankmem_stream_t stream)
{
    (void)stream;
    return RANKMEM_SUCCESS;
}

void rk_gpu_event_destroy(void *event) { (void)event; }

rankmem_status_t rk_cuda_error(int cuda_err, const char *what, size_t bytes)
{
    /* Unreachable in practice: nothing calls CUDA in this build. */
    if (bytes)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "%s(%zu bytes): built without CUDA (error %d)",
                        what, bytes, cuda_err);
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "%s: built without CUDA (error %d)", what,
                    cuda_err);
}

#endif
