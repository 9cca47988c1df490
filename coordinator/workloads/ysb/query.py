"""What the demo asks of a running YSB query, the same on every engine: handed on to the engine's run."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class RunningQuery(Protocol):
    def wait_ready(self, timeout: float) -> None: ...
    def wait_processing(self, seconds: float) -> None: ...
    def check_running(self) -> None: ...


_Run = TypeVar("_Run", bound=RunningQuery)


class QueryEngine(Generic[_Run]):
    """The part of an engine (Spark's, Flink's) that waits on and checks its running query ``ysb``."""

    ysb: _Run | None

    def _run(self) -> _Run:
        assert self.ysb is not None, "start() first"
        return self.ysb

    def wait_ready(self, timeout: float) -> None:
        self._run().wait_ready(timeout=timeout)

    def wait_processing(self, seconds: float) -> None:
        self._run().wait_processing(seconds)

    def check_running(self) -> None:
        self._run().check_running()
