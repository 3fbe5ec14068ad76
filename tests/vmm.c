/* The vmm resource over its host backend (mmap of a memfd, granule by
 * granule, 64 KiB granules here): placement and contents, coalescing across
 * growths, granules given back before growing past the budget, holes
 * reused, trim, the maximum, injected map failures (clean error, nothing
 * leaked, still usable), counters against queries, spec strings, export to
 * a forked process over a Unix socket, and every bad input. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <rankmem.h>
#include "tap.h"
#include "fdpass.h"

#include "vmm_host.h"

static rankmem_resource_t *host_vmm(size_t maximum, size_t release)
{
    return host_vmm_of(maximum, release, 0);
}

static size_t q(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = (size_t)-1;
    rankmem_resource_query(mr, what, &v);
    return v;
}

static void *get(rankmem_resource_t *mr, size_t n)
{
    void *p = NULL;
    if (rankmem_allocate(mr, n, 0, &p) != RANKMEM_SUCCESS)
        return NULL;
    return p;
}

static void bad_inputs(void)
{
    rankmem_vmm_params_t prm;
    rankmem_resource_t *mr = NULL;
    is_status(rankmem_vmm_params_default(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "params_default(NULL)");
    is_status(rankmem_vmm_create(NULL, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL output");
    rankmem_vmm_params_default(&prm);
    prm.size = 3;
    is_status(rankmem_vmm_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT, "create: bad params.size");
    rankmem_vmm_params_default(&prm);
    prm.backend = 7;
    is_status(rankmem_vmm_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT, "create: bad backend");
    rankmem_vmm_params_default(&prm);
    prm.backend = RANKMEM_VMM_BACKEND_HOST;
    prm.granule = 3 << 12;
    is_status(rankmem_vmm_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: granule not a power of two");
    prm.granule = 1024;
    is_status(rankmem_vmm_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: granule below 4 KiB");
    prm.granule = 0;
    prm.maximum = 0;
    is_status(rankmem_vmm_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT, "create: maximum 0");
    prm.maximum = (size_t)2 << 30;
    prm.reserve = (size_t)1 << 30;
    is_status(rankmem_vmm_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: maximum above the reserve");
    prm.maximum = SIZE_MAX;
    prm.reserve = SIZE_MAX / 2;
    is_status(rankmem_vmm_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "create: absurd reserve");
    ok(mr == NULL, "no resource came out of the bad calls");
    /* The device backend: a GPU with the API, or a clear refusal. */
    rankmem_status_t st = rankmem_vmm_create(NULL, &mr);
    ok(st == RANKMEM_SUCCESS || st == RANKMEM_ERR_NO_DEVICE || st == RANKMEM_ERR_NOT_SUPPORTED,
       "device backend: success or NO_DEVICE/NOT_SUPPORTED (%s)", rankmem_status_string(st));
    if (st == RANKMEM_SUCCESS)
        rankmem_resource_release(mr);

    rankmem_resource_t *sys = NULL;
    rankmem_system_create(&sys);
    rankmem_vmm_stats_t s = {.size = sizeof s};
    is_status(rankmem_vmm_get_stats(sys, &s), RANKMEM_ERR_INVALID_ARGUMENT,
              "get_stats: no vmm in the chain");
    is_status(rankmem_vmm_get_stats(NULL, &s), RANKMEM_ERR_INVALID_ARGUMENT, "get_stats: NULL");
    is_status(rankmem_vmm_inject_map_failure(sys, 1, 1), RANKMEM_ERR_INVALID_ARGUMENT,
              "inject: no vmm in the chain");
    rankmem_resource_release(sys);
}

