// CPython's own frames for the stack walker: at a sample of a CPython process, the sampled thread's
// PyThreadState is found from `_PyRuntime` (the thread holding the GIL where the runtime keeps it, else the
// main interpreter's thread list matched by native_thread_id), and its interpreter frames are walked from
// cframe->current_frame (3.11) or current_frame (3.13) through `previous`, at most PY_SLOTS of them. Each
// frame is stored as its code object's address, its instruction index and its entry flag: 3.11's is_entry
// (the first frame of a _PyEval_EvalFrameDefault call), 3.13's owner == FRAME_OWNED_BY_CSTACK (the shim
// frame each call pushes before its first frame; user space drops it and flags the frame leafward); user space
// (profiler/unwind/cpython.py) names the code objects and splices the frames where
// _PyEval_EvalFrameDefault sits in the native stack. Every offset comes from `pythons`, written by user space
// from the interpreter's version (profiler/unwind/cpython.py, docs/python-frames.md). Reads only; bounded.
#ifndef SPE_PYTHON_STEP_H
#define SPE_PYTHON_STEP_H

#define PY_SLOTS 64          // Python frames kept per sample (a power of two), leaf first
#define PY_THREADS 32        // thread states looked at for the sampled thread
#define PY_FRAME_BYTES 80    // bytes of a _PyInterpreterFrame read at once (its pointers' offsets are <= 56)
#define PY_BUFFER_BYTES 128  // the buffer they are read into: the entry byte is indexed within it (& 127)
#define PY_NO_CFRAME 0xFFFFFFFF  // ts_cframe when the thread state holds current_frame itself (3.13)
#define PY_ADDRESS_MASK ((1ULL << 47) - 1)
#define PY_INDEX_SHIFT 47
#define PY_INDEX_MAX 16383   // 14 bits of instruction index (code units); all ones: unknown
#define PY_ENTRY_BIT (1ULL << 63)

#define PY_NONE 0       // not a CPython target (or its layout not published yet)
#define PY_WALKED 1     // the thread's frames were walked (zero frames: the thread runs no Python)
#define PY_NO_THREAD 2  // no thread state of the sampled thread (a thread CPython does not know)

// Per CPython process, written by profiler/sampling/sampler.py from profiler/unwind/cpython.py's PyLayout:
// keep in step.
struct python_t {
    u64 runtime;          // the address of _PyRuntime in the process
    u32 interp_head;      // _PyRuntimeState.interpreters.head
    u32 tstate_current;   // _PyRuntimeState.gilstate.tstate_current; 0: none kept (3.13: the thread list)
    u32 threads_head;     // PyInterpreterState.threads.head
    u32 ts_next;          // PyThreadState.next
    u32 ts_native_tid;    // PyThreadState.native_thread_id
    u32 ts_cframe;        // PyThreadState.cframe; PY_NO_CFRAME: cframe_frame is in the thread state (3.13)
    u32 cframe_frame;     // _PyCFrame.current_frame (3.13: PyThreadState.current_frame)
    u32 fr_code;          // _PyInterpreterFrame.f_code (3.13: f_executable)
    u32 fr_previous;      // _PyInterpreterFrame.previous
    u32 fr_prev_instr;    // _PyInterpreterFrame.prev_instr (3.13: instr_ptr)
    u32 fr_is_entry;      // _PyInterpreterFrame.is_entry (3.13: owner)
    u32 entry_mask;       // the entry byte's bits that say it: 1 (3.11), 0xff (3.13)
    u32 entry_value;      // ... and their value: 1 (is_entry), 3 (FRAME_OWNED_BY_CSTACK)
    u32 code_units;       // PyCodeObject.co_code_adaptive: the first instruction
};

BPF_HASH(pythons, u32, struct python_t, MAX_TARGETS);

static __always_inline u64 py_pointer(u64 address) {
    u64 value = 0;
    if (bpf_probe_read_user(&value, sizeof(value), (void *)address) != 0)
        return 0;
    return value;
}

// The PyThreadState of native thread `tid`, or 0.
static __always_inline u64 py_thread_state(struct python_t *py, u32 tid) {
    u64 tstate = py->tstate_current != 0 ? py_pointer(py->runtime + py->tstate_current) : 0;
    if (tstate != 0 && py_pointer(tstate + py->ts_native_tid) == tid)
        return tstate;
    u64 interp = py_pointer(py->runtime + py->interp_head);
    if (interp == 0)
        return 0;
    tstate = py_pointer(interp + py->threads_head);
    for (int i = 0; i < PY_THREADS; i++) {
        if (tstate == 0)
            return 0;
        if (py_pointer(tstate + py->ts_native_tid) == tid)
            return tstate;
        tstate = py_pointer(tstate + py->ts_next);
    }
    return 0;
}

// Walks thread `tid`'s interpreter frames into out[0..PY_SLOTS); returns the count, *status says why.
static __always_inline u32 py_walk(struct python_t *py, u32 tid, u64 *out, u8 *buffer, u32 *status) {
    *status = PY_NO_THREAD;
    u64 tstate = py_thread_state(py, tid);
    if (tstate == 0)
        return 0;
    *status = PY_WALKED;
    u64 cframe = py->ts_cframe == PY_NO_CFRAME ? tstate : py_pointer(tstate + py->ts_cframe);
    u64 frame = cframe != 0 ? py_pointer(cframe + py->cframe_frame) : 0;
    u32 count = 0;
    // Branch-free per frame (every frame stored, the counter never conditional): the verifier prunes each
    // iteration against the last instead of following 2^64 paths.
    for (int i = 0; i < PY_SLOTS; i++) {
        if (frame == 0 || bpf_probe_read_user(buffer, PY_FRAME_BYTES, (void *)frame) != 0)
            break;
        u64 code = *(u64 *)(buffer + (py->fr_code & 63));
        u64 previous = *(u64 *)(buffer + (py->fr_previous & 63));
        u64 prev_instr = *(u64 *)(buffer + (py->fr_prev_instr & 63));
        u64 entry = (u64)((buffer[py->fr_is_entry & 127] & py->entry_mask) == py->entry_value) << 63;
        // code units from the first instruction; one before it (a frame not started) wraps to PY_INDEX_MAX
        u64 index = ((prev_instr - code - py->code_units) >> 1) & PY_INDEX_MAX;
        out[i & (PY_SLOTS - 1)] = (code & PY_ADDRESS_MASK) | (index << PY_INDEX_SHIFT) | entry;
        count = i + 1;
        frame = previous;
    }
    return count;
}

#endif
