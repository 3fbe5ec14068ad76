/* librankmem_omp: omp_init_allocator on rankmem's memory spaces, every trait
 * and its invalid values, the fallbacks (null_fb, default_mem_fb,
 * allocator_fb chains, abort_fb in a child process) on a full pool_size,
 * omp_destroy_allocator (twice, predefined, the runtime's twice), and a
 * runtime memory space whose fallback is one of ours. Built with
 * gcc/libgomp and clang/libomp. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "omp_test.h"

#define T(k, v) ((omp_alloctrait_t){(k), (omp_uintptr_t)(v)})

static omp_allocator_handle_t make1(omp_memspace_handle_t m, omp_alloctrait_t t)
{
    return omp_init_allocator(m, 1, &t);
}

static int ours(omp_allocator_handle_t a)
{
    int o = 0;
    return rankmem_omp_is_rankmem_allocator(a, &o) == RANKMEM_SUCCESS && o;
}

/* A valid single trait: allocator made, serves a block, destroyed. */
static void accept1(omp_memspace_handle_t m, omp_alloctrait_t t, const char *what)
{
    omp_allocator_handle_t a = make1(m, t);
    void *p = a != omp_null_allocator ? omp_alloc(100, a) : NULL;
    ok(ours(a) && is_ours(p), "accepted: %s", what);
    omp_free(p, a);
    omp_destroy_allocator(a);
}

static void reject1(omp_memspace_handle_t m, omp_alloctrait_t t, const char *what)
{
    ok(make1(m, t) == omp_null_allocator, "rejected: %s", what);
}

static void each_trait(void)
{
    omp_memspace_handle_t d = rankmem_omp_device_mem_space;
    omp_allocator_handle_t none = omp_init_allocator(d, 0, NULL);
    ok(ours(none), "no traits");
    omp_destroy_allocator(none);
    accept1(d, T(omp_atk_sync_hint, omp_atv_contended), "sync_hint contended");
    accept1(d, T(omp_atk_sync_hint, omp_atv_uncontended), "sync_hint uncontended");
    accept1(d, T(omp_atk_sync_hint, omp_atv_serialized), "sync_hint serialized");
    accept1(d, T(omp_atk_sync_hint, omp_atv_private), "sync_hint private");
    accept1(d, T(omp_atk_sync_hint, omp_atv_default), "sync_hint default");
    accept1(d, T(omp_atk_alignment, 64), "alignment 64");
    accept1(d, T(omp_atk_access, omp_atv_all), "access all");
    accept1(d, T(omp_atk_access, omp_atv_cgroup), "access cgroup");
    accept1(d, T(omp_atk_access, omp_atv_pteam), "access pteam");
    accept1(d, T(omp_atk_access, omp_atv_thread), "access thread");
    accept1(d, T(omp_atk_pool_size, 1 << 20), "pool_size 1 MiB");
    accept1(d, T(omp_atk_fallback, omp_atv_default_mem_fb), "fallback default_mem_fb");
    accept1(d, T(omp_atk_fallback, omp_atv_null_fb), "fallback null_fb");
    accept1(d, T(omp_atk_fallback, omp_atv_abort_fb), "fallback abort_fb");
    accept1(d, T(omp_atk_fb_data, rankmem_omp_pinned_mem_alloc), "fb_data alone (unused)");
    accept1(d, T(omp_atk_pinned, omp_atv_true), "pinned true on device memory");
    accept1(d, T(omp_atk_pinned, omp_atv_false), "pinned false");
    accept1(rankmem_omp_pinned_mem_space, T(omp_atk_pinned, omp_atv_true),
            "pinned true on the pinned space");
    accept1(d, T(omp_atk_partition, omp_atv_environment), "partition environment");
    accept1(d, T(omp_atk_partition, omp_atv_nearest), "partition nearest");
    accept1(d, T(omp_atk_partition, omp_atv_blocked), "partition blocked");
    accept1(d, T(omp_atk_partition, omp_atv_interleaved), "partition interleaved");
    accept1(rankmem_omp_managed_mem_space, T(omp_atk_pool_size, 4096), "managed with pool_size");

    reject1(d, T(99, 1), "unknown key");
    reject1(d, T(omp_atk_sync_hint, omp_atv_all), "sync_hint all");
    reject1(d, T(omp_atk_alignment, 3), "alignment 3");
    reject1(d, T(omp_atk_alignment, 0), "alignment 0");
    reject1(d, T(omp_atk_access, omp_atv_private), "access private");
    reject1(d, T(omp_atk_pool_size, 0), "pool_size 0");
    reject1(d, T(omp_atk_fallback, omp_atv_true), "fallback true");
    reject1(d, T(omp_atk_fallback, omp_atv_allocator_fb), "allocator_fb without fb_data");
    reject1(d, T(omp_atk_fb_data, omp_null_allocator), "fb_data omp_null_allocator");
    reject1(d, T(omp_atk_pinned, 5), "pinned 5");
    reject1(rankmem_omp_managed_mem_space, T(omp_atk_pinned, omp_atv_true),
            "pinned true on managed memory");
    reject1(d, T(omp_atk_partition, omp_atv_thread), "partition thread");
    ok(omp_init_allocator(d, -1, NULL) == omp_null_allocator, "rejected: ntraits -1");
    ok(omp_init_allocator(d, 1, NULL) == omp_null_allocator, "rejected: NULL traits");

    /* Alignment trait: every block of the allocator, and omp_aligned_alloc's
     * larger alignment wins. */
    omp_allocator_handle_t a = make1(d, T(omp_atk_alignment, 8192));
    void *p = omp_alloc(10, a), *q = omp_aligned_alloc(16384, 10, a), *r = omp_aligned_alloc(64, 10, a);
    ok(aligned_to(p, 8192) && aligned_to(q, 16384) && aligned_to(r, 8192),
       "alignment trait 8192 applies, a larger argument wins");
    omp_free(p, a);
    omp_free(q, a);
    omp_free(r, a);
    omp_destroy_allocator(a);

    /* A destroyed allocator as fb_data. */
    omp_allocator_handle_t gone = make1(d, T(omp_atk_alignment, 512));
    omp_destroy_allocator(gone);
    omp_alloctrait_t fb[2] = {T(omp_atk_fallback, omp_atv_allocator_fb), T(omp_atk_fb_data, gone)};
    ok(omp_init_allocator(d, 2, fb) == omp_null_allocator, "rejected: fb_data destroyed");
}

