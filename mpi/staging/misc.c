/* Staging, the other calls that take a buffer: MPI_Pack and MPI_Unpack
 * (native and external32), MPI_Reduce_local, MPI-IO, and the origin side
 * of one-sided communication. Each is the same pattern: a device argument
 * becomes a host copy (side_in / side_out below), MPI runs on the copies,
 * and what MPI wrote goes back to the device (the bytes the datatype
 * describes, never the gaps between them). Host arguments go to MPI as
 * they are, after one test of a flag (rk_stg_is_device).
 *
 * When the data comes back:
 *   - Pack, Unpack, Reduce_local, blocking and split-collective file
 *     calls: before the call (or its _end) returns;
 *   - nonblocking file calls and MPI_R{put,get,accumulate,get_accumulate}:
 *     when the request completes (rk_stg_wrap);
 *   - Put, Get, Accumulate, Get_accumulate, Fetch_and_op,
 *     Compare_and_swap: at the synchronisation that completes them at the
 *     origin (fence, complete, unlock, flush...); the host copies are kept
 *     on a list until then.
 * A window whose memory is device memory cannot work with an MPI that is
 * not CUDA-aware (other ranks' operations land in it with no call of ours
 * to stage them): MPI_Win_create and MPI_Win_attach refuse it. */
#define _GNU_SOURCE
#include "staging.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT RK_MPI_EXPORT

static int is_dev(const void *p) { return p != NULL && p != MPI_IN_PLACE && rk_stg_is_device(p); }

/* ---- one (buffer, count, datatype) argument ---- */

/* A staged argument: MPI gets h; when dev, h stands for u in hb. nout:
 * elements that go back to the device at the end (0: MPI only reads it). */
typedef struct {
    char *u, *h;
    int dev;
    int count;
    ptrdiff_t nout;
    MPI_Datatype dt;
    rk_stg_layout_t L;
    rk_stg_buf_t hb;
    size_t copied;
    uint64_t t0;
} side_t;

/* What MPI gets for an argument with nothing in it: a host address. */
static char no_data[16];

/* Stage u (count x dt) when it is device memory: host memory for its
 * region, filled from the device when in (MPI reads it). wait_ok: the
 * call is blocking (rk_stg_buf_get). MPI_SUCCESS or an error class. */
static int side_prep(side_t *s, const void *u, int count, MPI_Datatype dt, int in, int wait_ok)
{
    memset(s, 0, sizeof *s);
    s->u = s->h = (char *)u;
    s->count = count;
    s->dt = dt;
    if (!is_dev(u))
        return MPI_SUCCESS;
    int rc = rk_stg_layout(dt, 0, count, &s->L);
    if (rc != MPI_SUCCESS)
        return rc;
    if (s->L.span == 0) { /* nothing to read or write: no device pointer to MPI either */
        s->h = no_data;
        return MPI_SUCCESS;
    }
    if (rk_stg_buf_get(s->L.span, wait_ok, &s->hb) != 0)
        return MPI_ERR_NO_MEM;
    s->dev = 1;
    s->t0 = rk_stg_now();
    s->h = s->hb.ptr - s->L.lo;
    if (in) {
        s->copied += s->L.span;
        if (rk_stg_copy_sync(s->hb.ptr, s->u + s->L.lo, s->L.span, RK_STG_D2H) != 0)
            return MPI_ERR_OTHER;
    }
    return MPI_SUCCESS;
}

/* An argument MPI reads. */
static int side_in(side_t *s, const void *u, int count, MPI_Datatype dt, int wait_ok)
{
    return side_prep(s, u, count, dt, 1, wait_ok);
}

/* An argument MPI writes (count elements, all of them back at the end).
 * Nothing comes from the device: only the described bytes go back. */
static int side_out(side_t *s, void *u, int count, MPI_Datatype dt, int wait_ok)
{
    int rc = side_prep(s, u, count, dt, 0, wait_ok);
    s->nout = count;
    return rc;
}

/* Elements [first, first + n) back to the device. */
static int side_back_range(side_t *s, ptrdiff_t first, ptrdiff_t n)
{
    if (!s->dev || n <= 0)
        return MPI_SUCCESS;
    if (rk_stg_put_elems_sync(s->u, s->h, s->dt, first, n, &s->L, &s->copied) != 0)
        return MPI_ERR_OTHER;
    return MPI_SUCCESS;
}

static int side_back(side_t *s) { return side_back_range(s, 0, s->nout); }

/* Give the host copy back and count the staging. */
static void side_done(side_t *s)
{
    if (!s->dev)
        return;
    rk_stg_buf_put(&s->hb);
    rk_stg_count(s->copied, rk_stg_now() - s->t0);
    s->dev = 0;
}

/* A staging failure of ours (MPI's own errors went through its handlers
 * already): the communicator's handler, as MPI would. */
static int comm_fail(MPI_Comm comm, int rc, const char *what)
{
    rk_mpi_warn("staging: %s: cannot stage a device buffer (error class %d)", what, rc);
    PMPI_Comm_call_errhandler(comm, rc);
    return rc;
}

/* ---- MPI_Pack, MPI_Unpack and their external32 forms ---- */

/* rep: NULL for the native forms (on comm), else the data representation. */
static int pack_bound(const char *rep, int n, MPI_Datatype dt, MPI_Comm comm, MPI_Aint *b)
{
    if (rep)
        return PMPI_Pack_external_size(rep, n, dt, b);
    int v = 0, rc = PMPI_Pack_size(n, dt, comm, &v);
    *b = v;
    return rc;
}

static int pack_call(const char *rep, const void *in, int n, MPI_Datatype dt, void *out,
                     MPI_Aint outsize, MPI_Aint *pos, MPI_Comm comm)
{
    if (rep)
        return PMPI_Pack_external(rep, in, n, dt, out, outsize, pos);
    int p = (int)*pos, rc = PMPI_Pack(in, n, dt, out, (int)outsize, &p, comm);
    *pos = p;
    return rc;
}

static int unpack_call(const char *rep, const void *in, MPI_Aint insize, MPI_Aint *pos, void *out,
                       int n, MPI_Datatype dt, MPI_Comm comm)
{
    if (rep)
        return PMPI_Unpack_external(rep, in, insize, pos, out, n, dt);
    int p = (int)*pos, rc = PMPI_Unpack(in, (int)insize, &p, out, n, dt, comm);
    *pos = p;
    return rc;
}

/* The bytes [pos, pos + room) of a packed buffer, room at most what
 * (n, dt) packs to: MPI touches no other byte of it. */
