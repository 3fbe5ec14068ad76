/* rankmem-report: reads the MPI plugin's per-rank memory report (the JSON
 * or the CSV) and prints what a person wants from it in a terminal, draws
 * it as SVG or a standalone HTML page, or compares two runs.
 *
 *   rankmem-report [options] REPORT
 *   rankmem-report --compare OLD NEW
 *
 * docs/report-tool.md is the manual; docs/report.md the files it reads.
 * Exit status: 0 done, 1 a report could not be read or an output written,
 * 2 a usage error. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

#define PROG "rankmem-report"
#define MAX_FILES 4096 /* per-rank files on the command line; more: their directory */

typedef struct {
    rr_text_opts_t t;    /* the terminal report (report/text.c); t.top: also ranks shown in a comparison */
    const char *svg, *html;
    int quiet;           /* no terminal report (with --svg/--html) */
    rr_svg_opts_t svgo;
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [options] REPORT      summary of a report (JSON or CSV; - is stdin)\n"
            "       " PROG " [options] DIR|FILE... a failed job: its per-rank records\n"
            "       " PROG " --compare OLD NEW     what changed between two runs\n"
            "\n"
            "options:\n"
            "  --svg FILE          draw per-rank peak and leaked bytes as SVG (- is stdout)\n"
            "  --html FILE         a standalone HTML page with the summary and the picture\n"
            "  --order rank|peak   bars in rank order (default) or largest peak first\n"
            "  --max-bars N        beyond N ranks, bars are bins of ranks (default 200)\n"
            "  --capacity SIZE     the capacity line at SIZE (80GiB, 512MiB, bytes), or\n"
            "                      'none'; default: the device's, when peaks are visible on it\n"
            "  --top N             ranks listed by peak / by change (default 10)\n"
            "  --bins N            rows of the peak histogram (default 10)\n"
            "  --all               list every node, leaked rank and top rank\n"
            "  -q, --quiet         with --svg/--html: no terminal summary\n"
            "  --version, --help\n"
            "exit status: 0 done, 1 a report could not be read or a file written, 2 usage\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(" PROG " --help says how to use it)\n");
    return 2;
}

/* A count option: 1 to 1,000,000. */
static int parse_count(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 1000000)
        return -1;
    *out = (size_t)v;
    return 0;
}

/* "80GiB", "80G" (binary too), "1.5 TiB", "85899345920". */
static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v > 0))
        return -1;
    while (*end == ' ')
        end++;
    static const struct {
        const char *u;
        double m;
    } units[] = {{"", 1},    {"B", 1},          {"K", 1024.0}, {"KiB", 1024.0},
                 {"M", 1048576.0}, {"MiB", 1048576.0}, {"G", 1073741824.0},
                 {"GiB", 1073741824.0}, {"T", 1099511627776.0}, {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].u) == 0) {
            double b = v * units[i].m;
            if (b >= 1.8e19)
                return -1;
            *out = (uint64_t)(b + 0.5);
            return *out ? 0 : -1;
        }
    return -1;
}


/* ------------------------------------------------------------------------
 * Comparing two runs. */

/* "+20.0%", "-3.1%", "=", "new" (from zero), "-100.0%" */
static const char *pct(char *buf, size_t cap, double old, double now)
{
    if (old == now)
        snprintf(buf, cap, "=");
    else if (old == 0)
        snprintf(buf, cap, "new");
    else {
        double p = 100.0 * (now - old) / old;
        /* a small change still shows as one, not as +0.0% */
        snprintf(buf, cap, fabs(p) < 0.05 ? "%+.1g%%" : "%+.1f%%", p);
    }
    return buf;
}

/* A signed difference of a field, for people. */
static const char *delta(char *buf, size_t cap, int field, double d)
{
    char t[24];
    rr_fmt_field(t, sizeof t, field, fabs(d), rr_fields[field].unit == RR_UNIT_COUNT);
    snprintf(buf, cap, "%s%s", d > 0 ? "+" : d < 0 ? "-" : "", t);
    return buf;
}

static const rr_rank_t *cmp_ranks;
static int cmp_rank_idx(const void *x, const void *y)
{
    int a = cmp_ranks[*(const size_t *)x].rank, b = cmp_ranks[*(const size_t *)y].rank;
    return (a > b) - (a < b);
}

typedef struct {
    size_t oi, ni; /* indices in old and new */
    double d;      /* new - old */
} moved_t;

static int cmp_moved(const void *x, const void *y)
{
    const moved_t *a = x, *b = y;
    double p = fabs(a->d), q = fabs(b->d);
    if (p != q)
        return p < q ? 1 : -1;
    return (a->oi > b->oi) - (a->oi < b->oi);
}

