/* The limit, aligned, retry, threadsafe and prefetch adaptors on the CPU,
 * over host upstreams and over a pool: exact limits and counts (also with 8
 * threads racing), the alignment the upstream sees on allocate and on free,
 * retry callbacks and the default trim-and-retry, a lock that makes a
 * non-thread-safe upstream consistent, and every bad input. Run it under
 * ThreadSanitizer too (see README). */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define NTHREADS 8

static size_t q(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = (size_t)-1;
    rankmem_status_t st = rankmem_resource_query(mr, what, &v);
    if (st != RANKMEM_SUCCESS)
        diag("query %d: %s", (int)what, rankmem_last_error());
    return v;
}

static rankmem_resource_t *pool_over(rankmem_resource_t *up, size_t initial, size_t maximum)
{
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = initial;
    prm.maximum_size = maximum;
    rankmem_resource_t *pool;
    if (rankmem_pool_create(up, &prm, &pool) != RANKMEM_SUCCESS)
        BAIL_OUT("pool_create: %s", rankmem_last_error());
    return pool;
}

/* ---- a strict recording upstream ------------------------------------------
 * Host memory that remembers every live block with its size and alignment:
 * a free whose pointer, size or alignment differ from the allocation is
 * refused and counted. Optionally refuses past a byte cap (out of memory),
 * refuses alignments above max_align (not supported, as cudaMalloc does),
 * and counts trims. Thread-safe. */

#define REC_LIVE 1024

typedef struct {
    rankmem_resource_t base;
    pthread_mutex_t lock;
    size_t cap;       /* refuse past this many outstanding bytes; 0 = no cap */
    size_t max_align; /* refuse larger alignments; 0 = any */
    size_t outstanding, calls, allocs, frees, mismatches, trims;
    size_t last_alloc_bytes, last_alloc_align, last_free_bytes, last_free_align;
    void *last_free_ptr;
    struct {
        void *p;
        size_t n, a;
    } live[REC_LIVE];
    int nlive;
    int *finalized;
} rec_t;

static rankmem_status_t rec_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                     rankmem_stream_t stream, void **ptr_p)
{
    (void)stream;
    rec_t *r = (rec_t *)mr;
    rankmem_status_t st = RANKMEM_SUCCESS;
    pthread_mutex_lock(&r->lock);
    r->calls++;
    r->last_alloc_bytes = bytes;
    r->last_alloc_align = alignment;
    void *p = NULL;
    if (r->max_align && alignment > r->max_align)
        st = RANKMEM_ERR_NOT_SUPPORTED;
    else if ((r->cap && bytes > r->cap - r->outstanding) || r->nlive == REC_LIVE)
        st = RANKMEM_ERR_OUT_OF_MEMORY;
    else if (posix_memalign(&p, alignment, bytes))
        st = RANKMEM_ERR_OUT_OF_MEMORY;
    else {
        r->live[r->nlive].p = p, r->live[r->nlive].n = bytes, r->live[r->nlive].a = alignment;
        r->nlive++;
        r->outstanding += bytes;
        r->allocs++;
        *ptr_p = p;
    }
    pthread_mutex_unlock(&r->lock);
    return st;
}

static rankmem_status_t rec_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                       size_t alignment, rankmem_stream_t stream)
{
    (void)stream;
    rec_t *r = (rec_t *)mr;
    rankmem_status_t st = RANKMEM_ERR_INVALID_POINTER;
    pthread_mutex_lock(&r->lock);
    r->last_free_ptr = ptr;
    r->last_free_bytes = bytes;
    r->last_free_align = alignment;
    for (int i = 0; i < r->nlive; i++)
        if (r->live[i].p == ptr) {
            if (r->live[i].n == bytes && r->live[i].a == alignment) {
                free(ptr);
                r->outstanding -= bytes;
                r->frees++;
                r->live[i] = r->live[--r->nlive];
                st = RANKMEM_SUCCESS;
            }
            break;
        }
    if (st != RANKMEM_SUCCESS)
        r->mismatches++;
    pthread_mutex_unlock(&r->lock);
    return st;
}

static rankmem_status_t rec_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    (void)keep_bytes;
    rec_t *r = (rec_t *)mr;
    r->trims++; /* unlocked on purpose: only ever called from one thread here */
    return RANKMEM_SUCCESS;
}

static rankmem_status_t rec_finalize(rankmem_resource_t *mr)
{
    rec_t *r = (rec_t *)mr;
    if (r->finalized)
        *r->finalized = 1;
    for (int i = 0; i < r->nlive; i++)
        free(r->live[i].p);
    pthread_mutex_destroy(&r->lock);
    free(r);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t rec_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "recorder",
    .allocate = rec_allocate,
    .deallocate = rec_deallocate,
    .trim = rec_trim,
    .finalize = rec_finalize,
};

static rec_t *rec_new(size_t cap, size_t max_align, int *finalized)
{
    rec_t *r = calloc(1, sizeof *r);
    if (!r || rankmem_resource_init(&r->base, &rec_ops, RANKMEM_PROP_HOST_ACCESSIBLE, NULL))
        BAIL_OUT("recorder: cannot create");
    pthread_mutex_init(&r->lock, NULL);
    r->cap = cap;
    r->max_align = max_align;
    r->finalized = finalized;
    if (finalized)
        *finalized = 0;
    return r;
}

static size_t rec_get(rec_t *r, const size_t *field)
{
    pthread_mutex_lock(&r->lock);
    size_t v = *field;
    pthread_mutex_unlock(&r->lock);
    return v;
}

/* ---- what every adaptor shares: header, description, bad inputs ---------- */

