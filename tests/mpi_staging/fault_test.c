/* Staging under injected faults (issue 31): pinned memory that cannot be
 * had, no staging buffer at all, a copy to or from the device that fails,
 * injected on the sender or on the receiver of a point-to-point message of
 * each protocol (whole message, pipelined blocking, the nonblocking ring,
 * a non-contiguous type, and CUDA IPC where the test backend maps peers).
 *
 * What must hold after every fault:
 * - no call hangs: the sender's call returns; the receive completes,
 *   unless the sender failed before any of its message left (then, as for
 *   a failed MPI_Send, nothing arrives and the test cancels the receive);
 * - no silent wrong data: a receive that reports success holds the
 *   message, every byte (and never writes past it);
 * - pinned memory that cannot be had is no error at all (pageable
 *   memory serves), with the right data;
 * - nothing is kept: no staging buffer stays taken (rk_stg_buf_inuse);
 * - the same message without faults afterwards succeeds, right data.
 *
 * Built with the plugin's sources (as stg_fake): the fake device region is
 * a memory file, so peers can map it (the IPC path). A watchdog (alarm)
 * turns a hang into a failed run naming the case. */
#define _GNU_SOURCE
#include "config.h"

#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mtap.h"
#include "staging/ipc_map.h"
#include "staging/staging.h"

static int me, np;
static char *freg;
static size_t fsize = (size_t)128 << 20, fused;

static char *dev_alloc(size_t n)
{
    n = (n + 4095) & ~(size_t)4095;
    if (fused + n > fsize)
        abort();
    char *p = freg + fused;
    fused += n;
    return p;
}

static unsigned char pat(size_t i, unsigned seed) { return (unsigned char)((i * 131u + seed * 7u) ^ (i >> 9)); }

/* The case running, for the watchdog. */
static char current[256];

static void on_alarm(int sig)
{
    (void)sig;
    char line[400];
    int n = snprintf(line, sizeof line, "# rank %d: HANG in %s\n", me, current);
    if (n > 0 && write(2, line, (size_t)n) < 0)
        _exit(3);
    _exit(3);
}

enum { P_SMALL, P_PIPE, P_RING, P_VEC, NPROTO };
static const char *pname[] = {"whole message (64 KiB)", "pipelined, blocking (6 MiB)",
                              "ring, nonblocking (6 MiB)", "non-contiguous vector (3 MiB of data)"};
static const char *fname[] = {"pinned", "host", "copy"};

typedef struct {
    int count;
    MPI_Datatype dt;
    size_t span; /* bytes the buffer covers */
} msg_t;

static MPI_Datatype vec;

static msg_t message(int p)
{
    msg_t m = {0, MPI_BYTE, 0};
    switch (p) {
    case P_SMALL:
        m.count = 64 << 10;
        break;
    case P_PIPE:
    case P_RING:
        m.count = 6 << 20;
        break;
    default:
        m.count = (3 << 20) / 8; /* vec: 2 ints of every 3 */
        m.dt = vec;
        break;
    }
    if (m.dt == MPI_BYTE) {
        m.span = (size_t)m.count;
    } else {
        MPI_Aint lb, ext;
        MPI_Type_get_extent(m.dt, &lb, &ext);
        m.span = (size_t)m.count * (size_t)ext;
    }
    return m;
}

/* Whether byte i of a span is data of the message (else a gap). */
static int is_data(int p, size_t i) { return p != P_VEC || (i % 12) < 8; }

typedef struct {
    int rc_send, rc_recv, recv_done, cancelled, data_ok, hits;
} outcome_t;

/* One message from rank 0 to rank 1, the fault (kind f, call first) on
 * rank side (0 sender, 1 receiver; -1 none). Both ranks learn the outcome. */
