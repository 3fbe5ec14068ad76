/* CUDA IPC between ranks of one node (issue 20): the node's decision at
 * MPI_Init, the exporter's handle cache and the importer's mapping cache.
 * The message protocols that use them are in staging/proto_ipc.c and
 * staging/coll.c; staging/ipc_map.h says what each call promises.
 *
 * Why a decision at init: a mapping that fails in the middle of a message
 * needs the sender's help to recover (it must send the data after all),
 * and a container or MIG setup refuses every mapping alike. So each node
 * tries once: every rank exports a small probe buffer and maps each node
 * peer's; IPC is on for the node only when every rank mapped every peer. A
 * refusal is one line for the job (world rank 0), not one per message.
 *
 * The test backend (stg_fake) stands for device memory with a memory file
 * mapped at the fake region; a peer "maps" it through /proc/PID/fd/FD.
 *
 * Memory of the rank's vmm pool has no CUDA IPC handle (the driver refuses
 * VMM memory): it travels as its physical handles instead, whose
 * descriptors peers fetch from this rank's fd service (staging/ipc_fd.c);
 * the importer maps the run of handles and caches it like an allocation,
 * keyed by the handles' export ids, which are never reused. With the host
 * backend of the vmm (a memfd) the same path runs on the CPU tests. */
#define _GNU_SOURCE
#include "ipc_map.h"
#include "../mps.h"
#include "ipc_fd.h"
#include "../observe/recorder.h"
#include "staging.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if HAVE_GPU && !HAVE_HIP
#include <cuda_runtime.h>
#define RK_IPC_CUDA 1
#else
#define RK_IPC_CUDA 0
#endif

int rk_ipc_on;
_Static_assert(sizeof(rk_ipc_desc_t) == 328, "docs/staging.md gives the descriptor's size");

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int world_size;
static unsigned char *near; /* near[w]: world rank w is a node peer served by IPC */
static int cache_max = 64;  /* RANKMEM_STAGING_IPC_CACHE */
static rk_ipc_stats_t stats;
static int probing; /* rk_ipc_init's probe: its refusals make the job's one line */
static MPI_Comm ack_comm = MPI_COMM_NULL;

MPI_Comm rk_ipc_ack_comm(void) { return ack_comm; }

/* The rank's vmm pool, when its resource has one (retained), its reserved
 * range, and whether its fd service runs (only then are its buffers
 * described by handles). */
static rankmem_resource_t *vmm_mr;
static uintptr_t vmm_lo, vmm_hi;
static int vmm_served;

/* ---- test backend ---- */

static int fake_fd = -1;
static uint64_t fake_gen = 1;

void rk_stg_fake_ipc(int fd) { fake_fd = fd; }

/* Test backend: refuse every nth mapping from now on (the fallback that
 * asks the sender for the data). */
static int fake_fail_every, fake_fail_count;
void rk_stg_fake_ipc_fail(int every)
{
    pthread_mutex_lock(&lock);
    fake_fail_every = every;
    fake_fail_count = 0;
    pthread_mutex_unlock(&lock);
}

void rk_stg_fake_ipc_renew(void)
{
    pthread_mutex_lock(&lock);
    fake_gen++;
    pthread_mutex_unlock(&lock);
}

typedef struct {
    char tag[8]; /* "rkfake" */
    int32_t pid, fd;
} fake_handle_t;

/* ---- the driver's pointer query (the allocation's range and id) ---- */

#if RK_IPC_CUDA
#define RK_CU_POINTER_ATTRIBUTE_BUFFER_ID 7
#define RK_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 10
#define RK_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define RK_CU_POINTER_ATTRIBUTE_RANGE_SIZE 12

/* Run with the staging device current (threads start on device 0). */
static int dev_enter(void)
{
    int prev = -1, want = rk_mpi_gpu_current();
    if (want >= 0 && cudaGetDevice(&prev) == cudaSuccess && prev != want) {
        cudaSetDevice(want);
        return prev;
    }
    return -1;
}
static void dev_leave(int prev)
{
    if (prev >= 0)
        cudaSetDevice(prev);
}
#endif

#define IPC_MIN_ALLOCATION ((size_t)2 << 20)

