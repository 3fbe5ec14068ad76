/* rankmem-report: reading a report (JSON of any schema we wrote, or CSV).
 *
 * The format is told by the content, not the name: a JSON document starts
 * with '{', the CSV with its header "rank,...". Every value is checked for
 * its type and range, and a problem is reported with the line and column
 * where it is, so that a hand-edited or cut-off file is refused with a
 * message that points at the place. Keys and columns we do not know are
 * ignored (docs/report.md: new keys may come without a new schema). */
#include "report.h"
#include "json.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


/* A reading in progress: where messages go. */
typedef struct {
    const char *name;
    char *err;
    size_t cap;
    int failed;
} rctx_t;

static void fail(rctx_t *c, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* "name:line:col: message" (line/col left out when 0); the first error wins. */
static void fail(rctx_t *c, int line, int col, const char *fmt, ...)
{
    if (c->failed)
        return;
    c->failed = 1;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0 && col > 0)
        snprintf(c->err, c->cap, "%s:%d:%d: %s", c->name, line, col, msg);
    else if (line > 0)
        snprintf(c->err, c->cap, "%s:%d: %s", c->name, line, msg);
    else
        snprintf(c->err, c->cap, "%s: %s", c->name, msg);
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

void rr_report_free(rr_report_t *rep)
{
    if (!rep)
        return;
    for (size_t i = 0; i < rep->nleaks; i++) {
        free(rep->leaks[i].site);
        free(rep->leaks[i].api);
        free(rep->leaks[i].kind);
    }
    free(rep->leaks);
    for (size_t i = 0; i < rep->nlive; i++) {
        free(rep->live[i].site);
        free(rep->live[i].api);
        free(rep->live[i].kind);
    }
    free(rep->live);
    for (size_t i = 0; rep->src && i < rep->n; i++) {
        rr_source_t *sc = &rep->src[i];
        free(sc->file);
        free(sc->phase);
        free(sc->trigger);
        for (size_t k = 0; k < sc->nlive; k++) {
            free(sc->live[k].site);
            free(sc->live[k].api);
            free(sc->live[k].kind);
        }
        free(sc->live);
    }
    free(rep->src);
    free(rep->missing);
    for (size_t i = 0; i < rep->nphases; i++)
        free(rep->phases[i].name);
    free(rep->phases);
    free(rep->ranks);
    free(rep->path);
    free(rep->generator);
    free(rep->phase);
    free(rep->trigger);
    free(rep->job_id);
    free(rep->job_id_source);
    free(rep->time);
    free(rep->writer_host);
    memset(rep, 0, sizeof *rep);
}

/* ------------------------------------------------------------------------
 * The record's fields: the report model's table (report/model.c),
 * the one the plugin writes with, for JSON (dotted keys are nested
 * objects) and CSV (dotted keys are column names) alike. */

typedef enum { K_INT, K_UINT32, K_U64, K_STR, K_DOUBLE } kind_t;

/* How a model field is read: its value kind here. */
static kind_t read_kind(const rm_field_t *f)
{
    switch (f->kind) {
    case RM_K_INT:
        return K_INT;
    case RM_K_U32:
        return K_UINT32;
    case RM_K_U64:
        return K_U64;
    case RM_K_DOUBLE:
    case RM_K_NS_AS_S:
        return K_DOUBLE;
    case RM_K_STR:
    case RM_K_STATE:
    case RM_K_FLAG:
        break;
    }
    return K_STR;
}

/* Fields every report has had (record_version 1): a report without one is
 * refused. Later fields may be absent (an older report): they stay 0.
 * Booleans are read from "flags", which carries them all. */
static int required(const rm_field_t *f)
{
    return f->since <= 1;
}

static int rank_init(rr_rank_t *r)
{
    memset(r, 0, sizeof *r);
    r->wall_s = NAN;
    return 0;
}

static int set_str(char **slot, const char *s)
{
    char *d = dup_str(s);
    if (!d)
        return -1;
    free(*slot);
    *slot = d;
    return 0;
}

/* Ranks must be distinct: matching two reports and the per-node grouping
 * count on it. Returns the index of an earlier duplicate, or -1. */
static int cmp_idx_rank_data(const void *a, const void *b, const rr_rank_t *ranks)
{
    int x = ranks[*(const size_t *)a].rank, y = ranks[*(const size_t *)b].rank;
    if (x != y)
        return (x > y) - (x < y);
    return (*(const size_t *)a > *(const size_t *)b) - (*(const size_t *)a < *(const size_t *)b);
}
static const rr_rank_t *sort_ranks_; /* qsort has no context argument in C11 */
static int cmp_idx_rank(const void *a, const void *b)
{
    return cmp_idx_rank_data(a, b, sort_ranks_);
}

/* Returns 0; 1 with *first and *second set to a duplicated pair; -1 out of memory. */
static int find_duplicate(const rr_report_t *rep, size_t *first, size_t *second)
{
    if (rep->n < 2)
        return 0;
    size_t *idx = malloc(rep->n * sizeof *idx);
    if (!idx)
        return -1;
    for (size_t i = 0; i < rep->n; i++)
        idx[i] = i;
    sort_ranks_ = rep->ranks;
    qsort(idx, rep->n, sizeof *idx, cmp_idx_rank);
    int found = 0;
    for (size_t i = 1; i < rep->n && !found; i++)
        if (rep->ranks[idx[i]].rank == rep->ranks[idx[i - 1]].rank) {
            *first = idx[i - 1];
            *second = idx[i];
            found = 1;
        }
    free(idx);
    return found;
}

/* ------------------------------------------------------------------------
 * JSON. */

/* Checks v against a field kind and stores it. where: "ranks[3].rank". */
static int json_store(rctx_t *c, const json_value_t *v, kind_t kind, void *slot, const char *where)
{
    switch (kind) {
    case K_STR:
        if (v->type != JSON_STRING) {
            fail(c, v->line, v->column, "%s: expected a string, found %s", where,
                 json_type_name(v->type));
            return -1;
        }
        if (set_str((char **)slot, v->str) != 0) {
            fail(c, v->line, v->column, "out of memory");
            return -1;
        }
        return 0;
    case K_DOUBLE:
        if (v->type == JSON_NULL) { /* the writer's "cannot be computed" */
            *(double *)slot = NAN;
            return 0;
        }
        if (v->type != JSON_NUMBER) {
            fail(c, v->line, v->column, "%s: expected a number, found %s", where,
                 json_type_name(v->type));
            return -1;
        }
        *(double *)slot = v->num;
        return 0;
    case K_INT:
        if (v->type != JSON_NUMBER || !v->is_int ||
            v->u64 > (v->negative ? (uint64_t)INT_MAX + 1 : (uint64_t)INT_MAX)) {
            if (v->type == JSON_NUMBER)
                fail(c, v->line, v->column, "%s: expected an integer of 32 bits, found %.17g",
                     where, v->num);
            else
                fail(c, v->line, v->column, "%s: expected an integer, found %s", where,
                     json_type_name(v->type));
            return -1;
        }
        *(int *)slot = v->negative ? (int)(-(int64_t)(v->u64 - 1) - 1) : (int)v->u64;
        return 0;
    case K_UINT32:
    case K_U64:
        if (v->type != JSON_NUMBER || !v->is_int || v->negative ||
            (kind == K_UINT32 && v->u64 > UINT32_MAX)) {
            if (v->type == JSON_NUMBER && !v->is_int && v->num == floor(v->num))
                fail(c, v->line, v->column, "%s: expected an integer, found %.17g written with a "
                     "fraction or an exponent", where, v->num);
            else if (v->type == JSON_NUMBER)
                fail(c, v->line, v->column, "%s: expected a non-negative integer%s, found %.17g",
                     where, kind == K_UINT32 ? " of 32 bits" : "", v->num);
            else
                fail(c, v->line, v->column, "%s: expected a non-negative integer, found %s",
                     where, json_type_name(v->type));
            return -1;
        }
        if (kind == K_UINT32)
            *(unsigned *)slot = (unsigned)v->u64;
        else
            *(uint64_t *)slot = v->u64;
        return 0;
    }
    return -1;
}

/* An optional member: absent is fine (slot untouched), a wrong type is not. */
static int json_opt(rctx_t *c, const json_value_t *obj, const char *key, kind_t kind, void *slot,
                    const char *where_prefix)
{
    const json_value_t *v = json_get(obj, key);
    if (!v)
        return 0;
    char where[96];
    snprintf(where, sizeof where, "%s%s", where_prefix, key);
    return json_store(c, v, kind, slot, where);
}

static int json_req(rctx_t *c, const json_value_t *obj, const char *key, kind_t kind, void *slot,
                    const char *where_prefix)
{
    if (!json_get(obj, key)) {
        fail(c, obj->line, obj->column, "%s: the object has no \"%s\"",
             where_prefix[0] ? where_prefix : "top level", key);
        return -1;
    }
    return json_opt(c, obj, key, kind, slot, where_prefix);
}

/* A string that may be null (JSON null leaves *slot NULL). */
static int json_str_or_null(rctx_t *c, const json_value_t *obj, const char *key, char **slot,
                            const char *where_prefix)
{
    const json_value_t *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL)
        return 0;
    return json_opt(c, obj, key, K_STR, slot, where_prefix);
}

