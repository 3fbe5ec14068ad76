/* rankmem-bench: host cost of GPU allocators, rankmem against the CUDA runtime
 * and CUB, in one run. bench/README.md says what is measured and how to run it.
 *
 * Every allocator is driven through the same small virtual interface, so the
 * call overhead of the harness is the same for all of them; the "loop only"
 * row measures that overhead (an allocator that does nothing).
 *
 * A benchmark may abort: every CUDA error and every rankmem status other than
 * RANKMEM_SUCCESS ends the run with a message (die()). */

#include <rankmem.h>
/* The MPI plugin's timing layer, built into the benchmark from mpi/timing.c
 * (bench/bench.am) so that the plugin's default chain is timed outside MPI. */
#include "timing.h"

#include <cub/util_allocator.cuh>
#include <cuda_runtime.h>
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

/* Observation's mark (mpi/observe/recorder.c in the plugin), which timing.c sets
 * around its upstream calls: the benchmark has no recorder. */
extern "C" {
__thread int rk_obs_internal_depth;
}

namespace {

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

const char *g_tmp_path = nullptr; /* --out writes here first; removed on error */

[[noreturn]] __attribute__((format(printf, 1, 2))) void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("rankmem-bench: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    if (g_tmp_path)
        unlink(g_tmp_path);
    /* _Exit, not exit: die() may run on an OpenMP worker while other threads
     * are still inside the CUDA runtime. */
    _Exit(1);
}

[[noreturn]] __attribute__((noinline, cold)) void cuda_failed(cudaError_t err, const char *what,
                                                            const char *file, int line)
{
    die("%s:%d: %s: %s (%s)", file, line, what, cudaGetErrorName(err), cudaGetErrorString(err));
}

[[noreturn]] __attribute__((noinline, cold)) void rankmem_failed(rankmem_status_t st,
                                                               const char *what, const char *file,
                                                               int line)
{
    die("%s:%d: %s: %s (%s)", file, line, what, rankmem_status_string(st), rankmem_last_error());
}

/* The checks sit in the timed loops: keep the success path a single branch. */
inline void check_cuda(cudaError_t err, const char *what, const char *file, int line)
{
    if (__builtin_expect(err != cudaSuccess, 0))
        cuda_failed(err, what, file, line);
}

inline void check_rankmem(rankmem_status_t st, const char *what, const char *file, int line)
{
    if (__builtin_expect(st != RANKMEM_SUCCESS, 0))
        rankmem_failed(st, what, file, line);
}

#define CK_CUDA(call) check_cuda((call), #call, __FILE__, __LINE__)
#define CK_RM(call) check_rankmem((call), #call, __FILE__, __LINE__)

/* ------------------------------------------------------------------------ */
/* Clock, random sizes, statistics                                          */
/* ------------------------------------------------------------------------ */

inline int64_t now_ns()
{
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/* splitmix64: tiny and fully specified, so the size sequence is the same with
 * every compiler and standard library (std:: distributions are not). */
struct SplitMix64 {
    uint64_t state;
    uint64_t next()
    {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    double uniform() { return (double)(next() >> 11) * 0x1.0p-53; } /* [0, 1) */
};

constexpr uint64_t kSeed = 20240601;
constexpr size_t kMinBytes = 256;
size_t kMaxBytes = size_t(4) << 20; /* --max-size */

/* Log-uniform in [kMinBytes, kMaxBytes]: as many 1 KiB-ish requests as
 * 1 MiB-ish ones, like the mix of halos, scratch and field arrays in a code. */
size_t log_uniform_size(SplitMix64 &rng)
{
    const double lo = std::log((double)kMinBytes), hi = std::log((double)kMaxBytes);
    double b = std::exp(lo + rng.uniform() * (hi - lo));
    return std::min(kMaxBytes, std::max(kMinBytes, (size_t)std::llround(b)));
}

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ------------------------------------------------------------------------ */
/* Allocators under test                                                    */
/* ------------------------------------------------------------------------ */

/* One interface for all, so every row pays the same indirect call. */
class Allocator {
public:
    virtual ~Allocator() = default;
    virtual void *alloc(size_t bytes, cudaStream_t stream) = 0;
    virtual void dealloc(void *ptr, size_t bytes, cudaStream_t stream) = 0;
};

/* Does nothing: its row is the cost of the harness itself. */
class NullAllocator final : public Allocator {
    alignas(256) static char dummy_[256];

public:
    void *alloc(size_t, cudaStream_t) override { return dummy_; }
    void dealloc(void *, size_t, cudaStream_t) override {}
};
alignas(256) char NullAllocator::dummy_[256];

class RankmemAllocator final : public Allocator {
    rankmem_resource_t *mr_;
    bool is_pool_;
    std::vector<cudaStream_t> streams_; /* every stream the benchmark may use */

public:
    RankmemAllocator(rankmem_resource_t *mr, bool is_pool, std::vector<cudaStream_t> streams)
        : mr_(mr), is_pool_(is_pool), streams_(std::move(streams))
    {
    }
    ~RankmemAllocator() override
    {
        CK_CUDA(cudaDeviceSynchronize());
        /* The pool keeps per-stream free lists; the API asks us to hand each
         * stream back before it is destroyed (they outlive this object, but a
         * well-behaved user does this before releasing the pool too). */
        (void)is_pool_;
        for (cudaStream_t s : streams_)
            CK_RM(rankmem_resource_forget_stream(mr_, s));
        /* RANKMEM_ERR_BUSY here would mean the benchmark leaked: fail loudly. */
        CK_RM(rankmem_resource_release(mr_));
    }
    void *alloc(size_t bytes, cudaStream_t stream) override
    {
        void *p;
        CK_RM(rankmem_allocate_async(mr_, bytes, 0, stream, &p));
        return p;
    }
    void dealloc(void *ptr, size_t bytes, cudaStream_t stream) override
    {
        CK_RM(rankmem_deallocate_async(mr_, ptr, bytes, 0, stream));
    }
};

class CudaMallocAllocator final : public Allocator {
public:
    void *alloc(size_t bytes, cudaStream_t) override
    {
        void *p;
        CK_CUDA(cudaMalloc(&p, bytes));
        return p;
    }
    void dealloc(void *ptr, size_t, cudaStream_t) override { CK_CUDA(cudaFree(ptr)); }
};

/* The device's default pool; main() has set its release threshold to
 * UINT64_MAX so that synchronising does not hand its memory back. */
class MallocAsyncAllocator final : public Allocator {
public:
    void *alloc(size_t bytes, cudaStream_t stream) override
    {
        void *p;
        CK_CUDA(cudaMallocAsync(&p, bytes, stream));
        return p;
    }
    void dealloc(void *ptr, size_t, cudaStream_t stream) override
    {
        CK_CUDA(cudaFreeAsync(ptr, stream));
    }
};

class CubAllocator final : public Allocator {
    std::unique_ptr<cub::CachingDeviceAllocator> cub_;

public:
    explicit CubAllocator(cub::CachingDeviceAllocator *cub) : cub_(cub) {}
    ~CubAllocator() override
    {
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cub_->FreeAllCached()); /* the destructor would too, but unchecked */
    }
    void *alloc(size_t bytes, cudaStream_t stream) override
    {
        void *p;
        CK_CUDA(cub_->DeviceAllocate(&p, bytes, stream));
        return p;
    }
    void dealloc(void *ptr, size_t, cudaStream_t) override { CK_CUDA(cub_->DeviceFree(ptr)); }
};

/* ------------------------------------------------------------------------ */
/* Workloads                                                                */
/* ------------------------------------------------------------------------ */

constexpr int kThreadCounts[] = {1, 2, 4, 8, 16};
constexpr int kNumThreadCounts = (int)(sizeof kThreadCounts / sizeof kThreadCounts[0]);
constexpr int kMaxThreads = 16;

/* Pair counts. Each measurement first runs a short calibration, then takes
 * the number of pairs that makes one repeat last about target_ns, within
 * [min, max]: fast allocators get many pairs (less noise), slow ones few, so
 * the whole run stays within minutes (cudaMallocAsync from 16 threads costs
 * ~100 us a pair on an H100). ns per pair does not depend on the count. */
struct Limits {
    size_t a_min, a_max;       /* (a): pairs per repeat */
    size_t c_min, c_max;       /* (c): pairs per thread per repeat */
    size_t a_calib, c_calib;   /* pairs of the calibration run */
    double target_ns;          /* how long one repeat should last */
};

Limits limits_for(bool quick)
{
    if (quick)
        return {100, 20000, 50, 10000, 200, 50, 2e7};
    return {1000, 200000, 200, 100000, 1000, 200, 2e8};
}

size_t pick_pairs(double ns_per_pair, size_t lo, size_t hi, double target_ns)
{
    double n = target_ns / std::max(ns_per_pair, 1.0);
    return n < (double)lo ? lo : n > (double)hi ? hi : (size_t)n;
}

struct Workload {
    std::vector<size_t> sizes;        /* (a): prefix; (b): prefix; (c): thread t's slice */
    std::vector<uint32_t> free_order; /* (b): a shuffled order of the live allocations */
    std::vector<void *> live_ptrs;    /* (b): scratch */
    size_t live = 0;                  /* (b): number of live allocations */
    size_t live_bytes = 0;            /* (b): their total, rounded up to 256 B each */
};

Workload make_workload(bool quick)
{
    Workload w;
    Limits lim = limits_for(quick);
    w.live = quick ? 2000 : 20000;
    size_t n = std::max({lim.a_max, w.live, (size_t)kMaxThreads * lim.c_max});
    SplitMix64 rng{kSeed};
    w.sizes.resize(n);
    for (size_t &s : w.sizes)
        s = log_uniform_size(rng);
    for (size_t i = 0; i < w.live; i++)
        w.live_bytes += (w.sizes[i] + 255) / 256 * 256;
    /* Free in random order, not LIFO: that is what a pool must coalesce. */
    w.free_order.resize(w.live);
    for (size_t i = 0; i < w.live; i++)
        w.free_order[i] = (uint32_t)i;
    for (size_t i = w.live - 1; i > 0; i--)
        std::swap(w.free_order[i], w.free_order[rng.next() % (i + 1)]);
    w.live_ptrs.resize(w.live);
    return w;
}

/* (a) Allocate+free pairs. The stream is synchronised after the clock stops:
 * we measure what the host pays, not the stream-ordered frees' device side.
 * Returns ns per pair. */
__attribute__((noinline)) double run_pairs(Allocator &a, const size_t *sizes, size_t n,
                                           cudaStream_t stream)
{
    int64_t t0 = now_ns();
    for (size_t i = 0; i < n; i++) {
        void *p = a.alloc(sizes[i], stream);
        a.dealloc(p, sizes[i], stream);
    }
    int64_t t1 = now_ns();
    CK_CUDA(cudaStreamSynchronize(stream));
    return (double)(t1 - t0) / (double)n;
}

/* (b) w.live allocations, then all freed in shuffled order; both phases are
 * timed. Returns ns per pair. */
__attribute__((noinline)) double run_live(Allocator &a, Workload &w, cudaStream_t stream)
{
    const size_t *sizes = w.sizes.data();
    void **ptrs = w.live_ptrs.data();
    int64_t t0 = now_ns();
    for (size_t i = 0; i < w.live; i++)
        ptrs[i] = a.alloc(sizes[i], stream);
    for (size_t k = 0; k < w.live; k++) {
        uint32_t i = w.free_order[k];
        a.dealloc(ptrs[i], sizes[i], stream);
    }
    int64_t t1 = now_ns();
    CK_CUDA(cudaStreamSynchronize(stream));
    return (double)(t1 - t0) / (double)w.live;
}

struct ThreadResult {
    double ns_per_pair; /* per thread: wall time / pairs per thread */
    double mpairs_s;    /* all threads together */
};

/* (c) nthreads OpenMP threads, thread t on streams[t] with its own slice of
 * sizes, n pairs each. Wall time runs from the first thread's start to the
 * last thread's end, after a barrier. */
ThreadResult run_threads(Allocator &a, const Workload &w, size_t n, int nthreads,
                         const std::vector<cudaStream_t> &streams)
{
    std::vector<int64_t> start(nthreads), end(nthreads);
#pragma omp parallel num_threads(nthreads)
    {
        if (omp_get_num_threads() != nthreads)
            die("asked OpenMP for %d threads, got %d (OMP_THREAD_LIMIT?)", nthreads,
                omp_get_num_threads());
        int t = omp_get_thread_num();
        const size_t *sizes = w.sizes.data() + (size_t)t * n;
        cudaStream_t stream = streams[t];
#pragma omp barrier
        int64_t t0 = now_ns();
        for (size_t i = 0; i < n; i++) {
            void *p = a.alloc(sizes[i], stream);
            a.dealloc(p, sizes[i], stream);
        }
        int64_t t1 = now_ns();
        start[t] = t0;
        end[t] = t1;
    }
    for (int t = 0; t < nthreads; t++)
        CK_CUDA(cudaStreamSynchronize(streams[t]));
    double wall = (double)(*std::max_element(end.begin(), end.end()) -
                           *std::min_element(start.begin(), start.end()));
    return {wall / (double)n, (double)nthreads * (double)n / wall * 1e3};
}

/* ------------------------------------------------------------------------ */
/* The run                                                                  */
/* ------------------------------------------------------------------------ */

struct Options {
    bool quick = false;
    bool cub = true;
    bool cuda_malloc = true;
    int repeats = 5;
    const char *out = nullptr;
    std::vector<std::string> only; /* --only: rows whose name contains one of these */
};

struct Candidate {
    std::string name;
    std::function<std::unique_ptr<Allocator>()> make;
    int max_threads = kMaxThreads; /* (c): more threads are "skipped" */
    bool baseline = false;         /* the "loop only" row: no speed-up shown */
};

struct Row {
    std::string name;
    bool baseline = false;
    size_t pairs_a = 0;
    double a_ns = 0, b_ns = 0;
    bool c_done[kNumThreadCounts] = {};
    size_t c_pairs[kNumThreadCounts] = {};
    double c_ns[kNumThreadCounts] = {}, c_mpairs[kNumThreadCounts] = {};
};

std::string fmt_rate(double mpairs);

void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void progress(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("rankmem-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Runs fn repeats+1 times and returns the median of all runs but the first,
 * which is the warm-up (first touch of the pool's blocks on this stream, of
 * CUB's bins, of the runtime's lazy state), with the range for the log. */
template <class F> double median_of(int repeats, F fn, double *min_p, double *max_p)
{
    std::vector<double> v;
    for (int r = 0; r <= repeats; r++) {
        double x = fn();
        if (r > 0)
            v.push_back(x);
    }
    *min_p = *std::min_element(v.begin(), v.end());
    *max_p = *std::max_element(v.begin(), v.end());
    return median(v);
}

Row measure(const Candidate &c, Workload &w, const Options &opt,
            const std::vector<cudaStream_t> &streams, cudaMemPool_t default_pool)
{
    const Limits lim = limits_for(opt.quick);
    const char *name = c.name.c_str();
    Row row;
    row.name = c.name;
    row.baseline = c.baseline;
    double lo, hi;
    std::unique_ptr<Allocator> a = c.make();

    /* Calibrate twice: the first run pays the cold start (the runtime's
     * first mappings, CUB's first cudaMallocs) and would pick too few pairs. */
    double calib = run_pairs(*a, w.sizes.data(), lim.a_calib, streams[0]);
    calib = run_pairs(*a, w.sizes.data(), lim.a_calib, streams[0]);
    row.pairs_a = pick_pairs(calib, lim.a_min, lim.a_max, lim.target_ns);
    row.a_ns = median_of(opt.repeats, [&] {
        return run_pairs(*a, w.sizes.data(), row.pairs_a, streams[0]);
    }, &lo, &hi);
    progress("%-40s (a) %12.1f ns/pair         [%.1f .. %.1f], %zu pairs", name, row.a_ns, lo,
             hi, row.pairs_a);

    row.b_ns = median_of(opt.repeats, [&] { return run_live(*a, w, streams[0]); }, &lo, &hi);
    progress("%-40s (b) %12.1f ns/pair         [%.1f .. %.1f], %zu live", name, row.b_ns, lo, hi,
             w.live);

    for (int i = 0; i < kNumThreadCounts; i++) {
        int nt = kThreadCounts[i];
        if (nt > c.max_threads)
            continue;
        ThreadResult cal = run_threads(*a, w, lim.c_calib, nt, streams);
        cal = run_threads(*a, w, lim.c_calib, nt, streams);
        size_t n = pick_pairs(cal.ns_per_pair, lim.c_min, lim.c_max, lim.target_ns);
        std::vector<double> rates;
        row.c_ns[i] = median_of(opt.repeats, [&] {
            ThreadResult r = run_threads(*a, w, n, nt, streams);
            rates.push_back(r.mpairs_s);
            return r.ns_per_pair;
        }, &lo, &hi);
        rates.erase(rates.begin()); /* the warm-up */
        row.c_mpairs[i] = median(rates);
        row.c_pairs[i] = n;
        row.c_done[i] = true;
        progress("%-40s (c) %12.1f ns/pair/thread  [%.1f .. %.1f], %2d threads x %zu pairs, "
                 "%s Mpairs/s", name, row.c_ns[i], lo, hi, nt, n,
                 fmt_rate(row.c_mpairs[i]).c_str());
    }

    a.reset();
    /* Give the default pool's memory back so the next allocator finds the
     * device as empty as this one did. */
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaMemPoolTrimTo(default_pool, 0));
    return row;
}

/* ------------------------------------------------------------------------ */
/* Report                                                                   */
/* ------------------------------------------------------------------------ */

std::string strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

/* 1,234,567 */
std::string with_commas(uint64_t v)
{
    std::string s = std::to_string(v);
    for (int i = (int)s.size() - 3; i > 0; i -= 3)
        s.insert((size_t)i, ",");
    return s;
}

/* Three significant digits at most where it matters, no false precision. */
std::string fmt_ns(double ns)
{
    if (ns < 10)
        return strf("%.2f", ns);
    if (ns < 1000)
        return strf("%.1f", ns);
    return with_commas((uint64_t)std::llround(ns));
}

std::string fmt_rate(double mpairs)
{
    if (mpairs < 1)
        return strf("%.3f", mpairs);
    if (mpairs < 100)
        return strf("%.2f", mpairs);
    return strf("%.1f", mpairs);
}

std::string cuda_version(int v) { return strf("%d.%d", v / 1000, (v % 1000) / 10); }

std::string cpu_model()
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return "unknown";
    char line[512];
    std::string model = "unknown";
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *colon = strchr(line, ':');
            if (colon) {
                model = colon + 1;
                model.erase(0, model.find_first_not_of(" \t"));
                model.erase(model.find_last_not_of(" \t\n") + 1);
            }
            break;
        }
    }
    fclose(f);
    return model;
}

