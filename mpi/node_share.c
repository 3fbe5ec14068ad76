/* Sharing a stream-ordered pool and its allocations between the ranks of
 * one node (rankmem_mpi_share, rankmem_mpi_import,
 * rankmem_mpi_share_pointers). The pool travels as a file descriptor:
 * pidfd_getfd where the kernel allows it, else over a Unix socket
 * (abstract name, SCM_RIGHTS) whose name goes by MPI. Pointers travel as
 * 64 bytes of export data by MPI_Bcast. Every rank takes part in every
 * collective step whatever its own arguments, and all ranks agree on the
 * outcome at the end (one MPI_Allreduce), so that a failure on one rank
 * never leaves another waiting. */
#define _GNU_SOURCE
#include "plugin.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* How long the root waits for the importers' connections, and they for the
 * descriptor: a rank that never comes makes an error, not a hang. */
#define SHARE_TIMEOUT_MS 60000

/* What the root tells everyone before the descriptor moves (MPI_BYTE). */
typedef struct share_header {
    int32_t status; /* the root's: RANKMEM_SUCCESS or why it cannot share */
    int32_t pid;
    int32_t fd;     /* the root's descriptor number, for pidfd_getfd */
    uint64_t dev, ino; /* what it is, so that a wrong process's fd is refused */
    char sock[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* abstract: sock[0] == 0 */
} share_header_t;

/* The checks every collective here starts with. Nonzero: not collective-safe
 * (every rank answers the same for the same arguments and returns at once). */
static rankmem_status_t check_comm(MPI_Comm comm, int root, const char *fn, int *rank_p,
                                   int *size_p)
{
    int init = 0, fini = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fini);
    if (!init || fini) {
        rk_mpi_warn("%s: MPI is not initialised (or already finalised)", fn);
        return RANKMEM_ERR_NOT_SUPPORTED;
    }
    if (comm == MPI_COMM_NULL) {
        rk_mpi_warn("%s: MPI_COMM_NULL", fn);
        return RANKMEM_ERR_INVALID_ARGUMENT;
    }
    MPI_Comm_rank(comm, rank_p);
    MPI_Comm_size(comm, size_p);
    if (root < 0 || root >= *size_p) {
        rk_mpi_warn("%s: root %d is not a rank of the communicator (size %d)", fn, root, *size_p);
        return RANKMEM_ERR_INVALID_ARGUMENT;
    }
    return RANKMEM_SUCCESS;
}

/* Whether root is on this rank's node. */
static int same_node(MPI_Comm comm, int root)
{
    MPI_Comm node;
    if (rk_mpi_node_comm(comm, 0, &node) != MPI_SUCCESS || node == MPI_COMM_NULL)
        return 0;
    MPI_Group g, gn;
    int r = MPI_UNDEFINED;
    MPI_Comm_group(comm, &g);
    MPI_Comm_group(node, &gn);
    MPI_Group_translate_ranks(g, 1, &root, gn, &r);
    MPI_Group_free(&g);
    MPI_Group_free(&gn);
    MPI_Comm_free(&node);
    return r != MPI_UNDEFINED;
}

/* The outcome every rank agrees on: the largest status of any rank. */
static rankmem_status_t agree(rankmem_status_t mine, MPI_Comm comm)
{
    int in = (int)mine, out = 0;
    MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm);
    return (rankmem_status_t)out;
}

static int64_t ms_left(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    int64_t ms = (int64_t)(t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
    return SHARE_TIMEOUT_MS - ms;
}

static int wait_fd(int fd, short events, const struct timespec *t0)
{
    for (;;) {
        int64_t left = ms_left(t0);
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* ---- the descriptor's ways between processes ---- */

static int listen_socket(char name[static sizeof(((struct sockaddr_un *)0)->sun_path)])
{
    static int seq;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    /* Abstract namespace: nothing in the file system to clean up after a crash. */
    int len = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "rankmem-share-%ld-%d",
                       (long)getpid(), ++seq);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len);
    if (bind(s, (struct sockaddr *)&a, alen) != 0 || listen(s, 64) != 0) {
        close(s);
        return -1;
    }
    memcpy(name, a.sun_path, sizeof a.sun_path);
    return s;
}

static int send_fd(int conn, int fd)
{
    char byte = 'F';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } c;
    memset(&c, 0, sizeof c);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                       .msg_controllen = sizeof c.buf};
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
    ssize_t n;
    do
        n = sendmsg(conn, &m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == 1 ? 0 : -1;
}

