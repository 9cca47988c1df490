// Per-process socket traffic, split by peer address (bcc C; profiler/sampling/net.py compiles it).
//
// Two attachment variants share one accounting function:
//   NET_TRACEPOINT: raw tracepoints sock:sock_send_length / sock:sock_recv_length (kernel >= 6.3).
//     The tracepoint fires in sock_sendmsg()/sock_recvmsg() for every socket family with the byte
//     count the call returned; RET_ARG/FLAGS_ARG are the argument positions read from the kernel's
//     BTF (btf_trace_sock_send_length), because the prototype changed between kernel versions.
//   NET_KPROBE: tcp_sendmsg (entry + return, so failed calls carry no bytes) and tcp_cleanup_rbuf
//     (bytes copied to user space), the tcptop approach, TCP only.
// The peer address is read from struct sock_common at offsets net.py takes from BTF (SKC_*_OFF);
// without BTF the kernel headers' offsetof() is used.
// Maps are keyed by tgid so threads add up to their process; only tgids in target_tgids count
// (user space adds them while running, like the stack sampler's filter).

#include <uapi/linux/ptrace.h>
#include <linux/socket.h>
// The kernel headers are only needed when BTF did not give the offsets (they are slow to compile).
#if !defined(SKC_FAMILY_OFF) || !defined(SKC_DADDR_OFF) || !defined(SKC_V6_DADDR_OFF)
#include <net/sock.h>
#endif

#ifndef SKC_FAMILY_OFF
#define SKC_FAMILY_OFF offsetof(struct sock_common, skc_family)
#endif
#ifndef SKC_DADDR_OFF
#define SKC_DADDR_OFF offsetof(struct sock_common, skc_daddr)
#endif
#ifndef SKC_V6_DADDR_OFF
#define SKC_V6_DADDR_OFF offsetof(struct sock_common, skc_v6_daddr)
#endif
#ifndef PEER_ENTRIES
#define PEER_ENTRIES 16384
#endif
#ifndef TGID_ENTRIES
#define TGID_ENTRIES 4096
#endif

#define DIR_SEND 0
#define DIR_RECV 1
#define NET_MSG_PEEK 2

struct peer_key {
    u32 tgid;
    u16 family;
    u16 pad;
    u8 addr[16];  // IPv6, or IPv4 as ::ffff:a.b.c.d
};

struct traffic {
    u64 bytes_sent;
    u64 bytes_received;
    u64 calls_sent;
    u64 calls_received;
};

BPF_HASH(target_tgids, u32, u8, TGID_ENTRIES);
BPF_HASH(peer_traffic, struct peer_key, struct traffic, PEER_ENTRIES);
// Exact per-process totals even when peer_traffic is full.
BPF_HASH(tgid_traffic, u32, struct traffic, TGID_ENTRIES);
// [0]: calls whose peer could not be stored (peer_traffic full), [1]: their bytes.
BPF_ARRAY(dropped, u64, 2);

static __always_inline void add_traffic(struct traffic *t, int direction, s64 bytes) {
    if (direction == DIR_SEND) {
        __sync_fetch_and_add(&t->bytes_sent, bytes);
        __sync_fetch_and_add(&t->calls_sent, 1);
    } else {
        __sync_fetch_and_add(&t->bytes_received, bytes);
        __sync_fetch_and_add(&t->calls_received, 1);
    }
}

static __always_inline int account(void *sk, s64 bytes, int direction) {
    // Failed calls (negative) and empty ones (EOF, zero-length) move no data.
    if (bytes <= 0 || sk == 0)
        return 0;
    u32 tgid = current_pid_tgid() >> 32;
    if (target_tgids.lookup(&tgid) == 0)
        return 0;

    u16 family = 0;
    bpf_probe_read_kernel(&family, sizeof(family), (u8 *)sk + SKC_FAMILY_OFF);
    if (family != AF_INET && family != AF_INET6)
        return 0;  // unix, netlink, packet...: not network traffic

    struct peer_key key = {};
    key.tgid = tgid;
    key.family = family;
    if (family == AF_INET) {
        key.addr[10] = 0xff;
        key.addr[11] = 0xff;
        bpf_probe_read_kernel(&key.addr[12], 4, (u8 *)sk + SKC_DADDR_OFF);
    } else {
        bpf_probe_read_kernel(&key.addr[0], 16, (u8 *)sk + SKC_V6_DADDR_OFF);
    }

    struct traffic zero = {};
    struct traffic *total = tgid_traffic.lookup_or_try_init(&tgid, &zero);
    if (total)
        add_traffic(total, direction, bytes);
    struct traffic *peer = peer_traffic.lookup_or_try_init(&key, &zero);
    if (peer) {
        add_traffic(peer, direction, bytes);
    } else {
        int calls_slot = 0, bytes_slot = 1;
        u64 *calls = dropped.lookup(&calls_slot);
        if (calls)
            __sync_fetch_and_add(calls, 1);
        u64 *lost = dropped.lookup(&bytes_slot);
        if (lost)
            __sync_fetch_and_add(lost, bytes);
    }
    return 0;
}

#ifdef NET_TRACEPOINT
int net_send(struct bpf_raw_tracepoint_args *ctx) {
    return account((void *)ctx->args[0], (s64)(int)ctx->args[RET_ARG], DIR_SEND);
}

int net_recv(struct bpf_raw_tracepoint_args *ctx) {
    // MSG_PEEK leaves the data queued; the later real read counts it.
    if ((int)ctx->args[FLAGS_ARG] & NET_MSG_PEEK)
        return 0;
    return account((void *)ctx->args[0], (s64)(int)ctx->args[RET_ARG], DIR_RECV);
}
#endif

#ifdef NET_KPROBE
BPF_HASH(send_sock, u64, void *, 10240);

int net_send_entry(struct pt_regs *ctx, void *sk) {
    u64 id = current_pid_tgid();
    u32 tgid = id >> 32;
    if (target_tgids.lookup(&tgid) == 0)
        return 0;
    void *ptr = sk;
    send_sock.update(&id, &ptr);
    return 0;
}

int net_send_return(struct pt_regs *ctx) {
    u64 id = current_pid_tgid();
    void **ptr = send_sock.lookup(&id);
    if (ptr == 0)
        return 0;
    void *sk = *ptr;
    send_sock.delete(&id);
    return account(sk, (s64)(int)PT_REGS_RC(ctx), DIR_SEND);
}

int net_recv_copied(struct pt_regs *ctx, void *sk, int copied) {
    return account(sk, (s64)copied, DIR_RECV);
}
#endif
