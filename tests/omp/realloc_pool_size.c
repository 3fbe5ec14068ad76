/* Issue 31, defect 6: omp_realloc near pool_size. With pool_size 4096 and
 * null_fb, a block of 3071 bytes reallocated to 3072 gave NULL: the new
 * block was allocated before the old one was freed, and both had to fit.
 * Now a reallocation within an allocator's own pool_size counts the old
 * block as released (it fits when its result fits); into another
 * allocator, that allocator's pool must hold the new size. The rest of
 * libgomp's omp_realloc semantics, written for this library (the
 * scenarios of libgomp's own allocator tests, not their code): NULL ptr,
 * size 0, omp_null_allocator, a failure leaving the old block valid and
 * unchanged, the target's fallback on failure, its alignment trait. Runs on
 * rankmem_omp_device_mem_space (host memory without a GPU). Also the limit
 * adaptor's call behind it, rankmem_limit_allocate_replacing. Built with
 * gcc/libgomp and clang/libomp. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "omp_test.h"

#define T(k, v) ((omp_alloctrait_t){(omp_alloctrait_key_t)(k), (omp_uintptr_t)(v)})

static omp_allocator_handle_t pool(size_t bytes, omp_uintptr_t fb, omp_uintptr_t fb_data,
                                   omp_uintptr_t sync_hint, size_t alignment)
{
    omp_alloctrait_t t[5] = {T(omp_atk_pool_size, bytes), T(omp_atk_fallback, fb),
                             T(omp_atk_sync_hint, sync_hint), T(omp_atk_alignment, alignment),
                             T(omp_atk_fb_data, fb_data)};
    return omp_init_allocator(rankmem_omp_device_mem_space, fb == omp_atv_allocator_fb ? 5 : 4, t);
}

/* Bytes counted by the allocator's pool_size now. Freed device memory
 * waits for a device sync before it goes back, counted meanwhile: give it
 * back first. */
static size_t used(omp_allocator_handle_t a)
{
    rankmem_resource_t *mr = NULL;
    size_t v = SIZE_MAX;
    rankmem_omp_flush();
    if (rankmem_omp_allocator_resource(a, &mr) == RANKMEM_SUCCESS)
        rankmem_resource_query(mr, RANKMEM_QUERY_USED_CURRENT, &v);
    return v;
}

static size_t size_of(const void *p)
{
    size_t n = 0;
    return rankmem_omp_block_info(p, &n, NULL) == RANKMEM_SUCCESS ? n : 0;
}

/* Contents are checked where the CPU may touch them (everywhere without a
 * GPU; gpu_kernel.t checks device contents with kernels). */
static void fill(void *p, size_t n, unsigned char seed)
{
    unsigned char *c = p;
    if (!p || !host_ok(p))
        return;
    for (size_t i = 0; i < n; i++)
        c[i] = (unsigned char)(seed + i * 7);
}

static int same(const void *p, size_t n, unsigned char seed)
{
    const unsigned char *c = p;
    if (!p)
        return 0;
    if (!host_ok(p))
        return 1;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)(seed + i * 7))
            return 0;
    return 1;
}

/* The reported case, and growing to the pool's last byte. */
static void within_one_pool(omp_uintptr_t sync_hint, const char *how)
{
    omp_allocator_handle_t a = pool(4096, omp_atv_null_fb, 0, sync_hint, 1);
    unsigned char *p = omp_alloc(3071, a);
    fill(p, 3071, 1);
    unsigned char *q = omp_realloc(p, 3072, a, a);
    ok(q && is_ours(q) && size_of(q) == 3072 && same(q, 3071, 1),
       "%s: 3071 -> 3072 bytes in a 4096-byte pool (null_fb) succeeds and keeps the contents", how);
    ok(used(a) == 3072, "%s: the pool counts 3072 bytes (%zu)", how, used(a));
    unsigned char *r = omp_realloc(q, 4096, omp_null_allocator, a);
    ok(r && size_of(r) == 4096 && same(r, 3071, 1) && used(a) == 4096,
       "%s: -> 4096 (the whole pool) through omp_null_allocator", how);
    fill(r, 4096, 2);
    unsigned char *s = omp_realloc(r, 4097, a, a);
    ok(!s && is_ours(r) && size_of(r) == 4096 && same(r, 4096, 2) && used(a) == 4096,
       "%s: -> 4097 gives NULL, the old block valid and unchanged", how);
    /* Two blocks: the reallocated one may take exactly what the other leaves. */
    unsigned char *small = omp_realloc(r, 1000, a, a);
    unsigned char *other = omp_alloc(2000, a);
    ok(small && other && same(small, 1000, 2) && used(a) == 3000,
       "%s: shrink to 1000, another block of 2000", how);
    unsigned char *t = omp_realloc(small, 2096, a, a);
    ok(t && same(t, 1000, 2) && used(a) == 4096, "%s: 1000 -> 2096 fills the pool exactly", how);
    unsigned char *u = omp_realloc(t, 2097, a, a);
    ok(!u && same(t, 1000, 2) && used(a) == 4096, "%s: 2096 -> 2097 does not fit: NULL", how);
    omp_free(t, a);
    omp_free(other, a);
    ok(used(a) == 0, "%s: everything back, the pool counts 0", how);
    omp_destroy_allocator(a);
}

