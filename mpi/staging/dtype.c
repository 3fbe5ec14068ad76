/* Staging, datatypes: what a (buffer, count, datatype) touches, and the
 * copy back to the device of exactly the bytes a receive's datatype
 * describes. A receive never writes the gaps between them: a kernel may be
 * using them (MPI's rule is about the bytes the datatype names only).
 *
 * Which bytes a datatype describes is asked of MPI itself, whatever its
 * constructor (subarray, darray, Fortran types, pairs with holes): one
 * element is unpacked from 0xff bytes into a zeroed image, and the runs of
 * 0xff are the element's blocks. The copies are then one strided (2D) copy
 * per block across all elements, or per run of equal blocks within one
 * element: a few copies even for 65,530 elements of a struct with holes. */
#include "staging.h"

#include <stdlib.h>
#include <string.h>

/* ---- layout ---- */

static int dense_type(MPI_Datatype dt, int depth);

/* dt's elements lie one after the other with nothing between them and
 * in memory order: size == extent, true lb 0, and its type map in order. */
static int packed_in_order(MPI_Datatype dt, int depth)
{
    int sz = 0;
    MPI_Aint lb, ext, tlb, text;
    if (PMPI_Type_size(dt, &sz) != MPI_SUCCESS ||
        PMPI_Type_get_extent(dt, &lb, &ext) != MPI_SUCCESS ||
        PMPI_Type_get_true_extent(dt, &tlb, &text) != MPI_SUCCESS)
        return 0;
    if (sz == 0)
        return 1;
    return tlb == 0 && lb == 0 && (MPI_Aint)sz == text && ext == text && dense_type(dt, depth);
}

/* The type map of one element of dt is in memory order, without holes.
 * Decoded constructor by constructor; what is not known answers 0 (the
 * slower, always right path). */
static int dense_type(MPI_Datatype dt, int depth)
{
    int ni = 0, na = 0, nd = 0, comb = -1;
    if (depth > 16 || PMPI_Type_get_envelope(dt, &ni, &na, &nd, &comb) != MPI_SUCCESS)
        return 0;
    if (comb == MPI_COMBINER_NAMED) {
        int sz = 0;
        MPI_Aint tlb, text;
        return PMPI_Type_size(dt, &sz) == MPI_SUCCESS &&
               PMPI_Type_get_true_extent(dt, &tlb, &text) == MPI_SUCCESS && tlb == 0 &&
               (MPI_Aint)sz == text;
    }
    int *iv = malloc(sizeof(int) * (size_t)(ni + 1));
    MPI_Aint *av = malloc(sizeof(MPI_Aint) * (size_t)(na + 1));
    MPI_Datatype *tv = malloc(sizeof(MPI_Datatype) * (size_t)(nd + 1));
    int ok = 0;
    if (!iv || !av || !tv || PMPI_Type_get_contents(dt, ni, na, nd, iv, av, tv) != MPI_SUCCESS) {
        free(iv), free(av), free(tv);
        return 0;
    }
    MPI_Aint lb = 0, e0 = 0;
    if (nd >= 1)
        PMPI_Type_get_extent(tv[0], &lb, &e0);
    switch (comb) {
    case MPI_COMBINER_DUP:
    case MPI_COMBINER_RESIZED: /* the top level checks lb and extent */
        ok = dense_type(tv[0], depth + 1);
        break;
    case MPI_COMBINER_CONTIGUOUS:
        ok = iv[0] <= 1 ? dense_type(tv[0], depth + 1) : packed_in_order(tv[0], depth + 1);
        break;
    case MPI_COMBINER_VECTOR:
    case MPI_COMBINER_HVECTOR: {
        MPI_Aint stride = comb == MPI_COMBINER_VECTOR ? (MPI_Aint)iv[2] * e0 : av[0];
        ok = packed_in_order(tv[0], depth + 1) &&
             (iv[0] <= 1 || stride == (MPI_Aint)iv[1] * e0);
        break;
    }
    case MPI_COMBINER_INDEXED:
    case MPI_COMBINER_HINDEXED:
    case MPI_COMBINER_INDEXED_BLOCK:
    case MPI_COMBINER_HINDEXED_BLOCK: {
        int n = iv[0], blk = comb == MPI_COMBINER_INDEXED_BLOCK || comb == MPI_COMBINER_HINDEXED_BLOCK;
        ok = packed_in_order(tv[0], depth + 1);
        MPI_Aint next = 0;
        int any = 0;
        for (int i = 0; i < n && ok; i++) {
            int bl = blk ? iv[1] : iv[1 + i];
            MPI_Aint d;
            if (comb == MPI_COMBINER_INDEXED)
                d = (MPI_Aint)iv[1 + n + i] * e0;
            else if (comb == MPI_COMBINER_INDEXED_BLOCK)
                d = (MPI_Aint)iv[2 + i] * e0;
            else
                d = av[i];
            if (bl == 0)
                continue;
            ok = !any || d == next;
            next = d + (MPI_Aint)bl * e0;
            any = 1;
        }
        break;
    }
    case MPI_COMBINER_STRUCT: {
        int n = iv[0];
        MPI_Aint next = 0;
        int any = 0;
        ok = 1;
        for (int i = 0; i < n && ok; i++) {
            MPI_Aint l, e;
            if (iv[1 + i] == 0)
                continue;
            PMPI_Type_get_extent(tv[i], &l, &e);
            ok = packed_in_order(tv[i], depth + 1) && (!any || av[i] == next);
            next = av[i] + (MPI_Aint)iv[1 + i] * e;
            any = 1;
        }
        break;
    }
    default:
        ok = 0; /* subarray, darray, Fortran types: asked the slow way */
    }
    for (int i = 0; i < nd; i++) {
        int a, b, c, k = MPI_COMBINER_NAMED;
        if (PMPI_Type_get_envelope(tv[i], &a, &b, &c, &k) == MPI_SUCCESS &&
            k != MPI_COMBINER_NAMED)
            PMPI_Type_free(&tv[i]);
    }
    free(iv), free(av), free(tv);
    return ok;
}