static void placement_and_coalescing(void)
{
    rankmem_resource_t *mr = host_vmm(SIZE_MAX, 0);
    rankmem_vmm_stats_t s0 = stats(mr);
    ok(s0.granule == G && s0.mapped == 0 && s0.reserved == (size_t)1 << 30,
       "fresh: granule 64 KiB, nothing mapped, 1 GiB reserved");
    unsigned char *a = get(mr, 100000), *b = get(mr, 20000), *c = NULL;
    void *al = NULL;
    ok(a && b, "two blocks");
    memset(a, 0xa1, 100000);
    memset(b, 0xb2, 20000);
    is_status(rankmem_allocate(mr, 5000, 32768, &al), RANKMEM_SUCCESS, "aligned block");
    ok(((uintptr_t)al & 32767) == 0, "alignment 32 KiB honoured");
    memset(al, 0xcc, 5000);
    ok(a[99999] == 0xa1 && b[0] == 0xb2 && b[19999] == 0xb2, "contents intact");
    ok(!(b < a + 100000 && a < b + 20000), "no overlap");
    rankmem_vmm_stats_t s1 = stats(mr);
    ok(s1.mapped % G == 0 && s1.mapped >= 125000 && s1.mapped <= 125000 + 3 * G,
       "mapped %zu bytes: whole granules, close to the live bytes", s1.mapped);
    ok(q(mr, RANKMEM_QUERY_RESERVED_CURRENT) == s1.mapped &&
           q(mr, RANKMEM_QUERY_RESERVED_HIGH) == s1.mapped_high,
       "RESERVED_* answer the mapped bytes");
    ok(q(mr, RANKMEM_QUERY_USED_CURRENT) == 125000, "USED_CURRENT counts the live bytes");
    ok(s1.granules_mapped == s1.mapped / G, "one map per granule (%zu)", s1.granules_mapped);
    rankmem_deallocate(mr, al, 5000, 32768);
    rankmem_deallocate(mr, a, 100000, 0);
    rankmem_deallocate(mr, b, 20000, 0);
    /* Blocks carved from one growth coalesce back into it. */
    size_t whole = 8 * G;
    c = get(mr, whole);
    rankmem_deallocate(mr, c, whole, 0);
    rankmem_vmm_stats_t s2 = stats(mr);
    void *part[8];
    for (int i = 0; i < 8; i++)
        part[i] = get(mr, G - 256);
    for (int i = 0; i < 8; i++)
        rankmem_deallocate(mr, part[i], G - 256, 0);
    c = get(mr, whole);
    ok(c != NULL, "one block of a whole growth (%zu)", whole);
    ok(stats(mr).granules_mapped == s2.granules_mapped, "served without mapping anything");
    rankmem_deallocate(mr, c, whole, 0);
    char desc[128];
    rankmem_resource_describe(mr, desc, sizeof desc, NULL);
    ok(strcmp(desc, "vmm(backend=host,reserve=1GiB,granule=64KiB)") == 0, "describe: %s", desc);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "release");
}

static void give_back_and_holes(void)
{
    rankmem_resource_t *mr = host_vmm(SIZE_MAX, 0);
    size_t mib = (size_t)1 << 20;
    char *a = get(mr, mib);
    ok(a != NULL && stats(mr).mapped == mib, "1 MiB: 16 granules mapped");
    rankmem_deallocate(mr, a, mib, 0);
    /* Growing to 2 MiB would put 3 MiB mapped for a peak of 2 MiB live: the
     * free granules go back first, and the range they leave is reused. */
    char *b = get(mr, 2 * mib);
    rankmem_vmm_stats_t s = stats(mr);
    ok(b != NULL, "2 MiB");
    ok(s.mapped == 2 * mib, "mapped 2 MiB, not 3 (%zu)", s.mapped);
    ok(s.granules_released == 16 && s.give_backs == 1, "16 granules given back once (%zu, %zu)",
       s.granules_released, s.give_backs);
    ok(b == a, "the unmapped range was mapped again (address reused)");
    ok(s.mapped_high == 2 * mib, "high-water mark 2 MiB");
    /* A hole in the middle: c (64 KiB) after b; b freed; d (3 MiB) cannot
     * use b's hole and grows at the frontier; e (2 MiB) then fills it. */
    char *c = get(mr, G);
    rankmem_deallocate(mr, b, 2 * mib, 0);
    char *d = get(mr, 3 * mib);
    s = stats(mr);
    ok(c && d && d > c, "3 MiB placed after the 64 KiB block");
    ok(s.mapped == 3 * mib + G, "b's granules given back before growing (%zu mapped)", s.mapped);
    char *e = get(mr, 2 * mib);
    ok(e == b, "a block that fits the hole is mapped there");
    ok(stats(mr).mapped == 5 * mib + G, "mapped = live granules");
    /* Trim gives back what is wholly free. */
    rankmem_deallocate(mr, d, 3 * mib, 0);
    rankmem_deallocate(mr, e, 2 * mib, 0);
    ok(stats(mr).mapped == 5 * mib + G, "frees do not unmap (the deallocate path takes no syscall)");
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim(0)");
    s = stats(mr);
    ok(s.mapped == G, "after trim only the live block's granule stays (%zu)", s.mapped);
    ok((c[G - 1] = 7) == 7 && ((volatile char *)c)[0] == c[0], "the live block is still mapped");
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim again: nothing to do");
    ok(stats(mr).mapped == G, "still one granule");
    /* Steady oscillation below the peak never maps nor unmaps. */
    char *f = get(mr, 2 * mib);
    rankmem_deallocate(mr, f, 2 * mib, 0);
    rankmem_vmm_stats_t before = stats(mr);
    for (int i = 0; i < 100; i++) {
        f = get(mr, (size_t)(i % 7 + 1) * 200000);
        rankmem_deallocate(mr, f, (size_t)(i % 7 + 1) * 200000, 0);
    }
    s = stats(mr);
    ok(s.granules_mapped == before.granules_mapped &&
           s.granules_released == before.granules_released,
       "oscillation below the peak: no map, no unmap");
    rankmem_deallocate(mr, c, G, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "release");
}

