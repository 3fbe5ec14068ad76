/* The vmm resource on a real GPU (CUDA driver's virtual memory API):
 *  - built from spec strings (vmm, stats>vmm, binning>vmm), a kernel writes
 *    and checks every block, sizes from 1 KiB to 48 MiB;
 *  - growth maps granules, freeing and growing past the budget gives them
 *    back (counted by rankmem_vmm_get_stats), trim gives back the rest;
 *  - export of an interior range of a live block to another process, with
 *    default handle sizes (also once grown past 1 GiB: handles of several
 *    granules), handle=8MiB and one granule per handle: a child forked
 *    before any CUDA call receives the handles' descriptors over a Unix
 *    socket (SCM_RIGHTS), maps them on its GPU, checks the parent's data
 *    with a kernel and writes its own, which the parent then checks.
 * Skips where there is no GPU. Run it under compute-sanitizer too
 * (docs/vmm.md). */
#define _GNU_SOURCE
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <rankmem.h>

#include "tap.h"
#include "fdpass.h"

#if HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu_kernels.h"

#define MiB ((size_t)1 << 20)
#define PATTERN 0x5eed1234u
#define PATTERN2 0x0badcafeu

/* The child: exports one after another until a count of 0. Replies to
 * each: the words of the parent's pattern it found wrong (8 bytes), then,
 * once it has written PATTERN2 and closed its mapping, a status (8 bytes,
 * 0 = fine). */
static int child(int sock)
{
    for (;;) {
        rankmem_vmm_export_t e;
        rankmem_vmm_handle_t h[64];
        int got = recv_export(sock, &e, h);
        if (got == 1)
            return 0;
        if (got != 0)
            return 3;
        unsigned long long bad = ~0ull, status = 1;
        void *p = NULL;
        rankmem_vmm_import_t *im = NULL;
        if (cudaSetDevice(e.device) == cudaSuccess &&
            rankmem_vmm_import(&e, &p, &im) == RANKMEM_SUCCESS) {
            if (rk_test_check(p, e.bytes / 4, PATTERN, NULL, &bad) != 0)
                bad = ~0ull;
            if (rk_test_fill(p, e.bytes / 4, PATTERN2, NULL) == 0 &&
                cudaDeviceSynchronize() == cudaSuccess &&
                rankmem_vmm_import_close(im) == RANKMEM_SUCCESS)
                status = 0;
        } else {
            fprintf(stderr, "child: import: %s\n", rankmem_last_error());
        }
        for (size_t i = 0; i < e.count; i++)
            close(h[i].fd);
        if (write(sock, &bad, sizeof bad) != (ssize_t)sizeof bad ||
            write(sock, &status, sizeof status) != (ssize_t)sizeof status)
            return 4;
    }
}

static rankmem_vmm_stats_t vstats(rankmem_resource_t *mr)
{
    rankmem_vmm_stats_t s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    if (rankmem_vmm_get_stats(mr, &s) != RANKMEM_SUCCESS)
        diag("get_stats: %s", rankmem_last_error());
    return s;
}

/* Every block written and checked by kernels, then freed; trim gives every
 * granule back. */
static void test_spec(const char *spec)
{
    rankmem_resource_t *mr = NULL;
    rankmem_status_t st = rankmem_resource_from_spec(spec, &mr);
    is_status(st, RANKMEM_SUCCESS, "%s: built", spec);
    if (st != RANKMEM_SUCCESS) {
        diag("%s", rankmem_last_error());
        return;
    }
    enum { N = 24 };
    void *p[N];
    size_t n[N];
    int fails = 0;
    unsigned long long bad = 0;
    for (int i = 0; i < N; i++) {
        n[i] = (size_t)1024 << (i % 16); /* 1 KiB .. 32 MiB */
        n[i] += (size_t)i * 4096;
        p[i] = NULL;
        if (rankmem_allocate(mr, n[i], 0, &p[i]) != RANKMEM_SUCCESS) {
            fails++;
            continue;
        }
        if (rk_test_fill(p[i], n[i] / 4, PATTERN + (unsigned)i, NULL) != 0)
            fails++;
    }
    for (int i = 0; i < N; i++) {
        unsigned long long b = 0;
        if (p[i] && rk_test_check(p[i], n[i] / 4, PATTERN + (unsigned)i, NULL, &b) != 0)
            fails++;
        bad += b;
    }
    ok(fails == 0, "%s: %d blocks allocated, written and checked by kernels (%d failures)", spec,
       N, fails);
    ok(bad == 0, "%s: every word as written (%llu wrong)", spec, bad);
    rankmem_vmm_stats_t s = vstats(mr);
    ok(s.granules_mapped > 0 && s.mapped % s.granule == 0 && s.mapped >= s.live_high / 2,
       "%s: %zu granules of %zu bytes mapped", spec, s.granules_mapped, s.granule);
    for (int i = 0; i < N; i++)
        if (p[i])
            rankmem_deallocate(mr, p[i], n[i], 0);
    /* Trim the vmm itself (the leaf): adaptors above may keep blocks. */
    rankmem_resource_t *leaf = mr, *up = NULL;
    while (rankmem_resource_upstream(leaf, &up) == RANKMEM_SUCCESS && up)
        leaf = up;
    size_t before = s.mapped;
    is_status(rankmem_resource_trim(leaf, 0), RANKMEM_SUCCESS, "%s: trim", spec);
    s = vstats(mr);
    if (leaf == mr)
        ok(s.mapped == 0 && s.granules_released == s.granules_mapped,
           "%s: trim gave every granule back (%zu mapped, %zu of %zu released)", spec,
           s.mapped, s.granules_released, s.granules_mapped);
    else
        ok(s.mapped <= before && s.granules_released > 0,
           "%s: trim gave granules back (%zu mapped, %zu of %zu released)", spec, s.mapped,
           s.granules_released, s.granules_mapped);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "%s: release", spec);
}

