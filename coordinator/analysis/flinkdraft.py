"""A drafted application profile for a Flink run: tasks named after the job's operators (the chains of
flink.json's vertices, split at " -> "), patterns taken from the frames the captured stacks contain
under each vertex's task threads, a "chain, operator unknown" task per vertex for what no operator
claims, then Flink's runtime (network, serialization, task mailbox, waiting, GC, JIT); a job reading
Kafka gets the Kafka tasks of draft.KAFKA_TASKS first (fetch, and record deserialization apart).

Pure: stacks (folded counts of the workload processes) and the vertices in, profile text and the
shares it gives out. The Flink engine side of ``coordinator draft-profile`` (issue 18's command).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence

from coordinator.analysis.draft import KAFKA_TASKS, Draft, kafka_lines
from coordinator.analysis.inputs import RunInput
from profiler.capture.folded import FRAME_SEPARATOR
from profiler.capture.format import UNMATCHED, VertexWindow
from profiler.capture.read import read_flink_vertices
from profiler.engines.flinkmetrics import COMM_LENGTH, vertex_of_thread
from profiler.matching.appprofile import parse_profile
from profiler.matching.matcher import Matcher, candidate_patterns, match_stacks

# Flink's own classes per kind of operator: they name an operator's work when the JIT inlined the
# user's function into them (the YSB demo keeps those frames with -XX:CompileCommand=dontinline).
OPERATOR_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("source", ("org.apache.flink.streaming.api.operators.SourceOperator", "org.apache.flink.connector.datagen",
                "org.apache.flink.connector.base.source.reader", "org.apache.flink.connector.kafka.source",
                "org.apache.flink.api.connector.source",
                # the source operator's own watermark generation (periodic, from the mailbox)
                "org.apache.flink.streaming.api.operators.source.",
                # drives the source operator's emitNext, which the JIT often inlines into it
                "org.apache.flink.streaming.runtime.io.StreamTaskSourceInput")),
    ("window", ("org.apache.flink.streaming.runtime.operators.windowing",)),
    ("sink", ("org.apache.flink.streaming.runtime.operators.sink", "org.apache.flink.streaming.api.functions.sink")),
)
RUNTIME: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Network (Flink shuffle)", ("org.apache.flink.runtime.io.network", "org.apache.flink.shaded.netty4",
                                 "re:^Flink Netty")),
    ("Serialization", ("org.apache.flink.api.common.typeutils", "org.apache.flink.api.java.typeutils.runtime",
                       "org.apache.flink.core.memory.DataOutputSerializer")),
    ("Task runtime (mailbox, StreamTask)", ("org.apache.flink.streaming.runtime.tasks",
                                            "org.apache.flink.runtime.taskmanager.Task::")),
    ("Wait", ("LockSupport::park", "Unsafe::park", "Object::wait", "Thread::sleep", "futex_wait")),
    ("GC", ("re:^GC Thread", "re:^G1 ", "VM Thread")),
    ("JIT compiler", ("re:^C1 CompilerThre", "re:^C2 CompilerThre", "CompileBroker")),
)
OTHER_TASK = "Other threads"
OPERATOR_UNKNOWN = "chain, operator unknown"  # samples of a chain that no operator of it claims
MAILBOX_WAIT = "chain, mailbox wait"  # the task thread taking mail (waiting for input), in no operator
OTHER_MIN_SHARE = 0.002  # a thread joins "Other threads" once it holds 0.2 % of the samples
_JAVA_CLASS = re.compile(r"^(?:[\w$]+[./])+(?P<cls>[\w$]+)::[\w$<>]+(?: \[(?:i|inlined)\])?$")
# How a chain's operators are entered: the task calls the head's, each operator calls the next one's
# through Flink's ChainingOutput, so the k-th of these frames from the root is the chain's k-th operator
# (also when the JIT inlined them: the walker expands inlined frames). A method that calls its
# superclass's (an override's ``super.processWatermark``) is one entry, not two.
_OPERATOR_ENTRY = re.compile(
    r"^org\.apache\.flink\.(?:streaming\.api|streaming\.runtime|table\.runtime)\.operators\.[\w$.]+"
    r"::(?P<method>processElement[12]?|processWatermark[12]?|emitNext)(?: \[(?:i|inlined)\])?$"
)
# The task reading its head operator's input (network buffers, record deserialization, the watermark
# valve, the source reader's driver) before any operator is entered.
TASK_INPUT = "org.apache.flink.streaming.runtime.io."
# The task thread taking its next mail or waiting for one (input, a timer), in no operator.
TASK_MAILBOX = "org.apache.flink.streaming.runtime.tasks.mailbox.TaskMailboxImpl::"
_USER_PACKAGES = ("org.apache.flink.", "java.", "jdk.", "sun.", "scala.")


def operators_of(chain: str) -> list[str]:
    """"Source: GenSource -> ToKeyed" → ["Source: GenSource", "ToKeyed"]."""
    return [part.strip() for part in chain.split(" -> ") if part.strip()]


def operator_task_name(operator: str) -> str:
    return operator.replace(": ", " - ").replace(",", " ")  # ": " would end the task name


def _tokens(operator: str) -> list[str]:
    """What an operator's user function class is likely named after, lower case: "Source: YSB generator"
    → ["ysbgenerator", "generator"] (the name without its kind prefix, and its longer words)."""
    name = operator.split(": ", 1)[-1]
    words = [w.lower() for w in re.findall(r"[A-Za-z0-9]+", name) if len(w) >= 4]
    joined = re.sub(r"\W", "", name).lower()
    return list(dict.fromkeys([joined, *words])) if joined else words


def _named_like(simple: str, tokens: Sequence[str]) -> bool:
    simple = simple.lower()
    return any(token in simple or (len(simple) > 3 and simple in token) for token in tokens)


def _user_classes(frames: Mapping[str, int]) -> dict[str, str]:
    """Simple class name → the frame prefix naming it (``pkg.Outer$Inner``), for the job's own classes."""
    found: dict[str, str] = {}
    for frame in frames:
        match = _JAVA_CLASS.match(frame)
        if match is None or frame.replace("/", ".").startswith(_USER_PACKAGES):
            continue
        qualified = frame.split("::", 1)[0].replace("/", ".")
        found.setdefault(match["cls"].rsplit("$", 1)[-1], qualified)
    return found


