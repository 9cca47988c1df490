"""Exports of a run for other tools: speedscope, pprof (go tool pprof, Pyroscope) and folded stacks
(flamegraph.pl, inferno), each stack in the task summary.csv counted it in. docs/exports.md.

Imports the analysis (rows, the loaded run) below it; never the report.
"""
