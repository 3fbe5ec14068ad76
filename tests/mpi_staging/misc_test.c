/* The other calls that take a buffer (mpi/staging/misc.c), each with every
 * combination of host and device buffers, checked byte for byte against
 * the same call on host buffers: MPI_Pack/Unpack (native and external32),
 * MPI_Reduce_local, MPI-IO (blocking, nonblocking, split collectives,
 * short reads), one-sided origin buffers under every kind of
 * synchronisation, and the refusal of device memory as a window. Each
 * datatype is tried with counts 0, 1, 17 and 512: int, a vector with a
 * stride, a struct with a hole, a resized type with a nonzero lower bound.
 * Destinations start as a sentinel, which must survive in the gaps.
 *
 *   misc_fake (-DRKT_FAKE, the plugin's sources built in): "device" memory
 *       is a memory file mapped twice: the address the program passes is
 *       PROT_NONE (MPI or the plugin touching it directly would fault),
 *       the copies go through the second mapping.
 *   misc_gpu (linked with the plugin): cudaMalloc buffers; skipped without
 *       a GPU.
 * MPI 4's large-count forms and the calls refused with device buffers
 * (MPICH 4). An argument (pack, io, rma, mpi4) runs one part only. */
#define _GNU_SOURCE
#include "config.h"

#include <mpi.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>

#include "mtap.h"

int ftruncate(int fd, off_t length); /* <unistd.h>, whose F_* names clash with ours */
int unlink(const char *path);
pid_t getpid(void);

#ifdef RKT_FAKE
#include "staging/staging.h"
#elif HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static int me, np, left, right;

/* ---- buffers ---- */

#ifdef RKT_FAKE
static char *freg, *falias;
static size_t fsize = (size_t)256 << 20, fused;
#endif

typedef struct {
    char *p;
    int dev;
    size_t n;
} buf_t;

static buf_t live[16];
static int nlive;

static int have_device(void)
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

static void *dev_alloc(size_t n)
{
#ifdef RKT_FAKE
    size_t a = (fused + 255) & ~(size_t)255;
    if (a + n > fsize) {
        fprintf(stderr, "fake device region exhausted\n");
        abort();
    }
    fused = a + n;
    return freg + a;
#elif HAVE_CUDA
    void *p = NULL;
    if (cudaMalloc(&p, n) != cudaSuccess)
        abort();
    return p;
#else
    (void)n;
    abort();
#endif
}

static void to_dev(void *d, const void *h, size_t n)
{
#ifdef RKT_FAKE
    memcpy(falias + ((char *)d - freg), h, n);
#elif HAVE_CUDA
    if (cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess)
        abort();
#else
    (void)d, (void)h, (void)n;
#endif
}

static void from_dev(void *h, const void *d, size_t n)
{
#ifdef RKT_FAKE
    memcpy(h, falias + ((const char *)d - freg), n);
#elif HAVE_CUDA
    if (cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) != cudaSuccess)
        abort();
#else
    (void)d; /* no device here: never called (the tests skip), zeros to be defined */
    memset(h, 0, n);
#endif
}

/* The pattern a buffer starts with: seed 0 is the sentinel. */
static unsigned char pat(size_t i, unsigned seed)
{
    return seed ? (unsigned char)(i * 131u + seed * 29u + (unsigned)me * 7u + 1u) : 0x5a;
}

/* A buffer of n bytes (device or host) holding pattern seed. */
static char *mk(int dev, size_t n, unsigned seed)
{
    if (n == 0)
        n = 1;
    unsigned char *h = malloc(n);
    if (!h || nlive == (int)(sizeof live / sizeof live[0]))
        abort();
    for (size_t i = 0; i < n; i++)
        h[i] = pat(i, seed);
    char *p = (char *)h;
    if (dev) {
        p = dev_alloc(n);
        to_dev(p, h, n);
        free(h);
    }
    live[nlive++] = (buf_t){p, dev, n};
    return p;
}

static buf_t *find(const void *p)
{
    for (int i = 0; i < nlive; i++)
        if (live[i].p == p)
            return &live[i];
    abort();
}

static void free_all(void)
{
    for (int i = 0; i < nlive; i++) {
        if (!live[i].dev)
            free(live[i].p);
#if !defined(RKT_FAKE) && HAVE_CUDA
        else
            cudaFree(live[i].p);
#endif
    }
    nlive = 0;
#ifdef RKT_FAKE
    fused = 0;
#endif
}

/* ---- what a run produced: the bytes compared with the reference ---- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
} out_t;

static void oadd(out_t *o, const void *p, size_t n)
{
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2 + 64;
        o->p = realloc(o->p, o->cap);
        if (!o->p)
            abort();
    }
    memcpy(o->p + o->n, p, n);
    o->n += n;
}

static void oint(out_t *o, long v) { oadd(o, &v, sizeof v); }

/* A buffer's whole content. */
static void grab(out_t *o, const void *p)
{
    buf_t *b = find(p);
    if (!b->dev) {
        oadd(o, b->p, b->n);
        return;
    }
    char *h = malloc(b->n);
    from_dev(h, b->p, b->n);
    oadd(o, h, b->n);
    free(h);
}

/* What MPI says a status holds. */
static void ostatus(out_t *o, MPI_Status *st, MPI_Datatype dt)
{
    int c = 0, e = 0, b = 0;
    MPI_Get_count(st, MPI_BYTE, &b);
    MPI_Get_count(st, dt, &c);
    MPI_Get_elements(st, dt, &e);
    oint(o, b), oint(o, c), oint(o, e);
}

/* ---- datatypes ---- */

typedef struct {
    const char *name;
    MPI_Datatype dt;
    MPI_Aint lb, ext, tlb, text;
    int size;
} ty_t;