/* The allocation holding p: base, size and id. 0, or -1. */
static int allocation_of(const void *p, uint64_t *base, uint64_t *size, uint64_t *id)
{
    char *fb;
    size_t fn;
    if (rk_stg_fake_region(&fb, &fn)) {
        if (fake_fd < 0 || (const char *)p < fb || (const char *)p >= fb + fn)
            return -1;
        *base = (uint64_t)(uintptr_t)fb;
        *size = fn;
        *id = fake_gen;
        return 0;
    }
#if RK_IPC_CUDA
    unsigned long long b = 0, id64 = 0;
    size_t sz = 0;
    int attrs[3] = {RK_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, RK_CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                    RK_CU_POINTER_ATTRIBUTE_BUFFER_ID};
    void *data[3] = {&b, &sz, &id64};
    if (rk_stg_cu_pointer_attrs(3, attrs, data, p) != 0 || !b || !sz)
        return -1;
    /* cudaMalloc packs allocations under 2 MiB into shared 2 MiB blocks
     * (seen on the H100: a 4 KiB and a 1 MiB allocation 4.5 KiB apart).
     * On that machine a 64 KiB buffer freed and allocated again was now and
     * then read with old contents through IPC (4 ranks on one GPU), while
     * whole-block allocations never were; the cause inside the driver was
     * not pinned down. So only allocations of whole blocks are exported. */
    if (sz < IPC_MIN_ALLOCATION)
        return -1;
    *base = b;
    *size = sz;
    *id = id64;
    return 0;
#else
    (void)base, (void)size, (void)id;
    return -1;
#endif
}

/* ---- exporter: handles by allocation ---- */

#define EXPORTS 64
static struct {
    uint64_t base, size, id, used;
    int ok; /* 1 handle valid, 0 this allocation cannot be exported */
    unsigned char handle[RK_IPC_HANDLE_BYTES];
} ex[EXPORTS];
static uint64_t tick;

static int make_handle(uint64_t base, unsigned char *out)
{
    if (fake_fd >= 0) {
        fake_handle_t h = {"rkfake", (int32_t)getpid(), fake_fd};
        memset(out, 0, RK_IPC_HANDLE_BYTES);
        memcpy(out, &h, sizeof h);
        return 0;
    }
#if RK_IPC_CUDA
    /* The driver says which memory the IPC calls take (not stream-ordered
     * pools, VMM or managed memory); an old driver that cannot tell: ask. */
    int capable = 1;
    int attr = RK_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE;
    void *data = &capable;
    if (rk_stg_cu_pointer_attrs(1, &attr, &data, (const void *)(uintptr_t)base) == 0 && !capable)
        return -1;
    cudaIpcMemHandle_t h;
    int prev = dev_enter();
    cudaError_t e = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base);
    dev_leave(prev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    _Static_assert(sizeof h == RK_IPC_HANDLE_BYTES, "IPC handle size");
    memcpy(out, &h, sizeof h);
    return 0;
#else
    (void)base, (void)out;
    return -1;
#endif
}

/* A buffer of the rank's vmm pool: its physical handles (ids, sizes), no
 * descriptor made here (the fd service makes them when a peer asks). */
static int vmm_export(const void *buf, size_t n, rk_ipc_desc_t *d)
{
    rankmem_vmm_export_t e;
    if (rankmem_vmm_export_ex(vmm_mr, (void *)(uintptr_t)buf, n,
                              RANKMEM_VMM_EXPORT_NO_FDS | RANKMEM_VMM_EXPORT_MAPPED,
                              &e) != RANKMEM_SUCCESS)
        return -1;
    int ok = e.count > 0 && e.count <= RK_IPC_VMM_HANDLES;
    if (ok) {
        memset(d, 0, sizeof *d);
        uint64_t size = 0;
        int k = -1; /* the segment being filled */
        for (size_t i = 0; i < e.count && ok; i++) {
            const rankmem_vmm_handle_t *h = &e.handles[i];
            uint64_t g = h->bytes / e.granule;
            ok = g <= UINT32_MAX;
            if (k >= 0 && h->id == d->u.vmm.id0[k] + d->u.vmm.count[k] &&
                g == d->u.vmm.granules[k]) {
                d->u.vmm.count[k]++;
            } else if (++k < RK_IPC_VMM_SEGS) {
                d->u.vmm.id0[k] = h->id;
                d->u.vmm.count[k] = 1;
                d->u.vmm.granules[k] = (uint32_t)g;
            } else {
                ok = 0; /* ids too scattered for one descriptor */
            }
            size += h->bytes;
        }
        d->kind = RK_IPC_KIND_VMM;
        d->nh = k + 1;
        d->granule = e.granule;
        d->backend = e.backend;
        d->buffer_id = e.handles[0].id;
        d->base = e.handles[0].address;
        d->size = size;
        d->offset = e.offset;
        d->bytes = n;
        d->owner = -1;
        PMPI_Comm_rank(MPI_COMM_WORLD, &d->owner);
    }
    rankmem_vmm_export_close(&e);
    pthread_mutex_lock(&lock);
    stats.exports++;
    stats.vmm_exports++;
    if (!ok)
        stats.refused++;
    pthread_mutex_unlock(&lock);
    return ok ? 0 : -1;
}

/* A vmm descriptor's handles one by one. */
typedef struct {
    size_t n;
    uint64_t ids[RK_IPC_VMM_HANDLES], addr[RK_IPC_VMM_HANDLES], bytes[RK_IPC_VMM_HANDLES];
} vmm_list_t;

