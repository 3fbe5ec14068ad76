/* A generated matrix of MPI calls on device buffers through the staging
 * plugin: datatypes x counts x memory kinds x calls, every byte of every
 * receive buffer (the gaps a datatype does not describe included) compared
 * with a reference run of the same call on plain host buffers through PMPI
 * (the plugin bypassed), run by tests/mpi_staging/staging.mpish and gpu.mpish.
 *
 * One source, two programs:
 *   dt_fake (-DRKT_FAKE, the plugin's sources built in): "device" memory is
 *       a memory file mapped twice: the addresses the program and MPI see
 *       are PROT_NONE (touching them faults, as a device pointer would), and
 *       the test backend copies through a second, read/write mapping
 *       (rk_stg_fake_alias). A call that reads device memory directly
 *       instead of staging it crashes here. --unguarded: one ordinary
 *       mapping (the old behaviour), to tell a fault from a wrong answer.
 *   dt_gpu (linked with librankmem_mpi, CUDA runtime): host, cudaMalloc,
 *       cudaMallocAsync, managed, pinned, registered host and the rank's
 *       resource (rankmem pool); skipped without a GPU.
 *
 * Output: one TAP line per call family ("N cases, F failed") and the first
 * failing cases as diagnostics. A crash in a case prints that case on
 * stderr and the run fails.
 *
 * Options: --quick (counts 0, 1, 17), --full (0, 1, 17, 512, 65530),
 * --calls LIST, --kinds LIST (comma-separated names; --list prints them),
 * --seed N, --max BYTES (largest buffer), --unguarded (dt_fake). */
#define _GNU_SOURCE
#include "config.h"

#include <complex.h>
#include <mpi.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <sys/types.h>

#include "mtap.h"

int ftruncate(int fd, off_t length); /* <unistd.h>, whose F_* names clash with MPI's */
ssize_t write(int fd, const void *buf, size_t n);

#include <rankmem.h>
#include <rankmem_mpi.h>

#ifdef RKT_FAKE
#include "staging/staging.h"
#include "staging/ipc_map.h"
#elif HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static int me, np;
static int quick = 1, guarded = 1;
static unsigned seed = 1;
static size_t max_bytes;
static MPI_Comm ring = MPI_COMM_NULL; /* a periodic 1-D cartesian ring */

/* ---- memory kinds ---- */

enum { M_HOST, M_DEV, M_ASYNC, M_MANAGED, M_PINNED, M_REG, M_POOL, NKIND };
static const char *kname[NKIND] = {"host", "dev", "async", "managed", "pinned", "reg", "pool"};
static int kind_on[NKIND];
static int kinds[NKIND], nkinds;

#ifdef RKT_FAKE
static char *fregion, *falias;
static size_t fsize = (size_t)1 << 30, fused;
#endif
static rankmem_resource_t *pool;

typedef struct {
    int kind;
    char *base;   /* the allocation */
    size_t bytes; /* its size (all of it is checked) */
    char *buf;    /* what MPI gets (base + offset: the datatype's lower bound) */
} mb_t;

