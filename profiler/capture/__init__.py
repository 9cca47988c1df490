"""The on-disk capture and the stacks on their way to it: the format both halves share (format: meta.json,
per-PID folded stacks, counters, timelines, atomic writes), folded-stack lines (folded), the sample store
before symbolization (stackstore), per-interval counter deltas (timeline) and the checkpoint journal of a
run in progress (journal encodes it, checkpoint writes it).

Pure data and file I/O, shared with the coordinator: imports only profiler.errors. Never sampling, bcc or
anything that reads a live host (contract `profiler-pure-rooms` in pyproject.toml).
"""
