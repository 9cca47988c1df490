// Off-CPU time of the scoped processes' threads (bcc C; profiler/sampling/offcpu.py compiles it).
//
// Raw tracepoint sched_switch (no kprobe, no tracefs mount): it runs in the context of the thread that
// leaves the CPU (prev), so bpf_get_current_pid_tgid() and the stack helpers see prev. When prev belongs
// to a target process, the time, its user and kernel stack ids and the kernel's reason are remembered by
// thread id; when a remembered thread is switched in again (next), the time in between is added to
// (tgid, thread, stacks, reason, thread name) if it is at least MIN_BLOCK_NS. The sums stay in the kernel: user
// space reads the map once, after the window.
// Prototype (kernel >= 5.18): (bool preempt, struct task_struct *prev, struct task_struct *next,
// unsigned int prev_state); NEXT_PID_OFF is task_struct.pid's byte offset from the kernel's BTF.
// User stacks are bpf_get_stack's frame-pointer walk (a JIT frame without frame pointers ends them).
// For a thread of a HotSpot JVM (java_threads: tid -> its JavaThread, java_layouts: the JVM's vmStructs
// offsets, both written by user space) the switch-out also reads what the JVM itself says of the wait:
// its last Java frame (the JavaFrameAnchor HotSpot sets on every call out of Java code) and whether it
// is entering a contended monitor or in Object.wait (JavaThread::_current_pending/waiting_monitor).

#ifndef MIN_BLOCK_NS
#define MIN_BLOCK_NS 1000000
#endif
#ifndef SAMPLE_EVERY
#define SAMPLE_EVERY 1  // beyond EXACT_PER_EPOCH: remember one switch-out in SAMPLE_EVERY, at random
#endif
#ifndef EXACT_PER_EPOCH
#define EXACT_PER_EPOCH 10  // voluntary switch-outs per thread and epoch always remembered (weight 1)
#endif
#define EPOCH_NS 100000000ULL  // 100 ms
#ifndef THREAD_ENTRIES
#define THREAD_ENTRIES 65536
#endif
#ifndef BLOCK_ENTRIES
#define BLOCK_ENTRIES 65536
#endif
#ifndef STACK_ENTRIES
#define STACK_ENTRIES 32768
#endif
#ifndef TGID_ENTRIES
#define TGID_ENTRIES 4096
#endif

// The kernel's view of why prev left the CPU (user space refines it by the kernel frames).
#define REASON_PREEMPTED 0      // still runnable: preempted, or yielded
#define REASON_SLEEPING 1       // TASK_INTERRUPTIBLE
#define REASON_UNINTERRUPTIBLE 2  // TASK_UNINTERRUPTIBLE (disk and other I/O, some kernel locks)
#define REASON_OTHER 3          // stopped, traced, ...

// The JVM's view (struct block_key.java_state); names in profiler/capture/offcpu.py (JAVA_*).
#define JAVA_NONE 0        // no JavaThread known for the thread (or not a JVM)
#define JAVA_IN_VM 1       // a Java thread, neither entering a monitor nor in Object.wait
#define JAVA_MONITOR 2     // entering a contended monitor (synchronized)
#define JAVA_WAIT 3        // in Object.wait
// A java_frame with this bit set is the interpreted frame's Method*, else the frame's pc (0: none).
#define JAVA_INTERPRETED (1ULL << 63)

struct java_layout {
    u64 interpreter_start;
    u64 interpreter_end;
    s64 method_slot;        // bytes from an interpreted frame's fp to its Method*
    u32 last_java_sp;       // JavaThread::_anchor + JavaFrameAnchor::_last_Java_sp
    u32 last_java_pc;
    u32 last_java_fp;
    u32 pending_monitor;    // JavaThread::_current_pending_monitor
    u32 waiting_monitor;    // JavaThread::_current_waiting_monitor
    u32 pad;
};

