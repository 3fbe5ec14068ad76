/* The pool over a host upstream: randomized allocate/free (fixed seeds) with
 * overlap, alignment and content checks; coalescing back to one block;
 * exhaustion and recovery; growth and trim; every bad input. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"

#define MAXLIVE 512

typedef struct {
    unsigned char *p;
    size_t n, align;
    unsigned char fill;
} live_t;

static int no_overlap(const live_t *live, int n, const live_t *x)
{
    for (int i = 0; i < n; i++)
        if (x->p < live[i].p + live[i].n && live[i].p < x->p + x->n)
            return 0;
    return 1;
}

static int intact(const live_t *b)
{
    for (size_t i = 0; i < b->n; i++)
        if (b->p[i] != b->fill)
            return 0;
    return 1;
}

static size_t q(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = (size_t)-1;
    rankmem_resource_query(mr, what, &v);
    return v;
}

/* One randomized run: returns the failures seen (0 = good). */
static void random_run(unsigned long long seed, size_t pool_bytes, int steps)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = pool_bytes;
    prm.maximum_size = pool_bytes;
    rankmem_resource_t *pool;
    if (rankmem_pool_create(&up->base, &prm, &pool) != RANKMEM_SUCCESS)
        BAIL_OUT("pool_create: %s", rankmem_last_error());
    static live_t live[MAXLIVE];
    int n = 0, overlaps = 0, misaligned = 0, corrupt = 0, bad_status = 0, ooms = 0, allocs = 0;
    test_seed(seed);
    for (int s = 0; s < steps; s++) {
        int do_alloc = n == 0 || (n < MAXLIVE && test_rand() % 100 < 55);
        if (do_alloc) {
            static const size_t aligns[] = {0, 256, 512, 4096, 65536};
            live_t b;
            b.n = test_log_size(1, 64 << 10);
            b.align = aligns[test_rand() % 5];
            b.fill = (unsigned char)(1 + test_rand() % 255);
            void *p = NULL;
            rankmem_status_t st = rankmem_allocate(pool, b.n, b.align, &p);
            if (st == RANKMEM_ERR_OUT_OF_MEMORY) {
                ooms++;
                continue;
            }
            if (st != RANKMEM_SUCCESS) {
                bad_status++;
                continue;
            }
            allocs++;
            b.p = p;
            size_t a = b.align ? b.align : 256;
            if ((uintptr_t)b.p % a)
                misaligned++;
            if (!no_overlap(live, n, &b))
                overlaps++;
            memset(b.p, b.fill, b.n);
            live[n++] = b;
        } else {
            int i = (int)(test_rand() % (unsigned)n);
            if (!intact(&live[i]))
                corrupt++;
            if (rankmem_deallocate(pool, live[i].p, live[i].n, live[i].align) != RANKMEM_SUCCESS)
                bad_status++;
            live[i] = live[--n];
        }
    }
    size_t used_high = q(pool, RANKMEM_QUERY_USED_HIGH);
    for (int i = 0; i < n; i++) {
        if (!intact(&live[i]))
            corrupt++;
        if (rankmem_deallocate(pool, live[i].p, live[i].n, live[i].align) != RANKMEM_SUCCESS)
            bad_status++;
    }
    ok(allocs > steps / 4, "seed %llu: %d allocations served (%d out of memory)", seed, allocs, ooms);
    ok(overlaps == 0, "seed %llu: no two live blocks overlap (%d)", seed, overlaps);
    ok(misaligned == 0, "seed %llu: every block has its alignment (%d)", seed, misaligned);
    ok(corrupt == 0, "seed %llu: contents survive until freed (%d)", seed, corrupt);
    ok(bad_status == 0, "seed %llu: every call returned success or out of memory (%d)", seed, bad_status);
    ok(q(pool, RANKMEM_QUERY_FREE_BLOCKS) == 1, "seed %llu: freed blocks coalesce back into one", seed);
    ok(q(pool, RANKMEM_QUERY_RESERVED_CURRENT) == pool_bytes && up->outstanding_blocks == 1,
       "seed %llu: still the initial block, nothing more from upstream", seed);
    ok(q(pool, RANKMEM_QUERY_USED_CURRENT) == 0 && q(pool, RANKMEM_QUERY_LIVE_COUNT) == 0,
       "seed %llu: nothing in use at the end", seed);
    ok(used_high > 0 && used_high <= pool_bytes, "seed %llu: used high-water mark %zu", seed, used_high);
    rankmem_resource_release(&up->base);
    is_status(rankmem_resource_release(pool), RANKMEM_SUCCESS, "seed %llu: released", seed);
    ok(finalized, "seed %llu: the chain is gone", seed);
}

