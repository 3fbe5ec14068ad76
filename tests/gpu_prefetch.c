/* The prefetch adaptor on a real GPU: over managed memory and over a pool of
 * managed memory, each allocation is prefetched to the current device on
 * the allocation's stream (the runtime's last-prefetch location says so),
 * kernels write and read it back and so does the host. Upstreams whose
 * memory is not managed are refused at creation. Skips where there is no GPU. */
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

static cudaStream_t stream; /* non-blocking: nothing orders it implicitly */
static int dev;

static size_t host_mismatches(const void *p, size_t n_words, unsigned pattern)
{
    const uint32_t *w = p;
    size_t bad = 0;
    for (size_t i = 0; i < n_words; i++)
        bad += w[i] != (pattern ^ (uint32_t)i);
    return bad;
}

/* Where the runtime was last asked to prefetch [p, p + bytes) to. */
static int last_prefetch(const void *p, size_t bytes)
{
    int loc = -100;
    cudaError_t err =
        cudaMemRangeGetAttribute(&loc, sizeof loc, cudaMemRangeAttributeLastPrefetchLocation, p,
                                 bytes);
    if (err != cudaSuccess) {
        diag("cudaMemRangeGetAttribute: %s", cudaGetErrorString(err));
        return -100;
    }
    return loc;
}

static void test_refused(const char *what, rankmem_resource_t *up)
{
    rankmem_resource_t *mr = (rankmem_resource_t *)&mr;
    is_status(rankmem_prefetch_create(up, &mr), RANKMEM_ERR_NOT_SUPPORTED,
              "prefetch over %s: not supported", what);
    ok(mr == (rankmem_resource_t *)&mr, "prefetch over %s: output untouched; says: %s", what,
       rankmem_last_error());
}

/* pf is a prefetch adaptor over `up`'s memory; allocate, check the prefetch,
 * write and read back with kernels and the host. */
static void exercise(rankmem_resource_t *pf, const char *what)
{
    static const size_t sizes[] = {4, 4096 + 4, MiB, 48 * MiB + 256};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t bytes = sizes[i], n = bytes / 4;
        unsigned pattern = 0x7e570000u + (unsigned)i;
        void *p = NULL;
        rankmem_status_t st = rankmem_allocate_async(pf, bytes, 0, stream, &p);
        is_status(st, RANKMEM_SUCCESS, "%s: allocate %zu bytes on a stream", what, bytes);
        if (st != RANKMEM_SUCCESS) {
            diag("  %s", rankmem_last_error());
            continue;
        }
        int loc = last_prefetch(p, bytes);
        ok(loc == dev, "%s: %zu bytes prefetched to device %d (runtime says %d)", what, bytes, dev,
           loc);
        unsigned long long bad = ~0ull;
        int err = rk_test_fill(p, n, pattern, stream);
        if (!err)
            err = rk_test_check(p, n, pattern, stream, &bad);
        ok(err == 0 && bad == 0, "%s: %zu bytes: a kernel reads back what a kernel wrote "
                                 "(CUDA error %d, %llu bad words)", what, bytes, err, bad);
        cudaError_t e = cudaDeviceSynchronize();
        ok(e == cudaSuccess && host_mismatches(p, n, pattern) == 0,
           "%s: %zu bytes: the host reads what the kernel wrote", what, bytes);
        is_status(rankmem_deallocate_async(pf, p, bytes, 0, stream), RANKMEM_SUCCESS,
                  "%s: deallocate %zu bytes", what, bytes);
    }
    /* The synchronous call: the legacy default stream. */
    void *p = NULL;
    rankmem_status_t st = rankmem_allocate(pf, 4096, 0, &p);
    is_status(st, RANKMEM_SUCCESS, "%s: synchronous allocate", what);
    if (st == RANKMEM_SUCCESS) {
        ok(last_prefetch(p, 4096) == dev, "%s: prefetched on the default stream", what);
        unsigned long long bad = ~0ull;
        int err = rk_test_fill(p, 1024, 0xfeed, NULL);
        if (!err)
            err = rk_test_check(p, 1024, 0xfeed, NULL, &bad);
        ok(err == 0 && bad == 0, "%s: default stream: pattern read back (CUDA error %d, %llu "
                                 "bad words)", what, err, bad);
        is_status(rankmem_deallocate(pf, p, 4096, 0), RANKMEM_SUCCESS,
                  "%s: synchronous deallocate", what);
    }
    ok(cudaStreamSynchronize(stream) == cudaSuccess, "%s: the stream finished cleanly", what);
}

