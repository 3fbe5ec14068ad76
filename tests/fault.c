/* The fault injector (src/fault.c) and what every resource does with the
 * failures it injects (issue 31).
 *
 *     tests/fault.t [OPS [SPEC...]]      (or RANKMEM_FAULT_OPS=N;
 *                                        RANKMEM_FAULT_MAX_BYTES=N caps requests;
 *                                        RANKMEM_FAULT_PART=K/N runs every Nth chain)
 *
 * Part 1 tests the injector itself: nth, count, every, rate and seed,
 * enable, configure, its counters, frees that always work, the spec
 * syntax, and every public function with bad input.
 *
 * Part 2 puts it under every resource and adaptor and their common chains
 * (each spec below names "fault" where it sits) and runs OPS random
 * operations on one thread (default 20000; the long form is 10 million)
 * with failures injected at random and every so often. After every call
 * in which a failure was injected, it checks:
 *
 *   - the call failed with the injector's status, or a chain absorbed it
 *     (retry) and succeeded; a failed call left its output alone;
 *   - rankmem_last_error() describes this failure: "fault: injected
 *     failure K" with K one of this call's injections (a stale error is
 *     planted before every call, so an older message shows);
 *   - the same request succeeds once the fault stops (the injector is
 *     switched off for one call);
 *   - the books: stats and tracking hold exactly what the test holds, and
 *     stats counted each failed call once; a limit's count is what the
 *     test holds; the injector's outstanding bytes are exactly what the
 *     test holds under adaptors, and what the suballocator above it says
 *     it reserved under a suballocator;
 *   - nothing changed for good: a few requests at alignments of 512 B to
 *     64 KiB succeed or fail exactly as on a fresh chain (unbounded chains;
 *     bounded ones at the end), and a retry adaptor still absorbs one
 *     failure.
 *
 * At the end: everything freed, the books at zero, trim, the full probe of
 * sizes and alignments answered as by a fresh chain, the release clean
 * (not RANKMEM_ERR_BUSY) and the upstream given back every byte (the
 * injector's own count). Figures per chain are printed as TAP comments. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"

/* ---- helpers ---- */

/* RANKMEM_FAULT_MAX_BYTES: the largest random request and probe after a
 * fault, below each chain's own (0: the chain's). Under AddressSanitizer a
 * block above 128 KiB is an mmap of its own, which makes the long form
 * hours; capped at 64 KiB (and alignments at 4 KiB) it takes minutes and
 * still puts every resource's own books under ASan (the end's probe keeps
 * every size and alignment). */
static size_t cap_bytes = 0;