/* A value read as kind read_kind(f) (in *val) put into the record. */
static int put_field(rctx_t *c, const rm_field_t *f, rr_rank_t *r, void *val, int line, int col,
                     const char *where)
{
    char *slot = (char *)r + f->off;
    switch (f->kind) {
    case RM_K_INT: {
        int32_t v = (int32_t) * (int *)val;
        memcpy(slot, &v, sizeof v);
        return 0;
    }
    case RM_K_U32: {
        uint32_t v = (uint32_t) * (unsigned *)val;
        memcpy(slot, &v, sizeof v);
        return 0;
    }
    case RM_K_U64:
        memcpy(slot, val, sizeof(uint64_t));
        return 0;
    case RM_K_DOUBLE:
        memcpy(slot, val, sizeof(double));
        return 0;
    case RM_K_NS_AS_S: {
        double d = *(double *)val;
        uint64_t ns = isfinite(d) && d > 0 ? (uint64_t)llround(d * 1e9) : 0;
        memcpy(slot, &ns, sizeof ns);
        return 0;
    }
    case RM_K_STR:
        /* The record's own size: a longer string (a hand-edited file) is cut. */
        snprintf(slot, f->cap, "%s", *(char **)val);
        return 0;
    case RM_K_STATE: {
        int st = rm_state_parse(*(char **)val);
        if (st < 0) {
            fail(c, line, col, "%s: expected \"on\", \"off\" or \"unavailable\", found '%.40s'",
                 where, *(char **)val);
            return -1;
        }
        int32_t v = st;
        memcpy(slot, &v, sizeof v);
        return 0;
    }
    case RM_K_FLAG:
        break;
    }
    return 0;
}

/* A dotted key in nested objects: "observed.device.peak". */
static const json_value_t *json_path(const json_value_t *o, const char *key)
{
    char part[64];
    const char *p = key;
    while (o && o->type == JSON_OBJECT) {
        const char *d = strchr(p, '.');
        if (!d)
            return json_get(o, p);
        snprintf(part, sizeof part, "%.*s", (int)(d - p), p);
        o = json_get(o, part);
        p = d + 1;
    }
    return NULL;
}

/* Every field of the table from a rank's JSON object. */
static int json_record(rctx_t *c, const json_value_t *o, rr_rank_t *r, const char *prefix)
{
    for (size_t k = 0; k < rm_nfields; k++) {
        const rm_field_t *f = &rm_fields[k];
        if (f->kind == RM_K_FLAG)
            continue;
        const json_value_t *v = json_path(o, f->key);
        if (!v) {
            if (!required(f))
                continue;
            fail(c, o->line, o->column, "%s: the object has no \"%s\"", prefix, f->key);
            return -1;
        }
        char where[128];
        snprintf(where, sizeof where, "%s%s", prefix, f->key);
        union {
            int i;
            unsigned u;
            uint64_t u64;
            double d;
            char *s;
        } val;
        memset(&val, 0, sizeof val);
        kind_t kd = read_kind(f);
        if (json_store(c, v, kd, &val, where) != 0) {
            if (kd == K_STR)
                free(val.s);
            return -1;
        }
        int rc = put_field(c, f, r, &val, v->line, v->column, where);
        if (kd == K_STR)
            free(val.s);
        if (rc)
            return -1;
    }
    return 0;
}