int rk_stg_layout(MPI_Datatype dt, ptrdiff_t first, ptrdiff_t n, rk_stg_layout_t *l)
{
    int sz = 0, rc;
    MPI_Aint lb, ext, tlb, text;
    memset(l, 0, sizeof *l);
    l->contig = 1;
    if ((rc = PMPI_Type_size(dt, &sz)) != MPI_SUCCESS)
        return rc;
    if ((rc = PMPI_Type_get_extent(dt, &lb, &ext)) != MPI_SUCCESS)
        return rc;
    if ((rc = PMPI_Type_get_true_extent(dt, &tlb, &text)) != MPI_SUCCESS)
        return rc;
    l->tsize = (size_t)sz;
    if (n <= 0 || sz <= 0)
        return MPI_SUCCESS;
    l->size = (size_t)n * (size_t)sz;
    ptrdiff_t a = first * (ptrdiff_t)ext, b = (first + n - 1) * (ptrdiff_t)ext;
    ptrdiff_t lo = (a < b ? a : b) + (ptrdiff_t)tlb;
    ptrdiff_t hi = (a < b ? b : a) + (ptrdiff_t)tlb + (ptrdiff_t)text;
    l->lo = lo;
    l->span = (size_t)(hi - lo);
    /* One run of size bytes from the element's start, in the order MPI
     * sends them: the paths that split or map bytes (pipelined, IPC, the
     * ring) need exactly that. A datatype whose data starts past its own
     * origin (a true lower bound), has holes, or lists its blocks out of
     * memory order is staged whole instead. */
    l->contig = tlb == 0 && (size_t)text == (size_t)sz && (n == 1 || ext == text) &&
                dense_type(dt, 0);
    return MPI_SUCCESS;
}

int rk_stg_is_device_bottom(int count, MPI_Datatype dt)
{
    MPI_Aint tlb, text;
    if (count <= 0 || PMPI_Type_get_true_extent(dt, &tlb, &text) != MPI_SUCCESS || tlb == 0)
        return 0;
    return rk_stg_is_device((const void *)(uintptr_t)tlb);
}

/* ---- the bytes a datatype describes ---- */

typedef struct {
    ptrdiff_t off; /* from the element's origin */
    size_t len;
} blk_t;

/* Elements larger than this get the old behaviour (the whole region back):
 * the mask would cost as much host memory. */
#define MASK_MAX ((size_t)256 << 20)

/* The blocks of one element of dt (runs of described bytes, in memory
 * order, offsets from the element's origin). *nb_p blocks in *b_p (to
 * free). 0, or -1 (no memory, MPI refused, or too large). */
static int elem_blocks(MPI_Datatype dt, blk_t **b_p, size_t *nb_p)
{
    MPI_Aint tlb, text;
    int psz = 0, pos = 0;
    *b_p = NULL;
    *nb_p = 0;
    if (PMPI_Type_get_true_extent(dt, &tlb, &text) != MPI_SUCCESS || text <= 0 ||
        (size_t)text > MASK_MAX || PMPI_Pack_size(1, dt, MPI_COMM_SELF, &psz) != MPI_SUCCESS)
        return -1;
    unsigned char *img = calloc((size_t)text, 1), *pk = malloc((size_t)psz + 1);
    int rc = -1;
    if (img && pk) {
        memset(pk, 0xff, (size_t)psz);
        if (PMPI_Unpack(pk, psz, &pos, img - tlb, 1, dt, MPI_COMM_SELF) == MPI_SUCCESS)
            rc = 0;
    }
    free(pk);
    size_t cap = 0, nb = 0;
    blk_t *b = NULL;
    for (size_t i = 0; rc == 0 && i < (size_t)text;) {
        const unsigned char *p = memchr(img + i, 0xff, (size_t)text - i);
        if (!p)
            break;
        size_t s = (size_t)(p - img), e = s;
        while (e < (size_t)text && img[e] == 0xff)
            e++;
        if (nb == cap) {
            size_t c = cap ? cap * 2 : 16;
            blk_t *nbp = realloc(b, c * sizeof *b);
            if (!nbp) {
                rc = -1;
                break;
            }
            b = nbp, cap = c;
        }
        b[nb++] = (blk_t){(ptrdiff_t)s + (ptrdiff_t)tlb, e - s};
        i = e;
    }
    free(img);
    if (rc != 0) {
        free(b);
        return -1;
    }
    *b_p = b;
    *nb_p = nb;
    return 0;
}

