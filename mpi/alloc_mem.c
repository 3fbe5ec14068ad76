/* MPI_Alloc_mem / MPI_Free_mem: the info key rankmem_kind asks rankmem for
 * the memory.
 *
 *   device   the rank's resource (counted in the report)
 *   managed  cudaMallocManaged (rankmem_managed_create)
 *   pinned   cudaHostAlloc (rankmem_pinned_create)
 *   host     malloc (rankmem_system_create)
 *
 * With no GPU, managed and pinned are host memory too, and device is the
 * rank's resource, which is host memory then (the documented fallback).
 * Without the key (or with MPI_INFO_NULL) the call goes to MPI unchanged.
 * A bad value is MPI_ERR_INFO_VALUE, raised on MPI_COMM_WORLD's error
 * handler as MPI raises MPI_Alloc_mem's errors, with a message saying why.
 *
 * A small table maps each pointer we handed out to its resource and size,
 * so that MPI_Free_mem gives it back to the right place; any other pointer
 * goes to MPI. MPI_Alloc_mem is rare and coarse, so one lock is plenty. */
#define _GNU_SOURCE
#include "plugin.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define KEY "rankmem_kind"

typedef struct entry {
    void *ptr;
    size_t bytes;
    rankmem_resource_t *mr;
    struct entry *next;
} entry_t;

#define NBUCKETS 256

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t *buckets[NBUCKETS];
static size_t live;
/* Created on first use and kept for the life of the process (see init.c). */
static rankmem_resource_t *managed_mr, *pinned_mr, *host_mr;

static size_t bucket(const void *p) { return ((uintptr_t)p >> 8) % NBUCKETS; }

size_t rk_mpi_alloc_mem_live(void)
{
    pthread_mutex_lock(&lock);
    size_t n = live;
    pthread_mutex_unlock(&lock);
    return n;
}

/* The resource of a kind; NULL with *st_p set if it cannot be made. */
static rankmem_resource_t *kind_resource(const char *kind, rankmem_status_t *st_p)
{
    rankmem_resource_t **slot = NULL;
    rankmem_status_t (*make)(rankmem_resource_t **) = NULL;
    int gpu = rk_mpi_gpu_count() > 0;
    *st_p = RANKMEM_SUCCESS;
    if (strcmp(kind, "device") == 0) {
        rankmem_resource_t *mr = rankmem_mpi_resource();
        /* MPI_Init did not come through the plugin: the current resource. */
        if (!mr)
            *st_p = rankmem_get_current_resource(&mr);
        return *st_p == RANKMEM_SUCCESS ? mr : NULL;
    }
    if (strcmp(kind, "managed") == 0 && gpu) {
        slot = &managed_mr;
        make = rankmem_managed_create;
    } else if (strcmp(kind, "pinned") == 0 && gpu) {
        slot = &pinned_mr;
        make = rankmem_pinned_create;
    } else {
        slot = &host_mr;
        make = rankmem_system_create;
    }
    if (!*slot)
        *st_p = make(slot);
    return *slot;
}

static int known_kind(const char *kind)
{
    return strcmp(kind, "device") == 0 || strcmp(kind, "managed") == 0 ||
           strcmp(kind, "pinned") == 0 || strcmp(kind, "host") == 0;
}

/* The value of rankmem_kind in info: 1 found, 0 absent, -1 MPI error (*rc_p). */
static int get_kind(MPI_Info info, char *value, int len, int *rc_p)
{
    int flag = 0;
    if (info == MPI_INFO_NULL)
        return 0;
#if MPI_VERSION >= 4
    int buflen = len;
    *rc_p = PMPI_Info_get_string(info, KEY, &buflen, value, &flag);
#else
    *rc_p = PMPI_Info_get(info, KEY, len - 1, value, &flag);
#endif
    if (*rc_p != MPI_SUCCESS)
        return -1;
    value[len - 1] = '\0';
    return flag ? 1 : 0;
}

static int raise_error(int code)
{
    /* MPI raises MPI_Alloc_mem's errors on MPI_COMM_WORLD: so do we (with
     * the default handler the job stops, as MPI itself would stop it). */
    PMPI_Comm_call_errhandler(MPI_COMM_WORLD, code);
    return code;
}

RK_MPI_EXPORT int MPI_Alloc_mem(MPI_Aint size, MPI_Info info, void *baseptr)
{
    char kind[64];
    int rc = MPI_SUCCESS;
    int found = get_kind(info, kind, (int)sizeof kind, &rc);
    if (found < 0)
        return raise_error(rc);
    /* Zero and negative sizes: MPI's own rules apply. */
    if (found == 0 || size <= 0 || !baseptr)
        return PMPI_Alloc_mem(size, info, baseptr);
    if (!known_kind(kind)) {
        rk_mpi_warn("MPI_Alloc_mem: info %s='%s': expected device, managed, pinned or host", KEY,
                    kind);
        return raise_error(MPI_ERR_INFO_VALUE);
    }
    entry_t *e = malloc(sizeof *e);
    if (!e)
        return raise_error(MPI_ERR_NO_MEM);
    rankmem_status_t st;
    pthread_mutex_lock(&lock);
    rankmem_resource_t *mr = kind_resource(kind, &st);
    pthread_mutex_unlock(&lock);
    void *p = NULL;
    if (mr)
        st = rankmem_allocate(mr, (size_t)size, 0, &p);
    if (st != RANKMEM_SUCCESS) {
        rk_mpi_warn("MPI_Alloc_mem: %s=%s, %lld bytes: %s: %s", KEY, kind, (long long)size,
                    rankmem_status_string(st), rankmem_last_error());
        free(e);
        return raise_error(st == RANKMEM_ERR_OUT_OF_MEMORY || st == RANKMEM_ERR_LIMIT ? MPI_ERR_NO_MEM
                                                                                : MPI_ERR_OTHER);
    }
    e->ptr = p;
    e->bytes = (size_t)size;
    e->mr = mr;
    pthread_mutex_lock(&lock);
    size_t b = bucket(p);
    e->next = buckets[b];
    buckets[b] = e;
    live++;
    pthread_mutex_unlock(&lock);
    memcpy(baseptr, &p, sizeof p);
    return MPI_SUCCESS;
}

RK_MPI_EXPORT int MPI_Free_mem(void *base)
{
    entry_t *e = NULL;
    if (base) {
        pthread_mutex_lock(&lock);
        for (entry_t **pp = &buckets[bucket(base)]; *pp; pp = &(*pp)->next)
            if ((*pp)->ptr == base) {
                e = *pp;
                *pp = e->next;
                live--;
                break;
            }
        pthread_mutex_unlock(&lock);
    }
    if (!e)
        return PMPI_Free_mem(base);
    rankmem_status_t st = rankmem_deallocate(e->mr, e->ptr, e->bytes, 0);
    free(e);
    if (st != RANKMEM_SUCCESS) {
        rk_mpi_warn("MPI_Free_mem(%p): %s: %s", base, rankmem_status_string(st),
                    rankmem_last_error());
        return raise_error(MPI_ERR_OTHER);
    }
    return MPI_SUCCESS;
}
