// Stack sampler, own-walker variant: the user stack is walked here, frame by frame, instead of
// by bpf_get_stack. Per frame it records the pc, or, for a frame of HotSpot's template interpreter, the
// frame's Method* (read from the interpreter's method slot), so user space can name interpreted Java
// frames, or for a compiled Java frame its pc with the nmethod's compile id. A frame in the JVM's code
// cache is stepped by its CodeBlob's frame size (hotspot_step.h), native code by CFI (cfi_step.h), the
// rest by the frame pointer: no frame pointers are needed in JIT code.
// The kernel part of a sample stays with bpf_get_stack.
//
// Deep stacks: the walk goes on up to WALK_LIMIT frames (CHUNK_FRAMES per program of a tail-call chain: walk_more,
// the one program holding the walk, so the kernel's verifier checks it once per load); the first LEAF_SLOTS frames are kept, and the
// last ROOT_SLOTS frames in a ring (user space puts them in order), so a stack too deep to keep whole
// keeps its leaf and its root, and user space marks the frames cut between them. A record is sent with
// bpf_ringbuf_output at the size it uses, so the ring buffer does not grow with the depth allowed.
//
// Placeholders replaced by profiler/sampling/sampler.py: LEAF_SLOTS, ROOT_SLOTS (a power of two), WALK_LIMIT,
// CHUNK_FRAMES, KERNEL_STACK_DEPTH, MAX_TARGETS, RINGBUF_PAGES. Needs bpf_task_pt_regs (Linux 5.15), BTF,
// the ring buffer (5.8) and tail calls; profiler/sampling/stack_ringbuf.c is the fallback.
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include <linux/sched.h>

#define STACK_NONE -1  // no kernel stack asked for: the sample interrupted user mode
#define USER_SLOTS (LEAF_SLOTS + ROOT_SLOTS)

// A stored frame is a pc (user addresses are below 2^47), or an interpreted frame's Method* with the
// top bit set. Read by profiler/capture/stackstore.py (INTERPRETED_TAG).
#define INTERPRETED_TAG (1ULL << 63)

// Why the walk stopped (struct sample_t.walk_end); names in profiler/capture/stackstore.py (WALK_ENDS).
#define WALK_ROOT 0       // a zero frame pointer or return address: the outermost frame
#define WALK_LIMIT_HIT 1  // WALK_LIMIT frames walked
#define WALK_FAULT 2      // the frame pointer pointed at unreadable memory
#define WALK_BAD_FP 3     // the frame pointer was below the stack pointer (code without frame pointers)
#define WALK_CFI_FAIL 4   // a CFI table covered the pc but its step failed
#define WALK_HOTSPOT_FAIL 5  // a pc in the JVM's code cache that no blob or frame size could step from
#define WALK_RUNNING 255

struct unwind_regs {
    u64 pc;
    u64 sp;
    u64 fp;
};

#include "cfi_step.h"
#include "hotspot_step.h"
#include "python_step.h"

#include "targets.h"

// Layout read by profiler/capture/stackstore.py (WALK_HEADER): keep both in step.
struct sample_t {
    u32 tgid;
    u32 tid;
    u64 time_ns;       // bpf_ktime_get_ns: CLOCK_MONOTONIC
    s32 user_bytes;    // bytes of user frames stored (frames[0..]), or a negative errno
    s32 kernel_bytes;  // bytes of kernel frames after the user frames, a negative errno, or STACK_NONE
    char comm[TASK_COMM_LEN];
    u32 user_walked;   // user frames walked (> USER_SLOTS: the ring kept the root-most ROOT_SLOTS)
    u32 walk_end;      // WALK_*
    u64 jvm_unloads;   // the JVM's count of unloaded classes at the sample (names' generation), or ~0: unknown
    u32 py_frames;     // CPython frames after the kernel frames (python_step.h), leaf first
    u32 py_status;     // PY_* of python_step.h
    u64 frames[USER_SLOTS + KERNEL_STACK_DEPTH + PY_SLOTS];
};

