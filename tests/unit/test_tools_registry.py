"""The registry and the @tool declaration: argument models, validation errors, execution."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import Field

from keel.core.errors import InputRequired, ToolArgumentError, ToolError, UsageError
from keel.tools import (
    BUILTIN_TOOLS,
    Effect,
    Recovery,
    ToolContext,
    ToolRegistry,
    ToolResult,
    default_registry,
    tool,
)


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=tmp_path.resolve(), run_id="run_1", call_id="call_1", owner="me")


@tool(effect=Effect.READ)
def greet(
    ctx: ToolContext,
    name: Annotated[str, Field(description="Who to greet.")],
    times: int = 1,
    suffix: str | None = None,
) -> ToolResult:
    """Greet someone a number of times."""
    return ToolResult(output=" ".join([f"hello {name}{suffix or ''}"] * times))


@tool(effect=Effect.EXTERNAL)
def send(ctx: ToolContext, to: str, body: str = "") -> ToolResult:
    """Send a message.

    Args:
        to: The address to send to.
        body: What to say; may span
            several lines.
    """
    return ToolResult(output=f"sent to {to}")


def test_argument_model_is_derived_from_the_signature_with_defaults_and_optionals() -> None:
    fields = greet.args_model.model_fields
    assert list(fields) == ["name", "times", "suffix"]  # ctx is not an argument
    assert fields["name"].is_required()
    assert fields["name"].description == "Who to greet."
    assert fields["times"].default == 1
    assert fields["suffix"].default is None
    parsed = greet.args_model.model_validate({"name": "ada"})
    assert (parsed.name, parsed.times, parsed.suffix) == ("ada", 1, None)  # type: ignore[attr-defined]


def test_spec_carries_description_required_list_and_forbids_extras() -> None:
    spec = greet.spec()
    assert spec["name"] == "greet"
    assert spec["description"] == "Greet someone a number of times."
    params = spec["parameters"]
    assert params["required"] == ["name"]
    assert params["additionalProperties"] is False
    assert params["properties"]["times"] == {"default": 1, "type": "integer"}
    assert params["properties"]["suffix"] == {"type": "string"}  # optional shown plainly
    json.dumps(spec)  # what the model layer sends must be plain JSON


def test_docstring_args_section_gives_argument_descriptions() -> None:
    assert send.description == "Send a message."
    fields = send.args_model.model_fields
    assert fields["to"].description == "The address to send to."
    assert fields["body"].description == "What to say; may span several lines."


def test_default_recovery_follows_the_effect() -> None:
    assert greet.recovery is Recovery.REPLAY_SAFE
    assert send.recovery is Recovery.MANUAL


def test_verify_then_continue_without_an_intent_function_is_refused() -> None:
    with pytest.raises(UsageError, match="needs an intent function"):

        @tool(effect=Effect.WRITE, recovery=Recovery.VERIFY_THEN_CONTINUE)
        def bad(ctx: ToolContext, path: str) -> ToolResult:
            return ToolResult(output="")


def test_unannotated_argument_is_refused_at_declaration() -> None:
    with pytest.raises(UsageError, match="argument 'x' needs a type annotation"):

        @tool(effect=Effect.READ)
        def bad(ctx, x):  # type: ignore[no-untyped-def]
            return ToolResult(output="")


# --- argument errors the model can fix ----------------------------------------------


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry([greet, send])


def test_malformed_json_names_the_json_problem(registry: ToolRegistry) -> None:
    with pytest.raises(ToolArgumentError) as info:
        registry.parse_arguments("greet", '{"name": "ada",')
    message = str(info.value)
    assert message.startswith("arguments for greet are not valid JSON: ")
    assert "line 1 column 16" in message
    assert info.value.tool == "greet"


def test_non_object_json_is_refused(registry: ToolRegistry) -> None:
    with pytest.raises(ToolArgumentError, match="must be a JSON object, got an array"):
        registry.parse_arguments("greet", '["ada"]')


def test_wrong_type_names_the_field_and_the_value(registry: ToolRegistry) -> None:
    with pytest.raises(ToolArgumentError) as info:
        registry.parse_arguments("greet", '{"name": "ada", "times": "often"}')
    assert info.value.problems == (
        "times: Input should be a valid integer, unable to parse string as an integer "
        '(got a string "often")',
    )


def test_missing_required_argument_is_named(registry: ToolRegistry) -> None:
    with pytest.raises(ToolArgumentError) as info:
        registry.parse_arguments("greet", "{}")
    assert str(info.value) == "invalid arguments for greet: name: missing required argument"


def test_extra_argument_is_refused_listing_the_accepted_ones(registry: ToolRegistry) -> None:
    with pytest.raises(ToolArgumentError) as info:
        registry.parse_arguments("greet", {"name": "ada", "loud": True})
    assert info.value.problems == ("loud: unexpected argument (accepted: name, times, suffix)",)


def test_every_violation_is_listed(registry: ToolRegistry) -> None:
    with pytest.raises(ToolArgumentError) as info:
        registry.parse_arguments("greet", {"times": [], "x": 1})
    fields = [problem.split(":")[0] for problem in info.value.problems]
    assert sorted(fields) == ["name", "times", "x"]


def test_empty_argument_text_means_no_arguments(registry: ToolRegistry) -> None:
    assert default_registry().parse_arguments("list_dir", "").model_dump() == {"path": "."}
    with pytest.raises(ToolArgumentError, match="to: missing required argument"):
        registry.parse_arguments("send", "  ")


def test_valid_arguments_parse_to_the_model(registry: ToolRegistry) -> None:
    args = registry.parse_arguments("greet", '{"name": "ada", "times": 2}')
    assert isinstance(args, greet.args_model)
    assert args.model_dump() == {"name": "ada", "times": 2, "suffix": None}


# --- lookup and execution -------------------------------------------------------------


def test_unknown_tool_lists_the_available_ones(registry: ToolRegistry) -> None:
    with pytest.raises(ToolError) as info:
        registry.get("greeet")
    assert str(info.value) == "unknown tool 'greeet'; available: greet, send"


def test_registering_a_name_twice_is_refused(registry: ToolRegistry) -> None:
    with pytest.raises(UsageError, match="'greet' is already registered"):
        registry.register(greet)


def test_execute_validates_then_runs(registry: ToolRegistry, ctx: ToolContext) -> None:
    result = registry.execute("greet", '{"name": "ada", "times": 2, "suffix": "!"}', ctx)
    assert result.output == "hello ada! hello ada!"


def test_execute_turns_a_crash_into_a_tool_error(ctx: ToolContext) -> None:
    @tool(effect=Effect.READ)
    def crash(ctx: ToolContext) -> ToolResult:
        """Always fails."""
        raise ValueError("disk on fire")

    with pytest.raises(ToolError) as info:
        ToolRegistry([crash]).execute("crash", "{}", ctx)
    assert str(info.value) == "crash failed: ValueError: disk on fire"


def test_execute_passes_signals_through(ctx: ToolContext) -> None:
    @tool(effect=Effect.STATE)
    def asks(ctx: ToolContext) -> ToolResult:
        """Needs a person."""
        raise InputRequired(ctx.run_id, "which one?")

    with pytest.raises(InputRequired):
        ToolRegistry([asks]).execute("asks", {}, ctx)


def test_control_tools_have_specs_and_arguments_but_are_not_executed(ctx: ToolContext) -> None:
    registry = default_registry()
    for name, arg in [
        ("request_completion", "summary"),
        ("ask_user", "question"),
        ("plan_exit", "summary"),
    ]:
        item = registry.get(name)
        assert item.control and item.effect is Effect.STATE
        assert item.spec()["parameters"]["required"] == [arg]
        assert registry.parse_arguments(name, {arg: "text"}).model_dump(exclude_none=True) == {
            arg: "text"
        }
        with pytest.raises(ToolArgumentError, match=f"{arg}: String should have at least 1"):
            registry.parse_arguments(name, {arg: ""})
        with pytest.raises(UsageError, match="control tool"):
            registry.execute(name, {arg: "text"}, ctx)


def test_plan_write_is_an_ordinary_write_of_the_plan_file(ctx: ToolContext) -> None:
    item = default_registry().get("plan_write")
    assert not item.control
    assert (item.effect, item.recovery) == (Effect.WRITE, Recovery.VERIFY_THEN_CONTINUE)
    result = item.run(ctx, {"content": "- step one\n"})
    assert (ctx.workspace / "plans" / "PLAN.md").read_text() == "- step one\n"
    assert result.data == {"plan": "- step one\n"}
    assert list(result.changed_files) == ["plans/PLAN.md"]


def test_builtins_have_the_contracted_names_effects_and_recovery() -> None:
    registry = default_registry()
    assert registry.names() == [t.name for t in BUILTIN_TOOLS]
    expected = {
        "read_file": (Effect.READ, Recovery.REPLAY_SAFE, ["path", "offset", "limit"]),
        "list_dir": (Effect.READ, Recovery.REPLAY_SAFE, ["path"]),
        "glob": (Effect.READ, Recovery.REPLAY_SAFE, ["pattern"]),
        "grep": (Effect.READ, Recovery.REPLAY_SAFE, ["pattern", "path", "glob"]),
        "write_file": (Effect.WRITE, Recovery.VERIFY_THEN_CONTINUE, ["path", "content"]),
        "edit_file": (
            Effect.WRITE,
            Recovery.VERIFY_THEN_CONTINUE,
            ["path", "old_text", "new_text"],
        ),
        "apply_patch": (Effect.WRITE, Recovery.VERIFY_THEN_CONTINUE, ["artifact"]),
        "run_command": (Effect.EXECUTE, Recovery.MANUAL, ["argv", "timeout_seconds"]),
        "todo_write": (Effect.STATE, Recovery.IDEMPOTENT, ["todos"]),
    }
    for name, (effect, recovery, args) in expected.items():
        item = registry.get(name)
        assert (item.effect, item.recovery, list(item.args_model.model_fields)) == (
            effect,
            recovery,
            args,
        ), name
        assert not item.control
    assert registry.get("list_dir").args_model.model_validate({}).model_dump() == {"path": "."}


def test_default_registry_is_fresh_and_takes_more_tools() -> None:
    first = default_registry()
    first.register(greet)
    assert "greet" in first
    assert "greet" not in default_registry()


def test_effect_happened_is_only_for_verify_then_continue_tools(ctx: ToolContext) -> None:
    with pytest.raises(UsageError, match="recovery manual"):
        send.effect_happened(ctx, {})
    assert send.intent(ctx, {"to": "x"}) == {}


# --- todo_write -----------------------------------------------------------------------


def test_todo_write_replaces_the_list_and_returns_it(ctx: ToolContext) -> None:
    todos = [
        {"content": "read the manifest", "status": "completed"},
        {"content": "bump the pin", "status": "in_progress"},
        {"content": "add a test", "status": "pending"},
    ]
    result = default_registry().execute("todo_write", json.dumps({"todos": todos}), ctx)
    assert result.data == {"todos": todos}
    assert result.output.splitlines() == [
        "todo list updated (1/3 completed)",
        "[x] read the manifest",
        "[>] bump the pin",
        "[ ] add a test",
    ]


def test_todo_write_refuses_two_in_progress(ctx: ToolContext) -> None:
    todos = [{"content": "a", "status": "in_progress"}, {"content": "b", "status": "in_progress"}]
    with pytest.raises(ToolError) as info:
        default_registry().execute("todo_write", {"todos": todos}, ctx)
    assert str(info.value) == (
        "at most one todo may be in_progress, got 2 ('a', 'b'); "
        "keep one in_progress and mark the others pending or completed"
    )


def test_todo_write_refuses_an_unknown_status(ctx: ToolContext) -> None:
    with pytest.raises(ToolArgumentError) as info:
        default_registry().execute(
            "todo_write", {"todos": [{"content": "a", "status": "done"}]}, ctx
        )
    assert info.value.problems[0].startswith(
        "todos.0.status: Input should be 'pending', 'in_progress' or 'completed'"
    )


def test_todo_write_accepts_an_empty_list(ctx: ToolContext) -> None:
    result = default_registry().execute("todo_write", {"todos": []}, ctx)
    assert result.data == {"todos": []}


def test_parse_accepts_an_already_validated_model(registry: ToolRegistry) -> None:
    args = registry.parse_arguments("greet", {"name": "x"})
    assert registry.parse_arguments("greet", args) is args
