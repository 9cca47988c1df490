// Process watcher for the scope analyzer: every process that calls exec(), every new process (a fork that is
// not a thread) and every process that exits, so the analyzer need not list /proc to learn them.
// Raw tracepoints sched_process_exec / sched_process_fork / sched_process_exit (Linux 4.17+, need no tracefs
// mount); ring buffer (5.8+). Overhead: one 12-byte record per exec, process fork and process exit
// system-wide (threads' clones and exits end at a compare); user space reads them every poll.
// Layout read by profiler/scope/execwatch.py (EVENT): keep both in step.
#include <linux/sched.h>

#define EVENT_EXEC 1
#define EVENT_FORK 2
#define EVENT_EXIT 3

struct proc_event_t {
    u32 kind;
    u32 tgid;    // the process (in the agent's PID namespace, profiler/bpf/pidns.py)
    u32 parent;  // EVENT_FORK: the forking process's tgid; otherwise 0
};

BPF_RINGBUF_OUTPUT(exec_events, RINGBUF_PAGES);
BPF_ARRAY(exec_dropped, u64, 1);

static __always_inline void emit(u32 kind, u32 tgid, u32 parent)
{
    struct proc_event_t event = {.kind = kind, .tgid = tgid, .parent = parent};
    if (exec_events.ringbuf_output(&event, sizeof(event), 0) != 0) {
        int zero = 0;
        u64 *dropped = exec_dropped.lookup(&zero);
        if (dropped)
            __sync_fetch_and_add(dropped, 1);
    }
}

RAW_TRACEPOINT_PROBE(sched_process_exec)
{
    // exec runs in the task itself: the current tgid is the process that now runs the new program
    // (0 for a task of another namespace)
    u32 tgid = current_pid_tgid() >> 32;
    if (tgid != 0)
        emit(EVENT_EXEC, tgid, 0);
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_process_fork)
{
    // args: the parent task (current), the child. The child's ids are the initial namespace's: user space
    // uses fork records only when the agent runs there (execwatch.py).
    struct task_struct *child = (struct task_struct *)ctx->args[1];
    u32 child_pid = child->pid;
    u32 child_tgid = child->tgid;
    if (child_pid != child_tgid || child->mm == NULL)  // a new thread, or a kernel thread
        return 0;
    u32 parent = current_pid_tgid() >> 32;
    if (parent != 0)
        emit(EVENT_FORK, child_tgid, parent);
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    // runs in the exiting task for each thread: the process's own record is its leader's exit
    u64 id = current_pid_tgid();
    u32 tgid = id >> 32;
    if (tgid != 0 && (u32)id == tgid)
        emit(EVENT_EXIT, tgid, 0);
    return 0;
}
