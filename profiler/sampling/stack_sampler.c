// Stack sampler: one program for every target process, attached to a cpu-clock perf event on each CPU.
// Filtering happens here (the `targets` hash map, updated from user space while running), and
// samples are aggregated here by (tgid, tid, thread name, user stack id, kernel stack id), as bcc's
// profile.py does, so user space reads counts once after the window instead of one event per sample.
//
// Placeholders replaced by profiler/sampling/sampler.py: MAX_STACK_DEPTH, STACK_STORAGE_SIZE, COUNTS_SIZE,
// MAX_TARGETS.
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include <linux/sched.h>

// No kernel stack was asked for because the sample interrupted user mode. bpf_get_stackid never
// returns -1 (-EPERM), so this cannot be confused with a lost stack.
#define STACK_NONE -1

struct key_t {
    u32 tgid;
    u32 tid;
    int user_stack_id;    // < 0: -EFAULT, -EEXIST (bucket collision), -ENOMEM (map full)
    int kernel_stack_id;  // STACK_NONE in user mode, else as above
    char comm[TASK_COMM_LEN];
};

#include "targets.h"

// A stack trace deeper than the bcc default (127 frames) needs its own value type.
struct stack_t {
    u64 ip[MAX_STACK_DEPTH];
};

BPF_HASH(counts, struct key_t, u64, COUNTS_SIZE);
BPF_TABLE("stacktrace", int, struct stack_t, stack_traces, STACK_STORAGE_SIZE);

int on_cpu_clock(struct bpf_perf_event_data *ctx) {
    u64 id = current_pid_tgid();
    struct target_t *target = count_sample(id);
    if (target == NULL)
        return 0;

    struct key_t key = {};
    key.tgid = id >> 32;
    key.tid = (u32)id;
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    key.user_stack_id = stack_traces.get_stackid(&ctx->regs, BPF_F_USER_STACK);
    // Kernel addresses have the top bit set on x86_64 and arm64: the sample interrupted the kernel.
    if ((s64)PT_REGS_IP(&ctx->regs) < 0)
        key.kernel_stack_id = stack_traces.get_stackid(&ctx->regs, 0);
    else
        key.kernel_stack_id = STACK_NONE;

    u64 *count = counts.lookup(&key);
    if (count != NULL) {
        __sync_fetch_and_add(count, 1);
        return 0;
    }
    u64 one = 1;
    if (counts.insert(&key, &one) == 0)
        return 0;
    // Another CPU may have inserted the same key meanwhile; otherwise the map is full.
    count = counts.lookup(&key);
    if (count != NULL)
        __sync_fetch_and_add(count, 1);
    else
        __sync_fetch_and_add(&target->dropped, 1);
    return 0;
}
