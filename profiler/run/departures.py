"""Targets that leave: a line for each sampled process gone before or during the window, and whether a
run given --pid had anything to sample at all (pure functions over the scope's final records)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..capture.format import ProcessInfo

# The scope finds an exit at its next poll (window.POLL_INTERVAL, 0.5 s): a process found gone within
# about two polls of the window's start, without a sample, may have left before the window began.
AT_START_SECONDS = 1.0
# A Spark executor's Python workers come and go by the hundred: beyond this many lines for processes the
# scope found (not --pid), one line counts the rest (scope.csv has each one's exit time).
MAX_SCOPED_LINES = 10


def departure_lines(
    manual_pids: Sequence[int],
    processes: Sequence[ProcessInfo],
    samples: Mapping[int, int],
    start_time: float,
    end_time: float,
    command_time: float,
) -> list[str]:
    """One line per sampled process that left: a --pid the scope never found (gone during start-up),
    and a process found gone during the window with the samples it keeps."""
    found = {process.pid for process in processes}
    lines = [
        f"--pid {pid}: exited before the window began (it was there at the command, gone "
        f"{max(0.0, start_time - command_time):.1f} s later when sampling started); nothing of it was sampled"
        for pid in dict.fromkeys(manual_pids)
        if pid not in found
    ]
    window = max(0.0, end_time - start_time)
    manual = set(manual_pids)
    scoped_lines = 0
    left = [process for process in processes if process.sampled and process.exited]
    for process in left:
        if process.pid not in manual:
            scoped_lines += 1
            if scoped_lines > MAX_SCOPED_LINES:
                continue
        after = max(0.0, process.last_seen - start_time)
        count = samples.get(process.pid, 0)
        what = f"pid {process.pid} ({process.kind}: {process.cmdline[:80]})"
        if count == 0 and after <= AT_START_SECONDS:
            lines.append(
                f"{what}: exited before the window began or at its start (found gone "
                f"+{after:.1f} s into it); nothing of it was sampled"
            )
        else:
            lines.append(
                f"{what}: exited during the window, found gone +{after:.1f} s into its {window:.1f} s; "
                f"its {count} samples up to then are kept"
            )
    if scoped_lines > MAX_SCOPED_LINES:
        lines.append(
            f"{scoped_lines - MAX_SCOPED_LINES} more sampled processes exited during the window, their samples up to "
            "then kept (scope.csv: exited, last_seen)"
        )
    return lines


def nothing_to_sample(manual_pids: Sequence[int], processes: Sequence[ProcessInfo], samples: Mapping[int, int]) -> bool:
    """A run given --pid that took no sample and has no sampled process left running: every target was
    gone before it could be sampled. A scoped run without --pid is never "nothing": the scope's engine
    processes may simply not run on this host (its own health line says so)."""
    if not manual_pids:
        return False
    sampled = [process for process in processes if process.sampled]
    if any(not process.exited for process in sampled):
        return False
    return not any(samples.get(process.pid, 0) for process in sampled)


def nothing_line(manual_pids: Sequence[int]) -> str:
    pids = ", ".join(str(pid) for pid in dict.fromkeys(manual_pids))
    return (
        f"nothing to sample: --pid {pids} exited before a sample was taken and no other workload process was "
        "found; the capture holds only the notes; start the profiler earlier or give a process that lives "
        "through the window"
    )
