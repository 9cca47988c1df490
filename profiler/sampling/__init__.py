"""Taking the samples: the stack sampler and its BPF programs (sampler + stack_walk.c, stack_ringbuf.c,
stack_sampler.c, the sampled processes' map in targets.h), per-process CPU counters (counters over
perf_event), network bytes (net + net_trace.c).

Imports the rooms below it: profiler.symbols, profiler.scope, profiler.unwind, profiler.bpf,
profiler.capture, profiler.errors; never profiler.run or the commands.
"""