static ty_t tys[4];
static const int counts[] = {0, 1, 17, 512};
#define NCOUNTS 4

static void ty_set(ty_t *t, const char *name, MPI_Datatype dt)
{
    t->name = name;
    t->dt = dt;
    MPI_Type_get_extent(dt, &t->lb, &t->ext);
    MPI_Type_get_true_extent(dt, &t->tlb, &t->text);
    MPI_Type_size(dt, &t->size);
}

static void make_types(void)
{
    MPI_Datatype v, s, h, r;
    MPI_Type_vector(3, 2, 5, MPI_INT, &v); /* 2 ints of every 5 */
    MPI_Type_commit(&v);
    int bl[2] = {1, 2};
    MPI_Aint sd[2] = {0, 8};
    MPI_Datatype st[2] = {MPI_INT, MPI_INT};
    MPI_Type_create_struct(2, bl, sd, st, &s); /* a hole at bytes 4..8 */
    MPI_Type_commit(&s);
    MPI_Aint hd[2] = {8, 16};
    MPI_Type_create_hindexed(2, bl, hd, MPI_INT, &h); /* data at 8..12 and 16..24 */
    MPI_Type_create_resized(h, 4, 28, &r);
    MPI_Type_free(&h);
    MPI_Type_commit(&r);
    ty_set(&tys[0], "int", MPI_INT);
    ty_set(&tys[1], "vector", v);
    ty_set(&tys[2], "struct", s);
    ty_set(&tys[3], "resized", r);
}

/* Bytes a buffer of n elements needs (from its address), with a margin
 * after it that must stay as it was. */
static size_t span(const ty_t *t, int n)
{
    return (n ? (size_t)(n - 1) * (size_t)t->ext + (size_t)(t->tlb + t->text) : 0) + 40;
}

/* ---- the harness ---- */

/* One run of an operation: bit i of mask set, buffer argument i is device
 * memory. */
typedef void (*op_fn)(int mask, const ty_t *t, int n, out_t *o);

static void first_diff(const out_t *a, const out_t *b, char *why, size_t len)
{
    size_t i = 0;
    while (i < a->n && i < b->n && a->p[i] == b->p[i])
        i++;
    snprintf(why, len, "byte %zu of %zu/%zu: %02x, reference %02x", i, b->n, a->n,
             i < b->n ? b->p[i] : 0, i < a->n ? a->p[i] : 0);
}

/* Every type (those of types: bit i for tys[i]; 0: all), every count,
 * every combination of device buffers among nbufs, against all-host. */
static void check_op(const char *name, op_fn fn, int nbufs, int types)
{
    for (int ti = 0; ti < 4; ti++) {
        const ty_t *t = &tys[ti];
        if (types && !(types & (1 << ti)))
            continue;
        int ok = 1;
        char why[256] = "";
        for (int ci = 0; ci < NCOUNTS; ci++) {
            out_t ref = {0};
            fn(0, t, counts[ci], &ref);
            free_all();
            /* RKT_MISC_HOST_ONLY: the reference alone (is MPI itself right?) */
            int masks = getenv("RKT_MISC_HOST_ONLY") ? 1 : 1 << nbufs;
            for (int mask = 1; mask < masks; mask++) {
                out_t got = {0};
                fn(mask, t, counts[ci], &got);
                free_all();
                if (ok && (got.n != ref.n || memcmp(got.p, ref.p, ref.n))) {
                    ok = 0;
                    first_diff(&ref, &got, why, sizeof why);
                    fprintf(stderr, "# rank %d: %s %s count %d device mask %d: %s\n", me, name,
                            t->name, counts[ci], mask, why);
                }
                free(got.p);
            }
            free(ref.p);
        }
        mok(ok, "%s, %s: counts 0 1 17 512, every mix of host and device buffers", name,
            t->name);
    }
}

/* ---- Pack, Unpack ---- */

static void op_pack(int mask, const ty_t *t, int n, out_t *o)
{
    char *in = mk(mask & 1, span(t, n), 3);
    int psz = 0;
    MPI_Pack_size(n, t->dt, MPI_COMM_WORLD, &psz);
    int size = 7 + 2 * psz + 16, pos = 7;
    char *out = mk(mask & 2, (size_t)size, 0);
    int rc = MPI_Pack(in, n, t->dt, out, size, &pos, MPI_COMM_WORLD);
    oint(o, rc), oint(o, pos);
    rc = MPI_Pack(in, n, t->dt, out, size, &pos, MPI_COMM_WORLD); /* after the first */
    oint(o, rc), oint(o, pos);
    grab(o, out);
    grab(o, in);
}

static void op_unpack(int mask, const ty_t *t, int n, out_t *o)
{
    int psz = 0, pos = 5;
    MPI_Pack_size(n, t->dt, MPI_COMM_WORLD, &psz);
    int size = 5 + 2 * psz + 16;
    char *h = mk(0, span(t, n), 4), *packed = malloc((size_t)size);
    memset(packed, 0x11, (size_t)size);
    MPI_Pack(h, n, t->dt, packed, size, &pos, MPI_COMM_WORLD);
    for (size_t i = 0; i < span(t, n); i++)
        h[i] = (char)pat(i, 9);
    MPI_Pack(h, n, t->dt, packed, size, &pos, MPI_COMM_WORLD);
    char *in = mk(mask & 1, (size_t)size, 1);
    buf_t *ib = find(in);
    if (ib->dev)
        to_dev(in, packed, (size_t)size);
    else
        memcpy(in, packed, (size_t)size);
    free(packed);
    char *a = mk(mask & 2, span(t, n), 0), *b = mk(mask & 2, span(t, n), 0);
    pos = 5;
    int rc = MPI_Unpack(in, size, &pos, a, n, t->dt, MPI_COMM_WORLD);
    oint(o, rc), oint(o, pos);
    rc = MPI_Unpack(in, size, &pos, b, n, t->dt, MPI_COMM_WORLD);
    oint(o, rc), oint(o, pos);
    grab(o, a);
    grab(o, b);
}

