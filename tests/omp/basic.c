/* librankmem_omp: the predefined allocators through the omp_alloc family,
 * the runtime's own allocators passing through unchanged, the default
 * allocator, the allocate clause, stats through the rank's resource, and
 * bad inputs. Built with gcc/libgomp and with clang/libomp. Without a GPU
 * every space is host memory, so contents are checked on the CPU. */
#include <stdio.h>
#include <stdlib.h>

#include "omp_test.h"

static const char *const space_names[3] = {"device", "managed", "pinned"};

static void predefined(omp_allocator_handle_t a, const char *name)
{
    size_t bytes = 0;
    char *p = omp_alloc(1000, a);
    ok(p != NULL, "%s: omp_alloc(1000)", name);
    ok(rankmem_omp_block_info(p, &bytes, NULL) == RANKMEM_SUCCESS && bytes == 1000,
       "%s: rankmem serves the block (%zu bytes)", name, bytes);
    ok(aligned_to(p, 256), "%s: aligned to 256 like cudaMalloc", name);
    if (host_ok(p))
        memset(p, 0xab, 1000);
    uintptr_t pa = addr_of(p);
    omp_free(p, a);
    ok(was_freed(pa), "%s: forgotten after omp_free", name);

    /* Dirty memory first, so that a zeroed block is calloc's doing. */
    unsigned char *d = omp_alloc(4096, a);
    if (d && host_ok(d))
        memset(d, 0xff, 4096);
    omp_free(d, a);
    unsigned char *z = omp_calloc(512, 8, a);
    ok(z && is_ours(z) && (!host_ok(z) || all_bytes(z, 0, 4096)), "%s: omp_calloc zeroes", name);
    uintptr_t za = addr_of(z);
    omp_free(z, omp_null_allocator); /* the spec allows not naming the allocator */
    ok(was_freed(za), "%s: omp_free with omp_null_allocator frees ours", name);

    /* realloc: grow, shrink, keep contents. */
    unsigned char *r = omp_alloc(100, a);
    int host = r && host_ok(r);
    if (host)
        memset(r, 7, 100);
    unsigned char *r2 = omp_realloc(r, 10000, a, a);
    ok(r2 && is_ours(r2) && (!host || all_bytes(r2, 7, 100)),
       "%s: omp_realloc grows and keeps contents", name);
    unsigned char *r3 = omp_realloc(r2, 50, omp_null_allocator, a);
    size_t sz = 0;
    ok(r3 && rankmem_omp_block_info(r3, &sz, NULL) == RANKMEM_SUCCESS && sz == 50 &&
           (!host || all_bytes(r3, 7, 50)),
       "%s: omp_realloc with omp_null_allocator stays ours, shrinks, keeps contents", name);
    uintptr_t r3a = addr_of(r3);
    ok(omp_realloc(r3, 0, a, a) == NULL && was_freed(r3a), "%s: omp_realloc to 0 frees", name);
    unsigned char *r4 = omp_realloc(NULL, 64, a, omp_null_allocator);
    ok(r4 && is_ours(r4), "%s: omp_realloc(NULL) allocates", name);
    omp_free(r4, a);

    /* Aligned variants. */
    void *al = omp_aligned_alloc(4096, 100, a);
    ok(al && aligned_to(al, 4096) && is_ours(al), "%s: omp_aligned_alloc(4096)", name);
    omp_free(al, a);
    unsigned char *ac = omp_aligned_calloc(1024, 3, 100, a);
    ok(ac && aligned_to(ac, 1024) && (!host_ok(ac) || all_bytes(ac, 0, 300)),
       "%s: omp_aligned_calloc(1024)", name);
    omp_free(ac, a);
    ok(omp_aligned_alloc(48, 100, a) == NULL, "%s: non-power-of-two alignment gives NULL", name);
    ok(omp_alloc(0, a) == NULL, "%s: omp_alloc(0) gives NULL", name);
    volatile size_t huge = SIZE_MAX / 2;
    ok(omp_calloc(huge, 4, a) == NULL, "%s: overflowing omp_calloc gives NULL", name);
}

