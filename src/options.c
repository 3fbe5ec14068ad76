/* RANKMEM_* options and the typed parsers that options and spec strings share.
 *
 * One static table lists every option: name, type, default, one line of help
 * and, for enums, the choices. The environment is read once (pthread_once)
 * and copied, so later setenv() calls cannot change what the library sees
 * halfway through a run. Values are checked against their type when they are
 * asked for: a bad value is RANKMEM_ERR_CONFIG naming the variable, never a
 * silent fall-back to the default. A RANKMEM_* variable that is not in the
 * table is reported once on stderr, with the closest known name, because a
 * typo would otherwise pass unnoticed. */
#define _GNU_SOURCE
#include "config_internal.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

/* ---- sizes ---- */

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void trim(const char **s, size_t *len)
{
    while (*len && is_space(**s)) {
        (*s)++;
        (*len)--;
    }
    while (*len && is_space((*s)[*len - 1]))
        (*len)--;
}

/* Digits kept after the decimal point: enough for any byte count, small
 * enough that fraction * unit never overflows 128 bits. */
#define MAX_FRACTION_DIGITS 18

rankmem_status_t rk_parse_size(const char *text, size_t len, size_t percent_base, size_t *bytes_p,
                               const char **why_p)
{
    const char *s = text;
    trim(&s, &len);
    const char *end = s + len;
    if (s == end) {
        *why_p = "empty";
        return RANKMEM_ERR_CONFIG;
    }
    if (*s == '-') {
        *why_p = "negative";
        return RANKMEM_ERR_CONFIG;
    }
    if (!isdigit((unsigned char)*s) && *s != '.') {
        *why_p = "not a number";
        return RANKMEM_ERR_CONFIG;
    }
    /* Integer part, saturating: anything past SIZE_MAX is too large whatever follows. */
    unsigned __int128 ip = 0;
    int ndigits = 0, too_big = 0;
    for (; s < end && isdigit((unsigned char)*s); s++, ndigits++) {
        ip = ip * 10 + (unsigned)(*s - '0');
        if (ip > SIZE_MAX) {
            too_big = 1;
            ip = (unsigned __int128)SIZE_MAX + 1;
        }
    }
    if (s < end && *s == '^') { /* 2^N */
        if (ndigits == 0 || ip != 2) {
            *why_p = "only 2^N is allowed as a power";
            return RANKMEM_ERR_CONFIG;
        }
        s++;
        unsigned long e = 0;
        int edigits = 0;
        for (; s < end && isdigit((unsigned char)*s); s++, edigits++)
            e = e > 1000 ? e : e * 10 + (unsigned long)(*s - '0');
        if (!edigits) {
            *why_p = "expected an exponent after '^'";
            return RANKMEM_ERR_CONFIG;
        }
        if (s != end) {
            *why_p = "unexpected text after 2^N";
            return RANKMEM_ERR_CONFIG;
        }
        if (e >= sizeof(size_t) * CHAR_BIT) {
            *why_p = "too large";
            return RANKMEM_ERR_CONFIG;
        }
        *bytes_p = (size_t)1 << e;
        return RANKMEM_SUCCESS;
    }
    unsigned __int128 frac = 0, scale = 1;
    if (s < end && *s == '.') {
        s++;
        for (; s < end && isdigit((unsigned char)*s); s++, ndigits++)
            if (scale < (unsigned __int128)1000000000000000000ull) { /* 10^18 */
                frac = frac * 10 + (unsigned)(*s - '0');
                scale *= 10;
            }
    }
    if (ndigits == 0) {
        *why_p = "not a number";
        return RANKMEM_ERR_CONFIG;
    }
    while (s < end && is_space(*s)) /* "12 MiB" */
        s++;
    const char *u = s;
    size_t ulen = (size_t)(end - u);
    unsigned __int128 unit = 1;
    int percent = 0;
    /* Case-insensitive; K, KB and KiB all mean 1024 (memory is sized in binary units). */
    static const struct {
        const char *name;
        unsigned shift;
    } units[] = {
        {"", 0},    {"b", 0},    {"k", 10},  {"kb", 10},  {"kib", 10}, {"m", 20},
        {"mb", 20}, {"mib", 20}, {"g", 30},  {"gb", 30},  {"gib", 30}, {"t", 40},
        {"tb", 40}, {"tib", 40},
    };
    if (ulen == 1 && *u == '%') {
        percent = 1;
    } else {
        size_t k = 0;
        for (; k < sizeof units / sizeof units[0]; k++)
            if (strlen(units[k].name) == ulen && strncasecmp(units[k].name, u, ulen) == 0)
                break;
        if (k == sizeof units / sizeof units[0]) {
            *why_p = "unknown unit (expected K, M, G, T, KB..TB, KiB..TiB or %)";
            return RANKMEM_ERR_CONFIG;
        }
        unit = (unsigned __int128)1 << units[k].shift;
    }
    if (too_big) {
        *why_p = "too large";
        return RANKMEM_ERR_CONFIG;
    }
    unsigned __int128 v;
    if (percent) {
        if (percent_base == 0) {
            *why_p = "% not allowed here";
            return RANKMEM_ERR_CONFIG;
        }
        if (ip > 100 || (ip == 100 && frac)) {
            *why_p = "more than 100%";
            return RANKMEM_ERR_CONFIG;
        }
        /* ip <= 100 and base < 2^64: no overflow in 128 bits. */
        v = (ip * percent_base + frac * percent_base / scale) / 100;
    } else {
        if (ip > SIZE_MAX / unit) {
            *why_p = "too large";
            return RANKMEM_ERR_CONFIG;
        }
        /* Fractions of a byte are rounded down. */
        v = ip * unit + frac * unit / scale;
    }
    if (v > SIZE_MAX) {
        *why_p = "too large";
        return RANKMEM_ERR_CONFIG;
    }
    *bytes_p = (size_t)v;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_parse_bool(const char *text, size_t len, int *value_p)
{
    static const struct {
        const char *word;
        int value;
    } words[] = {{"1", 1}, {"0", 0},  {"on", 1},   {"off", 0},
                 {"yes", 1}, {"no", 0}, {"true", 1}, {"false", 0}};
    const char *s = text;
    trim(&s, &len);
    for (size_t k = 0; k < sizeof words / sizeof words[0]; k++)
        if (strlen(words[k].word) == len && strncasecmp(words[k].word, s, len) == 0) {
            *value_p = words[k].value;
            return RANKMEM_SUCCESS;
        }
    return RANKMEM_ERR_CONFIG;
}

int rk_format_size(char *buf, size_t len, size_t bytes)
{
    static const char *const names[] = {"TiB", "GiB", "MiB", "KiB"};
    static const unsigned shifts[] = {40, 30, 20, 10};
    for (int k = 0; k < 4; k++) {
        size_t u = (size_t)1 << shifts[k];
        if (bytes && bytes % u == 0)
            return snprintf(buf, len, "%zu%s", bytes / u, names[k]);
    }
    return snprintf(buf, len, "%zu", bytes);
}

size_t rk_edit_distance(const char *a, size_t alen, const char *b, size_t cap)
{
    enum { MAXLEN = 64 };
    size_t blen = strlen(b);
    if (alen > MAXLEN || blen > MAXLEN)
        return cap + 1;
    if ((alen > blen ? alen - blen : blen - alen) > cap)
        return cap + 1;
    size_t prev[MAXLEN + 1], cur[MAXLEN + 1];
    for (size_t j = 0; j <= blen; j++)
        prev[j] = j;
    for (size_t i = 1; i <= alen; i++) {
        cur[0] = i;
        size_t row_min = cur[0];
        for (size_t j = 1; j <= blen; j++) {
            size_t sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) !=
                                        tolower((unsigned char)b[j - 1]));
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            if (cur[j] < row_min)
                row_min = cur[j];
        }
        if (row_min > cap)
            return cap + 1;
        memcpy(prev, cur, (blen + 1) * sizeof prev[0]);
    }
    return prev[blen] > cap ? cap + 1 : prev[blen];
}