/* Growing past the budget gives free granules back first. */
static void test_give_back(void)
{
    rankmem_resource_t *mr = NULL;
    is_status(rankmem_vmm_create(NULL, &mr), RANKMEM_SUCCESS, "vmm_create(NULL)");
    if (!mr)
        return;
    void *a = NULL, *b = NULL;
    rankmem_allocate(mr, 64 * MiB, 0, &a);
    rankmem_vmm_stats_t s0 = vstats(mr);
    ok(a && s0.mapped >= 64 * MiB && s0.mapped <= 64 * MiB + s0.granule,
       "64 MiB: %zu bytes mapped", s0.mapped);
    rankmem_deallocate(mr, a, 64 * MiB, 0);
    rankmem_allocate(mr, 128 * MiB, 0, &b);
    unsigned long long bad = 1;
    if (b && rk_test_fill(b, 128 * MiB / 4, PATTERN, NULL) == 0)
        rk_test_check(b, 128 * MiB / 4, PATTERN, NULL, &bad);
    rankmem_vmm_stats_t s = vstats(mr);
    ok(b && bad == 0, "128 MiB after freeing 64: written and checked");
    /* At a new peak only what is over the budget (the peak live plus a
     * 64th) goes back: the 64 MiB less at most that slack. */
    ok(s.give_backs >= 1 &&
           s.granules_released * s.granule + 128 * MiB / 64 + s.granule >= 64 * MiB,
       "the 64 MiB went back before growing, less the budget's slack (%zu granules released, "
       "%zu give-backs)",
       s.granules_released, s.give_backs);
    ok(s.mapped_high <= 128 * MiB + 2 * s.granule, "peak mapped %zu for a peak live of 128 MiB",
       s.mapped_high);
    size_t reserved = 0;
    rankmem_resource_query(mr, RANKMEM_QUERY_RESERVED_CURRENT, &reserved);
    ok(reserved == s.mapped, "RESERVED_CURRENT is the mapped bytes (%zu)", reserved);
    rankmem_deallocate(mr, b, 128 * MiB, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "release");
}

/* Export an interior range of a live block of a vmm built from spec, after
 * a warm-up allocation of warm bytes (default handle sizes grow with what
 * is mapped: the block then lies in handles of several granules). */
