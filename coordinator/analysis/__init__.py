"""The analysis of captures: typed inputs (inputs), summary rows (rows), run comparison (compare), the
time axis (timeline), the reader that sums each PID's stacks per task (decide: stack tables by frame ids),
the engines that run it on Spark or in this process (engines),
and a finished run read back for the report and the exports (load).

Imports only run directories (coordinator.rundir) and the host agent's capture, matching and parsers.
"""
