/* omp-bench: what librankmem_omp costs on the host.
 *
 *  (1) omp_alloc + omp_free through rankmem_omp_device_mem_alloc, against
 *      rankmem_allocate + rankmem_deallocate on the same resource (a pool over
 *      the current device resource, installed as the current resource, so
 *      both are host bookkeeping) and cudaMallocAsync + cudaFreeAsync; with
 *      RANKMEM_OMP_FREE_SYNC=1 (the default: deferred release, one device
 *      sync per many frees) and =0. Without a GPU the default row runs with
 *      the test switch RKOMP_TEST_DEFER=1 (deferral with no-op waits), else
 *      it would repeat the =0 one. Target: at most 30 ns over
 *      rankmem_allocate.
 *  (2) what the interposition adds to the runtime's own allocators:
 *      omp_alloc + omp_free with omp_default_mem_alloc in a program built
 *      against the OpenMP runtime alone (bench/omp-bench-rt), the same binary
 *      with LD_PRELOAD=librankmem_omp.so, and this program (linked with
 *      librankmem_omp) before and after rankmem served blocks. Target: at
 *      most 10 ns added.
 *
 * 1 and 16 OpenMP threads, each doing its own pairs; sizes log-uniform
 * 256 B .. 64 KiB from a fixed seed, drawn before timing; each measurement
 * is calibrated to >= --target-ms per repeat, warmed up once, then repeated
 * (--repeats, default 9): the table shows median (min) ns per pair per
 * thread (wall time / pairs per thread; flat from 1 to 16 threads means it
 * scales).
 *
 * The same source builds two programs: bench/omp-bench (links
 * librankmem_omp and librankmem; the driver) and, with RKOB_RT_ONLY,
 * bench/omp-bench-rt (the OpenMP runtime only). The driver runs every
 * measurement in a child process ("--worker"), because the environment
 * (RANKMEM_OMP_FREE_SYNC, LD_PRELOAD) is read at load time: it prints one
 * Markdown report on stdout, progress on stderr. Exit: 0 done, 1 error,
 * 2 bad usage. */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef RKOB_RT_ONLY
#include <rankmem.h>
#include <rankmem_omp.h>
#if HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#endif

#define NSIZES 4096
#define MIN_SIZE 256.0
#define MAX_SIZE 65536.0
#define MAX_THREADS 16
#define MAX_PAIRS ((size_t)1 << 22) /* per thread and repeat */
#define MIN_PAIRS ((size_t)256)

enum kind { K_LOOP, K_RT_DEFAULT, K_DIRECT, K_OMP_DEVICE, K_CUDA_ASYNC, K_COUNT };
static const char *const kind_key[K_COUNT] = {"loop", "rt", "direct", "omp", "cudaasync"};

static size_t sizes[NSIZES];
static int repeats = 9;
static double target_ms = 10.0;

