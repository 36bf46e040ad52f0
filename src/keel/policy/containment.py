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

These are statements of intent checked before a call runs. The boundary is
below them: the file tools refuse protected writes themselves, and the sandbox
mounts protected paths read-only whatever a command is called.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from keel.core.guard import PLAN_FILE, PathGuard
from keel.core.pathnames import os_name
from keel.policy.commands import normalise_command, writes_git
from keel.policy.modes import Decision, Mode, strictness
from keel.policy.rules import PATH_DEFAULTS, Policy, workspace_relative

# Tools whose target path is fixed rather than an argument.
FIXED_PATHS = {"plan_write": PLAN_FILE}


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainedPolicy:
    """The user's policy under the harness's own rules (see the module docstring)."""

    policy: Policy = field(default_factory=Policy)
    guard: PathGuard = field(default_factory=PathGuard)
    sandboxed: bool = True  # does an OS sandbox confine commands?

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
    root = os.path.realpath(workspace)
    resolved = os.path.realpath(os.path.join(root, os_name(lexical)))  # \xHH spellings too
    real = workspace_relative(resolved, Path(root))
    return (lexical,) if real is None or real == lexical else (lexical, real)


__all__ = ["FIXED_PATHS", "ContainedPolicy", "path_spellings"]
