/* Spec strings: "stats>pool(initial=2GiB,max=90%)>async" to a resource chain.
 *
 *   chain := node ('>' node)*
 *   node  := name [ '(' [ opt (',' opt)* ] ')' ]
 *   opt   := key '=' value         value: bare text up to , ) > ( or a "quoted" string
 *
 * Whitespace may surround every token. Each node is the upstream of the one
 * before it, so a chain reads from what the user calls (left) to where the
 * memory comes from (right).
 *
 * Everything is parsed and checked before anything is built, so a typo at
 * the end of a spec does not cost a device pool made and destroyed. Then the
 * chain is built from the leaf leftwards; each constructor retains its
 * upstream, and the builder drops its own reference right after, so the
 * result holds exactly one reference per node and a failure half-way
 * releases everything built so far.
 *
 * Errors are RANKMEM_ERR_CONFIG "at <column>: <what was expected>", with
 * the closest known name (edit distance <= 2) for a misspelt resource or
 * option. Adding a resource is one entry in `kinds` below. */
#define _GNU_SOURCE
#include "config_internal.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if HAVE_GPU
#include "gpu_api.h"
#endif

#define MAX_NODES 64 /* no sane chain is longer; bounds the work per spec */
#define MAX_OPTS 8

typedef enum { V_SIZE, V_BOOL, V_ENUM, V_STRING } vtype_t;

typedef struct {
    const char *key;
    vtype_t type;
    int required;
    const char *def;     /* documents the default; builders leave the API's own in place */
    const char *choices; /* V_ENUM: "a|b|c"; the value is the index of the word */
} spec_opt_t;

typedef struct {
    int set;
    size_t kpos, vpos;  /* 1-based columns of the key and of the value */
    const char *text;   /* raw value, not NUL-terminated */
    size_t len;
    size_t size;        /* V_SIZE */
    int num;            /* V_BOOL: 0/1, V_ENUM: index */
    char *str;          /* V_STRING: NUL-terminated copy (freed by the parser) */
} spec_val_t;

typedef struct spec_node spec_node_t;
typedef struct parser parser_t;

typedef enum { LEAF, WRAPPER, NOT_FROM_SPEC } role_t;

typedef struct {
    const char *name;
    role_t role;
    int device; /* a leaf whose memory is the GPU's: % is of device memory */
    const char *why_not; /* NOT_FROM_SPEC: why */
    spec_opt_t opts[MAX_OPTS];
    /* Checks across options, after the values are parsed (may be NULL). */
    rankmem_status_t (*check)(parser_t *p, const spec_node_t *n);
    rankmem_status_t (*build)(const spec_node_t *n, rankmem_resource_t *up,
                              rankmem_resource_t **mr_p);
} spec_kind_t;

struct spec_node {
    const spec_kind_t *kind;
    size_t pos; /* column of the name */
    spec_val_t vals[MAX_OPTS];
};

static const spec_val_t *val(const spec_node_t *n, const char *key)
{
    for (int k = 0; k < MAX_OPTS && n->kind->opts[k].key; k++)
        if (strcmp(n->kind->opts[k].key, key) == 0)
            return &n->vals[k];
    return NULL; /* a builder asking for a key its table lacks: caught by the tests */
}

/* ---- builders ---- */

static rankmem_status_t build_system(const spec_node_t *n, rankmem_resource_t *up,
                                     rankmem_resource_t **mr_p)
{
    (void)n;
    (void)up;
    return rankmem_system_create(mr_p);
}

static rankmem_status_t build_cuda(const spec_node_t *n, rankmem_resource_t *up,
                                   rankmem_resource_t **mr_p)
{
    (void)n;
    (void)up;
    return rankmem_cuda_create(mr_p);
}

static rankmem_status_t build_managed(const spec_node_t *n, rankmem_resource_t *up,
                                      rankmem_resource_t **mr_p)
{
    (void)n;
    (void)up;
    return rankmem_managed_create(mr_p);
}

static rankmem_status_t build_pinned(const spec_node_t *n, rankmem_resource_t *up,
                                     rankmem_resource_t **mr_p)
{
    (void)n;
    (void)up;
    return rankmem_pinned_create(mr_p);
}

/* In the order of async.export's choices. */
static const int export_types[] = {RANKMEM_HANDLE_NONE, RANKMEM_HANDLE_POSIX_FD,
                                   RANKMEM_HANDLE_FABRIC,
                                   RANKMEM_HANDLE_POSIX_FD | RANKMEM_HANDLE_FABRIC};

static rankmem_status_t build_async(const spec_node_t *n, rankmem_resource_t *up,
                                    rankmem_resource_t **mr_p)
{
    (void)up;
    rankmem_async_params_t prm;
    rankmem_async_params_default(&prm);
    const spec_val_t *v;
    if ((v = val(n, "default"))->set)
        prm.use_default_pool = v->num;
    if ((v = val(n, "initial"))->set)
        prm.initial_pool_size = v->size;
    if ((v = val(n, "release"))->set)
        prm.release_threshold = v->size;
    if ((v = val(n, "export"))->set)
        prm.handle_type = export_types[v->num];
    if ((v = val(n, "reuse_events"))->set)
        prm.reuse_follow_event_dependencies = v->num;
    if ((v = val(n, "reuse_opportunistic"))->set)
        prm.reuse_allow_opportunistic = v->num;
    if ((v = val(n, "reuse_internal"))->set)
        prm.reuse_allow_internal_dependencies = v->num;
    return rankmem_async_create(&prm, mr_p);
}

static rankmem_status_t build_pool(const spec_node_t *n, rankmem_resource_t *up,
                                   rankmem_resource_t **mr_p)
{
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    const spec_val_t *v;
    if ((v = val(n, "initial"))->set)
        prm.initial_size = v->size;
    if ((v = val(n, "max"))->set)
        prm.maximum_size = v->size;
    if ((v = val(n, "growth"))->set)
        prm.growth_size = v->size;
    return rankmem_pool_create(up, &prm, mr_p);
}

static rankmem_status_t build_stats(const spec_node_t *n, rankmem_resource_t *up,
                                    rankmem_resource_t **mr_p)
{
    (void)n;
    return rankmem_stats_create(up, mr_p);
}

