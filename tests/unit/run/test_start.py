"""profiler/run/start.py: the window starts at the start file's time once it is there, at --start-at at the
latest, and a start file that is not whole, not a number, a link or not a regular file is never taken."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coordinator.remote.deploy import start_file_text
from profiler.run.start import START_FILE_BYTES, read_start_file, wait_for_start


class FakeClock:
    """A clock that ``wait`` advances; ``events`` run once the clock reaches their time (a coordinator
    writing the start file during the wait)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.waits: list[float] = []
        self.events: list[tuple[float, object]] = []
        self.stop_at: float | None = None

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        assert seconds > 0
        self.waits.append(seconds)
        self.now += seconds
        for at, action in list(self.events):
            if self.now >= at:
                self.events.remove((at, action))
                action()  # type: ignore[operator]
        return self.stop_at is not None and self.now >= self.stop_at


def test_the_coordinators_text_is_read_back_to_the_millisecond(tmp_path: Path) -> None:
    path = tmp_path / "start.txt"
    path.write_text(start_file_text(1795929984.12345))
    assert read_start_file(path) == pytest.approx(1795929984.123, abs=1e-9)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"1795929984.5",
        b"17959",
        b"soon\n",
        b"nan\n",
        b"inf\n",
        b"-5\n",
        b"\xff\xfe\n",
        b"1" * START_FILE_BYTES + b"\n",
    ],
    ids=["empty", "no-newline-yet", "half-written", "words", "nan", "inf", "negative", "not-ascii", "too-long"],
)
def test_a_start_file_that_is_not_one_whole_time_is_not_taken(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "start.txt"
    path.write_bytes(content)
    assert read_start_file(path) is None


def test_a_link_or_a_directory_or_a_fifo_is_not_followed(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("1795929984.5\n")
    link = tmp_path / "start.txt"
    link.symlink_to(real)
    assert read_start_file(link) is None
    (tmp_path / "dir.txt").mkdir()
    assert read_start_file(tmp_path / "dir.txt") is None
    os.mkfifo(tmp_path / "fifo.txt")  # no writer: an open that blocked would hang the profiler
    assert read_start_file(tmp_path / "fifo.txt") is None
    assert read_start_file(tmp_path / "absent.txt") is None


def test_without_a_start_file_the_window_starts_at_the_latest_start(tmp_path: Path) -> None:
    clock = FakeClock()
    stopped, given = wait_for_start(1010.0, tmp_path / "start.txt", clock, clock.wait)
    assert (stopped, given) == (False, None)
    assert clock.now == pytest.approx(1010.0)
    assert max(clock.waits) <= 0.05 + 1e-9, "the file is looked at while waiting"


def test_no_start_file_option_sleeps_once_to_the_latest_start() -> None:
    clock = FakeClock()
    assert wait_for_start(1010.0, None, clock, clock.wait) == (False, None)
    assert clock.waits == [pytest.approx(10.0)]


def test_a_start_file_written_during_the_wait_brings_the_start_forward(tmp_path: Path) -> None:
    # GIVEN a latest start 10 s ahead and a coordinator writing "start at 1003.0" 2 s into the wait
    path = tmp_path / "start.txt"
    clock = FakeClock()
    clock.events.append((1002.0, lambda: path.write_text(start_file_text(1003.0))))
    # WHEN the profiler waits; THEN it starts at the file's time, 7 s before the latest start
    stopped, given = wait_for_start(1010.0, path, clock, clock.wait)
    assert not stopped and given == pytest.approx(1003.0)
    assert clock.now == pytest.approx(1003.0, abs=1e-6)


def test_a_start_file_can_only_bring_the_start_forward(tmp_path: Path) -> None:
    path = tmp_path / "start.txt"
    path.write_text(start_file_text(1500.0))
    clock = FakeClock()
    stopped, given = wait_for_start(1010.0, path, clock, clock.wait)
    assert not stopped and given == pytest.approx(1500.0)
    assert clock.now == pytest.approx(1010.0), "never past --start-at"


def test_a_start_already_past_starts_at_once(tmp_path: Path) -> None:
    path = tmp_path / "start.txt"
    path.write_text(start_file_text(990.0))  # reached late (a slow link): start now, as late as it is
    clock = FakeClock()
    assert wait_for_start(1010.0, path, clock, clock.wait) == (False, pytest.approx(990.0))
    assert clock.waits == [] and clock.now == 1000.0


def test_a_stop_during_the_wait_is_reported(tmp_path: Path) -> None:
    clock = FakeClock()
    clock.stop_at = 1001.0
    stopped, _given = wait_for_start(1010.0, tmp_path / "start.txt", clock, clock.wait)
    assert stopped and clock.now < 1001.1
