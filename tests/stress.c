/* Short stress test of the suballocators (CI's form of the 8-thread
 * stress test; run it under ThreadSanitizer too: docs/replay.md).
 *
 *     tests/stress.t [OPS_PER_THREAD [SPEC...]]
 *
 * For each spec string (default: every suballocator over host memory), 8
 * threads, each on its own stand-in stream, allocate, fill, check and free
 * through one chain, and hand blocks to each other to check and free on
 * another thread and stream. Every block is filled with a pattern of its
 * own, checked whole when it is freed: two live blocks that overlap, or an
 * allocator that writes into a live block, show as a corrupt block. At the
 * end the chain is released and a stats adaptor put right above the leaf
 * says whether everything went back upstream. A spec whose resource this
 * library does not know yet is skipped. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"

#define NTHREADS 8
#define NLIVE 48     /* blocks a thread holds at most */
#define MAILBOX 64
#define TESTS_PER_SPEC 6

typedef struct {
    const char *spec;
    size_t max_bytes; /* largest request the resource serves */
} spec_t;

static const spec_t default_specs[] = {
    {"pool>system", 256 << 10},
    {"arena(size=1GiB)>system", 256 << 10},
    {"binning>system", 256 << 10},
    {"caching>system", 256 << 10},
    {"fixed(block=4KiB)>system", 4 << 10},
};

typedef struct {
    unsigned char *p;
    size_t n;
    uint64_t tag;
} blk_t;

static rankmem_resource_t *chain;
static size_t max_bytes;
static long ops_per_thread = 20000;

static pthread_mutex_t box_lock = PTHREAD_MUTEX_INITIALIZER;
static blk_t box[MAILBOX];
static int nbox;

static size_t errors[NTHREADS], corrupt[NTHREADS], misaligned[NTHREADS], handoffs[NTHREADS];
static char first_error[NTHREADS][200];

static uint64_t rng(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* Mostly small, sometimes up to max_bytes (log-uniform). */
static size_t pick_size(uint64_t *s)
{
    int top = 63 - __builtin_clzll(max_bytes);
    int b = (int)(rng(s) % (uint64_t)(top + 1));
    size_t n = ((size_t)1 << b) + (size_t)(rng(s) % ((uint64_t)1 << b));
    return n > max_bytes ? max_bytes : n;
}

/* The pattern: every 8-byte word is tag ^ its index; the tail bytes too. */
static void fill(const blk_t *b)
{
    size_t words = b->n / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t v = b->tag ^ i;
        memcpy(b->p + 8 * i, &v, 8);
    }
    for (size_t i = words * 8; i < b->n; i++)
        b->p[i] = (unsigned char)(b->tag >> (8 * (i & 7)));
}

static int intact(const blk_t *b)
{
    size_t words = b->n / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t v;
        memcpy(&v, b->p + 8 * i, 8);
        if (v != (b->tag ^ i))
            return 0;
    }
    for (size_t i = words * 8; i < b->n; i++)
        if (b->p[i] != (unsigned char)(b->tag >> (8 * (i & 7))))
            return 0;
    return 1;
}

static void release_blk(int id, const blk_t *b, rankmem_stream_t stream)
{
    if (!intact(b) && corrupt[id]++ == 0)
        snprintf(first_error[id], sizeof first_error[id], "thread %d: block %p (%zu bytes) "
                 "corrupt", id, (void *)b->p, b->n);
    rankmem_status_t st = rankmem_deallocate_async(chain, b->p, b->n, 0, stream);
    if (st != RANKMEM_SUCCESS && errors[id]++ == 0)
        snprintf(first_error[id], sizeof first_error[id], "thread %d: free of %zu bytes: %s", id,
                 b->n, rankmem_last_error());
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    /* Thread 0 on the default stream, the others each on a stand-in. */
    rankmem_stream_t stream = (rankmem_stream_t)(uintptr_t)(id ? 0x1000 * (unsigned)id : 0);
    uint64_t s = 0x243f6a8885a308d3ull + (uint64_t)id * 0x9e3779b97f4a7c15ull;
    blk_t mine[NLIVE];
    int n = 0;
    for (long step = 0; step < ops_per_thread; step++) {
        unsigned r = (unsigned)(rng(&s) % 16);
        if (r < 8 && n < NLIVE) {
            blk_t b = {NULL, pick_size(&s), rng(&s)};
            void *p;
            rankmem_status_t st = rankmem_allocate_async(chain, b.n, 0, stream, &p);
            if (st != RANKMEM_SUCCESS) {
                if (errors[id]++ == 0)
                    snprintf(first_error[id], sizeof first_error[id],
                             "thread %d: allocate of %zu bytes: %s", id, b.n,
                             rankmem_last_error());
                continue;
            }
            b.p = p;
            if ((uintptr_t)p % RANKMEM_DEFAULT_ALIGNMENT)
                misaligned[id]++;
            fill(&b);
            mine[n++] = b;
        } else if (r < 14 && n > 0) {
            int k = (int)(rng(&s) % (uint64_t)n);
            release_blk(id, &mine[k], stream);
            mine[k] = mine[--n];
        } else if (r == 14 && n > 0) { /* hand one over */
            int k = (int)(rng(&s) % (uint64_t)n);
            pthread_mutex_lock(&box_lock);
            if (nbox < MAILBOX) {
                box[nbox++] = mine[k];
                mine[k] = mine[--n];
                handoffs[id]++;
            }
            pthread_mutex_unlock(&box_lock);
        } else { /* take one another thread handed over: free it on our stream */
            blk_t b = {NULL, 0, 0};
            pthread_mutex_lock(&box_lock);
            if (nbox > 0)
                b = box[--nbox];
            pthread_mutex_unlock(&box_lock);
            if (b.p)
                release_blk(id, &b, stream);
        }
    }
    while (n > 0)
        release_blk(id, &mine[--n], stream);
    return NULL;
}