/* Ours to the runtime's and back. */
static void cross_realloc(void)
{
    unsigned char *p = omp_alloc(200, rankmem_omp_device_mem_alloc);
    int host = p && host_ok(p);
    if (host)
        memset(p, 3, 200);
    unsigned char *q = omp_realloc(p, 400, omp_default_mem_alloc, rankmem_omp_device_mem_alloc);
    ok(q && !is_ours(q) && (!host || all_bytes(q, 3, 200)),
       "omp_realloc from rankmem's to omp_default_mem_alloc copies");
    if (q)
        memset(q, 5, 400);
    unsigned char *s = omp_realloc(q, 300, rankmem_omp_device_mem_alloc, omp_default_mem_alloc);
    ok(s && is_ours(s) && (!host_ok(s) || all_bytes(s, 5, 300)),
       "omp_realloc from omp_default_mem_alloc to rankmem's copies");
    omp_free(s, rankmem_omp_device_mem_alloc);
}

/* The runtime's allocators behave as without us. */
static void passthrough(void)
{
    static const struct {
        omp_allocator_handle_t a;
        const char *name;
    } rt[] = {{omp_default_mem_alloc, "omp_default_mem_alloc"},
              {omp_high_bw_mem_alloc, "omp_high_bw_mem_alloc"},
              {omp_large_cap_mem_alloc, "omp_large_cap_mem_alloc"}};
    for (size_t i = 0; i < sizeof rt / sizeof rt[0]; i++) {
        /* libomp without memkind has no high-bandwidth or large-capacity
         * memory and returns NULL for those, with or without rankmem. */
        int may_refuse = i > 0;
        unsigned char *p = omp_alloc(128, rt[i].a);
        if (!p && may_refuse) {
            diag("%s: NULL from the runtime (it has no such memory)", rt[i].name);
            tap_skip(3, "the runtime has no such memory");
            continue;
        }
        ok(p && !is_ours(p), "%s: served by the runtime", rt[i].name);
        if (p)
            memset(p, 1, 128);
        unsigned char *q = omp_realloc(p, 1 << 16, rt[i].a, rt[i].a);
        ok(q && !is_ours(q) && all_bytes(q, 1, 128), "%s: omp_realloc keeps contents",
           rt[i].name);
        omp_free(q, rt[i].a);
        unsigned char *c = omp_calloc(10, 10, rt[i].a);
        ok(c && all_bytes(c, 0, 100), "%s: omp_calloc zeroes", rt[i].name);
        omp_free(c, omp_null_allocator);
    }
    omp_alloctrait_t t[] = {{omp_atk_alignment, 128}, {omp_atk_fallback, omp_atv_null_fb}};
    omp_allocator_handle_t u = omp_init_allocator(omp_default_mem_space, 2, t);
    ok(u != omp_null_allocator, "a user allocator on omp_default_mem_space");
    int ours = -1;
    rankmem_omp_is_rankmem_allocator(u, &ours);
    ok(ours == 0, "... belongs to the runtime");
    void *p = omp_alloc(1000, u);
    ok(p && aligned_to(p, 128) && !is_ours(p), "... allocates with its alignment trait");
    omp_free(p, u);
    void *pa = omp_aligned_alloc(64, 10, u);
    ok(pa && aligned_to(pa, 128), "... omp_aligned_alloc through it");
    omp_free(pa, u);
    omp_destroy_allocator(u);
}