struct switch_out {
    u64 time_ns;
    u64 java_frame;
    u32 java_state;
    u32 tgid;
    s32 user_stack_id;
    s32 kernel_stack_id;
    u32 reason;
    u32 weight;  // the switch-outs this one stands for: 1, or SAMPLE_EVERY when it was sampled
    char comm[16];
};

// A thread's voluntary switch-outs in the current epoch (the rate that decides whether it is sampled).
struct switch_rate {
    u64 epoch;
    u64 count;
};

struct block_key {
    u64 java_frame;
    u32 java_state;
    u32 tgid;
    s32 user_stack_id;
    s32 kernel_stack_id;
    u32 reason;
    char comm[16];
    u32 tid;  // the thread: user space names it as the sampler does (full name, Spark task, Flink subtask)
};

struct block_sum {
    u64 blocked_ns;
    u64 switches;
};

BPF_HASH(target_tgids, u32, u8, TGID_ENTRIES);
BPF_HASH(java_layouts, u32, struct java_layout, TGID_ENTRIES);
BPF_HASH(java_threads, u32, u64, THREAD_ENTRIES);
BPF_HASH(switched_out, u32, struct switch_out, THREAD_ENTRIES);
BPF_HASH(switch_rates, u32, struct switch_rate, THREAD_ENTRIES);
BPF_HASH(blocked, struct block_key, struct block_sum, BLOCK_ENTRIES);
BPF_STACK_TRACE(offcpu_stacks, STACK_ENTRIES);
// [0]: switch-outs not remembered (switched_out full), [1]: blocks not summed (blocked full),
// [2]: their nanoseconds, [3]: blocks shorter than MIN_BLOCK_NS (not summed), [4]: their nanoseconds
BPF_ARRAY(offcpu_dropped, u64, 5);

static __always_inline void count_drop(int index, u64 amount) {
    u64 *slot = offcpu_dropped.lookup(&index);
    if (slot)
        __sync_fetch_and_add(slot, amount);
}

static __always_inline u32 switch_reason(u64 preempt, u64 state) {
    if (preempt || (state & 0xff) == 0)
        return REASON_PREEMPTED;
    if (state & 0x2)
        return REASON_UNINTERRUPTIBLE;
    if (state & 0x1)
        return REASON_SLEEPING;
    return REASON_OTHER;
}

static __always_inline u64 read_user_u64(u64 address) {
    u64 value = 0;
    if (address == 0 || bpf_probe_read_user(&value, sizeof(value), (void *)address) != 0)
        return 0;
    return value;
}

// The JVM's view of the wait of thread tid (prev, whose memory is the current one): its state and
// last Java frame. A frame pointer or pointer the JVM changed meanwhile reads as garbage at worst,
// which user space fails to name; nothing here is trusted beyond naming a cause.
static __always_inline void java_view(u32 tgid, u32 tid, struct switch_out *out) {
    u64 *thread = java_threads.lookup(&tid);
    if (thread == 0)
        return;
    struct java_layout *layout = java_layouts.lookup(&tgid);
    if (layout == 0)
        return;
    u64 base = *thread;
    out->java_state = JAVA_IN_VM;
    if (read_user_u64(base + layout->pending_monitor) != 0)
        out->java_state = JAVA_MONITOR;
    else if (read_user_u64(base + layout->waiting_monitor) != 0)
        out->java_state = JAVA_WAIT;
    u64 sp = read_user_u64(base + layout->last_java_sp);
    if (sp == 0)
        return;  // no call out of Java code: running Java (or VM-internal work) when switched out
    u64 pc = read_user_u64(base + layout->last_java_pc);
    if (pc == 0)
        pc = read_user_u64(sp - 8);  // an anchor without a pc: the return address below the frame's sp
    if (pc >= layout->interpreter_start && pc < layout->interpreter_end) {
        u64 fp = read_user_u64(base + layout->last_java_fp);
        u64 method = fp != 0 ? read_user_u64(fp + layout->method_slot) : 0;
        out->java_frame = method != 0 ? (method | JAVA_INTERPRETED) : 0;
        return;
    }
    out->java_frame = pc;
}

