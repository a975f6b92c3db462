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


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove the temporary files atomic_write_text left in ``folder`` (not below) when its
    writer was killed mid-write (their writer's pid is no longer alive); the paths removed."""
    removed = []
    for path in Path(folder).glob(".*.tmp"):
        parts = path.name.split(".")
        pid = int(parts[-3]) if len(parts) >= 4 and parts[-3].isdigit() else None
        if pid is not None and not _alive(pid):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
