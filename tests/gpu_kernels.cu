/* Kernels for rankmem's GPU tests; see gpu_kernels.h. */
#include "gpu_kernels.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

const unsigned kThreads = 256;
const unsigned kMaxBlocks = 1024; /* grid-stride loops cover the rest */

unsigned blocks_for(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    return b > kMaxBlocks ? kMaxBlocks : (unsigned)b;
}

__global__ void fill_kernel(uint32_t *p, size_t n, unsigned pattern)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = pattern ^ (uint32_t)i;
}

__global__ void check_kernel(const uint32_t *p, size_t n, unsigned pattern,
                             unsigned long long *counter)
{
    unsigned long long bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        bad += p[i] != (pattern ^ (uint32_t)i);
    /* One atomic per thread that saw something, not per word. */
    if (bad)
        atomicAdd(counter, bad);
}

__global__ void spin_kernel(unsigned long long cycles)
{
    long long start = clock64();
    while ((unsigned long long)(clock64() - start) < cycles) {
    }
}

__device__ unsigned long long sync_counter;

} // namespace

extern "C" int rk_test_fill(void *p, size_t n_words, unsigned pattern, rankmem_stream_t stream)
{
    if (n_words == 0)
        return cudaSuccess;
    fill_kernel<<<blocks_for(n_words), kThreads, 0, (cudaStream_t)stream>>>((uint32_t *)p,
                                                                            n_words, pattern);
    return cudaGetLastError();
}

extern "C" int rk_test_check_async(const void *p, size_t n_words, unsigned pattern,
                                   unsigned long long *counter, rankmem_stream_t stream)
{
    if (n_words == 0)
        return cudaSuccess;
    check_kernel<<<blocks_for(n_words), kThreads, 0, (cudaStream_t)stream>>>(
        (const uint32_t *)p, n_words, pattern, counter);
    return cudaGetLastError();
}

extern "C" int rk_test_check(const void *p, size_t n_words, unsigned pattern,
                             rankmem_stream_t stream, unsigned long long *bad_p)
{
    cudaStream_t s = (cudaStream_t)stream;
    unsigned long long *counter;
    cudaError_t err = cudaGetSymbolAddress((void **)&counter, sync_counter);
    if (err == cudaSuccess)
        err = cudaMemsetAsync(counter, 0, sizeof *counter, s);
    if (err == cudaSuccess)
        err = (cudaError_t)rk_test_check_async(p, n_words, pattern, counter, stream);
    unsigned long long bad = 0;
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(&bad, counter, sizeof bad, cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(s);
    if (err == cudaSuccess)
        *bad_p = bad;
    return err;
}

extern "C" int rk_test_spin(rankmem_stream_t stream, unsigned long long cycles)
{
    spin_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(cycles);
    return cudaGetLastError();
}
