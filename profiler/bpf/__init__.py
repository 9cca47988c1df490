"""Compiling BPF C with bcc, one program's compiler heap at a time (compiler), and the kernel's BPF run-time
statistics our programs' cost is read from (stats), and the ids every program keys processes by: those of
the agent's own PID namespace (pidns). Every room that loads a program imports it; the C itself
sits beside the Python that loads it (sampling/, scope/, unwind/).

Imports nothing of the profiler.
"""
