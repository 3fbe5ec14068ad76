/* rankmem.hpp: the C++ face of rankmem (C++17, header-only, namespace rankmem).
 *
 *   rankmem::resource          RAII handle on a resource or a whole chain
 *                              (copy = retain, destroy = release, move = steal)
 *   rankmem::system(), pool(up), from_spec("stats>pool>cuda"), ...
 *                              builders returning handles
 *   rankmem::pmr_resource      std::pmr::memory_resource over a host-accessible resource
 *   rankmem::stream_allocator<T>       typed, stream-ordered: allocate(n, stream)
 *   rankmem::stream_bound_allocator<T> the above bound to one stream: a standard
 *                              Allocator for containers (std::vector, ...)
 *   rankmem::thrust_allocator<T>       (nvcc only) the same for thrust::device_vector
 *   rankmem::error             what a failing call throws (status() = rankmem_status_t);
 *   rankmem::out_of_memory     a std::bad_alloc, for RANKMEM_ERR_OUT_OF_MEMORY and _LIMIT
 *
 * Allocators and adaptors compare equal when their resources do
 * (rankmem_resource_is_equal: memory from one may be freed through the
 * other). Deallocation never throws (standard allocators may not, and
 * containers free from destructors): a failure there is left in
 * rankmem_last_error(). Only rankmem's C API is used: the library is the
 * same librankmem, linked with -lrankmem. See docs/cxx.md. */
#ifndef RANKMEM_HPP
#define RANKMEM_HPP

#if !defined(__cplusplus) || (__cplusplus < 201703L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 201703L))
#error "rankmem.hpp needs C++17 (e.g. -std=c++17)"
#endif

#include <rankmem.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory_resource>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace rankmem {

using stream_t = rankmem_stream_t; // same type as cudaStream_t; nullptr = default stream
using status_t = rankmem_status_t;
using query_t = rankmem_query_t;

// ---- errors ------------------------------------------------------------------

// A failed rankmem call: status() says which kind, what() the call and
// rankmem_last_error()'s detail.
class error : public std::runtime_error {
  public:
    error(status_t status, const std::string &what) : std::runtime_error(what), status_(status) {}
    status_t status() const noexcept { return status_; }

  private:
    status_t status_;
};

// Out of memory (or a limit adaptor's limit reached): a std::bad_alloc, as
// containers and their users expect, that still says what failed.
class out_of_memory : public std::bad_alloc {
  public:
    out_of_memory(status_t status, const std::string &what) : status_(status), what_(what) {}
    const char *what() const noexcept override { return what_.what(); }
    status_t status() const noexcept { return status_; }

  private:
    status_t status_;
    std::runtime_error what_; // its copy never throws: exceptions must copy safely
};

namespace detail {

[[noreturn]] inline void throw_status(status_t st, const char *call)
{
    std::string msg(call);
    const char *detail = rankmem_last_error();
    msg += ": ";
    msg += detail && *detail ? detail : rankmem_status_string(st);
    if (st == RANKMEM_ERR_OUT_OF_MEMORY || st == RANKMEM_ERR_LIMIT)
        throw out_of_memory(st, msg);
    throw error(st, msg);
}

inline void check(status_t st, const char *call)
{
    if (st != RANKMEM_SUCCESS)
        throw_status(st, call);
}

// RANKMEM_DEFAULT_ALIGNMENT without its C cast (for -Wold-style-cast users).
constexpr std::size_t default_alignment = 256;

// Containers may ask for 0 elements; rankmem refuses 0 bytes. One byte
// stands in, on both sides, so that the pair stays consistent.
inline std::size_t nonzero(std::size_t bytes) noexcept { return bytes ? bytes : 1; }

} // namespace detail

// ---- resource handles ----------------------------------------------------------