static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;
static unsigned long long rng(void)
{
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static rankmem_fault_stats_t fstats(rankmem_resource_t *mr)
{
    rankmem_fault_stats_t s = {.size = sizeof s};
    if (rankmem_fault_get_stats(mr, &s) != RANKMEM_SUCCESS)
        BAIL_OUT("rankmem_fault_get_stats: %s", rankmem_last_error());
    return s;
}

static rankmem_fault_params_t params(void)
{
    rankmem_fault_params_t p;
    rankmem_fault_params_default(&p);
    return p;
}

/* Which of n calls of `bytes` fail: a bit each (n <= 64), the blocks freed at once. */
static unsigned long long pattern(rankmem_resource_t *mr, int n, size_t bytes)
{
    unsigned long long bits = 0;
    for (int i = 0; i < n; i++) {
        void *p;
        if (rankmem_allocate(mr, bytes, 0, &p) != RANKMEM_SUCCESS)
            bits |= 1ull << i;
        else
            rankmem_deallocate(mr, p, bytes, 0);
    }
    return bits;
}

/* ---- part 1: the injector ---- */

static void test_bad_input(void)
{
    int fin = 0;
    counting_t *up = counting_new(&fin);
    rankmem_resource_t *mr = (rankmem_resource_t *)0x1, *sys = NULL;
    rankmem_fault_params_t p = params();

    is_status(rankmem_fault_params_default(NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "params_default(NULL): invalid argument");
    is_status(rankmem_fault_create(NULL, NULL, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: NULL upstream refused");
    is_status(rankmem_fault_create(&up->base, NULL, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: NULL mr_p refused");
    static const char *const bad[] = {
        "params.size of another version", "rate -0.1", "rate 1.5", "rate NaN", "count 0",
        "status success", "status invalid pointer (a free's)", "status busy (a release's)",
        "status 99"};
    for (int i = 0; i < (int)(sizeof bad / sizeof *bad); i++) {
        rankmem_fault_params_t q = params();
        switch (i) {
        case 0: q.size = sizeof q - 8; break;
        case 1: q.rate = -0.1; break;
        case 2: q.rate = 1.5; break;
        case 3: q.rate = NAN; break;
        case 4: q.count = 0; break;
        case 5: q.status = RANKMEM_SUCCESS; break;
        case 6: q.status = RANKMEM_ERR_INVALID_POINTER; break;
        case 7: q.status = RANKMEM_ERR_BUSY; break;
        default: q.status = (rankmem_status_t)99; break;
        }
        mr = (rankmem_resource_t *)0x1;
        rankmem_clear_error();
        rankmem_status_t st = rankmem_fault_create(&up->base, &q, &mr);
        ok(st == RANKMEM_ERR_INVALID_ARGUMENT && mr == (rankmem_resource_t *)0x1 &&
               rankmem_last_error()[0],
           "create: %s refused, output untouched (%s)", bad[i], rankmem_last_error());
    }
    ok(up->base.refcount == 1, "no reference kept on the upstream by refused creates");

    rankmem_status_t st = rankmem_fault_create(&up->base, NULL, &mr);
    is_status(st, RANKMEM_SUCCESS, "create with NULL params (the defaults)");
    if (st != RANKMEM_SUCCESS)
        BAIL_OUT("no fault resource");
    /* configure: a bad value changes nothing. */
    p.nth = 1;
    rankmem_fault_params_t q = p;
    q.rate = 2;
    is_status(rankmem_fault_configure(mr, &q), RANKMEM_ERR_INVALID_ARGUMENT,
              "configure: rate 2 refused");
    is_status(rankmem_fault_configure(mr, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "configure: NULL params refused");
    is_status(rankmem_fault_configure(NULL, &p), RANKMEM_ERR_INVALID_ARGUMENT,
              "configure: NULL resource refused");
    ok(pattern(mr, 8, 256) == 0, "after refused configures the old settings (none) stand");
    is_status(rankmem_fault_enable(NULL, 1), RANKMEM_ERR_INVALID_ARGUMENT,
              "enable: NULL resource refused");
    rankmem_fault_stats_t s = {.size = sizeof s};
    is_status(rankmem_fault_get_stats(NULL, &s), RANKMEM_ERR_INVALID_ARGUMENT,
              "get_stats: NULL resource refused");
    is_status(rankmem_fault_get_stats(mr, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "get_stats: NULL output refused");
    s.size = sizeof s + 8;
    is_status(rankmem_fault_get_stats(mr, &s), RANKMEM_ERR_INVALID_ARGUMENT,
              "get_stats: a size larger than the struct refused");
    s.size = 2;
    is_status(rankmem_fault_get_stats(mr, &s), RANKMEM_ERR_INVALID_ARGUMENT,
              "get_stats: a size smaller than its size field refused");
    /* An older, shorter struct: filled as far as it goes. */
    struct {
        size_t size;
        unsigned long long calls;
        unsigned long long guard;
    } old = {offsetof(rankmem_fault_stats_t, counted), 77, 0x5a5a};
    st = rankmem_fault_get_stats(mr, (rankmem_fault_stats_t *)&old);
    ok(st == RANKMEM_SUCCESS && old.calls == 8 && old.guard == 0x5a5a,
       "get_stats: an older struct filled as far as it goes (calls %llu)", old.calls);

    /* A chain with no fault in it. */
    rankmem_system_create(&sys);
    is_status(rankmem_fault_enable(sys, 0), RANKMEM_ERR_INVALID_ARGUMENT,
              "enable: a chain without a fault resource refused");
    ok(strstr(rankmem_last_error(), "no fault resource") != NULL, "  and says so: %s",
       rankmem_last_error());
    s.size = sizeof s;
    is_status(rankmem_fault_get_stats(sys, &s), RANKMEM_ERR_INVALID_ARGUMENT,
              "get_stats: a chain without a fault resource refused");
    is_status(rankmem_fault_configure(sys, &p), RANKMEM_ERR_INVALID_ARGUMENT,
              "configure: a chain without a fault resource refused");
    rankmem_resource_release(sys);

    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released");
    rankmem_resource_release(&up->base);
    ok(fin, "the upstream finalized: nothing kept");
}

static void test_modes(void)
{
    int fin = 0;
    counting_t *up = counting_new(&fin);
    rankmem_resource_t *mr;
    rankmem_fault_params_t p = params();
    p.nth = 3;
    if (rankmem_fault_create(&up->base, &p, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("rankmem_fault_create: %s", rankmem_last_error());

    /* nth: call 3 only; the output untouched, the upstream never asked. */
    void *ptr[4];
    rankmem_status_t st[4];
    for (int i = 0; i < 4; i++) {
        ptr[i] = (void *)0x42;
        size_t before = up->allocs;
        st[i] = rankmem_allocate(mr, 1000, 0, &ptr[i]);
        if (i == 2)
            ok(up->allocs == before, "nth=3: the failed call never reached the upstream");
    }
    ok(st[0] == 0 && st[1] == 0 && st[2] == RANKMEM_ERR_OUT_OF_MEMORY && st[3] == 0,
       "nth=3: calls 1, 2, 4 served, call 3 out of memory");
    ok(ptr[2] == (void *)0x42, "nth=3: the failed call left its output alone");
    ok(strstr(rankmem_last_error(), "out of memory: fault: injected failure 1, allocate call 3 "
                                    "(nth=3) of 1000 bytes") != NULL,
       "nth=3: the last error says what was injected: %s", rankmem_last_error());
    rankmem_fault_stats_t s = fstats(mr);
    ok(s.calls == 4 && s.counted == 4 && s.injected == 1 && s.upstream_failures == 0 &&
           s.bytes_outstanding == 3000 && s.blocks_outstanding == 3 && s.enabled == 1,
       "nth=3: counters (calls %llu, injected %llu, %zu bytes in %zu blocks out)", s.calls,
       s.injected, s.bytes_outstanding, s.blocks_outstanding);
    /* Frees always work, even with every allocation failing. */
    p = params();
    p.rate = 1;
    rankmem_fault_configure(mr, &p);
    int freed = 1;
    for (int i = 0; i < 4; i++)
        if (i != 2)
            freed &= rankmem_deallocate(mr, ptr[i], 1000, 0) == RANKMEM_SUCCESS;
    s = fstats(mr);
    ok(freed && s.bytes_outstanding == 0 && s.blocks_outstanding == 0 && s.frees == 3 &&
           up->outstanding_bytes == 0,
       "rate=1: frees pass, nothing outstanding");
    ok(pattern(mr, 64, 256) == ~0ull, "rate=1: every call fails");
    ok(fstats(mr).counted == 64, "configure restarted the count (64 counted)");

    p = params();
    p.nth = 2;
    p.count = 3;
    rankmem_fault_configure(mr, &p);
    ok(pattern(mr, 8, 256) == 0x0eull, "nth=2,count=3: calls 2, 3, 4 fail");
    p = params();
    p.every = 4;
    rankmem_fault_configure(mr, &p);
    ok(pattern(mr, 16, 256) == 0x8888ull, "every=4: calls 4, 8, 12, 16 fail");
    p.count = 2;
    rankmem_fault_configure(mr, &p);
    ok(pattern(mr, 16, 256) == 0x9998ull, "every=4,count=2: calls 4, 5, 8, 9, ... fail");
    p = params();
    p.nth = 1;
    p.every = 10;
    rankmem_fault_configure(mr, &p);
    ok(pattern(mr, 20, 256) == ((1ull << 0) | (1ull << 9) | (1ull << 19)),
       "nth=1,every=10: calls 1, 10, 20 fail (either rule)");

    /* rate: as often as asked, the same calls for the same seed. */
    p = params();
    p.rate = 0.25;
    p.seed = 7;
    rankmem_fault_configure(mr, &p);
    int failed = 0;
    for (int k = 0; k < 64; k++)
        failed += __builtin_popcountll(pattern(mr, 64, 256));
    ok(failed > 4096 * 0.2 && failed < 4096 * 0.3, "rate=0.25: %d of 4096 calls failed", failed);
    rankmem_fault_configure(mr, &p);
    unsigned long long a = pattern(mr, 64, 256), a2 = pattern(mr, 64, 256);
    rankmem_fault_configure(mr, &p);
    unsigned long long b = pattern(mr, 64, 256), b2 = pattern(mr, 64, 256);
    p.seed = 8;
    rankmem_fault_configure(mr, &p);
    unsigned long long c = pattern(mr, 64, 256), c2 = pattern(mr, 64, 256);
    ok(a == b && a2 == b2, "rate, seed 7 twice: the same calls fail");
    ok(a != c || a2 != c2, "rate, seed 8: other calls fail");
    st[0] = rankmem_allocate(mr, 512, 0, &ptr[0]);
    ok(st[0] == RANKMEM_SUCCESS || strstr(rankmem_last_error(), "(rate=0.25, seed=8)"),
       "rate: the message names rate and seed");
    if (st[0] == RANKMEM_SUCCESS)
        rankmem_deallocate(mr, ptr[0], 512, 0);

    /* enable: off passes everything and counts nothing; on resumes. */
    p = params();
    p.every = 2;
    rankmem_fault_configure(mr, &p);
    rankmem_fault_enable(mr, 0);
    ok(pattern(mr, 10, 256) == 0 && fstats(mr).counted == 0 && fstats(mr).enabled == 0,
       "enable(0): nothing fails, nothing counted");
    rankmem_fault_enable(mr, 1);
    ok(pattern(mr, 4, 256) == 0x0aull, "enable(1): every=2 resumes from the count it had");

    /* Another status. */
    p = params();
    p.nth = 1;
    p.status = RANKMEM_ERR_LIMIT;
    rankmem_fault_configure(mr, &p);
    ptr[0] = NULL;
    is_status(rankmem_allocate(mr, 256, 0, &ptr[0]), RANKMEM_ERR_LIMIT, "status=limit: returned");
    ok(strncmp(rankmem_last_error(), "limit reached: fault: injected failure", 38) == 0,
       "status=limit: the message begins with it: %s", rankmem_last_error());

    /* A batch of frees passes through (one call upstream), counted. */
    p = params();
    rankmem_fault_configure(mr, &p);
    rankmem_block_t blk[5];
    for (int i = 0; i < 5; i++) {
        blk[i].bytes = 300 * (size_t)(i + 1);
        blk[i].alignment = 0;
        rankmem_allocate(mr, blk[i].bytes, 0, &blk[i].ptr);
    }
    size_t nfail = 9;
    st[0] = rankmem_deallocate_many(mr, blk, 5, &nfail);
    s = fstats(mr);
    ok(st[0] == RANKMEM_SUCCESS && nfail == 0 && s.bytes_outstanding == 0 &&
           s.blocks_outstanding == 0 && up->outstanding_blocks == 0,
       "deallocate_many: passed on, counted back");

    /* Queries and trims go to the upstream; the chain is found from above. */
    rankmem_resource_t *stats = NULL;
    rankmem_stats_create(mr, &stats);
    p.nth = 1;
    ok(rankmem_fault_configure(stats, &p) == RANKMEM_SUCCESS && pattern(stats, 2, 256) == 1,
       "configure through a stats adaptor above finds the injector");
    rankmem_stats_t ss = {.size = sizeof ss};
    rankmem_stats_get(stats, &ss);
    ok(ss.failures == 1 && ss.count_total == 1, "stats above counted the injected failure once");
    is_status(rankmem_resource_trim(stats, 0), RANKMEM_SUCCESS, "trim passes through");
    size_t v;
    is_status(rankmem_resource_query(mr, RANKMEM_QUERY_LIMIT, &v), RANKMEM_ERR_NOT_SUPPORTED,
              "queries go to the upstream (which answers none)");
    rankmem_resource_release(stats);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released clean");
    rankmem_resource_release(&up->base);
    ok(fin, "the upstream finalized");
}

static void test_spec(void)
{
    static const struct {
        const char *spec, *described;
    } good[] = {
        {"fault>system", "fault>system"},
        {"fault(nth=5)>system", "fault(nth=5)>system"},
        {"fault( every = 7 , seed=42, rate=0.01 )>system",
         "fault(every=7,rate=0.01,seed=42)>system"},
        {"fault(rate=1%)>system", "fault(rate=0.01)>system"},
        {"fault(nth=2,count=3,status=limit,enabled=off)>system",
         "fault(nth=2,count=3,status=limit,enabled=0)>system"},
        {"stats>pool>fault(every=3)>system", "stats>pool>fault(every=3)>system"},
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        rankmem_resource_t *mr = NULL;
        char buf[256] = "";
        rankmem_status_t st = rankmem_resource_from_spec(good[i].spec, &mr);
        if (st == RANKMEM_SUCCESS)
            st = rankmem_resource_describe(mr, buf, sizeof buf, NULL);
        ok(st == RANKMEM_SUCCESS && strcmp(buf, good[i].described) == 0, "spec '%s' -> '%s'",
           good[i].spec, buf);
        if (mr)
            rankmem_resource_release(mr);
    }
    /* The spec's settings act. */
    rankmem_resource_t *mr = NULL;
    rankmem_resource_from_spec("fault(nth=2,count=2,status=device)>system", &mr);
    void *p = NULL;
    rankmem_allocate(mr, 256, 0, &p);
    rankmem_deallocate(mr, p, 256, 0);
    ok(rankmem_allocate(mr, 256, 0, &p) == RANKMEM_ERR_DEVICE &&
           rankmem_allocate(mr, 256, 0, &p) == RANKMEM_ERR_DEVICE &&
           pattern(mr, 4, 256) == 0,
       "fault(nth=2,count=2,status=device): calls 2 and 3 fail with a device error");
    rankmem_resource_release(mr);

    static const struct {
        const char *spec, *says;
    } bad[] = {
        {"fault(rate=2)>system", "not a probability"},
        {"fault(rate=-0.5)>system", "not a number"},
        {"fault(rate=nan)>system", "not a number"},
        {"fault(rate=0.5x)>system", "trailing characters"},
        {"fault(rate=200%)>system", "not a probability"},
        {"fault(count=0)>system", "fault.count of 0"},
        {"fault(status=oom)>system", "expected out_of_memory"},
        {"fault(status=out_of_memroy)>system", "did you mean 'out_of_memory'"},
        {"fault(nth=-1)>system", "bad size"},
        {"fault(nht=1)>system", "did you mean 'nth'"},
        {"fault", "needs an upstream"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mr = (rankmem_resource_t *)0x1;
        rankmem_status_t st = rankmem_resource_from_spec(bad[i].spec, &mr);
        ok(st == RANKMEM_ERR_CONFIG && mr == (rankmem_resource_t *)0x1 &&
               strstr(rankmem_last_error(), bad[i].says),
           "spec '%s' refused: %s", bad[i].spec, rankmem_last_error());
    }
}

/* ---- part 2: under every resource and chain ---- */

enum {
    BOUNDED = 1,  /* may refuse for want of room (pool max, arena size, limit) */
    RETRY = 2,    /* a retry adaptor above absorbs a single failure */
    EXACT = 4,    /* only adaptors above the injector: it has out exactly what the test holds */
    RESERVED = 8, /* a suballocator right above the injector: its reserved bytes = injector's */
    AT_CREATION = 16, /* the resource above asks its upstream only when it is made (arena) */
};

typedef struct {
    const char *spec;
    size_t max_bytes; /* largest request */
    size_t max_align; /* largest alignment asked (0: 64 KiB) */
} chain_t;

static const chain_t default_chains[] = {
    /* Each suballocator and adaptor alone over the injector. */
    {"pool>fault>system", 4 << 20, 0},
    {"pool(initial=8MiB,growth=2MiB)>fault>system", 4 << 20, 0},
    {"pool(max=24MiB)>fault>system", 4 << 20, 0},
    {"arena(size=64MiB)>fault>system", 4 << 20, 0},
    {"binning>fault>system", 6 << 20, 0},
    {"fixed(block=4KiB)>fault>system", 4 << 10, 4096},
    {"fixed(block=64KiB,batch=4)>fault>system", 64 << 10, 4096},
    {"caching>fault>system", 4 << 20, 0},
    {"stats>fault>system", 4 << 20, 0},
    {"tracking>fault>system", 4 << 20, 0},
    {"logging(file=/dev/null)>fault>system", 1 << 20, 0},
    {"limit(bytes=64MiB)>fault>system", 4 << 20, 0},
    {"aligned(alignment=4096,threshold=64KiB)>fault>system", 4 << 20, 0},
    {"retry>fault>system", 4 << 20, 0},
    {"threadsafe>fault>system", 4 << 20, 0},
    /* Common chains: the rank's default (stats>pool>cuda) with system for
     * the device, and the chains the docs suggest. */
    {"stats>pool>fault>system", 4 << 20, 0},
    {"binning>pool>fault>system", 6 << 20, 0},
    {"binning>pool(max=24MiB)>fault>system", 4 << 20, 0},
    {"tracking>arena(size=64MiB)>fault>system", 4 << 20, 0},
    {"stats>caching>fault>system", 4 << 20, 0},
    {"tracking>binning>fault>system", 6 << 20, 0},
    {"stats>fixed(block=64KiB)>fault>system", 64 << 10, 4096},
    {"retry>pool>fault>system", 4 << 20, 0},
    {"retry>limit(bytes=48MiB)>pool>fault>system", 4 << 20, 0},
    {"limit(bytes=48MiB)>stats>binning>fault>system", 4 << 20, 0},
    {"aligned(alignment=64KiB,threshold=1MiB)>stats>pool>fault>system", 4 << 20, 0},
    {"logging(file=/dev/null)>stats>threadsafe>pool>fault>system", 1 << 20, 0},
    /* The injector higher up: what the adaptors above a suballocator see. */
    {"stats>fault>pool>system", 4 << 20, 0},
    {"tracking>fault>binning>system", 4 << 20, 0},
};

static long nops = 20000;

/* The figures of one chain. */
typedef struct {
    unsigned long long ops, calls, injected, failed, absorbed, refused, checks, after_fault, broken;
    char first[400];
} figures_t;

__attribute__((format(printf, 2, 3))) static void broke(figures_t *f, const char *fmt, ...)
{
    f->broken++;
    if (f->first[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->first, sizeof f->first, fmt, ap);
    va_end(ap);
}

#define CHECK(f, cond, ...)                                                                     \
    do {                                                                                        \
        (f)->checks++;                                                                          \
        if (!(cond))                                                                            \
            broke((f), __VA_ARGS__);                                                            \
    } while (0)

typedef struct {
    void *p;
    size_t n, align;
    uint64_t tag;
} live_t;

#define MAX_LIVE 32

/* The chain and the resources of it that keep books. */
typedef struct {
    const chain_t *c;
    rankmem_resource_t *mr, *fault, *stats, *tracking, *limit, *above_fault;
    live_t live[MAX_LIVE];
    int nlive;
    size_t live_bytes;
    unsigned long long failed_calls; /* allocate calls through the chain that failed */
    unsigned flags;                  /* what the chain is (EXACT, RESERVED, ...) */
    rankmem_fault_params_t prm;
} run_t;

static rankmem_resource_t *find(rankmem_resource_t *mr, const char *name)
{
    for (rankmem_resource_t *r = mr; r; r = r->upstream) {
        const char *n;
        rankmem_resource_name(r, &n);
        if (strcmp(n, name) == 0)
            return r;
    }
    return NULL;
}

/* Byte j of a block's pattern. */
static inline unsigned char pat(uint64_t tag, size_t j)
{
    return (unsigned char)((tag >> (j & 7) * 8) ^ (j >> 3));
}

/* Its first and last 64 bytes: cheap, and catches overlaps with its neighbours. */
static void fill(const live_t *l)
{
    unsigned char *p = l->p;
    size_t k = l->n < 64 ? l->n : 64;
    for (size_t j = 0; j < k; j++) {
        p[j] = pat(l->tag, j);
        p[l->n - 1 - j] = pat(l->tag, l->n - 1 - j);
    }
}

static int intact(const live_t *l)
{
    const unsigned char *p = l->p;
    size_t k = l->n < 64 ? l->n : 64;
    for (size_t j = 0; j < k; j++)
        if (p[j] != pat(l->tag, j) || p[l->n - 1 - j] != pat(l->tag, l->n - 1 - j))
            return 0;
    return 1;
}

/* The probe: sizes x alignments allocated together, then freed. Each
 * status goes to out[] (a fresh chain's answers are the reference). */
static const size_t probe_sizes[] = {1, 300, 4096, 65536, (size_t)1 << 20, (size_t)3 << 20};
static const size_t probe_aligns[] = {0, 512, 4096, 65536};
#define NPROBE                                                                          \
    (sizeof probe_sizes / sizeof *probe_sizes * sizeof probe_aligns / sizeof *probe_aligns)

static char probe_msg[NPROBE][200]; /* why each probe request of the last probe failed */

/* failed (may be NULL) counts the requests refused: a stats adaptor counts them too. */
static void probe(rankmem_resource_t *mr, int small, rankmem_status_t *out,
                  unsigned long long *failed)
{
    void *p[NPROBE];
    size_t k = 0;
    for (size_t i = 0; i < sizeof probe_sizes / sizeof *probe_sizes; i++)
        for (size_t j = 0; j < sizeof probe_aligns / sizeof *probe_aligns; j++, k++) {
            /* small: one in three, for the check after each fault (and
             * none above the cap: under ASan each is an mmap). */
            if (small && (k % 3 != 1 || (cap_bytes && probe_sizes[i] > cap_bytes))) {
                out[k] = RANKMEM_SUCCESS;
                p[k] = NULL;
                continue;
            }
            p[k] = NULL;
            out[k] = rankmem_allocate(mr, probe_sizes[i], probe_aligns[j], &p[k]);
            if (out[k] != RANKMEM_SUCCESS && failed)
                ++*failed;
            snprintf(probe_msg[k], sizeof probe_msg[k], "%s",
                     out[k] == RANKMEM_SUCCESS ? "" : rankmem_last_error());
            if (out[k] == RANKMEM_SUCCESS &&
                (uintptr_t)p[k] % (probe_aligns[j] ? probe_aligns[j] : 256))
                out[k] = RANKMEM_ERR_INTERNAL; /* misaligned: shows as a difference */
        }
    k = 0;
    for (size_t i = 0; i < sizeof probe_sizes / sizeof *probe_sizes; i++)
        for (size_t j = 0; j < sizeof probe_aligns / sizeof *probe_aligns; j++, k++)
            if (p[k] && out[k] != RANKMEM_ERR_INTERNAL)
                rankmem_deallocate(mr, p[k], probe_sizes[i], probe_aligns[j]);
}

static void compare_probe(figures_t *f, const rankmem_status_t *want, const rankmem_status_t *got,
                          const char *when)
{
    size_t k = 0;
    for (size_t i = 0; i < sizeof probe_sizes / sizeof *probe_sizes; i++)
        for (size_t j = 0; j < sizeof probe_aligns / sizeof *probe_aligns; j++, k++)
            CHECK(f, got[k] == want[k],
                  "%s: %zu bytes at alignment %zu: %s, a fresh chain: %s (%s)", when,
                  probe_sizes[i], probe_aligns[j], rankmem_status_string(got[k]),
                  rankmem_status_string(want[k]), probe_msg[k]);
}

/* The books against what the test holds. */
static void check_books(run_t *r, figures_t *f, const char *when)
{
    if (r->stats) {
        rankmem_stats_t s = {.size = sizeof s};
        rankmem_stats_get(r->stats, &s);
        CHECK(f, s.bytes_current == r->live_bytes && s.count_current == (size_t)r->nlive,
              "%s: stats hold %zu bytes in %zu blocks, the test %zu in %d", when,
              s.bytes_current, s.count_current, r->live_bytes, r->nlive);
        /* Only adaptors that pass sizes on are above stats in these chains. */
        CHECK(f, s.failures == r->failed_calls, "%s: stats counted %zu failures, the test %llu",
              when, s.failures, r->failed_calls);
    }
    if (r->tracking) {
        size_t b = 0, n = 0;
        rankmem_tracking_outstanding(r->tracking, &b, &n);
        CHECK(f, b == r->live_bytes && n == (size_t)r->nlive,
              "%s: tracking has %zu bytes in %zu blocks, the test %zu in %d", when, b, n,
              r->live_bytes, r->nlive);
    }
    if (r->limit) {
        size_t u = 0;
        rankmem_resource_query(r->limit, RANKMEM_QUERY_USED_CURRENT, &u);
        CHECK(f, u == r->live_bytes, "%s: the limit counts %zu bytes in use, the test holds %zu",
              when, u, r->live_bytes);
    }
    rankmem_fault_stats_t fs = fstats(r->fault);
    if (r->flags & EXACT)
        CHECK(f, fs.bytes_outstanding == r->live_bytes &&
                     fs.blocks_outstanding == (size_t)r->nlive,
              "%s: the upstream lent %zu bytes in %zu blocks, the test holds %zu in %d", when,
              fs.bytes_outstanding, fs.blocks_outstanding, r->live_bytes, r->nlive);
    if (r->flags & RESERVED) {
        size_t v = 0;
        rankmem_status_t st =
            rankmem_resource_query(r->above_fault, RANKMEM_QUERY_RESERVED_CURRENT, &v);
        CHECK(f, st == RANKMEM_SUCCESS && v == fs.bytes_outstanding,
              "%s: the suballocator says it reserved %zu bytes, its upstream lent %zu", when, v,
              fs.bytes_outstanding);
    }
}

static int build(const chain_t *c, run_t *r)
{
    memset(r, 0, sizeof *r);
    r->c = c;
    if (rankmem_resource_from_spec(c->spec, &r->mr) != RANKMEM_SUCCESS)
        return 0;
    r->fault = find(r->mr, "fault");
    r->stats = find(r->mr, "stats");
    r->tracking = find(r->mr, "tracking");
    r->limit = find(r->mr, "limit");
    for (rankmem_resource_t *a = r->mr; a && a->upstream; a = a->upstream)
        if (a->upstream == r->fault)
            r->above_fault = a;
    rankmem_resource_retain(r->fault); /* read after the chain is gone */
    /* What the chain is, from its resources (a spec given on the command
     * line is classified as the table's are). */
    static const char *const subs[] = {"pool", "arena", "binning", "fixed", "caching"};
    r->flags = EXACT;
    for (rankmem_resource_t *a = r->mr; a && a != r->fault; a = a->upstream) {
        const char *n;
        rankmem_resource_name(a, &n);
        for (size_t i = 0; i < sizeof subs / sizeof *subs; i++)
            if (strcmp(n, subs[i]) == 0)
                r->flags &= ~(unsigned)EXACT;
        if (strcmp(n, "retry") == 0)
            r->flags |= RETRY;
        if (strcmp(n, "limit") == 0 || strcmp(n, "arena") == 0)
            r->flags |= BOUNDED;
        if (strcmp(n, "pool") == 0) {
            size_t m = SIZE_MAX;
            if (rankmem_resource_query(a, RANKMEM_QUERY_POOL_MAX, &m) == RANKMEM_SUCCESS &&
                m != SIZE_MAX)
                r->flags |= BOUNDED;
        }
    }
    if (!r->fault->upstream->upstream && r->above_fault) {
        /* The injector right above the leaf: what the resource over it reserved. */
        const char *n;
        rankmem_resource_name(r->above_fault, &n);
        for (size_t i = 0; i < sizeof subs / sizeof *subs; i++)
            if (strcmp(n, subs[i]) == 0)
                r->flags |= strcmp(n, "arena") ? RESERVED : AT_CREATION;
    } else {
        r->flags &= ~(unsigned)EXACT; /* a suballocator under the injector keeps memory */
    }
    return 1;
}

static void set_fault(run_t *r, int on)
{
    rankmem_fault_enable(r->fault, on);
}

static void free_one(run_t *r, figures_t *f, int i);

static int alloc_one(run_t *r, figures_t *f, size_t n, size_t align, int count_failure)
{
    if (r->nlive == MAX_LIVE) /* room for the block */
        free_one(r, f, 0);
    void *p = (void *)0x7; /* must survive a failure */
    rankmem_status_t st = rankmem_allocate(r->mr, n, align, &p);
    if (st != RANKMEM_SUCCESS) {
        r->failed_calls += count_failure;
        CHECK(f, p == (void *)0x7, "a failed allocate of %zu bytes wrote its output", n);
        return st;
    }
    CHECK(f, (uintptr_t)p % (align ? align : 256) == 0, "%p not aligned to %zu", p, align);
    live_t l = {p, n, align, rng()};
    for (int i = 0; i < r->nlive; i++)
        CHECK(f, !((char *)p < (char *)r->live[i].p + r->live[i].n &&
                   (char *)r->live[i].p < (char *)p + n),
              "block %p (%zu bytes) overlaps a live one", p, n);
    fill(&l);
    r->live[r->nlive++] = l;
    r->live_bytes += n;
    return RANKMEM_SUCCESS;
}

static void free_one(run_t *r, figures_t *f, int i)
{
    live_t l = r->live[i];
    CHECK(f, intact(&l), "block %p (%zu bytes) changed while live", l.p, l.n);
    rankmem_status_t st = rankmem_deallocate(r->mr, l.p, l.n, l.align);
    CHECK(f, st == RANKMEM_SUCCESS, "free of %zu bytes: %s", l.n, rankmem_last_error());
    r->live[i] = r->live[--r->nlive];
    r->live_bytes -= l.n;
}

static size_t pick_size(size_t max)
{
    int top = 63 - __builtin_clzll(max);
    int b = (int)(rng() % (unsigned)(top + 1));
    size_t n = ((size_t)1 << b) + (size_t)(rng() % (1ull << b));
    return n > max ? max : n;
}

/* The number after the last "injected failure " in msg, or 0. */
static unsigned long long injected_number(const char *msg)
{
    const char *k = NULL;
    for (const char *s = msg; (s = strstr(s, "injected failure ")) != NULL; s++)
        k = s;
    return k ? strtoull(k + 17, NULL, 10) : 0;
}

/* The chain made over a counting upstream with its injector failing the
 * nth call, for n = 1, 2, ... until one is made: a failed creation keeps
 * nothing (no byte, no reference) and says what was injected; a chain made
 * after an absorbed failure works and gives everything back. */
static void creation(const chain_t *c, unsigned flags)
{
    const char *at = strstr(c->spec, "fault>");
    if (!at) {
        ok(0, "%s: no 'fault>' in the spec", c->spec);
        return;
    }
    int failures = 0, broken = 0;
    char first[600] = "";
    for (int n = 1; n <= 8; n++) {
        char spec[300];
        snprintf(spec, sizeof spec, "%.*sfault(nth=%d)%s", (int)(at - c->spec), c->spec, n,
                 at + 5);
        int fin = 0;
        counting_t *up = counting_new(&fin);
        rankmem_resource_t *mr = NULL;
        rankmem_status_t st = rankmem_resource_from_spec_upstream(spec, &up->base, &mr);
        if (st != RANKMEM_SUCCESS) {
            failures++;
            if ((st != RANKMEM_ERR_OUT_OF_MEMORY ||
                 !strstr(rankmem_last_error(), "injected failure 1,") ||
                 up->outstanding_bytes || up->base.refcount != 1) && !broken++)
                snprintf(first, sizeof first, "%s: %s (%zu bytes kept, %lu references)", spec,
                         rankmem_last_error(), up->outstanding_bytes, up->base.refcount);
            rankmem_resource_release(&up->base);
            continue;
        }
        void *p = NULL;
        rankmem_fault_enable(mr, 0);
        st = rankmem_allocate(mr, 1000, 0, &p);
        if (st == RANKMEM_SUCCESS)
            st = rankmem_deallocate(mr, p, 1000, 0);
        rankmem_status_t rel = rankmem_resource_release(mr);
        if ((st != RANKMEM_SUCCESS || rel != RANKMEM_SUCCESS || up->outstanding_bytes) &&
            !broken++)
            snprintf(first, sizeof first, "%s: made after a failure, then %s; %zu bytes kept",
                     spec, rankmem_last_error(), up->outstanding_bytes);
        rankmem_resource_release(&up->base);
        if (!fin && !broken++)
            snprintf(first, sizeof first, "%s: the upstream not finalized", spec);
        break;
    }
    if (!ok(broken == 0, "%s: creation with its nth upstream call failing (%d failed cleanly)",
            c->spec, failures))
        diag("  first: %s", first);
    if (flags & AT_CREATION)
        ok(failures > 0, "%s: the creation's upstream call can fail", c->spec);
}

static void run_chain(const chain_t *c)
{
    figures_t f;
    memset(&f, 0, sizeof f);
    rankmem_status_t fresh[NPROBE], fresh_small[NPROBE], got[NPROBE];
    run_t r;
    /* The reference: a fresh chain's answers to the probes, nothing injected. */
    if (!build(c, &r)) {
        ok(0, "%s: built (%s)", c->spec, rankmem_last_error());
        return;
    }
    creation(c, r.flags);
    set_fault(&r, 0);
    probe(r.mr, 1, fresh_small, NULL);
    rankmem_resource_release(r.mr);
    rankmem_resource_release(r.fault);
    build(c, &r);
    set_fault(&r, 0);
    probe(r.mr, 0, fresh, NULL);
    rankmem_resource_release(r.mr);
    rankmem_resource_release(r.fault);

    build(c, &r);
    /* At random (seeded) and every 97th call, in runs of one. */
    rankmem_fault_params_default(&r.prm);
    /* Suballocators call their upstream seldom: fail more of those calls. */
    r.prm.rate = r.flags & RESERVED ? 0.25 : 0.03;
    r.prm.seed = (unsigned long long)strlen(c->spec) * 7919u;
    r.prm.every = 97;
    rankmem_fault_configure(r.fault, &r.prm);
    static const size_t aligns[] = {0, 0, 0, 512, 4096, 65536};
    size_t max_align = c->max_align ? c->max_align : 65536;
    if (cap_bytes && max_align > 4096) /* under ASan, 64 KiB alignment is an mmap too */
        max_align = 4096;
    rng_state = 0x243f6a8885a308d3ull ^ r.prm.seed;
    for (long op = 0; op < nops; op++) {
        f.ops++;
        unsigned long long d = rng();
        if (d % 2048 == 1) {
            /* Everything back and trimmed now and then: suballocators go to
             * their upstream again (new batches, chunks, bins). */
            while (r.nlive)
                free_one(&r, &f, r.nlive - 1);
            /* Each resource of the chain, top down: a pool under a binning
             * resource gives its chunks back too. */
            for (rankmem_resource_t *a = r.mr; a; a = a->upstream)
                CHECK(&f, rankmem_resource_trim(a, 0) == RANKMEM_SUCCESS, "trim: %s",
                      rankmem_last_error());
            check_books(&r, &f, "after a free-all and trim");
            continue;
        }
        if (d % 512 == 0) {
            /* A trim under live blocks now and then: pools give back what they can. */
            CHECK(&f, rankmem_resource_trim(r.mr, 0) == RANKMEM_SUCCESS, "trim: %s",
                  rankmem_last_error());
            check_books(&r, &f, "after a trim");
            continue;
        }
        if (r.nlive > 0 && (r.nlive == MAX_LIVE || d % 100 < 45)) {
            free_one(&r, &f, (int)(rng() % (unsigned)r.nlive));
            continue;
        }
        size_t n = pick_size(cap_bytes && cap_bytes < c->max_bytes ? cap_bytes : c->max_bytes),
               align = aligns[rng() % 6];
        if (align > max_align)
            align = max_align;
        /* A stale error: the one after the call must be its own. */
        rankmem_allocate(NULL, 1, 0, NULL);
        rankmem_fault_stats_t before = fstats(r.fault);
        f.calls++;
        rankmem_status_t st = alloc_one(&r, &f, n, align, 1);
        rankmem_fault_stats_t after = fstats(r.fault);
        unsigned long long inj = after.injected - before.injected;
        f.injected += inj;
        if (st != RANKMEM_SUCCESS && !inj) {
            /* Not injected: only a bounded chain may run out. */
            f.refused++;
            CHECK(&f, (r.flags & BOUNDED) &&
                          (st == RANKMEM_ERR_OUT_OF_MEMORY || st == RANKMEM_ERR_LIMIT) &&
                          !strstr(rankmem_last_error(), "injected"),
                  "allocate of %zu bytes at %zu failed without an injected failure: %s", n,
                  align, rankmem_last_error());
            continue;
        }
        if (!inj)
            continue;
        /* A failure was injected in this call. */
        unsigned long long c0 = f.checks;
        if (st == RANKMEM_SUCCESS) {
            f.absorbed++;
            CHECK(&f, !(r.flags & EXACT) || (r.flags & RETRY),
                  "an injected failure vanished in a chain that cannot absorb it");
        } else {
            f.failed++;
            const char *e = rankmem_last_error();
            unsigned long long k = injected_number(e);
            CHECK(&f, st == RANKMEM_ERR_OUT_OF_MEMORY,
                  "allocate of %zu bytes at %zu: %s, not the injected out of memory (%s)", n,
                  align, rankmem_status_string(st), e);
            CHECK(&f, strncmp(e, rankmem_status_string(st), strlen(rankmem_status_string(st))) == 0,
                  "the last error does not begin with the status returned: %s", e);
            CHECK(&f, k > before.injected && k <= after.injected,
                  "the last error is not this call's injected failure (%llu to %llu): %s",
                  before.injected + 1, after.injected, e);
            /* The same request once the fault stops. */
            set_fault(&r, 0);
            rankmem_status_t again = alloc_one(&r, &f, n, align, 1);
            set_fault(&r, 1);
            CHECK(&f, again == RANKMEM_SUCCESS ||
                          ((r.flags & BOUNDED) && (again == RANKMEM_ERR_OUT_OF_MEMORY ||
                                                    again == RANKMEM_ERR_LIMIT)),
                  "%zu bytes at %zu refused after the fault stopped: %s", n, align,
                  rankmem_last_error());
        }
        check_books(&r, &f, "after a fault");
        /* Nothing changed for good: the probe answers as on a fresh chain. */
        if (!(r.flags & BOUNDED)) {
            set_fault(&r, 0);
            probe(r.mr, 1, got, &r.failed_calls);
            set_fault(&r, 1);
            compare_probe(&f, fresh_small, got, "after a fault");
        }
        if (r.flags & RETRY) {
            /* The retry ladder starts again: one failure is absorbed. */
            rankmem_fault_params_t one = r.prm;
            one.rate = 0;
            one.every = 0;
            one.nth = 1;
            rankmem_fault_configure(r.fault, &one);
            unsigned long long i0 = fstats(r.fault).injected;
            /* Larger than any chunk a pool of these chains holds: the
             * request reaches the injector. */
            size_t big = (size_t)24 << 20;
            rankmem_status_t st1 = alloc_one(&r, &f, big, 0, 1);
            unsigned long long i1 = fstats(r.fault).injected;
            CHECK(&f, (st1 == RANKMEM_SUCCESS && i1 == i0 + 1) ||
                          ((r.flags & BOUNDED) && i1 == i0 && st1 == RANKMEM_ERR_LIMIT),
                  "retry no longer absorbs one failure (%llu injected): %s", i1 - i0,
                  rankmem_last_error());
            if (st1 == RANKMEM_SUCCESS)
                free_one(&r, &f, r.nlive - 1);
            /* Back to the run's settings, the count from 0 again: a new
             * seed, or every restart would replay the same draws. */
            r.prm.seed = r.prm.seed * 6364136223846793005ull + 1442695040888963407ull;
            rankmem_fault_configure(r.fault, &r.prm);
        }
        f.after_fault += f.checks - c0;
    }
    /* The end: nothing held, books at zero, trimmed, answers as when fresh. */
    set_fault(&r, 0);
    while (r.nlive)
        free_one(&r, &f, r.nlive - 1);
    check_books(&r, &f, "at the end");
    /* Each resource of the chain, top down, as in the free-all phase: a
     * pool under binning keeps its chunks through the top's trim. */
    for (rankmem_resource_t *a = r.mr; a; a = a->upstream)
        CHECK(&f, rankmem_resource_trim(a, 0) == RANKMEM_SUCCESS, "trim: %s",
              rankmem_last_error());
    check_books(&r, &f, "at the end, trimmed");
    probe(r.mr, 0, got, &r.failed_calls);
    compare_probe(&f, fresh, got, "at the end");
    rankmem_status_t rel = rankmem_resource_release(r.mr);
    rankmem_fault_stats_t fs = fstats(r.fault);
    rankmem_resource_release(r.fault);

    if (r.flags & AT_CREATION)
        ok(f.injected == 0, "%s: no upstream call after creation, none injected (the creation "
                            "is tested above)", c->spec);
    else
        ok(f.injected > 0 && f.failed + f.absorbed > 0, "%s: %llu failures injected in %llu calls",
           c->spec, f.injected, f.calls);
    if (!ok(f.broken == 0, "%s: every invariant held (%llu checks, %llu broken)", c->spec,
            f.checks, f.broken))
        diag("  first: %s", f.first);
    ok(rel == RANKMEM_SUCCESS, "%s: released with nothing live (%s)", c->spec,
       rankmem_status_string(rel));
    ok(fs.bytes_outstanding == 0 && fs.blocks_outstanding == 0,
       "%s: the upstream got every byte back (%zu bytes in %zu blocks out)", c->spec,
       fs.bytes_outstanding, fs.blocks_outstanding);
    diag("figures: %s: %llu operations, %llu allocate calls, %llu failures injected (%llu "
         "failed the call, %llu absorbed), %llu refused for want of room, %llu invariants "
         "checked (%llu after the faults)",
         c->spec, f.ops, f.calls, f.injected, f.failed, f.absorbed, f.refused, f.checks,
         f.after_fault);
}

int main(int argc, char **argv)
{
    const char *env = getenv("RANKMEM_FAULT_OPS");
    if (env)
        nops = atol(env);
    if (argc > 1)
        nops = atol(argv[1]);
    if ((env = getenv("RANKMEM_FAULT_MAX_BYTES")) != NULL)
        cap_bytes = (size_t)strtoull(env, NULL, 0);
    if (nops < 1) {
        fprintf(stderr, "usage: %s [OPS [SPEC...]]\n", argv[0]);
        return 2;
    }
    if (argc > 2) {
        for (int i = 2; i < argc; i++) {
            chain_t c = {argv[i], strstr(argv[i], "fixed") ? 4096 : (size_t)4 << 20,
                         strstr(argv[i], "fixed") ? 4096 : 0};
            run_chain(&c);
        }
        return tap_done();
    }
    /* RANKMEM_FAULT_PART=K/N: the long form on N cores, this process the
     * chains K, K+N, ... (and part 1 only in K = 0). */
    unsigned part = 0, nparts = 1;
    if ((env = getenv("RANKMEM_FAULT_PART")) != NULL &&
        (sscanf(env, "%u/%u", &part, &nparts) != 2 || nparts == 0 || part >= nparts)) {
        fprintf(stderr, "RANKMEM_FAULT_PART='%s': expected K/N with K < N\n", env);
        return 2;
    }
    if (part == 0) {
        test_bad_input();
        test_modes();
        test_spec();
    }
    for (size_t i = part; i < sizeof default_chains / sizeof *default_chains; i += nparts)
        run_chain(&default_chains[i]);
    return tap_done();
}
