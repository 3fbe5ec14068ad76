// include/rankmem.hpp with the C++ compiler, on host memory (no GPU
// needed): handles and their references, builders, errors as exceptions,
// the std::pmr adapter, the stream-ordered allocators in standard
// containers, and equality following the resources.
#include <rankmem.hpp>

#include <cstdint>
#include <cstring>
#include <list>
#include <map>
#include <memory_resource>
#include <string>
#include <vector>

#include "../tap.h"

namespace {

// Runs f; true when it throws an E (what() and status kept for the caller).
template <class E, class F> bool throws(F f, std::string *what = nullptr)
{
    try {
        f();
    } catch (const E &e) {
        if (what)
            *what = e.what();
        return true;
    } catch (const std::exception &e) {
        diag("  threw something else: %s", e.what());
        return false;
    } catch (...) {
        diag("  threw something that is not a std::exception");
        return false;
    }
    diag("  did not throw");
    return false;
}

template <class F> rankmem_status_t status_of(F f)
{
    try {
        f();
    } catch (const rankmem::error &e) {
        return e.status();
    } catch (const rankmem::out_of_memory &e) {
        return e.status();
    } catch (...) {
        return RANKMEM_ERR_INTERNAL;
    }
    return RANKMEM_SUCCESS;
}

unsigned long refs(const rankmem::resource &r) { return r ? r.get()->refcount : 0; }

size_t bytes_now(const rankmem::resource &stats)
{
    rankmem_stats_t s;
    s.size = sizeof s;
    if (rankmem_stats_get(stats.get(), &s) != RANKMEM_SUCCESS)
        return SIZE_MAX;
    return s.bytes_current;
}

void test_handles()
{
    rankmem::resource sys = rankmem::system();
    ok(sys && refs(sys) == 1, "system(): a handle with one reference");
    {
        rankmem::resource copy = sys;
        ok(refs(sys) == 2 && copy.get() == sys.get(), "copy retains (2 references)");
        rankmem::resource moved = std::move(copy);
        ok(!copy && refs(sys) == 2, "move steals: the source is empty, still 2 references");
        rankmem::resource assigned;
        assigned = moved;
        ok(refs(sys) == 3, "copy-assignment retains (3)");
        assigned = rankmem::resource();
        ok(refs(sys) == 2 && !assigned, "assigning an empty handle releases (2)");
    }
    ok(refs(sys) == 1, "destructors release (back to 1)");

    rankmem::resource borrowed = rankmem::resource::borrow(sys.get());
    ok(refs(sys) == 2, "borrow() retains");
    rankmem_resource_t *raw = borrowed.detach();
    ok(!borrowed && refs(sys) == 2, "detach() gives the reference up without releasing");
    rankmem::resource adopted = rankmem::resource::adopt(raw);
    ok(refs(sys) == 2, "adopt() takes it over without retaining");
    adopted.reset();
    ok(refs(sys) == 1 && !adopted, "reset() releases");

    ok(sys.name() == "system", "name() is '%s'", sys.name().c_str());
    ok(sys.host_accessible() && !sys.device_accessible() && !sys.stream_ordered(),
       "properties: host-accessible only");
    ok(sys.device() == RANKMEM_DEVICE_HOST, "device(): host");
    ok(!sys.upstream(), "a leaf has no upstream");

    void *p = sys.allocate(1000);
    ok(p && reinterpret_cast<std::uintptr_t>(p) % RANKMEM_DEFAULT_ALIGNMENT == 0,
       "allocate(1000): 256-aligned");
    std::memset(p, 0x5a, 1000);
    sys.deallocate(p, 1000);
    p = sys.allocate(100, 4096);
    ok(p && reinterpret_cast<std::uintptr_t>(p) % 4096 == 0, "allocate with alignment 4096");
    sys.deallocate(p, 100, 4096);
}

void test_builders()
{
    rankmem::resource sys = rankmem::system();
    rankmem::resource chain = rankmem::stats(rankmem::pool(sys, 1 << 20));
    ok(chain.describe() == "stats>pool(initial=1MiB)>system", "builders make a chain: %s",
       chain.describe().c_str());
    ok(refs(sys) == 2, "the pool holds its own reference on the upstream");
    ok(chain.upstream().name() == "pool" && chain.upstream().upstream() == sys,
       "upstream() walks the chain");
    void *p = chain.allocate(4096);
    ok(chain.query(RANKMEM_QUERY_USED_CURRENT) >= 4096, "query() through the chain");
    chain.deallocate(p, 4096);
    chain.trim(0);

    rankmem::resource spec = rankmem::from_spec("limit(bytes=1MiB)>tracking>pool>system");
    ok(spec.describe() == "limit(bytes=1MiB)>tracking>pool>system", "from_spec: %s",
       spec.describe().c_str());

    // A description longer than describe()'s first buffer.
    rankmem::resource deep = rankmem::system();
    for (int i = 0; i < 40; i++)
        deep = rankmem::limit(deep, (size_t)1 << 30);
    std::string d = deep.describe();
    ok(d.size() > 256 && d.compare(d.size() - 6, 6, "system") == 0,
       "describe() of a long chain (%zu characters)", d.size());

    rankmem::resource cur = rankmem::current_device_resource();
    ok(cur && cur == rankmem::current_device_resource(), "current_device_resource(): %s",
       cur.name().c_str());
}

void test_errors()
{
    rankmem::resource sys = rankmem::system();
    std::string what;

    ok(throws<rankmem::error>([&] { sys.allocate(0); }, &what), "allocate(0) throws rankmem::error");
    ok(what.find("allocate of 0 bytes") != std::string::npos, "  what(): %s", what.c_str());
    is_status(status_of([&] { sys.allocate(64, 3); }), RANKMEM_ERR_INVALID_ARGUMENT,
              "alignment 3: rankmem::error, invalid argument");

    rankmem::resource empty;
    is_status(status_of([&] { empty.allocate(64); }), RANKMEM_ERR_INVALID_ARGUMENT,
              "allocate on an empty handle: invalid argument");
    is_status(status_of([&] { (void)empty.name(); }), RANKMEM_ERR_INVALID_ARGUMENT,
              "name() of an empty handle: invalid argument");
    is_status(status_of([&] { rankmem::pool(empty); }), RANKMEM_ERR_INVALID_ARGUMENT,
              "pool over an empty handle: invalid argument");

    rankmem::resource pool = rankmem::pool(sys);
    int local = 0;
    is_status(status_of([&] { pool.deallocate(&local, 64); }), RANKMEM_ERR_INVALID_POINTER,
              "deallocate of a foreign pointer: invalid pointer");

    ok(throws<rankmem::error>([&] { rankmem::from_spec("pol>system"); }, &what),
       "a bad spec throws rankmem::error");
    ok(what.find("did you mean 'pool'?") != std::string::npos, "  what(): %s", what.c_str());
    is_status(status_of([&] { rankmem::from_spec("pol>system"); }), RANKMEM_ERR_CONFIG,
              "  status: bad configuration");

    // Out of memory and limits: std::bad_alloc, as containers expect.
    rankmem::resource lim = rankmem::limit(sys, 1 << 20);
    ok(throws<std::bad_alloc>([&] { lim.allocate(2 << 20); }, &what),
       "past a limit: std::bad_alloc");
    ok(what.find("limit") != std::string::npos, "  what(): %s", what.c_str());
    is_status(status_of([&] { lim.allocate(2 << 20); }), RANKMEM_ERR_LIMIT,
              "  rankmem::out_of_memory with status limit");
    rankmem::resource small = rankmem::pool(sys, 0, 1 << 20);
    is_status(status_of([&] { small.allocate(4 << 20); }), RANKMEM_ERR_OUT_OF_MEMORY,
              "a full pool: rankmem::out_of_memory, out of memory");
    ok(throws<std::bad_alloc>([&] { sys.allocate(SIZE_MAX / 4); }),
       "an absurd size: std::bad_alloc");

    // Releasing a chain with a live allocation: reset_checked() reports it.
    rankmem::resource leaky = rankmem::pool(sys);
    leaky.allocate(256);
    is_status(status_of([&] { leaky.reset_checked(); }), RANKMEM_ERR_BUSY,
              "reset_checked() of a chain with a live allocation: busy");
    ok(!leaky, "  and the handle is empty");

    // Not host-accessible: no pmr adapter over it.
    rankmem_resource_t *cb = nullptr;
    rankmem_callback_create(
        [](void *, size_t, size_t, rankmem_stream_t, void **) { return RANKMEM_ERR_OUT_OF_MEMORY; },
        [](void *, void *, size_t, size_t, rankmem_stream_t) { return RANKMEM_SUCCESS; }, nullptr,
        0, &cb);
    rankmem::resource dev_only = rankmem::resource::adopt(cb);
    ok(throws<rankmem::error>([&] { rankmem::pmr_resource r(dev_only); }, &what),
       "pmr_resource over a resource that is not host-accessible throws");
    ok(what.find("not host-accessible") != std::string::npos, "  what(): %s", what.c_str());
    is_status(status_of([&] { rankmem::pmr_resource r{rankmem::resource()}; }),
              RANKMEM_ERR_INVALID_ARGUMENT, "pmr_resource over an empty handle");
    is_status(status_of([&] { rankmem::stream_allocator<int> a{rankmem::resource()}; }),
              RANKMEM_ERR_INVALID_ARGUMENT, "stream_allocator over an empty handle");
}

void test_pmr()
{
    rankmem::resource sys = rankmem::system();
    rankmem::resource counted = rankmem::stats(rankmem::pool(sys));
    {
        rankmem::pmr_resource mr(counted);
        std::pmr::vector<int> v(&mr);
        for (int i = 0; i < 10000; i++)
            v.push_back(i * 3);
        bool good = true;
        for (int i = 0; i < 10000; i++)
            good = good && v[(size_t)i] == i * 3;
        ok(good, "std::pmr::vector<int> over stats>pool>system holds 10000 values");
        ok(bytes_now(counted) >= 10000 * sizeof(int), "  its memory came through rankmem (%zu "
                                                      "bytes live)", bytes_now(counted));

        // Nested containers take the same resource (uses-allocator construction).
        std::pmr::vector<std::pmr::string> names(&mr);
        for (int i = 0; i < 100; i++)
            names.emplace_back(std::string(100, char('a' + i % 26)));
        ok(names.back().get_allocator().resource() == &mr && names[25][99] == 'z',
           "std::pmr::vector<std::pmr::string>: the strings use the resource too");

        std::pmr::map<int, int> m(&mr);
        for (int i = 0; i < 1000; i++)
            m[i] = -i;
        ok(m.size() == 1000 && m[999] == -999, "std::pmr::map nodes from rankmem");

        void *p = mr.allocate(100, 4096);
        ok(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0, "over-aligned pmr allocate (4096)");
        mr.deallocate(p, 100, 4096);
        p = mr.allocate(0, 1);
        ok(p != nullptr, "pmr allocate of 0 bytes gives a pointer");
        mr.deallocate(p, 0, 1);
    }
    ok(bytes_now(counted) == 0, "everything freed when the containers go");

    rankmem::pmr_resource a(sys), b(rankmem::system()), c(rankmem::pool(sys)), c2(c.get_resource());
    ok(a.is_equal(b) && b.is_equal(a), "pmr over two system resources: equal (system frees any)");
    ok(!a.is_equal(c) && !c.is_equal(a), "pmr over system and over a pool: not equal");
    ok(c.is_equal(c2), "pmr adapters over the same pool: equal");
    ok(!a.is_equal(*std::pmr::new_delete_resource()), "not equal to a foreign pmr resource");

    rankmem::pmr_resource lim(rankmem::limit(sys, 1 << 16));
    std::pmr::vector<char> big(&lim);
    ok(throws<std::bad_alloc>([&] { big.resize(1 << 20); }),
       "a pmr container past a limit: std::bad_alloc");
}

void test_allocators()
{
    rankmem::resource sys = rankmem::system();
    rankmem::resource counted = rankmem::stats(rankmem::pool(sys));
    rankmem::stream_allocator<int> sa(counted);
    int *p = sa.allocate(1000, nullptr);
    ok(p && bytes_now(counted) >= 4000, "stream_allocator<int>::allocate(1000, stream)");
    for (int i = 0; i < 1000; i++)
        p[i] = i;
    sa.deallocate(p, 1000, nullptr);
    ok(bytes_now(counted) == 0, "deallocate(p, 1000, stream)");
    ok(throws<std::bad_array_new_length>([&] { sa.allocate(SIZE_MAX / 2, nullptr); }),
       "n * sizeof(T) overflows: std::bad_array_new_length");

    rankmem::stream_allocator<double> sd(sa);
    ok(sd == sa && !(sd != sa), "a converted stream_allocator equals its source");

    using alloc_t = rankmem::stream_bound_allocator<int>;
    alloc_t bound = rankmem::bind(sa, nullptr);
    {
        std::vector<int, alloc_t> v(bound);
        for (int i = 0; i < 5000; i++)
            v.push_back(i);
        ok(v.size() == 5000 && v[4999] == 4999 && bytes_now(counted) >= 5000 * sizeof(int),
           "std::vector<int, stream_bound_allocator<int>> (%zu bytes through rankmem)",
           bytes_now(counted));
        std::vector<int, alloc_t> copy = v;
        ok(copy == v && copy.get_allocator() == bound, "copied with its allocator");

        // Rebinding: a list allocates nodes, not ints.
        std::list<int, alloc_t> l(bound);
        for (int i = 0; i < 100; i++)
            l.push_back(i);
        ok(l.size() == 100 && l.back() == 99, "std::list rebinds it to its nodes");
        using traits = std::allocator_traits<alloc_t>;
        traits::rebind_alloc<double> rd(bound);
        ok(rd == bound, "allocator_traits::rebind_alloc<double> equals the original");

        std::map<int, int, std::less<int>, rankmem::stream_bound_allocator<std::pair<const int, int>>>
            m(bound);
        m[1] = 2;
        ok(m.at(1) == 2, "std::map with it");
    }
    ok(bytes_now(counted) == 0, "containers gave everything back");

    // Equality follows the resources, not the streams.
    rankmem::resource other_pool = rankmem::pool(sys);
    rankmem_stream_t s1 = reinterpret_cast<rankmem_stream_t>(std::uintptr_t(0x1000));
    alloc_t on_s1(counted, s1);
    ok(on_s1 == bound && on_s1.stream() == s1, "same resource, another stream: equal");
    ok(alloc_t(other_pool) != bound, "another pool: not equal");
    ok(alloc_t(sys) == alloc_t(rankmem::system()), "two system resources: equal");

    // Containers with unequal allocators swap their allocators with them.
    std::vector<int, alloc_t> x(bound), y{alloc_t(other_pool)};
    x.assign(10, 1);
    y.assign(20, 2);
    x.swap(y);
    ok(x.size() == 20 && x.get_allocator() == alloc_t(other_pool) && y.get_allocator() == bound,
       "swap carries the allocators along");
    x = y;
    ok(x.get_allocator() == bound && x.size() == 10, "copy-assignment propagates the allocator");

    // Limits surface as std::bad_alloc from the container.
    alloc_t lim(rankmem::limit(sys, 1 << 16));
    std::vector<int, alloc_t> big(lim);
    ok(throws<std::bad_alloc>([&] { big.resize(1 << 20); }),
       "a container past a limit: std::bad_alloc");

    // The default: the current device's resource (host memory with no GPU).
    rankmem::stream_allocator<int> def;
    ok(def.get_resource() == rankmem::current_device_resource(),
       "default stream_allocator: the current device's resource (%s)",
       def.get_resource().name().c_str());
}

} // namespace

int main()
{
    try {
        test_handles();
        test_builders();
        test_errors();
        test_pmr();
        test_allocators();
    } catch (const std::exception &e) {
        BAIL_OUT("unexpected exception: %s", e.what());
    }
    return tap_done();
}
