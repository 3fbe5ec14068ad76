/* The caching resource (CUB's scheme) over a host upstream and over a pool:
 * bin rounding (exact sizes handed upstream), reuse on the stream that freed
 * a block and across stand-in streams, requests too large to cache, the cap
 * (also across threads' budgets), free all and trim, out of memory -> free the
 * cache -> retry once, randomized allocate/free (fixed seeds) with overlap,
 * alignment and content checks, every bad input, destroy with live blocks,
 * and an 8-thread stress with handoffs (short here; `--long` or
 * RANKMEM_TEST_LONG=1 for the long form). Run it under ThreadSanitizer too
 * (docs/caching.md). */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"
#include "stress_harness.h"

#define S1 ((rankmem_stream_t)(uintptr_t)0x100)
#define S2 ((rankmem_stream_t)(uintptr_t)0x200)
#define S3 ((rankmem_stream_t)(uintptr_t)0x300)

static size_t q(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = (size_t)-1;
    rankmem_resource_query(mr, what, &v);
    return v;
}

static rankmem_resource_t *make(counting_t *up, unsigned growth, unsigned min_bin,
                                unsigned max_bin, size_t cap)
{
    rankmem_caching_params_t prm;
    rankmem_caching_params_default(&prm);
    prm.growth = growth;
    prm.min_bin = min_bin;
    prm.max_bin = max_bin;
    prm.max_cached_bytes = cap;
    rankmem_resource_t *mr = NULL;
    if (rankmem_caching_create(&up->base, &prm, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("caching_create: %s", rankmem_last_error());
    rankmem_resource_release(&up->base); /* the caching resource holds it now */
    return mr;
}

/* What the test expects a request to cost upstream; 0 when not cached. */
static size_t bin_bytes(unsigned growth, unsigned min_bin, unsigned max_bin, size_t n)
{
    size_t b = 1;
    for (unsigned k = 0; k < min_bin; k++)
        b *= growth;
    for (unsigned k = min_bin; b < n; k++) {
        if (k == max_bin)
            return 0;
        b *= growth;
    }
    return b;
}

/* ---- parameters, creation, describe ---- */

static void test_params(void)
{
    rankmem_caching_params_t prm;
    is_status(rankmem_caching_params_default(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "params_default: NULL");
    is_status(rankmem_caching_params_default(&prm), RANKMEM_SUCCESS, "params_default");
    ok(prm.size == sizeof prm && prm.growth == 8 && prm.min_bin == 3 && prm.max_bin == 7 &&
           prm.max_cached_bytes == (6u << 20) - 1,
       "defaults are CUB's: growth 8, bins 8^3..8^7, cap 6 MiB - 1");

    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *none = NULL, *mr = NULL;
    is_status(rankmem_caching_create(NULL, &prm, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL upstream");
    is_status(rankmem_caching_create(&up->base, &prm, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL output");
    static const struct {
        unsigned growth, min_bin, max_bin;
        const char *what, *word;
    } bad[] = {
        {0, 3, 7, "growth 0", "growth"},
        {1, 3, 7, "growth 1", "growth"},
        {8, 8, 7, "min_bin above max_bin", "min_bin"},
        {2, 0, 64, "2^64 overflows", "too large"},
        {10, 0, 20, "10^20 overflows", "too large"},
        {4000000000u, 0, 3, "4e9^3 overflows", "too large"},
        {8, 0, 4000000000u, "max_bin 4e9", "too large"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rankmem_caching_params_t b = prm;
        b.growth = bad[i].growth;
        b.min_bin = bad[i].min_bin;
        b.max_bin = bad[i].max_bin;
        is_status(rankmem_caching_create(&up->base, &b, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: %s", bad[i].what);
        ok(strstr(rankmem_last_error(), bad[i].word) != NULL, "  says why: %s", rankmem_last_error());
    }
    rankmem_caching_params_t b = prm;
    b.size = 0;
    is_status(rankmem_caching_create(&up->base, &b, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: params.size not set");
    ok(strstr(rankmem_last_error(), "params.size") != NULL, "  says so: %s", rankmem_last_error());
    b.size = sizeof b + 8;
    is_status(rankmem_caching_create(&up->base, &b, &none), RANKMEM_ERR_INVALID_ARGUMENT, "create: params.size too large");
    ok(none == NULL && up->base.refcount == 1 && up->allocs == 0, "failed creations hold nothing");

    b = prm;
    b.growth = 2, b.min_bin = 0, b.max_bin = 63;
    is_status(rankmem_caching_create(&up->base, &b, &mr), RANKMEM_SUCCESS, "create: 64 bins, 1 B .. 2^63 (the most that fit)");
    void *p = NULL;
    is_status(rankmem_allocate(mr, 3000, 0, &p), RANKMEM_SUCCESS, "  allocates");
    ok(up->outstanding_bytes == 4096, "  rounded up to 2^12 (%zu)", up->outstanding_bytes);
    rankmem_deallocate(mr, p, 3000, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "  released");
    ok(up->outstanding_blocks == 0 && up->base.refcount == 1, "  and gave everything back");

    is_status(rankmem_caching_create(&up->base, NULL, &mr), RANKMEM_SUCCESS, "create with NULL params: the defaults");
    char buf[256];
    is_status(rankmem_resource_describe(mr, buf, sizeof buf, NULL), RANKMEM_SUCCESS, "describe");
    ok(strcmp(buf, "caching>counting") == 0, "  defaults are not spelled out: %s", buf);
    const char *name = NULL;
    unsigned props = 0;
    rankmem_resource_name(mr, &name);
    rankmem_resource_properties(mr, &props);
    ok(name && strcmp(name, "caching") == 0, "named caching");
    ok(props == (RANKMEM_PROP_HOST_ACCESSIBLE | RANKMEM_PROP_STREAM_ORDERED),
       "host-accessible like its upstream, and stream-ordered (%#x)", props);
    rankmem_resource_release(mr);

    b = prm;
    b.growth = 4, b.min_bin = 5, b.max_bin = 9, b.max_cached_bytes = 1 << 20;
    rankmem_caching_create(&up->base, &b, &mr);
    rankmem_resource_describe(mr, buf, sizeof buf, NULL);
    ok(strcmp(buf, "caching(growth=4,min=5,max=9,cap=1MiB)>counting") == 0, "describe says what differs: %s", buf);
    rankmem_resource_release(mr);
    b = prm;
    b.max_cached_bytes = SIZE_MAX;
    rankmem_caching_create(&up->base, &b, &mr);
    rankmem_resource_describe(mr, buf, sizeof buf, NULL);
    ok(strcmp(buf, "caching(cap=18446744073709551615)>counting") == 0, "no cap is SIZE_MAX: %s", buf);
    rankmem_resource_release(mr);
    b = prm;
    b.max_cached_bytes = 0;
    rankmem_caching_create(&up->base, &b, &mr);
    rankmem_resource_describe(mr, buf, sizeof buf, NULL);
    ok(strcmp(buf, "caching(cap=0)>counting") == 0, "cap 0 (cache nothing): %s", buf);
    rankmem_resource_release(mr);
    rankmem_resource_release(&up->base);
    ok(finalized, "upstream gone");
}

/* ---- bins ---- */

static void check_bins(unsigned growth, unsigned min_bin, unsigned max_bin, const size_t *req,
                       const size_t *want, int n)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *mr = make(up, growth, min_bin, max_bin, SIZE_MAX);
    void *p[16];
    int exact = 1, one_call = 1;
    size_t reserved = 0, used = 0, cached = 0, uncached = 0;
    for (int i = 0; i < n; i++) {
        size_t before = up->outstanding_bytes, calls = up->allocs;
        if (rankmem_allocate(mr, req[i], 0, &p[i]) != RANKMEM_SUCCESS)
            BAIL_OUT("allocate %zu: %s", req[i], rankmem_last_error());
        memset(p[i], 0x5a, req[i]);
        if (up->outstanding_bytes - before != want[i]) {
            exact = 0;
            diag("  %zu bytes: upstream got %zu, want %zu", req[i], up->outstanding_bytes - before, want[i]);
        }
        one_call &= up->allocs == calls + 1;
        reserved += want[i];
        used += req[i];
        if (bin_bytes(growth, min_bin, max_bin, req[i]))
            cached++;
        else
            uncached++;
    }
    ok(exact, "growth %u, bins %u..%u: each request is rounded up to its bin exactly (above the largest: as asked)",
       growth, min_bin, max_bin);
    ok(one_call, "  one upstream call per request");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == reserved && q(mr, RANKMEM_QUERY_RESERVED_HIGH) == reserved,
       "  reserved = the bins' bytes (%zu)", reserved);
    ok(q(mr, RANKMEM_QUERY_USED_CURRENT) == used && q(mr, RANKMEM_QUERY_LIVE_COUNT) == (size_t)n,
       "  used = the bytes asked for (%zu), %d live", used, n);
    for (int i = 0; i < n; i++)
        rankmem_deallocate(mr, p[i], req[i], 0);
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == cached && up->frees == uncached,
       "  freed: %zu cached, %zu back upstream", cached, uncached);
    ok(q(mr, RANKMEM_QUERY_USED_CURRENT) == 0 && q(mr, RANKMEM_QUERY_USED_HIGH) == used, "  used high-water mark");
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "  released");
    ok(finalized, "  the chain is gone");
}

static void test_bins(void)
{
    static const size_t r8[] = {1, 256, 512, 513, 4096, 4097, 32768, 200000, 262145, 2097152, 2097153, 5000000};
    static const size_t w8[] = {512, 512, 512, 4096, 4096, 32768, 32768, 262144, 2097152, 2097152, 2097153, 5000000};
    check_bins(8, 3, 7, r8, w8, 12);
    static const size_t r10[] = {1, 100, 101, 1000, 99999, 100000, 100001};
    static const size_t w10[] = {100, 100, 1000, 1000, 100000, 100000, 100001};
    check_bins(10, 2, 5, r10, w10, 7); /* not a power of two */
    static const size_t r2[] = {1, 256, 257, 511, (size_t)1 << 20, ((size_t)1 << 20) + 1};
    static const size_t w2[] = {256, 256, 512, 512, (size_t)1 << 20, ((size_t)1 << 20) + 1};
    check_bins(2, 8, 20, r2, w2, 6);
    static const size_t r4[] = {1, 2, 3, 5, 17, 64, 65};
    static const size_t w4[] = {1, 4, 4, 16, 64, 64, 65};
    check_bins(4, 0, 3, r4, w4, 7); /* 4^0 = 1 byte; 65 > 4^3 is not cached */
}

/* ---- reuse ---- */

static void test_reuse(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *mr = make(up, 8, 3, 7, (6u << 20) - 1);
    void *p = NULL, *p2 = NULL, *x = NULL;
    rankmem_allocate_async(mr, 1000, 0, S1, &p);
    is_status(rankmem_deallocate_async(mr, p, 1000, 0, S1), RANKMEM_SUCCESS, "free on S1");
    ok(up->frees == 0 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 1, "the block is cached, not given back");
    is_status(rankmem_allocate_async(mr, 900, 0, S1, &p2), RANKMEM_SUCCESS, "allocate 900 B on S1");
    ok(p2 == p && up->allocs == 1, "same bin, same stream: the same block, no upstream call");
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 0 && q(mr, RANKMEM_QUERY_LIVE_COUNT) == 1, "it left the cache");
    rankmem_deallocate_async(mr, p2, 900, 0, S1);
    rankmem_allocate_async(mr, 100, 0, S1, &x);
    ok(x != p && up->allocs == 2, "a smaller bin does not take a larger bin's block (as CUB)");
    rankmem_deallocate_async(mr, x, 100, 0, S1);
    is_status(rankmem_allocate_async(mr, 4000, 0, S2, &p2), RANKMEM_SUCCESS, "allocate on S2");
    ok(p2 == p && up->allocs == 2, "over host memory a block freed on S1 serves S2 at once (streams are labels)");
    rankmem_deallocate_async(mr, p2, 4000, 0, S2);

    /* Each stream gets back what it freed itself first. */
    void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    rankmem_allocate_async(mr, 4096, 0, S1, &a);
    rankmem_allocate_async(mr, 4096, 0, S1, &b);
    rankmem_deallocate_async(mr, a, 4096, 0, S1);
    rankmem_deallocate_async(mr, b, 4096, 0, S3);
    rankmem_allocate_async(mr, 4096, 0, S1, &c);
    rankmem_allocate_async(mr, 4096, 0, S3, &d);
    ok(c == a && d == b, "a stream is served from its own frees first (S1 gets a, S3 gets b)");
    rankmem_deallocate_async(mr, c, 4096, 0, S1);
    rankmem_deallocate_async(mr, d, 4096, 0, S3);
    size_t allocs = up->allocs;
    void *e = NULL;
    rankmem_allocate(mr, 4096, 0, &e);
    ok(up->allocs == allocs && (e == a || e == b || e == p), "the default stream takes another stream's block");
    rankmem_deallocate(mr, e, 4096, 0);

    /* A larger alignment than the cached blocks have. */
    int good = 1;
    void *al[8];
    for (int i = 0; i < 8; i++) {
        if (rankmem_allocate_async(mr, 3000, 65536, S1, &al[i]) != RANKMEM_SUCCESS)
            good = 0;
        else
            good &= ((uintptr_t)al[i] & 65535) == 0;
    }
    ok(good, "requests with 64 KiB alignment get it, from the cache or not");
    for (int i = 0; i < 8; i++)
        rankmem_deallocate_async(mr, al[i], 3000, 65536, S1);
    good = 1;
    for (int i = 0; i < 8; i++) {
        rankmem_allocate_async(mr, 3000, 65536, S1, &al[i]);
        good &= ((uintptr_t)al[i] & 65535) == 0;
    }
    ok(good, "and again once those are cached");
    for (int i = 0; i < 8; i++)
        rankmem_deallocate_async(mr, al[i], 3000, 65536, S1);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released");
    ok(finalized, "the chain is gone");
}

/* A thread caches a block; another thread (another shard) reuses it. */
static rankmem_resource_t *xs_mr;
static void *xs_ptr;

static void *xs_cache(void *arg)
{
    (void)arg;
    rankmem_allocate_async(xs_mr, 20000, 0, S1, &xs_ptr);
    rankmem_deallocate_async(xs_mr, xs_ptr, 20000, 0, S1);
    return NULL;
}

static void test_cross_thread(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    xs_mr = make(up, 8, 3, 7, (6u << 20) - 1);
    pthread_t t;
    pthread_create(&t, NULL, xs_cache, NULL);
    pthread_join(t, NULL);
    void *p = NULL;
    rankmem_allocate_async(xs_mr, 30000, 0, S1, &p);
    ok(p == xs_ptr && up->allocs == 1, "a block cached by another thread is found before asking upstream");
    rankmem_deallocate_async(xs_mr, p, 30000, 0, S2);
    pthread_create(&t, NULL, xs_cache, NULL);
    pthread_join(t, NULL);
    ok(xs_ptr == p && up->allocs == 1, "and back again, across streams too");
    rankmem_resource_release(xs_mr);
    ok(finalized, "released");
}

/* ---- not cached ---- */

static void test_uncached(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *mr = make(up, 8, 3, 7, (6u << 20) - 1);
    void *p = NULL;
    is_status(rankmem_allocate_async(mr, 3 << 20, 0, S1, &p), RANKMEM_SUCCESS, "3 MiB (above the 2 MiB bin)");
    ok(up->allocs == 1 && up->outstanding_bytes == 3 << 20, "asked upstream for exactly 3 MiB");
    memset(p, 1, 3 << 20);
    rankmem_deallocate_async(mr, p, 3 << 20, 0, S1);
    ok(up->frees == 1 && up->outstanding_blocks == 0, "and given straight back on free");
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 0 && q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 0 &&
           q(mr, RANKMEM_QUERY_RESERVED_HIGH) == 3 << 20,
       "nothing cached, nothing reserved; the high-water mark remembers it");
    rankmem_allocate_async(mr, 3 << 20, 0, S1, &p);
    ok(up->allocs == 2, "the next one goes upstream again");
    rankmem_deallocate_async(mr, p, 3 << 20, 0, S1);
    rankmem_resource_release(mr);
    ok(finalized, "released");
}

/* ---- the cap ---- */

static void test_cap(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *mr = make(up, 8, 3, 7, 3 * 4096);
    void *p[5];
    for (int i = 0; i < 5; i++)
        rankmem_allocate(mr, 4000, 0, &p[i]);
    for (int i = 0; i < 5; i++)
        rankmem_deallocate(mr, p[i], 4000, 0);
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 3 && up->frees == 2,
       "cap 12 KiB: three 4 KiB blocks cached, the frees past the cap went upstream (%zu)", up->frees);
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 3 * 4096, "12 KiB reserved");
    void *big = NULL;
    rankmem_allocate(mr, 20000, 0, &big);
    rankmem_deallocate(mr, big, 20000, 0);
    ok(up->frees == 3, "a 32 KiB block never fits a 12 KiB cap");
    size_t allocs = up->allocs;
    for (int i = 0; i < 3; i++)
        rankmem_allocate(mr, 4000, 0, &p[i]);
    ok(up->allocs == allocs, "the three cached blocks serve again");
    for (int i = 0; i < 3; i++)
        rankmem_deallocate(mr, p[i], 4000, 0);
    rankmem_resource_release(mr);

    up = counting_new(&finalized);
    mr = make(up, 8, 3, 7, 0);
    rankmem_allocate(mr, 100, 0, &p[0]);
    rankmem_deallocate(mr, p[0], 100, 0);
    ok(up->frees == 1 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 0, "cap 0: nothing is cached");
    rankmem_resource_release(mr);

    up = counting_new(&finalized);
    mr = make(up, 8, 3, 7, (6u << 20) - 1);
    for (int i = 0; i < 3; i++)
        rankmem_allocate(mr, 2 << 20, 0, &p[i]);
    for (int i = 0; i < 3; i++)
        rankmem_deallocate(mr, p[i], 2 << 20, 0);
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 2 && up->frees == 1,
       "CUB's default cap (6 MiB - 1) keeps two 2 MiB blocks, not three");
    rankmem_resource_release(mr);

    up = counting_new(&finalized);
    mr = make(up, 8, 3, 7, SIZE_MAX);
    void *many[100];
    for (int i = 0; i < 100; i++)
        rankmem_allocate(mr, 4096, 0, &many[i]);
    for (int i = 0; i < 100; i++)
        rankmem_deallocate(mr, many[i], 4096, 0);
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 100 && up->frees == 0, "no cap (SIZE_MAX): everything is cached");
    rankmem_resource_release(mr);
    ok(finalized, "released");
}

/* The cap is one for all threads: a thread's unused budget serves another's frees. */
static rankmem_resource_t *cap_mr;
static void *cap_a[3];

static void *cap_thread_a(void *arg)
{
    (void)arg;
    for (int i = 0; i < 3; i++)
        rankmem_allocate(cap_mr, 4096, 0, &cap_a[i]);
    for (int i = 0; i < 3; i++)
        rankmem_deallocate(cap_mr, cap_a[i], 4096, 0);
    for (int i = 0; i < 3; i++) /* the cache is empty again; this thread's budget is unused */
        rankmem_allocate(cap_mr, 4096, 0, &cap_a[i]);
    return NULL;
}

static void *cap_thread_b(void *arg)
{
    (void)arg;
    void *p[4];
    for (int i = 0; i < 4; i++)
        rankmem_allocate(cap_mr, 4096, 0, &p[i]);
    for (int i = 0; i < 4; i++)
        rankmem_deallocate(cap_mr, p[i], 4096, 0);
    return NULL;
}

static void *cap_thread_c(void *arg)
{
    (void)arg;
    for (int i = 0; i < 3; i++)
        rankmem_deallocate(cap_mr, cap_a[i], 4096, 0);
    return NULL;
}

static void test_cap_threads(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    cap_mr = make(up, 8, 3, 7, 3 * 4096);
    pthread_t t;
    pthread_create(&t, NULL, cap_thread_a, NULL);
    pthread_join(t, NULL);
    ok(q(cap_mr, RANKMEM_QUERY_FREE_BLOCKS) == 0 && up->frees == 0, "thread A cached three blocks and took them back");
    pthread_create(&t, NULL, cap_thread_b, NULL);
    pthread_join(t, NULL);
    ok(q(cap_mr, RANKMEM_QUERY_FREE_BLOCKS) == 3 && up->frees == 1,
       "thread B caches three of its four frees: A's unused budget moved to B (%zu upstream)", up->frees);
    pthread_create(&t, NULL, cap_thread_c, NULL);
    pthread_join(t, NULL);
    ok(q(cap_mr, RANKMEM_QUERY_FREE_BLOCKS) == 3 && up->frees == 4,
       "A's blocks freed later go upstream: the cap is full (%zu upstream)", up->frees);
    ok(q(cap_mr, RANKMEM_QUERY_RESERVED_CURRENT) == 3 * 4096, "12 KiB cached in all");
    rankmem_resource_release(cap_mr);
    ok(finalized, "released");
}

/* ---- free all, trim ---- */

static void test_free_all_trim(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *mr = make(up, 8, 3, 7, SIZE_MAX);
    void *p[6], *live = NULL;
    rankmem_allocate(mr, 512, 0, &live);
    for (int i = 0; i < 6; i++)
        rankmem_allocate_async(mr, i < 4 ? 4096 : 30000, 0, i % 2 ? S1 : S2, &p[i]);
    for (int i = 0; i < 6; i++)
        rankmem_deallocate_async(mr, p[i], i < 4 ? 4096 : 30000, 0, i % 2 ? S1 : S2);
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 6, "six blocks cached on two streams");
    is_status(rankmem_caching_free_all(mr), RANKMEM_SUCCESS, "free_all");
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 0 && up->frees == 6 && up->outstanding_blocks == 1 &&
           q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 512,
       "every cached block went back; the live one stayed");
    void *a = NULL, *b = NULL;
    rankmem_allocate_async(mr, 4096, 0, S1, &a);
    rankmem_deallocate_async(mr, a, 4096, 0, S1);
    rankmem_allocate_async(mr, 4096, 0, S1, &b);
    ok(a == b, "caching works again after free_all");
    rankmem_deallocate_async(mr, b, 4096, 0, S1);

    rankmem_resource_t *lim = NULL;
    rankmem_limit_create(mr, 1 << 30, &lim);
    is_status(rankmem_caching_free_all(lim), RANKMEM_SUCCESS, "free_all on a chain (limit>caching>counting)");
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 0 && up->outstanding_blocks == 1, "reaches the caching resource below");
    rankmem_resource_release(lim);
    is_status(rankmem_caching_free_all(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "free_all: NULL");
    is_status(rankmem_caching_free_all(&up->base), RANKMEM_ERR_INVALID_ARGUMENT, "free_all: no caching resource in the chain");
    ok(strstr(rankmem_last_error(), "counting") != NULL, "  says which chain: %s", rankmem_last_error());

    for (int i = 0; i < 4; i++)
        rankmem_allocate(mr, 4096, 0, &p[i]);
    for (int i = 0; i < 4; i++)
        rankmem_deallocate(mr, p[i], 4096, 0);
    is_status(rankmem_resource_trim(mr, 512 + 8192), RANKMEM_SUCCESS, "trim to 8.5 KiB");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 512 + 8192 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 2,
       "two cached blocks went back, two stayed (%zu reserved)", q(mr, RANKMEM_QUERY_RESERVED_CURRENT));
    is_status(rankmem_resource_trim(mr, 1 << 30), RANKMEM_SUCCESS, "trim above what is held");
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 2, "  gives nothing back");
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim to 0");
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 512 && up->outstanding_blocks == 1, "  only the live block is held");
    rankmem_deallocate(mr, live, 512, 0);
    rankmem_resource_release(mr);
    ok(finalized, "released");
}

