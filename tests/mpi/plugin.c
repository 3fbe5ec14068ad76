/* The plugin as an application sees it (linked with -lrankmem_mpi): the
 * public getters, the rank's resource installed and counting, and
 * MPI_Alloc_mem with each rankmem_kind, a missing one and a bad one.
 * Run by tests/mpi/plugin.mpish under mpirun with 4 ranks.
 *   plugin [thread]   thread: start with MPI_Init_thread */
#include <rankmem.h>
#include <rankmem_mpi.h>

#include <mpi.h>
#include <stdint.h>
#include <string.h>

#include "mtap.h"

static int stats_now(rankmem_resource_t *mr, rankmem_stats_t *s)
{
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
    return mr ? (int)rankmem_stats_get(mr, s) : -1;
}

int main(int argc, char **argv)
{
    int before_local = rankmem_mpi_local_rank(), before_dev = rankmem_mpi_device();
    rankmem_resource_t *before_mr = rankmem_mpi_resource();
    int provided = 0;
    int thread = argc > 1 && strcmp(argv[1], "thread") == 0;
    if (thread)
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    else
        MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mdiag("%s, %d ranks", thread ? "MPI_Init_thread" : "MPI_Init", size);

    mok(before_local == -1 && before_dev == -1 && before_mr == NULL,
        "before MPI_Init: local rank -1, device -1, no resource");

    MPI_Comm node;
    int lrank = -2, lsize = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &lrank);
    MPI_Comm_size(node, &lsize);
    MPI_Comm_free(&node);
    mok(rankmem_mpi_local_rank() == lrank, "rankmem_mpi_local_rank() is the node-local rank (%d)",
        rankmem_mpi_local_rank());

    int ndev = -1;
    rankmem_device_count(&ndev);
    int dev = rankmem_mpi_device();
    if (ndev == 0)
        mok(dev == -1, "no GPU: rankmem_mpi_device() is -1 (host fallback)");
    else
        mok(dev >= 0 && dev < ndev, "rankmem_mpi_device() %d is one of the %d devices", dev, ndev);

    rankmem_resource_t *mr = rankmem_mpi_resource(), *cur = NULL;
    const char *name = "";
    if (mr)
        rankmem_resource_name(mr, &name);
    mok(mr && strcmp(name, "stats") == 0, "rankmem_mpi_resource() is a stats adaptor ('%s')",
        name);
    mok(rankmem_get_current_resource(&cur) == RANKMEM_SUCCESS && cur == mr,
        "the rank's resource is the current resource");

    /* Allocate through the current resource, as an application would: the
     * rank's stats see it. Sizes differ per rank. */
    size_t bytes = (size_t)(rank + 1) * 4096 + (size_t)rank * 8;
    rankmem_stats_t s0, s1, s2;
    stats_now(mr, &s0);
    void *p = NULL;
    int st = cur ? (int)rankmem_allocate(cur, bytes, 0, &p) : -1;
    stats_now(mr, &s1);
    mok(st == RANKMEM_SUCCESS && p, "allocate %zu bytes from the current resource", bytes);
    mok(s1.bytes_current == s0.bytes_current + bytes && s1.count_current == s0.count_current + 1 &&
            s1.bytes_total == s0.bytes_total + bytes && s1.bytes_peak >= s1.bytes_current,
        "stats count it (current %zu, total %zu, peak %zu)", s1.bytes_current, s1.bytes_total,
        s1.bytes_peak);
    if (p)
        rankmem_deallocate(cur, p, bytes, 0);
    stats_now(mr, &s2);
    mok(s2.bytes_current == s0.bytes_current && s2.count_current == s0.count_current,
        "and see it freed");

    /* MPI_Alloc_mem with rankmem_kind. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    static const char *const kinds[] = {"device", "managed", "pinned", "host"};
    for (int k = 0; k < 4; k++) {
        MPI_Info info;
        MPI_Info_create(&info);
        MPI_Info_set(info, "rankmem_kind", kinds[k]);
        void *q = NULL;
        stats_now(mr, &s0);
        int rc = MPI_Alloc_mem((MPI_Aint)bytes, info, &q);
        stats_now(mr, &s1);
        MPI_Info_free(&info);
        int counted = s1.bytes_current == s0.bytes_current + bytes;
        /* Host-accessible unless it is device memory on a real GPU. */
        if (q && (k > 0 || ndev == 0))
            memset(q, 0xab, bytes);
        int rc2 = q ? MPI_Free_mem(q) : -1;
        stats_now(mr, &s2);
        mok(rc == MPI_SUCCESS && q && rc2 == MPI_SUCCESS &&
                counted == (k == 0) && s2.bytes_current == s0.bytes_current,
            "MPI_Alloc_mem rankmem_kind=%s: served, %s the rank's stats, freed by MPI_Free_mem",
            kinds[k], k == 0 ? "counted in" : "not in");
    }
    {
        void *q = NULL;
        stats_now(mr, &s0);
        int rc = MPI_Alloc_mem((MPI_Aint)bytes, MPI_INFO_NULL, &q);
        stats_now(mr, &s1);
        if (q)
            memset(q, 1, bytes);
        int rc2 = q ? MPI_Free_mem(q) : -1;
        mok(rc == MPI_SUCCESS && q && rc2 == MPI_SUCCESS && s1.count_total == s0.count_total,
            "MPI_Alloc_mem without info goes to MPI (not counted)");
    }
    {
        MPI_Info info;
        MPI_Info_create(&info);
        MPI_Info_set(info, "some_other_key", "device");
        void *q = NULL;
        stats_now(mr, &s0);
        int rc = MPI_Alloc_mem((MPI_Aint)bytes, info, &q);
        stats_now(mr, &s1);
        int rc2 = q ? MPI_Free_mem(q) : -1;
        MPI_Info_free(&info);
        mok(rc == MPI_SUCCESS && q && rc2 == MPI_SUCCESS && s1.count_total == s0.count_total,
            "MPI_Alloc_mem with other info keys only goes to MPI");
    }
    {
        MPI_Info info;
        MPI_Info_create(&info);
        MPI_Info_set(info, "rankmem_kind", "gpu");
        void *q = (void *)&info; /* must be left alone */
        stats_now(mr, &s0);
        int rc = MPI_Alloc_mem((MPI_Aint)bytes, info, &q);
        stats_now(mr, &s1);
        MPI_Info_free(&info);
        int cls = -1;
        if (rc != MPI_SUCCESS)
            MPI_Error_class(rc, &cls);
        mok(rc != MPI_SUCCESS && cls == MPI_ERR_INFO_VALUE && q == (void *)&info &&
                s1.count_total == s0.count_total,
            "MPI_Alloc_mem rankmem_kind=gpu: MPI_ERR_INFO_VALUE, nothing allocated");
    }
    {
        /* Many blocks at once: the pointer table keeps them apart. */
        enum { N = 64 };
        void *q[N];
        MPI_Info info;
        MPI_Info_create(&info);
        MPI_Info_set(info, "rankmem_kind", "host");
        int good = 1;
        for (int i = 0; i < N; i++) {
            q[i] = NULL;
            good &= MPI_Alloc_mem((MPI_Aint)(64 + i), info, &q[i]) == MPI_SUCCESS && q[i];
            if (q[i])
                memset(q[i], i, (size_t)(64 + i));
        }
        for (int i = N - 1; i >= 0; i -= 2)
            good &= q[i] && MPI_Free_mem(q[i]) == MPI_SUCCESS;
        for (int i = 0; i < N; i += 2)
            good &= q[i] && ((unsigned char *)q[i])[63 + i] == (unsigned char)i &&
                    MPI_Free_mem(q[i]) == MPI_SUCCESS;
        MPI_Info_free(&info);
        mok(good, "64 MPI_Alloc_mem blocks freed out of order");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Finalize();
    return 0;
}
