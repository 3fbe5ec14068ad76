/* Spec strings, rankmem_resource_describe and the size/bool parsers:
 * a table of good specs with the exact chain they describe to, a table of bad
 * ones with the exact error (position and words), round trips, one reference
 * per node, device leaves (fail clearly without a GPU, build with one), and
 * rankmem_resource_from_spec_upstream over a counting upstream. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"

#define CFG "bad configuration: "

/* ---- good specs: the chain they describe to ---- */

static const struct {
    const char *spec, *chain;
} good[] = {
    {"system", "system"},
    {"  system  ", "system"},
    {"\tsystem\n", "system"},
    {"pool>system", "pool>system"},
    {"pool()>system", "pool>system"},
    {"pool ( ) > system", "pool>system"},
    {"pool(initial=1MiB)>system", "pool(initial=1MiB)>system"},
    {" pool ( initial = 2 MiB , max = 8MiB ) > system ", "pool(initial=2MiB,max=8MiB)>system"},
    {"pool(max=2^30,initial=2^20)>system", "pool(initial=1MiB,max=1GiB)>system"},
    {"pool(growth=64k)>system", "pool(growth=64KiB)>system"},
    {"pool(initial=1.5MiB)>system", "pool(initial=1536KiB)>system"},
    {"pool(initial=1000)>system", "pool(initial=1KiB)>system"}, /* rounded up to 256 */
    {"pool(initial=\"4MiB\")>system", "pool(initial=4MiB)>system"},
    {"pool(initial=0,max=0)>system", "pool>system"}, /* max 0: unbounded, as in the API */
    {"pool(max=1GB,growth=3m)>system", "pool(max=1GiB,growth=3MiB)>system"},
    {"pool>pool(initial=1MiB)>system", "pool>pool(initial=1MiB)>system"},
    {"limit(bytes=1GiB)>system", "limit(bytes=1GiB)>system"},
    {"limit(bytes=100)>pool>system", "limit(bytes=100)>pool>system"},
    {"fixed(block=64KiB)>system", "fixed(block=64KiB)>system"},
    {"fixed(block=4096,batch=16)>pool>system", "fixed(block=4KiB,batch=16)>pool>system"},
    {"binning(min=2^10,max=2^20)>system", "binning(min=2^10,max=2^20)>system"},
    {"stats>binning>pool>system", "stats>binning(min=2^8,max=2^22)>pool>system"},
    {"caching>system", "caching>system"},
    {"arena(size=64MiB)>system", "arena(size=64MiB)>system"},
    {"arena(size=64MiB,superblock=1MiB)>pool>system", "arena(size=64MiB,superblock=1MiB)>pool>system"},
    {"caching(growth=2,min=8,max=22,cap=1GiB)>system", "caching(growth=2,min=8,max=22,cap=1GiB)>system"},
    {"aligned(alignment=4096)>system", "aligned(alignment=4096,threshold=0)>system"},
    {"aligned(alignment=4KiB,threshold=1MiB)>pool>system",
     "aligned(alignment=4096,threshold=1MiB)>pool>system"},
    {"retry>pool>system", "retry>pool>system"},
    {"threadsafe>system", "threadsafe>system"},
    {"stats>system", "stats>system"},
    {"stats()>pool>system", "stats>pool>system"},
    {"tracking>system", "tracking>system"},
    {"tracking(backtraces=off)>system", "tracking>system"},
    {"tracking(backtraces=YES)>system", "tracking(backtraces=1)>system"},
    {"stats>tracking>limit(bytes=64MiB)>pool(initial=4MiB)>system",
     "stats>tracking>limit(bytes=64MiB)>pool(initial=4MiB)>system"},
    {"retry>threadsafe>stats>aligned(alignment=2^16,threshold=2^20)>limit(bytes=1.5GiB)>pool>"
     "system",
     "retry>threadsafe>stats>aligned(alignment=65536,threshold=1MiB)>limit(bytes=1536MiB)>pool>"
     "system"},
};

/* ---- bad specs: status and the exact message (after the status name) ---- */

