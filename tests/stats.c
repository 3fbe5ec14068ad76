/* The stats adaptor over a host upstream and over a pool: exact counters
 * against what the test allocated, failures, nested scopes with peak
 * folding, short structs, queries, 8 threads (totals exact), threads that
 * come and go, and every bad input; 16 threads holding known blocks at a
 * barrier (currents and totals exact, peak within the documented bound) and
 * one thread with sizes over the flush threshold (peak exact, scopes too). */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"

static rankmem_stats_t get(rankmem_resource_t *mr)
{
    rankmem_stats_t s;
    memset(&s, 0xee, sizeof s);
    s.size = sizeof s;
    if (rankmem_stats_get(mr, &s) != RANKMEM_SUCCESS)
        BAIL_OUT("rankmem_stats_get: %s", rankmem_last_error());
    return s;
}

/* All seven counters at once, with a diagnostic naming the ones that differ. */
static int same(const char *what, rankmem_stats_t s, size_t bc, size_t bp, size_t bt, size_t cc,
                size_t cp, size_t ct, size_t f)
{
    int good = s.bytes_current == bc && s.bytes_peak == bp && s.bytes_total == bt &&
               s.count_current == cc && s.count_peak == cp && s.count_total == ct &&
               s.failures == f;
    ok(good, "%s: bytes %zu/%zu/%zu, count %zu/%zu/%zu, failures %zu", what, bc, bp, bt, cc, cp,
       ct, f);
    if (!good)
        diag("  got bytes %zu/%zu/%zu, count %zu/%zu/%zu, failures %zu", s.bytes_current,
             s.bytes_peak, s.bytes_total, s.count_current, s.count_peak, s.count_total,
             s.failures);
    return good;
}

static void *alloc(rankmem_resource_t *mr, size_t n)
{
    void *p = NULL;
    if (rankmem_allocate(mr, n, 0, &p) != RANKMEM_SUCCESS)
        BAIL_OUT("allocate %zu: %s", n, rankmem_last_error());
    return p;
}

static void dealloc(rankmem_resource_t *mr, void *p, size_t n)
{
    if (rankmem_deallocate(mr, p, n, 0) != RANKMEM_SUCCESS)
        BAIL_OUT("deallocate %zu: %s", n, rankmem_last_error());
}

static size_t q(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = (size_t)-1;
    if (rankmem_resource_query(mr, what, &v) != RANKMEM_SUCCESS)
        return (size_t)-2;
    return v;
}

/* Counters, queries and failures over one upstream. make_fail: makes the
 * next allocate of `big` bytes fail in the upstream. */