/* The command line as a shell would need it typed. */
std::string command_line(int argc, char **argv)
{
    std::string s;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        bool plain = *arg != '\0';
        for (const char *p = arg; *p; p++)
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%",
                        *p))
                plain = false;
        if (i)
            s += ' ';
        if (plain) {
            s += arg;
        } else {
            s += '\'';
            for (const char *p = arg; *p; p++)
                s += *p == '\'' ? std::string("'\\''") : std::string(1, *p);
            s += '\'';
        }
    }
    return s;
}

std::string host_compiler()
{
#if defined(__clang__)
    return strf("clang %d.%d.%d", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
    return strf("gcc %d.%d.%d", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
    return "unknown";
#endif
}

struct RunInfo {
    std::string device, driver, runtime, cpu, compiler, rankmem, date, cmdline, omp_env;
    size_t pool_bytes = 0;
};

std::string env_or_unset(const char *name)
{
    const char *v = getenv(name);
    return v ? strf("`%s`", v) : std::string("unset");
}

/* "3.4× faster" than the reference, or "12× slower". */
std::string speedup(double ref_ns, double ns)
{
    double x = ref_ns / ns, r = x >= 1 ? x : 1 / x;
    std::string num = r < 10 ? strf("%.2g", r) : strf("%.0f", r);
    if (num == "1")
        return "1×";
    return num + (x >= 1 ? "× faster" : "× slower");
}

std::string report(const RunInfo &info, const std::vector<Row> &rows, const Workload &w,
                   const Options &opt)
{
    const Limits lim = limits_for(opt.quick);
    std::string s;
    s += "# rankmem benchmarks: allocators\n\n";
    if (opt.quick)
        s += "**A `--quick` run: a smoke test, not a result.**\n\n";
    s += "Written by `bench/rankmem-bench`; do not edit by hand. To refresh, on a GPU machine:\n"
         "`make bench && bench/rankmem-bench --out docs/benchmarks-allocators.md`; the targets are in\n"
         "[benchmarks.md](benchmarks.md).\n"
         "`bench/README.md` says what is measured and why.\n\n";
    s += "| | |\n| --- | --- |\n";
    s += "| device | " + info.device + " |\n";
    s += "| CUDA driver / runtime | " + info.driver + " / " + info.runtime + " |\n";
    s += "| host CPU | " + info.cpu + " |\n";
    s += "| compiler | " + info.compiler + " |\n";
    s += "| rankmem | " + info.rankmem + " |\n";
    s += "| date | " + info.date + " |\n";
    s += "| command | `" + info.cmdline + "` |\n";
    s += "| OpenMP | " + info.omp_env + " |\n\n";

    /* The reference of the speed-up column: what the design measures against. */
    const Row *ref = nullptr;
    for (const Row &r : rows)
        if (r.name.rfind("cudaMallocAsync", 0) == 0)
            ref = &r;

    s += "## One thread\n\n";
    s += strf("Host time per allocate+free pair in nanoseconds, median of %d repeats after a "
              "warm-up (lower is better). (a): each allocation freed at once. (b): %s "
              "allocations live at once, then all freed in shuffled order; both phases "
              "counted.\n\n",
              opt.repeats, with_commas(w.live).c_str());
    s += "| allocator | (a) ns/pair | (a) vs cudaMallocAsync | (b) ns/pair | (a) pairs |\n";
    s += "| --- | ---: | ---: | ---: | ---: |\n";
    for (const Row &r : rows) {
        std::string vs = ref && !r.baseline ? speedup(ref->a_ns, r.a_ns) : "";
        s += "| " + r.name + " | " + fmt_ns(r.a_ns) + " | " + vs + " | " + fmt_ns(r.b_ns) +
             " | " + with_commas(r.pairs_a) + " |\n";
    }

    s += "\n## Threads\n\n";
    s += strf("(c): 1 to %d OpenMP threads, each on its own non-blocking stream with its own "
              "sizes, doing pairs as in (a). Median of %d repeats after a warm-up. "
              "\"skipped\": too slow to be worth the minutes.\n\n",
              kMaxThreads, opt.repeats);
    std::string head = "| allocator |", rule = "| --- |";
    for (int i = 0; i < kNumThreadCounts; i++) {
        head += strf(" %d %s |", kThreadCounts[i], kThreadCounts[i] == 1 ? "thread" : "threads");
        rule += " ---: |";
    }
    for (int table = 0; table < 2; table++) {
        s += table == 0 ? "Nanoseconds per pair per thread: wall time / pairs per thread "
                          "(lower is better; flat means it scales):\n\n"
                        : "\nMillion pairs per second, all threads together (higher is "
                          "better):\n\n";
        s += head + "\n" + rule + "\n";
        for (const Row &r : rows) {
            s += "| " + r.name + " |";
            for (int i = 0; i < kNumThreadCounts; i++) {
                if (!r.c_done[i])
                    s += " skipped |";
                else
                    s += " " + (table == 0 ? fmt_ns(r.c_ns[i]) : fmt_rate(r.c_mpairs[i])) + " |";
            }
            s += "\n";
        }
    }

    s += "\n## How it was measured\n\n";
    s += strf("- Sizes: log-uniform between %zu B and %zu KiB (splitmix64, seed %llu), drawn "
              "before any timing; default alignment (256 B).\n",
              kMinBytes, kMaxBytes >> 10, (unsigned long long)kSeed);
    s += "- Clock: `std::chrono::steady_clock` around the loop alone. The stream is "
         "synchronised after the clock stops, so stream-ordered frees count by their host "
         "cost; no kernels run.\n";
    s += "- Streams: (a) and (b) run on one non-blocking stream (`cudaStreamCreateWithFlags`), "
         "(c) on one per thread; rankmem is called through `rankmem_allocate_async` / "
         "`rankmem_deallocate_async` with that stream.\n";
    s += strf("- Pairs: a short calibration run picks how many pairs make one repeat last about "
              "%.0f ms: (a) %s to %s pairs, (c) %s to %s per thread. The warm-up is one "
              "untimed repeat of the same size.\n",
              lim.target_ns / 1e6, with_commas(lim.a_min).c_str(),
              with_commas(lim.a_max).c_str(), with_commas(lim.c_min).c_str(),
              with_commas(lim.c_max).c_str());
    s += "- Every allocator is called through the same virtual function; *loop only* is that "
         "harness with an allocator that does nothing.\n";
    s += strf("- rankmem pool: `rankmem_pool_create`, initial size %zu GiB ((b) holds %.1f GiB "
              "live), so it never grows while timed. *rankmem async* is rankmem's resource over "
              "`cudaMallocAsync`, without a pool: the cost of rankmem's dispatch over the "
              "runtime.\n",
              info.pool_bytes >> 30, (double)w.live_bytes / (double)(size_t(1) << 30));
    s += "- cudaMallocAsync: the device's default pool with release threshold `UINT64_MAX`; "
         "the rankmem rows that say *default pool* use it too. It is trimmed between "
         "allocators, and one allocator at a time holds memory.\n";
    s += "- CUB: `cub::CachingDeviceAllocator`. Its defaults (bins 8^3..8^7 = 512 B..2 MiB, "
         "at most 6 MB cached) send requests above 2 MiB, and frees past the cache limit, to "
         "cudaMalloc/cudaFree; the tuned one (bins 2^8..2^22, no cache limit) caches all "
         "that this workload asks for. Its frees record an event on the stream.\n";
    s += "- cudaMalloc: `cudaMalloc` + `cudaFree` (which synchronises the device).\n";
    return s;
}

/* ------------------------------------------------------------------------ */
/* main                                                                     */
/* ------------------------------------------------------------------------ */

void usage(FILE *f)
{
    fputs("usage: rankmem-bench [--quick] [--out FILE] [--repeats N] [--max-size BYTES] [--no-cub]\n"
          "                     [--no-malloc] [--only TEXT]...\n"
          "  Times allocate+free on the GPU for rankmem's pool, cudaMalloc,\n"
          "  cudaMallocAsync and CUB's caching allocator; prints a Markdown report.\n"
          "  --quick      fewer pairs and repeats: a smoke test, not a result\n"
          "  --out FILE   write the report to FILE (docs/benchmarks.md) instead of stdout\n"
          "  --repeats N  timed repeats per measurement, median reported (default 5)\n"
          "  --max-size BYTES  largest request (default 4194304; 65536 for small sizes)\n"
          "  --no-cub     skip CUB's CachingDeviceAllocator\n"
          "  --no-malloc  skip cudaMalloc/cudaFree (the slowest)\n"
          "  --only TEXT  only the rows whose name contains TEXT (repeatable; the loop-only row\n"
          "               stays): a focused run, not a full report\n"
          "Exit status: 0 done, 1 error, 2 bad usage, 77 no GPU.\n",
          f);
}

Options parse(int argc, char **argv)
{
    Options o;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--quick")) {
            o.quick = true;
        } else if (!strcmp(a, "--max-size") && i + 1 < argc) {
            char *end;
            unsigned long long n = strtoull(argv[++i], &end, 10);
            if (*end || n < 1024 || n > (1ull << 30)) {
                fprintf(stderr, "rankmem-bench: --max-size wants 1024..2^30, not '%s'\n", argv[i]);
                exit(2);
            }
            kMaxBytes = (size_t)n;
        } else if (!strcmp(a, "--only") && i + 1 < argc) {
            o.only.push_back(argv[++i]);
        } else if (!strcmp(a, "--no-cub")) {
            o.cub = false;
        } else if (!strcmp(a, "--no-malloc")) {
            o.cuda_malloc = false;
        } else if (!strcmp(a, "--out") && i + 1 < argc) {
            o.out = argv[++i];
        } else if (!strncmp(a, "--out=", 6) && a[6]) {
            o.out = a + 6;
        } else if (!strcmp(a, "--repeats") && i + 1 < argc) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 1000) {
                fprintf(stderr, "rankmem-bench: --repeats wants 1..1000, not '%s'\n", argv[i]);
                exit(2);
            }
            o.repeats = (int)n;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else {
            fprintf(stderr, "rankmem-bench: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            exit(2);
        }
    }
    return o;
}

} // namespace

