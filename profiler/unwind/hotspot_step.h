// One unwind step through HotSpot's JIT code without frame pointers, for the stack walker: the pc's
// CodeBlob is found through its code heap's segment map, and the caller's registers come from the
// blob's frame size (compiled methods, native wrappers, runtime stubs). Interpreted frames are walked
// by their frame pointer, which the interpreter always keeps, with the caller's sp from the frame's
// sender-sp slot. Everything per JVM (heaps, field offsets) is written by user space from the JVM's
// vmStructs (profiler/unwind/codecache.py, profiler/sampling/sampler.py) into `jvms`. docs/unwinding.md explains it.
//
// Contract with the walker (profiler/sampling/stack_walk.c, which defines struct unwind_regs and includes
// this file after cfi_step.h): hs_frame() names the frame and hs_step() unwinds it, answering one of
// the UNWIND_HS_* below. Needs only bounded loops.
#ifndef SPE_HOTSPOT_STEP_H
#define SPE_HOTSPOT_STEP_H

#define UNWIND_HS_NONE 0   // pc not in this JVM's code cache: CFI, then frame pointer
#define UNWIND_HS_DONE 1   // regs hold the caller's pc, sp, fp
#define UNWIND_HS_FP 2     // a blob that keeps a frame pointer (stub routines, adapters): frame-pointer step
#define UNWIND_HS_FAIL -1  // in the code cache, but no blob or no plausible return address: stop

#define HS_MAX_HEAPS 4
#define HS_SEGMAP_STEPS 16   // back-links of the segment map per lookup (profiler/unwind/codecache.py: SEGMAP_STEPS)
#define HS_RA_SLOTS 4        // words searched above a frame for its return address (extra pushes)
#define HS_MAX_FRAME_WORDS 65536
#define HS_FREE_SEGMENT 0xff

// A stored compiled frame: this tag, the nmethod's compile id (31 bits) and pc - code_low (31 bits).
// profiler/unwind/codecache.py (COMPILED_TAG) reads it.
#define COMPILED_TAG (1ULL << 62)
#define COMPILE_ID_SHIFT 31
#define HS_LOW_MASK ((1ULL << COMPILE_ID_SHIFT) - 1)

#define HS_KIND_OTHER 0
#define HS_KIND_NMETHOD 1
#define HS_KIND_VTABLE 2

struct hs_heap {
    u64 low;     // reserved code of the heap: [low, high)
    u64 high;
    u64 segmap;  // one byte per segment
};

// Per JVM, written by profiler/sampling/sampler.py (_publish_jvm) from profiler/unwind/hotspot.py's VMLayout: keep in step.
struct jvm_t {
    u64 interpreter_start;  // the template interpreter's code: [start, end)
    u64 interpreter_end;
    s64 method_slot;  // byte offset from an interpreted frame's fp to its Method*
    s64 sender_sp_slot;  // byte offset from an interpreted frame's fp to its caller's sp
    u64 code_low;  // the code cache: [code_low, code_high); 0: not read, JIT frames by frame pointer
    u64 code_high;
    struct hs_heap heaps[HS_MAX_HEAPS];
    u32 heap_count;
    u32 segment_shift;
    u32 heapblock_size;
    u32 frame_size_at;  // CodeBlob::_frame_size (words)
    u32 frame_complete_at;  // CodeBlob::_frame_complete_offset
    u32 frame_complete_width;  // 2 or 4 bytes
    u32 code_at;  // CodeBlob::_code_begin (pointer) or _code_offset (from the blob)
    u32 code_is_offset;
    s32 kind_at;  // CodeBlob::_kind (u8), or -1: the kind is in _name's first bytes
    u32 name_at;
    u32 kind_nmethod;
    u32 kind_vtable;
    u32 compile_id_at;  // nmethod::_compile_id
    u32 pad;
    u64 unloads_at;  // the JVM's address of its hsperfdata counter java.cls.unloadedClasses; 0: none
};

// What the walker learned about the frame's blob (before storing the frame, used by the step after).
struct hs_blob {
    u64 address;  // 0: none
    u64 code_begin;
    s32 frame_complete;
    u32 frame_words;
    u32 kind;
    u32 compile_id;
};

// Per process: frames unwound by blob frame size, by the interpreter's frame pointer, and failures.
struct hs_health {
    u64 compiled;     // compiled/stub frames stepped by their blob's frame size
    u64 interpreted;  // interpreted frames stepped by their frame pointer and sender sp
    u64 no_blob;      // pc in the code cache but in no blob (free or unreadable segment map)
    u64 bad_return;   // no return address into the code cache where the frame size says
};

BPF_HASH(hs_health_map, u32, struct hs_health, MAX_TARGETS);

#define HS_COUNT_COMPILED 0
#define HS_COUNT_INTERPRETED 1
#define HS_COUNT_NO_BLOB 2
#define HS_COUNT_BAD_RETURN 3

static __always_inline int hs_in_code(struct jvm_t *jvm, u64 pc) {
    return pc >= jvm->code_low && pc < jvm->code_high;
}

