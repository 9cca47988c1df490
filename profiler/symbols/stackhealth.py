"""What one named user stack counts (UserStack, kept by the StackFolder per distinct stack) and the sums of a
process's samples the health panel reports (StackHealth: SamplerStats' fields)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(slots=True)
class UserStack:
    """One distinct user stack as the folder named it: what it adds to the health counts per sample."""

    lost: bool = False  # the walk failed: no frames (its frames are its values' records in the folder)
    named_in: int = 0  # the folder's epoch serial in which its values were last checked (StackFolder._user_stack)
    # once interned (StackFolder.stack_id): the first table stack holding it and its frames there (from 1)
    ids: tuple[int, int] | None = None
    truncated: bool = False
    unwalkable: bool = False
    interpreted_only: bool = False
    java_frames: int = 0
    unresolved: int = 0
    interpreted: int = 0  # interpreter frames (walker only)
    interpreted_named: int = 0
    unnamed: dict[str, int] | None = None  # cause -> interpreter frames left unnamed
    cut: str | None = None  # why the stack does not reach a thread's start (None: it does, or unknown)
    compiled: int = 0  # compiled frames the walker stored with their compile id
    compiled_named: int = 0  # named from the JVM's nmethod (vmStructs)
    compiled_perf_map: int = 0  # named by the perf map instead
    compiled_unnamed: dict[str, int] | None = None  # cause -> frames
    compiled_approximate: int = 0  # named from a PcDesc borrowed after the pc (APPROXIMATE_MARK)
    approximate_bytes: int = 0  # their distances to it


class StackHealth:
    """The health counts of one process's samples, each stack's counts added ``count`` times."""

    def __init__(self) -> None:
        self.counts = {
            "lost_user_stack": 0,
            "lost_kernel_stack": 0,
            "truncated": 0,
            "java_unwalkable": 0,
            "interpreted_only": 0,
            "java_frames": 0,
            "java_frames_unresolved": 0,
            "interpreted_frames": 0,
            "interpreted_named": 0,
            "compiled_frames": 0,
            "compiled_named": 0,
            "compiled_perf_map": 0,
            "compiled_samples": 0,
            "compiled_approximate": 0,
            "approximate_bytes": 0,
        }
        self.interpreted_unnamed: Counter[str] = Counter()
        self.compiled_unnamed: Counter[str] = Counter()
        self.stacks_cut: Counter[str] = Counter()

    @property
    def fields(self) -> dict[str, object]:
        """The SamplerStats fields counted so far."""
        return {
            **self.counts,
            "interpreted_unnamed": dict(self.interpreted_unnamed),
            "compiled_unnamed": dict(self.compiled_unnamed),
            "stacks_cut": dict(self.stacks_cut),
        }

    def add(self, user: UserStack, kernel_names: list[str] | None, kernel_truncated: bool, count: int) -> None:
        """Add one stack's ``count`` samples to the health counts."""
        counts = self.counts
        if user.lost:
            counts["lost_user_stack"] += count
        if kernel_names is None:
            counts["lost_kernel_stack"] += count
        if user.truncated or kernel_truncated:
            counts["truncated"] += count
        if user.unwalkable:
            counts["java_unwalkable"] += count
        if user.interpreted_only:
            counts["interpreted_only"] += count
        counts["java_frames"] += user.java_frames * count
        counts["java_frames_unresolved"] += user.unresolved * count
        counts["interpreted_frames"] += user.interpreted * count
        counts["interpreted_named"] += user.interpreted_named * count
        for cause, frames in (user.unnamed or {}).items():
            self.interpreted_unnamed[cause] += frames * count
        counts["compiled_frames"] += user.compiled * count
        counts["compiled_named"] += user.compiled_named * count
        counts["compiled_perf_map"] += user.compiled_perf_map * count
        if user.compiled_named:  # per sample: only its leaf-most compiled frame can be approximate
            counts["compiled_samples"] += count
            if user.compiled_approximate:
                counts["compiled_approximate"] += count
                counts["approximate_bytes"] += user.approximate_bytes * count
        for cause, frames in (user.compiled_unnamed or {}).items():
            self.compiled_unnamed[cause] += frames * count
        if user.cut is not None:
            self.stacks_cut[user.cut] += count