/* "a>b>leaf" -> "a>b>stats>leaf" (split at the last '>' outside parentheses). */
static char *with_probe(const char *spec)
{
    size_t len = strlen(spec), cut = 0;
    int depth = 0, found = 0;
    for (size_t i = 0; i < len; i++) {
        if (spec[i] == '(')
            depth++;
        else if (spec[i] == ')')
            depth--;
        else if (spec[i] == '>' && depth == 0)
            cut = i + 1, found = 1;
    }
    char *out = malloc(len + 8);
    if (!out)
        BAIL_OUT("out of memory");
    if (!found)
        snprintf(out, len + 8, "stats>%s", spec);
    else
        snprintf(out, len + 8, "%.*sstats>%s", (int)cut, spec, spec + cut);
    return out;
}

static void run_spec(const spec_t *sp)
{
    char *probed = with_probe(sp->spec);
    rankmem_status_t st = rankmem_resource_from_spec(probed, &chain);
    if (st != RANKMEM_SUCCESS) {
        const char *e = rankmem_last_error();
        if (st == RANKMEM_ERR_CONFIG && strstr(e, "unknown resource")) {
            char why[300];
            snprintf(why, sizeof why, "%s: not in this library yet (%s)", sp->spec, e);
            tap_skip(TESTS_PER_SPEC, why);
        } else {
            ok(0, "%s: built (%s: %s)", sp->spec, rankmem_status_string(st), e);
            tap_skip(TESTS_PER_SPEC - 1, "no chain");
        }
        free(probed);
        return;
    }
    ok(1, "%s: built as %s", sp->spec, probed);
    free(probed);

    /* The stats probe: the resource right above the leaf. */
    rankmem_resource_t *probe = chain, *up = NULL, *upup = NULL;
    for (;;) {
        rankmem_resource_upstream(probe, &up);
        upup = NULL;
        if (up)
            rankmem_resource_upstream(up, &upup);
        if (!upup)
            break;
        probe = up;
    }
    rankmem_resource_retain(probe);

    max_bytes = sp->max_bytes;
    memset(errors, 0, sizeof errors);
    memset(corrupt, 0, sizeof corrupt);
    memset(misaligned, 0, sizeof misaligned);
    memset(handoffs, 0, sizeof handoffs);
    memset(first_error, 0, sizeof first_error);
    nbox = 0;
    pthread_t tid[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        if (pthread_create(&tid[i], NULL, worker, (void *)(intptr_t)i))
            BAIL_OUT("pthread_create failed");
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(tid[i], NULL);
    while (nbox > 0) /* handed over, never taken */
        release_blk(0, &box[--nbox], NULL);

    size_t nerr = 0, ncorrupt = 0, nmis = 0, nhand = 0;
    const char *first = NULL;
    for (int i = 0; i < NTHREADS; i++) {
        nerr += errors[i], ncorrupt += corrupt[i], nmis += misaligned[i], nhand += handoffs[i];
        if (!first && first_error[i][0])
            first = first_error[i];
    }
    if (!ok(nerr == 0, "%s: %d threads x %ld operations, no allocate/free error", sp->spec,
            NTHREADS, ops_per_thread))
        diag("  %zu errors; first: %s", nerr, first ? first : "?");
    if (!ok(ncorrupt == 0, "%s: every block intact at free (%zu handed between threads)",
            sp->spec, nhand))
        diag("  %zu corrupt blocks; first: %s", ncorrupt, first ? first : "?");
    ok(nmis == 0, "%s: every block %zu-byte aligned (%zu not)", sp->spec,
       (size_t)RANKMEM_DEFAULT_ALIGNMENT, nmis);
    st = rankmem_resource_release(chain);
    is_status(st, RANKMEM_SUCCESS, "%s: released with nothing live", sp->spec);
    rankmem_stats_t s = {.size = sizeof s};
    st = rankmem_stats_get(probe, &s);
    if (!ok(st == RANKMEM_SUCCESS && s.bytes_current == 0 && s.count_current == 0,
            "%s: everything back upstream after release", sp->spec))
        diag("  upstream still lends %zu bytes in %zu blocks (peak %zu)", s.bytes_current,
             s.count_current, s.bytes_peak);
    rankmem_resource_release(probe);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        char *e;
        ops_per_thread = strtol(argv[1], &e, 10);
        if (*e || ops_per_thread < 1) {
            fprintf(stderr, "usage: %s [OPS_PER_THREAD [SPEC...]]\n", argv[0]);
            return 2;
        }
    }
    if (argc > 2) {
        tap_plan(TESTS_PER_SPEC * (argc - 2));
        for (int i = 2; i < argc; i++) {
            spec_t sp = {argv[i], strncmp(argv[i], "fixed", 5) ? (size_t)256 << 10 : 4096};
            run_spec(&sp);
        }
    } else {
        size_t n = sizeof default_specs / sizeof *default_specs;
        tap_plan(TESTS_PER_SPEC * (int)n);
        for (size_t i = 0; i < n; i++)
            run_spec(&default_specs[i]);
    }
    return tap_done();
}