static int packed_room(const char *rep, int n, MPI_Datatype dt, MPI_Comm comm, MPI_Aint size,
                       MPI_Aint pos, int *room)
{
    MPI_Aint bound = 0;
    int rc = pack_bound(rep, n, dt, comm, &bound);
    if (rc != MPI_SUCCESS)
        return rc;
    if (pos < 0 || pos > size)
        return MPI_ERR_ARG;
    MPI_Aint r = size - pos < bound ? size - pos : bound;
    *room = r > 0 && r <= 0x7fffffff ? (int)r : 0;
    return r > 0x7fffffff ? MPI_ERR_COUNT : MPI_SUCCESS;
}

static int pack_staged(const char *rep, const void *in, int n, MPI_Datatype dt, void *out,
                       MPI_Aint outsize, MPI_Aint *pos, MPI_Comm comm)
{
    side_t a, b;
    MPI_Aint p0 = *pos;
    int room = 0, rc = side_in(&a, in, n, dt, 1), mine = 1;
    memset(&b, 0, sizeof b);
    b.h = out;
    if (rc == MPI_SUCCESS && is_dev(out))
        rc = packed_room(rep, n, dt, comm, outsize, p0, &room);
    if (rc == MPI_SUCCESS && is_dev(out)) {
        rc = side_out(&b, (char *)out + p0, room, MPI_BYTE, 1);
        b.h -= p0; /* MPI writes from out + *pos */
    }
    if (rc == MPI_SUCCESS) {
        mine = 0;
        rc = pack_call(rep, a.h, n, dt, b.h, outsize, pos, comm);
    }
    if (rc == MPI_SUCCESS && b.dev) {
        b.h += p0;
        mine = 1;
        rc = side_back_range(&b, 0, *pos - p0);
    }
    side_done(&a);
    side_done(&b);
    return rc != MPI_SUCCESS && mine ? comm_fail(comm, rc, rep ? "MPI_Pack_external" : "MPI_Pack")
                                     : rc;
}

static int unpack_staged(const char *rep, const void *in, MPI_Aint insize, MPI_Aint *pos,
                         void *out, int n, MPI_Datatype dt, MPI_Comm comm)
{
    side_t a, b;
    MPI_Aint p0 = *pos;
    int room = 0, rc = MPI_SUCCESS, mine = 1;
    memset(&a, 0, sizeof a);
    a.h = (char *)in;
    if (is_dev(in))
        rc = packed_room(rep, n, dt, comm, insize, p0, &room);
    if (rc == MPI_SUCCESS && is_dev(in)) {
        rc = side_in(&a, (const char *)in + p0, room, MPI_BYTE, 1);
        a.h -= p0; /* MPI reads from in + *pos */
    }
    if (rc == MPI_SUCCESS)
        rc = side_out(&b, out, n, dt, 1);
    else
        memset(&b, 0, sizeof b);
    if (rc == MPI_SUCCESS) {
        mine = 0;
        rc = unpack_call(rep, a.h, insize, pos, b.h, n, dt, comm);
    }
    if (rc == MPI_SUCCESS) {
        mine = 1;
        rc = side_back(&b);
    }
    side_done(&a);
    side_done(&b);
    return rc != MPI_SUCCESS && mine
               ? comm_fail(comm, rc, rep ? "MPI_Unpack_external" : "MPI_Unpack")
               : rc;
}

EXPORT int MPI_Pack(const void *in, int n, MPI_Datatype dt, void *out, int outsize, int *pos,
                    MPI_Comm comm)
{
    if (RK_STG_LIKELY(!is_dev(in) && !is_dev(out)))
        return PMPI_Pack(in, n, dt, out, outsize, pos, comm);
    MPI_Aint p = *pos;
    int rc = pack_staged(NULL, in, n, dt, out, outsize, &p, comm);
    *pos = (int)p;
    return rc;
}

EXPORT int MPI_Unpack(const void *in, int insize, int *pos, void *out, int n, MPI_Datatype dt,
                      MPI_Comm comm)
{
    if (RK_STG_LIKELY(!is_dev(in) && !is_dev(out)))
        return PMPI_Unpack(in, insize, pos, out, n, dt, comm);
    MPI_Aint p = *pos;
    int rc = unpack_staged(NULL, in, insize, &p, out, n, dt, comm);
    *pos = (int)p;
    return rc;
}

/* Errors of calls without a communicator go to MPI_COMM_WORLD's handler
 * (MPI 3.1, which Open MPI 4.1 and MPICH follow). */
EXPORT int MPI_Pack_external(const char rep[], const void *in, int n, MPI_Datatype dt, void *out,
                             MPI_Aint outsize, MPI_Aint *pos)
{
    if (RK_STG_LIKELY(!is_dev(in) && !is_dev(out)))
        return PMPI_Pack_external(rep, in, n, dt, out, outsize, pos);
    return pack_staged(rep, in, n, dt, out, outsize, pos, MPI_COMM_WORLD);
}

EXPORT int MPI_Unpack_external(const char rep[], const void *in, MPI_Aint insize, MPI_Aint *pos,
                               void *out, int n, MPI_Datatype dt)
{
    if (RK_STG_LIKELY(!is_dev(in) && !is_dev(out)))
        return PMPI_Unpack_external(rep, in, insize, pos, out, n, dt);
    return unpack_staged(rep, in, insize, pos, out, n, dt, MPI_COMM_WORLD);
}

/* ---- MPI_Reduce_local ---- */

EXPORT int MPI_Reduce_local(const void *in, void *inout, int n, MPI_Datatype dt, MPI_Op op)
{
    if (RK_STG_LIKELY(!is_dev(in) && !is_dev(inout)))
        return PMPI_Reduce_local(in, inout, n, dt, op);
    side_t a, b;
    int rc = side_in(&a, in, n, dt, 1), mine = 1;
    if (rc == MPI_SUCCESS) {
        rc = side_in(&b, inout, n, dt, 1);
        b.nout = n;
    } else {
        memset(&b, 0, sizeof b);
    }
    if (rc == MPI_SUCCESS) {
        mine = 0;
        rc = PMPI_Reduce_local(a.h, b.h, n, dt, op);
    }
    if (rc == MPI_SUCCESS) {
        mine = 1;
        rc = side_back(&b);
    }
    side_done(&a);
    side_done(&b);
    return rc != MPI_SUCCESS && mine ? comm_fail(MPI_COMM_WORLD, rc, "MPI_Reduce_local") : rc;
}

/* ---- MPI-IO ---- */
#ifdef MPI_MODE_RDONLY