static rankmem_status_t build_tracking(const spec_node_t *n, rankmem_resource_t *up,
                                       rankmem_resource_t **mr_p)
{
    const spec_val_t *v = val(n, "backtraces");
    return rankmem_tracking_create(up, v->set ? v->num : 0, mr_p);
}

static rankmem_status_t build_logging(const spec_node_t *n, rankmem_resource_t *up,
                                      rankmem_resource_t **mr_p)
{
    const spec_val_t *v = val(n, "file");
    /* No file: the adaptor falls back on RANKMEM_LOG_FILE. */
    return rankmem_logging_create(up, v->set ? v->str : NULL, mr_p);
}

static rankmem_status_t build_limit(const spec_node_t *n, rankmem_resource_t *up,
                                    rankmem_resource_t **mr_p)
{
    return rankmem_limit_create(up, val(n, "bytes")->size, mr_p);
}

static rankmem_status_t build_aligned(const spec_node_t *n, rankmem_resource_t *up,
                                      rankmem_resource_t **mr_p)
{
    const spec_val_t *t = val(n, "threshold");
    return rankmem_aligned_create(up, val(n, "alignment")->size, t->set ? t->size : 0, mr_p);
}

static rankmem_status_t build_retry(const spec_node_t *n, rankmem_resource_t *up,
                                    rankmem_resource_t **mr_p)
{
    (void)n;
    return rankmem_retry_create(up, NULL, NULL, mr_p); /* default: trim the chain, retry once */
}

static rankmem_status_t build_threadsafe(const spec_node_t *n, rankmem_resource_t *up,
                                         rankmem_resource_t **mr_p)
{
    (void)n;
    return rankmem_threadsafe_create(up, mr_p);
}

static rankmem_status_t build_prefetch(const spec_node_t *n, rankmem_resource_t *up,
                                       rankmem_resource_t **mr_p)
{
    (void)n;
    return rankmem_prefetch_create(up, mr_p);
}

static rankmem_status_t check_async(parser_t *p, const spec_node_t *n);
static rankmem_status_t build_fixed(const spec_node_t *n, rankmem_resource_t *up,
                                    rankmem_resource_t **mr_p)
{
    const spec_val_t *b = val(n, "batch");
    return rankmem_fixed_create(up, val(n, "block")->size, b->set ? b->size : 0, mr_p);
}

/* log2 of a power of two (checked by check_binning). */
static int log2_exact(size_t v)
{
    int e = 0;
    while (v > 1) {
        v >>= 1;
        e++;
    }
    return e;
}

static rankmem_status_t build_binning(const spec_node_t *n, rankmem_resource_t *up,
                                      rankmem_resource_t **mr_p)
{
    const spec_val_t *lo = val(n, "min"), *hi = val(n, "max");
    return rankmem_binning_create(up, lo->set ? log2_exact(lo->size) : 8,
                                  hi->set ? log2_exact(hi->size) : 22, mr_p);
}

static rankmem_status_t build_caching(const spec_node_t *n, rankmem_resource_t *up,
                                      rankmem_resource_t **mr_p)
{
    rankmem_caching_params_t prm;
    rankmem_caching_params_default(&prm);
    const spec_val_t *v;
    if ((v = val(n, "growth"))->set)
        prm.growth = (unsigned)v->size;
    if ((v = val(n, "min"))->set)
        prm.min_bin = (unsigned)v->size;
    if ((v = val(n, "max"))->set)
        prm.max_bin = (unsigned)v->size;
    if ((v = val(n, "cap"))->set)
        prm.max_cached_bytes = v->size;
    return rankmem_caching_create(up, &prm, mr_p);
}

static rankmem_status_t build_arena(const spec_node_t *n, rankmem_resource_t *up,
                                    rankmem_resource_t **mr_p)
{
    rankmem_arena_params_t prm;
    rankmem_arena_params_default(&prm);
    const spec_val_t *v;
    if ((v = val(n, "size"))->set)
        prm.arena_size = v->size;
    if ((v = val(n, "superblock"))->set)
        prm.superblock_size = v->size;
    if ((v = val(n, "dump"))->set)
        prm.dump_on_failure = v->num;
    return rankmem_arena_create(up, &prm, mr_p);
}

/* issue 10: system memory with GPU headroom, stream-ordered managed pools. */
static rankmem_status_t build_sam_headroom(const spec_node_t *n, rankmem_resource_t *up,
                                           rankmem_resource_t **mr_p)
{
    (void)up;
    return rankmem_sam_headroom_create(val(n, "headroom")->size, mr_p);
}

/* In the order of async_managed.prefer's choices. */
static const int prefer_locations[] = {RANKMEM_MANAGED_PREFER_DEVICE, RANKMEM_MANAGED_PREFER_HOST,
                                       RANKMEM_MANAGED_PREFER_NONE};

static rankmem_status_t build_async_managed(const spec_node_t *n, rankmem_resource_t *up,
                                            rankmem_resource_t **mr_p)
{
    (void)up;
    rankmem_async_managed_params_t prm;
    rankmem_async_managed_params_default(&prm);
    const spec_val_t *v;
    if ((v = val(n, "initial"))->set)
        prm.initial_pool_size = v->size;
    if ((v = val(n, "release"))->set)
        prm.release_threshold = v->size;
    if ((v = val(n, "prefer"))->set)
        prm.preferred_location = prefer_locations[v->num];
    return rankmem_async_managed_create(&prm, mr_p);
}

/* issue 21: the pool over the virtual memory API. */
static rankmem_status_t build_vmm(const spec_node_t *n, rankmem_resource_t *up,
                                  rankmem_resource_t **mr_p)
{
    (void)up;
    rankmem_vmm_params_t prm;
    rankmem_vmm_params_default(&prm);
    const spec_val_t *v;
    if ((v = val(n, "reserve"))->set)
        prm.reserve = v->size;
    if ((v = val(n, "max"))->set)
        prm.maximum = v->size;
    if ((v = val(n, "release"))->set)
        prm.release = v->size;
    if ((v = val(n, "granule"))->set)
        prm.granule = v->size;
    if ((v = val(n, "backend"))->set)
        prm.backend = v->num ? RANKMEM_VMM_BACKEND_HOST : RANKMEM_VMM_BACKEND_DEVICE;
    if ((v = val(n, "handle"))->set)
        prm.handle = v->size;
    return rankmem_vmm_create(&prm, mr_p);
}

