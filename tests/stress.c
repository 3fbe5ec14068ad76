/* Short stress test of the suballocators (CI's form of the 8-thread
 * stress test; run it under ThreadSanitizer too: docs/replay.md), with and
 * without fault injection (docs/testing.md).
 *
 *     tests/stress.t [--fault] [OPS_PER_THREAD [SPEC...]]
 *
 * For each spec string (default: every suballocator over host memory), 8
 * threads, each on its own stand-in stream, allocate, fill, check and free
 * through one chain, and hand blocks to each other to check and free on
 * another thread and stream. Every block is filled with a pattern of its
 * own, checked whole when it is freed: two live blocks that overlap, or an
 * allocator that writes into a live block, show as a corrupt block. At the
 * end the chain is released and a stats adaptor put right above the leaf
 * says whether everything went back upstream. A spec whose resource this
 * library does not know yet is skipped.
 *
 * Fault injection (issue 31): the chains of fault_specs (or the SPECs
 * given after --fault, each naming "fault" where the injector sits) run the
 * same stress with the injector failing upstream calls at random and every
 * so often. After every failed allocation the thread that saw it checks
 * that the status is the injector's, that its last error is this failure
 * (a later injection than any it saw before), and that the same request
 * succeeds once the fault stops (asked again until the injector lets it
 * through). Between rounds (every thread done, nothing live) the books are
 * checked: stats and tracking at zero, a limit's count at zero, the
 * injector's outstanding bytes equal to what the probe above the leaf
 * sees and to what the suballocator above it says it reserved; then a trim,
 * and requests of 1 B to 3 MiB at alignments up to 64 KiB answered exactly
 * as by a fresh chain (no alignment, bin, limit or threshold changed for
 * good). Without --fault, `make check` runs the plain specs and then the
 * fault chains with a tenth of the operations. The long form, 10 million
 * operations per chain: `tests/stress.t --fault 1250000` (or
 * RANKMEM_STRESS_FAULT=1250000 tests/stress.t). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"
#include "stress_harness.h"

#define NTHREADS 8
#define NLIVE 48     /* blocks a thread holds at most */
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
    /* A leaf: the stats probe goes above it. */
    {"vmm(backend=host,granule=64KiB,reserve=4GiB)", 256 << 10},
};

/* Injector under each suballocator and adaptor, and the common chains (the
 * rank's default, stats>pool>cuda, with system for the device). The arena
 * is not here: it asks its upstream only when it is made (tests/fault.t
 * fails that call). */
static const spec_t fault_specs[] = {
    {"pool(growth=64KiB)>fault>system", 256 << 10},
    {"binning>fault>system", 256 << 10},
    {"caching>fault>system", 256 << 10},
    {"fixed(block=4KiB,batch=4)>fault>system", 4 << 10},
    {"stats>fault>system", 256 << 10},
    {"tracking>fault>system", 256 << 10},
    {"limit(bytes=1GiB)>fault>system", 256 << 10},
    {"aligned(alignment=4096,threshold=64KiB)>fault>system", 256 << 10},
    {"retry>fault>system", 256 << 10},
    {"threadsafe>fault>system", 256 << 10},
    {"stats>pool>fault>system", 256 << 10},
    {"stats>pool(growth=64KiB)>fault>system", 256 << 10},
    {"binning>pool>fault>system", 256 << 10},
    {"tracking>binning>fault>system", 256 << 10},
    {"stats>caching>fault>system", 256 << 10},
    {"retry>pool(growth=64KiB)>fault>system", 256 << 10},
    {"limit(bytes=1GiB)>stats>threadsafe>pool(growth=64KiB)>fault>system", 256 << 10},
};

static rankmem_resource_t *chain;
static long ops_per_thread = 20000;

typedef struct fault_ctx fault_ctx_t;
typedef struct {
    size_t max_bytes;
    fault_ctx_t *fx; /* fault mode; NULL otherwise */
} size_arg_t;