/* ---- out of memory ---- */

/* An upstream that refuses the next `fail_next` requests, counting attempts. */
typedef struct {
    rankmem_resource_t base;
    int fail_next;
    int attempts;
    size_t outstanding;
} flaky_t;

static rankmem_status_t flaky_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    (void)stream;
    flaky_t *f = (flaky_t *)mr;
    f->attempts++;
    if (f->fail_next > 0) {
        f->fail_next--;
        return RANKMEM_ERR_OUT_OF_MEMORY;
    }
    if (posix_memalign(ptr_p, alignment, bytes))
        return RANKMEM_ERR_OUT_OF_MEMORY;
    f->outstanding++;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t flaky_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                         size_t alignment, rankmem_stream_t stream)
{
    (void)bytes, (void)alignment, (void)stream;
    free(ptr);
    ((flaky_t *)mr)->outstanding--;
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t flaky_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "flaky",
    .allocate = flaky_allocate,
    .deallocate = flaky_deallocate,
};

static void test_oom(void)
{
    /* 1. Exactly one retry, after the cache was given back. */
    flaky_t fl;
    memset(&fl, 0, sizeof fl);
    rankmem_resource_init(&fl.base, &flaky_ops, RANKMEM_PROP_HOST_ACCESSIBLE, NULL);
    rankmem_resource_t *mr = NULL;
    rankmem_caching_create(&fl.base, NULL, &mr);
    void *p[3];
    for (int i = 0; i < 3; i++)
        rankmem_allocate(mr, 4096, 0, &p[i]);
    rankmem_deallocate(mr, p[0], 4096, 0);
    rankmem_deallocate(mr, p[1], 4096, 0);
    fl.attempts = 0;
    fl.fail_next = 1;
    void *x = NULL;
    is_status(rankmem_allocate(mr, 100, 0, &x), RANKMEM_SUCCESS, "the upstream refuses once: the retry succeeds");
    ok(fl.attempts == 2 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 0 && fl.outstanding == 2,
       "  after the two cached blocks went back (%d attempts)", fl.attempts);
    rankmem_deallocate(mr, x, 100, 0);
    fl.attempts = 0;
    fl.fail_next = 2;
    is_status(rankmem_allocate(mr, 20000, 0, &x), RANKMEM_ERR_OUT_OF_MEMORY, "the upstream refuses twice: out of memory");
    ok(fl.attempts == 2, "  it was tried exactly twice (%d)", fl.attempts);
    ok(strstr(rankmem_last_error(), "caching") && strstr(rankmem_last_error(), "flaky") &&
           !strchr(rankmem_last_error(), '('),
       "  the detail names both (flaky says nothing more): %s", rankmem_last_error());
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == 1 && fl.outstanding == 1, "  nothing changed but the cache");
    rankmem_deallocate(mr, p[2], 4096, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released");
    ok(fl.outstanding == 0 && fl.base.refcount == 1, "  everything back in the upstream");

    /* 2. A limit adaptor below: the cache holds what the limit needs. */
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *lim = NULL;
    rankmem_limit_create(&up->base, 4 * 4096, &lim);
    rankmem_resource_release(&up->base);
    rankmem_caching_create(lim, NULL, &mr);
    rankmem_resource_release(lim);
    void *b[4];
    for (int i = 0; i < 4; i++)
        rankmem_allocate(mr, 4096, 0, &b[i]);
    rankmem_deallocate(mr, b[0], 4096, 0);
    rankmem_deallocate(mr, b[1], 4096, 0);
    size_t allocs = up->allocs;
    is_status(rankmem_allocate(mr, 300, 0, &x), RANKMEM_SUCCESS, "limit reached: the cache is freed and the request retried");
    ok(up->frees == 2 && up->allocs == allocs + 1 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 0,
       "  the two cached blocks went back, one new allocation");
    void *y = NULL;
    is_status(rankmem_allocate(mr, 30000, 0, &y), RANKMEM_ERR_LIMIT, "past the limit with nothing cached: the limit's status");
    ok(strstr(rankmem_last_error(), "caching") && strstr(rankmem_last_error(), "limit: allocate of 32768"),
       "  with the limit's words: %s", rankmem_last_error());
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == 3 && up->allocs == allocs + 1, "  nothing changed");
    rankmem_deallocate(mr, x, 300, 0);
    rankmem_deallocate(mr, b[2], 4096, 0);
    rankmem_deallocate(mr, b[3], 4096, 0);
    rankmem_resource_release(mr);
    ok(finalized, "  released");

    /* 3. Over a bounded pool. */
    up = counting_new(&finalized);
    rankmem_pool_params_t pp;
    rankmem_pool_params_default(&pp);
    pp.initial_size = pp.maximum_size = 1 << 20;
    rankmem_resource_t *pool = NULL;
    rankmem_pool_create(&up->base, &pp, &pool);
    rankmem_resource_release(&up->base);
    rankmem_caching_create(pool, NULL, &mr);
    rankmem_resource_release(pool);
    for (int i = 0; i < 4; i++)
        is_status(rankmem_allocate(mr, 200000, 0, &b[i]), RANKMEM_SUCCESS, "pool: 256 KiB block %d", i);
    rankmem_deallocate(mr, b[0], 200000, 0);
    rankmem_deallocate(mr, b[1], 200000, 0);
    is_status(rankmem_allocate(mr, 20000, 0, &x), RANKMEM_SUCCESS, "pool full: the cache goes back to the pool, then it fits");
    ok(q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 0 && q(pool, RANKMEM_QUERY_LIVE_COUNT) == 3,
       "  the pool holds the three live blocks only");
    is_status(rankmem_allocate(mr, 600000, 0, &y), RANKMEM_ERR_OUT_OF_MEMORY, "more than the pool has left: out of memory");
    rankmem_deallocate(mr, x, 20000, 0);
    rankmem_deallocate(mr, b[2], 200000, 0);
    rankmem_deallocate(mr, b[3], 200000, 0);
    ok(q(pool, RANKMEM_QUERY_USED_CURRENT) == q(mr, RANKMEM_QUERY_RESERVED_CURRENT),
       "  the pool's used bytes are the cache's reserved bytes");
    rankmem_resource_release(mr);
    ok(finalized, "  released, the pool and its upstream too");
}