/* 0, or -1 when d is malformed. */
static int vmm_expand(const rk_ipc_desc_t *d, vmm_list_t *l)
{
    l->n = 0;
    if (d->nh < 1 || d->nh > RK_IPC_VMM_SEGS || !d->granule || (d->granule & (d->granule - 1)))
        return -1;
    uint64_t at = d->base;
    for (int k = 0; k < d->nh; k++)
        for (uint32_t j = 0; j < d->u.vmm.count[k]; j++) {
            if (l->n == RK_IPC_VMM_HANDLES || !d->u.vmm.granules[k])
                return -1;
            l->ids[l->n] = d->u.vmm.id0[k] + j;
            l->addr[l->n] = at;
            l->bytes[l->n] = (uint64_t)d->u.vmm.granules[k] * d->granule;
            at += l->bytes[l->n++];
        }
    return l->n && at - d->base == d->size ? 0 : -1;
}

static int describe(const void *buf, size_t n, rk_ipc_desc_t *d);

/* The exporter's own earlier work on the buffer must be done before a peer
 * touches it from another process: a cudaMemcpy from pageable memory
 * returns before its DMA has landed, and a cudaMemset or kernel on the
 * legacy default stream is asynchronous. Within this process the staging
 * streams are ordered after such work (blocking streams); across processes
 * nothing orders it (seen on an H200: a peer's Allreduce read an input that
 * cudaMemcpy had just written, and got old values). An event recorded on a
 * blocking stream waits for the legacy stream's work; wait for it. */
static int fence(void)
{
#if HAVE_GPU
    void *ev = NULL;
    int r = rk_stg_copy(NULL, NULL, 0, RK_STG_D2H, &ev);
    if (r == 0)
        r = rk_stg_event_wait(ev);
    rk_stg_event_put(ev);
    return r;
#else
    return 0; /* no device work to wait for (the test backend's copies are done on return) */
#endif
}

int rk_ipc_export(const void *buf, size_t n, rk_ipc_desc_t *d)
{
    if (describe(buf, n, d) != 0)
        return -1;
    return fence();
}

static int describe(const void *buf, size_t n, rk_ipc_desc_t *d)
{
    uint64_t base, size, id;
    if (!rk_ipc_on)
        return -1;
    if (vmm_served && (uintptr_t)buf >= vmm_lo && (uintptr_t)buf < vmm_hi)
        return vmm_export(buf, n, d);
    if (allocation_of(buf, &base, &size, &id) != 0)
        return -1;
    uint64_t off = (uint64_t)(uintptr_t)buf - base;
    if (off > size || n > size - off)
        return -1;
    pthread_mutex_lock(&lock);
    int slot = -1, victim = 0;
    for (int i = 0; i < EXPORTS; i++) {
        if (ex[i].used && ex[i].base == base && ex[i].id == id) {
            slot = i;
            break;
        }
        if (ex[i].used < ex[victim].used)
            victim = i;
    }
    if (slot < 0) {
        /* Not cached: ask (about 20 us on the H100), and remember the
         * answer, "cannot" included. Entries of other ids at this base are
         * allocations that are gone: they age out. */
        slot = victim;
        ex[slot].base = base;
        ex[slot].size = size;
        ex[slot].id = id;
        ex[slot].ok = make_handle(base, ex[slot].handle) == 0;
        stats.exports++;
        if (!ex[slot].ok)
            stats.refused++;
    }
    ex[slot].used = ++tick;
    int ok = ex[slot].ok;
    if (ok) {
        memset(d, 0, sizeof *d);
        memcpy(d->u.handle, ex[slot].handle, RK_IPC_HANDLE_BYTES);
        d->buffer_id = id;
        d->base = base;
        d->size = size;
        d->offset = off;
        d->bytes = n;
        d->owner = -1;
        PMPI_Comm_rank(MPI_COMM_WORLD, &d->owner);
        d->kind = RK_IPC_KIND_CUDA;
    }
    pthread_mutex_unlock(&lock);
    return ok ? 0 : -1;
}

/* ---- importer: mappings by (owner, buffer id) ---- */

typedef struct map {
    struct map *next;
    int owner, kind;
    uint64_t id, base, size;
    /* vmm: the handles mapped, from base (ids never reused by the owner) */
    size_t nh;
    uint64_t *ids;
    rankmem_vmm_import_t *im;
    char *ptr; /* the mapped allocation's first byte */
    int refs;  /* copies in flight through it */
    int stale; /* replaced: close when refs reach 0 */
    uint64_t used;
} map_t;
static map_t *maps;
static int nmaps;