static void check_header(rankmem_resource_t *mr, rankmem_resource_t *up, const char *name,
                         const char *want_describe)
{
    const char *got = NULL;
    unsigned props = ~0u, up_props = 0;
    int dev = -2, up_dev = -3;
    rankmem_resource_t *u = NULL;
    rankmem_resource_name(mr, &got);
    ok(got && strcmp(got, name) == 0, "%s: named '%s'", name, got ? got : "(null)");
    rankmem_resource_properties(mr, &props);
    rankmem_resource_properties(up, &up_props);
    ok(props == up_props, "%s: the upstream's properties (0x%x, 0x%x)", name, props, up_props);
    rankmem_resource_device(mr, &dev);
    rankmem_resource_device(up, &up_dev);
    ok(dev == up_dev, "%s: the upstream's device (%d, %d)", name, dev, up_dev);
    rankmem_resource_upstream(mr, &u);
    ok(u == up, "%s: its upstream is the one given", name);

    char buf[128], small[4];
    int n = mr->ops->describe ? mr->ops->describe(mr, buf, sizeof buf) : -1;
    ok(n >= 0 && strcmp(buf, want_describe) == 0 && (size_t)n == strlen(want_describe),
       "%s: described as '%s' (got '%s', %d)", name, want_describe, n >= 0 ? buf : "", n);
    memset(small, 'x', sizeof small);
    n = mr->ops->describe ? mr->ops->describe(mr, small, sizeof small) : -1;
    ok(n == (int)strlen(want_describe) && small[3] == '\0' &&
           strncmp(small, want_describe, 3) == 0,
       "%s: describe into 4 bytes truncates, terminates and says the length needed (%d)", name,
       n);
}

/* A failed constructor leaves *mr_p alone and says why. */
#define BAD_CREATE(call, want, mr, what)                                                       \
    do {                                                                                       \
        rankmem_clear_error();                                                                 \
        mr = (rankmem_resource_t *)&mr;                                                        \
        is_status(call, want, "%s", what);                                                     \
        ok(mr == (rankmem_resource_t *)&mr && rankmem_last_error()[0],                         \
           "%s: output untouched, says: %s", what, rankmem_last_error());                      \
    } while (0)

