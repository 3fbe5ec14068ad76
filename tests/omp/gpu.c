/* librankmem_omp on a GPU: device memory from omp_alloc is real device
 * memory (cudaPointerGetAttributes) and holds what cudaMemcpy puts in it;
 * omp_calloc zeroes it, omp_realloc keeps it; managed and pinned spaces give
 * managed and pinned memory; an allocate clause on 16 threads gets device
 * memory; pool_size with null_fb and allocator_fb on device memory; the
 * rank's stats count it. No kernel: everything is checked with cudaMemcpy.
 * Without a GPU (or without CUDA) the whole test is skipped. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "omp_test.h"

#if HAVE_CUDA
#include <cuda_runtime_api.h>

static int mem_type(const void *p)
{
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return (int)at.type;
}

/* Device block of n bytes holds v everywhere (read back with cudaMemcpy). */
static int device_holds(const void *d, unsigned char v, size_t n)
{
    unsigned char *h = malloc(n);
    int good = h && cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess && all_bytes(h, v, n);
    free(h);
    return good;
}

static int device_fill(void *d, unsigned char v, size_t n)
{
    unsigned char *h = malloc(n);
    if (!h)
        return 0;
    memset(h, v, n);
    int good = cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess;
    free(h);
    return good;
}

int main(void)
{
    int n = 0;
    if (rankmem_device_count(&n) != RANKMEM_SUCCESS || n == 0)
        return tap_skip_all("no GPU");
    diag("runtime: %s", RT_NAME);
    rankmem_resource_t *cur, *st = install_stats(&cur);

    const size_t N = 1 << 20;
    void *d = omp_alloc(N, rankmem_omp_device_mem_alloc);
    ok(d && mem_type(d) == cudaMemoryTypeDevice, "omp_alloc(device): cudaMemoryTypeDevice");
    ok(device_fill(d, 0x5a, N) && device_holds(d, 0x5a, N), "device block round-trips 1 MiB");
    rankmem_stats_t s = {.size = sizeof s};
    rankmem_stats_get(st, &s);
    ok(s.count_current == 1 && s.bytes_current == N, "the rank's stats count it");
    void *d2 = omp_realloc(d, 2 * N, rankmem_omp_device_mem_alloc, rankmem_omp_device_mem_alloc);
    ok(d2 && mem_type(d2) == cudaMemoryTypeDevice && device_holds(d2, 0x5a, N),
       "omp_realloc keeps device contents (device-to-device copy)");
    void *h = omp_realloc(d2, N, omp_default_mem_alloc, omp_null_allocator);
    ok(h && all_bytes(h, 0x5a, N), "omp_realloc from device memory to the runtime's host memory");
    void *d3 = omp_realloc(h, N, rankmem_omp_device_mem_alloc, omp_default_mem_alloc);
    ok(d3 && mem_type(d3) == cudaMemoryTypeDevice && device_holds(d3, 0x5a, N),
       "omp_realloc from host memory into device memory");
    omp_free(d3, rankmem_omp_device_mem_alloc);

    void *dirty = omp_alloc(N, rankmem_omp_device_mem_alloc);
    device_fill(dirty, 0xff, N);
    omp_free(dirty, rankmem_omp_device_mem_alloc);
    void *z = omp_calloc(N / 8, 8, rankmem_omp_device_mem_alloc);
    ok(z && device_holds(z, 0, N), "omp_calloc zeroes device memory");
    omp_free(z, omp_null_allocator);

    void *m = omp_alloc(4096, rankmem_omp_managed_mem_alloc);
    ok(m && mem_type(m) == cudaMemoryTypeManaged, "managed space: cudaMemoryTypeManaged");
    unsigned char *mc = omp_calloc(1, 4096, rankmem_omp_managed_mem_alloc);
    ok(mc && all_bytes(mc, 0, 4096), "managed omp_calloc zeroes (read on the host)");
    omp_free(m, omp_null_allocator);
    omp_free(mc, omp_null_allocator);
    void *p = omp_alloc(4096, rankmem_omp_pinned_mem_alloc);
    ok(p && mem_type(p) == cudaMemoryTypeHost, "pinned space: cudaMemoryTypeHost");
    omp_free(p, omp_null_allocator);

    int dev = 0, total = 0;
    double x[512];
#pragma omp parallel num_threads(16) private(x) allocate(rankmem_omp_device_mem_alloc : x) \
    reduction(+ : dev, total)
    {
        /* x is device memory: the host touches it only through CUDA. */
        double hv[512], back[512];
        for (int i = 0; i < 512; i++)
            hv[i] = omp_get_thread_num() * 1000.0 + i;
        int good = mem_type(x) == cudaMemoryTypeDevice &&
                   cudaMemcpy(x, hv, sizeof hv, cudaMemcpyHostToDevice) == cudaSuccess &&
                   cudaMemcpy(back, x, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess &&
                   memcmp(hv, back, sizeof hv) == 0;
        dev += good;
        total++;
    }
    (void)x;
    ok(dev == 16 && total == 16, "allocate clause on 16 threads: %d device copies", dev);

    /* pool_size on device memory: null_fb, then allocator_fb to the device. */
    omp_alloctrait_t tn[2] = {{omp_atk_pool_size, 1 << 20}, {omp_atk_fallback, omp_atv_null_fb}};
    omp_allocator_handle_t pn = omp_init_allocator(rankmem_omp_device_mem_space, 2, tn);
    void *a1 = omp_alloc(768 << 10, pn), *a2 = omp_alloc(768 << 10, pn);
    ok(a1 && mem_type(a1) == cudaMemoryTypeDevice && !a2, "pool_size 1 MiB, null_fb: full gives NULL");
    omp_alloctrait_t tf[3] = {{omp_atk_pool_size, 1 << 20},
                              {omp_atk_fallback, omp_atv_allocator_fb},
                              {omp_atk_fb_data, rankmem_omp_managed_mem_alloc}};
    omp_allocator_handle_t pf = omp_init_allocator(rankmem_omp_device_mem_space, 3, tf);
    void *b1 = omp_alloc(768 << 10, pf), *b2 = omp_alloc(768 << 10, pf);
    ok(mem_type(b1) == cudaMemoryTypeDevice && mem_type(b2) == cudaMemoryTypeManaged,
       "pool_size 1 MiB, allocator_fb managed: the rest is managed memory");
    omp_alloctrait_t tdf[1] = {{omp_atk_pool_size, 1 << 20}};
    omp_allocator_handle_t pd = omp_init_allocator(rankmem_omp_device_mem_space, 1, tdf);
    void *c1 = omp_alloc(768 << 10, pd), *c2 = omp_alloc(768 << 10, pd);
    ok(mem_type(c1) == cudaMemoryTypeDevice && c2 && !is_ours(c2),
       "pool_size 1 MiB, default_mem_fb: the runtime's host memory");
    omp_free(a1, pn);
    omp_free(b1, pf);
    omp_free(b2, pf);
    omp_free(c1, pd);
    omp_free(c2, pd);
    omp_destroy_allocator(pn);
    omp_destroy_allocator(pf);
    omp_destroy_allocator(pd);

    /* Freed device memory waits for a device sync (deferred release) unless
     * RANKMEM_OMP_FREE_SYNC=0: give it back before counting. */
    ok(rankmem_omp_flush() == RANKMEM_SUCCESS, "rankmem_omp_flush: the device syncs");
    rankmem_stats_get(st, &s);
    ok(s.count_current == 0 && s.count_total >= 20, "stats: all freed (%zu of %zu)", s.count_current,
       s.count_total);
    rankmem_set_current_resource(cur);
    rankmem_resource_release(st);
    rankmem_resource_release(cur);
    return tap_done();
}
#else
int main(void) { return tap_skip_all("built without CUDA"); }
#endif
