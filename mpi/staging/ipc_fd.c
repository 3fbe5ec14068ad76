/* The fd service of staging/ipc_fd.h: a listening socket and one thread
 * per rank that has a vmm pool, and the importer's side (a connection per
 * owner, made at its first request and kept).
 *
 * Why a socket of our own: MPI carries bytes, and a descriptor is only a
 * number outside the process that owns it; the kernel moves descriptors
 * between processes over a Unix socket (SCM_RIGHTS). The socket lives in
 * the abstract namespace (no file to clean up after a crash); its name
 * holds a nonce agreed by the ranks of the node at MPI_Init, so that two
 * jobs on a node never meet, and the world rank. Only processes of the
 * same user are served (SO_PEERCRED): a descriptor gives access to device
 * memory.
 *
 * The thread makes no MPI call and takes no lock of staging/ipc_map.c: it
 * exports each handle asked for through the public vmm API
 * (rankmem_vmm_export_ex on the handle's first byte, which checks that the
 * handle with that id is still mapped there), sends the descriptors, and
 * closes its copies. Nothing is held for importers between requests: a
 * handle released by the pool is never served again (its id is gone), and
 * an importer's mapping keeps the memory it maps. */
#define _GNU_SOURCE
#include "ipc_fd.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#if HAVE_GPU && !HAVE_HIP
#include <cuda_runtime.h>
#endif

#define MAGIC_REQ 0x726b6671u /* "rkfq" */
#define MAGIC_ANS 0x726b6661u /* "rkfa" */
#define MAX_CLIENTS 256
#define CLIENT_TIMEOUT_S 10 /* a peer that does not answer: staged, not hung */

typedef struct {
    uint32_t magic, n;
    uint64_t nonce;
    struct {
        uint64_t addr, id;
    } h[RK_IPC_FD_MAX];
} request_t;

typedef struct {
    uint32_t magic;
    int32_t status; /* 0, or the index of the first handle refused + 1 */
    uint32_t n, spare;
    struct {
        uint64_t bytes, fd_offset;
    } h[RK_IPC_FD_MAX];
} answer_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* the client side */
static uint64_t job_nonce;
static int nranks;
static int *conns; /* conns[w]: connected socket to world rank w; -1 none yet, -2 failed */
static int listen_fd = -1, wake[2] = {-1, -1};
static pthread_t thread;
static int running;
static rankmem_resource_t *served;
static volatile int refuse_all;

void rk_ipc_fd_refuse(int on) { refuse_all = on; }

static socklen_t sock_name(struct sockaddr_un *a, uint64_t nonce, int rank)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    /* Abstract: sun_path[0] is 0; the name is the bytes after it. */
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "rankmem-ipc-%016llx-%d",
                     (unsigned long long)nonce, rank);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* ---- the service ---- */

static void answer(int c)
{
    request_t q;
    answer_t a;
    ssize_t got = recv(c, &q, sizeof q, 0);
    if (got <= 0)
        return;
    memset(&a, 0, sizeof a);
    a.magic = MAGIC_ANS;
    int fds[RK_IPC_FD_MAX];
    size_t nfd = 0;
    if ((size_t)got < offsetof(request_t, h) || q.magic != MAGIC_REQ || q.nonce != job_nonce ||
        q.n == 0 || q.n > RK_IPC_FD_MAX ||
        (size_t)got < offsetof(request_t, h) + q.n * sizeof q.h[0]) {
        a.status = -1;
    } else {
        for (uint32_t i = 0; i < q.n && !a.status; i++) {
            rankmem_vmm_export_t e;
            /* The handle's first byte, which must still be mapped with
             * this id (MAPPED: a handle is not a live block). */
            if (refuse_all ||
                rankmem_vmm_export_ex(served, (void *)(uintptr_t)q.h[i].addr, 1,
                                      RANKMEM_VMM_EXPORT_MAPPED, &e) != RANKMEM_SUCCESS) {
                a.status = (int32_t)i + 1;
                break;
            }
            if (e.count != 1 || e.offset != 0 || e.handles[0].id != q.h[i].id) {
                a.status = (int32_t)i + 1;
            } else {
                fds[nfd++] = e.handles[0].fd;
                e.handles[0].fd = -1; /* ours now, closed after sending */
                a.h[i].bytes = e.handles[0].bytes;
                a.h[i].fd_offset = e.handles[0].fd_offset;
            }
            rankmem_vmm_export_close(&e);
        }
        if (!a.status)
            a.n = q.n;
    }
    char ctl[CMSG_SPACE(sizeof(int) * RK_IPC_FD_MAX)];
    memset(ctl, 0, sizeof ctl);
    struct iovec iov = {&a, sizeof a};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    if (!a.status && nfd) {
        m.msg_control = ctl;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * nfd);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * nfd);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfd);
    }
    (void)sendmsg(c, &m, MSG_NOSIGNAL);
    for (size_t i = 0; i < nfd; i++)
        close(fds[i]);
}

