/* CUDA-level fault injection (issue 31): the CUDA runtime calls through
 * which rankmem's device, managed, pinned and stream-ordered resources get
 * memory, pools and events fail on purpose, under each of those resources
 * and the common chains over them.
 *
 *     tests/gpu_fault.t [OPS]        (default 3000 operations per chain)
 *
 * This program defines those runtime functions itself. The executable's
 * definitions come first in the dynamic linker's search, for librankmem
 * too (an unversioned definition satisfies libcudart's versioned
 * references), and each calls the real one (dlsym RTLD_NEXT) unless a
 * failure is due: cudaErrorMemoryAllocation, which leaves no sticky error
 * in the context. Frees always go through. Every byte the runtime hands
 * out is counted until it comes back. Injection is armed only around the
 * calls into rankmem, so the test's own CUDA calls never fail.
 *
 * Per chain: OPS random allocations (1 byte to 4 MiB, alignments up to
 * 64 KiB) and frees, with failures every 7th intercepted call and at
 * random. After each call that saw an injected failure: the call either
 * failed with a status and left its output alone, with
 * rankmem_last_error() describing this failure (a stale message is planted
 * first), or a chain absorbed it and succeeded; the same request succeeds
 * with injection paused. Live blocks never overlap, and every 16th is
 * written and read back by a kernel. At the end: everything freed, trim,
 * the release clean, and the runtime got back every byte it handed out
 * since the chain was made. Also: making a chain while every call fails is
 * refused with a status, and leaves nothing. Skips without a GPU. */
#define _GNU_SOURCE
#include "config.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rankmem.h>

#include "tap.h"

#if HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu_kernels.h"

/* ---- the interposed runtime calls ---- */

static int armed;                  /* inject at all (around rankmem calls only) */
static unsigned every = 7;         /* every Nth intercepted call fails... */
static unsigned rate_pct = 5;      /* ...and this share of the others */
static unsigned long long ncalls;  /* intercepted calls while armed */
static unsigned long long injected, injected_before;
static unsigned long long rs = 0x2545F4914F6CDD1Dull;
static long long live_bytes;       /* handed out by the runtime, not yet back */

static unsigned rnd(unsigned n)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (unsigned)(rs % n);
}

static int due(void)
{
    if (!armed)
        return 0;
    ncalls++;
    if ((every && ncalls % every == 0) || rnd(100) < rate_pct) {
        injected++;
        return 1;
    }
    return 0;
}

/* Sizes of the runtime's live allocations, by address (open addressing). */
#define NSLOT 65536
static struct {
    void *p;
    size_t n;
} slot[NSLOT];

static void track(void *p, size_t n)
{
    size_t h = ((uintptr_t)p >> 8) % NSLOT;
    while (slot[h].p && slot[h].p != (void *)1)
        h = (h + 1) % NSLOT;
    slot[h].p = p;
    slot[h].n = n;
    live_bytes += (long long)n;
}

static void untrack(void *p)
{
    if (!p)
        return;
    size_t h = ((uintptr_t)p >> 8) % NSLOT;
    for (size_t i = 0; i < NSLOT && slot[h].p; i++, h = (h + 1) % NSLOT)
        if (slot[h].p == p) {
            live_bytes -= (long long)slot[h].n;
            slot[h].p = (void *)1; /* a tombstone */
            return;
        }
}

#define REAL(name) static __typeof__(&name) real_##name
#define FIND(name)                                                                                 \
    do {                                                                                           \
        if (!real_##name)                                                                          \
            real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name);                             \
    } while (0)

REAL(cudaMalloc);
REAL(cudaMallocManaged);
REAL(cudaHostAlloc);
REAL(cudaMallocFromPoolAsync);
REAL(cudaMemPoolCreate);
REAL(cudaEventCreateWithFlags);
REAL(cudaFree);
REAL(cudaFreeHost);
REAL(cudaFreeAsync);

/* An allocating call's result, its block counted when it succeeded. */
static cudaError_t counted(cudaError_t e, void *const *p, size_t n)
{
    if (e == cudaSuccess)
        track(*p, n);
    return e;
}