static void aligned_pool(void)
{
    omp_allocator_handle_t a = pool(65536, omp_atv_null_fb, 0, omp_atv_contended, 8192);
    void *p = omp_alloc(30000, a);
    fill(p, 30000, 3);
    size_t before = used(a);
    void *q = omp_realloc(p, 32000, a, a);
    ok(q && aligned_to(q, 8192) && same(q, 30000, 3),
       "alignment 8192: reallocated in its pool (counted %zu, then %zu), aligned, kept", before,
       used(a));
    omp_free(q, a);
    ok(used(a) == 0, "alignment 8192: the pool counts 0 at the end");
    /* omp_aligned_alloc's larger alignment is not kept by omp_realloc (as in
     * libgomp): the result has the allocator's alignment trait. */
    omp_allocator_handle_t b = pool(1 << 20, omp_atv_null_fb, 0, omp_atv_contended, 1024);
    void *r = omp_aligned_alloc(65536, 100, b);
    void *s = omp_realloc(r, 200, b, b);
    ok(aligned_to(r, 65536) && s && aligned_to(s, 1024), "the allocator's alignment trait applies");
    omp_free(s, b);
    omp_destroy_allocator(b);
    omp_destroy_allocator(a);
}

/* A leaf that, like cudaMalloc, gives 256-byte alignment and no more. */
static rankmem_status_t leaf_alloc(void *arg, size_t bytes, size_t alignment,
                                   rankmem_stream_t stream, void **ptr_p)
{
    (void)arg;
    (void)stream;
    if (alignment > 256)
        return RANKMEM_ERR_NOT_SUPPORTED;
    void *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p)
        return RANKMEM_ERR_OUT_OF_MEMORY;
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t leaf_free(void *arg, void *ptr, size_t bytes, size_t alignment,
                                  rankmem_stream_t stream)
{
    (void)arg;
    (void)bytes;
    (void)alignment;
    (void)stream;
    free(ptr);
    return RANKMEM_SUCCESS;
}

/* Over such a leaf an 8192-aligned block is cut from a larger one, and the
 * pool counts (and a reallocation releases) the larger one. */
static void over_aligned_pool(void)
{
    rankmem_resource_t *leaf = NULL, *prev = NULL;
    if (rankmem_callback_create(leaf_alloc, leaf_free, NULL, RANKMEM_PROP_HOST_ACCESSIBLE,
                                &leaf) != RANKMEM_SUCCESS ||
        rankmem_get_current_resource(&prev) != RANKMEM_SUCCESS ||
        rankmem_resource_retain(prev) != RANKMEM_SUCCESS ||
        rankmem_set_current_resource(leaf) != RANKMEM_SUCCESS)
        BAIL_OUT("cannot install a 256-byte-aligned leaf as the current resource");
    const size_t extra = 8192 - 256;
    /* Room for 32000 bytes cut to 8192, not for that and the old block too. */
    omp_allocator_handle_t a = pool(32000 + extra, omp_atv_null_fb, 0, omp_atv_contended, 8192);
    void *p = omp_alloc(30000, a);
    ok(p && aligned_to(p, 8192) && used(a) == 30000 + extra,
       "alignment 8192 over a 256-byte leaf: cut from %zu bytes", used(a));
    fill(p, 30000, 3);
    void *q = omp_realloc(p, 32000, a, a);
    ok(q && aligned_to(q, 8192) && same(q, 30000, 3) && used(a) == 32000 + extra,
       "reallocated to 32000 in a pool of 32000 + %zu: the old cut block counted as released",
       extra);
    omp_free(q, a);
    ok(used(a) == 0, "the pool counts 0 at the end");
    omp_destroy_allocator(a);
    rankmem_set_current_resource(prev);
    rankmem_resource_release(prev);
    rankmem_resource_release(leaf);
}

