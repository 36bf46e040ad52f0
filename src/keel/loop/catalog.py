"""The tool registry as the pure decision sees it."""

from __future__ import annotations

from typing import Any

from keel.tools.base import Tool
from keel.tools.registry import ToolRegistry


class RegistryCatalog:
    """Adapts ``ToolRegistry`` to ``keel.loop.decide.ToolCatalog``."""

    def __init__(self, registry: ToolRegistry) -> None:
        self._registry = registry

    def describe(self, name: str) -> Tool:
        return self._registry.get(name)

    def validate(self, name: str, raw: str | dict[str, Any]) -> dict[str, Any]:
        return self._registry.get(name).parse_arguments(raw).model_dump(mode="json")
