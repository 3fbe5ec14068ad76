/* The vmm resource's mapping layer (see vmm_map.h): virtual bookkeeping
 * shared by every backend, then the backends (host simulation, CUDA driver
 * API opened at run time, HIP). */
#define _GNU_SOURCE
#include "vmm_map.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if HAVE_CUDA
#include <cuda.h> /* types and enums only: the functions are looked up at run time */
#include <dlfcn.h>
#include <pthread.h>
#elif HAVE_HIP
#include "gpu_api.h"
#endif

#define HOST_DEFAULT_GRANULE ((size_t)2 << 20)

typedef struct {
    size_t start, count; /* granules */
} hole_t;

struct rk_vmm_map {
    rk_vmm_backend_t backend;
    int device;
    int exportable;
    char *base;
    size_t granule, ngranules; /* the reservation: ngranules * granule bytes */
    size_t frontier;           /* granules at and above it were never mapped */
    hole_t *holes;             /* unmapped spans below the frontier, sorted, disjoint */
    size_t nholes, cap_holes;
    uint64_t *handles;         /* per extent's first granule (GPU backends); host: unused */
    /* Extents: one physical handle may cover up to hmax granules (fewer
     * creates when growing; given back only whole). With hmax 1 every
     * granule is its own extent and ext_len stays NULL. */
    size_t hmax;
    /* handle= not given on a GPU: handles grow with the map (auto_ext). */
    int hauto;
    uint32_t *ext_len; /* at an extent's first granule: its length; elsewhere 0 */
    size_t mapped, mapped_high, maximum;
    /* Export ids at each exported extent's first granule (0: none yet),
     * allocated at the first export; an unmapped extent loses its id. */
    uint64_t *ids;
    int memfd;                 /* host */
    size_t fail_at, fail_count; /* host: the map call that fails (countdown), how many */
    rk_vmm_counters_t n;
};

/* ---- backends: create+map one granule, unmap+release it, set access ---- */

static rankmem_status_t host_map(rk_vmm_map_t *m, size_t g, size_t n)
{
    if (m->fail_at && --m->fail_at == 0) {
        if (--m->fail_count)
            m->fail_at = 1; /* the next fails too */
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                        "vmm: host backend: injected failure mapping granule %zu", g);
    }
    m->n.creates++;
    void *p = mmap(m->base + g * m->granule, n * m->granule, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, m->memfd, (off_t)(g * m->granule));
    if (p == MAP_FAILED)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "vmm: host backend: mmap of granule %zu: %s", g,
                        strerror(errno));
    m->n.maps += n;
    return RANKMEM_SUCCESS;
}

static void host_unmap(rk_vmm_map_t *m, size_t g, size_t n)
{
    /* Back to an inaccessible reservation, and the file's pages freed: the
     * same effect as cuMemUnmap + cuMemRelease on the memory used. */
    (void)mmap(m->base + g * m->granule, n * m->granule, PROT_NONE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    (void)fallocate(m->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    (off_t)(g * m->granule), (off_t)(n * m->granule));
    m->n.unmaps += n;
    m->n.releases += n;
}

#if HAVE_CUDA
/* The driver API, opened once (no libcuda at link time, like mpi/staging/base.c). */
static struct {
    int ok;
    const char *why;
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*attr)(int *, CUdevice_attribute, CUdevice);
    CUresult (*total_mem)(size_t *, CUdevice);
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                            CUmemAllocationGranularity_flags);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*addr_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                    unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*export_h)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                         unsigned long long);
    CUresult (*import_h)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*err_string)(CUresult, const char **);
} cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_open(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        cu.why = "libcuda.so.1 not found";
        return;
    }
#define CU_SYM(field, name)                                                                      \
    if (!(*(void **)&cu.field = dlsym(h, name))) {                                               \
        cu.why = "the driver lacks " name;                                                       \
        return;                                                                                  \
    }
    CU_SYM(init, "cuInit");
    CU_SYM(device_get, "cuDeviceGet");
    CU_SYM(attr, "cuDeviceGetAttribute");
    CU_SYM(total_mem, "cuDeviceTotalMem_v2");
    CU_SYM(granularity, "cuMemGetAllocationGranularity");
    CU_SYM(reserve, "cuMemAddressReserve");
    CU_SYM(addr_free, "cuMemAddressFree");
    CU_SYM(create, "cuMemCreate");
    CU_SYM(release, "cuMemRelease");
    CU_SYM(map, "cuMemMap");
    CU_SYM(unmap, "cuMemUnmap");
    CU_SYM(set_access, "cuMemSetAccess");
    CU_SYM(export_h, "cuMemExportToShareableHandle");
    CU_SYM(import_h, "cuMemImportFromShareableHandle");
    CU_SYM(err_string, "cuGetErrorString");
#undef CU_SYM
    if (cu.init(0) != CUDA_SUCCESS) {
        cu.why = "cuInit failed";
        return;
    }
    cu.ok = 1; /* the handle stays open for the life of the process */
}

