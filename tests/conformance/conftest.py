"""The Store contract runs once per backend registered in keel.testing.stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.store.base import Store
from keel.testing.stores import STORE_BACKENDS


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with STORE_BACKENDS[request.param](tmp_path) as backend:
        yield backend