#if MPI_VERSION > 3 || (MPI_VERSION == 3 && MPI_SUBVERSION >= 1)
#define HAVE_IO_ICOLL 1 /* MPI_File_iread_all and friends (MPI 3.1) */
#endif

static int file_fail(MPI_File fh, int rc, const char *what)
{
    rk_mpi_warn("staging: %s: cannot stage a device buffer (error class %d)", what, rc);
    PMPI_File_call_errhandler(fh, rc);
    return rc;
}

/* A read brought the status's bytes: whole elements go back; a last
 * element read in part goes back merged with the device's own bytes (the
 * ones MPI did not write keep their value). */
static int partial_back(side_t *s, ptrdiff_t i, size_t got)
{
    rk_stg_layout_t E;
    MPI_Aint lb, ext;
    int psz = 0, p1 = 0, p2 = 0, p3 = 0, rc = MPI_ERR_OTHER;
    if (rk_stg_layout(s->dt, i, 1, &E) != MPI_SUCCESS ||
        PMPI_Type_get_extent(s->dt, &lb, &ext) != MPI_SUCCESS ||
        PMPI_Pack_size(1, s->dt, MPI_COMM_SELF, &psz) != MPI_SUCCESS)
        return rc;
    char *old = malloc(E.span + 1), *pn = malloc((size_t)psz + 1), *po = malloc((size_t)psz + 1);
    char *elem = s->h + i * (ptrdiff_t)ext, *oelem = old - E.lo + i * (ptrdiff_t)ext;
    if (old && pn && po && rk_stg_copy_sync(old, s->u + E.lo, E.span, RK_STG_D2H) == 0 &&
        PMPI_Pack(elem, 1, s->dt, pn, psz, &p1, MPI_COMM_SELF) == MPI_SUCCESS &&
        PMPI_Pack(oelem, 1, s->dt, po, psz, &p2, MPI_COMM_SELF) == MPI_SUCCESS) {
        memcpy(po, pn, got);
        if (PMPI_Unpack(po, psz, &p3, elem, 1, s->dt, MPI_COMM_SELF) == MPI_SUCCESS)
            rc = side_back_range(s, i, 1);
    }
    s->copied += E.span;
    free(old), free(pn), free(po);
    return rc;
}

/* After a read into s: what the status says was read goes back. */
static int read_back(side_t *s, MPI_Status *st)
{
    MPI_Count bytes = 0;
    if (!s->dev)
        return MPI_SUCCESS;
    if (PMPI_Get_elements_x(st, MPI_BYTE, &bytes) != MPI_SUCCESS || bytes < 0)
        return MPI_ERR_OTHER;
    ptrdiff_t full = s->L.tsize ? (ptrdiff_t)((size_t)bytes / s->L.tsize) : 0;
    size_t rem = s->L.tsize ? (size_t)bytes % s->L.tsize : 0;
    if (full >= s->count) {
        full = s->count;
        rem = 0;
    }
    int rc = side_back_range(s, 0, full);
    if (rc == MPI_SUCCESS && rem)
        rc = partial_back(s, full, rem);
    return rc;
}

/* The blocking calls, on one signature (off is ignored by the forms
 * without an offset). */
typedef int (*io_fn)(MPI_File fh, MPI_Offset off, void *buf, int n, MPI_Datatype dt,
                     MPI_Status *st);

#define IO_READ(name, call)                                                                    \
    static int name(MPI_File fh, MPI_Offset off, void *buf, int n, MPI_Datatype dt,           \
                    MPI_Status *st)                                                            \
    {                                                                                          \
        (void)off;                                                                             \
        return call;                                                                           \
    }
IO_READ(io_read, PMPI_File_read(fh, buf, n, dt, st))
IO_READ(io_read_at, PMPI_File_read_at(fh, off, buf, n, dt, st))
IO_READ(io_read_all, PMPI_File_read_all(fh, buf, n, dt, st))
IO_READ(io_read_at_all, PMPI_File_read_at_all(fh, off, buf, n, dt, st))
IO_READ(io_read_shared, PMPI_File_read_shared(fh, buf, n, dt, st))
IO_READ(io_read_ordered, PMPI_File_read_ordered(fh, buf, n, dt, st))
IO_READ(io_write, PMPI_File_write(fh, buf, n, dt, st))
IO_READ(io_write_at, PMPI_File_write_at(fh, off, buf, n, dt, st))
IO_READ(io_write_all, PMPI_File_write_all(fh, buf, n, dt, st))
IO_READ(io_write_at_all, PMPI_File_write_at_all(fh, off, buf, n, dt, st))
IO_READ(io_write_shared, PMPI_File_write_shared(fh, buf, n, dt, st))
IO_READ(io_write_ordered, PMPI_File_write_ordered(fh, buf, n, dt, st))
#undef IO_READ

/* A blocking read (rd) or write on a staged buffer. MPI always gets a
 * status of ours: the read's bytes are in it. */
static int io_staged(io_fn fn, int rd, const char *what, MPI_File fh, MPI_Offset off,
                     const void *buf, int n, MPI_Datatype dt, MPI_Status *status)
{
    side_t s;
    MPI_Status st;
    int rc = rd ? side_out(&s, (void *)buf, n, dt, 1) : side_in(&s, buf, n, dt, 1);
    if (rc != MPI_SUCCESS) {
        side_done(&s);
        return file_fail(fh, rc, what);
    }
    rc = fn(fh, off, s.h, n, dt, &st);
    int back = rc == MPI_SUCCESS && rd ? read_back(&s, &st) : MPI_SUCCESS;
    side_done(&s);
    if (status != MPI_STATUS_IGNORE)
        *status = st;
    return back != MPI_SUCCESS ? file_fail(fh, back, what) : rc;
}

