/* vmm: a pool over the GPU's virtual memory API (docs/vmm.md).
 *
 * Two parts, each reused rather than written again:
 *  - placement and reuse are the pool's (src/pool.c, through the backing
 *    hook of pool_backed.h): sharded, stream-ordered, coalescing best fit;
 *  - memory is one reserved virtual range whose granules are mapped and
 *    unmapped one by one (src/vmm_map.c: CUDA driver, HIP, or host).
 * Because the range is contiguous, blocks grown at different times
 * coalesce, and because granules map one by one, the pool can give back
 * the interior of any free block rather than only whole chunks: that is
 * what keeps mapped bytes near the peak of live bytes (docs/vmm.md, policy).
 *
 * Two zones, each a backed pool over the same map: requests below a
 * quarter of a granule in one, the rest in the other. Small blocks that
 * live long would otherwise sit in the granules that large blocks leave,
 * and keep them mapped; kept apart, small blocks share few granules and
 * large frees leave whole granules to give back (peak mapped over peak live
 * on bench/traces/powerlaw.csv with 2 MiB granules: 1.109 in one zone,
 * 1.049 in two; three zones did no better). A block's zone follows from its
 * size, which deallocate is given, so no lookup is needed.
 *
 * This file is the resource around them: parameters, queries, counters,
 * export and import. allocate/deallocate go straight to a zone's pool. */
#define _GNU_SOURCE
#include "internal.h"
#include "config_internal.h"
#include "pool_backed.h"
#include "vmm_map.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if HAVE_GPU
#include "gpu_api.h"
#endif

#define HOST_DEFAULT_RESERVE ((size_t)64 << 30)

/* The current device's primary context, made current: the driver calls of
 * the mapping layer work in it (the runtime makes it lazily). */
static void primary_context(void)
{
#if HAVE_GPU
    (void)cudaFree(NULL);
#endif
}

typedef struct {
    rankmem_resource_t base;
    rankmem_resource_t *zone[2]; /* the engines over `backing`: small, large */
    size_t small_max;            /* requests below it go to zone[0] */
    rk_vmm_map_t *map;
    rk_pool_backing_t backing;
    rankmem_vmm_params_t prm; /* as given (describe says what differs from defaults) */
    /* The map is used under the pool's growth lock; queries and export
     * take this one as well, so they never see it half-changed. */
    pthread_mutex_t map_lock;
} vmm_t;

static const rankmem_resource_ops_t vmm_ops;

/* ---- the backing: the pool's growth goes to the map ---- */

static rankmem_status_t vmm_grow(void *ctx, size_t bytes, char **ptr_p, size_t *size_p)
{
    vmm_t *v = ctx;
    pthread_mutex_lock(&v->map_lock);
    rankmem_status_t st = rk_vmm_map_grow(v->map, bytes, ptr_p, size_p);
    pthread_mutex_unlock(&v->map_lock);
    return st;
}

static int vmm_fit(void *ctx, char **ptr_p, size_t *bytes_p, size_t want)
{
    vmm_t *v = ctx;
    pthread_mutex_lock(&v->map_lock);
    int fits = rk_vmm_map_fit(v->map, ptr_p, bytes_p, want);
    pthread_mutex_unlock(&v->map_lock);
    return fits;
}

static rankmem_status_t vmm_shrink(void *ctx, char *ptr, size_t bytes)
{
    vmm_t *v = ctx;
    pthread_mutex_lock(&v->map_lock);
    rankmem_status_t st = rk_vmm_map_shrink(v->map, ptr, bytes);
    pthread_mutex_unlock(&v->map_lock);
    return st;
}

/* ---- resource ops ---- */

static inline rankmem_resource_t *zone_of(const vmm_t *v, size_t bytes)
{
    return v->zone[bytes >= v->small_max];
}

static rankmem_status_t vmm_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                     rankmem_stream_t stream, void **ptr_p)
{
    return rk_pool_allocate(zone_of((vmm_t *)mr, bytes), bytes, alignment, stream, ptr_p);
}

