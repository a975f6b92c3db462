"""Shared test fixtures: where the read-only shared/ folder is."""
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.exists():
        pytest.skip(f"shared reference folder not found at {SHARED}")
    return SHARED
