"""One capture from start to end: the run's options, the components it builds, the sampling window and
its checkpoints, the status file, the writer of the capture and a killed run's recovery.

Imports the rooms below it (sampling, engines, matching, symbols, scope, unwind, bpf, capture, files);
only the commands import it, and the coordinator imports its options alone (options.py: every option
of `profiler run` declared once, from which the coordinator's parsers and each host's argv derive).
"""
