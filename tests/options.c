/* RANKMEM_* options: read once from the environment (set here before the
 * first use), typed getters, a bad value is RANKMEM_ERR_CONFIG naming the
 * variable, unknown RANKMEM_* variables are warned about once on stderr,
 * option_info/option_get/option_check and their bad inputs. Other
 * environments are tried in child processes (the options are read once per
 * process): this program re-runs itself with "child" and the variables set.
 *
 * Linked statically (-static in am/config.am) to reach the library's hidden
 * getters rk_option_* and rk_resource_from_spec_named. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <rankmem.h>
#include "tap.h"

/* The library's hidden internals (src/config_internal.h). Weak: when the
 * library was configured --disable-static, -static links the shared library,
 * where they are invisible; they are NULL then and their tests are skipped. */
#define WEAK __attribute__((weak))
WEAK rankmem_status_t rk_option_size(const char *name, size_t *value_p);
WEAK rankmem_status_t rk_option_bool(const char *name, int *value_p);
WEAK rankmem_status_t rk_option_int(const char *name, long *value_p);
WEAK rankmem_status_t rk_option_string(const char *name, const char **value_p);
WEAK rankmem_status_t rk_resource_from_spec_named(const char *origin, const char *spec,
                                                  rankmem_resource_t **mr_p);

#define CFG "bad configuration: "

/* Run fn with stderr going to a temporary file; returns what was written (malloc'd). */
static char *capture_stderr(void (*fn)(void))
{
    char path[] = "/tmp/rankmem-options-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        BAIL_OUT("mkstemp failed");
    unlink(path);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    off_t n = lseek(fd, 0, SEEK_END);
    char *out = calloc(1, (size_t)n + 1);
    if (n > 0 && pread(fd, out, (size_t)n, 0) != n)
        out[0] = '\0';
    close(fd);
    return out;
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* ---- first use: from 8 threads at once ---- */

static void *first_user(void *arg)
{
    size_t v = 0;
    const char *s = NULL;
    if (rankmem_option_get("RANKMEM_STAGING_POOL", &s) == RANKMEM_SUCCESS)
        rankmem_parse_size(s, 0, &v);
    *(size_t *)arg = v;
    return NULL;
}

static size_t seen[8];

static void first_use(void)
{
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, first_user, &seen[i]);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
}

static void later_use(void)
{
    const char *s;
    rankmem_option_info_t o;
    rankmem_option_get("RANKMEM_REPORT", &s);
    rankmem_option_info(0, &o);
    rankmem_option_check(1);
    if (rk_option_size) {
        size_t v;
        rk_option_size("RANKMEM_STAGING_POOL", &v);
        rk_option_string("RANKMEM_BIND", &s);
    }
}

static void expect_error(rankmem_status_t st, rankmem_status_t want, const char *msg,
                         const char *what)
{
    if (!ok(st == want && strcmp(rankmem_last_error(), msg) == 0, "%s", what))
        diag("  got %s: %s\n#   want %s", rankmem_status_string(st), rankmem_last_error(), msg);
}

/* ---- child processes: other environments ---- */

/* Runs this program as "child" with env (NULL-terminated "NAME=value"
 * list, nothing else of RANKMEM_*) and returns its stdout and stderr. */
