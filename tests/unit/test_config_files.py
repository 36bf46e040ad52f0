"""The workspace's hook and MCP files, run tags and an event's JSON form: what each
accepts, and the precise refusal for what it does not (keel.core, pure)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from keel.core.errors import ConfigError
from keel.core.events import Event, EventType
from keel.core.hooks_config import HookEntry, parse_hooks_config
from keel.core.mcp_config import McpServer, ToolOverride, parse_mcp_config
from keel.core.middleware import Point
from keel.core.tags import MAX_TAG_VALUE, MAX_TAGS, check_tags

HOOKS = ".keel/hooks.toml"
MCP = ".keel/mcp.toml"


def hooks_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        parse_hooks_config(text, HOOKS)


def hook(extra: str = "", point: str = "before_tool") -> str:
    return f'[[hooks]]\nname = "lint"\npoint = "{point}"\ncommand = ["lint"]\n{extra}\n'


def test_a_hook_entry_gets_its_defaults() -> None:
    config = parse_hooks_config(hook(), HOOKS)
    assert config.hooks == (
        HookEntry(name="lint", point=Point.BEFORE_TOOL, command=("lint",), order=0),
    )


def test_a_file_that_is_not_toml_is_refused_saying_so() -> None:
    with pytest.raises(ConfigError, match=rf"^{re.escape(HOOKS)}: not valid TOML: "):
        parse_hooks_config("[[hooks", HOOKS)


def test_the_first_unknown_top_level_key_is_named() -> None:
    hooks_refused(
        "zeta = 1\nalpha = 2\n",
        f"{HOOKS}: unknown key 'alpha'; the file has [[hooks]], [middleware] and [write_size]",
    )


def test_an_unknown_point_names_every_point() -> None:
    points = ", ".join(p.value for p in Point)
    hooks_refused(
        hook(point="whenever"),
        f"{HOOKS}: hooks[0] (lint).point: one of {points}, got 'whenever'",
    )


@pytest.mark.parametrize("command", ['"lint --fix"', "[]", '["lint", ""]'])
def test_a_command_is_a_non_empty_argv_list(command: str) -> None:
    hooks_refused(
        f'[[hooks]]\nname = "lint"\npoint = "after_tool"\ncommand = {command}\n',
        f"{HOOKS}: hooks[0] (lint).command: a non-empty argv list of strings",
    )


def test_tool_names_must_not_be_empty() -> None:
    hooks_refused(
        hook('tools = ["write_file", ""]'), f"{HOOKS}: hooks[0] (lint).tools: a list of tool names"
    )


@pytest.mark.parametrize("seconds", [0.5, 600])
def test_a_timeout_above_zero_and_up_to_ten_minutes_is_accepted(seconds: float) -> None:
    [entry] = parse_hooks_config(hook(f"timeout_seconds = {seconds}"), HOOKS).hooks
    assert entry.timeout_s == seconds


def test_middleware_names_must_be_entry_point_names() -> None:
    for names in ('["bad name!"]', "[3]"):
        hooks_refused(
            f"[middleware]\nuse = {names}\n",
            f"{HOOKS}: middleware.use: a list of entry point names (group keel.middleware)",
        )


@pytest.mark.parametrize("table", ["write_size = 5", "[write_size]\nmax_bytes = 1\nmin_bytes = 0"])
def test_write_size_is_a_table_with_max_bytes_only(table: str) -> None:
    hooks_refused(table, f"{HOOKS}: write_size: a table with max_bytes only")


@pytest.mark.parametrize("value", ['"1"', "0", "true"])
def test_max_bytes_is_a_whole_number_from_one(value: str) -> None:
    hooks_refused(
        f"[write_size]\nmax_bytes = {value}\n",
        f"{HOOKS}: write_size.max_bytes: a whole number of bytes, 1 or more",
    )


def test_one_byte_is_a_write_size() -> None:
    assert parse_hooks_config("[write_size]\nmax_bytes = 1\n", HOOKS).write_max_bytes == 1


# --- mcp.toml ---------------------------------------------------------------------------------


def mcp_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        parse_mcp_config(text, MCP)


def test_an_http_server_has_no_command_and_a_tool_override_defaults_to_manual_recovery() -> None:
    [server] = parse_mcp_config(
        '[servers.docs]\nurl = "https://docs.example.com/mcp"\n[servers.docs.tools.search]\n'
        'effect = "read"\n',
        MCP,
    )
    assert server == McpServer(
        name="docs",
        url="https://docs.example.com/mcp",
        tools={"search": ToolOverride(effect="read", recovery="manual")},
    )
    assert server.command == ()


def test_servers_must_be_a_table() -> None:
    mcp_refused("servers = 3\n", f"{MCP}: servers must be a table of [servers.NAME]")


def test_a_server_name_has_at_most_32_characters() -> None:
    name = "s" * 32
    assert parse_mcp_config(f'[servers.{name}]\ncommand = ["x"]\n', MCP)[0].name == name
    mcp_refused(
        f'[servers.{name}s]\ncommand = ["x"]\n',
        f"{MCP}: servers.{name}s: a server name is 1-32 of A-Z a-z 0-9 - and single _ (no '__')",
    )


def test_a_server_entry_must_be_a_table_with_known_keys() -> None:
    mcp_refused('[servers]\ndocs = "x"\n', f"{MCP}: servers.docs: must be a table")
    mcp_refused(
        '[servers.docs]\ncommand = ["x"]\nport = 1\n',
        f"{MCP}: servers.docs: unknown key 'port'; known: command, cwd, env, headers, "
        "timeout_seconds, tools, url",
    )


@pytest.mark.parametrize("cwd", ["/srv", "a/../../b", "..", 3])
def test_a_servers_directory_is_inside_the_workspace(cwd: object) -> None:
    value = f'"{cwd}"' if isinstance(cwd, str) else str(cwd)
    mcp_refused(
        f'[servers.docs]\ncommand = ["x"]\ncwd = {value}\n',
        f"{MCP}: servers.docs.cwd: a path inside the workspace, relative to it",
    )


def test_headers_name_variables_never_values() -> None:
    mcp_refused(
        '[servers.docs]\nurl = "https://x"\n[servers.docs.headers]\nAuthorization = "Bearer x"\n',
        f"{MCP}: servers.docs.headers: a table of header name = environment variable name (the "
        "value is read from the variable, never written in the file)",
    )


@pytest.mark.parametrize("seconds", [0, -1, 3600.5, '"60"', "true"])
def test_a_server_timeout_is_above_zero_and_at_most_an_hour(seconds: object) -> None:
    mcp_refused(
        f'[servers.docs]\ncommand = ["x"]\ntimeout_seconds = {seconds}\n',
        f"{MCP}: servers.docs.timeout_seconds: a number of seconds above 0, at most 3600",
    )


@pytest.mark.parametrize("seconds", [0.5, 3600])
def test_a_server_timeout_within_the_range_is_kept(seconds: float) -> None:
    [server] = parse_mcp_config(
        f'[servers.docs]\ncommand = ["x"]\ntimeout_seconds = {seconds}\n', MCP
    )
    assert server.timeout_s == seconds


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ("tools = 3", "servers.docs.tools: a table of [..tools.TOOL] tables"),
        (
            "tools = {search = 3}",
            "servers.docs.tools.search: a table with effect and/or recovery only",
        ),
        (
            "tools = {search = {cost = 1}}",
            "servers.docs.tools.search: a table with effect and/or recovery only",
        ),
        (
            'tools = {search = {effect = "fly"}}',
            "servers.docs.tools.search.effect: one of read, write, execute, external, state",
        ),
        (
            'tools = {search = {recovery = "pray"}}',
            "servers.docs.tools.search.recovery: one of replay_safe, idempotent, manual",
        ),
    ],
)
def test_a_bad_tool_override_is_refused_saying_what_it_may_be(tools: str, message: str) -> None:
    mcp_refused(f'[servers.docs]\ncommand = ["x"]\n{tools}\n', f"{MCP}: {message}")


# --- tags -------------------------------------------------------------------------------------


def test_a_run_has_at_most_32_tags() -> None:
    assert check_tags({f"t{i}": "v" for i in range(MAX_TAGS)}) is not None
    with pytest.raises(ConfigError, match=r"^a run has at most 32 tags, got 33$"):
        check_tags({f"t{i}": "v" for i in range(MAX_TAGS + 1)})


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        (
            {"Suite": "x"},
            "tag key 'Suite': a lowercase name ([a-z][a-z0-9_.-], at most 32 characters)",
        ),
        ({"suite": 3}, "tag 'suite': the value must be text, got int"),
        (
            {"suite": "x" * (MAX_TAG_VALUE + 1)},
            "tag 'suite': the value must be at most 200 characters, without control characters",
        ),
        (
            {"suite": "a\x1fb"},
            "tag 'suite': the value must be at most 200 characters, without control characters",
        ),
        (
            {"suite": "a\x7fb"},
            "tag 'suite': the value must be at most 200 characters, without control characters",
        ),
    ],
)
def test_a_bad_tag_is_refused_saying_what_a_tag_is(tags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        check_tags(tags)


def test_a_tag_value_may_have_spaces_and_be_200_characters() -> None:
    tags = {"case": "a b" + "x" * (MAX_TAG_VALUE - 4) + "\x80"}
    assert check_tags(tags) == tags


# --- an event as JSON -------------------------------------------------------------------------


def test_an_event_as_json_names_every_field() -> None:
    event = Event(
        run_id="run_1",
        seq=3,
        event_id="ev_3",
        type=EventType.NOTE_ADDED,
        recorded_at=datetime(2025, 6, 1, 12, 0, tzinfo=UTC),
        data={"text": "hi"},
        hash="ab" * 32,
    )
    assert event.to_dict() == {
        "run_id": "run_1",
        "seq": 3,
        "event_id": "ev_3",
        "type": "note_added",
        "recorded_at": "2025-06-01T12:00:00+00:00",
        "data": {"text": "hi"},
        "hash": "ab" * 32,
    }