/* Moving to another allocator: its own pool must hold the new size. */
static void across_pools(void)
{
    omp_allocator_handle_t a = pool(4096, omp_atv_null_fb, 0, omp_atv_contended, 1);
    omp_allocator_handle_t b = pool(4096, omp_atv_null_fb, 0, omp_atv_contended, 1);
    void *p = omp_alloc(3000, a), *held = omp_alloc(2000, b);
    fill(p, 3000, 4);
    void *q = omp_realloc(p, 3000, b, a);
    ok(!q && same(p, 3000, 4) && used(a) == 3000 && used(b) == 2000,
       "into another pool that cannot hold it: NULL, nothing moved");
    q = omp_realloc(p, 2096, b, a);
    ok(q && same(q, 2096, 4) && used(a) == 0 && used(b) == 4096,
       "into another pool that can: moved, counted there only");
    omp_free(q, b);
    omp_free(held, b);
    omp_destroy_allocator(a);
    omp_destroy_allocator(b);
}

/* A reallocation that fails takes the target allocator's fallback. */
static void fallbacks(void)
{
    omp_allocator_handle_t d = pool(4096, omp_atv_default_mem_fb, 0, omp_atv_contended, 1);
    void *p = omp_alloc(3000, d);
    fill(p, 3000, 5);
    /* A device block (on a GPU) cannot be filled here, so its copy in the
     * runtime's host memory holds whatever it held: not compared. */
    int filled = p && host_ok(p);
    uintptr_t pa = addr_of(p);
    void *q = omp_realloc(p, 8000, d, d);
    ok(q && !is_ours(q) && (!filled || same(q, 3000, 5)) && was_freed(pa) && used(d) == 0,
       "default_mem_fb: the runtime's memory takes it, contents copied, old block freed");
    omp_free(q, d);

    omp_allocator_handle_t big = pool(1 << 20, omp_atv_null_fb, 0, omp_atv_contended, 1);
    omp_allocator_handle_t f = pool(4096, omp_atv_allocator_fb, big, omp_atv_contended, 1);
    p = omp_alloc(3000, f);
    fill(p, 3000, 6);
    q = omp_realloc(p, 8000, f, f);
    rankmem_resource_t *m = NULL, *mb = NULL;
    rankmem_omp_block_info(q, NULL, &m);
    rankmem_omp_allocator_resource(big, &mb);
    ok(q && m == mb && same(q, 3000, 6) && used(f) == 0 && used(big) == 8000,
       "allocator_fb: its target takes it");
    /* Realloc of a block that went to the fallback, named by the allocator
     * it was asked of: the new block comes from that allocator again. */
    void *r = omp_realloc(q, 100, f, f);
    ok(r && same(r, 100, 6) && used(f) == 100 && used(big) == 0,
       "back into the first allocator's pool once it fits");
    omp_free(r, f);
    omp_destroy_allocator(f);
    omp_destroy_allocator(big);
    omp_destroy_allocator(d);

    /* abort_fb, in a child so that the abort is observable. */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr))
            _exit(5);
        omp_allocator_handle_t ab = pool(4096, omp_atv_abort_fb, 0, omp_atv_contended, 1);
        void *v = omp_alloc(3071, ab);
        v = omp_realloc(v, 3072, ab, ab); /* fits: no abort */
        if (!v)
            _exit(3);
        v = omp_realloc(v, 5000, ab, ab);
        _exit(4); /* not reached when abort_fb works */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ok(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
       "abort_fb: a reallocation that fits does not abort, one that does not aborts (status %#x)",
       status);
}

