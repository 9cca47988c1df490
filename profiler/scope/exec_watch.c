// Exec watcher for the scope analyzer: the tgid of every process that calls exec().
// Raw tracepoint sched_process_exec (Linux 4.17+, needs no tracefs mount); ring buffer (5.8+).
// Overhead: one 4-byte record per exec() system-wide; user space reads them every poll.

BPF_RINGBUF_OUTPUT(exec_events, 16);
BPF_ARRAY(exec_dropped, u64, 1);

RAW_TRACEPOINT_PROBE(sched_process_exec)
{
    // exec runs in the task itself: the current tgid is the process that now runs the new program
    // (in the agent's PID namespace, profiler/bpf/pidns.py: 0 for a task of another namespace)
    u32 tgid = current_pid_tgid() >> 32;
    if (tgid == 0)
        return 0;
    if (exec_events.ringbuf_output(&tgid, sizeof(tgid), 0) != 0) {
        int zero = 0;
        u64 *dropped = exec_dropped.lookup(&zero);
        if (dropped)
            __sync_fetch_and_add(dropped, 1);
    }
    return 0;
}