/* Schema 1 (the plugin's first layout, docs/report.md). The analysis
 * sections (nodes, aggregates, leaked_ranks, top_by_peak) are not read:
 * the tool computes them again from ranks[], the same way for the CSV. */
static int read_schema1(rctx_t *c, const json_value_t *root, rr_report_t *rep)
{
    if (json_opt(c, root, "record_version", K_INT, &rep->record_version, "") ||
        json_opt(c, root, "generator", K_STR, &rep->generator, "") ||
        json_req(c, root, "phase", K_STR, &rep->phase, "") ||
        json_req(c, root, "trigger", K_STR, &rep->trigger, ""))
        return -1;

    const json_value_t *job = json_get(root, "job");
    if (!job) {
        fail(c, root->line, root->column, "top level: the object has no \"job\"");
        return -1;
    }
    if (job->type != JSON_OBJECT) {
        fail(c, job->line, job->column, "job: expected an object, found %s",
             json_type_name(job->type));
        return -1;
    }
    int job_ranks = -1;
    double wall = 0;
    if (json_req(c, job, "id", K_STR, &rep->job_id, "job.") ||
        json_str_or_null(c, job, "id_source", &rep->job_id_source, "job.") ||
        json_req(c, job, "ranks", K_INT, &job_ranks, "job.") ||
        json_opt(c, job, "world_size", K_INT, &rep->world_size, "job.") ||
        json_opt(c, job, "wall_s", K_DOUBLE, &wall, "job.") ||
        json_opt(c, job, "time", K_STR, &rep->time, "job.") ||
        json_opt(c, job, "writer_host", K_STR, &rep->writer_host, "job."))
        return -1;
    int pid = -1;
    if (json_opt(c, job, "writer_pid", K_INT, &pid, "job."))
        return -1;
    rep->writer_pid = pid;

    const json_value_t *ranks = json_get(root, "ranks");
    if (!ranks) {
        fail(c, root->line, root->column, "top level: the object has no \"ranks\"");
        return -1;
    }
    if (ranks->type != JSON_ARRAY) {
        fail(c, ranks->line, ranks->column, "ranks: expected an array, found %s",
             json_type_name(ranks->type));
        return -1;
    }
    if (ranks->count == 0) {
        fail(c, ranks->line, ranks->column, "ranks: no record (a report covers one rank at least)");
        return -1;
    }
    if (job_ranks < 0 || (size_t)job_ranks != ranks->count) {
        fail(c, ranks->line, ranks->column,
             "ranks: %zu records, but job.ranks says %d (a cut or edited report?)", ranks->count,
             job_ranks);
        return -1;
    }
    rep->ranks = calloc(ranks->count ? ranks->count : 1, sizeof *rep->ranks);
    if (!rep->ranks) {
        fail(c, 0, 0, "out of memory for %zu records", ranks->count);
        return -1;
    }
    for (size_t i = 0; i < ranks->count; i++) {
        const json_value_t *o = ranks->items[i];
        rr_rank_t *r = &rep->ranks[i];
        if (rank_init(r) != 0) {
            fail(c, o->line, o->column, "out of memory");
            return -1;
        }
        rep->n = i + 1; /* from here on r is freed with the report */
        char prefix[48];
        snprintf(prefix, sizeof prefix, "ranks[%zu].", i);
        if (o->type != JSON_OBJECT) {
            fail(c, o->line, o->column, "ranks[%zu]: expected an object, found %s", i,
                 json_type_name(o->type));
            return -1;
        }
        if (json_record(c, o, r, prefix))
            return -1;
        if (r->rank < 0) {
            const json_value_t *v = json_get(o, "rank");
            fail(c, v->line, v->column, "ranks[%zu].rank: %d is not a rank", i, r->rank);
            return -1;
        }
    }
    return 0;
}

/* Schema 2's job-level sections (issue 19): all optional. */
static const json_value_t *json_array_of(rctx_t *c, const json_value_t *obj, const char *key,
                                         const char *where, int *err)
{
    const json_value_t *v = json_get(obj, key);
    *err = 0;
    if (!v)
        return NULL;
    if (v->type != JSON_ARRAY) {
        fail(c, v->line, v->column, "%s: expected an array, found %s", where,
             json_type_name(v->type));
        *err = 1;
        return NULL;
    }
    return v;
}

