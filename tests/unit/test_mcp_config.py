"""``.keel/mcp.toml`` parsing: every mistake is named by file and key, nothing half-read."""

from __future__ import annotations

import pytest

from keel.core.errors import ConfigError
from keel.core.mcp_config import McpServer, ToolOverride, parse_mcp_config

GOOD = """
[servers.files]
command = ["python3", "files.py"]
env = ["FILES_TOKEN"]
cwd = "tools"

[servers.tracker]
url = "https://tracker.example/mcp"
headers = { Authorization = "TRACKER_AUTH" }
timeout_seconds = 30

[servers.tracker.tools.search]
effect = "read"
recovery = "replay_safe"
"""


def test_a_valid_file_gives_each_server_as_written() -> None:
    files, tracker = parse_mcp_config(GOOD, "mcp.toml")
    assert files == McpServer(
        name="files", command=("python3", "files.py"), env=("FILES_TOKEN",), cwd="tools"
    )
    assert tracker.url == "https://tracker.example/mcp" and tracker.timeout_s == 30.0
    assert tracker.headers == (("Authorization", "TRACKER_AUTH"),)
    assert tracker.override("search") == ToolOverride(effect="read", recovery="replay_safe")
    assert tracker.override("create") == ToolOverride(effect="external", recovery="manual")
    assert tracker.tool_name("search") == "mcp__tracker__search"
    assert parse_mcp_config("", "mcp.toml") == ()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[servers.a\n", "not valid TOML"),
        ("[other]\n", "unknown key 'other'"),
        ('[servers."a__b"]\ncommand = ["x"]\n', "no '__'"),
        ("[servers.a]\n", "give either command"),
        ('[servers.a]\ncommand = ["x"]\nurl = "http://h"\n', "give either command"),
        ('[servers.a]\ncommand = "x y"\n', "servers.a.command: a non-empty list"),
        ('[servers.a]\ncommand = ["x", "\\u0000"]\n', "servers.a.command"),
        ('[servers.a]\nurl = "file:///etc/passwd"\n', "servers.a.url"),
        ('[servers.a]\ncommand = ["x"]\ncwd = "../up"\n', "servers.a.cwd"),
        ('[servers.a]\ncommand = ["x"]\nenv = ["NOT A NAME"]\n', "servers.a.env"),
        (
            '[servers.a]\nurl = "http://h"\nheaders = { Authorization = "Bearer sk-1" }\n',
            "never written in the file",
        ),
        ('[servers.a]\ncommand = ["x"]\ntimeout_seconds = 0\n', "timeout_seconds"),
        ('[servers.a]\ncommand = ["x"]\ncolour = 1\n', "unknown key 'colour'"),
        ('[servers.a]\ncommand = ["x"]\n[servers.a.tools.t]\neffect = "god"\n', "t.effect"),
        ('[servers.a]\ncommand = ["x"]\n[servers.a.tools.t]\nrecovery = "x"\n', "t.recovery"),
    ],
)
def test_a_mistake_is_named_by_file_and_key(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=r"^ws/\.keel/mcp\.toml: ") as raised:
        parse_mcp_config(text, "ws/.keel/mcp.toml")
    assert words in str(raised.value)
