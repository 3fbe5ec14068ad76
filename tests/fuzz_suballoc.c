/* libFuzzer harness for the suballocators (not built by make; docs/replay.md
 * has the command, and the results of the runs so far).
 *
 * The input is a program: byte 0 picks the resource (pool, arena, binning,
 * caching, fixed, vmm over its host backend; one that this librankmem lacks
 * is skipped), byte 1 its
 * configuration and how the run ends, and the rest is a sequence of
 * operations:
 *
 *   allocate  size (log scale, 1 B .. 1 MiB), alignment (default, 256, 4 KiB,
 *             64 KiB), one of 4 stand-in streams
 *   free      one of the live blocks, on its stream or another
 *   trim      keep 0 .. 16 MiB
 *   bad free  a foreign pointer, an interior pointer or a block already freed:
 *             must be refused with RANKMEM_ERR_INVALID_POINTER
 *
 * The resource sits over a counting upstream (host memory from
 * posix_memalign that counts what is outstanding) and is built with its
 * constructor. Checked after every step: a block is aligned as asked and
 * overlaps no live block; a failed allocate leaves its output alone; every
 * block keeps the pattern written into it until it is freed (checked whole
 * for blocks up to 16 KiB; for larger ones the first and last 4 KiB and a
 * stripe every 64 KiB: touching every page made the run slow); a request
 * too large for a fixed-size resource is refused with
 * RANKMEM_ERR_INVALID_ARGUMENT. At the end the resource is
 * released, with its live blocks freed first or (byte 1 says) still live,
 * which must give RANKMEM_ERR_BUSY; either way the upstream must have
 * every byte back and the resource must be finalized. A broken check
 * calls abort(), which libFuzzer reports with the input.
 *
 * Fault injection (FUZZ_FAULT=1, issue 31): byte 2 configures a fault
 * resource put between the resource and the counting upstream (failing at
 * random, rate 0 to 7/16, and/or every 2nd to 23rd call, in runs of one or
 * two; the vmm, a leaf, keeps its own map failures instead), and a stats
 * adaptor goes on top. After every call in which a failure was injected:
 * the call failed with the injector's status (or the resource absorbed
 * it), its last error is that injection ("injected failure K", K one of
 * this call's), its output is untouched, and the same request, the
 * injector switched off, succeeds (a bounded pool, arena or vmm may be out
 * of room instead). After every step the stats adaptor holds exactly what
 * is live. At the end of an input (blocks freed, then a trim) requests of
 * 1 B to 1 MiB at alignments up to 64 KiB are answered exactly as by a
 * fresh resource of the same configuration (nothing changed for good),
 * and a creation that failed under the injector kept nothing.
 *
 * Build with -DFUZZ_MAIN for a main() without libFuzzer: it runs the files
 * given, or N random inputs ("fuzz_suballoc -n N [-s SEED]").
 *
 * Statistics (operations, by kind) are printed at exit. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rankmem.h>
#include "counting.h"

/* Suballocators written after this harness: weak, so that it links
 * against a library without them (they are then skipped). */
#pragma weak rankmem_fixed_create
#pragma weak rankmem_binning_create
#pragma weak rankmem_caching_params_default
#pragma weak rankmem_caching_create
#pragma weak rankmem_arena_params_default
#pragma weak rankmem_arena_create
#pragma weak rankmem_vmm_params_default
#pragma weak rankmem_vmm_create
#pragma weak rankmem_vmm_inject_map_failure

#define MAX_LIVE 128
#define FULL_CHECK (16u << 10) /* blocks up to this are checked whole */
#define EDGE (4u << 10)        /* larger ones: both ends, and a stripe ... */
#define STRIPE 64u
#define STRIDE (64u << 10) /* ... every 64 KiB (few pages touched: fast) */

enum { R_POOL, R_ARENA, R_BINNING, R_CACHING, R_FIXED, R_VMM, NRES };
static const char *const res_names[NRES] = {"pool",    "arena", "binning",
                                            "caching", "fixed", "vmm"};

