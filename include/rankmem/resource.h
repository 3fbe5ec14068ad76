/* rankmem: the memory resource interface, its dispatchers and the per-device registry.
 *
 * A resource is a struct that begins with rankmem_resource_t and points to a
 * const ops table (libfabric's fid pattern). Every public call is a thin
 * dispatcher over the table. Resources are reference counted: a suballocator
 * or adaptor retains its upstream, and a chain is freed when its last user
 * releases it. */
#ifndef RANKMEM_RESOURCE_H
#define RANKMEM_RESOURCE_H

#include <stddef.h>
#include <rankmem/export.h>
#include <rankmem/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same type as cudaStream_t; NULL is the legacy default stream. */
typedef struct CUstream_st *rankmem_stream_t;

/* Alignment used when 0 is passed: what cudaMalloc guarantees. */
#define RANKMEM_DEFAULT_ALIGNMENT ((size_t)256)
/* The largest alignment any call takes (1 GiB, the largest huge page of
 * x86-64 and Arm; GPU granules are 2 MiB). More is RANKMEM_ERR_INVALID_ARGUMENT
 * (allocate, deallocate, the aligned adaptor, spec strings), so that no size
 * arithmetic of a resource can wrap: bytes + alignment stays below SIZE_MAX / 2. */
#define RANKMEM_MAX_ALIGNMENT ((size_t)1 << 30)

/* Properties recorded at creation. */
#define RANKMEM_PROP_DEVICE_ACCESSIBLE 0x1u /* kernels may touch it */
#define RANKMEM_PROP_HOST_ACCESSIBLE 0x2u   /* the CPU may touch it */
#define RANKMEM_PROP_STREAM_ORDERED 0x4u    /* allocate/deallocate honour the stream */

/* The device a host-only resource records (no GPU current, or host memory). */
#define RANKMEM_DEVICE_HOST (-1)

typedef struct rankmem_resource rankmem_resource_t;

/* What rankmem_resource_query() can ask. A resource answers what it knows and
 * returns RANKMEM_ERR_NOT_SUPPORTED for the rest. */
typedef enum rankmem_query {
    RANKMEM_QUERY_RESERVED_CURRENT = 0, /* bytes held from the upstream / the device now */
    RANKMEM_QUERY_RESERVED_HIGH = 1,    /* high-water mark of the above */
    RANKMEM_QUERY_USED_CURRENT = 2,     /* bytes handed out to users now */
    RANKMEM_QUERY_USED_HIGH = 3,        /* high-water mark of the above */
    RANKMEM_QUERY_POOL_MAX = 4,         /* maximum pool size; SIZE_MAX if unbounded */
    RANKMEM_QUERY_LIVE_COUNT = 5,       /* number of live allocations */
    RANKMEM_QUERY_FREE_BLOCKS = 6,      /* number of free blocks (fragmentation) */
    RANKMEM_QUERY_LIMIT = 7,            /* byte limit of a limit adaptor */
    RANKMEM_QUERY_LARGEST_FREE = 8      /* bytes of the largest free block (the pool) */
} rankmem_query_t;

/* One block of a batch (rankmem_deallocate_many): what rankmem_deallocate
 * takes for it. */
typedef struct rankmem_block {
    void *ptr;
    size_t bytes;
    size_t alignment; /* 0 (or below RANKMEM_DEFAULT_ALIGNMENT): the default */
} rankmem_block_t;