static const struct {
    const char *spec;
    rankmem_status_t status;
    const char *error; /* a prefix of the message when it ends in "..." */
} bad[] = {
    {"", RANKMEM_ERR_CONFIG, "at 1: empty spec: expected a resource name (e.g. pool>cuda)"},
    {"   ", RANKMEM_ERR_CONFIG, "at 4: empty spec: expected a resource name (e.g. pool>cuda)"},
    {"pol>system", RANKMEM_ERR_CONFIG, "at 1: unknown resource 'pol' (did you mean 'pool'?)"},
    {"Pool>system", RANKMEM_ERR_CONFIG, "at 1: unknown resource 'Pool' (did you mean 'pool'?)"},
    {"stat>system", RANKMEM_ERR_CONFIG, "at 1: unknown resource 'stat' (did you mean 'stats'?)"},
    {"pool>sytsem", RANKMEM_ERR_CONFIG, "at 6: unknown resource 'sytsem' (did you mean 'system'?)"},
    {"xyzzy>system", RANKMEM_ERR_CONFIG, "at 1: unknown resource 'xyzzy'"},
    {"stats>pool(intial=2GiB)>async", RANKMEM_ERR_CONFIG,
     "at 12: unknown option 'intial' for pool (did you mean 'initial'?)"},
    {"pool(maximum=1GiB)>system", RANKMEM_ERR_CONFIG, "at 6: unknown option 'maximum' for pool (it takes initial, max or growth)"},
    {"async(pool=1)", RANKMEM_ERR_CONFIG,
     "at 7: unknown option 'pool' for async (it takes default, initial, release, export, reuse_events, reuse_opportunistic or reuse_internal)"},
    {"system(x=1)", RANKMEM_ERR_CONFIG,
     "at 8: unknown option 'x' for system (system takes no options)"},
    {"stats>pool", RANKMEM_ERR_CONFIG, "at 7: 'pool' needs an upstream after it (e.g. pool>cuda)"},
    {"fixed>system", RANKMEM_ERR_CONFIG, "at 1: fixed needs block=<size>"},
    {"binning(min=1000)>system", RANKMEM_ERR_CONFIG,
     "at 13: binning.min must be a power of two from 2^8 to 2^40, not 1000"},
    {"binning(min=2^20,max=2^10)>system", RANKMEM_ERR_CONFIG,
     "at 13: binning.min (1048576) is above binning.max (1024)"},
    {"caching(growth=1)>system", RANKMEM_ERR_CONFIG, "at 16: caching.growth must be 2 to 1024, not 1"},
    {"caching(min=9,max=4)>system", RANKMEM_ERR_CONFIG, "at 13: caching.min (9) is above caching.max (4)"},
    {"limit(bytes=1GiB)", RANKMEM_ERR_CONFIG,
     "at 1: 'limit' needs an upstream after it (e.g. limit>cuda)"},
    {"cuda>system", RANKMEM_ERR_CONFIG,
     "at 5: 'cuda' cannot have an upstream: it allocates memory itself, so it ends the chain"},
    {"stats>system>pool>system", RANKMEM_ERR_CONFIG, "at 13: 'system' cannot have an upstream..."},
    {"system>", RANKMEM_ERR_CONFIG, "at 7: 'system' cannot have an upstream..."},
    {"pool>", RANKMEM_ERR_CONFIG, "at 6: expected a resource name after '>', found the end"},
    {"pool>>system", RANKMEM_ERR_CONFIG, "at 6: expected a resource name after '>', found '>'"},
    {">system", RANKMEM_ERR_CONFIG, "at 1: expected a resource name, found '>'"},
    {"pool(initial=1GiB,initial=2GiB)>system", RANKMEM_ERR_CONFIG,
     "at 19: duplicate option 'initial' for pool (first at 6)"},
    {"pool(initial)>system", RANKMEM_ERR_CONFIG,
     "at 13: expected '=' after pool.initial, found ')'"},
    {"pool(initial 1GiB)>system", RANKMEM_ERR_CONFIG,
     "at 14: expected '=' after pool.initial, found '1GiB'"},
    {"pool(initial=1GiB>system", RANKMEM_ERR_CONFIG,
     "at 18: expected ',' or ')' after pool.initial=1GiB, found '>'"},
    {"pool(initial=1GiB", RANKMEM_ERR_CONFIG,
     "at 18: missing ')' to close the options of pool opened at 5"},
    {"pool(", RANKMEM_ERR_CONFIG, "at 6: missing ')' to close the options of pool opened at 5"},
    {"pool(initial=abc)>system", RANKMEM_ERR_CONFIG,
     "at 14: bad size 'abc' for pool.initial: not a number"},
    {"pool(initial=)>system", RANKMEM_ERR_CONFIG,
     "at 14: missing value for pool.initial, found ')'"},
    {"pool(initial=-1)>system", RANKMEM_ERR_CONFIG,
     "at 14: bad size '-1' for pool.initial: negative"},
    {"pool(max=2^64)>system", RANKMEM_ERR_CONFIG, "at 10: bad size '2^64' for pool.max: too large"},
    {"pool(max=1 XB)>system", RANKMEM_ERR_CONFIG,
     "at 10: bad size '1 XB' for pool.max: unknown unit (expected K, M, G, T, KB..TB, KiB..TiB "
     "or %)"},
    {"pool(initial=150%)>system", RANKMEM_ERR_CONFIG,
     "at 14: bad size '150%' for pool.initial: more than 100%"},
    {"pool(,)>system", RANKMEM_ERR_CONFIG, "at 6: expected an option name for pool, found ','"},
    {"pool(initial=1MiB,)>system", RANKMEM_ERR_CONFIG,
     "at 19: expected an option name for pool, found ')'"},
    {"pool(1MiB)>system", RANKMEM_ERR_CONFIG, "at 6: expected an option name for pool, found '1MiB'"},
    {"system extra", RANKMEM_ERR_CONFIG,
     "at 8: expected '(', '>' or the end after system, found 'extra'"},
    {"pool(initial=1MiB) x>system", RANKMEM_ERR_CONFIG,
     "at 20: expected '>' or the end after pool, found 'x'"},
    {"pool(initial=1MiB)(max=2MiB)>system", RANKMEM_ERR_CONFIG,
     "at 19: expected '>' or the end after pool, found '('"},
    {"pool[initial=1]>system", RANKMEM_ERR_CONFIG,
     "at 5: expected '(', '>' or the end after pool, found '['"},
    {"system\x01", RANKMEM_ERR_CONFIG,
     "at 7: expected '(', '>' or the end after system, found '\\x01'"},
    {"pool(initial=\"1MiB)>system", RANKMEM_ERR_CONFIG,
     "at 14: missing closing '\"' for the value of pool.initial"},
    {"async_view", RANKMEM_ERR_CONFIG,
     "at 1: 'async_view' cannot be built from a spec: it wraps an existing cudaMemPool_t handle "
     "(use rankmem_async_view_create)"},
    {"pool>callback", RANKMEM_ERR_CONFIG,
     "at 6: 'callback' cannot be built from a spec: it needs two functions (use "
     "rankmem_callback_create)"},
    {"limit>system", RANKMEM_ERR_CONFIG, "at 1: limit needs bytes=<size>"},
    {"aligned(threshold=1)>system", RANKMEM_ERR_CONFIG, "at 1: aligned needs alignment=<size>"},
    {"tracking(backtraces=maybe)>system", RANKMEM_ERR_CONFIG,
     "at 21: bad boolean 'maybe' for tracking.backtraces: expected 1/0, on/off, yes/no or "
     "true/false"},
    {"async(export=posix)", RANKMEM_ERR_CONFIG,
     "at 14: bad value 'posix' for async.export: expected none, posix_fd, fabric or "
     "posix_fd+fabric"},
    {"async(export=fabrik)", RANKMEM_ERR_CONFIG,
     "at 14: bad value 'fabrik' for async.export: expected none, posix_fd, fabric or "
     "posix_fd+fabric (did you mean 'fabric'?)"},
    {"async(default=1,initial=1GiB)", RANKMEM_ERR_CONFIG,
     "at 17: async.initial does not apply to the device's default pool (default=1)"},
    {"async(default=2)", RANKMEM_ERR_CONFIG, "at 15: bad boolean '2' for async.default: ..."},
    {"pool(max=255)>system", RANKMEM_ERR_CONFIG,
     "at 10: pool.max of 255 bytes is less than the pool's unit (256 bytes): it could never "
     "allocate"},
    {"pool(initial=2MiB,max=1MiB)>system", RANKMEM_ERR_CONFIG,
     "at 14: pool.initial (2097152 bytes) is above pool.max (1048576 bytes)"},
    {"stats>limit(bytes=0)>pool(initial=1MiB)>system", RANKMEM_ERR_CONFIG,
     "at 19: limit.bytes of 0 would refuse every allocation"},
    {"aligned(alignment=100)>pool>system", RANKMEM_ERR_CONFIG,
     "at 19: aligned.alignment must be a power of two from 256 to 1GiB (RANKMEM_MAX_ALIGNMENT), "
     "not 100"},
    /* A constructor's own refusal, where it was built. */
    {"stats>pool(initial=2^63)>system", RANKMEM_ERR_CONFIG,
     "at 7: cannot build pool: rankmem_pool_create: sizes too large"},
    /* Issue 31, defect 5: accepted, then unusable (every allocation refused). */
    {"aligned(alignment=1TiB)>system", RANKMEM_ERR_CONFIG,
     "at 19: aligned.alignment must be a power of two from 256 to 1GiB (RANKMEM_MAX_ALIGNMENT), "
     "not 1099511627776"},
    {"aligned(alignment=2GiB)>pool>system", RANKMEM_ERR_CONFIG,
     "at 19: aligned.alignment must be a power of two ..."},
    {"vmm(backend=host,max=1MiB)", RANKMEM_ERR_CONFIG,
     "at 22: vmm.max of 1048576 bytes is less than one granule (2097152 bytes): it could never "
     "allocate"},
    {"vmm(backend=host,granule=2^40)", RANKMEM_ERR_CONFIG,
     "at 26: vmm.granule must be a power of two from 4KiB to 1GiB, not 1099511627776"},
    /* ... and refused only when built, before: now when checked too. */
    {"vmm(backend=host,reserve=4MiB,max=8MiB)", RANKMEM_ERR_CONFIG,
     "at 35: vmm.max (8388608 bytes) is above vmm.reserve (4194304 bytes)"},
    {"fixed(block=0)>system", RANKMEM_ERR_CONFIG, "at 13: fixed.block must be 1 byte to 1TiB, not 0"},
    {"fixed(block=1MiB,batch=2^30)>system", RANKMEM_ERR_CONFIG,
     "at 24: fixed.batch of 1073741824 blocks of 1048576 bytes is more than 1TiB"},
    {"caching(growth=1024,max=64)>system", RANKMEM_ERR_CONFIG,
     "at 25: caching: the largest bin, 1024^64 bytes, is too large"},
    {"arena(superblock=3000)>system", RANKMEM_ERR_CONFIG,
     "at 18: arena.superblock must be a power of two from 64KiB to 1GiB, not 3000"},
    {"arena(size=1MiB)>system", RANKMEM_ERR_CONFIG,
     "at 12: arena.size of 1048576 bytes is less than one superblock (4194304 bytes)"},
    {"prefetch>pool>system", RANKMEM_ERR_NOT_SUPPORTED,
     "at 1: cannot build prefetch: rankmem_prefetch_create: ..."},
};