/* The owner's run of handles, fetched from its fd service and mapped. */
static char *open_vmm(const rk_ipc_desc_t *d, const vmm_list_t *l, rankmem_vmm_import_t **im,
                      char *why, size_t len)
{
    size_t nh = l->n, got = 0;
    uint64_t bytes[RK_IPC_VMM_HANDLES], offs[RK_IPC_VMM_HANDLES];
    int fds[RK_IPC_VMM_HANDLES];
    while (got < nh) {
        size_t k = nh - got < RK_IPC_FD_MAX ? nh - got : RK_IPC_FD_MAX;
        if (rk_ipc_fd_fetch(d->owner, k, l->addr + got, l->ids + got, fds + got, bytes + got,
                            offs + got, why, len) != 0)
            break;
        got += k;
    }
    rankmem_vmm_handle_t *h = got == nh ? calloc(nh, sizeof *h) : NULL;
    void *p = NULL;
    int ok = h != NULL;
    for (size_t i = 0; ok && i < nh; i++) {
        h[i].id = l->ids[i];
        h[i].address = l->addr[i];
        h[i].bytes = (size_t)bytes[i];
        h[i].fd_offset = offs[i];
        h[i].fd = fds[i];
        ok = bytes[i] == l->bytes[i];
    }
    if (h && !ok) {
        snprintf(why, len, "its handles' sizes changed");
    } else if (h) {
        rankmem_vmm_export_t e;
        memset(&e, 0, sizeof e);
        e.backend = d->backend;
        e.device = -1;
        e.granule = (size_t)d->granule;
        e.count = nh;
        e.offset = 0;
        e.bytes = (size_t)d->size;
        e.handles = h;
#if RK_IPC_CUDA
        int prev = dev_enter();
#endif
        if (rankmem_vmm_import(&e, &p, im) != RANKMEM_SUCCESS) {
            snprintf(why, len, "%s", rankmem_last_error());
            p = NULL;
        }
#if RK_IPC_CUDA
        dev_leave(prev);
#endif
    } else if (got == nh) {
        snprintf(why, len, "out of host memory");
    }
    for (size_t i = 0; i < got; i++)
        close(fds[i]); /* the mapping keeps the memory */
    free(h);
    return p;
}

static char *open_mapping(const rk_ipc_desc_t *d, const vmm_list_t *l,
                          rankmem_vmm_import_t **im, char *why, size_t len)
{
    char *fb;
    size_t fn;
    if (rk_stg_fake_region(&fb, &fn) && fake_fail_every > 0 &&
        ++fake_fail_count % fake_fail_every == 0) {
        snprintf(why, len, "the test backend refused it on purpose");
        return NULL;
    }
    if (d->kind == RK_IPC_KIND_VMM)
        return open_vmm(d, l, im, why, len);
    if (d->kind != RK_IPC_KIND_CUDA) {
        snprintf(why, len, "a descriptor of unknown kind %d", (int)d->kind);
        return NULL;
    }
    if (fake_fd >= 0) {
        fake_handle_t h;
        memcpy(&h, d->u.handle, sizeof h);
        if (memcmp(h.tag, "rkfake", 7) != 0) {
            snprintf(why, len, "not a handle of the test backend");
            return NULL;
        }
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            snprintf(why, len, "open %s failed", path);
            return NULL;
        }
        void *p = mmap(NULL, d->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) {
            snprintf(why, len, "mmap of a peer's region failed");
            return NULL;
        }
        return p;
    }
#if RK_IPC_CUDA
    cudaIpcMemHandle_t h;
    memcpy(&h, d->u.handle, sizeof h);
    void *p = NULL;
    int prev = dev_enter();
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    dev_leave(prev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, len, "cudaIpcOpenMemHandle: %s", cudaGetErrorString(e));
        return NULL;
    }
    /* Offsets into the mapping must land in the exporter's allocation: a
     * mapping of another extent is refused (the sender then sends the data
     * staged). A defence only: on the H100 every mapping tried was exact. */
    unsigned long long mb = 0;
    size_t ms = 0;
    int attrs[2] = {RK_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, RK_CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    void *data[2] = {&mb, &ms};
    if (rk_stg_cu_pointer_attrs(2, attrs, data, p) == 0 &&
        (mb != (unsigned long long)(uintptr_t)p || ms != d->size)) {
        prev = dev_enter();
        if (cudaIpcCloseMemHandle(p) != cudaSuccess)
            (void)cudaGetLastError();
        dev_leave(prev);
        snprintf(why, len, "its allocation of %llu bytes maps here as %zu bytes",
                 (unsigned long long)d->size, ms);
        return NULL;
    }
    return p;
#else
    snprintf(why, len, "a build without CUDA");
    return NULL;
#endif
}

static void close_mapping(map_t *m)
{
    if (m->kind == RK_IPC_KIND_VMM) {
#if RK_IPC_CUDA
        int prev = dev_enter();
#endif
        (void)rankmem_vmm_import_close(m->im);
#if RK_IPC_CUDA
        dev_leave(prev);
#endif
        return;
    }
    if (fake_fd >= 0) {
        munmap(m->ptr, m->size);
        return;
    }
#if RK_IPC_CUDA
    int prev = dev_enter();
    if (cudaIpcCloseMemHandle(m->ptr) != cudaSuccess)
        (void)cudaGetLastError();
    dev_leave(prev);
#endif
}

