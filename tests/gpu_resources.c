/* The CUDA resources (cuda, managed, pinned, async, async_view) on a real GPU:
 * kernels write and read back what they allocate, queries, bad inputs and
 * the per-device registry. Skips where there is no GPU. */
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
#define HUGE_BYTES ((size_t)1 << 50) /* 1 PiB: no device has it */

static cudaStream_t stream; /* non-blocking: nothing orders it implicitly */
static int dev;             /* the device current for the whole test */

static size_t query(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = 0;
    rankmem_status_t st = rankmem_resource_query(mr, what, &v);
    if (st != RANKMEM_SUCCESS)
        diag("query %d: %s: %s", (int)what, rankmem_status_string(st), rankmem_last_error());
    return v;
}

/* Words that differ from pattern ^ i, read by the host. */
static size_t host_mismatches(const void *p, size_t n_words, unsigned pattern)
{
    const uint32_t *w = p;
    size_t bad = 0;
    for (size_t i = 0; i < n_words; i++)
        bad += w[i] != (pattern ^ (uint32_t)i);
    return bad;
}

/* Name, props and device as recorded; then, for several sizes, memory from
 * mr is written and read back by kernels (and by the host where it may). */
static void test_resource(rankmem_resource_t *mr, const char *name, unsigned want_props)
{
    const char *got = NULL;
    unsigned props = 0;
    int d = -2;
    is_status(rankmem_resource_name(mr, &got), RANKMEM_SUCCESS, "%s: name", name);
    ok(got && strcmp(got, name) == 0, "%s: named '%s'", name, got ? got : "(null)");
    is_status(rankmem_resource_properties(mr, &props), RANKMEM_SUCCESS, "%s: properties", name);
    ok(props == want_props, "%s: properties 0x%x (want 0x%x)", name, props, want_props);
    is_status(rankmem_resource_device(mr, &d), RANKMEM_SUCCESS, "%s: device", name);
    ok(d == dev, "%s: records device %d (current is %d)", name, d, dev);

    static const size_t sizes[] = {4, 1000, 4096 + 4, MiB, 48 * MiB + 256};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t bytes = sizes[i], n = bytes / 4;
        unsigned pattern = 0x5a5a0000u + (unsigned)i;
        void *p = NULL;
        rankmem_status_t st = rankmem_allocate_async(mr, bytes, 0, stream, &p);
        is_status(st, RANKMEM_SUCCESS, "%s: allocate %zu bytes on a stream", name, bytes);
        if (st != RANKMEM_SUCCESS) {
            diag("  %s", rankmem_last_error());
            continue;
        }
        ok(p && (uintptr_t)p % RANKMEM_DEFAULT_ALIGNMENT == 0, "%s: %p is 256-aligned", name, p);
        unsigned long long bad = ~0ull;
        int err = rk_test_fill(p, n, pattern, stream);
        if (!err)
            err = rk_test_check(p, n, pattern, stream, &bad);
        ok(err == 0 && bad == 0, "%s: %zu bytes: a kernel reads back what a kernel wrote "
                                 "(CUDA error %d, %llu bad words)", name, bytes, err, bad);
        if (want_props & RANKMEM_PROP_HOST_ACCESSIBLE) {
            /* Managed memory on devices without concurrent access must not be
             * touched while any kernel runs: wait for the whole device. */
            cudaError_t e = cudaDeviceSynchronize();
            ok(e == cudaSuccess && host_mismatches(p, n, pattern) == 0,
               "%s: %zu bytes: the host reads what the kernel wrote", name, bytes);
            uint32_t *w = p;
            for (size_t k = 0; k < n; k++)
                w[k] = (pattern + 1) ^ (uint32_t)k;
            bad = ~0ull;
            err = rk_test_check(p, n, pattern + 1, stream, &bad);
            ok(err == 0 && bad == 0, "%s: %zu bytes: a kernel reads what the host wrote "
                                     "(CUDA error %d, %llu bad words)", name, bytes, err, bad);
        }
        is_status(rankmem_deallocate_async(mr, p, bytes, 0, stream), RANKMEM_SUCCESS,
                  "%s: deallocate %zu bytes on the stream", name, bytes);
    }

    /* The synchronous calls: the legacy default stream. */
    void *p = NULL;
    rankmem_status_t st = rankmem_allocate(mr, 4096, 0, &p);
    is_status(st, RANKMEM_SUCCESS, "%s: synchronous allocate", name);
    if (st == RANKMEM_SUCCESS) {
        unsigned long long bad = ~0ull;
        int err = rk_test_fill(p, 1024, 0xc0ffee, NULL);
        if (!err)
            err = rk_test_check(p, 1024, 0xc0ffee, NULL, &bad);
        ok(err == 0 && bad == 0, "%s: default stream: pattern read back (CUDA error %d, %llu "
                                 "bad words)", name, err, bad);
        is_status(rankmem_deallocate(mr, p, 4096, 0), RANKMEM_SUCCESS,
                  "%s: synchronous deallocate", name);
    }
    ok(cudaStreamSynchronize(stream) == cudaSuccess, "%s: the stream finished cleanly", name);
}

