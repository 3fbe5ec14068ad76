/* async_managed on a real GPU: managed memory from a stream-ordered pool,
 * written and read by kernels and by the host, the async queries, trim, the
 * preferred location of the pool, equality and bad input. Where the driver
 * or the device has no managed pools, checks that creation says so and skips
 * the rest, saying why. Skips without a GPU. */
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

static size_t query(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = SIZE_MAX;
    if (rankmem_resource_query(mr, what, &v) != RANKMEM_SUCCESS)
        diag("query %d: %s", (int)what, rankmem_last_error());
    return v;
}

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

static void test_read_write(rankmem_resource_t *mr)
{
    static const size_t sizes[] = {4, 4096 + 4, MiB, 40 * MiB + 256};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t bytes = sizes[i], n = bytes / 4;
        unsigned pattern = 0x3c3c0000u + (unsigned)i;
        void *p = NULL;
        rankmem_status_t st = rankmem_allocate_async(mr, bytes, 0, stream, &p);
        is_status(st, RANKMEM_SUCCESS, "allocate %zu bytes on a stream", bytes);
        if (st != RANKMEM_SUCCESS) {
            diag("  %s", rankmem_last_error());
            tap_skip(4, "allocation failed");
            continue;
        }
        ok((uintptr_t)p % RANKMEM_DEFAULT_ALIGNMENT == 0, "  %p is 256-aligned", p);
        unsigned long long bad = ~0ull;
        int err = rk_test_fill(p, n, pattern, stream);
        if (!err)
            err = rk_test_check(p, n, pattern, stream, &bad);
        ok(err == 0 && bad == 0, "  a kernel reads back what a kernel wrote (CUDA error %d, %llu "
                                 "bad words)", err, bad);
        /* rk_test_check synchronised the stream: the host may touch it now. */
        uint32_t *w = p;
        size_t host_bad = 0;
        for (size_t k = 0; k < n; k++) {
            host_bad += w[k] != (pattern ^ (uint32_t)k);
            w[k] = (pattern + 7) ^ (uint32_t)k;
        }
        ok(host_bad == 0, "  the host reads what the kernel wrote (%zu bad words)", host_bad);
        bad = ~0ull;
        err = rk_test_check(p, n, pattern + 7, stream, &bad);
        ok(err == 0 && bad == 0, "  a kernel reads what the host wrote (CUDA error %d, %llu bad "
                                 "words)", err, bad);
        is_status(rankmem_deallocate_async(mr, p, bytes, 0, stream), RANKMEM_SUCCESS,
                  "  deallocate on the stream");
    }
    ok(cudaStreamSynchronize(stream) == cudaSuccess, "the stream finished cleanly");
}

static void test_queries(rankmem_resource_t *mr)
{
    size_t bytes = 8 * MiB;
    void *p = NULL;
    is_status(rankmem_allocate_async(mr, bytes, 0, stream, &p), RANKMEM_SUCCESS,
              "queries: allocate 8 MiB");
    cudaStreamSynchronize(stream);
    size_t used = query(mr, RANKMEM_QUERY_USED_CURRENT);
    size_t reserved = query(mr, RANKMEM_QUERY_RESERVED_CURRENT);
    ok(used >= bytes && used != SIZE_MAX, "used now %zu >= 8 MiB", used);
    ok(reserved >= used && reserved != SIZE_MAX, "reserved %zu >= used", reserved);
    ok(query(mr, RANKMEM_QUERY_USED_HIGH) >= bytes, "used high-water mark >= 8 MiB");
    ok(query(mr, RANKMEM_QUERY_RESERVED_HIGH) >= reserved, "reserved high-water mark >= reserved");
    size_t v = 77;
    is_status(rankmem_resource_query(mr, RANKMEM_QUERY_LIVE_COUNT, &v), RANKMEM_ERR_NOT_SUPPORTED,
              "LIVE_COUNT is not known to a CUDA pool");
    ok(v == 77, "  output untouched");
    rankmem_deallocate_async(mr, p, bytes, 0, stream);
    cudaStreamSynchronize(stream);
    ok(query(mr, RANKMEM_QUERY_USED_CURRENT) == 0, "used 0 after the free");
    ok(query(mr, RANKMEM_QUERY_RESERVED_CURRENT) >= bytes,
       "the pool keeps what it reserved (release threshold unbounded)");
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "trim to 0");
    ok(query(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 0, "reserved 0 after the trim (%zu)",
       query(mr, RANKMEM_QUERY_RESERVED_CURRENT));
}

