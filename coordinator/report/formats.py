"""Numbers as the report shows them: SI prefixes, shares with intervals, bytes; "—" for not measured."""

from __future__ import annotations


def format_si(value: float | None, unit: str = "") -> str:
    """1234567 → "1.23 M"; None → "—" (not measured, never 0)."""
    if value is None:
        return "—"
    magnitude = abs(value)
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= factor:
            return f"{value / factor:.3g} {prefix}{unit}".rstrip()
    if float(value).is_integer():
        return f"{int(value)} {unit}".rstrip()
    return f"{value:.3g} {unit}".rstrip()


def format_share(share: float | None, ci: float | None = None) -> str:
    if share is None:
        return "—"
    text = f"{share * 100:.1f} %"
    if ci is not None and ci > 0:
        text = f"{share * 100:.1f} ± {ci * 100:.1f} %"
    return text


def format_number(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "—"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def format_bytes(size: int) -> str:
    for factor, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} B"