static void die(const char *what)
{
    fprintf(stderr, "rank %d: %s\n", me, what);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

static char *k_alloc(int kind, size_t n)
{
    void *p = NULL;
    if (n == 0)
        n = 1;
    switch (kind) {
    case M_HOST:
        p = malloc(n);
        break;
#ifdef RKT_FAKE
    case M_DEV: {
        size_t a = (fused + 4095) & ~(size_t)4095;
        if (a + n > fsize)
            die("fake device region exhausted");
        fused = a + n;
        p = fregion + a;
        break;
    }
#elif HAVE_CUDA
    case M_DEV:
        if (cudaMalloc(&p, n) != cudaSuccess)
            p = NULL;
        break;
    case M_ASYNC:
        if (cudaMallocAsync(&p, n, 0) != cudaSuccess || cudaStreamSynchronize(0) != cudaSuccess)
            p = NULL;
        break;
    case M_MANAGED:
        if (cudaMallocManaged(&p, n, cudaMemAttachGlobal) != cudaSuccess)
            p = NULL;
        break;
    case M_PINNED:
        if (cudaMallocHost(&p, n) != cudaSuccess)
            p = NULL;
        break;
    case M_REG:
        p = malloc(n);
        if (p && cudaHostRegister(p, n, cudaHostRegisterDefault) != cudaSuccess) {
            free(p);
            p = NULL;
        }
        break;
#endif
    case M_POOL:
        if (!pool || rankmem_allocate(pool, n, 0, &p) != RANKMEM_SUCCESS)
            p = NULL;
        break;
    default:
        break;
    }
    if (!p) {
        char m[96];
        snprintf(m, sizeof m, "allocation of %zu bytes of %s memory failed", n, kname[kind]);
        die(m);
    }
    return p;
}

static void k_free(int kind, char *p, size_t n)
{
    if (n == 0)
        n = 1;
    switch (kind) {
    case M_HOST:
        free(p);
        break;
#if !defined(RKT_FAKE) && HAVE_CUDA
    case M_DEV:
        cudaFree(p);
        break;
    case M_ASYNC:
        cudaFreeAsync(p, 0);
        cudaStreamSynchronize(0);
        break;
    case M_MANAGED:
        cudaFree(p);
        break;
    case M_PINNED:
        cudaFreeHost(p);
        break;
    case M_REG:
        cudaHostUnregister(p);
        free(p);
        break;
#endif
    case M_POOL:
        rankmem_deallocate(pool, p, n, 0);
        break;
    default:
        break;
    }
}

/* Copies between the program's host memory and a buffer of any kind: the
 * guarded fake device through its alias, the GPU's through the runtime. */
static void k_put(int kind, char *dst, const void *src, size_t n)
{
#ifdef RKT_FAKE
    if (kind == M_DEV && falias)
        dst = falias + (dst - fregion);
    memcpy(dst, src, n);
#elif HAVE_CUDA
    if (kind == M_HOST || kind == M_REG || kind == M_PINNED)
        memcpy(dst, src, n);
    else if (cudaMemcpy(dst, src, n, cudaMemcpyDefault) != cudaSuccess)
        die("cudaMemcpy to the buffer failed");
#else
    (void)kind;
    memcpy(dst, src, n);
#endif
}

static void k_get(int kind, void *dst, const char *src, size_t n)
{
#ifdef RKT_FAKE
    if (kind == M_DEV && falias)
        src = falias + (src - fregion);
    memcpy(dst, src, n);
#elif HAVE_CUDA
    if (kind == M_HOST || kind == M_REG || kind == M_PINNED)
        memcpy(dst, src, n);
    else if (cudaMemcpy(dst, src, n, cudaMemcpyDefault) != cudaSuccess)
        die("cudaMemcpy from the buffer failed");
#else
    (void)kind;
    memcpy(dst, src, n);
#endif
}

/* Between cases: the fake device's bump region starts over. */
static void k_reset(void)
{
#ifdef RKT_FAKE
    fused = 0;
#endif
}

/* ---- buffers described by (datatype, count) ---- */

#define MARGIN 64

static unsigned char pat(unsigned s, size_t i) { return (unsigned char)(i * 131u + s * 29u + (i >> 9) + 7u); }
static unsigned char sentinel(size_t i) { return (unsigned char)(0xC3u ^ (i * 37u) ^ (i >> 8)); }

/* Bytes of count elements of t and where buf lies in them: [MARGIN of
 * sentinel][the data's true extent][MARGIN]; buf stays inside the
 * allocation whatever the lower bound (detection looks at buf). */
static size_t geom(MPI_Datatype t, size_t count, ptrdiff_t *off)
{
    MPI_Aint lb, ext, tlb, text;
    PMPI_Type_get_extent(t, &lb, &ext);
    PMPI_Type_get_true_extent(t, &tlb, &text);
    ptrdiff_t lo = 0, hi = 0;
    if (count > 0) {
        ptrdiff_t step = (ptrdiff_t)(count - 1) * (ptrdiff_t)ext;
        lo = (ptrdiff_t)tlb + (step < 0 ? step : 0);
        hi = (ptrdiff_t)tlb + (ptrdiff_t)text + (step > 0 ? step : 0);
    }
    ptrdiff_t pre = MARGIN + (lo > 0 ? lo : 0);
    *off = pre - lo;
    return (size_t)(pre + (hi - lo) + MARGIN);
}

static size_t span_of(MPI_Datatype t, size_t count)
{
    ptrdiff_t off;
    return geom(t, count, &off);
}

enum { FILL_SENTINEL, FILL_PATTERN };

/* The pattern for seed 0 and the sentinel, computed once and grown on
 * demand (the full matrix fills gigabytes: a byte-at-a-time generator was
 * most of its time), and one scratch buffer for a seed's pattern. */
static unsigned char *pat0, *sent0, *scratch;
static size_t filled;

static void fills_grow(size_t n)
{
    if (n <= filled)
        return;
    size_t cap = filled ? filled : (size_t)1 << 16;
    while (cap < n)
        cap *= 2;
    unsigned char *a = realloc(pat0, cap), *b = realloc(sent0, cap), *c = realloc(scratch, cap);
    if (a)
        pat0 = a;
    if (b)
        sent0 = b;
    if (c)
        scratch = c;
    if (!a || !b || !c)
        die("no host memory for the fill patterns");
    for (size_t i = filled; i < cap; i++)
        pat0[i] = pat(0, i), sent0[i] = sentinel(i);
    filled = cap;
}

static void mb_make(mb_t *m, int kind, MPI_Datatype t, size_t count, int fill, unsigned s)
{
    ptrdiff_t off;
    m->kind = kind;
    m->bytes = geom(t, count, &off);
    m->base = k_alloc(kind, m->bytes);
    m->buf = m->base + off;
    fills_grow(m->bytes);
    if (fill == FILL_SENTINEL) {
        k_put(kind, m->base, sent0, m->bytes);
        return;
    }
    /* pat(s, i) == pat(0, i) + s * 29 (mod 256) */
    unsigned char add = (unsigned char)(s * 29u);
    for (size_t i = 0; i < m->bytes; i++)
        scratch[i] = (unsigned char)(pat0[i] + add);
    k_put(kind, m->base, scratch, m->bytes);
}

/* Raw host bytes written into a buffer (typed reduction data). */
static void mb_write(mb_t *m, const unsigned char *h) { k_put(m->kind, m->base, h, m->bytes); }

/* ---- the result of one run of a case ---- */

#define NOUT 3
typedef struct {
    unsigned char *d[NOUT];
    size_t n[NOUT];
    int rc, count, source, tag, nints;
    int skip_out[NOUT]; /* not compared (undefined by the standard) */
} res_t;

static void mb_take(res_t *r, int slot, mb_t *m)
{
    r->d[slot] = malloc(m->bytes);
    r->n[slot] = m->bytes;
    k_get(m->kind, r->d[slot], m->base, m->bytes);
    k_free(m->kind, m->base, m->bytes);
    m->base = NULL;
}

static void mb_drop(mb_t *m)
{
    if (m->base)
        k_free(m->kind, m->base, m->bytes);
    m->base = NULL;
}

static void res_free(res_t *r)
{
    for (int i = 0; i < NOUT; i++)
        free(r->d[i]);
    memset(r, 0, sizeof *r);
}

/* ---- datatypes ---- */

typedef struct {
    const char *name;
    MPI_Datatype s, r; /* sent as s, received as rmul times as many r */
    int rmul;
} dt_t;

#define MAXDT 40
static dt_t dts[MAXDT];
static int ndts;

static MPI_Datatype commit(MPI_Datatype t)
{
    PMPI_Type_commit(&t);
    return t;
}

static void add_dt(const char *name, MPI_Datatype s, MPI_Datatype r, int rmul)
{
    dts[ndts].name = name;
    dts[ndts].s = s;
    dts[ndts].r = r ? r : s;
    dts[ndts].rmul = rmul ? rmul : 1;
    ndts++;
}

static void build_types(void)
{
    MPI_Datatype t, u, w;
    add_dt("MPI_BYTE", MPI_BYTE, 0, 0);
    add_dt("MPI_INT", MPI_INT, 0, 0);
    PMPI_Type_contiguous(3, MPI_DOUBLE, &t);
    add_dt("contiguous(3,DOUBLE)", commit(t), 0, 0);
    PMPI_Type_vector(3, 2, 5, MPI_INT, &t);
    MPI_Datatype vec = commit(t);
    add_dt("vector(3,2,5,INT)", vec, 0, 0);
    add_dt("vector(3,2,5,INT) -> 6 INT", vec, MPI_INT, 6);
    PMPI_Type_create_hvector(3, 2, -24, MPI_INT, &t);
    add_dt("hvector(3,2,-24B,INT)", commit(t), 0, 0);
    {
        int bl[3] = {2, 1, 3}, dp[3] = {5, 0, 12};
        PMPI_Type_indexed(3, bl, dp, MPI_INT, &t);
        add_dt("indexed({2,1,3},{5,0,12},INT)", commit(t), 0, 0);
    }
    {
        int bl[3] = {1, 2, 1};
        MPI_Aint dp[3] = {-16, 32, 8};
        PMPI_Type_create_hindexed(3, bl, dp, MPI_DOUBLE, &t);
        add_dt("hindexed({1,2,1},{-16,32,8}B,DOUBLE)", commit(t), 0, 0);
    }
    {
        int dp[3] = {4, 0, 9};
        PMPI_Type_create_indexed_block(3, 2, dp, MPI_INT, &t);
        add_dt("indexed_block(2,{4,0,9},INT)", commit(t), 0, 0);
    }
    {
        MPI_Aint dp[3] = {0, -24, 40};
        PMPI_Type_create_hindexed_block(3, 3, dp, MPI_SHORT, &t);
        add_dt("hindexed_block(3,{0,-24,40}B,SHORT)", commit(t), 0, 0);
    }
    MPI_Datatype holes;
    {
        int bl[3] = {1, 2, 1};
        MPI_Aint dp[3] = {0, 16, 40};
        MPI_Datatype ty[3] = {MPI_INT, MPI_DOUBLE, MPI_CHAR};
        PMPI_Type_create_struct(3, bl, dp, ty, &t);
        holes = commit(t);
        add_dt("struct{INT@0,2 DOUBLE@16,CHAR@40}", holes, 0, 0);
    }
    MPI_Datatype inner;
    {
        int bl[2] = {4, 8};
        MPI_Aint dp[2] = {0, 16};
        MPI_Datatype ty[2] = {MPI_INT, MPI_DOUBLE};
        PMPI_Type_create_struct(2, bl, dp, ty, &t);
        inner = commit(t);
        add_dt("struct{4 INT,8 DOUBLE}", inner, 0, 0);
    }
    {
        int sz[2] = {6, 7}, sub[2] = {3, 4}, st[2] = {1, 2};
        PMPI_Type_create_subarray(2, sz, sub, st, MPI_ORDER_C, MPI_INT, &t);
        add_dt("subarray C {6,7}[1:4,2:6] INT", commit(t), 0, 0);
    }
    {
        int sz[3] = {5, 4, 3}, sub[3] = {2, 2, 2}, st[3] = {1, 1, 0};
        PMPI_Type_create_subarray(3, sz, sub, st, MPI_ORDER_FORTRAN, MPI_DOUBLE, &t);
        add_dt("subarray Fortran {5,4,3} DOUBLE", commit(t), 0, 0);
    }
    {
        int gs[2] = {8, 6}, di[2] = {MPI_DISTRIBUTE_BLOCK, MPI_DISTRIBUTE_CYCLIC},
            da[2] = {MPI_DISTRIBUTE_DFLT_DARG, MPI_DISTRIBUTE_DFLT_DARG}, ps[2] = {2, 2};
        PMPI_Type_create_darray(4, 1, 2, gs, di, da, ps, MPI_ORDER_C, MPI_INT, &t);
        add_dt("darray(4 procs, rank 1, {8,6} block x cyclic) INT", commit(t), 0, 0);
    }
    PMPI_Type_create_resized(vec, 4, 64, &t);
    add_dt("resized(vector, lb 4, extent 64)", commit(t), 0, 0);
    PMPI_Type_contiguous(2, MPI_INT, &u);
    PMPI_Type_create_resized(u, -8, 20, &t);
    MPI_Datatype negres = commit(t);
    add_dt("resized(contiguous(2,INT), lb -8, extent 20)", negres, 0, 0);
    PMPI_Type_free(&u);
    PMPI_Type_dup(holes, &t);
    add_dt("dup(struct with holes)", commit(t), 0, 0);
    PMPI_Type_vector(2, 1, 2, holes, &t);
    add_dt("vector(2,1,2,struct with holes)", commit(t), 0, 0);
    {
        int bl[2] = {1, 2}, dp[2] = {3, -2};
        PMPI_Type_indexed(2, bl, dp, negres, &u);
        PMPI_Type_create_hvector(2, 1, 200, u, &t);
        add_dt("hvector(2,1,200B,indexed({1,2},{3,-2},resized lb -8))", commit(t), 0, 0);
        PMPI_Type_free(&u);
    }
    {
        /* The case an outside suite found broken (zeros delivered from
         * device send buffers): dup of an hindexed_block of one block at 8
         * bytes of a struct of one block of 32765 inner structs at 8,
         * received as a contiguous run of the inner struct. */
        int bl = 32765;
        MPI_Aint d8 = 8;
        PMPI_Type_create_struct(1, &bl, &d8, &inner, &u);
        PMPI_Type_create_hindexed_block(1, 1, &d8, u, &w);
        PMPI_Type_dup(w, &t);
        add_dt("dup(hindexed_block(1,{8},struct(32765 x struct{4 INT,8 DOUBLE}@8))) -> inner",
               commit(t), inner, 32765);
        PMPI_Type_free(&u);
        PMPI_Type_free(&w);
    }
}

/* ---- families ---- */

enum {
    F_SEND, F_ISEND, F_SSEND, F_BSEND, F_RSEND, F_SENDRECV, F_REPLACE, F_PERSIST, F_MPROBE,
    F_IMPROBE,
    F_BCAST, F_GATHER, F_GATHERV, F_SCATTER, F_SCATTERV, F_ALLGATHER, F_ALLGATHERV, F_ALLTOALL,
    F_ALLTOALLV, F_ALLTOALLW,
    F_IBCAST, F_IGATHER, F_IGATHERV, F_ISCATTER, F_ISCATTERV, F_IALLGATHER, F_IALLGATHERV,
    F_IALLTOALL, F_IALLTOALLV, F_IALLTOALLW,
    F_NALLGATHER, F_NALLGATHERV, F_NALLTOALL, F_NALLTOALLV, F_NALLTOALLW,
    F_INALLGATHER, F_INALLGATHERV, F_INALLTOALL, F_INALLTOALLV, F_INALLTOALLW,
    F_REDUCE, F_ALLREDUCE, F_SCAN, F_EXSCAN, F_REDSCAT, F_REDSCATB,
    F_IREDUCE, F_IALLREDUCE, F_ISCAN, F_IEXSCAN, F_IREDSCAT, F_IREDSCATB,
    NFAM
};
static const char *fam_name[NFAM] = {
    "send", "isend", "ssend", "bsend", "rsend", "sendrecv", "sendrecv_replace", "persistent",
    "mprobe", "improbe",
    "bcast", "gather", "gatherv", "scatter", "scatterv", "allgather", "allgatherv", "alltoall",
    "alltoallv", "alltoallw",
    "ibcast", "igather", "igatherv", "iscatter", "iscatterv", "iallgather", "iallgatherv",
    "ialltoall", "ialltoallv", "ialltoallw",
    "neighbor_allgather", "neighbor_allgatherv", "neighbor_alltoall", "neighbor_alltoallv",
    "neighbor_alltoallw",
    "ineighbor_allgather", "ineighbor_allgatherv", "ineighbor_alltoall", "ineighbor_alltoallv",
    "ineighbor_alltoallw",
    "reduce", "allreduce", "scan", "exscan", "reduce_scatter", "reduce_scatter_block",
    "ireduce", "iallreduce", "iscan", "iexscan", "ireduce_scatter", "ireduce_scatter_block"};
static int fam_on[NFAM];

#define MAXFIRST 4
#define NSLOW 3
static struct {
    long cases, failed, skipped;
    char first[MAXFIRST][800];
    double t_ref, t_got, t_all;   /* seconds: the reference runs, the runs through the plugin, all */
    double slow_t[NSLOW];         /* the slowest runs through the plugin */
    char slow[NSLOW][400];
} stats[NFAM];

/* The case in progress (printed when a call crashes). */
static char current[400];

typedef struct {
    int fam;
    const dt_t *dt; /* data-movement families */
    int rti, op;    /* reductions: type and op indices */
    size_t n;
    int ka, kb; /* p2p: send, receive kinds; collectives: even ranks send ka, receive kb */
    int inplace;
    int root;
} case_t;

/* Call through the plugin, or (the reference) straight to MPI. */
#define X(f) (ref ? P##f : f)

static int is_nb(int fam)
{
    return (fam >= F_IBCAST && fam <= F_IALLTOALLW) || (fam >= F_INALLGATHER && fam <= F_INALLTOALLW) ||
           (fam >= F_IREDUCE && fam <= F_IREDSCATB);
}

/* The blocking family that a nonblocking one mirrors. */
static int base_fam(int fam)
{
    if (fam >= F_IBCAST && fam <= F_IALLTOALLW)
        return fam - (F_IBCAST - F_BCAST);
    if (fam >= F_INALLGATHER && fam <= F_INALLTOALLW)
        return fam - (F_INALLGATHER - F_NALLGATHER);
    if (fam >= F_IREDUCE && fam <= F_IREDSCATB)
        return fam - (F_IREDUCE - F_REDUCE);
    return fam;
}

static int finish(int ref, int rc, MPI_Request *rq)
{
    if (rc != MPI_SUCCESS)
        return rc;
    return X(MPI_Wait)(rq, MPI_STATUS_IGNORE);
}

/* ---- point to point ---- */

static void run_p2p(const case_t *c, int ref, res_t *r)
{
    int sk = ref ? M_HOST : c->ka, rk = ref ? M_HOST : c->kb;
    int right = (me + 1) % np, left = (me + np - 1) % np, tag = 7;
    MPI_Datatype st = c->dt->s, rt = c->dt->r;
    int n = (int)c->n, rn = (int)c->n * c->dt->rmul + 1; /* a receive larger than the message */
    mb_t sb = {0}, rb = {0};
    MPI_Status status;
    memset(&status, 0, sizeof status);
    int rc = MPI_SUCCESS, rc2 = MPI_SUCCESS, even = me % 2 == 0;
    unsigned s = seed * 1000u + (unsigned)me;
    if (c->fam == F_REPLACE) {
        mb_make(&rb, rk, st, c->n, FILL_PATTERN, s);
        rc = X(MPI_Sendrecv_replace)(rb.buf, n, st, right, tag, left, tag, MPI_COMM_WORLD, &status);
        rt = st;
        goto done;
    }
    mb_make(&sb, sk, st, c->n, FILL_PATTERN, s);
    mb_make(&rb, rk, rt, (size_t)rn, FILL_SENTINEL, 0);
    switch (c->fam) {
    case F_SEND:
    case F_SSEND:
    case F_BSEND: {
        char *att = NULL;
        int asz = 0;
        if (c->fam == F_BSEND) {
            PMPI_Pack_size(n, st, MPI_COMM_WORLD, &asz);
            asz += MPI_BSEND_OVERHEAD + 64;
            att = malloc((size_t)asz);
            X(MPI_Buffer_attach)(att, asz);
        }
        for (int phase = 0; phase < 2; phase++) {
            if (phase == !even) {
                if (c->fam == F_SEND)
                    rc = X(MPI_Send)(sb.buf, n, st, right, tag, MPI_COMM_WORLD);
                else if (c->fam == F_SSEND)
                    rc = X(MPI_Ssend)(sb.buf, n, st, right, tag, MPI_COMM_WORLD);
                else
                    rc = X(MPI_Bsend)(sb.buf, n, st, right, tag, MPI_COMM_WORLD);
            } else {
                rc2 = X(MPI_Recv)(rb.buf, rn, rt, left, tag, MPI_COMM_WORLD, &status);
            }
        }
        if (att) {
            void *old;
            int osz;
            X(MPI_Buffer_detach)(&old, &osz);
            free(att);
        }
        break;
    }
    case F_ISEND: {
        MPI_Request q[2];
        MPI_Status sts[2];
        rc2 = X(MPI_Irecv)(rb.buf, rn, rt, left, tag, MPI_COMM_WORLD, &q[0]);
        rc = X(MPI_Isend)(sb.buf, n, st, right, tag, MPI_COMM_WORLD, &q[1]);
        int w = X(MPI_Waitall)(2, q, sts);
        status = sts[0];
        if (rc == MPI_SUCCESS)
            rc = w;
        break;
    }
    case F_RSEND: {
        MPI_Request q;
        rc2 = X(MPI_Irecv)(rb.buf, rn, rt, left, tag, MPI_COMM_WORLD, &q);
        PMPI_Barrier(MPI_COMM_WORLD); /* every receive posted */
        rc = X(MPI_Rsend)(sb.buf, n, st, right, tag, MPI_COMM_WORLD);
        if (rc2 == MPI_SUCCESS)
            rc2 = X(MPI_Wait)(&q, &status);
        break;
    }
    case F_SENDRECV:
        rc = X(MPI_Sendrecv)(sb.buf, n, st, right, tag, rb.buf, rn, rt, left, tag, MPI_COMM_WORLD,
                             &status);
        break;
    case F_PERSIST: {
        /* Two rounds (Startall, then Start each): the second sends other data. */
        MPI_Request q[2];
        MPI_Status sts[2];
        rc2 = X(MPI_Recv_init)(rb.buf, rn, rt, left, tag, MPI_COMM_WORLD, &q[0]);
        rc = X(MPI_Send_init)(sb.buf, n, st, right, tag, MPI_COMM_WORLD, &q[1]);
        if (rc != MPI_SUCCESS || rc2 != MPI_SUCCESS)
            break;
        rc = X(MPI_Startall)(2, q);
        if (rc == MPI_SUCCESS)
            rc = X(MPI_Waitall)(2, q, sts);
        {
            unsigned char *h = malloc(sb.bytes);
            for (size_t i = 0; i < sb.bytes; i++)
                h[i] = pat(s + 77u, i);
            k_put(sk, sb.base, h, sb.bytes);
            free(h);
        }
        if (rc == MPI_SUCCESS)
            rc = X(MPI_Start)(&q[0]);
        if (rc == MPI_SUCCESS)
            rc = X(MPI_Start)(&q[1]);
        if (rc == MPI_SUCCESS)
            rc = X(MPI_Wait)(&q[1], &sts[1]);
        if (rc == MPI_SUCCESS)
            rc = X(MPI_Wait)(&q[0], &status);
        X(MPI_Request_free)(&q[0]);
        X(MPI_Request_free)(&q[1]);
        break;
    }
    case F_MPROBE:
    case F_IMPROBE: {
        MPI_Request q, q2;
        MPI_Message msg;
        rc = X(MPI_Isend)(sb.buf, n, st, right, tag, MPI_COMM_WORLD, &q);
        if (c->fam == F_MPROBE) {
            rc2 = X(MPI_Mprobe)(left, tag, MPI_COMM_WORLD, &msg, &status);
            if (rc2 == MPI_SUCCESS)
                rc2 = X(MPI_Mrecv)(rb.buf, rn, rt, &msg, &status);
        } else {
            int flag = 0;
            while (rc2 == MPI_SUCCESS && !flag)
                rc2 = X(MPI_Improbe)(left, tag, MPI_COMM_WORLD, &flag, &msg, &status);
            if (rc2 == MPI_SUCCESS)
                rc2 = X(MPI_Imrecv)(rb.buf, rn, rt, &msg, &q2);
            if (rc2 == MPI_SUCCESS)
                rc2 = X(MPI_Wait)(&q2, &status);
        }
        if (rc == MPI_SUCCESS)
            rc = X(MPI_Wait)(&q, MPI_STATUS_IGNORE);
        break;
    }
    }
done:
    r->rc = rc != MPI_SUCCESS ? rc : rc2;
    r->count = -2;
    PMPI_Get_count(&status, rt, &r->count);
    r->source = status.MPI_SOURCE;
    r->tag = status.MPI_TAG;
    r->nints = 1;
    mb_drop(&sb);
    mb_take(r, 0, &rb);
}

/* ---- data-movement collectives ---- */

/* v-forms: rank i's count and its slot (in elements), slots in reverse rank order. */
static void vcounts(size_t n, int p, int *cnt, int *dsp, int mul)
{
    int at = 0;
    for (int i = p - 1; i >= 0; i--) {
        cnt[i] = n ? (int)(n - (size_t)(i % 2) * (n / 3)) * mul : 0;
        dsp[i] = at;
        at += cnt[i];
    }
}

static int vtotal(const int *cnt, int p)
{
    int t = 0;
    for (int i = 0; i < p; i++)
        t += cnt[i];
    return t;
}

static void run_coll(const case_t *c, int ref, res_t *r)
{
    int even = me % 2 == 0;
    int sk = ref ? M_HOST : (even ? c->ka : c->kb), rk = ref ? M_HOST : (even ? c->kb : c->ka);
    int fam = base_fam(c->fam), nb = is_nb(c->fam);
    MPI_Datatype st = c->dt->s, rt = c->dt->r;
    int mul = c->dt->rmul, n = (int)c->n, rn = n * mul, root = c->root, ip = c->inplace;
    unsigned s = seed * 1000u + (unsigned)me;
    int neigh = fam >= F_NALLGATHER && fam <= F_NALLTOALLW;
    MPI_Comm comm = neigh ? ring : MPI_COMM_WORLD;
    int p = neigh ? 2 : np; /* blocks: ranks, or a ring's 2 neighbours */
    int scnt[64] = {0}, sdsp[64] = {0}, rcnt[64] = {0}, rdsp[64] = {0};
    MPI_Aint swd[64], rwd[64];
    MPI_Datatype stv[64], rtv[64];
    MPI_Aint ext, lb;
    mb_t sb = {0}, rb = {0};
    MPI_Request q = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    void *sp;
    switch (fam) {
    case F_BCAST:
        mb_make(&rb, rk, st, c->n, me == root ? FILL_PATTERN : FILL_SENTINEL, s);
        rc = nb ? finish(ref, X(MPI_Ibcast)(rb.buf, n, st, root, comm, &q), &q)
                : X(MPI_Bcast)(rb.buf, n, st, root, comm);
        break;
    case F_GATHER:
    case F_GATHERV: {
        int isroot = me == root;
        vcounts(c->n, p, rcnt, rdsp, mul);
        if (fam == F_GATHER)
            for (int i = 0; i < p; i++)
                rcnt[i] = rn, rdsp[i] = i * rn;
        int my = fam == F_GATHER ? n : rcnt[me] / mul;
        size_t total = (size_t)vtotal(rcnt, p);
        mb_make(&sb, sk, st, (size_t)my, FILL_PATTERN, s);
        /* In place: the root's own block is already in the receive buffer. */
        mb_make(&rb, rk, rt, isroot ? total : 0, ip && isroot ? FILL_PATTERN : FILL_SENTINEL, s);
        sp = ip && isroot ? MPI_IN_PLACE : sb.buf;
        if (fam == F_GATHER)
            rc = nb ? finish(ref, X(MPI_Igather)(sp, n, st, rb.buf, rn, rt, root, comm, &q), &q)
                    : X(MPI_Gather)(sp, n, st, rb.buf, rn, rt, root, comm);
        else
            rc = nb ? finish(ref, X(MPI_Igatherv)(sp, my, st, rb.buf, rcnt, rdsp, rt, root, comm, &q), &q)
                    : X(MPI_Gatherv)(sp, my, st, rb.buf, rcnt, rdsp, rt, root, comm);
        break;
    }
    case F_SCATTER:
    case F_SCATTERV: {
        int isroot = me == root;
        vcounts(c->n, p, scnt, sdsp, 1);
        if (fam == F_SCATTER)
            for (int i = 0; i < p; i++)
                scnt[i] = n, sdsp[i] = i * n;
        int my = (fam == F_SCATTER ? n : scnt[me]) * mul;
        mb_make(&sb, sk, st, isroot ? (size_t)vtotal(scnt, p) : 0, FILL_PATTERN, s);
        mb_make(&rb, rk, rt, (size_t)my, FILL_SENTINEL, 0);
        void *rp = ip && isroot ? MPI_IN_PLACE : rb.buf;
        if (fam == F_SCATTER)
            rc = nb ? finish(ref, X(MPI_Iscatter)(sb.buf, n, st, rp, rn, rt, root, comm, &q), &q)
                    : X(MPI_Scatter)(sb.buf, n, st, rp, rn, rt, root, comm);
        else
            rc = nb ? finish(ref, X(MPI_Iscatterv)(sb.buf, scnt, sdsp, st, rp, my, rt, root, comm, &q), &q)
                    : X(MPI_Scatterv)(sb.buf, scnt, sdsp, st, rp, my, rt, root, comm);
        break;
    }
    case F_ALLGATHER:
    case F_ALLGATHERV:
    case F_NALLGATHER:
    case F_NALLGATHERV: {
        int v = fam == F_ALLGATHERV || fam == F_NALLGATHERV;
        vcounts(c->n, p, rcnt, rdsp, mul);
        if (v && neigh) /* a rank sends one count to both neighbours: all the same */
            for (int i = 0; i < p; i++)
                rcnt[i] = rn, rdsp[i] = (p - 1 - i) * rn;
        if (!v)
            for (int i = 0; i < p; i++)
                rcnt[i] = rn, rdsp[i] = i * rn;
        int my = v && !neigh ? rcnt[me] / mul : n;
        mb_make(&sb, sk, st, (size_t)my, FILL_PATTERN, s);
        mb_make(&rb, rk, rt, (size_t)vtotal(rcnt, p), ip ? FILL_PATTERN : FILL_SENTINEL, s);
        sp = ip ? MPI_IN_PLACE : sb.buf;
        if (fam == F_ALLGATHER)
            rc = nb ? finish(ref, X(MPI_Iallgather)(sp, n, st, rb.buf, rn, rt, comm, &q), &q)
                    : X(MPI_Allgather)(sp, n, st, rb.buf, rn, rt, comm);
        else if (fam == F_ALLGATHERV)
            rc = nb ? finish(ref, X(MPI_Iallgatherv)(sp, my, st, rb.buf, rcnt, rdsp, rt, comm, &q), &q)
                    : X(MPI_Allgatherv)(sp, my, st, rb.buf, rcnt, rdsp, rt, comm);
        else if (fam == F_NALLGATHER)
            rc = nb ? finish(ref, X(MPI_Ineighbor_allgather)(sp, n, st, rb.buf, rn, rt, comm, &q), &q)
                    : X(MPI_Neighbor_allgather)(sp, n, st, rb.buf, rn, rt, comm);
        else
            rc = nb ? finish(ref, X(MPI_Ineighbor_allgatherv)(sp, my, st, rb.buf, rcnt, rdsp, rt, comm, &q), &q)
                    : X(MPI_Neighbor_allgatherv)(sp, my, st, rb.buf, rcnt, rdsp, rt, comm);
        break;
    }
    default: { /* all-to-all forms, world and neighbourhood */
        int v = fam == F_ALLTOALLV || fam == F_NALLTOALLV || fam == F_ALLTOALLW || fam == F_NALLTOALLW;
        /* v-forms: the count between ranks a and b depends on a + b, so
         * that both sides agree (in place needs that too). */
        int nbr[64];
        for (int i = 0; i < p; i++)
            nbr[i] = neigh ? (i == 0 ? (me + np - 1) % np : (me + 1) % np) : i;
        for (int i = 0; i < p; i++) {
            int k = v && n ? n - ((me + nbr[i]) % 2) * (n / 3) : n;
            scnt[i] = k;
            rcnt[i] = k * mul;
        }
        int at = 0, at2 = 0;
        for (int i = p - 1; i >= 0; i--) { /* slots in reverse order */
            sdsp[i] = at;
            at += scnt[i];
            rdsp[i] = at2;
            at2 += rcnt[i];
        }
        PMPI_Type_get_extent(st, &lb, &ext);
        for (int i = 0; i < p; i++) {
            swd[i] = (MPI_Aint)sdsp[i] * ext;
            stv[i] = st;
            rtv[i] = rt;
        }
        PMPI_Type_get_extent(rt, &lb, &ext);
        for (int i = 0; i < p; i++)
            rwd[i] = (MPI_Aint)rdsp[i] * ext;
        int sdb[64], rdb[64]; /* Alltoallw's byte displacements */
        for (int i = 0; i < p; i++)
            sdb[i] = (int)swd[i], rdb[i] = (int)rwd[i];
        mb_make(&sb, sk, st, (size_t)at, FILL_PATTERN, s);
        mb_make(&rb, rk, rt, (size_t)at2, ip ? FILL_PATTERN : FILL_SENTINEL, s);
        sp = ip ? MPI_IN_PLACE : sb.buf;
        switch (fam) {
        case F_ALLTOALL:
            rc = nb ? finish(ref, X(MPI_Ialltoall)(sp, n, st, rb.buf, rn, rt, comm, &q), &q)
                    : X(MPI_Alltoall)(sp, n, st, rb.buf, rn, rt, comm);
            break;
        case F_ALLTOALLV:
            rc = nb ? finish(ref, X(MPI_Ialltoallv)(sp, scnt, sdsp, st, rb.buf, rcnt, rdsp, rt, comm, &q), &q)
                    : X(MPI_Alltoallv)(sp, scnt, sdsp, st, rb.buf, rcnt, rdsp, rt, comm);
            break;
        case F_ALLTOALLW:
            rc = nb ? finish(ref, X(MPI_Ialltoallw)(sp, scnt, sdb, stv, rb.buf, rcnt, rdb, rtv, comm, &q), &q)
                    : X(MPI_Alltoallw)(sp, scnt, sdb, stv, rb.buf, rcnt, rdb, rtv, comm);
            break;
        case F_NALLTOALL:
            rc = nb ? finish(ref, X(MPI_Ineighbor_alltoall)(sp, n, st, rb.buf, rn, rt, comm, &q), &q)
                    : X(MPI_Neighbor_alltoall)(sp, n, st, rb.buf, rn, rt, comm);
            break;
        case F_NALLTOALLV:
            rc = nb ? finish(ref, X(MPI_Ineighbor_alltoallv)(sp, scnt, sdsp, st, rb.buf, rcnt, rdsp, rt, comm, &q), &q)
                    : X(MPI_Neighbor_alltoallv)(sp, scnt, sdsp, st, rb.buf, rcnt, rdsp, rt, comm);
            break;
        case F_NALLTOALLW:
            rc = nb ? finish(ref, X(MPI_Ineighbor_alltoallw)(sp, scnt, swd, stv, rb.buf, rcnt, rwd, rtv, comm, &q), &q)
                    : X(MPI_Neighbor_alltoallw)(sp, scnt, swd, stv, rb.buf, rcnt, rwd, rtv, comm);
            break;
        }
        break;
    }
    }
    r->rc = rc;
    mb_drop(&sb);
    mb_take(r, 0, &rb);
}

/* ---- reductions ---- */

enum { T_INT8, T_UINT8, T_INT16, T_UINT16, T_INT32, T_INT64, T_SHORT, T_INT, T_LONG, T_LLONG,
       T_USHORT, T_UNSIGNED, T_ULONG, T_ULLONG, T_CHAR, T_SCHAR, T_UCHAR, T_BOOL, T_FLOAT,
       T_DOUBLE, T_LDOUBLE, T_CFLOAT, T_CDOUBLE, T_FLOAT_INT, T_DOUBLE_INT, T_LONG_INT, T_2INT,
       T_SHORT_INT, T_LDOUBLE_INT, T_USER_INT, T_USER_MAT, NRT };

/* Groups of the standard's table of ops and types. */
enum { G_INT = 1, G_FLOAT = 2, G_COMPLEX = 4, G_LOGICAL = 8, G_PAIR = 16, G_CHAR = 32, G_USER = 64 };

static struct {
    const char *name;
    MPI_Datatype t;
    int group;
    size_t sz; /* the C type's size (the element's extent) */
} rts[NRT];

static const char *op_name[] = {"SUM", "PROD", "MIN", "MAX", "LAND", "LOR", "LXOR", "BAND",
                                "BOR", "BXOR", "MINLOC", "MAXLOC", "user(commutative)",
                                "user(non-commutative)"};
#define NOPS 14
static MPI_Op ops[NOPS];

static int op_groups(int op)
{
    switch (op) {
    case 0:
    case 1:
        return G_INT | G_FLOAT | G_COMPLEX;
    case 2:
    case 3:
        return G_INT | G_FLOAT;
    case 4:
    case 5:
    case 6:
        return G_INT | G_LOGICAL;
    case 7:
    case 8:
    case 9:
        return G_INT;
    case 10:
    case 11:
        return G_PAIR;
    default:
        return G_USER;
    }
}

/* a op b = a + b + 1 on int: associative and commutative. */
static void user_comm(void *in, void *inout, int *len, MPI_Datatype *t)
{
    (void)t;
    int *a = in, *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = a[i] + b[i] + 1;
}

/* 2x2 matrix product mod 2^32 (in * inout): associative, not commutative. */
static void user_mat(void *in, void *inout, int *len, MPI_Datatype *t)
{
    (void)t;
    unsigned *a = in, *b = inout;
    for (int i = 0; i < *len; i++, a += 4, b += 4) {
        unsigned c0 = a[0] * b[0] + a[1] * b[2], c1 = a[0] * b[1] + a[1] * b[3];
        unsigned c2 = a[2] * b[0] + a[3] * b[2], c3 = a[2] * b[1] + a[3] * b[3];
        b[0] = c0, b[1] = c1, b[2] = c2, b[3] = c3;
    }
}

typedef struct { float v; int i; } float_int_t;
typedef struct { double v; int i; } double_int_t;
typedef struct { long v; int i; } long_int_t;
typedef struct { short v; int i; } short_int_t;
typedef struct { long double v; int i; } ldouble_int_t;

static void build_rtypes(void)
{
#define RT(id, nm, ty, g, ctype) rts[id].name = nm, rts[id].t = ty, rts[id].group = g, rts[id].sz = sizeof(ctype)
    RT(T_INT8, "INT8_T", MPI_INT8_T, G_INT, int8_t);
    RT(T_UINT8, "UINT8_T", MPI_UINT8_T, G_INT, uint8_t);
    RT(T_INT16, "INT16_T", MPI_INT16_T, G_INT, int16_t);
    RT(T_UINT16, "UINT16_T", MPI_UINT16_T, G_INT, uint16_t);
    RT(T_INT32, "INT32_T", MPI_INT32_T, G_INT, int32_t);
    RT(T_INT64, "INT64_T", MPI_INT64_T, G_INT, int64_t);
    RT(T_SHORT, "SHORT", MPI_SHORT, G_INT, short);
    RT(T_INT, "INT", MPI_INT, G_INT, int);
    RT(T_LONG, "LONG", MPI_LONG, G_INT, long);
    RT(T_LLONG, "LONG_LONG", MPI_LONG_LONG, G_INT, long long);
    RT(T_USHORT, "UNSIGNED_SHORT", MPI_UNSIGNED_SHORT, G_INT, unsigned short);
    RT(T_UNSIGNED, "UNSIGNED", MPI_UNSIGNED, G_INT, unsigned);
    RT(T_ULONG, "UNSIGNED_LONG", MPI_UNSIGNED_LONG, G_INT, unsigned long);
    RT(T_ULLONG, "UNSIGNED_LONG_LONG", MPI_UNSIGNED_LONG_LONG, G_INT, unsigned long long);
    RT(T_CHAR, "CHAR", MPI_CHAR, G_CHAR, char); /* no op takes it (the standard) */
    RT(T_SCHAR, "SIGNED_CHAR", MPI_SIGNED_CHAR, G_INT, signed char);
    RT(T_UCHAR, "UNSIGNED_CHAR", MPI_UNSIGNED_CHAR, G_INT, unsigned char);
    RT(T_BOOL, "C_BOOL", MPI_C_BOOL, G_LOGICAL, bool);
    RT(T_FLOAT, "FLOAT", MPI_FLOAT, G_FLOAT, float);
    RT(T_DOUBLE, "DOUBLE", MPI_DOUBLE, G_FLOAT, double);
    RT(T_LDOUBLE, "LONG_DOUBLE", MPI_LONG_DOUBLE, G_FLOAT, long double);
    RT(T_CFLOAT, "C_FLOAT_COMPLEX", MPI_C_FLOAT_COMPLEX, G_COMPLEX, float _Complex);
    RT(T_CDOUBLE, "C_DOUBLE_COMPLEX", MPI_C_DOUBLE_COMPLEX, G_COMPLEX, double _Complex);
    RT(T_FLOAT_INT, "FLOAT_INT", MPI_FLOAT_INT, G_PAIR, float_int_t);
    RT(T_DOUBLE_INT, "DOUBLE_INT", MPI_DOUBLE_INT, G_PAIR, double_int_t);
    RT(T_LONG_INT, "LONG_INT", MPI_LONG_INT, G_PAIR, long_int_t);
    RT(T_2INT, "2INT", MPI_2INT, G_PAIR, int[2]);
    RT(T_SHORT_INT, "SHORT_INT", MPI_SHORT_INT, G_PAIR, short_int_t);
    RT(T_LDOUBLE_INT, "LONG_DOUBLE_INT", MPI_LONG_DOUBLE_INT, G_PAIR, ldouble_int_t);
    RT(T_USER_INT, "INT (user op)", MPI_INT, G_USER, int);
    MPI_Datatype m;
    PMPI_Type_contiguous(4, MPI_UNSIGNED, &m);
    RT(T_USER_MAT, "contiguous(4,UNSIGNED) (user op)", commit(m), G_USER, unsigned[4]);
#undef RT
    MPI_Op b[12] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX, MPI_LAND, MPI_LOR,
                    MPI_LXOR, MPI_BAND, MPI_BOR, MPI_BXOR, MPI_MINLOC, MPI_MAXLOC};
    memcpy(ops, b, sizeof b);
    PMPI_Op_create(user_comm, 1, &ops[12]);
    PMPI_Op_create(user_mat, 0, &ops[13]);
}

