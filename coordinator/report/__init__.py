"""The HTML report of a run (read through coordinator.analysis.load): build its view (view, health,
model), render it (render: ``render_report``, the entry point), flamegraph trees (flame) and published
report indexes (publish).

Imports the exports, the analysis and run directories below it.
"""
