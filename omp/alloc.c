/* The omp_alloc family, libgomp's GOMP_alloc/GOMP_free (GCC's allocate
 * clause) and libomp's __kmpc_* (clang's allocate clause). Handles and
 * pointers of ours are served by rankmem; everything else goes to the
 * runtime's own function unchanged, so programs that never use our
 * allocators behave exactly as before.
 *
 * Stream rule (docs/openmp.md): our blocks are allocated and freed with the
 * synchronous rankmem calls, i.e. ordered on the legacy default stream. Zero
 * fills and copies of device memory run on that stream and are waited for
 * before the call returns. Device-accessible memory freed by omp_free goes
 * back only after a wait for the block's device that began after the free
 * (as cudaFree waits), so a kernel still using the block on any stream is
 * safe: one cudaDeviceSynchronize serves many frees (blockmap.c, "Deferred
 * release"), or one per free with RANKMEM_OMP_DEFER_BYTES=0.
 * RANKMEM_OMP_FREE_SYNC=0 skips the wait for programs whose device work on
 * the block is ordered before the free on the default stream (or already
 * synchronised). */
#include "omp_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if HAVE_GPU
#include "../src/gpu_api.h" /* CUDA, or HIP through the same names */
#endif

#define RKOMP_MAX_FB_DEPTH 8

/* ---- GPU helpers (no-ops without a GPU: every resource is host memory) ---- */

#define gpu_count rkomp_gpu_count

#if HAVE_GPU
/* Make dev current (when it is a device other than the current one);
 * returns the device to restore, or -1 for nothing to restore. */
static int enter_device(int dev)
{
    int cur;
    /* With one visible device it is always the current one: no runtime call
     * (this is on every omp_free of device memory). */
    if (dev < 0 || gpu_count() == 1 || cudaGetDevice(&cur) != cudaSuccess || cur == dev)
        return -1;
    return cudaSetDevice(dev) == cudaSuccess ? cur : -1;
}
static void leave_device(int prev)
{
    if (prev >= 0)
        cudaSetDevice(prev);
}
#endif

static int host_accessible(const rankmem_resource_t *mr)
{
    return !gpu_count() || (mr->props & RANKMEM_PROP_HOST_ACCESSIBLE);
}

/* Zero a fresh block: memset where the CPU may write, else cudaMemset on the
 * default stream, waited for so that the zeroes are visible on every stream. */
static int zero_fill(rankmem_resource_t *mr, void *p, size_t n)
{
    if (host_accessible(mr)) {
        memset(p, 0, n);
        return 0;
    }
#if HAVE_GPU
    int prev = enter_device(mr->device);
    cudaError_t err = cudaMemset(p, 0, n);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(0);
    leave_device(prev);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
#else
    return -1;
#endif
}

/* Whether the CPU may touch p: ours by its resource; a runtime's block is
 * host memory unless a GPU exists (then unknown: let the runtime decide). */
static int ptr_host_accessible(const void *p)
{
    rkomp_block_t b;
    if (!gpu_count())
        return 1;
    if (rkomp_map_maybe(p) && rkomp_map_get(p, &b))
        return host_accessible(b.mr);
    return 0;
}

/* Copy n bytes between blocks of any kind: memcpy when both are host
 * memory, else cudaMemcpy with cudaMemcpyDefault (unified addressing finds
 * the direction), waited for on the default stream. 0 on success. */
static int copy_bytes(void *dst, const void *src, size_t n)
{
    if (!n)
        return 0;
    if (ptr_host_accessible(dst) && ptr_host_accessible(src)) {
        memcpy(dst, src, n);
        return 0;
    }
#if HAVE_GPU
    cudaError_t err = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
    if (err == cudaSuccess)
        err = cudaStreamSynchronize(0);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
#else
    return -1;
#endif
}

/* Give a block back to the resource it came from (blockmap.c then stops
 * counting it; nothing here touches the resource after rankmem_deallocate). */
