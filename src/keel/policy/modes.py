"""Permission modes and what each one decides when no user rule speaks.

The mode default for a call depends only on the tool's effect (a plain string,
so policy does not depend on ``keel.tools``) and, for ``plan_exit``, its name:

    effect     plan              ask     edit    auto
    read       allow             allow   allow   allow
    state      allow (1)         allow   allow   allow (1)
    write      deny (2)          ask     allow   allow
    execute    deny (2)          ask     ask     allow
    external   deny (2)          ask     ask     ask (3)

(1) ``plan_exit`` is the exception: in plan mode it is ``ask`` (leaving plan mode
    is exactly the approval of the plan, so it goes through the ordinary approval
    flow: digest, grant, exactly-once); in every other mode it is refused with a
    message saying there is no plan mode to leave (not permanent: harmless to retry).
(2) ``plan_write`` is a write (of ``plans/PLAN.md``), allowed in plan mode: it
    is what plan mode is for. Other refusals in plan mode are not permanent: they
    tell the model it is in plan mode and how to leave it (``plan_write`` then
    ``plan_exit``).
(3) ``auto`` allows everything *inside the workspace*; an external call reaches
    outside it by definition, so it still needs approval unless a rule allows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from keel.core.errors import ConfigError, UsageError

Action = Literal["allow", "ask", "deny"]

ACTIONS: tuple[Action, ...] = ("allow", "ask", "deny")  # in order of strictness
EFFECTS = ("read", "write", "execute", "external", "state")
PLAN_EXIT = "plan_exit"
PLAN_WRITE = "plan_write"


class Mode(StrEnum):
    PLAN = "plan"  # read-only tools and plan tools only, until plan_exit is approved
    ASK = "ask"  # every write, execute or external call needs approval
    EDIT = "edit"  # writes inside the workspace allowed; commands and external calls ask
    AUTO = "auto"  # everything inside the workspace allowed


DEFAULT_MODE = Mode.EDIT


def parse_mode(value: str) -> Mode:
    """The mode named by ``value``; a ConfigError listing the choices otherwise."""
    try:
        return Mode(value)
    except ValueError:
        choices = "|".join(m.value for m in Mode)
        raise ConfigError(f"unknown mode {value!r}; choose one of {choices}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What the harness does with one proposed call, and why.

    ``rule`` names what decided (``mode:edit``, ``workspace``, or a user rule with
    its file and line); ``reason`` is fit to show the model. ``permanent`` marks a
    refusal that retrying cannot change (a user deny rule): if the goal needs the
    action, the run ends ``blocked``.
    """

    action: Action
    rule: str
    reason: str
    permanent: bool = False
    writes_git: bool = False  # an allowed or approved command may write below .git

    @property
    def allowed(self) -> bool:
        return self.action == "allow"


def strictness(action: Action) -> int:
    """0 for allow, 1 for ask, 2 for deny: the stricter action wins a conflict."""
    return ACTIONS.index(action)


def plan_mode_message(tool: str) -> str:
    return (
        f"You are in plan mode: {tool} is refused until your plan is approved. "
        "Only read-only tools work now. Write your plan with plan_write, then call "
        "plan_exit with a short summary to ask for approval; once approved you may act."
    )


_DEFAULTS: dict[str, dict[Mode, Action]] = {
    "read": {Mode.PLAN: "allow", Mode.ASK: "allow", Mode.EDIT: "allow", Mode.AUTO: "allow"},
    "state": {Mode.PLAN: "allow", Mode.ASK: "allow", Mode.EDIT: "allow", Mode.AUTO: "allow"},
    "write": {Mode.PLAN: "deny", Mode.ASK: "ask", Mode.EDIT: "allow", Mode.AUTO: "allow"},
    "execute": {Mode.PLAN: "deny", Mode.ASK: "ask", Mode.EDIT: "ask", Mode.AUTO: "allow"},
    "external": {Mode.PLAN: "deny", Mode.ASK: "ask", Mode.EDIT: "ask", Mode.AUTO: "ask"},
}


def mode_default(tool: str, effect: str, mode: Mode) -> Decision:
    """The decision of ``mode`` alone for a call of ``tool`` with ``effect``."""
    rule = f"mode:{mode.value}"
    if effect not in _DEFAULTS:
        raise UsageError(f"tool {tool} has unknown effect {effect!r}; one of {', '.join(EFFECTS)}")
    if tool == PLAN_EXIT:
        if mode is Mode.PLAN:
            return Decision(
                action="ask",
                rule=rule,
                reason="leaving plan mode needs a person's approval of the plan",
            )
        return Decision(
            action="deny",
            rule=rule,
            reason=f"plan_exit only works in plan mode; this run is in {mode.value} mode, "
            "so carry on with the work",
        )
    action = _DEFAULTS[effect][mode]
    if tool == PLAN_WRITE and mode is Mode.PLAN:
        return Decision(
            action="allow", rule=rule, reason="writing the plan is what plan mode is for"
        )
    if mode is Mode.PLAN and action == "deny":
        return Decision(action="deny", rule=rule, reason=plan_mode_message(tool))
    verb = {"allow": "are allowed", "ask": "need approval", "deny": "are refused"}[action]
    return Decision(action=action, rule=rule, reason=f"{effect} calls {verb} in {mode.value} mode")


__all__ = [
    "ACTIONS",
    "DEFAULT_MODE",
    "EFFECTS",
    "Action",
    "Decision",
    "Mode",
    "mode_default",
    "parse_mode",
    "plan_mode_message",
    "strictness",
]