/* A pool over a new counting upstream (*up_p); maximum 0: unbounded. */
static rankmem_resource_t *pool_over(counting_t **up_p, int *finalized, size_t initial,
                                     size_t maximum)
{
    counting_t *up = *up_p = counting_new(finalized);
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = initial;
    if (maximum)
        prm.maximum_size = maximum;
    rankmem_resource_t *pool;
    if (rankmem_pool_create(&up->base, &prm, &pool) != RANKMEM_SUCCESS)
        BAIL_OUT("pool_create: %s", rankmem_last_error());
    return pool;
}

static void test_exhaustion(void)
{
    int finalized;
    counting_t *up;
    rankmem_resource_t *pool = pool_over(&up, &finalized, 1 << 20, 1 << 20);
    void *blk[4];
    int good = 1;
    for (int i = 0; i < 4; i++)
        good &= rankmem_allocate(pool, 256 << 10, 0, &blk[i]) == RANKMEM_SUCCESS;
    ok(good, "four quarters fill the pool");
    void *extra = NULL;
    is_status(rankmem_allocate(pool, 256, 0, &extra), RANKMEM_ERR_OUT_OF_MEMORY, "a full pool says out of memory");
    ok(strstr(rankmem_last_error(), "pool") != NULL, "the detail names the pool: %s", rankmem_last_error());
    ok(up->allocs == 1, "it did not ask the upstream past its maximum");
    is_status(rankmem_deallocate(pool, blk[1], 256 << 10, 0), RANKMEM_SUCCESS, "free one quarter");
    is_status(rankmem_allocate(pool, 200 << 10, 0, &extra), RANKMEM_SUCCESS, "the pool works again after a free");
    ok(extra == blk[1], "best fit reuses the freed quarter");
    is_status(rankmem_allocate(pool, 100 << 10, 0, &blk[1]), RANKMEM_ERR_OUT_OF_MEMORY, "what is left is too small");
    rankmem_deallocate(pool, extra, 200 << 10, 0);
    rankmem_deallocate(pool, blk[2], 256 << 10, 0);
    is_status(rankmem_allocate(pool, 512 << 10, 0, &extra), RANKMEM_SUCCESS, "two freed neighbours coalesce into one half");
    ok(extra == blk[1], "the half starts where the first freed quarter did");
    rankmem_deallocate(pool, extra, 512 << 10, 0);
    rankmem_deallocate(pool, blk[0], 256 << 10, 0);
    rankmem_deallocate(pool, blk[3], 256 << 10, 0);
    is_status(rankmem_allocate(pool, 1 << 20, 0, &extra), RANKMEM_SUCCESS, "after all frees the whole pool is one block");
    rankmem_deallocate(pool, extra, 1 << 20, 0);
    rankmem_resource_release(&up->base);
    rankmem_resource_release(pool);
}

/* A large free block that grows back into the next size class after a
 * pair (pool.c files it a class low then) is still found for a request of
 * its whole size, without growing. */
static void test_large_block_class(void)
{
    int finalized;
    counting_t *up;
    const size_t whole = (size_t)73 << 20, cut = (size_t)2 << 20; /* 73 and 71 MiB: two classes */
    rankmem_resource_t *pool = pool_over(&up, &finalized, whole, 0);
    void *a = NULL, *b = NULL, *c = NULL;
    is_status(rankmem_allocate(pool, cut, 0, &a), RANKMEM_SUCCESS, "large block: a pair's first half");
    is_status(rankmem_deallocate(pool, a, cut, 0), RANKMEM_SUCCESS, "large block: freed, merged back");
    for (int i = 0; i < 3; i++) { /* pairs that cut and merge across the class boundary */
        rankmem_allocate(pool, cut, 0, &c);
        rankmem_deallocate(pool, c, cut, 0);
    }
    is_status(rankmem_allocate(pool, whole, 0, &b), RANKMEM_SUCCESS, "large block: all of it at once");
    ok(b == a, "large block: it is the one block (%p, %p)", b, a);
    ok(up->allocs == 1, "large block: found without growing (%zu upstream allocations)", up->allocs);
    rankmem_deallocate(pool, b, whole, 0);
    rankmem_resource_release(&up->base);
    rankmem_resource_release(pool);
    ok(finalized, "large block: chain released");
}

