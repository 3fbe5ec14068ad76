/* Issue 31, defect 4: omp_init_allocator took a garbage omp_atk_fb_data (with
 * allocator_fb) and the first fallback jumped through it. Now an fb_data
 * must be a predefined allocator (ours or the runtime's) or one that
 * omp_init_allocator made and that is not destroyed; anything else gives
 * omp_null_allocator, on our memory spaces and on the runtime's. Also: a
 * fallback whose target was destroyed since gives NULL (even once the
 * target's handle or address is reused), fallback chains end, and the other
 * traits' bad values (enums, pool_size, alignment, unknown keys,
 * omp_atv_default on the runtime's spaces, where libomp aborted) give
 * omp_null_allocator instead of an abort. Built with gcc/libgomp and
 * clang/libomp. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "omp_test.h"

#define T(k, v) ((omp_alloctrait_t){(omp_alloctrait_key_t)(k), (omp_uintptr_t)(v)})

static int ours(omp_allocator_handle_t a)
{
    int o = 0;
    return rankmem_omp_is_rankmem_allocator(a, &o) == RANKMEM_SUCCESS && o;
}

/* An allocator on m with allocator_fb to fb (and a small pool, so that the
 * fallback is reachable), or omp_null_allocator. */
static omp_allocator_handle_t with_fb(omp_memspace_handle_t m, omp_uintptr_t fb)
{
    omp_alloctrait_t t[3] = {T(omp_atk_pool_size, 1024), T(omp_atk_fallback, omp_atv_allocator_fb),
                             T(omp_atk_fb_data, fb)};
    return omp_init_allocator(m, 3, t);
}

static void refuse_fb(omp_uintptr_t v, const char *what)
{
    omp_allocator_handle_t a = with_fb(rankmem_omp_device_mem_space, v);
    omp_allocator_handle_t b = with_fb(omp_default_mem_space, v);
    omp_alloctrait_t alone = T(omp_atk_fb_data, v); /* without allocator_fb: still a bad value */
    omp_allocator_handle_t c = omp_init_allocator(rankmem_omp_device_mem_space, 1, &alone);
    ok(a == omp_null_allocator && b == omp_null_allocator && c == omp_null_allocator,
       "fb_data %s (%#lx) refused on our space and the runtime's, with or without allocator_fb",
       what, (unsigned long)v);
    /* Should one have been made, its fallback must not be tried here. */
    if (a != omp_null_allocator)
        omp_destroy_allocator(a);
    if (b != omp_null_allocator)
        omp_destroy_allocator(b);
    if (c != omp_null_allocator)
        omp_destroy_allocator(c);
}

static void garbage_targets(void)
{
    int on_stack = 0;
    static int in_data;
    refuse_fb(0xdeadbeefu, "odd garbage");
    refuse_fb(0x12345670u, "even garbage");
    refuse_fb((omp_uintptr_t)&on_stack, "a stack address");
    refuse_fb((omp_uintptr_t)&in_data, "a data address");
    refuse_fb((omp_uintptr_t)malloc, "a function address");
    refuse_fb(9, "9 (past the predefined handles)");
    refuse_fb(99, "99");
    refuse_fb(1000, "1000 (below 1024, not predefined)");
    refuse_fb(rankmem_omp_device_mem_space, "our memory space handle");
    refuse_fb(rankmem_omp_device_mem_alloc + 2, "our predefined handle with other tag bits");
    refuse_fb(rankmem_omp_pinned_mem_alloc + 128, "an allocator slot never handed out");
    refuse_fb(omp_null_allocator, "omp_null_allocator");

    /* What both runtimes define is accepted; libomp's llvm_omp_target_*
     * allocators only where libomp is the runtime. */
    int good = 1;
    for (omp_uintptr_t v = 1; v <= 8; v++) {
        omp_allocator_handle_t a = with_fb(rankmem_omp_device_mem_space, v);
        good &= a != omp_null_allocator;
        omp_destroy_allocator(a);
    }
    ok(good, "fb_data omp_default_mem_alloc .. omp_thread_mem_alloc accepted");
    omp_allocator_handle_t l = with_fb(rankmem_omp_device_mem_space, 100);
#if defined(__clang__)
    ok(l != omp_null_allocator, "fb_data 100 (llvm_omp_target_host_mem_alloc) accepted by libomp");
#else
    ok(l == omp_null_allocator, "fb_data 100 refused with libgomp (it would read it as a pointer)");
#endif
    if (l != omp_null_allocator)
        omp_destroy_allocator(l);

    /* omp_atv_default: no target, the same as none (allocator_fb needs one). */
    omp_alloctrait_t d[1] = {T(omp_atk_fb_data, omp_atv_default)};
    omp_allocator_handle_t da = omp_init_allocator(rankmem_omp_device_mem_space, 1, d);
    ok(ours(da), "fb_data omp_atv_default alone: accepted, no target");
    omp_destroy_allocator(da);
    ok(with_fb(rankmem_omp_device_mem_space, omp_atv_default) == omp_null_allocator,
       "allocator_fb with fb_data omp_atv_default: refused (no target)");
}

