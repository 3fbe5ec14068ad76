/* Observation's recorder: counters by source and kind, a bounded table of
 * live blocks with their call sites, a bounded timeline and phase marks.
 *
 * One lock guards everything. The sources it serves are cudaMalloc (~90 us,
 * serialised in the driver anyway) and cudaMallocAsync (~1.6 us); an
 * uncontended lock costs ~20 ns of that. Per-thread counting is issue 21's.
 *
 * Memory is bounded by the configuration: the block table never holds more
 * than max_blocks entries (24 bytes each, grown by doubling), the site table
 * max_sites (each with its frames), the timeline timeline_samples samples
 * (pairs merge when it is full, keeping the larger, so a peak survives and
 * the whole run stays covered) and RK_OBS_MAX_PHASES phases. */
#define _GNU_SOURCE
#include "recorder.h"

#include <dlfcn.h>
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

typedef struct {
    uint64_t hash;       /* of api, kind and frames; 0 never used for a real site */
    uint64_t bytes, count;
    uint8_t api, kind, src, nframes;
    void **frames;       /* nframes, in the frame store */
} site_t;

#define MAX_SKIP 32

static struct {
    pthread_mutex_t lock;
    int enabled;
    rk_obs_config_t cfg;
    uint64_t t0;

    block_t *blocks;
    size_t bmask, bcount; /* capacity - 1; live entries */

    site_t *sites;        /* sites[0] is "other" */
    size_t nsites;
    uint32_t *site_index; /* open addressing over sites, 0 = empty */
    size_t simask;
    void **frame_store;   /* max_sites * depth frames */
    size_t frames_used;

    rk_obs_counts_t by[RK_OBS_NSOURCES][RK_OBS_NKINDS];
    rk_obs_counts_t program[RK_OBS_NKINDS];
    rk_obs_counts_t program_gpu;
    uint64_t events, unmatched, untracked, sites_dropped;

    rk_obs_sample_t *samples;
    size_t nsamples;      /* buckets in use: bucket i covers [i*interval, (i+1)*interval) */
    uint64_t interval;

    rk_obs_phase_t phases[RK_OBS_MAX_PHASES];
    size_t nphases;
} R = {.lock = PTHREAD_MUTEX_INITIALIZER};

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

