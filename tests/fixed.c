/* The fixed-size resource over a host upstream (and over a pool): growth by
 * batches, trim, per-stream reuse, alignment, randomized allocate/free with
 * overlap, alignment and content checks, every bad input, release with live
 * blocks, and an 8-thread stress test with handoffs and concurrent trims
 * (the short CI form; run it under ThreadSanitizer too, see docs/fixed-binning.md). */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"
#include "flaky.h"
#include "stress_harness.h"


#define S1 ((rankmem_stream_t)(uintptr_t)0x1000)
#define S2 ((rankmem_stream_t)(uintptr_t)0x2000)
#define S3 ((rankmem_stream_t)(uintptr_t)0x3000)

static size_t q(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = (size_t)-1;
    rankmem_resource_query(mr, what, &v);
    return v;
}

/* An upstream that gives 256-byte alignment only, as cudaMalloc does. */
typedef struct {
    rankmem_resource_t base;
    int refused;
} picky_t;

static rankmem_status_t picky_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    if (alignment > 256) {
        ((picky_t *)mr)->refused++;
        return RANKMEM_ERR_NOT_SUPPORTED;
    }
    return rankmem_allocate_async(mr->upstream, bytes, alignment, stream, ptr_p);
}

static rankmem_status_t picky_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                         size_t alignment, rankmem_stream_t stream)
{
    return rankmem_deallocate_async(mr->upstream, ptr, bytes, alignment, stream);
}

static rankmem_status_t picky_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t picky_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "picky",
    .allocate = picky_allocate,
    .deallocate = picky_deallocate,
    .finalize = picky_finalize,
};