/* A spec fit for a TAP line: control characters escaped. */
static const char *esc(const char *s)
{
    static char buf[4][512];
    static int k;
    char *b = buf[k++ % 4];
    size_t o = 0;
    for (; *s && o + 5 < sizeof buf[0]; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            o += (size_t)snprintf(b + o, sizeof buf[0] - o, "\\x%02x", (unsigned char)*s);
        else
            b[o++] = *s;
    b[o] = '\0';
    return b;
}

static int matches(const char *got, const char *want)
{
    size_t n = strlen(want);
    if (n >= 3 && strcmp(want + n - 3, "...") == 0)
        return strncmp(got, want, n - 3) == 0;
    return strcmp(got, want) == 0;
}

/* The message without the status name rk_error puts first. */
static const char *message(rankmem_status_t st)
{
    const char *e = rankmem_last_error();
    size_t n = strlen(rankmem_status_string(st));
    if (strncmp(e, rankmem_status_string(st), n) == 0 && e[n] == ':')
        return e + n + 2;
    return e;
}

static char *describe(rankmem_resource_t *mr)
{
    static char buf[1024];
    if (rankmem_resource_describe(mr, buf, sizeof buf, NULL) != RANKMEM_SUCCESS)
        snprintf(buf, sizeof buf, "(describe failed: %s)", rankmem_last_error());
    return buf;
}

/* Every node of the chain holds exactly one reference (the caller's, or its user's). */
/* The chain holds one reference per node; below a binning, its fixed-size
 * bins hold one more each on the shared upstream. */
static int one_ref_each(const rankmem_resource_t *mr)
{
    int below_binning = 0;
    for (; mr; mr = mr->upstream) {
        if (below_binning ? mr->refcount < 1 : mr->refcount != 1)
            return 0;
        if (strcmp(mr->ops->name, "binning") == 0)
            below_binning = 1;
    }
    return 1;
}

static void test_good(void)
{
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        rankmem_resource_t *mr = NULL;
        rankmem_status_t st = rankmem_resource_from_spec(good[i].spec, &mr);
        if (!ok(st == RANKMEM_SUCCESS, "good spec \"%s\"", esc(good[i].spec))) {
            diag("  %s", rankmem_last_error());
            tap_skip(3, "not built");
            continue;
        }
        char d1[1024];
        snprintf(d1, sizeof d1, "%s", describe(mr));
        if (!ok(strcmp(d1, good[i].chain) == 0, "  describes as %s", good[i].chain))
            diag("  got %s", d1);
        ok(one_ref_each(mr), "  one reference per node");
        /* Round trip: the description builds a chain that describes the same. */
        rankmem_resource_t *again = NULL;
        st = rankmem_resource_from_spec(d1, &again);
        ok(st == RANKMEM_SUCCESS && strcmp(describe(again), d1) == 0, "  round trip of %s", d1);
        if (again)
            rankmem_resource_release(again);
        rankmem_resource_release(mr);
    }
}