const char *rk_quote(char *buf, size_t cap, const char *s, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == 48) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (isprint(c))
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

rankmem_status_t rankmem_parse_size(const char *text, size_t percent_base, size_t *bytes_p)
{
    if (!text || !bytes_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_parse_size: NULL %s",
                        text ? "output" : "text");
    const char *why = "";
    size_t v;
    char q[256];
    size_t len = strlen(text);
    if (rk_parse_size(text, len, percent_base, &v, &why) != RANKMEM_SUCCESS)
        return rk_error(RANKMEM_ERR_CONFIG, "bad size '%s': %s", rk_quote(q, sizeof q, text, len),
                        why);
    *bytes_p = v;
    return RANKMEM_SUCCESS;
}

#define BOOL_WORDS "expected 1/0, on/off, yes/no or true/false"

rankmem_status_t rankmem_parse_bool(const char *text, int *value_p)
{
    if (!text || !value_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_parse_bool: NULL %s",
                        text ? "output" : "text");
    int v;
    char q[256];
    size_t len = strlen(text);
    if (rk_parse_bool(text, len, &v) != RANKMEM_SUCCESS)
        return rk_error(RANKMEM_ERR_CONFIG, "bad boolean '%s': " BOOL_WORDS,
                        rk_quote(q, sizeof q, text, len));
    *value_p = v;
    return RANKMEM_SUCCESS;
}

