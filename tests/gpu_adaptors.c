/* Every adaptor on a real GPU, built from spec strings over device
 * resources: kernels write and read back what each chain hands out on a
 * stream, and each adaptor's own promise is checked (stats exact, tracking's
 * outstanding list, limit's refusal, aligned's alignment, retry recovering
 * after a trim, logging's lines). Skips where there is no GPU. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rankmem.h>

#include "tap.h"

#if HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu_kernels.h"

#define MiB ((size_t)1 << 20)

/* Allocate sizes on stream, fill each with a pattern, check it, free. */
static int roundtrip(rankmem_resource_t *mr, cudaStream_t stream, const char *spec)
{
    static const size_t sizes[] = {256, 4096, 100000, 3 * MiB};
    void *p[4] = {0};
    int good = 1;
    for (int i = 0; i < 4; i++)
        if (rankmem_allocate_async(mr, sizes[i], 0, (rankmem_stream_t)stream, &p[i]) != RANKMEM_SUCCESS) {
            diag("%s: allocate %zu: %s", spec, sizes[i], rankmem_last_error());
            good = 0;
        }
    for (int i = 0; i < 4 && good; i++)
        good &= rk_test_fill(p[i], sizes[i] / 4, 0x5a5a0000u + (unsigned)i, (rankmem_stream_t)stream) == 0;
    for (int i = 0; i < 4 && good; i++) {
        unsigned long long bad = 1;
        good &= rk_test_check(p[i], sizes[i] / 4, 0x5a5a0000u + (unsigned)i, (rankmem_stream_t)stream, &bad) == 0 && bad == 0;
    }
    for (int i = 0; i < 4; i++)
        if (p[i] && rankmem_deallocate_async(mr, p[i], sizes[i], 0, (rankmem_stream_t)stream) != RANKMEM_SUCCESS)
            good = 0;
    return good;
}

static rankmem_resource_t *build(const char *spec)
{
    rankmem_resource_t *mr = NULL;
    if (rankmem_resource_from_spec(spec, &mr) != RANKMEM_SUCCESS)
        diag("%s: %s", spec, rankmem_last_error());
    return mr;
}

