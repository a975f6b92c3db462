"""The one reader of every JSON input file: strict UTF-8, bounded size, depth and integers,
finite numbers only, no duplicate keys. Every problem is one SpecError naming the file."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from specs.errors import SpecError
from specs.limits import MAX_FILE_BYTES, MAX_INT_DIGITS, MAX_JSON_DEPTH

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def read_json_file(path: str | Path) -> Any:
    """The content of the JSON file at ``path``, or a SpecError naming the file and what is wrong."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise SpecError("(file)", f"cannot read: {err.strerror or err}", str(path)) from None
    try:
        return parse_json_bytes(data)
    except SpecError as err:
        raise err.with_source(str(path)) from None


def parse_json_bytes(data: bytes) -> Any:
    """Parse JSON bytes under the stated limits (see specs.limits)."""
    if len(data) > MAX_FILE_BYTES:
        raise SpecError("(file)", f"larger than the limit of {MAX_FILE_BYTES:,} bytes")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data:
        raise SpecError("(encoding)", "looks like UTF-16; save the file as UTF-8")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError("(encoding)", f"not UTF-8 (byte {data[err.start]:#04x} at offset {err.start})") from None
    return parse_json_text(text.removeprefix("\ufeff"))


def parse_json_text(text: str) -> Any:
    """Parse JSON text: depth, integer length, finiteness and duplicate keys checked."""
    _check_depth(text)
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_Refused,
                           object_pairs_hook=_object)
    except json.JSONDecodeError as err:
        raise SpecError("(json)", f"line {err.lineno} column {err.colno}: {err.msg}") from None
    _refuse_marked(value, "")
    return value


class _Refused:
    """A number the reader refuses, kept in place until the walk below can name its field."""

    def __init__(self, text: str, why: str = "") -> None:
        self.text = text
        self.why = why or f"{text} is not a finite number (JSON has no {text})"


def _refuse_marked(value: Any, field: str) -> None:
    if isinstance(value, _Refused):
        raise SpecError(field or "(top level)", value.why)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        _refuse_marked(child, f"{field}[{key}]" if isinstance(key, int) else f"{field}.{key}".lstrip("."))


def _check_depth(text: str) -> None:
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRINGS.sub('""', text)):
        depth += 1 if match.group() in "[{" else -1
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            raise SpecError("(json)", f"nested deeper than the limit of {MAX_JSON_DEPTH} levels")


def _int(digits: str) -> "int | _Refused":
    n = len(digits.lstrip("-"))
    if n > MAX_INT_DIGITS:
        return _Refused(digits, f"an integer of {n} digits exceeds the limit of {MAX_INT_DIGITS}")
    return int(digits)


def _float(text: str) -> "float | _Refused":
    value = float(text)
    return value if math.isfinite(value) else _Refused(text, f"number {text[:40]} is too large to be finite")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SpecError(key, "duplicate key (the last one would silently win)")
        out[key] = value
    return out
