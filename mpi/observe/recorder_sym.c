/* Call sites in words, at report time only: a site's frames are raw return
 * addresses until then (capturing them is the only cost an allocation pays).
 *
 * The text must be the same on every rank of a job, whatever the load
 * addresses, because the report groups leaks across ranks by it: functions
 * and file:line from addr2line (binutils), else symbol+offset from dladdr,
 * else object+offset. Frames of the CUDA runtime linked into the program
 * (static cudart: no object to skip at capture) are dropped here by name. */
#define _GNU_SOURCE
#include "recorder.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

typedef struct {
    char func[96];  /* function, or symbol+0xoff, or object+0xoff */
    char where[96]; /* file:line, or "" when unknown */
    int runtime;    /* a CUDA runtime/driver frame: not a site */
    int libc;       /* the C library's start-up frames: no news, end of the list */
} frame_text_t;

#define CACHE 256
static struct {
    void *addr;
    frame_text_t t;
} cache[CACHE];
static size_t ncache;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* Frames of the CUDA runtime or driver by their symbol: cudaMalloc,
 * __cudart123, cuMemAlloc_v2, libcudart_static internals. */
static int runtime_name(const char *s)
{
    if (!s || !*s)
        return 0;
    if (!strncmp(s, "cuda", 4) || !strncmp(s, "__cuda", 6) || !strncmp(s, "_cuda", 5) ||
        !strncmp(s, "libcudart", 9))
        return 1;
    return s[0] == 'c' && s[1] == 'u' && s[2] >= 'A' && s[2] <= 'Z';
}

/* Whether the main program is position dependent (addresses are absolute). */
static int exe_is_fixed(void)
{
    static int fixed = -1;
    if (fixed < 0) {
        FILE *f = fopen("/proc/self/exe", "rb");
        ElfW(Ehdr) eh;
        fixed = 0;
        if (f) {
            if (fread(&eh, sizeof eh, 1, f) == 1 && eh.e_type == ET_EXEC)
                fixed = 1;
            fclose(f);
        }
    }
    return fixed;
}

static void shell_quote(char *dst, size_t cap, const char *s)
{
    size_t k = 0;
    if (cap < 3)
        return;
    dst[k++] = '\'';
    for (; *s && k + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(dst + k, "'\\''", 4);
            k += 4;
        } else {
            dst[k++] = *s;
        }
    }
    dst[k++] = '\'';
    dst[k] = 0;
}

static void chomp(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = 0;
}

/* addr2line -f -C: function and file:line of offset in obj. 0 when it
 * named a function. Off by default in no environment: a missing
 * addr2line just fails. */
static int addr2line(const char *obj, uintptr_t off, char *func, size_t fcap, char *where,
                     size_t wcap)
{
    char q[600], cmd[700];
    shell_quote(q, sizeof q, obj);
    snprintf(cmd, sizeof cmd, "addr2line -f -C -e %s 0x%lx 2>/dev/null", q, (unsigned long)off);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    char l1[512] = "", l2[512] = "";
    int ok = fgets(l1, sizeof l1, p) && fgets(l2, sizeof l2, p);
    pclose(p);
    if (!ok)
        return -1;
    chomp(l1);
    chomp(l2);
    if (!strcmp(l1, "??") || !*l1)
        return -1;
    /* drop " (discriminator N)" and parameters of C++ names */
    char *d = strstr(l2, " (discriminator");
    if (d)
        *d = 0;
    char *paren = strchr(l1, '(');
    if (paren && paren != l1)
        *paren = 0;
    snprintf(func, fcap, "%.95s", l1);
    if (l2[0] && l2[0] != '?') {
        const char *colon = strrchr(l2, ':');
        if (colon && colon[1] && colon[1] != '?' && strcmp(colon + 1, "0"))
            snprintf(where, wcap, "%.95s", base_name(l2));
    }
    return 0;
}

static void *exe_base;
static pthread_once_t exe_once = PTHREAD_ONCE_INIT;

static void find_exe_base(void)
{
    Dl_info self;
    if (dladdr((void *)getauxval(AT_PHDR), &self))
        exe_base = self.dli_fbase;
}