/* A free's result, its block uncounted when it succeeded. */
static cudaError_t uncounted(cudaError_t e, void *p)
{
    if (e == cudaSuccess)
        untrack(p);
    return e;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    FIND(cudaMalloc);
    return due() ? cudaErrorMemoryAllocation : counted(real_cudaMalloc(p, n), p, n);
}

cudaError_t cudaMallocManaged(void **p, size_t n, unsigned flags)
{
    FIND(cudaMallocManaged);
    return due() ? cudaErrorMemoryAllocation : counted(real_cudaMallocManaged(p, n, flags), p, n);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    FIND(cudaHostAlloc);
    return due() ? cudaErrorMemoryAllocation : counted(real_cudaHostAlloc(p, n, flags), p, n);
}

cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t pool, cudaStream_t s)
{
    FIND(cudaMallocFromPoolAsync);
    return due() ? cudaErrorMemoryAllocation
                 : counted(real_cudaMallocFromPoolAsync(p, n, pool, s), p, n);
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props)
{
    FIND(cudaMemPoolCreate);
    return due() ? cudaErrorMemoryAllocation : real_cudaMemPoolCreate(pool, props);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags)
{
    FIND(cudaEventCreateWithFlags);
    return due() ? cudaErrorMemoryAllocation : real_cudaEventCreateWithFlags(ev, flags);
}

cudaError_t cudaFree(void *p)
{
    FIND(cudaFree);
    return uncounted(real_cudaFree(p), p);
}

cudaError_t cudaFreeHost(void *p)
{
    FIND(cudaFreeHost);
    return uncounted(real_cudaFreeHost(p), p);
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    FIND(cudaFreeAsync);
    return uncounted(real_cudaFreeAsync(p, s), p);
}

/* ---- the harness ---- */

#define MAXLIVE 256

typedef struct {
    void *p;
    size_t n, a;
} blk_t;

static long nops = 3000;

/* Address order, for the overlap check. */
static int by_addr(const void *x, const void *y)
{
    uintptr_t a = (uintptr_t)((const blk_t *)x)->p, b = (uintptr_t)((const blk_t *)y)->p;
    return a < b ? -1 : a > b;
}

static int no_overlap(const blk_t *live, int n)
{
    blk_t s[MAXLIVE];
    memcpy(s, live, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, by_addr);
    for (int i = 1; i < n; i++)
        if ((uintptr_t)s[i - 1].p + s[i - 1].n > (uintptr_t)s[i].p)
            return 0;
    return 1;
}

/* Plant a stale error message, so that a message that is not this call's shows. */
static void plant_stale(rankmem_resource_t *mr)
{
    void *p = NULL;
    (void)rankmem_allocate(mr, 0, 0, &p);
}

