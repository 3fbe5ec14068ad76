/* CUDA kernels for librankmem_omp's GPU test (tests/omp/gpu_kernel.c),
 * built by nvcc from gpu_kernels.cu. Every function returns a cudaError_t
 * as an int (0 = cudaSuccess); launches are asynchronous on `stream` (NULL:
 * the legacy default stream). Counting kernels add into one of
 * RKOMP_TEST_SLOTS counters on the device: threads that use different
 * slots may check concurrently. */
#ifndef RANKMEM_OMP_TEST_GPU_KERNELS_H
#define RANKMEM_OMP_TEST_GPU_KERNELS_H

#include <stddef.h>
#include <rankmem/resource.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RKOMP_TEST_SLOTS 64

/* Word i (uint32) of p becomes pattern ^ i when indexed, else pattern. */
int rkomp_test_fill(void *p, size_t n_words, unsigned pattern, int indexed,
                    rankmem_stream_t stream);

/* Counter `slot` := 0, then += the number of words of p that differ from what
 * rkomp_test_fill(p, n_words, pattern, indexed) writes. Asynchronous: read
 * the counter once the stream is done. */
int rkomp_test_count_async(const void *p, size_t n_words, unsigned pattern, int indexed,
                           int slot, rankmem_stream_t stream);

/* The value of counter `slot` (waits for the stream first). */
int rkomp_test_counter(int slot, rankmem_stream_t stream, unsigned long long *bad_p);

/* rkomp_test_count_async + rkomp_test_counter: *bad_p = mismatching words. */
int rkomp_test_count(const void *p, size_t n_words, unsigned pattern, int indexed, int slot,
                     rankmem_stream_t stream, unsigned long long *bad_p);

/* One GPU thread busy-waits about `cycles` clock cycles on stream, so that
 * later work on that stream runs late and a missing wait shows. */
int rkomp_test_spin(rankmem_stream_t stream, unsigned long long cycles);

#ifdef __cplusplus
}
#endif
#endif