/* A fills (1024 bytes) and falls back to its target: what 4000 bytes get. */
static void *overflow(omp_allocator_handle_t a) { return omp_alloc(4000, a); }

static void destroyed_targets(void)
{
    /* Ours: B destroyed, A's fallback gives NULL. */
    omp_alloctrait_t tb = T(omp_atk_alignment, 512);
    omp_allocator_handle_t B = omp_init_allocator(rankmem_omp_device_mem_space, 1, &tb);
    omp_allocator_handle_t A = with_fb(rankmem_omp_device_mem_space, B);
    void *p = overflow(A);
    ok(ours(A) && is_ours(p) && aligned_to(p, 512), "A falls back to B (ours)");
    omp_free(p, A);
    omp_destroy_allocator(B);
    ok(overflow(A) == NULL, "B destroyed: A's fallback gives NULL");
    omp_destroy_allocator(A);

    /* Even once B's handle value is reused: a slot's generation shows in 6
     * bits of the handle, so its 64th reuse gives the same value, but the
     * fallback compares the whole generation. Slots are reused FIFO after
     * the never-used ones, so this takes up to 8192 x 64 init/destroy. */
    B = omp_init_allocator(rankmem_omp_device_mem_space, 1, &tb);
    A = with_fb(rankmem_omp_device_mem_space, B);
    omp_destroy_allocator(B);
    omp_allocator_handle_t C = omp_null_allocator;
    long n = 0;
    for (; n < 8192L * 70; n++) {
        C = omp_init_allocator(rankmem_omp_device_mem_space, 1, &tb);
        if (C == B || C == omp_null_allocator)
            break;
        omp_destroy_allocator(C);
    }
    ok(C == B, "B's handle value comes back after %ld allocators", n);
    p = overflow(A);
    ok(p == NULL, "A's fallback does not serve from the new allocator with B's handle");
    omp_free(p, A);
    omp_destroy_allocator(C);
    omp_destroy_allocator(A);

    /* The runtime's: R made through omp_init_allocator, then destroyed. The
     * runtime would read freed memory; the fallback gives NULL instead. */
    omp_alloctrait_t tr = T(omp_atk_alignment, 64);
    omp_allocator_handle_t R = omp_init_allocator(omp_default_mem_space, 1, &tr);
    A = with_fb(rankmem_omp_device_mem_space, R);
    omp_allocator_handle_t W = with_fb(omp_default_mem_space, R);
    void *pa = overflow(A), *pw = overflow(W);
    ok(A != omp_null_allocator && pa && !is_ours(pa), "our allocator falls back to the runtime's R");
    ok(W != omp_null_allocator && pw && !is_ours(pw),
       "a runtime-space allocator falls back to R (through a wrapper of ours)");
    omp_free(pa, A);
    omp_free(pw, W);
    omp_destroy_allocator(R);
    ok(overflow(A) == NULL && overflow(W) == NULL, "R destroyed: both fallbacks give NULL");
    /* The runtime's malloc likely hands R's address to the next one. */
    omp_allocator_handle_t R2 = omp_init_allocator(omp_default_mem_space, 1, &tr);
    diag("the runtime %s R's address", R2 == R ? "reused" : "did not reuse");
    p = overflow(A);
    ok(R2 != omp_null_allocator && p == NULL, "a new runtime allocator (even at R's address) is not R");
    omp_free(p, A);
    void *small = omp_alloc(100, W);
    ok(small && !is_ours(small), "W still serves its own pool");
    omp_free(small, W);
    omp_destroy_allocator(W);
    omp_destroy_allocator(A);
    omp_destroy_allocator(R2);
    ok(with_fb(rankmem_omp_device_mem_space, R2) == omp_null_allocator &&
           with_fb(omp_default_mem_space, R2) == omp_null_allocator,
       "a destroyed runtime allocator is refused as fb_data");
}