/* The fault injector (a test tool). fault.status's choices, in order. */
static const rankmem_status_t fault_statuses[] = {
    RANKMEM_ERR_OUT_OF_MEMORY, RANKMEM_ERR_LIMIT,        RANKMEM_ERR_DEVICE,
    RANKMEM_ERR_NOT_SUPPORTED, RANKMEM_ERR_NO_DEVICE,    RANKMEM_ERR_WRONG_DEVICE,
    RANKMEM_ERR_INVALID_ARGUMENT, RANKMEM_ERR_INTERNAL};

/* A probability: "0.01", "1e-3" or "1%", from 0 to 1. 0 and *why_p on failure. */
static int parse_rate(const char *text, double *rate_p, const char **why_p)
{
    /* Plain decimals only: strtod would also take "nan", "inf" and hex. */
    if (!(isdigit((unsigned char)text[0]) || text[0] == '.')) {
        *why_p = "not a number";
        return 0;
    }
    char *end;
    double r = strtod(text, &end);
    if (end == text) {
        *why_p = "not a number";
        return 0;
    }
    if (*end == '%') {
        r /= 100;
        end++;
    }
    if (*end) {
        *why_p = "trailing characters (a decimal such as 0.01, or a percentage such as 1%)";
        return 0;
    }
    if (!(r >= 0 && r <= 1)) {
        *why_p = "not a probability from 0 to 1";
        return 0;
    }
    *rate_p = r;
    return 1;
}

static rankmem_status_t build_fault(const spec_node_t *n, rankmem_resource_t *up,
                                    rankmem_resource_t **mr_p)
{
    rankmem_fault_params_t prm;
    rankmem_fault_params_default(&prm);
    const spec_val_t *v;
    const char *why;
    if ((v = val(n, "nth"))->set)
        prm.nth = v->size;
    if ((v = val(n, "count"))->set)
        prm.count = v->size;
    if ((v = val(n, "every"))->set)
        prm.every = v->size;
    if ((v = val(n, "rate"))->set)
        (void)parse_rate(v->str, &prm.rate, &why); /* checked by check_fault */
    if ((v = val(n, "seed"))->set)
        prm.seed = v->size;
    if ((v = val(n, "status"))->set)
        prm.status = fault_statuses[v->num];
    if ((v = val(n, "enabled"))->set)
        prm.enabled = v->num;
    return rankmem_fault_create(up, &prm, mr_p);
}

static rankmem_status_t check_vmm(parser_t *p, const spec_node_t *n);
static rankmem_status_t check_fault(parser_t *p, const spec_node_t *n);
static rankmem_status_t check_pool(parser_t *p, const spec_node_t *n);
static rankmem_status_t check_binning(parser_t *p, const spec_node_t *n);
static rankmem_status_t check_caching(parser_t *p, const spec_node_t *n);
static rankmem_status_t check_limit(parser_t *p, const spec_node_t *n);
static rankmem_status_t check_aligned(parser_t *p, const spec_node_t *n);
static rankmem_status_t check_fixed(parser_t *p, const spec_node_t *n);
static rankmem_status_t check_arena(parser_t *p, const spec_node_t *n);

/* Every resource and adaptor the grammar knows. Later suballocators (arena,
 * binning, fixed, caching) are one entry each. */
static const spec_kind_t kinds[] = {
    {"system", LEAF, 0, NULL, {{0}}, NULL, build_system},
    {"cuda", LEAF, 1, NULL, {{0}}, NULL, build_cuda},
    {"managed", LEAF, 1, NULL, {{0}}, NULL, build_managed},
    {"pinned", LEAF, 0, NULL, {{0}}, NULL, build_pinned},
    {"async", LEAF, 1, NULL,
     {{"default", V_BOOL, 0, "0", NULL},
      {"initial", V_SIZE, 0, "0", NULL},
      {"release", V_SIZE, 0, "unbounded", NULL},
      {"export", V_ENUM, 0, "none", "none|posix_fd|fabric|posix_fd+fabric"},
      {"reuse_events", V_BOOL, 0, "(runtime default)", NULL},
      {"reuse_opportunistic", V_BOOL, 0, "(runtime default)", NULL},
      {"reuse_internal", V_BOOL, 0, "(runtime default)", NULL}},
     check_async, build_async},
    {"async_view", NOT_FROM_SPEC, 1,
     "it wraps an existing cudaMemPool_t handle (use rankmem_async_view_create)", {{0}}, NULL,
     NULL},
    {"callback", NOT_FROM_SPEC, 0, "it needs two functions (use rankmem_callback_create)",
     {{0}}, NULL, NULL},
    {"pool", WRAPPER, 0, NULL,
     {{"initial", V_SIZE, 0, "0", NULL},
      {"max", V_SIZE, 0, "unbounded", NULL},
      {"growth", V_SIZE, 0, "0 (a sixteenth of what is held)", NULL}},
     check_pool, build_pool},
    {"stats", WRAPPER, 0, NULL, {{0}}, NULL, build_stats},
    {"tracking", WRAPPER, 0, NULL, {{"backtraces", V_BOOL, 0, "0", NULL}}, NULL, build_tracking},
    {"logging", WRAPPER, 0, NULL, {{"file", V_STRING, 0, "$RANKMEM_LOG_FILE", NULL}}, NULL,
     build_logging},
    {"limit", WRAPPER, 0, NULL, {{"bytes", V_SIZE, 1, NULL, NULL}}, check_limit, build_limit},
    {"aligned", WRAPPER, 0, NULL,
     {{"alignment", V_SIZE, 1, NULL, NULL}, {"threshold", V_SIZE, 0, "0", NULL}}, check_aligned,
     build_aligned},
    {"retry", WRAPPER, 0, NULL, {{0}}, NULL, build_retry},
    {"threadsafe", WRAPPER, 0, NULL, {{0}}, NULL, build_threadsafe},
    {"prefetch", WRAPPER, 0, NULL, {{0}}, NULL, build_prefetch},
    {"fixed", WRAPPER, 0, NULL,
     {{"block", V_SIZE, 1, NULL, NULL}, {"batch", V_SIZE, 0, "0 (enough for 2 MiB)", NULL}},
     check_fixed, build_fixed},
    {"binning", WRAPPER, 0, NULL,
     {{"min", V_SIZE, 0, "2^8", NULL}, {"max", V_SIZE, 0, "2^22", NULL}}, check_binning,
     build_binning},
    {"caching", WRAPPER, 0, NULL,
     {{"growth", V_SIZE, 0, "8", NULL},
      {"min", V_SIZE, 0, "3", NULL},
      {"max", V_SIZE, 0, "7", NULL},
      {"cap", V_SIZE, 0, "6291455 (CUB's 6 MiB - 1)", NULL}},
     check_caching, build_caching},
    {"arena", WRAPPER, 0, NULL,
     {{"size", V_SIZE, 0, "half of the free device memory", NULL},
      {"superblock", V_SIZE, 0, "4MiB", NULL},
      {"dump", V_BOOL, 0, "0", NULL}},
     check_arena, build_arena},
    /* issue 10 */
    {"sam_headroom", LEAF, 1, NULL, {{"headroom", V_SIZE, 1, NULL, NULL}}, NULL,
     build_sam_headroom},
    {"async_managed", LEAF, 1, NULL,
     {{"initial", V_SIZE, 0, "0", NULL},
      {"release", V_SIZE, 0, "unbounded", NULL},
      {"prefer", V_ENUM, 0, "device", "device|host|none"}},
     NULL, build_async_managed},
    /* issue 31: the fault injector, for tests */
    {"fault", WRAPPER, 0, NULL,
     {{"nth", V_SIZE, 0, "0 (none)", NULL},
      {"count", V_SIZE, 0, "1", NULL},
      {"every", V_SIZE, 0, "0 (none)", NULL},
      {"rate", V_STRING, 0, "0", NULL},
      {"seed", V_SIZE, 0, "0", NULL},
      {"status", V_ENUM, 0, "out_of_memory",
       "out_of_memory|limit|device|not_supported|no_device|wrong_device|invalid_argument|"
       "internal"},
      {"enabled", V_BOOL, 0, "1", NULL}},
     check_fault, build_fault},
    /* issue 21 */
    {"vmm", LEAF, 1, NULL,
     {{"reserve", V_SIZE, 0, "twice the device memory (host: 64GiB)", NULL},
      {"max", V_SIZE, 0, "unbounded", NULL},
      {"release", V_SIZE, 0, "0", NULL},
      {"granule", V_SIZE, 0, "the device's (host: 2MiB)", NULL},
      {"backend", V_ENUM, 0, "device", "device|host"},
      {"handle", V_SIZE, 0, "one granule", NULL}},
     check_vmm, build_vmm},
};