static rankmem_status_t cu_fail(CUresult r, const char *what, size_t bytes)
{
    const char *s = NULL;
    if (cu.err_string)
        cu.err_string(r, &s);
    return rk_error(r == CUDA_ERROR_OUT_OF_MEMORY ? RANKMEM_ERR_OUT_OF_MEMORY
                                                  : RANKMEM_ERR_DEVICE,
                    "vmm: %s (%zu bytes): %s (%d)", what, bytes, s ? s : "unknown error", (int)r);
}

static void cu_prop(CUmemAllocationProp *prop, int device, int exportable)
{
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = device;
    prop->requestedHandleTypes =
        exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
}

static rankmem_status_t cu_set_access(int device, char *ptr, size_t bytes)
{
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = device;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult r = cu.set_access((CUdeviceptr)(uintptr_t)ptr, bytes, &a, 1);
    return r == CUDA_SUCCESS ? RANKMEM_SUCCESS : cu_fail(r, "cuMemSetAccess", bytes);
}
#endif

#if HAVE_HIP
static rankmem_status_t hip_fail(hipError_t r, const char *what, size_t bytes)
{
    return rk_error(r == hipErrorOutOfMemory ? RANKMEM_ERR_OUT_OF_MEMORY : RANKMEM_ERR_DEVICE,
                    "vmm: %s (%zu bytes): %s", what, bytes, hipGetErrorString(r));
}

static void hip_prop(hipMemAllocationProp *prop, int device, int exportable)
{
    memset(prop, 0, sizeof *prop);
    prop->type = hipMemAllocationTypePinned;
    prop->location.type = hipMemLocationTypeDevice;
    prop->location.id = device;
    prop->requestedHandleType =
        exportable ? hipMemHandleTypePosixFileDescriptor : hipMemHandleTypeNone;
}

static rankmem_status_t hip_set_access(int device, char *ptr, size_t bytes)
{
    hipMemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = hipMemLocationTypeDevice;
    a.location.id = device;
    a.flags = hipMemAccessFlagsProtReadWrite;
    hipError_t r = hipMemSetAccess(ptr, bytes, &a, 1);
    return r == hipSuccess ? RANKMEM_SUCCESS : hip_fail(r, "hipMemSetAccess", bytes);
}
#endif

/* Granules in the extent that starts at g. */
static inline size_t ext_of(const rk_vmm_map_t *m, size_t g)
{
    return m->ext_len ? m->ext_len[g] : 1;
}

/* One physical handle of n granules, mapped at granule g. */
static rankmem_status_t map_ext(rk_vmm_map_t *m, size_t g, size_t n)
{
    rankmem_status_t st = RANKMEM_SUCCESS;
    char *ptr = m->base + g * m->granule;
    size_t bytes = n * m->granule;
    if (m->backend == RK_VMM_HOST) {
        st = host_map(m, g, n);
    } else {
#if HAVE_CUDA
        CUmemAllocationProp prop;
        cu_prop(&prop, m->device, m->exportable);
        CUmemGenericAllocationHandle h;
        CUresult r = cu.create(&h, bytes, &prop, 0);
        if (r != CUDA_SUCCESS)
            return cu_fail(r, "cuMemCreate", bytes);
        m->n.creates++;
        r = cu.map((CUdeviceptr)(uintptr_t)ptr, bytes, 0, h, 0);
        if (r != CUDA_SUCCESS) {
            cu.release(h);
            m->n.releases += n;
            return cu_fail(r, "cuMemMap", bytes);
        }
        m->n.maps += n;
        m->handles[g] = (uint64_t)h;
#elif HAVE_HIP
        hipMemAllocationProp prop;
        hip_prop(&prop, m->device, m->exportable);
        hipMemGenericAllocationHandle_t h;
        hipError_t r = hipMemCreate(&h, bytes, &prop, 0);
        if (r != hipSuccess)
            return hip_fail(r, "hipMemCreate", bytes);
        m->n.creates++;
        r = hipMemMap(ptr, bytes, 0, h, 0);
        if (r != hipSuccess) {
            (void)hipMemRelease(h);
            m->n.releases += n;
            return hip_fail(r, "hipMemMap", bytes);
        }
        m->n.maps += n;
        m->handles[g] = (uint64_t)(uintptr_t)h;
#else
        (void)ptr;
        (void)bytes;
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "vmm: built without a GPU runtime");
#endif
    }
    if (st == RANKMEM_SUCCESS && m->ext_len)
        m->ext_len[g] = (uint32_t)n;
    return st;
}

/* Unmap and release the extent that starts at g. */
static void unmap_ext(rk_vmm_map_t *m, size_t g)
{
    size_t n = ext_of(m, g);
    char *ptr = m->base + g * m->granule;
    if (m->backend == RK_VMM_HOST) {
        host_unmap(m, g, n);
    } else {
#if HAVE_CUDA
        (void)cu.unmap((CUdeviceptr)(uintptr_t)ptr, n * m->granule);
        (void)cu.release((CUmemGenericAllocationHandle)m->handles[g]);
#elif HAVE_HIP
        (void)hipMemUnmap(ptr, n * m->granule);
        (void)hipMemRelease((hipMemGenericAllocationHandle_t)(uintptr_t)m->handles[g]);
#else
        (void)ptr;
#endif
        m->handles[g] = 0;
        m->n.unmaps += n;
        m->n.releases += n;
    }
    if (m->ext_len)
        m->ext_len[g] = 0;
    if (m->ids)
        m->ids[g] = 0; /* export: a handle mapped here later is another */
}