void rkomp_give_back(const rkomp_block_t *b, int immediate)
{
#if HAVE_GPU
    int prev = -1;
    if (gpu_count() && (b->mr->props & RANKMEM_PROP_DEVICE_ACCESSIBLE)) {
        prev = enter_device(b->mr->device);
        /* A pending block's wait was its sync epoch (blockmap.c). */
        if (immediate && rkomp_free_sync() && cudaDeviceSynchronize() != cudaSuccess)
            (void)cudaGetLastError(); /* a failed kernel is not this free's failure */
    }
#else
    (void)immediate;
#endif
    rankmem_block_t r = rkomp_returned(b);
    rankmem_status_t st = rankmem_deallocate(b->mr, r.ptr, r.bytes, r.alignment);
#if HAVE_GPU
    leave_device(prev);
#endif
    if (RKOMP_UNLIKELY(st != RANKMEM_SUCCESS))
        rkomp_give_back_failed(b, st);
}

void rkomp_give_back_many_failed(const rankmem_resource_t *mr, size_t n, size_t failed,
                                 rankmem_status_t st)
{
    fprintf(stderr, "rankmem_omp: omp_free: %zu of %zu blocks could not go back to '%s': %s: %s\n",
            failed, n, mr->ops->name, rankmem_status_string(st), rankmem_last_error());
}

void rkomp_give_back_failed(const rkomp_block_t *b, rankmem_status_t st)
{
    fprintf(stderr, "rankmem_omp: omp_free(%p): %s: %s\n", b->ptr, rankmem_status_string(st),
            rankmem_last_error());
}

int rkomp_sync_device(int dev)
{
#if HAVE_GPU
    if (!gpu_count())
        return 0; /* the test switch: host blocks, nothing to wait for */
    int prev = enter_device(dev);
    cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess)
        (void)cudaGetLastError(); /* a failed kernel is not the free's failure */
    leave_device(prev);
    return err == cudaSuccess ? 0 : -1;
#else
    (void)dev;
    return 0;
#endif
}

/* ---- serving one of our allocators ---- */

/* rankmem_allocate, or for a reallocation inside a pool_size (mr is then
 * the allocator's limit) one that counts the old block as released. */
static inline rankmem_status_t rk_alloc(rankmem_resource_t *mr, size_t size, size_t al,
                                        size_t credit, void **p)
{
    if (RKOMP_LIKELY(!credit))
        return rankmem_allocate(mr, size, al, p);
    return rankmem_limit_allocate_replacing(mr, size, al, credit, p);
}