#define NKINDS (sizeof kinds / sizeof kinds[0])

/* ---- the parser ---- */

struct parser {
    const char *s;
    size_t i, n;
    const char *origin;
    spec_node_t nodes[MAX_NODES];
    size_t nnodes;
    size_t percent_base; /* found on first use of % */
    int percent_known;
    /* Checking only (RANKMEM_RESOURCE when it is read): % is checked for its
     * syntax against a stand-in base, so that no CUDA context is made on
     * whatever device is current before the MPI plugin has bound the rank. */
    int check_only;
    /* rankmem_resource_from_spec_upstream: the caller's upstream, which ends
     * the chain (a wrapper may come last) and is what N% is of. */
    rankmem_resource_t *over;
};

/* Record "origin: at col: message" as a RANKMEM_ERR_CONFIG. */
RK_PRINTF(3, 4)
static rankmem_status_t fail(parser_t *p, size_t col, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rk_error(RANKMEM_ERR_CONFIG, "%s%sat %zu: %s", p->origin ? p->origin : "",
                    p->origin ? ": " : "", col, msg);
}

static void skip_ws(parser_t *p)
{
    while (p->i < p->n && isspace((unsigned char)p->s[p->i]))
        p->i++;
}

static int ident_start(char c) { return isalpha((unsigned char)c) || c == '_'; }
static int ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* What is at the cursor, for "found ..." in messages. */
static const char *found(parser_t *p, char *buf, size_t cap)
{
    if (p->i >= p->n)
        return "the end";
    char q[256];
    size_t len = 1;
    if (ident_char(p->s[p->i]))
        while (p->i + len < p->n && ident_char(p->s[p->i + len]))
            len++;
    snprintf(buf, cap, "'%s'", rk_quote(q, sizeof q, p->s + p->i, len));
    return buf;
}

/* " (did you mean 'x'?)" for the closest of names (distance <= 2), or "". */
static const char *suggest(char *buf, size_t cap, const char *word, size_t len,
                           const char *const *names, size_t count)
{
    size_t best = count, best_d = 3;
    for (size_t k = 0; k < count; k++) {
        size_t d = rk_edit_distance(word, len, names[k], 2);
        if (d < best_d) {
            best_d = d;
            best = k;
        }
    }
    if (best == count)
        return "";
    snprintf(buf, cap, " (did you mean '%s'?)", names[best]);
    return buf;
}