static void run_chain(const char *spec, size_t maxn, int maxlive)
{
    long long live0 = live_bytes;
    rankmem_resource_t *mr = NULL;
    if (rankmem_resource_from_spec(spec, &mr) != RANKMEM_SUCCESS) {
        ok(0, "%s: made (%s)", spec, rankmem_last_error());
        return;
    }
    blk_t live[MAXLIVE];
    int nlive = 0;
    unsigned long long faults = 0, failed = 0, absorbed = 0, bad_after = 0, bad_msg = 0,
                       bad_out = 0, overlap = 0, bad_data = 0, retried_ok = 0, bad_free = 0;
    for (long op = 0; op < nops; op++) {
        if (nlive == maxlive || (nlive > 0 && rnd(100) < 45)) {
            int i = (int)rnd((unsigned)nlive);
            if (rankmem_deallocate(mr, live[i].p, live[i].n, live[i].a) != RANKMEM_SUCCESS)
                bad_free++;
            live[i] = live[--nlive];
            continue;
        }
        size_t n = rnd(4) == 0 ? 1 + rnd((unsigned)maxn) : 1 + rnd(maxn < (64u << 10) ? (unsigned)maxn : 64u << 10);
        size_t a = rnd(3) == 0 ? (size_t)256 << rnd(9) : 0;
        void *p = (void *)0x5a5a;
        plant_stale(mr);
        const char *stale = rankmem_last_error();
        char stale_copy[256];
        snprintf(stale_copy, sizeof stale_copy, "%s", stale ? stale : "");
        injected_before = injected;
        armed = 1;
        rankmem_status_t st = rankmem_allocate(mr, n, a, &p);
        armed = 0;
        int hit = injected != injected_before;
        faults += hit;
        if (st != RANKMEM_SUCCESS) {
            failed++;
            if (p != (void *)0x5a5a)
                bad_out++;
            const char *msg = rankmem_last_error();
            if (!msg || !*msg || strcmp(msg, stale_copy) == 0)
                bad_msg++;
            if (!hit)
                continue; /* a real refusal (a size the chain cannot serve) */
            /* The same request, the fault stopped. */
            if (rankmem_allocate(mr, n, a, &p) != RANKMEM_SUCCESS) {
                bad_after++;
                diag("%s: %zu bytes at alignment %zu failed again without injection: %s", spec,
                     n, a, rankmem_last_error());
                continue;
            }
            retried_ok++;
        } else if (hit) {
            absorbed++;
        }
        if (a && ((uintptr_t)p & (a - 1)))
            overlap++; /* counted with the bad blocks: misaligned */
        live[nlive++] = (blk_t){p, n, a};
        if (!no_overlap(live, nlive)) {
            overlap++;
            diag("%s: a block handed out overlaps a live one", spec);
            live[--nlive] = (blk_t){0};
            continue;
        }
        if (op % 16 == 0 && n >= 4) {
            unsigned long long bad = 1;
            unsigned pattern = (unsigned)op * 2654435761u;
            if (rk_test_fill(p, n / 4, pattern, 0) != 0 ||
                rk_test_check(p, n / 4, pattern, 0, &bad) != 0 || bad)
                bad_data++;
        }
    }
    for (int i = 0; i < nlive; i++)
        if (rankmem_deallocate(mr, live[i].p, live[i].n, live[i].a) != RANKMEM_SUCCESS)
            bad_free++;
    rankmem_stats_t s = {.size = sizeof s};
    int stats_ok = 1;
    if (strncmp(spec, "stats>", 6) == 0 &&
        (rankmem_stats_get(mr, &s) != RANKMEM_SUCCESS || s.bytes_current != 0 ||
         s.count_current != 0))
        stats_ok = 0;
    (void)rankmem_resource_trim(mr, 0);
    rankmem_status_t rel = rankmem_resource_release(mr);
    cudaDeviceSynchronize(); /* frees on streams have run */
    diag("%s: %ld operations, %llu calls saw an injected failure (%llu failed, %llu absorbed), "
         "%llu retried right after",
         spec, nops, faults, failed, absorbed, retried_ok);
    ok(bad_out == 0 && bad_msg == 0, "%s: failed calls left their output alone and said why "
                                     "(%llu outputs touched, %llu stale or empty messages)",
       spec, bad_out, bad_msg);
    ok(bad_after == 0, "%s: each request served once the fault stopped (%llu not)", spec,
       bad_after);
    ok(overlap == 0 && bad_free == 0,
       "%s: no block handed out twice or misaligned, every free accepted (%llu, %llu)", spec,
       overlap, bad_free);
    ok(bad_data == 0, "%s: blocks written and read back by a kernel (%llu wrong)", spec,
       bad_data);
    ok(stats_ok, "%s: the books at zero after the frees", spec);
    ok(rel == RANKMEM_SUCCESS && live_bytes == live0,
       "%s: released clean, the runtime got back every byte (%lld bytes still out)", spec,
       live_bytes - live0);
}

