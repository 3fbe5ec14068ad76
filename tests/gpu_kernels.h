/* Small CUDA kernels for rankmem's GPU tests (gpu_kernels.cu). Every
 * function returns a cudaError_t as an int (0 = cudaSuccess); launches are
 * asynchronous on `stream` unless said otherwise. */
#ifndef RANKMEM_TEST_GPU_KERNELS_H
#define RANKMEM_TEST_GPU_KERNELS_H

#include <stddef.h>
#include <rankmem/resource.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Word i (uint32) of p becomes pattern ^ i. n_words may be 0. */
int rk_test_fill(void *p, size_t n_words, unsigned pattern, rankmem_stream_t stream);

/* Adds to *counter (device-accessible, 8 bytes) the number of words of p
 * that differ from pattern ^ i. Asynchronous: read the counter after the
 * stream is done. */
int rk_test_check_async(const void *p, size_t n_words, unsigned pattern,
                        unsigned long long *counter, rankmem_stream_t stream);

/* Synchronous check: *bad_p = number of mismatching words. Waits for the
 * stream. Uses a per-device counter: not for concurrent use from several
 * host threads. */
int rk_test_check(const void *p, size_t n_words, unsigned pattern, rankmem_stream_t stream,
                  unsigned long long *bad_p);

/* One thread busy-waits about `cycles` GPU clock cycles on stream, so that
 * what follows on that stream runs late and races become observable. */
int rk_test_spin(rankmem_stream_t stream, unsigned long long cycles);

#ifdef __cplusplus
}
#endif
#endif