typedef struct rankmem_resource_ops {
    size_t size;      /* sizeof(rankmem_resource_ops_t): lets the table grow */
    const char *name; /* "pool", "cuda", "system", ... */
    /* Required. The dispatcher has checked mr, ptr_p, bytes != 0 and the
     * alignment (a power of two, at least RANKMEM_DEFAULT_ALIGNMENT). */
    rankmem_status_t (*allocate)(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                 rankmem_stream_t stream, void **ptr_p);
    /* Required. ptr is not NULL; bytes and alignment are what allocate got. */
    rankmem_status_t (*deallocate)(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                   size_t alignment, rankmem_stream_t stream);
    /* Optional. */
    rankmem_status_t (*query)(rankmem_resource_t *mr, rankmem_query_t what, size_t *value_p);
    /* Optional: nonzero when memory from one may be freed through the other.
     * Without it, resources are equal only when they are the same object. */
    int (*is_equal)(const rankmem_resource_t *a, const rankmem_resource_t *b);
    /* Optional: give unused memory back upstream, keeping at least keep_bytes. */
    rankmem_status_t (*trim)(rankmem_resource_t *mr, size_t keep_bytes);
    /* Optional: called once when the last reference is dropped; frees what the
     * resource holds and the struct itself. The dispatcher then releases the
     * upstream. Returns RANKMEM_ERR_BUSY if live allocations were reclaimed. */
    rankmem_status_t (*finalize)(rankmem_resource_t *mr);
    /* Optional: this resource alone in spec syntax ("pool(initial=1GiB)"),
     * written as by snprintf (returns the length it needs, or -1). Without
     * it the resource is described by its name. */
    int (*describe)(const rankmem_resource_t *mr, char *buf, size_t len);
    /* Optional: the stream is about to be destroyed: wait for its work and
     * stop keeping memory ordered on it. */
    rankmem_status_t (*forget_stream)(rankmem_resource_t *mr, rankmem_stream_t stream);
    /* Optional: deallocate each of the n blocks (0 < n <= 256; every ptr
     * not NULL, every alignment 0 or a power of two, below
     * RANKMEM_DEFAULT_ALIGNMENT meaning it), as n calls of deallocate would,
     * trying every one: status[i] is block i's result, the return value the
     * first failure's (or success). Lets a resource take its lock once for
     * many, and an adaptor pass the batch on. Without it the dispatcher
     * calls deallocate for each block. */
    rankmem_status_t (*deallocate_many)(rankmem_resource_t *mr, const rankmem_block_t *blocks,
                                        size_t n, rankmem_stream_t stream,
                                        rankmem_status_t *status);
} rankmem_resource_ops_t;

/* The common header. Embed it first in your own resource, fill an ops table,
 * and call rankmem_resource_init(). Fields are read-only to users. */
struct rankmem_resource {
    const rankmem_resource_ops_t *ops;
    rankmem_resource_t *upstream; /* retained; NULL for a leaf resource */
    unsigned long refcount;       /* atomically updated */
    int device;                   /* current device at creation, or RANKMEM_DEVICE_HOST */
    unsigned props;               /* RANKMEM_PROP_* */
    void *reserved[4];
};

/* Fill the header of a user resource: one reference, the current device
 * (RANKMEM_DEVICE_HOST unless props says device-accessible), props, and a
 * reference on upstream (may be NULL). ops must stay valid for the resource's
 * life and have allocate and deallocate. */
RANKMEM_API rankmem_status_t rankmem_resource_init(rankmem_resource_t *mr,
                                                   const rankmem_resource_ops_t *ops,
                                                   unsigned props, rankmem_resource_t *upstream);

RANKMEM_API rankmem_status_t rankmem_resource_retain(rankmem_resource_t *mr);
/* Drop a reference; the last one finalizes the resource and releases its
 * upstream. RANKMEM_ERR_BUSY: live allocations were reclaimed (a leak in the
 * caller, reported; the memory went back anyway). */
RANKMEM_API rankmem_status_t rankmem_resource_release(rankmem_resource_t *mr);

/* Stream-ordered: valid on stream from the point allocate returns; after
 * deallocate on a stream, the memory may be reused by work on that stream at
 * once. alignment 0 means RANKMEM_DEFAULT_ALIGNMENT.
 * Checked here, before any resource sees the call: 0 bytes, an alignment that
 * is not a power of two or is above RANKMEM_MAX_ALIGNMENT are
 * RANKMEM_ERR_INVALID_ARGUMENT; bytes + alignment above SIZE_MAX / 2 (no
 * memory could hold it) is RANKMEM_ERR_OUT_OF_MEMORY. A deallocate with such
 * bytes and alignment describes no allocation: RANKMEM_ERR_INVALID_POINTER
 * (INVALID_ARGUMENT for the alignment), nothing freed. */
RANKMEM_API rankmem_status_t rankmem_allocate_async(rankmem_resource_t *mr, size_t bytes,
                                                    size_t alignment, rankmem_stream_t stream,
                                                    void **ptr_p);
RANKMEM_API rankmem_status_t rankmem_deallocate_async(rankmem_resource_t *mr, void *ptr,
                                                      size_t bytes, size_t alignment,
                                                      rankmem_stream_t stream);
/* Synchronous variants: ordered on the legacy default stream, which orders
 * itself with every blocking stream. */
RANKMEM_API rankmem_status_t rankmem_allocate(rankmem_resource_t *mr, size_t bytes,
                                              size_t alignment, void **ptr_p);