static void print_moved(FILE *o, const rr_report_t *old, const rr_report_t *now, moved_t *m,
                        size_t nm, int field, size_t limit, const char *title)
{
    char b1[32], b2[32], b3[32], b4[32], s1[80];
    for (size_t i = 0; i < nm; i++)
        m[i].d = (double)rm_value(&now->ranks[m[i].ni], field) -
                 (double)rm_value(&old->ranks[m[i].oi], field);
    qsort(m, nm, sizeof *m, cmp_moved);
    size_t changed = 0;
    for (size_t i = 0; i < nm; i++)
        changed += m[i].d != 0;
    fprintf(o, "\n%s (%zu of %zu ranks in both changed)\n", title, changed, nm);
    if (!changed) {
        fprintf(o, "  none\n");
        return;
    }
    fprintf(o, "  %6s  %-20s %12s %12s %13s %9s\n", "rank", "host (new)", "old", "new", "change",
            "%");
    for (size_t i = 0; i < nm && i < limit && m[i].d != 0; i++) {
        const rr_rank_t *a = &old->ranks[m[i].oi], *b = &now->ranks[m[i].ni];
        fprintf(o, "  %6d  %-20s %12s %12s %13s %9s\n", b->rank, rr_safe(b->host, s1, sizeof s1),
                rr_fmt_bytes(b1, sizeof b1, (double)rm_value(a, field)),
                rr_fmt_bytes(b2, sizeof b2, (double)rm_value(b, field)),
                delta(b3, sizeof b3, field, m[i].d),
                pct(b4, sizeof b4, (double)rm_value(a, field), (double)rm_value(b, field)));
    }
    if (changed > limit)
        fprintf(o, "  ... %zu more changed (--top N)\n", changed - limit);
}

static void describe_run(FILE *o, const char *which, const rr_analysis_t *a)
{
    char s1[300], s2[80];
    const rr_report_t *r = a->rep;
    fprintf(o, "  %-4s %s: %s", which, rr_safe(r->path, s1, sizeof s1), r->format);
    if (r->schema)
        fprintf(o, " schema %d", r->schema);
    fprintf(o, ", %zu ranks on %zu node%s", r->n, a->nnodes, a->nnodes == 1 ? "" : "s");
    if (r->phase)
        fprintf(o, ", %s", rr_safe(r->phase, s2, sizeof s2));
    if (r->time)
        fprintf(o, ", %s", rr_safe(r->time, s1, sizeof s1));
    fprintf(o, "; %s\n", rm_headline_label(a->source));
}

/* Peaks per phase, matched by name (the n-th phase of a name with the
 * n-th of the same name in the other run). */
static void compare_phases(FILE *o, const rr_report_t *old, const rr_report_t *now)
{
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], s1[80];
    if (!old->nphases && !now->nphases)
        return;
    fprintf(o, "\n%-26s %12s %12s %8s %12s %12s %8s\n", "peaks per phase", "old max", "new max",
            "change", "old mean", "new mean", "change");
    char *used = calloc(old->nphases ? old->nphases : 1, 1);
    if (!used)
        return;
    for (size_t i = 0; i < now->nphases; i++) {
        const rr_phase_t *y = &now->phases[i], *x = NULL;
        for (size_t j = 0; j < old->nphases && !x; j++)
            if (!used[j] && strcmp(old->phases[j].name, y->name) == 0) {
                used[j] = 1;
                x = &old->phases[j];
            }
        if (x)
            fprintf(o, "  %-24s %12s %12s %8s %12s %12s %8s\n", rr_safe(y->name, s1, sizeof s1),
                    rr_fmt_bytes(b1, sizeof b1, (double)x->peak_max),
                    rr_fmt_bytes(b2, sizeof b2, (double)y->peak_max),
                    pct(b3, sizeof b3, (double)x->peak_max, (double)y->peak_max),
                    rr_fmt_bytes(b4, sizeof b4, x->peak_mean),
                    rr_fmt_bytes(b5, sizeof b5, y->peak_mean),
                    pct(b6, sizeof b6, x->peak_mean, y->peak_mean));
        else
            fprintf(o, "  %-24s %12s %12s %8s %12s %12s %8s\n", rr_safe(y->name, s1, sizeof s1),
                    "-", rr_fmt_bytes(b2, sizeof b2, (double)y->peak_max), "new", "-",
                    rr_fmt_bytes(b5, sizeof b5, y->peak_mean), "new");
    }
    for (size_t j = 0; j < old->nphases; j++)
        if (!used[j])
            fprintf(o, "  %-24s %12s %12s %8s %12s %12s %8s\n",
                    rr_safe(old->phases[j].name, s1, sizeof s1),
                    rr_fmt_bytes(b1, sizeof b1, (double)old->phases[j].peak_max), "-", "gone",
                    rr_fmt_bytes(b4, sizeof b4, old->phases[j].peak_mean), "-", "gone");
    free(used);
}