/* ---- the table ---- */

typedef struct {
    const char *name;
    rankmem_option_type_t type;
    const char *def;
    const char *help;
    const char *choices; /* enums: words separated by '|'; "word:..." takes a list of integers */
    /* Optional extra check of the value (after the type's), e.g. spec syntax. */
    rankmem_status_t (*check)(const char *name, const char *value);
} option_def_t;

static rankmem_status_t check_spec(const char *name, const char *value);
static rankmem_status_t check_backtrace(const char *name, const char *value);
static rankmem_status_t check_timing_sample(const char *name, const char *value);
static rankmem_status_t check_max_blocks(const char *name, const char *value);
static rankmem_status_t check_duration(const char *name, const char *value);
static rankmem_status_t check_staging_sizes(const char *name, const char *value);
static rankmem_status_t check_ipc_cache(const char *name, const char *value);

/* Later issues add their options here; rankmem-info -c and docs/configuration.md
 * list them all. */
static const option_def_t defs[] = {
    {"RANKMEM_RESOURCE", RANKMEM_OPTION_STRING, "stats>pool>cuda",
     "resource chain (spec string) the MPI plugin installs on each rank's GPU", NULL, check_spec},
    {"RANKMEM_LOG_FILE", RANKMEM_OPTION_STRING, "",
     "file of the logging adaptor when its spec or constructor names none (empty: none)", NULL,
     NULL},
    {"RANKMEM_BIND", RANKMEM_OPTION_ENUM, "auto",
     "how the MPI plugin picks each rank's GPU: auto, none, nearest or list:<gpu>,<gpu>,...",
     "auto|none|nearest|list:...", NULL},
    {"RANKMEM_REPORT", RANKMEM_OPTION_STRING, "stderr",
     "per-rank memory report at MPI_Finalize: off, stdout, stderr or a path template "
     "(%j job id, %p pid, %t time, %n ranks, %% a %)", NULL, NULL},
    {"RANKMEM_REPORT_FORMAT", RANKMEM_OPTION_LIST, "text",
     "formats of the MPI report, comma-separated: text, json, csv, timeline (the timeline CSV)",
     "text|json|csv|timeline", NULL},
    {"RANKMEM_ON_FAILURE", RANKMEM_OPTION_ENUM, "report",
     "MPI plugin: each rank writes its own record when it runs out of memory, calls MPI_Abort, "
     "exits before MPI_Finalize or is ended by a signal (report), or not (off)",
     "report|off", NULL},
    {"RANKMEM_REPORT_INTERVAL", RANKMEM_OPTION_STRING, "off",
     "MPI plugin: each rank rewrites its own record at this period (10s, 500ms, 2m, 1h; off), "
     "so that a rank killed without a signal it can catch leaves its last one",
     NULL, check_duration},
    {"RANKMEM_STAGING", RANKMEM_OPTION_ENUM, "auto",
     "stage device buffers through pinned host memory for MPI (auto: when MPI is not CUDA-aware)",
     "auto|on|off", NULL},
    {"RANKMEM_STAGING_POOL", RANKMEM_OPTION_SIZE, "256MiB",
     "pinned host memory kept for staging MPI messages, per rank (64KiB to 64GiB, at least one "
     "chunk, at most 65536 chunks)", NULL, check_staging_sizes},
    {"RANKMEM_STAGING_CHUNK", RANKMEM_OPTION_SIZE, "4MiB",
     "size of one staging buffer; larger messages are sent in pieces (64KiB to 1GiB)", NULL,
     check_staging_sizes},
    {"RANKMEM_STAGING_IPC", RANKMEM_OPTION_ENUM, "auto",
     "device messages between ranks of one node: one device-to-device copy through CUDA IPC "
     "(auto: when every rank of the node can map every other's memory)",
     "auto|on|off", NULL},
    {"RANKMEM_TEST_NODE_RANKS", RANKMEM_OPTION_INT, "0",
     "tests only: the MPI plugin splits each host into pretend nodes of this many consecutive "
     "world ranks, so that what depends on ranks sharing a node runs across nodes on one "
     "machine (0: off)", NULL, NULL},
    {"RANKMEM_STAGING_IPC_CACHE", RANKMEM_OPTION_INT, "64",
     "CUDA IPC mappings of other ranks' allocations kept open per rank, 1 to 65536 (least "
     "recently used closed first)", NULL, check_ipc_cache},
    {"RANKMEM_STAGING_RING", RANKMEM_OPTION_BOOL, "1",
     "nonblocking sends and receives of large device messages move through a few reused pinned "
     "buffers, advanced by MPI's progress engine (Open MPI); 0: such a message is staged whole",
     NULL, NULL},
    {"RANKMEM_VMM_HOST_HANDLES", RANKMEM_OPTION_ENUM, "granule",
     "vmm pools on the host backend (tests, replays on a CPU): granule = one physical handle "
     "per granule; auto = handles that grow with the pool, as on a GPU",
     "granule|auto", NULL},
    {"RANKMEM_TIMING_SAMPLE", RANKMEM_OPTION_INT, "32",
     "the report's allocator time is measured on one call in this many per thread, at random, "
     "and scaled by the exact call count (1: every call, four clock reads a pair)",
     NULL, check_timing_sample},
    {"RANKMEM_MPI_VERBOSE", RANKMEM_OPTION_BOOL, "0",
     "the MPI plugin prints one line per rank at MPI_Init (binding, device, resource) and at "
     "MPI_Finalize", NULL, NULL},
    {"RANKMEM_OMP_DEFAULT_ALLOCATOR", RANKMEM_OPTION_ENUM, "",
     "librankmem_omp: initial default allocator (device, managed or pinned; empty: the runtime's)",
     "|device|managed|pinned|rankmem_omp_device_mem_alloc|rankmem_omp_managed_mem_alloc|"
     "rankmem_omp_pinned_mem_alloc",
     NULL},
    {"RANKMEM_OMP_FREE_SYNC", RANKMEM_OPTION_BOOL, "1",
     "librankmem_omp: wait for the device before omp_free gives device memory back", NULL, NULL},
    {"RANKMEM_OMP_DEFER_BYTES", RANKMEM_OPTION_SIZE, "256MiB",
     "librankmem_omp: freed device memory that may wait for one device sync shared by many frees "
     "(0: a sync per free)", NULL, NULL},
    {"RANKMEM_OMP_VERBOSE", RANKMEM_OPTION_BOOL, "0",
     "librankmem_omp: say why omp_init_allocator refused a trait set", NULL, NULL},
    {"RANKMEM_OBSERVE", RANKMEM_OPTION_ENUM, "auto",
     "the MPI plugin records every device, managed, pinned and VMM allocation of the process "
     "through CUPTI (auto: when the rank has a GPU)", "auto|on|off", NULL},
    {"RANKMEM_OBSERVE_BACKTRACE", RANKMEM_OPTION_INT, "8",
     "frames of call site kept per observed allocation, 0 to 32 (0: no call sites)", NULL,
     check_backtrace},
    {"RANKMEM_OBSERVE_MAX_BLOCKS", RANKMEM_OPTION_SIZE, "1M",
     "live blocks observation keeps per rank (a count: 1M is 1048576); more are counted, not kept",
     NULL, check_max_blocks},
    {"RANKMEM_INTERCEPT", RANKMEM_OPTION_ENUM, "none",
     "the MPI plugin serves the program's cudaMalloc/cudaFree and cudaMallocAsync/cudaFreeAsync "
     "from the rank's resource (cuda; needs the shared CUDA runtime) or not (none)",
     "none|cuda", NULL},
    {"RANKMEM_CUPTI_LIB", RANKMEM_OPTION_STRING, "",
     "the libcupti file observation loads (empty: the loader's path, next to libcudart, "
     "$CUDA_HOME, then the toolkit rankmem was built with)", NULL, NULL},
    {"RANKMEM_QUIET", RANKMEM_OPTION_BOOL, "0",
     "silence the notice printed when no GPU is found", NULL, NULL},
    {"RANKMEM_WARN_UNKNOWN", RANKMEM_OPTION_BOOL, "1",
     "warn on stderr about RANKMEM_* variables rankmem does not know (typos)", NULL, NULL},
};