static char *run_child(const char *self, const char *const *env)
{
    int fds[2];
    if (pipe(fds) != 0)
        BAIL_OUT("pipe failed");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        extern char **environ;
        /* Drop every RANKMEM_* of the parent. */
        for (;;) {
            char **e = environ;
            while (*e && strncmp(*e, "RANKMEM_", 8) != 0)
                e++;
            if (!*e)
                break;
            char name[256];
            size_t n = strcspn(*e, "=");
            snprintf(name, sizeof name, "%.*s", (int)n, *e);
            unsetenv(name);
        }
        for (const char *const *e = env; *e; e++)
            putenv((char *)*e);
        execl(self, self, "child", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    ssize_t r;
    while ((r = read(fds[0], out + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (cap - len < 2)
            out = realloc(out, cap *= 2);
    }
    out[len] = '\0';
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    return out;
}

/* Child: every option's check, one line each: "NAME: status: message". */
static int child(void)
{
    size_t n = 0;
    rankmem_option_count(&n);
    for (size_t i = 0; i < n; i++) {
        rankmem_option_info_t o;
        rankmem_option_info(i, &o);
        rankmem_status_t st = rankmem_option_check(i);
        printf("%s=%s: %s\n", o.name, o.value,
               st == RANKMEM_SUCCESS ? "ok" : rankmem_last_error());
    }
    return 0;
}

/* A child with env set prints line for its option (a prefix when it ends in "..."). */
static void child_says(const char *self, const char *label, const char *env1, const char *line)
{
    const char *env[] = {env1, NULL};
    char *out = run_child(self, env);
    char want[512];
    snprintf(want, sizeof want, "%s", line);
    size_t wl = strlen(want);
    int prefix = wl > 3 && strcmp(want + wl - 3, "...") == 0;
    if (prefix)
        want[wl - 3] = '\0';
    else
        strcat(want, "\n");
    if (!ok(strstr(out, want) != NULL, "%s%s -> %s", label, env1, line))
        diag("  child said:\n%s", out);
    free(out);
}

static void test_children(const char *self)
{
    static const char *const quiet_env[] = {"RANKMEM_WARN_UNKNOWN=off", "RANKMEM_TYPO=1", NULL};
    char *out = run_child(self, quiet_env);
    ok(!strstr(out, "unknown variable") && strstr(out, "RANKMEM_WARN_UNKNOWN=off: ok"),
       "RANKMEM_WARN_UNKNOWN=off: no warning about RANKMEM_TYPO");
    free(out);

    static const char *const bad_switch[] = {"RANKMEM_WARN_UNKNOWN=perhaps",
                                             "RANKMEM_QUIT=1", NULL};
    out = run_child(self, bad_switch);
    ok(strstr(out, "rankmem: unknown variable RANKMEM_QUIT (did you mean RANKMEM_QUIET?)") &&
           strstr(out, "RANKMEM_WARN_UNKNOWN=perhaps: " CFG "RANKMEM_WARN_UNKNOWN: bad boolean "
                       "'perhaps': expected 1/0, on/off, yes/no or true/false"),
       "a bad RANKMEM_WARN_UNKNOWN still warns, and is itself reported");
    free(out);

    static const struct {
        const char *env, *line;
    } enums[] = {
        {"RANKMEM_BIND=none", "RANKMEM_BIND=none: ok"},
        {"RANKMEM_BIND=nearest", "RANKMEM_BIND=nearest: ok"},
        {"RANKMEM_BIND=list:3", "RANKMEM_BIND=list:3: ok"},
        {"RANKMEM_BIND=list:0,1,2,3", "RANKMEM_BIND=list:0,1,2,3: ok"},
        {"RANKMEM_BIND=nearst", "RANKMEM_BIND=nearst: " CFG "RANKMEM_BIND: bad value 'nearst': "
                                "expected auto, none, nearest or list:... (did you mean "
                                "'nearest'?)"},
        {"RANKMEM_BIND=list:", "RANKMEM_BIND=list:: " CFG "RANKMEM_BIND: bad value 'list:'..."},
        {"RANKMEM_BIND=list:0,,1", "RANKMEM_BIND=list:0,,1: " CFG "RANKMEM_BIND: bad value..."},
        {"RANKMEM_BIND=list:a", "RANKMEM_BIND=list:a: " CFG "RANKMEM_BIND: bad value..."},
        {"RANKMEM_BIND=list:1,", "RANKMEM_BIND=list:1,: " CFG "RANKMEM_BIND: bad value..."},
        {"RANKMEM_BIND=AUTO", "RANKMEM_BIND=AUTO: " CFG "RANKMEM_BIND: bad value..."},
        {"RANKMEM_STAGING=on", "RANKMEM_STAGING=on: ok"},
        {"RANKMEM_STAGING=", "RANKMEM_STAGING=: " CFG "RANKMEM_STAGING: bad value ''..."},
        {"RANKMEM_STAGING_CHUNK=2^20", "RANKMEM_STAGING_CHUNK=2^20: ok"},
        {"RANKMEM_STAGING_CHUNK=", "RANKMEM_STAGING_CHUNK=: " CFG "RANKMEM_STAGING_CHUNK: bad "
                                   "size '': empty (default: 4MiB)"},
        {"RANKMEM_STAGING_POOL=10%", "RANKMEM_STAGING_POOL=10%: " CFG "RANKMEM_STAGING_POOL: bad "
                                     "size '10%': % not allowed here (default: 256MiB)"},
        {"RANKMEM_QUIET=no", "RANKMEM_QUIET=no: ok"},
        {"RANKMEM_RESOURCE=stats>pool(max=90%)>cuda", "RANKMEM_RESOURCE=stats>pool(max=90%)>cuda: ok"},
        {"RANKMEM_RESOURCE=pool>sytem", "RANKMEM_RESOURCE=pool>sytem: " CFG "RANKMEM_RESOURCE: at "
                                        "6: unknown resource 'sytem' (did you mean 'system'?)"},
        {"RANKMEM_RESOURCE=", "RANKMEM_RESOURCE=: " CFG "RANKMEM_RESOURCE: at 1: empty spec..."},
    };
    for (size_t i = 0; i < sizeof enums / sizeof enums[0]; i++)
        child_says(self, "", enums[i].env, enums[i].line);

    /* Issue 31, defect 5: values the option check passed that were refused
     * (or ignored) only when used. */
    static const struct {
        const char *env, *line;
    } defect5[] = {
        {"RANKMEM_REPORT_FORMAT=xml", "RANKMEM_REPORT_FORMAT=xml: " CFG "RANKMEM_REPORT_FORMAT: "
                                      "unknown item 'xml' in 'xml': expected a comma-separated "
                                      "list of text, json, csv or timeline"},
        {"RANKMEM_REPORT_FORMAT=json,jsn", "RANKMEM_REPORT_FORMAT=json,jsn: " CFG
                                           "RANKMEM_REPORT_FORMAT: unknown item 'jsn' in "
                                           "'json,jsn': expected a comma-separated list of text, "
                                           "json, csv or timeline (did you mean 'json'?)"},
        {"RANKMEM_REPORT_FORMAT= JSON , csv,timeline", "RANKMEM_REPORT_FORMAT= JSON , "
                                                       "csv,timeline: ok"},
        {"RANKMEM_REPORT_FORMAT=", "RANKMEM_REPORT_FORMAT=: ok"},
        {"RANKMEM_RESOURCE=aligned(alignment=1TiB)>system",
         "RANKMEM_RESOURCE=aligned(alignment=1TiB)>system: " CFG "RANKMEM_RESOURCE: at 19: "
         "aligned.alignment must be a power of two from 256 to 1GiB (RANKMEM_MAX_ALIGNMENT), not "
         "1099511627776"},
        {"RANKMEM_RESOURCE=aligned(alignment=1GiB)>system",
         "RANKMEM_RESOURCE=aligned(alignment=1GiB)>system: ok"},
        {"RANKMEM_RESOURCE=limit(bytes=0)>system", "RANKMEM_RESOURCE=limit(bytes=0)>system: " CFG
                                                   "RANKMEM_RESOURCE: at 13: limit.bytes of 0 "
                                                   "would refuse every allocation"},
        {"RANKMEM_STAGING_CHUNK=1KiB", "RANKMEM_STAGING_CHUNK=1KiB: " CFG "RANKMEM_STAGING_CHUNK: "
                                       "1024 bytes is out of range: expected 64 KiB to 1024 MiB"},
        {"RANKMEM_STAGING_POOL=128GiB", "RANKMEM_STAGING_POOL=128GiB: " CFG "RANKMEM_STAGING_POOL: "
                                        "137438953472 bytes is out of range: expected 64 KiB to "
                                        "65536 MiB"},
        {"RANKMEM_STAGING_POOL=1MiB", "RANKMEM_STAGING_POOL=1MiB: " CFG "RANKMEM_STAGING_POOL: 1024 "
                                      "KiB is smaller than RANKMEM_STAGING_CHUNK (4096 KiB)"},
        {"RANKMEM_STAGING_IPC_CACHE=0", "RANKMEM_STAGING_IPC_CACHE=0: " CFG
                                        "RANKMEM_STAGING_IPC_CACHE: 0 is out of range: expected 1 "
                                        "to 65536 mappings"},
        {"RANKMEM_STAGING_IPC_CACHE=64", "RANKMEM_STAGING_IPC_CACHE=64: ok"},
    };
    for (size_t i = 0; i < sizeof defect5 / sizeof defect5[0]; i++)
        child_says(self, "defect 5: ", defect5[i].env, defect5[i].line);
}

/* The hidden typed getters and rk_resource_from_spec_named. */
#define INTERNAL_TESTS 27
static void test_internal(void)
{
    size_t sz = 0;
    is_status(rk_option_size("RANKMEM_STAGING_POOL", &sz), RANKMEM_SUCCESS, "size getter");
    ok(sz == (size_t)1 << 30, "  RANKMEM_STAGING_POOL=1GiB, read once (%zu)", sz);

    /* Typed getters. */
    int b = -1;
    is_status(rk_option_bool("RANKMEM_QUIET", &b), RANKMEM_SUCCESS, "bool getter");
    ok(b == 1, "  RANKMEM_QUIET=yes is 1");
    b = -1;
    is_status(rk_option_bool("RANKMEM_WARN_UNKNOWN", &b), RANKMEM_SUCCESS, "bool getter, default");
    ok(b == 1, "  RANKMEM_WARN_UNKNOWN defaults to on");
    const char *s = NULL;
    is_status(rk_option_string("RANKMEM_BIND", &s), RANKMEM_SUCCESS, "enum through the string getter");
    ok(s && strcmp(s, "list:0,1,3") == 0, "  RANKMEM_BIND=%s", s ? s : "(null)");
    s = NULL;
    is_status(rk_option_string("RANKMEM_REPORT", &s), RANKMEM_SUCCESS, "string getter");
    ok(s && strcmp(s, "/tmp/report.json") == 0, "  RANKMEM_REPORT=%s", s ? s : "(null)");
    s = NULL;
    is_status(rk_option_string("RANKMEM_LOG_FILE", &s), RANKMEM_SUCCESS, "string getter, default");
    ok(s && strcmp(s, "") == 0, "  RANKMEM_LOG_FILE defaults to empty");

    /* Bad values: CONFIG naming the variable, output untouched. */
    sz = 77;
    expect_error(rk_option_size("RANKMEM_STAGING_CHUNK", &sz), RANKMEM_ERR_CONFIG,
                 CFG "RANKMEM_STAGING_CHUNK: bad size 'abc': not a number (default: 4MiB)",
                 "bad size: CONFIG naming the variable and the default");
    ok(sz == 77, "  output untouched");
    s = "untouched";
    expect_error(rk_option_string("RANKMEM_STAGING", &s), RANKMEM_ERR_CONFIG,
                 CFG "RANKMEM_STAGING: bad value 'sometimes': expected auto, on or off",
                 "bad enum: CONFIG naming the variable and the choices");
    ok(strcmp(s, "untouched") == 0, "  output untouched");
    expect_error(rk_option_string("RANKMEM_RESOURCE", &s), RANKMEM_ERR_CONFIG,
                 CFG "RANKMEM_RESOURCE: at 12: unknown option 'intial' for pool (did you mean "
                     "'initial'?)",
                 "bad spec in RANKMEM_RESOURCE: position and suggestion");

    /* Getter misuse. */
    is_status(rk_option_size("RANKMEM_QUIET", &sz), RANKMEM_ERR_INVALID_ARGUMENT,
              "size getter of a bool option");
    is_status(rk_option_bool("RANKMEM_STAGING_POOL", &b), RANKMEM_ERR_INVALID_ARGUMENT,
              "bool getter of a size option");
    long l;
    is_status(rk_option_int("RANKMEM_QUIET", &l), RANKMEM_ERR_INVALID_ARGUMENT,
              "int getter of a bool option");
    is_status(rk_option_size("RANKMEM_NOPE", &sz), RANKMEM_ERR_INVALID_ARGUMENT, "unknown option");
    is_status(rk_option_size(NULL, &sz), RANKMEM_ERR_INVALID_ARGUMENT, "NULL name");
    is_status(rk_option_string("RANKMEM_REPORTS", &s), RANKMEM_ERR_INVALID_ARGUMENT,
              "string getter: unknown option");

    /* A spec from a named origin: every message says where it came from. */
    rankmem_resource_t *mr = (rankmem_resource_t *)0x1;
    expect_error(rk_resource_from_spec_named("RANKMEM_RESOURCE", "stats>pool(intial=2GiB)>async", &mr),
                 RANKMEM_ERR_CONFIG,
                 CFG "RANKMEM_RESOURCE: at 12: unknown option 'intial' for pool (did you mean 'initial'?)",
                 "from_spec_named: origin, position and suggestion");
    expect_error(rk_resource_from_spec_named("RANKMEM_RESOURCE", "stats>pool(initial=2^63)>system",
                                             &mr),
                 RANKMEM_ERR_CONFIG,
                 CFG "RANKMEM_RESOURCE: at 7: cannot build pool: rankmem_pool_create: sizes too "
                     "large",
                 "from_spec_named: a constructor's refusal, with origin and position");
    ok(mr == (rankmem_resource_t *)0x1, "  output untouched");
    is_status(rk_resource_from_spec_named("here", "stats>system", &mr), RANKMEM_SUCCESS,
              "from_spec_named: a good spec");
    if (mr != (rankmem_resource_t *)0x1)
        rankmem_resource_release(mr);

}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "child") == 0)
        return child();

    /* Before any rankmem call: the options are read once, at first use.
     * Whatever RANKMEM_* the caller's environment has goes first. */
    extern char **environ;
    for (char **e = environ; *e;) {
        if (strncmp(*e, "RANKMEM_", 8) != 0) {
            e++;
            continue;
        }
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
        unsetenv(name);
        e = environ;
    }
    setenv("RANKMEM_STAGING_POOL", "1GiB", 1);
    setenv("RANKMEM_STAGING_CHUNK", "abc", 1);
    setenv("RANKMEM_QUIET", "yes", 1);
    setenv("RANKMEM_BIND", "list:0,1,3", 1);
    setenv("RANKMEM_STAGING", "sometimes", 1);
    setenv("RANKMEM_REPORT", "/tmp/report.json", 1);
    setenv("RANKMEM_RESOURCE", "stats>pool(intial=2GiB)>async", 1);
    setenv("RANKMEM_RESOURSE", "x", 1);    /* a typo */
    setenv("RANKMEM_FROBNICATE", "1", 1);  /* unknown, nothing close */
    unsetenv("RANKMEM_LOG_FILE");
    unsetenv("RANKMEM_WARN_UNKNOWN");

    char *err = capture_stderr(first_use);
    ok(count(err, "rankmem: unknown variable RANKMEM_RESOURSE (did you mean RANKMEM_RESOURCE?)\n") == 1,
       "the typo RANKMEM_RESOURSE is warned about once, with the right name");
    ok(count(err, "rankmem: unknown variable RANKMEM_FROBNICATE (ignored; rankmem-info -c lists "
                  "the known ones)\n") == 1,
       "an unknown variable with no close name is warned about once");
    ok(count(err, "rankmem: ") == 2, "nothing else on stderr (known variables are not warned about)");
    if (tap_failed_)
        diag("stderr was:\n%s", err);
    free(err);
    int all = 1;
    for (int i = 0; i < 8; i++)
        all &= seen[i] == ((size_t)1 << 30);
    ok(all, "8 threads at first use all read RANKMEM_STAGING_POOL=1GiB");

    setenv("RANKMEM_STAGING_POOL", "2GiB", 1);
    err = capture_stderr(later_use);
    ok(err[0] == '\0', "later calls warn no more");
    free(err);
    const char *s = NULL;
    is_status(rankmem_option_get("RANKMEM_STAGING_POOL", &s), RANKMEM_SUCCESS, "option_get");
    ok(s && strcmp(s, "1GiB") == 0, "  read once: a later setenv changes nothing (%s)",
       s ? s : "(null)");

    if (rk_option_size && rk_option_bool && rk_option_int && rk_option_string &&
        rk_resource_from_spec_named)
        test_internal();
    else
        tap_skip(INTERNAL_TESTS, "hidden getters not linked in (library built without static)");

    /* option_info for every index. */
    size_t n = 0;
    is_status(rankmem_option_count(&n), RANKMEM_SUCCESS, "option_count");
    ok(n >= 9, "  %zu options", n);
    is_status(rankmem_option_count(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "option_count: NULL");
    int from_env = 0;
    for (size_t i = 0; i < n; i++) {
        rankmem_option_info_t o;
        memset(&o, 0, sizeof o);
        rankmem_status_t st = rankmem_option_info(i, &o);
        int good = st == RANKMEM_SUCCESS && o.name && strncmp(o.name, "RANKMEM_", 8) == 0 &&
                   o.help && o.help[0] && o.default_value && o.value &&
                   (unsigned)o.type <= RANKMEM_OPTION_INT &&
                   /* enums have choices; lists may (what each item must be) */
                   (o.type == RANKMEM_OPTION_ENUM ? o.choices != NULL
                                                  : o.type == RANKMEM_OPTION_LIST || !o.choices);
        /* The default itself must pass its own type's parser. */
        size_t dsz;
        int db;
        if (good && o.type == RANKMEM_OPTION_SIZE)
            good = rankmem_parse_size(o.default_value, 0, &dsz) == RANKMEM_SUCCESS;
        if (good && o.type == RANKMEM_OPTION_BOOL)
            good = rankmem_parse_bool(o.default_value, &db) == RANKMEM_SUCCESS;
        const char *v = getenv(o.name);
        if (good && strcmp(o.name, "RANKMEM_STAGING_POOL") != 0) /* changed after first use */
            good = o.from_environment == (v != NULL) &&
                   strcmp(o.value, v ? v : o.default_value) == 0;
        from_env += o.from_environment;
        ok(good, "option_info(%zu): %s = \"%s\" (default \"%s\")", i, o.name ? o.name : "?",
           o.value ? o.value : "?", o.default_value ? o.default_value : "?");
        const char *gv = NULL;
        ok(rankmem_option_get(o.name, &gv) == RANKMEM_SUCCESS && gv == o.value,
           "  option_get(%s) agrees", o.name);
        rankmem_status_t cst = rankmem_option_check(i);
        int bad_one = strcmp(o.name, "RANKMEM_STAGING_CHUNK") == 0 ||
                      strcmp(o.name, "RANKMEM_STAGING") == 0 ||
                      strcmp(o.name, "RANKMEM_RESOURCE") == 0;
        ok(bad_one ? cst == RANKMEM_ERR_CONFIG && strstr(rankmem_last_error(), o.name)
                   : cst == RANKMEM_SUCCESS,
           "  option_check(%s): %s", o.name,
           cst == RANKMEM_SUCCESS ? "ok" : rankmem_last_error());
    }
    ok(from_env == 7, "7 options came from the environment (%d)", from_env);
    rankmem_option_info_t o;
    is_status(rankmem_option_info(n, &o), RANKMEM_ERR_INVALID_ARGUMENT, "option_info: index past the end");
    is_status(rankmem_option_info((size_t)-1, &o), RANKMEM_ERR_INVALID_ARGUMENT, "option_info: index SIZE_MAX");
    is_status(rankmem_option_info(0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "option_info: NULL output");
    is_status(rankmem_option_check(n), RANKMEM_ERR_INVALID_ARGUMENT, "option_check: index past the end");
    is_status(rankmem_option_get("RANKMEM_NOPE", &s), RANKMEM_ERR_INVALID_ARGUMENT, "option_get: unknown name");
    is_status(rankmem_option_get(NULL, &s), RANKMEM_ERR_INVALID_ARGUMENT, "option_get: NULL name");
    is_status(rankmem_option_get("RANKMEM_BIND", NULL), RANKMEM_ERR_INVALID_ARGUMENT, "option_get: NULL output");

    test_children("/proc/self/exe");
    return tap_done();
}