static void fallbacks(void)
{
    omp_memspace_handle_t d = rankmem_omp_device_mem_space;
    /* null_fb on a full pool. */
    omp_alloctrait_t tn[2] = {T(omp_atk_pool_size, 4096), T(omp_atk_fallback, omp_atv_null_fb)};
    omp_allocator_handle_t n = omp_init_allocator(d, 2, tn);
    void *a = omp_alloc(3000, n), *b = omp_alloc(3000, n);
    ok(a && !b, "null_fb: the second 3000 bytes of a 4096-byte pool_size give NULL");
    void *c = omp_calloc(2, 2000, n);
    ok(!c, "null_fb: omp_calloc past the pool gives NULL too");
    omp_free(a, n);
    b = omp_alloc(4096, n);
    ok(b && is_ours(b), "after omp_free the whole pool_size is available again");
    rankmem_resource_t *chain = NULL;
    size_t lim = 0;
    ok(rankmem_omp_allocator_resource(n, &chain) == RANKMEM_SUCCESS &&
           rankmem_resource_query(chain, RANKMEM_QUERY_LIMIT, &lim) == RANKMEM_SUCCESS &&
           lim == 4096,
       "pool_size is a limit of 4096 bytes on the chain");
    omp_free(b, n);

    /* default_mem_fb: the runtime's omp_default_mem_alloc takes over. */
    omp_alloctrait_t td[1] = {T(omp_atk_pool_size, 4096)};
    omp_allocator_handle_t df = omp_init_allocator(d, 1, td);
    void *x = omp_alloc(3000, df), *y = omp_alloc(3000, df);
    ok(is_ours(x) && y && !is_ours(y), "default_mem_fb (the default): the runtime serves the rest");
    unsigned char *yc = omp_calloc(1, 3000, df);
    ok(yc && !is_ours(yc) && all_bytes(yc, 0, 3000), "default_mem_fb: omp_calloc zeroes");
    omp_free(y, df); /* the runtime's block, our handle */
    omp_free(yc, df);
    omp_free(x, df);

    /* allocator_fb chain: A (4 KiB) -> B (8 KiB, null_fb). */
    omp_alloctrait_t tb[2] = {T(omp_atk_pool_size, 8192), T(omp_atk_fallback, omp_atv_null_fb)};
    omp_allocator_handle_t B = omp_init_allocator(d, 2, tb);
    omp_alloctrait_t ta[3] = {T(omp_atk_pool_size, 4096), T(omp_atk_fallback, omp_atv_allocator_fb),
                              T(omp_atk_fb_data, B)};
    omp_allocator_handle_t A = omp_init_allocator(d, 3, ta);
    rankmem_resource_t *ca = NULL, *cb = NULL, *m1 = NULL, *m2 = NULL, *m3 = NULL;
    rankmem_omp_allocator_resource(A, &ca);
    rankmem_omp_allocator_resource(B, &cb);
    void *p1 = omp_alloc(4000, A), *p2 = omp_alloc(4000, A), *p3 = omp_alloc(4000, A),
         *p4 = omp_alloc(4000, A);
    rankmem_omp_block_info(p1, NULL, &m1);
    rankmem_omp_block_info(p2, NULL, &m2);
    rankmem_omp_block_info(p3, NULL, &m3);
    ok(m1 == ca && m2 == cb && m3 == cb && !p4,
       "allocator_fb: A fills, then B, then B's null_fb gives NULL");
    /* omp_free needs no allocator: each block goes back to its own chain. */
    omp_free(p2, A);
    omp_free(p1, omp_null_allocator);
    omp_free(p3, B);
    void *p5 = omp_alloc(8000, B);
    ok(p5 != NULL, "every block went back to its own pool_size");
    omp_free(p5, B);
    omp_destroy_allocator(A);
    omp_destroy_allocator(B);

    /* allocator_fb to the runtime's allocator. */
    omp_alloctrait_t tr[3] = {T(omp_atk_pool_size, 1024), T(omp_atk_fallback, omp_atv_allocator_fb),
                              T(omp_atk_fb_data, omp_default_mem_alloc)};
    omp_allocator_handle_t R = omp_init_allocator(d, 3, tr);
    void *big = omp_alloc(100000, R);
    ok(R != omp_null_allocator && big && !is_ours(big), "allocator_fb to omp_default_mem_alloc");
    omp_free(big, R);
    omp_destroy_allocator(R);

    /* abort_fb: in a child, so that the abort is observable. */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        omp_alloctrait_t tab[2] = {T(omp_atk_pool_size, 1024), T(omp_atk_fallback, omp_atv_abort_fb)};
        omp_allocator_handle_t ab = omp_init_allocator(rankmem_omp_device_mem_space, 2, tab);
        void *v = omp_alloc(2048, ab);
        _exit(v ? 3 : 4); /* not reached when abort_fb works */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ok(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "abort_fb aborts (status %#x)", status);

    /* sync_hint private: a per-thread cache over the space. */
    omp_allocator_handle_t pv = make1(d, T(omp_atk_sync_hint, omp_atv_private));
    rankmem_resource_t *pc = NULL;
    const char *name = "";
    rankmem_omp_allocator_resource(pv, &pc);
    rankmem_resource_name(pc, &name);
    int good = 1;
    for (int i = 0; i < 100; i++) {
        unsigned char *v = omp_alloc((size_t)(i % 7 + 1) * 100, pv);
        good &= v != NULL && is_ours(v);
        omp_free(v, pv);
    }
    ok(good && strcmp(name, "caching") == 0, "sync_hint private: served by a '%s' chain", name);
    omp_destroy_allocator(pv);
}