#define NOPTS (sizeof defs / sizeof defs[0])

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static const char *values[NOPTS]; /* written once under env_once, read-only after */
static int from_env[NOPTS];

static size_t find_option(const char *name, size_t len)
{
    for (size_t i = 0; i < NOPTS; i++)
        if (strlen(defs[i].name) == len && memcmp(defs[i].name, name, len) == 0)
            return i;
    return NOPTS;
}

static void warn_unknown(void)
{
    int warn = 1;
    size_t w = find_option("RANKMEM_WARN_UNKNOWN", strlen("RANKMEM_WARN_UNKNOWN"));
    /* A bad value of this switch itself warns: the getter reports it. */
    (void)rk_parse_bool(values[w], strlen(values[w]), &warn);
    if (!warn || !environ)
        return;
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, "RANKMEM_", 8) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        if (find_option(*e, len) < NOPTS)
            continue;
        size_t best = NOPTS, best_d = 3;
        for (size_t i = 0; i < NOPTS; i++) {
            size_t d = rk_edit_distance(*e, len, defs[i].name, 2);
            if (d < best_d) {
                best_d = d;
                best = i;
            }
        }
        if (best < NOPTS)
            fprintf(stderr, "rankmem: unknown variable %.*s (did you mean %s?)\n", (int)len, *e,
                    defs[best].name);
        else
            fprintf(stderr,
                    "rankmem: unknown variable %.*s (ignored; rankmem-info -c lists the known "
                    "ones)\n",
                    (int)len, *e);
    }
}