static rankmem_status_t set_access(rk_vmm_map_t *m, char *ptr, size_t bytes)
{
    m->n.set_access++;
#if HAVE_CUDA
    if (m->backend == RK_VMM_CUDA)
        return cu_set_access(m->device, ptr, bytes);
#elif HAVE_HIP
    if (m->backend == RK_VMM_HIP)
        return hip_set_access(m->device, ptr, bytes);
#endif
    (void)ptr;
    (void)bytes;
    return RANKMEM_SUCCESS; /* host: mmap gave PROT_READ|PROT_WRITE already */
}

/* ---- availability ---- */

int rk_vmm_backend_available(rk_vmm_backend_t backend, int device, const char **why_p)
{
    if (backend == RK_VMM_HOST)
        return 1;
#if HAVE_CUDA
    if (backend != RK_VMM_CUDA) {
        *why_p = "this rankmem was built for CUDA, not HIP";
        return 0;
    }
    pthread_once(&cu_once, cu_open);
    if (!cu.ok) {
        *why_p = cu.why ? cu.why : "the CUDA driver did not initialise";
        return 0;
    }
    CUdevice d;
    int v = 0;
    if (cu.device_get(&d, device) != CUDA_SUCCESS ||
        cu.attr(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d) != CUDA_SUCCESS ||
        !v) {
        *why_p = "the device does not support virtual memory management";
        return 0;
    }
    return 1;
#elif HAVE_HIP
    if (backend != RK_VMM_HIP) {
        *why_p = "this rankmem was built for HIP, not CUDA";
        return 0;
    }
    /* HIP 5.x has no attribute saying so: ask for the granularity. */
    hipMemAllocationProp prop;
    hip_prop(&prop, device, 0);
    size_t g = 0;
    if (hipMemGetAllocationGranularity(&g, &prop, hipMemAllocationGranularityMinimum) !=
            hipSuccess ||
        !g) {
        *why_p = "hipMemGetAllocationGranularity failed: the device or HIP runtime does not "
                 "support virtual memory management";
        return 0;
    }
    return 1;
#else
    (void)device;
    (void)backend;
    *why_p = "rankmem was built without a GPU runtime";
    return 0;
#endif
}

size_t rk_vmm_device_memory(rk_vmm_backend_t backend, int device)
{
    size_t total = 0;
#if HAVE_CUDA
    CUdevice d;
    if (backend == RK_VMM_CUDA && cu.ok && cu.device_get(&d, device) == CUDA_SUCCESS &&
        cu.total_mem(&total, d) != CUDA_SUCCESS)
        total = 0;
#elif HAVE_HIP
    if (backend == RK_VMM_HIP && hipDeviceTotalMem(&total, device) != hipSuccess)
        total = 0;
#else
    (void)backend;
    (void)device;
#endif
    return total;
}

/* Whether the device can export granules as POSIX fds (GPU backends), and
 * the granularity to use (0 on failure). */
static size_t device_granule(rk_vmm_backend_t backend, int device, int *exportable_p)
{
    size_t g = 0;
    *exportable_p = 0;
#if HAVE_CUDA
    if (backend == RK_VMM_CUDA) {
        CUdevice d;
        int v = 0;
        if (cu.device_get(&d, device) == CUDA_SUCCESS &&
            cu.attr(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, d) ==
                CUDA_SUCCESS)
            *exportable_p = v != 0;
        CUmemAllocationProp prop;
        cu_prop(&prop, device, *exportable_p);
        if (cu.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS)
            g = 0;
    }
#elif HAVE_HIP
    if (backend == RK_VMM_HIP) {
        *exportable_p = 1; /* POSIX fds are HIP's only handle type on Linux */
        hipMemAllocationProp prop;
        hip_prop(&prop, device, 1);
        if (hipMemGetAllocationGranularity(&g, &prop, hipMemAllocationGranularityRecommended) !=
            hipSuccess)
            g = 0;
    }
#else
    (void)backend;
    (void)device;
#endif
    return g;
}

/* ---- the map ---- */

/* Host backend: RANKMEM_VMM_HOST_HANDLES=auto gives it the GPU's default
 * handles (growing with the map, auto_ext) instead of one per granule, so
 * that replays on a CPU count the handles a GPU would create (bench only). */
static int host_auto_handles(void)
{
    const char *v = getenv("RANKMEM_VMM_HOST_HANDLES");
    return v && !strcmp(v, "auto");
}

