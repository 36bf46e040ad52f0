"""Loading agent specs from a real workspace's `.keel/agents/` and the package's built-ins."""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator, ValidationError

from keel.core.agent_spec import MAX_SPEC_BYTES, AgentSpec, FailurePolicy, parse_agent_spec
from keel.core.errors import ConfigError
from keel.runtime.agent_specs import builtin_tool_names, list_agent_specs, load_agent_spec

READ_TOOLS = ("read_file", "list_dir", "glob", "grep")


def write_spec(workspace: Path, name: str, text: str) -> Path:
    path = workspace / ".keel" / "agents" / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def spec_text(description: str = "helps", body: str = "Do the thing.", **keys: str) -> str:
    extra = "".join(f"{k}: {v}\n" for k, v in keys.items())
    return f"---\ndescription: {description}\n{extra}---\n{body}\n"


# --- built-ins --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["explorer", "reviewer"])
def test_builtin_goes_through_the_same_parser_as_user_files(name: str, tmp_path: Path) -> None:
    data = (resources.files("keel.runtime") / "builtin_agents" / f"{name}.md").read_bytes()
    spec = load_agent_spec(name, tmp_path)
    assert spec == parse_agent_spec(
        data, name=name, source=f"builtin:{name}", known_tools=builtin_tool_names()
    )
    assert spec.digest == hashlib.sha256(data).hexdigest()
    # the same bytes as a workspace file parse to the same spec, bar the source
    write_spec(tmp_path, name, data.decode())
    user = load_agent_spec(name, tmp_path)
    assert user.source == str(tmp_path / ".keel" / "agents" / f"{name}.md")
    assert (user.digest, user.output, user.tools) == (spec.digest, spec.output, spec.tools)


@pytest.mark.parametrize("name", ["explorer", "reviewer"])
def test_builtins_are_read_only(name: str, tmp_path: Path) -> None:
    spec = load_agent_spec(name, tmp_path)
    assert spec.source == f"builtin:{name}"
    assert spec.tools == READ_TOOLS
    assert spec.mode == "plan"
    assert spec.workspace == "shared-readonly"
    assert spec.output is not None
    Draft202012Validator.check_schema(spec.output)
    assert len(spec.instructions) > 200


def test_explorer_output_requires_findings_with_file_references(tmp_path: Path) -> None:
    schema = load_agent_spec("explorer", tmp_path).output
    assert schema is not None
    validator = Draft202012Validator(schema)
    good = {
        "findings": [
            {"summary": "budget lives in core", "files": [{"path": "src/b.py", "line": 3}]},
            {"summary": "no line needed", "files": [{"path": "README.md"}]},
        ],
        "open_questions": ["who calls it?"],
    }
    validator.validate(good)
    bad_outputs: list[dict[str, object]] = [
        {"findings": [{"summary": "no files", "files": []}], "open_questions": []},
        {"findings": [{"summary": "s", "files": [{"line": 3}]}], "open_questions": []},
        {"findings": []},
        {"findings": [], "open_questions": [], "extra": 1},
    ]
    for bad in bad_outputs:
        with pytest.raises(ValidationError):
            validator.validate(bad)


def test_reviewer_output_has_blocking_issues_other_issues_and_evidence_gaps(
    tmp_path: Path,
) -> None:
    spec = load_agent_spec("reviewer", tmp_path)
    assert spec.output is not None
    validator = Draft202012Validator(spec.output)
    validator.validate(
        {
            "blocking_issues": [{"description": "off by one", "file": "a.py", "line": 9}],
            "other_issues": [{"description": "unclear name"}],
            "evidence_gaps": ["no test covers the empty list"],
        }
    )
    with pytest.raises(ValidationError):
        validator.validate({"blocking_issues": [{"file": "a.py"}], "other_issues": []})
    assert spec.on_failure.policy is FailurePolicy.ESCALATE


# --- workspace files --------------------------------------------------------------------------


def test_workspace_file_overrides_the_builtin(tmp_path: Path) -> None:
    path = write_spec(tmp_path, "explorer", spec_text("our own explorer", tools="[grep]"))
    spec = load_agent_spec("explorer", tmp_path)
    assert (spec.description, spec.tools, spec.source) == ("our own explorer", ("grep",), str(path))
    listed = {s.name: s for s in list_agent_specs(tmp_path) if isinstance(s, AgentSpec)}
    assert listed["explorer"].source == str(path)
    assert listed["reviewer"].source == "builtin:reviewer"


def test_invalid_workspace_file_names_its_path_and_line(tmp_path: Path) -> None:
    path = write_spec(tmp_path, "fixer", spec_text(mode="plan", tools="[read_file, rm_rf]"))
    with pytest.raises(ConfigError) as info:
        load_agent_spec("fixer", tmp_path)
    assert str(info.value) == (
        f"{path}:4: unknown tool 'rm_rf'; known tools: {', '.join(sorted(builtin_tool_names()))}"
    )


def test_unknown_name_lists_the_available_ones(tmp_path: Path) -> None:
    write_spec(tmp_path, "fixer", spec_text())
    with pytest.raises(ConfigError) as info:
        load_agent_spec("tester", tmp_path)
    assert str(info.value) == (
        f"no agent named 'tester': add {tmp_path}/.keel/agents/tester.md or use one of "
        "explorer, fixer, reviewer"
    )