// A walk's counts (struct hs_health's order) added to its process's, once per sample.
static __always_inline void hs_flush(u32 tgid, u32 *counts) {
    if ((counts[0] | counts[1] | counts[2] | counts[3]) == 0)
        return;
    struct hs_health *health = hs_health_map.lookup(&tgid);
    if (health == NULL) {
        struct hs_health zero = {};
        hs_health_map.insert(&tgid, &zero);
        health = hs_health_map.lookup(&tgid);
        if (health == NULL)
            return;
    }
    __sync_fetch_and_add(&health->compiled, counts[0]);
    __sync_fetch_and_add(&health->interpreted, counts[1]);
    __sync_fetch_and_add(&health->no_blob, counts[2]);
    __sync_fetch_and_add(&health->bad_return, counts[3]);
}

// The CodeBlob holding pc: the heap's segment map links each segment back to its block's first one.
static __always_inline u64 hs_find_blob(struct jvm_t *jvm, u64 pc) {
    u64 low = 0, segmap = 0;
    for (int h = 0; h < HS_MAX_HEAPS; h++) {
        if (h >= jvm->heap_count)
            break;
        if (pc >= jvm->heaps[h].low && pc < jvm->heaps[h].high) {
            low = jvm->heaps[h].low;
            segmap = jvm->heaps[h].segmap;
            break;
        }
    }
    if (low == 0)
        return 0;
    u32 shift = jvm->segment_shift & 31;
    u64 segment = (pc - low) >> shift;
    u8 tag = HS_FREE_SEGMENT;
    for (int i = 0; i < HS_SEGMAP_STEPS; i++) {
        if (bpf_probe_read_user(&tag, sizeof(tag), (void *)(segmap + segment)) != 0)
            return 0;
        if (tag == 0 || tag == HS_FREE_SEGMENT || tag > segment)
            break;
        segment -= tag;
    }
    if (tag != 0)
        return 0;
    return low + (segment << shift) + jvm->heapblock_size;
}

// The blob's fields the step needs (a few small reads; the blob header lies just before its code).
static __always_inline int hs_read_blob(struct jvm_t *jvm, u64 pc, struct hs_blob *blob) {
    blob->address = hs_find_blob(jvm, pc);
    if (blob->address == 0)
        return -1;
    u64 address = blob->address;
    s32 frame_words = 0, complete = -1;
    u64 code = 0;
    if (bpf_probe_read_user(&frame_words, 4, (void *)(address + (jvm->frame_size_at & 4095))) != 0)
        return -1;
    if (jvm->frame_complete_width == 2) {
        s16 short_complete = -1;
        bpf_probe_read_user(&short_complete, 2, (void *)(address + (jvm->frame_complete_at & 4095)));
        complete = short_complete;
    } else {
        bpf_probe_read_user(&complete, 4, (void *)(address + (jvm->frame_complete_at & 4095)));
    }
    if (jvm->code_is_offset) {
        s32 offset = 0;
        bpf_probe_read_user(&offset, 4, (void *)(address + (jvm->code_at & 4095)));
        code = address + offset;
    } else {
        bpf_probe_read_user(&code, 8, (void *)(address + (jvm->code_at & 4095)));
    }
    blob->code_begin = code;
    blob->frame_complete = complete;
    blob->frame_words = frame_words > 0 && frame_words < HS_MAX_FRAME_WORDS ? (u32)frame_words : 0;
    blob->kind = HS_KIND_OTHER;
    if (jvm->kind_at >= 0) {
        u8 kind = 0;
        bpf_probe_read_user(&kind, 1, (void *)(address + (jvm->kind_at & 4095)));
        if (kind == jvm->kind_nmethod)
            blob->kind = HS_KIND_NMETHOD;
        else if (kind == jvm->kind_vtable)
            blob->kind = HS_KIND_VTABLE;
    } else {
        u64 name = 0;
        u32 head = 0;
        bpf_probe_read_user(&name, 8, (void *)(address + (jvm->name_at & 4095)));
        bpf_probe_read_user(&head, 4, (void *)name);
        if (head == 0x74656d6e || head == 0x6974616e)  // "nmet", "nati": nmethod, native nmethod
            blob->kind = HS_KIND_NMETHOD;
        else if (head == 0x62617476)  // "vtab": vtable chunks
            blob->kind = HS_KIND_VTABLE;
    }
    blob->compile_id = 0;
    if (blob->kind == HS_KIND_NMETHOD) {
        s32 id = 0;
        bpf_probe_read_user(&id, 4, (void *)(address + (jvm->compile_id_at & 4095)));
        blob->compile_id = (u32)id & 0x7fffffff;
    }
    return 0;
}

// The value stored for a frame in the code cache (not the interpreter): a compiled frame with its
// compile id, else the plain pc (stubs are named by the perf map or as unknown JIT code).
static __always_inline u64 hs_frame(struct jvm_t *jvm, u64 pc, struct hs_blob *blob) {
    if (blob->address == 0 || blob->kind != HS_KIND_NMETHOD)
        return pc;
    return COMPILED_TAG | ((u64)blob->compile_id << COMPILE_ID_SHIFT) | ((pc - jvm->code_low) & HS_LOW_MASK);
}

