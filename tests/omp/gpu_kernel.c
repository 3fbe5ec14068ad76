/* librankmem_omp on a GPU, checked by CUDA kernels (tests/omp/gpu_kernels.cu):
 * device memory from omp_alloc written and read back by kernels; an
 * allocate(rankmem_omp_device_mem_alloc: x) clause on 16 threads, each
 * thread's x checked with cudaPointerGetAttributes and kernels (the host
 * never dereferences device memory); pool_size with every fallback when the
 * pool is full (null_fb, default_mem_fb, allocator_fb, and abort_fb in a
 * child process); omp_calloc zeroes memory a kernel dirtied; omp_realloc
 * keeps what a kernel wrote; omp_free waits for a kernel still reading the
 * block on another stream (RANKMEM_OMP_FREE_SYNC=1); everything counted by
 * a stats adaptor installed as the current resource. Everything is freed
 * (compute-sanitizer: run with --target-processes application-only, the
 * abort_fb child aborts on purpose). Skips without a GPU. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "omp_test.h"

#if HAVE_CUDA
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "gpu_kernels.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define SPIN_CYCLES 20000000ull /* ~10 ms at 2 GHz: ample for a missing wait to show */
#define NTHREADS 16
#define CLAUSE_DOUBLES 4096 /* 32 KiB per thread */

static int mem_type(const void *p)
{
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return (int)at.type;
}

static int is_device(const void *p) { return p && mem_type(p) == cudaMemoryTypeDevice; }

/* A kernel fills p and another counts the words that differ: 1 when none do. */
static int kernel_round_trip(void *p, size_t bytes, unsigned pattern, int slot)
{
    unsigned long long bad = 1;
    size_t n = bytes / 4;
    return rkomp_test_fill(p, n, pattern, 1, NULL) == 0 &&
           rkomp_test_count(p, n, pattern, 1, slot, NULL, &bad) == 0 && bad == 0;
}

/* Kernel count of words of p (n of them) that differ from the fill pattern;
 * (unsigned long long)-1 when a CUDA call failed. */
static unsigned long long kernel_bad(const void *p, size_t n_words, unsigned pattern, int indexed)
{
    unsigned long long bad = 0;
    if (rkomp_test_count(p, n_words, pattern, indexed, 0, NULL, &bad) != 0)
        return (unsigned long long)-1;
    return bad;
}

static rankmem_stats_t stats_of(rankmem_resource_t *st)
{
    rankmem_stats_t s = {.size = sizeof s};
    if (rankmem_stats_get(st, &s) != RANKMEM_SUCCESS)
        diag("rankmem_stats_get failed: %s", rankmem_last_error());
    return s;
}

/* ---- abort_fb, in a child process (run as: gpu_kernel.t --abort-child) ---- */

static int abort_child(void)
{
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none); /* the abort below is expected: no core file */
    int n = 0;
    if (rankmem_device_count(&n) != RANKMEM_SUCCESS || n == 0)
        return 2;
    omp_alloctrait_t t[2] = {{omp_atk_pool_size, MiB}, {omp_atk_fallback, omp_atv_abort_fb}};
    omp_allocator_handle_t a = omp_init_allocator(rankmem_omp_device_mem_space, 2, t);
    if (a == omp_null_allocator)
        return 3;
    void *p = omp_alloc(768 * KiB, a);
    if (!is_device(p))
        return 4;
    fprintf(stderr, "child: first block served\n");
    fflush(stderr);
    void *q = omp_alloc(768 * KiB, a); /* past pool_size: abort_fb aborts here */
    fprintf(stderr, "child: omp_alloc past pool_size returned %p\n", q);
    return 5;
}

/* Runs this program with --abort-child, its stderr captured in err (NUL-
 * terminated). Returns the wait status, or -1 when it could not run. */