static int applicable(int op, int ti)
{
    int g = rts[ti].group;
    if (op >= 12) /* each user op takes its own type */
        return (op == 12 && ti == T_USER_INT) || (op == 13 && ti == T_USER_MAT);
    if (!(op_groups(op) & g))
        return 0;
    /* MPI itself may refuse more (an implementation without long double
     * pairs, say): ask it, locally. */
    unsigned char a[64] = {0}, b2[64] = {0};
    return PMPI_Reduce_local(a, b2, 1, rts[ti].t, ops[op]) == MPI_SUCCESS;
}

/* Small values, so that sums and products stay exact and in range. */
static void put_val(unsigned char *e, int ti, int op, size_t i, int rank)
{
    long v = (long)((i * 5u + (unsigned)rank * 3u + seed) % 4u);
    long sv = v - 1; /* -1 .. 2 */
    if (op == 1)     /* products: 1 or 2, or -1 .. 2 signed */
        v = 1 + (v & 1);
    switch (ti) {
    case T_INT8: { int8_t x = (int8_t)sv; memcpy(e, &x, sizeof x); break; }
    case T_UINT8: { uint8_t x = (uint8_t)v; memcpy(e, &x, sizeof x); break; }
    case T_INT16: { int16_t x = (int16_t)(sv * 300); memcpy(e, &x, sizeof x); break; }
    case T_UINT16: { uint16_t x = (uint16_t)(v * 300); memcpy(e, &x, sizeof x); break; }
    case T_INT32: case T_INT: { int32_t x = (int32_t)(sv * 70000 + (long)i); memcpy(e, &x, sizeof x); break; }
    case T_INT64: case T_LONG: case T_LLONG: { int64_t x = sv * 5000000000L + (long)i; memcpy(e, &x, sizeof x); break; }
    case T_SHORT: { short x = (short)(sv * 100 + (long)(i % 50)); memcpy(e, &x, sizeof x); break; }
    case T_USHORT: { unsigned short x = (unsigned short)(v * 100 + (long)(i % 50)); memcpy(e, &x, sizeof x); break; }
    case T_UNSIGNED: { unsigned x = (unsigned)(v * 70000 + (long)i); memcpy(e, &x, sizeof x); break; }
    case T_ULONG: case T_ULLONG: { unsigned long long x = (unsigned long long)v * 5000000000ULL + i; memcpy(e, &x, sizeof x); break; }
    case T_CHAR: case T_SCHAR: { signed char x = (signed char)sv; memcpy(e, &x, 1); break; }
    case T_UCHAR: { unsigned char x = (unsigned char)v; memcpy(e, &x, 1); break; }
    case T_BOOL: { bool x = (v & 1) != 0; memcpy(e, &x, sizeof x); break; }
    case T_FLOAT: { float x = (float)sv * 0.5f; memcpy(e, &x, sizeof x); break; }
    case T_DOUBLE: { double x = (double)sv * 0.25 + (double)(i % 7); memcpy(e, &x, sizeof x); break; }
    case T_LDOUBLE: { long double x = (long double)sv * 0.5L; memset(e, 0, sizeof x); memcpy(e, &x, sizeof x); break; }
    case T_CFLOAT: { float _Complex x = (float)sv + (float)(v & 1) * I; memcpy(e, &x, sizeof x); break; }
    case T_CDOUBLE: { double _Complex x = (double)sv + (double)(i % 3) * I; memcpy(e, &x, sizeof x); break; }
    case T_FLOAT_INT: { float_int_t x; memset(&x, 0, sizeof x); x.v = (float)sv; x.i = rank; memcpy(e, &x, sizeof x); break; }
    case T_DOUBLE_INT: { double_int_t x; memset(&x, 0, sizeof x); x.v = (double)sv; x.i = rank; memcpy(e, &x, sizeof x); break; }
    case T_LONG_INT: { long_int_t x; memset(&x, 0, sizeof x); x.v = sv; x.i = rank; memcpy(e, &x, sizeof x); break; }
    case T_2INT: { int x[2] = {(int)sv, rank}; memcpy(e, x, sizeof x); break; }
    case T_SHORT_INT: { short_int_t x; memset(&x, 0, sizeof x); x.v = (short)sv; x.i = rank; memcpy(e, &x, sizeof x); break; }
    case T_LDOUBLE_INT: { ldouble_int_t x; memset(&x, 0, sizeof x); x.v = (long double)sv; x.i = rank; memcpy(e, &x, sizeof x); break; }
    case T_USER_INT: { int x = (int)(sv * 1000 + (long)i); memcpy(e, &x, sizeof x); break; }
    case T_USER_MAT: { unsigned x[4] = {(unsigned)v + 1u, (unsigned)rank, (unsigned)i, 1u}; memcpy(e, x, sizeof x); break; }
    }
}