// One reference to a resource (and so to its chain of upstreams). Empty
// when default-constructed or moved from; calls on an empty handle throw
// rankmem::error(RANKMEM_ERR_INVALID_ARGUMENT).
class resource {
  public:
    resource() noexcept = default;

    // Takes over a reference the caller owns (what a C constructor returned).
    static resource adopt(rankmem_resource_t *mr) noexcept
    {
        resource r;
        r.mr_ = mr;
        return r;
    }
    // Takes a new reference (rankmem_resource_retain) on a borrowed pointer.
    static resource borrow(rankmem_resource_t *mr)
    {
        if (mr)
            detail::check(rankmem_resource_retain(mr), "rankmem_resource_retain");
        return adopt(mr);
    }

    resource(const resource &other) : mr_(other.mr_)
    {
        if (mr_)
            detail::check(rankmem_resource_retain(mr_), "rankmem_resource_retain");
    }
    resource(resource &&other) noexcept : mr_(std::exchange(other.mr_, nullptr)) {}
    resource &operator=(const resource &other)
    {
        resource tmp(other);
        swap(tmp);
        return *this;
    }
    resource &operator=(resource &&other) noexcept
    {
        resource tmp(std::move(other));
        swap(tmp);
        return *this;
    }
    // Releasing the last reference of a chain with live allocations
    // reclaims them and reports RANKMEM_ERR_BUSY, which a destructor cannot
    // throw: call reset_checked() to see it.
    ~resource() { reset(); }

    void reset() noexcept
    {
        if (mr_)
            (void)rankmem_resource_release(std::exchange(mr_, nullptr));
    }
    // reset(), throwing what the release reported (RANKMEM_ERR_BUSY: leaks).
    void reset_checked()
    {
        if (mr_)
            detail::check(rankmem_resource_release(std::exchange(mr_, nullptr)),
                          "rankmem_resource_release");
    }
    // Gives up the reference without releasing it (for C code that will).
    rankmem_resource_t *detach() noexcept { return std::exchange(mr_, nullptr); }
    void swap(resource &other) noexcept { std::swap(mr_, other.mr_); }

    rankmem_resource_t *get() const noexcept { return mr_; }
    explicit operator bool() const noexcept { return mr_ != nullptr; }

    // alignment 0: RANKMEM_DEFAULT_ALIGNMENT. Stream-ordered as in C.
    void *allocate(std::size_t bytes, std::size_t alignment = 0, stream_t stream = nullptr) const
    {
        void *p = nullptr;
        detail::check(rankmem_allocate_async(mr_, bytes, alignment, stream, &p),
                      "rankmem_allocate_async");
        return p;
    }
    void deallocate(void *p, std::size_t bytes, std::size_t alignment = 0,
                    stream_t stream = nullptr) const
    {
        detail::check(rankmem_deallocate_async(mr_, p, bytes, alignment, stream),
                      "rankmem_deallocate_async");
    }

    std::size_t query(query_t what) const
    {
        std::size_t v = 0;
        detail::check(rankmem_resource_query(mr_, what, &v), "rankmem_resource_query");
        return v;
    }
    void trim(std::size_t keep_bytes = 0) const
    {
        detail::check(rankmem_resource_trim(mr_, keep_bytes), "rankmem_resource_trim");
    }
    void forget_stream(stream_t stream) const
    {
        detail::check(rankmem_resource_forget_stream(mr_, stream),
                      "rankmem_resource_forget_stream");
    }

    std::string name() const
    {
        const char *n = nullptr;
        detail::check(rankmem_resource_name(mr_, &n), "rankmem_resource_name");
        return n ? n : "";
    }
    int device() const
    {
        int d = 0;
        detail::check(rankmem_resource_device(mr_, &d), "rankmem_resource_device");
        return d;
    }
    unsigned properties() const
    {
        unsigned p = 0;
        detail::check(rankmem_resource_properties(mr_, &p), "rankmem_resource_properties");
        return p;
    }
    bool host_accessible() const { return properties() & RANKMEM_PROP_HOST_ACCESSIBLE; }
    bool device_accessible() const { return properties() & RANKMEM_PROP_DEVICE_ACCESSIBLE; }
    bool stream_ordered() const { return properties() & RANKMEM_PROP_STREAM_ORDERED; }