static void release_threshold(void)
{
    size_t mib = (size_t)1 << 20;
    rankmem_resource_t *mr = host_vmm(SIZE_MAX, 4 * mib);
    char *a = get(mr, mib);
    rankmem_deallocate(mr, a, mib, 0);
    char *b = get(mr, 2 * mib);
    rankmem_vmm_stats_t s = stats(mr);
    ok(b && s.mapped == 3 * mib && s.granules_released == 0,
       "release=4MiB: free granules within the threshold stay mapped");
    rankmem_deallocate(mr, b, 2 * mib, 0);
    /* trim(keep) stops at keep, whatever the threshold. */
    is_status(rankmem_resource_trim(mr, mib / 2), RANKMEM_SUCCESS, "trim(512 KiB)");
    s = stats(mr);
    ok(s.mapped == mib / 2, "trim keeps 512 KiB mapped (%zu)", s.mapped);
    void *c = get(mr, mib / 2);
    ok(c != NULL && stats(mr).granules_mapped == s.granules_mapped,
       "what trim kept serves a request without mapping");
    rankmem_deallocate(mr, c, mib / 2, 0);
    rankmem_resource_release(mr);
}

/* handle=: growths map handles of up to 4 granules; only whole ones go back. */
static void handles(void)
{
    rankmem_vmm_params_t prm;
    rankmem_vmm_params_default(&prm);
    prm.backend = RANKMEM_VMM_BACKEND_HOST;
    prm.granule = G;
    prm.handle = 4 * G;
    prm.reserve = (size_t)1 << 30;
    rankmem_resource_t *mr = NULL;
    is_status(rankmem_vmm_create(&prm, &mr), RANKMEM_SUCCESS, "handle=256KiB");
    if (!mr)
        return;
    char *x = get(mr, 8 * G);
    rankmem_vmm_stats_t s = stats(mr);
    ok(x && s.handles_created == 2 && s.granules_mapped == 8,
       "8 granules in 2 handles (%zu handles)", s.handles_created);
    char *y = get(mr, G);
    ok(y && stats(mr).handles_created == 3, "a 1-granule growth: a handle of 1 granule");
    memset(x, 1, 8 * G);
    rankmem_deallocate(mr, x, 8 * G, 0);
    char *z = get(mr, 16 * G);
    s = stats(mr);
    ok(z && s.granules_released == 8, "x's 2 handles went back whole (%zu granules)",
       s.granules_released);
    ok(s.mapped == 17 * G, "mapped: y and z (%zu)", s.mapped);
    char desc[160];
    rankmem_resource_describe(mr, desc, sizeof desc, NULL);
    ok(strstr(desc, "handle=256KiB") != NULL, "describe: %s", desc);
    rankmem_deallocate(mr, y, G, 0);
    rankmem_deallocate(mr, z, 16 * G, 0);
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim");
    ok(stats(mr).mapped == 0, "trim: every handle back");
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "release");
    prm.handle = 3 * G;
    is_status(rankmem_vmm_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "handle not a power of two");
    prm.handle = G / 2;
    is_status(rankmem_vmm_create(&prm, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "handle below the granule");
    is_status(rankmem_resource_from_spec("vmm(backend=host,granule=64KiB,handle=32KiB)", &mr),
              RANKMEM_ERR_CONFIG, "spec: handle below the granule");
}