static rankmem_status_t parse_options(parser_t *p, spec_node_t *node)
{
    const spec_kind_t *k = node->kind;
    size_t open = p->i + 1;
    char f[300], q[256], s[200];
    p->i++; /* '(' */
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == ')') {
        p->i++;
        return RANKMEM_SUCCESS;
    }
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n)
            return fail(p, p->i + 1, "missing ')' to close the options of %s opened at %zu",
                        k->name, open);
        if (!ident_start(p->s[p->i]))
            return fail(p, p->i + 1, "expected an option name for %s, found %s", k->name,
                        found(p, f, sizeof f));
        size_t kpos = p->i + 1, start = p->i;
        while (p->i < p->n && ident_char(p->s[p->i]))
            p->i++;
        const char *key = p->s + start;
        size_t klen = p->i - start;
        int idx = -1;
        const char *names[MAX_OPTS];
        size_t nnames = 0;
        for (int o = 0; o < MAX_OPTS && k->opts[o].key; o++) {
            names[nnames++] = k->opts[o].key;
            if (strlen(k->opts[o].key) == klen && memcmp(k->opts[o].key, key, klen) == 0)
                idx = o;
        }
        if (idx < 0) {
            if (nnames == 0)
                return fail(p, kpos, "unknown option '%s' for %s (%s takes no options)",
                            rk_quote(q, sizeof q, key, klen), k->name, k->name);
            const char *sug = suggest(s, sizeof s, key, klen, names, nnames);
            if (!sug[0]) { /* nothing close: say what there is */
                size_t o = 0;
                for (size_t j = 0; j < nnames && o < sizeof s; j++)
                    o += (size_t)snprintf(s + o, sizeof s - o, "%s%s",
                                          j == 0 ? " (it takes " : j + 1 == nnames ? " or " : ", ",
                                          names[j]);
                if (o < sizeof s)
                    snprintf(s + o, sizeof s - o, ")");
                sug = s;
            }
            return fail(p, kpos, "unknown option '%s' for %s%s", rk_quote(q, sizeof q, key, klen),
                        k->name, sug);
        }
        spec_val_t *v = &node->vals[idx];
        if (v->set)
            return fail(p, kpos, "duplicate option '%s' for %s (first at %zu)", k->opts[idx].key,
                        k->name, v->kpos);
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != '=')
            return fail(p, p->i + 1, "expected '=' after %s.%s, found %s", k->name,
                        k->opts[idx].key, found(p, f, sizeof f));
        p->i++;
        skip_ws(p);
        v->set = 1;
        v->kpos = kpos;
        v->vpos = p->i + 1;
        if (p->i < p->n && p->s[p->i] == '"') {
            /* Quoted: for paths holding , ) > ( (no escapes; no '"' inside). */
            const char *close = memchr(p->s + p->i + 1, '"', p->n - p->i - 1);
            if (!close)
                return fail(p, p->i + 1, "missing closing '\"' for the value of %s.%s", k->name,
                            k->opts[idx].key);
            v->text = p->s + p->i + 1;
            v->len = (size_t)(close - v->text);
            v->vpos++;
            p->i = (size_t)(close - p->s) + 1;
        } else {
            size_t vstart = p->i;
            while (p->i < p->n && !strchr(",)>(\"", p->s[p->i]))
                p->i++;
            size_t vlen = p->i - vstart;
            while (vlen && isspace((unsigned char)p->s[vstart + vlen - 1]))
                vlen--;
            if (vlen == 0)
                return fail(p, vstart + 1, "missing value for %s.%s, found %s", k->name,
                            k->opts[idx].key, found(p, f, sizeof f));
            v->text = p->s + vstart;
            v->len = vlen;
        }
        skip_ws(p);
        if (p->i >= p->n)
            return fail(p, p->i + 1, "missing ')' to close the options of %s opened at %zu",
                        k->name, open);
        if (p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->s[p->i] == ')') {
            p->i++;
            return RANKMEM_SUCCESS;
        }
        return fail(p, p->i + 1, "expected ',' or ')' after %s.%s=%s, found %s", k->name,
                    k->opts[idx].key, rk_quote(q, sizeof q, v->text, v->len),
                    found(p, f, sizeof f));
    }
}

static rankmem_status_t parse_chain(parser_t *p)
{
    char f[300], q[256], s[80];
    skip_ws(p);
    if (p->i >= p->n)
        return fail(p, p->i + 1, "empty spec: expected a resource name (e.g. pool>cuda)");
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n || !ident_start(p->s[p->i]))
            return fail(p, p->i + 1, "expected a resource name%s, found %s",
                        p->nnodes ? " after '>'" : "", found(p, f, sizeof f));
        if (p->nnodes == MAX_NODES)
            return fail(p, p->i + 1, "chain too long (more than %d resources)", MAX_NODES);
        size_t pos = p->i + 1, start = p->i;
        while (p->i < p->n && ident_char(p->s[p->i]))
            p->i++;
        const char *name = p->s + start;
        size_t len = p->i - start;
        const spec_kind_t *k = NULL;
        const char *names[NKINDS];
        for (size_t j = 0; j < NKINDS; j++) {
            names[j] = kinds[j].name;
            if (strlen(kinds[j].name) == len && memcmp(kinds[j].name, name, len) == 0)
                k = &kinds[j];
        }
        if (!k)
            return fail(p, pos, "unknown resource '%s'%s", rk_quote(q, sizeof q, name, len),
                        suggest(s, sizeof s, name, len, names, NKINDS));
        if (k->role == NOT_FROM_SPEC)
            return fail(p, pos, "'%s' cannot be built from a spec: %s", k->name, k->why_not);
        spec_node_t *node = &p->nodes[p->nnodes++];
        node->kind = k;
        node->pos = pos;
        skip_ws(p);
        int had_opts = 0;
        if (p->i < p->n && p->s[p->i] == '(') {
            rankmem_status_t st = parse_options(p, node);
            if (st != RANKMEM_SUCCESS)
                return st;
            had_opts = 1;
            skip_ws(p);
        }
        if (p->i >= p->n) {
            if (k->role == WRAPPER && !p->over)
                return fail(p, pos, "'%s' needs an upstream after it (e.g. %s>cuda)", k->name,
                            k->name);
            return RANKMEM_SUCCESS;
        }
        if (p->s[p->i] != '>')
            return fail(p, p->i + 1, "expected %s'>' or the end after %s, found %s",
                        had_opts ? "" : "'(', ", k->name, found(p, f, sizeof f));
        if (k->role == LEAF)
            return fail(p, p->i + 1,
                        "'%s' cannot have an upstream: it allocates memory itself, so it "
                        "ends the chain",
                        k->name);
        p->i++;
    }
}

/* ---- values ---- */

size_t rk_percent_base(int device, const char **why_p)
{
#if HAVE_GPU
    if (device && rk_gpu_count() > 0) {
        size_t free_b = 0, total = 0;
        cudaError_t err = cudaMemGetInfo(&free_b, &total);
        if (err == cudaSuccess && total)
            return total;
        (void)cudaGetLastError();
        *why_p = "cudaMemGetInfo failed on the current device";
        return 0;
    }
#else
    (void)device;
#endif
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) {
        *why_p = "the size of physical memory is unknown";
        return 0;
    }
    unsigned __int128 b = (unsigned __int128)pages * (unsigned long)page;
    return b > SIZE_MAX ? SIZE_MAX : (size_t)b;
}

static rankmem_status_t check_async(parser_t *p, const spec_node_t *n)
{
    const spec_val_t *d = val(n, "default");
    if (d->set && d->num) {
        /* The device's default pool is shared: its settings are not ours to choose. */
        static const char *const others[] = {"initial", "release", "export"};
        for (int k = 0; k < 3; k++) {
            const spec_val_t *v = val(n, others[k]);
            if (v->set)
                return fail(p, v->kpos,
                            "async.%s does not apply to the device's default pool (default=1)",
                            others[k]);
        }
    }
    return RANKMEM_SUCCESS;
}