static void default_allocator(void)
{
    omp_allocator_handle_t old = omp_get_default_allocator();
    ok(old == omp_default_mem_alloc, "initial default allocator is omp_default_mem_alloc");
    void *f = omp_alloc(64, omp_null_allocator);
    ok(f && !is_ours(f), "omp_alloc(omp_null_allocator) follows the runtime's default");
    omp_free(f, omp_null_allocator);

    omp_set_default_allocator(rankmem_omp_managed_mem_alloc);
    ok(omp_get_default_allocator() == rankmem_omp_managed_mem_alloc,
       "omp_set_default_allocator accepts ours");
    void *m = omp_alloc(64, omp_null_allocator);
    ok(is_ours(m), "omp_alloc(omp_null_allocator) follows our default");
    omp_free(m, omp_null_allocator);
    void *mc = omp_calloc(8, 8, omp_null_allocator);
    ok(is_ours(mc), "omp_calloc(omp_null_allocator) follows our default");
    omp_free(mc, omp_null_allocator);

    /* def-allocator-var is inherited by the threads of a parallel region,
     * and each thread's setting is its own. */
    int inherited = 0, own_ok = 0;
#pragma omp parallel num_threads(4) reduction(+ : inherited, own_ok)
    {
        void *p = omp_alloc(32, omp_null_allocator);
        inherited += is_ours(p);
        omp_free(p, omp_null_allocator);
        if (omp_get_thread_num() == 1) {
            omp_set_default_allocator(omp_default_mem_alloc);
            void *q = omp_alloc(32, omp_null_allocator);
            own_ok += q && !is_ours(q);
            omp_free(q, omp_null_allocator);
        }
    }
    ok(inherited == 4, "all 4 threads of a parallel region inherit our default (%d)", inherited);
    ok(own_ok == 1, "a thread's own omp_set_default_allocator applies to it alone");
    void *again = omp_alloc(32, omp_null_allocator);
    ok(is_ours(again), "the encountering thread keeps its default after the region");
    omp_free(again, omp_null_allocator);
    omp_set_default_allocator(old);
    void *back = omp_alloc(32, omp_null_allocator);
    ok(back && !is_ours(back), "setting the runtime's default back restores it");
    omp_free(back, omp_null_allocator);
}

/* The allocate clause: GCC calls GOMP_alloc/GOMP_free, clang __kmpc_alloc/
 * __kmpc_free. The private copies must come from rankmem. */
static void allocate_clause(void)
{
    double x[64];
    int ours = 0, n = 0;
#pragma omp parallel num_threads(4) private(x) allocate(rankmem_omp_device_mem_alloc : x) \
    reduction(+ : ours, n)
    {
        ours += is_ours(x);
        n++;
        if (host_ok(x))
            x[0] = omp_get_thread_num();
    }
    (void)x;
    ok(n == 4 && ours == 4, "allocate clause: %d of %d private copies from rankmem (%s)", ours, n,
       RT_NAME);
}

/* Allocations reach the rank's resource: a stats adaptor installed as the
 * current resource counts them. */
static void stats_through_rank_resource(void)
{
    rankmem_resource_t *cur, *st = install_stats(&cur);
    rankmem_stats_t s = {.size = sizeof s};
    rankmem_resource_t *seen = NULL;
    ok(rankmem_omp_allocator_resource(rankmem_omp_device_mem_alloc, &seen) == RANKMEM_SUCCESS &&
           seen == st,
       "the device allocator follows the current resource");
    void *p = omp_alloc(5000, rankmem_omp_device_mem_alloc);
    rankmem_stats_get(st, &s);
    ok(s.count_current == 1 && s.bytes_current == 5000, "stats count the block (%zu, %zu bytes)",
       s.count_current, s.bytes_current);
    double x[16];
#pragma omp parallel num_threads(3) private(x) allocate(rankmem_omp_device_mem_alloc : x)
    {
        if (host_ok(x))
            x[0] = 1;
    }
    (void)x;
    /* Put the old resource back while p is live: p goes back to the stats
     * adaptor it came from. */
    rankmem_set_current_resource(cur);
    omp_free(p, rankmem_omp_device_mem_alloc);
    /* With a GPU, freed device memory waits for a device sync (deferred
     * release): give it back before counting. */
    ok(rankmem_omp_flush() == RANKMEM_SUCCESS, "rankmem_omp_flush");
    rankmem_stats_get(st, &s);
    ok(s.count_current == 0 && s.count_total >= 4,
       "freed through its own resource after the swap (current %zu, total %zu)",
       s.count_current, s.count_total);
    rankmem_resource_release(st);
    rankmem_resource_release(cur);
}