/* A failure leaves the output alone, says something, and leaves no CUDA
 * error behind for the caller's next runtime call. */
static void test_failure(rankmem_resource_t *mr, const char *name, size_t bytes, size_t alignment,
                         rankmem_status_t want, const char *why)
{
    void *p = (void *)&p;
    is_status(rankmem_allocate_async(mr, bytes, alignment, stream, &p), want,
              "%s: %s fails", name, why);
    ok(p == (void *)&p, "%s: %s: output untouched", name, why);
    ok(rankmem_last_error()[0] != '\0', "%s: %s: says why: %s", name, why, rankmem_last_error());
    ok(cudaGetLastError() == cudaSuccess, "%s: %s: no CUDA error left behind", name, why);
}

static void test_bad_inputs(void)
{
    rankmem_resource_t *mr = (rankmem_resource_t *)&mr; /* sentinel: must stay */
    rankmem_async_params_t params;

    is_status(rankmem_cuda_create(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "cuda_create(NULL)");
    is_status(rankmem_managed_create(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "managed_create(NULL)");
    is_status(rankmem_pinned_create(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "pinned_create(NULL)");
    is_status(rankmem_async_create(NULL, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_create(NULL, NULL)");
    is_status(rankmem_async_params_default(NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_params_default(NULL)");
    is_status(rankmem_async_params_default(&params), RANKMEM_SUCCESS, "async_params_default");
    ok(params.size == sizeof params && !params.use_default_pool && params.initial_pool_size == 0 &&
           params.release_threshold == SIZE_MAX && params.handle_type == RANKMEM_HANDLE_NONE,
       "async params default: new pool, no initial size, threshold SIZE_MAX, no handle");
    is_status(rankmem_async_create(&params, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_create(params, NULL)");
    params.size = 0;
    is_status(rankmem_async_create(&params, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_create with params.size 0");
    rankmem_async_params_default(&params);
    params.handle_type = 0x100;
    is_status(rankmem_async_create(&params, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_create with an unknown handle type");
    is_status(rankmem_async_view_create((rankmem_mempool_t)&params, NULL),
              RANKMEM_ERR_INVALID_ARGUMENT, "async_view_create(pool, NULL)");
    is_status(rankmem_async_view_create(NULL, &mr), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_view_create(NULL pool)");
    ok(mr == (rankmem_resource_t *)&mr, "failed constructors leave *mr_p untouched");
    rankmem_mempool_t h = (rankmem_mempool_t)&h;
    is_status(rankmem_async_pool_handle(NULL, &h), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_pool_handle(NULL, ...)");
    ok(h == (rankmem_mempool_t)&h, "async_pool_handle: output untouched on failure");
}

static void test_cuda(rankmem_resource_t *cuda)
{
    test_resource(cuda, "cuda", RANKMEM_PROP_DEVICE_ACCESSIBLE);
    test_failure(cuda, "cuda", 4096, 512, RANKMEM_ERR_NOT_SUPPORTED, "alignment 512");
    test_failure(cuda, "cuda", HUGE_BYTES, 0, RANKMEM_ERR_OUT_OF_MEMORY, "1 PiB");
    ok(strstr(rankmem_last_error(), "cudaMalloc") != NULL,
       "cuda: the error names cudaMalloc: %s", rankmem_last_error());
    rankmem_mempool_t h = (rankmem_mempool_t)&h;
    is_status(rankmem_async_pool_handle(cuda, &h), RANKMEM_ERR_INVALID_ARGUMENT,
              "async_pool_handle of a cuda resource");
    ok(h == (rankmem_mempool_t)&h, "async_pool_handle of a cuda resource: output untouched");
}

static void test_managed(void)
{
    rankmem_resource_t *mr = NULL;
    rankmem_status_t st = rankmem_managed_create(&mr);
    if (st == RANKMEM_ERR_NOT_SUPPORTED) {
        tap_skip(1, "managed memory not supported on this device");
        return;
    }
    is_status(st, RANKMEM_SUCCESS, "managed_create");
    if (st != RANKMEM_SUCCESS) {
        diag("  %s", rankmem_last_error());
        return;
    }
    test_resource(mr, "managed", RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE);
    test_failure(mr, "managed", 4096, 512, RANKMEM_ERR_NOT_SUPPORTED, "alignment 512");
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "managed: release");
}

static void test_pinned(void)
{
    rankmem_resource_t *mr = NULL;
    rankmem_status_t st = rankmem_pinned_create(&mr);
    is_status(st, RANKMEM_SUCCESS, "pinned_create");
    if (st != RANKMEM_SUCCESS) {
        diag("  %s", rankmem_last_error());
        return;
    }
    test_resource(mr, "pinned", RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE);
    void *p = NULL;
    st = rankmem_allocate(mr, 100, 4096, &p);
    is_status(st, RANKMEM_SUCCESS, "pinned: page alignment is supported");
    if (st == RANKMEM_SUCCESS) {
        ok((uintptr_t)p % 4096 == 0, "pinned: %p is page-aligned", p);
        is_status(rankmem_deallocate(mr, p, 100, 4096), RANKMEM_SUCCESS, "pinned: deallocate");
    }
    test_failure(mr, "pinned", 4096, 8192, RANKMEM_ERR_NOT_SUPPORTED, "alignment 8192");
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "pinned: release");
}

/* The async resource over the device's default pool. Returns it (kept for
 * comparisons) or NULL. */
static rankmem_resource_t *test_async_default(void)
{
    rankmem_resource_t *a0 = NULL, *a0b = NULL;
    rankmem_status_t st = rankmem_async_create(NULL, &a0);
    is_status(st, RANKMEM_SUCCESS, "async_create(default pool)");
    if (st != RANKMEM_SUCCESS) {
        diag("  %s", rankmem_last_error());
        return NULL;
    }
    test_resource(a0, "async", RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_STREAM_ORDERED);
    test_failure(a0, "async", 4096, 512, RANKMEM_ERR_NOT_SUPPORTED, "alignment 512");
    test_failure(a0, "async", HUGE_BYTES, 0, RANKMEM_ERR_OUT_OF_MEMORY, "1 PiB");

    cudaMemPool_t def = NULL;
    rankmem_mempool_t h = NULL;
    ok(cudaDeviceGetDefaultMemPool(&def, dev) == cudaSuccess, "cudaDeviceGetDefaultMemPool");
    is_status(rankmem_async_pool_handle(a0, &h), RANKMEM_SUCCESS, "async: pool handle");
    ok(h == (rankmem_mempool_t)def, "async(NULL params) is over the device's default pool");

    /* use_default_pool asks for the same pool: the two are interchangeable. */
    rankmem_async_params_t params;
    rankmem_async_params_default(&params);
    params.use_default_pool = 1;
    st = rankmem_async_create(&params, &a0b);
    is_status(st, RANKMEM_SUCCESS, "async_create(use_default_pool)");
    if (st == RANKMEM_SUCCESS) {
        int eq = -1;
        h = NULL;
        rankmem_async_pool_handle(a0b, &h);
        ok(h == (rankmem_mempool_t)def, "use_default_pool: the default pool");
        is_status(rankmem_resource_is_equal(a0, a0b, &eq), RANKMEM_SUCCESS, "async: is_equal");
        ok(eq == 1, "two async resources over the default pool are equal");
        is_status(rankmem_resource_release(a0b), RANKMEM_SUCCESS, "async(default): release");
    }
    /* Releasing an async resource over the default pool must not destroy it. */
    void *p = NULL;
    cudaError_t err = cudaMallocFromPoolAsync(&p, MiB, def, stream);
    if (err == cudaSuccess)
        err = cudaFreeAsync(p, stream);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(stream);
    ok(err == cudaSuccess, "the default pool still works after an async resource over it is "
                           "released (%s)", cudaGetErrorString(err));
    return a0;
}

/* A new pool with 64 MiB reserved at creation and no release threshold. */
static void test_async_new_pool(rankmem_resource_t *a0, rankmem_resource_t *cuda)
{
    rankmem_async_params_t params;
    rankmem_async_params_default(&params);
    params.initial_pool_size = 64 * MiB;
    params.release_threshold = SIZE_MAX;
    rankmem_resource_t *a1 = NULL, *v1 = NULL;
    rankmem_status_t st = rankmem_async_create(&params, &a1);
    is_status(st, RANKMEM_SUCCESS, "async_create(new pool, initial 64 MiB)");
    if (st != RANKMEM_SUCCESS) {
        diag("  %s", rankmem_last_error());
        return;
    }
    size_t reserved = query(a1, RANKMEM_QUERY_RESERVED_CURRENT);
    ok(reserved >= 64 * MiB, "async: initial size reserved (%zu bytes)", reserved);
    rankmem_mempool_t h1 = NULL, h0 = NULL;
    is_status(rankmem_async_pool_handle(a1, &h1), RANKMEM_SUCCESS, "async(new): pool handle");
    if (a0)
        rankmem_async_pool_handle(a0, &h0);
    ok(h1 && h1 != h0, "async(new) has its own pool");
    {
        /* Reuse policies: the runtime's defaults kept (-1), or set. */
        rankmem_async_params_t rp;
        rankmem_async_params_default(&rp);
        rp.reuse_follow_event_dependencies = 0;
        rp.reuse_allow_opportunistic = 0;
        rp.reuse_allow_internal_dependencies = 1;
        rankmem_resource_t *ar = NULL;
        st = rankmem_async_create(&rp, &ar);
        is_status(st, RANKMEM_SUCCESS, "async_create with reuse policies 0, 0, 1");
        if (st == RANKMEM_SUCCESS) {
            rankmem_mempool_t hp = NULL;
            rankmem_async_pool_handle(ar, &hp);
            int fe = -1, op = -1, in = -1;
            cudaMemPoolGetAttribute((cudaMemPool_t)hp, cudaMemPoolReuseFollowEventDependencies, &fe);
            cudaMemPoolGetAttribute((cudaMemPool_t)hp, cudaMemPoolReuseAllowOpportunistic, &op);
            cudaMemPoolGetAttribute((cudaMemPool_t)hp, cudaMemPoolReuseAllowInternalDependencies,
                                    &in);
            ok(fe == 0 && op == 0 && in == 1, "the pool's reuse policies are set (%d, %d, %d)", fe,
               op, in);
            rankmem_resource_release(ar);
        }
    }

    test_resource(a1, "async", RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_STREAM_ORDERED);

    /* Queries follow an allocation. */
    size_t used0 = query(a1, RANKMEM_QUERY_USED_CURRENT);
    void *p = NULL;
    st = rankmem_allocate_async(a1, 8 * MiB, 0, stream, &p);
    is_status(st, RANKMEM_SUCCESS, "async: allocate 8 MiB");
    size_t used1 = query(a1, RANKMEM_QUERY_USED_CURRENT);
    reserved = query(a1, RANKMEM_QUERY_RESERVED_CURRENT);
    ok(used1 >= used0 + 8 * MiB, "async: used grows with an allocation (%zu -> %zu)", used0,
       used1);
    ok(reserved >= used1, "async: reserved %zu >= used %zu", reserved, used1);
    ok(query(a1, RANKMEM_QUERY_USED_HIGH) >= used1, "async: used high-water >= used");
    ok(query(a1, RANKMEM_QUERY_RESERVED_HIGH) >= reserved, "async: reserved high-water >= reserved");
    size_t v = 12345;
    is_status(rankmem_resource_query(a1, RANKMEM_QUERY_POOL_MAX, &v), RANKMEM_ERR_NOT_SUPPORTED,
              "async: POOL_MAX is not known");
    ok(v == 12345, "async: unsupported query leaves the output alone");
    if (st == RANKMEM_SUCCESS)
        is_status(rankmem_deallocate_async(a1, p, 8 * MiB, 0, stream), RANKMEM_SUCCESS,
                  "async: deallocate 8 MiB");
    ok(cudaStreamSynchronize(stream) == cudaSuccess, "async: stream synchronised");
    size_t used2 = query(a1, RANKMEM_QUERY_USED_CURRENT);
    ok(used2 < used1, "async: used drops after the free (%zu -> %zu)", used1, used2);
    ok(query(a1, RANKMEM_QUERY_RESERVED_CURRENT) >= 64 * MiB,
       "async: threshold SIZE_MAX keeps the memory after a synchronisation");
    is_status(rankmem_resource_trim(a1, 0), RANKMEM_SUCCESS, "async: trim to 0");
    reserved = query(a1, RANKMEM_QUERY_RESERVED_CURRENT);
    ok(reserved == 0, "async: nothing reserved after trimming an idle pool (%zu bytes)", reserved);

    /* A view over the same pool: memory from one may go back through the other. */
    st = rankmem_async_view_create(h1, &v1);
    is_status(st, RANKMEM_SUCCESS, "async_view over the async resource's pool");
    if (st == RANKMEM_SUCCESS) {
        int eq = -1;
        is_status(rankmem_resource_is_equal(a1, v1, &eq), RANKMEM_SUCCESS, "is_equal(async, view)");
        ok(eq == 1, "async and async_view over one pool are equal");
        p = NULL;
        st = rankmem_allocate_async(a1, MiB, 0, stream, &p);
        is_status(st, RANKMEM_SUCCESS, "async: allocate 1 MiB");
        if (st == RANKMEM_SUCCESS)
            is_status(rankmem_deallocate_async(v1, p, MiB, 0, stream), RANKMEM_SUCCESS,
                      "async_view: deallocate what async allocated");
        is_status(rankmem_resource_release(v1), RANKMEM_SUCCESS, "async_view: release");
    }
    if (a0) {
        int eq = -1;
        is_status(rankmem_resource_is_equal(a1, a0, &eq), RANKMEM_SUCCESS, "is_equal(new, default)");
        ok(eq == 0, "async resources over different pools differ");
    }
    int eq = -1;
    is_status(rankmem_resource_is_equal(a1, cuda, &eq), RANKMEM_SUCCESS, "is_equal(async, cuda)");
    ok(eq == 0, "async and cuda differ");

    /* The registry: an async resource as the current device's resource. */
    rankmem_resource_t *cur = NULL, *got = NULL;
    is_status(rankmem_get_current_resource(&cur), RANKMEM_SUCCESS, "get_current_resource");
    is_status(rankmem_resource_retain(cur), RANKMEM_SUCCESS, "retain the current resource");
    is_status(rankmem_set_current_resource(a1), RANKMEM_SUCCESS, "set async as current");
    is_status(rankmem_get_current_resource(&got), RANKMEM_SUCCESS, "get_current_resource");
    ok(got == a1, "the current resource is the async one");
    got = NULL;
    is_status(rankmem_get_device_resource(dev, &got), RANKMEM_SUCCESS, "get_device_resource");
    ok(got == a1, "and so is the current device's");
    is_status(rankmem_set_current_resource(cur), RANKMEM_SUCCESS, "set the old one back");
    got = NULL;
    rankmem_get_current_resource(&got);
    ok(got == cur, "the old resource is current again");
    is_status(rankmem_resource_release(cur), RANKMEM_SUCCESS, "release our reference to it");

    /* The pool is ours: it still works while we hold the resource. */
    p = NULL;
    st = rankmem_allocate_async(a1, MiB, 0, stream, &p);
    is_status(st, RANKMEM_SUCCESS, "async(new) works after the registry let go");
    if (st == RANKMEM_SUCCESS)
        rankmem_deallocate_async(a1, p, MiB, 0, stream);
    cudaStreamSynchronize(stream);
    is_status(rankmem_resource_release(a1), RANKMEM_SUCCESS, "async(new): release");
}

/* A view over a pool the test creates and destroys itself. */
static void test_async_view(void)
{
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t pool = NULL;
    cudaError_t err = cudaMemPoolCreate(&pool, &props);
    ok(err == cudaSuccess, "cudaMemPoolCreate (%s)", cudaGetErrorString(err));
    if (err != cudaSuccess)
        return;
    rankmem_resource_t *v = NULL;
    rankmem_status_t st = rankmem_async_view_create((rankmem_mempool_t)pool, &v);
    is_status(st, RANKMEM_SUCCESS, "async_view_create");
    if (st == RANKMEM_SUCCESS) {
        rankmem_mempool_t h = NULL;
        is_status(rankmem_async_pool_handle(v, &h), RANKMEM_SUCCESS, "async_view: pool handle");
        ok(h == (rankmem_mempool_t)pool, "async_view: the user's pool");
        test_resource(v, "async_view", RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_STREAM_ORDERED);
        is_status(rankmem_resource_release(v), RANKMEM_SUCCESS, "async_view: release");
    }
    /* The view must not have destroyed the user's pool. */
    err = cudaMemPoolDestroy(pool);
    ok(err == cudaSuccess, "the user destroys the pool after the view (%s)",
       cudaGetErrorString(err));
}

static void test_registry_and_devices(rankmem_resource_t *cuda, int ndev)
{
    rankmem_resource_t *cur = NULL;
    const char *name = NULL;
    int d = -2;
    is_status(rankmem_get_current_resource(&cur), RANKMEM_SUCCESS, "registry: current resource");
    if (cur) {
        rankmem_resource_name(cur, &name);
        rankmem_resource_device(cur, &d);
    }
    ok(name && strcmp(name, "cuda") == 0, "registry: the first resource is 'cuda' (got '%s')",
       name ? name : "(null)");
    ok(d == dev, "registry: on the current device %d (got %d)", dev, d);
    d = -2;
    is_status(rankmem_current_device(&d), RANKMEM_SUCCESS, "rankmem_current_device");
    ok(d == dev, "rankmem_current_device agrees with cudaGetDevice (%d, %d)", d, dev);

    if (ndev < 2) {
        tap_skip(6, "one GPU: cannot use a resource on another device");
        return;
    }
    int other = (dev + 1) % ndev;
    if (cudaSetDevice(other) != cudaSuccess)
        BAIL_OUT("cudaSetDevice(%d) failed", other);
    test_failure(cuda, "cuda", 4096, 0, RANKMEM_ERR_WRONG_DEVICE, "use on another device");
    rankmem_resource_t *mr = NULL;
    d = -2;
    if (rankmem_cuda_create(&mr) == RANKMEM_SUCCESS) {
        rankmem_resource_device(mr, &d);
        rankmem_resource_release(mr);
    }
    ok(d == other, "a cuda resource made on device %d records it (got %d)", other, d);
    if (cudaSetDevice(dev) != cudaSuccess)
        BAIL_OUT("cudaSetDevice(%d) failed", dev);
    ok(1, "back on device %d", dev);
}

/* Issue 31, defect 7: the direct resources keep no records; a bad free is
 * the CUDA runtime's to judge (docs/user-guide.md, "Bad frees"). What it
 * says must come back as a status, never an abort, and leave no error
 * behind for the next CUDA call. */
static void test_defect7_runtime_frees(void)
{
    static const char *const specs[] = {"cuda", "managed", "pinned"};
    char host[4096] __attribute__((aligned(256)));
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        rankmem_resource_t *mr = NULL;
        if (rankmem_resource_from_spec(specs[i], &mr) != RANKMEM_SUCCESS) {
            tap_skip(3, "resource not available here");
            continue;
        }
        void *p = NULL;
        rankmem_status_t st = rankmem_allocate(mr, 1 * MiB, 0, &p);
        if (st == RANKMEM_SUCCESS)
            st = rankmem_deallocate(mr, p, 1 * MiB, 0);
        is_status(st, RANKMEM_SUCCESS, "defect 7: %s: allocate and free", specs[i]);
        st = rankmem_deallocate(mr, p, 1 * MiB, 0);
        ok(st != RANKMEM_SUCCESS && cudaGetLastError() == cudaSuccess,
           "defect 7: %s: a double free is the runtime's error, reported (%s: %s)", specs[i],
           rankmem_status_string(st), st ? rankmem_last_error() : "");
        st = rankmem_deallocate(mr, host, sizeof host, 0);
        ok(st != RANKMEM_SUCCESS && cudaGetLastError() == cudaSuccess,
           "defect 7: %s: a foreign (stack) pointer likewise (%s: %s)", specs[i],
           rankmem_status_string(st), st ? rankmem_last_error() : "");
        rankmem_resource_release(mr);
    }
}

int main(void)
{
    int ndev = 0;
    rankmem_status_t st = rankmem_device_count(&ndev);
    if (st != RANKMEM_SUCCESS || ndev == 0) {
        /* A constructor says why in the runtime's words. */
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
    diag("%d device(s); testing on device %d", ndev, dev);

    test_bad_inputs();

    rankmem_resource_t *cuda = NULL;
    st = rankmem_cuda_create(&cuda);
    is_status(st, RANKMEM_SUCCESS, "cuda_create");
    if (st != RANKMEM_SUCCESS)
        BAIL_OUT("rankmem_cuda_create: %s", rankmem_last_error());
    test_cuda(cuda);
    test_managed();
    test_pinned();
    rankmem_resource_t *a0 = test_async_default();
    test_async_new_pool(a0, cuda);
    test_async_view();
    test_registry_and_devices(cuda, ndev);
    test_defect7_runtime_frees();

    if (a0)
        is_status(rankmem_resource_release(a0), RANKMEM_SUCCESS, "async(default): release");
    is_status(rankmem_resource_release(cuda), RANKMEM_SUCCESS, "cuda: release");
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