static rankmem_status_t vmm_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                       size_t alignment, rankmem_stream_t stream)
{
    return rk_pool_deallocate(zone_of((vmm_t *)mr, bytes), ptr, bytes, alignment, stream);
}

/* Each zone's blocks as one batch, so each pool still locks once for many. */
static rankmem_status_t vmm_deallocate_many(rankmem_resource_t *mr, const rankmem_block_t *blocks,
                                            size_t n, rankmem_stream_t stream,
                                            rankmem_status_t *status)
{
    vmm_t *v = (vmm_t *)mr;
    rankmem_block_t part[RK_BATCH];
    rankmem_status_t st[RK_BATCH], first = RANKMEM_SUCCESS;
    unsigned short where[RK_BATCH];
    for (int z = 0; z < 2; z++) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if ((blocks[i].bytes >= v->small_max) == z) {
                where[k] = (unsigned short)i;
                part[k++] = blocks[i];
            }
        if (!k)
            continue;
        rk_deallocate_many(v->zone[z], part, k, stream, st);
        for (size_t j = 0; j < k; j++)
            status[where[j]] = st[j];
    }
    for (size_t i = 0; i < n; i++)
        if (status[i] != RANKMEM_SUCCESS && first == RANKMEM_SUCCESS)
            first = status[i];
    return first;
}

static rankmem_status_t vmm_query(rankmem_resource_t *mr, rankmem_query_t what, size_t *value_p)
{
    vmm_t *v = (vmm_t *)mr;
    size_t total = 0;
    switch (what) {
    case RANKMEM_QUERY_POOL_MAX: total = rk_vmm_map_maximum(v->map); break;
    case RANKMEM_QUERY_RESERVED_CURRENT:
    case RANKMEM_QUERY_RESERVED_HIGH:
        /* Mapped bytes: the virtual reservation costs no memory. */
        pthread_mutex_lock(&v->map_lock);
        total = what == RANKMEM_QUERY_RESERVED_CURRENT ? rk_vmm_map_mapped(v->map)
                                                        : rk_vmm_map_mapped_high(v->map);
        pthread_mutex_unlock(&v->map_lock);
        break;
    default: /* USED_HIGH: the sum of the zones' peaks, an upper bound as the pool's */
        for (int z = 0; z < 2; z++) {
            size_t x = 0;
            rankmem_status_t st = v->zone[z]->ops->query(v->zone[z], what, &x);
            if (st != RANKMEM_SUCCESS)
                return rk_error(st, "vmm: unknown query %d", (int)what);
            total += x;
        }
    }
    *value_p = total;
    return RANKMEM_SUCCESS;
}

/* Wholly free granules go back while more than keep_bytes are mapped: the
 * large zone first (where whole granules are), then the small. */
static rankmem_status_t vmm_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    vmm_t *v = (vmm_t *)mr;
    size_t small_held = 0;
    rankmem_status_t st = v->zone[0]->ops->query(v->zone[0], RANKMEM_QUERY_RESERVED_CURRENT,
                                                 &small_held);
    if (st == RANKMEM_SUCCESS)
        st = v->zone[1]->ops->trim(v->zone[1], keep_bytes > small_held ? keep_bytes - small_held
                                                                       : 0);
    size_t large_held = 0;
    if (st == RANKMEM_SUCCESS)
        st = v->zone[1]->ops->query(v->zone[1], RANKMEM_QUERY_RESERVED_CURRENT, &large_held);
    if (st == RANKMEM_SUCCESS)
        st = v->zone[0]->ops->trim(v->zone[0], keep_bytes > large_held ? keep_bytes - large_held
                                                                       : 0);
    return st;
}

static rankmem_status_t vmm_forget_stream(rankmem_resource_t *mr, rankmem_stream_t stream)
{
    vmm_t *v = (vmm_t *)mr;
    rankmem_status_t st = v->zone[0]->ops->forget_stream(v->zone[0], stream);
    return st != RANKMEM_SUCCESS ? st : v->zone[1]->ops->forget_stream(v->zone[1], stream);
}