static void test_export(int sock, const char *spec, size_t warm)
{
    rankmem_resource_t *mr = NULL;
    is_status(rankmem_resource_from_spec(spec, &mr), RANKMEM_SUCCESS, "export %s: created", spec);
    if (!mr)
        return;
    void *w = NULL, *pad = NULL, *b = NULL;
    size_t n = 40 * MiB + 4096;
    if (warm)
        rankmem_allocate(mr, warm, 0, &w);
    rankmem_allocate(mr, 3 * MiB + 512, 0, &pad); /* b starts inside a granule */
    rankmem_allocate(mr, n, 0, &b);
    int wrote = b && rk_test_fill(b, n / 4, PATTERN ^ 1, NULL) == 0 &&
                cudaDeviceSynchronize() == cudaSuccess;
    /* The range: from 1 MiB + 4 into the block, 30 MiB. */
    char *r = b ? (char *)b + MiB + 4 : NULL;
    size_t rn = 30 * MiB;
    wrote = wrote && rk_test_fill(r, rn / 4, PATTERN, NULL) == 0 &&
            cudaDeviceSynchronize() == cudaSuccess;
    ok(wrote, "export %s: a %zu-byte block written", spec, n);
    rankmem_vmm_export_t e;
    memset(&e, 0, sizeof e);
    rankmem_status_t st = r ? rankmem_vmm_export(mr, r, rn, &e) : RANKMEM_ERR_OUT_OF_MEMORY;
    if (st == RANKMEM_ERR_NOT_SUPPORTED) {
        tap_skip(5, "this device cannot export POSIX file descriptors");
    } else {
        size_t multi = 0;
        for (size_t i = 0; st == RANKMEM_SUCCESS && i < e.count; i++)
            multi += e.handles[i].bytes > e.granule;
        is_status(st, RANKMEM_SUCCESS, "export %s: an interior range of %zu bytes in %zu handles "
                                       "(%zu of several granules)",
                  spec, rn, e.count, multi);
        if (warm || strstr(spec, "handle=8MiB")) /* handles larger than a granule */
            ok(multi > 0, "export %s: handles of several granules are exported whole", spec);
        else
            ok(st == RANKMEM_SUCCESS && e.count >= 1, "export %s: handles described", spec);
        int sent = st == RANKMEM_SUCCESS && send_export(sock, &e) == 0;
        unsigned long long bad = ~0ull, status = ~0ull;
        if (sent) {
            (void)!read(sock, &bad, sizeof bad);
            (void)!read(sock, &status, sizeof status);
        }
        ok(sent && bad == 0, "export %s: the other process read the range (%llu words wrong)",
           spec, bad);
        ok(sent && status == 0, "export %s: it wrote its own and closed its mapping", spec);
        unsigned long long bad2 = ~0ull, bad3 = ~0ull;
        rk_test_check(r, rn / 4, PATTERN2, NULL, &bad2);
        rk_test_check(b, MiB / 4, PATTERN ^ 1, NULL, &bad3);
        ok(bad2 == 0 && bad3 == 0,
           "export %s: its writes are seen here, the rest of the block untouched (%llu, %llu "
           "words wrong)",
           spec, bad2, bad3);
        rankmem_vmm_export_close(&e);
    }
    if (b)
        rankmem_deallocate(mr, b, n, 0);
    if (pad)
        rankmem_deallocate(mr, pad, 3 * MiB + 512, 0);
    if (w)
        rankmem_deallocate(mr, w, warm, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "export %s: release", spec);
}

int main(void)
{
    /* The child must be forked before this process makes any CUDA call. */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        BAIL_OUT("socketpair");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        BAIL_OUT("fork");
    if (pid == 0) {
        close(sv[0]);
        _exit(child(sv[1]));
    }
    close(sv[1]);

    int ndev = 0;
    rankmem_status_t st = rankmem_device_count(&ndev);
    if (st != RANKMEM_SUCCESS || ndev == 0) {
        rankmem_vmm_export_t none;
        memset(&none, 0, sizeof none);
        (void)!write(sv[0], &none, sizeof none);
        waitpid(pid, NULL, 0);
        char reason[600];
        rankmem_resource_t *mr = NULL;
        st = rankmem_vmm_create(NULL, &mr);
        snprintf(reason, sizeof reason, "no GPU: %s", st ? rankmem_last_error() : "?");
        if (mr)
            rankmem_resource_release(mr);
        return tap_skip_all(reason);
    }
    rankmem_resource_t *probe = NULL;
    st = rankmem_vmm_create(NULL, &probe);
    if (st == RANKMEM_ERR_NOT_SUPPORTED) {
        rankmem_vmm_export_t none;
        memset(&none, 0, sizeof none);
        (void)!write(sv[0], &none, sizeof none);
        waitpid(pid, NULL, 0);
        char reason[600];
        snprintf(reason, sizeof reason, "vmm not supported here: %s", rankmem_last_error());
        return tap_skip_all(reason);
    }
    if (probe)
        rankmem_resource_release(probe);

    test_spec("vmm");
    test_spec("stats>vmm");
    test_spec("binning>vmm");
    test_give_back();
    test_export(sv[0], "vmm", 0);
    test_export(sv[0], "vmm", (size_t)1 << 30); /* default handles, grown past 1 GiB */
    test_export(sv[0], "vmm(handle=8MiB)", 0);
    test_export(sv[0], "stats>vmm(granule=2MiB,handle=2MiB)", 0);
    rankmem_vmm_export_t none;
    memset(&none, 0, sizeof none);
    (void)!write(sv[0], &none, sizeof none);
    int status = -1;
    waitpid(pid, &status, 0);
    close(sv[0]);
    ok(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child process exited cleanly (%d)",
       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    ok(cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess,
       "no CUDA error left at the end");
    return tap_done();
}

#else /* !HAVE_CUDA */

int main(void)
{
    rankmem_resource_t *mr = NULL;
    rankmem_status_t st = rankmem_vmm_create(NULL, &mr);
    (void)st;
    return tap_skip_all("no GPU: rankmem was built without CUDA");
}

#endif
