"""Checks every front end (the native server, the Ray router) applies to a parsed JSON request body
before it reads any field.

Python's JSON parser is lenient in two ways that break the first component re-encoding the body far
from the client: it accepts `NaN` / `Infinity` (not JSON; httpx's strict encoder refuses them, and a
NaN temperature slips through every range check), and a `\\ud800` escape decodes to a lone surrogate,
a `str` that cannot be encoded as UTF-8 (the tokenizer and httpx raise). `find_invalid` finds the
first such value anywhere in the body and names it by its path (`prompt`, `messages[0].content`).
Standard library only.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

LABEL_CHARS = 40   # longest key shown in a path


def _valid_text(s: str) -> Optional[int]:
    """None when `s` is valid Unicode, else the index of its first lone surrogate."""
    try:
        s.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return e.start


def _label(key: str) -> str:
    """A key as it may appear in an error message (valid Unicode, short)."""
    shown = key.encode("utf-8", "backslashreplace").decode("utf-8")
    return shown if len(shown) <= LABEL_CHARS else shown[:LABEL_CHARS] + "..."


def find_invalid(body: Any) -> Optional[Tuple[str, str]]:
    """(path, problem) of the first value JSON cannot carry, in document order, or None.

    path is e.g. "temperature" or "messages[1].content" (empty for the body itself); problem is
    a short sentence ("must be a finite number, got nan"). Iterative: any nesting depth."""
    stack = [("", body)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            at = _valid_text(v)
            if at is not None:
                return path, f"not valid Unicode (a lone surrogate at character {at})"
        elif isinstance(v, float):
            if not math.isfinite(v):
                return path, f"must be a finite number, got {v}"
        elif isinstance(v, dict):
            items = []
            for k, x in v.items():
                name = _label(k) if isinstance(k, str) else str(k)
                sub = f"{path}.{name}" if path else name
                if isinstance(k, str) and _valid_text(k) is not None:
                    return sub, "field name is not valid Unicode (a lone surrogate)"
                items.append((sub, x))
            stack.extend(reversed(items))
        elif isinstance(v, list):
            stack.extend(reversed([(f"{path}[{i}]", x) for i, x in enumerate(v)]))
    return None


def field_of(path: str) -> str:
    """The top-level field a path belongs to ("messages[0].content" -> "messages")."""
    for i, c in enumerate(path):
        if c in ".[":
            return path[:i]
    return path
