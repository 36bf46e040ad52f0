"""Every test starts with no model credentials and no Keel settings from the caller's shell.

A real provider can only be reached with a key; with the keys removed, a test that
forgot to point its model at the loopback FakeProvider fails with a ConfigError
instead of calling a paid API. Tests that need a setting set it themselves.
"""

from __future__ import annotations

import pytest

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
)


@pytest.fixture(autouse=True)
def _no_caller_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CALLER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