/* Unlink and close m (under lock; refs == 0). */
static void drop(map_t **pp)
{
    map_t *m = *pp;
    *pp = m->next;
    nmaps--;
    close_mapping(m);
    free(m->ids);
    free(m);
}

/* Whether mapping m holds what d describes: the same allocation (cudaIpc
 * kind), or a run of handles that contains d's, l (vmm kind: ids are never
 * reused by an owner, so equal ids are the same memory). */
static int covers(const map_t *m, const rk_ipc_desc_t *d, const vmm_list_t *l)
{
    if (m->owner != d->owner || m->kind != d->kind)
        return 0;
    if (d->kind != RK_IPC_KIND_VMM)
        return m->id == d->buffer_id;
    if (d->base < m->base || d->size > m->size || d->base - m->base > m->size - d->size)
        return 0;
    for (size_t j = 0; j + l->n <= m->nh; j++)
        if (m->ids[j] == l->ids[0]) {
            for (size_t i = 1; i < l->n; i++)
                if (m->ids[j + i] != l->ids[i])
                    return 0;
            return 1;
        }
    return 0;
}

static void *map_locked(const rk_ipc_desc_t *d, const vmm_list_t *l);

void *rk_ipc_map(const rk_ipc_desc_t *d)
{
    if (!d || d->offset > d->size || d->bytes > d->size - d->offset)
        return NULL;
    /* A vmm descriptor's handles, one by one (on the heap: 6 KiB). */
    vmm_list_t *l = NULL;
    if (d->kind == RK_IPC_KIND_VMM) {
        l = malloc(sizeof *l);
        if (!l || vmm_expand(d, l) != 0) {
            free(l);
            return NULL;
        }
    }
    void *r = map_locked(d, l);
    free(l);
    return r;
}

static void *map_locked(const rk_ipc_desc_t *d, const vmm_list_t *l)
{
    pthread_mutex_lock(&lock);
    for (map_t *m = maps; m; m = m->next)
        if (!m->stale && covers(m, d, l)) {
            m->refs++;
            m->used = ++tick;
            stats.hits++;
            pthread_mutex_unlock(&lock);
            return m->ptr + (d->base - m->base) + d->offset;
        }
    /* A new allocation of that owner over addresses we map: the old one is
     * gone (freed, perhaps reallocated with other contents), so its mapping
     * must never be read again. */
    for (map_t **pp = &maps; *pp;) {
        map_t *m = *pp;
        if (m->owner == d->owner && m->kind == d->kind && m->base < d->base + d->size &&
            d->base < m->base + m->size) {
            stats.stale++;
            if (m->refs == 0) {
                drop(pp);
                continue;
            }
            m->stale = 1;
        }
        pp = &m->next;
    }
    /* Bounded: evict the least recently used idle mappings. */
    while (nmaps >= cache_max) {
        map_t **vp = NULL;
        for (map_t **pp = &maps; *pp; pp = &(*pp)->next)
            if ((*pp)->refs == 0 && (!vp || (*pp)->used < (*vp)->used))
                vp = pp;
        if (!vp)
            break; /* all in use: go over the bound for now */
        stats.evicted++;
        drop(vp);
    }
    char why[160] = "";
    rankmem_vmm_import_t *im = NULL;
    char *p = open_mapping(d, l, &im, why, sizeof why);
    map_t *m = p ? calloc(1, sizeof *m) : NULL;
    if (p && !m) {
        map_t tmp = {.ptr = p, .size = d->size, .kind = d->kind, .im = im};
        close_mapping(&tmp);
        p = NULL;
    }
    if (!p) {
        static int told;
        stats.refused_maps++;
        if (!probing && !told++)
            rk_mpi_warn("staging: cannot map rank %d's device memory (%s): its messages to this "
                        "rank are staged instead",
                        (int)d->owner, why[0] ? why : "out of memory");
        pthread_mutex_unlock(&lock);
        return NULL;
    }
    m->owner = d->owner;
    m->kind = d->kind;
    m->im = im;
    if (d->kind == RK_IPC_KIND_VMM) {
        m->ids = malloc(l->n * sizeof *m->ids);
        if (!m->ids) {
            close_mapping(m);
            free(m);
            stats.refused_maps++;
            pthread_mutex_unlock(&lock);
            return NULL;
        }
        memcpy(m->ids, l->ids, l->n * sizeof *m->ids);
        m->nh = l->n;
        stats.vmm_opened++;
    }
    m->id = d->buffer_id;
    m->base = d->base;
    m->size = d->size;
    m->ptr = p;
    m->refs = 1;
    m->used = ++tick;
    m->next = maps;
    maps = m;
    nmaps++;
    stats.opened++;
    pthread_mutex_unlock(&lock);
    return p + d->offset;
}