static void make_sizes(void)
{
    uint64_t x = 0x9e3779b97f4a7c15ull; /* xorshift64*, fixed seed */
    for (int i = 0; i < NSIZES; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        double u = (double)((x * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
        sizes[i] = (size_t)(MIN_SIZE * pow(MAX_SIZE / MIN_SIZE, u));
    }
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- what each kind does, per pair ---- */

static void *volatile sink; /* keeps the loop-only row from being optimised away */

#ifndef RKOB_RT_ONLY
static rankmem_resource_t *pool; /* the pool both K_DIRECT and K_OMP_DEVICE use */
#if HAVE_CUDA
static cudaStream_t streams[MAX_THREADS];
#endif
#endif

/* pairs allocate+free from thread tid's own stretch of the sizes; returns
 * the number of failed calls. Each kind has its own loop so that the
 * harness around the calls is the same few instructions for all. */
static size_t do_pairs(int kind, int tid, size_t pairs)
{
    size_t fails = 0, j = (size_t)tid * 257u;
    switch (kind) {
    case K_LOOP:
        for (size_t i = 0; i < pairs; i++, j++)
            sink = (void *)sizes[j & (NSIZES - 1)];
        break;
    case K_RT_DEFAULT:
        for (size_t i = 0; i < pairs; i++, j++) {
            void *p = omp_alloc(sizes[j & (NSIZES - 1)], omp_default_mem_alloc);
            fails += !p;
            omp_free(p, omp_default_mem_alloc);
        }
        break;
#ifndef RKOB_RT_ONLY
    case K_DIRECT:
        for (size_t i = 0; i < pairs; i++, j++) {
            size_t n = sizes[j & (NSIZES - 1)];
            void *p = NULL;
            if (rankmem_allocate(pool, n, RANKMEM_DEFAULT_ALIGNMENT, &p) != RANKMEM_SUCCESS ||
                rankmem_deallocate(pool, p, n, RANKMEM_DEFAULT_ALIGNMENT) != RANKMEM_SUCCESS)
                fails++;
        }
        break;
    case K_OMP_DEVICE:
        for (size_t i = 0; i < pairs; i++, j++) {
            void *p = omp_alloc(sizes[j & (NSIZES - 1)], rankmem_omp_device_mem_alloc);
            fails += !p;
            omp_free(p, rankmem_omp_device_mem_alloc);
        }
        break;
#if HAVE_CUDA
    case K_CUDA_ASYNC: {
        cudaStream_t s = streams[tid];
        for (size_t i = 0; i < pairs; i++, j++) {
            void *p = NULL;
            if (cudaMallocAsync(&p, sizes[j & (NSIZES - 1)], s) != cudaSuccess ||
                cudaFreeAsync(p, s) != cudaSuccess)
                fails++;
        }
        break;
    }
#endif
#endif
    default: fails = pairs;
    }
    return fails;
}

/* One timed run of `pairs` per thread on nthreads threads: ns per pair per
 * thread. *got_threads: how many threads the runtime gave. */
static double run_once(int kind, int nthreads, size_t pairs, size_t *fails_p, int *got_threads)
{
    double t0 = 0, t1 = 0;
    size_t fails = 0;
    int got = 0;
#pragma omp parallel num_threads(nthreads) reduction(+ : fails)
    {
        int tid = omp_get_thread_num();
#pragma omp single
        {
            got = omp_get_num_threads();
            t0 = now_ns();
        } /* implicit barrier: every thread starts after t0 */
        fails += do_pairs(kind, tid, pairs);
#pragma omp barrier
#pragma omp single
        t1 = now_ns();
    }
#if !defined(RKOB_RT_ONLY) && HAVE_CUDA
    if (kind == K_CUDA_ASYNC) /* outside the clock: frees count by their host cost */
        for (int t = 0; t < nthreads; t++)
            if (cudaStreamSynchronize(streams[t]) != cudaSuccess)
                fails++;
#endif
    *fails_p += fails;
    *got_threads = got;
    return (t1 - t0) / (double)pairs;
}

/* Pairs per thread that make one run last at least target_ms; 0 on failure. */
static size_t calibrate(int kind, int nthreads)
{
    size_t fails = 0, pairs = MIN_PAIRS;
    int got = 0;
    double prev = 0; /* ns per pair of the previous count */
    for (;;) {
        double per = run_once(kind, nthreads, pairs, &fails, &got), ns = per * (double)pairs;
        if (fails) {
            fprintf(stderr, "omp-bench: %s on %d threads: %zu calls failed\n", kind_key[kind],
                    nthreads, fails);
            return 0;
        }
        if (got != nthreads) {
            fprintf(stderr, "omp-bench: asked for %d threads, the runtime gave %d\n", nthreads, got);
            return 0;
        }
        /* Long enough, and the count no longer matters: a run can take
         * milliseconds whatever its length (the threads' start or wake-up on
         * a busy host, the process's first device sync), which a small
         * count would then time as a cost per pair. */
        if (pairs >= MAX_PAIRS || (ns >= target_ms * 1e6 && prev > 0 && per > 0.9 * prev))
            return pairs;
        double scale = ns > 0 && ns < target_ms * 1e6 ? target_ms * 1e6 * 1.2 / ns : 2;
        pairs = (size_t)((double)pairs * (scale > 16 ? 16 : scale < 2 ? 2 : scale));
        if (pairs > MAX_PAIRS)
            pairs = MAX_PAIRS;
        prev = per;
    }
}

static double median_sorted(double *v, int n)
{
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Measures kind a (and, when b >= 0, kind b in alternation with it, so
 * that both see the same load): calibrate, warm up, repeat. Prints
 * "R kind threads median min pairs" for each, and for a pair
 * "D kind_b threads median-of-differences". */
static int measure2(int a, int b, int nthreads)
{
    int kinds[2] = {a, b}, nk = b >= 0 ? 2 : 1, n = repeats < 64 ? repeats : 64, got = 0;
    size_t pairs[2], fails = 0;
    double v[2][64], d[64];
    for (int k = 0; k < nk; k++) {
        if (!(pairs[k] = calibrate(kinds[k], nthreads)))
            return -1;
        run_once(kinds[k], nthreads, pairs[k], &fails, &got); /* warm-up */
    }
    for (int r = 0; r < n && !fails; r++) {
        for (int k = 0; k < nk; k++)
            v[k][r] = run_once(kinds[k], nthreads, pairs[k], &fails, &got);
        if (nk == 2)
            d[r] = v[1][r] - v[0][r];
    }
    if (fails) {
        fprintf(stderr, "omp-bench: %d threads: %zu calls failed\n", nthreads, fails);
        return -1;
    }
    for (int k = 0; k < nk; k++) {
        double med = median_sorted(v[k], n);
        printf("R %s %d %.2f %.2f %zu\n", kind_key[kinds[k]], nthreads, med, v[k][0], pairs[k]);
    }
    if (nk == 2)
        printf("D %s %d %.2f\n", kind_key[b], nthreads, median_sorted(d, n));
    fflush(stdout);
    return 0;
}

static int measure(int kind, int nthreads) { return measure2(kind, -1, nthreads); }

static const int thread_counts[] = {1, MAX_THREADS};
#define NTC ((int)(sizeof thread_counts / sizeof thread_counts[0]))

static int measure_all_threads(int kind)
{
    for (int i = 0; i < NTC; i++)
        if (measure(kind, thread_counts[i]) != 0)
            return -1;
    return 0;
}

static void usage(FILE *to)
{
    fprintf(to, "usage: omp-bench [--quick] [--repeats N] [--target-ms MS] [--rounds N]\n"
                "                 [--preload LIB] [--rt PROG]\n"
                "  --quick        3 repeats of >= 2 ms, 2 rounds: a smoke test, not a result\n"
                "  --repeats N    timed repeats per measurement (default 9; median and min shown)\n"
                "  --target-ms MS calibrate each repeat to at least MS ms (default 10)\n"
                "  --rounds N     alternate runtime-only and LD_PRELOAD runs N times (default 5)\n"
                "  --preload LIB  librankmem_omp.so to preload (default: ../omp/.libs/ next to\n"
                "                 this program, else the dynamic linker's search)\n"
                "  --rt PROG      the runtime-only program (default: omp-bench-rt next to this one)\n");
}

/* ---- worker of the runtime-only program (also run under LD_PRELOAD) ---- */

static int worker_rt(void)
{
    /* Whether librankmem_omp came in (LD_PRELOAD) and won over the runtime. */
    int active = 0;
    int (*is_active)(int *) = NULL; /* returns a rankmem_status_t */
    *(void **)&is_active = dlsym(RTLD_DEFAULT, "rankmem_omp_active");
    if (is_active)
        is_active(&active);
    printf("I interposed %d\n", active);
    if (measure_all_threads(K_LOOP) || measure_all_threads(K_RT_DEFAULT))
        return 1;
    return 0;
}

#ifndef RKOB_RT_ONLY
/* ---- worker of the linked program ---- */

static int worker_main(int full)
{
    int active = 0, ngpu = 0;
    rankmem_omp_active(&active);
    printf("I interposed %d\n", active);
    if (rankmem_device_count(&ngpu) != RANKMEM_SUCCESS)
        ngpu = 0;
#if HAVE_CUDA
    if (ngpu > 0) {
        struct cudaDeviceProp prop;
        int dev = 0, drv = 0, rtv = 0;
        cudaGetDevice(&dev);
        if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
            printf("I device %s\n", prop.name);
        cudaDriverGetVersion(&drv);
        cudaRuntimeGetVersion(&rtv);
        printf("I cuda driver %d.%d, runtime %d.%d\n", drv / 1000, drv % 1000 / 10, rtv / 1000,
               rtv % 1000 / 10);
    }
#endif
    if (ngpu == 0)
        printf("I device none\n");

    rankmem_resource_t *cur = NULL;
    const char *name = "?";
    rankmem_pool_params_t pp;
    if (rankmem_get_current_resource(&cur) != RANKMEM_SUCCESS ||
        rankmem_pool_params_default(&pp) != RANKMEM_SUCCESS)
        return 1;
    rankmem_resource_name(cur, &name);
    printf("I current %s\n", name);
    /* Large enough never to grow while timed: 16 threads x 64 KiB live at
     * most, plus what deferred release may hold back (RANKMEM_OMP_DEFER_BYTES,
     * 256 MiB by default; 384 blocks of up to 64 KiB per thread), which a
     * 64 MiB pool could not serve at 16 threads. */
    pp.initial_size = (size_t)448 << 20;
    if (rankmem_resource_retain(cur) != RANKMEM_SUCCESS ||
        rankmem_pool_create(cur, &pp, &pool) != RANKMEM_SUCCESS ||
        rankmem_set_current_resource(pool) != RANKMEM_SUCCESS) {
        fprintf(stderr, "omp-bench: cannot install a pool as the current resource: %s\n",
                rankmem_last_error());
        return 1;
    }
    int rc = 0;
    /* The runtime's allocator first, while rankmem has served no block
     * (omp_free then skips the block map), and again at the end. */
    if (full && measure_all_threads(K_RT_DEFAULT))
        rc = 1;
    if (!rc && measure_all_threads(K_LOOP))
        rc = 1;
    /* Direct and through omp_alloc in alternation: their difference is the point. */
    for (int i = 0; i < NTC && !rc; i++)
        if (measure2(K_DIRECT, K_OMP_DEVICE, thread_counts[i]))
            rc = 1;
    if (!rc && full) {
        printf("I map_used\n");
        if (measure_all_threads(K_RT_DEFAULT))
            rc = 1;
    }
#if HAVE_CUDA
    if (!rc && full && ngpu > 0) {
        int dev = 0;
        cudaMemPool_t mp;
        uint64_t keep = UINT64_MAX;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetDefaultMemPool(&mp, dev) != cudaSuccess ||
            cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess)
            rc = 1;
        for (int t = 0; t < MAX_THREADS && !rc; t++)
            if (cudaStreamCreateWithFlags(&streams[t], cudaStreamNonBlocking) != cudaSuccess)
                rc = 1;
        if (!rc && measure_all_threads(K_CUDA_ASYNC))
            rc = 1;
        for (int t = 0; t < MAX_THREADS; t++)
            if (streams[t])
                cudaStreamDestroy(streams[t]);
    }
#endif
    rankmem_set_current_resource(cur);
    rankmem_resource_release(pool);
    rankmem_resource_release(cur);
    return rc;
}

/* ---- the driver ---- */

typedef struct result {
    double med, min;
    int have;
} result_t;

/* results[run][kind][thread index]: runs are the workers below. */
enum run { RUN_SYNC1, RUN_SYNC0, RUN_RT, RUN_PRELOAD, RUN_LINKED_USED, RUN_COUNT };
static result_t res[RUN_COUNT][K_COUNT][NTC];
static double paired[RUN_COUNT][NTC]; /* median of paired differences omp - direct */
static int have_paired[RUN_COUNT][NTC];
static double rounds_med[2][NTC][64]; /* RUN_RT/RUN_PRELOAD medians per round */
static char device[256] = "none", cuda_versions[128] = "", current_name[128] = "?";
static int interposed[RUN_COUNT];

static int tc_index(int threads)
{
    for (int i = 0; i < NTC; i++)
        if (thread_counts[i] == threads)
            return i;
    return -1;
}

static void append_quoted(char *buf, size_t cap, const char *s)
{
    size_t len = strlen(buf);
    if (len + 2 < cap)
        buf[len++] = '\'';
    for (; *s && len + 5 < cap; s++) {
        if (*s == '\'') {
            memcpy(buf + len, "'\\''", 4);
            len += 4;
        } else
            buf[len++] = *s;
    }
    if (len + 1 < cap)
        buf[len++] = '\'';
    buf[len] = 0;
}

/* Runs one worker; its R lines go to res[run] (or, for the rounds of the
 * runtime-only program, to rounds_med), its I lines to the globals. */
static int run_worker(const char *env, const char *prog, const char *mode, int run, int round)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s ", env);
    append_quoted(cmd, sizeof cmd, prog);
    size_t len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, " --worker %s --repeats %d --target-ms %g", mode, repeats,
             target_ms);
    fprintf(stderr, "omp-bench: %s\n", cmd);
    FILE *f = popen(cmd, "r");
    if (!f) {
        fprintf(stderr, "omp-bench: cannot run %s: %s\n", prog, strerror(errno));
        return -1;
    }
    char line[512];
    int map_used = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char key[32];
        int threads;
        double med, mn;
        size_t pairs;
        if (sscanf(line, "R %31s %d %lf %lf %zu", key, &threads, &med, &mn, &pairs) == 5) {
            int k, ti = tc_index(threads);
            for (k = 0; k < K_COUNT && strcmp(kind_key[k], key); k++) {
            }
            if (k == K_COUNT || ti < 0)
                continue;
            fprintf(stderr, "omp-bench:   %-9s %2d threads: median %8.1f ns, min %8.1f ns (%zu pairs)\n",
                    key, threads, med, mn, pairs);
            result_t *r = &res[k == K_RT_DEFAULT && map_used ? RUN_LINKED_USED : run][k][ti];
            if (round >= 0 && k == K_RT_DEFAULT)
                rounds_med[run == RUN_PRELOAD][ti][round] = med;
            if (!r->have || mn < r->min)
                r->min = mn;
            if (!r->have || round < 0)
                r->med = med;
            r->have = 1;
        } else if (sscanf(line, "D %31s %d %lf", key, &threads, &med) == 3) {
            int ti = tc_index(threads);
            if (ti >= 0) {
                paired[run][ti] = med;
                have_paired[run][ti] = 1;
            }
        } else if (!strncmp(line, "I interposed ", 13)) {
            interposed[run] = atoi(line + 13);
        } else if (!strcmp(line, "I map_used")) {
            map_used = 1; /* the runtime's rows after this line */
        } else if (!strncmp(line, "I device ", 9)) {
            snprintf(device, sizeof device, "%.200s", line + 9);
        } else if (!strncmp(line, "I cuda ", 7)) {
            snprintf(cuda_versions, sizeof cuda_versions, "%.100s", line + 7);
        } else if (!strncmp(line, "I current ", 10)) {
            snprintf(current_name, sizeof current_name, "%.100s", line + 10);
        }
    }
    int st = pclose(f);
    if (st != 0) {
        fprintf(stderr, "omp-bench: worker %s %s failed (status %d)\n", prog, mode, st);
        return -1;
    }
    return 0;
}

