"""The rules no mode and no user rule can loosen: protected paths, git, secrets, no sandbox.

``ContainedPolicy`` wraps the user's ``Policy`` (mode defaults plus rules) and
tightens its decision:

- a write whose path — as spelled, or as resolved through symbolic links — is
  protected (``.keel/``, the store's files, ``.git/config``, ``.git/hooks/`` and
  the policy's ``protected`` list) is denied, permanently, in every mode;
- a write below ``.git/`` by a file tool, and a command that writes the
  repository (``git commit``, ``git branch x`` …), need approval in every mode;
  only such an approved command runs with ``.git`` writable in the sandbox;
- reading a secret file (``.env*`` and the policy's ``secret`` list) needs
  approval in every mode;
- in ``auto`` mode, commands run without approval only inside an OS sandbox.

A tool whose written paths are in content the call names rather than in an
argument (``apply_patch``: the paths are inside the patch artifact) is judged
through ``paths_of``, an object the harness builds that reads them: the call is
judged as a write of each path it touches (rules on the tool itself, and the rules
that would judge ``write_file`` writing that path), and the strictest of those
decisions stands, its reason naming the paths. Without ``paths_of`` such a call is
refused.

These are statements of intent checked before a call runs. The boundary is
below them: the file tools refuse protected writes themselves, and the sandbox
mounts protected paths read-only whatever a command is called.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from keel.core.guard import PLAN_FILE, PathGuard
from keel.policy.commands import normalise_command, writes_git
from keel.policy.modes import Decision, Mode, strictness
from keel.policy.resolution import resolve
from keel.policy.rules import PATH_DEFAULTS, Policy, workspace_relative

# Tools whose target path is fixed rather than an argument.
FIXED_PATHS = {"plan_write": PLAN_FILE}
# Tools whose written paths are in content a call names (judged through ``paths_of``).
CONTENT_PATHS = frozenset({"apply_patch"})
# Besides its own name, each path such a tool writes is judged as these tools' write of it.
JUDGED_AS = ("write_file",)
PATHS_SHOWN = 40  # of the paths named in a decision's reason


class CallPaths(Protocol):
    """The workspace-relative paths a call of a ``CONTENT_PATHS`` tool writes.

    None when it does not know the tool; a ToolError (shown to the model as the
    refusal) when the content cannot be read.
    """

    def __call__(self, tool: str, arguments: Mapping[str, Any]) -> Sequence[str] | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainedPolicy:
    """The user's policy under the harness's own rules (see the module docstring)."""

    policy: Policy = field(default_factory=Policy)
    guard: PathGuard = field(default_factory=PathGuard)
    sandboxed: bool = True  # does an OS sandbox confine commands?
    paths_of: CallPaths | None = None  # reads the paths of CONTENT_PATHS calls

    def decide(
        self,
        tool: str,
        effect: str,
        arguments: Mapping[str, Any],
        *,
        mode: Mode,
        workspace: Path,
    ) -> Decision:
        """Allow, ask or deny one call; never looser than ``policy.decide`` alone."""
        if tool in CONTENT_PATHS:
            return self._decide_each_path(tool, effect, arguments, mode=mode, workspace=workspace)
        return self._decide(tool, effect, arguments, mode=mode, workspace=workspace)

    def _decide_each_path(
        self,
        tool: str,
        effect: str,
        arguments: Mapping[str, Any],
        *,
        mode: Mode,
        workspace: Path,
    ) -> Decision:
        """The strictest decision on writing each path the call touches, naming them."""
        paths = None if self.paths_of is None else self.paths_of(tool, arguments)
        if paths is None:
            return Decision(
                action="deny",
                rule="policy_error",
                reason=f"the files {tool} would write cannot be read here, so the call "
                "cannot be judged",
            )
        if not paths:
            return Decision(action="deny", rule="policy_error", reason=f"{tool} writes no file")
        decisions = [
            self._decide(name, effect, {"path": path}, mode=mode, workspace=workspace)
            for path in paths
            for name in (tool, *JUDGED_AS)
        ]
        strongest = max(decisions, key=lambda d: strictness(d.action))  # first of equals
        shown = ", ".join(paths[:PATHS_SHOWN])
        if len(paths) > PATHS_SHOWN:
            shown += f" … ({len(paths) - PATHS_SHOWN} more)"
        return replace(strongest, reason=f"{strongest.reason} (it writes: {shown})")

    def _decide(
        self,
        tool: str,
        effect: str,
        arguments: Mapping[str, Any],
        *,
        mode: Mode,
        workspace: Path,
    ) -> Decision:
        args = dict(arguments)
        if tool in FIXED_PATHS:
            args["path"] = FIXED_PATHS[tool]
        base = self.policy.decide(tool, effect, args, mode=mode, workspace=workspace)
        if base.action == "deny":
            return base
        tighter = [base]
        path = args.get("path", PATH_DEFAULTS.get(tool))
        spellings = path_spellings(path, workspace) if isinstance(path, str) else ()
        if effect == "write":
            for rel in spellings:
                refusal = self.guard.write_refusal(rel)
                if refusal is not None:
                    return Decision(action="deny", rule="protected", reason=refusal, permanent=True)
            if any(self.guard.is_git_internal(rel) for rel in spellings):
                tighter.append(
                    Decision(
                        action="ask",
                        rule="git",
                        reason=f"writing {path} changes the repository's history or state; "
                        "writes below .git need approval in every mode",
                    )
                )
        elif effect == "read" and any(self.guard.is_secret(rel) for rel in spellings):
            tighter.append(
                Decision(
                    action="ask",
                    rule="secret",
                    reason=f"{path} may hold secrets (credentials, keys); reading it needs "
                    "approval in every mode",
                )
            )
        if effect == "execute" and tool == "run_command":
            argv = args.get("argv")
            if isinstance(argv, list) and writes_git(
                normalise_command([str(a) for a in argv], cwd=workspace)
            ):
                tighter.append(
                    Decision(
                        action="ask",
                        rule="git",
                        reason="this command writes the git repository (commit, branch, reset "
                        "…); writes below .git need approval in every mode",
                        writes_git=True,
                    )
                )
            if not self.sandboxed and base.rule == f"mode:{Mode.AUTO.value}" and base.allowed:
                tighter.append(
                    Decision(
                        action="ask",
                        rule="sandbox",
                        reason="no OS sandbox confines commands here (bubblewrap is missing or "
                        "the sandbox is off), so in auto mode they need approval",
                    )
                )
        strongest = max(tighter, key=lambda d: strictness(d.action))  # first of equals
        if any(d.writes_git for d in tighter) and not strongest.writes_git:
            strongest = replace(strongest, writes_git=True)
        return strongest


def path_spellings(path: str, workspace: Path) -> tuple[str, ...]:
    """``path`` relative to the workspace as written and as resolved through symlinks.

    Outside paths give nothing (the policy already refuses them). Resolution never
    fails: a path that does not exist yet resolves as far as it exists.
    """
    lexical = workspace_relative(path, workspace)
    if lexical is None:
        return ()
    root, resolved = resolve(lexical, workspace)  # \xHH spellings too
    real = workspace_relative(resolved, Path(root))
    return (lexical,) if real is None or real == lexical else (lexical, real)


__all__ = [
    "CONTENT_PATHS",
    "FIXED_PATHS",
    "JUDGED_AS",
    "CallPaths",
    "ContainedPolicy",
    "path_spellings",
]