/* ---- randomized ---- */

typedef struct {
    unsigned growth, min_bin, max_bin;
    size_t cap, max_req;
    rankmem_resource_t *below; /* the pool under the cache, or NULL */
    counting_t *up;
    long over_cap, books;
} books_t;

static size_t up_to_max_req(void *arg, unsigned long long *s)
{
    return sh_log_size(s, 1, ((const books_t *)arg)->max_req);
}

/* Every 64 steps, the books against the live blocks: what the cache holds
 * is what is live (in whole bins) plus at most the cap, and it is what the
 * upstream lent; used bytes and live count exact. Every 5000 steps a trim. */
static int check_books(void *arg, rankmem_resource_t *mr, long step, const sh_live_t *live,
                       int n)
{
    books_t *k = arg;
    int books = step >= 0 && step % 64 == 0, trim = step >= 0 && step % 5000 == 4999;
    if (!books && !trim)
        return 0;
    size_t live_bins = 0, used = 0;
    for (int i = 0; i < n; i++) {
        size_t bb = bin_bytes(k->growth, k->min_bin, k->max_bin, live[i].b.n);
        live_bins += bb ? bb : live[i].b.n;
        used += live[i].b.n;
    }
    if (books) {
        size_t reserved = q(mr, RANKMEM_QUERY_RESERVED_CURRENT);
        if (reserved < live_bins || reserved - live_bins > k->cap)
            k->over_cap++;
        size_t below_used = k->below ? q(k->below, RANKMEM_QUERY_USED_CURRENT)
                                     : k->up->outstanding_bytes;
        if (below_used != reserved || q(mr, RANKMEM_QUERY_USED_CURRENT) != used ||
            q(mr, RANKMEM_QUERY_LIVE_COUNT) != (size_t)n)
            k->books++;
    }
    if (trim) /* to 0, or to half the cap above what is live */
        rankmem_resource_trim(mr, step % 10000 == 9999 ? 0 : live_bins + k->cap / 2);
    return 0;
}