    // The next resource down the chain (empty for a leaf).
    resource upstream() const
    {
        rankmem_resource_t *up = nullptr;
        detail::check(rankmem_resource_upstream(mr_, &up), "rankmem_resource_upstream");
        return borrow(up);
    }
    // The chain in spec syntax ("stats>pool>cuda").
    std::string describe() const
    {
        std::size_t needed = 0;
        char small[256];
        if (rankmem_resource_describe(mr_, small, sizeof small, &needed) == RANKMEM_SUCCESS)
            return small;
        if (!mr_ || needed < sizeof small) // a real failure, not a short buffer
            detail::check(rankmem_resource_describe(mr_, small, sizeof small, nullptr),
                          "rankmem_resource_describe");
        std::vector<char> buf(needed + 1);
        detail::check(rankmem_resource_describe(mr_, buf.data(), buf.size(), nullptr),
                      "rankmem_resource_describe");
        return buf.data();
    }

    // Memory from one may be freed through the other. Two empty handles are
    // equal; an empty and a non-empty one are not. Never throws.
    bool is_equal(const resource &other) const noexcept
    {
        if (mr_ == other.mr_)
            return true;
        if (!mr_ || !other.mr_)
            return false;
        int eq = 0;
        return rankmem_resource_is_equal(mr_, other.mr_, &eq) == RANKMEM_SUCCESS && eq;
    }
    friend bool operator==(const resource &a, const resource &b) noexcept { return a.is_equal(b); }
    friend bool operator!=(const resource &a, const resource &b) noexcept { return !a.is_equal(b); }

  private:
    rankmem_resource_t *mr_ = nullptr;
};

inline void swap(resource &a, resource &b) noexcept { a.swap(b); }

// ---- builders (each returns a handle with the one reference) -------------------

namespace detail {
template <class F> resource make(F &&create, const char *call)
{
    rankmem_resource_t *mr = nullptr;
    check(create(&mr), call);
    return resource::adopt(mr);
}
} // namespace detail