/* Connect to the root's socket and receive its descriptor; -1 on failure. */
static int recv_fd(const char *name, const struct timespec *t0)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, name, sizeof a.sun_path);
    socklen_t alen =
        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a.sun_path + 1));
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    int fd = -1;
    if (connect(s, (struct sockaddr *)&a, alen) == 0 && wait_fd(s, POLLIN, t0) == 0) {
        char byte;
        struct iovec iov = {.iov_base = &byte, .iov_len = 1};
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int))];
        } c;
        memset(&c, 0, sizeof c);
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                           .msg_controllen = sizeof c.buf};
        ssize_t n;
        do
            n = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        struct cmsghdr *h = n == 1 ? CMSG_FIRSTHDR(&m) : NULL;
        if (h && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
            h->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&fd, CMSG_DATA(h), sizeof fd);
    }
    close(s);
    return fd;
}

/* The root's descriptor by pidfd_getfd (Linux 5.6; needs ptrace rights over
 * the root, which containers and Yama often refuse); -1 when not possible. */
static int pidfd_fd(const share_header_t *h)
{
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    int pfd = (int)syscall(SYS_pidfd_open, (pid_t)h->pid, 0);
    if (pfd < 0)
        return -1;
    int fd = (int)syscall(SYS_pidfd_getfd, pfd, h->fd, 0);
    close(pfd);
    return fd;
#else
    (void)h;
    return -1;
#endif
}

static int same_file(int fd, const share_header_t *h)
{
    struct stat st;
    return fstat(fd, &st) == 0 && (uint64_t)st.st_dev == h->dev && (uint64_t)st.st_ino == h->ino;
}

/* ---- the pool ---- */

