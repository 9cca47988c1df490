"""Compiling BPF C with bcc, one program's compiler heap at a time (compiler). Every room that loads a
program imports it; the C itself sits beside the Python that loads it (sampling/, scope/, unwind/).

Imports nothing of the profiler.
"""
