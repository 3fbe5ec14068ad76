/* A user resource for tests: host memory from malloc that counts what is
 * outstanding, how often it was called and whether it was finalized, so tests
 * can see that chains give back everything and free themselves. Also shows
 * how users write their own resource. */
#ifndef RANKMEM_TEST_COUNTING_H
#define RANKMEM_TEST_COUNTING_H

#include <stdlib.h>
#include <string.h>
#include <rankmem.h>

typedef struct {
    rankmem_resource_t base;
    size_t outstanding_bytes, outstanding_blocks;
    size_t allocs, frees;
    size_t fail_above; /* refuse requests larger than this (0 = never) */
    int *finalized;    /* set to 1 by finalize (the struct is gone by then) */
} counting_t;

static rankmem_status_t counting_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                          rankmem_stream_t stream, void **ptr_p)
{
    (void)stream;
    counting_t *c = (counting_t *)mr;
    if (c->fail_above && bytes > c->fail_above)
        return RANKMEM_ERR_OUT_OF_MEMORY;
    void *p = NULL;
    if (posix_memalign(&p, alignment, bytes))
        return RANKMEM_ERR_OUT_OF_MEMORY;
    __atomic_add_fetch(&c->outstanding_bytes, bytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->outstanding_blocks, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->allocs, 1, __ATOMIC_RELAXED);
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t counting_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                            size_t alignment, rankmem_stream_t stream)
{
    (void)alignment;
    (void)stream;
    counting_t *c = (counting_t *)mr;
    free(ptr);
    __atomic_sub_fetch(&c->outstanding_bytes, bytes, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&c->outstanding_blocks, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->frees, 1, __ATOMIC_RELAXED);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t counting_finalize(rankmem_resource_t *mr)
{
    counting_t *c = (counting_t *)mr;
    if (c->finalized)
        *c->finalized = 1;
    free(c);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t counting_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "counting",
    .allocate = counting_allocate,
    .deallocate = counting_deallocate,
    .finalize = counting_finalize,
};

__attribute__((unused)) static counting_t *counting_new(int *finalized)
{
    counting_t *c = calloc(1, sizeof *c);
    if (!c || rankmem_resource_init(&c->base, &counting_ops, RANKMEM_PROP_HOST_ACCESSIBLE, NULL)) {
        free(c);
        return NULL;
    }
    c->finalized = finalized;
    if (finalized)
        *finalized = 0;
    return c;
}

/* Deterministic generator (xorshift64*) so runs repeat exactly. */
static unsigned long long test_rng_state = 88172645463325252ull;
__attribute__((unused)) static void test_seed(unsigned long long s) { test_rng_state = s ? s : 1; }
static unsigned long long test_rand(void)
{
    test_rng_state ^= test_rng_state >> 12;
    test_rng_state ^= test_rng_state << 25;
    test_rng_state ^= test_rng_state >> 27;
    return test_rng_state * 2685821657736338717ull;
}
/* Log-uniform size in [lo, hi]. */
__attribute__((unused)) static size_t test_log_size(size_t lo, size_t hi)
{
    int bits_lo = 63 - __builtin_clzll(lo), bits_hi = 63 - __builtin_clzll(hi);
    int b = bits_lo + (int)(test_rand() % (unsigned)(bits_hi - bits_lo + 1));
    size_t base = (size_t)1 << b;
    size_t n = base + (size_t)(test_rand() % base);
    return n < lo ? lo : n > hi ? hi : n;
}

#endif