static struct {
    unsigned long long inputs[NRES], skipped, ops, allocs, alloc_ok, frees, trims, bad_frees;
    unsigned long long too_large, busy_releases;
} stats;

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz_suballoc: %s: check failed: %s: ", cur_name, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, " (last error: %s)\n", rankmem_last_error());                    \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

static const char *cur_name = "?";

/* FUZZ_FAULT: the injector under the resource (read once, at initialization). */
static int fault_mode;
static struct {
    unsigned long long injected, failed, absorbed, refused, creations, checks, probes;
} fstats_;

/* The number after the last "injected failure " in msg, or 0. */
static unsigned long long injected_number(const char *msg)
{
    const char *k = NULL;
    for (const char *s = msg; (s = strstr(s, "injected failure ")) != NULL; s++)
        k = s;
    return k ? strtoull(k + 17, NULL, 10) : 0;
}

static unsigned long long injected_so_far(rankmem_resource_t *mr)
{
    rankmem_fault_stats_t f = {.size = sizeof f};
    if (rankmem_fault_get_stats(mr, &f) != RANKMEM_SUCCESS)
        return 0;
    return f.injected;
}

typedef struct {
    unsigned char *p;
    size_t n;
    uint64_t tag;
    rankmem_stream_t stream;
} blk_t;

static unsigned char foreign[1 << 16] __attribute__((aligned(4096)));

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    return x;
}

/* The pattern: 8-byte word w of a block holds tag ^ (w * odd constant),
 * written and compared a word at a time (a byte at a time at the ends of a
 * range): under the sanitizers, byte loops were most of the run time. */
static uint64_t pat_word(uint64_t tag, size_t w)
{
    return tag ^ ((uint64_t)w * 0x9e3779b97f4a7c15ull);
}

static unsigned char pat_byte(uint64_t tag, size_t i)
{
    unsigned char b[8];
    uint64_t v = pat_word(tag, i >> 3);
    memcpy(b, &v, 8);
    return b[i & 7];
}

static void fill_range(const blk_t *b, size_t from, size_t to)
{
    size_t i = from;
    for (; i < to && (i & 7); i++)
        b->p[i] = pat_byte(b->tag, i);
    for (; i + 8 <= to; i += 8) {
        uint64_t v = pat_word(b->tag, i >> 3);
        memcpy(b->p + i, &v, 8);
    }
    for (; i < to; i++)
        b->p[i] = pat_byte(b->tag, i);
}

static int check_range(const blk_t *b, size_t from, size_t to)
{
    size_t i = from;
    for (; i < to && (i & 7); i++)
        if (b->p[i] != pat_byte(b->tag, i))
            return 0;
    for (; i + 8 <= to; i += 8) {
        uint64_t v;
        memcpy(&v, b->p + i, 8);
        if (v != pat_word(b->tag, i >> 3))
            return 0;
    }
    for (; i < to; i++)
        if (b->p[i] != pat_byte(b->tag, i))
            return 0;
    return 1;
}

/* The parts of a block that carry the pattern. */
#define FOR_PATTERN(b, FN, ok)                                                               \
    do {                                                                                     \
        if ((b)->n <= FULL_CHECK) {                                                          \
            ok &= FN((b), 0, (b)->n);                                                        \
        } else {                                                                             \
            ok &= FN((b), 0, EDGE);                                                          \
            for (size_t o_ = STRIDE; o_ + STRIPE < (b)->n - EDGE; o_ += STRIDE)                  \
                ok &= FN((b), o_, o_ + STRIPE);                                              \
            ok &= FN((b), (b)->n - EDGE, (b)->n);                                            \
        }                                                                                    \
    } while (0)

static int fill_ok(const blk_t *b, size_t from, size_t to)
{
    fill_range(b, from, to);
    return 1;
}

static void fill(const blk_t *b)
{
    int ok = 1;
    FOR_PATTERN(b, fill_ok, ok);
    (void)ok;
}

