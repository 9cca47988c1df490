"""A BPF program's C text with its compile-time values: one ``#define NAME value`` line each, before the source."""

from __future__ import annotations

from collections.abc import Mapping


def with_defines(values: Mapping[str, object], source: str) -> str:
    """``source`` preceded by ``#define NAME value`` for each of ``values``, in their order."""
    return "".join(f"#define {name} {value}\n" for name, value in values.items()) + source
