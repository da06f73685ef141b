"""The VM test bed's fixture (tests/vm/bed.py): one storage VM and one client VM for the storage tests (module scope)."""

from __future__ import annotations

import pytest
from bed import Bed


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    bed = Bed(tmp_path_factory.mktemp("vm"))
    try:
        yield bed.up()
    finally:
        bed.down()
