/* fault: an adaptor that fails allocations on purpose, so that tests can
 * see what every resource above it does with a failure from below (the
 * failing upstream of RMM's and CUB's own test suites, made a resource of
 * its own so that it can sit anywhere in a chain and be written in a spec).
 *
 * An allocate call fails when it is the nth counted call or within the
 * count after it, when it is a multiple of `every` (or within the count
 * after one), or at random with probability `rate`. The random choice is a
 * hash of the seed and the call's number, not a shared generator: the same
 * seed and the same sequence of calls fail the same calls, and the hot path
 * takes no lock. Deallocations are never failed: a free that fails leaks
 * by design, and no resource can be asked to survive that.
 *
 * Calls are counted only while the injector is enabled, from the last
 * rankmem_fault_configure() (or creation), so "nth=1" always means the
 * next call. Settings are separate atomics: a call racing a reconfigure
 * may see some old and some new settings, never a torn value.
 *
 * The resource also counts what its upstream lent through it and has not
 * got back, so that a test can check that a chain above it returns
 * everything (at release, or after trims). */
#include "internal.h"
#include "config_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    rankmem_resource_t base;
    /* Settings (atomics). */
    unsigned long long nth, count, every, seed;
    uint64_t threshold; /* a call fails when hash < threshold; UINT64_MAX with always */
    int always;         /* rate >= 1 */
    uint64_t rate_bits; /* the rate as given (a double's bits), for describe and messages */
    int status;
    int enabled;
    /* Counters (atomics). */
    unsigned long long counted; /* calls counted since the last configure */
    unsigned long long calls, injected, upstream_failures, frees;
    size_t bytes_out, blocks_out;
} fault_t;

/* splitmix64's finaliser: consecutive call numbers give unrelated draws. */
static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define ADD(x, v) __atomic_add_fetch(&(x), (v), __ATOMIC_RELAXED)

/* Why call i fails ("" when it does not). */
static const char *fails(const fault_t *f, unsigned long long i)
{
    unsigned long long nth = LOAD(f->nth), count = LOAD(f->count), every = LOAD(f->every);
    if (nth && i >= nth && i - nth < count)
        return "nth";
    if (every && i >= every && i % every < count)
        return "every";
    if (LOAD(f->always))
        return "rate";
    uint64_t thr = LOAD(f->threshold);
    if (thr && mix64(LOAD(f->seed) ^ mix64(i)) < thr)
        return "rate";
    return "";
}

static double rate_of(const fault_t *f)
{
    uint64_t b = LOAD(f->rate_bits);
    double r;
    memcpy(&r, &b, sizeof r);
    return r;
}

static __attribute__((noinline, cold)) rankmem_status_t
inject(fault_t *f, const char *why, unsigned long long i, size_t bytes, size_t alignment)
{
    unsigned long long n = ADD(f->injected, 1);
    rankmem_status_t st = (rankmem_status_t)LOAD(f->status);
    /* "injected" comes first: chains that wrap the message keep its start. */
    if (why[0] == 'n')
        return rk_error(st, "fault: injected failure %llu, allocate call %llu (nth=%llu) of %zu "
                            "bytes at alignment %zu",
                        n, i, LOAD(f->nth), bytes, alignment);
    if (why[0] == 'e')
        return rk_error(st, "fault: injected failure %llu, allocate call %llu (every=%llu) of "
                            "%zu bytes at alignment %zu",
                        n, i, LOAD(f->every), bytes, alignment);
    return rk_error(st, "fault: injected failure %llu, allocate call %llu (rate=%g, seed=%llu) "
                        "of %zu bytes at alignment %zu",
                    n, i, rate_of(f), LOAD(f->seed), bytes, alignment);
}

static rankmem_status_t fault_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    fault_t *f = (fault_t *)mr;
    ADD(f->calls, 1);
    if (LOAD(f->enabled)) {
        unsigned long long i = ADD(f->counted, 1);
        const char *why = fails(f, i);
        if (why[0])
            return inject(f, why, i, bytes, alignment);
    }
    rankmem_resource_t *up = mr->upstream;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS)) {
        ADD(f->upstream_failures, 1);
        return st;
    }
    ADD(f->bytes_out, bytes);
    ADD(f->blocks_out, 1);
    return RANKMEM_SUCCESS;
}

/* The upstream took it back: no longer out. */
static inline void returned(fault_t *f, size_t bytes)
{
    __atomic_sub_fetch(&f->bytes_out, bytes, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&f->blocks_out, 1, __ATOMIC_RELAXED);
    ADD(f->frees, 1);
}