static void maximum_and_failures(void)
{
    size_t mib = (size_t)1 << 20;
    rankmem_resource_t *mr = host_vmm(mib, 0);
    ok(q(mr, RANKMEM_QUERY_POOL_MAX) == mib, "POOL_MAX is the maximum");
    char *a = get(mr, mib / 2);
    void *p = NULL;
    ok(a != NULL, "half the maximum");
    is_status(rankmem_allocate(mr, mib, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY, "past the maximum");
    ok(strstr(rankmem_last_error(), "maximum") != NULL, "the error names the maximum: %s",
       rankmem_last_error());
    ok(stats(mr).mapped == mib / 2, "nothing mapped by the refused request");
    rankmem_deallocate(mr, a, mib / 2, 0);
    ok((p = get(mr, mib)) != NULL, "the whole maximum once the half is free");
    rankmem_deallocate(mr, p, mib, 0);
    rankmem_resource_release(mr);

    mr = host_vmm(SIZE_MAX, 0);
    a = get(mr, G);
    rankmem_vmm_stats_t s0 = stats(mr);
    /* The 2nd granule of the next growth fails, and every map after it. */
    is_status(rankmem_vmm_inject_map_failure(mr, 2, SIZE_MAX), RANKMEM_SUCCESS, "arm");
    is_status(rankmem_allocate(mr, 4 * G, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY,
              "map failure: OUT_OF_MEMORY");
    ok(strstr(rankmem_last_error(), "injected") != NULL, "the map's error: %s",
       rankmem_last_error());
    rankmem_vmm_stats_t s1 = stats(mr);
    ok(s1.mapped == s0.mapped && s1.granules_mapped - s1.granules_released ==
                                     s0.granules_mapped - s0.granules_released,
       "nothing stays mapped from the failed growth (%zu mapped)", s1.mapped);
    ok((a[G - 1] = 1) == 1 && ((volatile char *)a)[0] == a[0], "the live block is untouched");
    is_status(rankmem_vmm_inject_map_failure(mr, 0, 0), RANKMEM_SUCCESS, "disarm");
    ok((p = get(mr, 4 * G)) != NULL, "usable again");
    rankmem_deallocate(mr, p, 4 * G, 0);
    /* One failure only: growth gives back what is free and tries again. */
    rankmem_vmm_inject_map_failure(mr, 1, 1);
    ok((p = get(mr, 8 * G)) != NULL, "a single failure is retried");
    rankmem_deallocate(mr, p, 8 * G, 0);
    rankmem_deallocate(mr, a, G, 0);
    /* Released with a live block: BUSY, and the memory unmapped anyway. */
    p = get(mr, 3 * G);
    is_status(rankmem_resource_release(mr), RANKMEM_ERR_BUSY, "release with a live block: BUSY");
}

static void specs(void)
{
    rankmem_resource_t *mr = NULL;
    is_status(rankmem_resource_from_spec("stats>vmm(backend=host,granule=64KiB,max=1GiB)", &mr),
              RANKMEM_SUCCESS, "stats>vmm(backend=host,...) from a spec");
    void *p = get(mr, 1000);
    ok(p != NULL, "allocates through stats");
    rankmem_vmm_stats_t s = stats(mr);
    ok(s.granule == G && s.mapped == G, "get_stats finds the vmm below stats");
    rankmem_deallocate(mr, p, 1000, 0);
    rankmem_resource_release(mr);
    mr = NULL;
    is_status(rankmem_resource_from_spec("vmm(backend=host,granule=3000)", &mr), RANKMEM_ERR_CONFIG,
              "spec: granule not a power of two");
    is_status(rankmem_resource_from_spec("vmm(backend=gpu)", &mr), RANKMEM_ERR_CONFIG,
              "spec: unknown backend");
    is_status(rankmem_resource_from_spec("vmm(backend=host,max=0)", &mr), RANKMEM_ERR_CONFIG,
              "spec: max=0");
    is_status(rankmem_resource_from_spec("pool>vmm(backend=host)", &mr), RANKMEM_SUCCESS,
              "pool>vmm: a leaf under a pool");
    rankmem_resource_release(mr);
}

/* ---- export to a forked process ---- */

/* The child: receive the export, check the parent's bytes, write its own. */
static int child(int sock)
{
    rankmem_vmm_export_t e;
    rankmem_vmm_handle_t h[64];
    if (recv_export(sock, &e, h) != 0)
        return 2;
    void *p = NULL;
    rankmem_vmm_import_t *im = NULL;
    if (rankmem_vmm_import(&e, &p, &im) != RANKMEM_SUCCESS)
        return 3;
    for (size_t i = 0; i < e.count; i++)
        close(h[i].fd);
    unsigned char *b = p;
    for (size_t i = 0; i < e.bytes; i++)
        if (b[i] != (unsigned char)(i * 7 + 1))
            return 4;
    memset(b, 0x5a, e.bytes);
    if (rankmem_vmm_import_close(im) != RANKMEM_SUCCESS)
        return 5;
    return 0;
}

/* Import e here and compare with the exporter's bytes at ptr. */
static int import_matches(const rankmem_vmm_export_t *e, const unsigned char *ptr)
{
    void *p = NULL;
    rankmem_vmm_import_t *im = NULL;
    if (rankmem_vmm_import(e, &p, &im) != RANKMEM_SUCCESS)
        return 0;
    int same = p != ptr && memcmp(p, ptr, e->bytes) == 0;
    return rankmem_vmm_import_close(im) == RANKMEM_SUCCESS && same;
}

static void export_import(void)
{
    rankmem_resource_t *mr = host_vmm(SIZE_MAX, 0);
    size_t n = 3 * G + 1000;
    unsigned char *pad = get(mr, 5000); /* so that the block starts inside a granule */
    unsigned char *b = get(mr, n);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 7 + 1);
    void *rb = NULL;
    size_t rn = 0;
    is_status(rankmem_vmm_range(mr, &rb, &rn), RANKMEM_SUCCESS, "range");
    ok((char *)b >= (char *)rb && (char *)b + n <= (char *)rb + rn && rn == (size_t)1 << 30,
       "range: the reservation holds the blocks (%zu bytes)", rn);
    rankmem_vmm_export_t e;
    memset(&e, 0, sizeof e);
    is_status(rankmem_vmm_export(mr, b, n, &e), RANKMEM_SUCCESS, "export");
    int layout = e.count == 4 && e.offset == (size_t)((uintptr_t)b % G) && e.bytes == n &&
                 e.granule == G && e.backend == RANKMEM_VMM_BACKEND_HOST;
    for (size_t i = 0; layout && i < e.count; i++) {
        const rankmem_vmm_handle_t *h = &e.handles[i];
        layout = h->fd >= 0 && h->bytes == G && h->id != 0 &&
                 h->address == (uintptr_t)b - e.offset + i * G &&
                 (i == 0 || (h->id != e.handles[0].id &&
                             h->fd_offset == e.handles[i - 1].fd_offset + G));
    }
    ok(layout, "export: 4 handles of one granule, ids and addresses, offset %zu", e.offset);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        BAIL_OUT("socketpair: %s", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        _exit(child(sv[1]));
    }
    close(sv[1]);
    ok(send_export(sv[0], &e) == 0, "export sent with SCM_RIGHTS");
    int status = -1;
    waitpid(pid, &status, 0);
    close(sv[0]);
    ok(WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "the child imported, read the data and closed the mapping (exit %d)",
       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    size_t same = 0;
    for (size_t i = 0; i < n; i++)
        same += b[i] == 0x5a;
    ok(same == n, "the child's writes are seen here (shared memory)");
    unsigned long long first_id = e.handles[0].id;
    is_status(rankmem_vmm_export_close(&e), RANKMEM_SUCCESS, "export_close");
    ok(e.handles == NULL && e.count == 0, "export_close cleared the export");

    /* In this process too: import and read. */
    rankmem_vmm_export_t e2;
    rankmem_vmm_export(mr, pad, 5000, &e2);
    void *p = NULL;
    rankmem_vmm_import_t *im = NULL;
    memset(pad, 0x33, 5000);
    is_status(rankmem_vmm_import(&e2, &p, &im), RANKMEM_SUCCESS, "import in the same process");
    ok(p != pad && ((unsigned char *)p)[4999] == 0x33, "a second mapping of the same memory");
    is_status(rankmem_vmm_import_close(im), RANKMEM_SUCCESS, "import_close");

    /* Interior pointers: any range inside the block. */
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 13 + 5);
    rankmem_vmm_export_t ei;
    is_status(rankmem_vmm_export(mr, b + G + 100, 2 * G, &ei), RANKMEM_SUCCESS,
              "export: an interior range");
    ok(ei.count == 3 && ei.offset == (size_t)((uintptr_t)(b + G + 100) % G) &&
           ei.handles[0].id == first_id + 1 && import_matches(&ei, b + G + 100),
       "... its 3 handles (the same ids as before), mapped and read in this process");
    rankmem_vmm_export_close(&ei);
    is_status(rankmem_vmm_export(mr, b + n - 1, 1, &ei), RANKMEM_SUCCESS,
              "export: the block's last byte");
    ok(ei.count == 1 && import_matches(&ei, b + n - 1), "... one handle, read");
    rankmem_vmm_export_close(&ei);

    /* Flags: no descriptors; a range that is mapped but not one block. */
    is_status(rankmem_vmm_export_ex(mr, pad, 5000 + 300, RANKMEM_VMM_EXPORT_NO_FDS, &ei),
              RANKMEM_ERR_INVALID_POINTER, "export: a range over two blocks");
    is_status(rankmem_vmm_export_ex(mr, pad, 5000 + 300,
                                    RANKMEM_VMM_EXPORT_NO_FDS | RANKMEM_VMM_EXPORT_MAPPED, &ei),
              RANKMEM_SUCCESS, "export: the same with MAPPED (mapped memory is enough)");
    ok(ei.count >= 1 && ei.handles[0].fd == -1, "... NO_FDS: no descriptor (fd %d)",
       ei.count ? ei.handles[0].fd : 0);
    rankmem_vmm_export_close(&ei);
    is_status(rankmem_vmm_export_ex(mr, (char *)rb + rn - G, 1, RANKMEM_VMM_EXPORT_MAPPED, &ei),
              RANKMEM_ERR_INVALID_POINTER, "export MAPPED: memory never mapped is refused");

    /* Ids are never reused: the handles given back and others mapped at
     * the same addresses get new ones. */
    unsigned long long old_last = 0;
    rankmem_vmm_export(mr, b, n, &ei);
    old_last = ei.handles[ei.count - 1].id;
    rankmem_vmm_export_close(&ei);
    rankmem_deallocate(mr, b, n, 0);
    rankmem_resource_trim(mr, 0);
    unsigned char *b2 = get(mr, n);
    is_status(rankmem_vmm_export(mr, b2, n, &ei), RANKMEM_SUCCESS, "export after give-back");
    ok(b2 == b && ei.count == 4 && ei.handles[0].id > old_last,
       "a block at the same address in new handles: new ids (%llu after %llu)",
       ei.count ? ei.handles[0].id : 0, old_last);
    rankmem_vmm_export_close(&ei);
    b = b2;

    /* Bad inputs. */
    rankmem_vmm_export_t x;
    rankmem_resource_t *sys = NULL;
    rankmem_system_create(&sys);
    is_status(rankmem_vmm_export(mr, b, n + 1, &x), RANKMEM_ERR_INVALID_POINTER,
              "export: past the block's end");
    is_status(rankmem_vmm_export(mr, b + 256, n, &x), RANKMEM_ERR_INVALID_POINTER,
              "export: interior pointer, past the block's end");
    is_status(rankmem_vmm_export(mr, (char *)rb + rn - G, 1, &x), RANKMEM_ERR_INVALID_POINTER,
              "export: not a live block");
    is_status(rankmem_vmm_export(mr, NULL, n, &x), RANKMEM_ERR_INVALID_ARGUMENT, "export: NULL ptr");
    is_status(rankmem_vmm_export(mr, b, 0, &x), RANKMEM_ERR_INVALID_ARGUMENT, "export: 0 bytes");
    is_status(rankmem_vmm_export(mr, b, n, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "export: NULL output");
    is_status(rankmem_vmm_export(NULL, b, n, &x), RANKMEM_ERR_INVALID_ARGUMENT,
              "export: NULL resource");
    is_status(rankmem_vmm_export(sys, b, n, &x), RANKMEM_ERR_INVALID_ARGUMENT,
              "export: no vmm in the chain");
    is_status(rankmem_vmm_export_ex(mr, b, n, 8, &x), RANKMEM_ERR_INVALID_ARGUMENT,
              "export: unknown flags");
    is_status(rankmem_vmm_range(sys, &rb, &rn), RANKMEM_ERR_INVALID_ARGUMENT,
              "range: no vmm in the chain");
    is_status(rankmem_vmm_range(mr, NULL, &rn), RANKMEM_ERR_INVALID_ARGUMENT,
              "range: NULL output");
    rankmem_resource_release(sys);
    is_status(rankmem_vmm_export_close(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "export_close(NULL)");
    is_status(rankmem_vmm_import(NULL, &p, &im), RANKMEM_ERR_INVALID_ARGUMENT, "import(NULL)");
    is_status(rankmem_vmm_import(&e2, NULL, &im), RANKMEM_ERR_INVALID_ARGUMENT,
              "import: NULL output");
    x = e2;
    x.granule = 3000;
    is_status(rankmem_vmm_import(&x, &p, &im), RANKMEM_ERR_INVALID_ARGUMENT,
              "import: bad granule");
    x = e2;
    x.offset = x.handles[0].bytes;
    is_status(rankmem_vmm_import(&x, &p, &im), RANKMEM_ERR_INVALID_ARGUMENT, "import: bad offset");
    x = e2;
    x.bytes = x.handles[0].bytes * x.count + 1;
    is_status(rankmem_vmm_import(&x, &p, &im), RANKMEM_ERR_INVALID_ARGUMENT,
              "import: more bytes than its handles");
    x = e2;
    x.count = 0;
    is_status(rankmem_vmm_import(&x, &p, &im), RANKMEM_ERR_INVALID_ARGUMENT, "import: no handle");
    x = e2;
    x.handles = NULL;
    is_status(rankmem_vmm_import(&x, &p, &im), RANKMEM_ERR_INVALID_ARGUMENT,
              "import: NULL handles");
    rankmem_vmm_handle_t hb = e2.handles[0];
    x = e2;
    x.count = 1;
    x.handles = &hb;
    hb.fd = -1;
    is_status(rankmem_vmm_import(&x, &p, &im), RANKMEM_ERR_INVALID_ARGUMENT,
              "import: bad descriptor");
    hb = e2.handles[0];
    hb.bytes = G + 1;
    is_status(rankmem_vmm_import(&x, &p, &im), RANKMEM_ERR_INVALID_ARGUMENT,
              "import: a handle's size not in granules");
    hb = e2.handles[0];
    hb.fd = 1000; /* not open */
    is_status(rankmem_vmm_import(&x, &p, &im), RANKMEM_ERR_INVALID_ARGUMENT,
              "import: a descriptor that is not open");
    is_status(rankmem_vmm_import_close(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "import_close(NULL)");
    rankmem_vmm_export_close(&e2);
    rankmem_deallocate(mr, b, n, 0);
    rankmem_deallocate(mr, pad, 5000, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "release after export");
}

/* Handles of several granules: an export names them whole (the importer
 * maps whole handles), with the range's offset in the first. */
static void export_large_handles(void)
{
    rankmem_vmm_params_t prm;
    rankmem_vmm_params_default(&prm);
    prm.backend = RANKMEM_VMM_BACKEND_HOST;
    prm.granule = G;
    prm.handle = 4 * G;
    prm.reserve = (size_t)1 << 30;
    rankmem_resource_t *mr = NULL;
    if (rankmem_vmm_create(&prm, &mr) != RANKMEM_SUCCESS)
        BAIL_OUT("rankmem_vmm_create: %s", rankmem_last_error());
    size_t n = 10 * G; /* handles of 4, 4 and 2 granules */
    unsigned char *b = get(mr, n);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 3 + 11);
    rankmem_vmm_export_t e;
    is_status(rankmem_vmm_export(mr, b + 5 * G + 17, 10, &e), RANKMEM_SUCCESS,
              "handle=4 granules: export 10 bytes inside the second handle");
    ok(e.count == 1 && e.handles[0].bytes == 4 * G && e.offset == G + 17 &&
           e.handles[0].address == (uintptr_t)b + 4 * G,
       "... the whole handle (%zu bytes), the range at %zu in it", e.count ? e.handles[0].bytes : 0,
       e.offset);
    ok(import_matches(&e, b + 5 * G + 17), "... mapped and read here");
    rankmem_vmm_export_close(&e);
    is_status(rankmem_vmm_export(mr, b + 3 * G, 6 * G, &e), RANKMEM_SUCCESS,
              "export across the three handles");
    ok(e.count == 3 && e.handles[0].bytes == 4 * G && e.handles[1].bytes == 4 * G &&
           e.handles[2].bytes == 2 * G && e.offset == 3 * G &&
           import_matches(&e, b + 3 * G),
       "... handles of 4, 4 and 2 granules, mapped one after another, read");
    rankmem_vmm_export_close(&e);
    rankmem_deallocate(mr, b, n, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "release");
}

/* Regression (issue 31, found by the fault-injection fuzzer's probe):
 * free memory split between the lists of several streams must still go
 * back whole. Before, the granules under two free blocks of two streams
 * stayed mapped after trim(0) with nothing live, and at the maximum a
 * request that a fresh vmm serves was refused for good. */
static void give_back_across_streams(void)
{
    rankmem_stream_t s1 = (rankmem_stream_t)(uintptr_t)0x100, s2 = (rankmem_stream_t)(uintptr_t)0x200;
    rankmem_resource_t *mr = host_vmm(SIZE_MAX, 0);
    void *a = NULL, *b = NULL;
    rankmem_allocate(mr, G / 2, 0, &a);
    rankmem_allocate(mr, G / 2, 0, &b);
    ok(a && b && stats(mr).mapped == G, "two halves of one granule");
    rankmem_deallocate_async(mr, a, G / 2, 0, s1);
    rankmem_deallocate_async(mr, b, G / 2, 0, s2);
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim(0), the halves freed on two streams");
    ok(stats(mr).mapped == 0, "nothing live, nothing mapped after trim (%zu)", stats(mr).mapped);
    rankmem_resource_release(mr);

    /* At the maximum: 1.5 granules and the half after them, freed on two
     * streams; 2 granules at once must fit in the 2 allowed. */
    mr = host_vmm(2 * G, 0);
    rankmem_allocate(mr, 3 * G / 2, 0, &a);
    rankmem_allocate(mr, G / 2, 0, &b);
    rankmem_deallocate_async(mr, a, 3 * G / 2, 0, s1);
    rankmem_deallocate_async(mr, b, G / 2, 0, s2);
    void *c = NULL;
    rankmem_status_t st = rankmem_allocate(mr, 2 * G, 0, &c);
    if (!ok(st == RANKMEM_SUCCESS, "at the maximum, nothing live: 2 granules served"))
        diag("  %s", rankmem_last_error());
    if (c)
        rankmem_deallocate(mr, c, 2 * G, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "release");
}

int main(void)
{
    bad_inputs();
    placement_and_coalescing();
    give_back_and_holes();
    give_back_across_streams();
    release_threshold();
    handles();
    maximum_and_failures();
    specs();
    export_import();
    export_large_handles();
    return tap_done();
}