static int read_extras(rctx_t *c, const json_value_t *root, rr_report_t *rep)
{
    int err;
    const json_value_t *tl = json_get(root, "timeline");
    if (tl) {
        if (tl->type != JSON_OBJECT) {
            fail(c, tl->line, tl->column, "timeline: expected an object, found %s",
                 json_type_name(tl->type));
            return -1;
        }
        int buckets = 0;
        if (json_req(c, tl, "t_end_s", K_DOUBLE, &rep->t_end_s, "timeline.") ||
            json_req(c, tl, "buckets", K_INT, &buckets, "timeline."))
            return -1;
        const json_value_t *rows = json_array_of(c, tl, "bytes", "timeline.bytes", &err);
        if (err)
            return -1;
        if (!rows || buckets != RM_TIMELINE_BUCKETS || rows->count != rep->n) {
            const json_value_t *at = rows ? rows : tl;
            fail(c, at->line, at->column, "timeline: %d buckets for %zu ranks, expected %d for "
                 "%zu", buckets, rows ? rows->count : 0, RM_TIMELINE_BUCKETS, rep->n);
            return -1;
        }
        for (size_t i = 0; i < rows->count; i++) {
            const json_value_t *row = rows->items[i];
            if (row->type != JSON_ARRAY || row->count != RM_TIMELINE_BUCKETS) {
                fail(c, row->line, row->column, "timeline.bytes[%zu]: expected %d numbers", i,
                     RM_TIMELINE_BUCKETS);
                return -1;
            }
            for (size_t k = 0; k < RM_TIMELINE_BUCKETS; k++)
                if (json_store(c, row->items[k], K_U64, &rep->ranks[i].timeline[k],
                               "timeline.bytes[]"))
                    return -1;
        }
        rep->has_timeline = 1;
    }
    const json_value_t *lk = json_array_of(c, root, "leaks", "leaks", &err);
    if (err)
        return -1;
    if (lk) {
        rep->has_leaks = 1;
        rep->leaks = calloc(lk->count ? lk->count : 1, sizeof *rep->leaks);
        if (!rep->leaks) {
            fail(c, 0, 0, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < lk->count; i++) {
            const json_value_t *o = lk->items[i];
            rr_leak_t *l = &rep->leaks[i];
            rep->nleaks = i + 1;
            if (o->type != JSON_OBJECT) {
                fail(c, o->line, o->column, "leaks[%zu]: expected an object", i);
                return -1;
            }
            if (json_req(c, o, "site", K_STR, &l->site, "leaks[].") ||
                json_opt(c, o, "api", K_STR, &l->api, "leaks[].") ||
                json_opt(c, o, "kind", K_STR, &l->kind, "leaks[].") ||
                json_req(c, o, "ranks", K_INT, &l->ranks, "leaks[].") ||
                json_req(c, o, "bytes", K_U64, &l->bytes, "leaks[].") ||
                json_opt(c, o, "count", K_U64, &l->count, "leaks[].") ||
                json_opt(c, o, "first_rank", K_INT, &l->first_rank, "leaks[]."))
                return -1;
        }
    }
    const json_value_t *ph = json_array_of(c, root, "phases", "phases", &err);
    if (err)
        return -1;
    if (ph && ph->count) {
        rep->phases = calloc(ph->count, sizeof *rep->phases);
        if (!rep->phases) {
            fail(c, 0, 0, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < ph->count; i++) {
            const json_value_t *o = ph->items[i];
            rr_phase_t *p = &rep->phases[i];
            rep->nphases = i + 1;
            if (o->type != JSON_OBJECT) {
                fail(c, o->line, o->column, "phases[%zu]: expected an object", i);
                return -1;
            }
            if (json_req(c, o, "name", K_STR, &p->name, "phases[].") ||
                json_opt(c, o, "t_start_s", K_DOUBLE, &p->t_start_s, "phases[].") ||
                json_opt(c, o, "t_end_s", K_DOUBLE, &p->t_end_s, "phases[].") ||
                json_req(c, o, "peak_min", K_U64, &p->peak_min, "phases[].") ||
                json_req(c, o, "peak_max", K_U64, &p->peak_max, "phases[].") ||
                json_opt(c, o, "peak_max_rank", K_INT, &p->peak_max_rank, "phases[].") ||
                json_opt(c, o, "peak_mean", K_DOUBLE, &p->peak_mean, "phases[]."))
                return -1;
        }
    }
    return 0;
}

/* Schema 2 (issue 19): schema 1's layout, records with "observed", and
 * the job's "leaks", "timeline" and "phases". */
static int read_schema2(rctx_t *c, const json_value_t *root, rr_report_t *rep)
{
    if (read_schema1(c, root, rep))
        return -1;
    return read_extras(c, root, rep);
}

/* Schema 3 (issue 29): schema 2's, records with "failure", and in a
 * rank's own document (a failed job) the sites live at its failure. */
static int read_schema3(rctx_t *c, const json_value_t *root, rr_report_t *rep)
{
    if (read_schema2(c, root, rep))
        return -1;
    int err;
    const json_value_t *ls = json_array_of(c, root, "live_sites", "live_sites", &err);
    if (err)
        return -1;
    if (ls && ls->count) {
        rep->live = calloc(ls->count, sizeof *rep->live);
        if (!rep->live) {
            fail(c, 0, 0, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < ls->count; i++) {
            const json_value_t *o = ls->items[i];
            rr_site_t *l = &rep->live[i];
            rep->nlive = i + 1;
            if (o->type != JSON_OBJECT) {
                fail(c, o->line, o->column, "live_sites[%zu]: expected an object", i);
                return -1;
            }
            if (json_req(c, o, "site", K_STR, &l->site, "live_sites[].") ||
                json_opt(c, o, "api", K_STR, &l->api, "live_sites[].") ||
                json_opt(c, o, "kind", K_STR, &l->kind, "live_sites[].") ||
                json_req(c, o, "bytes", K_U64, &l->bytes, "live_sites[].") ||
                json_opt(c, o, "count", K_U64, &l->count, "live_sites[]."))
                return -1;
        }
    }
    return 0;
}

/* One reader per schema we ever wrote; a new layout adds a line here (and
 * keeps the old readers: old reports stay readable). */
static const struct {
    int schema;
    int (*read)(rctx_t *, const json_value_t *, rr_report_t *);
} json_readers[] = {
    {1, read_schema1},
    {2, read_schema2},
    {3, read_schema3},
    {4, read_schema3}, /* the headline's keys are computed again, not read */
};
#define NREADERS (sizeof json_readers / sizeof json_readers[0])

int rr_schema_newest(void)
{
    int m = 0;
    for (size_t i = 0; i < NREADERS; i++)
        if (json_readers[i].schema > m)
            m = json_readers[i].schema;
    return m;
}

static int load_json(rctx_t *c, const char *text, size_t len, rr_report_t *rep)
{
    json_error_t je;
    json_value_t *root = json_parse(text, len, &je);
    if (!root) {
        fail(c, je.line, je.column, "not valid JSON: %s", je.msg);
        return -1;
    }
    int rc = -1;
    if (root->type != JSON_OBJECT) {
        fail(c, root->line, root->column, "expected a JSON object with \"schema\", found %s",
             json_type_name(root->type));
        goto out;
    }
    const json_value_t *sv = json_get(root, "schema");
    if (!sv) {
        fail(c, root->line, root->column,
             "no \"schema\" in the top-level object: not a rankmem report");
        goto out;
    }
    if (sv->type != JSON_NUMBER || !sv->is_int || sv->negative || sv->u64 > INT_MAX) {
        fail(c, sv->line, sv->column, "schema: expected a positive integer, found %s",
             sv->type == JSON_NUMBER ? "another number" : json_type_name(sv->type));
        goto out;
    }
    int schema = (int)sv->u64;
    int newest = rr_schema_newest();
    if (schema > newest) {
        fail(c, sv->line, sv->column,
             "report schema %d is newer than this rankmem-report reads (schemas 1 to %d); "
             "read it with the rankmem-report of the rankmem that wrote it",
             schema, newest);
        goto out;
    }
    for (size_t i = 0; i < NREADERS; i++)
        if (json_readers[i].schema == schema) {
            rep->schema = schema;
            rep->format = "JSON";
            rc = json_readers[i].read(c, root, rep);
            goto out;
        }
    fail(c, sv->line, sv->column, "unknown report schema %d (this tool reads 1 to %d)", schema,
         newest);
out:
    json_free(root);
    return rc;
}

/* ------------------------------------------------------------------------
 * CSV (RFC 4180, as mpi/report.c writes it). */

typedef struct {
    char **f;       /* fields of the row */
    int *col;       /* the column (byte, from 1) where each starts */
    size_t n, cap;
    int line;       /* where the row starts */
    int last_line;  /* where it ends (a quoted field may span lines) */
} row_t;

static void row_clear(row_t *r)
{
    for (size_t i = 0; i < r->n; i++)
        free(r->f[i]);
    r->n = 0;
}

static void row_free(row_t *r)
{
    row_clear(r);
    free(r->f);
    free(r->col);
}

static int row_push(row_t *r, const char *s, size_t len, int col)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        char **f = realloc(r->f, cap * sizeof *f);
        if (!f)
            return -1;
        r->f = f;
        int *cl = realloc(r->col, cap * sizeof *cl);
        if (!cl)
            return -1;
        r->col = cl;
        r->cap = cap;
    }
    char *d = malloc(len + 1);
    if (!d)
        return -1;
    memcpy(d, s, len);
    d[len] = '\0';
    r->f[r->n] = d;
    r->col[r->n] = col;
    r->n++;
    return 0;
}

typedef struct {
    const char *p, *end, *line_start;
    int line;
    char *buf;
    size_t cap;
} csv_t;

/* Reads one row at p. Returns 1 with a row, 0 at the end, -1 on error. */
static int csv_row(rctx_t *c, csv_t *s, row_t *row)
{
    row_clear(row);
    if (s->p >= s->end)
        return 0;
    row->line = s->line;
    for (;;) {
        size_t len = 0;
        int col = (int)(s->p - s->line_start) + 1;
        int fline = s->line;
        if (s->p < s->end && *s->p == '"') {
            s->p++;
            for (;;) {
                if (s->p >= s->end) {
                    fail(c, fline, col, "quoted field not closed before the end of the file "
                                        "(truncated?)");
                    return -1;
                }
                char ch = *s->p++;
                if (ch == '"') {
                    if (s->p < s->end && *s->p == '"') {
                        s->p++;
                    } else {
                        break;
                    }
                } else if (ch == '\n') {
                    s->line++;
                    s->line_start = s->p;
                }
                if (len + 1 >= s->cap) {
                    size_t cap = s->cap ? s->cap * 2 : 256;
                    char *b = realloc(s->buf, cap);
                    if (!b) {
                        fail(c, fline, col, "out of memory");
                        return -1;
                    }
                    s->buf = b;
                    s->cap = cap;
                }
                s->buf[len++] = ch;
            }
            if (s->p < s->end && *s->p != ',' && *s->p != '\n' && *s->p != '\r') {
                fail(c, s->line, (int)(s->p - s->line_start) + 1,
                     "unexpected character after a quoted field (expected ',' or a line break)");
                return -1;
            }
            if (row_push(row, s->buf ? s->buf : "", len, col) != 0) {
                fail(c, fline, col, "out of memory");
                return -1;
            }
        } else {
            const char *f = s->p;
            while (s->p < s->end && *s->p != ',' && *s->p != '\n' && *s->p != '\r') {
                if (*s->p == '"') {
                    fail(c, s->line, (int)(s->p - s->line_start) + 1,
                         "a quote inside an unquoted field");
                    return -1;
                }
                s->p++;
            }
            if (row_push(row, f, (size_t)(s->p - f), col) != 0) {
                fail(c, fline, col, "out of memory");
                return -1;
            }
        }
        if (s->p >= s->end) {
            row->last_line = s->line;
            return 1;
        }
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        /* end of the row: \n or \r\n */
        if (*s->p == '\r')
            s->p++;
        if (s->p < s->end && *s->p == '\n')
            s->p++;
        row->last_line = s->line;
        s->line++;
        s->line_start = s->p;
        return 1;
    }
}

/* Parses a CSV cell as a field kind. Returns 0 or -1 (message in c). */
static int csv_store(rctx_t *c, const char *text, kind_t kind, void *slot, int line, int col,
                     const char *column)
{
    const char *p = text;
    switch (kind) {
    case K_STR:
        if (set_str((char **)slot, text) != 0) {
            fail(c, line, col, "out of memory");
            return -1;
        }
        return 0;
    case K_DOUBLE: {
        char *end;
        errno = 0;
        double d = strtod(text, &end);
        if (!*text || *end || errno == ERANGE) {
            fail(c, line, col, "column %s: expected a number, found '%.40s'", column, text);
            return -1;
        }
        *(double *)slot = d;
        return 0;
    }
    case K_INT:
    case K_UINT32:
    case K_U64: {
        int neg = 0;
        if (kind == K_INT && *p == '-') {
            neg = 1;
            p++;
        }
        uint64_t m = 0;
        int over = 0;
        if (!*p)
            goto bad;
        for (; *p; p++) {
            if (*p < '0' || *p > '9')
                goto bad;
            unsigned dig = (unsigned)(*p - '0');
            if (m > (UINT64_MAX - dig) / 10)
                over = 1;
            else
                m = m * 10 + dig;
        }
        if (over || (kind == K_INT && m > (neg ? (uint64_t)INT_MAX + 1 : (uint64_t)INT_MAX)) ||
            (kind == K_UINT32 && m > UINT32_MAX)) {
            fail(c, line, col, "column %s: '%.40s' is out of range", column, text);
            return -1;
        }
        if (kind == K_INT)
            *(int *)slot = neg ? (int)(-(int64_t)(m - 1) - 1) : (int)m;
        else if (kind == K_UINT32)
            *(unsigned *)slot = (unsigned)m;
        else
            *(uint64_t *)slot = m;
        return 0;
    }
    }
bad:
    fail(c, line, col, "column %s: expected %s integer, found '%.40s'", column,
         kind == K_INT ? "an" : "a non-negative", text);
    return -1;
}

static int load_csv(rctx_t *c, const char *text, size_t len, rr_report_t *rep)
{
    csv_t s = {text, text + len, text, 1, NULL, 0};
    row_t hdr = {0}, row = {0};
    int *where = calloc(rm_nfields, sizeof *where); /* column index of each record field */
    int rc = -1;
    size_t cap = 0;

    if (!where) {
        fail(c, 0, 0, "out of memory");
        goto out;
    }
    if (csv_row(c, &s, &hdr) != 1)
        goto out;
    for (size_t k = 0; k < rm_nfields; k++) {
        where[k] = -1;
        if (rm_fields[k].kind == RM_K_FLAG)
            continue;
        for (size_t i = 0; i < hdr.n; i++)
            if (strcmp(hdr.f[i], rm_fields[k].key) == 0) {
                where[k] = (int)i;
                break;
            }
        if (where[k] < 0 && required(&rm_fields[k])) {
            fail(c, 1, 0, "the CSV header has no column '%s' (not a rankmem report, or a "
                          "newer layout)", rm_fields[k].key);
            goto out;
        }
    }
    rep->format = "CSV";
    rep->writer_pid = -1;
    for (;;) {
        int got = csv_row(c, &s, &row);
        if (got < 0)
            goto out;
        if (got == 0)
            break;
        if (row.n == 1 && row.f[0][0] == '\0')
            continue; /* a blank line (a trailing one, say) */
        if (row.n != hdr.n) {
            fail(c, row.line, 0, "%zu fields, the header has %zu%s", row.n, hdr.n,
                 row.n < hdr.n ? " (a truncated file?)" : "");
            goto out;
        }
        if (rep->n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            rr_rank_t *nr = realloc(rep->ranks, ncap * sizeof *nr);
            if (!nr) {
                fail(c, row.line, 0, "out of memory");
                goto out;
            }
            rep->ranks = nr;
            cap = ncap;
        }
        rr_rank_t *r = &rep->ranks[rep->n];
        if (rank_init(r) != 0) {
            fail(c, row.line, 0, "out of memory");
            goto out;
        }
        rep->n++;
        for (size_t k = 0; k < rm_nfields; k++) {
            int i = where[k];
            if (i < 0)
                continue;
            const rm_field_t *f = &rm_fields[k];
            union {
                int i;
                unsigned u;
                uint64_t u64;
                double d;
                char *s;
            } val;
            memset(&val, 0, sizeof val);
            kind_t kd = read_kind(f);
            if (f->kind == RM_K_DOUBLE && !row.f[i][0]) {
                r->wall_s = NAN; /* the writer leaves an unknown time empty */
                continue;
            }
            int bad = csv_store(c, row.f[i], kd, &val, row.line, row.col[i], f->key) != 0 ||
                      put_field(c, f, r, &val, row.line, row.col[i], f->key) != 0;
            if (kd == K_STR)
                free(val.s);
            if (bad)
                goto out;
        }
        if (r->rank < 0) {
            fail(c, row.line, row.col[where[0]], "column rank: %d is not a rank", r->rank);
            goto out;
        }
    }
    if (rep->n == 0) {
        fail(c, 1, 0, "a CSV header and no rank rows (truncated?)");
        goto out;
    }
    rc = 0;
out:
    row_free(&hdr);
    row_free(&row);
    free(s.buf);
    free(where);
    return rc;
}

/* ------------------------------------------------------------------------
 * Entry points. */

/* Is the first line a CSV header: fields separated by commas, one of them
 * "rank"? (The writer puts rank first; a spreadsheet may have moved the
 * columns. Missing columns are then named by the CSV reader.) */
static int csv_header(const char *p, const char *end)
{
    int rank = 0, commas = 0;
    while (p < end && *p != '\n') {
        const char *f = p;
        while (p < end && *p != ',' && *p != '\n')
            p++;
        const char *e = p;
        if (e > f && e[-1] == '\r')
            e--;
        if (e - f >= 2 && *f == '"' && e[-1] == '"') {
            f++;
            e--;
        }
        rank |= e - f == 4 && memcmp(f, "rank", 4) == 0;
        if (p < end && *p == ',') {
            p++;
            commas++;
        }
    }
    return rank && commas;
}

int rr_load_buffer(const char *name, const char *text, size_t len, rr_report_t *rep, char *err,
                   size_t cap)
{
    rctx_t c = {name, err, cap, 0};
    memset(rep, 0, sizeof *rep);
    rep->writer_pid = -1;
    if (cap)
        err[0] = '\0';
    const char *p = text, *end = text + len;
    if (len >= 3 && memcmp(p, "\xef\xbb\xbf", 3) == 0) /* a byte order mark */
        p += 3;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    int rc;
    if (p >= end) {
        fail(&c, 0, 0, "empty file: no report in it");
        rc = -1;
    } else if (*p == '{') {
        rc = load_json(&c, text, len, rep);
    } else if (csv_header(p, end)) {
        rc = load_csv(&c, p, (size_t)(end - p), rep);
    } else if (*p == '[') {
        fail(&c, 1, 1, "a JSON array, not a rankmem report (a JSON object with \"schema\")");
        rc = -1;
    } else if (len >= 4 && memcmp(text, "====", 4) == 0) {
        fail(&c, 1, 1, "this is the text report; rankmem-report reads the JSON or CSV one "
                       "(RANKMEM_REPORT_FORMAT=json,csv)");
        rc = -1;
    } else {
        fail(&c, 1, 1, "not a rankmem report: neither JSON (starting with '{') nor CSV (a "
                       "header with a column 'rank')");
        rc = -1;
    }
    if (rc == 0) {
        size_t a, b;
        int d = find_duplicate(rep, &a, &b);
        if (d < 0) {
            fail(&c, 0, 0, "out of memory");
            rc = -1;
        } else if (d > 0) {
            fail(&c, 0, 0, "rank %d appears twice (records %zu and %zu)", rep->ranks[a].rank, a,
                 b);
            rc = -1;
        }
    }
    if (rc == 0) {
        rep->path = dup_str(name);
        if (!rep->path) {
            fail(&c, 0, 0, "out of memory");
            rc = -1;
        }
    }
    if (rc != 0)
        rr_report_free(rep);
    return rc;
}

int rr_load(const char *path, rr_report_t *rep, char *err, size_t cap)
{
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    memset(rep, 0, sizeof *rep);
    if (!f) {
        snprintf(err, cap, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char *buf = NULL;
    size_t len = 0, bcap = 0;
    for (;;) {
        if (len + 65536 + 1 > bcap) {
            size_t nc = bcap ? bcap * 2 : 1 << 17;
            char *nb = realloc(buf, nc);
            if (!nb) {
                snprintf(err, cap, "%s: out of memory reading the file", path);
                free(buf);
                if (!is_stdin)
                    fclose(f);
                return -1;
            }
            buf = nb;
            bcap = nc;
        }
        size_t got = fread(buf + len, 1, bcap - len - 1, f);
        len += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    int e = errno;
    if (!is_stdin)
        fclose(f);
    if (bad) {
        snprintf(err, cap, "%s: cannot read: %s", path, strerror(e));
        free(buf);
        return -1;
    }
    buf[len] = '\0';
    int rc = rr_load_buffer(path, buf, len, rep, err, cap);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------------
 * A job from per-rank files (issue 29). */


/* "x.rank-12.json" */
static int rank_file_name(const char *name)
{
    const char *r = strstr(name, ".rank-");
    if (!r)
        return 0;
    r += 6;
    if (*r < '0' || *r > '9')
        return 0;
    while (*r >= '0' && *r <= '9')
        r++;
    return strcmp(r, ".json") == 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Paths to read: files as given, directories' rank files in name order. */
static int list_files(const char *const *paths, size_t npaths, char ***out, size_t *nout,
                      FILE *errs, size_t *nbad)
{
    char **v = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < npaths; i++) {
        struct stat st;
        size_t first = n;
        if (stat(paths[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            DIR *d = opendir(paths[i]);
            if (!d) {
                fprintf(errs, "rankmem-report: %s: cannot open the directory: %s\n", paths[i],
                        strerror(errno));
                (*nbad)++;
                continue;
            }
            struct dirent *e;
            while ((e = readdir(d)) != NULL) {
                if (e->d_name[0] == '.' || !rank_file_name(e->d_name))
                    continue;
                if (n == cap) {
                    cap = cap ? 2 * cap : 64;
                    char **nv = realloc(v, cap * sizeof *v);
                    if (!nv)
                        goto oom;
                    v = nv;
                }
                size_t l = strlen(paths[i]) + strlen(e->d_name) + 2;
                if (!(v[n] = malloc(l)))
                    goto oom;
                snprintf(v[n++], l, "%s/%s", paths[i], e->d_name);
                continue;
            oom:
                closedir(d);
                for (size_t k = 0; k < n; k++)
                    free(v[k]);
                free(v);
                return -1;
            }
            closedir(d);
            qsort(v + first, n - first, sizeof *v, cmp_str);
            if (n == first) {
                fprintf(errs, "rankmem-report: %s: no per-rank record (*.rank-N.json) in the "
                              "directory\n", paths[i]);
                (*nbad)++;
            }
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nv = realloc(v, cap * sizeof *v);
            if (!nv)
                goto fail;
            v = nv;
        }
        if (!(v[n] = dup_str(paths[i])))
            goto fail;
        n++;
    }
    *out = v;
    *nout = n;
    return 0;
fail:
    for (size_t k = 0; k < n; k++)
        free(v[k]);
    free(v);
    return -1;
}

/* Of two records of one rank: the one a failure wrote, else the later. */
static int better(const rr_rank_t *a, const rr_source_t *sa, const rr_rank_t *b,
                  const rr_source_t *sb)
{
    int fa = sa->phase && strcmp(sa->phase, "failure") == 0;
    int fb = sb->phase && strcmp(sb->phase, "failure") == 0;
    if (fa != fb)
        return fa;
    return !(b->wall_s > a->wall_s);
}

static const rr_report_t *sort_rep; /* for by_rank (qsort has no context) */
static int by_rank(const void *x, const void *y)
{
    size_t a = *(const size_t *)x, b = *(const size_t *)y;
    int ra = sort_rep->ranks[a].rank, rb = sort_rep->ranks[b].rank;
    if (ra != rb)
        return ra < rb ? -1 : 1;
    return a < b ? -1 : a > b; /* the order the files were read */
}

static void source_free(rr_source_t *sc)
{
    free(sc->file);
    free(sc->phase);
    free(sc->trigger);
    for (size_t q = 0; q < sc->nlive; q++) {
        free(sc->live[q].site);
        free(sc->live[q].api);
        free(sc->live[q].kind);
    }
    free(sc->live);
    memset(sc, 0, sizeof *sc);
}

/* Sorts rep's records by rank and keeps one per rank (a failure record
 * over a periodic one, else the later: better()), saying which on errs.
 * The records move in place (each is kilobytes): one cycle walk. */
static int in_rank_order(rr_report_t *rep, FILE *errs)
{
    size_t n = rep->n;
    size_t *ord = malloc((n ? n : 1) * sizeof *ord);
    unsigned char *drop = calloc(n ? n : 1, 1), *done = calloc(n ? n : 1, 1);
    if (!ord || !drop || !done) {
        free(ord);
        free(drop);
        free(done);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        ord[i] = i;
    sort_rep = rep;
    qsort(ord, n, sizeof *ord, by_rank);
    /* ord[k]: the record that belongs at position k. Duplicates: keep one. */
    for (size_t k = 0; k < n;) {
        size_t keep = ord[k], e = k + 1;
        for (; e < n && rep->ranks[ord[e]].rank == rep->ranks[keep].rank; e++) {
            size_t other = ord[e];
            int second = better(&rep->ranks[other], &rep->src[other], &rep->ranks[keep],
                                &rep->src[keep]);
            fprintf(errs, "rankmem-report: rank %d is in both %s and %s; the %s one is used\n",
                    rep->ranks[keep].rank, rep->src[keep].file, rep->src[other].file,
                    second ? "second" : "first");
            if (second) {
                drop[keep] = 1;
                keep = other;
            } else {
                drop[other] = 1;
            }
        }
        k = e;
    }
    for (size_t i = 0; i < n; i++)
        if (drop[i])
            source_free(&rep->src[i]);
    /* Apply the permutation: position k takes record ord[k]. */
    for (size_t i = 0; i < n; i++) {
        if (done[i] || ord[i] == i) {
            done[i] = 1;
            continue;
        }
        rr_rank_t tr = rep->ranks[i];
        rr_source_t ts = rep->src[i];
        unsigned char td = drop[i];
        size_t j = i;
        for (;;) {
            size_t k = ord[j];
            done[j] = 1;
            if (k == i) {
                rep->ranks[j] = tr;
                rep->src[j] = ts;
                drop[j] = td;
                break;
            }
            rep->ranks[j] = rep->ranks[k];
            rep->src[j] = rep->src[k];
            drop[j] = drop[k];
            j = k;
        }
    }
    /* Then the dropped ones out, in order. */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (drop[i])
            continue;
        if (m != i) {
            rep->ranks[m] = rep->ranks[i];
            rep->src[m] = rep->src[i];
        }
        m++;
    }
    rep->n = m;
    free(ord);
    free(drop);
    free(done);
    return 0;
}

int rr_load_job(const char *const *paths, size_t npaths, rr_report_t *rep, FILE *errs)
{
    memset(rep, 0, sizeof *rep);
    rep->writer_pid = -1;
    rep->assembled = 1;
    char **files = NULL;
    size_t nf = 0;
    if (list_files(paths, npaths, &files, &nf, errs, &rep->nbad) != 0)
        return -1;
    rep->nfiles = nf;
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; i < nf && rc == 0; i++) {
        rr_report_t one;
        char err[1024];
        if (rr_load(files[i], &one, err, sizeof err) != 0) {
            fprintf(errs, "rankmem-report: %s\n", err);
            rep->nbad++;
            continue;
        }
        if (one.n != 1 && nf > 1)
            fprintf(errs, "rankmem-report: %s: %zu ranks in one file (a whole report, not a "
                          "rank's record); its ranks are taken as they are\n", files[i], one.n);
        if (!rep->job_id && one.job_id) {
            rep->job_id = dup_str(one.job_id);
            rep->job_id_source = one.job_id_source ? dup_str(one.job_id_source) : NULL;
            rep->generator = one.generator ? dup_str(one.generator) : NULL;
        } else if (rep->job_id && one.job_id && strcmp(rep->job_id, one.job_id) != 0) {
            fprintf(errs, "rankmem-report: %s: job %s, not %s like the files before it; read "
                          "all the same\n", files[i], one.job_id, rep->job_id);
        }
        for (size_t k = 0; k < one.n; k++) {
            const rr_rank_t *r = &one.ranks[k];
            if (r->size > rep->world_size)
                rep->world_size = r->size;
            rr_source_t sc = {dup_str(files[i]), one.phase ? dup_str(one.phase) : NULL,
                              one.trigger ? dup_str(one.trigger) : NULL, NULL, 0};
            if (one.n == 1) { /* the file's sites are its rank's */
                sc.live = one.live;
                sc.nlive = one.nlive;
                one.live = NULL;
                one.nlive = 0;
            }
            if (rep->n == cap) {
                size_t nc = cap ? 2 * cap : 64;
                rr_rank_t *nr = realloc(rep->ranks, nc * sizeof *nr);
                if (nr)
                    rep->ranks = nr;
                rr_source_t *ns = nr ? realloc(rep->src, nc * sizeof *ns) : NULL;
                if (ns)
                    rep->src = ns;
                if (!nr || !ns) {
                    free(sc.file);
                    free(sc.phase);
                    free(sc.trigger);
                    rc = -1;
                    break;
                }
                cap = nc;
            }
            rep->ranks[rep->n] = *r;
            rep->src[rep->n] = sc;
            rep->n++;
        }
        rr_report_free(&one);
    }
    for (size_t i = 0; i < nf; i++)
        free(files[i]);
    free(files);
    if (rc != 0 || rep->n == 0) {
        if (rc == 0)
            fprintf(errs, "rankmem-report: no rank's record could be read\n");
        rr_report_free(rep);
        return -1;
    }
    /* In rank order, one record per rank, and the ranks of the world that
     * left nothing. Sorted, not searched: 100,000 files in seconds. */
    if (in_rank_order(rep, errs) != 0) {
        rr_report_free(rep);
        return -1;
    }
    if (rep->world_size > 0) {
        rep->missing = calloc((size_t)rep->world_size, sizeof *rep->missing);
        if (!rep->missing) {
            rr_report_free(rep);
            return -1;
        }
        size_t j = 0;
        for (int r = 0; r < rep->world_size; r++) {
            while (j < rep->n && rep->ranks[j].rank < r)
                j++;
            if (j >= rep->n || rep->ranks[j].rank != r)
                rep->missing[rep->nmissing++] = r;
        }
    }
    int failed = 0;
    for (size_t i = 0; i < rep->n; i++)
        failed |= rep->ranks[i].fail.kind[0] != 0;
    rep->path = dup_str(npaths == 1 ? paths[0] : "(per-rank files)");
    rep->format = "JSON";
    rep->schema = RM_REPORT_SCHEMA;
    rep->record_version = RM_RECORD_VERSION;
    rep->phase = dup_str(failed ? "failure" : "interval");
    rep->trigger = dup_str("per-rank records");
    if (!rep->job_id)
        rep->job_id = dup_str("nojob");
    return 0;
}
