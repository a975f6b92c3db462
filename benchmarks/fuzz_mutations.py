"""Mutations of JSON input files, each labelled: garbage (broken by construction, so it must be
rejected) or plausible (another possibly valid input, which may be accepted if it re-validates).
Used by ``python -m benchmarks.fuzz_inputs`` and by the property tests in tests/specs/test_fuzz.py."""
from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from typing import Any, Callable

Path_ = tuple  # a path into a JSON value: keys and list indices


@dataclass(frozen=True)
class Mutant:
    """One mutated file."""

    data: bytes
    """The file's bytes."""
    garbage: bool
    """Broken by construction: a reader that accepts it accepts garbage."""
    what: str
    """What was done (for the report)."""


@dataclass(frozen=True)
class Format:
    """What counts as garbage in one file format."""

    open_at: Callable[[Path_], bool] = lambda path: False
    """Objects where unknown keys are allowed (read by other tools, ignored by us)."""
    free_at: Callable[[Path_], bool] = lambda path: False
    """Free-form notes: anything under such a path is unread, so no change there is garbage."""
    null_is_missing: bool = False
    """null means 'not given' (Hugging Face configs)."""
    counts: bool = True
    """Integers in the file are counts: a fraction or a 10**12 is garbage (not in number tables)."""


def paths(value: Any, prefix: Path_ = ()) -> list[Path_]:
    """Every path in ``value`` (containers and leaves), the root excluded."""
    out: list[Path_] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        out.append(prefix + (key,))
        out.extend(paths(child, prefix + (key,)))
    return out


def get(value: Any, path: Path_) -> Any:
    for key in path:
        value = value[key]
    return value


def junk_for(orig: Any, fmt: Format, rng: random.Random) -> tuple[Any, bool, str]:
    """A replacement for ``orig`` and whether it is garbage for this field."""
    if isinstance(orig, bool):
        options = [(1, True), (0, True), ("true", True), (not orig, False)] + [(None, not fmt.null_is_missing)]
    elif isinstance(orig, int):
        options = [(True, True), (False, True), ("7", True), ("\u0663", True), (-1, True), (0, False),
                   (10**12, fmt.counts), (10**30, fmt.counts), (2.5, fmt.counts), ([], True), ({}, True),
                   (orig * 2, False), (orig + 1, False), (1, False), (None, not fmt.null_is_missing)]
    elif isinstance(orig, float):
        options = [(True, True), ("abc", True), (-1.0, True), (0, False), (1e30, False), (orig * 2, False),
                   ([], True), (None, not fmt.null_is_missing)]
    elif isinstance(orig, str):
        options = [(123, True), (True, True), ([], True), ("zzz", False), ("", False), ("1,x", False),
                   (None, not fmt.null_is_missing)]
    elif isinstance(orig, list):
        options = [("x", True), (3, True), ({}, True), ([], False), (orig[:-1], False), (orig + orig[-1:], False)]
    else:  # null: an optional field of unknown type, so a small count may be a valid value
        options = [(3, False), ([], True), ("x", True), ({}, False)]
    value, garbage = rng.choice(options)
    return value, garbage, f"= {json.dumps(value)[:30]}"


LEGACY_BOOLEAN_FIELDS = ("sp", "checkpoint")
"""Plan-strategy fields whose old files held booleans (sp true = megatron, checkpoint true = full)."""


def structural(raw: Any, fmt: Format, rng: random.Random) -> tuple[Any, bool, str]:
    """One change to the parsed file: a field set to junk, a key deleted, or an unknown key added."""
    raw = copy.deepcopy(raw)
    all_paths = paths(raw)
    op = rng.choice(("junk", "junk", "junk", "delete", "unknown"))
    if op == "unknown" or not all_paths:
        objects = [()] + [p for p in all_paths if isinstance(get(raw, p), dict)]
        where = rng.choice(objects)
        get(raw, where)["zz_unknown"] = 1
        return raw, not (fmt.open_at(where) or fmt.free_at(where)), f"{_name(where)}.zz_unknown added"
    path = rng.choice(all_paths)
    parent, key = get(raw, path[:-1]), path[-1]
    if op == "delete" and isinstance(parent, dict):
        del parent[key]
        return raw, False, f"{_name(path)} deleted"
    value, garbage, what = junk_for(parent[key], fmt, rng)
    parent[key] = value
    if key in LEGACY_BOOLEAN_FIELDS and isinstance(value, bool):
        garbage = False  # the pre-issue-15 spelling of the field: old plan files must still load
    return raw, garbage and not fmt.free_at(path), f"{_name(path)} {what}"


def _name(path: Path_) -> str:
    return ".".join(str(p) for p in path) or "(top)"


def _numeric_leaf_text(text: str, raw: Any, rng: random.Random, replacement: str) -> str | None:
    """``text`` with one numeric leaf written as ``replacement`` (None if the file has none)."""
    leaves = [p for p in paths(raw) if isinstance(get(raw, p), (int, float)) and not isinstance(get(raw, p), bool)]
    if not leaves:
        return None
    path = rng.choice(leaves)
    marker = "\u0000MARK\u0000"
    doc = copy.deepcopy(raw)
    get(doc, path[:-1])[path[-1]] = marker
    return json.dumps(doc, indent=1).replace(json.dumps(marker), replacement)


def byte_level(raw: Any, rng: random.Random) -> tuple[bytes, bool, str]:
    """The file broken below the JSON level: encoding, truncation, depth, huge or non-finite numbers."""
    text = json.dumps(raw, indent=1)
    op = rng.choice(("utf16", "utf16le", "latin1", "truncate", "deep", "digits", "nan", "inf", "1e999",
                     "duplicate", "empty", "bom"))
    if op == "utf16":
        return text.encode("utf-16"), True, "UTF-16 with BOM"
    if op == "utf16le":
        return text.encode("utf-16-le"), True, "UTF-16-LE without BOM"
    if op == "latin1":
        return text.replace('"', '"\xe9', 1).encode("latin-1", "replace"), True, "latin-1 byte"
    if op == "truncate":
        return text[:rng.randrange(len(text))].encode(), True, "truncated"
    if op == "deep":
        depth = rng.choice((40, 900, 5000))
        return (text[:-1] + f', "zz_deep": {"[" * depth}1{"]" * depth}}}').encode(), True, f"nested {depth} deep"
    if op == "empty":
        return b"", True, "empty file"
    if op == "bom":
        return b"\xef\xbb\xbf" + text.encode(), False, "UTF-8 BOM"
    if op == "duplicate" and isinstance(raw, dict) and raw:
        key = rng.choice(sorted(raw))
        return (text[:-1] + f', {json.dumps(key)}: {{"zz": "different"}}}}').encode(), True, f"duplicate {key}"
    replacement = {"digits": "9" * 5000, "nan": "NaN", "inf": "Infinity", "1e999": "1e999"}.get(op, "NaN")
    changed = _numeric_leaf_text(text, raw, rng, replacement)
    if changed is None:
        return b"\xff" + text.encode(), True, "invalid UTF-8 start byte"
    return changed.encode(), True, f"a number written {replacement[:10]}"


def mutate(raw: Any, fmt: Format, rng: random.Random) -> Mutant:
    """One mutant of ``raw``: mostly structural changes, a quarter of them below the JSON level."""
    if rng.random() < 0.25:
        data, garbage, what = byte_level(raw, rng)
        return Mutant(data, garbage, what)
    doc, garbage, what = structural(raw, fmt, rng)
    return Mutant(json.dumps(doc, indent=1).encode(), garbage, what)
