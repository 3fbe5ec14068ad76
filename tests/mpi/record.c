/* This rank's record (rk_mpi_fill_record), field by field: the plugin's
 * sources are built into this program, hooks included, so that it can call
 * the hidden function. Run by the tests/mpi .mpish scripts under mpirun with 4 ranks.
 *
 * What the settings should have produced comes from the environment:
 *   RKT_EXPECT_SPEC       the record's spec (default stats>pool>system with
 *                         no GPU; not checked with a GPU)
 *   RKT_EXPECT_MISMATCH   1: the launcher's local rank was overridden
 *   RKT_EXPECT_ENV_LOCAL  the launcher's local rank the plugin should have
 *                         read (default: the communicator's) */
#define _GNU_SOURCE
#include "plugin.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mtap.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, lrank, lsize, ndev = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &lrank);
    MPI_Comm_size(node, &lsize);
    MPI_Comm_free(&node);
    rankmem_device_count(&ndev);

    const char *e;
    const char *want_spec = getenv("RKT_EXPECT_SPEC");
    if (!want_spec && ndev == 0)
        want_spec = "stats>pool>system";
    int want_mismatch = (e = getenv("RKT_EXPECT_MISMATCH")) ? atoi(e) : 0;
    int want_env_local = (e = getenv("RKT_EXPECT_ENV_LOCAL")) ? atoi(e) : lrank;
    const char *want_bind = (e = getenv("RANKMEM_BIND")) ? e : "auto";

    mok(rk_mpi_active(), "the plugin is active after MPI_Init");

    /* Distinct sizes per rank: rank r holds (r + 1) MiB + r bytes at the end. */
    rankmem_resource_t *mr = NULL;
    rankmem_get_current_resource(&mr);
    size_t keep = ((size_t)rank + 1) * 1048576 + (size_t)rank, tmp = 4096;
    void *a = NULL, *b = NULL;
    int st1 = rankmem_allocate(mr, keep, 0, &a);
    int st2 = rankmem_allocate(mr, tmp, 0, &b);
    if (b)
        rankmem_deallocate(mr, b, tmp, 0);
    mok(st1 == 0 && st2 == 0, "two allocations through the current resource");

    rk_mpi_record_t r;
    memset(&r, 0x5a, sizeof r);
    rk_mpi_fill_record(&r);
    char host[64] = "";
    gethostname(host, sizeof host - 1);

    mok(r.version == RK_MPI_RECORD_VERSION, "version %u", r.version);
    mok(r.rank == rank && r.size == size, "rank %d of %d", r.rank, r.size);
    mok(r.local_rank == lrank && r.local_size == lsize, "local rank %d of %d (communicator)",
        r.local_rank, r.local_size);
    mok(r.env_local_rank == want_env_local, "launcher's local rank %d (want %d)",
        r.env_local_rank, want_env_local);
    mok(!!(r.flags & RK_MPI_BIND_MISMATCH) == !!want_mismatch, "mismatch flag %s",
        want_mismatch ? "set" : "clear");
    mok(strcmp(r.host, host) == 0, "host '%s'", r.host);
    mok(r.node_devices == ndev, "node devices %d", r.node_devices);
    if (ndev == 0) {
        mok(r.device == -1 && (r.flags & RK_MPI_HOST_FALLBACK) && !(r.flags & RK_MPI_SHARED_GPU) &&
                r.device_name[0] == 0 && r.pci_bus_id[0] == 0 && r.dev_total_init == 0 &&
                r.dev_total_final == 0,
            "no GPU: device -1, host fallback flagged, no device fields");
    } else {
        mok(r.device >= 0 && r.device < ndev && !(r.flags & RK_MPI_HOST_FALLBACK) &&
                r.device_name[0] && r.pci_bus_id[0] && r.dev_total_init > 0,
            "device %d (%s, %s)", r.device, r.device_name, r.pci_bus_id);
    }
    mok(strncmp(r.bind_mode, want_bind, sizeof r.bind_mode - 1) == 0, "bind mode '%s'",
        r.bind_mode);
    if (want_spec)
        mok(strcmp(r.spec, want_spec) == 0, "spec '%s' (want '%s')", r.spec, want_spec);
    else
        mok(strncmp(r.spec, "stats>", 6) == 0, "spec '%s'", r.spec);
    mok(r.bytes_current == keep && r.count_current == 1, "still allocated: %llu bytes in %llu",
        (unsigned long long)r.bytes_current, (unsigned long long)r.count_current);
    mok(r.bytes_peak == keep + tmp && r.count_peak == 2, "peak %llu bytes, %llu allocations",
        (unsigned long long)r.bytes_peak, (unsigned long long)r.count_peak);
    mok(r.bytes_total == keep + tmp && r.count_total == 2, "total %llu bytes, %llu allocations",
        (unsigned long long)r.bytes_total, (unsigned long long)r.count_total);
    mok(r.alloc_ns > 0, "time in the allocator %llu ns", (unsigned long long)r.alloc_ns);
    mok(r.reserved_peak == 0 || r.reserved_peak >= r.bytes_peak,
        "reserved peak %llu (0: the chain does not say)", (unsigned long long)r.reserved_peak);
    mok(r.staged_bytes == 0 && r.staged_messages == 0, "nothing staged");
    mok(r.wall_s > 0 && r.wall_s < 3600, "%.6f s since MPI_Init", r.wall_s);
    mok(r.host[sizeof r.host - 1] == 0 && r.spec[sizeof r.spec - 1] == 0 &&
            r.device_name[sizeof r.device_name - 1] == 0 && r.bind_mode[sizeof r.bind_mode - 1] == 0,
        "strings are terminated and padded");

    /* Leave `keep` allocated: the report at MPI_Finalize shows it as a leak. */
    (void)a;
    MPI_Finalize();
    return 0;
}
