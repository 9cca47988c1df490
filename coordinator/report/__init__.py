"""The HTML report of a run: load the run (load), build its view (view, health, model), render it
(render: ``render_report``, the entry point), flamegraph trees (flame) and published report indexes
(publish).
"""
