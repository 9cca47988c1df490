// Thread renames of the sampled JVMs: a uprobe on HotSpot's os::set_native_thread_name(const char *),
// which every Java thread calls at start and Thread.setName calls on the current thread, with the whole
// name before HotSpot cuts it to the kernel's 15 bytes. Each call of a target process goes to user
// space (tgid, tid, time, name) through its own ring buffer; profiler/scope/threadwatch.py names samples by it.
// A separate program from the stack sampler's: neither needs the other's maps.
//
// Placeholders replaced by profiler/scope/threadwatch.py: NAME_BYTES, MAX_TARGETS, RINGBUF_PAGES.
// Needs uprobes (CONFIG_UPROBES) and BPF_MAP_TYPE_RINGBUF (Linux 5.8).
#include <uapi/linux/ptrace.h>

// Layout read by profiler/scope/threadwatch.py (RENAME_HEADER): keep both in step.
struct rename_t {
    u32 tgid;
    u32 tid;
    u64 time_ns;  // bpf_ktime_get_ns: CLOCK_MONOTONIC, the clock of the stack samples
    char name[NAME_BYTES];
};

BPF_HASH(targets, u32, u8, MAX_TARGETS);
BPF_ARRAY(lost, u64, 1);  // renames the ring buffer had no room for
BPF_RINGBUF_OUTPUT(renames, RINGBUF_PAGES);

int on_set_native_thread_name(struct pt_regs *ctx) {
    u64 id = current_pid_tgid();
    u32 tgid = id >> 32;
    if (targets.lookup(&tgid) == NULL)
        return 0;
    struct rename_t *event = renames.ringbuf_reserve(sizeof(struct rename_t));
    if (event == NULL) {
        int zero = 0;
        u64 *count = lost.lookup(&zero);
        if (count != NULL)
            __sync_fetch_and_add(count, 1);
        return 0;
    }
    event->tgid = tgid;
    event->tid = (u32)id;
    event->time_ns = bpf_ktime_get_ns();
    if (bpf_probe_read_user_str(event->name, sizeof(event->name), (void *)PT_REGS_PARM1(ctx)) < 0)
        event->name[0] = 0;
    renames.ringbuf_submit(event, BPF_RB_NO_WAKEUP);
    return 0;
}