static void test_bad_input(void)
{
    int fin;
    counting_t *up = counting_new(&fin);
    rankmem_resource_t *mr = (rankmem_resource_t *)&fin; /* sentinel: must stay untouched */
    is_status(rankmem_fixed_create(NULL, 1024, 16, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: NULL upstream");
    is_status(rankmem_fixed_create(&up->base, 1024, 16, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: NULL output");
    is_status(rankmem_fixed_create(&up->base, 0, 16, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: block size 0");
    is_status(rankmem_fixed_create(&up->base, SIZE_MAX, 1, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: block size SIZE_MAX");
    is_status(rankmem_fixed_create(&up->base, (size_t)1 << 41, 1, &mr),
              RANKMEM_ERR_INVALID_ARGUMENT, "create: block size 2^41");
    is_status(rankmem_fixed_create(&up->base, 1 << 20, (size_t)1 << 21, &mr),
              RANKMEM_ERR_INVALID_ARGUMENT, "create: a batch of 2^41 bytes");
    is_status(rankmem_fixed_create(&up->base, 1 << 20, SIZE_MAX, &mr),
              RANKMEM_ERR_INVALID_ARGUMENT, "create: SIZE_MAX blocks per batch");
    up->fail_above = 1000;
    is_status(rankmem_fixed_create(&up->base, 1024, 16, &mr), RANKMEM_ERR_OUT_OF_MEMORY,
              "create: the upstream refuses the first batch");
    up->fail_above = 0;
    ok(mr == (rankmem_resource_t *)&fin, "output untouched on every failure");
    ok(up->base.refcount == 1 && up->allocs == 0 && up->outstanding_blocks == 0,
       "no reference and nothing allocated left behind (refcount %lu, %zu allocs)",
       up->base.refcount, up->allocs);

    is_status(rankmem_fixed_create(&up->base, 1024, 4, &mr), RANKMEM_SUCCESS, "create");
    void *p = NULL;
    is_status(rankmem_allocate(mr, 1025, 0, &p), RANKMEM_ERR_INVALID_ARGUMENT,
              "a request larger than the block");
    const char *msg = rankmem_last_error();
    ok(strstr(msg, "1025") && strstr(msg, "1024"), "the message names both sizes: %s", msg);
    is_status(rankmem_allocate(mr, 0, 0, &p), RANKMEM_ERR_INVALID_ARGUMENT, "0 bytes");
    is_status(rankmem_allocate(mr, 8, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "NULL output");
    is_status(rankmem_allocate(mr, 8, 3, &p), RANKMEM_ERR_INVALID_ARGUMENT, "alignment 3");
    is_status(rankmem_deallocate(mr, NULL, 8, 0), RANKMEM_ERR_INVALID_POINTER, "free NULL");
    ok(p == NULL && q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 4,
       "nothing changed");
    is_status(rankmem_resource_query(mr, RANKMEM_QUERY_LIMIT, &(size_t){0}),
              RANKMEM_ERR_NOT_SUPPORTED, "an unknown query");
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released");
    ok(up->outstanding_bytes == 0 && up->base.refcount == 1, "nothing outstanding upstream");
    rankmem_resource_release(&up->base);
    ok(fin, "chain gone");
}

static void test_growth_and_trim(void)
{
    int fin;
    counting_t *up = counting_new(&fin);
    rankmem_resource_t *mr;
    if (rankmem_fixed_create(&up->base, 1000, 16, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("fixed_create: %s", rankmem_last_error());
    ok(up->allocs == 1 && up->outstanding_bytes == 16 * 1024,
       "creation takes one batch: 16 blocks of 1000 rounded up to 1024 (%zu allocs, %zu bytes)",
       up->allocs, up->outstanding_bytes);
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 16384 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 16 &&
           q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0 && q(mr, RANKMEM_QUERY_USED_CURRENT) == 0,
       "queries at creation");
    char desc[64] = "";
    rankmem_resource_describe(mr, desc, sizeof desc, NULL);
    ok(strcmp(desc, "fixed(block=1KiB,batch=16)>counting") == 0, "describe: %s", desc);

    void *p[40];
    int bad = 0;
    for (int i = 0; i < 16; i++)
        bad += rankmem_allocate(mr, 1 + (size_t)i * 60, 0, &p[i]) != RANKMEM_SUCCESS;
    ok(!bad && up->allocs == 1, "16 blocks from the first batch, no upstream call");
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < i; j++)
            bad += (char *)p[i] < (char *)p[j] + 1024 && (char *)p[j] < (char *)p[i] + 1024;
    ok(!bad, "no two blocks overlap");
    bad = rankmem_allocate(mr, 1024, 0, &p[16]) != RANKMEM_SUCCESS;
    ok(!bad && up->allocs == 2 && q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 32768,
       "the 17th grows by one batch (%zu allocs)", up->allocs);
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == 17 && q(mr, RANKMEM_QUERY_USED_CURRENT) == 17 * 1024 &&
           q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 15,
       "live %zu, used %zu, free %zu", q(mr, RANKMEM_QUERY_LIVE_COUNT),
       q(mr, RANKMEM_QUERY_USED_CURRENT), q(mr, RANKMEM_QUERY_FREE_BLOCKS));
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim with every batch in use");
    ok(up->frees == 0 && q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 32768,
       "gives nothing back while every batch has a live block");
    /* Free the first batch's blocks: it becomes wholly free. */
    for (int i = 0; i < 16; i++)
        bad += rankmem_deallocate(mr, p[i], 1 + (size_t)i * 60, 0) != RANKMEM_SUCCESS;
    ok(!bad, "frees");
    is_status(rankmem_resource_trim(mr, 32768), RANKMEM_SUCCESS, "trim keeping 32 KiB");
    ok(up->frees == 0, "keeps what it was asked to keep");
    is_status(rankmem_resource_trim(mr, 1), RANKMEM_SUCCESS, "trim keeping 1 byte");
    ok(up->frees == 1 && q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 16384 &&
           q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 15 && q(mr, RANKMEM_QUERY_RESERVED_HIGH) == 32768,
       "gives back the wholly free batch only (%zu frees, %zu free blocks, high %zu)", up->frees,
       q(mr, RANKMEM_QUERY_FREE_BLOCKS), q(mr, RANKMEM_QUERY_RESERVED_HIGH));
    /* A pointer of the batch given back is now foreign. */
    is_status(rankmem_deallocate(mr, p[0], 8, 0), RANKMEM_ERR_INVALID_POINTER,
              "a pointer into a trimmed batch is refused");
    bad = rankmem_deallocate(mr, p[16], 1024, 0) != RANKMEM_SUCCESS;
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim to 0");
    ok(!bad && up->outstanding_bytes == 0 && q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 0 &&
           q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 0,
       "everything back upstream");
    bad = rankmem_allocate(mr, 100, 0, &p[0]) != RANKMEM_SUCCESS;
    ok(!bad && up->allocs == 3, "grows again after a trim to 0");
    bad = rankmem_deallocate(mr, p[0], 100, 0) != RANKMEM_SUCCESS;
    ok(!bad, "and frees");

    rankmem_resource_t *dflt;
    if (rankmem_fixed_create(&up->base, 64 << 10, 0, &dflt) != RANKMEM_SUCCESS)
        BAIL_OUT("fixed_create: %s", rankmem_last_error());
    rankmem_resource_describe(dflt, desc, sizeof desc, NULL);
    ok(q(dflt, RANKMEM_QUERY_RESERVED_CURRENT) == (2 << 20) &&
           strcmp(desc, "fixed(block=64KiB)>counting") == 0,
       "batch 0: 2 MiB worth of blocks; describe: %s", desc);
    rankmem_resource_t *big;
    if (rankmem_fixed_create(&up->base, 3 << 20, 0, &big) != RANKMEM_SUCCESS)
        BAIL_OUT("fixed_create: %s", rankmem_last_error());
    ok(q(big, RANKMEM_QUERY_RESERVED_CURRENT) == (3 << 20), "blocks over 2 MiB: one per batch");
    rankmem_resource_release(big);
    rankmem_resource_release(dflt);
    rankmem_resource_release(&up->base);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released");
    ok(fin, "chain gone");
}

static void test_bad_pointers(void)
{
    int fin;
    counting_t *up = counting_new(&fin);
    rankmem_resource_t *mr, *odd;
    if (rankmem_fixed_create(&up->base, 1024, 8, &mr) != RANKMEM_SUCCESS ||
        rankmem_fixed_create(&up->base, 768, 8, &odd) != RANKMEM_SUCCESS)
        BAIL_OUT("fixed_create: %s", rankmem_last_error());
    void *p, *r, *o;
    rankmem_allocate(mr, 1000, 0, &p);
    rankmem_allocate(mr, 1000, 0, &r);
    rankmem_allocate(odd, 700, 0, &o);
    size_t live = q(mr, RANKMEM_QUERY_LIVE_COUNT), nfree = q(mr, RANKMEM_QUERY_FREE_BLOCKS);
    char *c = p;
    void *heap = malloc(1024);
    is_status(rankmem_deallocate(mr, heap, 1000, 0), RANKMEM_ERR_INVALID_POINTER,
              "a foreign pointer");
    is_status(rankmem_deallocate(mr, c + 256, 8, 0), RANKMEM_ERR_INVALID_POINTER,
              "an interior pointer (256 bytes in)");
    is_status(rankmem_deallocate(mr, c + 1, 8, 0), RANKMEM_ERR_INVALID_POINTER,
              "an interior pointer (1 byte in)");
    is_status(rankmem_deallocate(mr, p, 1025, 0), RANKMEM_ERR_INVALID_POINTER,
              "a size larger than the block");
    is_status(rankmem_deallocate(odd, (char *)o + 256, 8, 0), RANKMEM_ERR_INVALID_POINTER,
              "an interior pointer, block size 768");
    is_status(rankmem_deallocate(odd, (char *)o + 512, 8, 0), RANKMEM_ERR_INVALID_POINTER,
              "an interior pointer, 512 into a 768-byte block");
    is_status(rankmem_deallocate(odd, (char *)o + 768, 8, 0), RANKMEM_ERR_INVALID_POINTER,
              "the next block, which is free");
    is_status(rankmem_deallocate(odd, p, 8, 0), RANKMEM_ERR_INVALID_POINTER,
              "a block of another fixed resource");
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == live && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == nfree,
       "nothing changed by the refusals");
    is_status(rankmem_deallocate(mr, p, 1000, 0), RANKMEM_SUCCESS, "the real free");
    is_status(rankmem_deallocate(mr, p, 1000, 0), RANKMEM_ERR_INVALID_POINTER, "a double free");
    ok(strstr(rankmem_last_error(), "double free") != NULL, "says so: %s", rankmem_last_error());
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == live - 1 &&
           q(mr, RANKMEM_QUERY_FREE_BLOCKS) == nfree + 1,
       "the double free changed nothing");
    void *p2;
    rankmem_allocate(mr, 10, 0, &p2);
    ok(p2 == p, "the block comes back once");
    void *p3;
    rankmem_allocate(mr, 10, 0, &p3);
    ok(p3 != p, "and only once");
    is_status(rankmem_deallocate(odd, o, 700, 0), RANKMEM_SUCCESS, "768: free");
    rankmem_deallocate(mr, p2, 10, 0);
    rankmem_deallocate(mr, p3, 10, 0);
    rankmem_deallocate(mr, r, 1000, 0);
    free(heap);

    /* Alignment: batches are asked at the block's power-of-two factor (at most 4 KiB). */
    void *a = NULL;
    is_status(rankmem_allocate(mr, 100, 1024, &a), RANKMEM_SUCCESS, "alignment 1024, block 1024");
    ok(a && (uintptr_t)a % 1024 == 0, "is 1024-aligned");
    rankmem_deallocate(mr, a, 100, 1024);
    is_status(rankmem_allocate(mr, 100, 2048, &a), RANKMEM_ERR_NOT_SUPPORTED,
              "alignment 2048 with 1 KiB blocks");
    is_status(rankmem_allocate(odd, 100, 512, &a), RANKMEM_ERR_NOT_SUPPORTED,
              "alignment 512 with 768-byte blocks");
    picky_t *pk = calloc(1, sizeof *pk);
    rankmem_resource_init(&pk->base, &picky_ops, RANKMEM_PROP_HOST_ACCESSIBLE, &up->base);
    rankmem_resource_t *pf;
    is_status(rankmem_fixed_create(&pk->base, 4096, 4, &pf), RANKMEM_SUCCESS,
              "over an upstream that gives 256-byte alignment only");
    ok(pk->refused == 1, "it was asked for 4096 once");
    is_status(rankmem_allocate(pf, 100, 512, &a), RANKMEM_ERR_NOT_SUPPORTED,
              "then alignment 512 is not supported");
    is_status(rankmem_allocate(pf, 100, 256, &a), RANKMEM_SUCCESS, "256 is");
    rankmem_deallocate(pf, a, 100, 256);
    void *g[5];
    for (int i = 0; i < 5; i++)
        rankmem_allocate(pf, 4096, 0, &g[i]);
    ok(pk->refused == 1, "growth asks for 256 from then on");
    for (int i = 0; i < 5; i++)
        rankmem_deallocate(pf, g[i], 4096, 0);
    rankmem_resource_release(&pk->base);
    is_status(rankmem_resource_release(pf), RANKMEM_SUCCESS, "released");

    rankmem_resource_release(odd);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released");
    ok(up->outstanding_bytes == 0 && up->base.refcount == 1, "nothing outstanding upstream");
    rankmem_resource_release(&up->base);
    ok(fin, "chain gone");
}

static void test_streams(void)
{
    int fin;
    counting_t *up = counting_new(&fin);
    rankmem_resource_t *mr;
    if (rankmem_fixed_create(&up->base, 512, 8, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("fixed_create: %s", rankmem_last_error());
    void *a, *b, *c, *x, *y;
    rankmem_allocate_async(mr, 512, 0, S1, &a);
    rankmem_deallocate_async(mr, a, 512, 0, S1);
    rankmem_allocate_async(mr, 512, 0, S1, &b);
    ok(a == b, "the same stream gets its block back at once");
    rankmem_allocate_async(mr, 512, 0, S1, &x);
    rankmem_deallocate_async(mr, x, 512, 0, S1);
    rankmem_deallocate_async(mr, b, 512, 0, S1);
    rankmem_allocate_async(mr, 512, 0, S1, &y);
    rankmem_allocate_async(mr, 512, 0, S1, &c);
    ok(y == b && c == x, "last freed, first reused (LIFO per stream)");
    /* S2 has nothing of its own: it takes from another stream (over a host
     * upstream no event is needed), and then keeps what it took. */
    void *d, *e;
    rankmem_deallocate_async(mr, y, 512, 0, S1);
    is_status(rankmem_allocate_async(mr, 512, 0, S2, &d), RANKMEM_SUCCESS, "another stream");
    ok(d != c, "gets a block that is not live");
    rankmem_deallocate_async(mr, d, 512, 0, S2);
    rankmem_allocate_async(mr, 512, 0, S2, &e);
    ok(e == d, "and reuses its own free at once");
    size_t nfree = q(mr, RANKMEM_QUERY_FREE_BLOCKS);
    /* Forgetting a stream: its blocks go to the default stream. */
    rankmem_deallocate_async(mr, e, 512, 0, S3);
    is_status(rankmem_resource_forget_stream(mr, S3), RANKMEM_SUCCESS, "forget a stream");
    void *f;
    rankmem_allocate_async(mr, 512, 0, NULL, &f);
    ok(f == e, "its free block went to the default stream");
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == nfree, "nothing lost (%zu free)",
       q(mr, RANKMEM_QUERY_FREE_BLOCKS));
    rankmem_deallocate_async(mr, f, 512, 0, S2);
    rankmem_deallocate_async(mr, c, 512, 0, S2);
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 8,
       "all 8 free again, over three streams");
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim across streams");
    ok(up->outstanding_bytes == 0, "the batch went back");
    rankmem_resource_release(&up->base);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released");
    ok(fin, "chain gone");
}

/* ---- randomized ---- */

static size_t up_to_block(void *arg, unsigned long long *s)
{
    return 1 + sh_rng(s) % *(const size_t *)arg;
}

static void random_run(const char *what, rankmem_resource_t *upstream, counting_t *count,
                       size_t block, unsigned long long seed, int steps)
{
    rankmem_resource_t *mr;
    if (rankmem_fixed_create(upstream, block, 16, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("fixed_create: %s", rankmem_last_error());
    static const rankmem_stream_t streams[] = {NULL, S1, S2};
    /* Mostly the default; 4 KiB only where a block can have it. */
    static const size_t aligns[] = {0, 0, 0, 256, 0, 0, 256, 4096};
    /* Overlap is checked over whole blocks: a request smaller than the
     * block still owns all of it. Freed mostly on the stream it was used
     * on, sometimes on another. */
    sh_seq_config_t cfg = {.mr = mr, .steps = steps, .max_live = 300, .alloc_pct = 52,
                           .seed = seed, .size = up_to_block, .arg = &block,
                           .aligns = aligns, .naligns = block % 4096 == 0 ? 8 : 4,
                           .streams = streams, .nstreams = 3, .other_stream_pct = 20,
                           .extent = block, .hook = sh_seq_hook_trim};
    sh_seq_result_t res;
    sh_seq_run(&cfg, &res);
    long bad = res.errors + res.hook_failures;
    ok(!bad && res.allocs > steps / 3, "%s: %ld allocations, every call succeeded (%ld failures)",
       what, res.allocs, bad);
    ok(!res.overlaps && !res.misaligned && !res.corrupt,
       "%s: no overlap (%ld), misalignment (%ld), corruption (%ld)", what, res.overlaps,
       res.misaligned, res.corrupt);
    ok(!bad && q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0, "%s: all freed", what);
    size_t reserved = q(mr, RANKMEM_QUERY_RESERVED_CURRENT);
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) * ((block + 255) & ~(size_t)255) == reserved,
       "%s: every block of %zu bytes reserved is free", what, reserved);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "%s: released", what);
    if (count)
        ok(count->outstanding_blocks == 0 && count->outstanding_bytes == 0,
           "%s: nothing outstanding upstream", what);
}

/* ---- release with live blocks ---- */

static void test_busy(void)
{
    int fin;
    counting_t *up = counting_new(&fin);
    rankmem_resource_t *mr;
    if (rankmem_fixed_create(&up->base, 256, 4, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("fixed_create: %s", rankmem_last_error());
    void *p[6];
    for (int i = 0; i < 6; i++)
        rankmem_allocate(mr, 256, 0, &p[i]);
    is_status(rankmem_resource_release(mr), RANKMEM_ERR_BUSY, "release with 6 live blocks");
    ok(strstr(rankmem_last_error(), "6 live") != NULL, "says how many: %s", rankmem_last_error());
    ok(up->outstanding_bytes == 0 && up->base.refcount == 1,
       "every batch went back anyway (%zu bytes outstanding)", up->outstanding_bytes);
    rankmem_resource_release(&up->base);
    ok(fin, "chain gone: nothing leaked");
}

/* ---- threads ---- */

#define NTHREADS 8
#define STEPS 20000

static size_t thread_size(void *arg, unsigned r, unsigned long long *s)
{
    (void)arg;
    (void)r;
    return 1 + sh_rng(s) % 4096;
}

static void test_threads(void)
{
    int fin;
    counting_t *up = counting_new(&fin);
    rankmem_resource_t *shared;
    if (rankmem_fixed_create(&up->base, 4096, 32, &shared) != RANKMEM_SUCCESS)
        BAIL_OUT("fixed_create: %s", rankmem_last_error());
    sh_config_t cfg = {.mr = shared, .threads = NTHREADS, .steps = STEPS, .live = 48,
                       .seed = 12345, .handoff_mod = 5, .take_mod = 7, .size = thread_size,
                       .hook = sh_hook_trim};
    sh_result_t res;
    sh_run(&cfg, &res);
    sh_report(&res, "8 threads, own streams, handoffs, trims", NTHREADS * STEPS / 3);
    ok(q(shared, RANKMEM_QUERY_LIVE_COUNT) == 0, "nothing live at the end");
    is_status(rankmem_resource_trim(shared, 0), RANKMEM_SUCCESS, "trim to 0");
    ok(up->outstanding_bytes == 0 && q(shared, RANKMEM_QUERY_FREE_BLOCKS) == 0,
       "blocks spread over threads and streams add up to whole batches again (%zu outstanding)",
       up->outstanding_bytes);
    rankmem_resource_release(&up->base);
    is_status(rankmem_resource_release(shared), RANKMEM_SUCCESS, "released");
    ok(fin, "chain gone");
}

/* Issue 31, defect 1: a transient upstream failure while a batch is made
 * must not lower the batch alignment for good. The upstream hands out
 * memory at 256 that is never 512-aligned, so a batch asked at 256 shows. */
static void test_defect1_transient_alignment(void)
{
    const size_t MiB = (size_t)1 << 20;
    flaky_t f = {0};
    f.skew = 1;
    rankmem_resource_t *up = flaky_new(&f), *mr = NULL;
    if (!up || rankmem_fixed_create(up, 4 * MiB, 1, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("fixed over flaky: %s", rankmem_last_error());
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    is_status(rankmem_allocate(mr, 3 * MiB, 512, &a), RANKMEM_SUCCESS,
              "defect 1: 3 MiB at alignment 512");
    ok(a && (uintptr_t)a % 512 == 0, "defect 1: is 512-aligned");
    f.fail_at = f.calls + 1; /* the next upstream call fails, once */
    is_status(rankmem_allocate(mr, 3 * MiB, 0, &b), RANKMEM_SUCCESS,
              "defect 1: 3 MiB while the upstream fails once");
    ok(f.failed == 1, "defect 1: the upstream did fail (%zu)", f.failed);
    ok(b && (uintptr_t)b % 512 != 0, "defect 1: served from a batch asked at 256");
    /* The free low block is on top of the stack: an aligned request passes over it. */
    is_status(rankmem_deallocate(mr, b, 3 * MiB, 0), RANKMEM_SUCCESS, "defect 1: free it");
    size_t calls = f.calls;
    is_status(rankmem_allocate(mr, 3 * MiB, 512, &c), RANKMEM_SUCCESS,
              "defect 1: 512 again, before any trim, with only the low block free");
    ok(c && (uintptr_t)c % 512 == 0 && c != b, "defect 1: an aligned block of a new batch");
    ok(f.calls == calls + 1, "defect 1: asked of the upstream at full alignment, once");
    void *x = NULL;
    rankmem_allocate(mr, 3 * MiB, 0, &x);
    ok(x == b, "defect 1: the low block went back to the stack");
    /* Now the low block on top, the aligned one under it. */
    rankmem_deallocate(mr, c, 3 * MiB, 512);
    rankmem_deallocate(mr, x, 3 * MiB, 0);
    is_status(rankmem_allocate(mr, 3 * MiB, 512, &d), RANKMEM_SUCCESS,
              "defect 1: 512 again, with an aligned block free under the low one");
    ok(d == c, "defect 1: the aligned free block is found (%p, %p)", d, c);
    rankmem_deallocate(mr, d, 3 * MiB, 512);
    rankmem_deallocate(mr, a, 3 * MiB, 512);
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "defect 1: free all, trim");
    ok(f.live_blocks == 0, "defect 1: every batch went back (%zu left)", f.live_blocks);
    a = NULL;
    is_status(rankmem_allocate(mr, 3 * MiB, 512, &a), RANKMEM_SUCCESS,
              "defect 1: 3 MiB at alignment 512 after the trim (the issue's reproduction)");
    ok(a && (uintptr_t)a % 512 == 0, "defect 1: is 512-aligned");
    rankmem_deallocate(mr, a, 3 * MiB, 512);
    /* A request that needs the alignment is not served from a batch asked at 256. */
    f.fail_at = f.calls + 1;
    void *held;
    rankmem_allocate(mr, 3 * MiB, 0, &held); /* the only free block: taken */
    a = (void *)0x1;
    is_status(rankmem_allocate(mr, 3 * MiB, 4096, &a), RANKMEM_ERR_OUT_OF_MEMORY,
              "defect 1: 4096 while the upstream fails: its error, not a 256-aligned batch");
    ok(a == (void *)0x1 && f.failed == 2, "defect 1: nothing handed out");
    is_status(rankmem_allocate(mr, 3 * MiB, 4096, &a), RANKMEM_SUCCESS,
              "defect 1: 4096 once the fault is over");
    ok((uintptr_t)a % 4096 == 0, "defect 1: is 4096-aligned");
    rankmem_deallocate(mr, a, 3 * MiB, 4096);
    rankmem_deallocate(mr, held, 3 * MiB, 0);
    /* NOT_SUPPORTED is what lowers it for good (cudaMalloc's case). */
    rankmem_resource_trim(mr, 0);
    f.fail_at = f.calls + 1;
    f.fail_status = RANKMEM_ERR_NOT_SUPPORTED;
    is_status(rankmem_allocate(mr, 3 * MiB, 0, &b), RANKMEM_SUCCESS,
              "defect 1: an upstream that says NOT_SUPPORTED at 4096: served at 256");
    is_status(rankmem_allocate(mr, 3 * MiB, 512, &c), RANKMEM_ERR_NOT_SUPPORTED,
              "defect 1: then alignment 512 is NOT_SUPPORTED");
    rankmem_deallocate(mr, b, 3 * MiB, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "defect 1: released");
    ok(f.live_blocks == 0 && f.live_bytes == 0, "defect 1: nothing outstanding upstream");
    rankmem_resource_release(up);
}

/* Issue 31, defect 2: a free with size 0 (or more than a block) of a block
 * in one of the resource's own batches is refused and changes nothing. */
static void test_defect2_wrong_size(void)
{
    for (int over_system = 0; over_system < 2; over_system++) {
        const char *on = over_system ? "over system" : "over a callback";
        flaky_t f = {0};
        rankmem_resource_t *up = NULL, *mr = NULL;
        if (over_system)
            rankmem_system_create(&up);
        else
            up = flaky_new(&f);
        if (!up || rankmem_resource_from_spec_upstream("fixed(block=4096)", up, &mr) !=
                       RANKMEM_SUCCESS)
            BAIL_OUT("fixed(block=4096): %s", rankmem_last_error());
        void *p = NULL, *r = NULL;
        rankmem_allocate(mr, 4096, 0, &p);
        rankmem_allocate(mr, 4096, 0, &r);
        size_t live = q(mr, RANKMEM_QUERY_LIVE_COUNT), nfree = q(mr, RANKMEM_QUERY_FREE_BLOCKS);
        size_t blocks = f.live_blocks;
        is_status(rankmem_deallocate(mr, p, 0, 0), RANKMEM_ERR_INVALID_POINTER,
                  "defect 2: fixed %s: free with size 0", on);
        ok(strstr(rankmem_last_error(), "0 bytes") != NULL, "defect 2: says so: %s",
           rankmem_last_error());
        is_status(rankmem_deallocate(mr, p, 0, 4096), RANKMEM_ERR_INVALID_POINTER,
                  "defect 2: fixed %s: size 0 at alignment 4096", on);
        is_status(rankmem_deallocate(mr, p, 4097, 0), RANKMEM_ERR_INVALID_POINTER,
                  "defect 2: fixed %s: size 4097", on);
        ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == live && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == nfree &&
               f.live_blocks == blocks,
           "defect 2: fixed %s: nothing changed, upstream included", on);
        is_status(rankmem_deallocate(mr, p, 4096, 0), RANKMEM_SUCCESS,
                  "defect 2: fixed %s: the right free afterwards", on);
        void *a = NULL, *b = NULL;
        rankmem_allocate(mr, 4096, 0, &a);
        rankmem_allocate(mr, 4096, 0, &b);
        ok(a == p && b != p && b != r, "defect 2: fixed %s: the block comes back once", on);
        rankmem_deallocate(mr, a, 4096, 0);
        rankmem_deallocate(mr, b, 4096, 0);
        rankmem_deallocate(mr, r, 4096, 0);
        is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "defect 2: fixed %s: released",
                  on);
        ok(over_system || f.live_blocks == 0, "defect 2: fixed %s: the upstream has all back", on);
        rankmem_resource_release(up);
    }
}

int main(void)
{
    test_bad_input();
    test_growth_and_trim();
    test_bad_pointers();
    test_streams();
    test_defect1_transient_alignment();
    test_defect2_wrong_size();

    static const unsigned long long seeds[] = {1, 2, 3};
    for (int i = 0; i < 3; i++) {
        int fin;
        counting_t *up = counting_new(&fin);
        char name[64];
        snprintf(name, sizeof name, "host, 768-byte blocks, seed %llu", seeds[i]);
        random_run(name, &up->base, up, 768, seeds[i], 12000);
        snprintf(name, sizeof name, "host, 4 KiB blocks, seed %llu", seeds[i]);
        random_run(name, &up->base, up, 4096, seeds[i] + 100, 12000);
        rankmem_resource_release(&up->base);
        ok(fin, "seed %llu: upstream gone", seeds[i]);
    }
    {
        int fin;
        counting_t *up = counting_new(&fin);
        rankmem_resource_t *pool;
        if (rankmem_pool_create(&up->base, NULL, &pool) != RANKMEM_SUCCESS)
            BAIL_OUT("pool_create: %s", rankmem_last_error());
        random_run("over a pool, 4 KiB blocks", pool, NULL, 4096, 7, 12000);
        random_run("over a pool, 1280-byte blocks", pool, NULL, 1280, 8, 12000);
        ok(q(pool, RANKMEM_QUERY_LIVE_COUNT) == 0, "the pool has nothing live after");
        is_status(rankmem_resource_release(pool), RANKMEM_SUCCESS, "pool released");
        ok(up->outstanding_bytes == 0, "nothing outstanding upstream");
        rankmem_resource_release(&up->base);
        ok(fin, "chain gone");
    }
    test_busy();
    test_threads();
    return tap_done();
}