static void test_managed(void)
{
    rankmem_resource_t *managed = NULL, *pf = NULL, *pool = NULL, *pfp = NULL;
    rankmem_status_t st = rankmem_managed_create(&managed);
    if (st != RANKMEM_SUCCESS) {
        diag("managed_create: %s", rankmem_last_error());
        tap_skip(1, "managed memory not available on this device");
        return;
    }
    st = rankmem_prefetch_create(managed, &pf);
    if (st == RANKMEM_ERR_NOT_SUPPORTED) {
        /* Refused at creation on devices without concurrent managed access. */
        ok(strstr(rankmem_last_error(), "concurrent") != NULL,
           "prefetch refused: the device has no concurrent managed access: %s",
           rankmem_last_error());
        rankmem_resource_release(managed);
        return;
    }
    is_status(st, RANKMEM_SUCCESS, "prefetch over managed: create");
    if (st != RANKMEM_SUCCESS) {
        diag("  %s", rankmem_last_error());
        rankmem_resource_release(managed);
        return;
    }
    const char *name = NULL;
    unsigned props = 0;
    int d = -2;
    char buf[32] = "";
    rankmem_resource_name(pf, &name);
    rankmem_resource_properties(pf, &props);
    rankmem_resource_device(pf, &d);
    ok(name && strcmp(name, "prefetch") == 0, "prefetch: named '%s'", name ? name : "(null)");
    ok(props == managed->props && d == dev, "prefetch: managed's properties 0x%x and device %d",
       props, d);
    ok(pf->ops->describe && pf->ops->describe(pf, buf, sizeof buf) == 8 &&
           strcmp(buf, "prefetch") == 0,
       "prefetch: described as 'prefetch' (%s)", buf);
    exercise(pf, "prefetch>managed");

    /* A pool of managed memory: each block is prefetched, not the whole chunk. */
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = 64 * MiB;
    st = rankmem_pool_create(managed, &prm, &pool);
    is_status(st, RANKMEM_SUCCESS, "pool over managed: create");
    if (st == RANKMEM_SUCCESS) {
        st = rankmem_prefetch_create(pool, &pfp);
        is_status(st, RANKMEM_SUCCESS, "prefetch over pool over managed: create");
        if (st == RANKMEM_SUCCESS) {
            exercise(pfp, "prefetch>pool>managed");
            is_status(rankmem_resource_release(pfp), RANKMEM_SUCCESS,
                      "prefetch>pool>managed: release");
        }
        is_status(rankmem_resource_release(pool), RANKMEM_SUCCESS, "pool over managed: release");
    }
    is_status(rankmem_resource_release(pf), RANKMEM_SUCCESS, "prefetch>managed: release");
    is_status(rankmem_resource_release(managed), RANKMEM_SUCCESS, "managed: release");
}

/* Pinned memory is host- and device-accessible but not managed: whether the
 * runtime prefetches it depends on the system (HMM/ATS). Either way the
 * allocation succeeds, or fails cleanly with the block given back. */
static void test_pinned(void)
{
    rankmem_resource_t *pinned = NULL, *pf = NULL;
    if (rankmem_pinned_create(&pinned) != RANKMEM_SUCCESS) {
        tap_skip(1, "no pinned resource");
        return;
    }
    rankmem_status_t st = rankmem_prefetch_create(pinned, &pf);
    if (st != RANKMEM_SUCCESS) {
        ok(st == RANKMEM_ERR_NOT_SUPPORTED, "prefetch over pinned: refused at creation (%s)",
           rankmem_last_error());
        rankmem_resource_release(pinned);
        return;
    }
    void *p = (void *)&p;
    st = rankmem_allocate_async(pf, MiB, 0, stream, &p);
    if (st == RANKMEM_SUCCESS)
        rankmem_deallocate_async(pf, p, MiB, 0, stream);
    else
        diag("prefetch over pinned: %s", rankmem_last_error());
    ok(st == RANKMEM_SUCCESS || (st == RANKMEM_ERR_DEVICE && p == (void *)&p),
       "prefetch over pinned: works, or fails cleanly (%s)", rankmem_status_string(st));
    ok(cudaGetLastError() == cudaSuccess && cudaStreamSynchronize(stream) == cudaSuccess,
       "prefetch over pinned: no CUDA error left behind");
    rankmem_resource_release(pf);
    rankmem_resource_release(pinned);
}

int main(void)
{
    int ndev = 0;
    rankmem_status_t st = rankmem_device_count(&ndev);
    if (st != RANKMEM_SUCCESS || ndev == 0) {
        char reason[600];
        rankmem_resource_t *mr = NULL;
        if (rankmem_cuda_create(&mr) == RANKMEM_SUCCESS) {
            rankmem_resource_release(mr);
            snprintf(reason, sizeof reason, "no GPU: rankmem_device_count gives %d", ndev);
        } else {
            snprintf(reason, sizeof reason, "no GPU: %s", rankmem_last_error());
        }
        return tap_skip_all(reason);
    }
    if (cudaGetDevice(&dev) != cudaSuccess)
        BAIL_OUT("cudaGetDevice failed with %d devices", ndev);
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
        BAIL_OUT("cudaStreamCreateWithFlags failed");

    /* Device memory is not managed: refused at creation. */
    rankmem_resource_t *cuda = NULL, *async = NULL;
    if (rankmem_cuda_create(&cuda) != RANKMEM_SUCCESS)
        BAIL_OUT("rankmem_cuda_create: %s", rankmem_last_error());
    test_refused("cuda", cuda);
    if (rankmem_async_create(NULL, &async) == RANKMEM_SUCCESS) {
        test_refused("async", async);
        rankmem_resource_release(async);
    }
    rankmem_resource_release(cuda);

    test_managed();
    test_pinned();

    ok(cudaStreamDestroy(stream) == cudaSuccess, "stream destroyed");
    ok(cudaGetLastError() == cudaSuccess, "no CUDA error left at the end");
    return tap_done();
}

#else /* !HAVE_CUDA */

int main(void)
{
    return tap_skip_all("no GPU: rankmem was built without CUDA");
}

#endif