/* Bins are powers of two from 2^8 to 2^40, smallest first. */
static rankmem_status_t check_binning(parser_t *p, const spec_node_t *n)
{
    const spec_val_t *lo = val(n, "min"), *hi = val(n, "max");
    const spec_val_t *both[2] = {lo, hi};
    for (int i = 0; i < 2; i++) {
        const spec_val_t *v = both[i];
        if (v->set && (!rk_is_pow2(v->size) || v->size < ((size_t)1 << 8) ||
                       v->size > ((size_t)1 << 40)))
            return fail(p, v->vpos, "binning.%s must be a power of two from 2^8 to 2^40, not %zu",
                        i ? "max" : "min", v->size);
    }
    size_t a = lo->set ? lo->size : (size_t)1 << 8, b = hi->set ? hi->size : (size_t)1 << 22;
    if (a > b)
        return fail(p, (lo->set ? lo : hi)->vpos, "binning.min (%zu) is above binning.max (%zu)",
                    a, b);
    return RANKMEM_SUCCESS;
}

/* Small integers: the bins are growth^min .. growth^max bytes. */
static rankmem_status_t check_caching(parser_t *p, const spec_node_t *n)
{
    const spec_val_t *g = val(n, "growth"), *lo = val(n, "min"), *hi = val(n, "max");
    if (g->set && (g->size < 2 || g->size > 1024))
        return fail(p, g->vpos, "caching.growth must be 2 to 1024, not %zu", g->size);
    if (lo->set && lo->size > 64)
        return fail(p, lo->vpos, "caching.min must be at most 64, not %zu", lo->size);
    if (hi->set && hi->size > 64)
        return fail(p, hi->vpos, "caching.max must be at most 64, not %zu", hi->size);
    size_t a = lo->set ? lo->size : 3, b = hi->set ? hi->size : 7;
    if (a > b)
        return fail(p, (lo->set ? lo : hi)->vpos, "caching.min (%zu) is above caching.max (%zu)",
                    a, b);
    /* rankmem_caching_create: the largest bin, growth^max bytes, must be a size. */
    size_t gr = g->set ? g->size : 8, bytes = 1;
    for (size_t k = 0; k < b; k++) {
        if (bytes > SIZE_MAX / gr)
            return fail(p, (hi->set ? hi : g)->vpos,
                        "caching: the largest bin, %zu^%zu bytes, is too large", gr, b);
        bytes *= gr;
    }
    return RANKMEM_SUCCESS;
}

/* The checks below refuse, already when a spec is only checked (rankmem-info
 * -c, RANKMEM_RESOURCE), what the constructors refuse or what would make a
 * chain that builds but can never allocate. The bounds are the constructors'. */

/* rankmem_limit_create: a limit of 0 refuses everything. */
static rankmem_status_t check_limit(parser_t *p, const spec_node_t *n)
{
    const spec_val_t *b = val(n, "bytes");
    if (b->set && b->size == 0)
        return fail(p, b->vpos, "limit.bytes of 0 would refuse every allocation");
    return RANKMEM_SUCCESS;
}

/* rankmem_aligned_create: a power of two from 256 to RANKMEM_MAX_ALIGNMENT
 * (above it every allocation is refused). */
static rankmem_status_t check_aligned(parser_t *p, const spec_node_t *n)
{
    const spec_val_t *a = val(n, "alignment");
    if (a->set && (!rk_is_pow2(a->size) || a->size < RANKMEM_DEFAULT_ALIGNMENT ||
                   a->size > RANKMEM_MAX_ALIGNMENT))
        return fail(p, a->vpos,
                    "aligned.alignment must be a power of two from 256 to 1GiB "
                    "(RANKMEM_MAX_ALIGNMENT), not %zu",
                    a->size);
    return RANKMEM_SUCCESS;
}

/* rankmem_fixed_create: blocks (rounded up to 256 bytes) and batches of at most 1 TiB. */
#define SPEC_FIXED_MAX_BATCH ((size_t)1 << 40)

static rankmem_status_t check_fixed(parser_t *p, const spec_node_t *n)
{
    const spec_val_t *b = val(n, "block"), *k = val(n, "batch");
    if (!b->set)
        return RANKMEM_SUCCESS;
    if (b->size == 0 || b->size > SPEC_FIXED_MAX_BATCH)
        return fail(p, b->vpos, "fixed.block must be 1 byte to 1TiB, not %zu", b->size);
    size_t bs = rk_align_up(b->size, RANKMEM_DEFAULT_ALIGNMENT);
    if (k->set && k->size > SPEC_FIXED_MAX_BATCH / bs)
        return fail(p, k->vpos, "fixed.batch of %zu blocks of %zu bytes is more than 1TiB",
                    k->size, bs);
    return RANKMEM_SUCCESS;
}

/* rankmem_arena_create: superblocks are powers of two of 64 KiB to 1 GiB, and
 * the arena holds one at least. */
