// Stack sampler, ring-buffer variant: every sample of a target process goes to user space whole
// (tgid, tid, thread name, timestamp, raw user and kernel addresses) through one BPF ring buffer;
// user space deduplicates and counts. Unlike a stack map, nothing here has a fixed number of distinct
// stacks: a long window cannot fill a table, and no stack is refused for a hash collision. The only
// losses are the kernel's own: the ring buffer full (counted in `dropped` per process) or a stack the
// kernel could not walk (a negative length).
//
// Placeholders replaced by profiler/sampling/sampler.py: MAX_STACK_DEPTH, KERNEL_STACK_DEPTH, MAX_TARGETS,
// RINGBUF_PAGES. Needs BPF_MAP_TYPE_RINGBUF (Linux 5.8); the stack-map program is the fallback.
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include <linux/sched.h>

// No kernel stack was asked for because the sample interrupted user mode. bpf_get_stack returns a
// length or -EFAULT/-EINVAL, never -1 (-EPERM), so this cannot be confused with a failed walk.
#define STACK_NONE -1

#include "targets.h"

// Layout read by profiler/capture/stackstore.py (RECORD_HEADER): keep both in step.
struct sample_t {
    u32 tgid;
    u32 tid;
    u64 time_ns;       // bpf_ktime_get_ns: CLOCK_MONOTONIC
    s32 user_bytes;    // bytes of `user` written, or a negative errno
    s32 kernel_bytes;  // bytes of `kernel` written, a negative errno, or STACK_NONE in user mode
    char comm[TASK_COMM_LEN];
    u64 user[MAX_STACK_DEPTH];
    u64 kernel[KERNEL_STACK_DEPTH];
};

BPF_RINGBUF_OUTPUT(samples, RINGBUF_PAGES);

int on_cpu_clock(struct bpf_perf_event_data *ctx) {
    u64 id = current_pid_tgid();
    struct target_t *target = count_sample(id);
    if (target == NULL)
        return 0;

    struct sample_t *sample = samples.ringbuf_reserve(sizeof(struct sample_t));
    if (sample == NULL) {
        __sync_fetch_and_add(&target->dropped, 1);
        return 0;
    }
    sample->tgid = id >> 32;
    sample->tid = (u32)id;
    sample->time_ns = bpf_ktime_get_ns();
    bpf_get_current_comm(&sample->comm, sizeof(sample->comm));
    sample->user_bytes = bpf_get_stack(ctx, sample->user, sizeof(sample->user), BPF_F_USER_STACK);
    // Kernel addresses have the top bit set on x86_64 and arm64: the sample interrupted the kernel.
    if ((s64)PT_REGS_IP(&ctx->regs) < 0)
        sample->kernel_bytes = bpf_get_stack(ctx, sample->kernel, sizeof(sample->kernel), 0);
    else
        sample->kernel_bytes = STACK_NONE;
    // No wake-up per sample: the reader drains the buffer on its own period (see sampler.py).
    samples.ringbuf_submit(sample, BPF_RB_NO_WAKEUP);
    return 0;
}