static void test_bad(void)
{
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rankmem_resource_t *mr = (rankmem_resource_t *)0x1;
        rankmem_status_t st = rankmem_resource_from_spec(bad[i].spec, &mr);
        const char *e = message(st);
        int good_status = st == bad[i].status;
        if (!ok(good_status && matches(e, bad[i].error) && mr == (rankmem_resource_t *)0x1,
                "bad spec \"%s\": %s", esc(bad[i].spec), esc(bad[i].error))) {
            diag("  got status %s, message: %s", rankmem_status_string(st), rankmem_last_error());
        }
    }
}

/* % over a host leaf is of physical host memory: the result depends on the
 * machine, so it is checked against sysconf here rather than in the table. */
static void test_percent(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t host = (size_t)pages * (size_t)page;
    rankmem_resource_t *mr = NULL;
    rankmem_status_t st = rankmem_resource_from_spec("pool(max=50%)>system", &mr);
    is_status(st, RANKMEM_SUCCESS, "pool(max=50%%)>system: %% of host memory over a host leaf");
    size_t max = 0;
    if (st == RANKMEM_SUCCESS) {
        rankmem_resource_query(mr, RANKMEM_QUERY_POOL_MAX, &max);
        rankmem_resource_release(mr);
    }
    ok(max == (host / 2 & ~(size_t)255), "  max is half of %zu bytes (rounded to 256): %zu", host,
       max);
    st = rankmem_resource_from_spec("limit(bytes=12.5%)>system", &mr);
    is_status(st, RANKMEM_SUCCESS, "limit(bytes=12.5%%)>system");
    if (st == RANKMEM_SUCCESS) {
        size_t lim = 0;
        rankmem_resource_query(mr, RANKMEM_QUERY_LIMIT, &lim);
        ok(lim == host / 8, "  limit is an eighth of host memory: %zu", lim);
        rankmem_resource_release(mr);
    } else {
        tap_skip(1, "not built");
    }
}

/* The options reach the resources: the chain does what it says. */
static void test_effects(void)
{
    rankmem_resource_t *mr = NULL;
    void *p;
    rankmem_status_t st = rankmem_resource_from_spec("limit(bytes=1MiB)>pool(initial=2MiB)>system", &mr);
    is_status(st, RANKMEM_SUCCESS, "limit over a pool over system");
    if (st != RANKMEM_SUCCESS) {
        tap_skip(3, "not built");
        return;
    }
    size_t held = 0;
    rankmem_resource_query(mr->upstream, RANKMEM_QUERY_RESERVED_CURRENT, &held);
    ok(held == (size_t)2 << 20, "  the pool took its initial 2 MiB: %zu", held);
    is_status(rankmem_allocate(mr, (size_t)2 << 20, 0, &p), RANKMEM_ERR_LIMIT,
              "  2 MiB is past the 1 MiB limit");
    st = rankmem_allocate(mr, 4096, 0, &p);
    is_status(st, RANKMEM_SUCCESS, "  4 KiB is within it");
    if (st == RANKMEM_SUCCESS)
        rankmem_deallocate(mr, p, 4096, 0);
    rankmem_resource_release(mr);
}

/* logging writes a file: a path of our own, removed afterwards. */
static void test_logging(void)
{
    char path[128], spec[256], want[256];
    snprintf(path, sizeof path, "/tmp/rankmem-spec-%ld.csv", (long)getpid());
    snprintf(spec, sizeof spec, " logging ( file = %s ) > pool > system", path);
    snprintf(want, sizeof want, "logging(file=%s)>pool>system", path);
    rankmem_resource_t *mr = NULL;
    rankmem_status_t st = rankmem_resource_from_spec(spec, &mr);
    is_status(st, RANKMEM_SUCCESS, "logging with a file");
    if (st == RANKMEM_SUCCESS) {
        ok(strcmp(describe(mr), want) == 0, "  describes as %s", want);
        void *p;
        if (rankmem_allocate(mr, 1000, 0, &p) == RANKMEM_SUCCESS)
            rankmem_deallocate(mr, p, 1000, 0);
        rankmem_resource_release(mr);
        ok(access(path, F_OK) == 0, "  the log file was written");
    } else {
        tap_skip(2, "not built");
    }
    unlink(path);
    /* A quoted path may hold the characters that end a bare value. */
    snprintf(path, sizeof path, "/tmp/rankmem-spec-%ld,(x)>y.csv", (long)getpid());
    snprintf(spec, sizeof spec, "logging(file=\"%s\")>system", path);
    st = rankmem_resource_from_spec(spec, &mr);
    is_status(st, RANKMEM_SUCCESS, "logging with a quoted file name holding , ( ) >");
    if (st == RANKMEM_SUCCESS)
        rankmem_resource_release(mr);
    ok(access(path, F_OK) == 0, "  that file was written");
    unlink(path);
}