def _kind_of(operator: str, index: int) -> str | None:
    if index == 0 and operator.startswith("Source"):
        return "source"
    if operator.endswith((": Writer", ": Committer")) or "sink" in operator.lower():
        return "sink"
    return "window" if "window" in operator.lower() else None


def _kind_patterns(kind: str, frames: Mapping[str, int]) -> list[str]:
    patterns = dict(OPERATOR_KINDS)[kind]
    return [p for p in patterns if any(p.replace("/", ".") in f.replace("/", ".") for f in frames)]


def operator_patterns(chain: str, frames: Mapping[str, int]) -> list[tuple[str, list[str]]]:
    """Each operator of the chain with its patterns: the job's classes named like it, and Flink's
    classes of its kind. A kind whose classes are in the stacks but that no operator's name gives
    (a window operator named after the user's function, "CampaignProcessor") goes to the first
    operator that found nothing else, else to the first operator without a kind of its own."""
    classes = _user_classes(frames)
    found = []
    for index, operator in enumerate(operators_of(chain)):
        tokens = _tokens(operator)
        patterns = [q for simple, q in sorted(classes.items()) if _named_like(simple, tokens)]
        kind = _kind_of(operator, index)
        found.append((operator, patterns + (_kind_patterns(kind, frames) if kind else [])))
    named = {_kind_of(op, i) for i, op in enumerate(operators_of(chain))}
    for kind, _patterns in OPERATOR_KINDS:
        present = _kind_patterns(kind, frames)
        empty = next((i for i, (_op, patterns) in enumerate(found) if not patterns), None)
        if empty is None:
            empty = next((i for i, op in enumerate(operators_of(chain)) if _kind_of(op, i) is None), None)
        if kind not in named and present and empty is not None and kind != "source":
            found[empty] = (found[empty][0], found[empty][1] + present)
    return found


def operator_position(frames: Sequence[str]) -> tuple[int, int | None]:
    """(how many operators of the chain the stack entered, index of the innermost entry frame), frames
    root first; (0, None) when no operator was entered."""
    depth, last, previous = 0, None, ""
    for index, frame in enumerate(frames):
        entry = _OPERATOR_ENTRY.match(frame)
        method = entry["method"] if entry else ""
        if method and method != previous:
            depth, last = depth + 1, index
        previous = method
    return depth, last


def frames_by_vertex(stacks: Mapping[str, int], names: Sequence[str]) -> dict[str, Counter[str]]:
    found: dict[str, Counter[str]] = {name: Counter() for name in names}
    for stack, count in stacks.items():
        frames = stack.split(FRAME_SEPARATOR)
        vertex = vertex_of_thread(frames[0], names)
        if vertex is not None:
            for frame in set(frames[1:]):
                found[vertex][frame] += count
    return found