static int run_abort_child(char *err, size_t cap)
{
    int fd[2];
    err[0] = 0;
    if (pipe(fd) != 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        /* exec at once: a forked child of a CUDA process must not use CUDA. */
        dup2(fd[1], 2);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, 1);
        close(fd[0]);
        close(fd[1]);
        char *args[] = {(char *)"gpu_kernel.t", (char *)"--abort-child", NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(fd[1]);
    size_t len = 0;
    for (;;) {
        ssize_t r = read(fd[0], err + len, cap - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len == cap - 1) { /* full: drain the rest so the child never blocks */
            char sink[256];
            while (read(fd[0], sink, sizeof sink) > 0) {
            }
            break;
        }
    }
    err[len] = 0;
    close(fd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return status;
}

/* ---- the tests ---- */

static void test_kernel_round_trip(rankmem_resource_t *st)
{
    rankmem_stats_t before = stats_of(st);
    void *d = omp_alloc(4 * MiB, rankmem_omp_device_mem_alloc);
    ok(is_device(d), "omp_alloc(4 MiB, device): cudaMemoryTypeDevice");
    ok(d && kernel_round_trip(d, 4 * MiB, 0x1234abcdu, 0), "a kernel writes it, another reads it back");
    /* And the host sees, through cudaMemcpy, what the kernel wrote. */
    uint32_t h[1024];
    int good = d && cudaMemcpy(h, (char *)d + 3 * MiB, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (size_t i = 0; good && i < 1024; i++)
        good = h[i] == (0x1234abcdu ^ (uint32_t)(3 * MiB / 4 + i));
    ok(good, "cudaMemcpy reads back what the kernel wrote");
    rankmem_stats_t s = stats_of(st);
    ok(s.count_current == before.count_current + 1 && s.bytes_current == before.bytes_current + 4 * MiB,
       "the rank's stats count the block (%zu live, %zu bytes)", s.count_current, s.bytes_current);
    void *a = omp_aligned_alloc(64 * KiB, 100 * KiB, rankmem_omp_device_mem_alloc);
    ok(is_device(a) && aligned_to(a, 64 * KiB) && kernel_round_trip(a, 100 * KiB, 0x77u, 0),
       "omp_aligned_alloc(64 KiB): device memory, aligned, kernel round trip");
    omp_free(a, rankmem_omp_device_mem_alloc);
    omp_free(d, omp_null_allocator);
    /* Freed device memory waits for a device sync (deferred release) until
     * rankmem_omp_flush, unless RANKMEM_OMP_FREE_SYNC=0. */
    ok(rankmem_omp_flush() == RANKMEM_SUCCESS, "rankmem_omp_flush");
    s = stats_of(st);
    ok(s.count_current == before.count_current && s.bytes_current == before.bytes_current,
       "omp_free gives both back to the rank's resource");
}

static void test_calloc(void)
{
    const size_t n = 2 * MiB;
    /* Dirty the pool's memory with a kernel, then calloc the same size:
     * the block is most likely the same one. */
    void *dirty = omp_alloc(n, rankmem_omp_device_mem_alloc);
    int filled = dirty && rkomp_test_fill(dirty, n / 4, 0xffffffffu, 0, NULL) == 0 &&
                 kernel_bad(dirty, n / 4, 0xffffffffu, 0) == 0;
    uintptr_t was = addr_of(dirty);
    omp_free(dirty, rankmem_omp_device_mem_alloc);
    void *z = omp_calloc(n / 8, 8, rankmem_omp_device_mem_alloc);
    diag("omp_calloc %s the dirtied block", (uintptr_t)z == was ? "reused" : "did not reuse");
    ok(filled && is_device(z) && kernel_bad(z, n / 4, 0, 0) == 0,
       "omp_calloc zeroes device memory a kernel had dirtied (kernel check)");
    omp_free(z, rankmem_omp_device_mem_alloc);

    void *dirty2 = omp_alloc(300 * KiB, rankmem_omp_device_mem_alloc);
    int filled2 = dirty2 && rkomp_test_fill(dirty2, 300 * KiB / 4, 0xa5a5a5a5u, 0, NULL) == 0;
    omp_free(dirty2, rankmem_omp_device_mem_alloc);
    void *za = omp_aligned_calloc(4096, 1000, 300, rankmem_omp_device_mem_alloc);
    ok(filled2 && is_device(za) && aligned_to(za, 4096) && kernel_bad(za, 300000 / 4, 0, 0) == 0,
       "omp_aligned_calloc zeroes device memory, aligned");
    omp_free(za, rankmem_omp_device_mem_alloc);
}

static void test_realloc(void)
{
    const size_t n = 1 * MiB;
    void *d = omp_alloc(n, rankmem_omp_device_mem_alloc);
    int filled = d && rkomp_test_fill(d, n / 4, 0xc0ffee00u, 1, NULL) == 0;
    void *g = filled ? omp_realloc(d, 4 * n, rankmem_omp_device_mem_alloc, rankmem_omp_device_mem_alloc)
                     : NULL;
    ok(is_device(g) && kernel_bad(g, n / 4, 0xc0ffee00u, 1) == 0,
       "omp_realloc 1 -> 4 MiB keeps what a kernel wrote (kernel check)");
    /* The new tail is writable by a kernel. */
    ok(g && kernel_round_trip((char *)g + n, 3 * n, 0x31u, 0), "the grown part is usable by a kernel");
    void *s = g ? omp_realloc(g, n / 2, omp_null_allocator, rankmem_omp_device_mem_alloc) : NULL;
    ok(is_device(s) && kernel_bad(s, n / 8, 0xc0ffee00u, 1) == 0,
       "omp_realloc 4 MiB -> 512 KiB (null allocator: same one) keeps the head");
    /* Into managed memory: the host may read it directly afterwards. */
    uint32_t *m = s ? omp_realloc(s, n / 2, rankmem_omp_managed_mem_alloc, rankmem_omp_device_mem_alloc)
                    : NULL;
    int good = m && mem_type(m) == cudaMemoryTypeManaged;
    for (size_t i = 0; good && i < n / 8; i++)
        good = m[i] == (0xc0ffee00u ^ (uint32_t)i);
    ok(good, "omp_realloc device -> managed keeps contents (read on the host)");
    omp_free(m, rankmem_omp_managed_mem_alloc);
}

static void test_allocate_clause(rankmem_resource_t *st)
{
    void *addr[NTHREADS] = {0};
    int dev[NTHREADS] = {0};
    unsigned long long bad[NTHREADS];
    int cuda_ok[NTHREADS] = {0};
    int nthreads = 0;
    rankmem_omp_flush(); /* nothing of the earlier tests pending */
    size_t live_inside = 0, live_before = stats_of(st).count_current;
    for (int i = 0; i < NTHREADS; i++)
        bad[i] = (unsigned long long)-1;
    double x[CLAUSE_DOUBLES];
#pragma omp parallel num_threads(NTHREADS) private(x) allocate(rankmem_omp_device_mem_alloc : x)
    {
        /* x is device memory: the host hands its address to CUDA and never
         * dereferences it. Each thread uses its own non-blocking stream. */
        int t = omp_get_thread_num();
        if (t == 0)
            nthreads = omp_get_num_threads();
        if (t < NTHREADS) {
            addr[t] = x;
            dev[t] = is_device(x);
            cudaStream_t s;
            if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess) {
                unsigned pattern = 0x10000u * (unsigned)(t + 1);
                cuda_ok[t] = rkomp_test_fill(x, sizeof x / 4, pattern, 1, s) == 0 &&
                             rkomp_test_count(x, sizeof x / 4, pattern, 1, t, s, &bad[t]) == 0;
                cudaStreamDestroy(s);
            }
        }
#pragma omp barrier
#pragma omp master
        live_inside = stats_of(st).count_current;
#pragma omp barrier
    }
    (void)x;
    rankmem_omp_flush();
    int ndev = 0, nclean = 0, distinct = 1;
    for (int t = 0; t < NTHREADS; t++) {
        ndev += dev[t];
        nclean += cuda_ok[t] && bad[t] == 0;
        for (int u = 0; u < t; u++)
            distinct &= addr[t] != addr[u];
    }
    ok(nthreads == NTHREADS && ndev == NTHREADS,
       "allocate clause, %d threads: every x is cudaMemoryTypeDevice (%d)", nthreads, ndev);
    ok(nclean == NTHREADS && distinct,
       "each thread's x, on its own stream: kernel fill and check clean (%d), all distinct", nclean);
    ok(live_inside == live_before + NTHREADS && stats_of(st).count_current == live_before,
       "the rank's stats: %zu live inside the region, all freed at its end", live_inside - live_before);
}

static void test_pool_size(rankmem_resource_t *st)
{
    /* null_fb: the pool's bytes are a hard limit. */
    omp_alloctrait_t tn[2] = {{omp_atk_pool_size, MiB}, {omp_atk_fallback, omp_atv_null_fb}};
    omp_allocator_handle_t pn = omp_init_allocator(rankmem_omp_device_mem_space, 2, tn);
    rankmem_omp_flush(); /* the failed allocations below flush: start with nothing pending */
    size_t live0 = stats_of(st).count_current;
    void *a1 = omp_alloc(768 * KiB, pn);
    void *a2 = omp_alloc(768 * KiB, pn);
    void *big = omp_alloc(2 * MiB, pn);
    ok(pn != omp_null_allocator && is_device(a1) && kernel_round_trip(a1, 768 * KiB, 0x5u, 0) &&
           !a2 && !big,
       "pool_size 1 MiB, null_fb: 768 KiB served (kernel round trip), the next 768 KiB and 2 MiB NULL");
    ok(stats_of(st).count_current == live0 + 1, "pool_size allocations count in the rank's stats");
    void *a3 = omp_alloc(256 * KiB, pn);
    ok(is_device(a3) && kernel_round_trip(a3, 256 * KiB, 0x6u, 0), "what is left of the pool is served");
    omp_free(a1, pn);
    void *a4 = omp_alloc(768 * KiB, pn);
    ok(is_device(a4), "after a free the pool serves 768 KiB again");
    void *zc = omp_calloc(1, 64 * KiB, pn);
    ok(!zc, "calloc past pool_size, null_fb: NULL");
    omp_free(a3, pn);
    omp_free(a4, pn);

    /* default_mem_fb: the rest comes from the runtime's omp_default_mem_alloc (host). */
    omp_alloctrait_t td[1] = {{omp_atk_pool_size, MiB}};
    omp_allocator_handle_t pd = omp_init_allocator(rankmem_omp_device_mem_space, 1, td);
    void *c1 = omp_alloc(768 * KiB, pd);
    unsigned char *c2 = omp_alloc(768 * KiB, pd);
    int host_rw = c2 && !is_ours(c2) && mem_type(c2) != cudaMemoryTypeDevice;
    if (host_rw) {
        memset(c2, 0x3c, 768 * KiB);
        host_rw = all_bytes(c2, 0x3c, 768 * KiB);
    }
    ok(is_device(c1) && host_rw,
       "pool_size 1 MiB, default_mem_fb: device block, then the runtime's host memory");
    omp_free(c2, pd);
    omp_free(c1, pd);

    /* allocator_fb: to another device allocator, then to managed memory,
     * then to the runtime's allocator. */
    omp_alloctrait_t tf[3] = {{omp_atk_pool_size, MiB},
                              {omp_atk_fallback, omp_atv_allocator_fb},
                              {omp_atk_fb_data, rankmem_omp_device_mem_alloc}};
    omp_allocator_handle_t pf = omp_init_allocator(rankmem_omp_device_mem_space, 3, tf);
    void *b1 = omp_alloc(768 * KiB, pf), *b2 = omp_alloc(768 * KiB, pf);
    ok(is_device(b1) && is_device(b2) && kernel_round_trip(b2, 768 * KiB, 0x7u, 0),
       "allocator_fb to rankmem_omp_device_mem_alloc: the overflow is device memory too");
    omp_free(b1, pf);
    omp_free(b2, pf);
    tf[2].value = rankmem_omp_managed_mem_alloc;
    omp_allocator_handle_t pm = omp_init_allocator(rankmem_omp_device_mem_space, 3, tf);
    void *m1 = omp_alloc(768 * KiB, pm);
    uint32_t *m2 = omp_alloc(768 * KiB, pm);
    int good = is_device(m1) && m2 && mem_type(m2) == cudaMemoryTypeManaged &&
               rkomp_test_fill(m2, 768 * KiB / 4, 0x99u, 1, NULL) == 0 &&
               cudaDeviceSynchronize() == cudaSuccess;
    for (size_t i = 0; good && i < 768 * KiB / 4; i += 997)
        good = m2[i] == (0x99u ^ (uint32_t)i);
    ok(good, "allocator_fb to the managed allocator: kernel writes it, the host reads it");
    omp_free(m1, pm);
    omp_free(m2, pm);
    tf[2].value = omp_default_mem_alloc;
    omp_allocator_handle_t pr = omp_init_allocator(rankmem_omp_device_mem_space, 3, tf);
    void *r1 = omp_alloc(768 * KiB, pr);
    unsigned char *r2 = omp_alloc(768 * KiB, pr);
    int rt_host = r2 && !is_ours(r2);
    if (rt_host) {
        memset(r2, 0x42, 768 * KiB);
        rt_host = all_bytes(r2, 0x42, 768 * KiB);
    }
    ok(is_device(r1) && rt_host, "allocator_fb to omp_default_mem_alloc: the runtime's host memory");
    omp_free(r1, pr);
    omp_free(r2, pr);

    omp_destroy_allocator(pn);
    omp_destroy_allocator(pd);
    omp_destroy_allocator(pf);
    omp_destroy_allocator(pm);
    omp_destroy_allocator(pr);

    /* abort_fb: the child process must die of SIGABRT, and say why. */
    char err[4096];
    int status = run_abort_child(err, sizeof err);
    int aborted = status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
    ok(aborted && strstr(err, "child: first block served") && strstr(err, "abort_fb"),
       "pool_size 1 MiB, abort_fb: the overflowing omp_alloc aborts with a message");
    if (!aborted)
        diag("child: wait status %d (exit %d), stderr: %s", status,
             status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1, err);
}

/* omp_free's wait (RANKMEM_OMP_FREE_SYNC=1): a kernel on a non-blocking
 * stream still reading a block must finish before the block is handed out
 * again and overwritten. */
static void test_free_waits(void)
{
    const char *v = getenv("RANKMEM_OMP_FREE_SYNC");
    if (v && (!strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "no") ||
              !strcasecmp(v, "false"))) {
        tap_skip(1, "RANKMEM_OMP_FREE_SYNC is off");
        return;
    }
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        ok(0, "cudaStreamCreateWithFlags");
        return;
    }
    const size_t n = 1 * MiB;
    void *p = omp_alloc(n, rankmem_omp_device_mem_alloc);
    unsigned long long bad = (unsigned long long)-1;
    int launched = p && rkomp_test_fill(p, n / 4, 0xfeedu, 1, s) == 0 &&
                   rkomp_test_spin(s, SPIN_CYCLES) == 0 &&
                   rkomp_test_count_async(p, n / 4, 0xfeedu, 1, 1, s) == 0;
    uintptr_t was = addr_of(p);
    omp_free(p, rankmem_omp_device_mem_alloc); /* the check kernel is still queued behind the spin */
    /* With deferred release p is pending now: the flush gives it back after
     * a device sync, so the allocation below may reuse it. */
    int flushed = rankmem_omp_flush() == RANKMEM_SUCCESS;
    void *q = omp_alloc(n, rankmem_omp_device_mem_alloc);
    int over = q && rkomp_test_fill(q, n / 4, 0xbad0u, 1, NULL) == 0;
    int read = rkomp_test_counter(1, s, &bad) == 0;
    diag("the next omp_alloc %s the freed block", (uintptr_t)q == was ? "reused" : "did not reuse");
    ok(launched && flushed && over && read && bad == 0,
       "omp_free waits for a kernel still reading the block on a non-blocking stream (%llu words "
       "overwritten early)",
       bad);
    omp_free(q, rankmem_omp_device_mem_alloc);
    cudaStreamDestroy(s);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--abort-child") == 0)
        return abort_child();
    int n = 0;
    if (rankmem_device_count(&n) != RANKMEM_SUCCESS || n == 0)
        return tap_skip_all("no GPU");
    int active = 0;
    rankmem_omp_active(&active);
    if (!active)
        BAIL_OUT("librankmem_omp is not interposed (link order)");
    diag("runtime: %s", RT_NAME);

    rankmem_resource_t *cur, *st = install_stats(&cur);

    test_kernel_round_trip(st);
    test_calloc();
    test_realloc();
    test_allocate_clause(st);
    test_pool_size(st);
    test_free_waits();

    ok(cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess,
       "no CUDA error left behind");
    rankmem_omp_flush();
    rankmem_stats_t s = stats_of(st);
    ok(s.count_current == 0 && s.bytes_current == 0 && s.count_total >= 30,
       "the rank's stats: everything freed (%zu live of %zu served, %zu bytes)", s.count_current,
       s.count_total, s.bytes_current);
    rankmem_set_current_resource(cur);
    ok(rankmem_resource_release(st) == RANKMEM_SUCCESS, "the stats adaptor goes with no block left");
    rankmem_resource_release(cur);
    return tap_done();
}
#else
int main(void) { return tap_skip_all("built without CUDA"); }
#endif