static void test_growth_and_trim(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = 1 << 20;
    prm.growth_size = 1 << 20;
    rankmem_resource_t *pool;
    rankmem_pool_create(&up->base, &prm, &pool);
    void *a, *b, *c;
    rankmem_allocate(pool, 900 << 10, 0, &a);
    is_status(rankmem_allocate(pool, 900 << 10, 0, &b), RANKMEM_SUCCESS, "an unbounded pool grows when exhausted");
    ok(q(pool, RANKMEM_QUERY_RESERVED_CURRENT) == 2 << 20 && up->outstanding_blocks == 2, "by one growth step");
    is_status(rankmem_allocate(pool, 3 << 20, 0, &c), RANKMEM_SUCCESS, "a request above the growth step gets a chunk of its size");
    ok(q(pool, RANKMEM_QUERY_RESERVED_CURRENT) == 5 << 20, "reserved %zu", q(pool, RANKMEM_QUERY_RESERVED_CURRENT));
    ok(q(pool, RANKMEM_QUERY_RESERVED_HIGH) == 5 << 20, "reserved high-water mark");
    ok(q(pool, RANKMEM_QUERY_POOL_MAX) == SIZE_MAX, "no maximum");
    rankmem_deallocate(pool, c, 3 << 20, 0);
    rankmem_deallocate(pool, b, 900 << 10, 0);
    is_status(rankmem_resource_trim(pool, 1 << 20), RANKMEM_SUCCESS, "trim to 1 MiB");
    ok(q(pool, RANKMEM_QUERY_RESERVED_CURRENT) == 1 << 20 && up->outstanding_blocks == 1,
       "free chunks went back; the one in use stayed (%zu)", q(pool, RANKMEM_QUERY_RESERVED_CURRENT));
    rankmem_deallocate(pool, a, 900 << 10, 0);
    is_status(rankmem_resource_trim(pool, 0), RANKMEM_SUCCESS, "trim to 0");
    ok(q(pool, RANKMEM_QUERY_RESERVED_CURRENT) == 0 && up->outstanding_blocks == 0, "everything went back");
    is_status(rankmem_allocate(pool, 1000, 0, &a), RANKMEM_SUCCESS, "a trimmed pool grows again");
    rankmem_deallocate(pool, a, 1000, 0);
    rankmem_resource_release(&up->base);
    rankmem_resource_release(pool);
    ok(finalized, "chain released");
}