static void read_env(void)
{
    for (size_t i = 0; i < NOPTS; i++) {
        const char *v = getenv(defs[i].name);
        values[i] = defs[i].def;
        if (v) {
            /* A copy: a later setenv() may free the environment's string. */
            char *copy = strdup(v);
            values[i] = copy ? copy : v;
            from_env[i] = 1;
        }
    }
    warn_unknown();
}

static void read_once(void) { pthread_once(&env_once, read_env); }

/* Does value match "a|b|word:..."? A "word:..." choice takes word: and a
 * comma-separated list of integers >= 0. */
static int enum_matches(const char *choices, const char *value)
{
    const char *c = choices;
    while (*c) {
        const char *bar = strchr(c, '|');
        size_t n = bar ? (size_t)(bar - c) : strlen(c);
        if (n > 4 && memcmp(c + n - 4, ":...", 4) == 0) {
            size_t pre = n - 3; /* "word:" */
            if (strncmp(value, c, pre) == 0) {
                const char *p = value + pre;
                int ok = *p != '\0';
                while (ok && *p) {
                    if (!isdigit((unsigned char)*p))
                        ok = 0;
                    while (isdigit((unsigned char)*p))
                        p++;
                    if (*p == ',' && isdigit((unsigned char)p[1]))
                        p++;
                    else if (*p)
                        ok = 0;
                }
                if (ok)
                    return 1;
            }
        } else if (strlen(value) == n && memcmp(value, c, n) == 0) {
            return 1;
        }
        c += n + (bar != NULL);
    }
    return 0;
}

/* "auto, none, nearest or list:..." for messages, and the closest choice to value. */
static void enum_words(const char *choices, const char *value, char *buf, size_t len,
                       char *best, size_t best_len)
{
    size_t o = 0, nwords = 1, best_d = 3;
    for (const char *c = choices; *c; c++)
        nwords += *c == '|';
    best[0] = '\0';
    const char *c = choices;
    for (size_t k = 0; *c && o < len; k++) {
        const char *bar = strchr(c, '|');
        size_t n = bar ? (size_t)(bar - c) : strlen(c);
        o += (size_t)snprintf(buf + o, len - o, "%s%.*s",
                              k == 0 ? "" : k + 1 == nwords ? " or " : ", ", (int)n, c);
        char word[64];
        snprintf(word, sizeof word, "%.*s", (int)n, c);
        size_t d = rk_edit_distance(value, strlen(value), word, 2);
        if (d < best_d && !strstr(word, ":...")) {
            best_d = d;
            snprintf(best, best_len, "%s", word);
        }
        c += n + (bar != NULL);
    }
}