static void test_long_chain(void)
{
    char spec[64 * 6 + 16] = "";
    for (int i = 0; i < 64; i++)
        strcat(spec, "stats>");
    strcat(spec, "system");
    rankmem_resource_t *mr;
    is_status(rankmem_resource_from_spec(spec, &mr), RANKMEM_ERR_CONFIG, "65 resources: too long");
    ok(matches(message(RANKMEM_ERR_CONFIG), "at 385: chain too long (more than 64 resources)"),
       "  says so at the 65th: %s", rankmem_last_error());
    char sixty_four[64 * 6 + 16] = "";
    for (int i = 0; i < 63; i++)
        strcat(sixty_four, "stats>");
    strcat(sixty_four, "system");
    rankmem_status_t st = rankmem_resource_from_spec(sixty_four, &mr);
    is_status(st, RANKMEM_SUCCESS, "64 resources build");
    if (st == RANKMEM_SUCCESS) {
        ok(one_ref_each(mr), "  one reference per node");
        is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "  released");
    } else {
        tap_skip(2, "not built");
    }
}

/* Device leaves: a clear failure naming the resource without a GPU, the
 * described chain with one. */
static void test_device_leaves(int ndev)
{
    static const struct {
        const char *spec, *chain, *leaf;
    } dev[] = {
        {"cuda", "cuda", "cuda"},
        {"managed", "managed", "managed"},
        {"pinned", "pinned", "pinned"},
        {"async", "async", "async"},
        {"async(default=0)", "async", "async"},
        {"async(default=1)", "async(default=1)", "async"},
        {"async( initial = 2MiB , release = 1GiB )", "async(initial=2MiB,release=1GiB)", "async"},
        {"pool(initial=1MiB)>cuda", "pool(initial=1MiB)>cuda", "cuda"},
        {"stats>pool>async(default=yes)", "stats>pool>async(default=1)", "async"},
        {"limit(bytes=16MiB)>tracking>managed", "limit(bytes=16MiB)>tracking>managed", "managed"},
        {"pool>pinned", "pool>pinned", "pinned"},
    };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
        rankmem_resource_t *mr = (rankmem_resource_t *)0x1;
        rankmem_status_t st = rankmem_resource_from_spec(dev[i].spec, &mr);
        if (ndev == 0) {
            char want[64];
            snprintf(want, sizeof want, "cannot build %s: ", dev[i].leaf);
            ok((st == RANKMEM_ERR_NO_DEVICE || st == RANKMEM_ERR_NOT_SUPPORTED) &&
                   strstr(rankmem_last_error(), want) && mr == (rankmem_resource_t *)0x1,
               "no GPU: \"%s\" fails naming %s: %s", dev[i].spec, dev[i].leaf,
               rankmem_last_error());
        } else {
            if (!ok(st == RANKMEM_SUCCESS && strcmp(describe(mr), dev[i].chain) == 0 &&
                        one_ref_each(mr),
                    "GPU: \"%s\" builds and describes as %s", dev[i].spec, dev[i].chain))
                diag("  %s", st == RANKMEM_SUCCESS ? describe(mr) : rankmem_last_error());
            if (st == RANKMEM_SUCCESS)
                rankmem_resource_release(mr);
        }
    }
}

/* ---- rankmem_resource_describe's own contract ---- */

static rankmem_status_t fake_alloc(rankmem_resource_t *mr, size_t b, size_t a,
                                   rankmem_stream_t s, void **p)
{
    (void)mr, (void)b, (void)a, (void)s, (void)p;
    return RANKMEM_ERR_OUT_OF_MEMORY;
}
static rankmem_status_t fake_free(rankmem_resource_t *mr, void *p, size_t b, size_t a,
                                  rankmem_stream_t s)
{
    (void)mr, (void)p, (void)b, (void)a, (void)s;
    return RANKMEM_SUCCESS;
}
static rankmem_status_t cb_alloc(void *arg, size_t b, size_t a, rankmem_stream_t s, void **p)
{
    (void)arg, (void)b, (void)a, (void)s, (void)p;
    return RANKMEM_ERR_OUT_OF_MEMORY;
}
static rankmem_status_t cb_free(void *arg, void *p, size_t b, size_t a, rankmem_stream_t s)
{
    (void)arg, (void)p, (void)b, (void)a, (void)s;
    return RANKMEM_SUCCESS;
}
static int broken_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    (void)mr, (void)buf, (void)len;
    return -1;
}