static int intact(const blk_t *b)
{
    int ok = 1;
    FOR_PATTERN(b, check_range, ok);
    return ok;
}

/* Reader of the input: zeros once it runs out. */
typedef struct {
    const uint8_t *d;
    size_t n, i;
} rd_t;

static unsigned next(rd_t *r)
{
    return r->i < r->n ? r->d[r->i++] : 0;
}

static rankmem_status_t build(int which, unsigned cfg, rankmem_resource_t *up,
                              rankmem_resource_t **mr_p, size_t *limit_p)
{
    *limit_p = 0; /* no size limit */
    switch (which) {
    case R_POOL: {
        rankmem_pool_params_t p;
        rankmem_pool_params_default(&p);
        p.initial_size = (cfg & 1) ? (size_t)4 << 20 : 0;
        p.growth_size = (cfg & 2) ? (size_t)1 << 20 : 0;
        p.maximum_size = (cfg & 4) ? (size_t)64 << 20 : SIZE_MAX;
        return rankmem_pool_create(up, &p, mr_p);
    }
    case R_ARENA: {
        if (!rankmem_arena_create || !rankmem_arena_params_default)
            return RANKMEM_ERR_NOT_SUPPORTED;
        rankmem_arena_params_t p;
        rankmem_arena_params_default(&p);
        p.arena_size = (size_t)(16 << (cfg & 3)) << 20; /* 16 .. 128 MiB */
        p.superblock_size = (cfg & 4) ? (size_t)1 << 20 : 0;
        return rankmem_arena_create(up, &p, mr_p);
    }
    case R_BINNING: {
        if (!rankmem_binning_create)
            return RANKMEM_ERR_NOT_SUPPORTED;
        int lo = 8 + (int)(cfg & 3), hi = lo + 4 + (int)((cfg >> 2) & 7);
        return rankmem_binning_create(up, lo, hi, mr_p);
    }
    case R_CACHING: {
        if (!rankmem_caching_create || !rankmem_caching_params_default)
            return RANKMEM_ERR_NOT_SUPPORTED;
        rankmem_caching_params_t p;
        rankmem_caching_params_default(&p);
        if (cfg & 1) {
            p.growth = 2;
            p.min_bin = 8;
            p.max_bin = 20;
        }
        p.max_cached_bytes = (cfg & 2) ? SIZE_MAX : (size_t)(1 + (cfg >> 2 & 7)) << 20;
        return rankmem_caching_create(up, &p, mr_p);
    }
    case R_FIXED: {
        if (!rankmem_fixed_create)
            return RANKMEM_ERR_NOT_SUPPORTED;
        size_t block = (size_t)256 << (cfg & 7); /* 256 B .. 32 KiB */
        *limit_p = block;
        return rankmem_fixed_create(up, block, (cfg >> 3) & 3 ? (cfg >> 3 & 3) * 8u : 0, mr_p);
    }
    case R_VMM: {
        /* A leaf: the counting upstream is not used (and must still be
         * finalized, which the caller checks). */
        if (!rankmem_vmm_create || !rankmem_vmm_params_default)
            return RANKMEM_ERR_NOT_SUPPORTED;
        rankmem_vmm_params_t p;
        rankmem_vmm_params_default(&p);
        p.backend = RANKMEM_VMM_BACKEND_HOST;
        p.granule = (size_t)4096 << (2 * (cfg & 3)); /* 4 KiB .. 256 KiB */
        p.reserve = (size_t)256 << 20;
        p.maximum = (cfg & 4) ? (size_t)8 << 20 : SIZE_MAX;
        p.release = (cfg & 8) ? (size_t)1 << 20 : 0;
        if (!(cfg & 0x10)) /* handles of 1, 2, 4 or 8 granules */
            p.handle = p.granule << (cfg >> 5 & 3);
        rankmem_status_t st = rankmem_vmm_create(&p, mr_p);
        /* Map failures now and then: one, retried inside, or a run of them. */
        if (st == RANKMEM_SUCCESS && (cfg & 0x10) && rankmem_vmm_inject_map_failure)
            rankmem_vmm_inject_map_failure(*mr_p, 1 + (cfg >> 5 & 3) * 3,
                                           (cfg & 0x40) ? 4 : 1);
        return st;
    }
    }
    return RANKMEM_ERR_NOT_SUPPORTED;
}