static rankmem_status_t vmm_finalize(rankmem_resource_t *mr)
{
    vmm_t *v = (vmm_t *)mr;
    /* The pools first (they report live allocations), then the mappings. */
    rankmem_status_t st = RANKMEM_SUCCESS;
    for (int z = 0; z < 2; z++) {
        rankmem_status_t s = v->zone[z] ? rankmem_resource_release(v->zone[z]) : RANKMEM_SUCCESS;
        if (s != RANKMEM_SUCCESS && st == RANKMEM_SUCCESS)
            st = s;
    }
    if (st == RANKMEM_ERR_BUSY)
        (void)rk_error(st, "vmm: released with live allocations; their memory was unmapped");
    rk_vmm_map_destroy(v->map);
    pthread_mutex_destroy(&v->map_lock);
    free(v);
    return st;
}

static int vmm_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const vmm_t *v = (const vmm_t *)mr;
    char opts[256] = "", sz[40];
    size_t o = 0;
    const struct {
        const char *key;
        size_t value, dflt;
    } f[] = {{"reserve", v->prm.reserve, 0},
             {"max", v->prm.maximum, SIZE_MAX},
             {"release", v->prm.release, 0},
             {"granule", v->prm.granule, 0},
             {"handle", v->prm.handle, 0}};
    if (v->prm.backend == RANKMEM_VMM_BACKEND_HOST)
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",backend=host");
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].value != f[i].dflt) {
            rk_format_size(sz, sizeof sz, f[i].value);
            o += (size_t)snprintf(opts + o, sizeof opts - o, ",%s=%s", f[i].key, sz);
        }
    return o ? snprintf(buf, len, "vmm(%s)", opts + 1) : snprintf(buf, len, "vmm");
}

static const rankmem_resource_ops_t vmm_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "vmm",
    .allocate = vmm_allocate,
    .deallocate = vmm_deallocate,
    .query = vmm_query,
    .trim = vmm_trim,
    .finalize = vmm_finalize,
    .describe = vmm_describe,
    .forget_stream = vmm_forget_stream,
    .deallocate_many = vmm_deallocate_many,
};

/* ---- construction ---- */

