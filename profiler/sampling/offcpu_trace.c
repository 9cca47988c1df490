// Off-CPU time of the scoped processes' threads (bcc C; profiler/sampling/offcpu.py compiles it).
//
// Raw tracepoint sched_switch (no kprobe, no tracefs mount): it runs in the context of the thread that
// leaves the CPU (prev), so current_pid_tgid() and the stack helpers see prev. When prev belongs
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
//
// The hot path: the program runs at EVERY context switch of the host, so a switch that concerns no
// scoped thread must cost next to nothing. Two bitmaps in arrays (whose lookups the verifier inlines into
// a load: no hashing, no helper call) answer first: is prev's process in the scope (scope_bits, by tgid,
// written by user space), was next switched out by us (followed_bits, by thread id)? Only when one says
// yes is the clock read and a hash touched. next's thread id must be read from its task_struct
// (bpf_probe_read_kernel: ~40 ns here, the raw tracepoint gives no typed pointer), so it is read only
// when pending_slots says a followed thread may be coming in: a counter per hash of a task_struct's
// address, raised before a followed switch-out sets its bit and lowered when that thread's switch-in is
// accounted. A zero slot means no followed thread hashes there (no false negatives); most switches of the
// host stop at that one inlined load. A scoped thread's switch rate and its random numbers (the sampling
// decision) live in a slot of an array by thread id (switch_rates: one inlined load, one cache line, no
// helper call; task-local storage cost a helper call and three dependent loads from the task_struct).

#ifndef MIN_BLOCK_NS
#define MIN_BLOCK_NS 1000000
#endif
#ifndef SAMPLE_EVERY
#define SAMPLE_EVERY 1  // beyond EXACT_PER_EPOCH: remember one switch-out in SAMPLE_EVERY, at random
#endif
#ifndef EXACT_PER_EPOCH
#define EXACT_PER_EPOCH 10  // voluntary switch-outs per thread and epoch always remembered (weight 1)
#endif
#ifndef EPOCH_JIFFIES
#define EPOCH_JIFFIES 25  // 100 ms at HZ=250 (user space gives the kernel's HZ / 10)
#endif
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
#ifndef WALK_BUDGET_PER_EPOCH
#define WALK_BUDGET_PER_EPOCH 10  // sampled switch-outs per thread and epoch aimed at, beyond the exact ones
#endif
// The bitmaps cover every thread id the kernel can give (PID_MAX_LIMIT, 4,194,304: 512 KiB each).
#define ID_WORDS 65536
// Counters of followed threads awaiting their switch-in, by a hash of their task_struct's address (256 KiB).
#define PENDING_SLOTS 65536
// The scoped threads' switch rates, by thread id modulo RATE_SLOTS (1.5 MiB).
#define RATE_SLOTS 65536

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

