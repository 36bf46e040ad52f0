"""A pytest plugin: with ``KEEL_TEST_POSTGRES_URL`` set, a PostgreSQL test that skips fails.

``.ci/run`` sets the variable, so CI cannot pass with the PostgreSQL half of the suite
skipped (psycopg missing, a fixture that gave up): the skip is reported as a failure
with its reason. Without the variable, those tests skip as before, saying why. A test
is of the PostgreSQL half when it is marked ``postgres``, uses a PostgreSQL fixture,
is parametrized with the ``postgres`` store backend, or its id names PostgreSQL.

Enable it with ``pytest_plugins = ["keel.testing.postgres_gate"]`` in a conftest, or
``pytest -p keel.testing.postgres_gate``.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

from keel.testing.stores import POSTGRES_URL_ENV

POSTGRES_FIXTURES = frozenset({"postgres_url", "pg_url", "pg_store"})


def postgres_test(item: pytest.Item) -> bool:
    """Whether ``item`` belongs to the PostgreSQL half of the suite."""
    if item.get_closest_marker("postgres") is not None:
        return True
    if set(getattr(item, "fixturenames", ())) & POSTGRES_FIXTURES:
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "postgres" in {str(v) for v in callspec.params.values()}:
        return True
    return "postgres" in item.nodeid.lower()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and os.environ.get(POSTGRES_URL_ENV) and postgres_test(item):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"a PostgreSQL test skipped although {POSTGRES_URL_ENV} is set "
            f"(the PostgreSQL half must run): {reason}"
        )
    return report