static void test_bad_inputs(void)
{
    rankmem_resource_t *sys, *mr;
    if (rankmem_system_create(&sys) != RANKMEM_SUCCESS)
        BAIL_OUT("system_create");
    BAD_CREATE(rankmem_limit_create(NULL, 100, &mr), RANKMEM_ERR_INVALID_ARGUMENT, mr,
               "limit_create(NULL upstream)");
    is_status(rankmem_limit_create(sys, 100, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "limit_create(NULL mr_p)");
    BAD_CREATE(rankmem_limit_create(sys, 0, &mr), RANKMEM_ERR_INVALID_ARGUMENT, mr,
               "limit_create(0 bytes)");
    BAD_CREATE(rankmem_aligned_create(NULL, 4096, 0, &mr), RANKMEM_ERR_INVALID_ARGUMENT, mr,
               "aligned_create(NULL upstream)");
    is_status(rankmem_aligned_create(sys, 4096, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "aligned_create(NULL mr_p)");
    /* Above RANKMEM_MAX_ALIGNMENT (1 GiB) every allocation would fail (issue 31, defect 5). */
    static const size_t bad_aligns[] = {0, 1, 128, 3000, 4097, (size_t)2 << 30, (size_t)1 << 40,
                                        (size_t)1 << 63};
    for (size_t i = 0; i < sizeof bad_aligns / sizeof bad_aligns[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "aligned_create(alignment %zu)", bad_aligns[i]);
        BAD_CREATE(rankmem_aligned_create(sys, bad_aligns[i], 0, &mr),
                   RANKMEM_ERR_INVALID_ARGUMENT, mr, what);
    }
    BAD_CREATE(rankmem_retry_create(NULL, NULL, NULL, &mr), RANKMEM_ERR_INVALID_ARGUMENT, mr,
               "retry_create(NULL upstream)");
    is_status(rankmem_retry_create(sys, NULL, NULL, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "retry_create(NULL mr_p)");
    BAD_CREATE(rankmem_threadsafe_create(NULL, &mr), RANKMEM_ERR_INVALID_ARGUMENT, mr,
               "threadsafe_create(NULL upstream)");
    is_status(rankmem_threadsafe_create(sys, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "threadsafe_create(NULL mr_p)");
    BAD_CREATE(rankmem_prefetch_create(NULL, &mr), RANKMEM_ERR_INVALID_ARGUMENT, mr,
               "prefetch_create(NULL upstream)");
    is_status(rankmem_prefetch_create(sys, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "prefetch_create(NULL mr_p)");
    BAD_CREATE(rankmem_prefetch_create(sys, &mr), RANKMEM_ERR_NOT_SUPPORTED, mr,
               "prefetch_create over host memory");
    ok(strstr(rankmem_last_error(), "system") != NULL, "prefetch: the error names the upstream");

    /* Managed-like props: whether it can be made depends on the build and machine. */
    rec_t *both = rec_new(0, 0, NULL);
    both->base.props = RANKMEM_PROP_HOST_ACCESSIBLE | RANKMEM_PROP_DEVICE_ACCESSIBLE;
    int ndev = 0;
    rankmem_device_count(&ndev);
    if (!rankmem_have_cuda() && !rankmem_have_hip())
        BAD_CREATE(rankmem_prefetch_create(&both->base, &mr), RANKMEM_ERR_NOT_SUPPORTED, mr,
                   "prefetch_create in a build without a GPU runtime");
    else if (ndev == 0)
        BAD_CREATE(rankmem_prefetch_create(&both->base, &mr), RANKMEM_ERR_NO_DEVICE, mr,
                   "prefetch_create without a GPU");
    else {
        rankmem_status_t st = rankmem_prefetch_create(&both->base, &mr);
        ok(st == RANKMEM_SUCCESS || st == RANKMEM_ERR_NOT_SUPPORTED,
           "prefetch_create over managed-like memory on a GPU: %s", rankmem_status_string(st));
        if (st == RANKMEM_SUCCESS)
            rankmem_resource_release(mr);
        tap_skip(1, "a GPU is present: tests/gpu_prefetch.t covers it");
    }
    rankmem_resource_release(&both->base);

    /* Nothing was retained by the failures: one release frees the upstream. */
    int fin;
    counting_t *c = counting_new(&fin);
    mr = NULL;
    rankmem_limit_create(&c->base, 0, &mr);
    rankmem_aligned_create(&c->base, 100, 0, &mr);
    rankmem_prefetch_create(&c->base, &mr);
    rankmem_resource_release(&c->base);
    ok(fin == 1 && mr == NULL, "failed constructors hold no reference on the upstream");
    rankmem_resource_release(sys);
}

/* ---- limit ------------------------------------------------------------- */

static void test_limit_on(rankmem_resource_t *up, const char *on)
{
    const size_t L = 10000;
    rankmem_resource_t *lim;
    is_status(rankmem_limit_create(up, L, &lim), RANKMEM_SUCCESS, "limit over %s: create", on);
    void *a = NULL, *b = NULL, *c = (void *)&c;
    ok(q(lim, RANKMEM_QUERY_LIMIT) == L, "limit over %s: LIMIT query", on);
    is_status(rankmem_allocate(lim, 6000, 0, &a), RANKMEM_SUCCESS, "limit over %s: 6000 bytes", on);
    ok(q(lim, RANKMEM_QUERY_USED_CURRENT) == 6000, "limit over %s: used 6000", on);
    is_status(rankmem_allocate(lim, 4001, 0, &c), RANKMEM_ERR_LIMIT,
              "limit over %s: 4001 more is one byte too many", on);
    ok(c == (void *)&c, "limit over %s: refused: output untouched", on);
    const char *e = rankmem_last_error();
    ok(strstr(e, "4001") && strstr(e, "6000") && strstr(e, "10000"),
       "limit over %s: the error has the sizes: %s", on, e);
    ok(q(lim, RANKMEM_QUERY_USED_CURRENT) == 6000, "limit over %s: a refusal counts nothing", on);
    is_status(rankmem_allocate(lim, 4000, 0, &b), RANKMEM_SUCCESS,
              "limit over %s: 4000 more reaches the limit exactly", on);
    ok(q(lim, RANKMEM_QUERY_USED_CURRENT) == L && q(lim, RANKMEM_QUERY_USED_HIGH) == L,
       "limit over %s: used and high-water at the limit", on);
    is_status(rankmem_allocate(lim, 1, 0, &c), RANKMEM_ERR_LIMIT, "limit over %s: not one byte more",
              on);
    is_status(rankmem_deallocate(lim, a, 6000, 0), RANKMEM_SUCCESS, "limit over %s: free 6000", on);
    ok(q(lim, RANKMEM_QUERY_USED_CURRENT) == 4000 && q(lim, RANKMEM_QUERY_USED_HIGH) == L,
       "limit over %s: a free lowers used (4000), not the high-water mark", on);
    is_status(rankmem_allocate(lim, 6000, 0, &a), RANKMEM_SUCCESS,
              "limit over %s: the freed bytes can be had again", on);
    /* A free the upstream refuses changes nothing (only a pool can tell). */
    if (strcmp(on, "pool") == 0) {
        is_status(rankmem_deallocate(lim, a, 5999, 0), RANKMEM_ERR_INVALID_POINTER,
                  "limit over pool: a free with the wrong size is refused");
        ok(q(lim, RANKMEM_QUERY_USED_CURRENT) == L, "limit over pool: and still counted");
    }
    rankmem_deallocate(lim, a, 6000, 0);
    rankmem_deallocate(lim, b, 4000, 0);
    ok(q(lim, RANKMEM_QUERY_USED_CURRENT) == 0, "limit over %s: used 0 after the frees", on);
    rankmem_resource_release(lim);
}

static void test_limit(void)
{
    int fin;
    counting_t *c = counting_new(&fin);
    test_limit_on(&c->base, "counting");
    ok(c->outstanding_blocks == 0, "limit over counting: everything went back upstream");
    rankmem_resource_t *pool = pool_over(&c->base, 0, 64 * KiB);
    test_limit_on(pool, "pool");

    rankmem_resource_t *lim;
    rankmem_limit_create(pool, 1 * MiB, &lim);
    check_header(lim, pool, "limit", "limit(bytes=1MiB)");
    /* The upstream's refusal gives the reservation back. */
    void *p = (void *)&p;
    is_status(rankmem_allocate(lim, 100 * KiB, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY,
              "limit over pool: the pool (max 64 KiB) refuses 100 KiB under the limit");
    ok(p == (void *)&p && q(lim, RANKMEM_QUERY_USED_CURRENT) == 0 &&
           q(lim, RANKMEM_QUERY_USED_HIGH) == 0,
       "limit over pool: nothing counted for what the upstream refused");
    ok(q(lim, RANKMEM_QUERY_POOL_MAX) == 64 * KiB, "limit: other queries go to the upstream");
    ok(q(lim, RANKMEM_QUERY_RESERVED_CURRENT) > 0, "limit over pool: the pool holds a chunk");
    is_status(rankmem_resource_trim(lim, 0), RANKMEM_SUCCESS, "limit: trim");
    ok(q(pool, RANKMEM_QUERY_RESERVED_CURRENT) == 0 && c->outstanding_blocks == 0,
       "limit: trim reached the pool, which gave its idle chunk back");
    rankmem_resource_release(lim);

    rankmem_limit_create(&c->base, 3 * ((size_t)1 << 30), &lim);
    check_header(lim, &c->base, "limit", "limit(bytes=3GiB)");
    rankmem_resource_release(lim);
    rankmem_limit_create(&c->base, 1536, &lim);
    check_header(lim, &c->base, "limit", "limit(bytes=1536)");
    rankmem_resource_release(lim);

    rankmem_resource_release(pool);
    rankmem_resource_release(&c->base);
    ok(fin, "limit: the chains are freed");
}

/* 8 threads race for a limit; each counts what it holds in a shared counter,
 * raised after allocate and lowered before deallocate, so the counter is at
 * most what the adaptor counts and must never pass the limit. */
#define LIMIT_RACE (256 * KiB)
#define RACE_STEPS 20000

static rankmem_resource_t *race_mr;
static size_t race_live, race_max;
static int race_refused[NTHREADS], race_errors[NTHREADS];

static void *limit_worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    unsigned long long s = 777 + (unsigned long long)id;
    struct {
        void *p;
        size_t n;
    } mine[16];
    int n = 0;
    for (int step = 0; step < RACE_STEPS; step++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        unsigned long long r = s * 2685821657736338717ull;
        if (n < 16 && (n == 0 || r % 2)) {
            size_t bytes = 1 + (size_t)(r >> 20) % (32 * KiB);
            void *p;
            rankmem_status_t st = rankmem_allocate(race_mr, bytes, 0, &p);
            if (st == RANKMEM_ERR_LIMIT) {
                race_refused[id]++;
                continue;
            }
            if (st != RANKMEM_SUCCESS) {
                race_errors[id]++;
                continue;
            }
            size_t now = __atomic_add_fetch(&race_live, bytes, __ATOMIC_SEQ_CST);
            size_t m = __atomic_load_n(&race_max, __ATOMIC_RELAXED);
            while (m < now && !__atomic_compare_exchange_n(&race_max, &m, now, 1,
                                                           __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                ;
            memset(p, id, bytes < 64 ? bytes : 64);
            mine[n].p = p, mine[n].n = bytes;
            n++;
        } else {
            int i = (int)(r % (unsigned)n);
            __atomic_sub_fetch(&race_live, mine[i].n, __ATOMIC_SEQ_CST);
            if (rankmem_deallocate(race_mr, mine[i].p, mine[i].n, 0) != RANKMEM_SUCCESS)
                race_errors[id]++;
            mine[i] = mine[--n];
        }
    }
    while (n > 0) {
        n--;
        __atomic_sub_fetch(&race_live, mine[n].n, __ATOMIC_SEQ_CST);
        if (rankmem_deallocate(race_mr, mine[n].p, mine[n].n, 0) != RANKMEM_SUCCESS)
            race_errors[id]++;
    }
    return NULL;
}

static void limit_race_on(rankmem_resource_t *up, const char *on)
{
    if (rankmem_limit_create(up, LIMIT_RACE, &race_mr) != RANKMEM_SUCCESS)
        BAIL_OUT("limit_create: %s", rankmem_last_error());
    race_live = race_max = 0;
    memset(race_refused, 0, sizeof race_refused);
    memset(race_errors, 0, sizeof race_errors);
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        if (pthread_create(&t[i], NULL, limit_worker, (void *)(intptr_t)i))
            BAIL_OUT("pthread_create");
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    int refused = 0, errors = 0;
    for (int i = 0; i < NTHREADS; i++)
        refused += race_refused[i], errors += race_errors[i];
    ok(race_max <= LIMIT_RACE, "limit race over %s: at most %zu bytes held at once (%zu)", on,
       LIMIT_RACE, race_max);
    ok(refused > 0 && race_max > LIMIT_RACE / 2,
       "limit race over %s: the limit was reached (%d refusals, %zu bytes at most)", on, refused,
       race_max);
    ok(errors == 0, "limit race over %s: no other failure (%d)", on, errors);
    size_t high = q(race_mr, RANKMEM_QUERY_USED_HIGH);
    ok(q(race_mr, RANKMEM_QUERY_USED_CURRENT) == 0 && high <= LIMIT_RACE && high >= race_max,
       "limit race over %s: used back to 0; high-water %zu within the limit", on, high);
    rankmem_resource_release(race_mr);
}

static void test_limit_race(void)
{
    counting_t *c = counting_new(NULL);
    limit_race_on(&c->base, "counting");
    ok(c->outstanding_blocks == 0 && c->outstanding_bytes == 0,
       "limit race over counting: nothing left upstream");
    rankmem_resource_t *pool = pool_over(&c->base, 0, SIZE_MAX);
    limit_race_on(pool, "pool");
    ok(q(pool, RANKMEM_QUERY_USED_CURRENT) == 0 && q(pool, RANKMEM_QUERY_LIVE_COUNT) == 0,
       "limit race over pool: nothing live in the pool");
    rankmem_resource_release(pool);
    rankmem_resource_release(&c->base);
}

/* ---- aligned ----------------------------------------------------------- */

static void test_aligned_pass_through(void)
{
    int fin;
    rec_t *r = rec_new(0, 0, &fin);
    rankmem_resource_t *al;
    is_status(rankmem_aligned_create(&r->base, 4096, 64 * KiB, &al), RANKMEM_SUCCESS,
              "aligned(4096, 64 KiB): create");
    check_header(al, &r->base, "aligned", "aligned(alignment=4096,threshold=64KiB)");

    static const struct {
        size_t bytes, align, want;
    } cases[] = {
        {64 * KiB, 0, 4096},        /* at the threshold */
        {64 * KiB + 1, 512, 4096},  /* above, asked for less */
        {MiB, 16384, 16384},        /* above, asked for more: that wins */
        {64 * KiB - 1, 0, 256},     /* below: as asked */
        {1000, 1024, 1024},         /* below: as asked */
        {1, 0, 256},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t bytes = cases[i].bytes, want = cases[i].want;
        void *p = NULL;
        rankmem_status_t st = rankmem_allocate(al, bytes, cases[i].align, &p);
        is_status(st, RANKMEM_SUCCESS, "aligned: %zu bytes at %zu", bytes, cases[i].align);
        if (st != RANKMEM_SUCCESS)
            continue;
        ok(r->last_alloc_align == want && r->last_alloc_bytes == bytes,
           "aligned: %zu bytes: the upstream got alignment %zu (want %zu)", bytes,
           r->last_alloc_align, want);
        ok((uintptr_t)p % want == 0, "aligned: %zu bytes: %p is %zu-aligned", bytes, p, want);
        memset(p, 0xab, bytes);
        is_status(rankmem_deallocate(al, p, bytes, cases[i].align), RANKMEM_SUCCESS,
                  "aligned: free %zu bytes", bytes);
        ok(r->last_free_ptr == p && r->last_free_align == want && r->last_free_bytes == bytes,
           "aligned: %zu bytes: the upstream got the same alignment on free (%zu)", bytes,
           r->last_free_align);
    }

    /* Threshold 0: every request. */
    rankmem_resource_t *al0;
    rankmem_aligned_create(&r->base, 65536, 0, &al0);
    check_header(al0, &r->base, "aligned", "aligned(alignment=65536,threshold=0)");
    void *p = NULL;
    is_status(rankmem_allocate(al0, 1, 0, &p), RANKMEM_SUCCESS, "aligned(threshold 0): 1 byte");
    ok(p && (uintptr_t)p % 65536 == 0 && r->last_alloc_align == 65536,
       "aligned(threshold 0): even 1 byte is 64 KiB-aligned");
    rankmem_deallocate(al0, p, 1, 0);
    ok(r->last_free_align == 65536, "aligned(threshold 0): freed at the same alignment");
    /* Too large to pad by the alignment: refused, not wrapped around. */
    p = (void *)&p;
    is_status(rankmem_allocate(al0, SIZE_MAX / 2 - 1024, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY,
              "aligned: a size that would overflow with the alignment is refused");
    ok(p == (void *)&p, "aligned: overflow refused: output untouched");
    rankmem_resource_release(al0);

    ok(r->outstanding == 0 && r->mismatches == 0,
       "aligned: every free matched its allocation upstream (%zu mismatches)", r->mismatches);
    rankmem_resource_release(al);
    rankmem_resource_release(&r->base);
    ok(fin, "aligned: the chain is freed");
}

/* An upstream that, like cudaMalloc, guarantees only 256 bytes: the adaptor
 * pads and aligns inside, and frees what it really got. */
static void test_aligned_padded(void)
{
    int fin;
    rec_t *r = rec_new(0, 256, &fin);
    rankmem_resource_t *al;
    rankmem_aligned_create(&r->base, 4096, 8 * KiB, &al);
    void *p = NULL;
    rankmem_status_t st = rankmem_allocate(al, 10000, 0, &p);
    is_status(st, RANKMEM_SUCCESS, "aligned over a 256-only upstream: 10000 bytes");
    ok(p && (uintptr_t)p % 4096 == 0, "aligned padded: %p is 4096-aligned", p);
    ok(r->last_alloc_bytes == 10000 + 4096 - 256 && r->last_alloc_align == 256,
       "aligned padded: asked the upstream for %zu bytes at 256 (got %zu at %zu)",
       (size_t)10000 + 4096 - 256, r->last_alloc_bytes, r->last_alloc_align);
    if (st == RANKMEM_SUCCESS) {
        memset(p, 0x5a, 10000); /* all of it is ours (ASan would say otherwise) */
        is_status(rankmem_deallocate(al, p, 10000, 0), RANKMEM_SUCCESS, "aligned padded: free");
        ok(r->outstanding == 0 && r->mismatches == 0 && r->last_free_bytes == 10000 + 4096 - 256,
           "aligned padded: the upstream block went back whole");
    }
    /* Below the threshold: straight through. */
    p = NULL;
    rankmem_allocate(al, 100, 0, &p);
    ok(r->last_alloc_bytes == 100 && r->last_alloc_align == 256,
       "aligned padded: small requests are not padded");
    rankmem_deallocate(al, p, 100, 0);

    /* Many at once, freed in a scrambled order. */
    enum { N = 300 };
    static void *ps[N];
    int misaligned = 0, failed = 0;
    for (int i = 0; i < N; i++) {
        size_t bytes = 8 * KiB + (size_t)i * 37;
        if (rankmem_allocate(al, bytes, 0, &ps[i]) != RANKMEM_SUCCESS) {
            failed++;
            ps[i] = NULL;
            continue;
        }
        misaligned += (uintptr_t)ps[i] % 4096 != 0;
        memset(ps[i], i & 0xff, bytes);
    }
    for (int k = 0; k < N; k++) {
        int i = (k * 7) % N; /* 7 and 300 are coprime: every index once */
        if (ps[i] && rankmem_deallocate(al, ps[i], 8 * KiB + (size_t)i * 37, 0) != RANKMEM_SUCCESS)
            failed++;
    }
    ok(failed == 0 && misaligned == 0, "aligned padded: %d blocks, %d failures, %d misaligned", N,
       failed, misaligned);
    ok(r->outstanding == 0 && r->mismatches == 0, "aligned padded: all given back exactly");
    /* A pointer it never gave out is the upstream's to refuse. */
    char foreign[16];
    is_status(rankmem_deallocate(al, foreign, 10000, 0), RANKMEM_ERR_INVALID_POINTER,
              "aligned padded: a foreign pointer is refused");
    rankmem_resource_release(al);
    rankmem_resource_release(&r->base);
    ok(fin, "aligned padded: the chain is freed");
}

static void test_aligned_pool(void)
{
    counting_t *c = counting_new(NULL);
    rankmem_resource_t *pool = pool_over(&c->base, 0, SIZE_MAX), *al;
    rankmem_aligned_create(pool, 8192, 4096, &al);
    check_header(al, pool, "aligned", "aligned(alignment=8192,threshold=4KiB)");
    test_seed(42);
    enum { N = 200 };
    static struct {
        void *p;
        size_t n;
    } b[N];
    int misaligned = 0, failed = 0, big = 0;
    for (int i = 0; i < N; i++) {
        b[i].n = test_log_size(1, 256 * KiB);
        if (rankmem_allocate(al, b[i].n, 0, &b[i].p) != RANKMEM_SUCCESS) {
            failed++;
            b[i].p = NULL;
            continue;
        }
        if (b[i].n >= 4096) {
            big++;
            misaligned += (uintptr_t)b[i].p % 8192 != 0;
        }
        memset(b[i].p, 1, b[i].n);
    }
    for (int i = 0; i < N; i++)
        if (b[i].p && rankmem_deallocate(al, b[i].p, b[i].n, 0) != RANKMEM_SUCCESS)
            failed++;
    ok(failed == 0 && big > N / 4 && misaligned == 0,
       "aligned over pool: %d of %d blocks at or above the threshold, %d misaligned, %d failures",
       big, N, misaligned, failed);
    ok(q(al, RANKMEM_QUERY_LIVE_COUNT) == 0 && q(al, RANKMEM_QUERY_USED_CURRENT) == 0,
       "aligned over pool: queries reach the pool; nothing live");
    is_status(rankmem_resource_trim(al, 0), RANKMEM_SUCCESS, "aligned: trim");
    ok(c->outstanding_blocks == 0, "aligned: trim reached the pool");
    rankmem_resource_release(al);
    rankmem_resource_release(pool);
    rankmem_resource_release(&c->base);
}

/* ---- retry ------------------------------------------------------------- */

typedef struct {
    int calls, attempts[32];
    rankmem_status_t statuses[32];
    size_t bytes[32];
    rankmem_resource_t *mr_seen;
    int free_at;       /* free the ballast after this attempt (0: never) */
    int give_up_after; /* return 0 after this attempt (0: never) */
    rankmem_resource_t *ballast_mr;
    void *ballast;
    size_t ballast_bytes;
} cb_state_t;

static int retry_cb(void *arg, rankmem_resource_t *mr, size_t bytes, rankmem_status_t status,
                    int attempt)
{
    cb_state_t *s = arg;
    if (s->calls < 32) {
        s->attempts[s->calls] = attempt;
        s->statuses[s->calls] = status;
        s->bytes[s->calls] = bytes;
    }
    s->calls++;
    s->mr_seen = mr;
    if (s->free_at && attempt == s->free_at && s->ballast) {
        rankmem_deallocate(s->ballast_mr, s->ballast, s->ballast_bytes, 0);
        s->ballast = NULL;
    }
    return !(s->give_up_after && attempt >= s->give_up_after);
}

static int attempts_are_1_to_n(const cb_state_t *s)
{
    for (int i = 0; i < s->calls && i < 32; i++)
        if (s->attempts[i] != i + 1)
            return 0;
    return 1;
}

static void test_retry_callback(void)
{
    int fin;
    rec_t *r = rec_new(64 * KiB, 0, &fin);
    cb_state_t s;
    memset(&s, 0, sizeof s);
    rankmem_resource_t *rt;
    is_status(rankmem_retry_create(&r->base, retry_cb, &s, &rt), RANKMEM_SUCCESS,
              "retry: create with a callback");
    check_header(rt, &r->base, "retry", "retry");

    /* The upstream is full of ballast; the callback frees it after attempt 2. */
    s.ballast_mr = &r->base, s.ballast_bytes = 48 * KiB, s.free_at = 2;
    if (rankmem_allocate(&r->base, s.ballast_bytes, 0, &s.ballast) != RANKMEM_SUCCESS)
        BAIL_OUT("ballast");
    size_t calls0 = r->calls;
    void *p = NULL;
    rankmem_status_t st = rankmem_allocate(rt, 32 * KiB, 0, &p);
    is_status(st, RANKMEM_SUCCESS, "retry: 32 KiB succeed once the callback freed memory");
    ok(s.calls == 2 && attempts_are_1_to_n(&s), "retry: the callback saw attempts 1, 2 (%d calls)",
       s.calls);
    ok(s.statuses[0] == RANKMEM_ERR_OUT_OF_MEMORY && s.statuses[1] == RANKMEM_ERR_OUT_OF_MEMORY &&
           s.bytes[0] == 32 * KiB && s.mr_seen == rt,
       "retry: the callback got the status, the size and the retry resource");
    ok(r->calls - calls0 == 3, "retry: three upstream attempts (%zu)", r->calls - calls0);
    if (st == RANKMEM_SUCCESS)
        rankmem_deallocate(rt, p, 32 * KiB, 0);
    if (s.ballast)
        rankmem_deallocate(&r->base, s.ballast, s.ballast_bytes, 0);

    /* The callback gives up at once: the upstream's status comes back. */
    memset(&s, 0, sizeof s);
    s.give_up_after = 1;
    p = (void *)&p;
    calls0 = r->calls;
    is_status(rankmem_allocate(rt, 65 * KiB, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY,
              "retry: the callback declines: out of memory");
    ok(p == (void *)&p && s.calls == 1 && r->calls - calls0 == 1,
       "retry: declined: output untouched, one attempt, one callback");
    ok(strstr(rankmem_last_error(), "retry") && strstr(rankmem_last_error(), "66560"),
       "retry: the error says so: %s", rankmem_last_error());

    /* A callback that always says "again" is stopped. */
    memset(&s, 0, sizeof s);
    calls0 = r->calls;
    is_status(rankmem_allocate(rt, 65 * KiB, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY,
              "retry: a callback that never gives up does not hang");
    ok(r->calls - calls0 == 16 && s.calls == 15 && attempts_are_1_to_n(&s),
       "retry: 16 attempts, the callback asked after each of the first 15 (%zu, %d)",
       r->calls - calls0, s.calls);
    ok(strstr(rankmem_last_error(), "16 attempts") != NULL, "retry: the error says: %s",
       rankmem_last_error());

    /* Other failures are not retried. */
    r->max_align = 4096;
    memset(&s, 0, sizeof s);
    calls0 = r->calls;
    is_status(rankmem_allocate(rt, 1024, 8192, &p), RANKMEM_ERR_NOT_SUPPORTED,
              "retry: not supported comes back unchanged");
    ok(s.calls == 0 && r->calls - calls0 == 1, "retry: and without a callback or a second try");
    r->max_align = 0;
    rankmem_resource_release(rt);
    ok(r->outstanding == 0 && r->mismatches == 0, "retry: nothing left upstream");
    rankmem_resource_release(&r->base);
    ok(fin, "retry: the chain is freed");

    /* A limit below refuses with RANKMEM_ERR_LIMIT: that is retried too. */
    counting_t *c = counting_new(&fin);
    rankmem_resource_t *lim;
    rankmem_limit_create(&c->base, 64 * KiB, &lim);
    memset(&s, 0, sizeof s);
    s.ballast_mr = lim, s.ballast_bytes = 40 * KiB, s.free_at = 1;
    rankmem_allocate(lim, s.ballast_bytes, 0, &s.ballast);
    rankmem_retry_create(lim, retry_cb, &s, &rt);
    st = rankmem_allocate(rt, 30 * KiB, 0, &p);
    is_status(st, RANKMEM_SUCCESS, "retry over limit: succeeds after the callback freed");
    ok(s.calls == 1 && s.statuses[0] == RANKMEM_ERR_LIMIT,
       "retry over limit: the callback saw the limit status");
    if (st == RANKMEM_SUCCESS)
        rankmem_deallocate(rt, p, 30 * KiB, 0);
    if (s.ballast)
        rankmem_deallocate(lim, s.ballast, s.ballast_bytes, 0);
    rankmem_resource_release(rt);
    rankmem_resource_release(lim);
    ok(c->outstanding_blocks == 0, "retry over limit: nothing left");
    rankmem_resource_release(&c->base);
}

/* retry(NULL) > pool > upstream of 4 MiB. The pool's idle 2 MiB initial
 * chunk leaves too little upstream for 3 MiB more (it grows by exactly what
 * it needs) until the default callback trims the pool. */
static void retry_default_over_pool(rankmem_resource_t *up, const char *what,
                                    rankmem_status_t refusal, size_t (*held)(rankmem_resource_t *))
{
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = 2 * MiB;
    prm.growth_size = 256; /* grow by what is needed */
    rankmem_resource_t *pool, *rt;
    if (rankmem_pool_create(up, &prm, &pool) != RANKMEM_SUCCESS)
        BAIL_OUT("pool_create: %s", rankmem_last_error());
    is_status(rankmem_retry_create(pool, NULL, NULL, &rt), RANKMEM_SUCCESS,
              "retry(default) over pool over %s: create", what);
    void *small = NULL, *big = NULL;
    if (rankmem_allocate(rt, 1024, 0, &small) == RANKMEM_SUCCESS)
        rankmem_deallocate(rt, small, 1024, 0);
    ok(q(pool, RANKMEM_QUERY_RESERVED_CURRENT) == 2 * MiB && held(up) == 2 * MiB,
       "over %s: the pool holds an idle 2 MiB chunk", what);
    /* Without retry the pool refuses. */
    void *p = NULL;
    rankmem_status_t alone = rankmem_allocate(pool, 3 * MiB, 0, &p);
    is_status(alone, refusal, "over %s: the pool alone cannot get 3 MiB more", what);
    if (alone == RANKMEM_SUCCESS)
        rankmem_deallocate(pool, p, 3 * MiB, 0);
    rankmem_status_t st = rankmem_allocate(rt, 3 * MiB, 0, &big);
    is_status(st, RANKMEM_SUCCESS,
              "over %s: through retry it can: the pool was trimmed and the retry fit", what);
    ok(q(pool, RANKMEM_QUERY_RESERVED_CURRENT) == 3 * MiB && held(up) == 3 * MiB,
       "over %s: the idle chunk went back; the pool holds just the new one", what);
    /* Trimming cannot help here: one trim, one retry, then the refusal. */
    p = (void *)&p;
    is_status(rankmem_allocate(rt, 2 * MiB, 0, &p), refusal,
              "over %s: what cannot fit is still refused", what);
    ok(p == (void *)&p && strstr(rankmem_last_error(), "retry") != NULL,
       "over %s: output untouched; says: %s", what, rankmem_last_error());
    if (st == RANKMEM_SUCCESS)
        rankmem_deallocate(rt, big, 3 * MiB, 0);
    rankmem_resource_release(rt);
    rankmem_resource_release(pool);
}

static rec_t *held_rec;
static size_t rec_held(rankmem_resource_t *up)
{
    (void)up;
    return rec_get(held_rec, &held_rec->outstanding);
}
static size_t limit_held(rankmem_resource_t *up) { return q(up, RANKMEM_QUERY_USED_CURRENT); }

static void test_retry_default(void)
{
    int fin;
    held_rec = rec_new(4 * MiB, 0, &fin);
    retry_default_over_pool(&held_rec->base, "a 4 MiB upstream", RANKMEM_ERR_OUT_OF_MEMORY,
                            rec_held);
    ok(held_rec->outstanding == 0 && held_rec->mismatches == 0, "retry(default): all given back");

    /* Exactly two attempts when trimming cannot help. */
    rankmem_resource_t *rt;
    rankmem_retry_create(&held_rec->base, NULL, NULL, &rt);
    size_t calls0 = held_rec->calls, trims0 = held_rec->trims;
    void *p;
    is_status(rankmem_allocate(rt, 5 * MiB, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY,
              "retry(default): 5 MiB from a 4 MiB upstream is refused");
    ok(held_rec->calls - calls0 == 2 && held_rec->trims - trims0 == 1,
       "retry(default): one trim and one retry (%zu attempts, %zu trims)",
       held_rec->calls - calls0, held_rec->trims - trims0);
    rankmem_resource_release(rt);

    /* Below a threadsafe adaptor, the upstream is trimmed under its lock only. */
    rankmem_resource_t *ts;
    rankmem_threadsafe_create(&held_rec->base, &ts);
    rankmem_retry_create(ts, NULL, NULL, &rt);
    trims0 = held_rec->trims;
    is_status(rankmem_allocate(rt, 5 * MiB, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY,
              "retry(default) over threadsafe: refused");
    ok(held_rec->trims - trims0 == 1,
       "retry(default) over threadsafe: the guarded upstream trimmed once, through the lock "
       "(%zu)",
       held_rec->trims - trims0);
    rankmem_resource_release(rt);
    rankmem_resource_release(ts);
    rankmem_resource_release(&held_rec->base);
    ok(fin, "retry(default): the chain is freed");

    /* The same with a limit adaptor as the cap. */
    counting_t *c = counting_new(&fin);
    rankmem_resource_t *lim;
    rankmem_limit_create(&c->base, 4 * MiB, &lim);
    retry_default_over_pool(lim, "a 4 MiB limit", RANKMEM_ERR_LIMIT, limit_held);
    rankmem_resource_release(lim);
    ok(c->outstanding_blocks == 0, "retry(default) over limit: all given back");
    rankmem_resource_release(&c->base);
    ok(fin, "retry(default) over limit: the chain is freed");
}

/* ---- threadsafe -------------------------------------------------------- */

/* A callback upstream that is not thread-safe on purpose: plain counters and
 * a check that no two calls overlap. */
typedef struct {
    int inside, overlaps;
    long calls, allocs, frees;
    size_t outstanding;
} unsafe_t;

static void dawdle(void)
{
    for (volatile int i = 0; i < 50; i++)
        ;
}

static rankmem_status_t unsafe_alloc(void *arg, size_t bytes, size_t alignment,
                                     rankmem_stream_t stream, void **ptr_p)
{
    (void)stream;
    unsafe_t *u = arg;
    int in = u->inside;
    u->inside = in + 1;
    if (in)
        u->overlaps++;
    dawdle(); /* widen the window another thread would hit without the lock */
    rankmem_status_t st = posix_memalign(ptr_p, alignment, bytes) ? RANKMEM_ERR_OUT_OF_MEMORY
                                                                 : RANKMEM_SUCCESS;
    if (st == RANKMEM_SUCCESS)
        u->allocs++, u->outstanding += bytes;
    u->calls++;
    u->inside = in;
    return st;
}

static rankmem_status_t unsafe_free(void *arg, void *ptr, size_t bytes, size_t alignment,
                                    rankmem_stream_t stream)
{
    (void)alignment;
    (void)stream;
    unsafe_t *u = arg;
    int in = u->inside;
    u->inside = in + 1;
    if (in)
        u->overlaps++;
    dawdle();
    free(ptr);
    u->frees++, u->outstanding -= bytes;
    u->calls++;
    u->inside = in;
    return RANKMEM_SUCCESS;
}

#define TS_STEPS 5000
static rankmem_resource_t *ts_mr;
static int ts_errors[NTHREADS];

static void *ts_worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    for (int step = 0; step < TS_STEPS; step++) {
        size_t bytes = 64 + (size_t)((step * 131 + id * 17) % 4000);
        void *p;
        if (rankmem_allocate(ts_mr, bytes, 0, &p) != RANKMEM_SUCCESS) {
            ts_errors[id]++;
            continue;
        }
        ((unsigned char *)p)[0] = (unsigned char)id;
        if (rankmem_deallocate(ts_mr, p, bytes, 0) != RANKMEM_SUCCESS)
            ts_errors[id]++;
        if (step % 100 == 0) { /* queries and trims go through the lock too */
            size_t v;
            rankmem_resource_query(ts_mr, RANKMEM_QUERY_LIMIT, &v);
            rankmem_resource_trim(ts_mr, 0);
        }
    }
    return NULL;
}

static void test_threadsafe(void)
{
    unsafe_t u;
    memset(&u, 0, sizeof u);
    rankmem_resource_t *cb, *lim;
    if (rankmem_callback_create(unsafe_alloc, unsafe_free, &u, RANKMEM_PROP_HOST_ACCESSIBLE, &cb))
        BAIL_OUT("callback_create: %s", rankmem_last_error());
    /* Only the threadsafe adaptor makes the callback safe to share; a limit
     * sits in between to give query and trim somewhere to go. */
    rankmem_limit_create(cb, SIZE_MAX, &lim);
    is_status(rankmem_threadsafe_create(lim, &ts_mr), RANKMEM_SUCCESS, "threadsafe: create");
    check_header(ts_mr, lim, "threadsafe", "threadsafe");
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        if (pthread_create(&t[i], NULL, ts_worker, (void *)(intptr_t)i))
            BAIL_OUT("pthread_create");
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    int errors = 0;
    for (int i = 0; i < NTHREADS; i++)
        errors += ts_errors[i];
    long want = (long)NTHREADS * TS_STEPS;
    ok(errors == 0, "threadsafe: no call failed (%d)", errors);
    ok(u.overlaps == 0, "threadsafe: no two calls ran in the upstream at once (%d)", u.overlaps);
    ok(u.allocs == want && u.frees == want && u.calls == 2 * want,
       "threadsafe: the unguarded counters are exact (%ld allocs, %ld frees, %ld calls; want %ld)",
       u.allocs, u.frees, u.calls, want);
    ok(u.outstanding == 0 && q(ts_mr, RANKMEM_QUERY_USED_CURRENT) == 0,
       "threadsafe: nothing outstanding");
    ok(q(ts_mr, RANKMEM_QUERY_LIMIT) == SIZE_MAX, "threadsafe: queries go to the upstream");
    rankmem_resource_release(ts_mr);
    rankmem_resource_release(lim);
    rankmem_resource_release(cb);

    /* Over a pool: queries and trim reach it. */
    counting_t *c = counting_new(NULL);
    rankmem_resource_t *pool = pool_over(&c->base, MiB, SIZE_MAX), *ts;
    rankmem_threadsafe_create(pool, &ts);
    void *p = NULL;
    is_status(rankmem_allocate(ts, 1000, 0, &p), RANKMEM_SUCCESS, "threadsafe over pool: allocate");
    ok(q(ts, RANKMEM_QUERY_USED_CURRENT) == 1000 && q(ts, RANKMEM_QUERY_LIVE_COUNT) == 1,
       "threadsafe over pool: the pool's queries");
    rankmem_deallocate(ts, p, 1000, 0);
    is_status(rankmem_resource_trim(ts, 0), RANKMEM_SUCCESS, "threadsafe over pool: trim");
    ok(c->outstanding_blocks == 0, "threadsafe over pool: trim reached the pool");
    rankmem_resource_release(ts);
    rankmem_resource_release(pool);
    rankmem_resource_release(&c->base);
}

/* ---- chains ------------------------------------------------------------ */

/* The five stacked: the last release frees all of them and the upstream. */
static void test_chain(void)
{
    int fin;
    counting_t *c = counting_new(&fin);
    rankmem_resource_t *lim, *al, *rt, *ts, *pool = pool_over(&c->base, 0, SIZE_MAX);
    rankmem_limit_create(pool, 64 * MiB, &lim);
    rankmem_aligned_create(lim, 4096, 0, &al);
    rankmem_retry_create(al, NULL, NULL, &rt);
    rankmem_threadsafe_create(rt, &ts);
    rankmem_resource_release(pool);
    rankmem_resource_release(lim);
    rankmem_resource_release(al);
    rankmem_resource_release(rt);
    void *p = NULL;
    is_status(rankmem_allocate(ts, 5000, 0, &p), RANKMEM_SUCCESS,
              "threadsafe>retry>aligned>limit>pool: allocate");
    ok((uintptr_t)p % 4096 == 0 && q(ts, RANKMEM_QUERY_USED_CURRENT) == 5000 &&
           q(ts, RANKMEM_QUERY_LIMIT) == 64 * MiB,
       "chain: aligned, counted by the limit, queried through the chain");
    rankmem_deallocate(ts, p, 5000, 0);
    rankmem_resource_release(&c->base);
    ok(!fin, "chain: the upstream lives while the chain holds it");
    is_status(rankmem_resource_release(ts), RANKMEM_SUCCESS, "chain: release the top");
    ok(fin, "chain: one release freed every adaptor, the pool and the upstream");
}

int main(void)
{
    test_bad_inputs();
    test_limit();
    test_limit_race();
    test_aligned_pass_through();
    test_aligned_padded();
    test_aligned_pool();
    test_retry_callback();
    test_retry_default();
    test_threadsafe();
    test_chain();
    return tap_done();
}
