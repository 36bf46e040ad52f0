"""The records a run's state is made of: its options, todos, evidence, pending request, grants.

Frozen, keyword-only values with ``to_dict``/``from_dict`` for the snapshot and the
events; ``keel.core.state`` folds events into a ``RunState`` built from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from keel.core.budget import Budget


def canonical_json(value: Any) -> str:
    """Stable text of a JSON value: sorted keys, no spaces (for digests and signatures)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """How a run is driven; fixed at creation and carried by every resume."""

    model: str | None = None
    mode: str = "edit"
    verify: tuple[str, ...] = ()
    budget: Budget = field(default_factory=Budget)
    approval_timeout_s: float | None = None  # how long a request may wait; None: 24 h
    grant_ttl_s: float | None = None  # how long a granted approval stays usable; None: 24 h
    plan_then: str | None = None
    policy: dict[str, Any] | None = None
    sandbox: dict[str, Any] | None = None  # SandboxSettings.to_dict(); None: the defaults
    # --- delegation (``keel.runtime.delegation``); a top-level run keeps the defaults ---
    tools: tuple[str, ...] | None = None  # the only tools the run is offered; None: all
    depth: int = 0  # 0 for a top-level run, the parent's depth + 1 for a child
    root_id: str | None = None  # the tree's top-level run (None on that run itself)
    agent: dict[str, Any] | None = None  # name, digest, version, source of the agent spec
    output_schema: dict[str, Any] | None = None  # what request_completion's output must match
    workspace_kind: str | None = None  # isolated | shared-readonly | shared (children only)
    isolated: dict[str, Any] | None = None  # the isolated workspace (runtime.worktrees)
    workspace_git: dict[str, Any] | None = None  # url, ref: checked out where it executes
    skills: tuple[dict[str, str], ...] | None = None  # name, description, digest (no text)
    # --- service (``keel serve``); stored only when set ---
    creator: str | None = None  # who created the run, e.g. "token:NAME"; None: the CLI
    follows: str | None = None  # the run this one follows up (``keel message`` on an ended run)
    # --- context (``keel.loop.context``); stored only when set ---
    context_tokens: int | None = None  # the model's context size; None: known for the model
    context_summary: bool = False  # a compaction also asks the model to summarise
    # --- outcome (``keel.core.verifiers``); stored only when set ---
    verifier_names: tuple[str, ...] | None = None  # each verify command's name, in order
    signoffs: tuple[str, ...] = ()  # people who must sign off (``--verify-human NAME``)
    reviewers: tuple[tuple[str, str], ...] = ()  # (name, agent spec): ``--verify-agent``
    outcome: str | None = None  # what a completed run's result declares it to be
    # --- tags (``keel.core.tags``: suite, case, ... of ``keel eval``); stored only when set ---
    tags: dict[str, str] | None = None

    def verifier_name(self, command: str) -> str:
        """The name ``command``'s evidence is filed under (its command line if unnamed)."""
        if self.verifier_names is not None and command in self.verify:
            return self.verifier_names[self.verify.index(command)]
        return command

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "model": self.model,
            "mode": self.mode,
            "verify": list(self.verify),
            "budget": self.budget.to_dict(),
            "approval_timeout_s": self.approval_timeout_s,
            "grant_ttl_s": self.grant_ttl_s,
            "plan_then": self.plan_then,
            "policy": self.policy,
            "sandbox": self.sandbox,
        }
        # A child's fields are stored only when set: a top-level run's options read as
        # they always have.
        if self.tools is not None:
            d["tools"] = list(self.tools)
        if self.depth:
            d["depth"] = self.depth
        if self.skills is not None:
            d["skills"] = [dict(skill) for skill in self.skills]
        if self.context_summary:
            d["context_summary"] = True
        if self.verifier_names is not None:
            d["verifier_names"] = list(self.verifier_names)
        if self.signoffs:
            d["signoffs"] = list(self.signoffs)
        if self.reviewers:
            d["reviewers"] = [{"name": name, "agent": agent} for name, agent in self.reviewers]
        for key in (
            "root_id",
            "agent",
            "output_schema",
            "workspace_kind",
            "isolated",
            "workspace_git",
            "creator",
            "follows",
            "context_tokens",
            "outcome",
            "tags",
        ):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunOptions:
        return cls(
            model=d.get("model"),
            mode=d.get("mode", "edit"),
            verify=tuple(d.get("verify", ())),
            budget=Budget.from_dict(d.get("budget", {})),
            approval_timeout_s=d.get("approval_timeout_s"),
            grant_ttl_s=d.get("grant_ttl_s"),
            plan_then=d.get("plan_then"),
            policy=d.get("policy"),
            sandbox=d.get("sandbox"),
            tools=None if d.get("tools") is None else tuple(d["tools"]),
            depth=int(d.get("depth", 0)),
            root_id=d.get("root_id"),
            agent=d.get("agent"),
            output_schema=d.get("output_schema"),
            workspace_kind=d.get("workspace_kind"),
            isolated=d.get("isolated"),
            workspace_git=d.get("workspace_git"),
            skills=tuple(dict(skill) for skill in d["skills"]) if d.get("skills") else None,
            creator=d.get("creator"),
            follows=d.get("follows"),
            context_tokens=None if d.get("context_tokens") is None else int(d["context_tokens"]),
            context_summary=bool(d.get("context_summary", False)),
            verifier_names=(
                None if d.get("verifier_names") is None else tuple(d["verifier_names"])
            ),
            signoffs=tuple(d.get("signoffs", ())),
            reviewers=tuple((str(r["name"]), str(r["agent"])) for r in d.get("reviewers", ())),
            outcome=d.get("outcome"),
            tags=None if d.get("tags") is None else dict(d["tags"]),
        )

    @property
    def is_child(self) -> bool:
        return self.depth > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Todo:
    content: str
    status: str  # pending | in_progress | completed

    def to_dict(self) -> dict[str, Any]:
        return {"content": self.content, "status": self.status}


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationRecord:
    """Evidence from one verifier run, bound to the mutation revision it checked."""

    command: str
    exit_code: int
    duration_s: float
    artifact: str | None  # artifact id of the captured output
    mutation_revision: int
    file_hashes: dict[str, str]
    passed: bool
    note: str | None = None  # a sign-off's who and why, a review's blocking issues
    unfixable: str | None = None  # why no change of the workspace can make it pass

    def __post_init__(self) -> None:
        if self.unfixable is not None and self.passed:
            raise ValueError("a passed validation has nothing left to fix")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "command": self.command,
            "exit_code": self.exit_code,
            "duration_s": self.duration_s,
            "artifact": self.artifact,
            "mutation_revision": self.mutation_revision,
            "file_hashes": dict(self.file_hashes),
            "passed": self.passed,
        }
        if self.note is not None:
            d["note"] = self.note
        if self.unfixable is not None:
            d["unfixable"] = self.unfixable
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ValidationRecord:
        return cls(
            command=d["command"],
            exit_code=int(d["exit_code"]),
            duration_s=float(d["duration_s"]),
            artifact=d.get("artifact"),
            mutation_revision=int(d["mutation_revision"]),
            file_hashes=dict(d.get("file_hashes", {})),
            passed=bool(d["passed"]),
            note=d.get("note"),
            unfixable=d.get("unfixable"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingRequest:
    """What a waiting run waits for: an approval, an answer, or an unknown outcome."""

    kind: str  # "approval" | "question" | "unknown_outcome" | "child_failure" | "child"
    # | "signoff" (call_id "signoff:NAME", question NAME: a person's sign-off)
    call_id: str
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    digest: str | None = None
    risk: str | None = None
    question: str | None = None
    expires_at: str | None = None  # ISO-8601 UTC

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "call_id": self.call_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "digest": self.digest,
            "risk": self.risk,
            "question": self.question,
            "expires_at": self.expires_at,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PendingRequest:
        return cls(
            kind=d["kind"],
            call_id=d["call_id"],
            tool=d.get("tool"),
            arguments=d.get("arguments"),
            digest=d.get("digest"),
            risk=d.get("risk"),
            question=d.get("question"),
            expires_at=d.get("expires_at"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """A person's approval of one exact call, not used yet; ``RunState.grants`` keys it by
    the call's digest. The attempt it approved uses it up, whatever the outcome."""

    call_id: str  # the call that asked
    tool: str | None = None
    expires_at: str | None = None  # ISO-8601 UTC; None only in logs older than grant expiry

    def to_dict(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "tool": self.tool, "expires_at": self.expires_at}

    @classmethod
    def from_value(cls, value: Any) -> Grant:
        """A stored grant; a bare call id is the snapshot format before grants expired."""
        if isinstance(value, str):
            return cls(call_id=value)
        return cls(
            call_id=value["call_id"], tool=value.get("tool"), expires_at=value.get("expires_at")
        )


def in_plan_paths(path: str, patterns: tuple[str, ...]) -> bool:
    """Does a plan's ``Paths`` entry cover ``path`` (workspace-relative, posix)?

    An entry is a glob from the workspace root (``fnmatch``: ``*`` also matches
    ``/``, so ``*.py`` covers every Python file); an entry naming a directory
    (``src`` or ``src/``) covers everything below it.
    """
    parts = path.split("/")
    prefixes = ["/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]
    return any(
        fnmatchcase(prefix, pattern.strip("/")) for pattern in patterns for prefix in prefixes
    )


__all__ = [
    "Grant",
    "PendingRequest",
    "RunOptions",
    "Todo",
    "ValidationRecord",
    "canonical_json",
    "in_plan_paths",
]
