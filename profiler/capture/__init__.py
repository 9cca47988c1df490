"""The on-disk capture and the stacks on their way to it: the format both halves share (format: its records,
file names and writers; read: each file read back, checked; jsonfile: a JSON file into typed records; checks:
the one validator every reader uses), folded-stack lines (folded), the sample store
before symbolization (stackstore), per-interval counter deltas (timeline) and the checkpoint journal of a
run in progress (journal encodes it, checkpoint writes it).

Pure data and file I/O, shared with the coordinator: imports only profiler.errors. Never sampling, bcc or
anything that reads a live host (contract `profiler-pure-rooms` in pyproject.toml).
"""