static void op_pack_ext(int mask, const ty_t *t, int n, out_t *o)
{
    char *in = mk(mask & 1, span(t, n), 3);
    MPI_Aint psz = 0, pos = 3;
    MPI_Pack_external_size("external32", n, t->dt, &psz);
    MPI_Aint size = 3 + 2 * psz + 16;
    char *out = mk(mask & 2, (size_t)size, 0);
    int rc = MPI_Pack_external("external32", in, n, t->dt, out, size, &pos);
    oint(o, rc), oint(o, (long)pos);
    rc = MPI_Pack_external("external32", in, n, t->dt, out, size, &pos);
    oint(o, rc), oint(o, (long)pos);
    grab(o, out);
}

static void op_unpack_ext(int mask, const ty_t *t, int n, out_t *o)
{
    MPI_Aint psz = 0, pos = 2;
    MPI_Pack_external_size("external32", n, t->dt, &psz);
    MPI_Aint size = 2 + 2 * psz + 16;
    char *h = mk(0, span(t, n), 4), *packed = malloc((size_t)size);
    memset(packed, 0x22, (size_t)size);
    MPI_Pack_external("external32", h, n, t->dt, packed, size, &pos);
    MPI_Pack_external("external32", h, n, t->dt, packed, size, &pos);
    char *in = mk(mask & 1, (size_t)size, 1);
    if (find(in)->dev)
        to_dev(in, packed, (size_t)size);
    else
        memcpy(in, packed, (size_t)size);
    free(packed);
    char *a = mk(mask & 2, span(t, n), 0), *b = mk(mask & 2, span(t, n), 0);
    pos = 2;
    int rc = MPI_Unpack_external("external32", in, size, &pos, a, n, t->dt);
    oint(o, rc), oint(o, (long)pos);
    rc = MPI_Unpack_external("external32", in, size, &pos, b, n, t->dt);
    oint(o, rc), oint(o, (long)pos);
    grab(o, a);
    grab(o, b);
}

/* ---- Reduce_local ---- */

/* Predefined operations take predefined datatypes only (Open MPI refuses
 * others): derived ones go through an operation of ours that knows where
 * each type's ints are. */
static const int int_offs[4][7] = {
    {0, -1}, {0, 4, 20, 24, 40, 44, -1}, {0, 8, 12, -1}, {8, 16, 20, -1}};
static const ty_t *op_ty;

static void user_add(void *in, void *io, int *len, MPI_Datatype *dt)
{
    (void)dt;
    int ti = (int)(op_ty - tys);
    for (int i = 0; i < *len; i++)
        for (const int *k = int_offs[ti]; *k >= 0; k++) {
            int a, b;
            size_t at = (size_t)i * (size_t)op_ty->ext + (size_t)*k;
            memcpy(&a, (char *)in + at, 4);
            memcpy(&b, (char *)io + at, 4);
            b = (int)((unsigned)a + (unsigned)b);
            memcpy((char *)io + at, &b, 4);
        }
}

static void op_reduce_local(int mask, const ty_t *t, int n, out_t *o)
{
    char *in = mk(mask & 1, span(t, n), 5), *io = mk(mask & 2, span(t, n), 6);
    MPI_Op add;
    op_ty = t;
    MPI_Op_create(user_add, 1, &add);
    if (t->dt == MPI_INT) {
        oint(o, MPI_Reduce_local(in, io, n, t->dt, MPI_SUM));
        oint(o, MPI_Reduce_local(in, io, n, t->dt, MPI_BXOR));
    }
    oint(o, MPI_Reduce_local(in, io, n, t->dt, add));
    MPI_Op_free(&add);
    grab(o, io);
    grab(o, in);
}

/* ---- MPI-IO ---- */

static MPI_File fh;
static char fpath[512];
#define SLOT ((MPI_Offset)64 << 10) /* each rank's part of the file */