inline resource system()
{
    return detail::make([](rankmem_resource_t **p) { return rankmem_system_create(p); },
                        "rankmem_system_create");
}
inline resource cuda()
{
    return detail::make([](rankmem_resource_t **p) { return rankmem_cuda_create(p); },
                        "rankmem_cuda_create");
}
inline resource managed()
{
    return detail::make([](rankmem_resource_t **p) { return rankmem_managed_create(p); },
                        "rankmem_managed_create");
}
inline resource pinned()
{
    return detail::make([](rankmem_resource_t **p) { return rankmem_pinned_create(p); },
                        "rankmem_pinned_create");
}
// The device's default cudaMallocAsync pool, or a new pool as params say.
inline resource async()
{
    return detail::make([](rankmem_resource_t **p) { return rankmem_async_create(nullptr, p); },
                        "rankmem_async_create");
}
inline resource async(const rankmem_async_params_t &params)
{
    return detail::make(
        [&](rankmem_resource_t **p) { return rankmem_async_create(&params, p); },
        "rankmem_async_create");
}
inline resource async_managed()
{
    return detail::make(
        [](rankmem_resource_t **p) { return rankmem_async_managed_create(nullptr, p); },
        "rankmem_async_managed_create");
}
inline resource async_managed(const rankmem_async_managed_params_t &params)
{
    return detail::make(
        [&](rankmem_resource_t **p) { return rankmem_async_managed_create(&params, p); },
        "rankmem_async_managed_create");
}
inline resource sam_headroom(std::size_t headroom)
{
    return detail::make(
        [&](rankmem_resource_t **p) { return rankmem_sam_headroom_create(headroom, p); },
        "rankmem_sam_headroom_create");
}
// maximum SIZE_MAX: unbounded; growth 0: geometric (rankmem_pool_params_t).
inline resource pool(const resource &upstream, std::size_t initial = 0,
                     std::size_t maximum = std::numeric_limits<std::size_t>::max(),
                     std::size_t growth = 0)
{
    rankmem_pool_params_t prm;
    detail::check(rankmem_pool_params_default(&prm), "rankmem_pool_params_default");
    prm.initial_size = initial;
    prm.maximum_size = maximum;
    prm.growth_size = growth;
    return detail::make(
        [&](rankmem_resource_t **p) { return rankmem_pool_create(upstream.get(), &prm, p); },
        "rankmem_pool_create");
}
inline resource stats(const resource &upstream)
{
    return detail::make(
        [&](rankmem_resource_t **p) { return rankmem_stats_create(upstream.get(), p); },
        "rankmem_stats_create");
}
inline resource tracking(const resource &upstream, bool backtraces = false)
{
    return detail::make(
        [&](rankmem_resource_t **p) {
            return rankmem_tracking_create(upstream.get(), backtraces ? 1 : 0, p);
        },
        "rankmem_tracking_create");
}
inline resource limit(const resource &upstream, std::size_t limit_bytes)
{
    return detail::make(
        [&](rankmem_resource_t **p) { return rankmem_limit_create(upstream.get(), limit_bytes, p); },
        "rankmem_limit_create");
}
inline resource aligned(const resource &upstream, std::size_t alignment, std::size_t threshold = 0)
{
    return detail::make(
        [&](rankmem_resource_t **p) {
            return rankmem_aligned_create(upstream.get(), alignment, threshold, p);
        },
        "rankmem_aligned_create");
}
// On out-of-memory, trims the chain below once and retries.
inline resource retry(const resource &upstream)
{
    return detail::make(
        [&](rankmem_resource_t **p) {
            return rankmem_retry_create(upstream.get(), nullptr, nullptr, p);
        },
        "rankmem_retry_create");
}
inline resource threadsafe(const resource &upstream)
{
    return detail::make(
        [&](rankmem_resource_t **p) { return rankmem_threadsafe_create(upstream.get(), p); },
        "rankmem_threadsafe_create");
}
inline resource prefetch(const resource &upstream)
{
    return detail::make(
        [&](rankmem_resource_t **p) { return rankmem_prefetch_create(upstream.get(), p); },
        "rankmem_prefetch_create");
}
// A whole chain from a spec string (docs/configuration.md).
inline resource from_spec(const std::string &spec)
{
    return detail::make(
        [&](rankmem_resource_t **p) { return rankmem_resource_from_spec(spec.c_str(), p); },
        "rankmem_resource_from_spec");
}

// The per-device registry; the handles hold their own reference.
inline resource device_resource(int device)
{
    rankmem_resource_t *mr = nullptr;
    detail::check(rankmem_get_device_resource(device, &mr), "rankmem_get_device_resource");
    return resource::borrow(mr);
}
inline resource current_device_resource()
{
    rankmem_resource_t *mr = nullptr;
    detail::check(rankmem_get_current_resource(&mr), "rankmem_get_current_resource");
    return resource::borrow(mr);
}
inline void set_device_resource(int device, const resource &r)
{
    detail::check(rankmem_set_device_resource(device, r.get()), "rankmem_set_device_resource");
}
inline void set_current_device_resource(const resource &r)
{
    detail::check(rankmem_set_current_resource(r.get()), "rankmem_set_current_resource");
}

// ---- std::pmr ------------------------------------------------------------------