RANKMEM_API rankmem_status_t rankmem_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                                size_t alignment);
/* n blocks of mr back at once, as n calls of rankmem_deallocate would (on
 * the legacy default stream), with one lock for many where the resource
 * allows (a pool: the calling thread's shard; the stats adaptor passes the
 * batch on). Every block is tried: a bad one (NULL, a bad alignment, not
 * mr's) does not keep the others; the status is that of the first failure
 * (rankmem_last_error() describes the last), *failed_p (may be NULL) how
 * many failed. n == 0: nothing, success; blocks may then be NULL. */
RANKMEM_API rankmem_status_t rankmem_deallocate_many(rankmem_resource_t *mr,
                                                     const rankmem_block_t *blocks, size_t n,
                                                     size_t *failed_p);

/* Call before destroying a stream that a chain has seen: every resource of
 * the chain that keeps memory per stream (pool, arena, fixed, binning)
 * waits for the stream's work and moves what it kept for it to the default
 * stream. A no-op for resources that keep nothing per stream. */
RANKMEM_API rankmem_status_t rankmem_resource_forget_stream(rankmem_resource_t *mr,
                                                            rankmem_stream_t stream);

RANKMEM_API rankmem_status_t rankmem_resource_query(rankmem_resource_t *mr, rankmem_query_t what,
                                                    size_t *value_p);
RANKMEM_API rankmem_status_t rankmem_resource_trim(rankmem_resource_t *mr, size_t keep_bytes);
/* *equal_p = 1 when memory from a may be deallocated through b. */
RANKMEM_API rankmem_status_t rankmem_resource_is_equal(const rankmem_resource_t *a,
                                                       const rankmem_resource_t *b, int *equal_p);
RANKMEM_API rankmem_status_t rankmem_resource_name(const rankmem_resource_t *mr,
                                                   const char **name_p);
RANKMEM_API rankmem_status_t rankmem_resource_device(const rankmem_resource_t *mr, int *device_p);
RANKMEM_API rankmem_status_t rankmem_resource_properties(const rankmem_resource_t *mr,
                                                         unsigned *props_p);
RANKMEM_API rankmem_status_t rankmem_resource_upstream(const rankmem_resource_t *mr,
                                                       rankmem_resource_t **upstream_p);

/* Per-device registry. On a machine with a GPU, a device's first resource is
 * the cudaMalloc resource of that device. With no GPU, device 0 (and the
 * current device) is served by the host resource, and one notice says so.
 * Getters return a borrowed pointer: the registry holds a reference until the
 * device's resource is replaced; retain it if another thread may replace it.
 * Setters retain the new resource and release the old one. Thread-safe. */
RANKMEM_API rankmem_status_t rankmem_device_count(int *count_p); /* 0 when no GPU */
RANKMEM_API rankmem_status_t rankmem_current_device(int *device_p); /* 0 when no GPU */
RANKMEM_API rankmem_status_t rankmem_get_device_resource(int device, rankmem_resource_t **mr_p);
RANKMEM_API rankmem_status_t rankmem_set_device_resource(int device, rankmem_resource_t *mr);

/* Told of every change of a device's resource: fn(device, mr, arg) runs
 * once for each device that has a resource when it is added, then each
 * time one is set (rankmem_set_device_resource, or the first resource made
 * on first use), before the setter returns. It runs under the registry's
 * lock: it must be quick and must not call the registry functions above.
 * mr is borrowed, as from rankmem_get_device_resource. For layers that
 * cache the current resource (the OpenMP allocators do). At most
 * RANKMEM_MAX_RESOURCE_LISTENERS at once: RANKMEM_ERR_LIMIT past them;
 * adding the same (fn, arg) twice is one listener. Remove a listener
 * before its code goes (dlclose): once removed it is never called again.
 * Removing one that was not added: RANKMEM_ERR_INVALID_ARGUMENT. */
#define RANKMEM_MAX_RESOURCE_LISTENERS 8
typedef void (*rankmem_resource_listener_t)(int device, rankmem_resource_t *mr, void *arg);
RANKMEM_API rankmem_status_t rankmem_add_resource_listener(rankmem_resource_listener_t fn,
                                                           void *arg);
RANKMEM_API rankmem_status_t rankmem_remove_resource_listener(rankmem_resource_listener_t fn,
                                                              void *arg);
RANKMEM_API rankmem_status_t rankmem_get_current_resource(rankmem_resource_t **mr_p);
RANKMEM_API rankmem_status_t rankmem_set_current_resource(rankmem_resource_t *mr);

#ifdef __cplusplus
}
#endif
#endif