/* Check option i's current value against its type; error names the variable. */
static rankmem_status_t check_option(size_t i)
{
    const option_def_t *d = &defs[i];
    const char *v = values[i];
    char q[256];
    const char *why = "";
    size_t sz;
    int b;
    switch (d->type) {
    case RANKMEM_OPTION_SIZE:
        if (rk_parse_size(v, strlen(v), 0, &sz, &why) != RANKMEM_SUCCESS)
            return rk_error(RANKMEM_ERR_CONFIG, "%s: bad size '%s': %s (default: %s)", d->name,
                            rk_quote(q, sizeof q, v, strlen(v)), why, d->def);
        break;
    case RANKMEM_OPTION_BOOL:
        if (rk_parse_bool(v, strlen(v), &b) != RANKMEM_SUCCESS)
            return rk_error(RANKMEM_ERR_CONFIG, "%s: bad boolean '%s': " BOOL_WORDS, d->name,
                            rk_quote(q, sizeof q, v, strlen(v)));
        break;
    case RANKMEM_OPTION_ENUM:
        if (!enum_matches(d->choices, v)) {
            char words[256], best[64];
            enum_words(d->choices, v, words, sizeof words, best, sizeof best);
            return rk_error(RANKMEM_ERR_CONFIG, "%s: bad value '%s': expected %s%s%s%s", d->name,
                            rk_quote(q, sizeof q, v, strlen(v)), words,
                            best[0] ? " (did you mean '" : "", best, best[0] ? "'?)" : "");
        }
        break;
    case RANKMEM_OPTION_INT: {
        char *end;
        errno = 0;
        (void)strtol(v, &end, 10);
        if (end == v || *end || errno)
            return rk_error(RANKMEM_ERR_CONFIG, "%s: bad integer '%s'", d->name,
                            rk_quote(q, sizeof q, v, strlen(v)));
        break;
    }
    case RANKMEM_OPTION_LIST: {
        /* Every item one of the choices, as its reader takes them (mpi/report.c:
         * commas, blanks around items, any case); an unknown item would only
         * be warned about at MPI_Finalize, too late to fix the run. */
        if (!d->choices)
            break;
        for (const char *p = v; *p;) {
            while (*p == ',' || *p == ' ' || *p == '\t')
                p++;
            const char *w = p;
            while (*p && *p != ',')
                p++;
            size_t len = (size_t)(p - w);
            while (len && (w[len - 1] == ' ' || w[len - 1] == '\t'))
                len--;
            if (!len)
                continue;
            int known = 0;
            for (const char *c = d->choices; *c && !known;) {
                size_t n = strcspn(c, "|");
                known = n == len && strncasecmp(c, w, len) == 0;
                c += n + (c[n] == '|');
            }
            if (!known) {
                char words[256], best[64], item[128], whole[256];
                snprintf(item, sizeof item, "%.*s", (int)(len < 64 ? len : 64), w);
                enum_words(d->choices, item, words, sizeof words, best, sizeof best);
                return rk_error(RANKMEM_ERR_CONFIG,
                                "%s: unknown item '%s' in '%s': expected a comma-separated list "
                                "of %s%s%s%s",
                                d->name, rk_quote(q, sizeof q, w, len),
                                rk_quote(whole, sizeof whole, v, strlen(v)), words,
                                best[0] ? " (did you mean '" : "", best, best[0] ? "'?)" : "");
            }
        }
        break;
    }
    case RANKMEM_OPTION_STRING:
        break;
    }
    return d->check ? d->check(d->name, v) : RANKMEM_SUCCESS;
}

static rankmem_status_t check_spec(const char *name, const char *value)
{
    /* Parse without building: resources are made by whoever uses the option. */
    return rk_spec_check_named(name, value);
}

/* RK_OBS_MAX_FRAMES of mpi/observe/recorder.h: the recorder keeps at most 32 frames. */
#define OBSERVE_MAX_FRAMES 32

static rankmem_status_t check_backtrace(const char *name, const char *value)
{
    long n = strtol(value, NULL, 10); /* the type's check has run: an integer */
    if (n < 0 || n > OBSERVE_MAX_FRAMES)
        return rk_error(RANKMEM_ERR_CONFIG, "%s: %ld is out of range: expected 0 to %d frames",
                        name, n, OBSERVE_MAX_FRAMES);
    return RANKMEM_SUCCESS;
}