/* The layer keeps a resource alive for its blocks with one reference for
 * all of them, dropped with the last block once the resource is no longer
 * in service (replaced as the current resource, or its allocator destroyed). */
static void resource_references(void)
{
    rankmem_resource_t *cur, *st = install_stats(&cur);
    unsigned long r0 = st->refcount; /* ours and the registry's */
    void *p[9];
    for (int i = 0; i < 9; i++)
        p[i] = omp_alloc(100 + (size_t)i, rankmem_omp_device_mem_alloc);
    ok(st->refcount == r0 + 1, "9 live blocks: one reference on their resource (%lu over %lu)",
       st->refcount, r0);
    /* Replaced while its blocks live: the next allocation notices, the
     * blocks keep it. */
    rankmem_set_current_resource(cur);
    void *z = omp_alloc(100, rankmem_omp_device_mem_alloc);
    rankmem_resource_t *zr = NULL;
    ok(rankmem_omp_block_info(z, NULL, &zr) == RANKMEM_SUCCESS && zr == cur,
       "after the swap, blocks come from the new current resource");
    ok(st->refcount == r0, "the replaced resource is still held for its blocks (%lu)", st->refcount);
    for (int i = 0; i < 8; i++)
        omp_free(p[i], rankmem_omp_device_mem_alloc);
    ok(st->refcount == r0, "... until the last of them is freed (%lu)", st->refcount);
    omp_free(p[8], rankmem_omp_device_mem_alloc);
    rankmem_omp_flush(); /* a deferred release holds it until then */
    ok(st->refcount == r0 - 1, "then the layer's reference goes (%lu)", st->refcount);
    omp_free(z, rankmem_omp_device_mem_alloc);

    /* Blocks in several threads' maps, freed by one thread: the retirement
     * finds every one of them. */
    rankmem_set_current_resource(st);
    void *tb[12];
#pragma omp parallel for num_threads(4) schedule(static, 3)
    for (int i = 0; i < 12; i++)
        tb[i] = omp_alloc(200 + (size_t)i, rankmem_omp_device_mem_alloc);
    rankmem_set_current_resource(cur);
    unsigned long r1 = st->refcount; /* the registry's is gone, the layer's not */
    z = omp_alloc(100, rankmem_omp_device_mem_alloc); /* notices the swap */
    for (int i = 0; i < 11; i++)
        omp_free(tb[i], rankmem_omp_device_mem_alloc);
    rankmem_omp_flush();
    ok(st->refcount == r1, "12 blocks of 4 threads hold it, 11 freed by another (%lu, %lu)",
       st->refcount, r1);
    omp_free(tb[11], rankmem_omp_device_mem_alloc);
    rankmem_omp_flush();
    ok(st->refcount == r1 - 1, "the 12th frees it (%lu)", st->refcount);
    omp_free(z, rankmem_omp_device_mem_alloc);

    /* More allocators with chains than the layer counts by entry: blocks of
     * the rest hold references of their own; all outlive their allocators. */
    enum { NA = 40 };
    omp_allocator_handle_t a[NA];
    void *q[NA];
    int made = 0, live = 0;
    rankmem_set_current_resource(st);
    omp_alloctrait_t t[1] = {{omp_atk_pool_size, 1 << 20}};
    for (int i = 0; i < NA; i++) {
        a[i] = omp_init_allocator(rankmem_omp_device_mem_space, 1, t);
        q[i] = a[i] != omp_null_allocator ? omp_alloc(64, a[i]) : NULL;
        made += is_ours(q[i]);
    }
    for (int i = 0; i < NA; i++)
        omp_destroy_allocator(a[i]);
    for (int i = 0; i < NA; i++) {
        live += is_ours(q[i]);
        omp_free(q[i], omp_null_allocator);
    }
    rankmem_omp_flush();
    rankmem_stats_t s = {.size = sizeof s};
    rankmem_stats_get(st, &s);
    ok(made == NA && live == NA && s.count_current == 0,
       "%d allocators' blocks outlive them and go back (%d, %zu left)", made, live,
       s.count_current);
    rankmem_set_current_resource(cur);
    void *w = omp_alloc(100, rankmem_omp_device_mem_alloc); /* notices the swap */
    omp_free(w, rankmem_omp_device_mem_alloc);
    rankmem_omp_flush();
    ok(st->refcount == 1, "nothing of the layer's is left on the resource (%lu)", st->refcount);
    rankmem_resource_release(st);
    rankmem_resource_release(cur);
}