static void random_run(unsigned long long seed, int over_pool, unsigned growth, unsigned min_bin,
                       unsigned max_bin, size_t cap, size_t max_req, int steps)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *below = &up->base, *pool = NULL;
    if (over_pool) {
        rankmem_pool_create(&up->base, NULL, &pool);
        rankmem_resource_release(&up->base);
        below = pool;
    }
    rankmem_caching_params_t prm;
    rankmem_caching_params_default(&prm);
    prm.growth = growth, prm.min_bin = min_bin, prm.max_bin = max_bin, prm.max_cached_bytes = cap;
    rankmem_resource_t *mr = NULL;
    if (rankmem_caching_create(below, &prm, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("caching_create: %s", rankmem_last_error());
    rankmem_resource_release(below);
    static const rankmem_stream_t streams[] = {NULL, S1, S2, S3};
    static const size_t aligns[] = {0, 256, 512, 4096, 65536};
    books_t k = {growth, min_bin, max_bin, cap, max_req, pool, up, 0, 0};
    /* Freed on the stream it was used on, or (one in four) on another one. */
    sh_seq_config_t cfg = {.mr = mr, .steps = steps, .max_live = 512, .alloc_pct = 52,
                           .seed = seed, .size = up_to_max_req, .aligns = aligns, .naligns = 5,
                           .streams = streams, .nstreams = 4, .other_stream_pct = 25,
                           .hook = check_books, .arg = &k};
    sh_seq_result_t res;
    sh_seq_run(&cfg, &res);
    const char *where = over_pool ? "pool" : "host";
    ok(res.errors == 0, "seed %llu over %s: every call succeeded (%ld failures)", seed, where,
       res.errors);
    ok(res.overlaps == 0, "seed %llu: no two live blocks overlap (%ld)", seed, res.overlaps);
    ok(res.misaligned == 0, "seed %llu: every block has its alignment (%ld)", seed,
       res.misaligned);
    ok(res.corrupt == 0, "seed %llu: contents survive until freed (%ld)", seed, res.corrupt);
    ok(k.over_cap == 0, "seed %llu: cached bytes never above the cap of %zu (%ld)", seed, cap,
       k.over_cap);
    ok(k.books == 0, "seed %llu: reserved = what the upstream lent, used and live counts exact (%ld)",
       seed, k.books);
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0 && q(mr, RANKMEM_QUERY_USED_CURRENT) == 0,
       "seed %llu: nothing live at the end", seed);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "seed %llu: released", seed);
    ok(finalized, "seed %llu: the chain is gone, upstream included", seed);
}