static void test_params(void)
{
    rankmem_async_managed_params_t prm;
    rankmem_async_managed_params_default(&prm);
    prm.initial_pool_size = 32 * MiB;
    rankmem_resource_t *mr = NULL;
    rankmem_status_t st = rankmem_async_managed_create(&prm, &mr);
    is_status(st, RANKMEM_SUCCESS, "initial pool size 32 MiB");
    if (st == RANKMEM_SUCCESS) {
        ok(query(mr, RANKMEM_QUERY_RESERVED_CURRENT) >= 32 * MiB, "  reserved %zu >= 32 MiB",
           query(mr, RANKMEM_QUERY_RESERVED_CURRENT));
        ok(query(mr, RANKMEM_QUERY_USED_CURRENT) == 0, "  nothing used");
        char buf[128] = "";
        rankmem_resource_describe(mr, buf, sizeof buf, NULL);
        ok(strcmp(buf, "async_managed(initial=32MiB)") == 0, "  describes as %s", buf);
        rankmem_resource_release(mr);
    } else {
        diag("  %s", rankmem_last_error());
        tap_skip(3, "creation failed");
    }

    /* Preferred locations: the pool's, given to every allocation. */
    static const struct {
        int where;
        const char *name;
        int want; /* cudaMemRangeAttributePreferredLocation */
    } locs[] = {
        {RANKMEM_MANAGED_PREFER_DEVICE, "device", -100},
        {RANKMEM_MANAGED_PREFER_HOST, "host", cudaCpuDeviceId},
        {RANKMEM_MANAGED_PREFER_NONE, "none", cudaInvalidDeviceId},
    };
    for (size_t i = 0; i < 3; i++) {
        rankmem_async_managed_params_default(&prm);
        prm.preferred_location = locs[i].where;
        int want = locs[i].want == -100 ? dev : locs[i].want;
        st = rankmem_async_managed_create(&prm, &mr);
        is_status(st, RANKMEM_SUCCESS, "prefer=%s: created", locs[i].name);
        if (st != RANKMEM_SUCCESS) {
            diag("  %s", rankmem_last_error());
            tap_skip(2, "creation failed");
            continue;
        }
        void *p = NULL;
        rankmem_allocate_async(mr, 2 * MiB, 0, stream, &p);
        cudaStreamSynchronize(stream);
        int got = p ? preferred(p, 2 * MiB) : -9;
        ok(got == want, "prefer=%s: an allocation's preferred location is %d (want %d)",
           locs[i].name, got, want);
        unsigned long long bad = ~0ull;
        int err = p ? rk_test_fill(p, MiB / 2, 0x77, stream) : -1;
        if (!err)
            err = rk_test_check(p, MiB / 2, 0x77, stream, &bad);
        ok(err == 0 && bad == 0, "prefer=%s: kernels use it (CUDA error %d, %llu bad words)",
           locs[i].name, err, bad);
        if (p)
            rankmem_deallocate_async(mr, p, 2 * MiB, 0, stream);
        cudaStreamSynchronize(stream);
        rankmem_resource_release(mr);
    }
}