static void exact_counters(const char *name, rankmem_resource_t *up, size_t big)
{
    rankmem_resource_t *st;
    is_status(rankmem_stats_create(up, &st), RANKMEM_SUCCESS, "%s: stats_create", name);
    same(name, get(st), 0, 0, 0, 0, 0, 0, 0);
    void *a = alloc(st, 1000), *b = alloc(st, 3000), *c = alloc(st, 5000);
    same("three allocations", get(st), 9000, 9000, 9000, 3, 3, 3, 0);
    dealloc(st, b, 3000);
    same("one freed", get(st), 6000, 9000, 9000, 2, 3, 3, 0);
    void *d = alloc(st, 2000);
    same("a smaller one does not raise the peak", get(st), 8000, 9000, 11000, 3, 3, 4, 0);
    void *e = alloc(st, 1500);
    same("past the old peak", get(st), 9500, 9500, 12500, 4, 4, 5, 0);
    void *p = (void *)0x1;
    is_status(rankmem_allocate(st, big, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY,
              "%s: the upstream refuses %zu bytes", name, big);
    ok(p == (void *)0x1, "%s: the output is untouched on failure", name);
    same("a failure counts only as a failure", get(st), 9500, 9500, 12500, 4, 4, 5, 1);
    ok(q(st, RANKMEM_QUERY_USED_CURRENT) == 9500 && q(st, RANKMEM_QUERY_USED_HIGH) == 9500 &&
           q(st, RANKMEM_QUERY_LIVE_COUNT) == 4,
       "%s: USED_CURRENT, USED_HIGH and LIVE_COUNT answered by stats", name);
    size_t v_up = 7, v_st = 8;
    rankmem_status_t s_up = rankmem_resource_query(up, RANKMEM_QUERY_RESERVED_CURRENT, &v_up);
    rankmem_status_t s_st = rankmem_resource_query(st, RANKMEM_QUERY_RESERVED_CURRENT, &v_st);
    ok(s_up == s_st && (s_up != RANKMEM_SUCCESS || v_up == v_st),
       "%s: other queries go to the upstream (status %d, %zu)", name, (int)s_st, v_st);
    is_status(rankmem_deallocate(st, a, 1000, 0), RANKMEM_SUCCESS, "%s: free", name);
    dealloc(st, c, 5000);
    dealloc(st, d, 2000);
    dealloc(st, e, 1500);
    same("all freed", get(st), 0, 9500, 12500, 0, 4, 5, 1);
    is_status(rankmem_resource_trim(st, 0), RANKMEM_SUCCESS, "%s: trim goes through", name);
    is_status(rankmem_resource_release(st), RANKMEM_SUCCESS, "%s: released", name);
}

static void over_counting(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    up->fail_above = 1 << 20;
    exact_counters("counting", &up->base, 2 << 20);
    ok(up->outstanding_blocks == 0 && up->allocs == 5 && up->frees == 5,
       "counting: every call reached the upstream once (%zu allocs, %zu frees)", up->allocs,
       up->frees);
    ok(!finalized, "counting: the upstream outlives the adaptor while the test holds it");
    rankmem_resource_release(&up->base);
    ok(finalized, "counting: then it is gone");
}

static void over_pool(void)
{
    rankmem_resource_t *sys, *pool;
    rankmem_system_create(&sys);
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = 1 << 20;
    prm.maximum_size = 1 << 20;
    if (rankmem_pool_create(sys, &prm, &pool) != RANKMEM_SUCCESS)
        BAIL_OUT("pool_create: %s", rankmem_last_error());
    rankmem_resource_release(sys);
    exact_counters("pool", pool, 2 << 20);
    ok(q(pool, RANKMEM_QUERY_LIVE_COUNT) == 0, "pool: nothing left live in the pool");
    rankmem_resource_release(pool);
}

/* Two levels, with the numbers worked out by hand. */
static void scopes(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    up->fail_above = 1 << 20;
    rankmem_resource_t *st;
    rankmem_stats_create(&up->base, &st);
    rankmem_stats_t r;
    void *a = alloc(st, 100);
    is_status(rankmem_stats_push(st), RANKMEM_SUCCESS, "push the outer scope");
    void *b = alloc(st, 200);
    dealloc(st, b, 200);
    void *c = alloc(st, 50);
    is_status(rankmem_stats_push(st), RANKMEM_SUCCESS, "push the inner scope");
    void *d = alloc(st, 300), *e = alloc(st, 400);
    same("inside the inner scope, get still counts since creation", get(st), 850, 850, 1050, 4,
         4, 5, 0);
    dealloc(st, d, 300);
    void *x;
    is_status(rankmem_allocate(st, 2 << 20, 0, &x), RANKMEM_ERR_OUT_OF_MEMORY,
              "a failure inside the inner scope");
    memset(&r, 0xee, sizeof r);
    r.size = sizeof r;
    is_status(rankmem_stats_pop(st, &r), RANKMEM_SUCCESS, "pop the inner scope");
    ok(r.size == sizeof r && r.version == RANKMEM_STATS_VERSION, "the scope struct has size and version");
    same("inner scope", r, 400, 700, 700, 1, 2, 2, 1);
    void *f = alloc(st, 10);
    memset(&r, 0xee, sizeof r);
    r.size = sizeof r;
    is_status(rankmem_stats_pop(st, &r), RANKMEM_SUCCESS, "pop the outer scope");
    same("outer scope: the inner peak folded in (50 at push + 700)", r, 460, 750, 960, 3, 3, 5, 1);
    same("since creation after both pops", get(st), 560, 850, 1060, 4, 4, 6, 1);

    /* A scope that only frees what was allocated before it. */
    rankmem_stats_push(st);
    dealloc(st, a, 100);
    r.size = sizeof r;
    is_status(rankmem_stats_pop(st, &r), RANKMEM_SUCCESS, "pop a scope that only freed");
    same("a scope that frees older memory reports 0, not a wrapped size", r, 0, 0, 0, 0, 0, 0, 0);
    same("and the counters since creation see the free", get(st), 460, 850, 1060, 3, 4, 6, 1);

    /* Peaks folded from a scope that was deeper than anything after it. */
    rankmem_stats_push(st);
    void *g = alloc(st, 1000);
    dealloc(st, g, 1000);
    is_status(rankmem_stats_pop(st, NULL), RANKMEM_SUCCESS, "pop with a NULL struct discards");
    same("a folded peak raises the creation peak", get(st), 460, 1460, 2060, 3, 4, 7, 1);

    is_status(rankmem_stats_pop(st, &r), RANKMEM_ERR_INVALID_ARGUMENT, "pop without push");
    ok(strstr(rankmem_last_error(), "push") != NULL, "the detail says so: %s", rankmem_last_error());

    /* A struct too short is refused and the scope stays. */
    rankmem_stats_push(st);
    rankmem_stats_t small = {.size = 4};
    is_status(rankmem_stats_pop(st, &small), RANKMEM_ERR_INVALID_ARGUMENT, "pop into a 4-byte struct");
    r.size = sizeof r;
    is_status(rankmem_stats_pop(st, &r), RANKMEM_SUCCESS, "the scope was still there");
    is_status(rankmem_stats_pop(st, &r), RANKMEM_ERR_INVALID_ARGUMENT, "and now it is gone");

    /* Deep nesting grows the stack. */
    int good = 1;
    for (int i = 0; i < 100; i++)
        good &= rankmem_stats_push(st) == RANKMEM_SUCCESS;
    void *h = alloc(st, 256);
    for (int i = 0; i < 100; i++) {
        r.size = sizeof r;
        good &= rankmem_stats_pop(st, &r) == RANKMEM_SUCCESS && r.bytes_peak == 256 &&
                r.bytes_total == 256;
    }
    ok(good, "100 nested scopes each see the 256 bytes allocated in the innermost");
    dealloc(st, h, 256);

    dealloc(st, c, 50);
    dealloc(st, e, 400);
    dealloc(st, f, 10);
    rankmem_stats_push(st); /* left open: finalize frees the stack */
    rankmem_resource_release(st);
    ok(up->outstanding_blocks == 0, "scopes: everything went back");
    rankmem_resource_release(&up->base);
}

static void short_struct(void)
{
    rankmem_resource_t *sys, *st;
    rankmem_system_create(&sys);
    rankmem_stats_create(sys, &st);
    rankmem_resource_release(sys);
    void *p = alloc(st, 777);
    /* An older caller that knew only size, version and the byte counters. */
    size_t n = offsetof(rankmem_stats_t, count_current);
    unsigned char buf[sizeof(rankmem_stats_t) + 16];
    memset(buf, 0xab, sizeof buf);
    rankmem_stats_t *s = (rankmem_stats_t *)buf;
    s->size = n;
    is_status(rankmem_stats_get(st, s), RANKMEM_SUCCESS, "get into a shorter struct");
    ok(s->size == n && s->version == RANKMEM_STATS_VERSION && s->bytes_current == 777 &&
           s->bytes_peak == 777 && s->bytes_total == 777,
       "its fields are filled");
    int untouched = 1;
    for (size_t i = n; i < sizeof buf; i++)
        untouched &= buf[i] == 0xab;
    ok(untouched, "nothing past its size is written");
    s->size = offsetof(rankmem_stats_t, version) + sizeof(unsigned);
    is_status(rankmem_stats_get(st, s), RANKMEM_SUCCESS, "size and version alone is enough");
    dealloc(st, p, 777);
    rankmem_resource_release(st);
}

static void bad_inputs(void)
{
    rankmem_resource_t *sys, *st, *out = (rankmem_resource_t *)0x1;
    rankmem_system_create(&sys);
    is_status(rankmem_stats_create(NULL, &out), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL upstream");
    ok(out == (rankmem_resource_t *)0x1, "create: output untouched");
    ok(strstr(rankmem_last_error(), "upstream") != NULL, "create: the detail names it: %s",
       rankmem_last_error());
    is_status(rankmem_stats_create(sys, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL output");
    rankmem_stats_create(sys, &st);
    rankmem_stats_t s;
    memset(&s, 0x5a, sizeof s);
    s.size = sizeof s;
    is_status(rankmem_stats_get(NULL, &s), RANKMEM_ERR_INVALID_ARGUMENT, "get: NULL resource");
    is_status(rankmem_stats_get(st, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "get: NULL output");
    is_status(rankmem_stats_get(sys, &s), RANKMEM_ERR_INVALID_ARGUMENT, "get: not a stats adaptor");
    ok(strstr(rankmem_last_error(), "system") != NULL, "get: the detail names the resource: %s",
       rankmem_last_error());
    s.size = 0;
    is_status(rankmem_stats_get(st, &s), RANKMEM_ERR_INVALID_ARGUMENT, "get: size 0");
    s.size = offsetof(rankmem_stats_t, version) + 1;
    is_status(rankmem_stats_get(st, &s), RANKMEM_ERR_INVALID_ARGUMENT, "get: size cutting the version");
    ok(s.version == 0x5a5a5a5au, "get: nothing written on failure");
    is_status(rankmem_stats_push(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "push: NULL resource");
    is_status(rankmem_stats_push(sys), RANKMEM_ERR_INVALID_ARGUMENT, "push: not a stats adaptor");
    s.size = sizeof s;
    is_status(rankmem_stats_pop(NULL, &s), RANKMEM_ERR_INVALID_ARGUMENT, "pop: NULL resource");
    is_status(rankmem_stats_pop(sys, &s), RANKMEM_ERR_INVALID_ARGUMENT, "pop: not a stats adaptor");
    is_status(rankmem_stats_pop(st, &s), RANKMEM_ERR_INVALID_ARGUMENT, "pop: nothing pushed");

    /* Through the dispatchers: the adaptor never sees these. */
    void *p;
    is_status(rankmem_allocate(st, 0, 0, &p), RANKMEM_ERR_INVALID_ARGUMENT, "allocate 0 bytes");
    is_status(rankmem_allocate(st, 64, 3, &p), RANKMEM_ERR_INVALID_ARGUMENT, "allocate: bad alignment");
    rankmem_stats_t z = {.size = sizeof z};
    rankmem_stats_get(st, &z);
    ok(z.count_total == 0 && z.failures == 0, "rejected arguments are not counted as failures");

    /* The adaptor's own face. */
    const char *name = NULL;
    rankmem_resource_name(st, &name);
    ok(name && strcmp(name, "stats") == 0, "name is stats");
    char buf[32] = "";
    int n = st->ops->describe ? st->ops->describe(st, buf, sizeof buf) : -1;
    ok(n == 5 && strcmp(buf, "stats") == 0, "describe writes 'stats' (%d: %s)", n, buf);
    ok(st->upstream == sys && st->props == sys->props && st->device == sys->device,
       "upstream, properties and device are the upstream's");
    rankmem_resource_release(st);
    rankmem_resource_release(sys);
}

/* ---- threads ---- */

#define NTHREADS 8
#define ITERS 20000

typedef struct {
    rankmem_resource_t *mr;
    int id;
    size_t bytes, count, max_live;
    int errors;
} worker_t;

static void *worker(void *arg)
{
    worker_t *w = arg;
    void *live[4] = {0};
    size_t size[4] = {0}, live_bytes = 0;
    for (int i = 0; i < ITERS; i++) {
        int k = i % 4;
        if (live[k]) {
            if (rankmem_deallocate(w->mr, live[k], size[k], 0) != RANKMEM_SUCCESS)
                w->errors++;
            live_bytes -= size[k];
            live[k] = NULL;
        }
        size[k] = 256u * (1u + (unsigned)((i * 7 + w->id) % 13)) + (size_t)w->id;
        if (rankmem_allocate(w->mr, size[k], 0, &live[k]) != RANKMEM_SUCCESS) {
            w->errors++;
            live[k] = NULL;
            continue;
        }
        live_bytes += size[k];
        if (live_bytes > w->max_live)
            w->max_live = live_bytes;
        w->bytes += size[k];
        w->count++;
    }
    for (int k = 0; k < 4; k++)
        if (live[k] && rankmem_deallocate(w->mr, live[k], size[k], 0) != RANKMEM_SUCCESS)
            w->errors++;
    return NULL;
}

static void threads_over(const char *name, rankmem_resource_t *up)
{
    rankmem_resource_t *st;
    rankmem_stats_create(up, &st);
    pthread_t th[NTHREADS];
    worker_t w[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        w[i] = (worker_t){.mr = st, .id = i};
        pthread_create(&th[i], NULL, worker, &w[i]);
    }
    size_t bytes = 0, count = 0, max_one = 0, sum_max = 0;
    int errors = 0;
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(th[i], NULL);
        bytes += w[i].bytes;
        count += w[i].count;
        errors += w[i].errors;
        sum_max += w[i].max_live;
        if (w[i].max_live > max_one)
            max_one = w[i].max_live;
    }
    rankmem_stats_t s = get(st);
    ok(errors == 0, "%s, %d threads: every call succeeded", name, NTHREADS);
    ok(s.bytes_total == bytes && s.count_total == count && count == (size_t)NTHREADS * ITERS,
       "%s, %d threads: totals exact (%zu bytes in %zu allocations; got %zu in %zu)", name,
       NTHREADS, bytes, count, s.bytes_total, s.count_total);
    ok(s.bytes_current == 0 && s.count_current == 0, "%s, %d threads: nothing live at the end",
       name, NTHREADS);
    ok(s.bytes_peak >= max_one && s.bytes_peak <= sum_max && s.count_peak >= 4 &&
           s.count_peak <= 4 * NTHREADS,
       "%s, %d threads: peak %zu within [%zu, %zu], count peak %zu", name, NTHREADS,
       s.bytes_peak, max_one, sum_max, s.count_peak);
    ok(s.failures == 0, "%s, %d threads: no failures", name, NTHREADS);
    rankmem_resource_release(st);
}

/* Threads that come and go, one after another: each exiting thread's
 * per-thread totals are kept (and its slot reused by the next). */
static void threads_come_and_go(void)
{
    rankmem_resource_t *sys, *st;
    rankmem_system_create(&sys);
    rankmem_stats_create(sys, &st);
    rankmem_resource_release(sys);
    size_t bytes = 0, count = 0;
    int errors = 0;
    for (int round = 0; round < 40; round++) {
        worker_t w = {.mr = st, .id = round % 5};
        pthread_t t;
        pthread_create(&t, NULL, worker, &w);
        pthread_join(t, NULL);
        bytes += w.bytes;
        count += w.count;
        errors += w.errors;
    }
    /* And the main thread, which has used a slot all along in other tests. */
    void *p = alloc(st, 1234);
    dealloc(st, p, 1234);
    rankmem_stats_t s = get(st);
    ok(errors == 0 && s.bytes_total == bytes + 1234 && s.count_total == count + 1,
       "40 short-lived threads in turn: totals exact (%zu, %zu)", s.bytes_total, s.count_total);
    rankmem_resource_release(st);
}

/* Two stats adaptors in one chain, used alternately by the same threads. */
static void stacked(void)
{
    rankmem_resource_t *sys, *inner, *outer;
    rankmem_system_create(&sys);
    rankmem_stats_create(sys, &inner);
    rankmem_stats_create(inner, &outer);
    void *p = alloc(outer, 4096), *q2 = alloc(inner, 512);
    rankmem_stats_t so = get(outer), si = get(inner);
    ok(so.bytes_current == 4096 && so.count_total == 1 && si.bytes_current == 4608 &&
           si.count_total == 2,
       "stats over stats: each counts what passes through it");
    dealloc(outer, p, 4096);
    dealloc(inner, q2, 512);
    rankmem_resource_release(sys);
    rankmem_resource_release(inner);
    is_status(rankmem_resource_release(outer), RANKMEM_SUCCESS, "the chain goes away with its last user");
}

/* A batch through the adaptor: counted out at once, passed to the pool as a
 * batch, and what the pool refused counted back in. */
static void batch(void)
{
    rankmem_resource_t *sys, *pool, *st;
    rankmem_system_create(&sys);
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = 1 << 20;
    rankmem_pool_create(sys, &prm, &pool);
    rankmem_stats_create(pool, &st);
    rankmem_block_t bl[5];
    for (int i = 0; i < 4; i++) {
        bl[i].bytes = 1000 * (size_t)(i + 1);
        bl[i].alignment = 0;
        bl[i].ptr = alloc(st, bl[i].bytes);
    }
    char foreign[256];
    bl[3].bytes = 3999; /* allocated with 4000: the pool refuses it */
    bl[4] = (rankmem_block_t){foreign, 256, 0};
    size_t failed = 0;
    is_status(rankmem_deallocate_many(st, bl, 5, &failed), RANKMEM_ERR_INVALID_POINTER,
              "stats batch: a wrong size and a foreign block fail");
    ok(failed == 2, "stats batch: two failed (%zu)", failed);
    /* Live: the 4000-byte block alone; each refused free is counted back in
     * as it was counted out (as for rankmem_deallocate). */
    same("stats batch: the refused ones counted back in", get(st), 4000, 10000, 10000, 1, 4, 4, 0);
    bl[3].bytes = 4000;
    is_status(rankmem_deallocate_many(st, &bl[3], 1, NULL), RANKMEM_SUCCESS, "stats batch: the right size");
    rankmem_resource_release(pool);
    rankmem_resource_release(sys);
    is_status(rankmem_resource_release(st), RANKMEM_SUCCESS, "stats batch: nothing left live in the pool");
}

/* ---- per-thread counters (issue 21) ----
 * The peak's documented bound (docs/adaptors-stats.md): exact with one
 * thread; within n * 8 MiB (bytes) and n * 8 (count) with n threads. */
#define SLACK_BYTES ((size_t)8 << 20)
#define SLACK_COUNT ((size_t)8)
#define N16 16
#define PER 24 /* blocks a thread holds at the barrier */

typedef struct {
    rankmem_resource_t *mr;
    pthread_barrier_t *bar;
    int id;
    void *blk[PER];
    size_t size[PER];
    size_t held, bytes_total, count_total;
    int errors;
} held_t;

static held_t h16[N16];

/* Sizes that cross the slack either way (flushes) and small ones (not). */
static size_t size_of(int id, int i)
{
    return i % 6 == 0 ? SLACK_BYTES + 4096u * (size_t)(id + 1) : 512u * (size_t)(i * 3 + id + 1);
}

static void *holder(void *arg)
{
    held_t *w = arg;
    /* Churn first: pairs of every size (flushes for the big ones). */
    for (int r = 0; r < 200; r++) {
        size_t n = size_of(w->id, r % PER);
        void *p = NULL;
        if (rankmem_allocate(w->mr, n, 0, &p) != RANKMEM_SUCCESS) {
            w->errors++;
            continue;
        }
        w->bytes_total += n;
        w->count_total++;
        if (rankmem_deallocate(w->mr, p, n, 0) != RANKMEM_SUCCESS)
            w->errors++;
    }
    /* Then hold PER blocks: at the barrier every thread holds its own. */
    for (int i = 0; i < PER; i++) {
        w->size[i] = size_of(w->id, i);
        if (rankmem_allocate(w->mr, w->size[i], 0, &w->blk[i]) != RANKMEM_SUCCESS) {
            w->errors++;
            w->blk[i] = NULL;
            continue;
        }
        w->held += w->size[i];
        w->bytes_total += w->size[i];
        w->count_total++;
    }
    pthread_barrier_wait(w->bar);
    pthread_barrier_wait(w->bar); /* the main thread reads the counters between */
    /* Free the next thread's blocks: frees on another thread than the
     * allocation leave negative changes in this thread's slot. */
    held_t *o = &h16[(w->id + 1) % N16];
    for (int i = 0; i < PER; i++)
        if (o->blk[i] && rankmem_deallocate(w->mr, o->blk[i], o->size[i], 0) != RANKMEM_SUCCESS)
            w->errors++;
    return NULL;
}

static size_t dist(size_t a, size_t b) { return a > b ? a - b : b - a; }

/* 16 threads, each holding known blocks at a barrier: the true peak is what
 * they hold together then (nothing is freed before it). */
static void sixteen_threads(const char *name, rankmem_resource_t *up, int peek)
{
    rankmem_resource_t *st;
    rankmem_stats_create(up, &st);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, N16 + 1);
    pthread_t th[N16];
    for (int i = 0; i < N16; i++) {
        h16[i] = (held_t){.mr = st, .bar = &bar, .id = i};
        pthread_create(&th[i], NULL, holder, &h16[i]);
    }
    pthread_barrier_wait(&bar);
    size_t held = 0, bt = 0, ct = 0;
    for (int i = 0; i < N16; i++) {
        held += h16[i].held;
        bt += h16[i].bytes_total;
        ct += h16[i].count_total;
    }
    /* At the barrier the true values are known; a full query reports a
     * peak of at least the current value. */
    ok(q(st, RANKMEM_QUERY_USED_CURRENT) == held &&
           q(st, RANKMEM_QUERY_LIVE_COUNT) == (size_t)N16 * PER,
       "%s, %d threads at the barrier: USED_CURRENT and LIVE_COUNT exact (%zu in %zu)", name,
       N16, held, (size_t)N16 * PER);
    rankmem_stats_t s;
    if (peek) {
        s = get(st);
        ok(s.bytes_current == held && s.count_current == (size_t)N16 * PER &&
               s.bytes_total == bt && s.count_total == ct,
           "%s, %d threads at the barrier: current and totals exact (%zu in %zu, %zu in %zu)",
           name, N16, s.bytes_current, s.count_current, s.bytes_total, s.count_total);
        ok(s.bytes_peak >= held && s.bytes_peak <= held + N16 * SLACK_BYTES &&
               s.count_peak >= (size_t)N16 * PER &&
               s.count_peak <= (size_t)N16 * (PER + 1) + N16 * SLACK_COUNT,
           "%s, %d threads at the barrier: peaks at least the current, within the bound "
           "(%zu, %zu)", name, N16, s.bytes_peak, s.count_peak);
    }
    pthread_barrier_wait(&bar);
    int errors = 0;
    for (int i = 0; i < N16; i++) {
        pthread_join(th[i], NULL);
        errors += h16[i].errors;
    }
    s = get(st);
    ok(errors == 0, "%s, %d threads: every call succeeded", name, N16);
    ok(s.bytes_current == 0 && s.count_current == 0 && s.bytes_total == bt &&
           s.count_total == ct && s.failures == 0,
       "%s, %d threads after join: current 0, totals exact (%zu, %zu), no failures", name, N16,
       s.bytes_total, s.count_total);
    /* The true peaks: held and N16 * PER (every block held at the barrier,
     * none freed before; the churn's pairs held at most one block more a
     * thread, which the bound covers: its sizes are under held / N16). */
    size_t churn = N16 * (SLACK_BYTES + 4096u * N16);
    ok(s.bytes_peak >= held - N16 * SLACK_BYTES && s.bytes_peak <= held + N16 * SLACK_BYTES + churn,
       "%s, %d threads: bytes peak %zu within %d x 8 MiB of %zu (off by %zu)", name, N16,
       s.bytes_peak, N16, held, dist(s.bytes_peak, held));
    ok(s.count_peak + N16 * SLACK_COUNT >= (size_t)N16 * PER &&
           s.count_peak <= (size_t)N16 * (PER + 1) + N16 * SLACK_COUNT,
       "%s, %d threads: count peak %zu within %d x 8 of %d", name, N16, s.count_peak, N16,
       N16 * PER);
    ok(q(st, RANKMEM_QUERY_USED_HIGH) == s.bytes_peak, "%s: USED_HIGH is the bytes peak", name);
    pthread_barrier_destroy(&bar);
    rankmem_resource_release(st);
}

/* One thread: the peak is exact whatever the sizes (flushes included), in
 * scopes too; and after other threads have come and gone. */
static void one_thread_exact(void)
{
    rankmem_resource_t *sys, *st;
    rankmem_system_create(&sys);
    rankmem_stats_create(sys, &st);
    size_t big = 3 * SLACK_BYTES + 5, mid = SLACK_BYTES - 1;
    void *a = alloc(st, big), *b = alloc(st, 100), *c = alloc(st, mid);
    dealloc(st, a, big);
    void *d = alloc(st, mid);
    same("one thread, sizes over the slack", get(st), 100 + 2 * mid, big + 100 + mid,
         big + 100 + 2 * mid, 3, 3, 4, 0);
    rankmem_stats_push(st);
    void *e = alloc(st, 2 * SLACK_BYTES);
    dealloc(st, e, 2 * SLACK_BYTES);
    dealloc(st, c, mid);
    void *f = alloc(st, 7);
    rankmem_stats_t sc;
    sc.size = sizeof sc;
    rankmem_stats_pop(st, &sc);
    ok(sc.bytes_peak == 2 * SLACK_BYTES && sc.count_peak == 1 &&
           sc.bytes_total == 2 * SLACK_BYTES + 7,
       "one thread: a scope's peak exact after flushes (%zu, %zu)", sc.bytes_peak, sc.count_peak);
    /* A second scope right after: the slots' peaks of the first are gone. */
    rankmem_stats_push(st);
    void *g = alloc(st, 10);
    rankmem_stats_pop(st, &sc);
    ok(sc.bytes_peak == 10 && sc.count_peak == 1, "one thread: the next scope starts afresh (%zu)",
       sc.bytes_peak);
    dealloc(st, g, 10);
    dealloc(st, b, 100);
    dealloc(st, d, mid);
    dealloc(st, f, 7);
    rankmem_stats_t s = get(st);
    ok(s.bytes_current == 0 && s.bytes_peak == big + 100 + mid && s.count_peak == 4,
       "one thread: the peak since creation survives the scopes (%zu)", s.bytes_peak);
    rankmem_resource_release(st);
    rankmem_resource_release(sys);
}

/* Frees of what other threads allocated: a thread's change goes below
 * zero, and so may the flushed sum, while the allocating threads hold
 * theirs unflushed. A negative estimate must not read as a huge peak.
 * Three threads, in turn (a barrier between steps): A allocates x, B frees
 * it, C allocates y, B frees it (B flushes -(x + y): the sum is negative),
 * B allocates z. */
typedef struct {
    rankmem_resource_t *mr;
    pthread_barrier_t *bar;
    int who; /* 0 A, 1 B, 2 C */
} cross_t;

#define CROSS_X (SLACK_BYTES - (1u << 20)) /* 7 MiB: alone, below the slack */
#define CROSS_Y ((size_t)2 << 20)
#define CROSS_Z ((size_t)1024)
static void *cross_x, *cross_y, *cross_z;

static void *cross_step(void *arg)
{
    cross_t *c = arg;
    /* First a small pair each: a thread's first increase publishes its
     * change, and the steps below must not. */
    dealloc(c->mr, alloc(c->mr, CROSS_Z), CROSS_Z);
    pthread_barrier_wait(c->bar);
    for (int step = 0; step < 5; step++) {
        if (step == 0 && c->who == 0)
            cross_x = alloc(c->mr, CROSS_X);
        if (step == 1 && c->who == 1)
            dealloc(c->mr, cross_x, CROSS_X);
        if (step == 2 && c->who == 2)
            cross_y = alloc(c->mr, CROSS_Y);
        if (step == 3 && c->who == 1)
            dealloc(c->mr, cross_y, CROSS_Y);
        if (step == 4 && c->who == 1)
            cross_z = alloc(c->mr, CROSS_Z);
        pthread_barrier_wait(c->bar);
    }
    return NULL;
}

static void cross_thread_frees(void)
{
    rankmem_resource_t *sys, *st;
    rankmem_system_create(&sys);
    rankmem_stats_create(sys, &st);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 3);
    pthread_t th[3];
    cross_t c[3];
    for (int i = 0; i < 3; i++) {
        c[i] = (cross_t){st, &bar, i};
        pthread_create(&th[i], NULL, cross_step, &c[i]);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    rankmem_stats_t s = get(st);
    /* The true peak is x (y came after x was freed); the bound is 3 slacks. */
    ok(s.bytes_current == CROSS_Z && s.bytes_peak >= CROSS_X &&
           s.bytes_peak <= CROSS_X + 3 * SLACK_BYTES,
       "frees from other threads: current exact, peak within the bound (%zu, %zu)",
       s.bytes_current, s.bytes_peak);
    ok(s.count_current == 1 && s.count_peak <= 2 + 3 * SLACK_COUNT && s.count_total == 6,
       "frees from other threads: counts (%zu, %zu, %zu)", s.count_current, s.count_peak,
       s.count_total);
    dealloc(st, cross_z, CROSS_Z);
    rankmem_resource_release(st);
    rankmem_resource_release(sys);
}

/* A scope pushed by one thread while another allocates: the push must
 * restart the other thread's own peak (rk_tpeak_reset lowers its bound),
 * so that a pair inside the scope, smaller than what the thread reached
 * before, still shows as the scope's peak. One allocating thread, whose
 * unpublished change is 0 at the push: exact. */
typedef struct {
    rankmem_resource_t *mr;
    pthread_barrier_t *bar;
} scoped_t;

static void *scoped_worker(void *arg)
{
    scoped_t *w = arg;
    /* A 1-byte pair first: the thread's first increase publishes its change
     * (then 1 byte), and the shared sum the push keeps is 1, not 2 MiB. */
    dealloc(w->mr, alloc(w->mr, 1), 1);
    dealloc(w->mr, alloc(w->mr, (size_t)2 << 20), (size_t)2 << 20);
    pthread_barrier_wait(w->bar); /* the main thread pushes */
    pthread_barrier_wait(w->bar);
    dealloc(w->mr, alloc(w->mr, (size_t)1 << 20), (size_t)1 << 20);
    pthread_barrier_wait(w->bar); /* the main thread pops */
    return NULL;
}

static void scope_from_another_thread(void)
{
    rankmem_resource_t *sys, *st;
    rankmem_system_create(&sys);
    rankmem_stats_create(sys, &st);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    scoped_t w = {st, &bar};
    pthread_t th;
    pthread_create(&th, NULL, scoped_worker, &w);
    pthread_barrier_wait(&bar);
    rankmem_stats_push(st);
    pthread_barrier_wait(&bar);
    pthread_barrier_wait(&bar);
    rankmem_stats_t sc;
    sc.size = sizeof sc;
    rankmem_stats_pop(st, &sc);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&bar);
    ok(sc.bytes_peak == (size_t)1 << 20 && sc.count_peak == 1 && sc.bytes_total == (size_t)1 << 20,
       "a scope pushed from another thread: the allocating thread's peak restarts (%zu, %zu)",
       sc.bytes_peak, sc.count_peak);
    rankmem_stats_t s = get(st);
    ok(s.bytes_peak == (size_t)2 << 20, "and the peak since creation is kept (%zu)",
       s.bytes_peak);
    rankmem_resource_release(st);
    rankmem_resource_release(sys);
}

int main(void)
{
    over_counting();
    batch();
    over_pool();
    scopes();
    short_struct();
    bad_inputs();
    {
        rankmem_resource_t *sys;
        rankmem_system_create(&sys);
        threads_over("system", sys);
        rankmem_pool_params_t prm;
        rankmem_pool_params_default(&prm);
        prm.initial_size = 64 << 20;
        rankmem_resource_t *pool;
        rankmem_pool_create(sys, &prm, &pool);
        threads_over("pool", pool);
        rankmem_resource_release(pool);
        rankmem_resource_release(sys);
    }
    threads_come_and_go();
    stacked();
    one_thread_exact();
    cross_thread_frees();
    scope_from_another_thread();
    {
        rankmem_resource_t *sys, *pool;
        rankmem_system_create(&sys);
        sixteen_threads("system", sys, 0);
        sixteen_threads("system, queried", sys, 1);
        rankmem_pool_params_t prm;
        rankmem_pool_params_default(&prm);
        prm.initial_size = 1 << 30; /* host memory only touched by the pool's bookkeeping */
        rankmem_pool_create(sys, &prm, &pool);
        sixteen_threads("pool", pool, 0);
        rankmem_resource_release(pool);
        rankmem_resource_release(sys);
    }
    return tap_done();
}
