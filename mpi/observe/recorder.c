/* Observation's recorder: counters by source and kind, a bounded table of
 * live blocks with their call sites, a bounded timeline and phase marks.
 *
 * Threads that allocate at once must not wait on each other (issue 21: the
 * served allocations of RANKMEM_INTERCEPT=cuda cost a pool hit, ~100 ns,
 * and one lock over everything serialised them). So each part has its own
 * lock or none:
 *
 * - The block table is split into up to 64 parts by a hash of the pointer,
 *   each with its own lock on its own cache line: an allocation or a free
 *   locks one part, and two threads collide only when their pointers hash
 *   to the same part.
 * - Counters are per thread (a slot per thread, written by it alone, added
 *   up at a query): totals and the current values are exact whenever no
 *   feed is in flight; peaks are kept like rk_tpeak_t's (src/tslot.h; the
 *   plugin cannot link librankmem's hidden symbols, so the few lines are
 *   repeated here with the peak's time added): exact on one thread, within
 *   n * PEAK_SLACK with n threads. A counter is updated under the block's
 *   part lock, so that a block's free is counted before its address is
 *   counted again.
 * - Call sites are found without a lock (entries are only ever added, and
 *   published with a release store); a new site takes the site lock. Live
 *   bytes and counts per site are not kept: the query walks the blocks.
 * - The timeline and the phases have their own lock, which a thread takes
 *   only when its event falls in another sampling interval than its
 *   previous one; until then it raises its own pending maximum, which the
 *   next crossing or a query folds in.
 *
 * Memory is bounded by the configuration: the block table never holds more
 * than max_blocks entries (24 bytes each, each part grown by doubling), the
 * site table max_sites (each with its frames), the timeline
 * timeline_samples samples (pairs merge when it is full, keeping the
 * larger, so a peak survives and the whole run stays covered),
 * RK_OBS_MAX_PHASES phases, and one slot per thread alive at once (a slot
 * of an exited thread is taken over by the next new thread).
 *
 * rk_obs_init and rk_obs_fini must not race with feeds of other threads
 * that are past rk_obs_enabled() (the source stops feeding first); a feed
 * that starts after fini is a no-op. */
#define _GNU_SOURCE
#include "recorder.h"

#include <dlfcn.h>
#include <stddef.h>
#include <execinfo.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__thread int rk_obs_internal_depth;
__thread const void *rk_obs_caller;
__thread int rk_obs_caller_api;

static const char *const api_names[RK_OBS_NAPIS] = {
    [RK_OBS_API_OTHER] = "allocation",
    [RK_OBS_API_CUDA_MALLOC] = "cudaMalloc",
    [RK_OBS_API_CUDA_MALLOC_ASYNC] = "cudaMallocAsync",
    [RK_OBS_API_CUDA_MALLOC_FROM_POOL_ASYNC] = "cudaMallocFromPoolAsync",
    [RK_OBS_API_CUDA_MALLOC_MANAGED] = "cudaMallocManaged",
    [RK_OBS_API_CUDA_MALLOC_HOST] = "cudaMallocHost",
    [RK_OBS_API_CUDA_HOST_ALLOC] = "cudaHostAlloc",
    [RK_OBS_API_CUDA_HOST_REGISTER] = "cudaHostRegister",
    [RK_OBS_API_CUDA_MALLOC_PITCH] = "cudaMallocPitch",
    [RK_OBS_API_CUDA_MALLOC_3D] = "cudaMalloc3D",
    [RK_OBS_API_CU_MEM_ALLOC] = "cuMemAlloc",
    [RK_OBS_API_CU_MEM_ALLOC_ASYNC] = "cuMemAllocAsync",
    [RK_OBS_API_CU_MEM_ALLOC_MANAGED] = "cuMemAllocManaged",
    [RK_OBS_API_CU_MEM_ALLOC_PITCH] = "cuMemAllocPitch",
    [RK_OBS_API_CU_MEM_HOST_ALLOC] = "cuMemHostAlloc",
    [RK_OBS_API_CU_MEM_MAP] = "cuMemMap",
    [RK_OBS_API_RANKMEM] = "rankmem_allocate",
    [RK_OBS_API_TEST] = "test",
};

static const char *const kind_names[RK_OBS_NKINDS] = {"device", "managed", "pinned", "vmm"};

const char *rk_obs_api_name(int api)
{
    return api >= 0 && api < RK_OBS_NAPIS && api_names[api] ? api_names[api] : "?";
}

const char *rk_obs_kind_name(int kind)
{
    return kind >= 0 && kind < RK_OBS_NKINDS ? kind_names[kind] : "?";
}

/* ---- state ---- */

typedef struct {
    uintptr_t ptr; /* 0: empty */
    uint64_t bytes;
    uint32_t site;
    uint8_t kind, src;
} block_t;

/* A part of the block table: open addressing, its own lock and line. */
typedef struct {
    pthread_mutex_t lock;
    block_t *blocks;      /* NULL while the recorder is off */
    size_t mask, count;   /* capacity - 1; live entries */
    size_t limit;         /* its share of max_blocks */
} __attribute__((aligned(64))) part_t;

#define MAX_PARTS 64
#define PART_MIN_SHARE 1024 /* fewer parts for a small max_blocks: its bound stays close */

typedef struct {
    uint64_t hash;       /* of api, kind and frames; 0 never used for a real site */
    uint8_t api, kind, src, nframes;
    void **frames;       /* nframes, in the frame store */
} site_t;

/* A counter's shared part (see rk_tpeak_t in src/tslot.h): the flushed
 * sum and the peak, written by flushes, on a line of their own. The
 * epochs, read by every increase and written only by phase marks, are
 * apart (gepoch). */
typedef struct {
    size_t flushed;    /* atomic */
    size_t peak;       /* atomic */
    uint64_t peak_ns;  /* atomic: when peak was raised last */
} __attribute__((aligned(64))) gctr_t;

/* A counter's part in a thread's slot (written by that thread only). */
typedef struct {
    size_t cur;        /* atomic: net bytes, two's complement */
    size_t lpeak;      /* atomic: the largest estimate in epoch `epoch` */
    uint64_t lpeak_ns; /* atomic */
    unsigned epoch;    /* atomic */
    size_t base, seen, off; /* the thread's only: see rk_tpeak_local_t */
    uint64_t total, count, live; /* atomic; live: two's complement */
} lctr_t;

/* Counters: by[src][kind], program[kind], program_gpu. */
#define CTR_BY(src, kind) ((src) * RK_OBS_NKINDS + (kind))
#define CTR_PROGRAM(kind) (RK_OBS_NSOURCES * RK_OBS_NKINDS + (kind))
#define CTR_GPU (RK_OBS_NSOURCES * RK_OBS_NKINDS + RK_OBS_NKINDS)
#define NCTR (CTR_GPU + 1)