/* Targets are older than the allocators that name them: no cycle can form,
 * and a long chain stops after 8 steps. */
static void chains(void)
{
    enum { N = 12 };
    omp_allocator_handle_t c[N];
    omp_alloctrait_t t0[2] = {T(omp_atk_pool_size, 1024), T(omp_atk_fallback, omp_atv_null_fb)};
    c[0] = omp_init_allocator(rankmem_omp_device_mem_space, 2, t0);
    for (int i = 1; i < N; i++)
        c[i] = with_fb(rankmem_omp_device_mem_space, c[i - 1]);
    int made = 1;
    for (int i = 0; i < N; i++)
        made &= ours(c[i]);
    ok(made, "a chain of %d allocators, each falling back to the one before", N);
    ok(overflow(c[N - 1]) == NULL, "a request none can serve ends with NULL (no loop)");
    /* 3 steps from c[3]: c[2], c[1], c[0], all 1 KiB: 900 bytes fit each. */
    void *q[4];
    for (int i = 0; i < 4; i++)
        q[i] = omp_alloc(900, c[3]);
    rankmem_resource_t *m = NULL, *c0 = NULL;
    rankmem_omp_block_info(q[3], NULL, &m);
    rankmem_omp_allocator_resource(c[0], &c0);
    ok(q[0] && q[1] && q[2] && q[3] && m == c0, "a short chain serves down to its end");
    ok(omp_alloc(900, c[3]) == NULL, "... then its end's null_fb");
    for (int i = 0; i < 4; i++)
        omp_free(q[i], omp_null_allocator);
    for (int i = N - 1; i >= 0; i--)
        omp_destroy_allocator(c[i]);
    /* Destroying a target before the allocator naming it is allowed. */
    omp_allocator_handle_t x = omp_init_allocator(rankmem_omp_device_mem_space, 2, t0);
    omp_allocator_handle_t y = with_fb(rankmem_omp_device_mem_space, x);
    omp_destroy_allocator(x);
    void *r = omp_alloc(100, y);
    ok(r && is_ours(r) && overflow(y) == NULL,
       "target destroyed first: its referrer serves its own pool, its fallback gives NULL");
    omp_free(r, y);
    omp_destroy_allocator(y);
}

static void reject(omp_memspace_handle_t m, omp_alloctrait_t t, const char *what)
{
    omp_allocator_handle_t a = omp_init_allocator(m, 1, &t);
    ok(a == omp_null_allocator, "refused on %s space: %s", m == omp_default_mem_space ? "the runtime's" : "our", what);
    if (a != omp_null_allocator)
        omp_destroy_allocator(a);
}

static void accept(omp_memspace_handle_t m, omp_alloctrait_t t, const char *what)
{
    omp_allocator_handle_t a = omp_init_allocator(m, 1, &t);
    void *p = a != omp_null_allocator ? omp_alloc(100, a) : NULL;
    ok(p != NULL, "accepted on %s space: %s", m == omp_default_mem_space ? "the runtime's" : "our",
       what);
    omp_free(p, a);
    if (a != omp_null_allocator)
        omp_destroy_allocator(a);
}

