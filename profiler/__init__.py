"""Host agent of the task-level CPU profiler for stream processing engines.

Needs only python3, bcc and psutil, so the package can be copied to a cluster host as is.
"""

__version__ = "0.1.0"