/* Making a chain while every intercepted call fails. */
static void make_under_faults(const char *spec)
{
    long long live0 = live_bytes;
    unsigned e = every, r = rate_pct;
    every = 1;
    rate_pct = 0;
    rankmem_resource_t *mr = NULL;
    void *p = NULL;
    armed = 1;
    rankmem_status_t st = rankmem_resource_from_spec(spec, &mr);
    rankmem_status_t st2 = st == RANKMEM_SUCCESS ? rankmem_allocate(mr, 4096, 0, &p) : st;
    armed = 0;
    every = e;
    rate_pct = r;
    int fine = st2 != RANKMEM_SUCCESS && p == NULL;
    if (mr)
        rankmem_resource_release(mr);
    cudaDeviceSynchronize();
    ok(fine && live_bytes == live0,
       "%s made and used while every CUDA call fails: refused with a status (%s), nothing left "
       "(%lld bytes)",
       spec, rankmem_status_string(st2), live_bytes - live0);
}

int main(int argc, char **argv)
{
    int n = 0;
    if (rankmem_device_count(&n) != RANKMEM_SUCCESS || n == 0)
        return tap_skip_all("no GPU");
    if (argc > 1)
        nops = atol(argv[1]);
    if (nops < 1)
        nops = 1;
    /* The interposition must be in force for librankmem: a chain over cuda
     * made with every call failing cannot allocate. */
    {
        rankmem_resource_t *mr = NULL;
        void *p = NULL;
        if (rankmem_resource_from_spec("cuda", &mr) != RANKMEM_SUCCESS)
            BAIL_OUT("cuda: %s", rankmem_last_error());
        every = 1;
        armed = 1;
        rankmem_status_t st = rankmem_allocate(mr, 4096, 0, &p);
        armed = 0;
        every = 7;
        if (st == RANKMEM_SUCCESS)
            rankmem_deallocate(mr, p, 4096, 0);
        rankmem_resource_release(mr);
        if (st == RANKMEM_SUCCESS)
            BAIL_OUT("the interposed cudaMalloc was not called by librankmem");
        ok(1, "librankmem's CUDA calls come through the injector (%s)", rankmem_status_string(st));
    }
    /* Sizes and live counts that each chain can always serve, so that a
     * request refused after the fault stopped is a fault's lasting damage,
     * not a full arena or a limit reached. */
    static const struct {
        const char *spec;
        size_t maxn;
        int maxlive;
    } chains[] = {
        {"cuda", 4u << 20, MAXLIVE},
        {"managed", 4u << 20, MAXLIVE},
        {"pinned", 1u << 20, 64},
        {"async", 4u << 20, MAXLIVE},
        {"pool>cuda", 4u << 20, MAXLIVE},
        {"stats>pool>cuda", 4u << 20, MAXLIVE},
        {"pool(initial=8MiB,growth=2MiB)>cuda", 4u << 20, MAXLIVE},
        {"binning>pool>cuda", 4u << 20, MAXLIVE},
        {"arena(size=64MiB)>cuda", 1u << 20, 24},
        {"caching>cuda", 4u << 20, MAXLIVE},
        {"fixed(block=64KiB)>cuda", 64u << 10, MAXLIVE},
        {"stats>async", 4u << 20, MAXLIVE},
        {"pool>async", 4u << 20, MAXLIVE},
        {"pool>managed", 4u << 20, MAXLIVE},
        {"pool>pinned", 1u << 20, 64},
        {"retry>pool>cuda", 4u << 20, MAXLIVE},
        {"limit(bytes=48MiB)>stats>binning>cuda", 256u << 10, 128},
        {"tracking>arena(size=64MiB)>cuda", 1u << 20, 24},
    };
    for (size_t i = 0; i < sizeof chains / sizeof chains[0]; i++)
        run_chain(chains[i].spec, chains[i].maxn, chains[i].maxlive);
    make_under_faults("async");
    make_under_faults("stats>pool(initial=8MiB)>cuda");
    make_under_faults("arena(size=64MiB)>cuda");
    diag("%llu failures injected in all", injected);
    return tap_done();
}

#else
int main(void) { return tap_skip_all("built without CUDA"); }
#endif