rankmem_status_t rankmem_vmm_params_default(rankmem_vmm_params_t *params_p)
{
    if (!params_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_vmm_params_default: NULL output");
    memset(params_p, 0, sizeof *params_p);
    params_p->size = sizeof *params_p;
    params_p->maximum = SIZE_MAX;
    params_p->backend = RANKMEM_VMM_BACKEND_DEVICE;
    return RANKMEM_SUCCESS;
}

static rk_vmm_backend_t device_backend(void)
{
#if HAVE_HIP
    return RK_VMM_HIP;
#else
    return RK_VMM_CUDA;
#endif
}

rankmem_status_t rankmem_vmm_create(const rankmem_vmm_params_t *params, rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_vmm_create: NULL output");
    rankmem_vmm_params_t prm;
    rankmem_vmm_params_default(&prm);
    if (params) {
        if (params->size < offsetof(rankmem_vmm_params_t, backend) + sizeof(int) ||
            params->size > sizeof prm)
            return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                            "rankmem_vmm_create: params.size %zu is not that of "
                            "rankmem_vmm_params_t (%zu); set it with rankmem_vmm_params_default()",
                            params->size, sizeof prm);
        memcpy(&prm, params, params->size);
    }
    if (prm.backend != RANKMEM_VMM_BACKEND_DEVICE && prm.backend != RANKMEM_VMM_BACKEND_HOST)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_vmm_create: backend %d is neither RANKMEM_VMM_BACKEND_DEVICE "
                        "nor RANKMEM_VMM_BACKEND_HOST",
                        prm.backend);
    if (prm.maximum == 0)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_vmm_create: maximum of 0 bytes");
    if (prm.granule && (!rk_is_pow2(prm.granule) || prm.granule < 4096))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_vmm_create: granule %zu is not a power of two of at least 4 KiB",
                        prm.granule);
    if (prm.handle && (!rk_is_pow2(prm.handle) || (prm.granule && prm.handle < prm.granule)))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_vmm_create: handle %zu is not a power of two of at least the "
                        "granule",
                        prm.handle);
    if (prm.reserve > SIZE_MAX / 4)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_vmm_create: reserve of %zu bytes is too large", prm.reserve);
    if (prm.maximum != SIZE_MAX && prm.reserve && prm.maximum > prm.reserve)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_vmm_create: maximum %zu bytes exceeds the reserve of %zu bytes",
                        prm.maximum, prm.reserve);

    rk_vmm_backend_t backend = RK_VMM_HOST;
    int device = RANKMEM_DEVICE_HOST;
    unsigned props = RANKMEM_PROP_HOST_ACCESSIBLE;
    size_t reserve = prm.reserve;
    if (prm.backend == RANKMEM_VMM_BACKEND_DEVICE) {
        /* Like the cuda resource: no GPU is NO_DEVICE. */
        if (rk_gpu_count() == 0)
            return rk_error(RANKMEM_ERR_NO_DEVICE, "rankmem_vmm_create: no GPU (%s)",
                            rk_gpu_absent_reason());
        backend = device_backend();
        device = rk_gpu_current();
        primary_context();
        props = RANKMEM_PROP_DEVICE_ACCESSIBLE;
        if (!reserve) {
            const char *why = "";
            if (!rk_vmm_backend_available(backend, device, &why))
                return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "rankmem_vmm_create: %s", why);
            size_t total = rk_vmm_device_memory(backend, device);
            /* Twice the device: room for holes, virtual space is cheap. */
            reserve = total ? 2 * total : (size_t)256 << 30;
        }
    } else if (!reserve) {
        reserve = HOST_DEFAULT_RESERVE;
    }
    if (prm.maximum != SIZE_MAX && prm.maximum > reserve)
        reserve = prm.maximum;

    vmm_t *v = calloc(1, sizeof *v);
    if (!v)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "rankmem_vmm_create: no host memory");
    rankmem_status_t st = rankmem_resource_init(&v->base, &vmm_ops, props, NULL);
    if (st != RANKMEM_SUCCESS) {
        free(v);
        return st;
    }
    v->base.device = device;
    v->prm = prm;
    pthread_mutex_init(&v->map_lock, NULL);
    st = rk_vmm_map_create(backend, device, reserve, prm.granule, prm.handle, prm.maximum,
                           &v->map);
    if (st != RANKMEM_SUCCESS) {
        pthread_mutex_destroy(&v->map_lock);
        free(v);
        return st;
    }
    v->backing.grow = vmm_grow;
    v->backing.shrink = vmm_shrink;
    v->backing.granule = rk_vmm_map_granule(v->map);
    if (rk_vmm_map_multi(v->map)) /* handles of several granules go back whole */
        v->backing.fit = vmm_fit;
    v->backing.release = prm.release;
    v->small_max = v->backing.granule / 4;
    for (int z = 0; z < 2 && st == RANKMEM_SUCCESS; z++)
        st = rk_pool_create_backed(&v->backing, v, props, device, &v->zone[z]);
    if (st != RANKMEM_SUCCESS) {
        vmm_finalize(&v->base); /* nothing was handed out */
        return st;
    }
    *mr_p = &v->base;
    return RANKMEM_SUCCESS;
}

/* ---- stats, failure injection ---- */

/* The vmm resource of mr's chain, or NULL (error recorded). */
static vmm_t *vmm_of(rankmem_resource_t *mr, const char *fn)
{
    if (!mr) {
        (void)rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: NULL resource", fn);
        return NULL;
    }
    for (rankmem_resource_t *r = mr; r; r = r->upstream)
        if (r->ops == &vmm_ops)
            return (vmm_t *)r;
    (void)rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: no vmm in the chain of '%s'", fn,
                   mr->ops->name);
    return NULL;
}