static int compare(FILE *o, const rr_analysis_t *ao, const rr_analysis_t *an, const opts_t *op)
{
    const rr_report_t *old = ao->rep, *now = an->rep;
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], i1[16], i2[16];
    fprintf(o, "rankmem memory report: comparison\n");
    describe_run(o, "old", ao);
    describe_run(o, "new", an);
    /* Peaks of two different memories would compare as a change. */
    int src = ao->source == an->source ? an->source : RM_SRC_MIXED;
    if (ao->source != an->source)
        fprintf(o, "  note: the runs count different memories (old %s, new %s): peaks, leaks "
                   "and totals below compare these\n", rm_source_name(ao->source),
                rm_source_name(an->source));

    fprintf(o, "\n%-19s %12s %12s %8s %12s %12s %8s  %s\n", "aggregates", "old max", "new max",
            "change", "old mean", "new mean", "change", "max/mean old -> new");
    for (int f = 0; f < RR_NAGG; f++) {
        const rr_agg_t *x = &ao->agg[f], *y = &an->agg[f];
        if (!rm_agg_shown(f, src))
            continue;
        if (isfinite(x->imbalance))
            snprintf(i1, sizeof i1, "%.2f", x->imbalance);
        else
            snprintf(i1, sizeof i1, "-");
        if (isfinite(y->imbalance))
            snprintf(i2, sizeof i2, "%.2f", y->imbalance);
        else
            snprintf(i2, sizeof i2, "-");
        int exact = rr_fields[f].unit == RR_UNIT_COUNT;
        fprintf(o, "  %-17s %12s %12s %8s %12s %12s %8s  %s -> %s\n", rr_field_label(an, f),
                rr_fmt_field(b1, sizeof b1, f, (double)x->max, exact),
                rr_fmt_field(b2, sizeof b2, f, (double)y->max, exact),
                pct(b3, sizeof b3, (double)x->max, (double)y->max),
                rr_fmt_field(b4, sizeof b4, f, x->mean, 0),
                rr_fmt_field(b5, sizeof b5, f, y->mean, 0), pct(b6, sizeof b6, x->mean, y->mean),
                i1, i2);
    }
    fprintf(o, "  %-17s %12s %12s %8s\n", "leaking ranks", (snprintf(b1, sizeof b1, "%zu",
            ao->nleaked), b1), (snprintf(b2, sizeof b2, "%zu", an->nleaked), b2),
            pct(b3, sizeof b3, (double)ao->nleaked, (double)an->nleaked));

    /* Match ranks by number: sort the new run's indices by rank. */
    size_t *idx = malloc((now->n ? now->n : 1) * sizeof *idx);
    moved_t *m = malloc((old->n ? old->n : 1) * sizeof *m);
    if (!idx || !m) {
        free(idx);
        free(m);
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < now->n; i++)
        idx[i] = i;
    cmp_ranks = now->ranks;
    qsort(idx, now->n, sizeof *idx, cmp_rank_idx);
    size_t nm = 0, only_old = 0;
    int only_old_list[8], nool = 0;
    for (size_t i = 0; i < old->n; i++) {
        int want = old->ranks[i].rank;
        size_t lo = 0, hi = now->n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (now->ranks[idx[mid]].rank < want)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < now->n && now->ranks[idx[lo]].rank == want) {
            m[nm].oi = i;
            m[nm].ni = idx[lo];
            nm++;
        } else {
            only_old++;
            if (nool < 8)
                only_old_list[nool++] = want;
        }
    }
    size_t only_new = now->n - nm;
    if (only_old || only_new) {
        fprintf(o, "\nranks: %zu in both, %zu only in old", nm, only_old);
        for (int k = 0; k < nool; k++)
            fprintf(o, "%s%d", k ? ", " : " (", only_old_list[k]);
        if (nool)
            fprintf(o, "%s)", only_old > (size_t)nool ? ", ..." : "");
        fprintf(o, ", %zu only in new\n", only_new);
    }
    size_t limit = op->t.all ? nm : op->t.top;
    /* The headline, as in each run's own report (rm_headline). */
    print_moved(o, old, now, m, nm, RM_MEM_PEAK, limit, "ranks whose peak moved most");
    print_moved(o, old, now, m, nm, RM_MEM_CURRENT, limit,
                an->final ? "ranks whose leaked bytes moved most"
                          : "ranks whose live bytes moved most");
    if (rr_has_observed(old) || rr_has_observed(now))
        print_moved(o, old, now, m, nm, RR_OBS_GPU_PEAK, limit,
                    "ranks whose observed GPU peak moved most");
    compare_phases(o, old, now);
    free(idx);
    free(m);
    return 0;
}