rankmem_status_t rk_vmm_map_create(rk_vmm_backend_t backend, int device, size_t reserve,
                                   size_t granule, size_t handle, size_t maximum,
                                   rk_vmm_map_t **map_p)
{
    const char *why = "";
    if (!rk_vmm_backend_available(backend, device, &why))
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "vmm: no virtual memory API: %s", why);
    int exportable = 1; /* host: memfd ranges travel as fds */
    if (backend != RK_VMM_HOST) {
        size_t g = device_granule(backend, device, &exportable);
        if (!g)
            return rk_error(RANKMEM_ERR_DEVICE, "vmm: the device's allocation granularity is "
                                                "unknown");
        if (granule && granule % g)
            return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                            "vmm: granule %zu is not a multiple of the device's granularity %zu",
                            granule, g);
        if (!granule)
            granule = g;
    } else if (!granule) {
        granule = HOST_DEFAULT_GRANULE;
    }
    /* Blocks are granule-aligned: more than any call may ask would wrap the
     * reserve's rounding below (2^63 did). */
    if (!rk_is_pow2(granule) || granule < 4096 || granule > RANKMEM_MAX_ALIGNMENT)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "vmm: granule %zu is not a power of two from 4 KiB to 1 GiB "
                        "(RANKMEM_MAX_ALIGNMENT)",
                        granule);
    /* A maximum below one granule builds a pool that can map nothing. */
    if (maximum < granule)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "vmm: maximum of %zu bytes is less than one granule (%zu bytes): it could "
                        "never allocate",
                        maximum, granule);
    if (reserve > SIZE_MAX / 2)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "vmm: reserve of %zu bytes is too large",
                        reserve);
    if (handle && (handle < granule || handle % granule || handle / granule > UINT32_MAX))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "vmm: handle %zu is not a multiple of the granule %zu", handle, granule);
    reserve = rk_align_up(reserve ? reserve : granule, granule);
    rk_vmm_map_t *m = calloc(1, sizeof *m);
    if (!m)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "vmm: no host memory for the map");
    m->backend = backend;
    m->device = device;
    m->exportable = exportable;
    m->granule = granule;
    m->ngranules = reserve / granule;
    m->maximum = maximum;
    m->memfd = -1;
    m->hmax = handle ? handle / granule : 1;
    m->hauto = !handle && (backend != RK_VMM_HOST || host_auto_handles());
    if ((m->hmax > 1 || m->hauto) && !(m->ext_len = calloc(m->ngranules, sizeof *m->ext_len))) {
        free(m);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "vmm: no host memory for %zu extents",
                        reserve / granule);
    }
    rankmem_status_t st = RANKMEM_SUCCESS;
    if (backend != RK_VMM_HOST && !(m->handles = calloc(m->ngranules, sizeof *m->handles))) {
        free(m->ext_len);
        free(m);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "vmm: no host memory for %zu granule handles",
                        reserve / granule);
    }
    if (backend == RK_VMM_HOST) {
        m->memfd = (int)memfd_create("rankmem-vmm", MFD_CLOEXEC);
        if (m->memfd < 0 || ftruncate(m->memfd, (off_t)reserve) != 0)
            st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "vmm: host backend: memfd of %zu bytes: %s",
                          reserve, strerror(errno));
        void *p = MAP_FAILED;
        if (st == RANKMEM_SUCCESS) {
            /* One extra granule to align the start to the granule. */
            p = mmap(NULL, reserve + granule, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED)
                st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                              "vmm: host backend: reserving %zu bytes: %s", reserve,
                              strerror(errno));
        }
        if (st == RANKMEM_SUCCESS) {
            char *b = (char *)p, *a = (char *)rk_align_up((uintptr_t)b, granule);
            if (a > b)
                munmap(b, (size_t)(a - b));
            if (a + reserve < b + reserve + granule)
                munmap(a + reserve, (size_t)(b + granule - a));
            m->base = a;
        }
    }
#if HAVE_CUDA
    else {
        CUdeviceptr p = 0;
        CUresult r = cu.reserve(&p, reserve, granule, 0, 0);
        if (r != CUDA_SUCCESS)
            st = cu_fail(r, "cuMemAddressReserve", reserve);
        m->base = (char *)(uintptr_t)p;
    }
#elif HAVE_HIP
    else {
        void *p = NULL;
        hipError_t r = hipMemAddressReserve(&p, reserve, granule, NULL, 0);
        if (r != hipSuccess)
            st = hip_fail(r, "hipMemAddressReserve", reserve);
        m->base = p;
    }
#endif
    if (st != RANKMEM_SUCCESS) {
        if (m->memfd >= 0)
            close(m->memfd);
        free(m->handles);
        free(m->ext_len);
        free(m);
        return st;
    }
    m->n.reserves++;
    *map_p = m;
    return RANKMEM_SUCCESS;
}

