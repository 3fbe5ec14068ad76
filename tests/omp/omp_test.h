/* Shared by the OpenMP tests (the C files of tests/omp/), which are built with both
 * gcc/libgomp and clang/libomp. */
#ifndef RANKMEM_OMP_TEST_H
#define RANKMEM_OMP_TEST_H

#include <stdint.h>
#include <string.h>
#include <rankmem_omp.h>

#include "../tap.h"

#if defined(__clang__)
#define RT_NAME "clang/libomp"
#else
#define RT_NAME "gcc/libgomp"
#endif

/* Ours: rankmem knows the block. */
static inline int is_ours(const void *p)
{
    return p && rankmem_omp_block_info(p, NULL, NULL) == RANKMEM_SUCCESS;
}

/* The address of a block about to be freed, for asking rankmem about it
 * afterwards (the compiler knows omp_free frees, and warns about any later
 * use of the pointer itself). */
static inline uintptr_t addr_of(const void *p)
{
    volatile uintptr_t a = (uintptr_t)p;
    return a;
}
static inline int was_freed(uintptr_t a)
{
    return rankmem_omp_block_info((const void *)a, NULL, NULL) == RANKMEM_ERR_INVALID_POINTER;
}

/* Whether the CPU may touch memory from this allocator (no GPU here: yes). */
static inline int host_ok(const void *p)
{
    rankmem_resource_t *mr = NULL;
    unsigned props = 0;
    if (rankmem_omp_block_info(p, NULL, &mr) != RANKMEM_SUCCESS)
        return 1; /* the runtime's: host memory */
    rankmem_resource_properties(mr, &props);
    return (props & RANKMEM_PROP_HOST_ACCESSIBLE) != 0;
}

static inline int all_bytes(const void *p, unsigned char v, size_t n)
{
    const unsigned char *c = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != v)
            return 0;
    return 1;
}

static inline int aligned_to(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* A stats adaptor over the current resource, installed as the current
 * resource; *cur_p: the previous one, retained (put it back, then release
 * both). */
static inline rankmem_resource_t *install_stats(rankmem_resource_t **cur_p)
{
    rankmem_resource_t *st = NULL;
    *cur_p = NULL;
    if (rankmem_get_current_resource(cur_p) != RANKMEM_SUCCESS ||
        rankmem_resource_retain(*cur_p) != RANKMEM_SUCCESS ||
        rankmem_stats_create(*cur_p, &st) != RANKMEM_SUCCESS ||
        rankmem_set_current_resource(st) != RANKMEM_SUCCESS)
        BAIL_OUT("cannot install a stats adaptor as the current resource");
    return st;
}

#endif