static int overlaps(const blk_t *live, int nlive, const unsigned char *p, size_t n)
{
    for (int i = 0; i < nlive; i++)
        if (p < live[i].p + live[i].n && live[i].p < p + n)
            return 1;
    return 0;
}

static rankmem_resource_ops_t checked_ops;
static rankmem_status_t checked_finalize(rankmem_resource_t *mr);

/* counting_new() with a finalize that checks the counts. */
static counting_t *checked_new(int *finalized)
{
    counting_t *c = calloc(1, sizeof *c);
    if (!c || rankmem_resource_init(&c->base, &checked_ops, RANKMEM_PROP_HOST_ACCESSIBLE, NULL)) {
        free(c);
        return NULL;
    }
    c->finalized = finalized;
    *finalized = 0;
    return c;
}

static void print_stats(void);

/* The requests of the probe, all live at once, then freed; statuses in out. */
static const size_t probe_sizes[] = {1, 300, 4096, 65536, (size_t)1 << 20};
static const size_t probe_aligns[] = {0, 512, 4096, 65536};
#define NPROBE                                                                          \
    (sizeof probe_sizes / sizeof *probe_sizes * sizeof probe_aligns / sizeof *probe_aligns)

static void probe(rankmem_resource_t *mr, rankmem_status_t *out)
{
    void *p[NPROBE];
    size_t k = 0;
    for (size_t i = 0; i < sizeof probe_sizes / sizeof *probe_sizes; i++)
        for (size_t j = 0; j < sizeof probe_aligns / sizeof *probe_aligns; j++, k++) {
            p[k] = NULL;
            out[k] = rankmem_allocate(mr, probe_sizes[i], probe_aligns[j], &p[k]);
            CHECK(out[k] != RANKMEM_SUCCESS ||
                      (uintptr_t)p[k] % (probe_aligns[j] ? probe_aligns[j] : 256) == 0,
                  "probe: %zu bytes at %zu misaligned", probe_sizes[i], probe_aligns[j]);
        }
    k = 0;
    for (size_t i = 0; i < sizeof probe_sizes / sizeof *probe_sizes; i++)
        for (size_t j = 0; j < sizeof probe_aligns / sizeof *probe_aligns; j++, k++)
            if (out[k] == RANKMEM_SUCCESS)
                CHECK(rankmem_deallocate(mr, p[k], probe_sizes[i], probe_aligns[j]) ==
                          RANKMEM_SUCCESS,
                      "probe: free");
}

/* Nothing changed for good: after a trim, mr (nothing live in it) answers
 * the probe as a fresh resource of the same configuration does, with no
 * failure injected in either. */
static void probe_against_fresh(rankmem_resource_t *mr, int which, unsigned cfg,
                                rankmem_resource_t *fault)
{
    int fin = 0;
    counting_t *up = checked_new(&fin);
    CHECK(up != NULL, "counting upstream");
    rankmem_resource_t *fresh;
    size_t limit;
    rankmem_status_t st = build(which, cfg, &up->base, &fresh, &limit);
    rankmem_resource_release(&up->base);
    if (st != RANKMEM_SUCCESS) {
        CHECK(fin, "upstream finalized after a failed build");
        return;
    }
    if (which == R_VMM) /* no map failures in either */
        rankmem_vmm_inject_map_failure(fresh, 0, 0), rankmem_vmm_inject_map_failure(mr, 0, 0);
    if (fault)
        rankmem_fault_enable(fault, 0);
    st = rankmem_resource_trim(mr, 0);
    CHECK(st == RANKMEM_SUCCESS || st == RANKMEM_ERR_NOT_SUPPORTED, "trim: %s",
          rankmem_status_string(st));
    rankmem_status_t want[NPROBE], got[NPROBE];
    probe(fresh, want);
    probe(mr, got);
    size_t k = 0;
    for (size_t i = 0; i < sizeof probe_sizes / sizeof *probe_sizes; i++)
        for (size_t j = 0; j < sizeof probe_aligns / sizeof *probe_aligns; j++, k++)
            CHECK(got[k] == want[k], "probe: %zu bytes at alignment %zu: %s, a fresh %s: %s",
                  probe_sizes[i], probe_aligns[j], rankmem_status_string(got[k]), cur_name,
                  rankmem_status_string(want[k]));
    fstats_.checks += NPROBE;
    fstats_.probes++;
    if (fault)
        rankmem_fault_enable(fault, 1);
    CHECK(rankmem_resource_release(fresh) == RANKMEM_SUCCESS, "release of the fresh one");
    CHECK(fin, "the fresh one's upstream finalized");
}