void rk_vmm_map_destroy(rk_vmm_map_t *m)
{
    if (!m)
        return;
    /* Everything below the frontier that is not a hole is mapped. */
    size_t h = 0;
    for (size_t g = 0; g < m->frontier;) {
        if (h < m->nholes && m->holes[h].start == g) {
            g += m->holes[h++].count;
            continue;
        }
        size_t n = ext_of(m, g);
        unmap_ext(m, g);
        g += n;
    }
    size_t bytes = m->ngranules * m->granule;
    if (m->backend == RK_VMM_HOST) {
        munmap(m->base, bytes);
        close(m->memfd);
    }
#if HAVE_CUDA
    else
        (void)cu.addr_free((CUdeviceptr)(uintptr_t)m->base, bytes);
#elif HAVE_HIP
    else
        (void)hipMemAddressFree(m->base, bytes);
#endif
    free(m->holes);
    free(m->handles);
    free(m->ext_len);
    free(m->ids);
    free(m);
}

size_t rk_vmm_map_granule(const rk_vmm_map_t *m) { return m->granule; }
size_t rk_vmm_map_mapped(const rk_vmm_map_t *m) { return m->mapped; }
size_t rk_vmm_map_mapped_high(const rk_vmm_map_t *m) { return m->mapped_high; }
size_t rk_vmm_map_reserved(const rk_vmm_map_t *m) { return m->ngranules * m->granule; }
size_t rk_vmm_map_maximum(const rk_vmm_map_t *m) { return m->maximum; }
char *rk_vmm_map_base(const rk_vmm_map_t *m) { return m->base; }
rk_vmm_backend_t rk_vmm_map_backend(const rk_vmm_map_t *m) { return m->backend; }
int rk_vmm_map_exportable(const rk_vmm_map_t *m) { return m->exportable; }
void rk_vmm_map_counters(const rk_vmm_map_t *m, rk_vmm_counters_t *c_p) { *c_p = m->n; }
void rk_vmm_map_fail_at(rk_vmm_map_t *m, size_t nth, size_t count)
{
    m->fail_at = count ? nth : 0;
    m->fail_count = count;
}

static void hole_remove(rk_vmm_map_t *m, size_t i)
{
    memmove(&m->holes[i], &m->holes[i + 1], (m->nholes - i - 1) * sizeof *m->holes);
    m->nholes--;
}

/* Add [start, start + count) to the holes, merged with its neighbours; a
 * hole that reaches the frontier moves the frontier back instead. */
static int hole_add(rk_vmm_map_t *m, size_t start, size_t count)
{
    size_t i = 0;
    while (i < m->nholes && m->holes[i].start < start)
        i++;
    if (i > 0 && m->holes[i - 1].start + m->holes[i - 1].count == start) {
        i--;
        m->holes[i].count += count;
    } else {
        if (m->nholes == m->cap_holes) {
            size_t cap = m->cap_holes ? m->cap_holes * 2 : 16;
            hole_t *h = realloc(m->holes, cap * sizeof *h);
            if (!h)
                return 0;
            m->holes = h;
            m->cap_holes = cap;
        }
        memmove(&m->holes[i + 1], &m->holes[i], (m->nholes - i) * sizeof *m->holes);
        m->holes[i].start = start;
        m->holes[i].count = count;
        m->nholes++;
    }
    if (i + 1 < m->nholes && m->holes[i].start + m->holes[i].count == m->holes[i + 1].start) {
        m->holes[i].count += m->holes[i + 1].count;
        hole_remove(m, i + 1);
    }
    if (i + 1 == m->nholes && m->holes[i].start + m->holes[i].count == m->frontier) {
        m->frontier = m->holes[i].start;
        hole_remove(m, i);
    }
    return 1;
}

/* Granules per handle when handle= was not given on a GPU. Each handle
 * costs ~60 us on an H100 whatever its size up to 512 MiB (cuMemCreate
 * ~13, cuMemSetAccess ~45 per handle in the range; docs/vmm.md), so one
 * per 2 MiB granule would cost ~0.5 s for an 18 GiB pool. Handles of a
 * 64th of what is mapped (a power of two of granules, at most 256 MiB)
 * keep the count logarithmic, and a handle that stays partly used holds
 * at most ~1.6% of the pool. */
#define AUTO_EXT_SHIFT 6
#define AUTO_EXT_MAX ((size_t)256 << 20)

static size_t auto_ext(const rk_vmm_map_t *m)
{
    size_t want = m->mapped >> AUTO_EXT_SHIFT;
    if (want > AUTO_EXT_MAX)
        want = AUTO_EXT_MAX;
    size_t k = want / m->granule;
    if (k <= 1)
        return 1;
    return (size_t)1 << (63 - __builtin_clzll((unsigned long long)k));
}

int rk_vmm_map_multi(const rk_vmm_map_t *m)
{
    return m->hmax > 1 || m->hauto;
}

