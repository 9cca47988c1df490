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
// User stacks: where the sampler's own walker is loaded (profiler/sampling/stack_walk.c), this file is
// compiled into the walker's program with OFFCPU_WALKER defined, and a followed switch-out walks prev's
// user stack with the walker's code (walk_frames: frame pointers, CFI, HotSpot's code cache, interpreted
// and compiled Java frames) from the user registers prev saved on its kernel entry, its tables shared
// with the on-CPU samples; the frames go to offcpu_walked by a hash of them (the block's walked_stack).
// Otherwise they are bpf_get_stackid's frame-pointer walk (a JIT frame without frame pointers ends them).
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
// The scoped threads' switch rates, by thread id modulo RATE_SLOTS (1.5 MiB; rate_slot spreads them).
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
    u64 walked_stack;  // the walker's stack (offcpu_walked's key) when user_stack_id is STACK_WALKED
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
    u32 voluntary;  // voluntary switch-outs this epoch, from EXACT_PER_EPOCH for a busy thread (the first
                    // EXACT_PER_EPOCH are all followed: none of a busy thread's)
    u32 count;      // all switch-outs this epoch
    u32 every;      // this epoch's 1-in-every beyond the exact ones (from the previous epoch's count)
    u32 random;     // the thread's xorshift32 state (never 0): its sampling draws, no helper call
};