static rankmem_status_t fault_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                         size_t alignment, rankmem_stream_t stream)
{
    rankmem_resource_t *up = mr->upstream;
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    if (st == RANKMEM_SUCCESS)
        returned((fault_t *)mr, bytes);
    return st;
}

/* Passed on as a batch, so that the resource below keeps its one lock for many. */
static rankmem_status_t fault_deallocate_many(rankmem_resource_t *mr,
                                              const rankmem_block_t *blocks, size_t n,
                                              rankmem_stream_t stream, rankmem_status_t *status)
{
    rankmem_status_t first = rk_deallocate_many(mr->upstream, blocks, n, stream, status);
    for (size_t i = 0; i < n; i++)
        if (status[i] == RANKMEM_SUCCESS)
            returned((fault_t *)mr, blocks[i].bytes);
    return first;
}

static rankmem_status_t fault_query(rankmem_resource_t *mr, rankmem_query_t what, size_t *value_p)
{
    return rankmem_resource_query(mr->upstream, what, value_p);
}

static rankmem_status_t fault_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return rankmem_resource_trim(mr->upstream, keep_bytes);
}

static rankmem_status_t fault_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

/* Spec names of the statuses (spec.c's fault.status choices, in the
 * order of rankmem_status_t). */
static const char *const status_names[RANKMEM_STATUS_COUNT] = {
    "success",   "invalid_argument", "out_of_memory", "invalid_pointer",
    "not_supported", "no_device",    "device",        "limit",
    "config",    "busy",             "wrong_device",  "internal",
};

static int fault_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const fault_t *f = (const fault_t *)mr;
    char s[256];
    size_t o = 0;
    unsigned long long nth = LOAD(f->nth), count = LOAD(f->count), every = LOAD(f->every);
    int st = LOAD(f->status);
    /* Only what differs from the defaults, so that "fault>system" stays that. */
    if (nth)
        o += (size_t)snprintf(s + o, sizeof s - o, ",nth=%llu", nth);
    if (count != 1)
        o += (size_t)snprintf(s + o, sizeof s - o, ",count=%llu", count);
    if (every)
        o += (size_t)snprintf(s + o, sizeof s - o, ",every=%llu", every);
    if (rate_of(f) > 0)
        o += (size_t)snprintf(s + o, sizeof s - o, ",rate=%.17g", rate_of(f));
    if (LOAD(f->seed))
        o += (size_t)snprintf(s + o, sizeof s - o, ",seed=%llu", LOAD(f->seed));
    if (st != RANKMEM_ERR_OUT_OF_MEMORY)
        o += (size_t)snprintf(s + o, sizeof s - o, ",status=%s", status_names[st]);
    if (!LOAD(f->enabled))
        o += (size_t)snprintf(s + o, sizeof s - o, ",enabled=0");
    if (o == 0)
        return snprintf(buf, len, "fault");
    return snprintf(buf, len, "fault(%s)", s + 1);
}

static const rankmem_resource_ops_t fault_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "fault",
    .allocate = fault_allocate,
    .deallocate = fault_deallocate,
    .query = fault_query,
    .trim = fault_trim,
    .finalize = fault_finalize,
    .describe = fault_describe,
    .deallocate_many = fault_deallocate_many,
};

/* ---- the public calls ---- */

