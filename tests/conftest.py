from __future__ import annotations

import pathlib
import sys

import pytest
from support import SHARED

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "infra"))
from fleet import Fleet  # noqa: E402


@pytest.fixture(scope="session")
def shared() -> pathlib.Path:
    assert SHARED.is_dir(), f"{SHARED} is missing: the seed documents live in ../shared beside the checkout"
    return SHARED


@pytest.fixture(scope="module")
def fleet3(tmp_path_factory):
    """Three test hosts reached over SSH (tests/infra/fleet.py)."""
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), 3).up()
    yield fleet
    fleet.down()