static void cell(const result_t *r)
{
    if (r->have)
        printf(" %.1f (%.1f) |", r->med, r->min);
    else
        printf(" n/a |");
}

/* Median of the paired differences (difference of the minima). */
static void paired_delta(int run, int ti)
{
    const result_t *a = &res[run][K_OMP_DEVICE][ti], *b = &res[run][K_DIRECT][ti];
    if (have_paired[run][ti] && a->have && b->have)
        printf(" %+.1f (%+.1f) |", paired[run][ti], a->min - b->min);
    else
        printf(" n/a |");
}

static void delta(const result_t *a, const result_t *b)
{
    if (a->have && b->have)
        printf(" %+.1f (%+.1f) |", a->med - b->med, a->min - b->min);
    else
        printf(" n/a |");
}

/* How much a thread slows down when all MAX_THREADS run: a loop bound by
 * the multiplier (8 independent chains, no memory), per iteration, on one
 * thread and then the slowest of MAX_THREADS at once. Where the CPUs are
 * hardware threads sharing cores (a cloud VM's vCPUs often are), the ratio
 * nears 2 and every per-thread figure at 16 threads pays for it. */
static double mul_loop(long n)
{
    uint64_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        for (int k = 0; k < 8; k++)
            a[k] = a[k] * 3 + (a[k] >> 7);
        __asm__ __volatile__("" : "+r"(a[0]), "+r"(a[3]), "+r"(a[7]));
    }
    double t = (now_ns() - t0) / (double)n;
    sink = (void *)(uintptr_t)(a[0] ^ a[1] ^ a[2] ^ a[4] ^ a[5] ^ a[6]);
    return t;
}