/* Bytes of an element that hold data (the rest is padding, which MPI may
 * or may not write): long double's 10 of 16, the pair structs' members. */
static int significant(int ti, size_t b)
{
    switch (ti) {
    case T_LDOUBLE: return b < 10;
    case T_DOUBLE_INT: return b < 12;
    case T_LONG_INT: return b < 12;
    case T_SHORT_INT: return b < 2 || (b >= 4 && b < 8);
    case T_LDOUBLE_INT: return b < 10 || (b >= 16 && b < 20);
    default: return 1;
    }
}

static void mb_typed(mb_t *m, int kind, int ti, size_t count, int op, int fill, int rank)
{
    mb_make(m, kind, rts[ti].t, count, FILL_SENTINEL, 0);
    if (fill != FILL_PATTERN)
        return;
    unsigned char *h = scratch; /* grown by mb_make above */
    memcpy(h, sent0, m->bytes);
    unsigned char *d = h + (m->buf - m->base);
    for (size_t i = 0; i < count; i++)
        put_val(d + i * rts[ti].sz, ti, op, i, rank);
    mb_write(m, h);
}

static void run_red(const case_t *c, int ref, res_t *r)
{
    int even = me % 2 == 0;
    int sk = ref ? M_HOST : (even ? c->ka : c->kb), rk = ref ? M_HOST : (even ? c->kb : c->ka);
    int fam = base_fam(c->fam), nb = is_nb(c->fam), ip = c->inplace, root = c->root;
    int ti = c->rti, n = (int)c->n;
    MPI_Datatype t = rts[ti].t;
    MPI_Op op = ops[c->op];
    MPI_Comm comm = MPI_COMM_WORLD;
    mb_t sb = {0}, rb = {0};
    MPI_Request q = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS, rcnt[64];
    size_t in_n = (size_t)n, out_n = (size_t)n;
    if (fam == F_REDSCAT) {
        in_n = 0;
        for (int i = 0; i < np; i++)
            in_n += (size_t)(rcnt[i] = n ? n + i % 2 : 0);
        out_n = (size_t)rcnt[me];
    } else if (fam == F_REDSCATB) {
        in_n = (size_t)n * (size_t)np;
    }
    /* In place: the input is in the receive buffer (at the root for Reduce). */
    int here = ip && (fam != F_REDUCE || me == root);
    size_t rsize = here ? in_n : out_n;
    if (fam == F_REDUCE && me != root)
        rsize = 0;
    mb_typed(&sb, sk, ti, here ? 0 : in_n, c->op, FILL_PATTERN, me);
    mb_typed(&rb, rk, ti, rsize, c->op, here ? FILL_PATTERN : FILL_SENTINEL, me);
    void *sp = here ? MPI_IN_PLACE : sb.buf;
    switch (fam) {
    case F_REDUCE:
        rc = nb ? finish(ref, X(MPI_Ireduce)(sp, rb.buf, n, t, op, root, comm, &q), &q)
                : X(MPI_Reduce)(sp, rb.buf, n, t, op, root, comm);
        break;
    case F_ALLREDUCE:
        rc = nb ? finish(ref, X(MPI_Iallreduce)(sp, rb.buf, n, t, op, comm, &q), &q)
                : X(MPI_Allreduce)(sp, rb.buf, n, t, op, comm);
        break;
    case F_SCAN:
        rc = nb ? finish(ref, X(MPI_Iscan)(sp, rb.buf, n, t, op, comm, &q), &q)
                : X(MPI_Scan)(sp, rb.buf, n, t, op, comm);
        break;
    case F_EXSCAN:
        rc = nb ? finish(ref, X(MPI_Iexscan)(sp, rb.buf, n, t, op, comm, &q), &q)
                : X(MPI_Exscan)(sp, rb.buf, n, t, op, comm);
        r->skip_out[0] = me == 0; /* undefined on rank 0 */
        break;
    case F_REDSCAT:
        rc = nb ? finish(ref, X(MPI_Ireduce_scatter)(sp, rb.buf, rcnt, t, op, comm, &q), &q)
                : X(MPI_Reduce_scatter)(sp, rb.buf, rcnt, t, op, comm);
        break;
    case F_REDSCATB:
        rc = nb ? finish(ref, X(MPI_Ireduce_scatter_block)(sp, rb.buf, n, t, op, comm, &q), &q)
                : X(MPI_Reduce_scatter_block)(sp, rb.buf, n, t, op, comm);
        break;
    }
    if (here && (fam == F_REDSCAT || fam == F_REDSCATB)) /* only the first block is defined */
        r->nints = (int)out_n;
    else
        r->nints = -1;
    r->rc = rc;
    mb_drop(&sb);
    mb_take(r, 0, &rb);
}