rankmem_status_t rk_vmm_map_grow(rk_vmm_map_t *m, size_t bytes, char **ptr_p, size_t *size_p)
{
    if (bytes == 0 || bytes > SIZE_MAX - m->granule)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "vmm: cannot map %zu bytes", bytes);
    size_t n = (bytes + m->granule - 1) / m->granule;
    size_t size = n * m->granule;
    if (m->maximum < m->mapped || m->maximum - m->mapped < size)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                        "vmm: mapping %zu more bytes would pass the maximum: %zu of at most %zu "
                        "bytes mapped",
                        size, m->mapped, m->maximum);
    /* The lowest hole that fits keeps the mapped range dense; else the
     * frontier, taking in a last hole that reaches it. */
    size_t start = SIZE_MAX, hole = SIZE_MAX;
    for (size_t i = 0; i < m->nholes; i++)
        if (m->holes[i].count >= n) {
            start = m->holes[i].start;
            hole = i;
            break;
        }
    if (start == SIZE_MAX) {
        start = m->frontier;
        if (m->nholes) {
            hole_t *last = &m->holes[m->nholes - 1];
            if (last->start + last->count == m->frontier)
                start = last->start; /* never true: hole_add pulls the frontier back */
        }
        if (start + n > m->ngranules)
            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                            "vmm: %zu bytes do not fit in the reserved virtual range (%zu bytes, "
                            "%zu mapped); raise reserve=",
                            size, m->ngranules * m->granule, m->mapped);
    }
    size_t done = 0, hmax = m->hauto ? auto_ext(m) : m->hmax;
    rankmem_status_t st = RANKMEM_SUCCESS;
    while (done < n) {
        size_t k = n - done < hmax ? n - done : hmax;
        if ((st = map_ext(m, start + done, k)) != RANKMEM_SUCCESS)
            break;
        done += k;
    }
    if (st == RANKMEM_SUCCESS)
        st = set_access(m, m->base + start * m->granule, size);
    if (st != RANKMEM_SUCCESS) {
        for (size_t g = start; g < start + done;) {
            size_t k = ext_of(m, g);
            unmap_ext(m, g);
            g += k;
        }
        return st;
    }
    if (hole != SIZE_MAX) {
        m->holes[hole].start += n;
        m->holes[hole].count -= n;
        if (!m->holes[hole].count)
            hole_remove(m, hole);
    } else {
        m->frontier = start + n;
    }
    m->mapped += size;
    if (m->mapped > m->mapped_high)
        m->mapped_high = m->mapped;
    *ptr_p = m->base + start * m->granule;
    *size_p = size;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_vmm_map_shrink(rk_vmm_map_t *m, char *ptr, size_t bytes)
{
    size_t off = (size_t)(ptr - m->base);
    if (ptr < m->base || off % m->granule || bytes % m->granule || !bytes ||
        off / m->granule + bytes / m->granule > m->frontier)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "vmm: [%p, +%zu) is not a mapped granule range", (void *)ptr, bytes);
    /* Room for the hole first: after unmapping there is no way back. */
    if (m->nholes == m->cap_holes) {
        size_t cap = m->cap_holes ? m->cap_holes * 2 : 16;
        hole_t *h = realloc(m->holes, cap * sizeof *h);
        if (!h)
            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "vmm: no host memory for the hole list");
        m->holes = h;
        m->cap_holes = cap;
    }
    size_t g0 = off / m->granule, n = bytes / m->granule;
    /* Whole extents only (rk_vmm_map_fit says which). */
    for (size_t g = g0; m->ext_len && g < g0 + n; g += m->ext_len[g])
        if (!m->ext_len[g] || g + m->ext_len[g] > g0 + n)
            return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                            "vmm: [%p, +%zu) does not cover whole handles", (void *)ptr, bytes);
    for (size_t g = g0; g < g0 + n;) {
        size_t k = ext_of(m, g);
        unmap_ext(m, g);
        g += k;
    }
    (void)hole_add(m, g0, n); /* cannot fail: room was made above */
    m->mapped -= bytes;
    return RANKMEM_SUCCESS;
}

int rk_vmm_map_fit(const rk_vmm_map_t *m, char **ptr_p, size_t *bytes_p, size_t want)
{
    if (!m->ext_len) {
        size_t w = rk_align_up(want, m->granule);
        if (w && w < *bytes_p)
            *bytes_p = w;
        return *bytes_p > 0;
    }
    size_t g0 = (size_t)(*ptr_p - m->base) / m->granule, g1 = g0 + *bytes_p / m->granule;
    size_t g = g0;
    /* Skip to the first extent that starts inside (granules of an extent
     * that started before have ext_len 0: walk to the next start). */
    while (g < g1 && !m->ext_len[g])
        g++;
    size_t end = g;
    /* Only what is wanted: each handle given back may have to be made
     * again (~60 us on an H100), so none goes back beyond the need. */
    while (end < g1 && m->ext_len[end] && end + m->ext_len[end] <= g1 &&
           (end - g) * m->granule < want)
        end += m->ext_len[end];
    *ptr_p = m->base + g * m->granule;
    *bytes_p = (end - g) * m->granule;
    return end > g;
}

/* ---- export and import ---- */

/* Export ids: one counter for the process, so that an id never names two
 * handles, whichever map they belong to, and never comes back. */
static uint64_t next_export_id;