struct walk_state {
    struct unwind_regs regs;
    u32 tgid;  // the walked process as the programs key it (current_pid_tgid(), profiler/bpf/pidns.py)
    struct jvm_t jvm;
    struct hs_blob blob;  // the current frame's CodeBlob, when its pc is in the JVM's code cache
    u32 walked;
    u32 end;  // WALK_RUNNING until the walk stops
    u32 hs_counts[4];  // struct hs_health's counters of this walk (HS_COUNT_*)
    u32 py_count;  // CPython frames in py
    u32 py_status;
    u64 py[PY_SLOTS];
    u8 py_buffer[PY_BUFFER_BYTES];
};

// Per CPU: the walk in progress and the record it fills (too big for the 512-byte BPF stack).
struct scratch_t {
    struct walk_state state;
    struct sample_t sample;
};

BPF_HASH(jvms, u32, struct jvm_t, MAX_TARGETS);
BPF_PERCPU_ARRAY(scratch, struct scratch_t, 1);
BPF_PROG_ARRAY(walk_progs, 1);  // [0] = walk_more, set by profiler/sampling/sampler.py
BPF_RINGBUF_OUTPUT(samples, RINGBUF_PAGES);

// The slot of the index-th frame walked in a record of `leaf` + `root` slots (`root` a power of two): the
// first `leaf` frames in order, the rest in a ring of `root`. Inlined with constants: the on-CPU record
// (LEAF_SLOTS, ROOT_SLOTS) and the off-CPU one (profiler/sampling/offcpu_trace.c, OFFCPU_*_SLOTS).
static __always_inline u32 slot_of(u32 index, u32 leaf, u32 root) {
    if (index < leaf)
        return index;
    return leaf + ((index - leaf) & (root - 1));
}

static __always_inline u64 frame_value(struct walk_state *state) {
    u64 pc = state->regs.pc;
    if (pc < state->jvm.interpreter_start || pc >= state->jvm.interpreter_end)
        return hs_in_code(&state->jvm, pc) ? hs_frame(&state->jvm, pc, &state->blob) : pc;
    u64 method = 0;
    if (bpf_probe_read_user(&method, sizeof(method), (void *)(state->regs.fp + state->jvm.method_slot)) != 0)
        return pc;  // user space counts an interpreter pc as an interpreted frame left unnamed
    return method | INTERPRETED_TAG;
}

// One frame-pointer step (x86_64): [fp] is the caller's fp, [fp + 8] the return address; the caller's
// sp is fp + 16. Returns 0 to go on, 1 when the walk ends (state->end says why).
static __always_inline int fp_step(struct walk_state *state) {
    u64 fp = state->regs.fp;
    if (fp == 0) {
        state->end = WALK_ROOT;
        return 1;
    }
    if (fp < state->regs.sp) {
        state->end = WALK_BAD_FP;
        return 1;
    }
    u64 pair[2];
    if (bpf_probe_read_user(pair, sizeof(pair), (void *)fp) != 0) {
        state->end = WALK_FAULT;
        return 1;
    }
    if (pair[1] == 0) {
        state->end = WALK_ROOT;
        return 1;
    }
    state->regs.pc = pair[1];
    state->regs.sp = fp + 16;
    state->regs.fp = pair[0];
    return 0;
}

// One frame: store it, then step to the caller: by the JVM's code cache (JIT code, the interpreter),
// else by CFI, else by the frame pointer. Returns 0 to go on, 1 when the walk ends.
// `frames`: the record's `leaf` + `root` slots (slot_of).
static __always_inline int walk_one(struct walk_state *state, u64 *frames, u32 leaf, u32 root) {
    u32 slot = slot_of(state->walked, leaf, root);
    if (slot >= leaf + root)
        return 1;
    int in_code = hs_in_code(&state->jvm, state->regs.pc);
    state->blob.address = 0;
    if (in_code && (state->regs.pc < state->jvm.interpreter_start || state->regs.pc >= state->jvm.interpreter_end))
        hs_read_blob(&state->jvm, state->regs.pc, &state->blob);
    frames[slot] = frame_value(state);
    state->walked++;
    if (in_code) {
        int hs = hs_step(&state->jvm, &state->regs, &state->blob, state->walked == 1, state->hs_counts);
        if (hs == UNWIND_HS_DONE)
            return 0;
        if (hs == UNWIND_HS_FAIL) {
            state->end = WALK_HOTSPOT_FAIL;
            return 1;
        }
        return fp_step(state);
    }
    int cfi = cfi_step(&state->regs, state->tgid);
    if (cfi == UNWIND_CFI_DONE)
        return 0;
    if (cfi == UNWIND_CFI_FAIL) {
        state->end = WALK_CFI_FAIL;
        return 1;
    }
    if (cfi == UNWIND_CFI_END) {  // the frame's CFI says it is outermost (clone3, _start)
        state->end = WALK_ROOT;
        return 1;
    }
    return fp_step(state);
}

