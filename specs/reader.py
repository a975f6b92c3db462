"""The one reader of every JSON input file: strict UTF-8, bounded size, depth and integers,
finite numbers only, no duplicate keys. Every problem is one SpecError naming the file."""
from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from specs.errors import SpecError
from specs.limits import MAX_FILE_BYTES, MAX_INT_DIGITS, MAX_JSON_DEPTH

_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}:,]', re.DOTALL)


def read_json_file(path: str | Path) -> Any:
    """The content of the JSON file at ``path``, or a SpecError naming the file and what is wrong."""
    path = Path(path)
    try:
        data = _read_regular(path)
    except OSError as err:
        raise SpecError("(file)", f"cannot read: {err.strerror or err}", str(path)) from None
    try:
        return parse_json_bytes(data)
    except SpecError as err:
        raise err.with_source(str(path)) from None


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def _read_regular(path: Path) -> bytes:
    """The first MAX_FILE_BYTES + 1 bytes of a regular file. Opened without blocking and checked
    with fstat before any read: a FIFO or a device would block or never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise SpecError("(file)", f"is {kind}, not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)


def _encoding_problem(data: bytes) -> str | None:
    """Why ``data`` is not UTF-8 text, judged from its NUL bytes and byte-order marks."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "starts with a UTF-16 byte-order mark; save the file as UTF-8"
    zero = data.find(b"\x00")
    if zero < 0:
        return None
    head = data[:64]
    # UTF-16 text that is mostly ASCII has a NUL in every other byte and none in the others
    odd, even = head[1::2], head[0::2]
    if len(head) >= 4 and (odd.count(0) == len(odd) and 0 not in even or even.count(0) == len(even) and 0 not in odd):
        return "looks like UTF-16 (a NUL in every other byte); save the file as UTF-8"
    return f"a NUL byte at offset {zero}: a binary file, not JSON text"


def parse_json_bytes(data: bytes) -> Any:
    """Parse JSON bytes under the stated limits (see specs.limits)."""
    if len(data) > MAX_FILE_BYTES:
        raise SpecError("(file)", f"larger than the limit of {MAX_FILE_BYTES:,} bytes")
    problem = _encoding_problem(data)
    if problem:
        raise SpecError("(encoding)", problem)
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
    """Refuse nesting past the limit before json.loads recurses, naming the path to the deep
    value (``a.b[3].c``): keys and list positions are tracked from a scan of the tokens."""
    stack: list[list] = []  # per open container: [is_list, key or index]
    last = ""
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            if len(stack) == MAX_JSON_DEPTH:
                raise SpecError(_path(stack) or "(top level)",
                                f"nested deeper than the limit of {MAX_JSON_DEPTH} levels")
            stack.append([token == "[", 0 if token == "[" else ""])
        elif token in "]}":
            stack = stack[:-1]
        elif token == "," and stack and stack[-1][0]:
            stack[-1][1] += 1
        elif token == ":" and stack and last.startswith('"'):
            stack[-1][1] = last[1:-1][:40]
        last = token


def _path(stack: list[list]) -> str:
    parts = [f"[{key}]" if is_list else f".{key}" for is_list, key in stack]
    return "".join(parts).lstrip(".")


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
