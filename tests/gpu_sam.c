/* sam_headroom on a real GPU. Where the GPU cannot access pageable memory
 * (cudaDevAttrPageableMemoryAccess 0: no HMM, no ATS), checks that creation
 * says so and skips the rest, saying why. Where it can: kernels and the host
 * read and write the memory, and the headroom rule decides the preferred
 * location, seen through cudaMemRangeGetAttribute. Skips without a GPU. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <rankmem.h>

#include "tap.h"

#if HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu_kernels.h"

#define MiB ((size_t)1 << 20)

static cudaStream_t stream;
static int dev;

/* The range's preferred location: a device, cudaCpuDeviceId (-1) for the
 * host, cudaInvalidDeviceId (-2) for none or mixed; -3 if the query fails. */
static int preferred(const void *p, size_t bytes)
{
    int loc = -3;
    cudaError_t err =
        cudaMemRangeGetAttribute(&loc, sizeof loc, cudaMemRangeAttributePreferredLocation, p, bytes);
    if (err != cudaSuccess) {
        diag("cudaMemRangeGetAttribute: %s", cudaGetErrorString(err));
        (void)cudaGetLastError();
        return -3;
    }
    return loc;
}

static size_t device_bytes(rankmem_resource_t *mr)
{
    size_t b = SIZE_MAX;
    if (rankmem_sam_headroom_device_bytes(mr, &b) != RANKMEM_SUCCESS)
        diag("device_bytes: %s", rankmem_last_error());
    return b;
}

static size_t query(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = SIZE_MAX;
    if (rankmem_resource_query(mr, what, &v) != RANKMEM_SUCCESS)
        diag("query %d: %s", (int)what, rankmem_last_error());
    return v;
}

/* Kernel writes, kernel and host read, host writes, kernel reads. */
static void read_write(rankmem_resource_t *mr, size_t bytes, const char *label)
{
    void *p = NULL;
    rankmem_status_t st = rankmem_allocate(mr, bytes, 0, &p);
    is_status(st, RANKMEM_SUCCESS, "%s: allocate %zu bytes", label, bytes);
    if (st != RANKMEM_SUCCESS) {
        diag("  %s", rankmem_last_error());
        tap_skip(3, "allocation failed");
        return;
    }
    size_t n = bytes / 4;
    unsigned long long bad = ~0ull;
    int err = rk_test_fill(p, n, 0x5a5a0000u, stream);
    if (!err)
        err = rk_test_check(p, n, 0x5a5a0000u, stream, &bad);
    ok(err == 0 && bad == 0, "%s: a kernel reads back what a kernel wrote to malloc'd memory "
                             "(CUDA error %d, %llu bad words)", label, err, bad);
    uint32_t *w = p;
    size_t host_bad = 0;
    for (size_t i = 0; i < n; i++) {
        host_bad += w[i] != (0x5a5a0000u ^ (uint32_t)i);
        w[i] = 0x11110000u ^ (uint32_t)i;
    }
    ok(host_bad == 0, "%s: the host reads what the kernel wrote (%zu bad words)", label, host_bad);
    bad = ~0ull;
    err = rk_test_check(p, n, 0x11110000u, stream, &bad);
    ok(err == 0 && bad == 0, "%s: a kernel reads what the host wrote (CUDA error %d, %llu bad "
                             "words)", label, err, bad);
    is_status(rankmem_deallocate(mr, p, bytes, 0), RANKMEM_SUCCESS, "%s: deallocate", label);
}

static void test_unsupported(void)
{
    rankmem_resource_t *mr = (rankmem_resource_t *)&mr;
    is_status(rankmem_sam_headroom_create(0, &mr), RANKMEM_ERR_NOT_SUPPORTED,
              "device %d without pageable memory access: sam_headroom_create is not supported",
              dev);
    ok(strstr(rankmem_last_error(), "cudaDevAttrPageableMemoryAccess is 0") != NULL,
       "  says why: %s", rankmem_last_error());
    ok(mr == (rankmem_resource_t *)&mr, "  output untouched");
    char why[160];
    snprintf(why, sizeof why,
             "device %d has cudaDevAttrPageableMemoryAccess 0 (no HMM or ATS here): "
             "sam_headroom is not supported on this machine", dev);
    tap_skip(1, why);
}