/* The file as every rank sees it: its size and bytes. */
static void grab_file(out_t *o)
{
    MPI_Offset sz = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_get_size(fh, &sz);
    oint(o, (long)sz);
    char *h = malloc((size_t)sz + 1);
    MPI_Status st;
    MPI_File_read_at(fh, 0, h, (int)sz, MPI_BYTE, &st);
    oadd(o, h, (size_t)sz);
    free(h);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Each rank's part holds pattern bytes (host writes), the file the same
 * size each time. Neither MPI_File_set_size (Open MPI 4.1's OMPIO loses
 * other ranks' writes that follow it now and then, and takes 100 ms) nor
 * MPI_File_sync (a local file: a barrier is enough to see other ranks'
 * writes, and fsync costs 10 ms a call) is used. */
static void file_prepare(void)
{
    unsigned char *h = malloc((size_t)SLOT);
    for (size_t i = 0; i < (size_t)SLOT; i++)
        h[i] = pat(i, 8);
    MPI_Status st;
    MPI_File_write_at(fh, (MPI_Offset)me * SLOT, h, (int)SLOT, MPI_BYTE, &st);
    free(h);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_File_seek_shared(fh, 0, MPI_SEEK_SET);
}

enum { IO_IND, IO_AT, IO_ALL, IO_AT_ALL, IO_SHARED, IO_ORDERED };
enum { F_BLOCK, F_NONBLOCK, F_SPLIT };

/* One file call: read (rd) or write, form f, mode m, on buf. */
static int io_call(int rd, int f, int m, char *buf, int n, MPI_Datatype dt, MPI_Status *st)
{
    MPI_Offset off = (MPI_Offset)me * SLOT;
    MPI_Request q;
    int rc = MPI_SUCCESS;
    if (m == IO_IND || m == IO_ALL)
        MPI_File_seek(fh, off, MPI_SEEK_SET);
    if (f == F_BLOCK) {
        switch (m) {
        case IO_IND: return rd ? MPI_File_read(fh, buf, n, dt, st) : MPI_File_write(fh, buf, n, dt, st);
        case IO_AT: return rd ? MPI_File_read_at(fh, off, buf, n, dt, st) : MPI_File_write_at(fh, off, buf, n, dt, st);
        case IO_ALL: return rd ? MPI_File_read_all(fh, buf, n, dt, st) : MPI_File_write_all(fh, buf, n, dt, st);
        case IO_AT_ALL: return rd ? MPI_File_read_at_all(fh, off, buf, n, dt, st) : MPI_File_write_at_all(fh, off, buf, n, dt, st);
        case IO_SHARED: return rd ? MPI_File_read_shared(fh, buf, n, dt, st) : MPI_File_write_shared(fh, buf, n, dt, st);
        default: return rd ? MPI_File_read_ordered(fh, buf, n, dt, st) : MPI_File_write_ordered(fh, buf, n, dt, st);
        }
    }
    if (f == F_NONBLOCK) {
        switch (m) {
        case IO_IND: rc = rd ? MPI_File_iread(fh, buf, n, dt, &q) : MPI_File_iwrite(fh, buf, n, dt, &q); break;
        case IO_AT: rc = rd ? MPI_File_iread_at(fh, off, buf, n, dt, &q) : MPI_File_iwrite_at(fh, off, buf, n, dt, &q); break;
        case IO_ALL: rc = rd ? MPI_File_iread_all(fh, buf, n, dt, &q) : MPI_File_iwrite_all(fh, buf, n, dt, &q); break;
        case IO_AT_ALL: rc = rd ? MPI_File_iread_at_all(fh, off, buf, n, dt, &q) : MPI_File_iwrite_at_all(fh, off, buf, n, dt, &q); break;
        default: rc = rd ? MPI_File_iread_shared(fh, buf, n, dt, &q) : MPI_File_iwrite_shared(fh, buf, n, dt, &q); break;
        }
        return rc != MPI_SUCCESS ? rc : MPI_Wait(&q, st);
    }
    switch (m) {
    case IO_ALL:
        rc = rd ? MPI_File_read_all_begin(fh, buf, n, dt) : MPI_File_write_all_begin(fh, buf, n, dt);
        return rc ? rc : rd ? MPI_File_read_all_end(fh, buf, st) : MPI_File_write_all_end(fh, buf, st);
    case IO_AT_ALL:
        rc = rd ? MPI_File_read_at_all_begin(fh, off, buf, n, dt) : MPI_File_write_at_all_begin(fh, off, buf, n, dt);
        return rc ? rc : rd ? MPI_File_read_at_all_end(fh, buf, st) : MPI_File_write_at_all_end(fh, buf, st);
    default:
        rc = rd ? MPI_File_read_ordered_begin(fh, buf, n, dt) : MPI_File_write_ordered_begin(fh, buf, n, dt);
        return rc ? rc : rd ? MPI_File_read_ordered_end(fh, buf, st) : MPI_File_write_ordered_end(fh, buf, st);
    }
}

/* A call on the shared file pointer by one rank after the other (their
 * order is MPI's otherwise). */
static int io_turns(int rd, int f, int m, char *buf, int n, MPI_Datatype dt, MPI_Status *st)
{
    int rc = MPI_SUCCESS;
    if (m != IO_SHARED)
        return io_call(rd, f, m, buf, n, dt, st);
    for (int r = 0; r < np; r++) {
        if (r == me)
            rc = io_call(rd, f, m, buf, n, dt, st);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    return rc;
}

static int io_f, io_m;

#ifdef MPICH_NUMVERSION
/* MPICH's ROMIO places a memory datatype with a nonzero lower bound that
 * many bytes too far (host buffers too: a resized type with lb 4 gets its
 * first int at byte 12, not 8): left out. */
#define IO_TYPES 7
#else
#define IO_TYPES 0
#endif
#define SHORT_TYPES IO_TYPES

static void op_read(int mask, const ty_t *t, int n, out_t *o)
{
    file_prepare();
    char *buf = mk(mask & 1, span(t, n), 0);
    MPI_Status st;
    oint(o, io_turns(1, io_f, io_m, buf, n, t->dt, &st));
    ostatus(o, &st, t->dt);
    grab(o, buf);
}

static void op_write(int mask, const ty_t *t, int n, out_t *o)
{
    file_prepare();
    char *buf = mk(mask & 1, span(t, n), 10);
    MPI_Status st;
    oint(o, io_turns(0, io_f, io_m, buf, n, t->dt, &st));
    ostatus(o, &st, t->dt);
    grab(o, buf);
    grab_file(o);
}

/* A read that meets the end of the file partway through an element.
 * (Not the nonblocking or split forms: Open MPI 4.1's OMPIO never
 * completes a nonblocking read that meets the end of the file, host
 * buffer or not; they share read_back with the blocking forms.) */
/* The buffer after a read of got bytes that met the end of the file: the
 * bytes the type describes past those are not compared. MPI may write
 * there, host buffers too: MPICH's ROMIO leaves varying contents in them
 * for a non-contiguous memory type, and Open MPI 4.1's OMPIO, in
 * MPI_File_read_at_all, reports the whole count read and leaves them
 * uninitialised. Gaps are compared. */
static void grab_read(out_t *o, const void *p, const ty_t *t, int n, MPI_Offset got)
{
    buf_t *b = find(p);
    int psz = 0, pos = 0;
    MPI_Pack_size(n, t->dt, MPI_COMM_SELF, &psz);
    unsigned char *h = malloc(b->n), *all = calloc(b->n, 1), *rd = calloc(b->n, 1),
                  *pk = malloc((size_t)psz + 1);
    if (b->dev)
        from_dev(h, b->p, b->n);
    else
        memcpy(h, b->p, b->n);
    memset(pk, 0xff, (size_t)psz + 1);
    MPI_Unpack(pk, psz, &pos, all, n, t->dt, MPI_COMM_SELF);
    if (got > psz)
        got = psz;
    memset(pk + got, 0, (size_t)(psz - got));
    pos = 0;
    MPI_Unpack(pk, psz, &pos, rd, n, t->dt, MPI_COMM_SELF);
    for (size_t i = 0; i < b->n; i++)
        if (all[i] && !rd[i])
            h[i] = 0x5a;
    oadd(o, h, b->n);
    free(h), free(all), free(rd), free(pk);
}

static void op_read_short(int mask, const ty_t *t, int n, out_t *o)
{
    file_prepare();
    MPI_Offset end = (MPI_Offset)np * SLOT, off = end - ((MPI_Offset)n * t->size / 2 + 3);
    if (off < 0)
        off = 0;
    char *buf = mk(mask & 1, span(t, n), 0);
    MPI_Status st;
    oint(o, MPI_File_read_at(fh, off, buf, n, t->dt, &st));
    ostatus(o, &st, t->dt);
    grab_read(o, buf, t, n, end - off);
    char *b3 = mk(mask & 1, span(t, n), 0);
    oint(o, MPI_File_read_at_all(fh, off, b3, n, t->dt, &st));
    ostatus(o, &st, t->dt);
    grab_read(o, b3, t, n, end - off);
}

static void t_io(void)
{
    static const char *mname[] = {"", "_at", "_all", "_at_all", "_shared", "_ordered"};
    char name[96];
    for (int rd = 1; rd >= 0; rd--)
        for (int f = F_BLOCK; f <= F_SPLIT; f++)
            for (int m = IO_IND; m <= IO_ORDERED; m++) {
                if ((f == F_NONBLOCK && m == IO_ORDERED) ||
                    (f == F_SPLIT && m != IO_ALL && m != IO_AT_ALL && m != IO_ORDERED))
                    continue;
                io_f = f, io_m = m;
                snprintf(name, sizeof name, "MPI_File_%s%s%s%s", f == F_NONBLOCK ? "i" : "",
                         rd ? "read" : "write", mname[m], f == F_SPLIT ? "_begin/_end" : "");
                check_op(name, rd ? op_read : op_write, 1, IO_TYPES);
            }
    check_op("MPI_File_read_at, read_at_all: short reads", op_read_short, 1, SHORT_TYPES);
}

/* ---- one-sided ---- */

enum { S_FENCE, S_LOCK, S_FLUSH, S_FLUSH_ALL, S_FLUSH_LOCAL_ALL, S_FLUSH_LOCAL, S_PSCW, S_LOCK_ALL,
       NSYNC };
static const char *sname[] = {"fence", "lock/unlock", "lock/flush", "lock_all/flush_all",
                              "lock_all/flush_local_all", "lock/flush_local", "post/start/complete/wait",
                              "lock_all/unlock_all"};
static int sync_mode;
static MPI_Group g_left, g_right;

static void epoch_open(int s, MPI_Win w)
{
    switch (s) {
    case S_FENCE: MPI_Win_fence(0, w); break;
    case S_LOCK: MPI_Win_lock(MPI_LOCK_EXCLUSIVE, right, 0, w); break;
    case S_FLUSH:
    case S_FLUSH_LOCAL: MPI_Win_lock(MPI_LOCK_SHARED, right, 0, w); break;
    case S_PSCW:
        MPI_Win_post(g_left, 0, w);
        MPI_Win_start(g_right, 0, w);
        break;
    default: MPI_Win_lock_all(0, w);
    }
}

/* Completes the operations at the origin: the results are read after
 * this, before epoch_end. */
static void epoch_sync(int s, MPI_Win w)
{
    switch (s) {
    case S_FENCE: MPI_Win_fence(MPI_MODE_NOSUCCEED, w); break;
    case S_LOCK: MPI_Win_unlock(right, w); break;
    case S_FLUSH: MPI_Win_flush(right, w); break;
    case S_FLUSH_ALL: MPI_Win_flush_all(w); break;
    case S_FLUSH_LOCAL_ALL: MPI_Win_flush_local_all(w); break;
    case S_FLUSH_LOCAL: MPI_Win_flush_local(right, w); break;
    case S_PSCW: MPI_Win_complete(w); break;
    default: MPI_Win_unlock_all(w);
    }
}

static void epoch_end(int s, MPI_Win w)
{
    switch (s) {
    case S_FLUSH:
    case S_FLUSH_LOCAL: MPI_Win_unlock(right, w); break;
    case S_FLUSH_ALL:
    case S_FLUSH_LOCAL_ALL: MPI_Win_unlock_all(w); break;
    case S_PSCW: MPI_Win_wait(w); break;
    default: break;
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* A window of host memory, each rank's with its own pattern. */
static MPI_Win win_make(size_t bytes, char **mem)
{
    MPI_Win w;
    *mem = mk(0, bytes, 12);
    MPI_Win_create(*mem, (MPI_Aint)bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &w);
    return w;
}

/* The window's memory once every operation landed. */
static void grab_win(out_t *o, MPI_Win w, char *mem)
{
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, me, 0, w);
    grab(o, mem);
    MPI_Win_unlock(me, w);
    MPI_Barrier(MPI_COMM_WORLD);
}

enum { R_PUT, R_GET, R_ACC, R_GACC, R_FOP, R_CAS };
static int rma_kind, rma_req;

/* One origin-side call (the request form when rma_req, completed inside
 * the epoch). Buffers o, c, r; n elements of t at the target's start. */
static void rma_one(const ty_t *t, int n, char *o, char *c, char *r, MPI_Win w)
{
    MPI_Request q = MPI_REQUEST_NULL;
    MPI_Datatype dt = t->dt;
    switch (rma_kind) {
    case R_PUT:
        rma_req ? MPI_Rput(o, n, dt, right, 0, n, dt, w, &q) : MPI_Put(o, n, dt, right, 0, n, dt, w);
        break;
    case R_GET:
        rma_req ? MPI_Rget(r, n, dt, right, 0, n, dt, w, &q) : MPI_Get(r, n, dt, right, 0, n, dt, w);
        break;
    case R_ACC:
        rma_req ? MPI_Raccumulate(o, n, dt, right, 0, n, dt, MPI_SUM, w, &q)
                : MPI_Accumulate(o, n, dt, right, 0, n, dt, MPI_SUM, w);
        break;
    case R_GACC:
        rma_req ? MPI_Rget_accumulate(o, n, dt, r, n, dt, right, 0, n, dt, MPI_SUM, w, &q)
                : MPI_Get_accumulate(o, n, dt, r, n, dt, right, 0, n, dt, MPI_SUM, w);
        break;
    case R_FOP: /* single-int operations on consecutive ints (at most 17:
                 * Open MPI 4.1's osc pt2pt recurses into a deadlock on
                 * hundreds of them in one epoch) */
        for (int i = 0; i < n && i < 17; i++)
            MPI_Fetch_and_op(o + 4 * i, r + 4 * i, MPI_INT, right, 4 * i, MPI_SUM, w);
        break;
    default:
        for (int i = 0; i < n && i < 17; i++)
            MPI_Compare_and_swap(o + 4 * i, c + 4 * i, r + 4 * i, MPI_INT, right, 4 * i, w);
        break;
    }
    if (q != MPI_REQUEST_NULL)
        MPI_Wait(&q, MPI_STATUS_IGNORE);
}

/* mask: bit 0 origin, bit 1 result, bit 2 compare. */
static void op_rma(int mask, const ty_t *t, int n, out_t *o)
{
    size_t sz = span(t, n);
    char *mem, *ob = mk(mask & 1, sz, 13), *r = mk(mask & 2, sz, 0), *c = mk(mask & 4, sz, 0);
    if (rma_kind == R_CAS && n) { /* compare with what half the target holds */
        unsigned char *h = malloc(sz);
        for (size_t i = 0; i < sz; i++)
            h[i] = (i / 4) % 2 ? 0 : (unsigned char)(i * 131u + 12u * 29u + (unsigned)right * 7u + 1u);
        if (find(c)->dev)
            to_dev(c, h, sz);
        else
            memcpy(c, h, sz);
        free(h);
    }
    MPI_Win w = win_make(sz, &mem);
    int s = rma_req ? S_LOCK_ALL : sync_mode;
    epoch_open(s, w);
    rma_one(t, n, ob, c, r, w);
    epoch_sync(s, w);
    grab(o, r); /* complete at the origin: results are there */
    grab(o, ob);
    epoch_end(s, w);
    grab_win(o, w, mem);
    MPI_Win_free(&w);
}

static void t_rma(void)
{
    static const char *kname[] = {"MPI_Put", "MPI_Get", "MPI_Accumulate", "MPI_Get_accumulate",
                                  "MPI_Fetch_and_op", "MPI_Compare_and_swap"};
    static const char *rname[] = {"MPI_Rput", "MPI_Rget", "MPI_Raccumulate",
                                  "MPI_Rget_accumulate"};
    char name[128];
    for (int k = R_PUT; k <= R_CAS; k++) {
        rma_kind = k;
        rma_req = 0;
        int nb = k == R_CAS ? 3 : k == R_PUT || k == R_ACC || k == R_GET ? 1 : 2;
        int small = k == R_FOP || k == R_CAS; /* predefined datatypes only */
        int rsmall = 0;
#ifdef OPEN_MPI
        /* Open MPI 4.1's osc pt2pt corrupts its heap on a Get_accumulate
         * with derived datatypes, host buffers or not. */
        small |= k == R_GACC;
#endif
#ifdef MPICH_NUMVERSION
        /* MPICH completes an MPI_Rget's request with a derived datatype
         * before the data is in the origin buffer (host buffers too: it
         * changes again at the unlock). */
        rsmall = k == R_GET || k == R_GACC;
#endif
        for (int s = 0; s < NSYNC; s++) {
            if ((k != R_PUT && k != R_GET) && s != S_FENCE && s != S_FLUSH && s != S_PSCW)
                continue;
            sync_mode = s;
            snprintf(name, sizeof name, "%s, %s", kname[k], sname[s]);
            /* a Get's origin is its result (bit 1) */
            check_op(name, op_rma, k == R_GET ? 2 : nb, small);
        }
        small |= rsmall;
        if (k <= R_GACC) {
            rma_req = 1;
            snprintf(name, sizeof name, "%s, lock_all, MPI_Wait", rname[k]);
            check_op(name, op_rma, k == R_GET ? 2 : nb, small);
        }
    }
}

/* Device memory as a window: an error on every rank (the communicator's
 * or the window's handler, here MPI_ERRORS_RETURN). */
static void t_win_refused(void)
{
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    char *d = mk(1, 4096, 1);
    MPI_Win w = MPI_WIN_NULL;
    int rc = MPI_Win_create(d, 4096, 1, MPI_INFO_NULL, comm, &w), cls = -1;
    MPI_Error_class(rc, &cls);
    mok(cls == MPI_ERR_BUFFER && w == MPI_WIN_NULL,
        "MPI_Win_create on device memory: MPI_ERR_BUFFER on every rank (%d)", cls);
    /* Device memory on one rank only: every rank refuses, none hangs. */
    char *h = mk(0, 4096, 1);
    w = MPI_WIN_NULL;
    rc = MPI_Win_create(me == np - 1 ? d : h, 4096, 1, MPI_INFO_NULL, comm, &w);
    MPI_Error_class(rc, &cls);
    mok(cls == MPI_ERR_BUFFER && w == MPI_WIN_NULL,
        "MPI_Win_create, device memory on the last rank only: MPI_ERR_BUFFER on every rank (%d)",
        cls);
    rc = MPI_Win_create_dynamic(MPI_INFO_NULL, comm, &w);
    MPI_Win_set_errhandler(w, MPI_ERRORS_RETURN);
    rc = MPI_Win_attach(w, d, 4096);
    MPI_Error_class(rc, &cls);
    int hrc = MPI_Win_attach(w, h, 4096);
    if (hrc == MPI_SUCCESS)
        MPI_Win_detach(w, h);
    mok(cls == MPI_ERR_BUFFER && hrc == MPI_SUCCESS,
        "MPI_Win_attach of device memory: MPI_ERR_BUFFER (%d); host memory attaches", cls);
    MPI_Win_free(&w);
    MPI_Comm_free(&comm);
    free_all();
}

/* MPI's buffer for buffered sends in device memory: refused (MPI writes it). */
static void t_buffer_attach(void)
{
    char *d = dev_alloc(4096);
    int cls = -1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int rc = MPI_Buffer_attach(d, 4096);
    MPI_Error_class(rc, &cls);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_ARE_FATAL);
    mok(cls == MPI_ERR_BUFFER, "MPI_Buffer_attach of device memory: MPI_ERR_BUFFER (%d)", cls);
}

#if MPI_VERSION >= 4
/* MPI 4's calls (mpi/staging/mpi4.c): the large-count forms staged as the
 * int ones while counts fit; a device buffer refused where the plugin
 * cannot stage it (MPI_ERR_COUNT above INT_MAX; MPI_ERR_BUFFER for the
 * v-forms, MPI_Isendrecv, partitioned sends); the same
 * calls on host buffers are MPI's. The fake device memory is PROT_NONE: a
 * call that reached MPI with it would fault. */
static unsigned char bpat(size_t i, int rank) { return (unsigned char)(i * 7u + (unsigned)rank * 13u + 1u); }

static void t_mpi4(void)
{
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    const size_t n = 3000;
    unsigned char *h = malloc(n);
    for (size_t i = 0; i < n; i++)
        h[i] = bpat(i, me);
    char *ds = dev_alloc(n), *dr = dev_alloc(n);
    to_dev(ds, h, n);
    MPI_Request q;
    int rc = MPI_Isend_c(ds, (MPI_Count)n, MPI_BYTE, right, 4, comm, &q);
    rc |= MPI_Recv_c(dr, (MPI_Count)n, MPI_BYTE, left, 4, comm, MPI_STATUS_IGNORE);
    rc |= MPI_Wait(&q, MPI_STATUS_IGNORE);
    from_dev(h, dr, n);
    int ok = rc == MPI_SUCCESS;
    for (size_t i = 0; i < n && ok; i++)
        ok = h[i] == bpat(i, left);
    mok(ok, "MPI_Isend_c and MPI_Recv_c of %zu device bytes", n);

    int v[64], sum[64];
    for (int i = 0; i < 64; i++)
        v[i] = me * 1000 + i;
    int *dv = dev_alloc(sizeof v), *dsum = dev_alloc(sizeof v);
    to_dev(dv, v, sizeof v);
    rc = MPI_Allreduce_c(dv, dsum, 64, MPI_INT, MPI_SUM, comm);
    from_dev(sum, dsum, sizeof sum);
    ok = rc == MPI_SUCCESS;
    for (int i = 0; i < 64 && ok; i++)
        ok = sum[i] == 1000 * np * (np - 1) / 2 + np * i;
    mok(ok, "MPI_Allreduce_c of 64 device ints");
    rc = MPI_Ibcast_c(dv, 64, MPI_INT, 0, comm, &q);
    rc |= MPI_Wait(&q, MPI_STATUS_IGNORE);
    from_dev(sum, dv, sizeof sum);
    ok = rc == MPI_SUCCESS;
    for (int i = 0; i < 64 && ok; i++)
        ok = sum[i] == i;
    mok(ok, "MPI_Ibcast_c of 64 device ints from rank 0");

    char packed[512];
    MPI_Count pos = 0;
    rc = MPI_Pack_c(dv, 64, MPI_INT, packed, sizeof packed, &pos, comm);
    MPI_Count upos = 0;
    rc |= MPI_Unpack_c(packed, pos, &upos, dsum, 64, MPI_INT, comm);
    from_dev(sum, dsum, sizeof sum);
    ok = rc == MPI_SUCCESS && pos == (MPI_Count)sizeof v && upos == pos;
    for (int i = 0; i < 64 && ok; i++)
        ok = sum[i] == i;
    mok(ok, "MPI_Pack_c and MPI_Unpack_c of device ints (position %lld)", (long long)pos);

    /* Refused: a count above INT_MAX (nothing is read: refused first). */
    int cls = -1;
    rc = MPI_Send_c(ds, (MPI_Count)INT_MAX + 1, MPI_BYTE, right, 5, comm);
    MPI_Error_class(rc, &cls);
    mok(cls == MPI_ERR_COUNT, "MPI_Send_c of a device buffer above INT_MAX elements: MPI_ERR_COUNT (%d)", cls);
    MPI_Count *cnt = malloc(sizeof(MPI_Count) * (size_t)np);
    MPI_Aint *dsp = malloc(sizeof(MPI_Aint) * (size_t)np);
    for (int r = 0; r < np; r++)
        cnt[r] = 4, dsp[r] = 4 * r;
    char *dall = dev_alloc((size_t)np * 4);
    rc = MPI_Gatherv_c(ds, 4, MPI_BYTE, dall, cnt, dsp, MPI_BYTE, 0, comm);
    MPI_Error_class(rc, &cls);
    mok(cls == MPI_ERR_BUFFER, "MPI_Gatherv_c of device buffers: MPI_ERR_BUFFER on every rank (%d)", cls);
    char *hall = malloc((size_t)np * 4), hs4[4] = {1, 2, 3, 4};
    rc = MPI_Gatherv_c(hs4, 4, MPI_BYTE, hall, cnt, dsp, MPI_BYTE, 0, comm);
    mok(rc == MPI_SUCCESS && (me != 0 || hall[4 * (np - 1) + 3] == 4),
        "MPI_Gatherv_c of host buffers: MPI's");
    q = (MPI_Request)1;
    rc = MPI_Isendrecv(ds, 8, MPI_BYTE, right, 6, dr, 8, MPI_BYTE, left, 6, comm, &q);
    MPI_Error_class(rc, &cls);
    mok(cls == MPI_ERR_BUFFER && q == MPI_REQUEST_NULL,
        "MPI_Isendrecv of device buffers: MPI_ERR_BUFFER, no request (%d)", cls);
    char hr8[8] = {0}, hs8[8] = {9, 9, 9, 9, 9, 9, 9, (char)me};
    rc = MPI_Isendrecv(hs8, 8, MPI_BYTE, right, 6, hr8, 8, MPI_BYTE, left, 6, comm, &q);
    rc |= MPI_Wait(&q, MPI_STATUS_IGNORE);
    mok(rc == MPI_SUCCESS && hr8[7] == (char)left, "MPI_Isendrecv of host buffers: MPI's");
    rc = MPI_Psend_init(ds, 2, 4, MPI_BYTE, right, 7, comm, MPI_INFO_NULL, &q);
    MPI_Error_class(rc, &cls);
    mok(cls == MPI_ERR_BUFFER, "MPI_Psend_init of a device buffer: MPI_ERR_BUFFER (%d)", cls);
    free(h), free(cnt), free(dsp), free(hall);
    MPI_Comm_free(&comm);
    free_all();
}
#endif

int main(int argc, char **argv)
{
#ifdef RKT_FAKE
    int fd = memfd_create("rankmem-fake-device", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)fsize) != 0)
        return 1;
    freg = mmap(NULL, fsize, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    falias = mmap(NULL, fsize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (freg == MAP_FAILED || falias == MAP_FAILED)
        return 1;
    rk_stg_fake_device(freg, fsize);
    rk_stg_fake_alias(falias);
#endif
    MPI_Init(&argc, &argv);
#ifdef RKT_FAKE
    rk_mpi_staging_init();
#endif
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    left = (me + np - 1) % np;
    right = (me + 1) % np;
    int dev = have_device(), all = 0;
    MPI_Allreduce(&dev, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) {
        mskip("no GPU (device buffers cannot be tested here)");
        MPI_Finalize();
        return 0;
    }
    make_types();
    MPI_Group world;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, 1, &left, &g_left);
    MPI_Group_incl(world, 1, &right, &g_right);

    const char *only = argc > 1 ? argv[1] : "";
    int all_parts = !*only;
    if (all_parts || !strcmp(only, "pack")) {
        check_op("MPI_Pack", op_pack, 2, 0);
        check_op("MPI_Unpack", op_unpack, 2, 0);
        check_op("MPI_Pack_external", op_pack_ext, 2, 0);
        check_op("MPI_Unpack_external", op_unpack_ext, 2, 0);
        check_op("MPI_Reduce_local", op_reduce_local, 2, 0);
    }
    if (all_parts || !strcmp(only, "io")) {
        const char *tmp = getenv("TMPDIR");
        long id = me == 0 ? (long)getpid() : 0;
        MPI_Bcast(&id, 1, MPI_LONG, 0, MPI_COMM_WORLD);
        snprintf(fpath, sizeof fpath, "%s/rankmem-misc-%ld.dat", tmp && *tmp ? tmp : "/tmp", id);
        int rc = MPI_File_open(MPI_COMM_WORLD, fpath, MPI_MODE_CREATE | MPI_MODE_RDWR,
                               MPI_INFO_NULL, &fh);
        if (mok(rc == MPI_SUCCESS, "MPI_File_open %s", fpath)) {
            t_io();
            MPI_File_close(&fh);
        }
        if (me == 0)
            unlink(fpath);
    }
    if (all_parts || !strcmp(only, "rma")) {
        t_rma();
        t_win_refused();
    }
    if (all_parts || !strcmp(only, "mpi4")) {
        t_buffer_attach();
#if MPI_VERSION >= 4
        t_mpi4();
#endif
    }
    MPI_Group_free(&g_left);
    MPI_Group_free(&g_right);
    MPI_Group_free(&world);
    MPI_Finalize();
    return mtap_failed_ ? 1 : 0;
}