static rankmem_status_t share_pool(rankmem_resource_t *mr, int as_root, int root, MPI_Comm comm,
                                   rankmem_resource_t **imported_p, const char *fn)
{
    int rank, size;
    rankmem_status_t st = check_comm(comm, root, fn, &rank, &size);
    if (st != RANKMEM_SUCCESS)
        return st;
    int is_root = rank == root;
    rankmem_status_t mine = RANKMEM_SUCCESS;
    /* The root calls rankmem_mpi_share, the others rankmem_mpi_import. */
    if (is_root != as_root) {
        rk_mpi_warn("%s: rank %d is %sthe root (%d): call %s", fn, rank, is_root ? "" : "not ",
                    root, is_root ? "rankmem_mpi_share" : "rankmem_mpi_import");
        mine = RANKMEM_ERR_INVALID_ARGUMENT;
    } else if (!is_root && !imported_p) {
        rk_mpi_warn("%s: NULL imported_p", fn);
        mine = RANKMEM_ERR_INVALID_ARGUMENT;
    }
    /* Collective: every rank makes the split, whatever its arguments. */
    int near = same_node(comm, root);
    if (mine == RANKMEM_SUCCESS && !near) {
        rk_mpi_warn("%s: rank %d is not on the node of the root (rank %d): device memory is "
                    "shared between the ranks of one node only",
                    fn, rank, root);
        mine = RANKMEM_ERR_NOT_SUPPORTED;
    }

    share_header_t h;
    memset(&h, 0, sizeof h);
    int fd = -1, lsock = -1;
    if (is_root) {
        rankmem_pool_share_t sh;
        if (mine == RANKMEM_SUCCESS && !mr) {
            rk_mpi_warn("%s: NULL resource", fn);
            mine = RANKMEM_ERR_INVALID_ARGUMENT;
        }
        if (mine == RANKMEM_SUCCESS) {
            mine = rankmem_async_export_pool(mr, &sh);
            if (mine != RANKMEM_SUCCESS)
                rk_mpi_warn("%s: %s", fn, rankmem_last_error());
            else
                fd = sh.fd;
        }
        struct stat sb;
        if (mine == RANKMEM_SUCCESS && fstat(fd, &sb) != 0)
            mine = RANKMEM_ERR_INTERNAL;
        if (mine == RANKMEM_SUCCESS && (lsock = listen_socket(h.sock)) < 0) {
            rk_mpi_warn("%s: Unix socket: %s", fn, strerror(errno));
            mine = RANKMEM_ERR_NOT_SUPPORTED;
        }
        if (mine == RANKMEM_SUCCESS) {
            h.pid = (int32_t)getpid();
            h.fd = fd;
            h.dev = (uint64_t)sb.st_dev;
            h.ino = (uint64_t)sb.st_ino;
        }
        h.status = (int32_t)mine;
    }
    MPI_Bcast(&h, (int)sizeof h, MPI_BYTE, root, comm);

    /* Each importer: the descriptor by pidfd, else ask for it by socket. */
    int need_socket = 0;
    if (!is_root && h.status == RANKMEM_SUCCESS && mine == RANKMEM_SUCCESS) {
        fd = pidfd_fd(&h);
        if (fd >= 0 && !same_file(fd, &h)) {
            close(fd); /* another process of that pid (another pid namespace) */
            fd = -1;
        }
        need_socket = fd < 0;
    }
    int *needs = is_root ? calloc((size_t)size, sizeof *needs) : NULL;
    if (is_root && !needs)
        mine = RANKMEM_ERR_OUT_OF_MEMORY; /* the others still need a consistent end */
    MPI_Gather(&need_socket, 1, MPI_INT, needs, 1, MPI_INT, root, comm);

    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (is_root && lsock >= 0) {
        int n = 0;
        for (int r = 0; needs && r < size; r++)
            n += needs[r] != 0;
        for (int i = 0; i < n; i++) {
            int conn = -1;
            if (wait_fd(lsock, POLLIN, &t0) == 0)
                conn = accept4(lsock, NULL, NULL, SOCK_CLOEXEC);
            if (conn < 0 || send_fd(conn, fd) != 0) {
                rk_mpi_warn("%s: %d of %d importers got the pool's descriptor over the socket "
                            "within %d s",
                            fn, i, n, SHARE_TIMEOUT_MS / 1000);
                mine = RANKMEM_ERR_INTERNAL;
                if (conn >= 0)
                    close(conn);
                break;
            }
            close(conn);
        }
    }
    free(needs);
    if (need_socket) {
        fd = recv_fd(h.sock, &t0);
        if (fd < 0 || !same_file(fd, &h)) {
            rk_mpi_warn("%s: could not receive the pool's descriptor from rank %d (pidfd_getfd "
                        "refused, socket failed)",
                        fn, root);
            if (fd >= 0)
                close(fd);
            fd = -1;
            mine = RANKMEM_ERR_NOT_SUPPORTED;
        }
    }

    rankmem_resource_t *imp = NULL;
    if (!is_root && fd >= 0 && mine == RANKMEM_SUCCESS) {
        rankmem_pool_share_t sh = {.handle_type = RANKMEM_HANDLE_POSIX_FD, .fd = fd};
        mine = rankmem_async_import_pool(&sh, &imp);
        if (mine != RANKMEM_SUCCESS)
            rk_mpi_warn("%s: %s", fn, rankmem_last_error());
    }
    if (fd >= 0)
        close(fd);
    if (lsock >= 0)
        close(lsock);

    rankmem_status_t all = agree(mine, comm);
    if (all != RANKMEM_SUCCESS) {
        if (imp)
            (void)rankmem_resource_release(imp);
        if (mine == RANKMEM_SUCCESS && rank == root)
            rk_mpi_warn("%s: another rank could not import the pool (%s)", fn,
                        rankmem_status_string(all));
        return mine != RANKMEM_SUCCESS ? mine : all;
    }
    if (!is_root)
        *imported_p = imp;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_mpi_share(rankmem_resource_t *mr, int root, MPI_Comm comm)
{
    return share_pool(mr, 1, root, comm, NULL, "rankmem_mpi_share");
}

rankmem_status_t rankmem_mpi_import(int root, MPI_Comm comm, rankmem_resource_t **imported_p)
{
    return share_pool(NULL, 0, root, comm, imported_p, "rankmem_mpi_import");
}

/* ---- single allocations ---- */

rankmem_status_t rankmem_mpi_share_pointers(rankmem_resource_t *mr, void **ptrs, int count,
                                            int root, MPI_Comm comm)
{
    const char *fn = "rankmem_mpi_share_pointers";
    int rank, size;
    rankmem_status_t st = check_comm(comm, root, fn, &rank, &size);
    if (st != RANKMEM_SUCCESS)
        return st;
    rankmem_status_t mine = RANKMEM_SUCCESS;
    if (!mr || (count > 0 && !ptrs) || count < 0) {
        rk_mpi_warn("%s: %s", fn, !mr ? "NULL resource" : count < 0 ? "negative count" : "NULL ptrs");
        mine = RANKMEM_ERR_INVALID_ARGUMENT;
    }
    /* The root's count and status first: everyone then knows what follows. */
    int32_t head[2] = {(int32_t)mine, count};
    rankmem_ptr_export_t *data = NULL;
    if (rank == root && mine == RANKMEM_SUCCESS && count > 0) {
        data = calloc((size_t)count, sizeof *data);
        if (!data)
            mine = RANKMEM_ERR_OUT_OF_MEMORY;
        for (int i = 0; i < count && mine == RANKMEM_SUCCESS; i++) {
            mine = rankmem_async_export_pointer(mr, ptrs[i], &data[i]);
            if (mine != RANKMEM_SUCCESS)
                rk_mpi_warn("%s: pointer %d: %s", fn, i, rankmem_last_error());
        }
        head[0] = (int32_t)mine;
    }
    MPI_Bcast(head, 2, MPI_INT32_T, root, comm);
    if (head[0] == RANKMEM_SUCCESS && head[1] > 0) {
        if (rank != root) {
            data = calloc((size_t)head[1], sizeof *data);
            if (!data)
                mine = RANKMEM_ERR_OUT_OF_MEMORY;
        }
        /* Every rank joins the broadcast; one without memory takes it in a scratch byte array. */
        static rankmem_ptr_export_t scratch;
        for (int i = 0; i < head[1]; i++)
            MPI_Bcast(data ? data[i].bytes : scratch.bytes, RANKMEM_PTR_EXPORT_BYTES, MPI_BYTE,
                      root, comm);
    }
    int imported = 0;
    if (rank != root && mine == RANKMEM_SUCCESS && head[0] == RANKMEM_SUCCESS) {
        if (head[1] != count) {
            rk_mpi_warn("%s: count %d here, %d at the root", fn, count, (int)head[1]);
            mine = RANKMEM_ERR_INVALID_ARGUMENT;
        }
        for (int i = 0; i < count && mine == RANKMEM_SUCCESS; i++) {
            mine = rankmem_async_import_pointer(mr, &data[i], &ptrs[i]);
            if (mine != RANKMEM_SUCCESS)
                rk_mpi_warn("%s: pointer %d: %s", fn, i, rankmem_last_error());
            else
                imported++;
        }
    }
    free(data);
    rankmem_status_t all = agree(mine, comm);
    if (all != RANKMEM_SUCCESS) {
        for (int i = 0; i < imported; i++)
            (void)rankmem_async_free_imported(mr, ptrs[i]);
        return mine != RANKMEM_SUCCESS ? mine : all;
    }
    return RANKMEM_SUCCESS;
}
