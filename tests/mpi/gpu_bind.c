/* On a GPU machine: each rank's binding, checked from inside the rank
 * against the CUDA runtime. Built with the plugin's sources (like
 * tests/mpi/record.c) so that it reads the record's device fields.
 * Run by tests/mpi/gpu.mpish.
 *   gpu_bind --count   print the number of visible devices (no MPI)
 *   gpu_bind           the checks (RANKMEM_BIND auto, the default) */
#define _GNU_SOURCE
#include "plugin.h"

#include <ctype.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "mtap.h"

int main(int argc, char **argv)
{
    int ndev = 0;
    if (argc > 1 && strcmp(argv[1], "--count") == 0) {
        rankmem_device_count(&ndev);
        printf("%d\n", ndev);
        return 0;
    }
    MPI_Init(&argc, &argv);
    rankmem_device_count(&ndev);
#if !HAVE_CUDA
    mskip("built without CUDA");
    MPI_Finalize();
    return 0;
#else
    if (ndev == 0) {
        mskip("no GPU");
        MPI_Finalize();
        return 0;
    }
    int rank, lrank, lsize;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &lrank);
    MPI_Comm_size(node, &lsize);
    mdiag("%d ranks on this node, %d visible device(s)", lsize, ndev);

    int dev = rankmem_mpi_device(), cur = -1;
    cudaGetDevice(&cur);
    /* What RANKMEM_BIND should give (nearest: any device). */
    const char *bind_text = getenv("RANKMEM_BIND");
    rk_bind_spec_t spec;
    char why[160];
    int want = -1;
    if (rk_bind_parse(bind_text ? bind_text : "auto", &spec, why, sizeof why) == 0 &&
        spec.mode != RK_BIND_NEAREST && spec.mode != RK_BIND_NONE)
        want = rk_bind_choose(&spec, lrank, ndev, NULL, why, sizeof why);
    if (want >= 0)
        mok(dev == want, "RANKMEM_BIND=%s: local rank %d -> device %d (got %d)",
            bind_text ? bind_text : "auto", lrank, want, dev);
    else
        mok(dev >= 0 && dev < ndev, "RANKMEM_BIND=%s: device %d", bind_text, dev);
    mok(cur == dev, "cudaGetDevice() %d is rankmem_mpi_device() %d", cur, dev);
    int rdev = -2;
    rankmem_resource_device(rankmem_mpi_resource(), &rdev);
    mok(rdev == dev, "the rank's resource belongs to device %d (%d)", dev, rdev);

    /* Memory from the current resource lives on the rank's device. */
    rankmem_resource_t *mr = NULL;
    void *p = NULL;
    rankmem_get_current_resource(&mr);
    int st = rankmem_allocate(mr, ((size_t)rank + 1) << 20, 0, &p);
    struct cudaPointerAttributes attr;
    memset(&attr, 0, sizeof attr);
    int aok = st == 0 && cudaPointerGetAttributes(&attr, p) == cudaSuccess;
    mok(aok && attr.type == cudaMemoryTypeDevice && attr.device == dev,
        "an allocation from the current resource is device memory on device %d (%d)", dev,
        attr.device);

    /* Devices of all local ranks: distinct while there are enough GPUs. */
    int *all = malloc((size_t)lsize * sizeof *all);
    MPI_Allgather(&dev, 1, MPI_INT, all, 1, MPI_INT, node);
    int shared = 0;
    for (int r = 0; r < lsize; r++)
        shared |= r != lrank && all[r] == dev;
    free(all);
    if (want >= 0 && spec.mode == RK_BIND_AUTO)
        mok(shared == (lsize > ndev), "%s",
            lsize > ndev ? "more ranks than GPUs: device shared"
                         : "every local rank has its own device");

    rk_mpi_record_t rec;
    rk_mpi_fill_record(&rec);
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, dev);
    char bus[32] = "";
    cudaDeviceGetPCIBusId(bus, (int)sizeof bus, dev);
    for (char *c = bus; *c; c++)
        *c = (char)tolower((unsigned char)*c);
    mok(rec.device == dev && rec.node_devices == ndev, "record: device %d of %d", rec.device,
        rec.node_devices);
    mok(strcmp(rec.device_name, prop.name) == 0, "record: device name '%s'", rec.device_name);
    mok(strcmp(rec.pci_bus_id, bus) == 0, "record: PCI bus id '%s' (runtime: '%s')",
        rec.pci_bus_id, bus);
    mok(!!(rec.flags & RK_MPI_SHARED_GPU) == shared && !(rec.flags & RK_MPI_HOST_FALLBACK),
        "record: shared flag %s, no host fallback", shared ? "set" : "clear");
    mok(rec.dev_total_init <= (uint64_t)prop.totalGlobalMem &&
            rec.dev_total_init >= (uint64_t)prop.totalGlobalMem / 2 &&
            rec.dev_total_final == rec.dev_total_init && rec.dev_free_init > 0 &&
            rec.dev_free_final > 0 && rec.dev_free_init <= rec.dev_total_init,
        "record: device memory %llu total, %llu free at init, %llu now",
        (unsigned long long)rec.dev_total_init, (unsigned long long)rec.dev_free_init,
        (unsigned long long)rec.dev_free_final);
    mok(rec.bytes_current == ((uint64_t)rank + 1) << 20 && rec.reserved_peak >= rec.bytes_peak,
        "record: %llu bytes live, %llu reserved at peak", (unsigned long long)rec.bytes_current,
        (unsigned long long)rec.reserved_peak);
    fprintf(stderr, "gpu_bind: rank %d local %d device %d bus %s\n", rank, lrank, dev, bus);
    if (p)
        rankmem_deallocate(mr, p, ((size_t)rank + 1) << 20, 0);
    MPI_Comm_free(&node);
    MPI_Finalize();
    return 0;
#endif
}