static void test_bad_inputs(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = 1 << 20;
    rankmem_resource_t *pool = NULL, *none = NULL;
    is_status(rankmem_pool_create(NULL, &prm, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL upstream");
    is_status(rankmem_pool_create(&up->base, &prm, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL output");
    rankmem_pool_params_t bad = prm;
    bad.maximum_size = 1 << 19;
    is_status(rankmem_pool_create(&up->base, &bad, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: initial above maximum");
    bad = prm;
    bad.size = 3;
    is_status(rankmem_pool_create(&up->base, &bad, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: params.size not set");
    up->fail_above = 1 << 10;
    is_status(rankmem_pool_create(&up->base, &prm, &none), RANKMEM_ERR_OUT_OF_MEMORY, "create: the upstream refuses the initial size");
    up->fail_above = 0;
    ok(none == NULL && up->base.refcount == 1 && up->outstanding_blocks == 0, "failed creations hold nothing");
    is_status(rankmem_pool_params_default(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "params_default: NULL");

    is_status(rankmem_pool_create(&up->base, &prm, &pool), RANKMEM_SUCCESS, "create");
    void *p = NULL, *p2 = NULL;
    is_status(rankmem_allocate(pool, 0, 0, &p), RANKMEM_ERR_INVALID_ARGUMENT, "0 bytes");
    is_status(rankmem_allocate(pool, SIZE_MAX, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY, "SIZE_MAX bytes");
    is_status(rankmem_allocate(pool, SIZE_MAX / 4, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY, "more than the host has");
    is_status(rankmem_allocate(pool, 100, 100, &p), RANKMEM_ERR_INVALID_ARGUMENT, "alignment 100");
    is_status(rankmem_allocate(pool, 100, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "NULL output");
    is_status(rankmem_allocate(pool, 1000, 0, &p), RANKMEM_SUCCESS, "allocate");
    memset(p, 7, 1000);
    is_status(rankmem_allocate(pool, 1000, 0, &p2), RANKMEM_SUCCESS, "allocate a neighbour");
    memset(p2, 9, 1000);
    is_status(rankmem_deallocate(pool, p, 999, 0), RANKMEM_ERR_INVALID_POINTER, "wrong size");
    ok(strstr(rankmem_last_error(), "999") && strstr(rankmem_last_error(), "1000"), "says both sizes: %s", rankmem_last_error());
    ok(q(pool, RANKMEM_QUERY_LIVE_COUNT) == 2, "the block is still live after a wrong-size free");
    is_status(rankmem_deallocate(pool, (char *)p + 256, 744, 0), RANKMEM_ERR_INVALID_POINTER, "interior pointer");
    char foreign[512];
    is_status(rankmem_deallocate(pool, foreign, 512, 0), RANKMEM_ERR_INVALID_POINTER, "foreign pointer");
    is_status(rankmem_deallocate(pool, NULL, 512, 0), RANKMEM_ERR_INVALID_POINTER, "NULL pointer");
    is_status(rankmem_deallocate(pool, p, 1000, 0), RANKMEM_SUCCESS, "the right free");
    is_status(rankmem_deallocate(pool, p, 1000, 0), RANKMEM_ERR_INVALID_POINTER, "double free");
    ok(q(pool, RANKMEM_QUERY_LIVE_COUNT) == 1, "the double free changed nothing");
    void *p3 = NULL, *p4 = NULL;
    rankmem_allocate(pool, 1000, 0, &p3);
    rankmem_allocate(pool, 1000, 0, &p4);
    ok(p3 != p4 && p3 != p2 && p4 != p2, "no block is handed out twice after the bad frees");
    unsigned char *c = p2;
    int same = 1;
    for (int i = 0; i < 1000; i++)
        same &= c[i] == 9;
    ok(same, "the neighbour's contents are untouched");
    is_status(rankmem_pool_forget_stream(NULL, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "forget_stream: NULL pool");
    is_status(rankmem_pool_forget_stream(&up->base, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "forget_stream: not a pool");
    size_t v;
    is_status(rankmem_resource_query(pool, (rankmem_query_t)77, &v), RANKMEM_ERR_NOT_SUPPORTED, "unknown query");
    rankmem_deallocate(pool, p3, 1000, 0);
    /* Destroy with live allocations: a clear status, and the memory still goes back. */
    rankmem_resource_release(&up->base);
    is_status(rankmem_resource_release(pool), RANKMEM_ERR_BUSY, "release with live allocations says so");
    ok(strstr(rankmem_last_error(), "2 live") != NULL, "and how many: %s", rankmem_last_error());
    ok(finalized, "the chain is freed all the same (no leak)");
}

static void *alloc_three(void *arg)
{
    void **out = arg;
    for (int i = 0; i < 3; i++)
        if (rankmem_allocate((rankmem_resource_t *)out[3], 4096, 0, &out[i]) != RANKMEM_SUCCESS)
            out[i] = NULL;
    return NULL;
}

/* rankmem_deallocate_many: the pool's one-lock path, blocks of another
 * thread's shard, the one-at-a-time path, and every bad input. */
static void test_deallocate_many(void)
{
    int finalized;
    counting_t *up;
    rankmem_resource_t *pool = pool_over(&up, &finalized, 8 << 20, 0);
    enum { N = 300 }; /* more than one round of the pool's 256 */
    static rankmem_block_t bl[N];
    int got = 0;
    for (int i = 0; i < N; i++) {
        bl[i].bytes = 256 + (size_t)i * 40;
        bl[i].alignment = i % 3 ? 0 : 512;
        got += rankmem_allocate(pool, bl[i].bytes, bl[i].alignment, &bl[i].ptr) == RANKMEM_SUCCESS;
    }
    ok(got == N && q(pool, RANKMEM_QUERY_LIVE_COUNT) == N, "%d blocks allocated", N);
    size_t failed = 99;
    is_status(rankmem_deallocate_many(pool, bl, N, &failed), RANKMEM_SUCCESS, "all back at once");
    ok(failed == 0 && q(pool, RANKMEM_QUERY_LIVE_COUNT) == 0 && q(pool, RANKMEM_QUERY_USED_CURRENT) == 0,
       "none failed, none live (failed %zu)", failed);
    ok(q(pool, RANKMEM_QUERY_FREE_BLOCKS) == 1, "coalesced back into one free block");
    ok(q(pool, RANKMEM_QUERY_LARGEST_FREE) == q(pool, RANKMEM_QUERY_RESERVED_CURRENT),
       "the largest free block is all the pool holds (%zu)", q(pool, RANKMEM_QUERY_LARGEST_FREE));
    /* Every other block freed: holes between live blocks, the largest free
     * block smaller than all that is free (what the failure record reports). */
    void *h[8];
    int hg = 0;
    for (int i = 0; i < 8; i++)
        hg += rankmem_allocate(pool, 64 << 10, 0, &h[i]) == RANKMEM_SUCCESS;
    for (int i = 0; i < 8; i += 2)
        rankmem_deallocate(pool, h[i], 64 << 10, 0);
    size_t lf = q(pool, RANKMEM_QUERY_LARGEST_FREE);
    size_t fr = q(pool, RANKMEM_QUERY_RESERVED_CURRENT) - q(pool, RANKMEM_QUERY_USED_CURRENT);
    ok(hg == 8 && lf >= (64 << 10) && lf < fr && q(pool, RANKMEM_QUERY_FREE_BLOCKS) >= 4,
       "fragmented: the largest free block (%zu) is less than the %zu bytes free", lf, fr);
    for (int i = 1; i < 8; i += 2)
        rankmem_deallocate(pool, h[i], 64 << 10, 0);

    /* Blocks of another thread's shard. */
    void *t[4] = {NULL, NULL, NULL, pool};
    pthread_t th;
    pthread_create(&th, NULL, alloc_three, t);
    pthread_join(th, NULL);
    rankmem_block_t other[3] = {{t[0], 4096, 0}, {t[1], 4096, 0}, {t[2], 4096, 0}};
    is_status(rankmem_deallocate_many(pool, other, 3, &failed), RANKMEM_SUCCESS,
              "another thread's blocks");
    ok(failed == 0 && q(pool, RANKMEM_QUERY_LIVE_COUNT) == 0, "all back (failed %zu)", failed);

    /* A batch with bad blocks: the good ones go back all the same. */
    void *a, *b, *c;
    char foreign[512];
    rankmem_allocate(pool, 1000, 0, &a);
    rankmem_allocate(pool, 1000, 0, &b);
    rankmem_allocate(pool, 1000, 0, &c);
    rankmem_block_t mixed[5] = {{a, 1000, 0}, {foreign, 512, 0}, {b, 1000, 0}, {a, 1000, 0},
                                {c, 999, 0}};
    is_status(rankmem_deallocate_many(pool, mixed, 5, &failed), RANKMEM_ERR_INVALID_POINTER,
              "foreign, double and wrong-size blocks: the first failure's status");
    ok(failed == 3, "three failed (%zu)", failed);
    ok(q(pool, RANKMEM_QUERY_LIVE_COUNT) == 1, "the good ones went back, the wrong-size one is live");
    void *d;
    rankmem_allocate(pool, 1000, 0, &d);
    rankmem_block_t checked[4] = {{c, 1000, 0}, {NULL, 8, 0}, {d, 1000, 100}, {d, 1000, 0}};
    is_status(rankmem_deallocate_many(pool, checked, 4, &failed), RANKMEM_ERR_INVALID_POINTER,
              "a NULL block and a bad alignment: one at a time");
    ok(failed == 2 && q(pool, RANKMEM_QUERY_LIVE_COUNT) == 0, "both bad ones failed, both good went back (%zu)",
       failed);
    failed = 7;
    is_status(rankmem_deallocate_many(NULL, mixed, 5, &failed), RANKMEM_ERR_INVALID_ARGUMENT, "NULL resource");
    ok(failed == 5, "every block counted as failed (%zu)", failed);
    is_status(rankmem_deallocate_many(pool, NULL, 2, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "NULL blocks");
    is_status(rankmem_deallocate_many(pool, NULL, 0, &failed), RANKMEM_SUCCESS, "no blocks");
    ok(failed == 0, "nothing failed");

    /* A resource without the batch operation: one deallocate per block. */
    rankmem_block_t direct[2];
    rankmem_allocate(&up->base, 300, 0, &direct[0].ptr);
    rankmem_allocate(&up->base, 600, 0, &direct[1].ptr);
    direct[0].bytes = 300, direct[1].bytes = 600, direct[0].alignment = direct[1].alignment = 0;
    size_t before = up->outstanding_blocks;
    is_status(rankmem_deallocate_many(&up->base, direct, 2, &failed), RANKMEM_SUCCESS,
              "through deallocate, one by one");
    ok(failed == 0 && up->outstanding_blocks == before - 2, "both went back");
    rankmem_resource_release(pool);
    rankmem_resource_release(&up->base);
    ok(finalized, "nothing leaked");
}

int main(void)
{
    random_run(1, 4 << 20, 20000);
    random_run(42, 1 << 20, 20000); /* small: many out-of-memory */
    random_run(20261122, 64 << 20, 40000);
    test_exhaustion();
    test_large_block_class();
    test_growth_and_trim();
    test_bad_inputs();
    test_deallocate_many();
    return tap_done();
}