/* rk_mpi_timing_set_period's range (mpi/timing.h). */
#define TIMING_SAMPLE_MAX (1L << 20)

static rankmem_status_t check_timing_sample(const char *name, const char *value)
{
    long n = strtol(value, NULL, 10); /* the type's check has run: an integer */
    if (n < 1 || n > TIMING_SAMPLE_MAX)
        return rk_error(RANKMEM_ERR_CONFIG, "%s: %ld is out of range: expected 1 to %ld calls",
                        name, n, TIMING_SAMPLE_MAX);
    return RANKMEM_SUCCESS;
}

/* A table of a billion blocks is tens of GiB per rank: certainly a typo. */
#define OBSERVE_MAX_BLOCKS_LIMIT ((size_t)1 << 30)

static rankmem_status_t check_max_blocks(const char *name, const char *value)
{
    size_t n = 0;
    const char *why;
    (void)rk_parse_size(value, strlen(value), 0, &n, &why); /* the type's check has run */
    if (n == 0 || n > OBSERVE_MAX_BLOCKS_LIMIT)
        return rk_error(RANKMEM_ERR_CONFIG, "%s: %zu is out of range: expected 1 to %zu blocks",
                        name, n, OBSERVE_MAX_BLOCKS_LIMIT);
    return RANKMEM_SUCCESS;
}

/* mpi/staging/base.c's bounds (rk_mpi_staging_init), so that a value staging
 * would refuse at MPI_Init is refused here too: a chunk of 64 KiB to 1 GiB, a
 * pool of 64 KiB to 64 GiB holding at least one chunk and at most 65536. */
#define STAGING_MIN ((size_t)64 << 10)
#define STAGING_CHUNK_MAX ((size_t)1 << 30)
#define STAGING_POOL_MAX ((size_t)64 << 30)
#define STAGING_MAX_CHUNKS 65536

static rankmem_status_t check_staging_sizes(const char *name, const char *value)
{
    const char *why;
    size_t n = 0, chunk = 0, pool = 0;
    (void)rk_parse_size(value, strlen(value), 0, &n, &why); /* the type's check has run */
    int is_chunk = strcmp(name, "RANKMEM_STAGING_CHUNK") == 0;
    size_t hi = is_chunk ? STAGING_CHUNK_MAX : STAGING_POOL_MAX;
    if (n < STAGING_MIN || n > hi)
        return rk_error(RANKMEM_ERR_CONFIG, "%s: %zu bytes is out of range: expected %zu KiB to %zu "
                        "MiB", name, n, STAGING_MIN >> 10, hi >> 20);
    /* The pair: checked on the pool, against a chunk that is itself good. */
    if (is_chunk)
        return RANKMEM_SUCCESS;
    const char *c = values[find_option("RANKMEM_STAGING_CHUNK", strlen("RANKMEM_STAGING_CHUNK"))];
    if (rk_parse_size(c, strlen(c), 0, &chunk, &why) != RANKMEM_SUCCESS ||
        chunk < STAGING_MIN || chunk > STAGING_CHUNK_MAX)
        return RANKMEM_SUCCESS; /* the chunk's own check says what is wrong */
    pool = n;
    if (pool < chunk)
        return rk_error(RANKMEM_ERR_CONFIG,
                        "%s: %zu KiB is smaller than RANKMEM_STAGING_CHUNK (%zu KiB)", name,
                        pool >> 10, chunk >> 10);
    if (pool / chunk > STAGING_MAX_CHUNKS)
        return rk_error(RANKMEM_ERR_CONFIG,
                        "%s: %zu chunks of RANKMEM_STAGING_CHUNK (%zu KiB); at most %d", name,
                        pool / chunk, chunk >> 10, STAGING_MAX_CHUNKS);
    return RANKMEM_SUCCESS;
}

/* mpi/staging's bound on open CUDA IPC mappings. */
static rankmem_status_t check_ipc_cache(const char *name, const char *value)
{
    long n = strtol(value, NULL, 10); /* the type's check has run: an integer */
    if (n < 1 || n > STAGING_MAX_CHUNKS)
        return rk_error(RANKMEM_ERR_CONFIG, "%s: %ld is out of range: expected 1 to %d mappings",
                        name, n, STAGING_MAX_CHUNKS);
    return RANKMEM_SUCCESS;
}

