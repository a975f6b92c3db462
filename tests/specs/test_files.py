"""Atomic writes: the whole new file or the old one, and no temporary file left behind."""
import json

import pytest

from specs.files import atomic_write_json, atomic_write_text


def test_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")
    with pytest.raises(TypeError):
        atomic_write_text(path, b"not text")  # type: ignore[arg-type]
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_json_round_trips_and_ends_in_a_newline(tmp_path):
    path = tmp_path / "a.json"
    atomic_write_json(path, {"b": [1, 2], "a": 1.5}, sort_keys=True)
    text = path.read_text()
    assert text.endswith("}\n") and text.index('"a"') < text.index('"b"')
    assert json.loads(text) == {"b": [1, 2], "a": 1.5}
