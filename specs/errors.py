"""One error type for bad input: it names the file, the field and the value in one line."""
from __future__ import annotations

import dataclasses
import enum
import functools
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)


class SpecError(ValueError):
    """A malformed or inconsistent model, cluster or plan.

    ``str(err)`` is one line: ``<source>: <field>: <message>``, so a command-line tool
    can print it as is instead of a traceback.
    """

    def __init__(self, field: str, message: str, source: str = "") -> None:
        self.field = field
        self.message = message
        self.source = source
        super().__init__(self._line())

    def _line(self) -> str:
        head = f"{self.source}: " if self.source else ""
        line = f"{head}{self.field}: {self.message}"
        return line.replace("\r", "\\r").replace("\n", "\\n")  # one line whatever the input held

    def with_source(self, source: str) -> "SpecError":
        """The same error, attributed to a file (kept if one is already named)."""
        return SpecError(self.field, self.message, self.source or source)


def require(condition: bool, field: str, message: str) -> None:
    """Raise a SpecError for ``field`` unless ``condition`` holds."""
    if not condition:
        raise SpecError(field, message)


def positive_int(value: object, field: str) -> int:
    """``value`` as an int > 0, or a SpecError naming the field and the value."""
    if type(value) is int and value > 0:  # the common case, checked first: planners build many records
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(field, f"must be a positive integer, got {value!r}")
    return value


def positive_number(value: object, field: str, allow_zero: bool = False) -> float:
    """``value`` as a float > 0 (>= 0 with allow_zero), or a SpecError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and value == value and value != float("inf"):
        if value > 0 or (allow_zero and value == 0):
            return float(value)
    bound = ">= 0" if allow_zero else "> 0"
    raise SpecError(field, f"must be a finite number {bound}, got {value!r}")


def one_of(value: object, choices: tuple, field: str) -> object:
    """``value`` if it is one of ``choices``, else a SpecError listing them."""
    if value not in choices:
        raise SpecError(field, f"must be one of {', '.join(map(str, choices))}; got {value!r}")
    return value


def member(value: object, kind: type[E], field: str) -> E:
    """``value`` as a member of the enum ``kind`` (a member itself, or its value), else a SpecError
    listing the members."""
    if type(value) is kind:
        return value
    try:
        found = _members(kind).get(value)
    except TypeError:  # unhashable: not a member
        found = None
    return kind(one_of(value, tuple(kind), field)) if found is None else found


@functools.lru_cache(maxsize=None)
def _members(kind: type[E]) -> dict:
    """The members of the enum ``kind`` by themselves and by their values."""
    return {**{m.value: m for m in kind}, **{m: m for m in kind}}


def check_fields(cls: type, given: Iterable[str], where: str = "") -> None:
    """A SpecError naming the first key of ``given`` that is not a field of the dataclass
    ``cls``, or the first required field it lacks; ``where`` prefixes the field (``gpu``)."""
    given = set(given)
    init = [f for f in dataclasses.fields(cls) if f.init]
    names = {f.name for f in init}
    prefix = f"{where}." if where else ""
    unknown = sorted(given - names)
    if unknown:
        raise SpecError(prefix + unknown[0], f"unknown field; {cls.__name__} has {', '.join(sorted(names))}")
    required = [f.name for f in init
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [name for name in required if name not in given]
    if missing:
        raise SpecError(prefix + missing[0], f"missing (required by {cls.__name__})")


def read_json(path: "str | Path") -> Any:
    """A JSON file's content through the one strict reader (specs.reader); any problem with
    the file is one SpecError naming it."""
    from specs.reader import read_json_file  # the reader needs SpecError from this module
    return read_json_file(path)


def load_json_with(path: "str | Path", parse: Callable[[Any], T]) -> T:
    """``parse`` applied to a JSON file's content, its errors attributed to the file."""
    raw = read_json(path)
    try:
        return parse(raw)
    except SpecError as err:
        raise err.with_source(str(path)) from None


def one_line_errors(*errors: type[Exception]) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a command-line ``main``: a SpecError (or one of ``errors``) becomes one line
    ``error: ...`` on stderr and exit status 2, never a traceback."""
    caught = (SpecError, *errors)

    def decorate(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def wrapped(*args: Any, **kwargs: Any) -> int:
            try:
                return main(*args, **kwargs)
            except caught as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
        return wrapped
    return decorate