static rankmem_status_t check_arena(parser_t *p, const spec_node_t *n)
{
    const spec_val_t *sb = val(n, "superblock"), *sz = val(n, "size");
    size_t b = sb->set ? sb->size : (size_t)4 << 20;
    if (sb->set && (!rk_is_pow2(b) || b < ((size_t)64 << 10) || b > ((size_t)1 << 30)))
        return fail(p, sb->vpos,
                    "arena.superblock must be a power of two from 64KiB to 1GiB, not %zu", b);
    if (p->check_only && sz->set && memchr(sz->text, '%', sz->len))
        return RANKMEM_SUCCESS; /* its bytes are known only when it is built */
    if (sz->set && sz->size && (sz->size & ~(RANKMEM_DEFAULT_ALIGNMENT - 1)) < b)
        return fail(p, sz->vpos, "arena.size of %zu bytes is less than one superblock (%zu bytes)",
                    sz->size, b);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t check_pool(parser_t *p, const spec_node_t *n)
{
    /* The pool keeps whole 256-byte units and rounds its maximum down: a
     * smaller maximum would make a pool that can never allocate. */
    const spec_val_t *m = val(n, "max");
    if (p->check_only && m->set && memchr(m->text, '%', m->len))
        return RANKMEM_SUCCESS; /* its bytes are known only when it is built */
    if (m->set && m->size && m->size < RANKMEM_DEFAULT_ALIGNMENT)
        return fail(p, m->vpos, "pool.max of %zu bytes is less than the pool's unit (%zu "
                    "bytes): it could never allocate",
                    m->size, (size_t)RANKMEM_DEFAULT_ALIGNMENT);
    /* rankmem_pool_create refuses these. */
    const spec_val_t *i = val(n, "initial");
    if (p->check_only && i->set && memchr(i->text, '%', i->len))
        return RANKMEM_SUCCESS;
    if (i->set && m->set && i->size > m->size)
        return fail(p, i->vpos, "pool.initial (%zu bytes) is above pool.max (%zu bytes)", i->size,
                    m->size);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t check_fault(parser_t *p, const spec_node_t *n)
{
    const spec_val_t *r = val(n, "rate"), *c = val(n, "count");
    double rate;
    const char *why = "";
    char q[256];
    if (r->set && !parse_rate(r->str, &rate, &why))
        return fail(p, r->vpos, "bad rate '%s' for fault.rate: %s",
                    rk_quote(q, sizeof q, r->text, r->len), why);
    if (c->set && c->size == 0)
        return fail(p, c->vpos, "fault.count of 0 would fail no call (leave out nth, every and "
                    "rate for none)");
    return RANKMEM_SUCCESS;
}

/* Granules are powers of two (the device's, or a multiple of it). */
static rankmem_status_t check_vmm(parser_t *p, const spec_node_t *n)
{
    const spec_val_t *g = val(n, "granule"), *m = val(n, "max"), *h = val(n, "handle");
    if (g->set && (!rk_is_pow2(g->size) || g->size < 4096 || g->size > RANKMEM_MAX_ALIGNMENT))
        return fail(p, g->vpos, "vmm.granule must be a power of two from 4KiB to 1GiB, not %zu",
                    g->size);
    if (h->set && (!rk_is_pow2(h->size) || h->size < 4096 || (g->set && h->size < g->size)))
        return fail(p, h->vpos,
                    "vmm.handle must be a power of two of at least the granule, not %zu",
                    h->size);
    if (p->check_only && m->set && memchr(m->text, '%', m->len))
        return RANKMEM_SUCCESS; /* its bytes are known only when it is built */
    if (m->set && m->size == 0)
        return fail(p, m->vpos, "vmm.max of 0 bytes: it could never allocate");
    /* Below one granule nothing can be mapped (the device's granule is known
     * only when it is built: 4 KiB, the least, here). */
    const spec_val_t *b = val(n, "backend");
    size_t least = g->set ? g->size : b->set && b->num == 1 ? (size_t)2 << 20 : 4096;
    if (m->set && m->size < least)
        return fail(p, m->vpos, "vmm.max of %zu bytes is less than one granule (%zu bytes): it "
                    "could never allocate", m->size, least);
    const spec_val_t *r = val(n, "reserve"); /* rankmem_vmm_create refuses this */
    if (m->set && r->set && !(p->check_only && memchr(r->text, '%', r->len)) && r->size &&
        m->size > r->size)
        return fail(p, m->vpos, "vmm.max (%zu bytes) is above vmm.reserve (%zu bytes)", m->size,
                    r->size);
    return RANKMEM_SUCCESS;
}

/* N% over a given upstream is of what it can hold: its limit or bounded
 * size when it says, else the memory its properties name. */
static size_t over_percent_base(rankmem_resource_t *up, const char **why_p)
{
    size_t v = 0;
    if (rankmem_resource_query(up, RANKMEM_QUERY_LIMIT, &v) == RANKMEM_SUCCESS && v)
        return v;
    if (rankmem_resource_query(up, RANKMEM_QUERY_POOL_MAX, &v) == RANKMEM_SUCCESS && v &&
        v != SIZE_MAX)
        return v;
    rankmem_clear_error(); /* a query it does not answer is no error here */
    unsigned props = 0;
    rankmem_resource_properties(up, &props);
    return rk_percent_base((props & RANKMEM_PROP_DEVICE_ACCESSIBLE) != 0, why_p);
}

static rankmem_status_t convert_values(parser_t *p)
{
    /* % is of the memory where the chain's leaf allocates. */
    int device = p->nodes[p->nnodes - 1].kind->device;
    char q[256];
    for (size_t j = 0; j < p->nnodes; j++) {
        spec_node_t *node = &p->nodes[j];
        const spec_kind_t *k = node->kind;
        for (int o = 0; o < MAX_OPTS && k->opts[o].key; o++) {
            const spec_opt_t *opt = &k->opts[o];
            spec_val_t *v = &node->vals[o];
            if (!v->set) {
                if (opt->required)
                    return fail(p, node->pos, "%s needs %s=<%s>", k->name, opt->key,
                                opt->type == V_SIZE ? "size" : "value");
                continue;
            }
            const char *why = "";
            switch (opt->type) {
            case V_SIZE: {
                size_t base = 0;
                if (memchr(v->text, '%', v->len)) {
                    if (!p->percent_known && p->check_only) {
                        p->percent_base = SIZE_MAX;
                        p->percent_known = 1;
                    } else if (!p->percent_known) {
                        const char *pwhy = "";
                        p->percent_base = p->over ? over_percent_base(p->over, &pwhy)
                                                  : rk_percent_base(device, &pwhy);
                        p->percent_known = 1;
                        if (!p->percent_base)
                            return fail(p, v->vpos, "cannot use %% in %s.%s: %s", k->name,
                                        opt->key, pwhy);
                    }
                    base = p->percent_base;
                }
                if (rk_parse_size(v->text, v->len, base, &v->size, &why) != RANKMEM_SUCCESS)
                    return fail(p, v->vpos, "bad size '%s' for %s.%s: %s",
                                rk_quote(q, sizeof q, v->text, v->len), k->name, opt->key, why);
                break;
            }
            case V_BOOL:
                if (rk_parse_bool(v->text, v->len, &v->num) != RANKMEM_SUCCESS)
                    return fail(p, v->vpos,
                                "bad boolean '%s' for %s.%s: expected 1/0, on/off, yes/no or "
                                "true/false",
                                rk_quote(q, sizeof q, v->text, v->len), k->name, opt->key);
                break;
            case V_ENUM: {
                int idx = 0, match = -1;
                char words[128] = "", best[80];
                const char *names[8];
                char store[8][32];
                size_t nnames = 0;
                for (const char *c = opt->choices; *c; idx++) {
                    size_t wl = strcspn(c, "|");
                    if (wl == v->len && memcmp(c, v->text, wl) == 0)
                        match = idx;
                    if (nnames < 8) {
                        snprintf(store[nnames], sizeof store[nnames], "%.*s", (int)wl, c);
                        names[nnames] = store[nnames];
                        nnames++;
                    }
                    c += wl + (c[wl] == '|');
                }
                if (match < 0) {
                    size_t o2 = 0;
                    for (size_t w = 0; w < nnames && o2 < sizeof words; w++)
                        o2 += (size_t)snprintf(words + o2, sizeof words - o2, "%s%s",
                                               w == 0 ? "" : w + 1 == nnames ? " or " : ", ",
                                               names[w]);
                    return fail(p, v->vpos, "bad value '%s' for %s.%s: expected %s%s",
                                rk_quote(q, sizeof q, v->text, v->len), k->name, opt->key, words,
                                suggest(best, sizeof best, v->text, v->len, names, nnames));
                }
                v->num = match;
                break;
            }
            case V_STRING:
                v->str = strndup(v->text, v->len);
                if (!v->str)
                    return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "%s%sspec: no host memory",
                                    p->origin ? p->origin : "", p->origin ? ": " : "");
                break;
            }
        }
        if (k->check) {
            rankmem_status_t st = k->check(p, node);
            if (st != RANKMEM_SUCCESS)
                return st;
        }
    }
    return RANKMEM_SUCCESS;
}

static void parser_free(parser_t *p)
{
    for (size_t j = 0; j < p->nnodes; j++)
        for (int o = 0; o < MAX_OPTS; o++)
            free(p->nodes[j].vals[o].str);
    free(p);
}

static rankmem_status_t parse(const char *origin, const char *spec, int check_only,
                              rankmem_resource_t *over, parser_t **p_p)
{
    if (!spec)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s%sNULL spec", origin ? origin : "",
                        origin ? ": " : "");
    parser_t *p = calloc(1, sizeof *p); /* ~20 KiB: off the stack */
    if (!p)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "%s%sspec: no host memory",
                        origin ? origin : "", origin ? ": " : "");
    p->s = spec;
    p->n = strlen(spec);
    p->origin = origin;
    p->check_only = check_only;
    p->over = over;
    rankmem_status_t st = parse_chain(p);
    if (st == RANKMEM_SUCCESS)
        st = convert_values(p);
    if (st != RANKMEM_SUCCESS) {
        parser_free(p);
        return st;
    }
    *p_p = p;
    return RANKMEM_SUCCESS;
}