/* RANKMEM_REPORT_INTERVAL: off (or 0), or a number with s (the default),
 * ms, m or h; 10 ms at least (the MPI plugin parses the same words,
 * mpi/failure.c). */
static rankmem_status_t check_duration(const char *name, const char *value)
{
    if (!*value || strcmp(value, "off") == 0)
        return RANKMEM_SUCCESS;
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    double mul = 1.0;
    if (strcmp(end, "ms") == 0)
        mul = 1e-3;
    else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0)
        mul = 60.0;
    else if (strcmp(end, "h") == 0)
        mul = 3600.0;
    else if (*end && strcmp(end, "s") != 0)
        end = NULL;
    if (errno || !end || end == value || !(v >= 0) || v > 1e7 || (v > 0 && v * mul < 0.01))
        return rk_error(RANKMEM_ERR_CONFIG,
                        "%s: bad duration '%.48s': expected off or a number of s, ms, m or h, "
                        "10ms at least (10s, 500ms, 2m)", name, value);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t lookup(const char *fn, const char *name, rankmem_option_type_t type,
                               int any_type, size_t *i_p)
{
    if (!name)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: NULL name", fn);
    read_once();
    size_t i = find_option(name, strlen(name));
    if (i == NOPTS)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: no option named %s", fn, name);
    if (!any_type && defs[i].type != type)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: %s is not of that type", fn, name);
    *i_p = i;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_option_size(const char *name, size_t *value_p)
{
    size_t i;
    rankmem_status_t st = lookup("rk_option_size", name, RANKMEM_OPTION_SIZE, 0, &i);
    if (st == RANKMEM_SUCCESS)
        st = check_option(i);
    if (st != RANKMEM_SUCCESS)
        return st;
    const char *why;
    return rk_parse_size(values[i], strlen(values[i]), 0, value_p, &why);
}

rankmem_status_t rk_option_bool(const char *name, int *value_p)
{
    size_t i;
    rankmem_status_t st = lookup("rk_option_bool", name, RANKMEM_OPTION_BOOL, 0, &i);
    if (st == RANKMEM_SUCCESS)
        st = check_option(i);
    if (st != RANKMEM_SUCCESS)
        return st;
    return rk_parse_bool(values[i], strlen(values[i]), value_p);
}

rankmem_status_t rk_option_int(const char *name, long *value_p)
{
    size_t i;
    rankmem_status_t st = lookup("rk_option_int", name, RANKMEM_OPTION_INT, 0, &i);
    if (st == RANKMEM_SUCCESS)
        st = check_option(i);
    if (st != RANKMEM_SUCCESS)
        return st;
    *value_p = strtol(values[i], NULL, 10);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_option_string(const char *name, const char **value_p)
{
    size_t i;
    rankmem_status_t st = lookup("rk_option_string", name, RANKMEM_OPTION_STRING, 1, &i);
    if (st == RANKMEM_SUCCESS)
        st = check_option(i);
    if (st != RANKMEM_SUCCESS)
        return st;
    *value_p = values[i];
    return RANKMEM_SUCCESS;
}

/* ---- public ---- */

rankmem_status_t rankmem_option_count(size_t *count_p)
{
    if (!count_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_option_count: NULL output");
    *count_p = NOPTS;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_option_info(size_t index, rankmem_option_info_t *info_p)
{
    if (!info_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_option_info: NULL output");
    if (index >= NOPTS)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_option_info: index %zu out of range [0, %zu)", index, NOPTS);
    read_once();
    *info_p = (rankmem_option_info_t){
        .name = defs[index].name,
        .type = defs[index].type,
        .default_value = defs[index].def,
        .value = values[index],
        .from_environment = from_env[index],
        .help = defs[index].help,
        .choices = defs[index].choices,
    };
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_option_get(const char *name, const char **value_p)
{
    size_t i;
    if (!value_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_option_get: NULL output");
    rankmem_status_t st = lookup("rankmem_option_get", name, RANKMEM_OPTION_STRING, 1, &i);
    if (st != RANKMEM_SUCCESS)
        return st;
    *value_p = values[i];
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_option_check(size_t index)
{
    if (index >= NOPTS)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_option_check: index %zu out of range [0, %zu)", index, NOPTS);
    read_once();
    return check_option(index);
}
