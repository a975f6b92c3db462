"""Atomic file writes: a crash or a full disk leaves the old file or the new one, never half."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsync, os.replace.

    The temporary file is removed if anything fails; the folder must exist.
    """
    path = Path(path)
    # Same folder, so os.replace is a rename on one file system (atomic), never a copy; a
    # unique name, so two writers never share a temporary file; open() keeps the umask's mode.
    tmp_name = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp_name, "x", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any, *, indent: int | None = 1,
                      sort_keys: bool = False) -> None:
    """Write ``obj`` as JSON (ending in a newline) atomically; see atomic_write_text. NaN and
    infinities are refused (ValueError): JSON has none, and readers would take them as garbage."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, allow_nan=False) + "\n")