static void test_supported(void)
{
    rankmem_resource_t *lo = NULL, *hi = NULL;
    /* Headroom 0: everything that fits in free memory prefers the device. */
    rankmem_status_t st = rankmem_sam_headroom_create(0, &lo);
    is_status(st, RANKMEM_SUCCESS, "sam_headroom(headroom=0) on device %d", dev);
    /* A headroom larger than any device: nothing may prefer the device. */
    if (st == RANKMEM_SUCCESS)
        st = rankmem_sam_headroom_create((size_t)1 << 60, &hi);
    is_status(st, RANKMEM_SUCCESS, "sam_headroom(headroom=1EiB)");
    if (st != RANKMEM_SUCCESS)
        BAIL_OUT("cannot create sam_headroom: %s", rankmem_last_error());

    const char *name = NULL;
    unsigned props = 0;
    int d = -5;
    rankmem_resource_name(lo, &name);
    rankmem_resource_properties(lo, &props);
    rankmem_resource_device(lo, &d);
    ok(name && strcmp(name, "sam_headroom") == 0, "named '%s'", name ? name : "(null)");
    ok(props == (RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE),
       "host- and device-accessible, not stream-ordered (0x%x)", props);
    ok(d == dev, "records device %d", d);
    char desc[128] = "";
    rankmem_resource_describe(hi, desc, sizeof desc, NULL);
    ok(strncmp(desc, "sam_headroom(headroom=", 22) == 0, "describes itself: %s", desc);

    read_write(lo, 4 * MiB + 4, "headroom 0");
    read_write(hi, 4 * MiB + 4, "huge headroom");

    /* The rule, seen through the preferred location of each allocation. */
    size_t bytes = 16 * MiB;
    void *a = NULL, *b = NULL;
    is_status(rankmem_allocate(lo, bytes, 0, &a), RANKMEM_SUCCESS, "headroom 0: allocate 16 MiB");
    is_status(rankmem_allocate(hi, bytes, 0, &b), RANKMEM_SUCCESS,
              "huge headroom: allocate 16 MiB");
    ok(a && preferred(a, bytes) == dev, "headroom 0: prefers device %d (got %d)", dev,
       a ? preferred(a, bytes) : -9);
    ok(b && preferred(b, bytes) == cudaCpuDeviceId, "huge headroom: prefers the host (got %d)",
       b ? preferred(b, bytes) : -9);
    ok(device_bytes(lo) == bytes, "headroom 0: %zu bytes placed on the device", device_bytes(lo));
    ok(device_bytes(hi) == 0, "huge headroom: nothing placed on the device");
    ok(query(lo, RANKMEM_QUERY_USED_CURRENT) == bytes && query(lo, RANKMEM_QUERY_LIVE_COUNT) == 1,
       "headroom 0: used %zu bytes in 1 allocation", query(lo, RANKMEM_QUERY_USED_CURRENT));
    if (a)
        rankmem_deallocate(lo, a, bytes, 0);
    if (b)
        rankmem_deallocate(hi, b, bytes, 0);
    ok(device_bytes(lo) == 0 && query(lo, RANKMEM_QUERY_USED_CURRENT) == 0,
       "headroom 0: nothing placed or used after the frees");

    /* Placed bytes count: with room for one and a half allocations above
     * the headroom, the first goes to the device, the second stays on the
     * host, and once the first is freed a third goes to the device again.
     * Nothing is touched meanwhile, so free memory holds still. */
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    size_t a_bytes = 64 * MiB;
    rankmem_resource_t *mid = NULL;
    st = free_b > 2 * a_bytes
             ? rankmem_sam_headroom_create(free_b - a_bytes - a_bytes / 2, &mid)
             : RANKMEM_ERR_OUT_OF_MEMORY;
    is_status(st, RANKMEM_SUCCESS, "sam_headroom with room for 1.5 x 64 MiB (free %zu MiB)",
              free_b / MiB);
    if (st == RANKMEM_SUCCESS) {
        void *x = NULL, *y = NULL, *z = NULL;
        rankmem_allocate(mid, a_bytes, 0, &x);
        rankmem_allocate(mid, a_bytes, 0, &y);
        ok(x && preferred(x, a_bytes) == dev, "first 64 MiB prefers the device (got %d)",
           x ? preferred(x, a_bytes) : -9);
        ok(y && preferred(y, a_bytes) == cudaCpuDeviceId,
           "second 64 MiB would eat into the headroom: prefers the host (got %d)",
           y ? preferred(y, a_bytes) : -9);
        ok(device_bytes(mid) == a_bytes, "%zu MiB placed", device_bytes(mid) / MiB);
        if (x)
            rankmem_deallocate(mid, x, a_bytes, 0);
        rankmem_allocate(mid, a_bytes, 0, &z);
        ok(z && preferred(z, a_bytes) == dev,
           "after the first is freed, a third prefers the device again (got %d)",
           z ? preferred(z, a_bytes) : -9);
        if (y)
            rankmem_deallocate(mid, y, a_bytes, 0);
        if (z)
            rankmem_deallocate(mid, z, a_bytes, 0);
        is_status(rankmem_resource_release(mid), RANKMEM_SUCCESS, "released clean");
    } else {
        tap_skip(5, "could not set up the headroom case");
    }

    /* Alignment beyond a page. */
    void *p = NULL;
    is_status(rankmem_allocate(lo, 1000, (size_t)1 << 21, &p), RANKMEM_SUCCESS,
              "allocate with 2 MiB alignment");
    ok(p && (uintptr_t)p % ((size_t)1 << 21) == 0, "  %p is 2 MiB-aligned", p);

    /* Bad frees change nothing. */
    int local;
    is_status(rankmem_deallocate(lo, p, 1 << 20, 0), RANKMEM_ERR_INVALID_POINTER,
              "free with the wrong size");
    is_status(rankmem_deallocate(lo, &local, 1000, 0), RANKMEM_ERR_INVALID_POINTER,
              "free of a foreign pointer");
    ok(query(lo, RANKMEM_QUERY_LIVE_COUNT) == 1, "  the allocation is still live");
    is_status(rankmem_deallocate(lo, p, 1000, 0), RANKMEM_SUCCESS, "free with the right size");
    is_status(rankmem_deallocate(lo, p, 1000, 0), RANKMEM_ERR_INVALID_POINTER, "double free");

    /* Released with a live allocation: reclaimed and reported. */
    p = NULL;
    rankmem_allocate(hi, 4096, 0, &p);
    is_status(rankmem_resource_release(hi), RANKMEM_ERR_BUSY, "release with a live allocation");
    is_status(rankmem_resource_release(lo), RANKMEM_SUCCESS, "release clean");

    /* From a spec, % of device memory. */
    rankmem_resource_t *sp = NULL;
    st = rankmem_resource_from_spec("stats>sam_headroom(headroom=10%)", &sp);
    is_status(st, RANKMEM_SUCCESS, "spec stats>sam_headroom(headroom=10%%)");
    if (st == RANKMEM_SUCCESS) {
        char buf[128] = "";
        rankmem_resource_describe(sp, buf, sizeof buf, NULL);
        ok(strncmp(buf, "stats>sam_headroom(headroom=", 28) == 0, "  describes as %s", buf);
        read_write(sp, MiB, "from a spec");
        rankmem_resource_release(sp);
    } else {
        diag("  %s", rankmem_last_error());
    }
    ok(cudaGetLastError() == cudaSuccess, "no CUDA error left behind");
}

int main(void)
{
    int n = 0;
    if (rankmem_device_count(&n) != RANKMEM_SUCCESS || n == 0)
        return tap_skip_all("no GPU");
    if (cudaGetDevice(&dev) != cudaSuccess || cudaStreamCreateWithFlags(&stream,
                                                                         cudaStreamNonBlocking))
        BAIL_OUT("cannot set up a stream on the GPU");
    int pageable = 0, host_tables = 0;
    cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, dev);
    cudaDeviceGetAttribute(&host_tables, cudaDevAttrPageableMemoryAccessUsesHostPageTables, dev);
    diag("device %d: cudaDevAttrPageableMemoryAccess %d, ...UsesHostPageTables %d (%s)", dev,
         pageable, host_tables, pageable ? (host_tables ? "ATS" : "HMM") : "neither HMM nor ATS");
    if (pageable)
        test_supported();
    else
        test_unsupported();
    cudaStreamDestroy(stream);
    return tap_done();
}

#else

int main(void) { return tap_skip_all("no GPU (rankmem was built without CUDA)"); }

#endif
