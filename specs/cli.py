"""What the command lines share: ``--help`` shows every flag's default; arguments are validated
like file fields (strict ASCII integers and finite numbers within the stated limits); output
paths are checked before any work; JSON output has no NaN or Infinity; an argparse whose
errors are one SpecError line; a TOML file of flags (``--config``) under the command line; the
``hybridpar`` command's name in the usage line of the module it starts."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tomllib
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from specs.errors import SpecError

_INT = re.compile(r"-?[0-9]{1,18}")
_NUMBER = re.compile(r"-?([0-9]{1,18}(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]{1,3})?")
_PROG: ContextVar[str | None] = ContextVar("prog", default=None)


@contextmanager
def invoked_as(prog: str) -> Iterator[None]:
    """Within this block, parsers name themselves ``prog`` (``hybridpar plan``), not the module."""
    token = _PROG.set(prog)
    try:
        yield
    finally:
        _PROG.reset(token)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad argument is a SpecError (one line naming it), not usage text; help
    shows the defaults (HelpFormatter)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        if _PROG.get():
            kwargs["prog"] = _PROG.get()
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


def parse_with_config(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
                      flag: str = "--config") -> argparse.Namespace:
    """``parser.parse_args(argv)`` over the defaults a TOML file named by ``flag`` sets: the
    file's keys are the long flags (``budget_gib`` or ``budget-gib``), and flags on the command
    line win over the file (a repeatable flag adds to the file's values)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument(flag)
    path = vars(pre.parse_known_args(argv)[0])[flag.lstrip("-").replace("-", "_")]
    if path is not None:
        parser.set_defaults(**config_defaults(parser, Path(path), argv))
    return parser.parse_args(argv)


def config_defaults(parser: argparse.ArgumentParser, path: Path, argv: Sequence[str] = ()) -> dict[str, Any]:
    """{dest: value} of the TOML file ``path``, each value checked by the flag's own type and
    choices; keys of a mutually exclusive group that ``argv`` sets are left to ``argv``."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as err:
        raise SpecError("--config", f"cannot read {path}: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise SpecError("config", f"not TOML: {err}", str(path)) from None
    flags = _flags_by_key(parser)
    given = {a for a in flags.values() if any(t == o or t.startswith(o + "=") for t in argv for o in a.option_strings)}
    tokens: list[str] = []
    for key, value in table.items():
        action = flags.get(key.replace("-", "_"))
        if action is None:
            raise SpecError(key, f"unknown key; the keys are {parser.prog}'s flags: {', '.join(sorted(flags))}",
                            str(path))
        if not _left_to_command_line(parser, action, given):
            tokens += _tokens(action, key, value, str(path))
    try:
        parsed = parser.parse_args(tokens)
    except SpecError as err:
        raise err.with_source(str(path)) from None
    return {a.dest: getattr(parsed, a.dest) for a in flags.values() if a.option_strings[-1] in tokens}


def _flags_by_key(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's long flags by name with underscores (help and --config itself left out)."""
    out = {}
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in ("help", "config"):
            for o in longs:
                out[o[2:].replace("-", "_")] = action
    return out


def _left_to_command_line(parser: argparse.ArgumentParser, action: argparse.Action,
                          given: set[argparse.Action]) -> bool:
    """True when the command line sets ``action`` or one it excludes (argparse would refuse both)."""
    if action in given:
        return action.nargs != 0 and not isinstance(action, argparse._AppendAction)
    return any(action in g._group_actions and given & set(g._group_actions)
               for g in parser._mutually_exclusive_groups)


def _tokens(action: argparse.Action, key: str, value: Any, source: str) -> list[str]:
    """The command-line words that set ``action`` to the TOML ``value``."""
    flag = action.option_strings[-1]
    if action.nargs == 0:  # a switch: true sets it, false leaves the default
        if not isinstance(value, bool):
            raise SpecError(key, f"expected true or false, got {value!r}", source)
        return [flag] if value else []
    if isinstance(value, dict):  # [option] galvatron.time_limit_s = 60 -> galvatron.time_limit_s=60
        value = [f"{k}={_text(v)}" for k, v in _dotted(value)]
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [w for item in items for w in (flag, _text(item))]
    if isinstance(value, list):
        if action.nargs in (None, "?"):
            raise SpecError(key, f"takes one value, got the list {value!r}", source)
        return [flag, *map(_text, value)]
    return [flag, _text(value)]


def _dotted(table: dict[str, Any], head: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in table.items():
        out += _dotted(v, f"{head}{k}.") if isinstance(v, dict) else [(f"{head}{k}", v)]
    return out


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        raise SpecError("config", f"expected a number or text, got {value!r}")
    return str(value)


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
