"""Targets that leave: the lines written for them and the "nothing to sample" decision (pure functions)."""

from __future__ import annotations

from dataclasses import replace

from profiler.capture.format import ProcessInfo
from profiler.run.departures import departure_lines, nothing_line, nothing_to_sample

START = 1_700_000_000.0


def proc(pid: int, role: str = "workload", exited_after: float | None = None) -> ProcessInfo:
    info = ProcessInfo(pid, role, "manual", "manual", "root", "python3 busy.py", START, START + 8.0)
    if exited_after is None:
        return info
    return replace(info, exited=True, last_seen=START + exited_after)


def lines(pids: tuple[int, ...], processes: list[ProcessInfo], samples: dict[int, int]) -> list[str]:
    return departure_lines(pids, processes, samples, START, START + 8.0, command_time=START - 30.0)


def test_a_pid_never_found_by_the_scope_is_gone_before_the_window_with_the_start_up_it_missed() -> None:
    assert lines((7, 8), [proc(8)], {8: 50}) == [
        "--pid 7: exited before the window began (it was there at the command, gone 30.0 s later when sampling "
        "started); nothing of it was sampled"
    ]


def test_a_process_gone_mid_window_keeps_its_samples_and_says_when_it_went() -> None:
    (line,) = lines((8,), [proc(8, exited_after=3.5), proc(9)], {8: 120, 9: 800})
    assert line.startswith("pid 8 (manual: python3 busy.py): exited during the window, found gone +3.5 s into")
    assert "into its 8.0 s" in line
    assert line.endswith("its 120 samples up to then are kept")


def test_a_process_found_gone_at_the_first_polls_without_a_sample_left_before_the_window() -> None:
    (line,) = lines((), [proc(8, exited_after=0.5)], {})
    assert "exited before the window began or at its start (found gone +0.5 s into it)" in line
    # with samples it was there: the same timing reads as an exit during the window
    (line,) = lines((), [proc(8, exited_after=0.5)], {8: 3})
    assert "exited during the window" in line and "its 3 samples" in line


def test_managing_processes_and_live_ones_get_no_line() -> None:
    assert lines((), [proc(5, role="managing", exited_after=2.0), proc(6)], {}) == []


def test_nothing_to_sample_only_with_pid_no_sample_and_nothing_left_running() -> None:
    assert nothing_to_sample((7,), [], {})  # gone before the scope started, nothing else found
    assert nothing_to_sample((7,), [proc(7, exited_after=0.5)], {})  # found gone at the start
    assert not nothing_to_sample((7,), [proc(7, exited_after=2.0)], {7: 1})  # one sample before its exit
    assert not nothing_to_sample((7,), [proc(9)], {})  # another workload process still runs (idle)
    assert nothing_to_sample((7,), [proc(9, role="managing")], {})  # a managing process is not sampled
    assert not nothing_to_sample((), [], {})  # a scoped run: its health line says no workload was found


def test_the_nothing_line_names_every_pid_once() -> None:
    line = nothing_line((7, 8, 7))
    assert line.startswith("nothing to sample: --pid 7, 8 exited before a sample was taken") and "\n" not in line


def test_scoped_processes_that_come_and_go_by_the_hundred_are_ten_lines_and_a_count() -> None:
    workers = [proc(pid, exited_after=2.0) for pid in range(500, 650)]
    found = lines((7,), [proc(7, exited_after=4.0), *workers], {pid: 5 for pid in range(500, 650)})
    assert len(found) == 1 + 10 + 1 and found[0].startswith("pid 7 ")  # a --pid always has its own line
    assert found[-1].startswith("140 more sampled processes exited during the window")