/* ---- comparing a case's run with its reference ---- */

static int is_p2p(int fam) { return fam <= F_IMPROBE; }
static int is_red(int fam) { return base_fam(fam) >= F_REDUCE; }

static void describe(const case_t *c, char *s, size_t len)
{
    if (is_red(c->fam))
        snprintf(s, len, "%s%s %s x %s, count %zu, kinds even %s->%s odd %s->%s", fam_name[c->fam],
                 c->inplace ? " IN_PLACE" : "", op_name[c->op], rts[c->rti].name, c->n,
                 kname[c->ka], kname[c->kb], kname[c->kb], kname[c->ka]);
    else if (is_p2p(c->fam))
        snprintf(s, len, "%s %s, count %zu, send %s, receive %s", fam_name[c->fam], c->dt->name,
                 c->n, kname[c->ka], kname[c->kb]);
    else
        snprintf(s, len, "%s%s %s, count %zu, root %d, kinds even %s->%s odd %s->%s",
                 fam_name[c->fam], c->inplace ? " IN_PLACE" : "", c->dt->name, c->n, c->root,
                 kname[c->ka], kname[c->kb], kname[c->kb], kname[c->ka]);
}

/* 0, or a description of the first difference (into why). */
static int compare(const case_t *c, const res_t *ref, const res_t *got, char *why, size_t len)
{
    if (got->rc != ref->rc) {
        snprintf(why, len, "return code %d, reference %d", got->rc, ref->rc);
        return 1;
    }
    if (is_p2p(c->fam) && (got->count != ref->count || got->source != ref->source || got->tag != ref->tag)) {
        snprintf(why, len, "status: count %d source %d tag %d, reference count %d source %d tag %d",
                 got->count, got->source, got->tag, ref->count, ref->source, ref->tag);
        return 1;
    }
    for (int k = 0; k < NOUT; k++) {
        if (!ref->d[k] || got->skip_out[k] || ref->skip_out[k])
            continue;
        if (got->n[k] != ref->n[k]) {
            snprintf(why, len, "buffer %d: %zu bytes, reference %zu", k, got->n[k], ref->n[k]);
            return 1;
        }
        size_t esz = 0, lo = 0, hi = 0;
        ptrdiff_t off = 0;
        if (is_red(c->fam)) {
            esz = rts[c->rti].sz;
            geom(rts[c->rti].t, 1, &off); /* data start in the allocation */
            lo = (size_t)off;
            hi = ref->nints >= 0 ? lo + (size_t)ref->nints * esz : ref->n[k];
        }
        if (!memcmp(got->d[k], ref->d[k], ref->n[k]))
            continue;
        for (size_t b = 0; b < ref->n[k]; b++) {
            if (got->d[k][b] == ref->d[k][b])
                continue;
            if (esz && b >= lo && b < ref->n[k] - MARGIN) {
                /* Inside the data: padding bytes count only where the
                 * reference left the sentinel; in-place reduce_scatter
                 * defines only the first block. */
                if (b >= hi)
                    continue;
                if (!significant(c->rti, (b - lo) % esz))
                    continue; /* padding: MPI's own nonblocking reductions leave it varying */
            }
            snprintf(why, len, "byte %zu of %zu (buf at +%td): expected 0x%02x, found 0x%02x%s", b,
                     ref->n[k], esz ? (ptrdiff_t)lo : (ptrdiff_t)0, ref->d[k][b], got->d[k][b],
                     got->d[k][b] == sentinel(b) ? " (the sentinel: not written)" : "");
            return 1;
        }
    }
    return 0;
}

