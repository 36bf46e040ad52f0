"""Recorded provider answers, for tests that replay real traffic through `FakeProvider`.

Each fixture is ``tests/fixtures/providers/NAME.json``::

    {"source": {"repo": ..., "path": ..., "commit": ..., "url": ..., "note": ...},
     "provider": "deepseek" | "openai" | "openrouter" | ...,
     "request": {...} or null,
     "status": 200, "headers": {"content-type": ...}, "body": "<exact body text>"}

`body` is the exact text the provider sent (JSON, or a whole ``text/event-stream``), so
the adapter under test parses what a real provider wrote, not what a test author
imagined. A malformed fixture is a `ConfigError` naming the file and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.core.errors import ConfigError

FIXTURES = Path("tests") / "fixtures" / "providers"
_EVENT = re.compile(r".*?(?:\r\n\r\n|\n\n|\r\r|\Z)", re.DOTALL)


@dataclass(frozen=True, kw_only=True)
class RecordedExchange:
    """One recorded request and the provider's answer, as the fixture file holds it."""

    name: str
    provider: str
    status: int
    body: str
    headers: Mapping[str, str] = field(default_factory=dict)
    request: Mapping[str, Any] | None = None
    source: Mapping[str, Any] = field(default_factory=dict)

    @property
    def content_type(self) -> str:
        return next((v for k, v in self.headers.items() if k.lower() == "content-type"), "")

    @property
    def is_stream(self) -> bool:
        """Whether the answer is a ``text/event-stream`` (served event by event)."""
        return self.content_type.lower().startswith("text/event-stream")

    def json(self) -> Any:
        """The body parsed as JSON (for a plain, non-streamed answer)."""
        return json.loads(self.body)

    def events(self) -> list[str]:
        """The streamed body cut into its events (see `split_events`)."""
        return split_events(self.body)


def fixtures_dir() -> Path:
    """``tests/fixtures/providers`` of the checkout this package runs from.

    Found from the package's own location (``src/keel/testing`` is three levels below
    the repository root), so tests find the files from any working directory.
    """
    return Path(__file__).resolve().parents[3] / FIXTURES


def fixture_names(directory: Path | None = None) -> list[str]:
    """Names of every fixture in `directory` (default `fixtures_dir`), sorted."""
    folder = directory or fixtures_dir()
    return sorted(p.stem for p in folder.glob("*.json"))


def load_fixture(name: str, directory: Path | None = None) -> RecordedExchange:
    """Read fixture `name` (without ``.json``) from `directory` (default `fixtures_dir`)."""
    path = (directory or fixtures_dir()) / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"no recorded exchange {name!r}: {path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return RecordedExchange(
        name=name,
        provider=_field(data, "provider", str, path),
        status=_field(data, "status", int, path),
        body=_field(data, "body", str, path),
        headers={str(k): str(v) for k, v in _field(data, "headers", dict, path).items()},
        request=_optional(data, "request", dict, path),
        source=_optional(data, "source", dict, path) or {},
    )


def split_events(body: str) -> list[str]:
    """A ``text/event-stream`` body cut after each blank line, exactly: the pieces join
    back to `body`, so a server can write a recording event by event."""
    return [piece for piece in _EVENT.findall(body) if piece]


def _field(data: Mapping[str, Any], name: str, kind: type[Any], path: Path) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
        raise ConfigError(f"{path}: {name!r} must be a {kind.__name__}, got {value!r:.80}")
    return value


def _optional(data: Mapping[str, Any], name: str, kind: type[Any], path: Path) -> Any:
    return None if data.get(name) is None else _field(data, name, kind, path)