struct block_key {
    u64 java_frame;
    u64 walked_stack;
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
// `anchor` gets the last Java frame's sp, fp and pc (sp 0: none): where the walker restarts a walk that
// stopped short of it (walk_switch_out).
struct java_anchor {
    u64 pc;
    u64 sp;
    u64 fp;
};

static __always_inline void java_view(u32 tgid, u32 tid, struct switch_out *out, struct java_anchor *anchor) {
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
    anchor->pc = pc;
    anchor->sp = sp;
    anchor->fp = read_user_u64(base + layout->last_java_fp);
    if (pc >= layout->interpreter_start && pc < layout->interpreter_end) {
        u64 fp = anchor->fp;
        u64 method = fp != 0 ? read_user_u64(fp + layout->method_slot) : 0;
        out->java_frame = method != 0 ? (method | JAVA_INTERPRETED) : 0;
        return;
    }
    out->java_frame = pc;
}

// The stack walks are most of the cost (~10 us each switch-out followed with the walker). A thread's first
// EXACT_PER_EPOCH voluntary switch-outs of each epoch are all followed (weight 1): threads that block a few
// times a second, whose blocks are long and few, are measured exactly. Beyond that, and for every
// preemption (CPU contention, not a wait), one switch-out in `every` is followed at random and stands for
// `every` (its weight): an unbiased estimate where blocks are many. `every` is SAMPLE_EVERY, or more for a
// thread that switched out more than SAMPLE_EVERY * WALK_BUDGET_PER_EPOCH times in the previous epoch (a busy
// thread), so that each thread's sampled walks stay near WALK_BUDGET_PER_EPOCH per epoch whatever its rate.
// A busy thread has no exact switch-outs (its epoch starts with them spent): beyond ~110 switch-outs an epoch
// at the defaults, EXACT_PER_EPOCH of weight 1 carried under a tenth of its estimate (0.4 % at 2,500) yet cost
// half of its walks; the sampled walks, as many as before, carry its variance either way. Both are fixed for the epoch before any of its switch-outs is seen: the
// estimate stays unbiased. 0: not followed.
static __always_inline u32 epoch_every(struct switch_rate *rate, u32 epoch) {
    if (rate->epoch != epoch) {
        u32 busy = rate->epoch + 1 == epoch ? rate->count / WALK_BUDGET_PER_EPOCH : 0;
        rate->every = busy > SAMPLE_EVERY ? busy : SAMPLE_EVERY;
        rate->epoch = epoch;
        rate->voluntary = busy > SAMPLE_EVERY ? EXACT_PER_EPOCH : 0;
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

// A thread's slot: its id modulo RATE_SLOTS, the low 14 bits times 4 plus the next 2, so that threads whose ids
// are near one another (one process's) sit 4 slots (96 bytes) apart: every switch-out writes its thread's slot,
// and two threads on two CPUs writing one cache line moved it between the CPUs at each of their switch-outs.
// Two threads share a slot only when their ids are equal modulo RATE_SLOTS, as before.
static __always_inline u32 rate_slot(u32 tid) {
    return ((tid & (RATE_SLOTS / 4 - 1)) << 2) | ((tid / (RATE_SLOTS / 4)) & 3);
}

static __always_inline u32 sample_weight(u32 tid, u32 reason) {
    if (SAMPLE_EVERY <= 1)
        return 1;
    u32 index = rate_slot(tid);
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

// prev (this thread, whose task_struct is `task`) is switched out: its record stored, its bit set.
static __always_inline void store_switch_out(u64 task, u32 tid, struct switch_out *out) {
    if (switched_out.update(&tid, out) != 0) {
        count_drop(0, 1);
        return;
    }
    u64 *word = followed_word(tid);
    u32 *pending = pending_slot(task);
    if (word != 0 && pending != 0) {
        __sync_fetch_and_add(pending, 1);  // before the bit: its switch-in always finds the slot raised
        __sync_fetch_and_or(word, 1ULL << (tid & 63));
    }
}

#ifdef OFFCPU_WALKER
#define STACK_WALKED -100  // user_stack_id of a stack the walker took: its frames in offcpu_walked[walked_stack]

// One walked user stack, read by profiler/sampling/offcpu.py (walked_values): the stack_walk.c record's
// layout in small (OFFCPU_LEAF_SLOTS leaf-most frames, the root-most OFFCPU_ROOT_SLOTS in a ring).
struct offcpu_walk_t {
    u32 walked;  // frames walked
    u32 walk_end;  // WALK_*
    u64 jvm_unloads;  // the JVM's unloaded classes when the stack was first walked (names' generation), ~0: unknown
    u64 frames[OFFCPU_LEAF_SLOTS + OFFCPU_ROOT_SLOTS];
};

// Per CPU: the switch-out being walked (its record waits for the stack's hash) and the walk.
struct offcpu_scratch_t {
    struct walk_state state;
    struct switch_out out;
    struct java_anchor anchor;  // the JVM's last Java frame (sp 0: none, or used already)
    u64 task;
    u32 tid;
    u32 pad;
    struct offcpu_walk_t walk;
};

BPF_PERCPU_ARRAY(offcpu_scratch, struct offcpu_scratch_t, 1);
BPF_PROG_ARRAY(offcpu_walk_progs, 1);  // [0] = offcpu_walk_more, set by profiler/sampling/program.py
// half the stack map's entries: 16,384 distinct walked stacks of ~1 KiB (17 MiB, preallocated) by default
BPF_HASH(offcpu_walked, u64, struct offcpu_walk_t, STACK_ENTRIES / 2);

// A chunk of the walk; 1 when it is over. A walk that stopped below the JVM's last Java frame (its sp
// under the anchor's: glibc or libjvm code the tables could not step, a frame pointer that ended it) goes on
// from that frame, once: the anchor is HotSpot's own record of where the Java frames begin.
static __always_inline int offcpu_walk_chunk(struct offcpu_scratch_t *scratch) {
    struct walk_state *state = &scratch->state;
    if (!walk_frames(state, scratch->walk.frames, OFFCPU_LEAF_SLOTS, OFFCPU_ROOT_SLOTS, OFFCPU_WALK_LIMIT))
        return 0;
    struct java_anchor *anchor = &scratch->anchor;
    if (anchor->sp == 0 || state->end == WALK_LIMIT_HIT || state->regs.sp >= anchor->sp ||
        state->walked >= OFFCPU_WALK_LIMIT)
        return 1;
    state->regs.pc = anchor->pc;
    state->regs.sp = anchor->sp;
    state->regs.fp = anchor->fp;
    state->end = WALK_RUNNING;
    anchor->sp = 0;
    return 0;
}

// The walk is over: its frames stored once under their hash, then the switch-out stored with that key.
static __always_inline int offcpu_finish(struct offcpu_scratch_t *scratch) {
    struct offcpu_walk_t *walk = &scratch->walk;
    struct walk_state *state = &scratch->state;
    if (state->end == WALK_RUNNING)
        state->end = WALK_LIMIT_HIT;  // no tail call possible: the walk is cut here
    walk->walked = state->walked;
    walk->walk_end = state->end;
    u32 stored = state->walked < OFFCPU_LEAF_SLOTS + OFFCPU_ROOT_SLOTS ? state->walked
                                                                       : OFFCPU_LEAF_SLOTS + OFFCPU_ROOT_SLOTS;
    u64 hash = 0xcbf29ce484222325ULL ^ ((u64)walk->walked << 8) ^ walk->walk_end;
    for (u32 i = 0; i < OFFCPU_LEAF_SLOTS + OFFCPU_ROOT_SLOTS; i++) {
        u32 index = i;
        asm volatile("" : "+r"(index));  // an index the verifier bounds, not a pointer the compiler strides
        if (index >= stored || index >= OFFCPU_LEAF_SLOTS + OFFCPU_ROOT_SLOTS)
            break;
        hash = (hash ^ walk->frames[index]) * 0x100000001b3ULL;
        hash ^= hash >> 29;
    }
    hash |= 1;  // never 0: 0 is "not walked"
    if (offcpu_walked.lookup(&hash) == 0 && offcpu_walked.update(&hash, walk) != 0 &&
        offcpu_walked.lookup(&hash) == 0) {
        scratch->out.user_stack_id = -ENOMEM;  // the map is full: the block keeps its kernel stack and cause
    } else {
        scratch->out.user_stack_id = STACK_WALKED;
        scratch->out.walked_stack = hash;
    }
    store_switch_out(scratch->task, scratch->tid, &scratch->out);
    return 0;
}

// The next CHUNK_FRAMES frames of a blocked thread's walk (tail call from sched_switch).
int offcpu_walk_more(struct bpf_raw_tracepoint_args *ctx) {
    u32 zero = 0;
    struct offcpu_scratch_t *scratch = offcpu_scratch.lookup(&zero);
    if (scratch == 0)
        return 0;
    if (!offcpu_walk_chunk(scratch))
        offcpu_walk_progs.call(ctx, 0);  // returns only when the chain cannot go on
    return offcpu_finish(scratch);
}

// prev's user stack by the walker, from the registers saved on its kernel entry (the top of its kernel
// stack: bpf_task_pt_regs), then its record stored (offcpu_finish, at the end of the chain). Runs last in
// the tracepoint: the tail call does not come back. The walk itself is only in offcpu_walk_more, verified
// once. 0: no scratch, or no offcpu_walk_more in offcpu_walk_progs yet (the tracepoint is attached as it
// is loaded, before program.py sets it): the caller stores `out` with bpf_get_stackid's stack.
static __always_inline int walk_switch_out(struct bpf_raw_tracepoint_args *ctx, u32 tgid, u32 tid,
                                           struct switch_out *out, struct java_anchor *anchor) {
    u32 zero = 0;
    struct offcpu_scratch_t *scratch = offcpu_scratch.lookup(&zero);
    if (scratch == 0)
        return 0;
    struct walk_state *state = &scratch->state;
    __builtin_memset(state, 0, sizeof(*state));
    state->end = WALK_RUNNING;
    state->tgid = tgid;
    scratch->out = *out;
    scratch->anchor = *anchor;
    scratch->task = ctx->args[1];
    scratch->tid = tid;
    scratch->walk.jvm_unloads = ~0ULL;
    if (saved_user_regs(&state->regs) != 0) {
        scratch->out.user_stack_id = -EFAULT;
        store_switch_out(scratch->task, tid, &scratch->out);
        return 1;
    }
    struct jvm_t *jvm = jvms.lookup(&tgid);
    if (jvm != 0) {
        state->jvm = *jvm;
        if (jvm->unloads_at != 0 &&
            bpf_probe_read_user(&scratch->walk.jvm_unloads, sizeof(u64), (void *)jvm->unloads_at) != 0)
            scratch->walk.jvm_unloads = ~0ULL;
    }
    offcpu_walk_progs.call(ctx, 0);  // the walk and offcpu_finish: does not come back once it runs
    return 0;
}
#endif

// Remembers prev's switch-out if it is followed; returns the time it read (0: none, not followed). With
// the walker, the record is stored at the end of the walk's tail-call chain: call this last.
static __always_inline u64 remember(struct bpf_raw_tracepoint_args *ctx, u32 tgid, u32 tid, u64 now) {
    // An exiting thread (TASK_DEAD 0x80, EXIT_ZOMBIE 0x20, EXIT_DEAD 0x10) never runs again: not a block.
    if (ctx->args[3] & 0xb0)
        return 0;  // its rate slot is taken over by the next thread that finds it
    u32 reason = switch_reason(ctx->args[0], ctx->args[3]);
    u32 weight = sample_weight(tid, reason);
    if (weight == 0)
        return 0;
    if (now == 0)
        now = bpf_ktime_get_ns();
    struct switch_out out = {};
    out.time_ns = now;
    out.tgid = tgid;
    out.reason = reason;
    out.weight = weight;
    out.kernel_stack_id = offcpu_stacks.get_stackid(ctx, 0);
    bpf_get_current_comm(&out.comm, sizeof(out.comm));
    struct java_anchor anchor = {};
    java_view(tgid, tid, &out, &anchor);
#ifdef OFFCPU_WALKER
    if (walk_switch_out(ctx, tgid, tid, &out, &anchor))
        return now;
#endif
    out.user_stack_id = offcpu_stacks.get_stackid(ctx, BPF_F_USER_STACK);
    store_switch_out(ctx->args[1], tid, &out);
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
    key.walked_stack = out->walked_stack;
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
    // The clock is read only for a followed thread's switch-in and for a switch-out that is followed. The
    // switch-in first: with the walker, remember() ends in a tail-call chain that does not come back.
    u64 now = 0;
    if (in != 0 && next_word != 0 && pending != 0) {
        now = bpf_ktime_get_ns();
        account(next_tid, next_word, pending, now);
    }
    if (out != 0)
        remember(ctx, tgid, tid, now);
    return 0;
}
