"""YSB's deserialize, filter and projection as plain Python functions, run as one Python UDF by PySpark's
workers (coordinator demo --udf python): the user's own Python code beside the JVM's tasks.

No pyspark here: the workers import this module by name (the UDF is pickled by reference), and the
application profile names its functions (``pyudfs.parse_event``) from the Python frames on the workers'
stacks; each step is a function of its own so that each is a frame.
"""

from __future__ import annotations

import json
from typing import Any

# coordinator demo --udf: YSB's deserialize, filter and projection as SQL expressions or as this module's
# Python UDF (pipeline.python_views); pandas UDFs would need pandas and pyarrow, which the venv lacks.
UDFS = ("sql", "python")


def parse_event(value: str) -> dict[str, Any]:
    """Deserialize: one YSB event's JSON text into a dict."""
    event: dict[str, Any] = json.loads(value)
    return event


def is_view(event: dict[str, Any]) -> bool:
    """Filter: YSB keeps the view events only."""
    return event.get("event_type") == "view"


def project(event: dict[str, Any]) -> tuple[str, int]:
    """Projection: (ad_id, event_time in epoch ms)."""
    return str(event["ad_id"]), int(event["event_time"])


def view_of(value: str) -> tuple[str, int] | None:
    """The UDF: a view event's (ad_id, event_time), None for the other events (filtered out after it)."""
    event = parse_event(value)
    return project(event) if is_view(event) else None