static void run(const uint8_t *data, size_t size)
{
    static unsigned long long reported;
    if (stats.ops - reported >= 1000000) { /* progress, in case the run is cut short */
        reported = stats.ops;
        print_stats();
    }
    if (size < 2)
        return;
    rd_t in = {data, size, 0};
    int which = (int)(next(&in) % NRES);
    unsigned cfg = next(&in);
    cur_name = res_names[which];

    int finalized = 0;
    counting_t *up = checked_new(&finalized);
    CHECK(up != NULL, "counting upstream");
    rankmem_resource_t *mr, *fault = NULL, *below = &up->base;
    size_t limit;
    rankmem_status_t st;
    /* Bounded: may refuse for want of room once the fault stops. */
    int bounded = (which == R_POOL && (cfg & 4)) || which == R_ARENA || which == R_VMM;
    if (fault_mode) {
        unsigned fb = next(&in);
        rankmem_fault_params_t fp;
        rankmem_fault_params_default(&fp);
        fp.rate = (fb & 7) / 16.0;
        fp.every = (fb >> 3 & 7) ? 2 + 3 * (fb >> 3 & 7) : 0;
        fp.count = 1 + (fb >> 6 & 1);
        fp.seed = mix(size);
        if (which != R_VMM) { /* a leaf: its own map failures instead */
            st = rankmem_fault_create(&up->base, &fp, &fault);
            CHECK(st == RANKMEM_SUCCESS, "rankmem_fault_create");
            below = fault;
        }
    }
    unsigned long long inj0 = fault ? injected_so_far(fault) : 0;
    st = build(which, cfg, below, &mr, &limit);
    if (st != RANKMEM_SUCCESS && fault && injected_so_far(fault) > inj0) {
        /* Made under the injector, and failed for it: nothing kept. */
        CHECK(st == RANKMEM_ERR_OUT_OF_MEMORY && injected_number(rankmem_last_error()) > inj0,
              "creation failed under the injector with %s: %s", rankmem_status_string(st),
              rankmem_last_error());
        rankmem_resource_release(fault);
        CHECK(up->outstanding_bytes == 0 && up->base.refcount == 1,
              "a failed creation kept %zu bytes and %lu references", up->outstanding_bytes,
              up->base.refcount - 1);
        rankmem_resource_release(&up->base);
        CHECK(finalized, "upstream finalized after a failed build");
        fstats_.creations++;
        fstats_.checks += 4;
        return;
    }
    if (fault)
        rankmem_resource_release(fault); /* mr holds it, until the end of the input */
    if (st != RANKMEM_SUCCESS) {
        /* Missing from this library (weak symbol), or a configuration it refuses. */
        CHECK(st != RANKMEM_ERR_INTERNAL, "build");
        stats.skipped++;
        rankmem_resource_release(&up->base);
        CHECK(finalized, "upstream finalized after a failed build");
        return;
    }
    rankmem_resource_release(&up->base); /* mr holds it; up stays readable until finalized */
    stats.inputs[which]++;
    rankmem_resource_t *top = NULL; /* fault mode: the stats adaptor over mr */
    size_t live_bytes = 0;
    if (fault_mode) {
        st = rankmem_stats_create(mr, &top);
        CHECK(st == RANKMEM_SUCCESS, "rankmem_stats_create");
        rankmem_resource_release(mr);
        mr = top;
    }

    static const rankmem_stream_t streams[4] = {
        NULL, (rankmem_stream_t)(uintptr_t)0x100, (rankmem_stream_t)(uintptr_t)0x200,
        (rankmem_stream_t)(uintptr_t)0x300};
    blk_t live[MAX_LIVE];
    int nlive = 0;
    unsigned char *stale[8] = {0}; /* recently freed */
    uint64_t tag = mix(size * 0x100000001b3ull + data[0]);

    while (in.i < in.n) {
        unsigned b = next(&in);
        unsigned op = b & 7;
        stats.ops++;
        if (op <= 3 && nlive < MAX_LIVE) {
            unsigned e = next(&in) % 21, x = next(&in) | next(&in) << 8;
            size_t n = ((size_t)1 << e) | ((size_t)x * 0x9e37u & (((size_t)1 << e) - 1));
            static const size_t aligns[4] = {0, 256, 4096, 65536};
            size_t align = aligns[(b >> 3) & 3];
            rankmem_stream_t s = streams[(b >> 5) & 3];
            void *p = (void *)foreign; /* must stay as is on failure */
            stats.allocs++;
            unsigned long long i0 = 0;
            if (fault) {
                rankmem_allocate(NULL, 1, 0, NULL); /* a stale error: the next must be its own */
                i0 = injected_so_far(fault);
            }
            st = rankmem_allocate_async(mr, n, align, s, &p);
            if (fault && injected_so_far(fault) > i0) {
                unsigned long long i1 = injected_so_far(fault);
                fstats_.injected += i1 - i0;
                if (st == RANKMEM_SUCCESS) {
                    fstats_.absorbed++;
                } else {
                    unsigned long long k = injected_number(rankmem_last_error());
                    fstats_.failed++;
                    fstats_.checks += 4;
                    CHECK(st == RANKMEM_ERR_OUT_OF_MEMORY,
                          "allocate of %zu at %zu: %s, not the injected out of memory", n,
                          align, rankmem_status_string(st));
                    CHECK(k > i0 && k <= i1,
                          "the last error is not this call's injection (%llu to %llu)", i0 + 1,
                          i1);
                    CHECK(p == (void *)foreign, "output written by a failed allocate");
                    /* The same request once the fault stops. */
                    rankmem_fault_enable(fault, 0);
                    st = rankmem_allocate_async(mr, n, align, s, &p);
                    rankmem_fault_enable(fault, 1);
                    CHECK(st == RANKMEM_SUCCESS ||
                              (bounded && st == RANKMEM_ERR_OUT_OF_MEMORY &&
                               !injected_number(rankmem_last_error())),
                          "allocate of %zu at %zu refused once the fault stopped: %s", n, align,
                          rankmem_status_string(st));
                    if (st != RANKMEM_SUCCESS)
                        fstats_.refused++;
                }
            }
            if (limit && n > limit) {
                CHECK(st == RANKMEM_ERR_INVALID_ARGUMENT,
                      "allocate of %zu from a fixed resource of %zu-byte blocks: %s", n, limit,
                      rankmem_status_string(st));
                stats.too_large++;
            }
            if (st != RANKMEM_SUCCESS) {
                CHECK(p == (void *)foreign, "output written by a failed allocate");
                CHECK(st != RANKMEM_ERR_INTERNAL, "allocate of %zu", n);
                continue;
            }
            stats.alloc_ok++;
            size_t want = align ? align : RANKMEM_DEFAULT_ALIGNMENT;
            CHECK(p != NULL && ((uintptr_t)p & (want - 1)) == 0,
                  "allocate of %zu, alignment %zu: %p", n, want, p);
            CHECK(!overlaps(live, nlive, p, n), "block %p (%zu bytes) overlaps a live block", p,
                  n);
            blk_t nb = {p, n, tag = mix(tag + 1), s};
            fill(&nb);
            live[nlive++] = nb;
            live_bytes += n;
        } else if (op <= 5 && nlive > 0) {
            int k = (int)(next(&in) % (unsigned)nlive);
            blk_t blk = live[k];
            CHECK(intact(&blk), "block %p (%zu bytes) changed while live", (void *)blk.p, blk.n);
            rankmem_stream_t s = (b & 8) ? streams[(b >> 4) & 3] : blk.stream;
            st = rankmem_deallocate_async(mr, blk.p, blk.n, 0, s);
            CHECK(st == RANKMEM_SUCCESS, "free of %p (%zu bytes): %s", (void *)blk.p, blk.n,
                  rankmem_status_string(st));
            live[k] = live[--nlive];
            live_bytes -= blk.n;
            memmove(stale + 1, stale, sizeof stale - sizeof *stale);
            stale[0] = blk.p;
            stats.frees++;
        } else if (op == 6) {
            size_t keep = (size_t)next(&in) << 16;
            st = rankmem_resource_trim(mr, keep);
            CHECK(st == RANKMEM_SUCCESS || st == RANKMEM_ERR_NOT_SUPPORTED, "trim(%zu): %s", keep,
                  rankmem_status_string(st));
            stats.trims++;
        } else if (op == 7) {
            /* Bad frees: refused, and nothing changes. */
            unsigned kind = (b >> 3) % 3;
            unsigned char *p = NULL;
            size_t n = 256;
            if (kind == 0) {
                p = foreign + 256 * (next(&in) % 64);
            } else if (kind == 1 && nlive > 0) {
                blk_t *l = &live[next(&in) % (unsigned)nlive];
                if (l->n > 256)
                    p = l->p + 256, n = l->n - 256;
            } else if (kind == 2) {
                p = stale[next(&in) % 8];
                if (p && overlaps(live, nlive, p, 1))
                    p = NULL; /* reused since: not stale */
            }
            if (!p)
                continue;
            st = rankmem_deallocate_async(mr, p, n, 0, streams[(b >> 5) & 3]);
            CHECK(st == RANKMEM_ERR_INVALID_POINTER, "bad free (%s) of %p: %s",
                  kind == 0 ? "foreign" : kind == 1 ? "interior" : "stale", (void *)p,
                  rankmem_status_string(st));
            stats.bad_frees++;
        }
        if (top) {
            /* The books: exactly what is live, whatever failed or was refused. */
            rankmem_stats_t ss = {.size = sizeof ss};
            rankmem_stats_get(top, &ss);
            CHECK(ss.bytes_current == live_bytes && ss.count_current == (size_t)nlive,
                  "stats hold %zu bytes in %zu blocks, %zu in %d live", ss.bytes_current,
                  ss.count_current, live_bytes, nlive);
            fstats_.checks++;
        }
    }

    /* The end: free everything first, or release with blocks live. */
    int leave_live = (cfg & 0x80) && nlive > 0;
    for (int i = 0; i < nlive; i++)
        CHECK(intact(&live[i]), "block %p (%zu bytes) changed while live", (void *)live[i].p,
              live[i].n);
    if (!leave_live)
        for (int i = 0; i < nlive; i++) {
            st = rankmem_deallocate_async(mr, live[i].p, live[i].n, 0, live[i].stream);
            CHECK(st == RANKMEM_SUCCESS, "final free of %p: %s", (void *)live[i].p,
                  rankmem_status_string(st));
        }
    if (top && !leave_live)
        probe_against_fresh(mr, which, cfg, fault);
    st = rankmem_resource_release(mr);
    if (leave_live) {
        CHECK(st == RANKMEM_ERR_BUSY, "release with %d blocks live: %s", nlive,
              rankmem_status_string(st));
        stats.busy_releases++;
    } else {
        CHECK(st == RANKMEM_SUCCESS, "release: %s", rankmem_status_string(st));
    }
    CHECK(finalized, "the upstream was not finalized: the resource kept a reference");
    /* up is gone: its finalize checked that every byte came back. */
    rankmem_clear_error();
}