static size_t max3(size_t a, size_t b, size_t c)
{
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* One attempt through the allocator's own memory, no fallback. credit: a
 * reallocation within the allocator's own pool_size, the bytes its old
 * block holds there (rankmem_limit_allocate_replacing); else 0. */
static void *serve(rkomp_allocator_t *a, size_t alignment, size_t size, int zero, size_t credit)
{
    if (a->space == RKOMP_SPACE_FOREIGN) {
        const rkomp_runtime_t *r = rkomp_rt();
        size_t al = alignment > a->alignment ? alignment : a->alignment;
        if (zero)
            return r->aligned_calloc ? r->aligned_calloc(al, 1, size, a->foreign) : NULL;
        return r->aligned_alloc ? r->aligned_alloc(al, size, a->foreign) : NULL;
    }
    /* The block must keep its resource alive until freed (the current
     * resource may be replaced and the allocator destroyed meanwhile): it is
     * counted by the resource's entry (blockmap.c), which holds one reference
     * for all its blocks; shared resources live as long as the process. */
    rankmem_resource_t *mr;
    int ent;
    if (a->chain) {
        mr = a->chain;
        ent = rkomp_ent_pin(a->ent, mr) ? a->ent : RKOMP_ENT_OWN;
    } else if (a->space == RKOMP_SPACE_DEVICE) {
        int dev;
        if (rkomp_device_resource(&mr, &dev) != RANKMEM_SUCCESS)
            return NULL;
        ent = rkomp_device_ent(dev, mr);
    } else {
        if (!(mr = rkomp_shared_resource(a->space)))
            return NULL;
        ent = RKOMP_ENT_NONE;
    }
    if (ent == RKOMP_ENT_OWN && rankmem_resource_retain(mr) != RANKMEM_SUCCESS)
        return NULL;
    size_t al = max3(alignment, a->alignment, RANKMEM_DEFAULT_ALIGNMENT);
    void *p = NULL;
    rkomp_block_t b = {NULL, mr, size, al, rkomp_handle_of(a), NULL, 0, ent};
    if (rk_alloc(mr, size, al, credit, &p) != RANKMEM_SUCCESS) {
        /* Leaves such as cudaMalloc promise only 256 bytes: a larger
         * alignment is served by over-allocating and rounding up. */
        size_t extra = al - RANKMEM_DEFAULT_ALIGNMENT;
        if (al <= RANKMEM_DEFAULT_ALIGNMENT || size > SIZE_MAX - extra ||
            rk_alloc(mr, size + extra, RANKMEM_DEFAULT_ALIGNMENT, credit, &b.base) !=
                RANKMEM_SUCCESS) {
            if (ent == RKOMP_ENT_OWN)
                rankmem_resource_release(mr);
            return NULL;
        }
        rankmem_clear_error(); /* the first refusal is not this call's failure */
        b.base_bytes = size + extra;
        p = (void *)(((uintptr_t)b.base + al - 1) & ~(uintptr_t)(al - 1));
    }
    b.ptr = p;
    int ins = -1;
    if (!zero || zero_fill(mr, p, size) == 0)
        ins = rkomp_map_insert(&b);
    return RKOMP_LIKELY(ins == 0) ? p : rkomp_serve_tail(&b, ins);
}

void *rkomp_serve_tail(rkomp_block_t *b, int ins)
{
    if (ins == 1) {
        /* The entry was retired under us: the block takes a reference of
         * its own, unless the resource has none left: then it is gone, so
         * is the block; nothing can be given back. */
        if (rankmem_resource_retain(b->mr) == RANKMEM_SUCCESS)
            return b->ptr;
        rkomp_map_forget(b->ptr);
        return NULL;
    }
    /* Not recorded (no memory for the map, or the zero fill failed). */
    rankmem_block_t r = rkomp_returned(b);
    rankmem_deallocate(b->mr, r.ptr, r.bytes, r.alignment);
    if (b->ent == RKOMP_ENT_OWN)
        rankmem_resource_release(b->mr);
    return NULL;
}

static void *alloc_any(rkomp_handle_t h, size_t alignment, size_t size, int zero, int depth);
static void *apply_fallback(rkomp_allocator_t *a, size_t alignment, size_t size, int zero,
                            int depth);

void *rkomp_alloc_ours(rkomp_allocator_t *a, size_t alignment, size_t size, int zero, int depth)
{
    void *p = serve(a, alignment, size, zero, 0);
    return RKOMP_LIKELY(p != NULL) ? p : rkomp_alloc_failed(a, alignment, size, zero, depth);
}

/* Blocks waiting for a device sync may be what is missing: give them all
 * back, then try once more. NULL when that did not help. */
static void *retry_after_flush(rkomp_allocator_t *a, size_t alignment, size_t size, int zero,
                               size_t credit)
{
    void *p;
    if (a->space != RKOMP_SPACE_FOREIGN && rkomp_defer_on() && rkomp_map_flush(NULL, NULL) &&
        (p = serve(a, alignment, size, zero, credit)) != NULL) {
        rankmem_clear_error(); /* the first refusal is not this call's failure */
        return p;
    }
    return NULL;
}

void *rkomp_alloc_failed(rkomp_allocator_t *a, size_t alignment, size_t size, int zero, int depth)
{
    void *p = retry_after_flush(a, alignment, size, zero, 0);
    return p ? p : apply_fallback(a, alignment, size, zero, depth);
}

void *rkomp_runtime_alloc(rkomp_handle_t h, size_t alignment, size_t size, int zero)
{
    const rkomp_runtime_t *r = rkomp_rt();
    if (alignment < 1)
        alignment = 1;
    if (zero)
        return r->aligned_calloc ? r->aligned_calloc(alignment, 1, size, h) : NULL;
    return r->aligned_alloc ? r->aligned_alloc(alignment, size, h) : NULL;
}

/* allocator_fb: a's fb_data, if it is still the allocator it was when a
 * was made (omp_init_allocator checked it then). Targets are always older
 * than the allocators naming them, so fallbacks cannot form a cycle; the
 * depth bound stays as a limit on the chain's length. */
static void *alloc_fb(const rkomp_allocator_t *a, size_t alignment, size_t size, int zero,
                      int depth)
{
    rkomp_handle_t h = a->fb_data;
    if (depth > RKOMP_MAX_FB_DEPTH)
        return NULL;
    if (rkomp_in_range(h)) {
        rkomp_allocator_t *t = rkomp_lookup(h);
        /* The full generation: the handle keeps only 6 bits of it. */
        if (!t || __atomic_load_n(&t->gen, __ATOMIC_RELAXED) != a->fb_tag)
            return NULL;
        return rkomp_alloc_ours(t, alignment, size, zero, depth);
    }
    if (rkomp_runtime_predefined(h))
        return rkomp_runtime_alloc(h, alignment, size, zero);
    return rkomp_foreign_fb_alloc(h, a->fb_tag, alignment, size, zero);
}

/* What a failed allocation through a does next (its fallback trait). */
static void *apply_fallback(rkomp_allocator_t *a, size_t alignment, size_t size, int zero,
                            int depth)
{
    switch (a->fallback) {
    case RKOMP_ATV_NULL_FB: return NULL;
    case RKOMP_ATV_ABORT_FB:
        fprintf(stderr,
                "rankmem_omp: allocation of %zu bytes failed and the allocator's fallback is "
                "abort_fb: aborting\n",
                size);
        abort();
    case RKOMP_ATV_ALLOCATOR_FB: return alloc_fb(a, alignment, size, zero, depth + 1);
    default: /* default_mem_fb */
        return alloc_any(RKOMP_DEFAULT_MEM_ALLOC, alignment, size, zero, depth + 1);
    }
}

/* Through any allocator (the default_mem_fb target, or a stale default).
 * Deeper than RKOMP_MAX_FB_DEPTH: NULL. */
static void *alloc_any(rkomp_handle_t h, size_t alignment, size_t size, int zero, int depth)
{
    if (depth > RKOMP_MAX_FB_DEPTH)
        return NULL;
    if (h == RKOMP_NULL_ALLOCATOR)
        h = rkomp_get_default();
    rkomp_allocator_t *a = rkomp_lookup(h);
    if (a)
        return rkomp_alloc_ours(a, alignment, size, zero, depth);
    if (rkomp_in_range(h))
        return NULL;
    return rkomp_runtime_alloc(h, alignment, size, zero);
}

/* Ours when h (or, for omp_null_allocator, the default allocator) is in our
 * range. *a_p is the live allocator or NULL for a stale handle. */
static inline int classify(rkomp_handle_t h, rkomp_allocator_t **a_p)
{
    /* The predefined device allocator (the common case) is always live: no
     * range, state or generation check. */
    if (RKOMP_LIKELY(h == RKOMP_DEVICE_HANDLE)) {
        *a_p = &rkomp_slots[0].a;
        return 1;
    }
    if (h == RKOMP_NULL_ALLOCATOR)
        h = rkomp_get_default();
    if (!rkomp_in_range(h))
        return 0;
    *a_p = rkomp_lookup(h);
    return 1;
}

static int bad_alignment(size_t alignment) { return alignment & (alignment - 1); }

/* Our part of each entry point; *handled_p = 0 means "forward". */
static inline void *our_alloc(size_t alignment, size_t size, int zero, rkomp_handle_t h,
                              int *handled_p)
{
    /* The predefined device allocator, unaligned and not zeroed: the
     * common case, in one call. */
    if (RKOMP_LIKELY(h == RKOMP_DEVICE_HANDLE) && !zero && size &&
        alignment <= RANKMEM_DEFAULT_ALIGNMENT && !bad_alignment(alignment)) {
        *handled_p = 1;
        return rkomp_dev_alloc(size);
    }
    rkomp_allocator_t *a = NULL;
    if (!classify(h, &a)) {
        *handled_p = 0;
        return NULL;
    }
    *handled_p = 1;
    if (!a || !size || bad_alignment(alignment))
        return NULL;
    return rkomp_alloc_ours(a, alignment, size, zero, 0);
}

static int mul_overflows(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

/* clang (14 at least) converts an allocate clause's allocator to int when
 * compiling C (the enumerators of omp_allocator_handle_t are ints there), so
 * our handle reaches __kmpc_alloc/__kmpc_free cut to 32 bits and
 * sign-extended. Such a value is never a pointer nor a runtime's predefined
 * handle; our table lies in one place, so its upper bits can be restored. */
static inline rkomp_handle_t kmpc_handle(rkomp_handle_t h)
{
    uintptr_t hi = (uintptr_t)h >> 32;
    if (RKOMP_LIKELY(!(h & 1u)) || (hi != 0 && hi != 0xffffffffu) || h < 1024u)
        return h;
    uintptr_t low = (uintptr_t)h & 0xffffffffu;
    uintptr_t cand = (((uintptr_t)rkomp_slots >> 32) << 32) | low;
    if (rkomp_in_range(cand))
        return cand;
    cand += (uintptr_t)1 << 32; /* the table straddles a 4 GiB boundary */
    return rkomp_in_range(cand) ? cand : h;
}

/* ---- omp_free and friends ---- */

/* Whether ptr (not NULL) may be ours. In the grain of this thread's latest
 * insert the filters would answer "maybe": skip them. */
static inline int maybe_ours(const void *ptr)
{
    return rkomp_own_grain(ptr) || rkomp_map_maybe(ptr);
}

/* 1 when ptr was ours (now freed, or waiting for a device sync). */
static inline __attribute__((always_inline)) int our_free(void *ptr)
{
    return ptr && maybe_ours(ptr) && rkomp_map_free(ptr);
}

/* What to tell the runtime about a block that is not ours: our handles mean
 * nothing to it (both runtimes find the real allocator in the block's header). */
static inline rkomp_handle_t for_runtime(rkomp_handle_t h)
{
    return rkomp_in_range(h) ? RKOMP_NULL_ALLOCATOR : h;
}

void rkomp_free_forward(void *ptr, rkomp_handle_t allocator, int gomp)
{
    const rkomp_runtime_t *r = rkomp_rt();
    if (gomp && r->gomp_free)
        r->gomp_free(ptr, for_runtime(allocator));
    else if (r->free)
        r->free(ptr, for_runtime(allocator));
}

/* omp_free and GOMP_free reach rkomp_map_free_or_pass, or the runtime's function,
 * by a jump: no frame of their own on either common path. */
#define FREE_ENTRY(ptr, allocator, gomp, rt_fn)                                                   \
    do {                                                                                          \
        if (RKOMP_LIKELY((ptr) != NULL)) {                                                        \
            if (maybe_ours(ptr))                                                                  \
                return rkomp_map_free_or_pass((ptr), (allocator), (gomp));                        \
        } else if (rkomp_in_range(allocator)) {                                                   \
            return;                                                                               \
        }                                                                                         \
        if (RKOMP_LIKELY(__atomic_load_n(&rkomp_rt_ready, __ATOMIC_ACQUIRE) &&                    \
                         rkomp_rt_table.rt_fn != NULL))                                           \
            return rkomp_rt_table.rt_fn((ptr), for_runtime(allocator));                           \
        rkomp_free_forward((ptr), (allocator), (gomp));                                           \
    } while (0)

RKOMP_EXPORT void omp_free(void *ptr, rkomp_handle_t allocator)
{
    FREE_ENTRY(ptr, allocator, 0, free);
}

RKOMP_EXPORT void GOMP_free(void *ptr, rkomp_handle_t allocator)
{
    FREE_ENTRY(ptr, allocator, 1, gomp_free);
}

RKOMP_EXPORT void __kmpc_free(int gtid, void *ptr, rkomp_handle_t allocator)
{
    allocator = kmpc_handle(allocator);
    if (our_free(ptr) || (!ptr && rkomp_in_range(allocator)))
        return;
    const rkomp_runtime_t *r = rkomp_rt();
    if (r->kmpc_free)
        r->kmpc_free(gtid, ptr, for_runtime(allocator));
    else if (r->free)
        r->free(ptr, for_runtime(allocator));
}

/* ---- the omp_alloc family ---- */

/* omp_alloc but for its common case. */
static __attribute__((noinline)) void *alloc_rest(size_t size, rkomp_handle_t allocator)
{
    int handled;
    void *p = our_alloc(1, size, 0, allocator, &handled);
    if (handled)
        return p;
    const rkomp_runtime_t *r = rkomp_rt();
    return r->alloc ? r->alloc(size, allocator) : NULL;
}

RKOMP_EXPORT void *omp_alloc(size_t size, rkomp_handle_t allocator)
{
    /* The predefined device allocator, and a handle of the runtime's (not
     * omp_null_allocator, which may stand for ours): jumps, no frame here. */
    if (RKOMP_LIKELY(allocator == RKOMP_DEVICE_HANDLE && size))
        return rkomp_dev_alloc(size);
    if (allocator != RKOMP_NULL_ALLOCATOR && !rkomp_in_range(allocator) &&
        RKOMP_LIKELY(__atomic_load_n(&rkomp_rt_ready, __ATOMIC_ACQUIRE) &&
                     rkomp_rt_table.alloc != NULL))
        return rkomp_rt_table.alloc(size, allocator);
    return alloc_rest(size, allocator);
}

extern __typeof__(omp_alloc) rkomp_self_omp_alloc __attribute__((alias("omp_alloc")));

RKOMP_EXPORT void *omp_aligned_alloc(size_t alignment, size_t size, rkomp_handle_t allocator)
{
    int handled;
    void *p = our_alloc(alignment, size, 0, allocator, &handled);
    if (handled)
        return p;
    const rkomp_runtime_t *r = rkomp_rt();
    return r->aligned_alloc ? r->aligned_alloc(alignment, size, allocator) : NULL;
}

RKOMP_EXPORT void *omp_calloc(size_t nmemb, size_t size, rkomp_handle_t allocator)
{
    int handled;
    size_t total;
    /* An overflowing product cannot be served: SIZE_MAX fails in rankmem
     * and then takes the allocator's fallback, as any failure does. */
    if (mul_overflows(nmemb, size, &total))
        total = SIZE_MAX;
    void *p = our_alloc(1, total, 1, allocator, &handled);
    if (handled)
        return p;
    const rkomp_runtime_t *r = rkomp_rt();
    return r->calloc ? r->calloc(nmemb, size, allocator) : NULL;
}

RKOMP_EXPORT void *omp_aligned_calloc(size_t alignment, size_t nmemb, size_t size,
                                      rkomp_handle_t allocator)
{
    int handled;
    size_t total;
    if (mul_overflows(nmemb, size, &total))
        total = SIZE_MAX;
    void *p = our_alloc(alignment, total, 1, allocator, &handled);
    if (handled)
        return p;
    const rkomp_runtime_t *r = rkomp_rt();
    return r->aligned_calloc ? r->aligned_calloc(alignment, nmemb, size, allocator) : NULL;
}

/* libgomp's entry for allocate clauses: like omp_aligned_alloc, but a
 * failure is fatal (the compiled code does not check), as in libgomp. */
RKOMP_EXPORT void *GOMP_alloc(size_t alignment, size_t size, rkomp_handle_t allocator)
{
    int handled;
    void *p = our_alloc(alignment, size, 0, allocator, &handled);
    if (handled) {
        if (RKOMP_UNLIKELY(!p && size)) {
            fprintf(stderr,
                    "rankmem_omp: out of memory allocating %zu bytes for an allocate clause\n",
                    size);
            abort();
        }
        return p;
    }
    const rkomp_runtime_t *r = rkomp_rt();
    if (r->gomp_alloc)
        return r->gomp_alloc(alignment, size, allocator);
    return r->aligned_alloc ? r->aligned_alloc(alignment, size, allocator) : NULL;
}

RKOMP_EXPORT void *__kmpc_alloc(int gtid, size_t size, rkomp_handle_t allocator)
{
    allocator = kmpc_handle(allocator);
    int handled;
    void *p = our_alloc(1, size, 0, allocator, &handled);
    if (handled)
        return p;
    const rkomp_runtime_t *r = rkomp_rt();
    if (r->kmpc_alloc)
        return r->kmpc_alloc(gtid, size, allocator);
    return r->alloc ? r->alloc(size, allocator) : NULL;
}

RKOMP_EXPORT void *__kmpc_aligned_alloc(int gtid, size_t alignment, size_t size,
                                        rkomp_handle_t allocator)
{
    allocator = kmpc_handle(allocator);
    int handled;
    void *p = our_alloc(alignment, size, 0, allocator, &handled);
    if (handled)
        return p;
    const rkomp_runtime_t *r = rkomp_rt();
    if (r->kmpc_aligned_alloc)
        return r->kmpc_aligned_alloc(gtid, alignment, size, allocator);
    return r->aligned_alloc ? r->aligned_alloc(alignment, size, allocator) : NULL;
}

RKOMP_EXPORT void *__kmpc_calloc(int gtid, size_t nmemb, size_t size, rkomp_handle_t allocator)
{
    allocator = kmpc_handle(allocator);
    int handled;
    size_t total;
    if (mul_overflows(nmemb, size, &total))
        total = SIZE_MAX;
    void *p = our_alloc(1, total, 1, allocator, &handled);
    if (handled)
        return p;
    const rkomp_runtime_t *r = rkomp_rt();
    if (r->kmpc_calloc)
        return r->kmpc_calloc(gtid, nmemb, size, allocator);
    return r->calloc ? r->calloc(nmemb, size, allocator) : NULL;
}

/* ---- omp_realloc ---- */

typedef struct fwd {
    int kmpc, gtid;
} fwd_t;

static void *fwd_realloc(const fwd_t *f, void *ptr, size_t size, rkomp_handle_t h,
                         rkomp_handle_t fh)
{
    const rkomp_runtime_t *r = rkomp_rt();
    if (f->kmpc && r->kmpc_realloc)
        return r->kmpc_realloc(f->gtid, ptr, size, h, fh);
    return r->realloc ? r->realloc(ptr, size, h, fh) : NULL;
}

static void *fwd_alloc(const fwd_t *f, size_t size, rkomp_handle_t h)
{
    const rkomp_runtime_t *r = rkomp_rt();
    if (f->kmpc && r->kmpc_alloc)
        return r->kmpc_alloc(f->gtid, size, h);
    return r->alloc ? r->alloc(size, h) : NULL;
}

static void fwd_free(const fwd_t *f, void *ptr, rkomp_handle_t h)
{
    const rkomp_runtime_t *r = rkomp_rt();
    if (f->kmpc && r->kmpc_free)
        r->kmpc_free(f->gtid, ptr, h);
    else if (r->free)
        r->free(ptr, h);
}

/* The new block of a reallocation of our block b through our allocator ta,
 * fallback included: as in libgomp, a reallocation that does not fit takes
 * the target allocator's fallback. Within ta's own pool_size (b came from
 * ta's chain, whose top is then its limit) the old block counts as already
 * released: the reallocation fits when its result does. */
static void *realloc_ours(rkomp_allocator_t *ta, const rkomp_block_t *b, size_t size)
{
    size_t credit = ta->pool_size && ta->chain && b->mr == ta->chain ? rkomp_returned(b).bytes : 0;
    void *p = serve(ta, 1, size, 0, credit);
    if (!p)
        p = retry_after_flush(ta, 1, size, 0, credit);
    return p ? p : apply_fallback(ta, 1, size, 0, 0);
}

/* libgomp's omp_realloc, for our blocks and allocators:
 * - ptr NULL: omp_alloc(size, allocator) (omp_null_allocator: the default);
 * - size 0: ptr freed, NULL;
 * - the new block comes from `allocator`, or when that is omp_null_allocator
 *   from the allocator ptr was allocated with (ours: as recorded; the
 *   runtime's: free_allocator), with that allocator's alignment trait (an
 *   omp_aligned_alloc's larger alignment is not kept, as in libgomp);
 * - min(old, new) bytes are copied, then ptr is freed;
 * - on failure (after the target's fallback) NULL, and ptr is still valid
 *   and unchanged.
 * Crossing between our memory and the runtime's copies with the right kind
 * of copy. */
static void *do_realloc(const fwd_t *f, void *ptr, size_t size, rkomp_handle_t allocator,
                        rkomp_handle_t free_allocator)
{
    rkomp_block_t b;
    int mine = ptr && rkomp_map_maybe(ptr) && rkomp_map_get(ptr, &b);
    if (!ptr) {
        int handled;
        void *p = our_alloc(1, size, 0, allocator, &handled);
        return handled ? p : fwd_alloc(f, size, allocator);
    }
    if (!size) {
        if (!our_free(ptr))
            fwd_free(f, ptr, for_runtime(free_allocator));
        return NULL;
    }
    rkomp_handle_t t = allocator;
    if (t == RKOMP_NULL_ALLOCATOR)
        t = mine ? b.allocator : free_allocator;
    int t_ours = rkomp_in_range(t);
    if (!mine && !t_ours) /* the runtime's business alone, exactly as before */
        return fwd_realloc(f, ptr, size, allocator, for_runtime(free_allocator));
    rkomp_allocator_t *ta = t_ours ? rkomp_lookup(t) : NULL;
    if (t_ours && !ta)
        return NULL; /* stale handle */
    if (mine) {
        void *n = ta ? realloc_ours(ta, &b, size) : fwd_alloc(f, size, t);
        if (!n)
            return NULL;
        if (copy_bytes(n, ptr, b.bytes < size ? b.bytes : size) != 0) {
            if (!our_free(n))
                fwd_free(f, n, RKOMP_NULL_ALLOCATOR);
            return NULL;
        }
        our_free(ptr);
        return n;
    }
    /* A runtime block into ours: its size is the runtime's secret, so let
     * the runtime resize it to `size` first, then copy all of that. */
    void *n = rkomp_alloc_ours(ta, 1, size, 0, 0);
    if (!n)
        return NULL;
    void *tmp = fwd_realloc(f, ptr, size, RKOMP_DEFAULT_MEM_ALLOC, for_runtime(free_allocator));
    if (!tmp) {
        our_free(n);
        return NULL;
    }
    if (copy_bytes(n, tmp, size) != 0) {
        /* ptr is gone already (the runtime moved it): its contents, in the
         * runtime's block, are the result rather than lost. */
        our_free(n);
        return tmp;
    }
    fwd_free(f, tmp, RKOMP_NULL_ALLOCATOR);
    return n;
}

RKOMP_EXPORT void *omp_realloc(void *ptr, size_t size, rkomp_handle_t allocator,
                               rkomp_handle_t free_allocator)
{
    fwd_t f = {0, 0};
    return do_realloc(&f, ptr, size, allocator, free_allocator);
}

RKOMP_EXPORT void *__kmpc_realloc(int gtid, void *ptr, size_t size, rkomp_handle_t allocator,
                                  rkomp_handle_t free_allocator)
{
    fwd_t f = {1, gtid};
    return do_realloc(&f, ptr, size, kmpc_handle(allocator), kmpc_handle(free_allocator));
}

/* ---- public extras (rankmem_omp.h) ---- */

RKOMP_EXPORT rankmem_status_t rankmem_omp_block_info(const void *ptr, size_t *bytes_p,
                                                     rankmem_resource_t **mr_p)
{
    rkomp_block_t b;
    if (!ptr)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    if (!rkomp_map_maybe(ptr) || !rkomp_map_get(ptr, &b))
        return RANKMEM_ERR_INVALID_POINTER;
    if (bytes_p)
        *bytes_p = b.bytes;
    if (mr_p)
        *mr_p = b.mr;
    return RANKMEM_SUCCESS;
}

RKOMP_EXPORT rankmem_status_t rankmem_omp_flush(void)
{
    int err = 0;
    rkomp_map_flush(NULL, &err); /* nothing pending (deferral off): a scan of the threads' counts */
    return err ? RANKMEM_ERR_DEVICE : RANKMEM_SUCCESS;
}

RKOMP_EXPORT rankmem_status_t rankmem_omp_active(int *active_p)
{
    if (!active_p)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    *active_p = rkomp_interposed();
    return RANKMEM_SUCCESS;
}
