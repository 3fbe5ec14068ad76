/* The resource interface: dispatchers and their bad inputs, the system and
 * callback resources, user resources, retain/release lifetimes, the registry. */
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"
#include "flaky.h"

static int cb_calls;
static rankmem_status_t cb_alloc(void *arg, size_t bytes, size_t alignment,
                                 rankmem_stream_t stream, void **ptr_p)
{
    (void)stream;
    cb_calls++;
    if (arg != (void *)&cb_calls)
        return RANKMEM_ERR_INTERNAL;
    return posix_memalign(ptr_p, alignment, bytes) ? RANKMEM_ERR_OUT_OF_MEMORY : RANKMEM_SUCCESS;
}
static rankmem_status_t cb_free(void *arg, void *ptr, size_t bytes, size_t alignment,
                                rankmem_stream_t stream)
{
    (void)arg, (void)bytes, (void)alignment, (void)stream;
    cb_calls++;
    free(ptr);
    return RANKMEM_SUCCESS;
}
/* Claims success with a misaligned pointer: the library must catch it. */
static char misaligned_buf[4096];
static int misaligned_freed;
static rankmem_status_t bad_alloc(void *arg, size_t bytes, size_t alignment,
                                  rankmem_stream_t stream, void **ptr_p)
{
    (void)arg, (void)bytes, (void)alignment, (void)stream;
    *ptr_p = (char *)(((uintptr_t)misaligned_buf + 255) & ~(uintptr_t)255) + 8;
    return RANKMEM_SUCCESS;
}
static rankmem_status_t bad_free(void *arg, void *ptr, size_t bytes, size_t alignment,
                                 rankmem_stream_t stream)
{
    (void)arg, (void)ptr, (void)bytes, (void)alignment, (void)stream;
    misaligned_freed++;
    return RANKMEM_SUCCESS;
}