// Where the leaf frame's return address is when the sample interrupted its prologue or epilogue:
// 8 (only the return address pushed), 16 (rbp pushed too), or 0 (the frame is complete).
static __always_inline u64 hs_partial_frame(struct unwind_regs *regs, struct hs_blob *blob) {
    if (blob->frame_complete >= 0 && regs->pc < blob->code_begin + blob->frame_complete)
        return 0;  // prologue: decided by the return-address check in hs_step
    u8 code[16];
    if (bpf_probe_read_user(code, sizeof(code), (void *)(regs->pc - 1)) != 0)
        return 0;
    if (code[1] == 0xc3)  // on `ret`
        return 8;
    int ret_follows = 0;
    for (int i = 2; i < 16; i++)
        if (code[i] == 0xc3)
            ret_follows = 1;
    if (!ret_follows)
        return 0;
    if (code[1] == 0x5d)  // on `pop rbp` before a `ret`
        return 16;
    if (code[0] == 0x5d || code[0] == 0xc9)  // after `pop rbp` / `leave`: the return poll, then `ret`
        return 8;
    return 0;
}

static __always_inline int hs_read_caller(struct jvm_t *jvm, u64 sender_sp, u64 *ra, u64 *fp) {
    u64 pair[2];
    if (bpf_probe_read_user(pair, sizeof(pair), (void *)(sender_sp - 16)) != 0)
        return -1;
    *fp = pair[0];
    *ra = pair[1];
    return hs_in_code(jvm, pair[1]) ? 0 : -1;
}

// An interpreted frame: the interpreter keeps rbp as its frame pointer whatever the flags; the caller's
// sp is the one it saved (a compiled caller's, before a c2i adapter extended its frame).
static __always_inline int hs_interpreted_step(struct jvm_t *jvm, struct unwind_regs *regs, u32 *counts) {
    u64 fp = regs->fp, sender_sp = 0, pair[2];
    if (fp < regs->sp || bpf_probe_read_user(pair, sizeof(pair), (void *)fp) != 0)
        return UNWIND_HS_FAIL;
    if (bpf_probe_read_user(&sender_sp, sizeof(sender_sp), (void *)(fp + jvm->sender_sp_slot)) != 0 ||
        sender_sp <= fp)
        sender_sp = fp + 16;
    regs->pc = pair[1];
    regs->sp = sender_sp;
    regs->fp = pair[0];
    counts[HS_COUNT_INTERPRETED]++;
    return pair[1] == 0 ? UNWIND_HS_FAIL : UNWIND_HS_DONE;
}

// One step from a frame in the code cache. `leaf`: the sampled frame (prologue and epilogue possible).
static __always_inline int hs_step(struct jvm_t *jvm, struct unwind_regs *regs, struct hs_blob *blob, int leaf,
                                   u32 *counts) {
    if (regs->pc >= jvm->interpreter_start && regs->pc < jvm->interpreter_end)
        return hs_interpreted_step(jvm, regs, counts);
    if (blob->address == 0) {
        counts[HS_COUNT_NO_BLOB]++;
        return UNWIND_HS_FAIL;
    }
    u64 ra = 0, fp = regs->fp, sender_sp = 0;
    u64 partial = blob->kind == HS_KIND_VTABLE ? 8 : 0;  // vtable stubs push nothing
    if (leaf && partial == 0 && blob->frame_words != 0)
        partial = hs_partial_frame(regs, blob);
    if (leaf && partial == 0 && blob->frame_complete >= 0 && regs->pc < blob->code_begin + blob->frame_complete) {
        // prologue: the return address alone on the stack, or rbp pushed above it already
        u64 top[2] = {};
        bpf_probe_read_user(top, sizeof(top), (void *)regs->sp);
        partial = hs_in_code(jvm, top[0]) ? 8 : 16;
    }
    if (partial == 0 && blob->frame_words == 0)
        return UNWIND_HS_FP;  // stub routines, adapters, the call stub: they keep rbp
    if (partial == 8) {
        if (bpf_probe_read_user(&ra, sizeof(ra), (void *)regs->sp) != 0 || !hs_in_code(jvm, ra)) {
            counts[HS_COUNT_BAD_RETURN]++;
            return UNWIND_HS_FAIL;
        }
        sender_sp = regs->sp + 8;
    } else {
        sender_sp = regs->sp + (partial ? partial : (u64)blob->frame_words * 8);
        int found = 0;
        for (int i = 0; i < HS_RA_SLOTS; i++) {
            if (hs_read_caller(jvm, sender_sp, &ra, &fp) == 0) {
                found = 1;
                break;
            }
            sender_sp += 8;  // code that pushed a word more than its frame size says (async-profiler does the same)
        }
        if (!found) {
            counts[HS_COUNT_BAD_RETURN]++;
            return UNWIND_HS_FAIL;
        }
    }
    regs->pc = ra;
    regs->sp = sender_sp;
    regs->fp = fp;
    counts[HS_COUNT_COMPILED]++;
    return UNWIND_HS_DONE;
}

#endif