static inline size_t hash_ptr(uintptr_t p)
{
    uint64_t x = (uint64_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

/* ---- set-up ---- */

static void free_tables(void)
{
    free(R.blocks);
    free(R.sites);
    free(R.site_index);
    free(R.frame_store);
    free(R.samples);
    R.blocks = NULL;
    R.sites = NULL;
    R.site_index = NULL;
    R.frame_store = NULL;
    R.samples = NULL;
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

    pthread_mutex_lock(&R.lock);
    free_tables();
    R.enabled = 0;
    memset(R.by, 0, sizeof R.by);
    memset(R.program, 0, sizeof R.program);
    memset(&R.program_gpu, 0, sizeof R.program_gpu);
    R.events = R.unmatched = R.untracked = R.sites_dropped = 0;
    R.bcount = R.nsites = R.frames_used = R.nsamples = 0;
    R.cfg = c;
    R.t0 = 0;
    R.t0 = c.clock_ns ? c.clock_ns() : mono_ns();
    R.interval = c.sample_ns;

    /* Small tables to start with: most programs hold few blocks; the block
     * table doubles up to the bound. The site index is sized for the bound
     * at once (4 bytes a slot). */
    size_t bcap = 1024;
    size_t sicap = pow2_at_least(c.max_sites * 2 + 2);
    R.blocks = calloc(bcap, sizeof *R.blocks);
    R.sites = calloc(c.max_sites + 1, sizeof *R.sites);
    R.site_index = calloc(sicap, sizeof *R.site_index);
    R.frame_store = c.backtrace_depth
                        ? calloc(c.max_sites * (size_t)c.backtrace_depth, sizeof(void *))
                        : NULL;
    R.samples = calloc(c.timeline_samples, sizeof *R.samples);
    if (!R.blocks || !R.sites || !R.site_index || !R.samples ||
        (c.backtrace_depth && !R.frame_store)) {
        free_tables();
        pthread_mutex_unlock(&R.lock);
        return -1;
    }
    R.bmask = bcap - 1;
    R.simask = sicap - 1;
    R.nsites = 1; /* site 0: "other" */
    R.sites[0].api = RK_OBS_API_OTHER;
    R.nphases = 1;
    memset(R.phases, 0, sizeof R.phases);
    snprintf(R.phases[0].name, sizeof R.phases[0].name, "start");
    R.enabled = 1;
    pthread_mutex_unlock(&R.lock);
    return 0;
}

void rk_obs_fini(void)
{
    pthread_mutex_lock(&R.lock);
    R.enabled = 0;
    free_tables();
    pthread_mutex_unlock(&R.lock);
}

int rk_obs_enabled(void)
{
    return __atomic_load_n(&R.enabled, __ATOMIC_ACQUIRE);
}

void rk_obs_set_state(rk_obs_state_t state, const char *why)
{
    pthread_mutex_lock(&R.lock);
    obs_state = state;
    snprintf(obs_why, sizeof obs_why, "%s", why ? why : "");
    pthread_mutex_unlock(&R.lock);
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
    pthread_mutex_lock(&R.lock);
    rk_code_ranges(substring, skip, &nskip, MAX_SKIP);
    pthread_mutex_unlock(&R.lock);
}

/* ---- counters, timeline, phases (lock held) ---- */

static void count_up(rk_obs_counts_t *c, uint64_t bytes, uint64_t t)
{
    c->current += bytes;
    c->total += bytes;
    c->count++;
    c->live++;
    if (c->current > c->peak) {
        c->peak = c->current;
        c->peak_ns = t;
    }
}

static void count_down(rk_obs_counts_t *c, uint64_t bytes)
{
    c->current = c->current > bytes ? c->current - bytes : 0;
    if (c->live)
        c->live--;
}

/* Brings the timeline up to time t (buckets between the last one and t get
 * the level that held then) and raises t's bucket to the level now. */
static void timeline_note(uint64_t t, uint64_t before, uint64_t after)
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
    uint64_t hi = before > after ? before : after;
    if (R.samples[idx].bytes < hi)
        R.samples[idx].bytes = hi;
}

static void phase_note(uint64_t level)
{
    rk_obs_phase_t *p = &R.phases[R.nphases - 1];
    if (level > p->peak)
        p->peak = level;
}

static void account_alloc(int kind, int src, uint64_t bytes, uint64_t t)
{
    count_up(&R.by[src][kind], bytes, t);
    if (src == RK_OBS_RANKMEM)
        return;
    count_up(&R.program[kind], bytes, t);
    if (kind != RK_OBS_PINNED) {
        uint64_t before = R.program_gpu.current;
        count_up(&R.program_gpu, bytes, t);
        timeline_note(t, before, R.program_gpu.current);
        phase_note(R.program_gpu.current);
    }
}

static void account_free(int kind, int src, uint64_t bytes, uint64_t t)
{
    count_down(&R.by[src][kind], bytes);
    if (src == RK_OBS_RANKMEM)
        return;
    count_down(&R.program[kind], bytes);
    if (kind != RK_OBS_PINNED) {
        uint64_t before = R.program_gpu.current;
        count_down(&R.program_gpu, bytes);
        timeline_note(t, before, R.program_gpu.current);
    }
}

/* ---- the block table: open addressing, backward-shift deletion ---- */

static int blocks_grow(void)
{
    size_t cap = (R.bmask + 1) * 2;
    block_t *nb = calloc(cap, sizeof *nb);
    if (!nb)
        return -1;
    for (size_t i = 0; i <= R.bmask; i++) {
        if (!R.blocks[i].ptr)
            continue;
        size_t j = hash_ptr(R.blocks[i].ptr) & (cap - 1);
        while (nb[j].ptr)
            j = (j + 1) & (cap - 1);
        nb[j] = R.blocks[i];
    }
    free(R.blocks);
    R.blocks = nb;
    R.bmask = cap - 1;
    return 0;
}

static size_t block_find(uintptr_t ptr)
{
    size_t i = hash_ptr(ptr) & R.bmask;
    while (R.blocks[i].ptr) {
        if (R.blocks[i].ptr == ptr)
            return i;
        i = (i + 1) & R.bmask;
    }
    return SIZE_MAX;
}

static void block_remove_at(size_t i)
{
    size_t j = i;
    for (;;) {
        j = (j + 1) & R.bmask;
        if (!R.blocks[j].ptr)
            break;
        size_t home = hash_ptr(R.blocks[j].ptr) & R.bmask;
        /* move j back to i when its home is not in (i, j] (cyclically) */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            R.blocks[i] = R.blocks[j];
            i = j;
        }
    }
    R.blocks[i].ptr = 0;
    R.bcount--;
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

static uint32_t site_of(int api, int kind, int src, void *const *frames, int n)
{
    uint64_t h = site_hash(api, kind, frames, n);
    size_t i = (size_t)h & R.simask;
    for (;;) {
        uint32_t id = R.site_index[i];
        if (!id)
            break;
        site_t *s = &R.sites[id];
        if (s->hash == h && s->api == api && s->kind == kind && s->nframes == n &&
            (!n || !memcmp(s->frames, frames, (size_t)n * sizeof *frames)))
            return id;
        i = (i + 1) & R.simask;
    }
    if (R.nsites > R.cfg.max_sites) {
        R.sites_dropped++;
        return 0;
    }
    uint32_t id = (uint32_t)R.nsites++;
    site_t *s = &R.sites[id];
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
    R.site_index[i] = id;
    return id;
}

static int skipped(uintptr_t a) { return rk_in_ranges(skip, nskip, a); }

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

static void record(int kind, int src, int api, uintptr_t ptr, uint64_t bytes, void *const *frames,
                   int nframes)
{
    uint64_t t = now_ns();
    R.events++;
    size_t old = block_find(ptr);
    if (old != SIZE_MAX) {
        /* a free we never saw: settle the old block first */
        block_t b = R.blocks[old];
        if (b.site < R.nsites && R.sites[b.site].bytes >= b.bytes) {
            R.sites[b.site].bytes -= b.bytes;
            R.sites[b.site].count--;
        }
        account_free(b.kind, b.src, b.bytes, t);
        block_remove_at(old);
    }
    if (R.bcount >= R.cfg.max_blocks ||
        ((R.bcount + 1) * 2 > R.bmask + 1 && blocks_grow() != 0)) {
        /* Counted as made, but not kept: its free could not be matched, so
         * it stays out of the current bytes. */
        R.untracked++;
        R.by[src][kind].total += bytes;
        R.by[src][kind].count++;
        return;
    }
    uint32_t site = 0;
    if (src != RK_OBS_RANKMEM)
        site = site_of(api, kind, src, frames, nframes);
    size_t i = hash_ptr(ptr) & R.bmask;
    while (R.blocks[i].ptr)
        i = (i + 1) & R.bmask;
    R.blocks[i] = (block_t){.ptr = ptr, .bytes = bytes, .site = site, .kind = (uint8_t)kind,
                            .src = (uint8_t)src};
    R.bcount++;
    if (src != RK_OBS_RANKMEM) {
        R.sites[site].bytes += bytes;
        R.sites[site].count++;
    }
    account_alloc(kind, src, bytes, t);
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
    /* Frames are taken outside the lock: unwinding is the slow part. */
    if (R.cfg.backtrace_depth > 0 && src != RK_OBS_RANKMEM)
        n = capture(frames, R.cfg.backtrace_depth, from);
    pthread_mutex_lock(&R.lock);
    if (R.enabled)
        record(kind, src, api, ptr, bytes, frames, n);
    pthread_mutex_unlock(&R.lock);
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
    pthread_mutex_lock(&R.lock);
    if (nframes > R.cfg.backtrace_depth)
        nframes = R.cfg.backtrace_depth;
    if (R.enabled)
        record(kind, src, api, ptr, bytes, frames, nframes);
    pthread_mutex_unlock(&R.lock);
}

uint64_t rk_obs_free(uintptr_t ptr)
{
    if (!rk_obs_enabled() || !ptr)
        return 0;
    uint64_t bytes = 0;
    pthread_mutex_lock(&R.lock);
    if (R.enabled) {
        R.events++;
        size_t i = block_find(ptr);
        if (i == SIZE_MAX) {
            R.unmatched++;
        } else {
            block_t b = R.blocks[i];
            if (b.src != RK_OBS_RANKMEM && R.sites[b.site].bytes >= b.bytes) {
                R.sites[b.site].bytes -= b.bytes;
                R.sites[b.site].count--;
            }
            account_free(b.kind, b.src, b.bytes, now_ns());
            block_remove_at(i);
            bytes = b.bytes;
        }
    }
    pthread_mutex_unlock(&R.lock);
    return bytes;
}

void rk_obs_phase(const char *name)
{
    if (!rk_obs_enabled())
        return;
    pthread_mutex_lock(&R.lock);
    if (R.enabled) {
        uint64_t t = now_ns();
        if (R.nphases < RK_OBS_MAX_PHASES) {
            R.phases[R.nphases - 1].t_end_ns = t;
            rk_obs_phase_t *p = &R.phases[R.nphases++];
            memset(p, 0, sizeof *p);
            snprintf(p->name, sizeof p->name, "%s", name && *name ? name : "phase");
            p->t_start_ns = t;
            p->start_bytes = p->peak = R.program_gpu.current;
        }
        timeline_note(t, R.program_gpu.current, R.program_gpu.current);
    }
    pthread_mutex_unlock(&R.lock);
}

void rk_obs_sample_now(void)
{
    if (!rk_obs_enabled())
        return;
    pthread_mutex_lock(&R.lock);
    if (R.enabled)
        timeline_note(now_ns(), R.program_gpu.current, R.program_gpu.current);
    pthread_mutex_unlock(&R.lock);
}

/* ---- queries ---- */

void rk_obs_summary(rk_obs_summary_t *s)
{
    if (!s)
        return;
    memset(s, 0, sizeof *s);
    pthread_mutex_lock(&R.lock);
    if (R.enabled) {
        memcpy(s->by, R.by, sizeof s->by);
        memcpy(s->program, R.program, sizeof s->program);
        s->program_gpu = R.program_gpu;
        s->events = R.events;
        s->unmatched_frees = R.unmatched;
        s->untracked = R.untracked;
        s->sites = R.nsites - 1;
        s->sites_dropped = R.sites_dropped;
        s->now_ns = now_ns();
        s->bytes_used = (R.bmask + 1) * sizeof(block_t) +
                        (R.cfg.max_sites + 1) * sizeof(site_t) +
                        (R.simask + 1) * sizeof(uint32_t) +
                        R.cfg.max_sites * (size_t)R.cfg.backtrace_depth * sizeof(void *) +
                        R.cfg.timeline_samples * sizeof(rk_obs_sample_t);
    }
    pthread_mutex_unlock(&R.lock);
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
    pthread_mutex_lock(&R.lock);
    if (R.enabled) {
        /* keep the largest max sites: fill, then replace the smallest */
        for (size_t id = 0; id < R.nsites; id++) {
            const site_t *s = &R.sites[id];
            if (!s->count)
                continue;
            total++;
            if (!out || !max)
                continue;
            rk_obs_site_t v = {.id = (uint32_t)id, .api = s->api, .kind = s->kind,
                               .source = s->src, .bytes = s->bytes, .count = s->count,
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
    }
    pthread_mutex_unlock(&R.lock);
    if (out && max)
        qsort(out, total < max ? total : max, sizeof *out, cmp_site_bytes);
    return total;
}

size_t rk_obs_timeline(rk_obs_sample_t *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&R.lock);
    if (R.enabled) {
        n = R.nsamples;
        if (out)
            memcpy(out, R.samples, (n < max ? n : max) * sizeof *out);
    }
    pthread_mutex_unlock(&R.lock);
    return n;
}

size_t rk_obs_phases(rk_obs_phase_t *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&R.lock);
    if (R.enabled) {
        n = R.nphases;
        if (out) {
            memcpy(out, R.phases, (n < max ? n : max) * sizeof *out);
            if (n <= max)
                out[n - 1].t_end_ns = now_ns();
        }
    }
    pthread_mutex_unlock(&R.lock);
    return n;
}
