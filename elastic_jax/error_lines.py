"""The `error:` lines a user reads: one line each, of a bounded length.

A message may quote what the user wrote (a path, a pattern, a value); a new user's trial put a 5 MB string in
the trainer's config and got a 5,000,129-byte error line. Every `error:` line the CLI and the controller print
goes through `clip`.
"""

from __future__ import annotations

MAX_CHARS = 1000
"""Characters of an error line kept; the rest is counted, not shown (a message itself is well under this)."""


def clip(message: str, limit: int = MAX_CHARS) -> str:
    """`message` cut to `limit` characters, saying how many more there were: `...<N more characters>`."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}...<{len(message) - limit} more characters>"
