/* The few CUDA runtime calls the plugin makes itself: select the rank's
 * device, name it, read its memory, and find which CPUs are near it. The
 * rest goes through librankmem. Plain C against cuda_runtime_api.h (no
 * nvcc); every function means "no GPU" in a build without CUDA or HIP. */
#define _GNU_SOURCE
#include "plugin.h"

#include <ctype.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if HAVE_GPU
#include "../src/gpu_api.h" /* CUDA, or HIP through the same names */
#endif
#if HAVE_HWLOC
#include <hwloc.h>
#endif

int rk_mpi_gpu_count(void)
{
    int n = 0;
    if (rankmem_device_count(&n) != RANKMEM_SUCCESS)
        return 0;
    return n;
}

#if HAVE_GPU

int rk_mpi_gpu_set(int device)
{
    cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) {
        rk_mpi_warn("cudaSetDevice(%d): %s", device, cudaGetErrorString(err));
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
}

int rk_mpi_gpu_current(void)
{
    int d;
    if (rk_mpi_gpu_count() == 0)
        return -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return d;
}

void rk_mpi_gpu_describe(int device, char *name, size_t name_len, char *busid, size_t busid_len)
{
    name[0] = busid[0] = '\0';
    if (device < 0 || rk_mpi_gpu_count() == 0)
        return;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
        snprintf(name, name_len, "%s", prop.name);
    else
        (void)cudaGetLastError();
    char id[32];
    if (cudaDeviceGetPCIBusId(id, (int)sizeof id, device) == cudaSuccess) {
        /* The runtime says "0000:3B:00.0"; sysfs and hwloc spell it in lower case. */
        for (char *p = id; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        snprintf(busid, busid_len, "%s", id);
    } else {
        (void)cudaGetLastError();
    }
}

void rk_mpi_gpu_meminfo(int device, uint64_t *total_p, uint64_t *free_p)
{
    size_t fr = 0, tot = 0;
    *total_p = *free_p = 0;
    if (device < 0 || rk_mpi_gpu_count() == 0)
        return;
    /* The current device is per thread: the caller's may be another one. */
    int old = rk_mpi_gpu_current();
    if (old != device && cudaSetDevice(device) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        *total_p = tot;
        *free_p = fr;
    } else {
        (void)cudaGetLastError();
    }
    if (old != device && old >= 0 && cudaSetDevice(old) != cudaSuccess)
        (void)cudaGetLastError();
}

#else /* !HAVE_GPU */

int rk_mpi_gpu_set(int device)
{
    rk_mpi_warn("cannot select device %d: built without CUDA", device);
    return -1;
}

int rk_mpi_gpu_current(void) { return -1; }

void rk_mpi_gpu_describe(int device, char *name, size_t name_len, char *busid, size_t busid_len)
{
    (void)device;
    (void)name_len;
    (void)busid_len;
    name[0] = busid[0] = '\0';
}

void rk_mpi_gpu_meminfo(int device, uint64_t *total_p, uint64_t *free_p)
{
    (void)device;
    *total_p = *free_p = 0;
}

#endif

/* ---- locality for RANKMEM_BIND=nearest ---- */

#define MAX_CPUS 8192

/* How many CPUs of this process's affinity mask are set in local[]. */
static int count_common(const cpu_set_t *mine, size_t setsize, const unsigned char *local)
{
    int n = 0;
    for (int c = 0; c < MAX_CPUS; c++)
        if (CPU_ISSET_S(c, setsize, mine) && (local[c / 8] >> (c % 8)) & 1)
            n++;
    return n;
}

#if HAVE_HWLOC
/* hwloc: the PCI device's nearest non-I/O ancestor's cpuset. */
static int hwloc_local(hwloc_topology_t topo, const char *busid, unsigned char *local)
{
    unsigned dom, bus, dev, fn;
    if (sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4)
        return -1;
    hwloc_obj_t pci = hwloc_get_pcidev_by_busid(topo, dom, bus, dev, fn);
    if (!pci)
        return -1;
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, pci);
    if (!anc || !anc->cpuset)
        return -1;
    memset(local, 0, MAX_CPUS / 8);
    int c;
    hwloc_bitmap_foreach_begin(c, anc->cpuset)
    {
        if (c < MAX_CPUS)
            local[c / 8] |= (unsigned char)(1u << (c % 8));
    }
    hwloc_bitmap_foreach_end();
    return 0;
}
#endif

/* sysfs: /sys/bus/pci/devices/<busid>/local_cpus. */
static int sysfs_local(const char *busid, unsigned char *local)
{
    char path[128], buf[4096];
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/local_cpus", busid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return rk_bind_parse_cpumask(buf, local, MAX_CPUS);
}

void rk_mpi_gpu_overlap(int ndev, int *overlap)
{
    for (int d = 0; d < ndev; d++)
        overlap[d] = -1;
    size_t setsize = CPU_ALLOC_SIZE(MAX_CPUS);
    cpu_set_t *mine = CPU_ALLOC(MAX_CPUS);
    unsigned char *local = malloc(MAX_CPUS / 8);
    if (!mine || !local) {
        CPU_FREE(mine);
        free(local);
        return;
    }
    if (sched_getaffinity(0, setsize, mine) != 0) {
        rk_mpi_warn("RANKMEM_BIND=nearest: sched_getaffinity failed; binding round-robin");
        CPU_FREE(mine);
        free(local);
        return;
    }
#if HAVE_HWLOC
    hwloc_topology_t topo = NULL;
    if (hwloc_topology_init(&topo) == 0) {
        /* PCI devices are filtered out by default; keep the ones that matter. */
        hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
        if (hwloc_topology_load(topo) != 0) {
            hwloc_topology_destroy(topo);
            topo = NULL;
        }
    } else {
        topo = NULL;
    }
#endif
    for (int d = 0; d < ndev; d++) {
        char name[8], busid[32];
        rk_mpi_gpu_describe(d, name, sizeof name, busid, sizeof busid);
        if (!busid[0])
            continue;
        int got = -1;
#if HAVE_HWLOC
        if (topo)
            got = hwloc_local(topo, busid, local);
#endif
        if (got != 0)
            got = sysfs_local(busid, local);
        if (got == 0)
            overlap[d] = count_common(mine, setsize, local);
        rk_mpi_verbose("nearest: device %d (%s): %d of this rank's CPUs are local to it", d,
                       busid, overlap[d]);
    }
#if HAVE_HWLOC
    if (topo)
        hwloc_topology_destroy(topo);
#endif
    CPU_FREE(mine);
    free(local);
}