/* ------------------------------------------------------------------------ */

static int write_picture(const char *path, int html, const rr_analysis_t *a, const opts_t *op)
{
    int to_stdout = strcmp(path, "-") == 0;
    FILE *f = to_stdout ? stdout : fopen(path, "w");
    if (!f) {
        fprintf(stderr, PROG ": cannot write '%s': %s\n", path, strerror(errno));
        return 1;
    }
    int rc = html ? rr_write_html(f, a, &op->svgo) : rr_write_svg(f, a, &op->svgo);
    int e = errno;
    if (to_stdout) {
        if (fflush(f) != 0)
            rc = -1, e = errno;
    } else if (fclose(f) != 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc != 0) {
        fprintf(stderr, PROG ": writing '%s' failed: %s\n", path, strerror(e));
        return 1;
    }
    return 0;
}

static int load(const char *path, rr_report_t *rep, rr_analysis_t *a)
{
    char err[1024];
    if (rr_load(path, rep, err, sizeof err) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    if (rr_analyse(rep, a) != 0) {
        fprintf(stderr, PROG ": %s: out of memory\n", path);
        rr_report_free(rep);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts_t op = {RR_TEXT_OPTS_DEFAULT, NULL, NULL, 0, {0, 200, RR_CAP_AUTO, 0}};
    static const char *files[MAX_FILES];
    int nfiles = 0, cmp = 0;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *val = NULL;
        char name[32];
        /* --opt=value or --opt value */
        if (strncmp(arg, "--", 2) == 0 && strchr(arg, '=')) {
            size_t n = (size_t)(strchr(arg, '=') - arg);
            if (n >= sizeof name)
                return usage_error("unknown option '%s'", arg);
            memcpy(name, arg, n);
            name[n] = '\0';
            val = arg + n + 1;
            arg = name;
        }
#define NEEDS_VALUE()                                                                      \
    do {                                                                                   \
        if (!val) {                                                                        \
            if (i + 1 >= argc)                                                             \
                return usage_error("%s needs a value", arg);                               \
            val = argv[++i];                                                               \
        }                                                                                  \
    } while (0)
        /* the options without a value refuse one */
        if (val && (strcmp(arg, "--help") == 0 || strcmp(arg, "--version") == 0 ||
                    strcmp(arg, "--compare") == 0 || strcmp(arg, "--all") == 0 ||
                    strcmp(arg, "--quiet") == 0))
            return usage_error("%s takes no value", arg);
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(arg, "--version") == 0) {
            printf(PROG " (rankmem) %s; reads report schemas 1 to %d and the CSV\n",
                   PACKAGE_VERSION, rr_schema_newest());
            return 0;
        } else if (strcmp(arg, "--compare") == 0) {
            cmp = 1;
        } else if (strcmp(arg, "--svg") == 0) {
            NEEDS_VALUE();
            op.svg = val;
        } else if (strcmp(arg, "--html") == 0) {
            NEEDS_VALUE();
            op.html = val;
        } else if (strcmp(arg, "--order") == 0) {
            NEEDS_VALUE();
            if (strcmp(val, "rank") == 0)
                op.svgo.order_by_peak = 0;
            else if (strcmp(val, "peak") == 0)
                op.svgo.order_by_peak = 1;
            else
                return usage_error("--order: '%s' is neither 'rank' nor 'peak'", val);
        } else if (strcmp(arg, "--max-bars") == 0) {
            NEEDS_VALUE();
            if (parse_count(val, &op.svgo.max_bars) != 0 || op.svgo.max_bars > 5000)
                return usage_error("--max-bars: '%s' is not a number from 1 to 5000", val);
        } else if (strcmp(arg, "--capacity") == 0) {
            NEEDS_VALUE();
            if (strcmp(val, "none") == 0) {
                op.svgo.capacity_mode = RR_CAP_HIDE;
            } else if (strcmp(val, "auto") == 0) {
                op.svgo.capacity_mode = RR_CAP_AUTO;
                op.svgo.capacity = 0;
            } else if (parse_size(val, &op.svgo.capacity) == 0) {
                op.svgo.capacity_mode = RR_CAP_SHOW;
            } else {
                return usage_error("--capacity: '%s' is not a size (80GiB, 512MiB, bytes), "
                                   "'auto' or 'none'", val);
            }
        } else if (strcmp(arg, "--top") == 0) {
            NEEDS_VALUE();
            if (parse_count(val, &op.t.top) != 0)
                return usage_error("--top: '%s' is not a positive number", val);
        } else if (strcmp(arg, "--bins") == 0) {
            size_t b;
            NEEDS_VALUE();
            if (parse_count(val, &b) != 0 || b > 100)
                return usage_error("--bins: '%s' is not a number from 1 to 100", val);
            op.t.hist_bins = (int)b;
        } else if (strcmp(arg, "--all") == 0) {
            op.t.all = 1;
        } else if (strcmp(arg, "-q") == 0 || strcmp(arg, "--quiet") == 0) {
            op.quiet = 1;
        } else if (arg[0] == '-' && arg[1] != '\0') {
            return usage_error("unknown option '%s'", argv[i]);
        } else {
            if (val)
                return usage_error("unknown option '%s'", argv[i]);
            if (nfiles == MAX_FILES)
                return usage_error("too many files ('%s'); give their directory", arg);
            files[nfiles++] = arg;
        }
#undef NEEDS_VALUE
    }

    if (cmp) {
        if (nfiles != 2)
            return usage_error("--compare needs two reports, OLD and NEW");
        if (op.svg || op.html)
            return usage_error("--svg and --html draw one report, not a comparison");
        if (strcmp(files[0], "-") == 0 && strcmp(files[1], "-") == 0)
            return usage_error("only one of OLD and NEW can be stdin");
        rr_report_t r1, r2;
        rr_analysis_t a1, a2;
        if (load(files[0], &r1, &a1) != 0)
            return 1;
        if (load(files[1], &r2, &a2) != 0) {
            rr_analysis_free(&a1);
            rr_report_free(&r1);
            return 1;
        }
        int rc = compare(stdout, &a1, &a2, &op);
        rr_analysis_free(&a1);
        rr_analysis_free(&a2);
        rr_report_free(&r1);
        rr_report_free(&r2);
        if (fflush(stdout) != 0)
            rc = 1;
        return rc;
    }
    struct stat dst;
    int job = nfiles > 1 || (nfiles == 1 && stat(files[0], &dst) == 0 && S_ISDIR(dst.st_mode));
    if (nfiles < 1)
        return usage_error("which report? (a .json or .csv file, -, or a failed job's "
                           "directory or per-rank files)");
    if (op.svg && op.html && strcmp(op.svg, "-") == 0 && strcmp(op.html, "-") == 0)
        return usage_error("--svg and --html cannot both go to stdout");
    if ((op.svg && strcmp(op.svg, files[0]) == 0) || (op.html && strcmp(op.html, files[0]) == 0))
        return usage_error("the picture would overwrite the report '%s'", files[0]);

    rr_report_t rep;
    rr_analysis_t a;
    int rc = 0;
    if (job) {
        /* A failed job: every rank's own file; what cannot be read is
         * named and the rest reported (exit status 1 then). */
        if (rr_load_job(files, (size_t)nfiles, &rep, stderr) != 0)
            return 1;
        if (rr_analyse(&rep, &a) != 0) {
            fprintf(stderr, PROG ": out of memory\n");
            rr_report_free(&rep);
            return 1;
        }
        rc = rep.nbad ? 1 : 0;
    } else if (load(files[0], &rep, &a) != 0) {
        return 1;
    }
    int picture_to_stdout = (op.svg && strcmp(op.svg, "-") == 0) ||
                            (op.html && strcmp(op.html, "-") == 0);
    if (!op.quiet && !picture_to_stdout)
        rr_write_text(stdout, &a, &op.t);
    if (op.svg && write_picture(op.svg, 0, &a, &op) != 0)
        rc = 1;
    if (op.html && write_picture(op.html, 1, &a, &op) != 0)
        rc = 1;
    if (!op.quiet && !picture_to_stdout) {
        if (op.svg && !rc && strcmp(op.svg, "-") != 0)
            printf("\nSVG written to %s\n", op.svg);
        if (op.html && !rc && strcmp(op.html, "-") != 0)
            printf("%sHTML written to %s\n", op.svg ? "" : "\n", op.html);
    }
    rr_analysis_free(&a);
    rr_report_free(&rep);
    if (fflush(stdout) != 0) {
        fprintf(stderr, PROG ": writing the output failed: %s\n", strerror(errno));
        rc = 1;
    }
    return rc;
}