/* A thread publishes a counter's change when it reaches this either way:
 * the peaks are within n * PEAK_SLACK of the true ones with n threads. */
#define PEAK_SLACK ((size_t)8 << 20)

/* One per thread that has fed the recorder. Slots are never freed (a
 * thread's slot outlives recorder restarts; one of an exited thread is
 * taken over), so a query walks the list without a lock. */
typedef struct slot {
    struct slot *next;    /* the list: set before publication */
    const void *owner;    /* the thread's tag, NULL when orphaned (reg_lock) */
    uint64_t gen;         /* atomic: the recorder generation its counters count for */
    /* from here on, zeroed when the slot joins a generation */
    uint64_t events, unmatched, untracked; /* atomic */
    uint64_t pend_t;      /* time of the pending interval's first event (tl lock) */
    uint64_t pend_max;    /* atomic: most program_gpu live (its estimate) in it */
    uint64_t pend_end;    /* the pending interval's end (the thread's only) */
    int pend_on;          /* atomic: a pending interval is open */
    lctr_t c[NCTR];
} __attribute__((aligned(64))) slot_t;

#define SLOT_ZERO_FROM offsetof(slot_t, events)

#define MAX_SKIP 32

#define RK_OBS_LIKELY(x) __builtin_expect(!!(x), 1)
#define RK_OBS_UNLIKELY(x) __builtin_expect(!!(x), 0)

static part_t parts[MAX_PARTS];
static gctr_t gctr[NCTR];
/* atomic: bumped by each reset; the struct's size rounds to whole lines */
static struct {
    unsigned e[NCTR];
} __attribute__((aligned(64))) gepochs;
#define gepoch gepochs.e

static struct {
    int enabled;          /* atomic */
    uint64_t gen;         /* atomic: bumped by each init and fini */
    rk_obs_config_t cfg;
    uint64_t t0;
    size_t nparts;

    pthread_mutex_t site_lock;
    site_t *sites;        /* sites[0] is "other" */
    size_t nsites;        /* atomic (written under site_lock) */
    uint32_t *site_index; /* atomic entries: open addressing over sites, 0 = empty */
    size_t simask;
    void **frame_store;   /* max_sites * depth frames */
    size_t frames_used;
    uint64_t sites_dropped;
    /* Tables of the previous run: freed at the next init, not at fini, so
     * that a feed finishing its lock-free site lookup never reads freed
     * memory. */
    void *retired[3];

    pthread_mutex_t tl_lock; /* timeline and phases */
    rk_obs_sample_t *samples;
    size_t nsamples;      /* buckets in use: bucket i covers [i*interval, (i+1)*interval) */
    uint64_t interval;
    rk_obs_phase_t phases[RK_OBS_MAX_PHASES];
    size_t nphases;
    uint64_t closed_peak, closed_peak_ns; /* the most program_gpu of the closed phases */

    pthread_mutex_t misc_lock; /* state text, skipped objects, init and fini */
} R = {.site_lock = PTHREAD_MUTEX_INITIALIZER,
       .tl_lock = PTHREAD_MUTEX_INITIALIZER,
       .misc_lock = PTHREAD_MUTEX_INITIALIZER};

/* State and reason live apart from the tables: the source sets them before
 * or without starting the recorder. */
static rk_obs_state_t obs_state;
static char obs_why[200];