rankmem_status_t rankmem_vmm_get_stats(rankmem_resource_t *mr, rankmem_vmm_stats_t *stats_p)
{
    if (!stats_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_vmm_get_stats: NULL output");
    if (stats_p->size < sizeof(size_t) || stats_p->size > sizeof *stats_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_vmm_get_stats: stats.size %zu is not that of "
                        "rankmem_vmm_stats_t (%zu)",
                        stats_p->size, sizeof *stats_p);
    vmm_t *v = vmm_of(mr, "rankmem_vmm_get_stats");
    if (!v)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    rankmem_vmm_stats_t s;
    memset(&s, 0, sizeof s);
    s.size = stats_p->size;
    rk_vmm_counters_t c;
    size_t given;
    for (int z = 0; z < 2; z++) {
        size_t gb, lh;
        rk_pool_backed_counters(v->zone[z], &gb, &given, &lh);
        s.give_backs += gb;
        s.live_high += lh;
    }
    pthread_mutex_lock(&v->map_lock);
    rk_vmm_map_counters(v->map, &c);
    s.granule = rk_vmm_map_granule(v->map);
    s.reserved = rk_vmm_map_reserved(v->map);
    s.mapped = rk_vmm_map_mapped(v->map);
    s.mapped_high = rk_vmm_map_mapped_high(v->map);
    pthread_mutex_unlock(&v->map_lock);
    s.granules_mapped = c.maps;
    s.granules_released = c.releases;
    s.handles_created = c.creates;
    memcpy(stats_p, &s, s.size);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_vmm_inject_map_failure(rankmem_resource_t *mr, size_t nth, size_t count)
{
    vmm_t *v = vmm_of(mr, "rankmem_vmm_inject_map_failure");
    if (!v)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    if (rk_vmm_map_backend(v->map) != RK_VMM_HOST)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_vmm_inject_map_failure: the host backend only");
    pthread_mutex_lock(&v->map_lock);
    rk_vmm_map_fail_at(v->map, nth, count);
    pthread_mutex_unlock(&v->map_lock);
    return RANKMEM_SUCCESS;
}

/* ---- export, import ---- */

rankmem_status_t rankmem_vmm_range(rankmem_resource_t *mr, void **base_p, size_t *bytes_p)
{
    if (!base_p || !bytes_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_vmm_range: NULL output");
    vmm_t *v = vmm_of(mr, "rankmem_vmm_range");
    if (!v)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    /* Fixed at creation: no lock needed. */
    *base_p = rk_vmm_map_base(v->map);
    *bytes_p = rk_vmm_map_reserved(v->map);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_vmm_export_ex(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                       unsigned flags, rankmem_vmm_export_t *export_p)
{
    if (!export_p || !ptr || !bytes)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_vmm_export: NULL %s",
                        !export_p ? "output" : !ptr ? "pointer" : "size (0 bytes)");
    if (flags & ~(RANKMEM_VMM_EXPORT_NO_FDS | RANKMEM_VMM_EXPORT_MAPPED))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_vmm_export: unknown flags %#x",
                        flags);
    vmm_t *v = vmm_of(mr, "rankmem_vmm_export");
    if (!v)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    char *p = ptr;
    if (!(flags & RANKMEM_VMM_EXPORT_MAPPED)) {
        /* Inside one live block: its start and size, from either zone. */
        char *start = NULL;
        size_t req = 0;
        int live = 0;
        for (int z = 0; z < 2 && !live; z++)
            live = rk_pool_live_block(v->zone[z], ptr, &start, &req);
        if (!live || bytes > req - (size_t)(p - start))
            return rk_error(RANKMEM_ERR_INVALID_POINTER,
                            "rankmem_vmm_export: [%p, +%zu) is not inside a live allocation of "
                            "this vmm%s",
                            ptr, bytes, live ? " (it runs past the allocation's end)" : "");
    }
    rankmem_vmm_export_t e;
    memset(&e, 0, sizeof e);
    e.backend = rk_vmm_map_backend(v->map) == RK_VMM_HOST ? RANKMEM_VMM_BACKEND_HOST
                                                           : RANKMEM_VMM_BACKEND_DEVICE;
    e.device = v->base.device;
    e.bytes = bytes;
    pthread_mutex_lock(&v->map_lock);
    e.granule = rk_vmm_map_granule(v->map);
    rankmem_status_t st = rk_vmm_map_export(v->map, p, bytes, !(flags & RANKMEM_VMM_EXPORT_NO_FDS),
                                            &e.handles, &e.count, &e.offset);
    pthread_mutex_unlock(&v->map_lock);
    if (st != RANKMEM_SUCCESS)
        return st;
    *export_p = e;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_vmm_export(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                    rankmem_vmm_export_t *export_p)
{
    return rankmem_vmm_export_ex(mr, ptr, bytes, 0, export_p);
}

rankmem_status_t rankmem_vmm_export_close(rankmem_vmm_export_t *e)
{
    if (!e)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_vmm_export_close: NULL export");
    for (size_t i = 0; e->handles && i < e->count; i++)
        if (e->handles[i].fd >= 0)
            close(e->handles[i].fd);
    free(e->handles);
    e->handles = NULL;
    e->count = 0;
    return RANKMEM_SUCCESS;
}

struct rankmem_vmm_import {
    rk_vmm_backend_t backend;
    char *base;
    size_t count;
    size_t *sizes;
};

rankmem_status_t rankmem_vmm_import(const rankmem_vmm_export_t *e, void **ptr_p,
                                    rankmem_vmm_import_t **import_p)
{
    if (!e || !ptr_p || !import_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_vmm_import: NULL %s",
                        !e ? "export" : "output");
    size_t total = 0;
    int bad = !e->count || !e->handles || !rk_is_pow2(e->granule) || e->granule < 4096 ||
              !e->bytes || e->count > SIZE_MAX / sizeof(size_t) ||
              (e->backend != RANKMEM_VMM_BACKEND_DEVICE && e->backend != RANKMEM_VMM_BACKEND_HOST);
    for (size_t i = 0; !bad && i < e->count; i++) {
        const rankmem_vmm_handle_t *h = &e->handles[i];
        if (h->fd < 0 || !h->bytes || h->bytes % e->granule || h->fd_offset % e->granule ||
            h->bytes > SIZE_MAX - total)
            return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                            "rankmem_vmm_import: handle %zu is descriptor %d of %zu bytes at "
                            "offset %llu (granule %zu)",
                            i, h->fd, h->bytes, h->fd_offset, e->granule);
        total += h->bytes;
    }
    if (bad || e->offset >= e->handles[0].bytes || e->bytes > total - e->offset)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_vmm_import: not an export (granule %zu, %zu handles, offset "
                        "%zu, %zu bytes)",
                        e->granule, e->count, e->offset, e->bytes);
    rankmem_vmm_import_t *im = calloc(1, sizeof *im);
    size_t *sizes = malloc(e->count * sizeof *sizes);
    if (!im || !sizes) {
        free(im);
        free(sizes);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "rankmem_vmm_import: no host memory");
    }
    for (size_t i = 0; i < e->count; i++)
        sizes[i] = e->handles[i].bytes;
    im->backend = e->backend == RANKMEM_VMM_BACKEND_HOST ? RK_VMM_HOST : device_backend();
    im->count = e->count;
    im->sizes = sizes;
    int device = rk_gpu_current();
    if (im->backend != RK_VMM_HOST && rk_gpu_count() == 0) {
        free(sizes);
        free(im);
        return rk_error(RANKMEM_ERR_NO_DEVICE, "rankmem_vmm_import: no GPU (%s)",
                        rk_gpu_absent_reason());
    }
    if (im->backend != RK_VMM_HOST)
        primary_context();
    rankmem_status_t st =
        rk_vmm_import(im->backend, device, e->granule, e->count, e->handles, &im->base);
    if (st != RANKMEM_SUCCESS) {
        free(sizes);
        free(im);
        return st;
    }
    *ptr_p = im->base + e->offset;
    *import_p = im;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_vmm_import_close(rankmem_vmm_import_t *im)
{
    if (!im)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_vmm_import_close: NULL import");
    rankmem_status_t st = rk_vmm_unimport(im->backend, im->base, im->sizes, im->count);
    free(im->sizes);
    free(im);
    return st;
}
