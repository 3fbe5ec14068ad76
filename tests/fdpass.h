/* File descriptors between processes of the node over a Unix socket
 * (SCM_RIGHTS): the vmm export tests (tests/vmm.c, tests/gpu_vmm.c) hand a
 * block's descriptors to a forked child. At most 64 per message. */
#ifndef RANKMEM_TESTS_FDPASS_H
#define RANKMEM_TESTS_FDPASS_H

#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

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

#endif
