/* Every call staging covers, with data checked element by element, run by
 * the scripts in tests/mpi_staging under mpirun (collective TAP: tests/mpi/mtap.h).
 *
 * One source, three ways to run it:
 *   stg_gpu (linked with librankmem_mpi, CUDA runtime): device buffers from
 *       cudaMalloc; skipped without a GPU. The lead's H100 runs.
 *   stg_gpu --host: every buffer in host memory, through the real plugin:
 *       host buffers must pass through unchanged (CPU CI).
 *   stg_fake (the plugin's sources built in, -DRKT_FAKE): a host region that
 *       the plugin's detection calls device memory and copies with memcpy,
 *       so that the whole staging protocol (headers, segments, the request
 *       table, the pool running dry) runs on the CPU. --real: no fake region
 *       (for RANKMEM_STAGING=on without a GPU, and bad settings).
 *
 * --vmm: device buffers come from the rank's resource, a vmm pool
 *       (RANKMEM_RESOURCE='stats>vmm', or vmm(backend=host) in stg_fake,
 *       whose memory the test backend then takes for device memory), so
 *       that messages between ranks go through the vmm descriptor and the
 *       fd service (staging/ipc_fd.c); stg_fake checks the IPC counters.
 *
 * Options: --host, --real, --vmm, --max BYTES (largest message), --quick
 * (fewer sizes), --overhead (stg_fake: only the host fast path's cost). */
#define _GNU_SOURCE
#include "config.h"

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h> /* Open MPI 4: MPIX_*_init, the persistent collectives */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <time.h>

#include "mtap.h"

int ftruncate(int fd, off_t length); /* <unistd.h>, whose F_* names clash with ours */
int close(int fd);

#include <rankmem.h>
#include <rankmem_mpi.h>

#ifdef RKT_FAKE
#include "staging/staging.h"
#include "staging/ipc_map.h"
#include "staging/ipc_fd.h"
#elif HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static int me, np, left, right;

#ifdef RKT_FAKE
/* IPC is each node's decision: with pretend nodes (RANKMEM_TEST_NODE_RANKS,
 * a test-only setting of the plugin) the world spans nodes, rk_ipc_on may
 * differ between ranks, and neighbours may be on other nodes. The first two
 * are collective over the world. */
static int ipc_all(void)
{
    int v = rk_ipc_on, m = 0;
    MPI_Allreduce(&v, &m, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return m;
}
static int ipc_any(void)
{
    int v = rk_ipc_on, m = 0;
    MPI_Allreduce(&v, &m, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return m;
}
static int spans_nodes(void)
{
    const char *v = getenv("RANKMEM_TEST_NODE_RANKS");
    return v && atoi(v) > 0 && atoi(v) < np;
}
#endif
static int host_only, use_real, use_vmm;
static size_t max_bytes = (size_t)64 << 20;
static size_t chunk = (size_t)4 << 20;
static int quick, overhead_only;

/* ---- "device" memory ---- */

#ifdef RKT_FAKE
static char *fregion;
static size_t fsize = (size_t)1 << 30, fused;
#endif

static int have_device(void)
{
    if (host_only)
        return 0;
#ifdef RKT_FAKE
    return !use_real;
#elif HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n > 0;
#else
    return 0;
#endif
}

enum { HOST = 0, DEV = 1 };

/* --vmm: device buffers from the rank's resource, remembered with their
 * sizes (rankmem_deallocate wants them back). */
static rankmem_resource_t *vres;
static struct {
    void *p;
    size_t n;
} vlive[1024]; /* t_window: up to 2 x 256 */

static void *vmm_alloc(size_t n)
{
    void *p = NULL;
    if (rankmem_allocate(vres, n, 0, &p) != RANKMEM_SUCCESS) {
        fprintf(stderr, "rank %d: vmm allocation of %zu bytes: %s\n", me, n, rankmem_last_error());
        abort();
    }
    for (size_t i = 0; i < sizeof vlive / sizeof vlive[0]; i++)
        if (!vlive[i].p) {
            vlive[i].p = p;
            vlive[i].n = n;
            return p;
        }
    fprintf(stderr, "too many live vmm buffers\n");
    abort();
}

static void vmm_free(void *p)
{
    for (size_t i = 0; i < sizeof vlive / sizeof vlive[0]; i++)
        if (vlive[i].p == p) {
            rankmem_deallocate(vres, p, vlive[i].n, 0);
            vlive[i].p = NULL;
            return;
        }
}

static void *xalloc(int kind, size_t n)
{
    if (n == 0)
        n = 1;
    if (kind == HOST) {
        void *p = malloc(n);
        if (!p)
            abort();
        return p;
    }
    if (use_vmm)
        return vmm_alloc(n);
#ifdef RKT_FAKE
    size_t a = (fused + 255) & ~(size_t)255;
    if (a + n > fsize) {
        fprintf(stderr, "fake device region exhausted\n");
        abort();
    }
    fused = a + n;
    return fregion + a;
#elif HAVE_CUDA
    void *p = NULL;
    if (cudaMalloc(&p, n) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc(%zu) failed\n", n);
        abort();
    }
    return p;
#else
    abort();
#endif
}

static void xfree(int kind, void *p)
{
    if (kind == HOST) {
        free(p);
        return;
    }
    if (use_vmm) {
        vmm_free(p);
        return;
    }
#if !defined(RKT_FAKE) && HAVE_CUDA
    cudaFree(p);
#else
    (void)p;
#endif
}

/* Fake device memory is a bump region: start over between tests. With
 * --vmm: every buffer freed and the pool's memory given back, so that the
 * next buffers (often at the same addresses) are new physical handles. */
static void dev_reset(void)
{
    if (use_vmm) {
        for (size_t i = 0; i < sizeof vlive / sizeof vlive[0]; i++)
            if (vlive[i].p)
                vmm_free(vlive[i].p);
        rankmem_resource_trim(vres, 0);
        return;
    }
#ifdef RKT_FAKE
    fused = 0;
#endif
}

static void to_buf(int kind, void *dst, const void *src, size_t n)
{
    if (kind == HOST) {
        memcpy(dst, src, n);
        return;
    }
#if !defined(RKT_FAKE) && HAVE_CUDA
    if (cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice) != cudaSuccess)
        abort();
#else
    memcpy(dst, src, n);
#endif
}

static void from_buf(int kind, void *dst, const void *src, size_t n)
{
    if (kind == HOST) {
        memcpy(dst, src, n);
        return;
    }
#if !defined(RKT_FAKE) && HAVE_CUDA
    if (cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost) != cudaSuccess)
        abort();
#else
    memcpy(dst, src, n);
#endif
}

static unsigned char pat(int seed, size_t i) { return (unsigned char)((i * 131u + (unsigned)seed * 17u + (i >> 12)) & 0xff); }

/* Fill n bytes with rank seed's pattern. */
static void fill(int kind, void *p, size_t n, int seed)
{
    unsigned char *h = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        h[i] = pat(seed, i);
    to_buf(kind, p, h, n);
    free(h);
}

static void set(int kind, void *p, size_t n, int byte)
{
    unsigned char *h = malloc(n ? n : 1);
    memset(h, byte, n);
    to_buf(kind, p, h, n);
    free(h);
}

/* Index of the first byte that differs from seed's pattern, or -1; bytes
 * [n, cap) must still be `guard`. */
static long check(int kind, const void *p, size_t n, int seed, size_t cap, int guard)
{
    unsigned char *h = malloc(cap ? cap : 1);
    from_buf(kind, h, p, cap);
    long bad = -1;
    for (size_t i = 0; i < n && bad < 0; i++)
        if (h[i] != pat(seed, i))
            bad = (long)i;
    for (size_t i = n; i < cap && bad < 0; i++)
        if (h[i] != (unsigned char)guard)
            bad = (long)i;
    free(h);
    return bad;
}

static const char *kname(int k) { return k == DEV ? "dev" : "host"; }

static size_t sizes[16];
static int nsizes;

static void make_sizes(void)
{
    /* 65535 and 65536 straddle the CUDA IPC threshold (RK_STG_IPC_MIN),
     * 256 KiB and one more the pipelining one (RK_STG_BIG). */
    size_t s[] = {1,         3,         4099,        65535,     65536, (size_t)256 << 10,
                  ((size_t)256 << 10) + 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 5, max_bytes};
    nsizes = 0;
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
        if (s[i] <= max_bytes && (!quick || i % 2 == 0 || s[i] == max_bytes))
            sizes[nsizes++] = s[i];
}

/* ---- point to point ---- */

enum { C_SEND, C_SEND_ANY, C_SSEND, C_RSEND, C_BSEND, C_SENDRECV, C_REPLACE, C_ISEND, NCALLS };
static const char *cname[] = {"Send/Recv", "Send/Recv(ANY_SOURCE, ANY_TAG)", "Ssend", "Rsend",
                              "Bsend", "Sendrecv", "Sendrecv_replace", "Isend/Irecv+Wait"};

static void t_p2p(int call, int sk, int rk, size_t n)
{
    size_t cap = n + 64;
    int tag = 100 + call;
    void *sbuf = xalloc(sk, cap), *rbuf = xalloc(rk, cap);
    fill(sk, sbuf, n, me);
    set(rk, rbuf, cap, 0xA5);
    MPI_Status st;
    memset(&st, 0, sizeof st);
    int rc = MPI_SUCCESS, rc2 = MPI_SUCCESS;
    int even = me % 2 == 0;
    switch (call) {
    case C_SEND:
    case C_SEND_ANY: {
        int src = call == C_SEND ? left : MPI_ANY_SOURCE, t = call == C_SEND ? tag : MPI_ANY_TAG;
        if (even) {
            rc = MPI_Send(sbuf, (int)n, MPI_BYTE, right, tag, MPI_COMM_WORLD);
            rc2 = MPI_Recv(rbuf, (int)cap, MPI_BYTE, src, t, MPI_COMM_WORLD, &st);
        } else {
            rc2 = MPI_Recv(rbuf, (int)cap, MPI_BYTE, src, t, MPI_COMM_WORLD, &st);
            rc = MPI_Send(sbuf, (int)n, MPI_BYTE, right, tag, MPI_COMM_WORLD);
        }
        break;
    }
    case C_SSEND:
        if (even) {
            rc = MPI_Ssend(sbuf, (int)n, MPI_BYTE, right, tag, MPI_COMM_WORLD);
            rc2 = MPI_Recv(rbuf, (int)cap, MPI_BYTE, left, tag, MPI_COMM_WORLD, &st);
        } else {
            rc2 = MPI_Recv(rbuf, (int)cap, MPI_BYTE, left, tag, MPI_COMM_WORLD, &st);
            rc = MPI_Ssend(sbuf, (int)n, MPI_BYTE, right, tag, MPI_COMM_WORLD);
        }
        break;
    case C_RSEND: {
        MPI_Request r;
        rc2 = MPI_Irecv(rbuf, (int)cap, MPI_BYTE, left, tag, MPI_COMM_WORLD, &r);
        MPI_Barrier(MPI_COMM_WORLD);
        rc = MPI_Rsend(sbuf, (int)n, MPI_BYTE, right, tag, MPI_COMM_WORLD);
        if (rc2 == MPI_SUCCESS)
            rc2 = MPI_Wait(&r, &st);
        break;
    }
    case C_BSEND: {
        int bsz = (int)n + MPI_BSEND_OVERHEAD + 64;
        void *att = malloc((size_t)bsz);
        MPI_Buffer_attach(att, bsz);
        rc = MPI_Bsend(sbuf, (int)n, MPI_BYTE, right, tag, MPI_COMM_WORLD);
        rc2 = MPI_Recv(rbuf, (int)cap, MPI_BYTE, left, tag, MPI_COMM_WORLD, &st);
        void *old;
        int osz;
        MPI_Buffer_detach(&old, &osz);
        free(att);
        break;
    }
    case C_SENDRECV:
        rc = MPI_Sendrecv(sbuf, (int)n, MPI_BYTE, right, tag, rbuf, (int)cap, MPI_BYTE, left, tag,
                          MPI_COMM_WORLD, &st);
        break;
    case C_REPLACE:
        /* rbuf of the receiver's kind holds the data to send, then the reply. */
        fill(rk, rbuf, n, me);
        rc = MPI_Sendrecv_replace(rbuf, (int)n, MPI_BYTE, right, tag, left, tag, MPI_COMM_WORLD,
                                  &st);
        cap = n;
        break;
    case C_ISEND: {
        MPI_Request r[2];
        rc2 = MPI_Irecv(rbuf, (int)cap, MPI_BYTE, left, tag, MPI_COMM_WORLD, &r[0]);
        rc = MPI_Isend(sbuf, (int)n, MPI_BYTE, right, tag, MPI_COMM_WORLD, &r[1]);
        /* The send buffer may be reused at once only after completion; test
         * that staging does not read it late: nothing to do here. */
        MPI_Status sts[2];
        int rc3 = MPI_Waitall(2, r, sts);
        st = sts[0];
        if (rc == MPI_SUCCESS)
            rc = rc3;
        break;
    }
    }
    int cnt = -1;
    MPI_Get_count(&st, MPI_BYTE, &cnt);
    long bad = check(rk, rbuf, n, left, cap, 0xA5);
    int ok = rc == MPI_SUCCESS && rc2 == MPI_SUCCESS && bad < 0 && cnt == (int)n &&
             st.MPI_SOURCE == left && st.MPI_TAG == tag;
    if (!ok)
        fprintf(stderr, "# rank %d: %s %s->%s %zu bytes: rc %d/%d, first bad byte %ld, count %d, "
                        "source %d, tag %d\n",
                me, cname[call], kname(sk), kname(rk), n, rc, rc2, bad, cnt, st.MPI_SOURCE,
                st.MPI_TAG);
    mok(ok, "%s, %s to %s, %zu bytes", cname[call], kname(sk), kname(rk), n);
    xfree(sk, sbuf);
    xfree(rk, rbuf);
    dev_reset();
}

/* ---- many outstanding requests, every completion form ---- */

enum { F_WAIT, F_WAITALL, F_WAITANY, F_WAITSOME, F_TEST, F_TESTALL, F_TESTANY, F_TESTSOME, NFORMS };
static const char *fname[] = {"Wait",  "Waitall",  "Waitany",  "Waitsome",
                              "Test", "Testall", "Testany", "Testsome"};

#define K 10

static size_t k_size(int i)
{
    size_t s[K] = {7, (size_t)300 << 10, 1, chunk + 3, 65536, 2 * chunk, 0, 4099, chunk / 2, 12};
    size_t v = s[i];
    return v > max_bytes ? max_bytes : v;
}

