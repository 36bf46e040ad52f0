"""The tools and the permission gate as the pure decision sees them, made total.

``decide`` asks the catalog to validate the model's arguments and the gate to
judge the call; both see whatever the model sent. Here neither can raise anything
but a ToolError: an exception while validating becomes an argument error, and an
exception inside the gate a refusal naming it (``rule: policy_error``), so a call
the policy cannot judge is the model's observation, never a crash of the run.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keel.core.errors import ToolArgumentError, ToolError
from keel.core.text import printable
from keel.loop.situation import Gate, Verdict
from keel.models.base import ToolSpec
from keel.policy.modes import Mode
from keel.tools.base import Tool
from keel.tools.registry import ToolRegistry


class RegistryCatalog:
    """Adapts ``ToolRegistry`` to ``keel.loop.situation.ToolCatalog``."""

    def __init__(self, registry: ToolRegistry) -> None:
        self._registry = registry

    def describe(self, name: str) -> Tool:
        return self._registry.get(name)

    def validate(self, name: str, raw: str | dict[str, Any]) -> dict[str, Any]:
        tool = self._registry.get(name)
        args = tool.parse_arguments(raw)
        try:
            dumped: dict[str, Any] = args.model_dump(mode="json")
        except Exception as exc:
            raise ToolArgumentError(
                name, f"arguments for {name} could not be recorded: {type(exc).__name__}: {exc}"
            ) from None
        return dumped


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """The verdict on a call the gate could not judge."""

    action: str = "deny"
    rule: str = "policy_error"
    reason: str
    permanent: bool = False
    writes_git: bool = False


@dataclass(frozen=True, slots=True)
class TotalGate:
    """A gate that answers every call: when ``gate`` raises, the call is refused."""

    gate: Gate

    def decide(
        self, tool: str, effect: str, arguments: dict[str, Any], *, mode: Mode, workspace: Path
    ) -> Verdict:
        try:
            return self.gate.decide(tool, effect, arguments, mode=mode, workspace=workspace)
        except ToolError as exc:
            return Refusal(reason=printable(str(exc)))
        except Exception as exc:
            return Refusal(
                reason=printable(
                    f"the policy could not judge this call ({type(exc).__name__}: {exc}); "
                    "check its arguments"
                )
            )


_last_offer: tuple[tuple[Tool, ...], tuple[ToolSpec, ...]] = ((), ())
_offer_lock = threading.Lock()


def offered_specs(registry: ToolRegistry) -> tuple[ToolSpec, ...]:
    """What the model is offered from `registry`: a spec is a function of its frozen
    `Tool`, and every run of a worker offers the same tools, so the last ones are kept."""
    global _last_offer  # noqa: PLW0603 - one entry, replaced whole
    tools = tuple(registry)
    with _offer_lock:  # a worker's slots start together: one builds, the others reuse
        known, specs = _last_offer
        if len(known) == len(tools) and all(a is b for a, b in zip(known, tools, strict=True)):
            return specs
        specs = tuple(
            ToolSpec(name=s["name"], description=s["description"], parameters=s["parameters"])
            for s in (tool.spec() for tool in tools)
        )
        _last_offer = (tools, specs)
        return specs