static void on_crash(int sig)
{
    char m[512];
    int k = snprintf(m, sizeof m, "# rank %d: signal %d during case: %s\n", me, sig, current);
    if (k > 0)
        (void)!write(2, m, (size_t)k < sizeof m ? (size_t)k : sizeof m - 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The reference run depends on the case less its memory kinds (it runs on
 * host buffers): the kind pairs of one case, run one after the other,
 * share it (it was half the time of the full matrix). */
static res_t ref_kept;
static case_t ref_key;
static int ref_valid;

static int same_ref(const case_t *a, const case_t *b)
{
    return a->fam == b->fam && a->dt == b->dt && a->rti == b->rti && a->op == b->op && a->n == b->n &&
           a->inplace == b->inplace && a->root == b->root;
}

static void ref_forget(void)
{
    if (ref_valid)
        res_free(&ref_kept);
    ref_valid = 0;
}

static void run_case(case_t *c)
{
    res_t got;
    memset(&got, 0, sizeof got);
    describe(c, current, sizeof current);
    void (*fn)(const case_t *, int, res_t *) = is_p2p(c->fam) ? run_p2p : is_red(c->fam) ? run_red : run_coll;
    double t0 = PMPI_Wtime();
    if (!ref_valid || !same_ref(c, &ref_key)) {
        ref_forget();
        memset(&ref_kept, 0, sizeof ref_kept);
        fn(c, 1, &ref_kept);
        k_reset();
        ref_key = *c;
        ref_valid = 1;
    }
    const res_t *ref = &ref_kept;
    double t1 = PMPI_Wtime();
    fn(c, 0, &got);
    k_reset();
    double t2 = PMPI_Wtime();
    stats[c->fam].t_ref += t1 - t0;
    stats[c->fam].t_got += t2 - t1;
    /* Where the time goes (a TAP comment per family; rank 0's clock). */
    for (int i = 0; i < NSLOW; i++)
        if (t2 - t1 > stats[c->fam].slow_t[i]) {
            memmove(&stats[c->fam].slow_t[i + 1], &stats[c->fam].slow_t[i], sizeof(double) * (NSLOW - 1 - i));
            memmove(stats[c->fam].slow[i + 1], stats[c->fam].slow[i], sizeof stats[c->fam].slow[0] * (NSLOW - 1 - i));
            stats[c->fam].slow_t[i] = t2 - t1;
            snprintf(stats[c->fam].slow[i], sizeof stats[c->fam].slow[i], "%s", current);
            break;
        }
    char why[300] = "";
    int bad = compare(c, ref, &got, why, sizeof why);
    res_free(&got);
    /* Every rank learns whether the case failed; rank 0 gets the first
     * failing rank's description. */
    int who = bad ? me : np, first = np;
    PMPI_Allreduce(&who, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    stats[c->fam].cases++;
    if (first == np)
        return;
    long nf = stats[c->fam].failed++;
    if (nf >= MAXFIRST)
        return;
    char line[800];
    snprintf(line, sizeof line, "%s: rank %d: %s", current, first, why);
    if (first != 0 && me == first)
        PMPI_Send(line, (int)sizeof line, MPI_CHAR, 0, 99, MPI_COMM_WORLD);
    if (me == 0) {
        if (first != 0)
            PMPI_Recv(line, (int)sizeof line, MPI_CHAR, first, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        memcpy(stats[c->fam].first[nf], line, sizeof line);
    }
}

/* ---- the matrix ---- */

static size_t counts[8];
static int ncounts;
static unsigned long long rng = 88172645463325252ull;

static unsigned rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng >> 11);
}

/* Kind pairs for one case: all when there are 2 kinds or fewer; else the
 * device against host and itself, and two more in turn (the same on
 * every rank: one generator, one seed). */
static int pairs(int pa[][2])
{
    int m = 0;
    if (nkinds <= 2) {
        for (int a = 0; a < nkinds; a++)
            for (int b = 0; b < nkinds; b++)
                pa[m][0] = kinds[a], pa[m][1] = kinds[b], m++;
        return m;
    }
    int dev = kind_on[M_DEV] ? M_DEV : kinds[nkinds - 1], host = kind_on[M_HOST] ? M_HOST : kinds[0];
    pa[m][0] = dev, pa[m][1] = dev, m++;
    pa[m][0] = host, pa[m][1] = dev, m++;
    pa[m][0] = dev, pa[m][1] = host, m++;
    for (int j = 0; j < 2; j++) {
        pa[m][0] = kinds[rnd() % (unsigned)nkinds];
        pa[m][1] = kinds[rnd() % (unsigned)nkinds];
        m++;
    }
    return m;
}

static int has_inplace(int fam)
{
    fam = base_fam(fam);
    return fam == F_GATHER || fam == F_GATHERV || fam == F_SCATTER || fam == F_SCATTERV ||
           fam == F_ALLGATHER || fam == F_ALLGATHERV || fam == F_ALLTOALL || fam == F_ALLTOALLV ||
           fam == F_ALLTOALLW || is_red(fam);
}

/* The largest buffer a case needs (cases above --max are skipped). */
static size_t case_bytes(const case_t *c)
{
    size_t blocks = is_p2p(c->fam) ? 1 : (size_t)np + 1;
    if (is_red(c->fam))
        return span_of(rts[c->rti].t, c->n * blocks);
    size_t a = span_of(c->dt->s, c->n * blocks), b = span_of(c->dt->r, (c->n * c->dt->rmul + 1) * blocks);
    return a > b ? a : b;
}

static void run_family(int fam)
{
    int pa[NKIND * NKIND][2];
    case_t c;
    memset(&c, 0, sizeof c);
    c.fam = fam;
    if (is_red(fam)) {
        for (int op = 0; op < NOPS; op++)
            for (int ti = 0; ti < NRT; ti++) {
                if (!applicable(op, ti))
                    continue;
                for (int ci = 0; ci < ncounts; ci++)
                    for (int ip = 0; ip < 2; ip++) {
                        int m = pairs(pa);
                        /* Quick: one kind pair of the four in turn. */
                        for (int j = 0; j < m; j++) {
                            if (quick && nkinds == 2 && (unsigned)j != (unsigned)(op + ti + ci + ip) % (unsigned)m)
                                continue;
                            c.op = op, c.rti = ti, c.n = counts[ci], c.inplace = ip;
                            c.ka = pa[j][0], c.kb = pa[j][1];
                            c.root = (int)((unsigned)(op + ti) % (unsigned)np);
                            if (case_bytes(&c) > max_bytes) {
                                stats[fam].skipped++;
                                continue;
                            }
                            run_case(&c);
                        }
                    }
            }
        return;
    }
    for (int d = 0; d < ndts; d++)
        for (int ci = 0; ci < ncounts; ci++)
            for (int ip = 0; ip < 1 + has_inplace(fam); ip++) {
                int m = pairs(pa);
                for (int j = 0; j < m; j++) {
                    c.dt = &dts[d], c.n = counts[ci], c.inplace = ip;
                    c.ka = pa[j][0], c.kb = pa[j][1];
                    c.root = (int)((unsigned)(d + ci) % (unsigned)np);
                    /* In place takes one datatype for both sides. */
                    if (ip && dts[d].rmul != 1)
                        continue;
                    if (case_bytes(&c) > max_bytes) {
                        stats[fam].skipped++;
                        continue;
                    }
                    run_case(&c);
                }
            }
}

static int pick(const char *list, const char *const *names, int n, int *on)
{
    char *dup = strdup(list), *save = NULL;
    int ok = 1;
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int i = 0; i < n; i++)
            if (!strcmp(t, names[i]) || !strcmp(t, "all"))
                on[i] = 1, found = 1;
        if (!found) {
            if (me == 0)
                fprintf(stderr, "unknown name '%s'\n", t);
            ok = 0;
        }
    }
    free(dup);
    return ok;
}