static void destroy(void)
{
    omp_allocator_handle_t a = make1(rankmem_omp_pinned_mem_space, T(omp_atk_alignment, 512));
    void *live = omp_alloc(100, a);
    omp_destroy_allocator(a);
    ok(!ours(a), "destroyed: no longer an allocator of ours");
    ok(omp_alloc(10, a) == NULL, "omp_alloc through a destroyed allocator gives NULL");
    ok(is_ours(live), "a block outliving its allocator is still known");
    uintptr_t la = addr_of(live);
    omp_free(live, a);
    ok(was_freed(la), "... and is freed through the chain it came from");
    omp_destroy_allocator(a); /* reported on stderr, ignored */
    omp_allocator_handle_t b = make1(rankmem_omp_pinned_mem_space, T(omp_atk_alignment, 512));
    ok(ours(b) && b != a, "a new allocator gets a new handle");
    omp_destroy_allocator(a); /* stale: must not destroy b */
    ok(ours(b), "a second destroy of the old handle leaves the new one alone");
    omp_destroy_allocator(b);

    omp_destroy_allocator(rankmem_omp_device_mem_alloc); /* ignored */
    void *p = omp_alloc(10, rankmem_omp_device_mem_alloc);
    ok(is_ours(p), "predefined allocators survive omp_destroy_allocator");
    omp_free(p, rankmem_omp_device_mem_alloc);
    omp_destroy_allocator(omp_null_allocator);

    /* The runtime's allocator destroyed twice: the second is ignored rather
     * than freeing the runtime's struct again. */
    omp_alloctrait_t t = T(omp_atk_alignment, 64);
    omp_allocator_handle_t u = omp_init_allocator(omp_default_mem_space, 1, &t);
    omp_destroy_allocator(u);
    omp_destroy_allocator(u);
    omp_allocator_handle_t u2 = omp_init_allocator(omp_default_mem_space, 1, &t);
    void *q = omp_alloc(10, u2);
    ok(q && aligned_to(q, 64), "the runtime still works after a double destroy");
    omp_free(q, u2);
    omp_destroy_allocator(u2);
    omp_destroy_allocator(omp_default_mem_alloc); /* predefined: the runtime ignores it */
    q = omp_alloc(10, omp_default_mem_alloc);
    ok(q != NULL, "omp_default_mem_alloc survives omp_destroy_allocator");
    omp_free(q, omp_default_mem_alloc);
}