#define IO_RD(Name, fn, args, call)                                                             \
    EXPORT int Name args                                                                        \
    {                                                                                           \
        if (RK_STG_LIKELY(!is_dev(buf)))                                                        \
            return P##Name call;                                                                \
        return io_staged(fn, 1, #Name, fh, OFF, buf, n, dt, st);                                \
    }
#define IO_WR(Name, fn, args, call)                                                             \
    EXPORT int Name args                                                                        \
    {                                                                                           \
        if (RK_STG_LIKELY(!is_dev(buf)))                                                        \
            return P##Name call;                                                                \
        return io_staged(fn, 0, #Name, fh, OFF, buf, n, dt, st);                                \
    }
#define OFF 0
IO_RD(MPI_File_read, io_read,
      (MPI_File fh, void *buf, int n, MPI_Datatype dt, MPI_Status *st), (fh, buf, n, dt, st))
IO_RD(MPI_File_read_all, io_read_all,
      (MPI_File fh, void *buf, int n, MPI_Datatype dt, MPI_Status *st), (fh, buf, n, dt, st))
IO_RD(MPI_File_read_shared, io_read_shared,
      (MPI_File fh, void *buf, int n, MPI_Datatype dt, MPI_Status *st), (fh, buf, n, dt, st))
IO_RD(MPI_File_read_ordered, io_read_ordered,
      (MPI_File fh, void *buf, int n, MPI_Datatype dt, MPI_Status *st), (fh, buf, n, dt, st))
IO_WR(MPI_File_write, io_write,
      (MPI_File fh, const void *buf, int n, MPI_Datatype dt, MPI_Status *st),
      (fh, buf, n, dt, st))
IO_WR(MPI_File_write_all, io_write_all,
      (MPI_File fh, const void *buf, int n, MPI_Datatype dt, MPI_Status *st),
      (fh, buf, n, dt, st))
IO_WR(MPI_File_write_shared, io_write_shared,
      (MPI_File fh, const void *buf, int n, MPI_Datatype dt, MPI_Status *st),
      (fh, buf, n, dt, st))
IO_WR(MPI_File_write_ordered, io_write_ordered,
      (MPI_File fh, const void *buf, int n, MPI_Datatype dt, MPI_Status *st),
      (fh, buf, n, dt, st))
#undef OFF
#define OFF off
IO_RD(MPI_File_read_at, io_read_at,
      (MPI_File fh, MPI_Offset off, void *buf, int n, MPI_Datatype dt, MPI_Status *st),
      (fh, off, buf, n, dt, st))
IO_RD(MPI_File_read_at_all, io_read_at_all,
      (MPI_File fh, MPI_Offset off, void *buf, int n, MPI_Datatype dt, MPI_Status *st),
      (fh, off, buf, n, dt, st))
IO_WR(MPI_File_write_at, io_write_at,
      (MPI_File fh, MPI_Offset off, const void *buf, int n, MPI_Datatype dt, MPI_Status *st),
      (fh, off, buf, n, dt, st))
IO_WR(MPI_File_write_at_all, io_write_at_all,
      (MPI_File fh, MPI_Offset off, const void *buf, int n, MPI_Datatype dt, MPI_Status *st),
      (fh, off, buf, n, dt, st))
#undef OFF
#undef IO_RD
#undef IO_WR

/* ---- nonblocking file calls: the user gets a request of ours ---- */

typedef int (*iio_fn)(MPI_File fh, MPI_Offset off, void *buf, int n, MPI_Datatype dt,
                      MPI_Request *q);

#define IIO(name, call)                                                                         \
    static int name(MPI_File fh, MPI_Offset off, void *buf, int n, MPI_Datatype dt,            \
                    MPI_Request *q)                                                             \
    {                                                                                           \
        (void)off;                                                                              \
        return call;                                                                            \
    }
IIO(iio_read, PMPI_File_iread(fh, buf, n, dt, q))
IIO(iio_read_at, PMPI_File_iread_at(fh, off, buf, n, dt, q))
IIO(iio_read_shared, PMPI_File_iread_shared(fh, buf, n, dt, q))
IIO(iio_write, PMPI_File_iwrite(fh, buf, n, dt, q))
IIO(iio_write_at, PMPI_File_iwrite_at(fh, off, buf, n, dt, q))
IIO(iio_write_shared, PMPI_File_iwrite_shared(fh, buf, n, dt, q))
#ifdef HAVE_IO_ICOLL
IIO(iio_read_all, PMPI_File_iread_all(fh, buf, n, dt, q))
IIO(iio_read_at_all, PMPI_File_iread_at_all(fh, off, buf, n, dt, q))
IIO(iio_write_all, PMPI_File_iwrite_all(fh, buf, n, dt, q))
IIO(iio_write_at_all, PMPI_File_iwrite_at_all(fh, off, buf, n, dt, q))
#endif
#undef IIO

/* A staged read's request completed: the data to the device. */
static int iread_done(void *arg, MPI_Status *st)
{
    side_t *s = arg;
    int rc = read_back(s, st);
    side_done(s);
    free(s);
    return rc;
}

static int iwrite_done(void *arg, MPI_Status *st)
{
    (void)st;
    side_done(arg);
    free(arg);
    return MPI_SUCCESS;
}

/* Errors at completion go to MPI_COMM_SELF's handler (rk_stg_wrap takes
 * a communicator; the file's default handler, MPI_ERRORS_RETURN, is not
 * reachable from there). */
static int iio_staged(iio_fn fn, int rd, const char *what, MPI_File fh, MPI_Offset off,
                      const void *buf, int n, MPI_Datatype dt, MPI_Request *q)
{
    side_t *s = malloc(sizeof *s);
    if (!s)
        return file_fail(fh, MPI_ERR_NO_MEM, what);
    int rc = rd ? side_out(s, (void *)buf, n, dt, 0) : side_in(s, buf, n, dt, 0);
    MPI_Request inner = MPI_REQUEST_NULL;
    if (rc == MPI_SUCCESS) {
        rc = fn(fh, off, s->h, n, dt, &inner);
        if (rc != MPI_SUCCESS) { /* MPI's error: its handler ran */
            side_done(s);
            free(s);
            return rc;
        }
        rc = rk_stg_wrap(inner, MPI_COMM_SELF, rd ? iread_done : iwrite_done, s, q);
        if (rc != MPI_SUCCESS) /* MPI still uses the host copy: finish it first */
            PMPI_Wait(&inner, MPI_STATUS_IGNORE);
    }
    if (rc == MPI_SUCCESS)
        return rc;
    side_done(s);
    free(s);
    return file_fail(fh, rc, what);
}

#define IIO_X(Name, fn, rd, args, call, OFFV)                                               \
    EXPORT int Name args                                                                        \
    {                                                                                           \
        if (RK_STG_LIKELY(!is_dev(buf)))                                                        \
            return P##Name call;                                                                \
        return iio_staged(fn, rd, #Name, fh, OFFV, buf, n, dt, q);                              \
    }
#define IIO_R(Name, fn)                                                                         \
    IIO_X(Name, fn, 1, (MPI_File fh, void *buf, int n, MPI_Datatype dt, MPI_Request *q),      \
          (fh, buf, n, dt, q), 0)
#define IIO_W(Name, fn)                                                                         \
    IIO_X(Name, fn, 0,                                                                         \
          (MPI_File fh, const void *buf, int n, MPI_Datatype dt, MPI_Request *q),               \
          (fh, buf, n, dt, q), 0)
#define IIO_RA(Name, fn)                                                                        \
    IIO_X(Name, fn, 1,                                                                         \
          (MPI_File fh, MPI_Offset off, void *buf, int n, MPI_Datatype dt, MPI_Request *q),     \
          (fh, off, buf, n, dt, q), off)
#define IIO_WA(Name, fn)                                                                        \
    IIO_X(Name, fn, 0,                                                                         \
          (MPI_File fh, MPI_Offset off, const void *buf, int n, MPI_Datatype dt,                \
           MPI_Request *q),                                                                     \
          (fh, off, buf, n, dt, q), off)
IIO_R(MPI_File_iread, iio_read)
IIO_R(MPI_File_iread_shared, iio_read_shared)
IIO_W(MPI_File_iwrite, iio_write)
IIO_W(MPI_File_iwrite_shared, iio_write_shared)
IIO_RA(MPI_File_iread_at, iio_read_at)
IIO_WA(MPI_File_iwrite_at, iio_write_at)
#ifdef HAVE_IO_ICOLL
IIO_R(MPI_File_iread_all, iio_read_all)
IIO_W(MPI_File_iwrite_all, iio_write_all)
IIO_RA(MPI_File_iread_at_all, iio_read_at_all)
IIO_WA(MPI_File_iwrite_at_all, iio_write_at_all)
#endif
#undef IIO_X
#undef IIO_R
#undef IIO_W
#undef IIO_RA
#undef IIO_WA

/* ---- split collectives: the staging lives from _begin to _end ---- */

/* MPI allows one split collective at a time per file handle. */
typedef struct split {
    struct split *next;
    MPI_File fh;
    int rd;
    side_t s;
} split_t;

static pthread_mutex_t split_mu = PTHREAD_MUTEX_INITIALIZER;
static split_t *splits;
static atomic_int nsplits;

static void split_add(split_t *e)
{
    pthread_mutex_lock(&split_mu);
    e->next = splits;
    splits = e;
    atomic_fetch_add(&nsplits, 1);
    pthread_mutex_unlock(&split_mu);
}

static split_t *split_take(MPI_File fh)
{
    split_t *e = NULL;
    pthread_mutex_lock(&split_mu);
    for (split_t **pp = &splits; *pp; pp = &(*pp)->next)
        if ((*pp)->fh == fh) {
            e = *pp;
            *pp = e->next;
            atomic_fetch_sub(&nsplits, 1);
            break;
        }
    pthread_mutex_unlock(&split_mu);
    return e;
}

typedef int (*begin_fn)(MPI_File fh, MPI_Offset off, void *buf, int n, MPI_Datatype dt);
typedef int (*end_fn)(MPI_File fh, void *buf, MPI_Status *st);

static int split_begin(begin_fn fn, int rd, const char *what, MPI_File fh, MPI_Offset off,
                       const void *buf, int n, MPI_Datatype dt)
{
    split_t *e = calloc(1, sizeof *e);
    if (!e)
        return file_fail(fh, MPI_ERR_NO_MEM, what);
    e->fh = fh;
    e->rd = rd;
    int rc = rd ? side_out(&e->s, (void *)buf, n, dt, 0) : side_in(&e->s, buf, n, dt, 0);
    if (rc != MPI_SUCCESS) {
        side_done(&e->s);
        free(e);
        return file_fail(fh, rc, what);
    }
    rc = fn(fh, off, e->s.h, n, dt);
    if (rc != MPI_SUCCESS) {
        side_done(&e->s);
        free(e);
        return rc;
    }
    split_add(e);
    return rc;
}

/* The _end of a split collective whose _begin was staged (else NULL). */
static int split_end(end_fn fn, const char *what, MPI_File fh, void *buf, MPI_Status *status)
{
    split_t *e = atomic_load_explicit(&nsplits, memory_order_relaxed) ? split_take(fh) : NULL;
    if (!e)
        return fn(fh, buf, status);
    MPI_Status st;
    int rc = fn(fh, e->s.h, &st);
    int back = rc == MPI_SUCCESS && e->rd ? read_back(&e->s, &st) : MPI_SUCCESS;
    side_done(&e->s);
    free(e);
    if (status != MPI_STATUS_IGNORE)
        *status = st;
    return back != MPI_SUCCESS ? file_fail(fh, back, what) : rc;
}

#define SB(name, call)                                                                          \
    static int name(MPI_File fh, MPI_Offset off, void *buf, int n, MPI_Datatype dt)            \
    {                                                                                           \
        (void)off;                                                                              \
        return call;                                                                            \
    }
SB(b_read_all, PMPI_File_read_all_begin(fh, buf, n, dt))
SB(b_write_all, PMPI_File_write_all_begin(fh, buf, n, dt))
SB(b_read_at_all, PMPI_File_read_at_all_begin(fh, off, buf, n, dt))
SB(b_write_at_all, PMPI_File_write_at_all_begin(fh, off, buf, n, dt))
SB(b_read_ordered, PMPI_File_read_ordered_begin(fh, buf, n, dt))
SB(b_write_ordered, PMPI_File_write_ordered_begin(fh, buf, n, dt))
#undef SB
#define SE(name, call)                                                                          \
    static int name(MPI_File fh, void *buf, MPI_Status *st) { return call; }
SE(e_read_all, PMPI_File_read_all_end(fh, buf, st))
SE(e_write_all, PMPI_File_write_all_end(fh, buf, st))
SE(e_read_at_all, PMPI_File_read_at_all_end(fh, buf, st))
SE(e_write_at_all, PMPI_File_write_at_all_end(fh, buf, st))
SE(e_read_ordered, PMPI_File_read_ordered_end(fh, buf, st))
SE(e_write_ordered, PMPI_File_write_ordered_end(fh, buf, st))
#undef SE

EXPORT int MPI_File_read_all_begin(MPI_File fh, void *buf, int n, MPI_Datatype dt)
{
    if (RK_STG_LIKELY(!is_dev(buf)))
        return PMPI_File_read_all_begin(fh, buf, n, dt);
    return split_begin(b_read_all, 1, "MPI_File_read_all_begin", fh, 0, buf, n, dt);
}
EXPORT int MPI_File_write_all_begin(MPI_File fh, const void *buf, int n, MPI_Datatype dt)
{
    if (RK_STG_LIKELY(!is_dev(buf)))
        return PMPI_File_write_all_begin(fh, buf, n, dt);
    return split_begin(b_write_all, 0, "MPI_File_write_all_begin", fh, 0, buf, n, dt);
}
EXPORT int MPI_File_read_at_all_begin(MPI_File fh, MPI_Offset off, void *buf, int n,
                                      MPI_Datatype dt)
{
    if (RK_STG_LIKELY(!is_dev(buf)))
        return PMPI_File_read_at_all_begin(fh, off, buf, n, dt);
    return split_begin(b_read_at_all, 1, "MPI_File_read_at_all_begin", fh, off, buf, n, dt);
}
EXPORT int MPI_File_write_at_all_begin(MPI_File fh, MPI_Offset off, const void *buf, int n,
                                       MPI_Datatype dt)
{
    if (RK_STG_LIKELY(!is_dev(buf)))
        return PMPI_File_write_at_all_begin(fh, off, buf, n, dt);
    return split_begin(b_write_at_all, 0, "MPI_File_write_at_all_begin", fh, off, buf, n, dt);
}
EXPORT int MPI_File_read_ordered_begin(MPI_File fh, void *buf, int n, MPI_Datatype dt)
{
    if (RK_STG_LIKELY(!is_dev(buf)))
        return PMPI_File_read_ordered_begin(fh, buf, n, dt);
    return split_begin(b_read_ordered, 1, "MPI_File_read_ordered_begin", fh, 0, buf, n, dt);
}
EXPORT int MPI_File_write_ordered_begin(MPI_File fh, const void *buf, int n, MPI_Datatype dt)
{
    if (RK_STG_LIKELY(!is_dev(buf)))
        return PMPI_File_write_ordered_begin(fh, buf, n, dt);
    return split_begin(b_write_ordered, 0, "MPI_File_write_ordered_begin", fh, 0, buf, n, dt);
}

EXPORT int MPI_File_read_all_end(MPI_File fh, void *buf, MPI_Status *st)
{
    return split_end(e_read_all, "MPI_File_read_all_end", fh, buf, st);
}
EXPORT int MPI_File_write_all_end(MPI_File fh, const void *buf, MPI_Status *st)
{
    return split_end(e_write_all, "MPI_File_write_all_end", fh, (void *)buf, st);
}
EXPORT int MPI_File_read_at_all_end(MPI_File fh, void *buf, MPI_Status *st)
{
    return split_end(e_read_at_all, "MPI_File_read_at_all_end", fh, buf, st);
}
EXPORT int MPI_File_write_at_all_end(MPI_File fh, const void *buf, MPI_Status *st)
{
    return split_end(e_write_at_all, "MPI_File_write_at_all_end", fh, (void *)buf, st);
}
EXPORT int MPI_File_read_ordered_end(MPI_File fh, void *buf, MPI_Status *st)
{
    return split_end(e_read_ordered, "MPI_File_read_ordered_end", fh, buf, st);
}
EXPORT int MPI_File_write_ordered_end(MPI_File fh, const void *buf, MPI_Status *st)
{
    return split_end(e_write_ordered, "MPI_File_write_ordered_end", fh, (void *)buf, st);
}

#endif /* MPI_MODE_RDONLY */

/* ---- one-sided communication ---- */

/* Device memory as a window: refused. Win_create is collective, so every
 * rank learns whether any rank brought device memory, and all refuse
 * together (a rank going on into MPI's Win_create would wait forever); the
 * lowest such rank says why, once per job. */
static atomic_int warned_create, warned_attach;

EXPORT int MPI_Win_create(void *base, MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm,
                          MPI_Win *win)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Win_create(base, size, disp_unit, info, comm, win);
    int me = 0, first = 0x7fffffff, mine;
    PMPI_Comm_rank(comm, &me);
    mine = size > 0 && is_dev(base) ? me : 0x7fffffff;
    int rc = PMPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    if (first == 0x7fffffff)
        return PMPI_Win_create(base, size, disp_unit, info, comm, win);
    /* Every rank knows of the refusal: the flag is set on all of them, so
     * that a later one (another rank's device memory) prints nothing. */
    if (!atomic_exchange(&warned_create, 1) && first == me)
        rk_mpi_warn("staging: MPI_Win_create: a window in device memory cannot work with an MPI "
                    "that is not CUDA-aware (other ranks' operations reach it without the "
                    "plugin); refused on every rank of the communicator (MPI_ERR_BUFFER)");
    *win = MPI_WIN_NULL;
    PMPI_Comm_call_errhandler(comm, MPI_ERR_BUFFER);
    return MPI_ERR_BUFFER;
}

EXPORT int MPI_Win_attach(MPI_Win win, void *base, MPI_Aint size)
{
    if (RK_STG_LIKELY(size <= 0 || !is_dev(base)))
        return PMPI_Win_attach(win, base, size);
    if (!atomic_exchange(&warned_attach, 1))
        rk_mpi_warn("staging: MPI_Win_attach: device memory cannot be attached to a window with "
                    "an MPI that is not CUDA-aware (other ranks' operations reach it without "
                    "the plugin); refused (MPI_ERR_BUFFER)");
    PMPI_Win_call_errhandler(win, MPI_ERR_BUFFER);
    return MPI_ERR_BUFFER;
}

/* An origin-side operation with staged buffers: origin (o), compare (c)
 * and result (r; a Get's origin is its result). Kept on the pending list
 * until a synchronisation completes it at the origin, or carried by a
 * request (the R forms). */
typedef struct rop {
    struct rop *next;
    MPI_Win win;
    int target;
    side_t s[3];
} rop_t;

static pthread_mutex_t rop_mu = PTHREAD_MUTEX_INITIALIZER;
static rop_t *rops;
static atomic_long nrops;

enum { OP_PUT, OP_GET, OP_ACC, OP_GACC, OP_FOP, OP_CAS };

/* One call's arguments, as the user gave them. */
typedef struct {
    int kind;
    const void *o, *c;
    void *r;
    int on, rn, tn;
    MPI_Datatype ot, rt, tt;
    int target;
    MPI_Aint td;
    MPI_Op op;
    MPI_Win win;
} rma_t;

/* MPI's call on the buffers o, c, r: the request form when q is not NULL. */
static int rma_call(const rma_t *a, const void *o, const void *c, void *r, MPI_Request *q)
{
    switch (a->kind) {
    case OP_PUT:
        return q ? PMPI_Rput(o, a->on, a->ot, a->target, a->td, a->tn, a->tt, a->win, q)
                 : PMPI_Put(o, a->on, a->ot, a->target, a->td, a->tn, a->tt, a->win);
    case OP_GET:
        return q ? PMPI_Rget(r, a->rn, a->rt, a->target, a->td, a->tn, a->tt, a->win, q)
                 : PMPI_Get(r, a->rn, a->rt, a->target, a->td, a->tn, a->tt, a->win);
    case OP_ACC:
        return q ? PMPI_Raccumulate(o, a->on, a->ot, a->target, a->td, a->tn, a->tt, a->op,
                                    a->win, q)
                 : PMPI_Accumulate(o, a->on, a->ot, a->target, a->td, a->tn, a->tt, a->op,
                                   a->win);
    case OP_GACC:
        return q ? PMPI_Rget_accumulate(o, a->on, a->ot, r, a->rn, a->rt, a->target, a->td, a->tn,
                                        a->tt, a->op, a->win, q)
                 : PMPI_Get_accumulate(o, a->on, a->ot, r, a->rn, a->rt, a->target, a->td, a->tn,
                                       a->tt, a->op, a->win);
    case OP_FOP:
        return PMPI_Fetch_and_op(o, r, a->ot, a->target, a->td, a->op, a->win);
    default:
        return PMPI_Compare_and_swap(o, c, r, a->ot, a->target, a->td, a->win);
    }
}

static void rop_free(rop_t *p)
{
    for (int i = 0; i < 3; i++)
        side_done(&p->s[i]);
    free(p);
}

/* The results of p to the device (p is complete at the origin). */
static int rop_finish(rop_t *p)
{
    int rc = MPI_SUCCESS;
    for (int i = 0; i < 3; i++) {
        int e = side_back(&p->s[i]);
        rc = rc == MPI_SUCCESS ? e : rc;
    }
    rop_free(p);
    return rc;
}

static int rop_req_done(void *arg, MPI_Status *st)
{
    (void)st;
    return rop_finish(arg);
}

static void rop_add(rop_t *p)
{
    pthread_mutex_lock(&rop_mu);
    p->next = rops;
    rops = p;
    atomic_fetch_add(&nrops, 1);
    pthread_mutex_unlock(&rop_mu);
}

/* Take win's pending operations to target (-1: all of them), in the
 * order they were made. */
static rop_t *rop_take(MPI_Win win, int target)
{
    rop_t *out = NULL;
    pthread_mutex_lock(&rop_mu);
    for (rop_t **pp = &rops; *pp;) {
        rop_t *p = *pp;
        if (p->win == win && (target < 0 || p->target == target)) {
            *pp = p->next;
            p->next = out; /* rops is newest first: this reverses it */
            out = p;
            atomic_fetch_sub(&nrops, 1);
        } else {
            pp = &p->next;
        }
    }
    pthread_mutex_unlock(&rop_mu);
    return out;
}

static int win_fail(MPI_Win win, int rc, const char *what)
{
    rk_mpi_warn("staging: %s: cannot stage a device buffer (error class %d)", what, rc);
    PMPI_Win_call_errhandler(win, rc);
    return rc;
}

/* After a synchronisation call (its return rc) that completed win's
 * operations to target (-1: all) at the origin. */
static int rma_synced(int rc, MPI_Win win, int target, const char *what)
{
    if (rc != MPI_SUCCESS || !atomic_load_explicit(&nrops, memory_order_relaxed))
        return rc;
    int e = MPI_SUCCESS;
    for (rop_t *p = rop_take(win, target), *n; p; p = n) {
        n = p->next;
        int x = rop_finish(p);
        e = e == MPI_SUCCESS ? x : e;
    }
    return e != MPI_SUCCESS ? win_fail(win, e, what) : rc;
}

/* Stage a's buffers, make the call, keep them (list or request). */
static int rma_staged(const rma_t *a, MPI_Request *q, const char *what)
{
    rop_t *p = calloc(1, sizeof *p);
    if (!p)
        return win_fail(a->win, MPI_ERR_NO_MEM, what);
    p->win = a->win;
    p->target = a->target;
    int one = a->kind == OP_FOP || a->kind == OP_CAS;
    int rc = side_in(&p->s[0], a->o, one ? 1 : a->on, a->ot, 0);
    if (rc == MPI_SUCCESS && a->kind == OP_CAS)
        rc = side_in(&p->s[1], a->c, 1, a->ot, 0);
    if (rc == MPI_SUCCESS)
        rc = side_out(&p->s[2], a->r, one ? 1 : a->rn, one ? a->ot : a->rt, 0);
    if (rc != MPI_SUCCESS) {
        rop_free(p);
        return win_fail(a->win, rc, what);
    }
    MPI_Request inner = MPI_REQUEST_NULL;
    rc = rma_call(a, p->s[0].h, p->s[1].h, p->s[2].h, q ? &inner : NULL);
    if (rc != MPI_SUCCESS) { /* MPI's error: its handler ran */
        rop_free(p);
        return rc;
    }
    if (!q) {
        rop_add(p);
        return rc;
    }
    rc = rk_stg_wrap(inner, MPI_COMM_SELF, rop_req_done, p, q);
    if (rc == MPI_SUCCESS)
        return rc;
    PMPI_Wait(&inner, MPI_STATUS_IGNORE);
    rop_finish(p);
    return win_fail(a->win, rc, what);
}

#define RMA_FAST(a) (RK_STG_LIKELY(!is_dev((a).o) && !is_dev((a).c) && !is_dev((a).r)))

EXPORT int MPI_Put(const void *o, int on, MPI_Datatype ot, int target, MPI_Aint td, int tn,
                   MPI_Datatype tt, MPI_Win win)
{
    if (RK_STG_LIKELY(!is_dev(o)))
        return PMPI_Put(o, on, ot, target, td, tn, tt, win);
    rma_t a = {.kind = OP_PUT, .o = o, .on = on, .ot = ot, .target = target, .td = td, .tn = tn,
               .tt = tt, .win = win};
    return rma_staged(&a, NULL, "MPI_Put");
}

EXPORT int MPI_Get(void *o, int on, MPI_Datatype ot, int target, MPI_Aint td, int tn,
                   MPI_Datatype tt, MPI_Win win)
{
    if (RK_STG_LIKELY(!is_dev(o)))
        return PMPI_Get(o, on, ot, target, td, tn, tt, win);
    rma_t a = {.kind = OP_GET, .r = o, .rn = on, .rt = ot, .target = target, .td = td, .tn = tn,
               .tt = tt, .win = win};
    return rma_staged(&a, NULL, "MPI_Get");
}

EXPORT int MPI_Accumulate(const void *o, int on, MPI_Datatype ot, int target, MPI_Aint td, int tn,
                          MPI_Datatype tt, MPI_Op op, MPI_Win win)
{
    if (RK_STG_LIKELY(!is_dev(o)))
        return PMPI_Accumulate(o, on, ot, target, td, tn, tt, op, win);
    rma_t a = {.kind = OP_ACC, .o = o, .on = on, .ot = ot, .target = target, .td = td, .tn = tn,
               .tt = tt, .op = op, .win = win};
    return rma_staged(&a, NULL, "MPI_Accumulate");
}

EXPORT int MPI_Get_accumulate(const void *o, int on, MPI_Datatype ot, void *r, int rn,
                              MPI_Datatype rt, int target, MPI_Aint td, int tn, MPI_Datatype tt,
                              MPI_Op op, MPI_Win win)
{
    rma_t a = {.kind = OP_GACC, .o = o, .on = on, .ot = ot, .r = r, .rn = rn, .rt = rt,
               .target = target, .td = td, .tn = tn, .tt = tt, .op = op, .win = win};
    if (RMA_FAST(a))
        return PMPI_Get_accumulate(o, on, ot, r, rn, rt, target, td, tn, tt, op, win);
    return rma_staged(&a, NULL, "MPI_Get_accumulate");
}

EXPORT int MPI_Fetch_and_op(const void *o, void *r, MPI_Datatype dt, int target, MPI_Aint td,
                            MPI_Op op, MPI_Win win)
{
    rma_t a = {.kind = OP_FOP, .o = o, .r = r, .ot = dt, .target = target, .td = td, .op = op,
               .win = win};
    if (RMA_FAST(a))
        return PMPI_Fetch_and_op(o, r, dt, target, td, op, win);
    return rma_staged(&a, NULL, "MPI_Fetch_and_op");
}

EXPORT int MPI_Compare_and_swap(const void *o, const void *c, void *r, MPI_Datatype dt, int target,
                                MPI_Aint td, MPI_Win win)
{
    rma_t a = {.kind = OP_CAS, .o = o, .c = c, .r = r, .ot = dt, .target = target, .td = td,
               .win = win};
    if (RMA_FAST(a))
        return PMPI_Compare_and_swap(o, c, r, dt, target, td, win);
    return rma_staged(&a, NULL, "MPI_Compare_and_swap");
}

EXPORT int MPI_Rput(const void *o, int on, MPI_Datatype ot, int target, MPI_Aint td, int tn,
                    MPI_Datatype tt, MPI_Win win, MPI_Request *q)
{
    if (RK_STG_LIKELY(!is_dev(o)))
        return PMPI_Rput(o, on, ot, target, td, tn, tt, win, q);
    rma_t a = {.kind = OP_PUT, .o = o, .on = on, .ot = ot, .target = target, .td = td, .tn = tn,
               .tt = tt, .win = win};
    return rma_staged(&a, q, "MPI_Rput");
}

EXPORT int MPI_Rget(void *o, int on, MPI_Datatype ot, int target, MPI_Aint td, int tn,
                    MPI_Datatype tt, MPI_Win win, MPI_Request *q)
{
    if (RK_STG_LIKELY(!is_dev(o)))
        return PMPI_Rget(o, on, ot, target, td, tn, tt, win, q);
    rma_t a = {.kind = OP_GET, .r = o, .rn = on, .rt = ot, .target = target, .td = td, .tn = tn,
               .tt = tt, .win = win};
    return rma_staged(&a, q, "MPI_Rget");
}

EXPORT int MPI_Raccumulate(const void *o, int on, MPI_Datatype ot, int target, MPI_Aint td,
                           int tn, MPI_Datatype tt, MPI_Op op, MPI_Win win, MPI_Request *q)
{
    if (RK_STG_LIKELY(!is_dev(o)))
        return PMPI_Raccumulate(o, on, ot, target, td, tn, tt, op, win, q);
    rma_t a = {.kind = OP_ACC, .o = o, .on = on, .ot = ot, .target = target, .td = td, .tn = tn,
               .tt = tt, .op = op, .win = win};
    return rma_staged(&a, q, "MPI_Raccumulate");
}

EXPORT int MPI_Rget_accumulate(const void *o, int on, MPI_Datatype ot, void *r, int rn,
                               MPI_Datatype rt, int target, MPI_Aint td, int tn, MPI_Datatype tt,
                               MPI_Op op, MPI_Win win, MPI_Request *q)
{
    rma_t a = {.kind = OP_GACC, .o = o, .on = on, .ot = ot, .r = r, .rn = rn, .rt = rt,
               .target = target, .td = td, .tn = tn, .tt = tt, .op = op, .win = win};
    if (RMA_FAST(a))
        return PMPI_Rget_accumulate(o, on, ot, r, rn, rt, target, td, tn, tt, op, win, q);
    return rma_staged(&a, q, "MPI_Rget_accumulate");
}

/* ---- synchronisation: pending operations complete here ---- */

EXPORT int MPI_Win_fence(int assert, MPI_Win win)
{
    return rma_synced(PMPI_Win_fence(assert, win), win, -1, "MPI_Win_fence");
}

EXPORT int MPI_Win_complete(MPI_Win win)
{
    return rma_synced(PMPI_Win_complete(win), win, -1, "MPI_Win_complete");
}

EXPORT int MPI_Win_unlock(int rank, MPI_Win win)
{
    return rma_synced(PMPI_Win_unlock(rank, win), win, rank, "MPI_Win_unlock");
}

EXPORT int MPI_Win_unlock_all(MPI_Win win)
{
    return rma_synced(PMPI_Win_unlock_all(win), win, -1, "MPI_Win_unlock_all");
}

EXPORT int MPI_Win_flush(int rank, MPI_Win win)
{
    return rma_synced(PMPI_Win_flush(rank, win), win, rank, "MPI_Win_flush");
}

EXPORT int MPI_Win_flush_all(MPI_Win win)
{
    return rma_synced(PMPI_Win_flush_all(win), win, -1, "MPI_Win_flush_all");
}

EXPORT int MPI_Win_flush_local(int rank, MPI_Win win)
{
    return rma_synced(PMPI_Win_flush_local(rank, win), win, rank, "MPI_Win_flush_local");
}

EXPORT int MPI_Win_flush_local_all(MPI_Win win)
{
    return rma_synced(PMPI_Win_flush_local_all(win), win, -1, "MPI_Win_flush_local_all");
}

/* Operations still pending when the window goes (erroneous: MPI requires
 * them completed) are dropped without copying back. */
EXPORT int MPI_Win_free(MPI_Win *win)
{
    MPI_Win w = win ? *win : MPI_WIN_NULL;
    int rc = PMPI_Win_free(win);
    if (rc == MPI_SUCCESS && atomic_load_explicit(&nrops, memory_order_relaxed))
        for (rop_t *p = rop_take(w, -1), *n; p; p = n) {
            n = p->next;
            rop_free(p);
        }
    return rc;
}
