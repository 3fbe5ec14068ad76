/* MPI bandwidth and latency of device buffers staged by rankmem, against
 * naive staging, host-to-host MPI and the pinned copy bandwidth, in one run
 * between 2 ranks (osu_bw / osu_latency style). Prints markdown tables.
 * bench/mpi-bw.sh runs it; docs/staging.md says how to read it.
 *
 *   mpirun -np 2 bench/mpi-bw [--min BYTES] [--max BYTES] [--quick]
 *
 * Bandwidth: rank 0 sends a window of messages (MPI_Isend), rank 1
 * receives them (MPI_Irecv, MPI_Waitall) and answers with 4 bytes; the
 * window is 64 messages, fewer above 1 MiB so that a window stays within
 * 64 MiB. Latency: ping-pong with MPI_Send/MPI_Recv, half the round trip.
 * Halo: 26 faces each way per exchange (Irecv, Isend, Waitall), device
 * faces against host faces.
 *
 *   D-D rankmem  device buffers (cudaMalloc) handed to MPI: the plugin
 *                copies them through CUDA IPC between ranks of a node when
 *                it can (RANKMEM_STAGING_IPC), else stages them
 *   D-D staged   the same from cudaMallocAsync memory, which CUDA IPC cannot
 *                export: the plugin stages it through pinned memory
 *   D-D naive    cudaMemcpy to pageable host memory, MPI, cudaMemcpy back
 *   D2D copy     cudaMemcpyAsync from rank 0's buffer to another on rank 1's
 *                device (cudaMemcpyPeerAsync with peer access when that is
 *                another device), by one process: what one copy through IPC
 *                can reach
 *   H-H          pageable host buffers, plain MPI
 *   pinned copy  cudaMemcpyAsync between the device and pinned memory */
#define _GNU_SOURCE
#include "config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

static int me;
static size_t max_window_bytes = (size_t)64 << 20;

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "mpi-bw: %s: %s\n", #call, cudaGetErrorString(e_));                  \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                         \
        }                                                                                         \
    } while (0)

enum { M_RANKMEM, M_NAIVE, M_HOST, M_STAGED };
static char *sdev; /* cudaMallocAsync memory: never exported, always staged */

static int window_for(size_t n)
{
    size_t w = max_window_bytes / n;
    return w > 64 ? 64 : w < 1 ? 1 : (int)w;
}

static int iters_for(size_t n, int w)
{
    /* About 512 MiB per measurement, 5 to 200 windows. */
    size_t it = ((size_t)512 << 20) / (n * (size_t)w);
    return it < 5 ? 5 : it > 200 ? 200 : (int)it;
}

