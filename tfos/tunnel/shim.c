/*
 * tfos's network shim for the TF process (LD_PRELOAD): TensorFlow's gRPC server and Gloo listen and
 * connect only inside the node's private network namespace, where the node's tunnel alone can reach
 * them. TF 2.21 and stock Gloo have no option for this, so the shim redirects two libc calls:
 *
 *  - bind() of a TCP socket to the wildcard address on the TF port (TFOS_TUNNEL_TF_PORT), or to any
 *    address of the cluster's loopback block (TFOS_TUNNEL_BLOCK, e.g. "127.77": every node's
 *    address), binds instead a socket made in the private namespace, to the node's own address
 *    (TFOS_TUNNEL_SELF) or the address asked for;
 *  - connect() to an address of the block connects instead a socket made in the private namespace,
 *    after the tunnel made sure that the address's node is served there (its egress listener).
 *
 * The socket comes from the tunnel over its control socket (TFOS_TUNNEL_CONTROL, a unix socket in
 * the node's private directory) with SCM_RIGHTS, and replaces the caller's socket under the same
 * descriptor number (dup3), with the caller's file flags and socket options. Every other call is
 * passed through untouched. Without TFOS_TUNNEL_CONTROL the shim does nothing; with it, a call it
 * must redirect but cannot fails (EACCES / ECONNREFUSED) instead of listening or connecting outside
 * the namespace: the TF process never falls back to an open port.
 *
 * Built by tfos.tunnel.build (cc -shared); the TF process checks tfos_tunnel_shim_version to know
 * the shim is loaded before it lets TensorFlow or Gloo start.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

__attribute__((visibility("default"))) int tfos_tunnel_shim_version = 1;

static int (*real_bind)(int, const struct sockaddr *, socklen_t);
static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static const char *control_path;  /* NULL: the shim is idle */
static uint32_t block_prefix;     /* the block's first two octets, host order, low 16 bits zero */
static uint32_t self_ip;          /* this node's address in the block, host order */
static int tf_port = -1;
static int debug;

__attribute__((constructor)) static void shim_init(void) {
    real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    real_connect = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    const char *path = getenv("TFOS_TUNNEL_CONTROL");
    const char *block = getenv("TFOS_TUNNEL_BLOCK");
    const char *self = getenv("TFOS_TUNNEL_SELF");
    const char *port = getenv("TFOS_TUNNEL_TF_PORT");
    debug = getenv("TFOS_TUNNEL_DEBUG") != NULL;
    struct in_addr a;
    char block_ip[32];
    if (!path || !block || !self || strlen(block) > 16) return;
    snprintf(block_ip, sizeof block_ip, "%s.0.0", block);
    if (!inet_aton(block_ip, &a)) return;
    block_prefix = ntohl(a.s_addr) & 0xffff0000u;
    if (!inet_aton(self, &a)) return;
    self_ip = ntohl(a.s_addr);
    tf_port = port ? atoi(port) : -1;
    control_path = path;
}

/* An IPv4 address (or IPv4-mapped IPv6 address) and port; 0 for anything else. */
static int ipv4_of(const struct sockaddr *addr, socklen_t len, uint32_t *ip, int *port, int *wildcard) {
    if (addr == NULL) return 0;
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        *ip = ntohl(in->sin_addr.s_addr);
        *port = ntohs(in->sin_port);
        *wildcard = *ip == 0;
        return 1;
    }
    if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
        *port = ntohs(in6->sin6_port);
        if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr)) {
            *ip = 0;
            *wildcard = 1;
            return 1;
        }
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
            uint32_t v;
            memcpy(&v, &in6->sin6_addr.s6_addr[12], 4);
            *ip = ntohl(v);
            *wildcard = *ip == 0;
            return 1;
        }
    }
    return 0;
}

static int in_block(uint32_t ip) { return (ip & 0xffff0000u) == block_prefix; }

