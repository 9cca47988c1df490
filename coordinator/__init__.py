"""The user's side: cluster file and SSH transport (remote/), commands, the analysis (PySpark or in
process, analysis/), the HTML report (report/) and the demo workloads (workloads/)."""

from profiler import __version__

__all__ = ["__version__"]