// A thread's switch-outs in the current epoch and the one before (the rate that decides its sampling), in
// the slot of its thread id modulo RATE_SLOTS: the threads of a process, whose ids are near one another,
// never share one. A thread that finds another's id in its slot takes the slot and starts afresh (no
// previous epoch: SAMPLE_EVERY, its exact switch-outs again), so two threads sharing a slot cost more
// walks, never a biased weight: each decision uses only what the slot held before the switch-out.
struct switch_rate {
    u32 tid;        // the thread the slot counts (0: none yet)
    u32 epoch;      // the epoch counted (jiffies / EPOCH_JIFFIES, its low 32 bits)
    u32 voluntary;  // voluntary switch-outs this epoch (the first EXACT_PER_EPOCH are all followed)
    u32 count;      // all switch-outs this epoch
    u32 every;      // this epoch's 1-in-every beyond the exact ones (from the previous epoch's count)
    u32 random;     // the thread's xorshift32 state (never 0): its sampling draws, no helper call
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

BPF_HASH(target_tgids, u32, u8, TGID_ENTRIES);  // the scope as user space wrote it (read by user space)
BPF_ARRAY(scope_bits, u64, ID_WORDS);     // the same scope as bits by tgid: the hot path reads these
BPF_ARRAY(followed_bits, u64, ID_WORDS);  // thread ids with an entry in switched_out
BPF_ARRAY(pending_slots, u32, PENDING_SLOTS);  // those threads counted by a hash of their task_struct
BPF_HASH(java_layouts, u32, struct java_layout, TGID_ENTRIES);
BPF_HASH(java_threads, u32, u64, THREAD_ENTRIES);
BPF_HASH(switched_out, u32, struct switch_out, THREAD_ENTRIES);
BPF_ARRAY(switch_rates, struct switch_rate, RATE_SLOTS);
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

// id's bit in a bitmap's word (0 when the word is missing). The word is looked up by the caller: bcc
// wants each map named in the call, not passed as a pointer.
static __always_inline u64 id_bit(u64 *word, u32 id) {
    return word != 0 ? *word & (1ULL << (id & 63)) : 0;
}

static __always_inline u64 *scope_word(u32 tgid) {
    u32 index = tgid >> 6;
    return index < ID_WORDS ? scope_bits.lookup(&index) : 0;
}

// A task_struct address's counter: Fibonacci hashing of the address, its top bits an index < PENDING_SLOTS.
static __always_inline u32 *pending_slot(u64 task) {
    u32 index = (u32)((task * 0x9E3779B97F4A7C15ULL) >> 48) & (PENDING_SLOTS - 1);
    return pending_slots.lookup(&index);
}

static __always_inline u64 *followed_word(u32 tid) {
    u32 index = tid >> 6;
    return index < ID_WORDS ? followed_bits.lookup(&index) : 0;
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

// The two stack walks are most of the cost (~4 us each switch-out followed). A thread's first
// EXACT_PER_EPOCH voluntary switch-outs of each epoch are all followed (weight 1): threads that block a few
// times a second, whose blocks are long and few, are measured exactly. Beyond that, and for every
// preemption (CPU contention, not a wait), one switch-out in `every` is followed at random and stands for
// `every` (its weight): an unbiased estimate where blocks are many. `every` is SAMPLE_EVERY, or more for a
// thread that switched out more than SAMPLE_EVERY * WALK_BUDGET_PER_EPOCH times in the previous epoch, so
// that each thread's walks stay near EXACT_PER_EPOCH + WALK_BUDGET_PER_EPOCH per epoch whatever its rate.
// It is fixed for the epoch before any of its switch-outs is seen: the estimate stays unbiased. 0: not followed.
static __always_inline u32 epoch_every(struct switch_rate *rate, u32 epoch) {
    if (rate->epoch != epoch) {
        u32 busy = rate->epoch + 1 == epoch ? rate->count / WALK_BUDGET_PER_EPOCH : 0;
        rate->every = busy > SAMPLE_EVERY ? busy : SAMPLE_EVERY;
        rate->epoch = epoch;
        rate->voluntary = 0;
        rate->count = 0;
    }
    rate->count += 1;
    return rate->every > 0 ? rate->every : 1;
}

// The next draw of the slot's xorshift32 generator: true with probability 1/every (to within every/2^32).
static __always_inline bool draw(struct switch_rate *rate, u32 every) {
    u32 x = rate->random;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    rate->random = x;
    return (((u64)x * every) >> 32) == 0;
}

static __always_inline u32 sample_weight(u32 tid, u32 reason) {
    if (SAMPLE_EVERY <= 1)
        return 1;
    u32 index = tid & (RATE_SLOTS - 1);
    struct switch_rate *rate = switch_rates.lookup(&index);
    if (rate == 0)
        return 1;
    // Epochs counted in jiffies (a load: no clock source read), precise enough for 100 ms.
    u32 epoch = (u32)(bpf_jiffies64() / EPOCH_JIFFIES);
    if (rate->tid != tid) {  // a slot never used, or another thread's: this thread starts afresh
        rate->tid = tid;
        rate->epoch = epoch - 2;  // neither this epoch nor the last: epoch_every resets the counts
        rate->random = ((tid ^ epoch) * 2654435761u) | 1;
    }
    u32 every = epoch_every(rate, epoch);
    if (reason != REASON_PREEMPTED) {
        rate->voluntary += 1;
        if (rate->voluntary <= EXACT_PER_EPOCH)
            return 1;
    }
    return draw(rate, every) ? every : 0;
}

// Remembers prev's switch-out if it is followed; returns the time it read (0: none, not followed).
static __always_inline u64 remember(struct bpf_raw_tracepoint_args *ctx, u32 tgid, u32 tid) {
    // An exiting thread (TASK_DEAD 0x80, EXIT_ZOMBIE 0x20, EXIT_DEAD 0x10) never runs again: not a block.
    if (ctx->args[3] & 0xb0)
        return 0;  // its rate slot is taken over by the next thread that finds it
    u32 reason = switch_reason(ctx->args[0], ctx->args[3]);
    u32 weight = sample_weight(tid, reason);
    if (weight == 0)
        return 0;
    u64 now = bpf_ktime_get_ns();
    struct switch_out out = {};
    out.time_ns = now;
    out.tgid = tgid;
    out.reason = reason;
    out.weight = weight;
    out.user_stack_id = offcpu_stacks.get_stackid(ctx, BPF_F_USER_STACK);
    out.kernel_stack_id = offcpu_stacks.get_stackid(ctx, 0);
    bpf_get_current_comm(&out.comm, sizeof(out.comm));
    java_view(tgid, tid, &out);
    if (switched_out.update(&tid, &out) != 0) {
        count_drop(0, 1);
        return now;
    }
    u64 *word = followed_word(tid);
    u32 *pending = pending_slot(ctx->args[1]);  // prev: this thread's task_struct
    if (word != 0 && pending != 0) {
        __sync_fetch_and_add(pending, 1);  // before the bit: its switch-in always finds the slot raised
        __sync_fetch_and_or(word, 1ULL << (tid & 63));
    }
    return now;
}

static __always_inline void account(u32 tid, u64 *word, u32 *pending, u64 now) {
    __sync_fetch_and_and(word, ~(1ULL << (tid & 63)));
    __sync_fetch_and_add(pending, (u32)-1);
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
    u64 id = current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    u64 out = tid != 0 ? id_bit(scope_word(tgid), tgid) : 0;
    u32 next_tid = 0;
    u64 *next_word = 0;
    u64 in = 0;
    u32 *pending = pending_slot(ctx->args[2]);
    if (pending != 0 && *pending != 0) {  // a followed thread may be next: read which thread it is
        bpf_probe_read_kernel(&next_tid, sizeof(next_tid), (void *)(ctx->args[2] + NEXT_PID_OFF));
        next_word = next_tid != 0 ? followed_word(next_tid) : 0;
        in = id_bit(next_word, next_tid);
    }
    if (out == 0 && in == 0)
        return 0;  // neither thread is ours: most switches of the host end here, before the clock
    // The clock is read only for a switch-out that is followed and for a followed thread's switch-in.
    u64 now = out != 0 ? remember(ctx, tgid, tid) : 0;
    if (in != 0 && next_word != 0 && pending != 0)
        account(next_tid, next_word, pending, now != 0 ? now : bpf_ktime_get_ns());
    return 0;
}