static void *serve(void *arg)
{
    (void)arg;
#if HAVE_GPU && !HAVE_HIP
    /* The driver's export calls run in the rank's device's context. */
    int dev = rk_mpi_gpu_current();
    if (dev >= 0 && cudaSetDevice(dev) != cudaSuccess)
        (void)cudaGetLastError();
#endif
    struct pollfd pf[2 + MAX_CLIENTS];
    int nc = 0;
    pf[0].fd = wake[0];
    pf[0].events = POLLIN;
    pf[1].fd = listen_fd;
    pf[1].events = POLLIN;
    for (;;) {
        for (int i = 0; i < 2 + nc; i++)
            pf[i].revents = 0;
        int r = poll(pf, (nfds_t)(2 + nc), -1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || pf[0].revents)
            break;
        for (int i = 2; i < 2 + nc;) {
            if (pf[i].revents & POLLIN)
                answer(pf[i].fd);
            if (pf[i].revents & (POLLHUP | POLLERR | POLLNVAL)) {
                close(pf[i].fd);
                pf[i] = pf[1 + nc--];
                continue;
            }
            i++;
        }
        if (pf[1].revents & POLLIN) {
            int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
            struct ucred cr;
            socklen_t cl = sizeof cr;
            if (c >= 0 && (nc == MAX_CLIENTS ||
                           getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0 ||
                           cr.uid != getuid())) {
                close(c);
                c = -1;
            }
            if (c >= 0) {
                pf[2 + nc].fd = c;
                pf[2 + nc].events = POLLIN;
                nc++;
            }
        }
    }
    for (int i = 2; i < 2 + nc; i++)
        close(pf[i].fd);
    return NULL;
}

int rk_ipc_fd_start(uint64_t nonce, int rank, int world_size, rankmem_resource_t *mr, char *why,
                    size_t len)
{
    job_nonce = nonce;
    nranks = world_size;
    conns = malloc((size_t)world_size * sizeof *conns);
    if (!conns) {
        snprintf(why, len, "out of host memory");
        return -1;
    }
    for (int i = 0; i < world_size; i++)
        conns[i] = -1;
    struct sockaddr_un a;
    socklen_t al = sock_name(&a, nonce, rank);
    listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, al) != 0 ||
        listen(listen_fd, 64) != 0 || pipe2(wake, O_CLOEXEC) != 0) {
        snprintf(why, len, "the fd service's socket: %s", strerror(errno));
        rk_ipc_fd_stop();
        return -1;
    }
    served = mr;
    rankmem_resource_retain(mr);
    /* No signal for this thread: the program's handlers run elsewhere. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&thread, NULL, serve, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e) {
        snprintf(why, len, "the fd service's thread: %s", strerror(e));
        rk_ipc_fd_stop();
        return -1;
    }
    running = 1;
    return 0;
}

void rk_ipc_fd_stop(void)
{
    if (running) {
        char x = 0;
        while (write(wake[1], &x, 1) < 0 && errno == EINTR)
            ;
        pthread_join(thread, NULL);
        running = 0;
    }
    for (int i = 0; i < 2; i++)
        if (wake[i] >= 0) {
            close(wake[i]);
            wake[i] = -1;
        }
    if (listen_fd >= 0) {
        close(listen_fd);
        listen_fd = -1;
    }
    if (served) {
        rankmem_resource_release(served);
        served = NULL;
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; conns && i < nranks; i++)
        if (conns[i] >= 0)
            close(conns[i]);
    free(conns);
    conns = NULL;
    nranks = 0;
    pthread_mutex_unlock(&lock);
}

/* ---- the importer's side ---- */

