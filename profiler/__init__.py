"""Host agent of the task-level CPU profiler for stream processing engines.

Needs only python3, bcc and psutil, so the package can be copied to a cluster host as is. Rooms by
concern, lowest first: capture (the on-disk format) and bpf; scope and unwind; symbols; sampling,
engines and matching; then runner.py (one capture), recovery.py (a killed run's capture), commands/
and cli.py. Each room's docstring says what it owns and may import; the contract in pyproject.toml
([tool.importlinter], run by `make lint`) checks it.
"""

__version__ = "0.1.0"