static void test_describe_api(void)
{
    rankmem_resource_t *mr = NULL;
    if (rankmem_resource_from_spec("stats>pool(initial=1MiB)>system", &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("stats>pool>system: %s", rankmem_last_error());
    const char *full = "stats>pool(initial=1MiB)>system";
    size_t flen = strlen(full), needed = 0;
    char buf[64];
    is_status(rankmem_resource_describe(NULL, buf, sizeof buf, &needed),
              RANKMEM_ERR_INVALID_ARGUMENT, "describe: NULL resource");
    is_status(rankmem_resource_describe(mr, NULL, 10, &needed), RANKMEM_ERR_INVALID_ARGUMENT,
              "describe: NULL buffer with a length");
    needed = 0;
    is_status(rankmem_resource_describe(mr, NULL, 0, &needed), RANKMEM_ERR_INVALID_ARGUMENT,
              "describe: no buffer: too small");
    ok(needed == flen, "  but says the length it needs: %zu", needed);
    for (size_t len = 1; len <= flen; len += 5) {
        memset(buf, 'x', sizeof buf);
        needed = 0;
        rankmem_status_t st = rankmem_resource_describe(mr, buf, len, &needed);
        ok(st == RANKMEM_ERR_INVALID_ARGUMENT && needed == flen && buf[len - 1] == '\0' &&
               strncmp(buf, full, len - 1) == 0 && buf[len] == 'x',
           "describe into %zu bytes: truncated, NUL-terminated, needs %zu", len, needed);
    }
    needed = 0;
    is_status(rankmem_resource_describe(mr, buf, flen + 1, &needed), RANKMEM_SUCCESS,
              "describe into exactly enough bytes");
    ok(strcmp(buf, full) == 0 && needed == flen, "  %s", buf);
    is_status(rankmem_resource_describe(mr, buf, sizeof buf, NULL), RANKMEM_SUCCESS,
              "describe: needed_p may be NULL");
    /* From the middle of a chain: that resource and what is below it. */
    is_status(rankmem_resource_describe(mr->upstream, buf, sizeof buf, NULL), RANKMEM_SUCCESS,
              "describe the pool alone");
    ok(strcmp(buf, "pool(initial=1MiB)>system") == 0, "  %s", buf);
    rankmem_resource_release(mr);

    /* A user resource: described by its name, or by its own describe. */
    static rankmem_resource_ops_t ops = {
        .size = sizeof(rankmem_resource_ops_t),
        .name = "mine",
        .allocate = fake_alloc,
        .deallocate = fake_free,
    };
    rankmem_resource_t mine, *top = NULL;
    rankmem_resource_init(&mine, &ops, RANKMEM_PROP_HOST_ACCESSIBLE, NULL);
    rankmem_stats_create(&mine, &top);
    is_status(rankmem_resource_describe(top, buf, sizeof buf, NULL), RANKMEM_SUCCESS,
              "describe over a user resource");
    ok(strcmp(buf, "stats>mine") == 0, "  by its name: %s", buf);
    ops.describe = broken_describe;
    is_status(rankmem_resource_describe(top, buf, sizeof buf, NULL), RANKMEM_ERR_INTERNAL,
              "a describe that fails: internal error");
    rankmem_resource_release(top);
    /* ...and a table written before describe existed is described by name. */
    ops.size = offsetof(rankmem_resource_ops_t, describe);
    is_status(rankmem_resource_describe(&mine, buf, sizeof buf, NULL), RANKMEM_SUCCESS,
              "an older, shorter ops table");
    ok(strcmp(buf, "mine") == 0, "  by its name: %s", buf);

    rankmem_resource_t *cb = NULL;
    rankmem_callback_create(cb_alloc, cb_free, NULL, RANKMEM_PROP_HOST_ACCESSIBLE, &cb);
    if (cb) {
        rankmem_resource_describe(cb, buf, sizeof buf, NULL);
        ok(strcmp(buf, "callback") == 0, "a callback resource describes as %s", buf);
        rankmem_resource_release(cb);
    } else {
        tap_skip(1, "no callback resource");
    }
}

static void test_from_spec_args(void)
{
    rankmem_resource_t *mr = (rankmem_resource_t *)0x1;
    is_status(rankmem_resource_from_spec(NULL, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "from_spec: NULL spec");
    is_status(rankmem_resource_from_spec("system", NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "from_spec: NULL output");
    ok(mr == (rankmem_resource_t *)0x1, "  output untouched");
}

/* rankmem_resource_from_spec_upstream: the spec over a resource of ours. */
static void test_from_spec_upstream(void)
{
    int fin = 0;
    counting_t *c = counting_new(&fin);
    if (!c)
        BAIL_OUT("counting_new failed");
    rankmem_resource_t *up = &c->base, *mr = (rankmem_resource_t *)0x1;
    is_status(rankmem_resource_from_spec_upstream(NULL, up, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "from_spec_upstream: NULL spec");
    is_status(rankmem_resource_from_spec_upstream("pool", NULL, &mr),
              RANKMEM_ERR_INVALID_ARGUMENT, "from_spec_upstream: NULL upstream");
    is_status(rankmem_resource_from_spec_upstream("pool", up, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "from_spec_upstream: NULL output");
    static const struct {
        const char *spec, *error;
    } bad_over[] = {
        {"", "at 1: empty spec: expected a resource name (e.g. pool>cuda)"},
        {"pool>", "at 6: expected a resource name after '>', found the end"},
        {"cuda>pool", "at 5: 'cuda' cannot have an upstream: it allocates memory itself, so it "
                      "ends the chain"},
        {"pool(maxx=1GiB)", "at 6: unknown option 'maxx' for pool (did you mean 'max'?)..."},
        {"pool(max=100)", "at 10: pool.max of 100 bytes is less than the pool's unit..."},
        {"stats>fixed(block=0)", "at 19: fixed.block must be 1 byte to 1TiB, not 0"},
        {"stats>pool(initial=2^63)", "at 7: cannot build pool: ..."},
    };
    for (size_t i = 0; i < sizeof bad_over / sizeof bad_over[0]; i++) {
        rankmem_status_t st = rankmem_resource_from_spec_upstream(bad_over[i].spec, up, &mr);
        const char *e = message(st);
        if (!ok(st == RANKMEM_ERR_CONFIG && matches(e, bad_over[i].error) &&
                    mr == (rankmem_resource_t *)0x1 && up->refcount == 1,
                "over an upstream, bad spec \"%s\": %s; upstream not kept", bad_over[i].spec,
                bad_over[i].error))
            diag("  got %s: %s (upstream refcount %lu)", rankmem_status_string(st),
                 rankmem_last_error(), up->refcount);
    }
    ok(mr == (rankmem_resource_t *)0x1 && c->allocs == 0, "  output untouched, nothing allocated");

    /* A wrapper may end the spec; a leaf at the end is replaced, not built. */
    static const struct {
        const char *spec, *chain;
    } good_over[] = {
        {"pool(initial=1MiB)>stats", "pool(initial=1MiB)>stats>counting"},
        {"pool(initial=1MiB)>cuda", "pool(initial=1MiB)>counting"},
        {"limit(bytes=1MiB) > async(initial=2GiB)", "limit(bytes=1MiB)>counting"},
        {"binning(min=2^10,max=2^12)>system", "binning(min=2^10,max=2^12)>counting"},
    };
    for (size_t i = 0; i < sizeof good_over / sizeof good_over[0]; i++) {
        mr = NULL;
        size_t before = c->allocs;
        rankmem_status_t st = rankmem_resource_from_spec_upstream(good_over[i].spec, up, &mr);
        if (!ok(st == RANKMEM_SUCCESS, "over an upstream: \"%s\"", good_over[i].spec)) {
            diag("  %s", rankmem_last_error());
            tap_skip(2, "not built");
            continue;
        }
        const char *d = describe(mr);
        if (!ok(matches(d, good_over[i].chain), "  describes as %s", good_over[i].chain))
            diag("  got %s", d);
        void *p = NULL;
        int served = rankmem_allocate(mr, 1000, 0, &p) == RANKMEM_SUCCESS &&
                     rankmem_deallocate(mr, p, 1000, 0) == RANKMEM_SUCCESS;
        rankmem_resource_release(mr);
        ok(served && c->allocs > before && c->outstanding_bytes == 0 && up->refcount == 1,
           "  memory came from the given upstream and went back; released, upstream kept");
    }
    mr = NULL;
    rankmem_status_t st = rankmem_resource_from_spec_upstream("system", up, &mr);
    ok(st == RANKMEM_SUCCESS && mr == up && up->refcount == 2,
       "a spec that is only a leaf gives the upstream itself, one more reference");
    if (st == RANKMEM_SUCCESS)
        rankmem_resource_release(mr);

    /* N% is of what the upstream can hold: a limit's bytes, a bounded pool's
     * maximum, else (host upstream) physical host memory. */
    rankmem_resource_t *lim = NULL, *bounded = NULL;
    size_t v = 0;
    st = rankmem_limit_create(up, 1 << 20, &lim);
    if (st == RANKMEM_SUCCESS &&
        rankmem_resource_from_spec_upstream("limit(bytes=50%)", lim, &mr) == RANKMEM_SUCCESS) {
        rankmem_resource_query(mr, RANKMEM_QUERY_LIMIT, &v);
        rankmem_resource_release(mr);
    }
    ok(v == 512 << 10, "50%% over a 1 MiB limit: %zu bytes", v);
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.maximum_size = 64 << 20;
    v = 0;
    if (rankmem_pool_create(up, &prm, &bounded) == RANKMEM_SUCCESS &&
        rankmem_resource_from_spec_upstream("pool(max=25%)>stats", bounded, &mr) ==
            RANKMEM_SUCCESS) {
        rankmem_resource_query(mr, RANKMEM_QUERY_POOL_MAX, &v);
        rankmem_resource_release(mr);
    }
    ok(v == 16 << 20, "25%% over a pool of at most 64 MiB: %zu bytes", v);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    v = 0;
    if (rankmem_resource_from_spec_upstream("limit(bytes=12.5%)", up, &mr) == RANKMEM_SUCCESS) {
        rankmem_resource_query(mr, RANKMEM_QUERY_LIMIT, &v);
        rankmem_resource_release(mr);
    }
    ok(v == (size_t)pages * (size_t)page / 8, "12.5%% over a host upstream: of host memory (%zu)",
       v);
    if (lim)
        rankmem_resource_release(lim);
    if (bounded)
        rankmem_resource_release(bounded);
    ok(up->refcount == 1 && c->outstanding_bytes == 0, "the upstream holds only our reference");
    rankmem_resource_release(up);
    ok(fin, "and is gone with it");
}

/* ---- the size and boolean parsers ---- */

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
#define TiB ((size_t)1 << 40)

static void test_sizes(void)
{
    static const struct {
        const char *text;
        size_t base, want;
        const char *why; /* NULL: parses to want */
    } t[] = {
        {"0", 0, 0, NULL},
        {"1", 0, 1, NULL},
        {"4096", 0, 4096, NULL},
        {"1K", 0, KiB, NULL},
        {"1k", 0, KiB, NULL},
        {"1KB", 0, KiB, NULL},
        {"1kib", 0, KiB, NULL},
        {"1KiB", 0, KiB, NULL},
        {"2M", 0, 2 * MiB, NULL},
        {"3mb", 0, 3 * MiB, NULL},
        {"4MiB", 0, 4 * MiB, NULL},
        {"1G", 0, GiB, NULL},
        {"1GB", 0, GiB, NULL},
        {"1GiB", 0, GiB, NULL},
        {"1T", 0, TiB, NULL},
        {"1tb", 0, TiB, NULL},
        {"1TiB", 0, TiB, NULL},
        {"100B", 0, 100, NULL},
        {"1.5GiB", 0, 3 * GiB / 2, NULL},
        {"0.5K", 0, 512, NULL},
        {".5K", 0, 512, NULL},
        {"1.5", 0, 1, NULL}, /* fractions of a byte round down */
        {"0.1KiB", 0, 102, NULL},
        {"2^0", 0, 1, NULL},
        {"2^10", 0, 1024, NULL},
        {"2^63", 0, (size_t)1 << 63, NULL},
        {"12 MiB", 0, 12 * MiB, NULL},
        {"  7  ", 0, 7, NULL},
        {"18446744073709551615", 0, SIZE_MAX, NULL},
        {"16777215T", 0, 16777215 * TiB, NULL},
        {"10%", 1000, 100, NULL},
        {"12.5%", 1000, 125, NULL},
        {"100%", 1000, 1000, NULL},
        {"0%", 1000, 0, NULL},
        {"50%", SIZE_MAX, SIZE_MAX / 2, NULL},
        {"2^64", 0, 0, "too large"},
        {"2^100000000000000000000", 0, 0, "too large"},
        {"18446744073709551616", 0, 0, "too large"},
        {"99999999999999999999999K", 0, 0, "too large"},
        {"16777216T", 0, 0, "too large"},
        {"17179869184GiB", 0, 0, "too large"},
        {"10%", 0, 0, "% not allowed here"},
        {"101%", 1000, 0, "more than 100%"},
        {"100.5%", 1000, 0, "more than 100%"},
        {"-1", 0, 0, "negative"},
        {"-0", 0, 0, "negative"},
        {"", 0, 0, "empty"},
        {"   ", 0, 0, "empty"},
        {"abc", 0, 0, "not a number"},
        {"+5", 0, 0, "not a number"},
        {".", 0, 0, "not a number"},
        {"K", 0, 0, "not a number"},
        {"1X", 0, 0, "unknown unit (expected K, M, G, T, KB..TB, KiB..TiB or %)"},
        {"1e9", 0, 0, "unknown unit (expected K, M, G, T, KB..TB, KiB..TiB or %)"},
        {"1 KiB B", 0, 0, "unknown unit (expected K, M, G, T, KB..TB, KiB..TiB or %)"},
        {"1..5", 0, 0, "unknown unit (expected K, M, G, T, KB..TB, KiB..TiB or %)"},
        {"1PiB", 0, 0, "unknown unit (expected K, M, G, T, KB..TB, KiB..TiB or %)"},
        {"3^4", 0, 0, "only 2^N is allowed as a power"},
        {"2^", 0, 0, "expected an exponent after '^'"},
        {"2^10K", 0, 0, "unexpected text after 2^N"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        size_t v = 12345;
        rankmem_status_t st = rankmem_parse_size(t[i].text, t[i].base, &v);
        if (!t[i].why) {
            if (!ok(st == RANKMEM_SUCCESS && v == t[i].want, "size '%s' (%% of %zu) = %zu",
                    t[i].text, t[i].base, t[i].want))
                diag("  got %s, %zu: %s", rankmem_status_string(st), v, rankmem_last_error());
        } else {
            char want[256];
            snprintf(want, sizeof want, CFG "bad size '%s': %s", t[i].text, t[i].why);
            if (!ok(st == RANKMEM_ERR_CONFIG && v == 12345 &&
                        strcmp(rankmem_last_error(), want) == 0,
                    "size '%s': %s", t[i].text, t[i].why))
                diag("  got %s: %s", rankmem_status_string(st), rankmem_last_error());
        }
    }
    size_t v;
    is_status(rankmem_parse_size(NULL, 0, &v), RANKMEM_ERR_INVALID_ARGUMENT, "size: NULL text");
    is_status(rankmem_parse_size("1", 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "size: NULL output");
}

static void test_bools(void)
{
    static const struct {
        const char *text;
        int want; /* -1: bad */
    } t[] = {
        {"1", 1},     {"0", 0},      {"on", 1},     {"OFF", 0},  {"Yes", 1},    {"no", 0},
        {"TRUE", 1},  {"false", 0},  {" true ", 1}, {"2", -1},   {"", -1},      {"maybe", -1},
        {"onn", -1},  {"y", -1},     {"01", -1},    {"true1", -1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int v = 7;
        rankmem_status_t st = rankmem_parse_bool(t[i].text, &v);
        if (t[i].want >= 0)
            ok(st == RANKMEM_SUCCESS && v == t[i].want, "bool '%s' = %d", t[i].text, t[i].want);
        else
            ok(st == RANKMEM_ERR_CONFIG && v == 7 &&
                   strstr(rankmem_last_error(), "expected 1/0, on/off, yes/no or true/false"),
               "bool '%s' is bad: %s", t[i].text, rankmem_last_error());
    }
    int v;
    is_status(rankmem_parse_bool(NULL, &v), RANKMEM_ERR_INVALID_ARGUMENT, "bool: NULL text");
    is_status(rankmem_parse_bool("1", NULL), RANKMEM_ERR_INVALID_ARGUMENT, "bool: NULL output");
}

int main(void)
{
    int ndev = 0;
    rankmem_device_count(&ndev);
    test_good();
    test_bad();
    test_percent();
    test_effects();
    test_long_chain();
    test_logging();
    test_device_leaves(ndev);
    test_describe_api();
    test_from_spec_args();
    test_from_spec_upstream();
    test_sizes();
    test_bools();
    return tap_done();
}
