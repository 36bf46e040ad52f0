"""Skills in the Agent Skills folder format: ``.keel/skills/NAME/SKILL.md``.

A skill is a folder whose ``SKILL.md`` starts with YAML front matter — ``name`` (the
folder's name: lowercase letters, digits and hyphens, at most 64) and ``description``
(what it does and when to use it, at most 1,024 characters) — followed by the
instructions. Other keys of the format (``license``, ``compatibility``, ``metadata``,
``allowed-tools``) are accepted and kept out of the prompt, so skills written for
other agents work unchanged; sibling files (scripts, references) are the skill's too.

Only a skill's name and description go into the system prompt; its instructions reach
the model when it calls ``load_skill(name)``. Pure: parsing bytes, no I/O.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Final

import yaml

from keel.core.errors import ConfigError

SKILL_FILE: Final = "SKILL.md"
SKILLS_DIR: Final = (".keel", "skills")
MAX_SKILL_BYTES: Final = 256 * 1024
MAX_DESCRIPTION: Final = 1024
NAME_PATTERN: Final = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?!-)){0,62}[a-z0-9]|[a-z0-9]")
NAME_RULE: Final = "1-64 of a-z 0-9 and single hyphens, not starting or ending with one"
KNOWN_KEYS: Final = frozenset(
    {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Skill:
    """One parsed, valid skill. ``digest``: sha256 (hex) of the exact ``SKILL.md`` bytes."""

    name: str
    description: str
    instructions: str
    digest: str
    source: str  # the SKILL.md path as shown in errors

    def summary(self) -> dict[str, str]:
        """What a run records of the skill (and its prompt shows): no instructions."""
        return {"name": self.name, "description": self.description, "digest": self.digest}


def skill_path(name: str) -> str:
    """The workspace-relative path of skill ``name``'s ``SKILL.md``."""
    return "/".join((*SKILLS_DIR, name, SKILL_FILE))


def check_skill_name(name: str, source: str) -> None:
    """ConfigError naming ``source`` unless ``name`` is a valid skill name."""
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"{source}: skill name {name!r} is not allowed: a name is {NAME_RULE}")


def parse_skill(data: bytes, *, folder: str, source: str) -> Skill:
    """The skill in ``data`` (the exact bytes of ``folder``/SKILL.md), or a ConfigError
    ``SOURCE:LINE: what is wrong``."""
    check_skill_name(folder, source)
    if len(data) > MAX_SKILL_BYTES:
        raise ConfigError(f"{source}: {len(data)} bytes, over the {MAX_SKILL_BYTES} allowed")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{source}:{line}: not UTF-8 text (at byte offset {exc.start})") from None
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise ConfigError(
            f"{source}:1: a SKILL.md starts with '---' and YAML front matter "
            "(name, description), closed by another '---'"
        )
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise ConfigError(f"{source}:1: the front matter is never closed with '---'")
    front = _front_matter("".join(lines[1:end]), source)
    name = _text(front, "name", source, end)
    description = _text(front, "description", source, end)
    if name != folder:
        raise ConfigError(f"{source}: name {name!r} is not its folder's name {folder!r}")
    if len(description) > MAX_DESCRIPTION:
        raise ConfigError(
            f"{source}: the description has {len(description)} characters; at most "
            f"{MAX_DESCRIPTION} (say what the skill does and when to use it)"
        )
    instructions = "".join(lines[end + 1 :]).strip()
    if not instructions:
        raise ConfigError(f"{source}:{end + 2}: the instructions after the front matter are empty")
    return Skill(
        name=name,
        description=" ".join(description.split()),
        instructions=instructions,
        digest=hashlib.sha256(data).hexdigest(),
        source=source,
    )


def _front_matter(text: str, source: str) -> dict[str, Any]:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"{int(mark.line) + 2}" if mark is not None else "2"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"{source}:{line}: the front matter is not valid YAML: {problem}"
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{source}:2: the front matter must be a mapping (name, description)")
    return value


def _text(front: dict[str, Any], key: str, source: str, end: int) -> str:
    value = front.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"{source}:{end + 1}: the front matter needs {key!r}, a non-empty string"
            + ("" if value is None else f" (got {type(value).__name__})")
        )
    return value.strip()