static void core_sharing(double *one, double *all)
{
    const long n = 10 * 1000 * 1000;
    *one = *all = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t = mul_loop(n), worst = 0;
        if (t < *one)
            *one = t;
#pragma omp parallel num_threads(MAX_THREADS) reduction(max : worst)
        worst = mul_loop(n);
        if (worst < *all)
            *all = worst;
    }
}

static void host_info(char *cpu, size_t cap)
{
    snprintf(cpu, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c += 1 + (c[1] == ' ');
                c[strcspn(c, "\n")] = 0;
                snprintf(cpu, cap, "%s", c);
            }
            break;
        }
    }
    if (f)
        fclose(f);
}

static int driver(int argc, char **argv, int rounds, const char *preload, const char *rt)
{
    char self[PATH_MAX], dir[PATH_MAX], rt_path[PATH_MAX], lib[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "omp-bench: cannot read /proc/self/exe\n");
        return 1;
    }
    self[n] = 0;
    snprintf(dir, sizeof dir, "%s", self);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    /* libtool may have put the real binary in .libs/ (a build without
     * -no-install): the build directory is then one level up. */
    if (slash && strlen(dir) >= 6 && !strcmp(dir + strlen(dir) - 6, "/.libs"))
        dir[strlen(dir) - 6] = 0;
    if (rt)
        snprintf(rt_path, sizeof rt_path, "%s", rt);
    else
        snprintf(rt_path, sizeof rt_path, "%s/omp-bench-rt", dir);
    if (preload)
        snprintf(lib, sizeof lib, "%s", preload);
    else {
        snprintf(lib, sizeof lib, "%s/../omp/.libs/librankmem_omp.so", dir);
        if (access(lib, R_OK) != 0)
            snprintf(lib, sizeof lib, "librankmem_omp.so");
    }
    if (access(rt_path, X_OK) != 0) {
        fprintf(stderr, "omp-bench: no runtime-only program %s (make bench-omp builds it)\n",
                rt_path);
        return 1;
    }
    if (rounds > 64)
        rounds = 64;

    /* Without a GPU nothing waits, so the default row would repeat the
     * FREE_SYNC=0 one: the test switch makes host blocks take the deferred
     * release instead (no-op waits), so that its bookkeeping is measured. */
    int have_gpu = 0;
    if (rankmem_device_count(&have_gpu) != RANKMEM_SUCCESS)
        have_gpu = 0;
    if (run_worker(have_gpu ? "RANKMEM_OMP_FREE_SYNC=1" : "RANKMEM_OMP_FREE_SYNC=1 RKOMP_TEST_DEFER=1",
                   self, "main", RUN_SYNC1, -1) ||
        run_worker("RANKMEM_OMP_FREE_SYNC=0", self, "main-omp", RUN_SYNC0, -1))
        return 1;
    char env[PATH_MAX + 64] = "LD_PRELOAD=";
    append_quoted(env, sizeof env, lib);
    /* Alternate the two so that a slow patch of a loaded machine hits both. */
    for (int r = 0; r < rounds; r++)
        if (run_worker("", rt_path, "rt", RUN_RT, r) || run_worker(env, rt_path, "rt", RUN_PRELOAD, r))
            return 1;
    for (int w = 0; w < 2; w++)
        for (int ti = 0; ti < NTC; ti++)
            res[w ? RUN_PRELOAD : RUN_RT][K_RT_DEFAULT][ti].med = median_sorted(rounds_med[w][ti], rounds);
    if (!interposed[RUN_SYNC1] || !interposed[RUN_PRELOAD] || interposed[RUN_RT]) {
        fprintf(stderr, "omp-bench: librankmem_omp is not where it should be (linked: %d, "
                        "preloaded: %d, runtime only: %d)\n",
                interposed[RUN_SYNC1], interposed[RUN_PRELOAD], interposed[RUN_RT]);
        return 1;
    }

    char cpu[256], date[64], cmdline[2048] = "";
    host_info(cpu, sizeof cpu);
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    for (int i = 0; i < argc; i++) {
        size_t len = strlen(cmdline);
        snprintf(cmdline + len, sizeof cmdline - len, "%s%s", i ? " " : "", argv[i]);
    }
    int ngpu = strcmp(device, "none") != 0;
    printf("### OpenMP allocators (`bench/omp-bench`)\n\n");
    printf("- device: %s%s%s\n", ngpu ? device : "no GPU: rankmem's device space is host memory",
           cuda_versions[0] ? ", CUDA " : "", cuda_versions);
    printf("- host: %s, %ld CPUs online\n", cpu, sysconf(_SC_NPROCESSORS_ONLN));
    double one, all;
    core_sharing(&one, &all);
    printf("- core sharing: a multiply-bound loop takes %.2f ns an iteration on 1 thread, %.2f on "
           "each of %d at once (%.2fx)%s\n",
           one, all, MAX_THREADS, all / one,
           sysconf(_SC_NPROCESSORS_ONLN) < MAX_THREADS ? ": more threads than CPUs"
           : all / one > 1.3 ? ": the CPUs share cores, so code at 16 threads runs slower per "
                               "thread, ours and the direct calls' alike"
                             : "");
