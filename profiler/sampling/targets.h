// The sampled processes, the same in the three stack programs (the BPF walker, the ring-buffer and
// the stack-map program; one of them is loaded). Inlined by profiler/sampling/sampler.py where a program
// includes it, so bcc needs no include path and --print-bpf shows the whole program.

// Per target process; present in the map = sampled. User space creates the entry in add_pid().
struct target_t {
    u64 samples;  // every sample of the process, also those that could not be kept
    u64 dropped;  // no room for the sample (ring buffer or counts map full): it is in `samples` only
};

BPF_HASH(targets, u32, struct target_t, MAX_TARGETS);

// The entry of the interrupted process (``id``: current_pid_tgid(), profiler/bpf/pidns.py) with this sample counted, or
// NULL when the process is not sampled.
static __always_inline struct target_t *count_sample(u64 id) {
    u32 tgid = id >> 32;
    struct target_t *target = targets.lookup(&tgid);
    if (target != NULL)
        __sync_fetch_and_add(&target->samples, 1);
    return target;
}