/* ---- bad inputs, destroy with live blocks ---- */

static void test_bad_inputs(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *mr = make(up, 8, 3, 7, (6u << 20) - 1);
    rankmem_resource_retain(&up->base); /* to look at it after the caching resource is gone */
    void *p = NULL, *p2 = NULL, *big = NULL;
    is_status(rankmem_allocate(mr, 0, 0, &p), RANKMEM_ERR_INVALID_ARGUMENT, "0 bytes");
    is_status(rankmem_allocate(mr, SIZE_MAX, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY, "SIZE_MAX bytes");
    is_status(rankmem_allocate(mr, SIZE_MAX / 4, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY, "more than the host has");
    ok(strstr(rankmem_last_error(), "caching") != NULL, "  the detail names the cache: %s", rankmem_last_error());
    is_status(rankmem_allocate(mr, 100, 100, &p), RANKMEM_ERR_INVALID_ARGUMENT, "alignment 100");
    is_status(rankmem_allocate(mr, 100, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "NULL output");
    is_status(rankmem_allocate(NULL, 100, 0, &p), RANKMEM_ERR_INVALID_ARGUMENT, "NULL resource");
    ok(up->outstanding_blocks == 0 && q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0, "the refusals left nothing behind");
    is_status(rankmem_allocate(mr, 1000, 0, &p), RANKMEM_SUCCESS, "allocate");
    memset(p, 7, 1000);
    is_status(rankmem_allocate(mr, 1000, 0, &p2), RANKMEM_SUCCESS, "allocate another");
    memset(p2, 9, 1000);
    is_status(rankmem_allocate(mr, 3 << 20, 0, &big), RANKMEM_SUCCESS, "allocate one too large to cache");
    is_status(rankmem_deallocate(mr, p, 999, 0), RANKMEM_ERR_INVALID_POINTER, "wrong size");
    ok(strstr(rankmem_last_error(), "999") && strstr(rankmem_last_error(), "1000"), "  says both sizes: %s", rankmem_last_error());
    is_status(rankmem_deallocate(mr, big, 3 << 19, 0), RANKMEM_ERR_INVALID_POINTER, "wrong size of an uncached block");
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == 3 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 0 && up->frees == 0,
       "  the blocks are still live, nothing cached or given back");
    is_status(rankmem_deallocate(mr, (char *)p + 256, 744, 0), RANKMEM_ERR_INVALID_POINTER, "interior pointer");
    char foreign[512];
    is_status(rankmem_deallocate(mr, foreign, 512, 0), RANKMEM_ERR_INVALID_POINTER, "foreign pointer");
    ok(strstr(rankmem_last_error(), "not a live allocation") != NULL, "  says so: %s", rankmem_last_error());
    is_status(rankmem_deallocate(mr, NULL, 512, 0), RANKMEM_ERR_INVALID_POINTER, "NULL pointer");
    is_status(rankmem_deallocate(mr, p, 1000, 100), RANKMEM_ERR_INVALID_ARGUMENT, "free with alignment 100");
    is_status(rankmem_deallocate(NULL, p, 1000, 0), RANKMEM_ERR_INVALID_ARGUMENT, "free through NULL");
    is_status(rankmem_deallocate(mr, p, 1000, 0), RANKMEM_SUCCESS, "the right free");
    is_status(rankmem_deallocate(mr, p, 1000, 0), RANKMEM_ERR_INVALID_POINTER, "double free (of a cached block)");
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == 2 && q(mr, RANKMEM_QUERY_FREE_BLOCKS) == 1,
       "  changed nothing: 2 live, 1 cached");
    is_status(rankmem_deallocate(mr, big, 3 << 20, 0), RANKMEM_SUCCESS, "free the large block");
    is_status(rankmem_deallocate(mr, big, 3 << 20, 0), RANKMEM_ERR_INVALID_POINTER, "double free (of a block given back)");
    void *p3 = NULL, *p4 = NULL;
    rankmem_allocate(mr, 1000, 0, &p3);
    rankmem_allocate(mr, 1000, 0, &p4);
    ok(p3 != p4 && p3 != p2 && p4 != p2, "no block is handed out twice after the bad frees");
    unsigned char *c = p2;
    int same = 1;
    for (int i = 0; i < 1000; i++)
        same &= c[i] == 9;
    ok(same, "the neighbour's contents are untouched");
    size_t v;
    is_status(rankmem_resource_query(mr, (rankmem_query_t)77, &v), RANKMEM_ERR_NOT_SUPPORTED, "unknown query");
    is_status(rankmem_resource_query(mr, RANKMEM_QUERY_POOL_MAX, &v), RANKMEM_ERR_NOT_SUPPORTED, "no pool maximum to report");
    is_status(rankmem_resource_query(mr, RANKMEM_QUERY_LIVE_COUNT, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "query: NULL output");
    rankmem_deallocate(mr, p3, 1000, 0); /* cached */
    /* Destroy with live allocations: a clear status, and the memory still goes back. */
    is_status(rankmem_resource_release(mr), RANKMEM_ERR_BUSY, "release with live allocations says so");
    ok(strstr(rankmem_last_error(), "2 live") != NULL, "  and how many: %s", rankmem_last_error());
    ok(up->outstanding_blocks == 0 && up->outstanding_bytes == 0 && up->base.refcount == 1,
       "  live and cached blocks all went back upstream (no leak)");
    rankmem_resource_release(&up->base);
    ok(finalized, "the chain is freed");
}

/* ---- threads ---- */

#define NTHREADS 8

static size_t stress_size(void *arg, unsigned r, unsigned long long *s)
{
    (void)r;
    return 1 + sh_rng(s) % *(size_t *)arg;
}

/* One thread empties the cache and one trims it under the others' feet; a
 * third asks what the cache holds. */
static int stress_hook(void *arg, rankmem_resource_t *mr, int id, long step)
{
    (void)arg;
    size_t v;
    if (id == 0 && step % 997 == 0)
        return rankmem_caching_free_all(mr) != RANKMEM_SUCCESS;
    if (id == 1 && step % 1009 == 0)
        return rankmem_resource_trim(mr, 1 << 20) != RANKMEM_SUCCESS;
    if (id == 2 && step % 101 == 0)
        return rankmem_resource_query(mr, RANKMEM_QUERY_FREE_BLOCKS, &v) != RANKMEM_SUCCESS ||
               rankmem_resource_query(mr, RANKMEM_QUERY_USED_HIGH, &v) != RANKMEM_SUCCESS;
    return 0;
}

static void stress(const char *what, size_t limit, size_t cap, int steps)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *below = &up->base, *mr;
    if (limit) {
        rankmem_limit_create(&up->base, limit, &below);
        rankmem_resource_release(&up->base);
    }
    rankmem_caching_params_t prm;
    rankmem_caching_params_default(&prm);
    prm.growth = 4, prm.min_bin = 4, prm.max_bin = 8; /* 256 B .. 64 KiB */
    prm.max_cached_bytes = cap;
    if (rankmem_caching_create(below, &prm, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("caching_create: %s", rankmem_last_error());
    rankmem_resource_release(below);
    rankmem_resource_retain(&up->base);
    size_t max = 80 << 10; /* some requests above the largest bin */
    sh_config_t cfg = {.mr = mr, .threads = NTHREADS, .steps = steps, .live = 32, .seed = 4242,
                       .handoff_mod = 7, .take_mod = 11, .stream_base = 0x1000,
                       .yield_every = 64, .refusal = RANKMEM_ERR_LIMIT, .size = stress_size,
                       .hook = stress_hook, .arg = &max};
    sh_result_t res;
    sh_run(&cfg, &res);
    /* Under a limit, most requests may be refused while the others hold memory. */
    sh_report(&res, what, NTHREADS * steps / (limit ? 8 : 3));
    ok(q(mr, RANKMEM_QUERY_LIVE_COUNT) == 0 && q(mr, RANKMEM_QUERY_USED_CURRENT) == 0,
       "%s: nothing live at the end", what);
    size_t reserved = q(mr, RANKMEM_QUERY_RESERVED_CURRENT);
    ok(reserved <= cap && reserved == up->outstanding_bytes,
       "%s: what is held is the cache, within the cap (%zu of %zu)", what, reserved, cap);
    is_status(rankmem_caching_free_all(mr), RANKMEM_SUCCESS, "%s: free_all", what);
    ok(up->outstanding_blocks == 0 && q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 0,
       "%s: every block went back upstream", what);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "%s: released", what);
    rankmem_resource_release(&up->base);
    ok(finalized, "%s: chain gone", what);
}

int main(int argc, char **argv)
{
    const char *env = getenv("RANKMEM_TEST_LONG");
    int long_form = (env && *env && strcmp(env, "0") != 0) || (argc > 1 && strcmp(argv[1], "--long") == 0);
    test_params();
    test_bins();
    test_reuse();
    test_cross_thread();
    test_uncached();
    test_cap();
    test_cap_threads();
    test_free_all_trim();
    test_oom();
    random_run(1, 0, 8, 3, 7, (6u << 20) - 1, 4 << 20, 20000);
    random_run(7, 0, 4, 4, 9, 1 << 20, 1 << 20, 20000);
    random_run(20240601, 0, 2, 8, 16, 256 << 10, 256 << 10, 20000);
    random_run(99, 1, 8, 3, 7, (6u << 20) - 1, 4 << 20, 20000);
    random_run(12345, 1, 10, 2, 5, 64 << 10, 200000, 20000);
    test_bad_inputs();
    int steps = long_form ? 400000 : 20000;
    stress("host", 0, 512 << 10, steps);
    stress("limit", 3 << 20, 1 << 20, steps); /* out of memory -> free all -> retry, concurrently */
    stress("no cap", 0, SIZE_MAX, steps);
    return tap_done();
}