#if defined(__clang__)
    printf("- OpenMP: clang %s (libomp)\n", __clang_version__);
#elif defined(__GNUC__)
    printf("- OpenMP: gcc %s (libgomp)\n", __VERSION__);
#endif
    printf("- date: %s\n- command: `%s`\n", date, cmdline);
    printf("- pairs: allocate then free at once; sizes log-uniform %g B .. %g KiB (fixed seed); "
           "each thread its own pairs; per measurement %d timed repeats of >= %g ms after a "
           "warm-up\n",
           MIN_SIZE, MAX_SIZE / 1024, repeats, target_ms);
    printf("- cells: ns per pair per thread, median (min) over the repeats\n\n");

    printf("#### omp_alloc + omp_free through `rankmem_omp_device_mem_alloc`\n\n");
    printf("Pool: `rankmem_pool_create` over the current resource (%s), installed as the current "
           "resource: the direct calls and `rankmem_omp_device_mem_alloc` use the same pool.\n\n",
           current_name);
    printf("| allocator | 1 thread | 16 threads |\n| --- | ---: | ---: |\n");
    printf("| loop only (harness) |");
    cell(&res[RUN_SYNC1][K_LOOP][0]);
    cell(&res[RUN_SYNC1][K_LOOP][1]);
    printf("\n| `rankmem_allocate` + `rankmem_deallocate`, direct |");
    cell(&res[RUN_SYNC1][K_DIRECT][0]);
    cell(&res[RUN_SYNC1][K_DIRECT][1]);
    printf("\n| `omp_alloc` + `omp_free`, `RANKMEM_OMP_FREE_SYNC=1` (default: deferred release%s) |",
           ngpu ? "" : "; no GPU: `RKOMP_TEST_DEFER=1`, no-op waits");
    cell(&res[RUN_SYNC1][K_OMP_DEVICE][0]);
    cell(&res[RUN_SYNC1][K_OMP_DEVICE][1]);
    printf("\n| `omp_alloc` + `omp_free`, `RANKMEM_OMP_FREE_SYNC=0` |");
    cell(&res[RUN_SYNC0][K_OMP_DEVICE][0]);
    cell(&res[RUN_SYNC0][K_OMP_DEVICE][1]);
    printf("\n| `cudaMallocAsync` + `cudaFreeAsync` (own stream per thread) |");
    cell(&res[RUN_SYNC1][K_CUDA_ASYNC][0]);
    cell(&res[RUN_SYNC1][K_CUDA_ASYNC][1]);
    printf("\n\nAdded by `omp_alloc` + `omp_free` over the direct calls (target: at most "
           "30 ns). The two were timed in alternation, repeat by repeat, in the same process: "
           "median of the per-repeat differences (difference of the minima):\n\n");
    printf("| | 1 thread | 16 threads |\n| --- | ---: | ---: |\n");
    printf("| `RANKMEM_OMP_FREE_SYNC=1`%s |", ngpu ? "" : " (no-op waits)");
    for (int ti = 0; ti < NTC; ti++)
        paired_delta(RUN_SYNC1, ti);
    printf("\n| `RANKMEM_OMP_FREE_SYNC=0` |");
    for (int ti = 0; ti < NTC; ti++)
        paired_delta(RUN_SYNC0, ti);

    printf("\n\n#### The runtime's own allocator: `omp_alloc` + `omp_free` with "
           "`omp_default_mem_alloc`\n\n");
    printf("Runtime only and LD_PRELOAD: the same binary (`omp-bench-rt`), %d alternating runs "
           "each (median of the runs' medians, min of their mins). Target: at most 10 ns added.\n\n",
           rounds);
    printf("| program | 1 thread | 16 threads | added, 1 thread | added, 16 threads |\n"
           "| --- | ---: | ---: | ---: | ---: |\n");
    static const struct {
        int run;
        const char *what;
    } rows[] = {{RUN_RT, "runtime only"},
                {RUN_PRELOAD, "same binary, `LD_PRELOAD=librankmem_omp.so`"},
                {RUN_SYNC1, "linked with librankmem_omp, before rankmem served a block"},
                {RUN_LINKED_USED, "linked, after rankmem served (and freed) blocks: `omp_free` checks the block map"}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        printf("| %s |", rows[i].what);
        cell(&res[rows[i].run][K_RT_DEFAULT][0]);
        cell(&res[rows[i].run][K_RT_DEFAULT][1]);
        if (rows[i].run == RUN_RT)
            printf(" | |");
        else {
            delta(&res[rows[i].run][K_RT_DEFAULT][0], &res[RUN_RT][K_RT_DEFAULT][0]);
            delta(&res[rows[i].run][K_RT_DEFAULT][1], &res[RUN_RT][K_RT_DEFAULT][1]);
        }
        printf("\n");
    }
    printf("| loop only (harness), runtime only |");
    cell(&res[RUN_RT][K_LOOP][0]);
    cell(&res[RUN_RT][K_LOOP][1]);
    printf(" | |\n");
    fflush(stdout);
    return 0;
}
#endif /* !RKOB_RT_ONLY */

