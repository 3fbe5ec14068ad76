/* CUDA side of the heat example: see heat-kernels.h. */
#include "heat-kernels.h"

#include <cuda_runtime.h>

namespace {

/* The same arithmetic as heat.c's host loop, in the same order: the
 * neighbours' mean (a sum of sums, then a multiply by 0.25, which is
 * exact), so that no fused multiply-add can change a bit and the GPU and
 * the CPU compute the same field. */
__global__ void step_kernel(const double *u, double *v, int nloc, int nx, int row0, int ny)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= nx)
        return;
    /* Rows in a grid-stride loop: the grid's y extent is capped at 65535. */
    for (int r = blockIdx.y * blockDim.y + threadIdx.y + 1; r <= nloc;
         r += gridDim.y * blockDim.y) {
        size_t i = (size_t)r * nx + c;
        int g = row0 + r - 1;
        if (g == 0 || g == ny - 1 || c == 0 || c == nx - 1)
            v[i] = u[i];
        else
            v[i] = ((u[i - nx] + u[i + nx]) + (u[i - 1] + u[i + 1])) * 0.25;
    }
}

} // namespace

extern "C" int heat_dev_stream_create(rankmem_stream_t *stream_p)
{
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        *stream_p = (rankmem_stream_t)s;
    return (int)e;
}

extern "C" int heat_dev_stream_destroy(rankmem_stream_t stream)
{
    return (int)cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" int heat_dev_sync(rankmem_stream_t stream)
{
    return (int)cudaStreamSynchronize((cudaStream_t)stream);
}

extern "C" int heat_dev_step(const double *u, double *v, int nloc, int nx, int row0, int ny,
                             rankmem_stream_t stream)
{
    if (nloc <= 0)
        return (int)cudaSuccess;
    dim3 threads(32, 8);
    int rows = (nloc + 7) / 8;
    dim3 blocks((unsigned)((nx + 31) / 32), (unsigned)(rows > 65535 ? 65535 : rows));
    step_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(u, v, nloc, nx, row0, ny);
    return (int)cudaGetLastError();
}

extern "C" int heat_dev_copy(void *dst, const void *src, size_t bytes, rankmem_stream_t stream)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
    if (e != cudaSuccess)
        return (int)e;
    return (int)cudaStreamSynchronize((cudaStream_t)stream);
}

extern "C" const char *heat_dev_error(int err)
{
    return cudaGetErrorString((cudaError_t)err);
}
