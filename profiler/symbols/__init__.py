"""Naming frames: a frame and its naming rules (frames), the kernel's symbols and stack folding
(symbolize), perf maps and their versions over the window (perfmap, perfmap_history), preparing them for
the sampled processes (symbolprep), ELF symbols of processes that are gone (elfsyms) and the JVMTI
perf-map agent (agent/).

Imports profiler.scope (JVM facts), profiler.unwind (interpreted frames), profiler.capture, profiler.errors.
"""