def test_bad_requested_name_is_refused_before_any_file_is_touched(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent name '\.\./x' is not allowed"):
        load_agent_spec("../x", tmp_path)


def test_list_shows_a_broken_file_without_hiding_the_others(tmp_path: Path) -> None:
    write_spec(tmp_path, "good", spec_text())
    broken = write_spec(tmp_path, "broken", "---\ndescription: [oops\n---\nbody\n")
    badly_named = write_spec(tmp_path, "Bad Name", spec_text())
    (tmp_path / ".keel" / "agents" / "notes.txt").write_text("not a spec")
    listed = list_agent_specs(tmp_path)
    errors = [str(s) for s in listed if isinstance(s, ConfigError)]
    names = [s.name for s in listed if isinstance(s, AgentSpec)]
    assert names == ["explorer", "good", "reviewer"]
    assert errors == [
        f"{badly_named}: agent name 'Bad Name' is not allowed: a name is 1 to 63 characters "
        "of a-z, 0-9, '_' and '-', beginning with a letter or digit",
        f"{broken}:2: invalid YAML: expected ',' or ']', but got '<stream end>'",
    ]


def test_retry_agent_may_name_a_workspace_agent_but_not_a_missing_one(tmp_path: Path) -> None:
    write_spec(tmp_path, "fixer", spec_text())
    write_spec(tmp_path, "lead", spec_text(on_failure="{policy: retry, agent: fixer}"))
    assert load_agent_spec("lead", tmp_path).on_failure.agent == "fixer"
    path = write_spec(tmp_path, "lead", spec_text(on_failure="{policy: retry, agent: ghost}"))
    with pytest.raises(ConfigError) as info:
        load_agent_spec("lead", tmp_path)
    assert str(info.value) == (
        f"{path}:3: on_failure.agent names unknown agent 'ghost'; available: explorer, fixer, "
        "lead, reviewer"
    )


def test_known_tools_can_be_widened_by_the_caller(tmp_path: Path) -> None:
    write_spec(tmp_path, "patcher", spec_text(tools="[mcp__github__create_pr]"))
    with pytest.raises(ConfigError, match="unknown tool 'mcp__github__create_pr'"):
        load_agent_spec("patcher", tmp_path)
    known = [*builtin_tool_names(), "mcp__github__create_pr"]
    spec = load_agent_spec("patcher", tmp_path, known_tools=known)
    assert spec.tools == ("mcp__github__create_pr",)


def test_digest_is_of_the_file_bytes_and_changes_with_one_byte(tmp_path: Path) -> None:
    path = write_spec(tmp_path, "fixer", spec_text(body="Fix it."))
    first = load_agent_spec("fixer", tmp_path).digest
    assert first == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_bytes(path.read_bytes().replace(b"Fix it.", b"Fix it!"))
    assert load_agent_spec("fixer", tmp_path).digest not in (first, "")
    assert (
        load_agent_spec("fixer", tmp_path).digest == hashlib.sha256(path.read_bytes()).hexdigest()
    )


# --- refusals of what could leave the workspace or exhaust memory -------------------------------


def test_symlinked_spec_file_is_refused_not_followed(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside.md"
    outside.write_text(spec_text("from outside"))
    link = write_spec(workspace, "placeholder", spec_text()).parent / "spy.md"
    link.symlink_to(outside)
    with pytest.raises(ConfigError) as info:
        load_agent_spec("spy", workspace)
    assert str(info.value) == (
        f"{link}: is a symbolic link; agent specs must be regular files inside the workspace "
        "(a link could lead outside it)"
    )
    listed = list_agent_specs(workspace)
    assert [str(s) for s in listed if isinstance(s, ConfigError)] == [str(info.value)]


@pytest.mark.parametrize("linked", [".keel", ".keel/agents"])
def test_symlinked_agents_directory_is_refused(tmp_path: Path, linked: str) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    write_spec(outside, "spy", spec_text("from outside"))
    workspace.mkdir()
    if linked == ".keel":
        (workspace / ".keel").symlink_to(outside / ".keel")
    else:
        (workspace / ".keel").mkdir()
        (workspace / ".keel" / "agents").symlink_to(outside / ".keel" / "agents")
    with pytest.raises(ConfigError) as info:
        load_agent_spec("spy", workspace)
    assert str(info.value) == (
        f"{workspace / linked}: not a plain directory (a symbolic link or a file); agent "
        "specs are read only from a real .keel/agents directory inside the workspace"
    )
    listed = list_agent_specs(workspace)
    assert [str(listed[0])] == [str(info.value)]
    assert [s.source for s in listed[1:] if isinstance(s, AgentSpec)] == [
        "builtin:explorer",
        "builtin:reviewer",
    ]


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    path = write_spec(tmp_path, "big", spec_text(body="x" * MAX_SPEC_BYTES))
    size = path.stat().st_size
    with pytest.raises(ConfigError) as info:
        load_agent_spec("big", tmp_path)
    assert str(info.value) == (
        f"{path}: {size} bytes, over the limit of {MAX_SPEC_BYTES} bytes for an agent spec"
    )


def test_file_of_exactly_the_limit_is_read(tmp_path: Path) -> None:
    head = spec_text(body="")
    path = write_spec(tmp_path, "full", head + "y" * (MAX_SPEC_BYTES - len(head)))
    assert path.stat().st_size == MAX_SPEC_BYTES
    assert load_agent_spec("full", tmp_path).instructions == "y" * (MAX_SPEC_BYTES - len(head))


def test_fifo_in_place_of_a_spec_is_refused_without_blocking(tmp_path: Path) -> None:
    agents = write_spec(tmp_path, "good", spec_text()).parent
    os.mkfifo(agents / "pipe.md")
    with pytest.raises(ConfigError) as info:
        load_agent_spec("pipe", tmp_path)
    assert str(info.value) == f"{agents / 'pipe.md'}: not a regular file"


def test_missing_workspace_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"workspace .*/nowhere cannot be opened"):
        load_agent_spec("explorer", tmp_path / "nowhere")