void rk_ipc_release(const void *mapped)
{
    if (!mapped)
        return;
    const char *q = mapped;
    pthread_mutex_lock(&lock);
    /* The mapping that holds q; one that ends at q only when none holds
     * it (a buffer of 0 bytes at the end): mappings are often adjacent, and
     * the one below a mapping must not take its release. */
    map_t **hit = NULL;
    for (map_t **pp = &maps; *pp; pp = &(*pp)->next) {
        map_t *m = *pp;
        if (m->refs > 0 && q >= m->ptr && q <= m->ptr + m->size) {
            if (q < m->ptr + m->size) {
                hit = pp;
                break;
            }
            if (!hit)
                hit = pp;
        }
    }
    if (hit) {
        map_t *m = *hit;
        if (--m->refs == 0 && (m->stale || nmaps > cache_max))
            drop(hit);
    }
    pthread_mutex_unlock(&lock);
}

void rk_ipc_stats(rk_ipc_stats_t *s)
{
    pthread_mutex_lock(&lock);
    *s = stats;
    s->cached = nmaps;
    s->busy = 0;
    for (map_t *m = maps; m; m = m->next)
        s->busy += m->refs > 0;
    pthread_mutex_unlock(&lock);
}

int rk_ipc_reaches(int w) { return rk_ipc_on && near && w >= 0 && w < world_size && near[w]; }

/* ---- the node's decision ---- */

#define VMM_PROBE_BYTES ((size_t)64 << 10)

/* A probe buffer to export at init (freed after the decision): from the
 * rank's vmm pool when it has one (its handles then go through the fd
 * service, the path its buffers will take). */
static void *probe_alloc(void)
{
    char *fb;
    size_t fn;
    if (vmm_served) {
        void *p = NULL;
        rk_obs_internal_depth++; /* rankmem's own memory, not the program's */
        if (rankmem_allocate(vmm_mr, VMM_PROBE_BYTES, 0, &p) != RANKMEM_SUCCESS)
            p = NULL;
        rk_obs_internal_depth--;
        return p;
    }
    if (rk_stg_fake_region(&fb, &fn))
        return fake_fd >= 0 ? fb : NULL;
#if RK_IPC_CUDA
    void *p = NULL;
    int prev = dev_enter();
    rk_obs_internal_depth++; /* rankmem's own memory, not the program's */
    cudaError_t e = cudaMalloc(&p, IPC_MIN_ALLOCATION); /* a whole block: exportable */
    rk_obs_internal_depth--;
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        p = NULL;
    }
    dev_leave(prev);
    return p;
#else
    return NULL;
#endif
}

static void probe_free(void *p)
{
    char *fb;
    size_t fn;
    if (p && vmm_served) {
        rk_obs_internal_depth++;
        (void)rankmem_deallocate(vmm_mr, p, VMM_PROBE_BYTES, 0);
        rk_obs_internal_depth--;
        return;
    }
    if (!p || rk_stg_fake_region(&fb, &fn))
        return;
#if RK_IPC_CUDA
    int prev = dev_enter();
    rk_obs_internal_depth++;
    cudaFree(p);
    rk_obs_internal_depth--;
    dev_leave(prev);
#endif
}

/* Whether mr's chain holds a vmm pool (asked first, so that a chain
 * without one leaves no error behind for the program to find). */
static int has_vmm(rankmem_resource_t *mr)
{
    for (int depth = 0; mr && depth < 64; depth++) {
        const char *name = NULL;
        if (rankmem_resource_name(mr, &name) == RANKMEM_SUCCESS && name && !strcmp(name, "vmm"))
            return 1;
        if (rankmem_resource_upstream(mr, &mr) != RANKMEM_SUCCESS)
            return 0;
    }
    return 0;
}

