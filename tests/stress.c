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

static rankmem_resource_t *chain;
static long ops_per_thread = 20000;

/* Mostly small, sometimes up to the largest the resource serves (log-uniform). */
static size_t pick_size(void *arg, unsigned r, unsigned long long *s)
{
    (void)r;
    size_t max_bytes = *(const size_t *)arg;
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
    size_t max_bytes = sp->max_bytes;
    sh_config_t cfg = {.mr = chain, .threads = NTHREADS, .steps = ops_per_thread, .live = NLIVE,
                       .seed = 0x243f6a8885a308d3ull, .alloc_mod = 2, .handoff_mod = 8,
                       .take_mod = 16, .stream_base = 0x1000, .default_streams = 1,
                       .size = pick_size, .arg = &max_bytes};
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