rankmem_status_t rankmem_fault_params_default(rankmem_fault_params_t *params_p)
{
    if (!params_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_fault_params_default: NULL output");
    memset(params_p, 0, sizeof *params_p);
    params_p->size = sizeof *params_p;
    params_p->count = 1;
    params_p->status = RANKMEM_ERR_OUT_OF_MEMORY;
    params_p->enabled = 1;
    return RANKMEM_SUCCESS;
}

/* The statuses an allocate call may fail with (the spec's fault.status
 * choices); a free's, a constructor's or a release's would mean nothing. */
static int allocate_status(rankmem_status_t st)
{
    switch (st) {
    case RANKMEM_ERR_OUT_OF_MEMORY: case RANKMEM_ERR_LIMIT: case RANKMEM_ERR_DEVICE:
    case RANKMEM_ERR_NOT_SUPPORTED: case RANKMEM_ERR_NO_DEVICE: case RANKMEM_ERR_WRONG_DEVICE:
    case RANKMEM_ERR_INVALID_ARGUMENT: case RANKMEM_ERR_INTERNAL: return 1;
    default: return 0;
    }
}

/* Checked before anything changes: a bad value leaves the old settings. */
static rankmem_status_t check_params(const rankmem_fault_params_t *p, const char *fn)
{
    if (p->size != sizeof *p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: params.size %zu is not that of rankmem_fault_params_t (%zu); set it "
                        "with rankmem_fault_params_default()",
                        fn, p->size, sizeof *p);
    if (!(p->rate >= 0.0 && p->rate <= 1.0)) /* NaN too */
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: rate %g is not a probability (0 to 1)", fn, p->rate);
    if (p->count == 0)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: count 0 would fail no call (use nth=0 or enabled=0 for none)", fn);
    if (!allocate_status(p->status))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: status %d is not one an allocation fails with (out of memory, "
                        "limit, device, not supported, no device, wrong device, invalid "
                        "argument or internal)",
                        fn, (int)p->status);
    return RANKMEM_SUCCESS;
}

static void apply(fault_t *f, const rankmem_fault_params_t *p)
{
    STORE(f->nth, p->nth);
    STORE(f->count, p->count);
    STORE(f->every, p->every);
    STORE(f->seed, p->seed);
    uint64_t bits;
    memcpy(&bits, &p->rate, sizeof bits);
    STORE(f->rate_bits, bits);
    /* rate * 2^64, below 2^64 for rate < 1 (doubles below 1 have at most 53 bits);
     * a product, not ldexp: the library does not link libm. */
    STORE(f->always, p->rate >= 1.0);
    STORE(f->threshold,
          p->rate >= 1.0 ? UINT64_MAX : (uint64_t)(p->rate * 18446744073709551616.0));
    STORE(f->status, (int)p->status);
    STORE(f->counted, 0ull);
    STORE(f->enabled, p->enabled != 0);
}

rankmem_status_t rankmem_fault_create(rankmem_resource_t *upstream,
                                      const rankmem_fault_params_t *params,
                                      rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_fault_create: NULL %s",
                        upstream ? "mr_p" : "upstream");
    rankmem_fault_params_t prm;
    rankmem_fault_params_default(&prm);
    if (params) {
        rankmem_status_t st = check_params(params, "rankmem_fault_create");
        if (st != RANKMEM_SUCCESS)
            return st;
        prm = *params;
    }
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(fault_t), &fault_ops, upstream->props, upstream,
                                          &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    mr->device = upstream->device;
    apply((fault_t *)mr, &prm);
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}

/* The first fault resource from mr down its chain, or NULL (error recorded). */
static fault_t *fault_of(rankmem_resource_t *mr, const char *fn)
{
    if (!mr) {
        (void)rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: NULL resource", fn);
        return NULL;
    }
    for (rankmem_resource_t *r = mr; r; r = r->upstream)
        if (r->ops == &fault_ops)
            return (fault_t *)r;
    (void)rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: no fault resource in the chain of '%s'", fn,
                   mr->ops->name ? mr->ops->name : "unnamed");
    return NULL;
}

rankmem_status_t rankmem_fault_configure(rankmem_resource_t *mr,
                                         const rankmem_fault_params_t *params)
{
    if (!params)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_fault_configure: NULL params");
    fault_t *f = fault_of(mr, "rankmem_fault_configure");
    if (!f)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    rankmem_status_t st = check_params(params, "rankmem_fault_configure");
    if (st != RANKMEM_SUCCESS)
        return st;
    apply(f, params);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_fault_enable(rankmem_resource_t *mr, int enabled)
{
    fault_t *f = fault_of(mr, "rankmem_fault_enable");
    if (!f)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    STORE(f->enabled, enabled != 0);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_fault_get_stats(rankmem_resource_t *mr, rankmem_fault_stats_t *stats_p)
{
    if (!stats_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_fault_get_stats: NULL output");
    /* Older, shorter structs are filled as far as they go. */
    if (stats_p->size < offsetof(rankmem_fault_stats_t, calls) || stats_p->size > sizeof *stats_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_fault_get_stats: stats.size %zu is not that of "
                        "rankmem_fault_stats_t (%zu)",
                        stats_p->size, sizeof *stats_p);
    fault_t *f = fault_of(mr, "rankmem_fault_get_stats");
    if (!f)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    rankmem_fault_stats_t s;
    memset(&s, 0, sizeof s);
    s.size = stats_p->size;
    s.calls = LOAD(f->calls);
    s.counted = LOAD(f->counted);
    s.injected = LOAD(f->injected);
    s.upstream_failures = LOAD(f->upstream_failures);
    s.frees = LOAD(f->frees);
    s.bytes_outstanding = LOAD(f->bytes_out);
    s.blocks_outstanding = LOAD(f->blocks_out);
    s.enabled = LOAD(f->enabled);
    memcpy(stats_p, &s, stats_p->size);
    return RANKMEM_SUCCESS;
}