// A std::pmr::memory_resource over any host-accessible rankmem resource
// (system, pinned, managed, sam_headroom, async_managed, or a chain over
// one), for std::pmr containers. Allocates on the default stream.
// Alignments up to RANKMEM_DEFAULT_ALIGNMENT (256) are always met; larger
// ones are passed on (some resources refuse them: rankmem::error).
class pmr_resource final : public std::pmr::memory_resource {
  public:
    explicit pmr_resource(resource r) : res_(std::move(r))
    {
        if (!res_)
            throw error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem::pmr_resource: empty resource");
        if (!res_.host_accessible())
            throw error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem::pmr_resource: resource '" + res_.name() +
                            "' is not host-accessible, and std::pmr containers touch their "
                            "memory on the host");
    }
    const resource &get_resource() const noexcept { return res_; }

  private:
    static std::size_t align(std::size_t a) noexcept
    {
        return a <= detail::default_alignment ? 0 : a;
    }
    void *do_allocate(std::size_t bytes, std::size_t alignment) override
    {
        return res_.allocate(detail::nonzero(bytes), align(alignment));
    }
    void do_deallocate(void *p, std::size_t bytes, std::size_t alignment) override
    {
        (void)rankmem_deallocate(res_.get(), p, detail::nonzero(bytes), align(alignment));
    }
    // Equal when memory from one may be freed through the other.
    bool do_is_equal(const std::pmr::memory_resource &other) const noexcept override
    {
        if (this == &other)
            return true;
        const pmr_resource *o = dynamic_cast<const pmr_resource *>(&other);
        return o && res_ == o->res_;
    }

    resource res_;
};

// ---- stream-ordered typed allocators -----------------------------------------

// allocate(n, stream) / deallocate(p, n, stream) of T over a resource: the
// memory is valid on `stream` (RMM's polymorphic_allocator, in C's terms).
// Default-constructed: the current device's resource.
template <class T> class stream_allocator {
  public:
    using value_type = T;

    stream_allocator() : res_(current_device_resource()) {}
    explicit stream_allocator(resource r) : res_(std::move(r))
    {
        if (!res_)
            throw error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem::stream_allocator: empty resource");
    }
    template <class U> stream_allocator(const stream_allocator<U> &other) : res_(other.get_resource())
    {
    }

    T *allocate(std::size_t n, stream_t stream)
    {
        if (n > std::numeric_limits<std::size_t>::max() / sizeof(T))
            throw std::bad_array_new_length();
        return static_cast<T *>(res_.allocate(detail::nonzero(n * sizeof(T)), align(), stream));
    }
    void deallocate(T *p, std::size_t n, stream_t stream) noexcept
    {
        (void)rankmem_deallocate_async(res_.get(), p, detail::nonzero(n * sizeof(T)), align(),
                                       stream);
    }

    const resource &get_resource() const noexcept { return res_; }

  private:
    static constexpr std::size_t align() noexcept
    {
        return alignof(T) > detail::default_alignment ? alignof(T) : 0;
    }
    resource res_;
};

template <class T, class U>
bool operator==(const stream_allocator<T> &a, const stream_allocator<U> &b) noexcept
{
    return a.get_resource() == b.get_resource();
}
template <class T, class U>
bool operator!=(const stream_allocator<T> &a, const stream_allocator<U> &b) noexcept
{
    return !(a == b);
}