/* The first granule of the extent holding granule g, when g is mapped. */
static int extent_at(const rk_vmm_map_t *m, size_t g, size_t *start_p)
{
    if (g >= m->frontier)
        return 0;
    for (size_t i = 0; i < m->nholes; i++)
        if (g >= m->holes[i].start && g < m->holes[i].start + m->holes[i].count)
            return 0;
    size_t s = g;
    if (m->ext_len) {
        /* Granules after an extent's first have length 0: walk back. */
        while (s > 0 && !m->ext_len[s])
            s--;
        if (!m->ext_len[s] || s + m->ext_len[s] <= g)
            return 0;
    }
    *start_p = s;
    return 1;
}

rankmem_status_t rk_vmm_map_export(rk_vmm_map_t *m, char *ptr, size_t bytes, int want_fds,
                                   rankmem_vmm_handle_t **handles_p, size_t *count_p,
                                   size_t *offset_p)
{
    if (ptr < m->base || !bytes || (size_t)(ptr - m->base) >= m->ngranules * m->granule ||
        bytes > m->ngranules * m->granule - (size_t)(ptr - m->base))
        return rk_error(RANKMEM_ERR_INVALID_POINTER, "vmm: [%p, +%zu) is not in the reserved range",
                        (void *)ptr, bytes);
    if (want_fds && !m->exportable)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "vmm: the device cannot export memory as POSIX file descriptors");
    size_t g0 = (size_t)(ptr - m->base) / m->granule;
    size_t g1 = ((size_t)(ptr - m->base) + bytes - 1) / m->granule;
    /* First pass: every granule mapped, and how many handles. */
    size_t n = 0, s0 = 0;
    for (size_t g = g0; g <= g1;) {
        size_t s;
        if (!extent_at(m, g, &s))
            return rk_error(RANKMEM_ERR_INVALID_POINTER,
                            "vmm: [%p, +%zu) is not all mapped (granule %zu is not)", (void *)ptr,
                            bytes, g);
        if (!n)
            s0 = s;
        n++;
        g = s + ext_of(m, s);
    }
    if (!m->ids && !(m->ids = calloc(m->ngranules, sizeof *m->ids)))
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "vmm: no host memory for export ids");
    rankmem_vmm_handle_t *h = calloc(n, sizeof *h);
    if (!h)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "vmm: no host memory for %zu handles", n);
    rankmem_status_t st = RANKMEM_SUCCESS;
    size_t i = 0;
    for (size_t s = s0; i < n && st == RANKMEM_SUCCESS; i++) {
        size_t k = ext_of(m, s);
        if (!m->ids[s])
            m->ids[s] = __atomic_add_fetch(&next_export_id, 1, __ATOMIC_RELAXED);
        h[i].id = m->ids[s];
        h[i].address = (unsigned long long)(uintptr_t)(m->base + s * m->granule);
        h[i].bytes = k * m->granule;
        h[i].fd = -1;
        if (m->backend == RK_VMM_HOST)
            h[i].fd_offset = (unsigned long long)s * m->granule;
        if (want_fds) {
            if (m->backend == RK_VMM_HOST) {
                h[i].fd = fcntl(m->memfd, F_DUPFD_CLOEXEC, 0);
                if (h[i].fd < 0)
                    st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "vmm: dup of the memfd: %s",
                                  strerror(errno));
            }
#if HAVE_CUDA
            else {
                CUresult r = cu.export_h(&h[i].fd, (CUmemGenericAllocationHandle)m->handles[s],
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
                if (r != CUDA_SUCCESS) {
                    h[i].fd = -1;
                    st = cu_fail(r, "cuMemExportToShareableHandle", h[i].bytes);
                }
            }
#elif HAVE_HIP
            else {
                int fd = -1;
                hipError_t r = hipMemExportToShareableHandle(
                    &fd, (hipMemGenericAllocationHandle_t)(uintptr_t)m->handles[s],
                    hipMemHandleTypePosixFileDescriptor, 0);
                if (r != hipSuccess)
                    st = hip_fail(r, "hipMemExportToShareableHandle", h[i].bytes);
                h[i].fd = r == hipSuccess ? fd : -1;
            }
#endif
            if (st == RANKMEM_SUCCESS)
                m->n.exports++;
        }
        s += k;
    }
    if (st != RANKMEM_SUCCESS) {
        for (size_t j = 0; j < n; j++)
            if (h[j].fd >= 0)
                close(h[j].fd);
        free(h);
        return st;
    }
    *handles_p = h;
    *count_p = n;
    *offset_p = (size_t)(ptr - m->base) - s0 * m->granule;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_vmm_import(rk_vmm_backend_t backend, int device, size_t granule,
                               size_t count, const rankmem_vmm_handle_t *h, char **base_p)
{
    size_t bytes = 0;
    for (size_t i = 0; i < count; i++)
        bytes += h[i].bytes;
    if (backend == RK_VMM_HOST) {
        (void)granule;
        void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "vmm: import: reserving %zu bytes: %s",
                            bytes, strerror(errno));
        size_t at = 0;
        for (size_t i = 0; i < count; at += h[i++].bytes)
            if (mmap((char *)p + at, h[i].bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                     h[i].fd, (off_t)h[i].fd_offset) == MAP_FAILED) {
                int e = errno;
                munmap(p, bytes);
                return rk_error(e == EBADF ? RANKMEM_ERR_INVALID_ARGUMENT
                                           : RANKMEM_ERR_OUT_OF_MEMORY,
                                "vmm: import: mapping fd %d at offset %llu: %s", h[i].fd,
                                h[i].fd_offset, strerror(e));
            }
        *base_p = p;
        return RANKMEM_SUCCESS;
    }
    const char *why = "";
    if (!rk_vmm_backend_available(backend, device, &why))
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "vmm: import: %s", why);
#if HAVE_CUDA
    /* Each handle is mapped whole at offset 0 (cuMemMap takes no other
     * offset): the exporter's handle sizes tell the layout. */
    CUdeviceptr base = 0;
    CUresult r = cu.reserve(&base, bytes, granule, 0, 0);
    if (r != CUDA_SUCCESS)
        return cu_fail(r, "import: cuMemAddressReserve", bytes);
    size_t i = 0, at = 0;
    rankmem_status_t st = RANKMEM_SUCCESS;
    for (; i < count; at += h[i++].bytes) {
        CUmemGenericAllocationHandle g;
        r = cu.import_h(&g, (void *)(uintptr_t)h[i].fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r != CUDA_SUCCESS) {
            st = cu_fail(r, "import: cuMemImportFromShareableHandle", h[i].bytes);
            break;
        }
        r = cu.map(base + at, h[i].bytes, 0, g, 0);
        cu.release(g); /* the mapping keeps the memory */
        if (r != CUDA_SUCCESS) {
            st = cu_fail(r, "import: cuMemMap", h[i].bytes);
            break;
        }
    }
    if (st == RANKMEM_SUCCESS)
        st = cu_set_access(device, (char *)(uintptr_t)base, bytes);
    if (st != RANKMEM_SUCCESS) {
        while (i > 0) {
            i--;
            at -= h[i].bytes;
            cu.unmap(base + at, h[i].bytes);
        }
        cu.addr_free(base, bytes);
        return st;
    }
    *base_p = (char *)(uintptr_t)base;
    return RANKMEM_SUCCESS;