static void t_many(int form, int kinds)
{
    /* kinds 0: all host, 1: all device, 2: mixed by index */
    MPI_Request req[2 * K];
    MPI_Status sts[2 * K];
    void *rb[K], *sb[K];
    int rkind[K], skind[K], got[2 * K];
    MPI_Status rst[K];
    for (int i = 0; i < K; i++) {
        rkind[i] = kinds == 2 ? (i % 2 ? DEV : HOST) : kinds;
        skind[i] = kinds == 2 ? ((i / 2) % 2 ? DEV : HOST) : kinds;
        size_t n = k_size(i);
        rb[i] = xalloc(rkind[i], n + 16);
        set(rkind[i], rb[i], n + 16, 0x5A);
        sb[i] = xalloc(skind[i], n);
        fill(skind[i], sb[i], n, me * 7 + i);
        memset(&rst[i], 0, sizeof rst[i]);
        got[i] = got[K + i] = 0;
    }
    for (int i = 0; i < K; i++)
        MPI_Irecv(rb[i], (int)k_size(i) + 16, MPI_BYTE, left, 200 + i, MPI_COMM_WORLD, &req[i]);
    for (int i = 0; i < K; i++)
        MPI_Isend(sb[i], (int)k_size(i), MPI_BYTE, right, 200 + i, MPI_COMM_WORLD, &req[K + i]);
    int done = 0, rcs = MPI_SUCCESS;
    while (done < 2 * K) {
        int idx, flag, out, ix[2 * K];
        switch (form) {
        case F_WAIT:
            for (int i = 0; i < 2 * K; i++) {
                rcs |= MPI_Wait(&req[i], &sts[i]);
                if (i < K)
                    rst[i] = sts[i];
                got[i]++;
            }
            done = 2 * K;
            break;
        case F_WAITALL:
            rcs |= MPI_Waitall(2 * K, req, sts);
            for (int i = 0; i < 2 * K; i++) {
                got[i]++;
                if (i < K)
                    rst[i] = sts[i];
            }
            done = 2 * K;
            break;
        case F_WAITANY:
            rcs |= MPI_Waitany(2 * K, req, &idx, &sts[0]);
            if (idx >= 0 && idx < 2 * K) {
                got[idx]++;
                if (idx < K)
                    rst[idx] = sts[0];
                done++;
            }
            break;
        case F_WAITSOME:
            rcs |= MPI_Waitsome(2 * K, req, &out, ix, sts);
            for (int j = 0; j < out && out != MPI_UNDEFINED; j++) {
                got[ix[j]]++;
                if (ix[j] < K)
                    rst[ix[j]] = sts[j];
                done++;
            }
            break;
        case F_TEST:
            for (int i = 0; i < 2 * K; i++) {
                if (got[i])
                    continue;
                flag = 0;
                rcs |= MPI_Test(&req[i], &flag, &sts[i]);
                if (flag) {
                    got[i]++;
                    if (i < K)
                        rst[i] = sts[i];
                    done++;
                }
            }
            break;
        case F_TESTALL:
            flag = 0;
            rcs |= MPI_Testall(2 * K, req, &flag, sts);
            if (flag) {
                for (int i = 0; i < 2 * K; i++) {
                    got[i]++;
                    if (i < K)
                        rst[i] = sts[i];
                }
                done = 2 * K;
            }
            break;
        case F_TESTANY:
            flag = 0;
            rcs |= MPI_Testany(2 * K, req, &idx, &flag, &sts[0]);
            if (flag && idx != MPI_UNDEFINED) {
                got[idx]++;
                if (idx < K)
                    rst[idx] = sts[0];
                done++;
            }
            break;
        case F_TESTSOME:
            rcs |= MPI_Testsome(2 * K, req, &out, ix, sts);
            for (int j = 0; j < out && out != MPI_UNDEFINED; j++) {
                got[ix[j]]++;
                if (ix[j] < K)
                    rst[ix[j]] = sts[j];
                done++;
            }
            break;
        }
    }
    int ok = rcs == MPI_SUCCESS;
    for (int i = 0; i < 2 * K; i++) {
        ok &= got[i] == 1 && req[i] == MPI_REQUEST_NULL;
        if (got[i] != 1 || req[i] != MPI_REQUEST_NULL)
            fprintf(stderr, "# rank %d: %s request %d completed %d times\n", me, fname[form], i,
                    got[i]);
    }
    for (int i = 0; i < K; i++) {
        size_t n = k_size(i);
        long bad = check(rkind[i], rb[i], n, left * 7 + i, n + 16, 0x5A);
        int cnt = -1;
        MPI_Get_count(&rst[i], MPI_BYTE, &cnt);
        if (bad >= 0 || cnt != (int)n || rst[i].MPI_SOURCE != left || rst[i].MPI_TAG != 200 + i) {
            fprintf(stderr, "# rank %d: %s receive %d (%s, %zu bytes): bad byte %ld, count %d, "
                            "source %d, tag %d\n",
                    me, fname[form], i, kname(rkind[i]), n, bad, cnt, rst[i].MPI_SOURCE,
                    rst[i].MPI_TAG);
            ok = 0;
        }
        xfree(rkind[i], rb[i]);
        xfree(skind[i], sb[i]);
    }
    dev_reset();
    mok(ok, "%d sends and receives outstanding (%s), completed with %s", K,
        kinds == 0 ? "host" : kinds == 1 ? "device" : "mixed", fname[form]);
}

/* Windows of w messages in flight to the right neighbour, all on one tag:
 * sizes and memory kinds mixed (small device sends, which go to MPI once
 * their copy ended, host sends, messages through IPC or pipelined, and every
 * fifth sent blocking), receives posted first, device and host alternately,
 * with MPI_ANY_SOURCE and MPI_ANY_TAG when any is set. MPI's order between
 * two ranks must hold: the k-th receive gets the k-th message (its size and
 * its pattern), and every byte is right. */
static size_t w_size(int i)
{
    static const size_t small[] = {1, 7, 64, 4096, 4099, 12, 1000, 65541};
    size_t n = i % 32 == 31 ? (i % 64 == 63 ? chunk + 3 : ((size_t)300 << 10) + 1)
                            : small[(size_t)i % (sizeof small / sizeof small[0])];
    return n > max_bytes ? max_bytes : n;
}

static void t_window(int w, int any)
{
    MPI_Request *req = malloc(2 * (size_t)w * sizeof *req);
    MPI_Status *st = malloc(2 * (size_t)w * sizeof *st);
    void **rb = malloc((size_t)w * sizeof *rb), **sb = malloc((size_t)w * sizeof *sb);
    int *rk = malloc((size_t)w * sizeof *rk), *sk = malloc((size_t)w * sizeof *sk);
    if (!req || !st || !rb || !sb || !rk || !sk)
        abort();
    for (int i = 0; i < w; i++) {
        size_t n = w_size(i);
        rk[i] = i % 2 || host_only ? HOST : DEV;
        sk[i] = i % 3 == 2 || host_only ? HOST : DEV;
        rb[i] = xalloc(rk[i], n + 16);
        set(rk[i], rb[i], n + 16, 0x5A);
        sb[i] = xalloc(sk[i], n);
        fill(sk[i], sb[i], n, me * 1000 + i);
    }
    int rc = MPI_SUCCESS;
    for (int i = 0; i < w; i++)
        rc |= MPI_Irecv(rb[i], (int)w_size(i) + 16, MPI_BYTE, any ? MPI_ANY_SOURCE : left,
                        any ? MPI_ANY_TAG : 300, MPI_COMM_WORLD, &req[i]);
    for (int i = 0; i < w; i++) {
        if (i % 5 == 4) {
            rc |= MPI_Send(sb[i], (int)w_size(i), MPI_BYTE, right, 300, MPI_COMM_WORLD);
            req[w + i] = MPI_REQUEST_NULL;
        } else {
            rc |= MPI_Isend(sb[i], (int)w_size(i), MPI_BYTE, right, 300, MPI_COMM_WORLD,
                            &req[w + i]);
        }
    }
    rc |= MPI_Waitall(2 * w, req, st);
    int ok = rc == MPI_SUCCESS, nbad = 0;
    for (int i = 0; i < w; i++) {
        size_t n = w_size(i);
        long bad = check(rk[i], rb[i], n, left * 1000 + i, n + 16, 0x5A);
        int cnt = -1;
        MPI_Get_count(&st[i], MPI_BYTE, &cnt);
        if (bad >= 0 || cnt != (int)n || st[i].MPI_SOURCE != left || st[i].MPI_TAG != 300) {
            if (nbad++ < 3)
                fprintf(stderr, "# rank %d: window of %d, receive %d (%s, %zu bytes): bad byte %ld, "
                                "count %d, source %d, tag %d\n",
                        me, w, i, kname(rk[i]), n, bad, cnt, st[i].MPI_SOURCE, st[i].MPI_TAG);
            ok = 0;
        }
        xfree(rk[i], rb[i]);
        xfree(sk[i], sb[i]);
    }
    dev_reset();
    free(req), free(st), free(rb), free(sb), free(rk), free(sk);
    mok(ok, "a window of %d messages in flight, sizes and kinds mixed, one tag%s: each arrives "
            "in its place, intact", w, any ? " (ANY_SOURCE, ANY_TAG receives)" : "");
}

#ifdef RKT_FAKE
/* Small staging buffers are slices of one pool chunk: 8 device receives
 * and 8 device sends of 4 KiB in flight hold one chunk (two at most, if a
 * slice chunk filled), not 16. */
static void t_slices(void)
{
    enum { N = 8, SZ = 4096 };
    MPI_Request req[2 * N];
    void *rb[N], *sb[N];
    for (int i = 0; i < N; i++) {
        rb[i] = xalloc(DEV, SZ);
        sb[i] = xalloc(DEV, SZ);
        fill(DEV, sb[i], SZ, me * 31 + i);
    }
    long before = rk_stg_buf_inuse();
    for (int i = 0; i < N; i++)
        MPI_Irecv(rb[i], SZ, MPI_BYTE, left, 500 + i, MPI_COMM_WORLD, &req[i]);
    for (int i = 0; i < N; i++)
        MPI_Isend(sb[i], SZ, MPI_BYTE, right, 500 + i, MPI_COMM_WORLD, &req[N + i]);
    long held = rk_stg_buf_inuse() - before;
    int rc = MPI_Waitall(2 * N, req, MPI_STATUSES_IGNORE), good = rc == MPI_SUCCESS;
    for (int i = 0; i < N; i++)
        good &= check(DEV, rb[i], SZ, left * 31 + i, SZ, 0) < 0;
    dev_reset();
    mok(good && held <= 2,
        "%d small device messages in flight each way hold %ld pool chunk(s) (slices), data right",
        N, held);
}
#endif

