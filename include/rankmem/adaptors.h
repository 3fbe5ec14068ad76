/* rankmem: adaptors. Each is a resource that wraps an upstream (which it
 * retains) and can sit anywhere in a chain. Constructors return a resource
 * with one reference. */
#ifndef RANKMEM_ADAPTORS_H
#define RANKMEM_ADAPTORS_H

#include <stddef.h>
#include <stdio.h>
#include <rankmem/export.h>
#include <rankmem/status.h>
#include <rankmem/resource.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- stats: current, peak and total, for bytes and for allocation count ---- */

#define RANKMEM_STATS_VERSION 1

typedef struct rankmem_stats {
    size_t size;      /* sizeof(rankmem_stats_t): set by the caller; lets the struct grow */
    unsigned version; /* RANKMEM_STATS_VERSION of the library that filled it */
    size_t bytes_current, bytes_peak, bytes_total;
    size_t count_current, count_peak, count_total;
    size_t failures; /* allocations the upstream refused */
} rankmem_stats_t;

RANKMEM_API rankmem_status_t rankmem_stats_create(rankmem_resource_t *upstream,
                                                  rankmem_resource_t **mr_p);
/* Counters since creation. stats_p->size must be set (older, shorter structs are filled
 * as far as they go). */
RANKMEM_API rankmem_status_t rankmem_stats_get(rankmem_resource_t *mr, rankmem_stats_t *stats_p);
/* Nested scopes: push starts counting a phase (its current = 0, peak = 0,
 * totals = 0); pop ends it, returns its counters, and folds its peak into the
 * parent's (parent peak >= parent current at push + scope peak). */
RANKMEM_API rankmem_status_t rankmem_stats_push(rankmem_resource_t *mr);
RANKMEM_API rankmem_status_t rankmem_stats_pop(rankmem_resource_t *mr, rankmem_stats_t *scope_p);

/* ---- tracking: every live allocation, a leak report ---- */

typedef struct rankmem_allocation {
    void *ptr;
    size_t bytes;
    rankmem_stream_t stream;
} rankmem_allocation_t;

/* backtraces nonzero: record the call stack of each allocation (costlier). */
RANKMEM_API rankmem_status_t rankmem_tracking_create(rankmem_resource_t *upstream, int backtraces,
                                                     rankmem_resource_t **mr_p);
RANKMEM_API rankmem_status_t rankmem_tracking_outstanding(rankmem_resource_t *mr,
                                                          size_t *bytes_p, size_t *count_p);
/* Copies up to capacity live allocations, largest first; *count_p = how many are live. */
RANKMEM_API rankmem_status_t rankmem_tracking_list(rankmem_resource_t *mr,
                                                   rankmem_allocation_t *out, size_t capacity,
                                                   size_t *count_p);
/* A readable leak report (largest first; grouped by call site with backtraces). */
RANKMEM_API rankmem_status_t rankmem_tracking_report(rankmem_resource_t *mr, FILE *out);

/* ---- logging: one CSV line per event ---- */

/* path NULL: RANKMEM_LOG_FILE; neither: RANKMEM_ERR_CONFIG. Lines are
 * thread,time,action,pointer,size,stream with action allocate, allocate failure or free. */
RANKMEM_API rankmem_status_t rankmem_logging_create(rankmem_resource_t *upstream, const char *path,
                                                    rankmem_resource_t **mr_p);
RANKMEM_API rankmem_status_t rankmem_logging_flush(rankmem_resource_t *mr);

/* ---- limit: refuse allocations past a byte limit (RANKMEM_ERR_LIMIT) ---- */

RANKMEM_API rankmem_status_t rankmem_limit_create(rankmem_resource_t *upstream, size_t limit_bytes,
                                                  rankmem_resource_t **mr_p);

/* ---- aligned: a larger alignment for allocations of threshold bytes or more ---- */

RANKMEM_API rankmem_status_t rankmem_aligned_create(rankmem_resource_t *upstream, size_t alignment,
                                                    size_t threshold, rankmem_resource_t **mr_p);

/* ---- retry: on out-of-memory, ask a callback whether to try again ---- */

/* Called after attempt (1, 2, ...) failed with status; may free memory; returns
 * nonzero to try again. */
typedef int (*rankmem_retry_fn)(void *arg, rankmem_resource_t *mr, size_t bytes,
                                rankmem_status_t status, int attempt);
/* fn NULL: trim every resource of the chain below once, then retry once. */
RANKMEM_API rankmem_status_t rankmem_retry_create(rankmem_resource_t *upstream, rankmem_retry_fn fn,
                                                  void *arg, rankmem_resource_t **mr_p);

/* ---- threadsafe: one lock around an upstream that is not thread-safe ---- */

RANKMEM_API rankmem_status_t rankmem_threadsafe_create(rankmem_resource_t *upstream,
                                                       rankmem_resource_t **mr_p);

/* ---- prefetch: prefetch managed memory to the current device on allocate ---- */

RANKMEM_API rankmem_status_t rankmem_prefetch_create(rankmem_resource_t *upstream,
                                                     rankmem_resource_t **mr_p);

#ifdef __cplusplus
}
#endif
#endif
