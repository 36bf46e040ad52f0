"""Skills (``.keel/skills/NAME/SKILL.md``): listed by name, loaded on demand, read-only.

Real workspaces and SQLite files, the real ``keel`` command; only the model's turns
are scripted, and what the model was sent is read back from ``ScriptedModel.requests``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keel.core.errors import ConfigError
from keel.core.events import EventType
from keel.models.base import ModelRequest
from keel.runtime.harness import Harness
from keel.store.url import open_store
from keel.testing import ScriptedModel
from keel.testing.cli import KeelWorkspace, call, expect, turn

INSTRUCTIONS = "Run scripts/migrate.sh --dry-run first; SECRET-STEP-7 comes last."
SKILL = f"""---
name: db-migrate
description: Migrate the database schema safely; use when a change touches migrations/.
license: MIT
metadata:
  author: someone else
---
# Migrating

{INSTRUCTIONS}
"""


def add_skill(ws: Path, name: str = "db-migrate", text: str = SKILL) -> Path:
    folder = ws / ".keel" / "skills" / name
    (folder / "scripts").mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(text)
    (folder / "scripts" / "migrate.sh").write_text("#!/bin/sh\necho migrating\n")
    return folder


DONE_TURN = turn(call("request_completion", summary="done"))


def load(name: str) -> dict[str, object]:
    return {"name": "load_skill", "arguments": {"name": name}}


def sent(request: ModelRequest) -> str:
    return "\n".join(str(message.content) for message in request.messages)


def test_only_names_and_descriptions_are_in_the_prompt_until_load_skill(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    add_skill(ws)
    model = ScriptedModel(
        [
            turn(load("db-migrate")),
            turn(call("read_file", path=".keel/skills/db-migrate/scripts/migrate.sh")),
            turn(call("write_file", path=".keel/skills/db-migrate/SKILL.md", content="evil")),
            turn(call("write_file", path=".keel/skills/planted/SKILL.md", content="evil")),
            turn(load("planted")),
            turn(call("request_completion", summary="read the skill")),
        ]
    )
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model)
    try:
        outcome = harness.run("migrate", cwd=ws, mode="auto")
        events = list(harness.events(outcome.state.run_id))
    finally:
        harness.close()

    assert outcome.state.status.value == "completed", outcome.state.reason
    first, second, *later = model.requests
    system = str(first.messages[0].content)
    assert "db-migrate: Migrate the database schema safely; use when a change touches" in system
    assert INSTRUCTIONS not in sent(first)  # not before load_skill
    assert "load_skill" in {t.name for t in first.tools}
    assert INSTRUCTIONS in sent(second)  # the tool's answer, in the next request
    assert "scripts/migrate.sh" in sent(second)  # its files are named for read_file
    assert "echo migrating" in sent(later[0])  # ... and readable
    failures = [e.data for e in events if e.type is EventType.TOOL_FAILED]
    assert [f["tool"] for f in failures] == ["write_file", "write_file", "load_skill"]
    assert "protected" in failures[0]["message"] and "protected" in failures[1]["message"]
    assert "no skill named 'planted'" in failures[2]["message"]
    assert (ws / ".keel" / "skills" / "db-migrate" / "SKILL.md").read_text() == SKILL
    assert not (ws / ".keel" / "skills" / "planted").exists()
    assert outcome.state.options.skills is not None
    [summary] = outcome.state.options.skills
    assert set(summary) == {"name", "description", "digest"}  # never the instructions


def test_a_run_keeps_the_skills_it_started_with_and_a_run_without_any_has_no_load_skill(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    folder = add_skill(ws)
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    done = [turn(call("request_completion", summary="ok"))]
    first = Harness(store=url, model=ScriptedModel(done))
    try:
        state = first.create("migrate", cwd=ws)
    finally:
        first.close()
    (folder / "SKILL.md").write_text(SKILL.replace("safely", "recklessly"))  # after creation
    model = ScriptedModel(done)
    later = Harness(store=url, model=model)
    try:
        later.execute(state.run_id)
        assert "safely" in str(model.requests[0].messages[0].content)  # as it was created

        bare = tmp_path / "bare"
        bare.mkdir()
        plain_model = ScriptedModel(done)
        plain = Harness(store=url, model=plain_model).run("nothing to learn", cwd=bare)
        assert plain.state.options.skills is None
        assert "load_skill" not in {t.name for t in plain_model.requests[0].tools}
        assert "Skills" not in str(plain_model.requests[0].messages[0].content)
    finally:
        later.close()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("no front matter\n", "SKILL.md:1: a SKILL.md starts with '---'"),
        ("---\nname: db-migrate\n", "never closed"),
        ("---\nname: other\ndescription: d\n---\nx\n", "is not its folder's name 'db-migrate'"),
        ("---\nname: db-migrate\n---\nx\n", "SKILL.md:3: the front matter needs 'description'"),
        (
            "---\nname: db-migrate\ndescription: [unclosed\n---\nx\n",
            "SKILL.md:4: the front matter is not valid YAML",
        ),
        ("---\nname: db-migrate\ndescription: d\n---\n\n", "instructions after the front"),
    ],
)
def test_an_invalid_skill_refuses_the_run_naming_its_file_and_line(
    tmp_path: Path, text: str, words: str
) -> None:
    ws = tmp_path / "ws"
    add_skill(ws, text=text)
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    harness = Harness(store=url, model=ScriptedModel([]))
    try:
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("[", r"\[")):
            harness.create("x", cwd=ws)
    finally:
        harness.close()
    store = open_store(url)
    try:
        assert store.list_runs() == []
    finally:
        store.close()


def test_a_skill_folder_linked_out_of_the_workspace_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    add_skill(outside)
    ws = tmp_path / "ws"
    (ws / ".keel" / "skills").mkdir(parents=True)
    (ws / ".keel" / "skills" / "db-migrate").symlink_to(outside / ".keel" / "skills" / "db-migrate")
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=ScriptedModel([]))
    try:
        state = harness.create("x", cwd=ws)
    finally:
        harness.close()
    assert state.options.skills is None  # a link is not a skill folder: nothing read through it


def test_keel_skills_list_shows_each_skill_and_exits_2_on_a_broken_one(tmp_path: Path) -> None:
    ws = KeelWorkspace(tmp_path)
    add_skill(ws.root)
    listed = expect(ws.keel("skills", "list"), 0)
    assert "db-migrate" in listed and "Migrate the database schema" in listed
    [entry] = json.loads(expect(ws.keel("skills", "list", "--json"), 0))
    assert entry["name"] == "db-migrate" and len(entry["digest"]) == 64

    add_skill(ws.root, "broken", "---\nname: broken\n---\nx\n")
    refused = ws.keel("skills", "list")
    assert refused.returncode == 2 and "1 invalid skill" in refused.stderr
    assert "broken/SKILL.md:3" in " ".join(refused.stdout.split())
    run = ws.keel("run", "x", "--model", ws.script(turn(call("request_completion", summary="s"))))
    assert run.returncode == 2 and "broken/SKILL.md:3" in run.stderr


def test_a_skills_folder_that_leads_out_of_the_workspace_refuses_the_run(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    add_skill(outside)
    ws = tmp_path / "ws"
    (ws / ".keel").mkdir(parents=True)
    (ws / ".keel" / "skills").symlink_to(outside / ".keel" / "skills")
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=ScriptedModel([]))
    try:
        with pytest.raises(ConfigError, match=r"\.keel/skills: .*outside"):
            harness.create("x", cwd=ws)
    finally:
        harness.close()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"---\nname: db-migrate\ndescription: caf\xe9\n---\nx\n", "SKILL.md:3: not UTF-8"),
        (b"---\nname: db-migrate\ndescription: d\n---\n" + b"x" * 300_000, "over the"),
    ],
)
def test_skill_bytes_that_are_not_text_or_too_big_are_refused(
    tmp_path: Path, data: bytes, words: str
) -> None:
    ws = tmp_path / "ws"
    folder = add_skill(ws)
    (folder / "SKILL.md").write_bytes(data)
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=ScriptedModel([]))
    try:
        with pytest.raises(ConfigError, match=words):
            harness.create("x", cwd=ws)
    finally:
        harness.close()


def test_load_skill_of_a_path_or_an_unlisted_name_reads_nothing(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    add_skill(ws)
    (tmp_path / "secret.md").write_text("TOP-SECRET")
    names = ["../../../secret", "db-migrate/../../..", "DB-MIGRATE", "db-migrate\x00", "x" * 64]
    model = ScriptedModel([*(turn(load(name)) for name in names), DONE_TURN])
    harness = Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model)
    try:
        outcome = harness.run("x", cwd=ws, mode="auto")
        events = list(harness.events(outcome.state.run_id))
    finally:
        harness.close()
    assert outcome.state.status.value == "completed", outcome.state.reason
    refused = [e.data for e in events if e.type is EventType.TOOL_FAILED]
    assert len(refused) == len(names)
    assert all("no skill named" in r["message"] for r in refused)
    assert b"TOP-SECRET" not in (tmp_path / "keel.db").read_bytes()
