/* The GPU side of examples/heat.c (heat-kernels.cu): one stencil kernel
 * and the few CUDA runtime calls the example needs, so that heat.c itself
 * is plain C. Every function returns a cudaError_t as an int (0: success);
 * heat_dev_error() names it. */
#ifndef HEAT_KERNELS_H
#define HEAT_KERNELS_H

#include <stddef.h>
#include <rankmem/resource.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A non-blocking stream on the current device. */
int heat_dev_stream_create(rankmem_stream_t *stream_p);
int heat_dev_stream_destroy(rankmem_stream_t stream);
int heat_dev_sync(rankmem_stream_t stream);

/* One time step on `stream`: rows 1..nloc of v (nx values each, row 0 and
 * nloc + 1 are halos) from u. row0 is the global index of local row 1,
 * ny the global number of rows; global boundary rows and columns keep
 * their value. Asynchronous. */
int heat_dev_step(const double *u, double *v, int nloc, int nx, int row0, int ny,
                  rankmem_stream_t stream);

/* cudaMemcpyAsync(cudaMemcpyDefault) on stream, then waits for it. */
int heat_dev_copy(void *dst, const void *src, size_t bytes, rankmem_stream_t stream);

const char *heat_dev_error(int err);

#ifdef __cplusplus
}
#endif
#endif
