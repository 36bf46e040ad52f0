"""Every test starts with no model credentials and no Keel settings from the caller's shell.

A real provider can only be reached with a key; with the keys removed, a test that
forgot to point its model at the loopback FakeProvider fails with a ConfigError
instead of calling a paid API. Tests that need a setting set it themselves.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from keel.models.connections import close_shared_clients
from keel.sandbox.base import SandboxSettings
from keel.sandbox.choose import open_sandbox

# A PostgreSQL test that skips while KEEL_TEST_POSTGRES_URL is set fails instead.
pytest_plugins = ["keel.testing.postgres_gate"]

CALLER_SETTINGS = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "DEEPSEEK_API_KEY",
    "DEEPSEEK_BASE_URL",
    "KEEL_MODEL",
    "KEEL_STORE",
    "KEEL_FAULT",
    "KEEL_AGENT_ID",
    "KEEL_LEASE_TTL",
    "KEEL_MODEL_STREAM",
    "KEEL_MODEL_MAX_ATTEMPTS",
    "KEEL_MODEL_MAX_WAIT",
    "KEEL_MODEL_TIMEOUT",
    "KEEL_MODEL_MAX_ANSWER_SECONDS",
    # Tracing is on when an OTLP endpoint is set (keel.runtime.tracing): tests that trace
    # say where to.
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
)


@pytest.fixture(autouse=True)
def _no_caller_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CALLER_SETTINGS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _fresh_model_connections() -> Iterator[None]:
    """Each test's provider is its own server: pooled connections to an earlier test's
    server must not carry over (the harness closes them too; this covers bare adapters)."""
    yield
    close_shared_clients()


def _unconfined_reason() -> str | None:
    """Why commands would run unconfined here (no working bubblewrap), else None."""
    sandbox = open_sandbox(SandboxSettings(mode="auto"))
    if sandbox.kind == "bubblewrap":
        return None
    return str(sandbox.describe().get("reason", "no OS sandbox"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``sandboxed`` rely on auto mode running commands unasked, which it does
    only inside an OS sandbox: without a working bubblewrap they are skipped, saying why."""
    marked = [item for item in items if item.get_closest_marker("sandboxed")]
    if not marked:
        return
    reason = _unconfined_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs the bubblewrap sandbox: {reason}")
    for item in marked:
        item.add_marker(skip)