/* A constructor failed: keep its status (an argument it refused came from the
 * spec, so that one is a configuration error), release what was built, and
 * say where. The message is taken before the release, which may record its own. */
static rankmem_status_t build_failed(parser_t *p, const spec_node_t *n, rankmem_status_t st,
                                     rankmem_resource_t *built)
{
    char detail[512];
    const char *e = rankmem_last_error();
    const char *prefix = rankmem_status_string(st);
    size_t pl = strlen(prefix);
    if (strncmp(e, prefix, pl) == 0 && e[pl] == ':' && e[pl + 1] == ' ')
        e += pl + 2; /* rk_error adds the status name again below */
    snprintf(detail, sizeof detail, "%s", e);
    if (built)
        rankmem_resource_release(built);
    if (st == RANKMEM_ERR_INVALID_ARGUMENT)
        st = RANKMEM_ERR_CONFIG;
    return rk_error(st, "%s%sat %zu: cannot build %s: %s", p->origin ? p->origin : "",
                    p->origin ? ": " : "", n->pos, n->kind->name, detail);
}

/* Build a parsed chain from its leaf leftwards; over (may be NULL) is the
 * caller's upstream, in place of the spec's leaf if it has one. */
static rankmem_status_t build_chain(parser_t *p, rankmem_resource_t *over,
                                    rankmem_resource_t **mr_p)
{
    rankmem_status_t st;
    rankmem_resource_t *up = NULL;
    size_t j = p->nnodes;
    if (over) {
        if ((st = rankmem_resource_retain(over)) != RANKMEM_SUCCESS)
            return st;
        up = over; /* our reference, dropped like a built node's */
        if (p->nodes[j - 1].kind->role == LEAF)
            j--;
    }
    while (j-- > 0) {
        const spec_node_t *n = &p->nodes[j];
        rankmem_resource_t *mr = NULL;
        st = n->kind->build(n, up, &mr);
        if (st == RANKMEM_SUCCESS && !mr)
            st = rk_error(RANKMEM_ERR_INTERNAL, "%s: constructor succeeded without a resource",
                          n->kind->name);
        if (st != RANKMEM_SUCCESS)
            return build_failed(p, n, st, up);
        if (up)
            rankmem_resource_release(up); /* mr holds its own reference now */
        up = mr;
    }
    *mr_p = up;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_resource_from_spec_named(const char *origin, const char *spec,
                                             rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s%srankmem_resource_from_spec: NULL "
                        "output", origin ? origin : "", origin ? ": " : "");
    parser_t *p;
    rankmem_status_t st = parse(origin, spec, 0, NULL, &p);
    if (st != RANKMEM_SUCCESS)
        return st;
    st = build_chain(p, NULL, mr_p);
    parser_free(p);
    return st;
}

rankmem_status_t rankmem_resource_from_spec(const char *spec, rankmem_resource_t **mr_p)
{
    return rk_resource_from_spec_named(NULL, spec, mr_p);
}

rankmem_status_t rankmem_resource_from_spec_upstream(const char *spec,
                                                     rankmem_resource_t *upstream,
                                                     rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_resource_from_spec_upstream: NULL %s",
                        upstream ? "output" : "upstream");
    parser_t *p;
    rankmem_status_t st = parse(NULL, spec, 0, upstream, &p);
    if (st != RANKMEM_SUCCESS)
        return st;
    st = build_chain(p, upstream, mr_p);
    parser_free(p);
    return st;
}

rankmem_status_t rk_spec_check_named(const char *origin, const char *spec)
{
    parser_t *p;
    rankmem_status_t st = parse(origin, spec, 1, NULL, &p);
    if (st == RANKMEM_SUCCESS)
        parser_free(p);
    return st;
}