/* The same class of bug in the other traits. */
static void other_traits(void)
{
    omp_memspace_handle_t spaces[2] = {rankmem_omp_device_mem_space, omp_default_mem_space};
    for (int s = 0; s < 2; s++) {
        omp_memspace_handle_t m = spaces[s];
        reject(m, T(0, 1), "key 0");
        reject(m, T(9, 1), "key 9 (unknown)");
        reject(m, T(-1, 1), "key -1");
        reject(m, T(omp_atk_sync_hint, 0), "sync_hint 0");
        reject(m, T(omp_atk_sync_hint, 2), "sync_hint 2");
        reject(m, T(omp_atk_sync_hint, 7), "sync_hint 7");
        reject(m, T(omp_atk_sync_hint, 0x7fffffff), "sync_hint 0x7fffffff");
        reject(m, T(omp_atk_access, omp_atv_private), "access 6");
        reject(m, T(omp_atk_access, 11), "access 11");
        reject(m, T(omp_atk_fallback, 10), "fallback 10");
        reject(m, T(omp_atk_fallback, 15), "fallback 15");
        reject(m, T(omp_atk_fallback, 77), "fallback 77");
        reject(m, T(omp_atk_pinned, 2), "pinned 2");
        reject(m, T(omp_atk_partition, 14), "partition 14");
        reject(m, T(omp_atk_partition, 19), "partition 19");
        reject(m, T(omp_atk_alignment, 0), "alignment 0");
        reject(m, T(omp_atk_alignment, 3), "alignment 3");
        reject(m, T(omp_atk_alignment, 4097), "alignment 4097");
        reject(m, T(omp_atk_alignment, (omp_uintptr_t)1 << 63 | 1), "alignment 2^63 + 1");
        reject(m, T(omp_atk_pool_size, 0), "pool_size 0");
        /* omp_atv_default is the default of every trait (libomp aborted on
         * it for alignment and fallback). */
        for (int k = omp_atk_sync_hint; k <= omp_atk_partition; k++) {
            char what[48];
            snprintf(what, sizeof what, "trait %d = omp_atv_default", k);
            accept(m, T(k, omp_atv_default), what);
        }
        accept(m, T(omp_atk_pool_size, SIZE_MAX), "pool_size SIZE_MAX");
        accept(m, T(omp_atk_alignment, 1), "alignment 1");
    }
    /* Ours only: an alignment rankmem cannot serve would fail every
     * allocation. */
    reject(rankmem_omp_device_mem_space, T(omp_atk_alignment, (omp_uintptr_t)1 << 31),
           "alignment 2 GiB (above the 1 GiB rankmem serves)");
    accept(rankmem_omp_device_mem_space, T(omp_atk_alignment, (omp_uintptr_t)1 << 20),
           "alignment 1 MiB");
    /* A huge pool_size is no pool: requests beyond memory fail, and take
     * the fallback, without wrapping any count. */
    omp_alloctrait_t th[2] = {T(omp_atk_pool_size, SIZE_MAX), T(omp_atk_fallback, omp_atv_null_fb)};
    omp_allocator_handle_t h = omp_init_allocator(rankmem_omp_device_mem_space, 2, th);
    volatile size_t huge = SIZE_MAX - 4096; /* volatile: the compiler would warn of the size */
    void *big = omp_alloc(huge, h), *p = omp_alloc(4096, h);
    ok(!big && p && is_ours(p), "pool_size SIZE_MAX: an impossible request gives NULL, 4 KiB works");
    omp_free(p, h);
    omp_destroy_allocator(h);
}

int main(void)
{
    diag("runtime: %s", RT_NAME);
    garbage_targets();
    destroyed_targets();
    chains();
    other_traits();
    return tap_done();
}
