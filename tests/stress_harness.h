/* The randomized harnesses of the resource tests (fixed, binning, caching,
 * arena, threads, stress).
 *
 * sh_run, the multi-thread stress: N threads allocate, fill, check and free
 * through one resource, each on its own stand-in stream, and hand blocks to
 * each other through a mailbox to be checked and freed by another thread on
 * its stream. Every block carries a pattern of its own (8-byte words, its
 * tag xor the word's index; see SH_WHOLE), checked when it is freed: two live
 * blocks that overlap, or a resource that writes into a live block, show as
 * a corrupt block. Allocations are also checked for alignment.
 *
 *   sh_config_t cfg = {.mr = mr, .threads = 8, .steps = 20000, .live = 48,
 *                      .size = my_size};
 *   sh_result_t res;
 *   sh_run(&cfg, &res);   then assert on res.errors, res.corrupt, ...
 *
 * What differs between the tests (sizes, streams, the statuses a resource
 * may refuse with, trims and queries under load) comes in as fields and
 * callbacks; the assertions stay in each test.
 *
 * sh_seq_run, one thread: random allocate (sizes, alignments, streams from
 * the test) and free (sometimes on another stream), each new block checked
 * against every live one for overlap and for its alignment, patterns checked
 * at free; hooks for trims and bookkeeping checks.
 *
 * Header-only: include once. */
#ifndef RANKMEM_TEST_STRESS_HARNESS_H
#define RANKMEM_TEST_STRESS_HARNESS_H

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rankmem.h>

#define SH_MAX_THREADS 16
#define SH_MAX_LIVE 64
#define SH_MAILBOX 64

typedef struct sh_config {
    rankmem_resource_t *mr;
    int threads;         /* 1 .. SH_MAX_THREADS */
    long steps;          /* per thread */
    int live;            /* blocks a thread holds at most, 1 .. SH_MAX_LIVE */
    unsigned long long seed; /* thread i's generator starts at seed + i */
    /* A step allocates (with room and r % alloc_mod != 0, or nothing held),
     * else frees one of the thread's blocks; 0 means 3 (two in three). */
    unsigned alloc_mod;
    /* A block about to be freed goes to the mailbox instead when
     * r % handoff_mod == 0; the thread then takes one from the mailbox to
     * check and free when r % take_mod == 0 (0: never). */
    unsigned handoff_mod, take_mod;
    uintptr_t stream_base;  /* thread i's stream is stream_base * (i + 1) (0: 0x100) ... */
    int default_streams;    /* ... except threads below this, on the default stream (NULL) */
    unsigned yield_every;   /* sched_yield() every so many steps (0: never): on few cores,
                               threads then interleave inside the resource */
    rankmem_status_t refusal; /* an allocate status that is counted as refused, not as an
                                 error (RANKMEM_ERR_OUT_OF_MEMORY for a bounded resource;
                                 RANKMEM_SUCCESS: none) */
    /* Request size; r is the step's draw, sh_rng(state) gives more. */
    size_t (*size)(void *arg, unsigned r, unsigned long long *state);
    /* An allocate failed with st (may be NULL: then cfg.refusal alone
     * decides): returns SH_FAIL_ERROR (with why, cap bytes, saying what was
     * wrong), SH_FAIL_REFUSED (allowed), or SH_FAIL_RECOVERED when it got
     * the block after all, in *ptr_p (the same request, once the failure
     * stopped). For fault injection: the checks after each failure. */
    int (*on_failure)(void *arg, rankmem_resource_t *mr, int thread, size_t bytes,
                      rankmem_stream_t stream, rankmem_status_t st, void **ptr_p, char *why,
                      size_t cap);
    /* Called every step before the step's work (may be NULL): trims, queries,
     * "free all" under the others' feet. Returns how many of its calls failed. */
    int (*hook)(void *arg, rankmem_resource_t *mr, int thread, long step);
    void *arg;
} sh_config_t;

typedef struct sh_result {
    long errors;     /* allocate/free/hook calls that failed */
    long corrupt;    /* blocks whose pattern changed while live */
    long misaligned; /* blocks not RANKMEM_DEFAULT_ALIGNMENT-aligned */
    long served;     /* allocations served */
    long refused;    /* allocations refused with cfg.refusal */
    long handoffs;   /* blocks freed by a thread that did not allocate them */
    long recovered;  /* failed allocations that cfg.on_failure got after all */
    char first_error[200];
} sh_result_t;