def _thread_pattern(chain: str) -> str:
    """Matches the vertex's task threads by name: the chain (the stacks' root frame when the full name
    was known), the full "<chain> (i/n)#a" or the kernel's 15 bytes of it."""
    if len(chain) >= COMM_LENGTH:
        return "re:^" + re.escape(chain[:COMM_LENGTH])
    return "re:^" + re.escape(chain) + r"(?: \(| ?$)"


def escape_pattern(pattern: str) -> str:
    return pattern.replace(",", "\\,")


def draft_lines(stacks: Mapping[str, int], vertices: Sequence[VertexWindow]) -> list[str]:
    """The profile's task lines: operators (innermost first within a chain, so that leaf-first
    matching gives a sample to the deepest operator on its stack), each vertex's chain, the runtime."""
    chains = list(dict.fromkeys(v.name for v in sorted(vertices, key=lambda v: not v.source)))
    by_vertex = frames_by_vertex(stacks, chains)
    all_frames = Counter(f for stack in stacks for f in stack.split(FRAME_SEPARATOR))
    # Kafka first: its reader's frames are also the source operator's kind, and the first line wins a frame
    lines = kafka_lines(all_frames)
    claimed = {pattern for _name, patterns in KAFKA_TASKS for pattern in patterns}
    for chain in chains:
        for operator, found in operator_patterns(chain, by_vertex[chain]):
            patterns = [p for p in found if p not in claimed]
            claimed.update(patterns)
            if patterns:
                lines.append(f"{operator_task_name(operator)}: {', '.join(escape_pattern(p) for p in patterns)}")
    for name, runtime_patterns in RUNTIME:
        present = [p for p in runtime_patterns if any(_hits(p, frame) for frame in all_frames)]
        if present:
            lines.append(f"{name}: {', '.join(escape_pattern(p) for p in present)}")
    # Last in the profile and at the stack's root: what no operator or runtime frame above claims.
    lines += [f"{operator_task_name(chain)} ({OPERATOR_UNKNOWN}): {_thread_pattern(chain)}" for chain in chains]
    return lines


def _hits(pattern: str, frame: str) -> bool:
    if pattern.startswith("re:"):
        return re.search(pattern[3:], frame) is not None
    return pattern.replace("/", ".") in frame.replace("/", ".")


def _other_line(stacks: Mapping[str, int], lines: Sequence[str]) -> str | None:
    """The threads (by name) of the stacks the other tasks leave unmatched, each above OTHER_MIN_SHARE."""
    if not lines:
        return None
    unmatched = match_stacks(Matcher(parse_profile("\n".join(lines) + "\n", "<draft>")), stacks).unmatched
    total = sum(stacks.values())
    threads: Counter[str] = Counter()
    for stack, count in unmatched.items():
        threads[stack.split(FRAME_SEPARATOR, 1)[0]] += count
    kinds: Counter[str] = Counter()
    for name, count in threads.items():  # "flink-metrics-5" and "flink-metrics-12" are one kind
        kinds[r"\d+".join(re.escape(part) for part in re.split(r"\d+", name))] += count
    kept = [kind for kind, count in kinds.most_common() if total and count / total >= OTHER_MIN_SHARE]
    return f"{OTHER_TASK}: {', '.join(escape_pattern('re:^' + kind) for kind in kept)}" if kept else None


def draft_flink_profile(stacks: Mapping[str, int], vertices: Sequence[VertexWindow], source: str) -> Draft:
    """The draft for ``stacks`` (workload processes, all hosts) of a run whose flink.json lists ``vertices``."""
    lines = draft_lines(stacks, vertices)
    other = _other_line(stacks, lines)
    lines += [other] if other else []
    header = [
        f"# Drafted by coordinator draft-profile from {source}: tasks named after the Flink job's operators.",
        "# Operators inside one chain run in one thread; a sample goes to the innermost operator whose",
        "# frames are on its stack, else to the chain. Edit the patterns (docs/matching.md).",
    ]
    text = "\n".join(header + lines) + "\n"
    profile = parse_profile(text, "<draft>")
    result = match_stacks(Matcher(profile), stacks)
    total = sum(stacks.values())
    shares = [(task, result.task_samples.get(task, 0)) for task in (*profile.task_names, UNMATCHED)]
    return Draft(
        text, profile, tuple((task, n, n / total if total else 0.0) for task, n in shares),
        tuple(candidate_patterns(result.unmatched, 10)), total,
    )


def flink_vertices_of(run: RunInput) -> tuple[VertexWindow, ...]:
    """The job vertices of a run (flink.json of the host whose JobManager answered), empty for other
    engines: ``coordinator draft-profile`` drafts with ``draft_flink_profile`` when there are some."""
    for host in run.hosts:
        if host.capture_dir is not None:
            vertices = read_flink_vertices(host.capture_dir)
            if vertices:
                return vertices
    return ()