static void resolve(void *addr, frame_text_t *t)
{
    memset(t, 0, sizeof *t);
    /* a return address: the call is the byte before it */
    uintptr_t a = (uintptr_t)addr - 1;
    Dl_info di;
    memset(&di, 0, sizeof di);
    if (!dladdr((void *)a, &di) || !di.dli_fbase) {
        snprintf(t->func, sizeof t->func, "0x%lx", (unsigned long)a);
        return;
    }
    /* dladdr names the main program by argv[0]: know it by its base */
    pthread_once(&exe_once, find_exe_base);
    int is_exe = di.dli_fbase == exe_base;
    char exe[512];
    const char *obj = di.dli_fname;
    if (is_exe) {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[n > 0 ? n : 0] = 0;
        obj = exe;
    }
    if (obj && (strstr(obj, "/libc.so") || strstr(obj, "/ld-linux")))
        t->libc = 1;
    uintptr_t off = a - (uintptr_t)di.dli_fbase;
    uintptr_t query = is_exe && exe_is_fixed() ? a : off;
    if (di.dli_sname && runtime_name(di.dli_sname))
        t->runtime = 1;
    if (obj && *obj && addr2line(obj, query, t->func, sizeof t->func, t->where,
                                 sizeof t->where) == 0) {
        if (runtime_name(t->func))
            t->runtime = 1;
        return;
    }
    if (di.dli_sname)
        snprintf(t->func, sizeof t->func, "%.70s+0x%lx", di.dli_sname,
                 (unsigned long)(a - (uintptr_t)di.dli_saddr));
    else
        snprintf(t->func, sizeof t->func, "%.70s+0x%lx", base_name(obj ? obj : "?"),
                 (unsigned long)off);
}

static void resolve_cached(void *addr, frame_text_t *t)
{
    pthread_mutex_lock(&cache_lock);
    for (size_t i = 0; i < ncache; i++)
        if (cache[i].addr == addr) {
            *t = cache[i].t;
            pthread_mutex_unlock(&cache_lock);
            return;
        }
    pthread_mutex_unlock(&cache_lock);
    resolve(addr, t);
    pthread_mutex_lock(&cache_lock);
    if (ncache < CACHE) {
        cache[ncache].addr = addr;
        cache[ncache].t = *t;
        ncache++;
    }
    pthread_mutex_unlock(&cache_lock);
}

/* The function part of "name+0x12": the name alone, for the caller list. */
static void func_only(char *dst, size_t cap, const char *f)
{
    snprintf(dst, cap, "%s", f);
    char *plus = strstr(dst, "+0x");
    if (plus && plus != dst)
        *plus = 0;
}

const char *rk_obs_site_text(const rk_obs_site_t *site, char *buf, size_t cap)
{
    if (!buf || !cap)
        return buf;
    buf[0] = 0;
    if (!site)
        return buf;
    const char *api = rk_obs_api_name(site->api);
    if (site->id == 0 && site->nframes == 0 && site->api == 0) {
        snprintf(buf, cap, "other call sites (the site table was full)");
        return buf;
    }
    if (site->nframes <= 0) {
        snprintf(buf, cap, "%s (no call site)", api);
        return buf;
    }
    frame_text_t ft[4];
    int n = 0;
    for (int i = 0; i < site->nframes && n < 4; i++) {
        resolve_cached(site->frames[i], &ft[n]);
        if (n == 0 && ft[n].runtime)
            continue; /* the runtime's own frames before the program's */
        if (n > 0 && (ft[n].libc || !strncmp(ft[n].func, "__libc_start", 12) ||
                      !strcmp(ft[n].func, "_start")))
            break; /* the C library's start-up: no news */
        n++;
    }
    if (!n) {
        snprintf(buf, cap, "%s (no call site outside the CUDA libraries)", api);
        return buf;
    }
    size_t k = (size_t)snprintf(buf, cap, "%s at %s", api, ft[0].where[0] ? ft[0].where : ft[0].func);
    if (k < cap) {
        k += (size_t)snprintf(buf + k, cap - k, " (");
        for (int i = n - 1; i >= 0 && k < cap; i--) {
            char f[96];
            func_only(f, sizeof f, ft[i].func);
            k += (size_t)snprintf(buf + k, cap - k, "%s%s", f, i ? " < " : ")");
        }
    }
    return buf;
}
