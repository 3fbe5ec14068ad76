/* retry: when the upstream runs out of memory, ask a callback whether to try
 * again; the callback may free memory meanwhile (RMM's
 * failure_callback_resource_adaptor).
 *
 * "Out of memory" is RANKMEM_ERR_OUT_OF_MEMORY and RANKMEM_ERR_LIMIT (a
 * limit adaptor below refuses with the latter; RMM's limiting adaptor throws
 * the same out_of_memory as a device allocation). Every other status is
 * returned at once. The callback gets the status, so it can tell them apart.
 *
 * At most RETRY_MAX_ATTEMPTS upstream calls are made per allocation, so a
 * callback that always says "again" cannot hang the caller.
 *
 * Without a callback: trim every resource of the chain below once (top to
 * bottom, so that a pool's chunks reach the pool below it before that one is
 * trimmed), then retry once. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RETRY_MAX_ATTEMPTS 16

typedef struct {
    rankmem_resource_t base;
    rankmem_retry_fn fn; /* NULL: trim the chain once */
    void *arg;
} retry_t;

static inline int is_out_of_memory(rankmem_status_t st)
{
    return st == RANKMEM_ERR_OUT_OF_MEMORY || st == RANKMEM_ERR_LIMIT;
}

/* The default callback. */
static int trim_chain_once(void *arg, rankmem_resource_t *mr, size_t bytes,
                           rankmem_status_t status, int attempt)
{
    (void)arg;
    (void)bytes;
    (void)status;
    if (attempt > 1)
        return 0;
    for (rankmem_resource_t *r = mr->upstream; r; r = r->upstream) {
        rankmem_resource_trim(r, 0); /* best effort: a failed trim still lets us retry */
        /* What a threadsafe adaptor guards is reached only through its lock:
         * its trim has just trimmed it. */
        if (r->ops->name && strcmp(r->ops->name, "threadsafe") == 0 && r->upstream)
            r = r->upstream;
    }
    return 1;
}

/* The detail of the last error without its "<status>: " prefix. */
static const char *detail_of(const char *msg, rankmem_status_t st)
{
    const char *name = rankmem_status_string(st);
    size_t n = strlen(name);
    if (strncmp(msg, name, n) == 0 && msg[n] == ':' && msg[n + 1] == ' ')
        return msg + n + 2;
    return msg;
}

static rankmem_status_t retry_slow(retry_t *r, rankmem_status_t st, size_t bytes,
                                   size_t alignment, rankmem_stream_t stream, void **ptr_p)
{
    rankmem_resource_t *mr = &r->base, *up = mr->upstream;
    rankmem_retry_fn fn = r->fn ? r->fn : trim_chain_once;
    char why[512]; /* the upstream's detail: the callback's own calls may overwrite it */
    for (int attempt = 1;; attempt++) {
        const char *d = detail_of(rankmem_last_error(), st);
        snprintf(why, sizeof why, "%s", d[0] ? d : "the upstream gave no detail");
        if (attempt == RETRY_MAX_ATTEMPTS)
            return rk_error(st, "retry: %zu bytes still refused after %d attempts: %s", bytes,
                            attempt, why);
        if (!fn(r->arg, mr, bytes, st, attempt))
            return rk_error(st, "retry: %zu bytes refused (%d attempt%s, then the callback "
                                "gave up): %s",
                            bytes, attempt, attempt > 1 ? "s" : "", why);
        /* A user upstream may fail without a detail: do not show an old one. */
        rankmem_clear_error();
        st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
        if (st == RANKMEM_SUCCESS || !is_out_of_memory(st))
            return st;
    }
}

static rankmem_status_t retry_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    rankmem_resource_t *up = mr->upstream;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    if (RK_LIKELY(st == RANKMEM_SUCCESS) || !is_out_of_memory(st))
        return st;
    return retry_slow((retry_t *)mr, st, bytes, alignment, stream, ptr_p);
}

static rankmem_status_t retry_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                         size_t alignment, rankmem_stream_t stream)
{
    rankmem_resource_t *up = mr->upstream;
    return up->ops->deallocate(up, ptr, bytes, alignment, stream);
}

static rankmem_status_t retry_query(rankmem_resource_t *mr, rankmem_query_t what, size_t *value_p)
{
    return rankmem_resource_query(mr->upstream, what, value_p);
}

static rankmem_status_t retry_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return rankmem_resource_trim(mr->upstream, keep_bytes);
}

static rankmem_status_t retry_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

/* A user callback cannot be written as a spec: such a chain is described
 * as the default one. */
static int retry_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    (void)mr;
    return snprintf(buf, len, "retry");
}

static const rankmem_resource_ops_t retry_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "retry",
    .allocate = retry_allocate,
    .deallocate = retry_deallocate,
    .query = retry_query,
    .trim = retry_trim,
    .finalize = retry_finalize,
    .describe = retry_describe,
};

rankmem_status_t rankmem_retry_create(rankmem_resource_t *upstream, rankmem_retry_fn fn, void *arg,
                                      rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_retry_create: NULL %s",
                        upstream ? "mr_p" : "upstream");
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(retry_t), &retry_ops, upstream->props, upstream,
                                          &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    mr->device = upstream->device;
    ((retry_t *)mr)->fn = fn;
    ((retry_t *)mr)->arg = arg;
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
