/* The binning resource over a host upstream (and over a pool): routing by
 * size (and alignment) to fixed bins, user bins and the upstream; adding and
 * replacing bins; queries, trim; randomized allocate/free with overlap,
 * alignment and content checks; every bad input; release with live blocks;
 * an 8-thread stress test with handoffs and concurrent trims (the short CI
 * form; run it under ThreadSanitizer too, see docs/fixed-binning.md). */
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
#define MiB ((size_t)1 << 20)

static size_t q(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = (size_t)-1;
    rankmem_resource_query(mr, what, &v);
    return v;
}

static void test_bad_input(void)
{
    int fin;
    counting_t *up = counting_new(&fin);
    rankmem_resource_t *mr = (rankmem_resource_t *)&fin; /* sentinel */
    is_status(rankmem_binning_create(NULL, 10, 20, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: NULL upstream");
    is_status(rankmem_binning_create(&up->base, 10, 20, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: NULL output");
    is_status(rankmem_binning_create(&up->base, 7, 20, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: min exponent 7");
    ok(strstr(rankmem_last_error(), "7") != NULL, "names it: %s", rankmem_last_error());
    is_status(rankmem_binning_create(&up->base, 10, 41, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: max exponent 41");
    is_status(rankmem_binning_create(&up->base, 12, 11, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: min above max");
    is_status(rankmem_binning_create(&up->base, -1, 11, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: negative exponent");
    ok(mr == (rankmem_resource_t *)&fin && up->base.refcount == 1 && up->allocs == 0,
       "nothing written, retained or allocated by the failures");

    is_status(rankmem_binning_create(&up->base, 8, 40, &mr), RANKMEM_SUCCESS,
              "create with the widest range, 2^8 .. 2^40");
    ok(up->allocs == 0, "bins take nothing until used");
    rankmem_resource_t *fx;
    rankmem_fixed_create(&up->base, 256, 1, &fx);
    is_status(rankmem_binning_add_bin(NULL, 100, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "add_bin: NULL resource");
    is_status(rankmem_binning_add_bin(fx, 100, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "add_bin: not a binning resource");
    is_status(rankmem_binning_add_bin(mr, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "add_bin: size 0");
    is_status(rankmem_binning_add_bin(mr, ((size_t)1 << 40) + 1, NULL),
              RANKMEM_ERR_INVALID_ARGUMENT, "add_bin: size above 2^40");
    is_status(rankmem_binning_add_bin(mr, 1000, mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "add_bin: itself as a bin");
    is_status(rankmem_binning_add_bin(mr, 1000, fx), RANKMEM_ERR_INVALID_ARGUMENT,
              "add_bin: a fixed bin of blocks smaller than the bin");
    is_status(rankmem_binning_add_bin(mr, 256, fx), RANKMEM_SUCCESS,
              "add_bin: a fixed bin of the user's, blocks as large as the bin");
    ok(fx->refcount == 2, "retained");
    rankmem_resource_t *loop;
    rankmem_pool_create(mr, NULL, &loop);
    is_status(rankmem_binning_add_bin(mr, 1000, loop), RANKMEM_ERR_INVALID_ARGUMENT,
              "add_bin: a bin whose chain leads back to it");
    ok(loop->refcount == 1 && mr->refcount == 2, "no reference taken by the refusals");
    rankmem_resource_release(loop);
    void *p;
    is_status(rankmem_allocate(mr, 0, 0, &p), RANKMEM_ERR_INVALID_ARGUMENT, "allocate 0 bytes");
    is_status(rankmem_deallocate(mr, NULL, 8, 0), RANKMEM_ERR_INVALID_POINTER, "free NULL");
    is_status(rankmem_resource_query(mr, RANKMEM_QUERY_POOL_MAX, &(size_t){0}),
              RANKMEM_ERR_NOT_SUPPORTED, "an unknown query");
    /* A bin of 2^40 bytes exists but the upstream will not give that much. */
    up->fail_above = (size_t)1 << 30;
    is_status(rankmem_allocate(mr, ((size_t)1 << 39) + 1, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY,
              "a request the upstream cannot serve: out of memory");
    up->fail_above = 0;
    rankmem_resource_release(fx);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released");
    ok(up->outstanding_bytes == 0 && up->base.refcount == 1, "nothing outstanding upstream");
    rankmem_resource_release(&up->base);
    ok(fin, "chain gone");
}

static void test_routing(void)
{
    int fin, ufin;
    counting_t *up = counting_new(&fin);
    counting_t *user = counting_new(&ufin);
    rankmem_resource_t *mr;
    if (rankmem_binning_create(&up->base, 10, 22, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("binning_create: %s", rankmem_last_error());
    char desc[96] = "";
    rankmem_resource_describe(mr, desc, sizeof desc, NULL);
    ok(strcmp(desc, "binning(min=2^10,max=2^22)>counting") == 0, "describe: %s", desc);
    void *a, *b, *c, *d, *e;
    rankmem_allocate(mr, 1, 0, &a);
    ok(up->allocs == 1 && up->outstanding_bytes == 2 * MiB,
       "1 byte: the 1 KiB bin takes a 2 MiB batch (%zu bytes)", up->outstanding_bytes);
    rankmem_allocate(mr, 1024, 0, &b);
    ok(up->allocs == 1, "1024 bytes: same bin, no upstream call");
    rankmem_allocate(mr, 1025, 0, &c);
    ok(up->allocs == 2, "1025 bytes: the next bin");
    rankmem_allocate(mr, 4 * MiB, 0, &d);
    ok(up->allocs == 3 && up->outstanding_bytes == 8 * MiB,
       "4 MiB: the largest bin, one block per batch");
    rankmem_allocate(mr, 4 * MiB + 1, 0, &e);
    ok(up->allocs == 4 && up->outstanding_bytes == 12 * MiB + 1,
       "4 MiB + 1: straight from the upstream, exact size");
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == 5 &&
           q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == up->outstanding_bytes,
       "live %zu; reserved %zu = what the upstream gave", q(mr, RANKMEM_QUERY_LIVE_COUNT),
       q(mr, RANKMEM_QUERY_RESERVED_CURRENT));
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 2048 - 2 + 1024 - 1,
       "free blocks: the bins' sum (%zu)", q(mr, RANKMEM_QUERY_FREE_BLOCKS));

    /* Bad frees, small and large. */
    size_t live = q(mr, RANKMEM_QUERY_LIVE_COUNT);
    void *heap = malloc(64);
    is_status(rankmem_deallocate(mr, heap, 10, 0), RANKMEM_ERR_INVALID_POINTER,
              "a foreign pointer (bin size)");
    is_status(rankmem_deallocate(mr, heap, 5 * MiB, 0), RANKMEM_ERR_INVALID_POINTER,
              "a foreign pointer (above the largest bin)");
    is_status(rankmem_deallocate(mr, (char *)a + 256, 10, 0), RANKMEM_ERR_INVALID_POINTER,
              "an interior pointer");
    is_status(rankmem_deallocate(mr, c, 3000, 0), RANKMEM_ERR_INVALID_POINTER,
              "a size larger than the block, routed to another bin");
    ok(strstr(rankmem_last_error(), "3000") != NULL, "says so: %s", rankmem_last_error());
    is_status(rankmem_deallocate(mr, e, 5 * MiB, 0), RANKMEM_ERR_INVALID_POINTER,
              "a large block freed with another size");
    is_status(rankmem_deallocate(mr, a, 5 * MiB, 0), RANKMEM_ERR_INVALID_POINTER,
              "a bin's block freed with a size above the largest bin");
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == live && up->frees == 0, "nothing changed");
    is_status(rankmem_deallocate(mr, e, 4 * MiB + 1, 0), RANKMEM_SUCCESS, "the large free");
    ok(up->frees == 1 && up->outstanding_bytes == 8 * MiB, "went straight back upstream");
    is_status(rankmem_deallocate(mr, e, 4 * MiB + 1, 0), RANKMEM_ERR_INVALID_POINTER,
              "a large double free");
    is_status(rankmem_deallocate(mr, a, 1, 0), RANKMEM_SUCCESS, "a small free");
    is_status(rankmem_deallocate(mr, a, 1, 0), RANKMEM_ERR_INVALID_POINTER, "a small double free");
    free(heap);

    /* Alignment routes as a size: 300 bytes at 4096 come from the 4 KiB bin. */
    void *al;
    is_status(rankmem_allocate(mr, 300, 4096, &al), RANKMEM_SUCCESS, "300 bytes, alignment 4096");
    ok((uintptr_t)al % 4096 == 0 && up->allocs == 5, "aligned, from the 4 KiB bin");
    is_status(rankmem_deallocate(mr, al, 300, 4096), RANKMEM_SUCCESS, "freed the same way");
    is_status(rankmem_allocate(mr, 300, 8 * MiB, &al), RANKMEM_SUCCESS,
              "300 bytes, alignment 8 MiB");
    ok((uintptr_t)al % (8 * MiB) == 0 && up->allocs == 6, "aligned, from the upstream");
    is_status(rankmem_deallocate(mr, al, 300, 8 * MiB), RANKMEM_SUCCESS, "freed");
    /* Freed with another alignment than allocated: found by address. */
    size_t live0 = q(mr, RANKMEM_QUERY_LIVE_COUNT);
    rankmem_allocate(mr, 300, 4096, &al);
    is_status(rankmem_deallocate(mr, al, 300, 0), RANKMEM_SUCCESS,
              "allocated at 4096, freed with alignment 0: found in its bin");
    rankmem_allocate(mr, 300, 0, &al);
    is_status(rankmem_deallocate(mr, al, 300, 4096), RANKMEM_SUCCESS,
              "allocated at 0, freed with alignment 4096: found in its bin");
    rankmem_allocate(mr, 300, 8 * MiB, &al);
    is_status(rankmem_deallocate(mr, al, 300, 0), RANKMEM_SUCCESS,
              "allocated at 8 MiB from the upstream, freed with 0: found in the record");
    is_status(rankmem_deallocate(mr, al, 300, 0), RANKMEM_ERR_INVALID_POINTER,
              "and a second time: refused");
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == live0 && up->outstanding_bytes == 8 * MiB + 2 * MiB,
       "nothing left live by these (%zu bytes outstanding)", up->outstanding_bytes);

    /* A user bin between 2048 and 4096: a pool over its own counting upstream. */
    rankmem_resource_t *ubin;
    rankmem_pool_create(&user->base, NULL, &ubin);
    rankmem_resource_release(&user->base); /* the pool holds it now */
    is_status(rankmem_binning_add_bin(mr, 3000, ubin), RANKMEM_SUCCESS,
              "add a user bin (a pool) for up to 3000 bytes");
    ok(ubin->refcount == 2, "it is retained");
    void *u1, *u2, *n1, *n2;
    rankmem_allocate(mr, 2500, 0, &u1);
    rankmem_allocate(mr, 3000, 0, &u2);
    ok(q(ubin, RANKMEM_QUERY_LIVE_COUNT) == 2, "2500 and 3000 bytes go to it");
    rankmem_allocate(mr, 2048, 0, &n1);
    rankmem_allocate(mr, 3001, 0, &n2);
    ok(q(ubin, RANKMEM_QUERY_LIVE_COUNT) == 2, "2048 and 3001 bytes do not");
    is_status(rankmem_binning_add_bin(mr, 3000, NULL), RANKMEM_ERR_BUSY,
              "replacing a bin with live allocations");
    rankmem_deallocate(mr, u1, 2500, 0);
    rankmem_deallocate(mr, u2, 3000, 0);
    ok(q(ubin, RANKMEM_QUERY_LIVE_COUNT) == 0, "the user bin got its frees");
    size_t before = up->allocs;
    is_status(rankmem_binning_add_bin(mr, 3000, NULL), RANKMEM_SUCCESS,
              "then it is replaced by a fixed bin of 3000 bytes");
    rankmem_allocate(mr, 2999, 0, &u1);
    ok(q(ubin, RANKMEM_QUERY_LIVE_COUNT) == 0 && up->allocs == before + 1,
       "which takes its batch from the upstream");
    is_status(rankmem_binning_add_bin(mr, 100000, NULL), RANKMEM_SUCCESS,
              "a fixed bin of 100000 bytes (not a multiple of 256)");
    rankmem_allocate(mr, 99000, 0, &u2);
    ok(up->allocs == before + 2, "99000 bytes come from it");
    /* A 6000-byte bin (blocks of 6144: 2048-aligned) and alignment 4096. */
    is_status(rankmem_binning_add_bin(mr, 6000, NULL), RANKMEM_SUCCESS, "a bin of 6000 bytes");
    void *x1, *x2;
    rankmem_allocate(mr, 5000, 512, &x1);
    ok(up->allocs == before + 3, "5000 bytes at alignment 512 come from it");
    is_status(rankmem_allocate(mr, 5000, 4096, &x2), RANKMEM_SUCCESS,
              "5000 bytes at alignment 4096");
    ok((uintptr_t)x2 % 4096 == 0 && up->allocs == before + 4,
       "come from the 8 KiB bin, which gives that alignment");
    is_status(rankmem_deallocate(mr, x2, 5000, 4096), RANKMEM_SUCCESS, "and go back there");
    is_status(rankmem_deallocate(mr, x1, 5000, 512), RANKMEM_SUCCESS, "as does the other");
    rankmem_deallocate(mr, u1, 2999, 0);
    rankmem_deallocate(mr, u2, 99000, 0);
    rankmem_deallocate(mr, n1, 2048, 0);
    rankmem_deallocate(mr, n2, 3001, 0);
    rankmem_deallocate(mr, b, 1024, 0);
    rankmem_deallocate(mr, c, 1025, 0);

    /* Trim: keep_bytes is kept across the bins. */
    size_t held = q(mr, RANKMEM_QUERY_RESERVED_CURRENT);
    is_status(rankmem_resource_trim(mr, 5 * MiB), RANKMEM_SUCCESS, "trim keeping 5 MiB");
    size_t kept = q(mr, RANKMEM_QUERY_RESERVED_CURRENT);
    ok(kept >= 5 * MiB && kept < held, "keeps at least 5 MiB of %zu (%zu)", held, kept);
    rankmem_deallocate(mr, d, 4 * MiB, 0);
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim to 0");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 0 && up->outstanding_bytes == 0 &&
           q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0 && q(mr, RANKMEM_QUERY_RESERVED_HIGH) >= 12 * MiB,
       "everything back upstream (peak %zu)", q(mr, RANKMEM_QUERY_RESERVED_HIGH));

    /* Forgetting a stream reaches the bins. */
    rankmem_allocate_async(mr, 5000, 0, S1, &a);
    rankmem_deallocate_async(mr, a, 5000, 0, S1);
    is_status(rankmem_resource_forget_stream(mr, S1), RANKMEM_SUCCESS, "forget a stream");
    rankmem_allocate_async(mr, 5000, 0, NULL, &b);
    ok(a == b, "the bin's block went to the default stream");
    rankmem_deallocate(mr, b, 5000, 0);

    rankmem_resource_release(ubin);
    ok(!ufin, "the user bin lives while binning holds it");
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released");
    ok(ufin, "and is released with it");
    ok(up->outstanding_bytes == 0 && up->base.refcount == 1, "nothing outstanding upstream");
    rankmem_resource_release(&up->base);
    ok(fin, "chain gone");
}

static void test_busy(void)
{
    int fin;
    counting_t *up = counting_new(&fin);
    rankmem_resource_t *mr;
    if (rankmem_binning_create(&up->base, 8, 12, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("binning_create: %s", rankmem_last_error());
    void *p[3];
    rankmem_allocate(mr, 100, 0, &p[0]);
    rankmem_allocate(mr, 4000, 0, &p[1]);
    rankmem_allocate(mr, 100000, 0, &p[2]);
    is_status(rankmem_resource_release(mr), RANKMEM_ERR_BUSY, "release with live blocks");
    ok(up->outstanding_bytes == 0 && up->base.refcount == 1,
       "bins and large blocks went back anyway (%zu bytes outstanding)", up->outstanding_bytes);
    rankmem_resource_release(&up->base);
    ok(fin, "chain gone: nothing leaked");
}

/* ---- randomized ---- */

static size_t up_to_1mib(void *arg, unsigned long long *s)
{
    (void)arg;
    return sh_log_size(s, 1, 1 << 20);
}

static void random_run(const char *what, rankmem_resource_t *upstream, counting_t *count,
                       unsigned long long seed, int steps)
{
    rankmem_resource_t *mr;
    if (rankmem_binning_create(upstream, 9, 18, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("binning_create: %s", rankmem_last_error());
    /* A fixed bin off the powers of two, to route around. */
    if (rankmem_binning_add_bin(mr, 6000, NULL) != RANKMEM_SUCCESS)
        BAIL_OUT("add_bin: %s", rankmem_last_error());
    static const rankmem_stream_t streams[] = {NULL, S1, S2};
    static const size_t aligns[] = {0, 256, 512, 4096};
    sh_seq_config_t cfg = {.mr = mr, .steps = steps, .max_live = 300, .alloc_pct = 52,
                           .seed = seed, .size = up_to_1mib, .aligns = aligns, .naligns = 4,
                           .streams = streams, .nstreams = 3, .other_stream_pct = 20,
                           .hook = sh_seq_hook_trim};
    sh_seq_result_t res;
    sh_seq_run(&cfg, &res);
    long bad = res.errors + res.hook_failures;
    ok(!bad && res.allocs > steps / 3, "%s: %ld allocations, every call succeeded (%ld failures)",
       what, res.allocs, bad);
    ok(!res.overlaps && !res.misaligned && !res.corrupt,
       "%s: no overlap (%ld), misalignment (%ld), corruption (%ld)", what, res.overlaps,
       res.misaligned, res.corrupt);
    ok(!bad && q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0 && q(mr, RANKMEM_QUERY_USED_CURRENT) == 0,
       "%s: all freed", what);
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "%s: trim to 0", what);
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 0 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 0,
       "%s: every bin gave everything back", what);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "%s: released", what);
    if (count)
        ok(count->outstanding_blocks == 0, "%s: nothing outstanding upstream", what);
}

/* ---- threads ---- */

#define NTHREADS 8
#define STEPS 15000

/* Log-uniform 1 B .. 128 KiB; now and then above the largest bin. */
static size_t thread_size(void *arg, unsigned r, unsigned long long *s)
{
    (void)arg;
    if (r % 97 == 0)
        return (1 << 17) + 1 + sh_rng(s) % 4096;
    size_t bytes = (size_t)1 << (sh_rng(s) % 17);
    return bytes + sh_rng(s) % 1024;
}

static void test_threads(void)
{
    int fin;
    counting_t *up = counting_new(&fin);
    rankmem_resource_t *shared;
    if (rankmem_binning_create(&up->base, 8, 17, &shared) != RANKMEM_SUCCESS)
        BAIL_OUT("binning_create: %s", rankmem_last_error());
    sh_config_t cfg = {.mr = shared, .threads = NTHREADS, .steps = STEPS, .live = 48,
                       .seed = 777, .handoff_mod = 5, .take_mod = 7, .size = thread_size,
                       .hook = sh_hook_trim};
    sh_result_t res;
    sh_run(&cfg, &res);
    sh_report(&res, "8 threads, own streams, handoffs, trims", NTHREADS * STEPS / 3);
    ok(q(shared, RANKMEM_QUERY_LIVE_COUNT) == 0, "nothing live at the end");
    is_status(rankmem_resource_trim(shared, 0), RANKMEM_SUCCESS, "trim to 0");
    ok(up->outstanding_bytes == 0, "every bin's batches came back whole (%zu outstanding)",
       up->outstanding_bytes);
    is_status(rankmem_resource_release(shared), RANKMEM_SUCCESS, "released");
    rankmem_resource_release(&up->base);
    ok(fin, "chain gone");
}

/* Issue 31, defect 1, as the issue found it: binning>pool(max=24MiB) over
 * an upstream that fails once while a 4 MiB bin makes a batch. */
static void test_defect1_transient_alignment(void)
{
    flaky_t f = {0};
    rankmem_resource_t *up = flaky_new(&f), *mr = NULL;
    if (!up || rankmem_resource_from_spec_upstream("binning>pool(max=24MiB)", up, &mr) !=
                   RANKMEM_SUCCESS)
        BAIL_OUT("binning>pool(max=24MiB): %s", rankmem_last_error());
    void *a = NULL, *b = NULL;
    is_status(rankmem_allocate(mr, 3 * MiB, 512, &a), RANKMEM_SUCCESS,
              "defect 1: binning>pool: 3 MiB at alignment 512");
    f.fail_at = f.calls + 1;
    is_status(rankmem_allocate(mr, 3 * MiB, 0, &b), RANKMEM_SUCCESS,
              "defect 1: binning>pool: 3 MiB while the upstream fails once");
    ok(f.failed == 1, "defect 1: binning>pool: the upstream did fail (%zu)", f.failed);
    rankmem_deallocate(mr, a, 3 * MiB, 512);
    rankmem_deallocate(mr, b, 3 * MiB, 0);
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "defect 1: binning>pool: trim");
    a = NULL;
    is_status(rankmem_allocate(mr, 3 * MiB, 512, &a), RANKMEM_SUCCESS,
              "defect 1: binning>pool: 3 MiB at alignment 512 after free all and trim");
    if (!a)
        diag("  %s", rankmem_last_error());
    ok(a && (uintptr_t)a % 512 == 0, "defect 1: binning>pool: is 512-aligned");
    void *c[4];
    int all = 1;
    for (int i = 0; i < 4; i++) /* every 1-4 MiB bin */
        if (rankmem_allocate(mr, (size_t)(i + 1) * MiB - 100, 4096, &c[i]) != RANKMEM_SUCCESS ||
            (uintptr_t)c[i] % 4096)
            all = 0;
        else
            rankmem_deallocate(mr, c[i], (size_t)(i + 1) * MiB - 100, 4096);
    ok(all, "defect 1: binning>pool: alignment 4096 from every bin of 1 to 4 MiB");
    rankmem_deallocate(mr, a, 3 * MiB, 512);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "defect 1: binning>pool: released");
    ok(f.live_blocks == 0, "defect 1: binning>pool: nothing outstanding upstream");
    rankmem_resource_release(up);
}

/* Issue 31, defect 2: a free with a wrong size of a block that lies in one of
 * binning's own bins is refused and changes nothing; memory from the
 * upstream (above the largest bin) still goes back. */
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
        if (!up || rankmem_binning_create(up, 8, 22, &mr) != RANKMEM_SUCCESS)
            BAIL_OUT("binning: %s", rankmem_last_error());
        void *p = NULL, *r = NULL, *big = NULL, *k = NULL;
        rankmem_allocate(mr, 4096, 0, &p);
        rankmem_allocate(mr, 4096, 0, &r);
        rankmem_allocate(mr, 5000, 0, &k); /* the 8 KiB bin */
        rankmem_allocate(mr, 8 * MiB, 0, &big); /* above the largest bin: the upstream */
        size_t live = q(mr, RANKMEM_QUERY_LIVE_COUNT), nfree = q(mr, RANKMEM_QUERY_FREE_BLOCKS);
        size_t blocks = f.live_blocks;
        static const struct {
            size_t bytes, alignment;
            const char *what;
        } wrong[] = {{0, 0, "size 0"},
                     {0, 4096, "size 0 at alignment 4096"},
                     {8192, 0, "the size of the next bin"},
                     {4097, 0, "one byte more"},
                     {(size_t)1 << 30, 0, "a size above the largest bin"}};
        for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++)
            is_status(rankmem_deallocate(mr, p, wrong[i].bytes, wrong[i].alignment),
                      RANKMEM_ERR_INVALID_POINTER, "defect 2: binning %s: free of a 4 KiB block with %s",
                      on, wrong[i].what);
        is_status(rankmem_deallocate(mr, k, 100, 0), RANKMEM_ERR_INVALID_POINTER,
                  "defect 2: binning %s: an 8 KiB block freed with 100 bytes", on);
        is_status(rankmem_deallocate(mr, big, 4096, 0), RANKMEM_ERR_INVALID_POINTER,
                  "defect 2: binning %s: the upstream's block freed with a bin's size", on);
        is_status(rankmem_deallocate(mr, big, 0, 0), RANKMEM_ERR_INVALID_POINTER,
                  "defect 2: binning %s: the upstream's block freed with size 0", on);
        ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == live && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == nfree &&
               f.live_blocks == blocks,
           "defect 2: binning %s: nothing changed, upstream included", on);
        is_status(rankmem_deallocate(mr, p, 4096, 0), RANKMEM_SUCCESS,
                  "defect 2: binning %s: the right free afterwards", on);
        is_status(rankmem_deallocate(mr, p, 4096, 0), RANKMEM_ERR_INVALID_POINTER,
                  "defect 2: binning %s: then a double free is refused", on);
        void *a = NULL, *b = NULL;
        rankmem_allocate(mr, 4096, 0, &a);
        rankmem_allocate(mr, 4096, 0, &b);
        ok(a == p && b != p && b != r, "defect 2: binning %s: the block comes back once", on);
        is_status(rankmem_deallocate(mr, k, 5000, 4096), RANKMEM_SUCCESS,
                  "defect 2: binning %s: another alignment than allocate's is still found", on);
        is_status(rankmem_deallocate(mr, big, 8 * MiB, 0), RANKMEM_SUCCESS,
                  "defect 2: binning %s: the upstream's block with its size", on);
        rankmem_deallocate(mr, a, 4096, 0);
        rankmem_deallocate(mr, b, 4096, 0);
        rankmem_deallocate(mr, r, 4096, 0);
        is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS,
                  "defect 2: binning %s: released", on);
        ok(over_system || f.live_blocks == 0, "defect 2: binning %s: the upstream has all back",
           on);
        rankmem_resource_release(up);
    }
}

int main(void)
{
    test_bad_input();
    test_routing();
    test_busy();
    test_defect1_transient_alignment();
    test_defect2_wrong_size();
    static const unsigned long long seeds[] = {11, 12, 13};
    for (int i = 0; i < 3; i++) {
        int fin;
        counting_t *up = counting_new(&fin);
        char name[64];
        snprintf(name, sizeof name, "host, seed %llu", seeds[i]);
        random_run(name, &up->base, up, seeds[i], 12000);
        rankmem_resource_release(&up->base);
        ok(fin, "seed %llu: upstream gone", seeds[i]);
    }
    {
        int fin;
        counting_t *up = counting_new(&fin);
        rankmem_resource_t *pool;
        if (rankmem_pool_create(&up->base, NULL, &pool) != RANKMEM_SUCCESS)
            BAIL_OUT("pool_create: %s", rankmem_last_error());
        random_run("over a pool", pool, NULL, 21, 12000);
        ok(q(pool, RANKMEM_QUERY_LIVE_COUNT) == 0, "the pool has nothing live after");
        is_status(rankmem_resource_release(pool), RANKMEM_SUCCESS, "pool released");
        ok(up->outstanding_bytes == 0, "nothing outstanding upstream");
        rankmem_resource_release(&up->base);
        ok(fin, "chain gone");
    }
    test_threads();
    return tap_done();
}