enum { SH_FAIL_ERROR, SH_FAIL_REFUSED, SH_FAIL_RECOVERED };

typedef struct {
    unsigned char *p;
    size_t n;
    uint64_t tag;
} sh_block_t;

typedef struct {
    const sh_config_t *cfg;
    pthread_barrier_t start;
    pthread_mutex_t box_lock;
    sh_block_t box[SH_MAILBOX];
    int nbox;
    sh_result_t per[SH_MAX_THREADS];
} sh_run_t;

typedef struct {
    sh_run_t *run;
    int id;
} sh_arg_t;

static inline unsigned long long sh_rng(unsigned long long *s)
{
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* Blocks up to SH_WHOLE bytes carry the pattern whole; larger ones in
 * their first and last SH_EDGE bytes and one word every SH_STRIDE bytes
 * between (megabyte blocks by the thousand would otherwise take the time). */
#define SH_WHOLE ((size_t)64 << 10)
#define SH_EDGE ((size_t)4 << 10)
#define SH_STRIDE ((size_t)512)

/* Does word i carry the pattern? */
static inline int sh_patterned(const sh_block_t *b, size_t i)
{
    size_t words = b->n / 8;
    return b->n <= SH_WHOLE || i < SH_EDGE / 8 || i >= words - SH_EDGE / 8 ||
           i % (SH_STRIDE / 8) == 0;
}

static inline void sh_fill(const sh_block_t *b)
{
    size_t words = b->n / 8;
    for (size_t i = 0; i < words; i++) {
        if (!sh_patterned(b, i)) {
            i = (i / (SH_STRIDE / 8) + 1) * (SH_STRIDE / 8) - 1; /* to the next stripe */
            if (i >= words - SH_EDGE / 8)
                i = words - SH_EDGE / 8 - 1;
            continue;
        }
        uint64_t v = b->tag ^ i;
        memcpy(b->p + 8 * i, &v, 8);
    }
    for (size_t i = words * 8; i < b->n; i++)
        b->p[i] = (unsigned char)(b->tag >> (8 * (i & 7)));
}

static inline int sh_intact(const sh_block_t *b)
{
    size_t words = b->n / 8;
    for (size_t i = 0; i < words; i++) {
        if (!sh_patterned(b, i)) {
            i = (i / (SH_STRIDE / 8) + 1) * (SH_STRIDE / 8) - 1;
            if (i >= words - SH_EDGE / 8)
                i = words - SH_EDGE / 8 - 1;
            continue;
        }
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

__attribute__((format(printf, 2, 3))) static inline void sh_note(sh_result_t *r,
                                                                const char *fmt, ...)
{
    if (r->first_error[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->first_error, sizeof r->first_error, fmt, ap);
    va_end(ap);
}

/* Check a block and free it on stream. */
static inline void sh_release(const sh_config_t *cfg, sh_result_t *r, int id,
                              const sh_block_t *b, rankmem_stream_t stream)
{
    if (!sh_intact(b)) {
        r->corrupt++;
        sh_note(r, "thread %d: block %p (%zu bytes) corrupt", id, (void *)b->p, b->n);
    }
    rankmem_status_t st = rankmem_deallocate_async(cfg->mr, b->p, b->n, 0, stream);
    if (st != RANKMEM_SUCCESS) {
        r->errors++;
        sh_note(r, "thread %d: free of %zu bytes: %s", id, b->n, rankmem_last_error());
    }
}

static inline void *sh_worker(void *arg)
{
    sh_run_t *run = ((sh_arg_t *)arg)->run;
    int id = ((sh_arg_t *)arg)->id;
    const sh_config_t *cfg = run->cfg;
    sh_result_t *r = &run->per[id];
    uintptr_t base = cfg->stream_base ? cfg->stream_base : 0x100;
    rankmem_stream_t stream =
        id < cfg->default_streams ? NULL : (rankmem_stream_t)(base * (uintptr_t)(id + 1));
    unsigned long long s = cfg->seed + (unsigned long long)id;
    unsigned alloc_mod = cfg->alloc_mod ? cfg->alloc_mod : 3;
    sh_block_t mine[SH_MAX_LIVE];
    int n = 0;
    pthread_barrier_wait(&run->start);
    for (long step = 0; step < cfg->steps; step++) {
        unsigned rnd = (unsigned)sh_rng(&s);
        if (cfg->yield_every && step % cfg->yield_every == cfg->yield_every - 1)
            sched_yield();
        if (cfg->hook) {
            int failed = cfg->hook(cfg->arg, cfg->mr, id, step);
            if (failed) {
                r->errors += failed;
                sh_note(r, "thread %d: step %ld: %s", id, step, rankmem_last_error());
            }
        }
        if (n < cfg->live && (n == 0 || rnd % alloc_mod)) {
            sh_block_t b = {NULL, cfg->size(cfg->arg, rnd, &s), 0};
            void *p = (void *)run; /* any address: a failed call must leave it alone */
            rankmem_status_t st = rankmem_allocate_async(cfg->mr, b.n, 0, stream, &p);
            if (st != RANKMEM_SUCCESS && p != (void *)run) {
                r->errors++;
                sh_note(r, "thread %d: a failed allocate of %zu bytes wrote its output", id,
                        b.n);
                continue;
            }
            if (st != RANKMEM_SUCCESS && cfg->on_failure) {
                char why[sizeof r->first_error] = "";
                int what = cfg->on_failure(cfg->arg, cfg->mr, id, b.n, stream, st, &p, why,
                                           sizeof why);
                if (what == SH_FAIL_REFUSED) {
                    r->refused++;
                    continue;
                }
                if (what != SH_FAIL_RECOVERED) {
                    r->errors++;
                    sh_note(r, "thread %d: allocate of %zu bytes: %s", id, b.n, why);
                    continue;
                }
                r->recovered++;
                st = RANKMEM_SUCCESS;
            }
            if (st != RANKMEM_SUCCESS && cfg->refusal != RANKMEM_SUCCESS && st == cfg->refusal) {
                r->refused++;
                continue;
            }
            if (st != RANKMEM_SUCCESS) {
                r->errors++;
                sh_note(r, "thread %d: allocate of %zu bytes: %s", id, b.n, rankmem_last_error());
                continue;
            }
            r->served++;
            b.p = p;
            b.tag = sh_rng(&s);
            if ((uintptr_t)p % RANKMEM_DEFAULT_ALIGNMENT)
                r->misaligned++;
            sh_fill(&b);
            mine[n++] = b;
        } else {
            int k = (int)(sh_rng(&s) % (unsigned)n);
            int passed = 0;
            if (cfg->handoff_mod && rnd % cfg->handoff_mod == 0) {
                /* Checked when taken: it must survive the trip intact. */
                pthread_mutex_lock(&run->box_lock);
                if (run->nbox < SH_MAILBOX) {
                    run->box[run->nbox++] = mine[k];
                    passed = 1;
                }
                pthread_mutex_unlock(&run->box_lock);
            }
            if (!passed)
                sh_release(cfg, r, id, &mine[k], stream);
            mine[k] = mine[--n];
        }
        if (cfg->take_mod && rnd % cfg->take_mod == 0) {
            sh_block_t b = {NULL, 0, 0};
            pthread_mutex_lock(&run->box_lock);
            if (run->nbox)
                b = run->box[--run->nbox];
            pthread_mutex_unlock(&run->box_lock);
            if (b.p) {
                sh_release(cfg, r, id, &b, stream);
                r->handoffs++;
            }
        }
    }
    while (n > 0)
        sh_release(cfg, r, id, &mine[--n], stream);
    return NULL;
}

/* Run the threads to the end; blocks left in the mailbox are checked and
 * freed on the default stream. Returns 0, or -1 for a bad configuration
 * (counted as an error in *res, which says so). */
static inline int sh_run(const sh_config_t *cfg, sh_result_t *res)
{
    memset(res, 0, sizeof *res);
    if (!cfg->mr || !cfg->size || cfg->threads < 1 || cfg->threads > SH_MAX_THREADS ||
        cfg->live < 1 || cfg->live > SH_MAX_LIVE) {
        res->errors = 1;
        snprintf(res->first_error, sizeof res->first_error, "sh_run: bad configuration");
        return -1;
    }
    sh_run_t *run = calloc(1, sizeof *run);
    if (!run) {
        res->errors = 1;
        snprintf(res->first_error, sizeof res->first_error, "sh_run: out of host memory");
        return -1;
    }
    run->cfg = cfg;
    pthread_mutex_init(&run->box_lock, NULL);
    pthread_barrier_init(&run->start, NULL, (unsigned)cfg->threads);
    pthread_t tid[SH_MAX_THREADS];
    sh_arg_t args[SH_MAX_THREADS];
    for (int i = 0; i < cfg->threads; i++) {
        args[i].run = run;
        args[i].id = i;
        if (pthread_create(&tid[i], NULL, sh_worker, &args[i]) != 0) {
            /* The barrier waits for every thread: without all, none can run. */
            printf("Bail out! sh_run: pthread_create failed\n");
            fflush(stdout);
            exit(1);
        }
    }
    for (int i = 0; i < cfg->threads; i++)
        pthread_join(tid[i], NULL);
    while (run->nbox > 0) /* handed over, never taken */
        sh_release(cfg, &run->per[0], 0, &run->box[--run->nbox], NULL);
    for (int i = 0; i < cfg->threads; i++) {
        const sh_result_t *p = &run->per[i];
        res->errors += p->errors, res->corrupt += p->corrupt;
        res->misaligned += p->misaligned, res->served += p->served;
        res->refused += p->refused, res->handoffs += p->handoffs;
        res->recovered += p->recovered;
        if (!res->first_error[0] && p->first_error[0])
            memcpy(res->first_error, p->first_error, sizeof res->first_error);
    }
    pthread_barrier_destroy(&run->start);
    pthread_mutex_destroy(&run->box_lock);
    free(run);
    return 0;
}

/* ---- one thread: a randomized run with every check ---- */

/* Log-uniform in [lo, hi]. */
static inline size_t sh_log_size(unsigned long long *s, size_t lo, size_t hi)
{
    int blo = 63 - __builtin_clzll(lo), bhi = 63 - __builtin_clzll(hi);
    int b = blo + (int)(sh_rng(s) % (unsigned)(bhi - blo + 1));
    size_t base = (size_t)1 << b, n = base + (size_t)(sh_rng(s) % base);
    return n < lo ? lo : n > hi ? hi : n;
}

#define SH_SEQ_MAX_LIVE 512

typedef struct sh_live {
    sh_block_t b;
    size_t align;
    rankmem_stream_t stream;
} sh_live_t;

typedef struct sh_seq_config {
    rankmem_resource_t *mr;
    long steps;
    int max_live;       /* 1 .. SH_SEQ_MAX_LIVE */
    unsigned alloc_pct; /* a step allocates with this chance in 100 (always when nothing is live) */
    unsigned long long seed;
    size_t (*size)(void *arg, unsigned long long *state);
    const size_t *aligns; /* the alignment is one of these (NULL: the default) */
    int naligns;
    const rankmem_stream_t *streams; /* a block's stream is one of these (NULL: the default) */
    int nstreams;
    unsigned other_stream_pct; /* chance in 100 that a free goes on a random stream */
    size_t extent;      /* overlaps are checked over this many bytes of each block (0: its
                           size; a fixed-size resource: its whole block) */
    size_t large_above; /* requests above this count as large */
    rankmem_status_t refusal; /* counted as refused, not as an error (RANKMEM_SUCCESS: none) */
    /* After every step, and once with step -1 before the blocks still live
     * are freed (may be NULL): trims, bookkeeping against the live blocks.
     * Returns how many of its checks failed. */
    int (*hook)(void *arg, rankmem_resource_t *mr, long step, const sh_live_t *live, int n);
    void *arg;
} sh_seq_config_t;

typedef struct sh_seq_result {
    long allocs;     /* served */
    long large;      /* served above cfg.large_above */
    long refused;    /* refused with cfg.refusal */
    long errors;     /* allocate/free calls that failed otherwise */
    long overlaps;   /* a new block overlapping a live one */
    long misaligned; /* a block without the alignment asked for */
    long corrupt;    /* a block whose pattern changed while live */
    long cross;      /* blocks freed on another stream than their own */
    long hook_failures;
} sh_seq_result_t;

static inline void sh_seq_free(const sh_seq_config_t *cfg, sh_seq_result_t *res,
                               const sh_live_t *l, rankmem_stream_t stream)
{
    if (!sh_intact(&l->b))
        res->corrupt++;
    if (rankmem_deallocate_async(cfg->mr, l->b.p, l->b.n, l->align, stream) != RANKMEM_SUCCESS)
        res->errors++;
}

/* Runs cfg->steps steps on the calling thread, then frees what is live. */
static inline void sh_seq_run(const sh_seq_config_t *cfg, sh_seq_result_t *res)
{
    static sh_live_t live[SH_SEQ_MAX_LIVE];
    memset(res, 0, sizeof *res);
    int max_live = cfg->max_live < 1 || cfg->max_live > SH_SEQ_MAX_LIVE ? SH_SEQ_MAX_LIVE
                                                                        : cfg->max_live;
    unsigned long long s = cfg->seed ? cfg->seed : 1;
    int n = 0;
    for (long step = 0; step < cfg->steps; step++) {
        if (n == 0 || (n < max_live && sh_rng(&s) % 100 < cfg->alloc_pct)) {
            sh_live_t l;
            l.b.n = cfg->size(cfg->arg, &s);
            l.b.tag = sh_rng(&s);
            l.align = cfg->naligns ? cfg->aligns[sh_rng(&s) % (unsigned)cfg->naligns] : 0;
            l.stream = cfg->nstreams ? cfg->streams[sh_rng(&s) % (unsigned)cfg->nstreams] : NULL;
            void *p = NULL;
            rankmem_status_t st = rankmem_allocate_async(cfg->mr, l.b.n, l.align, l.stream, &p);
            if (st != RANKMEM_SUCCESS) {
                if (cfg->refusal != RANKMEM_SUCCESS && st == cfg->refusal)
                    res->refused++;
                else
                    res->errors++;
            } else {
                res->allocs++;
                res->large += l.b.n > cfg->large_above && cfg->large_above;
                l.b.p = p;
                if ((uintptr_t)p % (l.align ? l.align : RANKMEM_DEFAULT_ALIGNMENT))
                    res->misaligned++;
                size_t ext = cfg->extent ? cfg->extent : l.b.n;
                for (int i = 0; i < n; i++) {
                    size_t other = cfg->extent ? cfg->extent : live[i].b.n;
                    if (l.b.p < live[i].b.p + other && live[i].b.p < l.b.p + ext)
                        res->overlaps++;
                }
                sh_fill(&l.b);
                live[n++] = l;
            }
        } else {
            int i = (int)(sh_rng(&s) % (unsigned)n);
            rankmem_stream_t fs = live[i].stream;
            if (cfg->nstreams && sh_rng(&s) % 100 < cfg->other_stream_pct) {
                fs = cfg->streams[sh_rng(&s) % (unsigned)cfg->nstreams];
                res->cross += fs != live[i].stream;
            }
            sh_seq_free(cfg, res, &live[i], fs);
            live[i] = live[--n];
        }
        if (cfg->hook)
            res->hook_failures += cfg->hook(cfg->arg, cfg->mr, step, live, n);
    }
    if (cfg->hook)
        res->hook_failures += cfg->hook(cfg->arg, cfg->mr, -1, live, n);
    while (n > 0) {
        n--;
        sh_seq_free(cfg, res, &live[n], live[n].stream);
    }
}

/* A sh_seq_run hook: a trim to 0 every 4000 steps, in the middle of things. */
static inline int sh_seq_hook_trim(void *arg, rankmem_resource_t *mr, long step,
                                   const sh_live_t *live, int n)
{
    (void)arg, (void)live, (void)n;
    return step % 4000 == 3999 && rankmem_resource_trim(mr, 0) != RANKMEM_SUCCESS;
}

/* A sh_run hook: thread 0 trims the resource to 0 every 2000 steps, racing with
 * everybody's allocations and frees. */
static inline int sh_hook_trim(void *arg, rankmem_resource_t *mr, int thread, long step)
{
    (void)arg;
    return thread == 0 && step % 2000 == 1999 && rankmem_resource_trim(mr, 0) != RANKMEM_SUCCESS;
}

#ifdef RANKMEM_TAP_H
/* The checks every stress run makes (tap.h included first): no call failed
 * (but for the refusals allowed) and every block was aligned; no block was
 * overwritten while live; more than min_served allocations were served. */
static inline void sh_report(const sh_result_t *res, const char *what, long min_served)
{
    if (!ok(res->errors + res->misaligned == 0,
            "%s: every call succeeded%s, every block aligned (%ld errors, %ld misaligned, %ld "
            "refused)", what, res->refused ? " or was refused as allowed" : "", res->errors,
            res->misaligned, res->refused))
        diag("  first: %s", res->first_error);
    if (!ok(res->corrupt == 0,
            "%s: every block intact until freed (%ld corrupt; %ld handed between threads)",
            what, res->corrupt, res->handoffs))
        diag("  first: %s", res->first_error);
    ok(res->served > min_served, "%s: %ld allocations served (more than %ld)", what,
       res->served, min_served);
}
#endif

#endif