int main(int argc, char **argv)
{
    const char *worker = NULL, *preload = NULL, *rt = NULL;
    int rounds = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--worker") && v)
            worker = argv[++i];
        else if (!strcmp(a, "--repeats") && v)
            repeats = atoi(argv[++i]);
        else if (!strcmp(a, "--target-ms") && v)
            target_ms = atof(argv[++i]);
        else if (!strcmp(a, "--rounds") && v)
            rounds = atoi(argv[++i]);
        else if (!strcmp(a, "--preload") && v)
            preload = argv[++i];
        else if (!strcmp(a, "--rt") && v)
            rt = argv[++i];
        else if (!strcmp(a, "--quick")) {
            repeats = 3;
            target_ms = 2;
            rounds = 2;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (repeats < 1 || repeats > 64 || !(target_ms > 0) || rounds < 1 || rounds > 64) {
        usage(stderr);
        return 2;
    }
    make_sizes();
    if (worker && !strcmp(worker, "rt"))
        return worker_rt();
#ifdef RKOB_RT_ONLY
    (void)preload;
    (void)rt;
    fprintf(stderr, "omp-bench-rt: run as omp-bench-rt --worker rt (omp-bench runs it)\n");
    return 2;
#else
    if (worker && !strcmp(worker, "main"))
        return worker_main(1);
    if (worker && !strcmp(worker, "main-omp"))
        return worker_main(0);
    if (worker) {
        usage(stderr);
        return 2;
    }
    return driver(argc, argv, rounds, preload, rt);
#endif
}
