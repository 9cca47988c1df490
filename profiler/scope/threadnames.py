"""Full thread names over time, and how a sample's thread is named in the stacks (pure, no I/O).

The kernel keeps 15 bytes of a thread's name (``comm``); engines name threads after the work they do
and rename them as it changes (Spark: ``Executor task launch worker for task 3.0 in stage 12.0 (TID
56)``, once per task). ``NameHistory`` holds each thread's full names with the time they were set
(seeded from ``jcmd Thread.print`` for threads older than the window, then every rename the uprobe of
profiler/scope/threadwatch.py reports), so a sample is named by the name its thread had at the sample's time.

A name then splits into a stable *kind* (the stacks' root frame: ``Executor task launch worker``) and,
for names that carry a unit of work, a *context* (the full name), kept beside the stacks rather than in
them: distinct stacks must not multiply by task ids. The split rules are engine-neutral data
(``PER_UNIT_NAMES``); only names that change per unit of work need one.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

COMM_BYTES = 15  # the kernel (and HotSpot's os::set_native_thread_name) keep this many bytes of a name

# Names that carry a unit of work: (rule, kind template, expanded with the rule's groups). The kind
# replaces the name in the stacks; the full name becomes the sample's context. Spark's TaskRunner
# renames its pool thread per task; Flink names a task thread "<chain> (<subtask>/<parallelism>)#<attempt>",
# so that the stacks key it by its job vertex (the chain) and the context tells its subtasks apart.
PER_UNIT_NAMES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^Executor task launch worker for task \S+ in stage \S+ \(TID \d+\)$"), "Executor task launch worker"),
    (re.compile(r"^(?P<chain>.+) \(\d+/\d+\)#\d+$"), r"\g<chain>"),
)

THREAD_NAME_MAX = 255  # characters kept of a name, as the uprobe keeps at most 255 bytes (threadwatch.NAME_BYTES)
THREAD_PRINT_MAX_LINE = 4096

# One thread of `jcmd PID Thread.print`: "name" ... nid=0x4b53 (hex up to JDK 18, decimal from JDK 19).
_THREAD_PRINT_LINE = re.compile(r'^"(?P<name>.*)"\s.*?\bnid=(?P<nid>0x[0-9a-fA-F]+|\d+)\b')


def parse_thread_print(text: str) -> dict[int, str]:
    """Thread id (the kernel's tid, ``nid``) → full name, from ``jcmd PID Thread.print`` output."""
    names: dict[int, str] = {}
    for line in text.splitlines():
        if len(line) > THREAD_PRINT_MAX_LINE:
            continue  # a crafted name of kilobytes: the thread keeps its kernel name (and no regex runs long)
        match = _THREAD_PRINT_LINE.match(line)
        if match:
            nid = match.group("nid")
            names[int(nid, 16) if nid.startswith("0x") else int(nid)] = match.group("name")[:THREAD_NAME_MAX]
    return names


def comm_of(name: str) -> bytes:
    """The kernel's comm for a thread given ``name`` (its first 15 bytes)."""
    return name.encode("utf-8", "replace")[:COMM_BYTES]


@dataclass(frozen=True, slots=True)
class ThreadLabel:
    """How a sample's thread appears: ``kind`` is the stacks' root frame; ``context`` the full name when
    it carries a unit of work (None otherwise); ``full`` tells whether the name is more than the comm."""

    kind: str
    context: str | None
    full: bool
    kind_bytes: bytes  # the kind as the stack store keys it


def split_name(name: str) -> tuple[str, str | None]:
    """(kind, context) of a full thread name: a per-unit name gives its rule's kind and itself."""
    for rule, kind in PER_UNIT_NAMES:
        found = rule.match(name)
        if found:
            return found.expand(kind), name
    return name, None


class NameHistory:
    """Full names of the threads of the sampled processes, each with the monotonic time it was set.

    ``renamed`` records a rename seen as it happened; ``seed`` records names read once (jcmd), valid
    from the start unless the thread was renamed before the reading. ``label`` names a sample and
    falls back to the kernel's comm when the full name is unknown or does not agree with the comm (a
    rename missed), except for a name only jcmd gave (see ``_seed_only``): a name is never guessed.
    """

    def __init__(self) -> None:
        self._times: dict[tuple[int, int], list[int]] = {}
        self._names: dict[tuple[int, int], list[str]] = {}
        self._labels: dict[tuple[str | None, bytes, bool], ThreadLabel] = {}
        # Threads named by jcmd only, never renamed since: HotSpot never gives the kernel the name of a
        # thread attached through JNI (the launcher's "main" stays "java"), so their comm may differ.
        self._seed_only: set[tuple[int, int]] = set()
        self.renames = 0

    def renamed(self, tgid: int, tid: int, time_ns: int, name: str) -> None:
        times = self._times.setdefault((tgid, tid), [])
        names = self._names.setdefault((tgid, tid), [])
        self._seed_only.discard((tgid, tid))
        at = bisect.bisect_right(times, time_ns)  # events of one thread arrive in order; this is cheap
        times.insert(at, time_ns)
        names.insert(at, name)
        self.renames += 1

    def seed(self, tgid: int, names: dict[int, str], read_at_ns: int) -> None:
        """Names read at ``read_at_ns``: they hold from the beginning for threads not renamed before then."""
        for tid, name in names.items():
            times = self._times.get((tgid, tid))
            if times and times[0] <= read_at_ns:
                continue  # a rename seen before the reading knows better; earlier samples keep the comm
            if not times:
                self._seed_only.add((tgid, tid))
            self._times.setdefault((tgid, tid), []).insert(0, 0)
            self._names.setdefault((tgid, tid), []).insert(0, name)

    def name_at(self, tgid: int, tid: int, time_ns: int) -> str | None:
        times = self._times.get((tgid, tid))
        if not times:
            return None
        at = bisect.bisect_right(times, time_ns) - 1
        return self._names[(tgid, tid)][at] if at >= 0 else None

    def label(self, tgid: int, tid: int, time_ns: int, comm: bytes) -> ThreadLabel:
        """The thread's kind and context at ``time_ns``; the comm when the full name is unknown or stale."""
        name = self.name_at(tgid, tid, time_ns)
        seed_only = (tgid, tid) in self._seed_only
        cached = self._labels.get((name, comm, seed_only))
        if cached is None:
            if len(self._labels) > 4096:
                self._labels.clear()  # per-unit names never repeat: keep the memo small
            cached = self._labels[(name, comm, seed_only)] = _label(name, comm, seed_only)
        return cached

    def prune(self, before_ns: int) -> None:
        """Forget names replaced before ``before_ns`` (no sample that old is still to come): a thread
        renamed per task keeps one name, not one per task of the window."""
        for key, times in self._times.items():
            keep = bisect.bisect_right(times, before_ns) - 1
            if keep > 0:
                del times[:keep], self._names[key][:keep]

    def threads(self, tgid: int) -> int:
        return sum(1 for key in self._times if key[0] == tgid)

    def forget(self, tgid: int) -> None:
        for key in [key for key in self._times if key[0] == tgid]:
            del self._times[key], self._names[key]
            self._seed_only.discard(key)


def _label(name: str | None, comm: bytes, seed_only: bool) -> ThreadLabel:
    if name is None or (comm_of(name) != comm and not seed_only):
        return ThreadLabel(comm.decode("utf-8", "replace"), None, False, comm)
    kind, context = split_name(name)
    return ThreadLabel(kind, context, True, kind.encode("utf-8", "replace"))
