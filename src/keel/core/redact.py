"""Keeping secrets out of the event log (pure once given the secret values).

Values of environment variables whose names look secret (``*KEY*``, ``*TOKEN*``,
``*SECRET*``, ``*PASSWORD*``) are replaced by ``[redacted:NAME]`` wherever they
appear in event data, and are not passed to verifier processes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
MIN_SECRET_LENGTH = 6  # shorter values would redact ordinary words


def looks_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


@dataclass(frozen=True, slots=True)
class Redactor:
    secrets: tuple[tuple[str, str], ...]  # (name, value), longest value first

    @classmethod
    def from_mapping(cls, env: Mapping[str, str]) -> Redactor:
        found = [
            (name, value)
            for name, value in env.items()
            if looks_secret(name) and len(value) >= MIN_SECRET_LENGTH
        ]
        found.sort(key=lambda item: len(item[1]), reverse=True)
        return cls(tuple(found))

    def scrub_text(self, text: str) -> str:
        for name, value in self.secrets:
            if value in text:
                text = text.replace(value, f"[redacted:{name}]")
        return text

    def scrub(self, value: Any) -> Any:
        """``value`` (JSON data) with every secret replaced; unchanged objects are reused."""
        if not self.secrets:
            return value
        if isinstance(value, str):
            return self.scrub_text(value)
        if isinstance(value, dict):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(v) for v in value]
        return value


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables whose names look secret (for child processes)."""
    return {name: value for name, value in environ.items() if not looks_secret(name)}
