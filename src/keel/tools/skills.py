"""Skills on disk and ``load_skill``: a skill's instructions, read when the model asks.

Skills are read from the workspace's ``.keel/skills`` only, each path resolved from a
descriptor of the workspace (``keel.tools.fsroot``): a link that leads out of the
workspace is refused, never followed. ``.keel/`` is a protected path, so the model can
read a skill's files with the file tools but never write one, and cannot plant a skill
its own run or a later one would load.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated

from pydantic import Field

from keel.core.errors import ConfigError, ToolError
from keel.core.pathnames import shown_path
from keel.core.skills import (
    MAX_SKILL_BYTES,
    NAME_PATTERN,
    SKILL_FILE,
    SKILLS_DIR,
    Skill,
    parse_skill,
    skill_path,
)
from keel.tools.base import Effect, ToolContext, ToolResult, tool
from keel.tools.fsroot import WorkspaceRoot

MAX_LISTED_FILES = 50  # of a skill's sibling files named in load_skill's answer


def skill_folders(workspace: Path) -> list[str]:
    """The names of the directories in the workspace's ``.keel/skills``, sorted;
    ConfigError when that path leads out of the workspace."""
    try:
        return _folders(workspace)
    except ToolError as exc:
        raise ConfigError(f"{workspace / '/'.join(SKILLS_DIR)}: {exc}") from None


def _folders(workspace: Path) -> list[str]:
    with WorkspaceRoot(workspace) as root, root.locate("/".join(SKILLS_DIR), spelled=False) as spot:
        if not spot.found or not spot.is_dir():
            return []
        fd = os.open(spot.tail[-1], os.O_RDONLY | os.O_DIRECTORY, dir_fd=spot.dir_fd)
        try:
            with os.scandir(fd) as entries:
                return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        finally:
            os.close(fd)


def read_skill(workspace: Path, name: str) -> Skill | None:
    """Skill ``name`` of the workspace, parsed; None when it has no ``SKILL.md``.
    ConfigError ``FILE:LINE: …`` for one that is not a valid skill."""
    rel = skill_path(name)
    source = str(workspace / rel)
    with WorkspaceRoot(workspace) as root:
        try:
            opened = root.open(rel, spelled=False)
        except ToolError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        if opened is None:
            return None
        with opened:
            if not opened.is_file:
                raise ConfigError(f"{source}: not a regular file")
            data = opened.read(MAX_SKILL_BYTES + 1)  # one more: parse_skill refuses it whole
    return parse_skill(data, folder=name, source=source)


def scan_skills(workspace: Path) -> list[Skill | ConfigError]:
    """Every skill folder of the workspace, by name: its skill, or what is wrong with it
    (a folder without a ``SKILL.md`` is not a skill and is left out)."""
    found: list[Skill | ConfigError] = []
    for folder in skill_folders(workspace):
        try:
            skill = read_skill(workspace, folder)
        except ConfigError as exc:
            found.append(exc)
            continue
        if skill is not None:
            found.append(skill)
    return found


def workspace_skills(workspace: Path) -> list[Skill]:
    """Every skill of the workspace, by name. ConfigError for the first invalid one: a
    broken skill is reported, never skipped in silence."""
    skills = []
    for item in scan_skills(workspace):
        if isinstance(item, ConfigError):
            raise item
        skills.append(item)
    return skills


def skill_files(workspace: Path, name: str) -> list[str]:
    """The workspace-relative paths of the skill's other files (up to 50, sorted)."""
    base = "/".join((*SKILLS_DIR, name))
    found: list[str] = []
    with WorkspaceRoot(workspace) as root, root.locate(base, spelled=False) as spot:
        if not spot.found or not spot.is_dir():
            return []
        top = os.open(spot.tail[-1], os.O_RDONLY | os.O_DIRECTORY, dir_fd=spot.dir_fd)
        pending = [(top, base)]
        while pending and len(found) < MAX_LISTED_FILES:
            fd, rel = pending.pop()
            try:
                with os.scandir(fd) as entries:
                    for entry in sorted(entries, key=lambda e: e.name):
                        st = entry.stat(follow_symlinks=False)
                        path = f"{rel}/{entry.name}"
                        if stat.S_ISDIR(st.st_mode):
                            child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                            pending.append((child, path))
                        elif path != f"{base}/{SKILL_FILE}":
                            found.append(path)
            finally:
                os.close(fd)
        for fd, _ in pending:
            os.close(fd)
    return sorted(found)[:MAX_LISTED_FILES]


@tool(effect=Effect.READ)
def load_skill(
    ctx: ToolContext,
    name: Annotated[str, Field(min_length=1, max_length=64, description="The skill's name.")],
) -> ToolResult:
    """Read a skill's instructions (the skills are listed in the system prompt). Read
    them before you use the skill; its other files are readable with read_file."""
    offered = [] if ctx.state is None else [s["name"] for s in ctx.state.options.skills or ()]
    if name not in offered or not NAME_PATTERN.fullmatch(name):
        listed = ", ".join(offered) or "none"
        raise ToolError(f"no skill named {name!r}; this run's skills: {listed}")
    try:
        skill = read_skill(ctx.workspace, name)
    except ConfigError as exc:
        raise ToolError(str(exc)) from None
    if skill is None:
        raise ToolError(f"skill {name!r} is gone: {skill_path(name)} no longer exists")
    files = skill_files(ctx.workspace, name)
    parts = [f"# Skill: {skill.name}", "", skill.instructions]
    if files:
        parts += ["", "Files of this skill (read them with read_file):"]
        parts += [f"  {shown_path(path)}" for path in files]
    return ToolResult(output="\n".join(parts), data={"skill": skill.name, "digest": skill.digest})
