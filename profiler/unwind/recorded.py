"""Java names as the checkpoint journal saved them, for ``profiler recover`` (pure: no JVM is read).

While the window runs, the namer of each JVM (profiler/unwind/hotspot.py) logs every Method* it names,
per generation, and every compiled frame's chain of Method*s (the inlined ones, then the compiled
method); each checkpoint carries what was learned since the one before. A killed run is rebuilt from
those records alone, so its interpreted and compiled frames are named as the window named them even
when the JVM is gone. What was learned after the last checkpoint stays unnamed, with NOT_SAVED.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .codecache import compiled_at
from .hotspot import APPROXIMATE_MARK, INLINED_MARK, TAG_BITS

NOT_SAVED = "not in the checkpoint journal (named after its last checkpoint, or never)"
_MAX_NAME = 4096  # a name longer than this is damage, not a Java method


@dataclass
class RecordedNames:
    """One JVM's names replayed from its checkpoints: MethodNamer's interface, answered from the records."""

    code_low: int | None = None
    names: dict[int, dict[int, str]] = field(default_factory=dict)  # generation -> Method* -> name
    chains: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)  # (pc, compile id) -> Method*s
    # (pc, compile id) -> bytes to the PcDesc its chain borrowed (journals before issue 51 have none)
    borrowed_at: dict[tuple[int, int], int] = field(default_factory=dict)

    def apply(self, saved: Mapping[str, Any]) -> None:
        """Add one checkpoint's records (``java_names`` of its state, for this JVM); ValueError when damaged."""
        code_low = saved.get("code_low")
        if code_low is not None:
            self.code_low = _uint(code_low)
        for generation, method, name in saved.get("names", ()):
            table = self.names.setdefault(_uint(generation), {})
            if name is None:
                table.pop(_uint(method), None)
            elif isinstance(name, str) and 0 < len(name) <= _MAX_NAME and name.isprintable():
                table[_uint(method)] = name
            else:
                raise ValueError("a saved Java name is not a printable string")
        for pc, compile_id, chain in saved.get("chains", ()):
            self.chains[(_uint(pc), _uint(compile_id))] = tuple(_uint(m) for m in chain)
        for pc, compile_id, distance in saved.get("borrowed", ()):
            self.borrowed_at[(_uint(pc), _uint(compile_id))] = _uint(distance)

    def name(self, method: int, generation: int | None = None) -> str | None:
        return self.names.get(generation or 0, {}).get(method)

    def cause(self, method: int, generation: int | None, default: str) -> str:
        return NOT_SAVED

    def code_name(self, pc: int) -> str | None:
        return None

    def borrowed(self, value: int) -> int:
        if self.code_low is None:
            return 0
        return self.borrowed_at.get(compiled_at(self.code_low, value), 0)

    def compiled_names(self, value: int, generation: int | None = None) -> tuple[int, list[str], str]:
        """As MethodNamer.compiled_names, from the saved chains and names."""
        if self.code_low is None:
            return value & ~TAG_BITS, [], NOT_SAVED
        pc, compile_id = compiled_at(self.code_low, value)
        chain = self.chains.get((pc, compile_id))
        if not chain:
            return pc, [], NOT_SAVED
        outer = self.name(chain[-1], generation)
        if outer is None:
            return pc, [], NOT_SAVED
        inlined = (self.name(method, generation) for method in chain[:-1])
        names = [name + INLINED_MARK for name in inlined if name is not None] + [outer]
        if (pc, compile_id) in self.borrowed_at:
            names[0] += APPROXIMATE_MARK
        return pc, names, ""


def _uint(value: object) -> int:
    if type(value) is not int or not 0 <= value < 1 << 64:
        raise ValueError(f"a saved Java name record holds {value!r} where an address or count belongs")
    return value