// CHUNK_FRAMES frames of a walk into `frames` (leaf + root slots, at most `limit` frames in all); 1 when
// the walk ended. The verifier follows a bounded loop iteration by iteration (at most 8192 jumps in a
// row), and bcc 0.26 cannot relocate bpf_loop's callback, so longer walks go on in the next program of a
// tail-call chain (walk_more here, offcpu_walk_more for a blocked thread's stack). The one walk of both:
// on-CPU samples and off-CPU switch-outs differ only in where the registers come from and the record.
// Only the chains' programs walk: the programs that start a walk (on_cpu_clock, sched_switch) set up its
// state and tail-call the chain, so the verifier checks this, its costliest code, once per chain and load
// (it was three times with the off-CPU program, four with its chain: most of a warm start's CPU).
static __always_inline int walk_frames(struct walk_state *state, u64 *frames, u32 leaf, u32 root, u32 limit) {
    for (u32 i = 0; i < CHUNK_FRAMES; i++) {
        if (state->walked >= limit) {
            state->end = WALK_LIMIT_HIT;
            return 1;
        }
        if (walk_one(state, frames, leaf, root))
            return 1;
    }
    return state->walked >= limit;
}

static __always_inline int walk_chunk(struct scratch_t *scratch_value) {
    return walk_frames(&scratch_value->state, scratch_value->sample.frames, LEAF_SLOTS, ROOT_SLOTS, WALK_LIMIT);
}

// The user registers a thread saved on its kernel entry (a blocked thread's, or an interrupted one's).
static __always_inline int saved_user_regs(struct unwind_regs *regs) {
    struct pt_regs saved = {};
    struct task_struct *task = bpf_get_current_task_btf();
    void *task_regs = (void *)bpf_task_pt_regs(task);
    if (task_regs == NULL || bpf_probe_read_kernel(&saved, sizeof(saved), task_regs) != 0)
        return -EFAULT;
    regs->pc = PT_REGS_IP(&saved);
    regs->sp = PT_REGS_SP(&saved);
    regs->fp = PT_REGS_FP(&saved);
    return regs->pc == 0 ? -EFAULT : 0;
}

// The user registers of the sampled thread: the perf event's own when it interrupted user mode, else
// the ones saved on kernel entry.
static __always_inline int user_regs(struct bpf_perf_event_data *ctx, struct unwind_regs *regs) {
    if ((s64)PT_REGS_IP(&ctx->regs) >= 0) {
        regs->pc = PT_REGS_IP(&ctx->regs);
        regs->sp = PT_REGS_SP(&ctx->regs);
        regs->fp = PT_REGS_FP(&ctx->regs);
        return 0;
    }
    return saved_user_regs(regs);
}

