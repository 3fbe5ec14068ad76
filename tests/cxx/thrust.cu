// include/rankmem.hpp with nvcc: thrust::device_vector over the current
// device's resource through rankmem::thrust_allocator (the stream-bound
// allocator with thrust's device pointer), on the default stream and on a
// stream of its own; a chain with stats sees the memory come and go; a
// limit surfaces as std::bad_alloc; equality follows the resources.
// Called by thrust_main.c; prints a TAP skip without a GPU.
#include <rankmem.hpp>

#include <cuda_runtime_api.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/host_vector.h>
#include <thrust/reduce.h>
#include <thrust/sequence.h>
#include <thrust/transform.h>

#include <string>

#include "../tap.h"

namespace {

using ivec = thrust::device_vector<int, rankmem::thrust_allocator<int>>;

size_t bytes_now(const rankmem::resource &stats)
{
    rankmem_stats_t s;
    s.size = sizeof s;
    if (rankmem_stats_get(stats.get(), &s) != RANKMEM_SUCCESS)
        return SIZE_MAX;
    return s.bytes_current;
}

struct twice {
    __host__ __device__ int operator()(int x) const { return 2 * x; }
};

void test_current_resource()
{
    rankmem::resource cur = rankmem::current_device_resource();
    ok(cur.device_accessible(), "the current device resource (%s) is device memory",
       cur.name().c_str());
    rankmem::thrust_allocator<int> alloc(cur);
    const int n = 1 << 20;
    ivec v(n, 7, alloc);
    long long sum = thrust::reduce(v.begin(), v.end(), 0LL);
    ok(sum == 7LL * n, "device_vector(1M, 7) over it: reduce gives %lld", sum);
    thrust::sequence(v.begin(), v.end());
    thrust::transform(v.begin(), v.end(), v.begin(), twice());
    thrust::host_vector<int> h = v;
    bool good = true;
    for (int i = 0; i < n; i++)
        good = good && h[(size_t)i] == 2 * i;
    ok(good, "sequence and transform on the device, read back on the host");

    ivec def(16, 1); // default allocator: the current device's resource, default stream
    ok(def.get_allocator() == alloc, "the default thrust_allocator equals one over the current "
                                     "resource");
}

void test_stream_and_stats()
{
    cudaStream_t stream;
    // Blocking: thrust's own steps (the fill in resize) run on the default
    // stream, which then orders itself with this one.
    if (cudaStreamCreate(&stream) != cudaSuccess) {
        ok(0, "cudaStreamCreate");
        return;
    }
    rankmem::resource chain = rankmem::stats(rankmem::pool(rankmem::current_device_resource()));
    {
        rankmem::thrust_allocator<int> alloc(chain, (rankmem::stream_t)stream);
        ok(alloc.stream() == (rankmem::stream_t)stream, "thrust_allocator bound to a stream");
        ivec v(alloc);
        v.resize(1 << 16);
        thrust::sequence(thrust::cuda::par.on(stream), v.begin(), v.end(), 1);
        long long sum = thrust::reduce(thrust::cuda::par.on(stream), v.begin(), v.end(), 0LL);
        long long n = 1 << 16;
        ok(sum == n * (n + 1) / 2, "a device_vector on the stream: sum %lld", sum);
        ok(bytes_now(chain) >= (1 << 16) * sizeof(int),
           "its memory came through stats>pool (%zu bytes live)", bytes_now(chain));
        cudaStreamSynchronize(stream);
    }
    ok(bytes_now(chain) == 0, "and went back when the vector did");
    chain.forget_stream((rankmem::stream_t)stream);
    cudaStreamDestroy(stream);
}

void test_errors_and_equality()
{
    rankmem::resource cur = rankmem::current_device_resource();
    rankmem::thrust_allocator<int> lim(rankmem::limit(cur, 1 << 20));
    bool bad_alloc = false;
    try {
        ivec v(1 << 20, 0, lim); // 4 MiB past a 1 MiB limit
    } catch (const std::bad_alloc &e) {
        bad_alloc = true;
        diag("  %s", e.what());
    } catch (const std::exception &e) {
        diag("  threw something else: %s", e.what());
    }
    ok(bad_alloc, "a device_vector past a limit: std::bad_alloc");

    rankmem::resource p1 = rankmem::pool(cur), p2 = rankmem::pool(cur);
    rankmem::thrust_allocator<int> a1(p1), a1b(p1), a2(p2);
    rankmem::thrust_allocator<double> a1d(a1);
    ok(a1 == a1b && a1d == a1, "thrust allocators over one pool: equal (also rebound)");
    ok(a1 != a2, "over two pools: not equal");

    // The stream allocator itself, on a stream, over device memory.
    rankmem::stream_allocator<float> sa(cur);
    float *f = sa.allocate(1000, nullptr);
    ok(f != nullptr, "stream_allocator<float> over device memory");
    ok(cudaMemset(f, 0, 1000 * sizeof(float)) == cudaSuccess, "  the memory is the device's");
    sa.deallocate(f, 1000, nullptr);
}

} // namespace

extern "C" int rk_cxx_thrust_main(void)
{
    int n = 0;
    if (rankmem_device_count(&n) != RANKMEM_SUCCESS || n == 0)
        return tap_skip_all("no GPU");
    try {
        test_current_resource();
        test_stream_and_stats();
        test_errors_and_equality();
    } catch (const std::exception &e) {
        BAIL_OUT("unexpected exception: %s", e.what());
    }
    ok(cudaGetLastError() == cudaSuccess, "no CUDA error left behind");
    return tap_done();
}