static void edges(void)
{
    omp_allocator_handle_t a = pool(4096, omp_atv_null_fb, 0, omp_atv_contended, 1);
    void *p = omp_realloc(NULL, 3000, a, omp_null_allocator);
    ok(p && is_ours(p) && used(a) == 3000, "ptr NULL: allocated from the allocator");
    uintptr_t pa = addr_of(p);
    ok(omp_realloc(p, 0, a, a) == NULL && was_freed(pa) && used(a) == 0, "size 0: freed, NULL");
    ok(omp_realloc(NULL, 0, a, a) == NULL, "ptr NULL and size 0: NULL");
    /* free_allocator does not decide where a block of ours goes back. */
    p = omp_alloc(3071, a);
    void *q = omp_realloc(p, 3072, omp_null_allocator, omp_default_mem_alloc);
    ok(q && is_ours(q) && used(a) == 3072,
       "omp_null_allocator: the block's own allocator, whatever free_allocator says");
    omp_free(q, a);
    /* The default allocator, for a NULL ptr. */
    omp_set_default_allocator(a);
    p = omp_realloc(NULL, 4000, omp_null_allocator, omp_null_allocator);
    q = omp_realloc(p, 4096, omp_null_allocator, omp_null_allocator);
    ok(p && q && used(a) == 4096, "omp_null_allocator everywhere: the default allocator");
    omp_set_default_allocator(omp_default_mem_alloc);
    omp_free(q, omp_null_allocator);
    omp_destroy_allocator(a);
}

/* omp_realloc, again after a flush while it gives NULL. With deferral
 * (device memory on a GPU, or the test switch) freed blocks stay counted
 * until a device sync; a failed request gives them back and retries once,
 * but the other threads may have freed as much again by then. A NULL
 * leaves p as it was. */
static void *realloc_retry(void *p, size_t m, omp_allocator_handle_t a)
{
    void *q = omp_realloc(p, m, a, a);
    for (int retry = 0; !q && retry < 100 && rankmem_omp_flush() == RANKMEM_SUCCESS; retry++)
        q = omp_realloc(p, m, a, a);
    return q;
}

/* Threads reallocating in one pool, each within its share, nothing lost or
 * counted twice. The pool has room for every share twice: while a
 * reallocation copies, its old block still counts for the other threads
 * (docs/openmp.md), so with less room a request could meet another's old
 * block. (Sums by atomics: libgomp's reductions are not instrumented for
 * ThreadSanitizer.) */
static void threads(void)
{
    enum { NT = 4, SHARE = 4096 };
    omp_allocator_handle_t a = pool(2 * NT * SHARE, omp_atv_null_fb, 0, omp_atv_contended, 1);
    /* Static, not on the stack: TSan does not see libgomp's join, so a
     * later frame over the same bytes would look like a race. */
    static int bad;
#pragma omp parallel num_threads(NT)
    {
        unsigned char seed = (unsigned char)(omp_get_thread_num() * 31);
        int mine = 0;
        size_t n = 1;
        unsigned char *p = realloc_retry(NULL, n, a);
        if (p)
            fill(p, n, seed);
        else
            mine++;
        for (int i = 0; i < 2000 && p; i++) {
            size_t m = (size_t)(i * 2654435761u) % SHARE + 1;
            unsigned char *q = realloc_retry(p, m, a);
            if (!q) {
                mine++;
                break;
            }
            if (!same(q, n < m ? n : m, seed))
                mine++;
            fill(q, m, seed);
            p = q;
            n = m;
        }
        omp_free(p, a);
        __atomic_add_fetch(&bad, mine, __ATOMIC_RELAXED);
    }
    size_t left = used(a);
    int failed = __atomic_load_n(&bad, __ATOMIC_RELAXED);
    ok(failed == 0 && left == 0,
       "%d threads reallocating within their share of one pool: every one fits, pool back to 0 "
       "(%d failed, %zu bytes left)",
       NT, failed, left);
    omp_destroy_allocator(a);
}