/* counting_finalize frees the struct; check its counts first. */
static rankmem_status_t checked_finalize(rankmem_resource_t *mr)
{
    counting_t *c = (counting_t *)mr;
    CHECK(c->outstanding_bytes == 0 && c->outstanding_blocks == 0,
          "upstream still lends %zu bytes in %zu blocks after release", c->outstanding_bytes,
          c->outstanding_blocks);
    return counting_finalize(mr);
}

static void print_stats(void)
{
    fprintf(stderr,
            "fuzz_suballoc: %llu operations: %llu allocate (%llu served, %llu too large for "
            "fixed), %llu free, %llu trim, %llu bad free refused; %llu releases with live "
            "blocks; inputs per resource: pool %llu, arena %llu, binning %llu, caching %llu, "
            "fixed %llu, vmm %llu (skipped: %llu)\n",
            stats.ops, stats.allocs, stats.alloc_ok, stats.too_large, stats.frees, stats.trims,
            stats.bad_frees, stats.busy_releases, stats.inputs[R_POOL], stats.inputs[R_ARENA],
            stats.inputs[R_BINNING], stats.inputs[R_CACHING], stats.inputs[R_FIXED],
            stats.inputs[R_VMM], stats.skipped);
    if (fault_mode)
        fprintf(stderr,
                "fuzz_suballoc: fault: %llu injected, %llu failed a call, %llu absorbed, %llu "
                "refused for want of room once stopped, %llu creations failed cleanly, %llu "
                "probes against a fresh resource, %llu invariants checked\n",
                fstats_.injected, fstats_.failed, fstats_.absorbed, fstats_.refused,
                fstats_.creations, fstats_.probes, fstats_.checks);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* counting.h's ops, with a finalize that checks the counts. */
    checked_ops = counting_ops;
    checked_ops.finalize = checked_finalize;
    const char *f = getenv("FUZZ_FAULT");
    fault_mode = f && *f && strcmp(f, "0") != 0;
    atexit(print_stats);
    return 0;
}

