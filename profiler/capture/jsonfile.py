"""A JSON file of a capture, a run or a report, read with one rule: a regular file, UTF-8, valid JSON, each
value of the JSON kind its record's field declares; anything else is a CaptureFormatError naming the file."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..errors import CaptureFormatError
from ..files.textinput import TEXT_ENCODING
from .checks import open_regular


def read_json_file(path: Path, if_missing: str, if_invalid: str, follow: bool = True) -> Any:
    """The JSON of one file of a capture, run or report. A missing or unparsable file, or one that is not
    a regular file (a directory, a FIFO; with ``follow`` False a link), is a CaptureFormatError naming the
    file (and line) followed by the caller's advice."""
    if not os.path.lexists(path):
        raise CaptureFormatError(f"{path}: missing; {if_missing}")
    try:
        with open_regular(path, follow=follow, advice=if_invalid) as handle:
            return json.loads(handle.read().decode(TEXT_ENCODING))  # a BOM is not part of the JSON
    except json.JSONDecodeError as exc:
        raise CaptureFormatError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); {if_invalid}") from None
    except UnicodeDecodeError as exc:
        raise CaptureFormatError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start}); {if_invalid}") from None
    except OSError as exc:
        raise CaptureFormatError(f"{path}: cannot read ({exc.strerror or exc}); {if_missing}") from None


_JSON_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "true/false"),
    (int, "a number"),
    (float, "a number"),
    (str, "a string"),
    (list, "a list"),
    (dict, "an object"),
)


# Field annotations (strings: `from __future__ import annotations`) checked against JSON values;
# containers (tuple[...], Mapping[...]) are converted and checked by the reader that builds them.
_SIMPLE_TYPES: Mapping[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "None": (type(None),),
}


def json_kind(value: Any) -> str:
    return next((name for kind, name in _JSON_KINDS if isinstance(value, kind)), "null")


def expect_json(value: Any, kind: type, path: Path, what: str, advice: str = "re-run the capture") -> Any:
    """``value`` when it is of JSON ``kind`` (dict or list), else a CaptureFormatError naming ``path``."""
    if not isinstance(value, kind):
        wanted = dict((k, n) for k, n in _JSON_KINDS)[kind]
        raise CaptureFormatError(f"{path}: {what} is {json_kind(value)}, expected {wanted}; {advice}")
    return value


def _type_problem(cls: type, payload: Mapping[str, Any]) -> str | None:
    for item in fields(cls):
        names = [part.strip() for part in str(item.type).split("|")]
        if item.name not in payload or not all(name in _SIMPLE_TYPES for name in names):
            continue
        value = payload[item.name]
        allowed = tuple(kind for name in names for kind in _SIMPLE_TYPES[name])
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            return f"{item.name} is {json_kind(value)}, expected {' or '.join(names)}"
    return None


def from_json_object(
    cls: type, payload: Any, path: Path, advice: str = "the capture was written by an incompatible version"
) -> Any:
    """A record dataclass from a JSON object: unknown keys ignored, wrong JSON types a CaptureFormatError."""
    payload = expect_json(payload, dict, path, "a record", advice)
    problem = _type_problem(cls, payload)
    if problem is not None:
        raise CaptureFormatError(f"{path}: {problem}; {advice}")
    known = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in payload.items() if k in known})
    except TypeError as exc:
        raise CaptureFormatError(f"{path}: {exc}; {advice}") from None
