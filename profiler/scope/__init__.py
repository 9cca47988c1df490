"""Which processes are profiled and what they are: the SPE kinds of known_spes.txt (spes, the shipped
copy beside it), the scope analyzer over /proc (analyzer), the exec watcher (execwatch + exec_watch.c),
JVM facts and jcmd (jvm), and full Java thread names over time (threadnames, threadwatch +
thread_names.c).

Imports profiler.capture, profiler.bpf and profiler.errors.
"""