int main(void)
{
    int n = 0;
    if (rankmem_device_count(&n) != RANKMEM_SUCCESS || n == 0)
        return tap_skip_all("no GPU");
    cudaStream_t stream;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
        BAIL_OUT("cudaStreamCreateWithFlags failed");
    char logpath[] = "/tmp/rankmem-gpu-log-XXXXXX";
    int fd = mkstemp(logpath);
    if (fd < 0)
        BAIL_OUT("mkstemp");
    close(fd);
    char logspec[128];
    snprintf(logspec, sizeof logspec, "logging(file=%s)>pool>cuda", logpath);
    const char *specs[] = {
        "stats>pool(initial=64MiB)>cuda", "tracking>pool>cuda", logspec,
        "limit(bytes=64MiB)>pool>cuda", "aligned(alignment=64KiB,threshold=1MiB)>pool>cuda",
        "retry>pool>async", "threadsafe>cuda", "stats>tracking>managed", "stats>pinned",
        "prefetch>managed",
        /* The suballocators over device memory too. */
        "caching>cuda", "caching(growth=2,min=8,max=22,cap=1GiB)>async", "binning>pool>cuda",
        "fixed(block=4MiB,batch=2)>cuda", "arena(size=256MiB,superblock=1MiB)>cuda",
    };
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        rankmem_resource_t *mr = build(specs[i]);
        if (!ok(mr != NULL, "%s: built", specs[i])) {
            tap_skip(1, "not built");
            continue;
        }
        ok(roundtrip(mr, stream, specs[i]), "%s: kernels write and read back every block", specs[i]);
        rankmem_pool_forget_stream(mr, (rankmem_stream_t)stream); /* fine when there is no pool */
        rankmem_resource_release(mr);
    }

    /* stats: exact numbers over device memory. */
    rankmem_resource_t *st = build("stats>pool>cuda");
    void *a = NULL, *b = NULL;
    rankmem_allocate_async(st, 1000, 0, (rankmem_stream_t)stream, &a);
    rankmem_allocate_async(st, 5000, 0, (rankmem_stream_t)stream, &b);
    rankmem_deallocate_async(st, a, 1000, 0, (rankmem_stream_t)stream);
    rankmem_stats_t s;
    s.size = sizeof s;
    is_status(rankmem_stats_get(st, &s), RANKMEM_SUCCESS, "stats over a device pool");
    ok(s.bytes_current == 5000 && s.bytes_peak == 6000 && s.bytes_total == 6000 &&
           s.count_current == 1 && s.count_peak == 2 && s.count_total == 2,
       "stats exact: current %zu peak %zu total %zu, counts %zu/%zu/%zu", s.bytes_current,
       s.bytes_peak, s.bytes_total, s.count_current, s.count_peak, s.count_total);
    rankmem_deallocate_async(st, b, 5000, 0, (rankmem_stream_t)stream);
    rankmem_pool_forget_stream(st, (rankmem_stream_t)stream);
    rankmem_resource_release(st);

    /* tracking: what is outstanding on the device. */
    rankmem_resource_t *tr = build("tracking>cuda");
    rankmem_allocate(tr, 4096, 0, &a);
    rankmem_allocate(tr, 8192, 0, &b);
    size_t bytes = 0, count = 0;
    rankmem_tracking_outstanding(tr, &bytes, &count);
    ok(bytes == 12288 && count == 2, "tracking over cuda: %zu bytes in %zu blocks outstanding", bytes, count);
    is_status(rankmem_deallocate(tr, a, 4096, 0), RANKMEM_SUCCESS, "tracking: free");
    is_status(rankmem_deallocate(tr, a, 4096, 0), RANKMEM_ERR_INVALID_POINTER, "tracking: a double free of device memory is refused");
    rankmem_deallocate(tr, b, 8192, 0);
    rankmem_resource_release(tr);

    /* limit: refuses past its bytes, over device memory. */
    rankmem_resource_t *lim = build("limit(bytes=4MiB)>pool>cuda");
    is_status(rankmem_allocate(lim, 3 * MiB, 0, &a), RANKMEM_SUCCESS, "limit: under the limit");
    is_status(rankmem_allocate(lim, 2 * MiB, 0, &b), RANKMEM_ERR_LIMIT, "limit: past the limit");
    rankmem_deallocate(lim, a, 3 * MiB, 0);
    rankmem_resource_release(lim);

    /* aligned: large blocks at the larger alignment. */
    rankmem_resource_t *al = build("aligned(alignment=1MiB,threshold=64KiB)>cuda");
    is_status(rankmem_allocate(al, 100000, 0, &a), RANKMEM_SUCCESS, "aligned over cuda");
    ok(((uintptr_t)a & (MiB - 1)) == 0, "aligned: %p is 1 MiB-aligned", a);
    unsigned long long bad = 1;
    ok(rk_test_fill(a, 25000, 7, NULL) == 0 && rk_test_check(a, 25000, 7, NULL, &bad) == 0 && bad == 0,
       "aligned: a kernel writes and reads the whole block");
    rankmem_deallocate(al, a, 100000, 0);
    rankmem_resource_release(al);

    /* logging: lines reached the file. */
    FILE *f = fopen(logpath, "r");
    int lines = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        lines++;
    if (f)
        fclose(f);
    ok(lines == 1 + 8, "logging over a device pool: header and 8 events (%d lines)", lines);
    unlink(logpath);

    ok(cudaGetLastError() == cudaSuccess, "no CUDA error left at the end");
    cudaStreamDestroy(stream);
    return tap_done();
}

#else
int main(void) { return tap_skip_all("built without CUDA"); }
#endif