/* The connection to owner (under lock): -1 when there is none. */
static int conn_to(int owner, char *why, size_t len)
{
    if (conns[owner] >= 0)
        return conns[owner];
    if (conns[owner] == -2) {
        snprintf(why, len, "rank %d's fd service did not answer before", owner);
        return -1;
    }
    struct sockaddr_un a;
    socklen_t al = sock_name(&a, job_nonce, owner);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct timeval tv = {CLIENT_TIMEOUT_S, 0};
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
        connect(s, (struct sockaddr *)&a, al) != 0) {
        snprintf(why, len, "connecting to rank %d's fd service: %s", owner, strerror(errno));
        if (s >= 0)
            close(s);
        conns[owner] = -2;
        return -1;
    }
    conns[owner] = s;
    return s;
}

int rk_ipc_fd_fetch(int owner, size_t n, const uint64_t *addr, const uint64_t *ids, int *fds,
                    uint64_t *bytes, uint64_t *fd_offsets, char *why, size_t len)
{
    if (n == 0 || n > RK_IPC_FD_MAX) {
        snprintf(why, len, "%zu handles in one request", n);
        return -1;
    }
    pthread_mutex_lock(&lock);
    if (!conns || owner < 0 || owner >= nranks) {
        pthread_mutex_unlock(&lock);
        snprintf(why, len, "no fd service for rank %d", owner);
        return -1;
    }
    int s = conn_to(owner, why, len);
    if (s < 0) {
        pthread_mutex_unlock(&lock);
        return -1;
    }
    request_t q;
    memset(&q, 0, sizeof q);
    q.magic = MAGIC_REQ;
    q.n = (uint32_t)n;
    q.nonce = job_nonce;
    for (size_t i = 0; i < n; i++) {
        q.h[i].addr = addr[i];
        q.h[i].id = ids[i];
    }
    answer_t a;
    char ctl[CMSG_SPACE(sizeof(int) * RK_IPC_FD_MAX)];
    struct iovec iov = {&a, sizeof a};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    size_t qlen = offsetof(request_t, h) + n * sizeof q.h[0];
    ssize_t got = -1;
    if (send(s, &q, qlen, MSG_NOSIGNAL) == (ssize_t)qlen)
        got = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
    int rc = -1;
    size_t nfd = 0;
    struct cmsghdr *cm = got > 0 ? CMSG_FIRSTHDR(&m) : NULL;
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
        nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    int got_fds[RK_IPC_FD_MAX];
    if (nfd > RK_IPC_FD_MAX)
        nfd = 0; /* cannot happen: the control buffer holds at most that many */
    if (nfd)
        memcpy(got_fds, CMSG_DATA(cm), nfd * sizeof(int));
    if (got < 0) {
        snprintf(why, len, "rank %d's fd service: %s", owner,
                 errno == EAGAIN ? "no answer in time" : strerror(errno));
        close(s);
        conns[owner] = -2; /* the stream may be out of step: do not use it again */
    } else if ((size_t)got != sizeof a || a.magic != MAGIC_ANS || (m.msg_flags & MSG_CTRUNC)) {
        snprintf(why, len, "rank %d's fd service answered garbage", owner);
        close(s);
        conns[owner] = -2;
    } else if (a.status != 0 || a.n != n || nfd != n) {
        snprintf(why, len, "rank %d's fd service refused handle %d of %zu", owner,
                 a.status > 0 ? (int)a.status - 1 : 0, n);
    } else {
        for (size_t i = 0; i < n; i++) {
            fds[i] = got_fds[i];
            bytes[i] = a.h[i].bytes;
            fd_offsets[i] = a.h[i].fd_offset;
        }
        rc = 0;
    }
    if (rc != 0)
        for (size_t i = 0; i < nfd; i++)
            close(got_fds[i]);
    pthread_mutex_unlock(&lock);
    return rc;
}
