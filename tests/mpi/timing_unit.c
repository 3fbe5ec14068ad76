/* The MPI plugin's timing adaptor alone (no MPI, no CUDA): every call
 * counted exactly from 16 threads, one in `period` timed, the estimate
 * exact when every call is timed, observation's depth marked around the
 * upstream, and bad inputs. No timed assertion: only counts and sums. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "timing.h"
#include "recorder.h"
#include "../tap.h"

/* Defined by the recorder in the plugin; the test links timing.c alone. */
__thread int rk_obs_internal_depth;

/* An upstream over malloc that checks the observation mark. */
typedef struct {
    rankmem_resource_t base;
    int unmarked; /* atomic: calls that saw rk_obs_internal_depth != 1 */
} up_t;

static rankmem_status_t up_alloc(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                 rankmem_stream_t stream, void **ptr_p)
{
    (void)alignment;
    (void)stream;
    if (rk_obs_internal_depth != 1)
        __atomic_add_fetch(&((up_t *)mr)->unmarked, 1, __ATOMIC_RELAXED);
    if (bytes > ((size_t)1 << 40)) /* refused without asking malloc (sanitizers abort) */
        return RANKMEM_ERR_OUT_OF_MEMORY;
    void *p = malloc(bytes);
    if (!p)
        return RANKMEM_ERR_OUT_OF_MEMORY;
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t up_free(rankmem_resource_t *mr, void *ptr, size_t bytes, size_t alignment,
                                rankmem_stream_t stream)
{
    (void)bytes;
    (void)alignment;
    (void)stream;
    if (rk_obs_internal_depth != 1)
        __atomic_add_fetch(&((up_t *)mr)->unmarked, 1, __ATOMIC_RELAXED);
    free(ptr);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t up_fin(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t up_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "test-upstream",
    .allocate = up_alloc,
    .deallocate = up_free,
    .finalize = up_fin,
};

static up_t *make_up(void)
{
    up_t *u = calloc(1, sizeof *u);
    if (!u || rankmem_resource_init(&u->base, &up_ops, RANKMEM_PROP_HOST_ACCESSIBLE, NULL) !=
                  RANKMEM_SUCCESS)
        BAIL_OUT("cannot make the test upstream");
    return u;
}

#define NT 16
#define PAIRS 20000

static void *pairs(void *arg)
{
    rankmem_resource_t *mr = arg;
    for (int i = 0; i < PAIRS; i++) {
        void *p;
        size_t n = 16 + (size_t)(i % 64) * 8;
        if (rankmem_allocate(mr, n, 0, &p) != RANKMEM_SUCCESS ||
            rankmem_deallocate(mr, p, n, 0) != RANKMEM_SUCCESS)
            return (void *)1;
    }
    return NULL;
}

static rk_mpi_timing_t read_t(rankmem_resource_t *mr)
{
    rk_mpi_timing_t r;
    memset(&r, 0xee, sizeof r);
    if (rk_mpi_timing_read(mr, &r) != RANKMEM_SUCCESS)
        BAIL_OUT("rk_mpi_timing_read failed");
    return r;
}

/* The estimate is the sampled time scaled to every call. */
static int scaled(rk_mpi_timing_t r)
{
    double want = (double)r.sampled_ns * (double)r.calls / (double)r.sampled;
    return r.sampled && (double)r.ns >= want - 1.0 && (double)r.ns <= want + 1.0;
}

static void every_call(void)
{
    up_t *u = make_up();
    rankmem_resource_t *tm;
    is_status(rk_mpi_timing_create(&u->base, &tm), RANKMEM_SUCCESS, "create");
    rankmem_resource_release(&u->base);
    is_status(rk_mpi_timing_set_period(tm, 1), RANKMEM_SUCCESS, "period 1: every call timed");
    rk_mpi_timing_t r = read_t(tm);
    ok(r.ns == 0 && r.calls == 0 && r.sampled == 0, "nothing before the first call");
    ok(rk_mpi_timing_ns(tm) == 0, "rk_mpi_timing_ns 0 before the first call");
    ok(pairs(tm) == NULL, "1 thread, %d pairs", PAIRS);
    r = read_t(tm);
    ok(r.calls == 2 * PAIRS && r.sampled == r.calls && r.ns == r.sampled_ns && r.ns > 0,
       "period 1: every call counted and timed, the sum exact (%llu calls, %llu timed)",
       (unsigned long long)r.calls, (unsigned long long)r.sampled);
    ok(rk_mpi_timing_ns(tm) == r.ns, "rk_mpi_timing_ns is the sum");
    ok(u->unmarked == 0, "the upstream ran with rk_obs_internal_depth 1 (%d calls without)",
       u->unmarked);
    ok(rk_obs_internal_depth == 0, "the mark is undone after each call");
    rankmem_resource_release(tm);
}

static void sixteen_threads(void)
{
    up_t *u = make_up();
    rankmem_resource_t *tm;
    rk_mpi_timing_create(&u->base, &tm);
    rankmem_resource_release(&u->base);
    pthread_t th[NT];
    for (int i = 0; i < NT; i++)
        pthread_create(&th[i], NULL, pairs, tm);
    int errors = 0;
    for (int i = 0; i < NT; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        errors += rv != NULL;
    }
    rk_mpi_timing_t r = read_t(tm);
    ok(errors == 0 && u->unmarked == 0, "16 threads: every call succeeded, marked");
    ok(r.calls == (uint64_t)NT * 2 * PAIRS, "16 threads: calls exact (%llu)",
       (unsigned long long)r.calls);
    /* Intervals are drawn between 1 and 63 (mean 32); 640,000 calls make
     * about 20,000 samples: [calls/64, calls/16] holds but for a broken
     * sampler. Each thread's first call is timed. */
    ok(r.sampled >= NT && r.sampled >= r.calls / 64 && r.sampled <= r.calls / 16,
       "16 threads: about one call in 32 timed (%llu of %llu)", (unsigned long long)r.sampled,
       (unsigned long long)r.calls);
    ok(scaled(r) && r.ns > r.sampled_ns,
       "16 threads: the estimate scales the timed calls (%llu ns)", (unsigned long long)r.ns);
    rankmem_resource_release(tm);
}

static void short_run(void)
{
    up_t *u = make_up();
    rankmem_resource_t *tm;
    rk_mpi_timing_create(&u->base, &tm);
    rankmem_resource_release(&u->base);
    void *p;
    rankmem_allocate(tm, 100, 0, &p);
    rk_mpi_timing_t r = read_t(tm);
    ok(r.calls == 1 && r.sampled == 1 && r.ns == r.sampled_ns,
       "one call: the first call of a thread is timed");
    rankmem_deallocate(tm, p, 100, 0);
    rankmem_resource_release(tm);
}

/* Under a stats adaptor that counts its calls (the plugin's chain): the
 * calls are stats' allocations + frees + failures, exact from 16 threads;
 * every call timed with period 1; the mark still around every call. */
static void counted_by_stats(void)
{
    up_t *u = make_up();
    rankmem_resource_t *tm, *st, *other;
    rk_mpi_timing_create(&u->base, &tm);
    rankmem_resource_release(&u->base);
    rankmem_stats_create(tm, &st);
    rankmem_resource_release(tm); /* st holds it, as in the plugin */
    rankmem_stats_create(&u->base, &other);
    is_status(rk_mpi_timing_count_from(tm, other), RANKMEM_ERR_INVALID_ARGUMENT,
              "count_from: a stats adaptor that is not right above");
    is_status(rk_mpi_timing_count_from(tm, &u->base), RANKMEM_ERR_INVALID_ARGUMENT,
              "count_from: not a stats adaptor");
    is_status(rk_mpi_timing_count_from(&u->base, st), RANKMEM_ERR_INVALID_ARGUMENT,
              "count_from: not a timing layer");
    is_status(rk_mpi_timing_count_from(NULL, st), RANKMEM_ERR_INVALID_ARGUMENT,
              "count_from: NULL");
    rankmem_resource_release(other);
    is_status(rk_mpi_timing_count_from(tm, st), RANKMEM_SUCCESS, "count_from: stats above");
    rk_mpi_timing_t r = read_t(tm);
    ok(r.calls == 0 && r.sampled == 0 && r.ns == 0, "counted by stats: nothing before a call");
    pthread_t th[NT];
    for (int i = 0; i < NT; i++)
        pthread_create(&th[i], NULL, pairs, st);
    int errors = 0;
    for (int i = 0; i < NT; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        errors += rv != NULL;
    }
    r = read_t(tm);
    ok(errors == 0 && u->unmarked == 0,
       "counted by stats, 16 threads: every call succeeded, marked");
    ok(r.calls == (uint64_t)NT * 2 * PAIRS, "counted by stats, 16 threads: calls exact (%llu)",
       (unsigned long long)r.calls);
    ok(r.sampled >= NT && r.sampled >= r.calls / 64 && r.sampled <= r.calls / 16,
       "counted by stats, 16 threads: about one call in 32 timed (%llu of %llu)",
       (unsigned long long)r.sampled, (unsigned long long)r.calls);
    ok(scaled(r) && r.ns > r.sampled_ns, "counted by stats: the estimate scales the timed calls");
    /* A failed allocation is a call too. */
    void *p = NULL;
    is_status(rankmem_allocate(st, (size_t)1 << 62, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY,
              "counted by stats: an allocation the upstream refuses");
    ok(read_t(tm).calls == r.calls + 1, "counted by stats: the failed allocation is counted");
    is_status(rk_mpi_timing_set_period(tm, 1), RANKMEM_SUCCESS, "counted by stats: period 1");
    ok(pairs(st) == NULL, "counted by stats, period 1: %d pairs", PAIRS);
    rk_mpi_timing_t r1 = read_t(tm);
    /* The first call after the change may still finish an interval drawn before it. */
    ok(r1.calls == r.calls + 1 + 2 * PAIRS && r1.sampled >= r.sampled + 2 * PAIRS - 64,
       "counted by stats, period 1: every call counted, (nearly) every one timed (%llu, %llu)",
       (unsigned long long)(r1.calls - r.calls), (unsigned long long)(r1.sampled - r.sampled));
    ok(rk_obs_internal_depth == 0, "counted by stats: the mark is undone after each call");
    rankmem_resource_release(st);
}

/* Once a call went through, the layer keeps counting itself. */
static void count_from_late(void)
{
    up_t *u = make_up();
    rankmem_resource_t *tm, *st;
    rk_mpi_timing_create(&u->base, &tm);
    rankmem_resource_release(&u->base);
    rankmem_stats_create(tm, &st);
    rankmem_resource_release(tm); /* st holds it */
    void *p;
    rankmem_allocate(st, 64, 0, &p);
    is_status(rk_mpi_timing_count_from(tm, st), RANKMEM_ERR_INVALID_ARGUMENT,
              "count_from after a call: refused");
    rankmem_deallocate(st, p, 64, 0);
    ok(read_t(tm).calls == 2, "count_from refused: the layer still counts (2 calls)");
    rankmem_resource_release(st);
}

static void bad_inputs(void)
{
    up_t *u = make_up();
    rankmem_resource_t *tm = (rankmem_resource_t *)0x1;
    is_status(rk_mpi_timing_create(NULL, &tm), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: NULL upstream");
    ok(tm == (rankmem_resource_t *)0x1, "create: output untouched");
    is_status(rk_mpi_timing_create(&u->base, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: NULL output");
    rk_mpi_timing_create(&u->base, &tm);
    is_status(rk_mpi_timing_set_period(NULL, 4), RANKMEM_ERR_INVALID_ARGUMENT, "period: NULL");
    is_status(rk_mpi_timing_set_period(&u->base, 4), RANKMEM_ERR_INVALID_ARGUMENT,
              "period: not a timing resource");
    is_status(rk_mpi_timing_set_period(tm, 0), RANKMEM_ERR_INVALID_ARGUMENT, "period 0");
    is_status(rk_mpi_timing_set_period(tm, (1u << 20) + 1), RANKMEM_ERR_INVALID_ARGUMENT,
              "period over 2^20");
    rk_mpi_timing_t r;
    is_status(rk_mpi_timing_read(tm, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "read: NULL output");
    is_status(rk_mpi_timing_read(&u->base, &r), RANKMEM_ERR_INVALID_ARGUMENT,
              "read: not a timing resource");
    ok(rk_mpi_timing_ns(NULL) == 0 && rk_mpi_timing_ns(&u->base) == 0,
       "rk_mpi_timing_ns: 0 for NULL and for another resource");
    rankmem_resource_release(tm);
    rankmem_resource_release(&u->base);
}

int main(void)
{
    every_call();
    sixteen_threads();
    short_run();
    counted_by_stats();
    count_from_late();
    bad_inputs();
    return tap_done();
}