#elif HAVE_HIP
    void *base = NULL;
    hipError_t r = hipMemAddressReserve(&base, bytes, granule, NULL, 0);
    if (r != hipSuccess)
        return hip_fail(r, "import: hipMemAddressReserve", bytes);
    size_t i = 0, at = 0;
    rankmem_status_t st = RANKMEM_SUCCESS;
    for (; i < count; at += h[i++].bytes) {
        hipMemGenericAllocationHandle_t g;
        r = hipMemImportFromShareableHandle(&g, (void *)(intptr_t)h[i].fd,
                                            hipMemHandleTypePosixFileDescriptor);
        if (r != hipSuccess) {
            st = hip_fail(r, "import: hipMemImportFromShareableHandle", h[i].bytes);
            break;
        }
        r = hipMemMap((char *)base + at, h[i].bytes, 0, g, 0);
        (void)hipMemRelease(g);
        if (r != hipSuccess) {
            st = hip_fail(r, "import: hipMemMap", h[i].bytes);
            break;
        }
    }
    if (st == RANKMEM_SUCCESS)
        st = hip_set_access(device, base, bytes);
    if (st != RANKMEM_SUCCESS) {
        while (i > 0) {
            i--;
            at -= h[i].bytes;
            (void)hipMemUnmap((char *)base + at, h[i].bytes);
        }
        (void)hipMemAddressFree(base, bytes);
        return st;
    }
    *base_p = base;
    return RANKMEM_SUCCESS;
#else
    (void)granule;
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "vmm: import: no GPU runtime");
#endif
}

rankmem_status_t rk_vmm_unimport(rk_vmm_backend_t backend, char *base, const size_t *sizes,
                                 size_t count)
{
    size_t bytes = 0;
    for (size_t i = 0; i < count; i++)
        bytes += sizes[i];
    if (backend == RK_VMM_HOST) {
        munmap(base, bytes);
        return RANKMEM_SUCCESS;
    }
#if HAVE_CUDA
    for (size_t i = 0, at = 0; i < count; at += sizes[i++])
        cu.unmap((CUdeviceptr)(uintptr_t)(base + at), sizes[i]);
    CUresult r = cu.addr_free((CUdeviceptr)(uintptr_t)base, bytes);
    return r == CUDA_SUCCESS ? RANKMEM_SUCCESS : cu_fail(r, "cuMemAddressFree", bytes);
#elif HAVE_HIP
    for (size_t i = 0, at = 0; i < count; at += sizes[i++])
        (void)hipMemUnmap(base + at, sizes[i]);
    hipError_t r = hipMemAddressFree(base, bytes);
    return r == hipSuccess ? RANKMEM_SUCCESS : hip_fail(r, "hipMemAddressFree", bytes);
#else
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "vmm: no GPU runtime");
#endif
}