static int have_gpu(void)
{
#ifdef RKT_FAKE
    return 1;
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

int main(int argc, char **argv)
{
    const char *calls = NULL, *klist = NULL;
    int list = 0, full = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1, full = 0;
        else if (!strcmp(argv[i], "--full"))
            full = 1, quick = 0;
        else if (!strcmp(argv[i], "--calls") && i + 1 < argc)
            calls = argv[++i];
        else if (!strcmp(argv[i], "--kinds") && i + 1 < argc)
            klist = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = (unsigned)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--max") && i + 1 < argc)
            max_bytes = (size_t)strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--unguarded"))
            guarded = 0;
        else if (!strcmp(argv[i], "--list"))
            list = 1;
    }
    if (!max_bytes)
        max_bytes = full ? (size_t)64 << 20 : (size_t)8 << 20;
#ifdef __GLIBC__
    /* Buffers of up to 32 MiB come from the heap and stay there between
     * cases: fresh mappings each case made page faults a third of the time. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
#ifdef RKT_FAKE
    {
        /* One memory file, mapped twice: PROT_NONE where the program and
         * MPI see "device" memory, read/write where the test backend
         * copies (and peers map it through /proc for CUDA IPC). */
        int fd = memfd_create("rankmem-fake-device", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)fsize) != 0)
            return 1;
        fregion = mmap(NULL, fsize, guarded ? PROT_NONE : PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_NORESERVE, fd, 0);
        if (fregion == MAP_FAILED)
            return 1;
        if (guarded) {
            falias = mmap(NULL, fsize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
            if (falias == MAP_FAILED)
                return 1;
            rk_stg_fake_alias(falias);
        }
        rk_stg_fake_device(fregion, fsize);
        rk_stg_fake_ipc(fd);
    }