static void bad_inputs(void)
{
    /* No-ops (a crash would end the plan short). */
    omp_free(NULL, rankmem_omp_device_mem_alloc);
    omp_free(NULL, omp_null_allocator);
    omp_free(NULL, omp_default_mem_alloc);
    int ours = -1, active = -1;
    ok(rankmem_omp_is_rankmem_allocator(rankmem_omp_device_mem_alloc, NULL) ==
           RANKMEM_ERR_INVALID_ARGUMENT,
       "rankmem_omp_is_rankmem_allocator: NULL output");
    ok(rankmem_omp_is_rankmem_allocator(omp_default_mem_alloc, &ours) == RANKMEM_SUCCESS &&
           ours == 0,
       "omp_default_mem_alloc is not ours");
    ok(rankmem_omp_is_rankmem_allocator(rankmem_omp_pinned_mem_alloc, &ours) == RANKMEM_SUCCESS &&
           ours == 1,
       "rankmem_omp_pinned_mem_alloc is ours");
    rankmem_resource_t *mr;
    ok(rankmem_omp_allocator_resource(omp_default_mem_alloc, &mr) == RANKMEM_ERR_INVALID_ARGUMENT,
       "rankmem_omp_allocator_resource: the runtime's allocator");
    ok(rankmem_omp_allocator_resource(rankmem_omp_device_mem_alloc, NULL) ==
           RANKMEM_ERR_INVALID_ARGUMENT,
       "rankmem_omp_allocator_resource: NULL output");
    ok(rankmem_omp_block_info(NULL, NULL, NULL) == RANKMEM_ERR_INVALID_ARGUMENT,
       "rankmem_omp_block_info: NULL pointer");
    int local;
    ok(rankmem_omp_block_info(&local, NULL, NULL) == RANKMEM_ERR_INVALID_POINTER,
       "rankmem_omp_block_info: a stack address is not ours");
    ok(rankmem_omp_active(NULL) == RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_omp_active: NULL");
    ok(rankmem_omp_active(&active) == RANKMEM_SUCCESS && active == 1,
       "rankmem_omp_active: linked before the runtime");
    /* A handle that lies in our range but was never made: refused, never
     * passed to the runtime (which would read it as its own struct). */
    omp_allocator_handle_t fake =
        (omp_allocator_handle_t)((uintptr_t)rankmem_omp_device_mem_alloc + 128 * 4000);
    ok(omp_alloc(10, fake) == NULL, "a never-created handle in our range gives NULL");
    omp_free(NULL, fake);
    /* The runtime's pointer freed while naming our allocator: the runtime's
     * free gets it (the pointer decides, not the handle). */
    void *rp = omp_alloc(10, omp_default_mem_alloc);
    ok(rp && !is_ours(rp), "the runtime's block");
    omp_free(rp, rankmem_omp_device_mem_alloc);
}

int main(void)
{
    diag("runtime: %s", RT_NAME);
    omp_allocator_handle_t pre[3] = {rankmem_omp_device_mem_alloc, rankmem_omp_managed_mem_alloc,
                                     rankmem_omp_pinned_mem_alloc};
    ok(pre[0] != pre[1] && pre[1] != pre[2] && ((uintptr_t)pre[0] & 1) &&
           (uintptr_t)pre[0] > 4096,
       "predefined handles are distinct, tagged, and no runtime's small integers");
    for (int i = 0; i < 3; i++)
        predefined(pre[i], space_names[i]);
    cross_realloc();
    passthrough();
    default_allocator();
    allocate_clause();
    stats_through_rank_resource();
    resource_references();
    bad_inputs();
    return tap_done();
}