static int is_stream(int fd) {
    int type = 0;
    socklen_t len = sizeof type;
    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

static void say(const char *what, uint32_t ip, int port, const char *why) {
    fprintf(stderr, "tfos tunnel shim: %s %u.%u.%u.%u:%d %s\n", what, ip >> 24, (ip >> 16) & 255, (ip >> 8) & 255,
            ip & 255, port, why);
}

/* Ask the tunnel for a socket in the private namespace (request: "SOCKET ..." or "CONNECT ..."), and
 * put it in place of fd. 0, or -1 with *why set. */
static int replace_socket(int fd, const char *verb, uint32_t ip, int port, const char **why) {
    int domain = 0, type = 0, protocol = 0;
    socklen_t len = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len);
    len = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len);
    len = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &len);

    int u = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (u < 0) { *why = "cannot make a unix socket"; return -1; }
    struct timeval tv = {10, 0};  /* the tunnel answers at once; never wait on it forever */
    setsockopt(u, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(u, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_un sun;
    memset(&sun, 0, sizeof sun);
    sun.sun_family = AF_UNIX;
    if (strlen(control_path) >= sizeof sun.sun_path) { close(u); *why = "the tunnel's control path is too long"; return -1; }
    strcpy(sun.sun_path, control_path);
    if (real_connect(u, (struct sockaddr *)&sun, sizeof sun) < 0) { close(u); *why = "the node's tunnel is not running"; return -1; }
    char line[160];
    int n;
    if (strcmp(verb, "CONNECT") == 0)
        n = snprintf(line, sizeof line, "CONNECT %d %d %d %u.%u.%u.%u %d\n", domain, type, protocol, ip >> 24,
                     (ip >> 16) & 255, (ip >> 8) & 255, ip & 255, port);
    else
        n = snprintf(line, sizeof line, "SOCKET %d %d %d\n", domain, type, protocol);
    if (write(u, line, n) != n) { close(u); *why = "the tunnel did not take the request"; return -1; }
    char status = 0;
    char control[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {&status, 1};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t got = recvmsg(u, &msg, MSG_CMSG_CLOEXEC);
    int fresh = -1;
    struct cmsghdr *c = got == 1 ? CMSG_FIRSTHDR(&msg) : NULL;
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) memcpy(&fresh, CMSG_DATA(c), sizeof fresh);
    close(u);
    if (got != 1 || status != 'Y' || fresh < 0) {
        if (fresh >= 0) close(fresh);
        *why = "the tunnel refused it";
        return -1;
    }
    /* carry the caller's settings over to the new socket */
    static const int options[][2] = {
        {SOL_SOCKET, SO_REUSEADDR}, {SOL_SOCKET, SO_REUSEPORT}, {SOL_SOCKET, SO_KEEPALIVE},
        {SOL_SOCKET, SO_OOBINLINE}, {IPPROTO_TCP, TCP_NODELAY}, {IPPROTO_TCP, TCP_USER_TIMEOUT},
        {IPPROTO_TCP, TCP_KEEPIDLE}, {IPPROTO_TCP, TCP_KEEPINTVL}, {IPPROTO_TCP, TCP_KEEPCNT},
        {IPPROTO_IPV6, IPV6_V6ONLY}};
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        int v;
        socklen_t vl = sizeof v;
        if (getsockopt(fd, options[i][0], options[i][1], &v, &vl) == 0) setsockopt(fresh, options[i][0], options[i][1], &v, vl);
    }
    struct timeval t;
    socklen_t tl = sizeof t;
    if (getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, &tl) == 0) setsockopt(fresh, SOL_SOCKET, SO_RCVTIMEO, &t, tl);
    tl = sizeof t;
    if (getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, &tl) == 0) setsockopt(fresh, SOL_SOCKET, SO_SNDTIMEO, &t, tl);
    struct linger lg;
    socklen_t ll = sizeof lg;
    if (getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &ll) == 0) setsockopt(fresh, SOL_SOCKET, SO_LINGER, &lg, ll);
    int status_flags = fcntl(fd, F_GETFL);
    int fd_flags = fcntl(fd, F_GETFD);
    if (status_flags >= 0) fcntl(fresh, F_SETFL, status_flags);
    if (dup3(fresh, fd, fd_flags >= 0 && (fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0) {
        close(fresh);
        *why = "dup3 failed";
        return -1;
    }
    close(fresh);
    return 0;
}

__attribute__((visibility("default"))) int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    uint32_t ip;
    int port, wildcard;
    if (!control_path || !ipv4_of(addr, len, &ip, &port, &wildcard) || !is_stream(fd) ||
        !((wildcard && port == tf_port) || (!wildcard && in_block(ip))))
        return real_bind(fd, addr, len);
    uint32_t target = wildcard ? self_ip : ip;
    const char *why = "";
    if (replace_socket(fd, "SOCKET", target, port, &why) < 0) {
        say("refusing to listen on", target, port, why);
        errno = EACCES;
        return -1;
    }
    if (debug) say("listening in the private network on", target, port, "");
    if (addr->sa_family == AF_INET) {
        struct sockaddr_in in;
        memcpy(&in, addr, sizeof in);
        in.sin_addr.s_addr = htonl(target);
        return real_bind(fd, (struct sockaddr *)&in, sizeof in);
    }
    struct sockaddr_in6 in6;
    memcpy(&in6, addr, sizeof in6);
    memset(&in6.sin6_addr, 0, sizeof in6.sin6_addr);
    in6.sin6_addr.s6_addr[10] = 0xff;
    in6.sin6_addr.s6_addr[11] = 0xff;
    uint32_t v = htonl(target);
    memcpy(&in6.sin6_addr.s6_addr[12], &v, 4);
    int off = 0;  /* an IPv4-mapped address needs a dual-stack socket */
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    return real_bind(fd, (struct sockaddr *)&in6, sizeof in6);
}

__attribute__((visibility("default"))) int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    uint32_t ip;
    int port, wildcard;
    if (!control_path || !ipv4_of(addr, len, &ip, &port, &wildcard) || wildcard || !in_block(ip) || !is_stream(fd))
        return real_connect(fd, addr, len);
    const char *why = "";
    if (replace_socket(fd, "CONNECT", ip, port, &why) < 0) {
        say("refusing to connect to", ip, port, why);
        errno = ECONNREFUSED;
        return -1;
    }
    if (debug) say("connecting in the private network to", ip, port, "");
    return real_connect(fd, addr, len);
}
