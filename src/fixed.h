/* fixed: entry points binning.c builds its bins with. Never installed;
 * hidden like every internal symbol. */
#ifndef RANKMEM_FIXED_H
#define RANKMEM_FIXED_H

#include "internal.h"

/* rankmem_fixed_create with a name for messages (who) and, with prealloc 0,
 * no batch taken at creation. */
RK_HIDDEN rankmem_status_t rk_fixed_new(rankmem_resource_t *upstream, size_t block_size,
                                        size_t blocks_per_batch, int prealloc, const char *who,
                                        rankmem_resource_t **mr_p);
RK_HIDDEN int rk_fixed_is(const rankmem_resource_t *mr);
RK_HIDDEN size_t rk_fixed_max_align(const rankmem_resource_t *mr);
RK_HIDDEN size_t rk_fixed_block_size(const rankmem_resource_t *mr);
/* Nonzero when ptr lies in one of the resource's batches. */
RK_HIDDEN int rk_fixed_owns(rankmem_resource_t *mr, const void *ptr);

#endif
