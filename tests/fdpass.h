/* File descriptors between processes of the node over a Unix socket
 * (SCM_RIGHTS): the vmm export tests (tests/vmm.c, tests/gpu_vmm.c) hand a
 * block's descriptors to a forked child. At most 64 per message. */
#ifndef RANKMEM_TESTS_FDPASS_H
#define RANKMEM_TESTS_FDPASS_H

#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <rankmem.h>

static inline int send_fds(int sock, const int *fds, size_t n)
{
    char buf[CMSG_SPACE(sizeof(int) * 64)];
    char byte = 'x';
    struct iovec iov = {&byte, 1};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = buf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
    return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}

static inline int recv_fds(int sock, int *fds, size_t n)
{
    char buf[CMSG_SPACE(sizeof(int) * 64)];
    char byte;
    struct iovec iov = {&byte, 1};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = buf;
    m.msg_controllen = sizeof buf;
    if (recvmsg(sock, &m, 0) != 1)
        return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int) * n))
        return -1;
    memcpy(fds, CMSG_DATA(c), sizeof(int) * n);
    return 0;
}

/* An export over a socket: the struct, its handles, then the descriptors. */
static inline int send_export(int sock, const rankmem_vmm_export_t *e)
{
    int fds[64];
    if (e->count > 64)
        return -1;
    for (size_t i = 0; i < e->count; i++)
        fds[i] = e->handles[i].fd;
    return write(sock, e, sizeof *e) == (ssize_t)sizeof *e &&
                   write(sock, e->handles, e->count * sizeof *e->handles) ==
                       (ssize_t)(e->count * sizeof *e->handles) &&
                   send_fds(sock, fds, e->count) == 0
               ? 0
               : -1;
}

/* The other end: *e with its handles in h[64] and this process's
 * descriptors. 0; 1 for an export of no handle (the sender's "done");
 * -1 on a short read or a bad count. */
static inline int recv_export(int sock, rankmem_vmm_export_t *e, rankmem_vmm_handle_t *h)
{
    int fds[64];
    if (read(sock, e, sizeof *e) != (ssize_t)sizeof *e)
        return -1;
    if (e->count == 0)
        return 1;
    if (e->count > 64 || read(sock, h, e->count * sizeof *h) != (ssize_t)(e->count * sizeof *h) ||
        recv_fds(sock, fds, e->count) != 0)
        return -1;
    for (size_t i = 0; i < e->count; i++)
        h[i].fd = fds[i]; /* this process's numbers */
    e->handles = h;
    return 0;
}

#endif