/* FUZZ_ONLY=pool (arena, binning, caching, fixed, vmm): every input goes to that resource. */
static int only = -2; /* -2: not read yet; -1: all */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (only == -2) {
        const char *o = getenv("FUZZ_ONLY");
        only = -1;
        for (int i = 0; o && i < NRES; i++)
            if (!strcmp(o, res_names[i]))
                only = i;
    }
    if (only >= 0 && size >= 2) {
        uint8_t *copy = malloc(size);
        if (!copy)
            return 0;
        memcpy(copy, data, size);
        copy[0] = (uint8_t)only;
        run(copy, size);
        free(copy);
        return 0;
    }
    run(data, size);
    return 0;
}

#ifdef FUZZ_MAIN
/* Without libFuzzer: run the files given, or -n N random inputs. */
int main(int argc, char **argv)
{
    LLVMFuzzerInitialize(&argc, &argv);
    if (argc >= 3 && !strcmp(argv[1], "-n")) {
        long n = atol(argv[2]);
        uint64_t s = argc >= 5 && !strcmp(argv[3], "-s") ? (uint64_t)atoll(argv[4]) : 1;
        uint8_t buf[4096];
        for (long k = 0; k < n; k++) {
            size_t len = 2 + (size_t)((s = mix(s + 0x632be59bd9b4e019ull)) % (sizeof buf - 2));
            for (size_t i = 0; i < len; i++)
                buf[i] = (uint8_t)((s = mix(s + i)) >> 24);
            LLVMFuzzerTestOneInput(buf, len);
        }
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            perror(argv[i]);
            return 1;
        }
        static uint8_t buf[1 << 20];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, len);
    }
    return 0;
}
#endif