int main(int argc, char **argv)
{
    Options opt = parse(argc, argv);
    bool repeats_given = false;
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--repeats", 9))
            repeats_given = true;
    if (opt.quick && !repeats_given)
        opt.repeats = 2;

    int ndev = 0;
    cudaError_t err = cudaGetDeviceCount(&ndev);
    if (err != cudaSuccess || ndev == 0) {
        fprintf(stderr, "rankmem-bench: no GPU (%s)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "no device");
        return 77;
    }
    if (!rankmem_have_cuda())
        die("librankmem was built without CUDA: reconfigure it --with-cuda");

    /* Open the output before minutes of measuring, not after. */
    std::string tmp_path;
    FILE *out = stdout;
    if (opt.out) {
        tmp_path = std::string(opt.out) + ".tmp";
        out = fopen(tmp_path.c_str(), "w");
        if (!out)
            die("cannot write %s: %s", tmp_path.c_str(), strerror(errno));
        g_tmp_path = tmp_path.c_str();
    }

    int dev;
    CK_CUDA(cudaGetDevice(&dev));
    CK_CUDA(cudaFree(nullptr)); /* create the context outside every timing */
    omp_set_dynamic(0);         /* (c) needs exactly the threads it asks for */

    RunInfo info;
    {
        cudaDeviceProp prop;
        CK_CUDA(cudaGetDeviceProperties(&prop, dev));
        info.device = strf("%s (device %d, compute capability %d.%d, %.1f GiB, %d SMs)",
                           prop.name, dev, prop.major, prop.minor,
                           (double)prop.totalGlobalMem / (double)(size_t(1) << 30),
                           prop.multiProcessorCount);
        int v;
        CK_CUDA(cudaDriverGetVersion(&v));
        info.driver = cuda_version(v);
        CK_CUDA(cudaRuntimeGetVersion(&v));
        info.runtime = cuda_version(v);
        info.cpu = strf("%s (%ld online CPUs)", cpu_model().c_str(),
                        sysconf(_SC_NPROCESSORS_ONLN));
        info.compiler = strf("nvcc %d.%d.%d, host %s, CUB %d.%d.%d", __CUDACC_VER_MAJOR__,
                             __CUDACC_VER_MINOR__, __CUDACC_VER_BUILD__,
                             host_compiler().c_str(), CUB_VERSION / 100000,
                             CUB_VERSION / 100 % 1000, CUB_VERSION % 100);
        int ma, mi, pa;
        CK_RM(rankmem_version(&ma, &mi, &pa));
        info.rankmem = strf("%d.%d.%d", ma, mi, pa);
        char date[64];
        time_t t = time(nullptr);
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
        info.date = date;
        info.cmdline = command_line(argc, argv);
        info.omp_env = strf("max threads %d; OMP_PROC_BIND %s, OMP_PLACES %s",
                            omp_get_max_threads(), env_or_unset("OMP_PROC_BIND").c_str(),
                            env_or_unset("OMP_PLACES").c_str());
    }

    Workload w = make_workload(opt.quick);

    /* The pool must hold (b)'s live set without growing: growth would time a
     * cudaMalloc of gigabytes. 25% room for alignment and fragmentation. */
    const size_t GiB = size_t(1) << 30;
    info.pool_bytes = std::max(8 * GiB, (w.live_bytes + w.live_bytes / 4 + GiB - 1) / GiB * GiB);
    {
        size_t free_b, total_b;
        CK_CUDA(cudaMemGetInfo(&free_b, &total_b));
        if (free_b < info.pool_bytes + GiB)
            die("%.1f GiB free on the device; the benchmark needs %zu GiB", (double)free_b / GiB,
                info.pool_bytes / GiB + 1);
    }

    /* Keep everything the default pool gets between synchronisations, as a
     * long-running code would configure it. */
    cudaMemPool_t default_pool;
    CK_CUDA(cudaDeviceGetDefaultMemPool(&default_pool, dev));
    uint64_t threshold = UINT64_MAX;
    CK_CUDA(cudaMemPoolSetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &threshold));

    std::vector<cudaStream_t> streams(kMaxThreads);
    for (cudaStream_t &s : streams)
        CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    const size_t pool_bytes = info.pool_bytes;
    std::vector<Candidate> cands;
    /* A pool over cudaMalloc, large enough that it never grows while timed. */
    auto pool_over_cuda = [&] {
        rankmem_resource_t *up, *pool;
        rankmem_pool_params_t p;
        CK_RM(rankmem_cuda_create(&up));
        CK_RM(rankmem_pool_params_default(&p));
        p.initial_size = pool_bytes;
        CK_RM(rankmem_pool_create(up, &p, &pool));
        CK_RM(rankmem_resource_release(up)); /* the pool holds its own reference */
        return pool;
    };
    cands.push_back({"rankmem pool > cuda", [&] {
        return std::unique_ptr<Allocator>(new RankmemAllocator(pool_over_cuda(), true, streams));
    }});
    cands.push_back({"rankmem pool > async (default pool)", [&] {
        rankmem_resource_t *up, *pool;
        rankmem_pool_params_t p;
        CK_RM(rankmem_async_create(nullptr, &up));
        CK_RM(rankmem_pool_params_default(&p));
        p.initial_size = pool_bytes;
        CK_RM(rankmem_pool_create(up, &p, &pool));
        CK_RM(rankmem_resource_release(up));
        return std::unique_ptr<Allocator>(new RankmemAllocator(pool, true, streams));
    }});
    /* Adaptors over the same pool: what stats and tracking add per pair. */
    cands.push_back({"rankmem stats > pool > cuda", [&] {
        rankmem_resource_t *pool = pool_over_cuda(), *st;
        CK_RM(rankmem_stats_create(pool, &st));
        CK_RM(rankmem_resource_release(pool));
        return std::unique_ptr<Allocator>(new RankmemAllocator(st, true, streams));
    }});
    /* The MPI plugin's default chain: stats over its timing layer, which
     * times one call in `period` (RANKMEM_TIMING_SAMPLE; the row with 1/N
     * shows what another sampling period would cost). */
    auto stats_timing = [&](const char *name, unsigned period) {
        cands.push_back({name, [&pool_over_cuda, &streams, period] {
            rankmem_resource_t *pool = pool_over_cuda(), *tm, *st;
            CK_RM(rk_mpi_timing_create(pool, &tm));
            CK_RM(rankmem_resource_release(pool));
            if (period)
                CK_RM(rk_mpi_timing_set_period(tm, period));
            CK_RM(rankmem_stats_create(tm, &st));
            CK_RM(rk_mpi_timing_count_from(tm, st)); /* as the plugin builds it */
            CK_RM(rankmem_resource_release(tm));
            return std::unique_ptr<Allocator>(new RankmemAllocator(st, true, streams));
        }});
    };
    stats_timing("rankmem stats > timing > pool > cuda", 0);
    stats_timing("rankmem stats > timing(1/128) > pool > cuda", 128);
    cands.push_back({"rankmem tracking > pool > cuda", [&] {
        rankmem_resource_t *pool = pool_over_cuda(), *tr;
        CK_RM(rankmem_tracking_create(pool, 0, &tr));
        CK_RM(rankmem_resource_release(pool));
        return std::unique_ptr<Allocator>(new RankmemAllocator(tr, true, streams));
    }});
    /* The suballocators, built from spec strings as users write them. */
    auto from_spec = [&](const char *name, std::string spec, bool has_pool) {
        cands.push_back({name, [&streams, spec, has_pool] {
            rankmem_resource_t *mr;
            CK_RM(rankmem_resource_from_spec(spec.c_str(), &mr));
            return std::unique_ptr<Allocator>(new RankmemAllocator(mr, has_pool, streams));
        }});
    };
    std::string pool_spec = "pool(initial=" + std::to_string(pool_bytes >> 20) + "MiB)>cuda";
    /* The pool over the virtual memory API, warmed up like the pool: a
     * first allocation of pool_bytes maps that much before timing. */
    auto warm_vmm = [&] {
        rankmem_resource_t *mr;
        void *warm;
        CK_RM(rankmem_resource_from_spec("vmm", &mr));
        CK_RM(rankmem_allocate(mr, pool_bytes, 0, &warm));
        CK_RM(rankmem_deallocate(mr, warm, pool_bytes, 0));
        return mr;
    };
    cands.push_back({"rankmem vmm", [&] {
        return std::unique_ptr<Allocator>(new RankmemAllocator(warm_vmm(), true, streams));
    }});
    cands.push_back({"rankmem stats > timing > vmm", [&] {
        rankmem_resource_t *mr = warm_vmm(), *tm, *st;
        CK_RM(rk_mpi_timing_create(mr, &tm));
        CK_RM(rankmem_resource_release(mr));
        CK_RM(rankmem_stats_create(tm, &st));
        CK_RM(rk_mpi_timing_count_from(tm, st));
        CK_RM(rankmem_resource_release(tm));
        return std::unique_ptr<Allocator>(new RankmemAllocator(st, true, streams));
    }});
    from_spec("rankmem arena > cuda", "arena>cuda", false);
    from_spec("rankmem binning > pool > cuda", "binning(min=2^8,max=2^22)>" + pool_spec, true);
    from_spec("rankmem caching, CUB defaults > cuda", "caching>cuda", false);
    from_spec("rankmem caching (2^8..2^22, no cap) > cuda",
              "caching(growth=2,min=8,max=22,cap=2^60)>cuda", false);
    /* Not a pool: rankmem's dispatch over cudaMallocAsync, i.e. what the
     * library adds on top of the row below it. */
    cands.push_back({"rankmem async (default pool)", [&] {
        rankmem_resource_t *mr;
        CK_RM(rankmem_async_create(nullptr, &mr));
        return std::unique_ptr<Allocator>(new RankmemAllocator(mr, false, streams));
    }});
    cands.push_back({"cudaMallocAsync (default pool)",
                     [] { return std::unique_ptr<Allocator>(new MallocAsyncAllocator); }});
    if (opt.cub) {
        cands.push_back({"CUB caching, tuned (2^8..2^22, no limit)", [] {
            auto *c = new cub::CachingDeviceAllocator(2, 8, 22,
                                                      cub::CachingDeviceAllocator::INVALID_SIZE);
            return std::unique_ptr<Allocator>(new CubAllocator(c));
        }});
        cands.push_back({"CUB caching, defaults", [] {
            return std::unique_ptr<Allocator>(new CubAllocator(new cub::CachingDeviceAllocator));
        }});
    }
    if (opt.cuda_malloc)
        /* cudaFree synchronises the whole device: from 8 threads on it
         * would cost minutes and say nothing new. */
        cands.push_back({"cudaMalloc + cudaFree",
                         [] { return std::unique_ptr<Allocator>(new CudaMallocAllocator); }, 4});
    cands.push_back({"loop only (no allocation)",
                     [] { return std::unique_ptr<Allocator>(new NullAllocator); }, kMaxThreads,
                     true});

    if (!opt.only.empty()) {
        std::vector<Candidate> kept;
        for (const Candidate &c : cands) {
            bool keep = c.baseline;
            for (const std::string &t : opt.only)
                keep = keep || c.name.find(t) != std::string::npos;
            if (keep)
                kept.push_back(c);
        }
        cands.swap(kept);
    }
    progress("%s, %zu allocators, %d repeats%s", info.device.c_str(), cands.size(), opt.repeats,
             opt.quick ? " (--quick: a smoke test, not a result)" : "");
    /* The first allocator measured used to pay for the process warming up
     * (clocks, first touch of the runtime's and the library's state): one
     * unreported run of it first. */
    progress("warm-up run of %s (not reported)", cands[0].name.c_str());
    (void)measure(cands[0], w, opt, streams, default_pool);
    std::vector<Row> rows;
    for (const Candidate &c : cands)
        rows.push_back(measure(c, w, opt, streams, default_pool));

    for (cudaStream_t s : streams)
        CK_CUDA(cudaStreamDestroy(s));

    std::string doc = report(info, rows, w, opt);
    if (fputs(doc.c_str(), out) == EOF || fflush(out) != 0)
        die("cannot write the report: %s", strerror(errno));
    if (opt.out) {
        if (fclose(out) != 0)
            die("cannot write %s: %s", tmp_path.c_str(), strerror(errno));
        if (rename(tmp_path.c_str(), opt.out) != 0)
            die("cannot rename %s to %s: %s", tmp_path.c_str(), opt.out, strerror(errno));
        g_tmp_path = nullptr;
        progress("wrote %s", opt.out);
    }
    return 0;
}
