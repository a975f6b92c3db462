"""What the command lines share: ``--help`` shows every flag's default; arguments are validated
like file fields (strict ASCII integers and finite numbers within the stated limits); output
paths are checked before any work; JSON output has no NaN or Infinity; an argparse whose
errors are one SpecError line."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable

from specs.errors import SpecError

_INT = re.compile(r"-?[0-9]{1,18}")
_NUMBER = re.compile(r"-?([0-9]{1,18}(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]{1,3})?")


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad argument is a SpecError (one line naming it), not usage text; help
    shows the defaults (HelpFormatter)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        field, _, rest = message.partition(": ")
        if not rest:
            field, rest = "(arguments)", message
        raise SpecError(field.removeprefix("argument ").split("/")[0], rest)


def count(limit: int, minimum: int = 1) -> Callable[[str], int]:
    """argparse type: an integer written in ASCII digits, in [minimum, limit]."""
    def parse(text: str) -> int:
        if not _INT.fullmatch(text):
            raise argparse.ArgumentTypeError(f"expected an integer in ASCII digits, got {text!r}")
        value = int(text)
        if not minimum <= value <= limit:
            raise argparse.ArgumentTypeError(f"must be in [{minimum}, {limit:,}], got {value}")
        return value
    parse.__name__ = "integer"
    return parse


def number(low: float = 0.0, high: float = 1e12, low_open: bool = True) -> Callable[[str], float]:
    """argparse type: a finite decimal number in (low, high] (or [low, high] with low_open=False)."""
    def parse(text: str) -> float:
        if not _NUMBER.fullmatch(text):
            raise argparse.ArgumentTypeError(f"expected a finite decimal number, got {text!r}")
        value = float(text)
        if not (value > low if low_open else value >= low) or value > high or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be in {'(' if low_open else '['}{low:g}, {high:g}], got {text}")
        return value
    parse.__name__ = "number"
    return parse


def output_file(path: str | Path | None, field: str) -> None:
    """Fail now, not after the work, if ``path`` cannot be written as a file."""
    if path is None:
        return
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise SpecError(field, f"{path} is a folder, expected a file name")
    if not parent.is_dir():
        raise SpecError(field, f"{parent} is not a folder" if parent.exists() else f"folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise SpecError(field, f"folder {parent} is not writable")


def output_dir(path: str | Path | None, field: str) -> None:
    """Create the output folder ``path`` now (or fail with one line) so the work's results land."""
    if path is None:
        return
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SpecError(field, f"cannot create folder {path}: {err.strerror or err}") from None
    if not os.access(path, os.W_OK):
        raise SpecError(field, f"folder {path} is not writable")


def finite(obj: Any, field: str = "") -> Any:
    """``obj``, checked to hold no NaN or infinite float (JSON has none): such a number is a
    ValueError naming where it is, never written as null or 0.0 (a "not known" is None at its
    source)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"{field or '(top level)'}: {obj!r} cannot be written as JSON")
    if isinstance(obj, dict):
        return {k: finite(v, f"{field}.{k}".lstrip(".")) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v, f"{field}[{i}]") for i, v in enumerate(obj)]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps of ``obj`` after ``finite`` checked it: no NaN or infinity is written."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and appends ``(default: X)`` to every flag that has
    a default worth showing (not None, False or empty, not already in the help text)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or not action.option_strings or _nothing(default):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else "%(default)s"
        return f"{text} (default: {shown})"



def _nothing(default: object) -> bool:
    # identity, not ==: a default of 0 is worth showing, False (a store_true flag) is not
    return default is None or default is False or default is argparse.SUPPRESS or default in ([], ())