static outcome_t one(int p, int f, int side, unsigned first)
{
    outcome_t o = {MPI_SUCCESS, MPI_SUCCESS, 1, 0, 1, 0};
    msg_t m = message(p);
    fused = 0;
    char *buf = dev_alloc(m.span + 4096);
    size_t guard = 4096;
    for (size_t i = 0; i < m.span + guard; i++)
        buf[i] = me == 0 ? (char)pat(i, 1) : (char)0x5a;
    MPI_Comm side_comm = MPI_COMM_WORLD;
    MPI_Barrier(MPI_COMM_WORLD);
    if (side == me)
        rk_stg_fault_set(f, first, 0);
    alarm(30);
    if (me == 0) {
        if (p == P_RING) {
            MPI_Request rq;
            o.rc_send = MPI_Isend(buf, m.count, m.dt, 1, 7, MPI_COMM_WORLD, &rq);
            if (o.rc_send == MPI_SUCCESS)
                o.rc_send = MPI_Wait(&rq, MPI_STATUS_IGNORE);
        } else {
            o.rc_send = MPI_Send(buf, m.count, m.dt, 1, 7, MPI_COMM_WORLD);
        }
        MPI_Send(&o.rc_send, 1, MPI_INT, 1, 99, side_comm);
    } else if (me == 1) {
        MPI_Request rq, note;
        int srv = 0, flag = 0, nflag = 0, sender_failed = 0;
        /* A receive that fails when posted has no effect (as any MPI call
         * that fails): the application may post it again. */
        for (int tries = 0; tries < 4; tries++)
            if ((o.rc_recv = MPI_Irecv(buf, m.count, m.dt, 0, 7, MPI_COMM_WORLD, &rq)) ==
                MPI_SUCCESS)
                break;
        MPI_Irecv(&srv, 1, MPI_INT, 0, 99, side_comm, &note);
        o.recv_done = o.rc_recv != MPI_SUCCESS;
        long waited = 0;
        while (!o.recv_done) {
            MPI_Status st;
            int rc = MPI_Test(&rq, &flag, &st);
            if (rc != MPI_SUCCESS || flag) {
                o.rc_recv = rc;
                o.recv_done = 1;
                break;
            }
            if (!nflag) {
                MPI_Test(&note, &nflag, MPI_STATUS_IGNORE);
                if (nflag)
                    sender_failed = srv != MPI_SUCCESS;
            }
            if (sender_failed && ++waited > 2000) {
                /* The sender's call failed: cancel. A receive that met
                 * the message is not cancelled and ends as it ends. */
                MPI_Cancel(&rq);
                MPI_Status cst;
                o.rc_recv = MPI_Wait(&rq, &cst);
                int c = 0;
                MPI_Test_cancelled(&cst, &c);
                o.cancelled = c;
                o.recv_done = !c;
                break;
            }
            usleep(50);
        }
        if (!nflag)
            MPI_Wait(&note, MPI_STATUS_IGNORE);
        o.rc_send = srv;
        if (o.recv_done && o.rc_recv == MPI_SUCCESS)
            for (size_t i = 0; i < m.span + guard; i++) {
                unsigned char want = i < m.span && is_data(p, i) ? pat(i, 1) : 0x5a;
                if ((unsigned char)buf[i] != want) {
                    o.data_ok = 0;
                    break;
                }
            }
    }
    alarm(0);
    o.hits = side == me ? (int)rk_stg_fault_hits(f) : 0;
    rk_stg_fault_set(f, 0, 0);
    int v[5] = {o.rc_send, o.rc_recv, o.recv_done, o.cancelled, o.data_ok};
    MPI_Bcast(v, 5, MPI_INT, 1, MPI_COMM_WORLD);
    int h = o.hits, hall = 0;
    MPI_Allreduce(&h, &hall, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    o = (outcome_t){v[0], v[1], v[2], v[3], v[4], hall};
    return o;
}

int main(int argc, char **argv)
{
    int fd = memfd_create("rankmem-fake-device", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)fsize) != 0)
        return 1;
    freg = mmap(NULL, fsize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (freg == MAP_FAILED)
        return 1;
    rk_stg_fake_device(freg, fsize);
    rk_stg_fake_ipc(fd);
    MPI_Init(&argc, &argv);
    rk_mpi_staging_init();
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    signal(SIGALRM, on_alarm);
    MPI_Type_vector(1, 2, 3, MPI_INT, &vec);
    MPI_Datatype v2;
    MPI_Type_create_resized(vec, 0, 12, &v2);
    MPI_Type_free(&vec);
    vec = v2;
    MPI_Type_commit(&vec);
    if (np != 2) {
        mskip("2 ranks needed");
        MPI_Finalize();
        return 0;
    }
    unsigned maxfirst = argc > 1 ? (unsigned)atoi(argv[1]) : 4;
    /* RKT_FAULT_ONLY="p f side first": that case alone (debugging) */
    const char *only = getenv("RKT_FAULT_ONLY");
    if (only) {
        int p = 0, f = 0, side = 0;
        unsigned first = 1;
        sscanf(only, "%d %d %d %u", &p, &f, &side, &first);
        snprintf(current, sizeof current, "case %s", only);
        outcome_t o = one(p, f, side, first);
        printf("# send %d recv %d done %d cancelled %d data %d hits %d\n", o.rc_send, o.rc_recv,
               o.recv_done, o.cancelled, o.data_ok, o.hits);
        MPI_Finalize();
        return 0;
    }
    int total_faults = 0;
    for (int p = 0; p < NPROTO; p++) {
        for (int f = 0; f < RK_STG_FAULTS; f++)
            for (int side = 0; side < 2; side++) {
                int ok = 1, faults = 0, errors = 0, cancels = 0;
                char why[600] = "";
                for (unsigned first = 1; first <= maxfirst; first++) {
                    snprintf(current, sizeof current, "%s, %s fault on the %s, call %u", pname[p],
                             fname[f], side ? "receiver" : "sender", first);
                    outcome_t o = one(p, f, side, first);
                    faults += o.hits;
                    int err = o.rc_send != MPI_SUCCESS || o.rc_recv != MPI_SUCCESS || o.cancelled;
                    errors += err;
                    cancels += o.cancelled;
                    long inuse = rk_stg_buf_inuse(), all = 0;
                    MPI_Allreduce(&inuse, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
                    outcome_t again = one(p, f, -1, 0);
                    const char *bad = NULL;
                    if (o.recv_done && o.rc_recv == MPI_SUCCESS && !o.data_ok)
                        bad = "a receive reported success with wrong data";
                    else if (f == RK_STG_FAULT_PINNED && err)
                        bad = "pinned memory short gave an error";
                    else if (o.cancelled && o.rc_send == MPI_SUCCESS)
                        bad = "the receive did not complete although the send did";
                    else if (o.hits && side == 1 && !o.recv_done)
                        bad = "the failing receive did not complete";
                    else if (all)
                        bad = "staging buffers still taken";
                    else if (again.rc_send || again.rc_recv || !again.data_ok || again.cancelled)
                        bad = "the same message without faults failed afterwards";
                    if (bad && ok) {
                        ok = 0;
                        snprintf(why, sizeof why,
                                 "%s: %s (send %d, recv %d, done %d, cancelled %d, data %d, "
                                 "buffers %ld)",
                                 current, bad, o.rc_send, o.rc_recv, o.recv_done, o.cancelled,
                                 o.data_ok, all);
                    }
                }
                if (!ok && me == 0)
                    fprintf(stderr, "# %s\n", why);
                total_faults += faults;
                mok(ok,
                    "%s, %s fault on the %s, calls 1..%u: %d injected, %d calls gave an error "
                    "(%d receives cancelled after the send failed), never wrong data, no hang, "
                    "nothing kept",
                    pname[p], fname[f], side ? "receiver" : "sender", maxfirst, faults, errors,
                    cancels);
            }
    }
    mok(total_faults > 0, "faults were injected: %d", total_faults);
    MPI_Type_free(&vec);
    MPI_Finalize();
    return 0;
}