// The two stack walks are most of the cost (--off-cpu-sample-every bounds it). A thread's first
// EXACT_PER_EPOCH voluntary switch-outs of each epoch are all remembered (weight 1): threads that block
// a few times a second, whose blocks are long and few, are measured exactly. Beyond that, and for every
// preemption (CPU contention, not a wait), one switch-out in SAMPLE_EVERY is remembered at random and
// stands for SAMPLE_EVERY (weight): an unbiased estimate where blocks are many. 0: not remembered.
static __always_inline u32 sample_weight(u32 tid, u64 now, u32 reason) {
    if (SAMPLE_EVERY <= 1)
        return 1;
    if (reason != REASON_PREEMPTED) {
        u64 epoch = now / EPOCH_NS;
        struct switch_rate *rate = switch_rates.lookup(&tid);
        if (rate == 0) {
            struct switch_rate first = {epoch, 1};
            switch_rates.update(&tid, &first);  // full map: the thread stays exact (costlier, still right)
            return 1;
        }
        if (rate->epoch != epoch) {
            rate->epoch = epoch;
            rate->count = 0;
        }
        rate->count += 1;
        if (rate->count <= EXACT_PER_EPOCH)
            return 1;
    }
    return bpf_get_prandom_u32() % SAMPLE_EVERY == 0 ? SAMPLE_EVERY : 0;
}

static __always_inline void remember(struct bpf_raw_tracepoint_args *ctx, u64 now) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (tid == 0 || target_tgids.lookup(&tgid) == 0)
        return;
    // An exiting thread (TASK_DEAD 0x80, EXIT_ZOMBIE 0x20, EXIT_DEAD 0x10) never runs again: not a block.
    if (ctx->args[3] & 0xb0) {
        switch_rates.delete(&tid);
        return;
    }
    u32 reason = switch_reason(ctx->args[0], ctx->args[3]);
    u32 weight = sample_weight(tid, now, reason);
    if (weight == 0)
        return;
    struct switch_out out = {};
    out.time_ns = now;
    out.tgid = tgid;
    out.reason = reason;
    out.weight = weight;
    out.user_stack_id = offcpu_stacks.get_stackid(ctx, BPF_F_USER_STACK);
    out.kernel_stack_id = offcpu_stacks.get_stackid(ctx, 0);
    bpf_get_current_comm(&out.comm, sizeof(out.comm));
    java_view(tgid, tid, &out);
    if (switched_out.update(&tid, &out) != 0)
        count_drop(0, 1);
}

static __always_inline void account(u32 tid, u64 now) {
    struct switch_out *out = switched_out.lookup(&tid);
    if (out == 0)
        return;
    u64 delta = now - out->time_ns;
    struct block_key key = {};
    key.java_frame = out->java_frame;
    key.java_state = out->java_state;
    key.tgid = out->tgid;
    key.user_stack_id = out->user_stack_id;
    key.kernel_stack_id = out->kernel_stack_id;
    key.reason = out->reason;
    __builtin_memcpy(&key.comm, out->comm, sizeof(key.comm));
    key.tid = tid;
    u64 weight = out->weight;
    switched_out.delete(&tid);
    if (delta < MIN_BLOCK_NS) {
        count_drop(3, weight);
        count_drop(4, delta * weight);
        return;
    }
    struct block_sum zero = {};
    struct block_sum *sum = blocked.lookup_or_try_init(&key, &zero);
    if (sum == 0) {
        count_drop(1, weight);
        count_drop(2, delta * weight);
        return;
    }
    __sync_fetch_and_add(&sum->blocked_ns, delta * weight);
    __sync_fetch_and_add(&sum->switches, weight);
}

RAW_TRACEPOINT_PROBE(sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    remember(ctx, now);
    u32 next_tid = 0;
    bpf_probe_read_kernel(&next_tid, sizeof(next_tid), (void *)(ctx->args[2] + NEXT_PID_OFF));
    if (next_tid != 0)
        account(next_tid, now);
    return 0;
}