/* Blocks j.. that have b[j]'s length and lie one step apart: the end of
 * that run (*step: the distance, 0 for a run of one). */
static size_t run_end(const blk_t *b, size_t nb, size_t j, ptrdiff_t *step)
{
    size_t k = j + 1;
    *step = 0;
    if (k < nb && b[k].len == b[j].len) {
        *step = b[k].off - b[j].off;
        while (k < nb && b[k].len == b[j].len && b[k].off - b[k - 1].off == *step)
            k++;
    }
    return k;
}

/* Queue the copy of elements [first, first + n) of dt from img (host) to
 * dev, described bytes only, on the host-to-device stream; *ev_p (when not
 * NULL) an event after the last copy (the stream keeps them in order). */
static int put_blocks(char *dev, const char *img, MPI_Datatype dt, ptrdiff_t first, ptrdiff_t n,
                      void **ev_p, size_t *copied)
{
    MPI_Aint lb, ext, tlb, text;
    blk_t *b;
    size_t nb, runs = 0;
    if (PMPI_Type_get_extent(dt, &lb, &ext) != MPI_SUCCESS ||
        PMPI_Type_get_true_extent(dt, &tlb, &text) != MPI_SUCCESS || elem_blocks(dt, &b, &nb) != 0)
        return -1;
    ptrdiff_t step;
    for (size_t j = 0; j < nb; runs++)
        j = run_end(b, nb, j, &step);
    int rc = 0;
    void *ev = NULL;
#define QUEUE(call)                  \
    do {                             \
        rk_stg_event_put(ev);        \
        ev = NULL;                   \
        rc = (call);                 \
    } while (0)
    if (ext >= text && ext > 0 && nb <= (size_t)n * runs) {
        /* Elements do not overlap: one strided copy per block, across
         * every element. */
        for (size_t j = 0; j < nb && !rc; j++) {
            ptrdiff_t o = first * (ptrdiff_t)ext + b[j].off;
            QUEUE(rk_stg_copy2d(dev + o, img + o, (size_t)ext, b[j].len, (size_t)n, RK_STG_H2D,
                                &ev));
            *copied += b[j].len * (size_t)n;
        }
    } else {
        /* Element by element (in MPI's order: where elements overlap, the
         * later one wins, as in MPI's unpack), one strided copy per run of
         * equal blocks. */
        for (ptrdiff_t i = first; i < first + n && !rc; i++)
            for (size_t j = 0; j < nb && !rc;) {
                size_t k = run_end(b, nb, j, &step);
                ptrdiff_t o = i * (ptrdiff_t)ext + b[j].off;
                if (k - j > 1 && step >= (ptrdiff_t)b[j].len)
                    QUEUE(rk_stg_copy2d(dev + o, img + o, (size_t)step, b[j].len, k - j,
                                        RK_STG_H2D, &ev));
                else {
                    QUEUE(rk_stg_copy(dev + o, img + o, b[j].len, RK_STG_H2D, &ev));
                    k = j + 1;
                }
                *copied += b[j].len * (k - j);
                j = k;
            }
    }
#undef QUEUE
    free(b);
    if (ev_p)
        *ev_p = ev;
    else
        rk_stg_event_put(ev);
    return rc;
}

int rk_stg_put_elems(void *dev, const void *img, MPI_Datatype dt, ptrdiff_t first, ptrdiff_t n,
                     const rk_stg_layout_t *L, void **ev_p, size_t *copied)
{
    if (ev_p)
        *ev_p = NULL;
    if (n <= 0 || L->size == 0)
        return 0;
    if (L->contig) {
        /* One run: one copy. */
        rk_stg_layout_t o;
        if (rk_stg_layout(dt, first, n, &o) != MPI_SUCCESS)
            return -1;
        *copied += o.size;
        return rk_stg_copy((char *)dev + o.lo, (const char *)img + o.lo, o.size, RK_STG_H2D,
                           ev_p);
    }
    if (put_blocks(dev, img, dt, first, n, ev_p, copied) == 0)
        return 0;
    /* Without the mask the gaps cannot be told from the data: refuse
     * rather than write them. */
    rk_mpi_warn("staging: cannot copy a receive back to the device: its datatype's element "
                "spans more than %zu MiB (or host memory ran out)", MASK_MAX >> 20);
    return -1;
}

int rk_stg_put_elems_sync(void *dev, const void *img, MPI_Datatype dt, ptrdiff_t first,
                          ptrdiff_t n, const rk_stg_layout_t *L, size_t *copied)
{
    void *ev = NULL;
    int rc = rk_stg_put_elems(dev, img, dt, first, n, L, &ev, copied);
    if (ev && rk_stg_event_wait(ev) != 0)
        rc = -1;
    rk_stg_event_put(ev);
    return rc;
}