static rk_code_range_t skip[MAX_SKIP];
static int nskip;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(void)
{
    uint64_t t = R.cfg.clock_ns ? R.cfg.clock_ns() : mono_ns();
    return t > R.t0 ? t - R.t0 : 0;
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

static inline uint64_t hash_ptr(uintptr_t p)
{
    uint64_t x = (uint64_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

/* The part: the hash's top bits; the slot in it: its low bits. */
static inline part_t *part_of(uint64_t h) { return &parts[(h >> 58) & (R.nparts - 1)]; }

static pthread_once_t parts_once = PTHREAD_ONCE_INIT;

static void parts_init_locks(void)
{
    for (int i = 0; i < MAX_PARTS; i++)
        pthread_mutex_init(&parts[i].lock, NULL);
}

/* ---- per-thread slots ---- */

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static slot_t *slots;          /* atomic head */
static slot_t spill_slot;      /* for a thread that could get no slot, under spill_lock */
static pthread_mutex_t spill_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
static int key_ok;

static __thread char thread_tag __attribute__((tls_model("initial-exec")));
static __thread struct {
    uint64_t gen;
    slot_t *slot;
    int registered;
} tcache __attribute__((tls_model("initial-exec")));

static void thread_exit(void *arg)
{
    pthread_mutex_lock(&reg_lock);
    for (slot_t *s = slots; s; s = s->next)
        if (s->owner == arg)
            s->owner = NULL;
    pthread_mutex_unlock(&reg_lock);
    tcache.gen = 0;
    tcache.slot = NULL;
    tcache.registered = 0;
}

static void make_key(void) { key_ok = pthread_key_create(&exit_key, thread_exit) == 0; }

__attribute__((destructor)) static void recorder_unload(void)
{
    if (key_ok)
        pthread_key_delete(exit_key);
    key_ok = 0;
}

/* The calling thread's slot for generation gen, NULL when none can be had. */
static __attribute__((noinline)) slot_t *slot_slow(uint64_t gen)
{
    pthread_once(&key_once, make_key);
    pthread_mutex_lock(&reg_lock);
    slot_t *s = NULL;
    if (!tcache.registered) {
        /* without the exit hook the slot would stay owned by a dead thread */
        if (!key_ok || pthread_setspecific(exit_key, &thread_tag) != 0)
            goto out;
        tcache.registered = 1;
    }
    for (s = slots; s && s->owner != &thread_tag; s = s->next)
        ;
    if (!s)
        for (s = slots; s && s->owner; s = s->next)
            ;
    if (!s) {
        s = aligned_alloc(64, sizeof *s);
        if (!s)
            goto out;
        memset(s, 0, sizeof *s);
        s->owner = &thread_tag;
        s->next = slots;
        __atomic_store_n(&slots, s, __ATOMIC_RELEASE);
    }
    s->owner = &thread_tag;
    if (__atomic_load_n(&s->gen, __ATOMIC_RELAXED) != gen) {
        /* Only the owner writes a slot's counters: zeroing them is not a race. */
        memset((char *)s + SLOT_ZERO_FROM, 0, sizeof *s - SLOT_ZERO_FROM);
        __atomic_store_n(&s->gen, gen, __ATOMIC_RELEASE);
    }
out:
    pthread_mutex_unlock(&reg_lock);
    if (s) {
        tcache.gen = gen;
        tcache.slot = s;
    }
    return s;
}

static inline slot_t *slot_get(uint64_t gen)
{
    if (RK_OBS_LIKELY(tcache.gen == gen && tcache.slot))
        return tcache.slot;
    return slot_slow(gen);
}

/* The slot a feed writes: the thread's own, else the shared spare (under
 * spill_lock, released by slot_put). */
static slot_t *slot_take(uint64_t gen)
{
    slot_t *s = slot_get(gen);
    if (RK_OBS_LIKELY(s != NULL))
        return s;
    pthread_mutex_lock(&spill_lock);
    if (__atomic_load_n(&spill_slot.gen, __ATOMIC_RELAXED) != gen) {
        memset((char *)&spill_slot + SLOT_ZERO_FROM, 0, sizeof spill_slot - SLOT_ZERO_FROM);
        __atomic_store_n(&spill_slot.gen, gen, __ATOMIC_RELEASE);
    }
    return &spill_slot;
}

static inline void slot_put(slot_t *s)
{
    if (RK_OBS_UNLIKELY(s == &spill_slot))
        pthread_mutex_unlock(&spill_lock);
}

static slot_t *slot_first(void)
{
    slot_t *s = __atomic_load_n(&slots, __ATOMIC_ACQUIRE);
    return s ? s : &spill_slot;
}

static slot_t *slot_next(slot_t *s)
{
    return s == &spill_slot ? NULL : s->next ? s->next : &spill_slot;
}

/* Every slot counting for gen: the list, then the spare. */
#define FOR_SLOTS(s, gen)                                                                      \
    for (slot_t *s = slot_first(); s; s = slot_next(s))                                        \
        if (__atomic_load_n(&s->gen, __ATOMIC_ACQUIRE) == (gen))

/* ---- counters (rk_tpeak_t's scheme, src/tslot.h, with the peak's time) ---- */

static void raise_peak(gctr_t *g, size_t v, uint64_t t)
{
    size_t p = __atomic_load_n(&g->peak, __ATOMIC_RELAXED);
    while (v > p) {
        if (__atomic_compare_exchange_n(&g->peak, &p, v, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            /* two raisers at once may leave the other's time: a few ns apart */
            __atomic_store_n(&g->peak_ns, t, __ATOMIC_RELAXED);
            break;
        }
    }
}

static void ctr_flush(gctr_t *g, lctr_t *l, uint64_t t)
{
    size_t cur = l->cur;
    size_t f = __atomic_add_fetch(&g->flushed, cur - l->base, __ATOMIC_RELAXED);
    l->base = cur;
    l->seen = f;
    l->off = f - cur;
    raise_peak(g, f, t);
}

static void ctr_rebase(gctr_t *g, lctr_t *l, unsigned epoch, uint64_t t)
{
    /* `seen` may date from before the reset: flushing refreshes it */
    ctr_flush(g, l, t);
    __atomic_store_n(&l->lpeak, l->seen, __ATOMIC_RELAXED);
    __atomic_store_n(&l->lpeak_ns, t, __ATOMIC_RELAXED);
    __atomic_store_n(&l->epoch, epoch, __ATOMIC_RELEASE);
}

/* Whether |d| (two's complement) >= PEAK_SLACK, in one compare. */
static inline int ctr_due(size_t d) { return d + (PEAK_SLACK - 1) > 2 * (PEAK_SLACK - 1); }

static inline void ctr_add(int i, lctr_t *l, uint64_t bytes, uint64_t t)
{
    gctr_t *g = &gctr[i];
    size_t cur = l->cur + (size_t)bytes;
    __atomic_store_n(&l->cur, cur, __ATOMIC_RELAXED);
    __atomic_store_n(&l->total, l->total + bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&l->count, l->count + 1, __ATOMIC_RELAXED);
    __atomic_store_n(&l->live, l->live + 1, __ATOMIC_RELAXED);
    unsigned e = __atomic_load_n(&gepoch[i], __ATOMIC_RELAXED);
    if (RK_OBS_UNLIKELY(e != l->epoch)) {
        ctr_rebase(g, l, e, t);
        return;
    }
    if (RK_OBS_UNLIKELY(ctr_due(cur - l->base)))
        ctr_flush(g, l, t);
    size_t est = cur + l->off;
    if (est > l->lpeak) {
        __atomic_store_n(&l->lpeak, est, __ATOMIC_RELAXED);
        __atomic_store_n(&l->lpeak_ns, t, __ATOMIC_RELAXED);
    }
}

static inline void ctr_sub(int i, lctr_t *l, uint64_t bytes, uint64_t t)
{
    size_t cur = l->cur - (size_t)bytes;
    __atomic_store_n(&l->cur, cur, __ATOMIC_RELAXED);
    __atomic_store_n(&l->live, l->live - 1, __ATOMIC_RELAXED);
    if (RK_OBS_UNLIKELY(ctr_due(cur - l->base)))
        ctr_flush(&gctr[i], l, t);
}

/* The thread's estimate of a counter's current value. */
static inline uint64_t ctr_est(const lctr_t *l) { return (uint64_t)(l->cur + l->off); }

static void ctr_reset_all(void)
{
    for (int i = 0; i < NCTR; i++) {
        gepoch[i] = 1; /* slots start at 0: their first increase rebases */
        gctr[i].flushed = gctr[i].peak = 0;
        gctr[i].peak_ns = 0;
    }
}

/* Sums over the slots of generation gen. */
typedef struct {
    uint64_t cur, total, count, live, peak, peak_ns;
} ctr_view_t;

static ctr_view_t ctr_view(int i, uint64_t gen, uint64_t now)
{
    gctr_t *g = &gctr[i];
    ctr_view_t v = {0};
    unsigned e = __atomic_load_n(&gepoch[i], __ATOMIC_ACQUIRE);
    v.peak = __atomic_load_n(&g->peak, __ATOMIC_RELAXED);
    v.peak_ns = __atomic_load_n(&g->peak_ns, __ATOMIC_RELAXED);
    FOR_SLOTS(s, gen) {
        lctr_t *l = &s->c[i];
        v.cur += __atomic_load_n(&l->cur, __ATOMIC_RELAXED);
        v.total += __atomic_load_n(&l->total, __ATOMIC_RELAXED);
        v.count += __atomic_load_n(&l->count, __ATOMIC_RELAXED);
        v.live += __atomic_load_n(&l->live, __ATOMIC_RELAXED);
        if (__atomic_load_n(&l->epoch, __ATOMIC_ACQUIRE) == e) {
            uint64_t p = __atomic_load_n(&l->lpeak, __ATOMIC_RELAXED);
            uint64_t pt = __atomic_load_n(&l->lpeak_ns, __ATOMIC_RELAXED);
            /* the first to reach a peak names its time */
            if (p > v.peak || (p == v.peak && pt < v.peak_ns)) {
                v.peak = p;
                v.peak_ns = pt;
            }
        }
    }
    /* Read while threads run, the sums may be values that never were (a
     * block's free read in one slot, its new allocation in another); a
     * query never reports a peak below the current value it reports. */
    if ((int64_t)v.cur < 0)
        v.cur = 0;
    if ((int64_t)v.live < 0)
        v.live = 0;
    if (v.cur > v.peak) {
        v.peak = v.cur;
        v.peak_ns = now;
    }
    return v;
}

/* Restarts program_gpu's peak at its current value (a phase mark), which
 * it returns; tl_lock held. self: the caller's slot (flushed first, so
 * that a one-thread phase stays exact), or NULL. */
static uint64_t gpu_reset(uint64_t gen, slot_t *self, uint64_t t)
{
    gctr_t *g = &gctr[CTR_GPU];
    if (self)
        ctr_flush(g, &self->c[CTR_GPU], t);
    unsigned e = __atomic_load_n(&gepoch[CTR_GPU], __ATOMIC_RELAXED) + 1;
    if (e == 0)
        e = 1;
    __atomic_store_n(&gepoch[CTR_GPU], e, __ATOMIC_RELEASE);
    if (self) {
        lctr_t *l = &self->c[CTR_GPU];
        __atomic_store_n(&l->lpeak, l->seen, __ATOMIC_RELAXED);
        __atomic_store_n(&l->lpeak_ns, t, __ATOMIC_RELAXED);
        __atomic_store_n(&l->epoch, e, __ATOMIC_RELEASE);
    }
    uint64_t cur = 0;
    FOR_SLOTS(s, gen)
        cur += __atomic_load_n(&s->c[CTR_GPU].cur, __ATOMIC_RELAXED);
    if ((int64_t)cur < 0)
        cur = 0;
    /* flushed may exceed the current by what others freed and did not
     * flush (within the bound): keeping it bounds every later true value */
    size_t f = __atomic_load_n(&g->flushed, __ATOMIC_RELAXED);
    __atomic_store_n(&g->peak, f > cur ? f : cur, __ATOMIC_RELAXED);
    __atomic_store_n(&g->peak_ns, t, __ATOMIC_RELAXED);
    return cur;
}

/* ---- set-up ---- */

static void free_parts(void)
{
    for (size_t i = 0; i < MAX_PARTS; i++) {
        part_t *p = &parts[i];
        pthread_mutex_lock(&p->lock);
        free(p->blocks);
        p->blocks = NULL;
        p->mask = p->count = p->limit = 0;
        pthread_mutex_unlock(&p->lock);
    }
}

static void retire_sites(void)
{
    pthread_mutex_lock(&R.site_lock);
    for (int i = 0; i < 3; i++)
        free(R.retired[i]);
    R.retired[0] = R.sites;
    R.retired[1] = R.site_index;
    R.retired[2] = R.frame_store;
    R.sites = NULL;
    R.site_index = NULL;
    R.frame_store = NULL;
    pthread_mutex_unlock(&R.site_lock);
}

/* Everything off (misc_lock held). */
static void tables_off(void)
{
    __atomic_store_n(&R.enabled, 0, __ATOMIC_RELEASE);
    __atomic_add_fetch(&R.gen, 1, __ATOMIC_RELEASE);
    free_parts();
    retire_sites();
    pthread_mutex_lock(&R.tl_lock);
    free(R.samples);
    R.samples = NULL;
    R.nsamples = 0;
    pthread_mutex_unlock(&R.tl_lock);
}

int rk_obs_init(const rk_obs_config_t *cfg)
{
    rk_obs_config_t c = cfg ? *cfg : (rk_obs_config_t){0};
    if (!c.max_blocks)
        c.max_blocks = (size_t)1 << 20;
    if (!c.max_sites)
        c.max_sites = 4096;
    if (c.backtrace_depth < 0)
        c.backtrace_depth = 0;
    if (c.backtrace_depth > RK_OBS_MAX_FRAMES)
        c.backtrace_depth = RK_OBS_MAX_FRAMES;
    if (!c.timeline_samples)
        c.timeline_samples = 512;
    if (c.timeline_samples < 2)
        c.timeline_samples = 2;
    if (!c.sample_ns)
        c.sample_ns = 10000000u;

    pthread_once(&parts_once, parts_init_locks);
    pthread_mutex_lock(&R.misc_lock);
    tables_off();
    ctr_reset_all();
    R.cfg = c;
    R.t0 = 0;
    R.t0 = c.clock_ns ? c.clock_ns() : mono_ns();

    /* As many parts as keep each one's share of max_blocks at least
     * PART_MIN_SHARE (a small bound stays nearly exact); the shares add up
     * to max_blocks. Each part starts small and doubles up to its share. */
    size_t np = 1;
    while (np < MAX_PARTS && np * 2 * PART_MIN_SHARE <= c.max_blocks)
        np *= 2;
    R.nparts = np;
    size_t pcap = pow2_at_least(1024 / np < 16 ? 16 : 1024 / np);
    int bad = 0;
    for (size_t i = 0; i < np; i++) {
        part_t *p = &parts[i];
        pthread_mutex_lock(&p->lock);
        p->blocks = calloc(pcap, sizeof *p->blocks);
        p->mask = pcap - 1;
        p->count = 0;
        p->limit = c.max_blocks / np + (i < c.max_blocks % np);
        bad |= !p->blocks;
        pthread_mutex_unlock(&p->lock);
    }

    /* The site index is sized for the bound at once (4 bytes a slot). */
    size_t sicap = pow2_at_least(c.max_sites * 2 + 2);
    pthread_mutex_lock(&R.site_lock);
    R.sites = calloc(c.max_sites + 1, sizeof *R.sites);
    R.site_index = calloc(sicap, sizeof *R.site_index);
    R.frame_store = c.backtrace_depth
                        ? calloc(c.max_sites * (size_t)c.backtrace_depth, sizeof(void *))
                        : NULL;
    R.simask = sicap - 1;
    R.nsites = 1; /* site 0: "other" */
    R.frames_used = 0;
    R.sites_dropped = 0;
    if (R.sites)
        R.sites[0].api = RK_OBS_API_OTHER;
    bad |= !R.sites || !R.site_index || (c.backtrace_depth && !R.frame_store);
    pthread_mutex_unlock(&R.site_lock);

    pthread_mutex_lock(&R.tl_lock);
    R.samples = calloc(c.timeline_samples, sizeof *R.samples);
    R.nsamples = 0;
    R.interval = c.sample_ns;
    R.nphases = 1;
    memset(R.phases, 0, sizeof R.phases);
    snprintf(R.phases[0].name, sizeof R.phases[0].name, "start");
    R.closed_peak = R.closed_peak_ns = 0;
    bad |= !R.samples;
    pthread_mutex_unlock(&R.tl_lock);

    if (bad) {
        tables_off();
        pthread_mutex_unlock(&R.misc_lock);
        return -1;
    }
    __atomic_add_fetch(&R.gen, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&R.enabled, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&R.misc_lock);
    return 0;
}

void rk_obs_fini(void)
{
    pthread_mutex_lock(&R.misc_lock);
    tables_off();
    pthread_mutex_unlock(&R.misc_lock);
}

int rk_obs_enabled(void)
{
    return __atomic_load_n(&R.enabled, __ATOMIC_ACQUIRE);
}

void rk_obs_set_state(rk_obs_state_t state, const char *why)
{
    pthread_mutex_lock(&R.misc_lock);
    obs_state = state;
    snprintf(obs_why, sizeof obs_why, "%s", why ? why : "");
    pthread_mutex_unlock(&R.misc_lock);
}

rk_obs_state_t rk_obs_get_state(const char **why_p)
{
    if (why_p)
        *why_p = obs_why;
    return obs_state;
}

typedef struct {
    const char *sub;
    rk_code_range_t *out;
    int *n, max;
} ranges_arg_t;

static int add_ranges(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    const ranges_arg_t *a = arg;
    if (!info->dlpi_name || !strstr(info->dlpi_name, a->sub))
        return 0;
    for (int i = 0; i < info->dlpi_phnum && *a->n < a->max; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        uintptr_t lo = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
        a->out[*a->n] = (rk_code_range_t){lo, lo + ph->p_memsz};
        (*a->n)++;
    }
    return 0;
}

void rk_code_ranges(const char *substring, rk_code_range_t *out, int *n, int max)
{
    if (!substring || !*substring || !out || !n)
        return;
    ranges_arg_t a = {substring, out, n, max};
    dl_iterate_phdr(add_ranges, &a);
}

void rk_obs_skip_objects(const char *substring)
{
    pthread_mutex_lock(&R.misc_lock);
    rk_code_ranges(substring, skip, &nskip, MAX_SKIP);
    pthread_mutex_unlock(&R.misc_lock);
}

/* ---- timeline and phases ---- */

/* Brings the timeline up to time t (buckets between the last one and t get
 * the level `before`) and raises t's bucket to hi; returns t's bucket
 * (tl_lock held). */
static size_t timeline_note(uint64_t t, uint64_t before, uint64_t hi)
{
    size_t cap = R.cfg.timeline_samples;
    size_t idx = (size_t)(t / R.interval);
    while (idx >= cap) {
        /* merge pairs: the interval doubles, the maximum of each pair stays */
        size_t n = 0;
        for (size_t i = 0; i < R.nsamples; i += 2) {
            uint64_t b = R.samples[i].bytes;
            if (i + 1 < R.nsamples && R.samples[i + 1].bytes > b)
                b = R.samples[i + 1].bytes;
            R.samples[n].bytes = b;
            n++;
        }
        R.nsamples = n;
        R.interval *= 2;
        for (size_t i = 0; i < n; i++)
            R.samples[i].t_ns = (uint64_t)i * R.interval;
        idx = (size_t)(t / R.interval);
    }
    while (R.nsamples <= idx) {
        R.samples[R.nsamples].t_ns = (uint64_t)R.nsamples * R.interval;
        R.samples[R.nsamples].bytes = before;
        R.nsamples++;
    }
    if (R.samples[idx].bytes < hi)
        R.samples[idx].bytes = hi;
    return idx;
}

/* A slot's pending maximum into its bucket (tl_lock held). Its bucket
 * exists: it was made when the interval opened, and merging keeps it. */
static void fold_pending(slot_t *s)
{
    if (!__atomic_load_n(&s->pend_on, __ATOMIC_ACQUIRE))
        return;
    size_t idx = (size_t)(s->pend_t / R.interval);
    uint64_t m = __atomic_load_n(&s->pend_max, __ATOMIC_RELAXED);
    if (idx < R.nsamples && R.samples[idx].bytes < m)
        R.samples[idx].bytes = m;
}

static void fold_all_pending(uint64_t gen)
{
    FOR_SLOTS(s, gen)
        fold_pending(s);
}

/* An event of this thread that moved program_gpu from before to after (its
 * estimates) at time t. */
static __attribute__((noinline)) void timeline_cross(slot_t *s, uint64_t t, uint64_t before,
                                                    uint64_t hi)
{
    pthread_mutex_lock(&R.tl_lock);
    if (R.samples) {
        fold_pending(s);
        size_t idx = timeline_note(t, before, hi);
        s->pend_t = t;
        __atomic_store_n(&s->pend_max, hi, __ATOMIC_RELAXED);
        s->pend_end = (uint64_t)(idx + 1) * R.interval;
        __atomic_store_n(&s->pend_on, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&R.tl_lock);
}

static inline void timeline_event(slot_t *s, uint64_t t, uint64_t before, uint64_t after)
{
    uint64_t hi = before > after ? before : after;
    /* An interval merged since it opened only ends later than pend_end:
     * crossing early is harmless. */
    if (RK_OBS_LIKELY(s->pend_on && t >= s->pend_t && t < s->pend_end)) {
        if (hi > s->pend_max)
            __atomic_store_n(&s->pend_max, hi, __ATOMIC_RELAXED);
        return;
    }
    timeline_cross(s, t, before, hi);
}

/* ---- the block table: parts of open addressing, backward-shift deletion ---- */

static int part_grow(part_t *p)
{
    size_t cap = (p->mask + 1) * 2;
    block_t *nb = calloc(cap, sizeof *nb);
    if (!nb)
        return -1;
    for (size_t i = 0; i <= p->mask; i++) {
        if (!p->blocks[i].ptr)
            continue;
        size_t j = hash_ptr(p->blocks[i].ptr) & (cap - 1);
        while (nb[j].ptr)
            j = (j + 1) & (cap - 1);
        nb[j] = p->blocks[i];
    }
    free(p->blocks);
    p->blocks = nb;
    p->mask = cap - 1;
    return 0;
}

static size_t part_find(const part_t *p, uintptr_t ptr, uint64_t h)
{
    size_t i = h & p->mask;
    while (p->blocks[i].ptr) {
        if (p->blocks[i].ptr == ptr)
            return i;
        i = (i + 1) & p->mask;
    }
    return SIZE_MAX;
}

static void part_remove_at(part_t *p, size_t i)
{
    size_t j = i;
    for (;;) {
        j = (j + 1) & p->mask;
        if (!p->blocks[j].ptr)
            break;
        size_t home = hash_ptr(p->blocks[j].ptr) & p->mask;
        /* move j back to i when its home is not in (i, j] (cyclically) */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            p->blocks[i] = p->blocks[j];
            i = j;
        }
    }
    p->blocks[i].ptr = 0;
    p->count--;
}

/* ---- sites ---- */

static uint64_t site_hash(int api, int kind, void *const *frames, int n)
{
    uint64_t h = 0xcbf29ce484222325ULL ^ ((uint64_t)api << 8 | (uint64_t)kind);
    h *= 0x100000001b3ULL;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)(uintptr_t)frames[i];
        h *= 0x100000001b3ULL;
        h ^= h >> 29;
    }
    return h ? h : 1;
}

static int site_is(const site_t *s, uint64_t h, int api, int kind, void *const *frames, int n)
{
    return s->hash == h && s->api == api && s->kind == kind && s->nframes == n &&
           (!n || !memcmp(s->frames, frames, (size_t)n * sizeof *frames));
}

/* Lock-free for a known site (entries are only added, each published by a
 * release store of its index); a new one takes site_lock. */
static uint32_t site_of(int api, int kind, int src, void *const *frames, int n)
{
    uint64_t h = site_hash(api, kind, frames, n);
    uint32_t *index = R.site_index;
    if (!index)
        return 0;
    size_t i = (size_t)h & R.simask;
    for (;;) {
        uint32_t id = __atomic_load_n(&index[i], __ATOMIC_ACQUIRE);
        if (!id)
            break;
        if (site_is(&R.sites[id], h, api, kind, frames, n))
            return id;
        i = (i + 1) & R.simask;
    }
    pthread_mutex_lock(&R.site_lock);
    uint32_t found = 0;
    if (R.site_index != index) /* the recorder restarted meanwhile */
        goto out;
    for (;; i = (i + 1) & R.simask) { /* on from where the search stopped */
        uint32_t id = index[i];
        if (!id)
            break;
        if (site_is(&R.sites[id], h, api, kind, frames, n)) {
            found = id;
            goto out;
        }
    }
    if (R.nsites > R.cfg.max_sites) {
        R.sites_dropped++;
        goto out;
    }
    found = (uint32_t)R.nsites;
    site_t *s = &R.sites[found];
    memset(s, 0, sizeof *s);
    s->hash = h;
    s->api = (uint8_t)api;
    s->kind = (uint8_t)kind;
    s->src = (uint8_t)src;
    s->nframes = (uint8_t)n;
    if (n) {
        s->frames = R.frame_store + R.frames_used;
        R.frames_used += (size_t)n;
        memcpy(s->frames, frames, (size_t)n * sizeof *frames);
    }
    __atomic_store_n(&R.nsites, R.nsites + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&index[i], found, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&R.site_lock);
    return found;
}

static int skipped(uintptr_t a) { return rk_in_ranges(skip, nskip, a); }

int rk_obs_skipped(const void *pc) { return skipped((uintptr_t)pc); }

/* The caller's frames from `from` (rk_obs_alloc's return address) on,
 * without frames in skipped objects: what comes before it is the recorder's
 * own, however the compiler inlined it. */
static __attribute__((noinline)) int capture(void **out, int depth, void *from)
{
    void *raw[RK_OBS_MAX_FRAMES + 40];
    int want = depth + 2 + 24;
    if (want > (int)(sizeof raw / sizeof raw[0]))
        want = (int)(sizeof raw / sizeof raw[0]);
    int n = backtrace(raw, want);
    int first = 0;
    while (first < n && first < 6 && raw[first] != from)
        first++;
    if (first == n || first == 6)
        first = 2;
    int k = 0;
    for (int i = first; i < n && k < depth; i++)
        if (!skipped((uintptr_t)raw[i]))
            out[k++] = raw[i];
    return k;
}

/* ---- feeding ---- */

static inline void bump(uint64_t *c) { __atomic_store_n(c, *c + 1, __ATOMIC_RELAXED); }

static void account_alloc(slot_t *s, int kind, int src, uint64_t bytes, uint64_t t)
{
    ctr_add(CTR_BY(src, kind), &s->c[CTR_BY(src, kind)], bytes, t);
    if (src == RK_OBS_RANKMEM)
        return;
    ctr_add(CTR_PROGRAM(kind), &s->c[CTR_PROGRAM(kind)], bytes, t);
    if (kind != RK_OBS_PINNED) {
        lctr_t *g = &s->c[CTR_GPU];
        uint64_t before = ctr_est(g);
        ctr_add(CTR_GPU, g, bytes, t);
        timeline_event(s, t, before, ctr_est(g));
    }
}

static void account_free(slot_t *s, int kind, int src, uint64_t bytes, uint64_t t)
{
    ctr_sub(CTR_BY(src, kind), &s->c[CTR_BY(src, kind)], bytes, t);
    if (src == RK_OBS_RANKMEM)
        return;
    ctr_sub(CTR_PROGRAM(kind), &s->c[CTR_PROGRAM(kind)], bytes, t);
    if (kind != RK_OBS_PINNED) {
        lctr_t *g = &s->c[CTR_GPU];
        uint64_t before = ctr_est(g);
        ctr_sub(CTR_GPU, g, bytes, t);
        timeline_event(s, t, before, ctr_est(g));
    }
}

static void record(int kind, int src, int api, uintptr_t ptr, uint64_t bytes, void *const *frames,
                   int nframes)
{
    uint64_t gen = __atomic_load_n(&R.gen, __ATOMIC_ACQUIRE);
    uint32_t site = 0;
    if (src != RK_OBS_RANKMEM)
        site = site_of(api, kind, src, frames, nframes);
    uint64_t h = hash_ptr(ptr);
    part_t *p = part_of(h);
    slot_t *s = slot_take(gen);
    pthread_mutex_lock(&p->lock);
    if (!p->blocks) { /* off meanwhile */
        pthread_mutex_unlock(&p->lock);
        slot_put(s);
        return;
    }
    /* The clock is read under the lock: a block's free and its address's
     * next allocation are stamped in that order. */
    uint64_t t = now_ns();
    bump(&s->events);
    size_t old = part_find(p, ptr, h);
    if (old != SIZE_MAX) {
        /* a free we never saw: settle the old block first */
        block_t b = p->blocks[old];
        part_remove_at(p, old);
        account_free(s, b.kind, b.src, b.bytes, t);
    }
    if (p->count >= p->limit || ((p->count + 1) * 2 > p->mask + 1 && part_grow(p) != 0)) {
        /* Counted as made, but not kept: its free could not be matched, so
         * it stays out of the current bytes. */
        lctr_t *l = &s->c[CTR_BY(src, kind)];
        bump(&s->untracked);
        __atomic_store_n(&l->total, l->total + bytes, __ATOMIC_RELAXED);
        bump(&l->count);
    } else {
        size_t i = h & p->mask;
        while (p->blocks[i].ptr)
            i = (i + 1) & p->mask;
        p->blocks[i] = (block_t){.ptr = ptr, .bytes = bytes, .site = site,
                                 .kind = (uint8_t)kind, .src = (uint8_t)src};
        p->count++;
        account_alloc(s, kind, src, bytes, t);
    }
    pthread_mutex_unlock(&p->lock);
    slot_put(s);
}

static int valid(rk_obs_kind_t kind, rk_obs_source_t src, uintptr_t ptr, uint64_t bytes)
{
    return ptr && bytes && (unsigned)kind < RK_OBS_NKINDS && (unsigned)src < RK_OBS_NSOURCES;
}

static inline void alloc_from(rk_obs_kind_t kind, rk_obs_source_t src, rk_obs_api_t api,
                              uintptr_t ptr, uint64_t bytes, void *from)
{
    if (!rk_obs_enabled() || !valid(kind, src, ptr, bytes))
        return;
    void *frames[RK_OBS_MAX_FRAMES];
    int n = 0;
    if (R.cfg.backtrace_depth > 0 && src != RK_OBS_RANKMEM)
        n = capture(frames, R.cfg.backtrace_depth, from);
    record(kind, src, api, ptr, bytes, frames, n);
}

void rk_obs_alloc(rk_obs_kind_t kind, rk_obs_source_t src, rk_obs_api_t api, uintptr_t ptr,
                  uint64_t bytes)
{
    alloc_from(kind, src, api, ptr, bytes, __builtin_return_address(0));
}

void rk_obs_alloc_from(rk_obs_kind_t kind, rk_obs_source_t src, rk_obs_api_t api, uintptr_t ptr,
                       uint64_t bytes, void *from)
{
    alloc_from(kind, src, api, ptr, bytes, from);
}

void rk_obs_alloc_at(rk_obs_kind_t kind, rk_obs_source_t src, rk_obs_api_t api, uintptr_t ptr,
                     uint64_t bytes, void *const *frames, int nframes)
{
    if (!rk_obs_enabled() || !valid(kind, src, ptr, bytes))
        return;
    if (nframes < 0 || !frames)
        nframes = 0;
    if (nframes > R.cfg.backtrace_depth)
        nframes = R.cfg.backtrace_depth;
    record(kind, src, api, ptr, bytes, frames, nframes);
}

uint64_t rk_obs_free(uintptr_t ptr)
{
    if (!rk_obs_enabled() || !ptr)
        return 0;
    uint64_t gen = __atomic_load_n(&R.gen, __ATOMIC_ACQUIRE);
    uint64_t h = hash_ptr(ptr);
    part_t *p = part_of(h);
    slot_t *s = slot_take(gen);
    uint64_t bytes = 0;
    pthread_mutex_lock(&p->lock);
    if (p->blocks) {
        bump(&s->events);
        size_t i = part_find(p, ptr, h);
        if (i == SIZE_MAX) {
            bump(&s->unmatched);
        } else {
            block_t b = p->blocks[i];
            part_remove_at(p, i);
            account_free(s, b.kind, b.src, b.bytes, now_ns());
            bytes = b.bytes;
        }
    }
    pthread_mutex_unlock(&p->lock);
    slot_put(s);
    return bytes;
}

void rk_obs_phase(const char *name)
{
    if (!rk_obs_enabled())
        return;
    uint64_t gen = __atomic_load_n(&R.gen, __ATOMIC_ACQUIRE);
    slot_t *self = slot_get(gen);
    pthread_mutex_lock(&R.tl_lock);
    if (R.samples) {
        uint64_t t = now_ns();
        uint64_t level;
        if (R.nphases < RK_OBS_MAX_PHASES) {
            rk_obs_phase_t *last = &R.phases[R.nphases - 1];
            ctr_view_t v = ctr_view(CTR_GPU, gen, t);
            last->t_end_ns = t;
            last->peak = v.peak;
            if (v.peak > R.closed_peak) {
                R.closed_peak = v.peak;
                R.closed_peak_ns = v.peak_ns;
            }
            level = gpu_reset(gen, self, t);
            rk_obs_phase_t *p = &R.phases[R.nphases++];
            memset(p, 0, sizeof *p);
            snprintf(p->name, sizeof p->name, "%s", name && *name ? name : "phase");
            p->t_start_ns = t;
            p->start_bytes = p->peak = level;
        } else {
            level = ctr_view(CTR_GPU, gen, t).cur;
        }
        fold_all_pending(gen);
        timeline_note(t, level, level);
    }
    pthread_mutex_unlock(&R.tl_lock);
}

void rk_obs_sample_now(void)
{
    if (!rk_obs_enabled())
        return;
    uint64_t gen = __atomic_load_n(&R.gen, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&R.tl_lock);
    if (R.samples) {
        uint64_t t = now_ns();
        uint64_t level = ctr_view(CTR_GPU, gen, t).cur;
        fold_all_pending(gen);
        timeline_note(t, level, level);
    }
    pthread_mutex_unlock(&R.tl_lock);
}

/* ---- queries ---- */

static void view_to_counts(rk_obs_counts_t *c, const ctr_view_t *v)
{
    c->current = v->cur;
    c->peak = v->peak;
    c->total = v->total;
    c->count = v->count;
    c->live = v->live;
    c->peak_ns = v->peak_ns;
}

void rk_obs_summary(rk_obs_summary_t *s)
{
    if (!s)
        return;
    memset(s, 0, sizeof *s);
    if (!rk_obs_enabled())
        return;
    uint64_t gen = __atomic_load_n(&R.gen, __ATOMIC_ACQUIRE);
    /* tl_lock: phase marks (which restart program_gpu's peak) wait */
    pthread_mutex_lock(&R.tl_lock);
    if (!R.samples) {
        pthread_mutex_unlock(&R.tl_lock);
        return;
    }
    uint64_t now = now_ns();
    s->now_ns = now;
    for (int src = 0; src < RK_OBS_NSOURCES; src++)
        for (int kind = 0; kind < RK_OBS_NKINDS; kind++) {
            ctr_view_t v = ctr_view(CTR_BY(src, kind), gen, now);
            view_to_counts(&s->by[src][kind], &v);
        }
    for (int kind = 0; kind < RK_OBS_NKINDS; kind++) {
        ctr_view_t v = ctr_view(CTR_PROGRAM(kind), gen, now);
        view_to_counts(&s->program[kind], &v);
    }
    ctr_view_t v = ctr_view(CTR_GPU, gen, now);
    if (R.closed_peak > v.peak || (R.closed_peak == v.peak && R.closed_peak_ns < v.peak_ns)) {
        v.peak = R.closed_peak;
        v.peak_ns = R.closed_peak_ns;
    }
    view_to_counts(&s->program_gpu, &v);
    size_t nslots = 0;
    FOR_SLOTS(sl, gen) {
        s->events += __atomic_load_n(&sl->events, __ATOMIC_RELAXED);
        s->unmatched_frees += __atomic_load_n(&sl->unmatched, __ATOMIC_RELAXED);
        s->untracked += __atomic_load_n(&sl->untracked, __ATOMIC_RELAXED);
        nslots++;
    }
    size_t bytes = R.cfg.timeline_samples * sizeof(rk_obs_sample_t) + nslots * sizeof(slot_t);
    pthread_mutex_unlock(&R.tl_lock);

    for (size_t i = 0; i < R.nparts; i++) {
        part_t *p = &parts[i];
        pthread_mutex_lock(&p->lock);
        if (p->blocks)
            bytes += (p->mask + 1) * sizeof(block_t);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_lock(&R.site_lock);
    if (R.sites) {
        s->sites = R.nsites - 1;
        s->sites_dropped = R.sites_dropped;
        bytes += (R.cfg.max_sites + 1) * sizeof(site_t) + (R.simask + 1) * sizeof(uint32_t) +
                 R.cfg.max_sites * (size_t)R.cfg.backtrace_depth * sizeof(void *);
    }
    pthread_mutex_unlock(&R.site_lock);
    s->bytes_used = bytes;
}

static int cmp_site_bytes(const void *a, const void *b)
{
    const rk_obs_site_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

size_t rk_obs_live_sites(rk_obs_site_t *out, size_t max)
{
    size_t total = 0;
    if (!rk_obs_enabled())
        return 0;
    /* Live bytes per site are not kept by the feeds: added up here from
     * the blocks, one part at a time. */
    pthread_mutex_lock(&R.site_lock);
    size_t ns = R.sites ? R.nsites : 0;
    uint64_t *acc = ns ? calloc(ns * 2, sizeof *acc) : NULL;
    if (!acc) {
        pthread_mutex_unlock(&R.site_lock);
        return 0;
    }
    for (size_t k = 0; k < R.nparts; k++) {
        part_t *p = &parts[k];
        pthread_mutex_lock(&p->lock);
        for (size_t i = 0; p->blocks && i <= p->mask; i++) {
            const block_t *b = &p->blocks[i];
            if (b->ptr && b->src != RK_OBS_RANKMEM && b->site < ns) {
                acc[2 * b->site] += b->bytes;
                acc[2 * b->site + 1]++;
            }
        }
        pthread_mutex_unlock(&p->lock);
    }
    /* keep the largest max sites: fill, then replace the smallest */
    for (size_t id = 0; id < ns; id++) {
        const site_t *s = &R.sites[id];
        if (!acc[2 * id + 1])
            continue;
        total++;
        if (!out || !max)
            continue;
        rk_obs_site_t v = {.id = (uint32_t)id, .api = s->api, .kind = s->kind,
                           .source = s->src, .bytes = acc[2 * id], .count = acc[2 * id + 1],
                           .nframes = s->nframes};
        if (s->nframes)
            memcpy(v.frames, s->frames, s->nframes * sizeof(void *));
        size_t have = total <= max ? total - 1 : max;
        if (have < max) {
            out[have] = v;
        } else {
            size_t small = 0;
            for (size_t k = 1; k < max; k++)
                if (out[k].bytes < out[small].bytes)
                    small = k;
            if (v.bytes > out[small].bytes)
                out[small] = v;
        }
    }
    pthread_mutex_unlock(&R.site_lock);
    free(acc);
    if (out && max)
        qsort(out, total < max ? total : max, sizeof *out, cmp_site_bytes);
    return total;
}

size_t rk_obs_timeline(rk_obs_sample_t *out, size_t max)
{
    size_t n = 0;
    if (!rk_obs_enabled())
        return 0;
    uint64_t gen = __atomic_load_n(&R.gen, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&R.tl_lock);
    if (R.samples) {
        fold_all_pending(gen);
        n = R.nsamples;
        if (out)
            memcpy(out, R.samples, (n < max ? n : max) * sizeof *out);
    }
    pthread_mutex_unlock(&R.tl_lock);
    return n;
}

size_t rk_obs_phases(rk_obs_phase_t *out, size_t max)
{
    size_t n = 0;
    if (!rk_obs_enabled())
        return 0;
    uint64_t gen = __atomic_load_n(&R.gen, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&R.tl_lock);
    if (R.samples) {
        n = R.nphases;
        if (out) {
            memcpy(out, R.phases, (n < max ? n : max) * sizeof *out);
            if (n <= max) {
                /* the open phase: its peak so far */
                uint64_t now = now_ns();
                out[n - 1].t_end_ns = now;
                out[n - 1].peak = ctr_view(CTR_GPU, gen, now).peak;
            }
        }
    }
    pthread_mutex_unlock(&R.tl_lock);
    return n;
}

/* For a signal handler (mpi/failure.c): the counters read with atomic
 * loads only, and the timeline copied when its lock is free. A handler
 * must not wait for a lock that the thread it interrupted may hold, so
 * the lock is tried, never taken: when it is busy, the timeline is left
 * out (*ntl = 0) and the closed phases' peak may be missed. Neither
 * allocates. */
int rk_obs_snapshot_try(rk_obs_summary_t *s, rk_obs_sample_t *tl, size_t max, size_t *ntl)
{
    *ntl = 0;
    memset(s, 0, sizeof *s);
    if (!rk_obs_enabled())
        return -1;
    uint64_t gen = __atomic_load_n(&R.gen, __ATOMIC_ACQUIRE);
    int locked = pthread_mutex_trylock(&R.tl_lock) == 0;
    if (locked && !R.samples) {
        pthread_mutex_unlock(&R.tl_lock);
        return -1;
    }
    uint64_t now = now_ns();
    s->now_ns = now;
    for (int src = 0; src < RK_OBS_NSOURCES; src++)
        for (int kind = 0; kind < RK_OBS_NKINDS; kind++) {
            ctr_view_t v = ctr_view(CTR_BY(src, kind), gen, now);
            view_to_counts(&s->by[src][kind], &v);
        }
    for (int kind = 0; kind < RK_OBS_NKINDS; kind++) {
        ctr_view_t v = ctr_view(CTR_PROGRAM(kind), gen, now);
        view_to_counts(&s->program[kind], &v);
    }
    ctr_view_t v = ctr_view(CTR_GPU, gen, now);
    if (locked && R.closed_peak > v.peak) {
        v.peak = R.closed_peak;
        v.peak_ns = R.closed_peak_ns;
    }
    view_to_counts(&s->program_gpu, &v);
    FOR_SLOTS(sl, gen) {
        s->events += __atomic_load_n(&sl->events, __ATOMIC_RELAXED);
        s->unmatched_frees += __atomic_load_n(&sl->unmatched, __ATOMIC_RELAXED);
        s->untracked += __atomic_load_n(&sl->untracked, __ATOMIC_RELAXED);
    }
    if (locked) {
        fold_all_pending(gen);
        size_t n = R.nsamples < max ? R.nsamples : max;
        if (tl && n)
            memcpy(tl, R.samples, n * sizeof *tl);
        *ntl = tl ? n : 0;
        pthread_mutex_unlock(&R.tl_lock);
    }
    return 0;
}