/* One window of mode m; rank 0 sends, rank 1 receives. */
static void window(int m, size_t n, int w, char *dev, char *host)
{
    MPI_Request req[64];
    int ack = 0;
    if (me == 0) {
        for (int i = 0; i < w; i++) {
            if (m == M_NAIVE) {
                CK(cudaMemcpy(host + (size_t)i * n, dev, n, cudaMemcpyDeviceToHost));
                MPI_Isend(host + (size_t)i * n, (int)n, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &req[i]);
            } else {
                MPI_Isend(m == M_HOST ? host : m == M_STAGED ? sdev : dev, (int)n, MPI_BYTE, 1, 1,
                          MPI_COMM_WORLD, &req[i]);
            }
        }
        MPI_Waitall(w, req, MPI_STATUSES_IGNORE);
        MPI_Recv(&ack, 1, MPI_INT, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        for (int i = 0; i < w; i++) {
            char *dst = m == M_RANKMEM ? dev
                        : m == M_STAGED ? sdev
                                        : host + (m == M_NAIVE ? (size_t)i * n : 0);
            MPI_Irecv(dst, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &req[i]);
        }
        MPI_Waitall(w, req, MPI_STATUSES_IGNORE);
        if (m == M_NAIVE)
            for (int i = 0; i < w; i++)
                CK(cudaMemcpy(dev, host + (size_t)i * n, n, cudaMemcpyHostToDevice));
        MPI_Send(&ack, 1, MPI_INT, 0, 2, MPI_COMM_WORLD);
    }
}

static double bandwidth(int m, size_t n, char *dev, char *host)
{
    int w = window_for(n), it = iters_for(n, w);
    window(m, n, w, dev, host); /* warm-up: pools, connections */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < it; i++)
        window(m, n, w, dev, host);
    double t = MPI_Wtime() - t0;
    double gbs = (double)n * w * it / t * 1e-9;
    MPI_Bcast(&gbs, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return gbs;
}

/* Half a round trip, in microseconds. */
static double latency(int m, size_t n, char *dev, char *host)
{
    int it = n <= 4096 ? 2000 : 500;
    double t0 = 0;
    for (int i = -50; i < it; i++) {
        if (i == 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        char *buf = m == M_HOST ? host : m == M_STAGED ? sdev : dev;
        int peer = 1 - me;
        for (int leg = 0; leg < 2; leg++) {
            if ((leg == 0) == (me == 0)) {
                if (m == M_NAIVE) {
                    CK(cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost));
                    buf = host;
                }
                MPI_Send(buf, (int)n, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
            } else {
                MPI_Recv(m == M_NAIVE ? host : buf, (int)n, MPI_BYTE, peer, 3, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
                if (m == M_NAIVE)
                    CK(cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice));
            }
        }
    }
    double us = (MPI_Wtime() - t0) * 1e6 / it / 2;
    MPI_Bcast(&us, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return us;
}

/* A halo exchange: 26 faces of n bytes each way between the two ranks (as a
 * 3D stencil's rank exchanges with its 26 neighbours; here all are the
 * other rank, one tag per face): 26 MPI_Irecv, 26 MPI_Isend, one
 * MPI_Waitall. Faces in separate buffers, device (m == M_RANKMEM) or host.
 * Microseconds per exchange. */
#define FACES 26
static double halo(int m, size_t n, char *dev, char *host)
{
    int it = n <= 65536 ? 500 : 100;
    MPI_Request req[2 * FACES];
    char *base = m == M_HOST ? host : dev;
    double t0 = 0;
    for (int i = -20; i < it; i++) {
        if (i == 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        for (int f = 0; f < FACES; f++)
            MPI_Irecv(base + (size_t)f * n, (int)n, MPI_BYTE, 1 - me, f, MPI_COMM_WORLD, &req[f]);
        for (int f = 0; f < FACES; f++)
            MPI_Isend(base + (size_t)(FACES + f) * n, (int)n, MPI_BYTE, 1 - me, f, MPI_COMM_WORLD,
                      &req[FACES + f]);
        MPI_Waitall(2 * FACES, req, MPI_STATUSES_IGNORE);
    }
    double us = (MPI_Wtime() - t0) * 1e6 / it;
    MPI_Bcast(&us, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return us;
}

/* Pinned copy of n bytes, rank 0 alone: GB/s (bw) or microseconds (one copy). */
static void pinned_copy(size_t n, char *dev, char *pinned, cudaStream_t s, double *d2h,
                        double *h2d, double *one_us)
{
    double v[3] = {0, 0, 0};
    if (me == 0) {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        int reps = n >= ((size_t)64 << 20) ? 5 : n >= ((size_t)1 << 20) ? 20 : 200;
        for (int dir = 0; dir < 2; dir++) {
            CK(cudaMemcpyAsync(dir ? dev : pinned, dir ? pinned : dev, n, cudaMemcpyDefault, s));
            CK(cudaEventRecord(a, s));
            for (int i = 0; i < reps; i++)
                CK(cudaMemcpyAsync(dir ? dev : pinned, dir ? pinned : dev, n, cudaMemcpyDefault,
                                   s));
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, a, b));
            v[dir] = (double)n * reps / (ms * 1e-3) * 1e-9;
        }
        /* One synchronous copy as a small message sees it (launch and wait). */
        double t0 = MPI_Wtime();
        for (int i = 0; i < 200; i++) {
            CK(cudaMemcpyAsync(pinned, dev, n, cudaMemcpyDefault, s));
            CK(cudaStreamSynchronize(s));
        }
        v[2] = (MPI_Wtime() - t0) * 1e6 / 200;
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    MPI_Bcast(v, 3, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    *d2h = v[0];
    *h2d = v[1];
    if (one_us)
        *one_us = v[2];
}

/* Rank 0's device-to-device copy bandwidth to a buffer on rank 1's device
 * (GB/s; 0 when peer access is refused). */
static double dcopy_bw(size_t n, char *dev, int mydev, int peerdev, char *other, cudaStream_t s)
{
    double v = 0;
    if (me == 0) {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        int reps = n >= ((size_t)64 << 20) ? 5 : n >= ((size_t)1 << 20) ? 20 : 200;
        cudaError_t e = cudaSuccess;
        CK(cudaEventRecord(a, s));
        for (int i = 0; i < reps + 1 && e == cudaSuccess; i++) {
            if (i == 1)
                CK(cudaEventRecord(a, s));
            e = mydev == peerdev ? cudaMemcpyAsync(other, dev, n, cudaMemcpyDeviceToDevice, s)
                                 : cudaMemcpyPeerAsync(other, peerdev, dev, mydev, n, s);
        }
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (e == cudaSuccess && ms > 0)
            v = (double)n * reps / (ms * 1e-3) * 1e-9;
        (void)cudaGetLastError();
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    MPI_Bcast(&v, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return v;
}

static void human(size_t n, char *buf, size_t len)
{
    if (n >= ((size_t)1 << 20))
        snprintf(buf, len, "%zu MiB", n >> 20);
    else if (n >= 1024)
        snprintf(buf, len, "%zu KiB", n >> 10);
    else
        snprintf(buf, len, "%zu B", n);
}

int main(int argc, char **argv)
{
    size_t lo = 4096, hi = (size_t)256 << 20;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--min") && i + 1 < argc)
            lo = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--max") && i + 1 < argc)
            hi = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
    }
    MPI_Init(&argc, &argv);
    int np;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        if (me == 0)
            printf("mpi-bw: no GPU, nothing to measure\n");
        MPI_Finalize();
        return 0;
    }
    if (np != 2) {
        if (me == 0)
            fprintf(stderr, "mpi-bw: run with exactly 2 ranks\n");
        MPI_Finalize();
        return 1;
    }
    int devnum = 0;
    cudaGetDevice(&devnum);
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, devnum));
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int liblen = 0;
    MPI_Get_library_version(lib, &liblen);
    char *nl = strchr(lib, '\n');
    if (nl)
        *nl = '\0';
    int devs[2];
    MPI_Gather(&devnum, 1, MPI_INT, devs, 1, MPI_INT, 0, MPI_COMM_WORLD);
    const char *stg = getenv("RANKMEM_STAGING");

    size_t hostsz = hi > max_window_bytes ? hi : max_window_bytes;
    char *dev = NULL, *host = malloc(hostsz), *pinned = NULL;
    CK(cudaMalloc((void **)&dev, hi));
    CK(cudaHostAlloc((void **)&pinned, hi, cudaHostAllocDefault));
    CK(cudaMemset(dev, 1, hi));
    CK(cudaMallocAsync((void **)&sdev, hi, 0));
    CK(cudaMemsetAsync(sdev, 1, hi, 0));
    CK(cudaDeviceSynchronize());
    /* Rank 0's target for the D2D copy column, on rank 1's device. */
    MPI_Bcast(devs, 2, MPI_INT, 0, MPI_COMM_WORLD);
    int peerdev = devs[1];
    char *other = NULL;
    if (me == 0) {
        if (peerdev != devnum) {
            CK(cudaSetDevice(peerdev));
            CK(cudaMalloc((void **)&other, hi));
            CK(cudaSetDevice(devnum));
            /* Peer access, as an IPC mapping opened with lazy peer access
             * has it (without it cudaMemcpyPeer goes through host memory). */
            int can = 0;
            if (cudaDeviceCanAccessPeer(&can, devnum, peerdev) == cudaSuccess && can &&
                cudaDeviceEnablePeerAccess(peerdev, 0) != cudaSuccess)
                (void)cudaGetLastError(); /* already enabled */
        } else {
            CK(cudaMalloc((void **)&other, hi));
        }
    }
    memset(host, 2, hostsz);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    if (me == 0) {
        printf("# rankmem MPI staging benchmark\n\n");
        printf("- device: %s (ranks on devices %d and %d)\n", prop.name, devs[0], devs[1]);
        printf("- MPI: %s\n", lib);
        const char *ch = getenv("RANKMEM_STAGING_CHUNK"), *po = getenv("RANKMEM_STAGING_POOL");
        printf("- RANKMEM_STAGING=%s, RANKMEM_STAGING_CHUNK=%s, RANKMEM_STAGING_POOL=%s\n",
               stg ? stg : "(auto)", ch ? ch : "(default)", po ? po : "(default)");
        const char *sc = getenv("OMPI_MCA_btl_vader_single_copy_mechanism");
        if (sc)
            printf("- OMPI_MCA_btl_vader_single_copy_mechanism=%s\n", sc);
        printf("- bandwidth: windows of up to 64 MPI_Isend (at most 64 MiB a window); one run\n\n");
        printf("| size | D-D rankmem GB/s | D-D staged GB/s | D-D naive GB/s | H-H MPI GB/s | "
               "pinned D2H GB/s | pinned H2D GB/s | D2D copy GB/s | rankmem / staged | "
               "rankmem / D2D copy |\n");
        printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        fflush(stdout);
    }
    for (size_t n = lo; n <= hi; n *= quick ? 4 : 2) {
        double r = bandwidth(M_RANKMEM, n, dev, host);
        double g = bandwidth(M_STAGED, n, dev, host);
        double v = bandwidth(M_NAIVE, n, dev, host);
        double h = bandwidth(M_HOST, n, dev, host);
        double d2h, h2d;
        pinned_copy(n, dev, pinned, s, &d2h, &h2d, NULL);
        double dc = dcopy_bw(n, dev, devnum, peerdev, other, s);
        if (me == 0) {
            char sz[32];
            human(n, sz, sizeof sz);
            printf("| %s | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f | %.1f | %.2fx | %.0f%% |\n", sz,
                   r, g, v, h, d2h, h2d, dc, r / g, dc > 0 ? 100.0 * r / dc : 0.0);
            fflush(stdout);
        }
    }
    if (me == 0) {
        printf("\n| size | D-D rankmem us | D-D staged us | D-D naive us | H-H us | "
               "one pinned copy us | H-H + 2 copies us |\n");
        printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    }
    size_t lat[] = {1, 8, 64, 512, 4096, 32768, 262144};
    for (size_t i = 0; i < sizeof lat / sizeof lat[0]; i++) {
        size_t n = lat[i];
        double r = latency(M_RANKMEM, n, dev, host);
        double g = latency(M_STAGED, n, dev, host);
        double v = latency(M_NAIVE, n, dev, host);
        double h = latency(M_HOST, n, dev, host);
        double d2h, h2d, one;
        pinned_copy(n, dev, pinned, s, &d2h, &h2d, &one);
        if (me == 0) {
            char sz[32];
            human(n, sz, sizeof sz);
            printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", sz, r, g, v, h, one,
                   h + 2 * one);
            fflush(stdout);
        }
    }
    if (me == 0) {
        printf("\n| face | halo of %d device faces us | the same with host faces us | "
               "device / host |\n",
               FACES);
        printf("|---:|---:|---:|---:|\n");
    }
    size_t face[] = {8, 1024, 4096, 32768, 262144};
    for (size_t i = 0; i < sizeof face / sizeof face[0]; i++) {
        size_t n = face[i];
        if (2 * FACES * n > hi)
            break;
        double d = halo(M_RANKMEM, n, dev, host);
        double h = halo(M_HOST, n, dev, host);
        if (me == 0) {
            char sz[32];
            human(n, sz, sizeof sz);
            printf("| %s | %.1f | %.1f | %.1fx |\n", sz, d, h, h > 0 ? d / h : 0.0);
            fflush(stdout);
        }
    }
    cudaStreamDestroy(s);
    cudaFree(dev);
    cudaFreeAsync(sdev, 0);
    if (other)
        cudaFree(other);
    cudaFreeHost(pinned);
    free(host);
    MPI_Finalize();
    return 0;
}
