/* Kernels for librankmem_omp's GPU test; see gpu_kernels.h. */
#include "gpu_kernels.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

const unsigned kThreads = 256;
const unsigned kMaxBlocks = 512; /* grid-stride loops cover the rest */

unsigned blocks_for(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    return b > kMaxBlocks ? kMaxBlocks : (unsigned)b;
}

__device__ unsigned long long counters[RKOMP_TEST_SLOTS];

__device__ __forceinline__ uint32_t expected(size_t i, unsigned pattern, int indexed)
{
    return indexed ? pattern ^ (uint32_t)i : pattern;
}

__global__ void fill_kernel(uint32_t *p, size_t n, unsigned pattern, int indexed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = expected(i, pattern, indexed);
}

__global__ void count_kernel(const uint32_t *p, size_t n, unsigned pattern, int indexed, int slot)
{
    unsigned long long bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        bad += p[i] != expected(i, pattern, indexed);
    if (bad) /* one atomic per GPU thread that saw something */
        atomicAdd(&counters[slot], bad);
}

__global__ void spin_kernel(unsigned long long cycles)
{
    long long start = clock64();
    while ((unsigned long long)(clock64() - start) < cycles) {
    }
}

bool bad_slot(int slot) { return slot < 0 || slot >= RKOMP_TEST_SLOTS; }

} // namespace

extern "C" int rkomp_test_fill(void *p, size_t n_words, unsigned pattern, int indexed,
                               rankmem_stream_t stream)
{
    if (n_words == 0)
        return cudaSuccess;
    fill_kernel<<<blocks_for(n_words), kThreads, 0, (cudaStream_t)stream>>>(
        (uint32_t *)p, n_words, pattern, indexed);
    return cudaGetLastError();
}

extern "C" int rkomp_test_count_async(const void *p, size_t n_words, unsigned pattern,
                                      int indexed, int slot, rankmem_stream_t stream)
{
    if (bad_slot(slot))
        return cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    unsigned long long *counter;
    cudaError_t err = cudaGetSymbolAddress((void **)&counter, counters);
    if (err == cudaSuccess)
        err = cudaMemsetAsync(counter + slot, 0, sizeof *counter, s);
    if (err != cudaSuccess || n_words == 0)
        return err;
    count_kernel<<<blocks_for(n_words), kThreads, 0, s>>>((const uint32_t *)p, n_words, pattern,
                                                          indexed, slot);
    return cudaGetLastError();
}

extern "C" int rkomp_test_counter(int slot, rankmem_stream_t stream, unsigned long long *bad_p)
{
    if (bad_slot(slot) || !bad_p)
        return cudaErrorInvalidValue;
    cudaStream_t s = (cudaStream_t)stream;
    unsigned long long v = 0;
    cudaError_t err = cudaStreamSynchronize(s);
    if (err == cudaSuccess)
        err = cudaMemcpyFromSymbolAsync(&v, counters, sizeof v, slot * sizeof v,
                                        cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(s);
    if (err == cudaSuccess)
        *bad_p = v;
    return err;
}

extern "C" int rkomp_test_count(const void *p, size_t n_words, unsigned pattern, int indexed,
                                int slot, rankmem_stream_t stream, unsigned long long *bad_p)
{
    int err = rkomp_test_count_async(p, n_words, pattern, indexed, slot, stream);
    return err != cudaSuccess ? err : rkomp_test_counter(slot, stream, bad_p);
}

extern "C" int rkomp_test_spin(rankmem_stream_t stream, unsigned long long cycles)
{
    spin_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(cycles);
    return cudaGetLastError();
}