/* Mostly small, sometimes up to the largest the resource serves (log-uniform). */
static size_t pick_size(void *arg, unsigned r, unsigned long long *s)
{
    (void)r;
    size_t max_bytes = ((const size_arg_t *)arg)->max_bytes;
    int top = 63 - __builtin_clzll(max_bytes);
    int b = (int)(sh_rng(s) % (unsigned long long)(top + 1));
    size_t n = ((size_t)1 << b) + (size_t)(sh_rng(s) % (1ull << b));
    return n > max_bytes ? max_bytes : n;
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

    /* Thread 0 on the default stream, the others each on a stand-in; half
     * the steps allocate, one free in 8 goes through the mailbox. */
    size_arg_t sa = {sp->max_bytes, NULL};
    sh_config_t cfg = {.mr = chain, .threads = NTHREADS, .steps = ops_per_thread, .live = NLIVE,
                       .seed = 0x243f6a8885a308d3ull, .alloc_mod = 2, .handoff_mod = 8,
                       .take_mod = 16, .stream_base = 0x1000, .default_streams = 1,
                       .size = pick_size, .arg = &sa};
    sh_result_t res;
    sh_run(&cfg, &res);
    sh_report(&res, sp->spec, NTHREADS * ops_per_thread / 4);
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

/* ---- fault injection ---- */

#define ROUND_STEPS 20000L /* steps a thread makes between two checks of the books */
#define MAX_RETRIES 1000   /* asks of the same request after a fault (each may fail again) */

static const size_t probe_sizes[] = {1, 300, 4096, 65536, (size_t)1 << 20, (size_t)3 << 20};
static const size_t probe_aligns[] = {0, 512, 4096, 65536};
#define NPROBE                                                                          \
    (sizeof probe_sizes / sizeof *probe_sizes * sizeof probe_aligns / sizeof *probe_aligns)

struct fault_ctx {
    rankmem_resource_t *fault, *stats, *tracking, *limit, *above_fault, *probe;
    int bounded; /* a limit may refuse for want of room */
    unsigned long long last_k[NTHREADS]; /* the latest injection each thread saw */
    /* atomics: failed calls seen, invariants checked */
    unsigned long long faults, checks;
};

static rankmem_resource_t *find(rankmem_resource_t *mr, const char *name)
{
    for (rankmem_resource_t *r = mr; r; r = r->upstream) {
        const char *n;
        rankmem_resource_name(r, &n);
        if (strcmp(n, name) == 0)
            return r;
    }
    return NULL;
}

/* The number after the last "injected failure " in msg, or 0. */
static unsigned long long injected_number(const char *msg)
{
    const char *k = NULL;
    for (const char *s = msg; (s = strstr(s, "injected failure ")) != NULL; s++)
        k = s;
    return k ? strtoull(k + 17, NULL, 10) : 0;
}

/* The checks after a failed allocation (sh_config_t.on_failure). */
static int on_fault(void *arg, rankmem_resource_t *mr, int thread, size_t bytes,
                    rankmem_stream_t stream, rankmem_status_t st, void **ptr_p, char *why,
                    size_t cap)
{
    fault_ctx_t *fx = ((size_arg_t *)arg)->fx;
    const char *e = rankmem_last_error();
    unsigned long long k = injected_number(e);
    __atomic_add_fetch(&fx->checks, 3, __ATOMIC_RELAXED);
    if (!k) {
        if (fx->bounded && (st == RANKMEM_ERR_LIMIT || st == RANKMEM_ERR_OUT_OF_MEMORY))
            return SH_FAIL_REFUSED;
        snprintf(why, cap, "failed without an injected failure: %s", e);
        return SH_FAIL_ERROR;
    }
    __atomic_add_fetch(&fx->faults, 1, __ATOMIC_RELAXED);
    if (st != RANKMEM_ERR_OUT_OF_MEMORY) {
        snprintf(why, cap, "%s, not the injected out of memory: %s", rankmem_status_string(st),
                 e);
        return SH_FAIL_ERROR;
    }
    /* Injections are numbered in order: an older one is a stale message. */
    if (k <= fx->last_k[thread]) {
        snprintf(why, cap, "the last error is an older failure (%llu, after %llu): %s", k,
                 fx->last_k[thread], e);
        return SH_FAIL_ERROR;
    }
    fx->last_k[thread] = k;
    /* The same request once the fault stops: it stops for this thread as
     * soon as a call of its gets through (the others keep it going). */
    for (int i = 0; i < MAX_RETRIES; i++) {
        st = rankmem_allocate_async(mr, bytes, 0, stream, ptr_p);
        if (st == RANKMEM_SUCCESS)
            return SH_FAIL_RECOVERED;
        e = rankmem_last_error();
        k = injected_number(e);
        if (!k) {
            if (fx->bounded && (st == RANKMEM_ERR_LIMIT || st == RANKMEM_ERR_OUT_OF_MEMORY))
                return SH_FAIL_REFUSED;
            snprintf(why, cap, "refused once the fault stopped: %s", e);
            return SH_FAIL_ERROR;
        }
        if (k > fx->last_k[thread])
            fx->last_k[thread] = k;
    }
    snprintf(why, cap, "still failing after %d tries: %s", MAX_RETRIES, e);
    return SH_FAIL_ERROR;
}

/* The requests of the probe, all live at once, then freed: each status in out. */
static void probe_requests(rankmem_resource_t *mr, rankmem_status_t *out, char (*msg)[160])
{
    void *p[NPROBE];
    size_t k = 0;
    for (size_t i = 0; i < sizeof probe_sizes / sizeof *probe_sizes; i++)
        for (size_t j = 0; j < sizeof probe_aligns / sizeof *probe_aligns; j++, k++) {
            p[k] = NULL;
            out[k] = rankmem_allocate(mr, probe_sizes[i], probe_aligns[j], &p[k]);
            snprintf(msg[k], sizeof msg[k], "%s", out[k] ? rankmem_last_error() : "");
            if (out[k] == RANKMEM_SUCCESS &&
                (uintptr_t)p[k] % (probe_aligns[j] ? probe_aligns[j] : 256)) {
                out[k] = RANKMEM_ERR_INTERNAL; /* misaligned: shows as a difference */
                snprintf(msg[k], sizeof msg[k], "misaligned");
            }
        }
    k = 0;
    for (size_t i = 0; i < sizeof probe_sizes / sizeof *probe_sizes; i++)
        for (size_t j = 0; j < sizeof probe_aligns / sizeof *probe_aligns; j++, k++)
            if (p[k] && out[k] == RANKMEM_SUCCESS)
                rankmem_deallocate(mr, p[k], probe_sizes[i], probe_aligns[j]);
}

/* Between rounds (no thread running, nothing live): the books, a trim, the
 * probe against a fresh chain's answers. Returns how many checks failed
 * and says the first in why. */
static long check_round(fault_ctx_t *fx, const rankmem_status_t *fresh, char *why, size_t cap)
{
    long bad = 0, n = 0;
#define RCHECK(cond, ...)                                                                       \
    do {                                                                                        \
        n++;                                                                                    \
        if (!(cond) && !bad++)                                                                  \
            snprintf(why, cap, __VA_ARGS__);                                                    \
    } while (0)
    if (fx->stats) {
        rankmem_stats_t s = {.size = sizeof s};
        rankmem_stats_get(fx->stats, &s);
        RCHECK(s.bytes_current == 0 && s.count_current == 0,
               "stats hold %zu bytes in %zu blocks with nothing live", s.bytes_current,
               s.count_current);
    }
    if (fx->tracking) {
        size_t b = 1, c = 1;
        rankmem_tracking_outstanding(fx->tracking, &b, &c);
        RCHECK(b == 0 && c == 0, "tracking has %zu bytes in %zu blocks with nothing live", b, c);
    }
    if (fx->limit) {
        size_t u = 1;
        rankmem_resource_query(fx->limit, RANKMEM_QUERY_USED_CURRENT, &u);
        RCHECK(u == 0, "the limit counts %zu bytes with nothing live", u);
    }
    for (int trimmed = 0; trimmed < 2; trimmed++) {
        rankmem_fault_stats_t fs = {.size = sizeof fs};
        rankmem_fault_get_stats(fx->fault, &fs);
        rankmem_stats_t ps = {.size = sizeof ps};
        rankmem_stats_get(fx->probe, &ps);
        RCHECK(fs.bytes_outstanding == ps.bytes_current &&
                   fs.blocks_outstanding == ps.count_current,
               "the injector has %zu bytes in %zu blocks out, the leaf lent %zu in %zu",
               fs.bytes_outstanding, fs.blocks_outstanding, ps.bytes_current, ps.count_current);
        if (fx->above_fault) {
            size_t v = 0;
            const char *name = "?";
            rankmem_resource_name(fx->above_fault, &name);
            if (strcmp(name, "pool") == 0 || strcmp(name, "binning") == 0 ||
                strcmp(name, "fixed") == 0 || strcmp(name, "caching") == 0) {
                rankmem_resource_query(fx->above_fault, RANKMEM_QUERY_RESERVED_CURRENT, &v);
                RCHECK(v == fs.bytes_outstanding,
                       "%s says it reserved %zu bytes, its upstream lent %zu", name, v,
                       fs.bytes_outstanding);
            } else {
                /* Adaptors only above the injector: nothing live, nothing out. */
                RCHECK(fs.bytes_outstanding == 0, "%zu bytes out under adaptors, nothing live",
                       fs.bytes_outstanding);
            }
        }
        if (!trimmed)
            RCHECK(rankmem_resource_trim(chain, 0) == RANKMEM_SUCCESS, "trim: %s",
                   rankmem_last_error());
    }
    rankmem_status_t got[NPROBE];
    static char msg[NPROBE][160];
    rankmem_fault_enable(fx->fault, 0);
    probe_requests(chain, got, msg);
    rankmem_fault_enable(fx->fault, 1);
    size_t k = 0;
    for (size_t i = 0; i < sizeof probe_sizes / sizeof *probe_sizes; i++)
        for (size_t j = 0; j < sizeof probe_aligns / sizeof *probe_aligns; j++, k++)
            RCHECK(got[k] == fresh[k],
                   "%zu bytes at alignment %zu: %s, on a fresh chain %s (%.150s)", probe_sizes[i],
                   probe_aligns[j], rankmem_status_string(got[k]), rankmem_status_string(fresh[k]),
                   msg[k]);
#undef RCHECK
    __atomic_add_fetch(&fx->checks, (unsigned long long)n, __ATOMIC_RELAXED);
    return bad;
}

#define TESTS_PER_FAULT_SPEC 8

/* Thread 0 trims each resource of the chain every 256 steps under the
 * others' feet (a pool under binning too): what the suballocators give
 * back they must ask for again, so their upstream (and the injector) sees
 * many calls. What a threadsafe adaptor guards is trimmed through it. */
static int trim_often(void *arg, rankmem_resource_t *mr, int thread, long step)
{
    (void)arg;
    if (thread != 0 || step % 256 != 255)
        return 0;
    int failed = 0;
    for (rankmem_resource_t *r = mr; r; r = r->upstream) {
        const char *name = "";
        failed += rankmem_resource_trim(r, 0) != RANKMEM_SUCCESS;
        rankmem_resource_name(r, &name);
        if (strcmp(name, "threadsafe") == 0 && r->upstream)
            r = r->upstream;
    }
    return failed;
}

static void run_fault_spec(const spec_t *sp, long steps)
{
    char *probed = with_probe(sp->spec);
    rankmem_status_t st = rankmem_resource_from_spec(probed, &chain);
    if (st != RANKMEM_SUCCESS || !find(chain, "fault")) {
        ok(0, "%s: built with an injector (%s: %s)", sp->spec, rankmem_status_string(st),
           rankmem_last_error());
        tap_skip(TESTS_PER_FAULT_SPEC - 1, "no chain");
        free(probed);
        if (st == RANKMEM_SUCCESS)
            rankmem_resource_release(chain);
        return;
    }
    /* A fresh chain's answers to the probe, nothing injected. */
    rankmem_status_t fresh[NPROBE];
    static char fresh_msg[NPROBE][160];
    rankmem_fault_enable(chain, 0);
    probe_requests(chain, fresh, fresh_msg);
    rankmem_resource_release(chain);
    rankmem_resource_from_spec(probed, &chain);
    ok(1, "%s: built as %s", sp->spec, probed);
    free(probed);

    fault_ctx_t fx;
    memset(&fx, 0, sizeof fx);
    fx.fault = find(chain, "fault");
    fx.stats = find(chain, "stats");
    if (fx.stats && fx.stats->upstream && !fx.stats->upstream->upstream)
        fx.stats = NULL; /* that is the probe above the leaf */
    fx.tracking = find(chain, "tracking");
    fx.limit = find(chain, "limit");
    fx.bounded = fx.limit != NULL;
    for (rankmem_resource_t *a = chain; a && a->upstream; a = a->upstream)
        if (a->upstream == fx.fault)
            fx.above_fault = a;
    fx.probe = fx.fault->upstream;
    rankmem_resource_retain(fx.fault);
    rankmem_resource_retain(fx.probe);
    /* Suballocators ask their upstream seldom: fail more of those calls. */
    const char *above = "";
    if (fx.above_fault)
        rankmem_resource_name(fx.above_fault, &above);
    rankmem_fault_params_t prm;
    rankmem_fault_params_default(&prm);
    int sub = !strcmp(above, "pool") || !strcmp(above, "binning") || !strcmp(above, "fixed") ||
              !strcmp(above, "caching");
    prm.rate = sub ? 0.5 : 0.02;
    prm.every = 101;
    prm.seed = strlen(sp->spec);
    rankmem_fault_configure(fx.fault, &prm);

    size_arg_t sa = {sp->max_bytes, &fx};
    sh_result_t res, all;
    memset(&all, 0, sizeof all);
    long bad = 0, rounds = 0;
    char why[400] = "";
    for (long done = 0; done < steps; done += ROUND_STEPS, rounds++) {
        long n = steps - done < ROUND_STEPS ? steps - done : ROUND_STEPS;
        sh_config_t cfg = {.mr = chain, .threads = NTHREADS, .steps = n, .live = NLIVE,
                           .seed = 0x243f6a8885a308d3ull + (unsigned long long)done,
                           .alloc_mod = 2, .handoff_mod = 8, .take_mod = 16,
                           .stream_base = 0x1000, .default_streams = 1, .size = pick_size,
                           .on_failure = on_fault, .hook = trim_often, .arg = &sa};
        sh_run(&cfg, &res);
        all.errors += res.errors, all.corrupt += res.corrupt, all.misaligned += res.misaligned;
        all.served += res.served, all.refused += res.refused, all.handoffs += res.handoffs;
        all.recovered += res.recovered;
        if (!all.first_error[0])
            memcpy(all.first_error, res.first_error, sizeof all.first_error);
        char w[256] = "";
        long b = check_round(&fx, fresh, w, sizeof w);
        if (b && !bad)
            snprintf(why, sizeof why, "after round %ld: %s", rounds + 1, w);
        bad += b;
    }
    sh_report(&all, sp->spec, NTHREADS * steps / 4);
    if (!ok(bad == 0, "%s: the books and the probe as on a fresh chain after each of %ld rounds",
            sp->spec, rounds))
        diag("  first: %s", why);
    rankmem_fault_stats_t fs = {.size = sizeof fs};
    rankmem_fault_get_stats(fx.fault, &fs);
    ok(fs.injected > 0, "%s: %llu failures injected, %llu of them failed a call", sp->spec,
       fs.injected, fx.faults);
    st = rankmem_resource_release(chain);
    is_status(st, RANKMEM_SUCCESS, "%s: released with nothing live", sp->spec);
    rankmem_fault_get_stats(fx.fault, &fs);
    rankmem_stats_t ps = {.size = sizeof ps};
    rankmem_stats_get(fx.probe, &ps);
    if (!ok(fs.bytes_outstanding == 0 && fs.blocks_outstanding == 0 && ps.bytes_current == 0,
            "%s: everything back upstream after release", sp->spec))
        diag("  the injector has %zu bytes in %zu blocks out, the leaf %zu bytes",
             fs.bytes_outstanding, fs.blocks_outstanding, ps.bytes_current);
    diag("figures: %s: %ld operations (%d threads x %ld), %llu upstream calls, %llu failures "
         "injected (%llu failed a call; %ld recovered by asking again), %ld refused for want "
         "of room, %llu invariants checked, %ld rounds",
         sp->spec, NTHREADS * steps, NTHREADS, steps, fs.calls, fs.injected, fx.faults,
         all.recovered, all.refused, fx.checks, rounds);
    rankmem_resource_release(fx.fault);
    rankmem_resource_release(fx.probe);
}

int main(int argc, char **argv)
{
    int fault = 0, arg = 1;
    long fault_steps = 0;
    const char *env = getenv("RANKMEM_STRESS_FAULT");
    if (env && *env) {
        fault = 1;
        fault_steps = atol(env);
    }
    if (arg < argc && strcmp(argv[arg], "--fault") == 0) {
        fault = 1;
        arg++;
    }
    if (arg < argc) {
        char *e;
        ops_per_thread = strtol(argv[arg], &e, 10);
        if (*e || ops_per_thread < 1) {
            fprintf(stderr, "usage: %s [--fault] [OPS_PER_THREAD [SPEC...]]\n", argv[0]);
            return 2;
        }
        fault_steps = ops_per_thread;
        arg++;
    }
    if (fault_steps < 1)
        fault_steps = fault ? ops_per_thread : ops_per_thread / 10;
    size_t nplain = sizeof default_specs / sizeof *default_specs;
    size_t nfault = sizeof fault_specs / sizeof *fault_specs;
    if (arg < argc) {
        int n = argc - arg;
        tap_plan((fault ? TESTS_PER_FAULT_SPEC : TESTS_PER_SPEC) * n);
        for (int i = arg; i < argc; i++) {
            spec_t sp = {argv[i], strstr(argv[i], "fixed") ? 4096 : (size_t)256 << 10};
            if (fault)
                run_fault_spec(&sp, fault_steps);
            else
                run_spec(&sp);
        }
        return tap_done();
    }
    /* Without --fault: the plain specs, then the fault chains, shorter. */
    tap_plan((fault ? 0 : TESTS_PER_SPEC * (int)nplain) + TESTS_PER_FAULT_SPEC * (int)nfault);
    if (!fault)
        for (size_t i = 0; i < nplain; i++)
            run_spec(&default_specs[i]);
    for (size_t i = 0; i < nfault; i++)
        run_fault_spec(&fault_specs[i], fault_steps);
    return tap_done();
}