#endif
    MPI_Init(&argc, &argv);
#ifdef RKT_FAKE
    rk_mpi_staging_init(); /* as init.c does (a no-op when it did) */
#endif
    PMPI_Comm_rank(MPI_COMM_WORLD, &me);
    PMPI_Comm_size(MPI_COMM_WORLD, &np);
    PMPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    PMPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    rng ^= (unsigned long long)seed * 0x9E3779B97F4A7C15ull;
    if (list) {
        if (me == 0) {
            for (int f = 0; f < NFAM; f++)
                printf("%s%s", f ? "," : "# calls: ", fam_name[f]);
            printf("\n# kinds: host,dev,async,managed,pinned,reg,pool\n");
        }
        MPI_Finalize();
        return 0;
    }
    if (np < 2 || np > 64) {
        mskip("needs 2 to 64 ranks");
        MPI_Finalize();
        return 0;
    }
    int g = have_gpu(), all = 0;
    PMPI_Allreduce(&g, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        mskip("no GPU (device buffers cannot be tested here)");
        MPI_Finalize();
        return 0;
    }
    if (!pick(calls ? calls : "all", fam_name, NFAM, fam_on))
        MPI_Abort(MPI_COMM_WORLD, 2);
    int want[NKIND] = {0};
    if (!pick(klist ? klist : "all", kname, NKIND, want))
        MPI_Abort(MPI_COMM_WORLD, 2);
#ifdef RKT_FAKE
    kind_on[M_HOST] = want[M_HOST];
    kind_on[M_DEV] = want[M_DEV];
#else
    for (int k = 0; k < M_POOL; k++)
        kind_on[k] = want[k];
    if (want[M_POOL]) {
        /* The rank's resource (RANKMEM_RESOURCE), as staging_test --vmm. */
        pool = rankmem_mpi_resource();
        kind_on[M_POOL] = pool != NULL;
    }
#endif
    {
        int mine[NKIND], agreed[NKIND];
        memcpy(mine, kind_on, sizeof mine);
        PMPI_Allreduce(mine, agreed, NKIND, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        memcpy(kind_on, agreed, sizeof agreed);
    }
    for (int k = 0; k < NKIND; k++)
        if (kind_on[k])
            kinds[nkinds++] = k;
    if (!nkinds) {
        mskip("no memory kind selected");
        MPI_Finalize();
        return 0;
    }
    size_t qc[] = {0, 1, 17}, fc[] = {0, 1, 17, 512, 65530};
    ncounts = 0;
    for (size_t i = 0; i < (full ? 5u : 3u); i++)
        counts[ncounts++] = full ? fc[i] : qc[i];
    {
        int dims[1] = {np}, per[1] = {1};
        PMPI_Cart_create(MPI_COMM_WORLD, 1, dims, per, 0, &ring);
        PMPI_Comm_set_errhandler(ring, MPI_ERRORS_RETURN);
    }
    build_types();
    build_rtypes();
    signal(SIGSEGV, on_crash);
    signal(SIGBUS, on_crash);
    char kl[128] = "";
    for (int k = 0; k < nkinds; k++)
        snprintf(kl + strlen(kl), sizeof kl - strlen(kl), "%s%s", k ? "," : "", kname[kinds[k]]);
    mdiag("dt_matrix: %d ranks, %s, kinds %s, %d datatypes, largest buffer %zu bytes, seed %u%s", np,
          full ? "full" : "quick", kl, ndts, max_bytes, seed,
#ifdef RKT_FAKE
          guarded ? ", fake device guarded (PROT_NONE)" : ", fake device unguarded"
#else
          ""
#endif
    );
    for (int f = 0; f < NFAM; f++) {
        if (!fam_on[f])
            continue;
        double t0 = PMPI_Wtime();
        run_family(f);
        ref_forget();
        stats[f].t_all = PMPI_Wtime() - t0;
        mdiag("%s: %.1f s (reference runs %.1f s, through the plugin %.1f s); slowest: %.3f s %s; %.3f s %s",
              fam_name[f], stats[f].t_all, stats[f].t_ref, stats[f].t_got, stats[f].slow_t[0], stats[f].slow[0],
              stats[f].slow_t[1], stats[f].slow[1]);
        int ok = stats[f].failed == 0 && stats[f].cases > 0;
        for (int i = 0; i < MAXFIRST && i < stats[f].failed; i++)
            mdiag("  %s", stats[f].first[i]);
        mok(ok, "%s: %ld cases, %ld failed%s", fam_name[f], stats[f].cases, stats[f].failed,
            stats[f].skipped ? " (some over --max skipped)" : "");
    }
    PMPI_Barrier(MPI_COMM_WORLD);
#ifdef RKT_FAKE
    rk_mpi_staging_finalize();
#endif
    MPI_Finalize();
    return mtap_failed_ ? 1 : 0;
}