/* Request_free on a staged send, Cancel on a staged receive. */
static void t_free_cancel(int kind)
{
    size_t n = chunk + 5 > max_bytes ? max_bytes : chunk + 5;
    void *sb = xalloc(kind, n), *rb = xalloc(kind, n);
    fill(kind, sb, n, me);
    set(kind, rb, n, 0);
    MPI_Request r;
    MPI_Isend(sb, (int)n, MPI_BYTE, right, 300, MPI_COMM_WORLD, &r);
    int rc = MPI_Request_free(&r);
    MPI_Status st;
    int rc2 = MPI_Recv(rb, (int)n, MPI_BYTE, left, 300, MPI_COMM_WORLD, &st);
    long bad = check(kind, rb, n, left, n, 0);
    mok(rc == MPI_SUCCESS && rc2 == MPI_SUCCESS && r == MPI_REQUEST_NULL && bad < 0,
        "MPI_Request_free on a %s Isend of %zu bytes: the message arrives", kname(kind), n);
    MPI_Barrier(MPI_COMM_WORLD);

    MPI_Request c;
    int cancelled = 0;
    rc = MPI_Irecv(rb, (int)n, MPI_BYTE, left, 301, MPI_COMM_WORLD, &c);
    rc2 = MPI_Cancel(&c);
    int rc3 = MPI_Wait(&c, &st);
    MPI_Test_cancelled(&st, &cancelled);
    mok(rc == MPI_SUCCESS && rc2 == MPI_SUCCESS && rc3 == MPI_SUCCESS && cancelled &&
            c == MPI_REQUEST_NULL,
        "MPI_Cancel on a %s Irecv that nothing matches: cancelled", kname(kind));
    xfree(kind, sb);
    xfree(kind, rb);
    dev_reset();
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Probe (or Iprobe), size the buffer by MPI_Get_count, then receive: the
 * count must be the message's, also when it came as a header. 32 bytes:
 * the size of a header, an ordinary message the probe had to take. */
static void t_probe(int sk, int rk, size_t n, int iprobe)
{
    void *sb = xalloc(sk, n);
    fill(sk, sb, n, me);
    MPI_Request sr, rr;
    MPI_Status st, st2;
    MPI_Isend(sb, (int)n, MPI_BYTE, right, 500, MPI_COMM_WORLD, &sr);
    int flag = 0, rc;
    if (iprobe)
        while (!flag)
            MPI_Iprobe(left, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
    else
        MPI_Probe(MPI_ANY_SOURCE, 500, MPI_COMM_WORLD, &st);
    int cnt = -1, cnt2 = -1;
    MPI_Get_count(&st, MPI_BYTE, &cnt);
    void *rb = xalloc(rk, cnt > 0 ? (size_t)cnt : 1);
    set(rk, rb, cnt > 0 ? (size_t)cnt : 1, 0);
    if (iprobe) {
        rc = MPI_Irecv(rb, cnt, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &rr);
        if (rc == MPI_SUCCESS)
            rc = MPI_Wait(&rr, &st2);
    } else {
        rc = MPI_Recv(rb, cnt, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &st2);
    }
    MPI_Wait(&sr, MPI_STATUS_IGNORE);
    MPI_Get_count(&st2, MPI_BYTE, &cnt2);
    long bad = cnt == (int)n ? check(rk, rb, n, left, n, 0) : -2;
    mok(rc == MPI_SUCCESS && cnt == (int)n && cnt2 == (int)n && bad < 0 &&
            st.MPI_SOURCE == left && st2.MPI_SOURCE == left && st2.MPI_TAG == 500,
        "%s, then receive by its count: %s to %s, %zu bytes (probe said %d)",
        iprobe ? "MPI_Iprobe" : "MPI_Probe(ANY_SOURCE)", kname(sk), kname(rk), n, cnt);
    xfree(sk, sb);
    xfree(rk, rb);
    dev_reset();
}

/* A rank inside a collective must still post the segments its pending
 * receive needs: even ranks block in a large device MPI_Send whose
 * receiver (posted with MPI_Irecv) is in MPI_Allreduce meanwhile. Valid
 * MPI (the receive is posted), and a hang if staging did not keep going. */
static void t_progress(size_t n)
{
    void *sb = xalloc(DEV, n), *rb = xalloc(DEV, n);
    fill(DEV, sb, n, me);
    set(DEV, rb, n, 0);
    MPI_Request r;
    int one = 1, sum = 0, rc;
    MPI_Irecv(rb, (int)n, MPI_BYTE, left, 600, MPI_COMM_WORLD, &r);
    if (me % 2 == 0) {
        rc = MPI_Send(sb, (int)n, MPI_BYTE, right, 600, MPI_COMM_WORLD);
        rc |= MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    } else {
        rc = MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        rc |= MPI_Send(sb, (int)n, MPI_BYTE, right, 600, MPI_COMM_WORLD);
    }
    rc |= MPI_Wait(&r, MPI_STATUS_IGNORE);
    long bad = check(DEV, rb, n, left, n, 0);
    mok(rc == MPI_SUCCESS && sum == np && bad < 0,
        "a pending device Irecv advances while its rank is in MPI_Allreduce (%zu bytes)", n);
    xfree(DEV, sb);
    xfree(DEV, rb);
    dev_reset();
}

/* A nonblocking device send must keep moving while its rank sits in a call
 * the plugin does not cover: odd ranks wait in MPI_Barrier while their right
 * neighbour blocks in MPI_Recv of their MPI_Isend (a ring request advances in
 * MPI's progress engine; without the ring the Isend posted everything). */
static void t_isend_barrier(size_t n)
{
    void *sb = xalloc(DEV, n), *rb = xalloc(DEV, n);
    fill(DEV, sb, n, me);
    set(DEV, rb, n, 0);
    MPI_Request r;
    int rc = MPI_Isend(sb, (int)n, MPI_BYTE, right, 610, MPI_COMM_WORLD, &r);
    if (me % 2 == 0 || np % 2) {
        rc |= MPI_Recv(rb, (int)n, MPI_BYTE, left, 610, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        rc |= MPI_Barrier(MPI_COMM_WORLD);
    } else {
        rc |= MPI_Barrier(MPI_COMM_WORLD);
        rc |= MPI_Recv(rb, (int)n, MPI_BYTE, left, 610, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    rc |= MPI_Wait(&r, MPI_STATUS_IGNORE);
    long bad = check(DEV, rb, n, left, n, 0);
    mok(rc == MPI_SUCCESS && bad < 0,
        "a device Isend advances while its rank is in MPI_Barrier (%zu bytes)", n);
    xfree(DEV, sb);
    xfree(DEV, rb);
    dev_reset();
}

/* A pipelined device message (more than 256 KiB) meets a small device
 * receive: MPI_ERR_TRUNCATE (errors returned), and the sender completes
 * (its segments are taken and dropped). */
static void t_truncate(void)
{
    size_t n = (size_t)600 << 10, small = 1000;
    void *sb = xalloc(DEV, n), *rb = xalloc(DEV, small);
    fill(DEV, sb, n, me);
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    MPI_Request r;
    int rc = MPI_Isend(sb, (int)n, MPI_BYTE, right, 620, c, &r);
    int rrc = MPI_Recv(rb, (int)small, MPI_BYTE, left, 620, c, MPI_STATUS_IGNORE);
    int cls = -1;
    MPI_Error_class(rrc, &cls);
    rc |= MPI_Wait(&r, MPI_STATUS_IGNORE);
    mok(rc == MPI_SUCCESS && cls == MPI_ERR_TRUNCATE,
        "a %zu-byte device message into a %zu-byte device receive: MPI_ERR_TRUNCATE (class %d), "
        "the send completes", n, small, cls);
    MPI_Comm_free(&c);
    xfree(DEV, sb);
    xfree(DEV, rb);
    dev_reset();
}

/* Derived datatypes: a strided vector sent from one kind to the other,
 * received as a vector (holes keep their contents) and as plain ints. */
static void t_derived(int sk, int rk, int nel)
{
    MPI_Datatype vec;
    MPI_Type_vector(nel, 1, 3, MPI_INT, &vec);
    MPI_Type_commit(&vec);
    size_t span = (size_t)(nel - 1) * 3 + 1;
    int *hs = malloc(span * sizeof(int)), *hr = malloc(span * sizeof(int));
    for (size_t i = 0; i < span; i++)
        hs[i] = (int)(i % 3 == 0 ? me * 1000003 + (int)i : -1);
    int *sb = xalloc(sk, span * sizeof(int)), *rb = xalloc(rk, span * sizeof(int));
    to_buf(sk, sb, hs, span * sizeof(int));
    for (size_t i = 0; i < span; i++)
        hr[i] = -7;
    to_buf(rk, rb, hr, span * sizeof(int));
    MPI_Status st;
    int rc = MPI_Sendrecv(sb, 1, vec, right, 400, rb, 1, vec, left, 400, MPI_COMM_WORLD, &st);
    from_buf(rk, hr, rb, span * sizeof(int));
    int ok = rc == MPI_SUCCESS;
    for (size_t i = 0; i < span && ok; i++)
        ok = hr[i] == (i % 3 == 0 ? left * 1000003 + (int)i : -7);
    int cnt = -1;
    MPI_Get_count(&st, vec, &cnt);
    ok &= cnt == 1;
    mok(ok, "vector of %d ints, %s to %s: elements in place, holes untouched, count 1", nel,
        kname(sk), kname(rk));
    /* Vector in, contiguous ints out (same type signature). */
    int *rc_buf = xalloc(rk, (size_t)nel * sizeof(int));
    rc = MPI_Sendrecv(sb, 1, vec, right, 401, rc_buf, nel, MPI_INT, left, 401, MPI_COMM_WORLD,
                      &st);
    from_buf(rk, hr, rc_buf, (size_t)nel * sizeof(int));
    ok = rc == MPI_SUCCESS;
    for (int i = 0; i < nel && ok; i++)
        ok = hr[i] == left * 1000003 + 3 * i;
    MPI_Get_count(&st, MPI_INT, &cnt);
    mok(ok && cnt == nel, "vector of %d ints %s to %d contiguous ints %s", nel, kname(sk), nel,
        kname(rk));
    xfree(rk, rc_buf);
    xfree(sk, sb);
    xfree(rk, rb);
    free(hs);
    free(hr);
    MPI_Type_free(&vec);
    dev_reset();
}

/* ---- persistent requests ---- */

enum { PM_SEND, PM_SSEND, PM_RSEND, PM_BSEND, NPMODES };
static const char *pmname[] = {"Send_init", "Ssend_init", "Rsend_init", "Bsend_init"};

static int send_init(int mode, const void *buf, int n, int dest, int tag, MPI_Request *q)
{
    switch (mode) {
    case PM_SSEND:
        return MPI_Ssend_init(buf, n, MPI_BYTE, dest, tag, MPI_COMM_WORLD, q);
    case PM_RSEND:
        return MPI_Rsend_init(buf, n, MPI_BYTE, dest, tag, MPI_COMM_WORLD, q);
    case PM_BSEND:
        return MPI_Bsend_init(buf, n, MPI_BYTE, dest, tag, MPI_COMM_WORLD, q);
    default:
        return MPI_Send_init(buf, n, MPI_BYTE, dest, tag, MPI_COMM_WORLD, q);
    }
}

/* An empty status: what waiting on an inactive request gives. */
static int is_empty(const MPI_Status *st)
{
    int cnt = -1, c = 1;
    MPI_Get_count(st, MPI_BYTE, &cnt);
    MPI_Test_cancelled(st, &c);
    return cnt == 0 && !c && st->MPI_SOURCE == MPI_ANY_SOURCE && st->MPI_TAG == MPI_ANY_TAG;
}

/* A persistent receive (from the left) and send (to the right) of n bytes,
 * started 3 times with new data each time, completed with Wait, Waitall
 * and Test in turn; the handles stay, inactive in between (waiting on one
 * then returns an empty status at once); freed at the end. */
static void t_persist(int sk, int rk, size_t n, int mode)
{
    size_t cap = n + 64;
    int tag = 700 + mode;
    void *sb = xalloc(sk, n), *rb = xalloc(rk, cap), *att = NULL;
    if (mode == PM_BSEND) {
        int bsz = 2 * ((int)n + MPI_BSEND_OVERHEAD) + 64;
        att = malloc((size_t)bsz);
        MPI_Buffer_attach(att, bsz);
    }
    MPI_Request q[2], h[2];
    int rc = MPI_Recv_init(rb, (int)cap, MPI_BYTE, left, tag, MPI_COMM_WORLD, &q[0]);
    rc |= send_init(mode, sb, (int)n, right, tag, &q[1]);
    h[0] = q[0], h[1] = q[1];
    int ok = rc == MPI_SUCCESS;
    for (int round = 0; round < 3 && ok; round++) {
        fill(sk, sb, n, me * 10 + round);
        set(rk, rb, cap, 0xA5);
        rc = MPI_Start(&q[0]);
        if (mode == PM_RSEND)
            MPI_Barrier(MPI_COMM_WORLD); /* a ready send needs its receive posted */
        rc |= MPI_Start(&q[1]);
        MPI_Status st[2];
        memset(st, 0, sizeof st);
        if (round == 0) {
            rc |= MPI_Wait(&q[0], &st[0]);
            rc |= MPI_Wait(&q[1], &st[1]);
        } else if (round == 1) {
            rc |= MPI_Waitall(2, q, st);
        } else {
            int f0 = 0, f1 = 0;
            while (!(f0 && f1)) {
                if (!f0)
                    rc |= MPI_Test(&q[0], &f0, &st[0]);
                if (!f1)
                    rc |= MPI_Test(&q[1], &f1, &st[1]);
            }
        }
        int cnt = -1;
        MPI_Get_count(&st[0], MPI_BYTE, &cnt);
        long bad = check(rk, rb, n, left * 10 + round, cap, 0xA5);
        int good = rc == MPI_SUCCESS && bad < 0 && cnt == (int)n && st[0].MPI_SOURCE == left &&
                   st[0].MPI_TAG == tag && q[0] == h[0] && q[1] == h[1];
        if (!good)
            fprintf(stderr, "# rank %d: %s %s->%s %zu bytes, round %d: rc %d, first bad byte %ld, "
                            "count %d, source %d, tag %d, handles %s\n",
                    me, pmname[mode], kname(sk), kname(rk), n, round, rc, bad, cnt,
                    st[0].MPI_SOURCE, st[0].MPI_TAG,
                    q[0] == h[0] && q[1] == h[1] ? "kept" : "changed");
        ok &= good;
        MPI_Barrier(MPI_COMM_WORLD); /* the buffered send's space is free again */
    }
    MPI_Status es;
    memset(&es, 0x55, sizeof es);
    int flag = 0;
    rc = MPI_Wait(&q[0], &es);
    ok &= rc == MPI_SUCCESS && is_empty(&es) && q[0] == h[0];
    rc = MPI_Test(&q[1], &flag, &es);
    ok &= rc == MPI_SUCCESS && flag && is_empty(&es) && q[1] == h[1];
    rc = MPI_Request_free(&q[0]);
    rc |= MPI_Request_free(&q[1]);
    ok &= rc == MPI_SUCCESS && q[0] == MPI_REQUEST_NULL && q[1] == MPI_REQUEST_NULL;
    if (att) {
        void *old;
        int osz;
        MPI_Buffer_detach(&old, &osz);
        free(att);
    }
    mok(ok, "persistent %s/Recv_init, %s to %s, %zu bytes: 3 starts with new data, each "
            "element right; handles kept, inactive between (empty status); freed",
        pmname[mode], kname(sk), kname(rk), n);
    xfree(sk, sb);
    xfree(rk, rb);
    dev_reset();
}

/* Persistent requests of both kinds of memory started by one MPI_Startall,
 * completed in one array with ordinary and staged nonblocking requests and
 * a persistent request never started (inactive: an empty status), by
 * Waitall, Waitany or Testsome; twice. */
static void t_persist_mix(int form)
{
    static const char *fn[] = {"Waitall", "Waitany", "Testsome"};
    int D = host_only ? HOST : DEV;
    size_t big = chunk + 5 > max_bytes ? max_bytes : chunk + 5;
    size_t sz[4] = {big, 1000, 3000, (size_t)100 << 10}; /* per pair of messages */
    int rkind[4] = {D, HOST, HOST, D}, skind[4] = {D, HOST, HOST, D};
    int rfrom[4] = {left, right, left, right}, sto[4] = {right, left, right, left};
    void *rb[4], *sb[4], *idle = xalloc(D, 64);
    for (int i = 0; i < 4; i++) {
        rb[i] = xalloc(rkind[i], sz[i] + 16);
        sb[i] = xalloc(skind[i], sz[i]);
    }
    /* Persistent: [0] recv big D, [1] recv host, [2] send big D, [3] send
     * host, [4] recv never started; ordinary: [5] recv host, [6] send host;
     * staged: [7] recv D, [8] send D. */
    MPI_Request all[9], keep[5];
    int rc = MPI_Recv_init(rb[0], (int)sz[0] + 16, MPI_BYTE, rfrom[0], 720, MPI_COMM_WORLD, &all[0]);
    rc |= MPI_Recv_init(rb[1], (int)sz[1] + 16, MPI_BYTE, rfrom[1], 721, MPI_COMM_WORLD, &all[1]);
    rc |= MPI_Send_init(sb[0], (int)sz[0], MPI_BYTE, sto[0], 720, MPI_COMM_WORLD, &all[2]);
    rc |= MPI_Send_init(sb[1], (int)sz[1], MPI_BYTE, sto[1], 721, MPI_COMM_WORLD, &all[3]);
    rc |= MPI_Recv_init(idle, 64, MPI_BYTE, left, 729, MPI_COMM_WORLD, &all[4]);
    for (int i = 0; i < 5; i++)
        keep[i] = all[i];
    int ok = rc == MPI_SUCCESS;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 4; i++) {
            fill(skind[i], sb[i], sz[i], me * 31 + i + round * 7);
            set(rkind[i], rb[i], sz[i] + 16, 0x5A);
        }
        rc = MPI_Startall(4, all);
        rc |= MPI_Irecv(rb[2], (int)sz[2] + 16, MPI_BYTE, rfrom[2], 722, MPI_COMM_WORLD, &all[5]);
        rc |= MPI_Isend(sb[2], (int)sz[2], MPI_BYTE, sto[2], 722, MPI_COMM_WORLD, &all[6]);
        rc |= MPI_Irecv(rb[3], (int)sz[3] + 16, MPI_BYTE, rfrom[3], 723, MPI_COMM_WORLD, &all[7]);
        rc |= MPI_Isend(sb[3], (int)sz[3], MPI_BYTE, sto[3], 723, MPI_COMM_WORLD, &all[8]);
        MPI_Status sts[9], byidx[9];
        int got[9] = {0}, ix[9], out, idx, done = 0, undef = 0;
        memset(byidx, 0x55, sizeof byidx);
        if (form == 0) {
            rc |= MPI_Waitall(9, all, sts);
            for (int i = 0; i < 9; i++) {
                byidx[i] = sts[i];
                got[i] = i != 4;
            }
            undef = 1;
        } else {
            while (done < 8) {
                if (form == 1) {
                    rc |= MPI_Waitany(9, all, &idx, &sts[0]);
                    if (idx == MPI_UNDEFINED)
                        break;
                    got[idx]++;
                    byidx[idx] = sts[0];
                    done++;
                } else {
                    rc |= MPI_Testsome(9, all, &out, ix, sts);
                    if (out == MPI_UNDEFINED)
                        break;
                    for (int j = 0; j < out; j++) {
                        got[ix[j]]++;
                        byidx[ix[j]] = sts[j];
                        done++;
                    }
                }
            }
            /* Nothing active is left: MPI_UNDEFINED. */
            if (form == 1)
                rc |= MPI_Waitany(9, all, &idx, &sts[0]);
            else
                rc |= MPI_Testsome(9, all, &idx, ix, sts);
            undef = idx == MPI_UNDEFINED;
        }
        int good = rc == MPI_SUCCESS && undef;
        for (int i = 0; i < 9; i++)
            good &= got[i] == (i != 4);
        for (int i = 0; i < 5; i++)
            good &= all[i] == keep[i];
        for (int i = 5; i < 9; i++)
            good &= all[i] == MPI_REQUEST_NULL;
        if (form == 0)
            good &= is_empty(&byidx[4]);
        int ri[4] = {0, 1, 5, 7}, tg[4] = {720, 721, 722, 723};
        for (int k = 0; k < 4; k++) {
            int cnt = -1;
            MPI_Get_count(&byidx[ri[k]], MPI_BYTE, &cnt);
            long bad = check(rkind[k], rb[k], sz[k], rfrom[k] * 31 + k + round * 7, sz[k] + 16,
                             0x5A);
            if (bad >= 0 || cnt != (int)sz[k] || byidx[ri[k]].MPI_SOURCE != rfrom[k] ||
                byidx[ri[k]].MPI_TAG != tg[k]) {
                fprintf(stderr, "# rank %d: %s round %d, receive %d (%s, %zu bytes): bad byte "
                                "%ld, count %d, source %d, tag %d\n",
                        me, fn[form], round, ri[k], kname(rkind[k]), sz[k], bad, cnt,
                        byidx[ri[k]].MPI_SOURCE, byidx[ri[k]].MPI_TAG);
                good = 0;
            }
        }
        if (!good)
            fprintf(stderr, "# rank %d: %s round %d: rc %d, undefined at the end %d\n", me,
                    fn[form], round, rc, undef);
        ok &= good;
    }
    for (int i = 0; i < 5; i++)
        rc |= MPI_Request_free(&all[i]);
    ok &= rc == MPI_SUCCESS;
    mok(ok, "MPI_Startall of persistent requests (%s and host), completed by %s with ordinary "
            "and staged requests and an inactive persistent one, twice",
        kname(D), fn[form]);
    for (int i = 0; i < 4; i++) {
        xfree(rkind[i], rb[i]);
        xfree(skind[i], sb[i]);
    }
    xfree(D, idle);
    dev_reset();
}

/* MPI_Request_free of a persistent request never started, and of one after
 * a cancelled start; and of an active persistent send: its message still
 * arrives. */
static void t_persist_free(int kind)
{
    size_t n = chunk + 5 > max_bytes ? max_bytes : chunk + 5;
    void *sb = xalloc(kind, n), *rb = xalloc(kind, n);
    fill(kind, sb, n, me + 50);
    set(kind, rb, n, 0);
    MPI_Request q, h;
    MPI_Status st;
    int rc = MPI_Recv_init(rb, (int)n, MPI_BYTE, left, 740, MPI_COMM_WORLD, &q);
    rc |= MPI_Request_free(&q);
    int ok = rc == MPI_SUCCESS && q == MPI_REQUEST_NULL;
    /* Started, cancelled (nothing is sent on that tag), waited: inactive. */
    rc = MPI_Recv_init(rb, (int)n, MPI_BYTE, left, 741, MPI_COMM_WORLD, &q);
    h = q;
    rc |= MPI_Start(&q);
    rc |= MPI_Cancel(&q);
    rc |= MPI_Wait(&q, &st);
    int c = 0;
    MPI_Test_cancelled(&st, &c);
    ok &= rc == MPI_SUCCESS && c && q == h;
    rc = MPI_Request_free(&q);
    ok &= rc == MPI_SUCCESS && q == MPI_REQUEST_NULL;
    /* Freed while its send is active: its message still arrives. */
    rc = MPI_Send_init(sb, (int)n, MPI_BYTE, right, 742, MPI_COMM_WORLD, &q);
    rc |= MPI_Start(&q);
    rc |= MPI_Request_free(&q);
    rc |= MPI_Recv(rb, (int)n, MPI_BYTE, left, 742, MPI_COMM_WORLD, &st);
    long bad = check(kind, rb, n, left + 50, n, 0);
    ok &= rc == MPI_SUCCESS && q == MPI_REQUEST_NULL && bad < 0;
    mok(ok, "MPI_Request_free of %s persistent requests: inactive (never started, and after a "
            "cancelled start), and active (the %zu-byte message arrives)",
        kname(kind), n);
    MPI_Barrier(MPI_COMM_WORLD);
    xfree(kind, sb);
    xfree(kind, rb);
    dev_reset();
}

/* ---- matched probes ---- */

/* Mprobe (or Improbe) from any source, then Mrecv (or Imrecv) into a
 * buffer with room to spare: the probe's count is the message's, the data
 * is right and nothing past it is written. pf: MPI_Probe first (a 32-byte
 * message it took must go to the matched probe). */
static void t_mprobe(int sk, int rk, size_t n, int nb, int pf)
{
    size_t cap = n + 64;
    void *sb = xalloc(sk, n), *rb = xalloc(rk, cap);
    fill(sk, sb, n, me + 70);
    set(rk, rb, cap, 0xA5);
    MPI_Request sr, rr;
    MPI_Message m = MPI_MESSAGE_NULL;
    MPI_Status st, st2;
    memset(&st, 0, sizeof st);
    memset(&st2, 0, sizeof st2);
    int rc = MPI_Isend(sb, (int)n, MPI_BYTE, right, 750, MPI_COMM_WORLD, &sr);
    if (pf)
        rc |= MPI_Probe(left, 750, MPI_COMM_WORLD, &st);
    if (nb) {
        int flag = 0;
        while (!flag && rc == MPI_SUCCESS)
            rc = MPI_Improbe(MPI_ANY_SOURCE, 750, MPI_COMM_WORLD, &flag, &m, &st);
    } else {
        rc |= MPI_Mprobe(MPI_ANY_SOURCE, 750, MPI_COMM_WORLD, &m, &st);
    }
    int cnt = -1, cnt2 = -1;
    MPI_Get_count(&st, MPI_BYTE, &cnt);
    if (nb) {
        rc |= MPI_Imrecv(rb, (int)cap, MPI_BYTE, &m, &rr);
        rc |= MPI_Wait(&rr, &st2);
    } else {
        rc |= MPI_Mrecv(rb, (int)cap, MPI_BYTE, &m, &st2);
    }
    rc |= MPI_Wait(&sr, MPI_STATUS_IGNORE);
    MPI_Get_count(&st2, MPI_BYTE, &cnt2);
    long bad = check(rk, rb, n, left + 70, cap, 0xA5);
    mok(rc == MPI_SUCCESS && cnt == (int)n && cnt2 == (int)n && bad < 0 &&
            m == MPI_MESSAGE_NULL && st.MPI_SOURCE == left && st2.MPI_SOURCE == left &&
            st2.MPI_TAG == 750,
        "%s%s(ANY_SOURCE) then %s: %s to %s, %zu bytes (probe said %d, receive %d, bad byte "
        "%ld)",
        pf ? "MPI_Probe, " : "", nb ? "MPI_Improbe" : "MPI_Mprobe", nb ? "MPI_Imrecv" : "MPI_Mrecv",
        kname(sk), kname(rk), n, cnt, cnt2, bad);
    xfree(sk, sb);
    xfree(rk, rb);
    dev_reset();
}

/* A struct with holes ({int; double; char} at 0, 8 and 20, extent 32)
 * received through a matched probe into a device buffer: the data in
 * place, every hole byte still the sentinel. */
static int in_struct(size_t i)
{
    size_t o = i % 32;
    return o < 4 || (o >= 8 && o < 16) || o == 20;
}

static void t_mprobe_struct(int sk, int nel, int nb)
{
    int D = host_only ? HOST : DEV;
    int bl[3] = {1, 1, 1};
    MPI_Aint dp[3] = {0, 8, 20};
    MPI_Datatype ty[3] = {MPI_INT, MPI_DOUBLE, MPI_CHAR}, s0, st_t;
    MPI_Type_create_struct(3, bl, dp, ty, &s0);
    MPI_Type_create_resized(s0, 0, 32, &st_t);
    MPI_Type_commit(&st_t);
    MPI_Type_free(&s0);
    size_t span = (size_t)nel * 32;
    void *sb = xalloc(sk, span), *rb = xalloc(D, span);
    fill(sk, sb, span, me + 90);
    set(D, rb, span, 0xEE);
    MPI_Request sr, rr;
    MPI_Message m;
    MPI_Status st, st2;
    int rc = MPI_Isend(sb, nel, st_t, right, 760, MPI_COMM_WORLD, &sr), flag = 0;
    if (nb) {
        while (!flag && rc == MPI_SUCCESS)
            rc = MPI_Improbe(MPI_ANY_SOURCE, 760, MPI_COMM_WORLD, &flag, &m, &st);
        rc |= MPI_Imrecv(rb, nel, st_t, &m, &rr);
        rc |= MPI_Wait(&rr, &st2);
    } else {
        rc |= MPI_Mprobe(MPI_ANY_SOURCE, 760, MPI_COMM_WORLD, &m, &st);
        rc |= MPI_Mrecv(rb, nel, st_t, &m, &st2);
    }
    rc |= MPI_Wait(&sr, MPI_STATUS_IGNORE);
    unsigned char *h = malloc(span);
    from_buf(D, h, rb, span);
    long bad = -1;
    for (size_t i = 0; i < span && bad < 0; i++)
        if (h[i] != (in_struct(i) ? pat(left + 90, i) : 0xEE))
            bad = (long)i;
    free(h);
    int cnt = -1;
    MPI_Get_count(&st2, st_t, &cnt);
    mok(rc == MPI_SUCCESS && bad < 0 && cnt == nel && st2.MPI_SOURCE == left,
        "%s/%s of %d structs with holes, %s to %s: data in place, holes untouched (bad byte %ld, "
        "count %d)",
        nb ? "Improbe" : "Mprobe", nb ? "Imrecv" : "Mrecv", nel, kname(sk), kname(D), bad, cnt);
    MPI_Type_free(&st_t);
    xfree(sk, sb);
    xfree(D, rb);
    dev_reset();
}

/* Matched probes of MPI_PROC_NULL: MPI_MESSAGE_NO_PROC, whose receive into
 * a device buffer writes nothing and gives the null process's status. */
static void t_mprobe_noproc(void)
{
    int D = host_only ? HOST : DEV;
    void *rb = xalloc(D, 100);
    set(D, rb, 100, 0x3C);
    MPI_Message m = MPI_MESSAGE_NULL;
    MPI_Status st;
    MPI_Request r;
    int flag = 0, cnt = -1, ok;
    int rc = MPI_Mprobe(MPI_PROC_NULL, 5, MPI_COMM_WORLD, &m, &st);
    ok = rc == MPI_SUCCESS && m == MPI_MESSAGE_NO_PROC;
    rc = MPI_Mrecv(rb, 100, MPI_BYTE, &m, &st);
    MPI_Get_count(&st, MPI_BYTE, &cnt);
    ok &= rc == MPI_SUCCESS && m == MPI_MESSAGE_NULL && cnt == 0 &&
          st.MPI_SOURCE == MPI_PROC_NULL;
    rc = MPI_Improbe(MPI_PROC_NULL, 5, MPI_COMM_WORLD, &flag, &m, &st);
    ok &= rc == MPI_SUCCESS && flag && m == MPI_MESSAGE_NO_PROC;
    rc = MPI_Imrecv(rb, 100, MPI_BYTE, &m, &r);
    rc |= MPI_Wait(&r, &st);
    MPI_Get_count(&st, MPI_BYTE, &cnt);
    ok &= rc == MPI_SUCCESS && m == MPI_MESSAGE_NULL && cnt == 0 &&
          st.MPI_SOURCE == MPI_PROC_NULL && check(D, rb, 0, 0, 100, 0x3C) < 0;
    mok(ok, "MPI_Mprobe/MPI_Improbe of MPI_PROC_NULL: MPI_MESSAGE_NO_PROC, received into a %s "
            "buffer untouched",
        kname(D));
    xfree(D, rb);
    dev_reset();
}

/* ---- collectives ---- */

static int *ibuf(int kind, size_t n, int (*f)(size_t), int **host_p)
{
    int *h = malloc((n ? n : 1) * sizeof(int));
    for (size_t i = 0; i < n; i++)
        h[i] = f ? f(i) : -1;
    int *d = xalloc(kind, n * sizeof(int));
    to_buf(kind, d, h, n * sizeof(int));
    if (host_p)
        *host_p = h;
    else
        free(h);
    return d;
}

static int *back(int kind, const int *d, size_t n)
{
    int *h = malloc((n ? n : 1) * sizeof(int));
    from_buf(kind, h, d, n * sizeof(int));
    return h;
}

static int g_rank;
static int val_rank(size_t i) { return g_rank * 100000 + (int)(i % 100000); }
static int val_one(size_t i) { return (int)(i % 1000) + 1; }

/* Sum over ranks of val_rank(i). */
static int sum_ranks(size_t i, int upto)
{
    int s = 0;
    for (int r = 0; r < upto; r++)
        s += r * 100000 + (int)(i % 100000);
    return s;
}

/* CUDA IPC between ranks of the node (default on when they can map each
 * other's memory): a buffer freed and allocated again (at the same address,
 * as cudaMalloc tends to do) with other contents must never be read
 * through the old mapping; several allocations in turn (the cache's bound
 * with RANKMEM_STAGING_IPC_CACHE); nonblocking and blocking forms. Pairs
 * of ranks (even sends to odd). */
static void t_ipc(size_t n)
{
    int even = me % 2 == 0, peer = even ? me + 1 : me - 1;
    if (peer >= np)
        peer = -1; /* the last of an odd number: joins the barriers only */
    long bad = -1;
    int rc = MPI_SUCCESS;
    void *rbuf = even || peer < 0 ? NULL : xalloc(DEV, n);
    for (int round = 0; round < 6; round++) {
        void *sbuf = NULL;
        if (peer < 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            continue;
        }
        if (even) {
            dev_reset();
            sbuf = xalloc(DEV, n);
#ifdef RKT_FAKE
            rk_stg_fake_ipc_renew(); /* a new allocation at the same address */
#endif
            fill(DEV, sbuf, n, 40 + round);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (even) {
            if (round % 2 == 0) {
                rc |= MPI_Send(sbuf, (int)n, MPI_BYTE, peer, 900 + round, MPI_COMM_WORLD);
            } else {
                MPI_Request r;
                rc |= MPI_Isend(sbuf, (int)n, MPI_BYTE, peer, 900 + round, MPI_COMM_WORLD, &r);
                rc |= MPI_Wait(&r, MPI_STATUS_IGNORE);
            }
            xfree(DEV, sbuf);
        } else {
            set(DEV, rbuf, n, 0);
            if (round % 2 == 0) {
                rc |= MPI_Recv(rbuf, (int)n, MPI_BYTE, peer, 900 + round, MPI_COMM_WORLD,
                               MPI_STATUS_IGNORE);
            } else {
                MPI_Request r;
                rc |= MPI_Irecv(rbuf, (int)n, MPI_BYTE, peer, 900 + round, MPI_COMM_WORLD, &r);
                rc |= MPI_Wait(&r, MPI_STATUS_IGNORE);
            }
            long b = check(DEV, rbuf, n, 40 + round, n, 0);
            if (b >= 0 && bad < 0)
                bad = b;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    mok(rc == MPI_SUCCESS && bad < 0,
        "IPC: 6 allocations in turn at one address, %zu bytes each, blocking and nonblocking: "
        "each received as sent (first bad byte %ld)", n, bad);
#ifdef RKT_FAKE
    rk_ipc_stats_t st;
    rk_ipc_stats(&st);
    long got[3] = {(long)st.opened, (long)st.stale, rk_ipc_on}, mn[3], mx[3];
    if (even || peer < 0)
        got[0] = got[1] = 5; /* senders map nothing: neutral */
    MPI_Allreduce(got, mn, 3, MPI_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(got, mx, 3, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    if (mx[2] && getenv("RKT_FAKE_MAP_FAIL"))
        mdiag("mappings refused on purpose: the mapping counts were not checked");
    else if (mx[2] && spans_nodes())
        mdiag("pretend nodes: a peer may be on another node, the mapping counts were not checked");
    else if (mx[2])
        mok(mn[2] == 1 && mn[0] >= 5 && mn[1] >= 5,
            "IPC: each receiver mapped every new allocation afresh (at least 5 opened and 5 "
            "replaced; min %ld and %ld)", mn[0], mn[1]);
    else
        mdiag("IPC is off here: the mapping counts were not checked");
#endif
    MPI_Barrier(MPI_COMM_WORLD);
    if (rbuf)
        xfree(DEV, rbuf);
    dev_reset();
}

/* A collective test's buffer kinds on this rank (send sk, receive rk) and
 * their name. mixed 0: every rank's buffers on the device; 1: even ranks
 * device, odd host; 2: sends device, receives host; -1: all host. */
static const char *coll_kinds(int mixed, int *sk, int *rk)
{
    *sk = mixed == 0 ? DEV : mixed == 1 ? (me % 2 ? HOST : DEV) : mixed == 2 ? DEV : HOST;
    *rk = mixed == 0 ? DEV : mixed == 1 ? (me % 2 ? HOST : DEV) : HOST;
    return mixed == 0   ? "device"
           : mixed == 1 ? "device/host by rank"
           : mixed == 2 ? "device to host"
                        : "host";
}

static void t_coll(int mixed, size_t n)
{
    int sk, rk;
    const char *mk = coll_kinds(mixed, &sk, &rk);
    g_rank = me;
    int root = np > 1 ? 1 : 0, ok, rc;
    int *h, *s, *r;

    /* Bcast */
    s = ibuf(rk, n, me == root ? val_rank : NULL, NULL);
    g_rank = root;
    rc = MPI_Bcast(s, (int)n, MPI_INT, root, MPI_COMM_WORLD);
    h = back(rk, s, n);
    ok = rc == MPI_SUCCESS;
    for (size_t i = 0; i < n && ok; i++)
        ok = h[i] == val_rank(i);
    mok(ok, "Bcast of %zu ints (%s)", n, mk);
    free(h);
    g_rank = me;

    /* Reduce, Allreduce, Scan, Exscan; with MPI_IN_PLACE */
    for (int inplace = 0; inplace < 2; inplace++) {
        s = ibuf(sk, n, val_rank, NULL);
        r = ibuf(rk, n, inplace ? val_rank : NULL, NULL);
        rc = MPI_Reduce(inplace && me == 0 ? MPI_IN_PLACE : (inplace ? r : s), r, (int)n, MPI_INT,
                        MPI_SUM, 0, MPI_COMM_WORLD);
        ok = rc == MPI_SUCCESS;
        if (me == 0) {
            h = back(rk, r, n);
            for (size_t i = 0; i < n && ok; i++)
                ok = h[i] == sum_ranks(i, np);
            free(h);
        }
        mok(ok, "Reduce%s of %zu ints (%s)", inplace ? " (IN_PLACE)" : "", n, mk);
        r = ibuf(rk, n, inplace ? val_rank : NULL, NULL);
        rc = MPI_Allreduce(inplace ? MPI_IN_PLACE : s, r, (int)n, MPI_INT, MPI_SUM,
                           MPI_COMM_WORLD);
        h = back(rk, r, n);
        ok = rc == MPI_SUCCESS;
        for (size_t i = 0; i < n && ok; i++)
            ok = h[i] == sum_ranks(i, np);
        free(h);
        mok(ok, "Allreduce%s of %zu ints (%s)", inplace ? " (IN_PLACE)" : "", n, mk);
        r = ibuf(rk, n, inplace ? val_rank : NULL, NULL);
        rc = MPI_Scan(inplace ? MPI_IN_PLACE : s, r, (int)n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        h = back(rk, r, n);
        ok = rc == MPI_SUCCESS;
        for (size_t i = 0; i < n && ok; i++)
            ok = h[i] == sum_ranks(i, me + 1);
        free(h);
        mok(ok, "Scan%s of %zu ints (%s)", inplace ? " (IN_PLACE)" : "", n, mk);
        r = ibuf(rk, n, inplace ? val_rank : NULL, NULL);
        rc = MPI_Exscan(inplace ? MPI_IN_PLACE : s, r, (int)n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        h = back(rk, r, n);
        ok = rc == MPI_SUCCESS;
        for (size_t i = 0; i < n && ok && me > 0; i++)
            ok = h[i] == sum_ranks(i, me);
        free(h);
        mok(ok, "Exscan%s of %zu ints (%s)", inplace ? " (IN_PLACE)" : "", n, mk);
        dev_reset();
    }

    /* Gather / Scatter / Allgather / Alltoall (+ IN_PLACE where allowed) */
    size_t m = n / (size_t)np + 1;
    for (int inplace = 0; inplace < 2; inplace++) {
        s = ibuf(sk, m, val_rank, NULL);
        int *hr0 = malloc(m * (size_t)np * sizeof(int));
        for (int q = 0; q < np; q++)
            for (size_t i = 0; i < m; i++)
                hr0[(size_t)q * m + i] = q == me ? val_rank(i) : -1;
        r = xalloc(rk, m * (size_t)np * sizeof(int));
        to_buf(rk, r, hr0, m * (size_t)np * sizeof(int));
        rc = MPI_Gather(inplace && me == root ? MPI_IN_PLACE : s, (int)m, MPI_INT, r, (int)m,
                        MPI_INT, root, MPI_COMM_WORLD);
        ok = rc == MPI_SUCCESS;
        if (me == root) {
            h = back(rk, r, m * (size_t)np);
            for (int q = 0; q < np && ok; q++)
                for (size_t i = 0; i < m && ok; i++)
                    ok = h[(size_t)q * m + i] == q * 100000 + (int)(i % 100000);
            free(h);
        }
        mok(ok, "Gather%s of %zu ints per rank (%s)", inplace ? " (IN_PLACE)" : "", m, mk);

        to_buf(rk, r, hr0, m * (size_t)np * sizeof(int));
        rc = MPI_Allgather(inplace ? MPI_IN_PLACE : s, (int)m, MPI_INT, r, (int)m, MPI_INT,
                           MPI_COMM_WORLD);
        h = back(rk, r, m * (size_t)np);
        ok = rc == MPI_SUCCESS;
        for (int q = 0; q < np && ok; q++)
            for (size_t i = 0; i < m && ok; i++)
                ok = h[(size_t)q * m + i] == q * 100000 + (int)(i % 100000);
        free(h);
        mok(ok, "Allgather%s of %zu ints per rank (%s)", inplace ? " (IN_PLACE)" : "", m, mk);

        /* Scatter from root's full buffer (of the send kind). */
        int *hs = malloc(m * (size_t)np * sizeof(int));
        for (int q = 0; q < np; q++)
            for (size_t i = 0; i < m; i++)
                hs[(size_t)q * m + i] = q * 7 + (int)i;
        int *sfull = xalloc(sk, m * (size_t)np * sizeof(int));
        to_buf(sk, sfull, hs, m * (size_t)np * sizeof(int));
        int *rr = ibuf(rk, m, NULL, NULL);
        rc = MPI_Scatter(sfull, (int)m, MPI_INT, inplace && me == root ? MPI_IN_PLACE : rr,
                         (int)m, MPI_INT, root, MPI_COMM_WORLD);
        ok = rc == MPI_SUCCESS;
        if (!(inplace && me == root)) {
            h = back(rk, rr, m);
            for (size_t i = 0; i < m && ok; i++)
                ok = h[i] == me * 7 + (int)i;
            free(h);
        }
        mok(ok, "Scatter%s of %zu ints per rank (%s)", inplace ? " (IN_PLACE)" : "", m, mk);

        /* Alltoall: block q of rank p's send goes to rank q's block p. */
        for (int q = 0; q < np; q++)
            for (size_t i = 0; i < m; i++)
                hs[(size_t)q * m + i] = me * 1000 + q * 10 + (int)(i % 10);
        to_buf(sk, sfull, hs, m * (size_t)np * sizeof(int));
        if (inplace)
            to_buf(rk, r, hs, m * (size_t)np * sizeof(int));
        rc = MPI_Alltoall(inplace ? MPI_IN_PLACE : sfull, (int)m, MPI_INT, r, (int)m, MPI_INT,
                          MPI_COMM_WORLD);
        h = back(rk, r, m * (size_t)np);
        ok = rc == MPI_SUCCESS;
        for (int q = 0; q < np && ok; q++)
            for (size_t i = 0; i < m && ok; i++)
                ok = h[(size_t)q * m + i] == q * 1000 + me * 10 + (int)(i % 10);
        free(h);
        mok(ok, "Alltoall%s of %zu ints per pair (%s)", inplace ? " (IN_PLACE)" : "", m, mk);

        /* Reduce_scatter_block */
        for (size_t i = 0; i < m * (size_t)np; i++)
            hs[i] = me + (int)(i % 1000);
        to_buf(sk, sfull, hs, m * (size_t)np * sizeof(int));
        if (inplace)
            to_buf(rk, r, hs, m * (size_t)np * sizeof(int));
        int *rb2 = inplace ? r : ibuf(rk, m, NULL, NULL);
        rc = MPI_Reduce_scatter_block(inplace ? MPI_IN_PLACE : sfull, rb2, (int)m, MPI_INT,
                                      MPI_SUM, MPI_COMM_WORLD);
        h = back(rk, rb2, m);
        ok = rc == MPI_SUCCESS;
        for (size_t i = 0; i < m && ok; i++)
            ok = h[i] == np * (np - 1) / 2 + np * (int)(((size_t)me * m + i) % 1000);
        free(h);
        mok(ok, "Reduce_scatter_block%s of %zu ints per rank (%s)", inplace ? " (IN_PLACE)" : "",
            m, mk);
        free(hs);
        free(hr0);
        dev_reset();
    }

    /* v-variants, with a hole of 3 elements after each block (kept). */
    {
        int *cnt = malloc((size_t)np * sizeof(int)), *dsp = malloc((size_t)np * sizeof(int));
        size_t tot = 0;
        for (int q = 0; q < np; q++) {
            cnt[q] = (int)(m + (size_t)q);
            dsp[q] = (int)tot;
            tot += (size_t)cnt[q] + 3;
        }
        int *hr0 = malloc(tot * sizeof(int));
        for (size_t i = 0; i < tot; i++)
            hr0[i] = -9;
        size_t mine = (size_t)cnt[me];
        s = ibuf(sk, mine, val_rank, NULL);
        r = xalloc(rk, tot * sizeof(int));
        to_buf(rk, r, hr0, tot * sizeof(int));
        rc = MPI_Gatherv(s, (int)mine, MPI_INT, r, cnt, dsp, MPI_INT, root, MPI_COMM_WORLD);
        ok = rc == MPI_SUCCESS;
        if (me == root) {
            h = back(rk, r, tot);
            for (int q = 0; q < np && ok; q++) {
                for (int i = 0; i < cnt[q] && ok; i++)
                    ok = h[dsp[q] + i] == q * 100000 + i % 100000;
                for (int i = 0; i < 3 && ok; i++)
                    ok = h[dsp[q] + cnt[q] + i] == -9;
            }
            free(h);
        }
        mok(ok, "Gatherv with holes (%s)", mk);
        to_buf(rk, r, hr0, tot * sizeof(int));
        rc = MPI_Allgatherv(s, (int)mine, MPI_INT, r, cnt, dsp, MPI_INT, MPI_COMM_WORLD);
        h = back(rk, r, tot);
        ok = rc == MPI_SUCCESS;
        for (int q = 0; q < np && ok; q++) {
            for (int i = 0; i < cnt[q] && ok; i++)
                ok = h[dsp[q] + i] == q * 100000 + i % 100000;
            for (int i = 0; i < 3 && ok; i++)
                ok = h[dsp[q] + cnt[q] + i] == -9;
        }
        free(h);
        mok(ok, "Allgatherv with holes (%s)", mk);
        /* Scatterv from root: block q holds q*11+i. */
        int *hs = malloc(tot * sizeof(int));
        for (int q = 0; q < np; q++)
            for (int i = 0; i < cnt[q] + 3; i++)
                hs[dsp[q] + i] = q * 11 + i;
        int *sv = xalloc(sk, tot * sizeof(int));
        to_buf(sk, sv, hs, tot * sizeof(int));
        int *rv = ibuf(rk, mine, NULL, NULL);
        rc = MPI_Scatterv(sv, cnt, dsp, MPI_INT, rv, (int)mine, MPI_INT, root, MPI_COMM_WORLD);
        h = back(rk, rv, mine);
        ok = rc == MPI_SUCCESS;
        for (size_t i = 0; i < mine && ok; i++)
            ok = h[i] == me * 11 + (int)i;
        free(h);
        mok(ok, "Scatterv (%s)", mk);
        /* Alltoallv: rank p sends q*?: counts scnt[q] = m + p (what q expects from p:
         * q's rcnt[p] = m + p). */
        int *scnt = malloc((size_t)np * sizeof(int)), *sdsp = malloc((size_t)np * sizeof(int));
        int *rcnt = malloc((size_t)np * sizeof(int)), *rdsp = malloc((size_t)np * sizeof(int));
        size_t stot = 0, rtot = 0;
        for (int q = 0; q < np; q++) {
            scnt[q] = (int)m + me;
            sdsp[q] = (int)stot;
            stot += (size_t)scnt[q];
            rcnt[q] = (int)m + q;
            rdsp[q] = (int)rtot;
            rtot += (size_t)rcnt[q] + 2;
        }
        int *hsa = malloc(stot * sizeof(int)), *hra = malloc(rtot * sizeof(int));
        for (int q = 0; q < np; q++)
            for (int i = 0; i < scnt[q]; i++)
                hsa[sdsp[q] + i] = me * 1000 + q * 10 + i % 10;
        for (size_t i = 0; i < rtot; i++)
            hra[i] = -3;
        int *sa = xalloc(sk, stot * sizeof(int)), *ra = xalloc(rk, rtot * sizeof(int));
        to_buf(sk, sa, hsa, stot * sizeof(int));
        to_buf(rk, ra, hra, rtot * sizeof(int));
        rc = MPI_Alltoallv(sa, scnt, sdsp, MPI_INT, ra, rcnt, rdsp, MPI_INT, MPI_COMM_WORLD);
        h = back(rk, ra, rtot);
        ok = rc == MPI_SUCCESS;
        for (int q = 0; q < np && ok; q++) {
            for (int i = 0; i < rcnt[q] && ok; i++)
                ok = h[rdsp[q] + i] == q * 1000 + me * 10 + i % 10;
            for (int i = 0; i < 2 && ok; i++)
                ok = h[rdsp[q] + rcnt[q] + i] == -3;
        }
        free(h);
        mok(ok, "Alltoallv with holes (%s)", mk);
        /* Reduce_scatter with counts cnt[] */
        size_t ctot = 0;
        for (int q = 0; q < np; q++)
            ctot += (size_t)cnt[q];
        int *hrs = malloc(ctot * sizeof(int));
        for (size_t i = 0; i < ctot; i++)
            hrs[i] = me + (int)(i % 777);
        int *srs = xalloc(sk, ctot * sizeof(int));
        to_buf(sk, srs, hrs, ctot * sizeof(int));
        int *rrs = ibuf(rk, mine, NULL, NULL);
        rc = MPI_Reduce_scatter(srs, rrs, cnt, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        h = back(rk, rrs, mine);
        ok = rc == MPI_SUCCESS;
        size_t off = 0;
        for (int q = 0; q < me; q++)
            off += (size_t)cnt[q];
        for (size_t i = 0; i < mine && ok; i++)
            ok = h[i] == np * (np - 1) / 2 + np * (int)((off + i) % 777);
        free(h);
        mok(ok, "Reduce_scatter (%s)", mk);
        free(hrs);
        free(hsa);
        free(hra);
        free(scnt), free(sdsp), free(rcnt), free(rdsp);
        free(hs);
        free(hr0);
        free(cnt);
        free(dsp);
        dev_reset();
    }

    /* Bcast of a vector type into a buffer with holes: holes kept. */
    {
        int nel = (int)(n < 1000 ? n : 1000);
        MPI_Datatype vec;
        MPI_Type_vector(nel, 1, 2, MPI_INT, &vec);
        MPI_Type_commit(&vec);
        size_t span = (size_t)nel * 2 - 1;
        int *hv = malloc(span * sizeof(int));
        for (size_t i = 0; i < span; i++)
            hv[i] = me == root ? (int)i * 5 : (i % 2 ? -4 : 0);
        if (me == root)
            for (size_t i = 1; i < span; i += 2)
                hv[i] = 99; /* holes at the root hold something else */
        int *dv = xalloc(rk, span * sizeof(int));
        to_buf(rk, dv, hv, span * sizeof(int));
        rc = MPI_Bcast(dv, 1, vec, root, MPI_COMM_WORLD);
        h = back(rk, dv, span);
        ok = rc == MPI_SUCCESS;
        for (size_t i = 0; i < span && ok; i++)
            ok = h[i] == (i % 2 == 0 ? (int)i * 5 : me == root ? 99 : -4);
        free(h);
        free(hv);
        MPI_Type_free(&vec);
        mok(ok, "Bcast of a vector of %d ints: holes untouched (%s)", nel, mk);
        dev_reset();
    }
    (void)val_one;
}

/* Persistent collectives (MPI 4's MPI_*_init, Open MPI 4's MPIX_*_init):
 * an Allreduce (IN_PLACE or not), a Bcast and an Alltoall made once and
 * started three rounds with new contents each time (MPI_Start and MPI_Wait,
 * MPI_Startall and MPI_Waitall, MPI_Startall and MPI_Test loops); each
 * result checked; then freed. */
#if MPI_VERSION >= 4
#define PCOLL(x) MPI_##x##_init
#elif defined(OMPI_HAVE_MPI_EXT_PCOLLREQ) && OMPI_HAVE_MPI_EXT_PCOLLREQ
#define PCOLL(x) MPIX_##x##_init
#endif
#ifdef PCOLL
static void t_pcoll(int mixed, size_t n, int inplace)
{
    int sk, rk;
    const char *mk = coll_kinds(mixed, &sk, &rk);
    int root = np > 1 ? 1 : 0;
    size_t per = n / (size_t)np ? n / (size_t)np : 1, na = per * (size_t)np;
    int *hs = malloc(n * sizeof(int)), *hb = malloc(n * sizeof(int)),
        *ha = malloc(na * sizeof(int));
    int *s = xalloc(sk, n * sizeof(int)), *r = xalloc(rk, n * sizeof(int));
    int *b = xalloc(rk, n * sizeof(int));
    int *as = xalloc(sk, na * sizeof(int)), *ar = xalloc(rk, na * sizeof(int));
    MPI_Request q[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int rc = PCOLL(Allreduce)(inplace ? MPI_IN_PLACE : s, r, (int)n, MPI_INT, MPI_SUM,
                              MPI_COMM_WORLD, MPI_INFO_NULL, &q[0]);
    rc |= PCOLL(Bcast)(b, (int)n, MPI_INT, root, MPI_COMM_WORLD, MPI_INFO_NULL, &q[1]);
    rc |= PCOLL(Alltoall)(as, (int)per, MPI_INT, ar, (int)per, MPI_INT, MPI_COMM_WORLD,
                          MPI_INFO_NULL, &q[2]);
    int ok = rc == MPI_SUCCESS;
    uint64_t m0 = 0, m1 = 0; /* collectives staged: the device ones must be */
#ifdef RKT_FAKE
    rk_mpi_staging_counters(NULL, &m0, NULL);
#endif
    for (int round = 0; round < 3 && ok; round++) {
        for (size_t i = 0; i < n; i++) {
            hs[i] = me * 100000 + (int)(i % 100000) + round * 7;
            hb[i] = me == root ? (int)i * 3 + round : -1;
        }
        to_buf(inplace ? rk : sk, inplace ? (void *)r : (void *)s, hs, n * sizeof(int));
        to_buf(rk, b, hb, n * sizeof(int));
        for (size_t i = 0; i < na; i++)
            ha[i] = me * 1000 + (int)(i / per) * 10 + round; /* block j goes to rank j */
        to_buf(sk, as, ha, na * sizeof(int));
        if (round == 0) {
            for (int k = 0; k < 3; k++)
                rc |= MPI_Start(&q[k]);
            for (int k = 0; k < 3; k++)
                rc |= MPI_Wait(&q[k], MPI_STATUS_IGNORE);
        } else if (round == 1) {
            MPI_Status sts[3];
            rc |= MPI_Startall(3, q);
            rc |= MPI_Waitall(3, q, sts);
        } else {
            /* MPI_Test each (MPICH 4.0's MPI_Testall fails on its own
             * persistent collectives, which host buffers get without staging). */
            rc |= MPI_Startall(3, q);
            for (int k = 0; k < 3; k++) {
                int flag = 0;
                while (!flag && rc == MPI_SUCCESS)
                    rc |= MPI_Test(&q[k], &flag, MPI_STATUS_IGNORE);
            }
        }
        ok = rc == MPI_SUCCESS;
        for (int k = 0; k < 3; k++)
            ok = ok && q[k] != MPI_REQUEST_NULL; /* persistent: the handles stay */
        from_buf(rk, hs, r, n * sizeof(int));
        for (size_t i = 0; i < n && ok; i++)
            ok = hs[i] == sum_ranks(i, np) + np * round * 7;
        from_buf(rk, hb, b, n * sizeof(int));
        for (size_t i = 0; i < n && ok; i++)
            ok = hb[i] == (int)i * 3 + round;
        from_buf(rk, ha, ar, na * sizeof(int));
        for (size_t i = 0; i < na && ok; i++)
            ok = ha[i] == (int)(i / per) * 1000 + me * 10 + round; /* from rank i / per */
    }
#ifdef RKT_FAKE
    rk_mpi_staging_counters(NULL, &m1, NULL);
    if (sk == DEV || rk == DEV)
        ok = ok && m1 - m0 >= 3;
#else
    (void)m0, (void)m1;
#endif
    for (int k = 0; k < 3; k++)
        rc |= MPI_Request_free(&q[k]);
    ok = ok && rc == MPI_SUCCESS && q[0] == MPI_REQUEST_NULL && q[2] == MPI_REQUEST_NULL;
    mok(ok, "persistent Allreduce%s, Bcast and Alltoall of %zu ints, 3 rounds (%s)",
        inplace ? " (IN_PLACE)" : "", n, mk);
    free(hs), free(hb), free(ha);
    xfree(sk, s), xfree(rk, r), xfree(rk, b), xfree(sk, as), xfree(rk, ar);
    dev_reset();
}
#endif

#ifdef RKT_FAKE
/* Peer buffers mapped so far, opened or found in the cache. */
static long ipc_maps(void)
{
    rk_ipc_stats_t st;
    rk_ipc_stats(&st);
    return (long)(st.opened + st.hits);
}
#endif

/* Bcast, Allgather, Alltoall, Reduce and Allreduce of n ints per rank on
 * comm, at a size from which collectives among the ranks of a node go
 * through CUDA IPC: each result checked; in the test backend, whether the
 * ranks mapped each other's buffers. mixed: rank 0's buffers on the host,
 * the others' on the device (then every rank stages: nothing mapped). */
static void t_coll_ipc(MPI_Comm comm, const char *cname, size_t n, int mixed)
{
    int cme = 0, cnp = 1;
    MPI_Comm_rank(comm, &cme);
    MPI_Comm_size(comm, &cnp);
    int k = mixed && cme == 0 ? HOST : DEV;
    const char *mk = mixed ? "rank 0 host, others device" : "device";
    size_t all = n * (size_t)cnp;
#ifdef RKT_FAKE
    long m0 = ipc_maps();
#endif
    int rc, ok, root = cnp - 1;
    int *h, *hv, *s, *r;

    /* Bcast from the last rank */
    g_rank = root;
    s = ibuf(k, n, cme == root ? val_rank : NULL, NULL);
    rc = MPI_Bcast(s, (int)n, MPI_INT, root, comm);
    h = back(k, s, n);
    ok = rc == MPI_SUCCESS;
    for (size_t i = 0; i < n && ok; i++)
        ok = h[i] == val_rank(i);
    free(h);
    xfree(k, s);
    mok(ok, "%s: Bcast of %zu ints (%s)", cname, n, mk);
    g_rank = cme;

    /* Allgather; in place, this rank's block is already in the receive buffer */
    for (int inplace = 0; inplace < 2; inplace++) {
        s = ibuf(k, n, val_rank, &hv);
        r = xalloc(k, all * sizeof(int));
        set(k, r, all * sizeof(int), 0xff);
        if (inplace)
            to_buf(k, r + (size_t)cme * n, hv, n * sizeof(int));
        rc = MPI_Allgather(inplace ? MPI_IN_PLACE : s, (int)n, MPI_INT, r, (int)n, MPI_INT, comm);
        h = back(k, r, all);
        ok = rc == MPI_SUCCESS;
        for (int q = 0; q < cnp && ok; q++)
            for (size_t i = 0; i < n && ok; i++)
                ok = h[(size_t)q * n + i] == q * 100000 + (int)(i % 100000);
        free(h);
        free(hv);
        xfree(k, s);
        xfree(k, r);
        mok(ok, "%s: Allgather%s of %zu ints per rank (%s)", cname, inplace ? " (IN_PLACE)" : "",
            n, mk);
    }

    /* Alltoall: block q of rank p's send buffer is block p of rank q's receive buffer */
    hv = malloc(all * sizeof(int));
    for (int q = 0; q < cnp; q++)
        for (size_t i = 0; i < n; i++)
            hv[(size_t)q * n + i] = cme * 1000 + q * 10 + (int)(i % 10);
    s = xalloc(k, all * sizeof(int));
    to_buf(k, s, hv, all * sizeof(int));
    r = xalloc(k, all * sizeof(int));
    set(k, r, all * sizeof(int), 0xff);
    rc = MPI_Alltoall(s, (int)n, MPI_INT, r, (int)n, MPI_INT, comm);
    h = back(k, r, all);
    ok = rc == MPI_SUCCESS;
    for (int p = 0; p < cnp && ok; p++)
        for (size_t i = 0; i < n && ok; i++)
            ok = h[(size_t)p * n + i] == p * 1000 + cme * 10 + (int)(i % 10);
    free(h);
    free(hv);
    xfree(k, s);
    xfree(k, r);
    mok(ok, "%s: Alltoall of %zu ints per rank (%s)", cname, n, mk);

    /* Reduce to rank 0 and Allreduce, sums of ints; in place too */
    for (int inplace = 0; inplace < 2; inplace++) {
        s = ibuf(k, n, val_rank, NULL);
        r = ibuf(k, n, inplace ? val_rank : NULL, NULL);
        rc = MPI_Reduce(inplace && cme == 0 ? MPI_IN_PLACE : inplace ? r : s, r, (int)n, MPI_INT,
                        MPI_SUM, 0, comm);
        ok = rc == MPI_SUCCESS;
        if (cme == 0) {
            h = back(k, r, n);
            for (size_t i = 0; i < n && ok; i++)
                ok = h[i] == sum_ranks(i, cnp);
            free(h);
        }
        mok(ok, "%s: Reduce%s of %zu ints (%s)", cname, inplace ? " (IN_PLACE)" : "", n, mk);
        xfree(k, r);
        r = ibuf(k, n, inplace ? val_rank : NULL, NULL);
        rc = MPI_Allreduce(inplace ? MPI_IN_PLACE : s, r, (int)n, MPI_INT, MPI_SUM, comm);
        h = back(k, r, n);
        ok = rc == MPI_SUCCESS;
        for (size_t i = 0; i < n && ok; i++)
            ok = h[i] == sum_ranks(i, cnp);
        free(h);
        xfree(k, s);
        xfree(k, r);
        mok(ok, "%s: Allreduce%s of %zu ints (%s)", cname, inplace ? " (IN_PLACE)" : "", n, mk);
    }

    /* Allreduce MAX of doubles */
    double *hd = malloc(n * sizeof(double)), *ds = xalloc(k, n * sizeof(double)),
           *dr = xalloc(k, n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        hd[i] = (double)((cme * 7919 + (int)i) % cnp) + 0.5 * (double)i;
    to_buf(k, ds, hd, n * sizeof(double));
    rc = MPI_Allreduce(ds, dr, (int)n, MPI_DOUBLE, MPI_MAX, comm);
    from_buf(k, hd, dr, n * sizeof(double));
    ok = rc == MPI_SUCCESS;
    for (size_t i = 0; i < n && ok; i++)
        ok = hd[i] == (double)(cnp - 1) + 0.5 * (double)i;
    free(hd);
    xfree(k, ds);
    xfree(k, dr);
    mok(ok, "%s: Allreduce MAX of %zu doubles (%s)", cname, n, mk);

#ifdef RKT_FAKE
    long d = ipc_maps() - m0, mn = 0, mx = 0;
    MPI_Allreduce(&d, &mn, 1, MPI_LONG, MPI_MIN, comm);
    MPI_Allreduce(&d, &mx, 1, MPI_LONG, MPI_MAX, comm);
    /* mok is collective over the world: the same branch on every rank. */
    int counted = rk_ipc_on && cnp > 1 && !spans_nodes(), everywhere = 0;
    MPI_Allreduce(&counted, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!everywhere)
        mdiag("%s: IPC off, a communicator of one rank or pretend nodes: the mappings were not "
              "counted", cname);
    else if (mixed)
        mok(mx == 0, "%s: a rank with host buffers: every rank staged (%ld mappings)", cname, mx);
    else
        mok(mn >= 7, "%s: the collectives went through IPC (each rank mapped peers' buffers at "
                     "least 7 times: min %ld)", cname, mn);
#endif
    dev_reset();
}

/* Calls the IPC path must leave to the staged path, on every rank alike: a
 * root out of range (MPI's error, errors returned, no hang) and a derived
 * datatype (the data right, nothing mapped). */
static void t_coll_ipc_fallback(size_t n)
{
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    g_rank = me;
    int *s = ibuf(DEV, n, val_rank, NULL);
    int rc = MPI_Bcast(s, (int)n, MPI_INT, np + 3, c);
    mok(rc != MPI_SUCCESS, "Bcast of %zu device ints from root %d of %d ranks: an error (%d)", n,
        np + 3, np, rc);
#ifdef RKT_FAKE
    long m0 = ipc_maps();
#endif
    MPI_Datatype two;
    MPI_Type_contiguous(2, MPI_INT, &two);
    MPI_Type_commit(&two);
    int *r = xalloc(DEV, n * (size_t)np * sizeof(int));
    rc = MPI_Allgather(s, (int)(n / 2), two, r, (int)(n / 2), two, c);
    int *h = back(DEV, r, n * (size_t)np);
    int ok = rc == MPI_SUCCESS;
    for (int q = 0; q < np && ok; q++)
        for (size_t i = 0; i < n / 2 * 2 && ok; i++)
            ok = h[(size_t)q * (n / 2 * 2) + i] == q * 100000 + (int)(i % 100000);
    free(h);
    MPI_Type_free(&two);
    mok(ok, "Allgather of %zu device ints per rank as pairs (a derived datatype): staged, right",
        n / 2 * 2);
#ifdef RKT_FAKE
    long d = ipc_maps() - m0, mx = 0;
    MPI_Allreduce(&d, &mx, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    mok(mx == 0, "... and no rank mapped a peer's buffer (%ld)", mx);
    if (np > 1 && ipc_all()) {
        /* Rank 1 cannot map the peers' new allocations: every rank stages
         * after all, with the data (in place too) as MPI gives it. */
        rk_stg_fake_ipc_renew();
        if (me == 1)
            rk_stg_fake_ipc_fail(1);
        g_rank = me;
        int *a = ibuf(DEV, n, val_rank, NULL);
        rc = MPI_Allreduce(MPI_IN_PLACE, a, (int)n, MPI_INT, MPI_SUM, c);
        h = back(DEV, a, n);
        ok = rc == MPI_SUCCESS;
        for (size_t i = 0; i < n && ok; i++)
            ok = h[i] == sum_ranks(i, np);
        free(h);
        r = xalloc(DEV, n * (size_t)np * sizeof(int));
        rc = MPI_Allgather(a, (int)n, MPI_INT, r, (int)n, MPI_INT, c);
        h = back(DEV, r, n * (size_t)np);
        ok &= rc == MPI_SUCCESS;
        for (int q = 0; q < np && ok; q++)
            for (size_t i = 0; i < n && ok; i++)
                ok = h[(size_t)q * n + i] == sum_ranks(i, np);
        free(h);
        if (me == 1)
            rk_stg_fake_ipc_fail(0);
        mok(ok, "Allreduce (IN_PLACE) and Allgather of %zu device ints, rank 1 unable to map "
                "its peers' memory: staged on every rank, right", n);
    }
#endif
    MPI_Comm_free(&c);
    xfree(DEV, s);
    xfree(DEV, r);
    dev_reset();
}

#ifdef RKT_FAKE
/* --vmm: one message from each even rank to the next odd one, both
 * buffers interior pointers of vmm blocks that span several handles;
 * what the receiver's IPC counters must show is said for each. */
static int vmm_round(void *sbuf, void *rbuf, size_t n, int seed, int peer, int even,
                     rk_ipc_stats_t *d)
{
    rk_ipc_stats_t s0, s1;
    rk_ipc_stats(&s0);
    int rc = MPI_SUCCESS;
    long bad = -1;
    MPI_Barrier(MPI_COMM_WORLD);
    if (peer >= 0 && even) {
        fill(DEV, sbuf, n, seed);
        rc = MPI_Send(sbuf, (int)n, MPI_BYTE, peer, 950, MPI_COMM_WORLD);
    } else if (peer >= 0) {
        set(DEV, rbuf, n, 0);
        rc = MPI_Recv(rbuf, (int)n, MPI_BYTE, peer, 950, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        bad = check(DEV, rbuf, n, seed, n, 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    rk_ipc_stats(&s1);
    d->opened = s1.opened - s0.opened;
    d->hits = s1.hits - s0.hits;
    d->stale = s1.stale - s0.stale;
    d->refused_maps = s1.refused_maps - s0.refused_maps;
    return rc == MPI_SUCCESS && bad < 0;
}

/* A check over the receivers (even ranks and a lone last rank pass). */
static void vmm_ok(int good, int is_receiver, const char *what)
{
    int g = good || !is_receiver, all = 0;
    MPI_Allreduce(&g, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    mok(all, "vmm: %s", what);
}

static void t_vmm(void)
{
    int even = me % 2 == 0, peer = even ? me + 1 : me - 1;
    if (peer >= np)
        peer = -1;
    int recv = !even && peer >= 0;
    dev_reset();
    /* 3 MiB and a bit from 4 KiB + 12 into a block: several handles
     * (granule= and handle= of the run's spec), interior pointers. */
    size_t n = ((size_t)3 << 20) + 333, blk = n + 8192;
    char *sblk = xalloc(DEV, blk), *rblk = xalloc(DEV, blk);
    char *sbuf = sblk + 4096 + 12, *rbuf = rblk + 777;
    rk_ipc_stats_t d;
    int ok = vmm_round(sbuf, rbuf, n, 61, peer, even, &d);
    vmm_ok(ok && d.opened == 1 && d.refused_maps == 0, recv,
           "an interior range over several handles, into an interior pointer: mapped, right");
    ok = vmm_round(sbuf, rbuf, n, 62, peer, even, &d);
    vmm_ok(ok && d.opened == 0 && d.hits == 1, recv, "the same buffer again: a cache hit, right");
    ok = vmm_round(sbuf + 65536, rbuf, n - 65536, 63, peer, even, &d);
    vmm_ok(ok && d.opened == 0 && d.hits == 1, recv,
           "a range inside the mapped run: a cache hit, right");
    /* The sender's block freed, its memory given back, a new block (most
     * often at the same address, in new handles): mapped afresh, and the
     * new bytes read, never the old mapping's. */
    xfree(DEV, sblk);
    rankmem_resource_trim(vres, 0);
    sblk = xalloc(DEV, blk);
    sbuf = sblk + 4096 + 12;
    ok = vmm_round(sbuf, rbuf, n, 64, peer, even, &d);
    vmm_ok(ok && d.opened == 1 && d.stale >= 1, recv,
           "the sender's block freed, given back and allocated again: mapped afresh (the old "
           "mapping replaced), right");
    /* The sender's fd service refuses (a new block, nothing cached): the
     * receiver asks for the bytes, which come staged. */
    xfree(DEV, sblk);
    rankmem_resource_trim(vres, 0);
    sblk = xalloc(DEV, blk);
    sbuf = sblk + 4096 + 12;
    if (even)
        rk_ipc_fd_refuse(1);
    ok = vmm_round(sbuf, rbuf, n, 65, peer, even, &d);
    if (even)
        rk_ipc_fd_refuse(0);
    vmm_ok(ok && d.opened == 0 && d.refused_maps == 1, recv,
           "the sender's fd service refusing: staged instead, right");
    ok = vmm_round(sbuf, rbuf, n, 66, peer, even, &d);
    vmm_ok(ok && d.opened == 1, recv, "... and served again: mapped, right");
    dev_reset();

    /* The fd service itself, asked by this rank for its own handles: a
     * handle by address and id is served; a wrong id, or the id of a
     * handle the pool gave back, is refused. */
    char *b = xalloc(DEV, 100000);
    rankmem_vmm_export_t e;
    int good = rankmem_vmm_export_ex(vres, b, 100000,
                                     RANKMEM_VMM_EXPORT_NO_FDS | RANKMEM_VMM_EXPORT_MAPPED,
                                     &e) == RANKMEM_SUCCESS && e.count >= 1;
    uint64_t addr = good ? e.handles[0].address : 0, id = good ? e.handles[0].id : 0;
    uint64_t bytes = 0, off = 0, bad_id = id + 1000000;
    int fd = -1;
    char why[160];
    if (good) {
        good = rk_ipc_fd_fetch(me, 1, &addr, &id, &fd, &bytes, &off, why, sizeof why) == 0 &&
               fd >= 0 && bytes == e.handles[0].bytes && off == e.handles[0].fd_offset;
        if (fd >= 0)
            close(fd);
        rankmem_vmm_export_close(&e);
    }
    mok(good, "vmm: the fd service serves a handle by address and id");
    fd = -1;
    mok(rk_ipc_fd_fetch(me, 1, &addr, &bad_id, &fd, &bytes, &off, why, sizeof why) != 0 &&
            fd == -1,
        "vmm: ... and refuses a wrong id (%s)", why);
    dev_reset(); /* b freed, the pool's memory given back */
    fd = -1;
    mok(rk_ipc_fd_fetch(me, 1, &addr, &id, &fd, &bytes, &off, why, sizeof why) != 0 && fd == -1,
        "vmm: ... and the id of a handle given back (%s)", why);
}
#endif

/* ---- the host fast path's cost (staging active, host buffers) ---- */

static double ns_per(int *x, int wrapped, int recv, int iters)
{
    MPI_Status st;
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) {
        if (recv)
            (wrapped ? MPI_Recv : PMPI_Recv)(x, 1, MPI_INT, MPI_PROC_NULL, 0, MPI_COMM_WORLD,
                                              &st);
        else
            (wrapped ? MPI_Send : PMPI_Send)(x, 1, MPI_INT, MPI_PROC_NULL, 0, MPI_COMM_WORLD);
    }
    return (MPI_Wtime() - t0) * 1e9 / iters;
}

/* A host int on the stack, in a small malloc (the brk heap) and in a large
 * one (its own mapping: with a GPU, the plugin asks the driver). */
static void t_overhead(void)
{
    int on_stack = 0, *small = malloc(sizeof *small), *big = malloc((size_t)8 << 20);
    int *where[3] = {&on_stack, small, big};
    const char *name[3] = {"stack", "small malloc", "8 MiB malloc"};
    int good = small && big;
    for (int w = 0; w < 3 && good; w++) {
        /* Best of several rounds: the difference is a few nanoseconds. */
        double best[4] = {1e9, 1e9, 1e9, 1e9};
        for (int round = 0; round < 7; round++)
            for (int k = 0; k < 4; k++) {
                double v = ns_per(where[w], k & 1, k >> 1, w == 2 ? 20000 : 200000);
                if (v < best[k])
                    best[k] = v;
            }
        mdiag("host fast path, MPI_PROC_NULL, %s: MPI_Send %.1f ns vs PMPI_Send %.1f ns (+%.1f); "
              "MPI_Recv %.1f ns vs PMPI_Recv %.1f ns (+%.1f)",
              name[w], best[1], best[0], best[1] - best[0], best[3], best[2], best[3] - best[2]);
        good = best[1] > 0 && best[3] > 0;
    }
    mok(good, "host fast path measured (figures above)");
    free(small);
    free(big);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--host"))
            host_only = 1;
        else if (!strcmp(argv[i], "--real"))
            use_real = 1;
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--vmm"))
            use_vmm = 1;
        else if (!strcmp(argv[i], "--overhead"))
            overhead_only = 1;
        else if (!strcmp(argv[i], "--max") && i + 1 < argc)
            max_bytes = (size_t)strtoull(argv[++i], NULL, 0);
    }
#ifdef RKT_FAKE
    if (!use_real && !host_only) {
        /* A memory file, so that peers can map it (the IPC test backend);
         * RKT_FAKE_NO_MEMFD: private memory, which peers cannot map. */
        int fd = -1;
        if (use_vmm)
            fsize = (size_t)1 << 20; /* a stand-in until the vmm pool exists */
        if (!getenv("RKT_FAKE_NO_MEMFD") && !use_vmm) {
            fd = memfd_create("rankmem-fake-device", MFD_CLOEXEC);
            if (fd < 0 || ftruncate(fd, (off_t)fsize) != 0)
                return 1;
        }
        fregion = mmap(NULL, fsize, PROT_READ | PROT_WRITE,
                       (fd >= 0 ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS) | MAP_NORESERVE, fd, 0);
        if (fregion == MAP_FAILED)
            return 1;
        rk_stg_fake_device(fregion, fsize);
        if (fd >= 0)
            rk_stg_fake_ipc(fd);
    }
#endif
#ifdef RKT_FAKE
    /* RKT_FAKE_FD_REFUSE: the fd service refuses every handle (the node's
     * probe at init fails: IPC off for the node, one line for the job). */
    if (getenv("RKT_FAKE_FD_REFUSE"))
        rk_ipc_fd_refuse(1);
#endif
    MPI_Init(&argc, &argv);
#ifdef RKT_FAKE
    /* Built with the plugin's sources: staging's init, as init.c calls it
     * (a no-op when init.c already did). */
    rk_mpi_staging_init();
    /* RKT_FAKE_MAP_FAIL=N: every Nth IPC mapping is refused, so that the
     * receiver asks the sender for the data instead. */
    const char *mf = getenv("RKT_FAKE_MAP_FAIL");
    if (mf && atoi(mf) > 0)
        rk_stg_fake_ipc_fail(atoi(mf));
    /* RKT_FAKE_SHARED_GPU: as if the ranks shared one GPU, so that IPC
     * copies take their way through pinned memory. */
    if (getenv("RKT_FAKE_SHARED_GPU"))
        rk_stg_shared_gpu = 1;
#endif
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (use_vmm && !host_only && have_device()) {
        /* The rank's resource must hold a vmm pool (RANKMEM_RESOURCE). */
        vres = rankmem_mpi_resource();
        void *vb = NULL;
        size_t vn = 0;
        if (!vres || rankmem_vmm_range(vres, &vb, &vn) != RANKMEM_SUCCESS) {
            fprintf(stderr, "rank %d: --vmm: the rank's resource has no vmm pool (%s)\n", me,
                    vres ? rankmem_last_error() : "no resource");
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
#ifdef RKT_FAKE
        /* Its memory is the test backend's device memory from now on. */
        rk_stg_fake_device(vb, vn);
        fregion = vb;
#endif
    }
    left = (me + np - 1) % np;
    right = (me + 1) % np;
    const char *c = getenv("RANKMEM_STAGING_CHUNK");
    if (c) {
        char *end;
        size_t v = strtoull(c, &end, 10);
        if (!strcmp(end, "MiB"))
            v <<= 20;
        else if (!strcmp(end, "KiB"))
            v <<= 10;
        if (v)
            chunk = v;
    }
    if (chunk > max_bytes)
        chunk = max_bytes / 2;
    make_sizes();

    if (overhead_only) {
#ifdef RKT_FAKE
        int active = rk_stg_active;
#else
        int active = have_device(); /* staging is on: MPI here is not CUDA-aware */
#endif
        if (active)
            t_overhead();
        else
            mskip("staging is not active");
        MPI_Finalize();
        return mtap_failed_ ? 1 : 0;
    }
    if (np < 2) {
        mskip("needs 2 ranks or more");
        MPI_Finalize();
        return 0;
    }
    int dev = have_device();
    int all = 0;
    MPI_Allreduce(&dev, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!host_only && !all) {
        mskip("no GPU (device buffers cannot be tested here)");
        MPI_Finalize();
        return 0;
    }
    int kinds[2] = {HOST, DEV}, nk = host_only ? 1 : 2;
#ifdef RKT_FAKE
    mdiag("staging %s on rank 0 (fake device: %s), CUDA IPC %s, chunk %zu KiB, largest message "
          "%zu bytes",
          rk_stg_on ? "on" : "off", fregion ? "yes" : "no", rk_ipc_on ? "on" : "off", chunk >> 10,
          max_bytes);
    if (spans_nodes()) {
        /* Nothing maps a handle across nodes: only the ranks of this rank's
         * pretend node (k consecutive world ranks) are reached by IPC. */
        int k = atoi(getenv("RANKMEM_TEST_NODE_RANKS")), across = 0, within = 0;
        for (int w = 0; w < np; w++) {
            if (w == me)
                continue;
            if (w / k != me / k)
                across += rk_ipc_reaches(w) != 0;
            else
                within += rk_ipc_reaches(w) != 0;
        }
        mok(across == 0, "pretend nodes of %d ranks: no rank reaches a rank of another node "
                         "through IPC (%d on this rank; %d of its node's)", k, across, within);
    }
#endif

    for (int call = 0; call < NCALLS; call++)
        for (int a = 0; a < nk; a++)
            for (int b = 0; b < nk; b++)
                for (int i = 0; i < nsizes; i++) {
                    /* Every size for Send/Recv and Isend; the others at a few sizes. */
                    size_t n = sizes[i];
                    if (call != C_SEND && call != C_ISEND && call != C_SENDRECV && i % 3 != 0 &&
                        n != max_bytes)
                        continue;
                    t_p2p(call, kinds[a], kinds[b], n);
                }
    for (int form = 0; form < NFORMS; form++)
        for (int k = 0; k < (host_only ? 1 : 3); k++)
            t_many(form, k);
    {
        int ws[] = {1, 2, 7, 64, 256};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            if (!quick || ws[i] == 64)
                t_window(ws[i], (int)(i % 2));
    }
#ifdef RKT_FAKE
    /* Slices: a chunk holds several (not with chunks of 64 KiB). */
    if (!host_only && chunk >= ((size_t)128 << 10))
        t_slices();
#endif
    for (int a = 0; a < nk; a++)
        t_free_cancel(kinds[a]);
    if (!host_only && np % 2 == 0) {
        t_progress(2 * chunk + 7 > max_bytes ? max_bytes : 2 * chunk + 7);
#ifdef RKT_FAKE
        /* A refused mapping makes the receiver ask the sender for the
         * data, which needs the sender's progress: inside MPI_Barrier,
         * Open MPI's progress callback gives it, or (MPICH) the helper
         * thread where MPI is MPI_THREAD_MULTIPLE. */
        const char *mfail = getenv("RKT_FAKE_MAP_FAIL");
        if (mfail && atoi(mfail) > 0 && !rk_stg_hooked && !rk_stg_helper_allowed)
            mdiag("Isend across MPI_Barrier not tried: refused mappings need the sender's "
                  "progress, which this MPI gives no hook for");
        else
#endif
            t_isend_barrier(5 * chunk + 3 > max_bytes ? max_bytes : 5 * chunk + 3);
    }
    if (!host_only && max_bytes >= ((size_t)600 << 10))
        t_truncate();
    /* Allocations from 2 MiB are exported (smaller ones share cudaMalloc's
     * blocks and are staged): 2.5 MiB where the run allows. */
    if (!host_only && max_bytes >= ((size_t)5 << 19))
        t_ipc((size_t)5 << 19);
    else if (!host_only && max_bytes >= ((size_t)600 << 10))
        t_ipc((size_t)600 << 10);
    size_t psz[] = {32, 1000, chunk + 5 > max_bytes ? max_bytes : chunk + 5};
    for (int a = 0; a < nk; a++)
        for (int b = 0; b < nk; b++)
            for (size_t i = 0; i < sizeof psz / sizeof psz[0]; i++)
                for (int ip = 0; ip < 2; ip++)
                    t_probe(kinds[a], kinds[b], psz[i], ip);
    for (int a = 0; a < nk; a++)
        for (int b = 0; b < nk; b++) {
            t_derived(kinds[a], kinds[b], 5);
            t_derived(kinds[a], kinds[b], (int)((max_bytes / 12) > 300000 ? 300000 : max_bytes / 12));
        }
    {
        /* 1 KiB; 100 KiB (CUDA IPC between ranks of a node where it is on);
         * more than 256 KiB (pipelined, or IPC). */
        size_t big = chunk + 5 > max_bytes ? max_bytes : chunk + 5;
        size_t qsz[] = {1024, (size_t)100 << 10, big};
        int D = host_only ? HOST : DEV;
        int pk[3][2] = {{DEV, DEV}, {DEV, HOST}, {HOST, DEV}};
        for (size_t i = 0; i < sizeof qsz / sizeof qsz[0]; i++)
            for (int k = 0; k < (host_only ? 1 : 3); k++)
                t_persist(host_only ? HOST : pk[k][0], host_only ? HOST : pk[k][1], qsz[i],
                          PM_SEND);
        for (int mode = PM_SSEND; mode < NPMODES; mode++) {
            t_persist(D, D, 1024, mode);
            /* Open MPI 4.1.6's own persistent buffered send of a large host
             * message delivers wrong data when started again (staged device
             * ones are MPI_Ibsend each time). */
            if (host_only && mode == PM_BSEND)
                mdiag("persistent Bsend_init of %zu host bytes not tried: MPI's own", big);
            else
                t_persist(D, D, big, mode);
        }
        for (int form = 0; form < 3; form++)
            t_persist_mix(form);
        for (int a = 0; a < nk; a++)
            t_persist_free(kinds[a]);
        /* 0 and 32 bytes (a header's size: the probe must receive it to tell). */
        size_t msz[] = {0, 32, 1000, (size_t)100 << 10, big};
        for (int a = 0; a < nk; a++)
            for (int b = 0; b < nk; b++)
                for (size_t i = 0; i < sizeof msz / sizeof msz[0]; i++)
                    for (int nb = 0; nb < 2; nb++)
                        t_mprobe(kinds[a], kinds[b], msz[i], nb, 0);
        for (int a = 0; a < nk; a++)
            for (int nb = 0; nb < 2; nb++) {
                t_mprobe(kinds[a], kinds[nk - 1], 32, nb, 1);
                t_mprobe(kinds[a], kinds[nk - 1], big, nb, 1);
            }
        for (int a = 0; a < nk; a++)
            for (int nb = 0; nb < 2; nb++) {
                t_mprobe_struct(kinds[a], 7, nb);
                t_mprobe_struct(kinds[a], (int)(max_bytes / 64 > 12000 ? 12000 : max_bytes / 64),
                                nb);
            }
        t_mprobe_noproc();
    }
    size_t csz[] = {1, 1000, max_bytes / sizeof(int) / (size_t)(np > 1 ? np : 1) / 2};
    for (int mixed = 0; mixed < (host_only ? 1 : 3); mixed++)
        for (size_t i = 0; i < sizeof csz / sizeof csz[0]; i++) {
            t_coll(host_only ? -1 : mixed, csz[i] ? csz[i] : 1);
#ifdef PCOLL
            t_pcoll(host_only ? -1 : mixed, csz[i] ? csz[i] : 1, i == 1);
#endif
        }
    if (!host_only && max_bytes >= ((size_t)600 << 10)) {
        /* 300 KiB and a bit per rank: slices of uneven sizes. */
        size_t n = ((size_t)300 << 10) / sizeof(int) + 13;
        t_coll_ipc(MPI_COMM_WORLD, "world", n, 0);
        t_coll_ipc(MPI_COMM_WORLD, "world", n, 1);
        MPI_Comm dup, half;
        MPI_Comm_dup(MPI_COMM_WORLD, &dup);
        t_coll_ipc(dup, "world's duplicate", n, 0);
        MPI_Comm_free(&dup);
        /* Ranks in reverse order of the world's. */
        MPI_Comm_split(MPI_COMM_WORLD, me < np / 2, np - me, &half);
        t_coll_ipc(half, "half of world, reversed", n, 0);
        MPI_Comm_free(&half);
        t_coll_ipc_fallback(n);
    }
#ifdef RKT_FAKE
    if (use_vmm && !host_only && !(mf && atoi(mf) > 0) && ipc_all())
        t_vmm();
    uint64_t sb = 0, sm = 0, sns = 0;
    rk_mpi_staging_counters(&sb, &sm, &sns);
    mdiag("rank 0 staged %llu bytes in %llu calls, %.3f s", (unsigned long long)sb,
          (unsigned long long)sm, (double)sns * 1e-9);
    mok(!rk_stg_on || (sb > 0 && sm > 0), "staging counters move when staging is on");
    if (mf && atoi(mf) > 0 && ipc_any()) {
        rk_ipc_stats_t ist;
        rk_ipc_stats(&ist);
        long r = (long)ist.refused_maps, all = 0;
        MPI_Allreduce(&r, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        mok(all > 0, "refused mappings happened (%ld) and every message above still arrived", all);
    }
    if (use_vmm && !host_only && getenv("RKT_FAKE_FD_REFUSE")) {
        mok(!rk_ipc_on, "vmm: the fd service refusing at init: IPC off, every message above "
                        "staged and right");
    } else if (use_vmm && !host_only) {
        /* Not one message may have staged silently instead of mapping. */
        rk_ipc_stats_t ist;
        rk_ipc_stats(&ist);
        long v[4] = {(long)ist.vmm_opened, (long)ist.vmm_exports,
                     (long)(ist.opened - ist.vmm_opened), (long)ist.busy},
             mn[4], mx[4];
        MPI_Allreduce(v, mn, 4, MPI_LONG, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(v, mx, 4, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
        mdiag("vmm: rank 0 mapped %llu runs of peers' handles, %llu hits, %llu replaced, %llu "
              "evicted, %llu refused; exported %llu",
              (unsigned long long)ist.vmm_opened, (unsigned long long)ist.hits,
              (unsigned long long)ist.stale, (unsigned long long)ist.evicted,
              (unsigned long long)ist.refused_maps, (unsigned long long)ist.vmm_exports);
        if (spans_nodes())
            mdiag("vmm: pretend nodes: the vmm mapping counts were not checked (max %ld other "
                  "mappings)", mx[2]);
        else
            mok(rk_ipc_on && mn[0] > 0 && mn[1] > 0 && mx[2] == 0,
                "vmm: IPC on, every rank mapped peers' vmm handles (min %ld) and described its "
                "own (min %ld); no other kind of mapping (%ld)",
                mn[0], mn[1], mx[2]);
    }
    if (ipc_any()) {
        /* Every mapping taken was given back (a leaked reference keeps a
         * peer's memory mapped for good). */
        rk_ipc_stats_t ist;
        rk_ipc_stats(&ist);
        long b = ist.busy, bmax = 0;
        MPI_Allreduce(&b, &bmax, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
        mok(bmax == 0, "IPC: no mapping left in use at the end (at most %ld on a rank)", bmax);
    }
#endif
    MPI_Barrier(MPI_COMM_WORLD);
#ifdef RKT_FAKE
    rk_mpi_staging_finalize(); /* as init.c's MPI_Finalize hook does; idempotent */
#endif
    MPI_Finalize();
    return mtap_failed_ ? 1 : 0;
}