static void test_dispatch_bad_inputs(rankmem_resource_t *sys)
{
    void *p = (void *)0x1;
    is_status(rankmem_allocate(NULL, 64, 0, &p), RANKMEM_ERR_INVALID_ARGUMENT, "allocate: NULL resource");
    is_status(rankmem_allocate(sys, 64, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "allocate: NULL output");
    is_status(rankmem_allocate(sys, 0, 0, &p), RANKMEM_ERR_INVALID_ARGUMENT, "allocate: 0 bytes");
    is_status(rankmem_allocate(sys, SIZE_MAX, 0, &p), RANKMEM_ERR_OUT_OF_MEMORY, "allocate: SIZE_MAX bytes");
    is_status(rankmem_allocate(sys, 64, 48, &p), RANKMEM_ERR_INVALID_ARGUMENT, "allocate: alignment 48");
    is_status(rankmem_allocate(sys, 64, SIZE_MAX, &p), RANKMEM_ERR_INVALID_ARGUMENT, "allocate: alignment SIZE_MAX");
    ok(p == (void *)0x1, "failed allocations leave the output alone");
    is_status(rankmem_deallocate(NULL, p, 64, 0), RANKMEM_ERR_INVALID_ARGUMENT, "deallocate: NULL resource");
    is_status(rankmem_deallocate(sys, NULL, 64, 0), RANKMEM_ERR_INVALID_POINTER, "deallocate: NULL pointer");
    is_status(rankmem_deallocate(sys, p, 64, 12), RANKMEM_ERR_INVALID_ARGUMENT, "deallocate: alignment 12");
    size_t v;
    is_status(rankmem_resource_query(sys, RANKMEM_QUERY_USED_CURRENT, &v), RANKMEM_ERR_NOT_SUPPORTED, "system: no queries");
    is_status(rankmem_resource_query(NULL, RANKMEM_QUERY_USED_CURRENT, &v), RANKMEM_ERR_INVALID_ARGUMENT, "query: NULL resource");
    is_status(rankmem_resource_query(sys, RANKMEM_QUERY_USED_CURRENT, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "query: NULL output");
    is_status(rankmem_resource_trim(sys, 0), RANKMEM_SUCCESS, "trim of a resource without a cache is a no-op");
    is_status(rankmem_resource_trim(NULL, 0), RANKMEM_ERR_INVALID_ARGUMENT, "trim: NULL resource");
    const char *name = NULL;
    is_status(rankmem_resource_name(NULL, &name), RANKMEM_ERR_INVALID_ARGUMENT, "name: NULL resource");
    is_status(rankmem_resource_name(sys, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "name: NULL output");
    int d;
    rankmem_resource_t *up;
    is_status(rankmem_resource_device(NULL, &d), RANKMEM_ERR_INVALID_ARGUMENT, "device: NULL resource");
    is_status(rankmem_resource_properties(sys, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "properties: NULL output");
    is_status(rankmem_resource_upstream(NULL, &up), RANKMEM_ERR_INVALID_ARGUMENT, "upstream: NULL resource");
    int eq;
    is_status(rankmem_resource_is_equal(sys, NULL, &eq), RANKMEM_ERR_INVALID_ARGUMENT, "is_equal: NULL resource");
    is_status(rankmem_resource_retain(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "retain: NULL");
    is_status(rankmem_resource_release(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "release: NULL");
    is_status(rankmem_system_create(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "system_create: NULL output");
}

static void test_system(rankmem_resource_t *sys)
{
    const char *name;
    int dev;
    unsigned props;
    rankmem_resource_name(sys, &name);
    rankmem_resource_device(sys, &dev);
    rankmem_resource_properties(sys, &props);
    ok(strcmp(name, "system") == 0, "system resource is named 'system'");
    ok(dev == RANKMEM_DEVICE_HOST, "system resource records the host as its device");
    ok(props == RANKMEM_PROP_HOST_ACCESSIBLE, "system memory is host-accessible only");
    size_t aligns[] = {0, 256, 4096, (size_t)1 << 20};
    int good = 1;
    for (int i = 0; i < 4; i++) {
        void *p = NULL;
        if (rankmem_allocate(sys, 1000, aligns[i], &p) != RANKMEM_SUCCESS || !p)
            good = 0;
        else {
            size_t a = aligns[i] ? aligns[i] : RANKMEM_DEFAULT_ALIGNMENT;
            if ((uintptr_t)p % a)
                good = 0;
            memset(p, 0xab, 1000);
            if (rankmem_deallocate(sys, p, 1000, aligns[i]) != RANKMEM_SUCCESS)
                good = 0;
        }
    }
    ok(good, "system allocations honour alignments 0 (=256), 256, 4 KiB, 1 MiB");
    void *p = NULL;
    is_status(rankmem_allocate(sys, 64, 16, &p), RANKMEM_SUCCESS, "an alignment below 256 is raised to 256");
    ok(p && (uintptr_t)p % 256 == 0, "and the pointer is 256-aligned");
    rankmem_deallocate(sys, p, 64, 16);
    rankmem_resource_t *sys2;
    rankmem_system_create(&sys2);
    int eq = 0;
    rankmem_resource_is_equal(sys, sys2, &eq);
    ok(eq == 1, "two system resources are equal");
    rankmem_resource_release(sys2);
}

static void test_callback(void)
{
    rankmem_resource_t *cb = NULL;
    is_status(rankmem_callback_create(NULL, cb_free, NULL, 0, &cb), RANKMEM_ERR_INVALID_ARGUMENT, "callback: NULL allocate function");
    is_status(rankmem_callback_create(cb_alloc, NULL, NULL, 0, &cb), RANKMEM_ERR_INVALID_ARGUMENT, "callback: NULL free function");
    is_status(rankmem_callback_create(cb_alloc, cb_free, NULL, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "callback: NULL output");
    is_status(rankmem_callback_create(cb_alloc, cb_free, NULL, 0x100, &cb), RANKMEM_ERR_INVALID_ARGUMENT, "callback: unknown property bits");
    ok(cb == NULL, "failed creations leave the output alone");
    is_status(rankmem_callback_create(cb_alloc, cb_free, &cb_calls, RANKMEM_PROP_HOST_ACCESSIBLE, &cb), RANKMEM_SUCCESS, "callback resource created");
    void *p = NULL;
    is_status(rankmem_allocate(cb, 512, 0, &p), RANKMEM_SUCCESS, "callback allocate");
    is_status(rankmem_deallocate(cb, p, 512, 0), RANKMEM_SUCCESS, "callback deallocate");
    ok(cb_calls == 2, "both user functions ran, with their argument");
    rankmem_resource_t *bad;
    rankmem_callback_create(bad_alloc, bad_free, NULL, RANKMEM_PROP_HOST_ACCESSIBLE, &bad);
    p = NULL;
    is_status(rankmem_allocate(bad, 64, 0, &p), RANKMEM_ERR_INTERNAL, "a misaligned pointer from a callback is refused");
    ok(p == NULL && misaligned_freed == 1, "and handed back to the callback's free");
    int eq = 1;
    rankmem_resource_is_equal(cb, bad, &eq);
    ok(eq == 0, "callbacks with other functions are not equal");
    is_status(rankmem_resource_release(bad), RANKMEM_SUCCESS, "release bad callback");
    is_status(rankmem_resource_release(cb), RANKMEM_SUCCESS, "release callback");
}

static void test_user_resource_and_lifetime(void)
{
    counting_t bogus;
    rankmem_resource_ops_t no_alloc = counting_ops;
    no_alloc.allocate = NULL;
    is_status(rankmem_resource_init(&bogus.base, &no_alloc, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "init: ops without allocate");
    is_status(rankmem_resource_init(NULL, &counting_ops, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "init: NULL resource");
    is_status(rankmem_resource_init(&bogus.base, NULL, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT, "init: NULL ops");

    int up_gone = 0;
    counting_t *c = counting_new(&up_gone);
    rankmem_resource_t *pool = NULL;
    is_status(rankmem_pool_create(&c->base, NULL, &pool), RANKMEM_SUCCESS, "pool over a user resource");
    ok(c->base.refcount == 2, "the pool holds a reference on its upstream");
    is_status(rankmem_resource_release(&c->base), RANKMEM_SUCCESS, "the creator drops its reference");
    ok(!up_gone, "the upstream lives on while the pool uses it");
    void *p;
    is_status(rankmem_allocate(pool, 1000, 0, &p), RANKMEM_SUCCESS, "the pool allocates from it");
    rankmem_deallocate(pool, p, 1000, 0);
    rankmem_resource_t *up = NULL;
    rankmem_resource_upstream(pool, &up);
    ok(up == &c->base, "upstream() gives the upstream");
    is_status(rankmem_resource_retain(pool), RANKMEM_SUCCESS, "retain the pool");
    is_status(rankmem_resource_release(pool), RANKMEM_SUCCESS, "release once");
    ok(!up_gone, "a retained chain stays alive");
    ok(c->outstanding_blocks == 1, "the pool still holds its chunk");
    is_status(rankmem_resource_release(pool), RANKMEM_SUCCESS, "release the last reference");
    ok(up_gone, "the last release frees the whole chain, upstream included");
}

static void test_registry(void)
{
    int n = -1, dev = -1;
    is_status(rankmem_device_count(&n), RANKMEM_SUCCESS, "device count");
    is_status(rankmem_current_device(&dev), RANKMEM_SUCCESS, "current device");
    is_status(rankmem_device_count(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "device count: NULL output");
    is_status(rankmem_current_device(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "current device: NULL output");
    rankmem_resource_t *cur = NULL;
    is_status(rankmem_get_current_resource(&cur), RANKMEM_SUCCESS, "current resource");
    const char *name = "";
    rankmem_resource_name(cur, &name);
    if (n == 0) {
        ok(strcmp(name, "system") == 0, "with no GPU the current resource is host memory (%s)", name);
        ok(dev == 0, "with no GPU the current device reads 0");
    } else {
        ok(strcmp(name, "cuda") == 0, "a device's first resource is cudaMalloc (%s)", name);
        int rdev = -2;
        rankmem_resource_device(cur, &rdev);
        ok(rdev == dev, "on the current device (%d)", rdev);
    }
    rankmem_resource_t *again = NULL;
    rankmem_get_device_resource(dev, &again);
    ok(again == cur, "the current device's resource is the current resource");
    is_status(rankmem_get_device_resource(n > 0 ? n : 1, &again), RANKMEM_ERR_INVALID_ARGUMENT, "device out of range");
    is_status(rankmem_get_device_resource(-1, &again), RANKMEM_ERR_INVALID_ARGUMENT, "negative device");
    is_status(rankmem_get_current_resource(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "get: NULL output");
    is_status(rankmem_get_device_resource(dev, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "get_device_resource: NULL output (a made slot)");
    is_status(rankmem_get_device_resource(-1, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "get_device_resource: NULL output and a bad device");
    is_status(rankmem_set_current_resource(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "set: NULL resource");

    rankmem_resource_retain(cur); /* keep the old one to put back */
    rankmem_resource_t *pool;
    rankmem_pool_create(cur, NULL, &pool);
    is_status(rankmem_set_current_resource(pool), RANKMEM_SUCCESS, "set a pool as current");
    rankmem_resource_t *got = NULL;
    rankmem_get_current_resource(&got);
    ok(got == pool, "get returns what was set");
    ok(pool->refcount == 2, "the registry holds a reference");
    is_status(rankmem_set_current_resource(cur), RANKMEM_SUCCESS, "put the first one back");
    ok(pool->refcount == 1, "the registry dropped its reference on the pool");
    rankmem_resource_release(pool);
    rankmem_resource_release(cur);
}

/* What a listener saw: calls, and the latest (device, resource). */
typedef struct heard {
    int calls, device;
    rankmem_resource_t *mr;
} heard_t;
static void hear(int device, rankmem_resource_t *mr, void *arg)
{
    heard_t *h = arg;
    h->calls++;
    h->device = device;
    h->mr = mr;
}
static void hear_other(int device, rankmem_resource_t *mr, void *arg) { hear(device, mr, arg); }

static void test_listeners(void)
{
    heard_t h = {0, -1, NULL}, h2 = {0, -1, NULL};
    int dev = 0;
    rankmem_current_device(&dev);
    rankmem_resource_t *cur = NULL;
    rankmem_get_current_resource(&cur);
    is_status(rankmem_add_resource_listener(NULL, &h), RANKMEM_ERR_INVALID_ARGUMENT,
              "add_resource_listener: NULL function");
    is_status(rankmem_remove_resource_listener(NULL, &h), RANKMEM_ERR_INVALID_ARGUMENT,
              "remove_resource_listener: NULL function");
    is_status(rankmem_remove_resource_listener(hear, &h), RANKMEM_ERR_INVALID_ARGUMENT,
              "remove_resource_listener: one never added");
    is_status(rankmem_add_resource_listener(hear, &h), RANKMEM_SUCCESS, "add a listener");
    ok(h.calls >= 1 && h.device == dev && h.mr == cur,
       "told at once of the current device's resource (%d calls)", h.calls);
    int before = h.calls;
    is_status(rankmem_add_resource_listener(hear, &h), RANKMEM_SUCCESS, "the same one again");
    ok(h.calls == before, "is the same listener: not told again");
    rankmem_resource_t *pool = NULL;
    rankmem_pool_create(cur, NULL, &pool);
    rankmem_resource_retain(cur);
    rankmem_set_current_resource(pool);
    ok(h.calls == before + 1 && h.mr == pool && h.device == dev, "told of a new resource");
    /* Full: RANKMEM_MAX_RESOURCE_LISTENERS with distinct arguments. */
    heard_t many[RANKMEM_MAX_RESOURCE_LISTENERS];
    int added = 1; /* hear/&h */
    rankmem_status_t st = RANKMEM_SUCCESS;
    for (int i = 0; i < RANKMEM_MAX_RESOURCE_LISTENERS && st == RANKMEM_SUCCESS; i++) {
        many[i] = (heard_t){0, -1, NULL};
        st = rankmem_add_resource_listener(hear_other, &many[i]);
        added += st == RANKMEM_SUCCESS;
    }
    ok(st == RANKMEM_ERR_LIMIT && added == RANKMEM_MAX_RESOURCE_LISTENERS,
       "past RANKMEM_MAX_RESOURCE_LISTENERS: RANKMEM_ERR_LIMIT (%d added)", added);
    for (int i = 0; i + 1 < added; i++)
        rankmem_remove_resource_listener(hear_other, &many[i]);
    is_status(rankmem_add_resource_listener(hear_other, &h2), RANKMEM_SUCCESS,
              "room again once they are removed");
    is_status(rankmem_remove_resource_listener(hear, &h), RANKMEM_SUCCESS, "remove the first");
    rankmem_set_current_resource(cur);
    ok(h.calls == before + 1 && h.mr == pool, "a removed listener is not told");
    ok(h2.mr == cur, "the others are");
    rankmem_remove_resource_listener(hear_other, &h2);
    rankmem_resource_release(pool);
    rankmem_resource_release(cur);
}

/* Issue 31, defect 3: size arithmetic must not wrap at huge alignments.
 * Every resource and common chain, over an upstream that records the
 * largest request: alignments above RANKMEM_MAX_ALIGNMENT are
 * INVALID_ARGUMENT, bytes + alignment above SIZE_MAX / 2 OUT_OF_MEMORY, both
 * before anything reaches the upstream; sizes just inside the bound fail
 * (nothing that large exists) without a wrapped request upstream and
 * without keeping anything. */
static void test_defect3_huge_alignment(void)
{
    static const char *const chains[] = {
        "system", "pool", "arena(size=64MiB)", "fixed(block=4096)", "binning", "caching",
        "aligned(alignment=4096)", "limit(bytes=1GiB)", "stats", "tracking", "retry",
        "threadsafe", "stats>pool", "tracking>pool", "binning>pool(max=24MiB)",
        "stats>binning>pool", "limit(bytes=1GiB)>pool", "aligned(alignment=64KiB)>pool",
        "caching>pool", "stats>caching", "tracking>arena(size=64MiB)", "stats>fixed(block=1MiB)"};
    static const size_t huge_align[] = {(size_t)1 << 63, (size_t)1 << 62, SIZE_MAX / 2 + 1,
                                        (size_t)1 << 31};
    static const size_t huge_bytes[] = {SIZE_MAX, SIZE_MAX - 255, SIZE_MAX / 2 + 1, SIZE_MAX / 2};
    static const size_t aligns[] = {0, 4096, RANKMEM_MAX_ALIGNMENT};
    for (size_t c = 0; c < sizeof chains / sizeof chains[0]; c++) {
        flaky_t f = {0};
        f.refuse_above = (size_t)1 << 30; /* nothing absurd reaches posix_memalign */
        rankmem_resource_t *up = flaky_new(&f), *mr = NULL;
        if (!up || rankmem_resource_from_spec_upstream(chains[c], up, &mr) != RANKMEM_SUCCESS) {
            ok(0, "defect 3: %s: built (%s)", chains[c], rankmem_last_error());
            continue;
        }
        int bad = 0;
        void *p = (void *)0x1;
        /* Alignments above the maximum, with small and huge sizes. */
        for (size_t i = 0; i < sizeof huge_align / sizeof huge_align[0]; i++)
            for (size_t b = 0; b < 3; b++) {
                size_t bytes = b == 0 ? 4096 : b == 1 ? SIZE_MAX : SIZE_MAX / 2;
                size_t calls = f.calls;
                rankmem_status_t st = rankmem_allocate(mr, bytes, huge_align[i], &p);
                if (st != RANKMEM_ERR_INVALID_ARGUMENT || f.calls != calls) {
                    if (!bad++)
                        diag("%s: %zu bytes at alignment %zu: %s, %zu upstream calls", chains[c],
                             bytes, huge_align[i], rankmem_status_string(st), f.calls - calls);
                }
            }
        ok(!bad, "defect 3: %s: alignments 2^63, 2^62, SIZE_MAX/2+1, 2^31 are INVALID_ARGUMENT "
                 "before the upstream is asked", chains[c]);
        /* Sizes that cannot fit with their alignment. */
        bad = 0;
        for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++)
            for (size_t b = 0; b < sizeof huge_bytes / sizeof huge_bytes[0]; b++) {
                size_t calls = f.calls;
                rankmem_status_t st = rankmem_allocate(mr, huge_bytes[b], aligns[i], &p);
                if (st != RANKMEM_ERR_OUT_OF_MEMORY || f.calls != calls) {
                    if (!bad++)
                        diag("%s: %zu bytes at alignment %zu: %s, %zu upstream calls", chains[c],
                             huge_bytes[b], aligns[i], rankmem_status_string(st), f.calls - calls);
                }
            }
        ok(!bad, "defect 3: %s: SIZE_MAX, SIZE_MAX-255, SIZE_MAX/2+1, SIZE_MAX/2 bytes are "
                 "OUT_OF_MEMORY before the upstream is asked", chains[c]);
        /* Just inside the dispatcher's bound: each resource's own rounding. */
        bad = 0;
        for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
            size_t a = aligns[i] ? aligns[i] : RANKMEM_DEFAULT_ALIGNMENT;
            size_t edge[] = {SIZE_MAX / 2 - a, SIZE_MAX / 2 - a - 1, SIZE_MAX / 4 + 1,
                             ((size_t)1 << 62) - 255};
            for (size_t b = 0; b < sizeof edge / sizeof edge[0]; b++) {
                size_t blocks = f.live_blocks;
                f.largest = 0;
                rankmem_status_t st = rankmem_allocate(mr, edge[b], aligns[i], &p);
                if (st == RANKMEM_SUCCESS || f.largest > SIZE_MAX / 2 ||
                    (f.largest && f.largest < edge[b]) || f.live_blocks != blocks) {
                    if (!bad++)
                        diag("%s: %zu bytes at alignment %zu: %s; largest upstream request %zu, "
                             "upstream blocks %zu -> %zu",
                             chains[c], edge[b], aligns[i], rankmem_status_string(st), f.largest,
                             blocks, f.live_blocks);
                }
            }
        }
        ok(!bad, "defect 3: %s: sizes just below SIZE_MAX/2 fail, the upstream sees no wrapped "
                 "size and keeps nothing new", chains[c]);
        ok(p == (void *)0x1, "defect 3: %s: no output written", chains[c]);
        /* Frees that describe no possible allocation change nothing. */
        void *q = NULL;
        rankmem_status_t st = rankmem_allocate(mr, 1000, 0, &q);
        is_status(st, RANKMEM_SUCCESS, "defect 3: %s: an ordinary allocation", chains[c]);
        if (st == RANKMEM_SUCCESS) {
            is_status(rankmem_deallocate(mr, q, 1000, (size_t)1 << 63),
                      RANKMEM_ERR_INVALID_ARGUMENT, "defect 3: %s: free at alignment 2^63",
                      chains[c]);
            is_status(rankmem_deallocate(mr, q, SIZE_MAX, 0), RANKMEM_ERR_INVALID_POINTER,
                      "defect 3: %s: free of SIZE_MAX bytes", chains[c]);
            is_status(rankmem_deallocate(mr, q, 1000, 0), RANKMEM_SUCCESS,
                      "defect 3: %s: then the right free", chains[c]);
        }
        is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "defect 3: %s: released",
                  chains[c]);
        ok(f.live_blocks == 0 && f.live_bytes == 0, "defect 3: %s: the upstream has all back",
           chains[c]);
        rankmem_resource_release(up);
    }
    /* The real leaves: refused before posix_memalign sees anything. */
    static const char *const leaves[] = {"system", "pool>system", "stats>system",
                                         "vmm(backend=host,reserve=1GiB)"};
    for (size_t c = 0; c < sizeof leaves / sizeof leaves[0]; c++) {
        rankmem_resource_t *mr = NULL;
        if (rankmem_resource_from_spec(leaves[c], &mr) != RANKMEM_SUCCESS) {
            ok(0, "defect 3: %s: built (%s)", leaves[c], rankmem_last_error());
            continue;
        }
        void *p = NULL;
        is_status(rankmem_allocate(mr, 4096, (size_t)1 << 63, &p), RANKMEM_ERR_INVALID_ARGUMENT,
                  "defect 3: %s: 4096 bytes at alignment 2^63", leaves[c]);
        is_status(rankmem_allocate(mr, SIZE_MAX - 4095, 4096, &p), RANKMEM_ERR_OUT_OF_MEMORY,
                  "defect 3: %s: SIZE_MAX-4095 bytes at alignment 4096", leaves[c]);
        rankmem_resource_release(mr);
    }
}

/* Issue 31, defect 7: what each resource detects on a bad free, as
 * docs/user-guide.md ("Bad frees") says. Each case a chain claims to detect
 * must be INVALID_POINTER and change nothing (the right frees afterwards
 * succeed, the upstream gets everything back); a case it does not claim is
 * not tried (system would abort in glibc). */
enum { D_FOREIGN = 1, D_INTERIOR = 2, D_LARGER = 4, D_SMALLER = 8, D_ZERO = 16, D_DOUBLE = 32 };
#define D_ALL (D_FOREIGN | D_INTERIOR | D_LARGER | D_SMALLER | D_ZERO | D_DOUBLE)

static void test_defect7_bad_frees(void)
{
    static const struct {
        const char *spec; /* over the callback upstream, or a whole chain when over is 0 */
        int over;
        int detects;
    } chains[] = {
        {"pool", 1, D_ALL},
        {"arena(size=64MiB)", 1, D_ALL},
        {"caching", 1, D_ALL},
        {"tracking", 1, D_ALL},
        {"tracking>system", 0, D_ALL},
        {"stats>pool", 1, D_ALL},
        {"stats>tracking>system", 0, D_ALL},
        {"limit(bytes=1GiB)>pool", 1, D_ALL},
        {"aligned(alignment=4096)>pool", 1, D_ALL},
        {"threadsafe>retry>pool", 1, D_ALL},
        {"vmm(backend=host,reserve=1GiB)", 0, D_ALL},
        {"stats>vmm(backend=host,reserve=1GiB)", 0, D_ALL},
        /* Blocks handed out whole: a smaller size is not seen. */
        {"fixed(block=4096)", 1, D_ALL & ~D_SMALLER},
        {"binning", 1, D_ALL & ~D_SMALLER},
        {"stats>binning", 1, D_ALL & ~D_SMALLER},
    };
    static const char *const names[] = {"a foreign pointer", "an interior pointer",
                                        "a larger size", "a smaller size", "size 0",
                                        "a double free"};
    void *heap = NULL;
    if (posix_memalign(&heap, 4096, 8192))
        BAIL_OUT("posix_memalign");
    for (size_t c = 0; c < sizeof chains / sizeof chains[0]; c++) {
        flaky_t f = {0};
        rankmem_resource_t *up = chains[c].over ? flaky_new(&f) : NULL, *mr = NULL;
        rankmem_status_t st = chains[c].over
                                  ? rankmem_resource_from_spec_upstream(chains[c].spec, up, &mr)
                                  : rankmem_resource_from_spec(chains[c].spec, &mr);
        if (st != RANKMEM_SUCCESS) {
            ok(0, "defect 7: %s: built (%s)", chains[c].spec, rankmem_last_error());
            if (up)
                rankmem_resource_release(up);
            continue;
        }
        void *p = NULL, *q = NULL;
        rankmem_allocate(mr, 3000, 0, &p);
        rankmem_allocate(mr, 3000, 0, &q);
        size_t live0 = 0;
        int counts = rankmem_resource_query(mr, RANKMEM_QUERY_LIVE_COUNT, &live0) == RANKMEM_SUCCESS;
        for (int k = 0; k < 6; k++) {
            int d = 1 << k;
            if (!(chains[c].detects & d))
                continue;
            void *ptr = p;
            size_t bytes = 3000;
            if (d == D_FOREIGN)
                ptr = heap;
            else if (d == D_INTERIOR)
                ptr = (char *)p + 256;
            else if (d == D_LARGER)
                bytes = 5000;
            else if (d == D_SMALLER)
                bytes = 1000;
            else if (d == D_ZERO)
                bytes = 0;
            else if (rankmem_deallocate(mr, q, 3000, 0) == RANKMEM_SUCCESS) /* D_DOUBLE */
                ptr = q, live0--;
            is_status(rankmem_deallocate(mr, ptr, bytes, 0), RANKMEM_ERR_INVALID_POINTER,
                      "defect 7: %s detects %s", chains[c].spec, names[k]);
        }
        size_t live = 0;
        ok(!counts || (rankmem_resource_query(mr, RANKMEM_QUERY_LIVE_COUNT, &live) ==
                           RANKMEM_SUCCESS &&
                       live == live0),
           "defect 7: %s: the refused frees changed nothing (%zu live, %zu before)",
           chains[c].spec, live, live0);
        is_status(rankmem_deallocate(mr, p, 3000, 0), RANKMEM_SUCCESS,
                  "defect 7: %s: the right free afterwards", chains[c].spec);
        is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "defect 7: %s: released clean",
                  chains[c].spec);
        if (up) {
            ok(f.live_blocks == 0, "defect 7: %s: the upstream has all back", chains[c].spec);
            rankmem_resource_release(up);
        }
    }
    free(heap);
}

int main(void)
{
    rankmem_resource_t *sys = NULL;
    if (rankmem_system_create(&sys) != RANKMEM_SUCCESS)
        BAIL_OUT("cannot create the system resource: %s", rankmem_last_error());
    test_dispatch_bad_inputs(sys);
    test_system(sys);
    test_callback();
    test_user_resource_and_lifetime();
    test_registry();
    test_listeners();
    test_defect3_huge_alignment();
    test_defect7_bad_frees();

    /* Forgetting a stream walks the chain; resources without per-stream state ignore it. */
    rankmem_resource_t *chain = NULL;
    void *p = NULL;
    rankmem_stream_t s1 = (rankmem_stream_t)(uintptr_t)0x4000;
    is_status(rankmem_resource_from_spec("stats>pool>system", &chain), RANKMEM_SUCCESS, "a chain with a pool");
    rankmem_allocate_async(chain, 1000, 0, s1, &p);
    rankmem_deallocate_async(chain, p, 1000, 0, s1);
    is_status(rankmem_resource_forget_stream(chain, s1), RANKMEM_SUCCESS, "forget_stream on the chain");
    void *q = NULL;
    rankmem_allocate(chain, 1000, 0, &q);
    ok(q == p, "the forgotten stream's block went to the default stream");
    rankmem_deallocate(chain, q, 1000, 0);
    is_status(rankmem_resource_forget_stream(sys, s1), RANKMEM_SUCCESS, "forget_stream on system: nothing to do");
    is_status(rankmem_resource_forget_stream(NULL, s1), RANKMEM_ERR_INVALID_ARGUMENT, "forget_stream: NULL");
    rankmem_resource_release(chain);
    is_status(rankmem_resource_release(sys), RANKMEM_SUCCESS, "release system");
    return tap_done();
}