void rk_ipc_init(int mode, int cache, int stg_on)
{
    if (cache > 0)
        cache_max = cache;
    char why[200] = "";
    PMPI_Comm_size(MPI_COMM_WORLD, &world_size);
    int me = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm node = MPI_COMM_NULL;
    if (rk_mpi_node_comm(MPI_COMM_WORLD, me, &node) != MPI_SUCCESS || node == MPI_COMM_NULL)
        return;
    int nn = 1, nr = 0;
    PMPI_Comm_size(node, &nn);
    PMPI_Comm_rank(node, &nr);
    char *fb;
    size_t fn;
    int fake = rk_stg_fake_region(&fb, &fn);
    /* Which node peers use our GPU (by PCI bus id). */
    char bus[32] = "";
#if RK_IPC_CUDA
    int gdev = rk_mpi_gpu_current();
    if (!fake && stg_on && gdev >= 0 && cudaDeviceGetPCIBusId(bus, (int)sizeof bus, gdev) != cudaSuccess) {
        (void)cudaGetLastError();
        bus[0] = 0;
    }
#endif
    /* The test backend's ranks "share" one GPU when asked (RKT_FAKE_SHARED_GPU). */
    if (fake && stg_on && getenv("RKT_FAKE_SHARED_GPU"))
        snprintf(bus, sizeof bus, "fake-gpu");
    char *buses = calloc((size_t)nn, sizeof bus);
    int shared = 0;
    if (buses && PMPI_Allgather(bus, (int)sizeof bus, MPI_CHAR, buses, (int)sizeof bus, MPI_CHAR,
                                node) == MPI_SUCCESS && bus[0])
        for (int i = 0; i < nn; i++)
            if (i != nr && strncmp(buses + (size_t)i * sizeof bus, bus, sizeof bus) == 0)
                shared = 1;
    free(buses);
    /* Ranks sharing a GPU without MPS pay a context switch on small copies
     * (docs/staging.md); under MPS (its control pipe is there) they share
     * one context and plain copies are best. */
    char mps_path[512];
    int mps = rk_mps_running(mps_path, sizeof mps_path);
    rk_stg_shared_gpu = shared && !mps;
    /* The rank's vmm pool: its memory goes through the fd service, whose
     * socket name holds a nonce of the job (node rank 0's, for the node). */
    uint64_t nonce = 0;
    if (nr == 0) {
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(&nonce, sizeof nonce, 1, f) != 1)
            nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)&nonce;
        if (f)
            fclose(f);
    }
    PMPI_Bcast(&nonce, 1, MPI_UINT64_T, 0, node);
    int can = mode != 2 && stg_on && nn > 1;
    rankmem_resource_t *rmr = rankmem_mpi_resource();
    void *vb = NULL;
    size_t vn = 0;
    if (can && has_vmm(rmr) && rankmem_vmm_range(rmr, &vb, &vn) == RANKMEM_SUCCESS) {
        char fwhy[160] = "";
        if (rk_ipc_fd_start(nonce, me, world_size, rmr, fwhy, sizeof fwhy) == 0) {
            vmm_mr = rmr;
            rankmem_resource_retain(vmm_mr);
            vmm_lo = (uintptr_t)vb;
            vmm_hi = (uintptr_t)vb + vn;
            vmm_served = 1;
        } else {
            snprintf(why, sizeof why, "%s", fwhy);
        }
    }
    /* can: this rank takes part (wants IPC, stages, has a way to export). */
    if (can && fake && fake_fd < 0 && !vmm_served) {
        can = 0;
        if (!why[0]) /* else the fd service's reason, said above */
            snprintf(why, sizeof why, "the test backend has no memory file");
    }
    if (can && !fake && !RK_IPC_CUDA)
        can = 0, snprintf(why, sizeof why, "CUDA IPC is not built for HIP");
    rk_ipc_desc_t mine;
    memset(&mine, 0, sizeof mine);
    void *probe = NULL;
    if (can) {
        probe = probe_alloc();
        rk_ipc_on = 1; /* for rk_ipc_export */
        if (!probe || rk_ipc_export(probe, 1, &mine) != 0) {
            can = 0;
            snprintf(why, sizeof why, "%s",
                     vmm_served ? "the rank's vmm pool could not describe its memory"
                                : "cudaIpcGetMemHandle refused this rank's memory");
        }
        rk_ipc_on = 0;
    }
    mine.spare = can;
    mine.owner = me;
    rk_ipc_desc_t *all = calloc((size_t)nn, sizeof *all);
    int ok = can && all != NULL;
    if (all && PMPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                              node) != MPI_SUCCESS)
        ok = 0;
    for (int i = 0; ok && i < nn; i++) {
        if (i == nr)
            continue;
        if (!all[i].spare) {
            ok = 0;
            if (!why[0])
                snprintf(why, sizeof why, "rank %d does not take part", (int)all[i].owner);
            break;
        }
        probing = 1;
        void *p = rk_ipc_map(&all[i]);
        probing = 0;
        if (!p) {
            ok = 0;
            snprintf(why, sizeof why, "rank %d could not map rank %d's memory", me,
                     (int)all[i].owner);
            break;
        }
        rk_ipc_release(p);
    }
    /* The probes' mappings are closed before their memory goes. */
    pthread_mutex_lock(&lock);
    while (maps)
        drop(&maps);
    memset(&stats, 0, sizeof stats);
    pthread_mutex_unlock(&lock);
    int node_ok = 0;
    PMPI_Allreduce(&ok, &node_ok, 1, MPI_INT, MPI_MIN, node);
    probe_free(probe);
    if (node_ok) {
        near = calloc((size_t)world_size, 1);
        if (near)
            for (int i = 0; i < nn; i++)
                if (i != nr && all[i].owner >= 0 && all[i].owner < world_size)
                    near[all[i].owner] = 1;
        rk_ipc_on = near != NULL;
    }
    if (!rk_ipc_on && vmm_served) {
        /* Nobody will ask. */
        rk_ipc_fd_stop();
        vmm_served = 0;
    }
    /* Answers travel against the data's direction, with the data's tag (a
     * number the sender chose): a communicator of their own keeps them from
     * meeting the other side's descriptors of the same number. Collective
     * over MPI_COMM_WORLD (every rank runs this function). */
    if (PMPI_Comm_dup(MPI_COMM_WORLD, &ack_comm) != MPI_SUCCESS) {
        ack_comm = MPI_COMM_NULL;
        rk_ipc_on = 0;
    } else {
        PMPI_Comm_set_name(ack_comm, "rankmem-ipc-answers");
    }
    free(all);
    /* One line for the job: nodes where IPC was wanted and refused. A rank
     * alone on its node, or one that does not stage, is no refusal. */
    int wanted = mode != 2 && stg_on && nn > 1;
    int refused = wanted && !rk_ipc_on && (mode == 1 || why[0]) ? 1 : 0;
    int lead = nr == 0 ? refused : 0;
    int nodes[4] = {lead, nr == 0, rk_ipc_on, stg_on && rk_stg_shared_gpu}, sum[4] = {0, 0, 0, 0};
    PMPI_Allreduce(nodes, sum, 4, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    /* Ranks that share a GPU without MPS: what it costs, once for the job
     * (the copies below avoid the context switch only for some sizes). */
    if (me == 0 && sum[3] > 0)
        rk_mpi_warn("staging: %d of %d ranks share their GPU with another rank of the node without "
                    "MPS: device messages of 1 to 4 KiB, and those below 4 KiB whose size is not a "
                    "multiple of 4 bytes, cost about 150 us each (the GPU switches between the "
                    "processes' contexts; 7 to 15 us under MPS). Start MPS on each node before "
                    "the job: nvidia-cuda-mps-control -d (docs/staging.md)",
                    sum[3], world_size);
    /* Some rank sends through IPC: every host receive from its size on may
     * meet a header. */
    if (sum[2] > 0)
        rk_stg_hdr_min = RK_STG_IPC_MIN;
    /* The first reason, from the lowest world rank that has one. */
    int cand = refused && why[0] ? me : world_size, first = world_size;
    PMPI_Allreduce(&cand, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first < world_size) {
        if (me == first && first != 0)
            PMPI_Send(why, (int)sizeof why, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
        if (me == 0 && first != 0)
            PMPI_Recv(why, (int)sizeof why, MPI_CHAR, first, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (me == 0)
            rk_mpi_warn("staging: CUDA IPC between ranks of a node is off on %d of %d node%s (%s): "
                        "device messages between them go through host memory",
                        sum[0] ? sum[0] : 1, sum[1], sum[1] == 1 ? "" : "s", why);
    }
    rk_mpi_verbose("staging: CUDA IPC %s (RANKMEM_STAGING_IPC=%s, %d rank%s on this node, cache "
                   "of %d mappings%s)%s%s",
                   rk_ipc_on ? "on" : "off", mode == 0 ? "auto" : mode == 1 ? "on" : "off", nn,
                   nn == 1 ? "" : "s", cache_max,
                   vmm_served ? "; the vmm pool's memory by its physical handles" : "",
                   shared ? "; the GPU is shared with another rank of the node, " : "",
                   !shared ? ""
                   : mps           ? "under MPS"
                                   : "without MPS (small device messages pay the GPU's context "
                                     "switches: docs/staging.md)");
    PMPI_Comm_free(&node);
}

void rk_ipc_finalize(void)
{
    pthread_mutex_lock(&lock);
    rk_ipc_stats_t s = stats;
    for (map_t **pp = &maps; *pp;) {
        if ((*pp)->refs == 0) {
            drop(pp);
            continue;
        }
        pp = &(*pp)->next; /* a copy still in flight: leave it to the process's end */
    }
    pthread_mutex_unlock(&lock);
    /* No peer maps our handles any more (MPI_Finalize): the service goes. */
    if (vmm_served)
        rk_ipc_fd_stop();
    vmm_served = 0;
    if (vmm_mr) {
        rankmem_resource_release(vmm_mr);
        vmm_mr = NULL;
    }
    if (rk_ipc_on)
        rk_mpi_verbose("staging: CUDA IPC mapped %llu allocation%s of peers (%llu of vmm handles; "
                       "%llu hits, %llu replaced, %llu evicted, %llu refused), exported %llu (%llu "
                       "of vmm memory)",
                       (unsigned long long)s.opened, s.opened == 1 ? "" : "s",
                       (unsigned long long)s.vmm_opened, (unsigned long long)s.hits,
                       (unsigned long long)s.stale, (unsigned long long)s.evicted,
                       (unsigned long long)s.refused_maps, (unsigned long long)s.exports,
                       (unsigned long long)s.vmm_exports);
    free(near);
    near = NULL;
    rk_ipc_on = 0;
    if (ack_comm != MPI_COMM_NULL)
        PMPI_Comm_free(&ack_comm);
}
