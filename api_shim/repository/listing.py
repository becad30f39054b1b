"""Decoding a Kubernetes LIST response one item at a time (pure).

The API server answers a list served from its watch cache (`resourceVersion=0`) whole, whatever the
`limit`: 10,000 Scans are ~20 MB of JSON. Decoding it with one `json.loads` would hold every Scan as
dicts at once (several times the text); `items` hands each element over as it is decoded, so only the
text and one Scan exist at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


class _Cursor:
    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def skip(self) -> str:
        """Skip whitespace; the next character ('' at the end)."""
        self.at = _SPACE.match(self.text, self.at).end()  # type: ignore[union-attr]  # always matches
        return self.text[self.at : self.at + 1]

    def expect(self, char: str) -> None:
        if self.skip() != char:
            raise ValueError(f"expected {char!r} at {self.at} of a list response")
        self.at += 1

    def members(self, end: str) -> Iterator[str | None]:
        """Until `end`: the key of each member of an object (with its ':' read), or None for each
        element of an array; the caller reads the value."""
        first = True
        while self.skip() != end:
            if not first:
                self.expect(",")
            first = False
            if end == "]":
                yield None
                continue
            key = self.value()
            self.expect(":")
            yield key
        self.at += 1

    def value(self) -> Any:
        self.skip()
        found, self.at = _DECODER.raw_decode(self.text, self.at)
        return found


def items(text: str, rest: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Each element of the list object's `items`, decoded as it is reached; the other keys (`metadata`
    with `resourceVersion` and `continue`, `kind`, ...) land in `rest` by the time the iterator ends."""
    cursor = _Cursor(text)
    cursor.expect("{")
    for key in cursor.members("}"):
        if key == "items" and cursor.skip() == "[":
            cursor.at += 1
            for _ in cursor.members("]"):
                yield cursor.value()
        else:
            rest[str(key)] = cursor.value()