// The walk is over: the kernel stack (bpf_get_stack) after the user frames, and the record out at the
// size it uses.
static __always_inline int finish(struct bpf_perf_event_data *ctx, struct scratch_t *scratch_value) {
    struct sample_t *sample = &scratch_value->sample;
    struct walk_state *state = &scratch_value->state;
    if (sample->user_bytes == 0) {
        hs_flush(sample->tgid, state->hs_counts);
        u32 stored = state->walked < USER_SLOTS ? state->walked : USER_SLOTS;
        sample->user_bytes = stored * 8;
        sample->user_walked = state->walked;
        sample->walk_end = state->end;
    }
    u32 user_frames = sample->user_bytes > 0 ? (u32)sample->user_bytes / 8 : 0;
    if (user_frames > USER_SLOTS)
        return 0;
    // Kernel addresses have the top bit set on x86_64 and arm64: the sample interrupted the kernel.
    if ((s64)PT_REGS_IP(&ctx->regs) < 0)
        sample->kernel_bytes =
            bpf_get_stack(ctx, &sample->frames[user_frames], KERNEL_STACK_DEPTH * sizeof(u64), 0);
    else
        sample->kernel_bytes = STACK_NONE;
    u32 kernel_frames = sample->kernel_bytes > 0 ? (u32)sample->kernel_bytes / 8 : 0;
    if (kernel_frames > KERNEL_STACK_DEPTH)
        return 0;
    u64 frames = user_frames + kernel_frames;
    // The verifier needs the size bounded in the register passed: keep the compiler from folding the test.
    asm volatile("" : "+r"(frames));
    if (frames > USER_SLOTS + KERNEL_STACK_DEPTH)
        return 0;
    u64 py_frames = state->py_count;
    asm volatile("" : "+r"(py_frames));
    if (py_frames > PY_SLOTS)
        py_frames = 0;
    if (py_frames > 0 && bpf_probe_read_kernel(&sample->frames[frames], py_frames * 8, state->py) != 0)
        py_frames = 0;
    sample->py_frames = py_frames;
    sample->py_status = state->py_status;
    frames += py_frames;
    asm volatile("" : "+r"(frames));
    if (frames > USER_SLOTS + KERNEL_STACK_DEPTH + PY_SLOTS)
        return 0;
    u64 size = offsetof(struct sample_t, frames) + 8 * frames;
    // No wake-up per sample: the reader drains the buffer on its own period (see sampler.py).
    if (samples.ringbuf_output(sample, size, BPF_RB_NO_WAKEUP) != 0) {
        struct target_t *target = targets.lookup(&sample->tgid);
        if (target != NULL)
            __sync_fetch_and_add(&target->dropped, 1);
    }
    return 0;
}

// The next CHUNK_FRAMES frames of the walk on_cpu_clock set up (tail call; the kernel allows 33 in a row).
int walk_more(struct bpf_perf_event_data *ctx) {
    u32 zero = 0;
    struct scratch_t *scratch_value = scratch.lookup(&zero);
    if (scratch_value == NULL)
        return 0;
    if (!walk_chunk(scratch_value))
        walk_progs.call(ctx, 0);  // returns only when the chain cannot go on
    if (scratch_value->state.end == WALK_RUNNING)
        scratch_value->state.end = WALK_LIMIT_HIT;
    return finish(ctx, scratch_value);
}

int on_cpu_clock(struct bpf_perf_event_data *ctx) {
    u64 id = current_pid_tgid();
    struct target_t *target = count_sample(id);
    if (target == NULL)
        return 0;
    u32 tgid = id >> 32;

    u32 zero = 0;
    struct scratch_t *scratch_value = scratch.lookup(&zero);
    if (scratch_value == NULL)
        return 0;
    struct sample_t *sample = &scratch_value->sample;
    struct walk_state *state = &scratch_value->state;
    sample->tgid = tgid;
    sample->tid = (u32)id;
    sample->time_ns = bpf_ktime_get_ns();
    sample->user_bytes = 0;
    sample->user_walked = 0;
    sample->walk_end = WALK_ROOT;
    sample->jvm_unloads = ~0ULL;
    bpf_get_current_comm(&sample->comm, sizeof(sample->comm));
    __builtin_memset(state, 0, sizeof(*state));
    state->end = WALK_RUNNING;
    state->tgid = tgid;
    if (user_regs(ctx, &state->regs) != 0) {
        sample->user_bytes = -EFAULT;
        return finish(ctx, scratch_value);
    }
    struct jvm_t *jvm = jvms.lookup(&tgid);
    if (jvm != NULL) {
        state->jvm = *jvm;
        // read in the sampled process itself: the count is exact at the sample, no poll can race it
        if (jvm->unloads_at != 0 &&
            bpf_probe_read_user(&sample->jvm_unloads, sizeof(u64), (void *)jvm->unloads_at) != 0)
            sample->jvm_unloads = ~0ULL;
    } else {
        struct python_t *py = pythons.lookup(&tgid);
        if (py != NULL)
            state->py_count = py_walk(py, (u32)id, state->py, state->py_buffer, &state->py_status);
    }
    walk_progs.call(ctx, 0);  // the walk, and the record out: does not come back once walk_more runs
    // No walk_more in walk_progs (only before the sampler set it or after it emptied it): no user stack.
    sample->user_bytes = -ENOENT;
    return finish(ctx, scratch_value);
}
