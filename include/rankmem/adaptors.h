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
/* For a reallocation through a limit adaptor mr: allocate as rankmem_allocate
 * does, checking the limit as if replaced_bytes (the old block's size, which
 * the caller frees through mr once it has copied it) were already released.
 * Until the old block is freed the count may exceed the limit by at most
 * replaced_bytes. RANKMEM_ERR_INVALID_ARGUMENT when mr is not a limit
 * adaptor; RANKMEM_ERR_LIMIT when the result would not fit. */
RANKMEM_API rankmem_status_t rankmem_limit_allocate_replacing(rankmem_resource_t *mr, size_t bytes,
                                                              size_t alignment,
                                                              size_t replaced_bytes, void **ptr_p);

/* ---- aligned: a larger alignment for allocations of threshold bytes or more ---- */
/* alignment: a power of two from RANKMEM_DEFAULT_ALIGNMENT to
 * RANKMEM_MAX_ALIGNMENT (1 GiB), else RANKMEM_ERR_INVALID_ARGUMENT. */

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

/* ---- fault: fail allocations on purpose, a test tool (docs/testing.md) ----
 *
 * Put it under any resource ("stats>pool>fault(every=7)>system") to see
 * what the chain above does with a failure from below. An allocate call
 * fails when it is the nth counted call (or one of the count - 1 after
 * it), when its number is a multiple of every (or one of the count - 1
 * after such a multiple), or at random with probability rate; the random
 * choice hashes seed and the call's number, so the same seed and calls
 * fail the same calls. Calls are counted only while enabled, from the
 * last configure (or creation). A failed call returns status and records
 * "fault: injected failure N, allocate call I (...)" as the last error;
 * nothing reaches the upstream. Deallocations are never failed. */

typedef struct rankmem_fault_params {
    size_t size;              /* sizeof(rankmem_fault_params_t) */
    unsigned long long nth;   /* fail the nth counted call (1 = the next); 0: none */
    unsigned long long count; /* calls failed in a row from each nth/every hit (default 1) */
    unsigned long long every; /* fail calls every, 2*every, ...; 0: none */
    double rate;              /* probability that a call fails, 0 to 1 (default 0) */
    unsigned long long seed;  /* of the random choice (default 0) */
    rankmem_status_t status;  /* what a failed call returns (default RANKMEM_ERR_OUT_OF_MEMORY) */
    int enabled;              /* 0: pass everything through, count nothing (default 1) */
} rankmem_fault_params_t;

typedef struct rankmem_fault_stats {
    size_t size;                          /* sizeof(rankmem_fault_stats_t), set by the caller */
    unsigned long long calls;             /* allocate calls seen, enabled or not */
    unsigned long long counted;           /* calls counted since the last configure */
    unsigned long long injected;          /* failures injected (since creation) */
    unsigned long long upstream_failures; /* allocations the upstream itself refused */
    unsigned long long frees;             /* blocks the upstream took back */
    size_t bytes_outstanding;  /* bytes the upstream lent through it and has not got back */
    size_t blocks_outstanding; /* blocks of the above */
    int enabled;
} rankmem_fault_stats_t;

/* Defaults: never fails (nth, every and rate 0), count 1, status
 * RANKMEM_ERR_OUT_OF_MEMORY, enabled. */
RANKMEM_API rankmem_status_t rankmem_fault_params_default(rankmem_fault_params_t *params_p);
/* params NULL: the defaults. A rate outside [0, 1], count 0, a status
 * an allocation cannot fail with (success, invalid pointer, config, busy)
 * or a params.size of another version: RANKMEM_ERR_INVALID_ARGUMENT. */
RANKMEM_API rankmem_status_t rankmem_fault_create(rankmem_resource_t *upstream,
                                                  const rankmem_fault_params_t *params,
                                                  rankmem_resource_t **mr_p);
/* These act on the first fault resource from mr down its chain (mr may be
 * the top of "stats>pool>fault>system"); none there:
 * RANKMEM_ERR_INVALID_ARGUMENT. Thread-safe: a call racing a change sees
 * each setting old or new. */
/* New settings (checked as by create; a bad one changes nothing); the
 * call count restarts at 0. */
RANKMEM_API rankmem_status_t rankmem_fault_configure(rankmem_resource_t *mr,
                                                     const rankmem_fault_params_t *params);
/* Switch injection off (0) or on, keeping the settings and the counts. */
RANKMEM_API rankmem_status_t rankmem_fault_enable(rankmem_resource_t *mr, int enabled);
/* stats_p->size must be set (older, shorter structs are filled as far as they go). */
RANKMEM_API rankmem_status_t rankmem_fault_get_stats(rankmem_resource_t *mr,
                                                     rankmem_fault_stats_t *stats_p);

#ifdef __cplusplus
}
#endif
#endif