/* The limit adaptor's call under it. */
static void limit_call(void)
{
    rankmem_resource_t *sys = NULL, *lim = NULL;
    void *old = NULL, *n = NULL, *x = NULL;
    size_t v = 0;
    if (rankmem_system_create(&sys) != RANKMEM_SUCCESS || rankmem_limit_create(sys, 4096, &lim) != RANKMEM_SUCCESS)
        BAIL_OUT("cannot make a limit over the system resource");
    is_status(rankmem_limit_allocate_replacing(NULL, 8, 0, 0, &n), RANKMEM_ERR_INVALID_ARGUMENT,
              "replacing: NULL resource");
    is_status(rankmem_limit_allocate_replacing(lim, 8, 0, 0, NULL), RANKMEM_ERR_INVALID_ARGUMENT,
              "replacing: NULL output");
    is_status(rankmem_limit_allocate_replacing(sys, 8, 0, 0, &n), RANKMEM_ERR_INVALID_ARGUMENT,
              "replacing: not a limit adaptor");
    is_status(rankmem_limit_allocate_replacing(lim, 0, 0, 0, &n), RANKMEM_ERR_INVALID_ARGUMENT,
              "replacing: 0 bytes");
    is_status(rankmem_limit_allocate_replacing(lim, 8, 384, 0, &n), RANKMEM_ERR_INVALID_ARGUMENT,
              "replacing: alignment not a power of two");
    is_status(rankmem_limit_allocate_replacing(lim, SIZE_MAX - 10, 0, 0, &n),
              RANKMEM_ERR_OUT_OF_MEMORY, "replacing: a size no memory holds");
    ok(n == NULL, "nothing written on failure");
    rankmem_allocate(lim, 3000, 0, &old);
    is_status(rankmem_limit_allocate_replacing(lim, 4000, 0, 0, &n), RANKMEM_ERR_LIMIT,
              "replacing nothing: 3000 + 4000 does not fit 4096");
    is_status(rankmem_limit_allocate_replacing(lim, 4000, 0, 3000, &n), RANKMEM_SUCCESS,
              "replacing the 3000-byte block: 4000 fits");
    rankmem_resource_query(lim, RANKMEM_QUERY_USED_CURRENT, &v);
    ok(v == 7000, "until the old block goes, both are counted (%zu)", v);
    is_status(rankmem_allocate(lim, 1, 0, &x), RANKMEM_ERR_LIMIT,
              "meanwhile another request sees no room (no wrap past the limit)");
    is_status(rankmem_limit_allocate_replacing(lim, 100, 0, 1000, &x), RANKMEM_ERR_LIMIT,
              "nor does a second replacement that only fits with the first's room");
    rankmem_deallocate(lim, old, 3000, 0);
    rankmem_resource_query(lim, RANKMEM_QUERY_USED_CURRENT, &v);
    size_t high = 0;
    rankmem_resource_query(lim, RANKMEM_QUERY_USED_HIGH, &high);
    ok(v == 4000 && high == 4000, "old block freed: 4000 counted, high-water mark %zu", high);
    is_status(rankmem_limit_allocate_replacing(lim, 4097, 0, 4000, &x), RANKMEM_ERR_LIMIT,
              "a replacement whose result exceeds the limit is refused");
    is_status(rankmem_limit_allocate_replacing(lim, 200, 0, SIZE_MAX, &x), RANKMEM_SUCCESS,
              "a credit larger than the count releases only the count");
    rankmem_deallocate(lim, n, 4000, 0);
    rankmem_deallocate(lim, x, 200, 0);
    rankmem_resource_query(lim, RANKMEM_QUERY_USED_CURRENT, &v);
    ok(v == 0, "everything freed: 0 counted");
    rankmem_resource_release(lim);
    rankmem_resource_release(sys);
}

/* Without a GPU nothing waits for a device sync: run the reallocations once
 * more with the test switch (read when the library starts), which sends
 * freed host blocks of ours through the deferred release, as device memory
 * goes on a GPU. Its TAP output is not shown: RKOMP_TEST_DEFER=1 and this
 * program run it by hand. */
static void again_deferred(char **argv)
{
    int ngpu = 0;
    rankmem_device_count(&ngpu);
    if (ngpu > 0) {
        tap_skip(1, "a GPU: device memory took the deferred release already");
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr))
            _exit(98);
        setenv("RKOMP_TEST_DEFER", "1", 1);
        execv("/proc/self/exe", argv);
        _exit(99);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    ok(WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "all of it again with deferred release (RKOMP_TEST_DEFER=1; status %#x)", status);
}

int main(int argc, char **argv)
{
    (void)argc;
    diag("runtime: %s%s", RT_NAME, getenv("RKOMP_TEST_DEFER") ? ", RKOMP_TEST_DEFER=1" : "");
    within_one_pool(omp_atv_contended, "pool_size");
    within_one_pool(omp_atv_private, "pool_size + sync_hint private");
    aligned_pool();
    over_aligned_pool();
    across_pools();
    fallbacks();
    edges();
    threads();
    limit_call();
    if (!getenv("RKOMP_TEST_DEFER"))
        again_deferred(argv);
    return tap_done();
}
