"""Test kit for delegation: agent spec files with scripted models, and a parent model that
refers to the children it spawned.

``write_agent`` writes ``.keel/agents/NAME.md`` whose ``model`` is a scripted file, so
each child plays its own script. ``RelayModel`` plays a parent's script in which a
string ``{task0}``, ``{task1}`` … (or ``{child0}`` …) stands for the task id (or child
run id) the N-th spawn of the run returned: what a real model would read from its
earlier tool results. Only the model's decisions are scripted; everything else is real.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from keel.models.base import ModelRequest, ModelTurn
from keel.models.scripted import ScriptedModel

_PLACEHOLDER = re.compile(r"\{(task|child)(\d+)\}")


def write_script(path: Path, turns: Sequence[Mapping[str, Any]]) -> str:
    """Write a scripted model file; returns its ``scripted:`` spec (absolute)."""
    path.write_text(json.dumps(list(turns)), encoding="utf-8")
    return f"scripted:{path.resolve()}"


def write_agent(
    workspace: Path,
    name: str,
    *,
    script: Sequence[Mapping[str, Any]] | None = None,
    body: str = "Do the task you are given, then request completion.",
    **front: Any,
) -> Path:
    """``workspace/.keel/agents/NAME.md`` with ``front`` as its front matter (keys as in
    the spec file; ``workspace_kind`` is written as ``workspace``); with ``script``, the
    agent's model plays it (written beside the workspace)."""
    agents = workspace / ".keel" / "agents"
    agents.mkdir(parents=True, exist_ok=True)
    matter: dict[str, Any] = {"description": front.pop("description", f"test agent {name}")}
    if "workspace_kind" in front:
        front["workspace"] = front.pop("workspace_kind")
    if script is not None:
        scripts = workspace.parent / "scripts"
        scripts.mkdir(exist_ok=True)
        matter["model"] = write_script(scripts / f"{name}.json", script)
    matter.update(front)
    path = agents / f"{name}.md"
    path.write_text(
        "---\n" + yaml.safe_dump(matter, sort_keys=False) + "---\n" + body + "\n",
        encoding="utf-8",
    )
    return path


class RelayModel:
    """A scripted parent whose arguments may name the children it spawned (see module)."""

    def __init__(self, turns: Sequence[Mapping[str, Any]], spec: str = "scripted:relay") -> None:
        self.spec = spec
        self._turns = [dict(t) for t in turns]
        self.requests: list[ModelRequest] = []

    def complete(self, request: ModelRequest) -> ModelTurn:
        self.requests.append(request)
        tasks: list[str] = []
        children: list[str] = []
        for message in request.messages:
            if message.role != "tool" or not message.content:
                continue
            try:
                found = json.loads(message.content)
            except ValueError:
                continue
            if isinstance(found, dict) and found.get("status") in (
                "started",
                "already running",
                "waiting",
            ):
                tasks.append(str(found.get("task_id")))
                children.append(str(found.get("child_run_id")))
        ids = {"task": tasks, "child": children}

        def fill(value: Any) -> Any:
            if isinstance(value, str):
                return _PLACEHOLDER.sub(lambda m: _pick(ids[m.group(1)], int(m.group(2))), value)
            if isinstance(value, list):
                return [fill(v) for v in value]
            if isinstance(value, dict):
                return {k: fill(v) for k, v in value.items()}
            return value

        turns = [fill(turn) for turn in self._turns]
        return ScriptedModel(turns, spec=self.spec).complete(request)


def _pick(ids: list[str], index: int) -> str:
    return ids[index] if index < len(ids) else f"(no spawn #{index} yet)"


__all__ = ["RelayModel", "write_agent", "write_script"]