/* A runtime memory space whose allocator_fb is ours: the runtime never sees
 * our handle. */
static void foreign_space_our_fallback(void)
{
    omp_alloctrait_t t[3] = {T(omp_atk_pool_size, 4096), T(omp_atk_fallback, omp_atv_allocator_fb),
                             T(omp_atk_fb_data, rankmem_omp_managed_mem_alloc)};
    omp_allocator_handle_t a = omp_init_allocator(omp_default_mem_space, 3, t);
    ok(a != omp_null_allocator, "omp_default_mem_space with allocator_fb = ours");
    void *small = omp_alloc(1000, a), *big = omp_alloc(100000, a);
    ok(small && !is_ours(small), "... the runtime serves what fits its pool_size");
    ok(big && is_ours(big), "... rankmem serves the fallback");
    omp_free(small, a);
    omp_free(big, a);
    omp_destroy_allocator(a);
    omp_alloctrait_t t2[2] = {T(omp_atk_fb_data, rankmem_omp_managed_mem_alloc),
                              T(omp_atk_alignment, 256)};
    omp_allocator_handle_t b = omp_init_allocator(omp_default_mem_space, 2, t2);
    void *s = omp_alloc(10, b);
    ok(b != omp_null_allocator && s && !is_ours(s) && aligned_to(s, 256),
       "fb_data of ours without allocator_fb: the runtime's allocator, fb_data dropped");
    omp_free(s, b);
    omp_destroy_allocator(b);
}

int main(void)
{
    diag("runtime: %s", RT_NAME);
    each_trait();
    fallbacks();
    destroy();
    foreign_space_our_fallback();
    return tap_done();
}