static void test_identity(rankmem_resource_t *mr)
{
    const char *name = NULL;
    unsigned props = 0;
    int d = -5;
    rankmem_resource_name(mr, &name);
    rankmem_resource_properties(mr, &props);
    rankmem_resource_device(mr, &d);
    ok(name && strcmp(name, "async_managed") == 0, "named '%s'", name ? name : "(null)");
    ok(props == (RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE |
                 RANKMEM_PROP_STREAM_ORDERED),
       "host- and device-accessible, stream-ordered (0x%x)", props);
    ok(d == dev, "records device %d", d);

    rankmem_mempool_t h = NULL;
    is_status(rankmem_async_managed_pool_handle(mr, &h), RANKMEM_SUCCESS, "pool handle");
    ok(h && cudaMemPoolGetAttribute((cudaMemPool_t)h, cudaMemPoolAttrReleaseThreshold,
                                    &(uint64_t){0}) == cudaSuccess,
       "  a live cudaMemPool_t");
    rankmem_mempool_t h2 = (rankmem_mempool_t)&h2;
    is_status(rankmem_async_pool_handle(mr, &h2), RANKMEM_ERR_INVALID_ARGUMENT,
              "rankmem_async_pool_handle refuses it (it is not async)");
    ok(h2 == (rankmem_mempool_t)&h2, "  output untouched");

    rankmem_resource_t *other = NULL;
    int eq = -1;
    rankmem_resource_is_equal(mr, mr, &eq);
    ok(eq == 1, "equal to itself");
    if (rankmem_async_managed_create(NULL, &other) == RANKMEM_SUCCESS) {
        rankmem_resource_is_equal(mr, other, &eq);
        ok(eq == 0, "not equal to another managed pool");
        rankmem_resource_release(other);
    } else {
        ok(0, "a second pool: %s", rankmem_last_error());
    }

    void *p = (void *)&p;
    is_status(rankmem_allocate_async(mr, 4096, 512, stream, &p), RANKMEM_ERR_NOT_SUPPORTED,
              "alignment 512: not supported (the pool guarantees 256)");
    ok(p == (void *)&p, "  output untouched");
}

static void test_spec(void)
{
    rankmem_resource_t *mr = NULL;
    rankmem_status_t st =
        rankmem_resource_from_spec("stats>pool>async_managed(release=1GiB,prefer=none)", &mr);
    is_status(st, RANKMEM_SUCCESS, "spec stats>pool>async_managed(release=1GiB,prefer=none)");
    if (st != RANKMEM_SUCCESS) {
        diag("  %s", rankmem_last_error());
        tap_skip(2, "spec failed");
        return;
    }
    char buf[160] = "";
    rankmem_resource_describe(mr, buf, sizeof buf, NULL);
    ok(strcmp(buf, "stats>pool>async_managed(release=1GiB,prefer=none)") == 0,
       "  describes as %s", buf);
    void *p = NULL;
    unsigned long long bad = ~0ull;
    int err = -1;
    if (rankmem_allocate_async(mr, MiB, 0, stream, &p) == RANKMEM_SUCCESS) {
        err = rk_test_fill(p, MiB / 4, 0x99, stream);
        if (!err)
            err = rk_test_check(p, MiB / 4, 0x99, stream, &bad);
        rankmem_deallocate_async(mr, p, MiB, 0, stream);
    }
    ok(err == 0 && bad == 0, "  a pool over it serves kernels (CUDA error %d)", err);
    rankmem_pool_forget_stream(mr, stream);
    rankmem_resource_release(mr);
}

int main(void)
{
    int n = 0;
    if (rankmem_device_count(&n) != RANKMEM_SUCCESS || n == 0)
        return tap_skip_all("no GPU");
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
        BAIL_OUT("cannot set up a stream on the GPU");
    int driver = 0, runtime = 0, concurrent = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev);
    diag("device %d: driver CUDA %d, runtime %d, concurrent managed access %d", dev, driver,
         runtime, concurrent);

    rankmem_resource_t *mr = NULL;
    rankmem_status_t st = rankmem_async_managed_create(NULL, &mr);
    if (st == RANKMEM_ERR_NOT_SUPPORTED) {
        /* Allowed only where something named is missing. */
        ok(strstr(rankmem_last_error(), "13.0") || strstr(rankmem_last_error(), "concurrent") ||
               strstr(rankmem_last_error(), "cudaMemPoolCreate") ||
               strstr(rankmem_last_error(), "stream-ordered"),
           "not supported here, and says why: %s", rankmem_last_error());
        char why[300];
        snprintf(why, sizeof why, "no managed memory pools here: %s", rankmem_last_error());
        tap_skip(1, why);
        cudaStreamDestroy(stream);
        return tap_done();
    }
    is_status(st, RANKMEM_SUCCESS, "async_managed with defaults on device %d", dev);
    if (st != RANKMEM_SUCCESS)
        BAIL_OUT("%s", rankmem_last_error());
    test_identity(mr);
    test_read_write(mr);
    test_queries(mr);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "released clean");
    test_params();
    test_spec();
    ok(cudaGetLastError() == cudaSuccess, "no CUDA error left behind");
    cudaStreamDestroy(stream);
    return tap_done();
}

#else

int main(void) { return tap_skip_all("no GPU (rankmem was built without CUDA)"); }

#endif