// A stream_allocator bound to one stream: a standard Allocator
// (allocate(n) / deallocate(p, n), rebind, equality) for containers that
// expect one. Copies, moves and swaps travel with the container's memory.
// Equality follows the resources, not the streams: memory may be freed on
// any stream (the stream only orders its reuse).
template <class T> class stream_bound_allocator {
  public:
    using value_type = T;
    using propagate_on_container_copy_assignment = std::true_type;
    using propagate_on_container_move_assignment = std::true_type;
    using propagate_on_container_swap = std::true_type;
    using is_always_equal = std::false_type;
    template <class U> struct rebind {
        using other = stream_bound_allocator<U>;
    };

    // The current device's resource, on the default stream.
    stream_bound_allocator() = default;
    explicit stream_bound_allocator(resource r, stream_t stream = nullptr)
        : alloc_(std::move(r)), stream_(stream)
    {
    }
    stream_bound_allocator(stream_allocator<T> alloc, stream_t stream)
        : alloc_(std::move(alloc)), stream_(stream)
    {
    }
    template <class U>
    stream_bound_allocator(const stream_bound_allocator<U> &other)
        : alloc_(other.underlying_allocator()), stream_(other.stream())
    {
    }

    T *allocate(std::size_t n) { return alloc_.allocate(n, stream_); }
    void deallocate(T *p, std::size_t n) noexcept { alloc_.deallocate(p, n, stream_); }

    stream_t stream() const noexcept { return stream_; }
    const stream_allocator<T> &underlying_allocator() const noexcept { return alloc_; }
    const resource &get_resource() const noexcept { return alloc_.get_resource(); }

  private:
    stream_allocator<T> alloc_;
    stream_t stream_ = nullptr;
};

template <class T, class U>
bool operator==(const stream_bound_allocator<T> &a, const stream_bound_allocator<U> &b) noexcept
{
    return a.get_resource() == b.get_resource();
}
template <class T, class U>
bool operator!=(const stream_bound_allocator<T> &a, const stream_bound_allocator<U> &b) noexcept
{
    return !(a == b);
}

// Bind: rankmem::bind(alloc, stream).
template <class T>
stream_bound_allocator<T> bind(const stream_allocator<T> &alloc, stream_t stream)
{
    return stream_bound_allocator<T>(alloc, stream);
}

} // namespace rankmem

// ---- thrust (nvcc only) ------------------------------------------------------------
// thrust::device_vector needs an allocator whose pointer is a
// thrust::device_ptr, so that its algorithms run on the device.
#if defined(__CUDACC__) && defined(__has_include)
#if __has_include(<thrust/device_malloc_allocator.h>)
#include <thrust/device_malloc_allocator.h>
#include <thrust/device_ptr.h>

namespace rankmem {

template <class T> class thrust_allocator : public thrust::device_malloc_allocator<T> {
    using base = thrust::device_malloc_allocator<T>;

  public:
    using value_type = T;
    using pointer = typename base::pointer;
    using size_type = typename base::size_type;
    using propagate_on_container_copy_assignment = std::true_type;
    using propagate_on_container_move_assignment = std::true_type;
    using propagate_on_container_swap = std::true_type;
    template <class U> struct rebind {
        using other = thrust_allocator<U>;
    };

    // The current device's resource, on the default stream.
    thrust_allocator() = default;
    explicit thrust_allocator(resource r, stream_t stream = nullptr) : bound_(std::move(r), stream)
    {
    }
    explicit thrust_allocator(stream_bound_allocator<T> bound) : bound_(std::move(bound)) {}
    template <class U>
    thrust_allocator(const thrust_allocator<U> &other) : bound_(other.bound_allocator())
    {
    }

    pointer allocate(size_type n) { return thrust::device_pointer_cast(bound_.allocate(n)); }
    void deallocate(pointer p, size_type n) noexcept
    {
        bound_.deallocate(thrust::raw_pointer_cast(p), n);
    }

    stream_t stream() const noexcept { return bound_.stream(); }
    const stream_bound_allocator<T> &bound_allocator() const noexcept { return bound_; }
    const resource &get_resource() const noexcept { return bound_.get_resource(); }

  private:
    stream_bound_allocator<T> bound_;
};

template <class T, class U>
bool operator==(const thrust_allocator<T> &a, const thrust_allocator<U> &b) noexcept
{
    return a.get_resource() == b.get_resource();
}
template <class T, class U>
bool operator!=(const thrust_allocator<T> &a, const thrust_allocator<U> &b) noexcept
{
    return !(a == b);
}

} // namespace rankmem
#endif
#endif

#endif
