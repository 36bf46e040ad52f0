"""The Store contract runs once per backend registered in keel.testing.stores.

The PostgreSQL half needs KEEL_TEST_POSTGRES_URL (``.ci/run`` exports it); without
it those tests are skipped with that reason, shown in the summary (``-ra``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.store.base import Store
from keel.testing.stores import STORE_BACKENDS, postgres_unavailable


@pytest.fixture(params=sorted(STORE_BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "postgres" and (reason := postgres_unavailable()):
        pytest.skip(f"PostgreSQL store not tested: {reason}")
    with STORE_BACKENDS[request.param](tmp_path) as backend:
        yield backend
