"""File tools and the run's PathGuard: protected paths are never written, secrets and
denied paths are left out of listings and searches; FIFOs, absolute links and link
loops are handled without hanging, escaping or crashing.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ToolError
from keel.core.guard import PathGuard
from keel.tools import ToolContext, ToolResult, default_registry
from keel.tools.workspace import current_hash, sha256_file, write_in_workspace

Call = Callable[..., ToolResult]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


def make_ctx(ws: Path, guard: PathGuard | None = None) -> ToolContext:
    return ToolContext(
        workspace=ws, run_id="run_1", call_id="c", owner="me", guard=guard or PathGuard()
    )


def make_call(ws: Path, guard: PathGuard | None = None) -> Call:
    registry, ctx = default_registry(), make_ctx(ws, guard)

    def run(name: str, **args: Any) -> ToolResult:
        return registry.execute(name, args, ctx)

    return run


# --- protected paths ------------------------------------------------------------------


@pytest.fixture
def protected(ws: Path) -> Path:
    """.keel and .git/config exist, .git/hooks does not; links inside lead to them."""
    (ws / ".keel").mkdir()
    (ws / ".keel/policy.toml").write_text("original policy\n")
    (ws / ".git").mkdir()
    (ws / ".git/config").write_text("[core]\n")
    (ws / "sub").mkdir()
    os.symlink(".keel", ws / "keel_link")  # a directory link inside the workspace
    os.symlink(ws / ".keel", ws / "abs_keel_link")  # the same, absolute
    os.symlink(".git/config", ws / "cfg_link")  # a file link
    os.symlink(".git/hooks", ws / "hooks_link")  # dangling: .git/hooks does not exist
    return ws


def untouched(ws: Path) -> None:
    assert (ws / ".keel/policy.toml").read_text() == "original policy\n"
    assert sorted(p.name for p in (ws / ".keel").iterdir()) == ["policy.toml"]
    assert (ws / ".git/config").read_text() == "[core]\n"
    assert sorted(p.name for p in (ws / ".git").iterdir()) == ["config"]  # no hooks/ made


PROTECTED_WRITES = [
    pytest.param(".keel/policy.toml", ".keel/policy.toml", id="keel-direct"),
    pytest.param(".keel/keel.db", ".keel/keel.db", id="keel-new-file"),
    pytest.param(".git/config", ".git/config", id="git-config"),
    pytest.param(".git/hooks/pre-commit", ".git/hooks/pre-commit", id="hooks-missing-dir"),
    pytest.param("./.keel/policy.toml", ".keel/policy.toml", id="dot-slash"),
    pytest.param("sub/../.keel/x", ".keel/x", id="dotdot-spelling"),
    pytest.param(".//.git//config", ".git/config", id="double-slashes"),
    pytest.param(".KEEL/policy.toml", ".keel/policy.toml", id="case"),
    pytest.param("keel_link/policy.toml", ".keel/policy.toml", id="dir-link"),
    pytest.param("abs_keel_link/new.toml", ".keel/new.toml", id="absolute-dir-link"),
    pytest.param("cfg_link", ".git/config", id="file-link"),
    pytest.param("hooks_link/pre-commit", ".git/hooks/pre-commit", id="dangling-link-to-hooks"),
    pytest.param("{ws}/.git/config", ".git/config", id="absolute-path"),
]


@pytest.mark.parametrize(("path", "real"), PROTECTED_WRITES)
def test_write_file_refuses_protected_paths_however_reached(
    protected: Path, path: str, real: str
) -> None:
    path = path.format(ws=protected)
    call = make_call(protected)
    write = default_registry().get("write_file")
    with pytest.raises(ToolError) as info:
        call("write_file", path=path, content="pwned")
    message = str(info.value)
    assert message.startswith(f"refusing to write {path!r}: ")
    assert f"{real} is protected" in message
    with pytest.raises(ToolError, match="refusing to write"):  # the intent refuses too
        write.intent(make_ctx(protected), {"path": path, "content": "pwned"})
    untouched(protected)


@pytest.mark.parametrize(
    "path", [".keel/policy.toml", "keel_link/policy.toml", "sub/../.keel/policy.toml"]
)
def test_edit_file_and_its_intent_refuse_protected_paths(protected: Path, path: str) -> None:
    args = {"path": path, "old_text": "original", "new_text": "pwned"}
    with pytest.raises(ToolError, match=r"refusing to write .*\.keel/policy\.toml is protected"):
        make_call(protected)("edit_file", **args)
    with pytest.raises(ToolError, match="refusing to write"):
        default_registry().get("edit_file").intent(make_ctx(protected), args)
    untouched(protected)


def test_a_link_to_git_config_is_refused_for_edit(protected: Path) -> None:
    with pytest.raises(ToolError, match=r"refusing to write 'cfg_link': \.git/config"):
        make_call(protected)("edit_file", path="cfg_link", old_text="[core]", new_text="[x]")
    untouched(protected)


def test_the_stores_own_files_are_protected_and_other_paths_are_not(ws: Path) -> None:
    call = make_call(ws, PathGuard(store_paths=("data/keel.db",)))
    with pytest.raises(ToolError, match=r"data/keel\.db is part of Keel's store"):
        call("write_file", path="data/keel.db", content="x")
    assert not (ws / "data").exists()  # refused before any directory was made
    for fine in (".gitignore", ".keelrc", "notes/.keel-notes.md", ".git/info/exclude"):
        assert call("write_file", path=fine, content="ok\n").changed_files == {
            fine: hashlib.sha256(b"ok\n").hexdigest()
        }


# --- the harness's own writes ----------------------------------------------------------


def test_write_in_workspace_writes_where_the_path_really_leads(ws: Path) -> None:
    assert write_in_workspace(ws, "plans/PLAN.md", b"# plan\n", PathGuard()) == "plans/PLAN.md"
    assert (ws / "plans/PLAN.md").read_bytes() == b"# plan\n"
    (ws / "docs").mkdir()
    (ws / "plans/PLAN.md").unlink()
    (ws / "plans").rmdir()
    os.symlink("docs", ws / "plans")
    assert write_in_workspace(ws, "plans/PLAN.md", b"v2\n", PathGuard()) == "docs/PLAN.md"
    assert (ws / "docs/PLAN.md").read_bytes() == b"v2\n"


def test_write_in_workspace_refuses_a_link_out_and_protected_paths(
    ws: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, ws / "plans")
    with pytest.raises(ToolError, match="leads outside the workspace"):
        write_in_workspace(ws, "plans/PLAN.md", b"# plan\n", PathGuard())
    assert list(outside.iterdir()) == []
    with pytest.raises(ToolError, match=r"\.keel/PLAN\.md is protected"):
        write_in_workspace(ws, ".keel/PLAN.md", b"x", PathGuard())
    assert not (ws / ".keel").exists()


# --- secrets and denied paths: left out, counted, never opened ---------------------------


@pytest.fixture
def secrets(ws: Path) -> Path:
    (ws / ".env").write_text("API_TOKEN=s3cret-env\n")
    (ws / "config").mkdir()
    (ws / "config/.env.local").write_text("TOKEN=s3cret-local\n")
    (ws / "config/settings.py").write_text("TOKEN = None\n")
    (ws / "secrets").mkdir()  # denied by a policy rule (the guard's hidden paths)
    (ws / "secrets/key.txt").write_text("TOKEN=s3cret-dir\n")
    os.symlink(".env", ws / "env_link")  # a link to a secret is as secret as its target
    (ws / "app.py").write_text("TOKEN = os.environ['API_TOKEN']\n")
    return ws


HIDDEN_NAMES = (".env", "secrets", "env_link", "key.txt", "s3cret")


def shows_nothing_hidden(output: str) -> None:
    for name in HIDDEN_NAMES:
        assert name not in output, (name, output)


def test_list_dir_leaves_out_secrets_and_denied_paths_and_counts_them(secrets: Path) -> None:
    call = make_call(secrets, PathGuard(hidden=("secrets",)))
    out = call("list_dir").output
    assert out.splitlines() == [
        ".:",
        "app.py  (32 bytes)",
        "config/",
        "[3 entries hidden by policy]",
    ]
    assert call("list_dir", path="config").output.splitlines() == [
        "config:",
        "settings.py  (13 bytes)",
        "[1 entries hidden by policy]",
    ]


def test_glob_leaves_out_secrets_and_denied_paths_and_counts_them(secrets: Path) -> None:
    call = make_call(secrets, PathGuard(hidden=("secrets",)))
    everything = call("glob", pattern="**/*").output
    shows_nothing_hidden(everything)
    assert everything.splitlines() == [
        "app.py",
        "config/",
        "config/settings.py",
        "[4 entries hidden by policy]",  # .env, env_link, secrets/, config/.env.local
    ]
    assert call("glob", pattern="*.py").output.splitlines() == [
        "app.py",
        "[1 entries hidden by policy]",  # secrets/: what it holds is not looked at
    ]
    assert call("glob", pattern=".env").output.splitlines() == [
        "no paths match '.env'",
        "[1 entries hidden by policy]",
    ]


def test_grep_leaves_out_secrets_and_denied_paths_and_never_opens_them(secrets: Path) -> None:
    call = make_call(secrets, PathGuard(hidden=("secrets",)))
    opened: list[str] = []
    watching = True

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if watching and event == "open" and isinstance(args[0], str):
            opened.append(os.path.basename(args[0]))

    sys.addaudithook(hook)  # observes every open() in this process; cannot be removed
    try:
        out = call("grep", pattern="TOKEN").output
        none = call("grep", pattern="s3cret").output
        by_name = call("grep", pattern="TOKEN", glob="*.py").output
    finally:
        watching = False
    assert out.splitlines() == [
        "app.py:1: TOKEN = os.environ['API_TOKEN']",
        "config/settings.py:1: TOKEN = None",
        "[2 matching lines in 2 files]",
        "[3 entries hidden by policy]",  # .env, config/.env.local, secrets/
    ]
    assert none.splitlines() == ["no lines match 's3cret' in .", "[3 entries hidden by policy]"]
    assert by_name.splitlines()[-1] == "[1 entries hidden by policy]"  # only secrets/
    assert "app.py" in opened  # the hook does see the tool's opens
    for name in (".env", ".env.local", "env_link", "secrets", "key.txt"):
        assert name not in opened, (name, opened)


def test_a_secret_named_directly_is_read_the_policy_decides_not_the_tool(secrets: Path) -> None:
    call = make_call(secrets, PathGuard(hidden=("secrets",)))
    assert call("read_file", path=".env").output == "     1\tAPI_TOKEN=s3cret-env"
    assert call("grep", pattern="s3cret", path=".env").output.splitlines()[0] == (
        ".env:1: API_TOKEN=s3cret-env"
    )


# --- FIFOs, absolute links, loops ------------------------------------------------------


@pytest.mark.timeout(10)
def test_a_fifo_is_refused_at_once_never_waited_on(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    os.symlink("pipe", ws / "pipe_link")
    (ws / "a.txt").write_text("needle\n")
    call = make_call(ws)
    for path in ("pipe", "pipe_link"):
        with pytest.raises(ToolError, match=f"'{path}' is not a regular file"):
            call("read_file", path=path)
        with pytest.raises(ToolError, match=f"'{path}' is not a regular file"):
            call("edit_file", path=path, old_text="a", new_text="b")
    with pytest.raises(ToolError, match="'pipe' is not a regular file or a directory"):
        call("grep", pattern="x", path="pipe")
    assert call("grep", pattern="needle").output.splitlines()[0] == "a.txt:1: needle"
    assert "pipe  (0 bytes)" in call("list_dir").output.splitlines()
    assert current_hash(ws, "pipe") == ""
    assert sha256_file(ws / "pipe") == ""


def test_absolute_links_inside_the_workspace_work_like_relative_ones(ws: Path) -> None:
    (ws / "sub").mkdir()
    (ws / "sub/f.txt").write_text("inside\n")
    os.symlink(ws / "sub", ws / "abs_dir")
    os.symlink(ws / "sub/f.txt", ws / "abs_file")
    os.symlink(f"../{ws.name}/sub", ws / "detour")  # out by '..' and straight back in
    call = make_call(ws)
    assert call("read_file", path="abs_file").output == "     1\tinside"
    assert call("read_file", path="abs_dir/f.txt").output == "     1\tinside"
    assert call("read_file", path="detour/f.txt").output == "     1\tinside"
    written = call("write_file", path="abs_dir/new.txt", content="new\n")
    assert list(written.changed_files) == ["sub/new.txt"]
    assert (ws / "sub/new.txt").read_text() == "new\n"
    edited = call("edit_file", path="abs_file", old_text="inside", new_text="edited")
    assert list(edited.changed_files) == ["sub/f.txt"]
    assert call("list_dir", path="abs_dir").output.splitlines() == [
        "sub:",
        "f.txt  (7 bytes)",
        "new.txt  (4 bytes)",
    ]
    assert "abs_dir -> sub" in call("list_dir").output.splitlines()
    assert call("grep", pattern="edited", path="abs_dir").output.splitlines()[0] == (
        "sub/f.txt:1: edited"
    )
    assert call("glob", pattern="abs_dir/*.txt").output.splitlines() == [
        "sub/f.txt",
        "sub/new.txt",
    ]


def test_a_link_loop_is_a_tool_error_and_walks_go_on(ws: Path) -> None:
    os.symlink("loop_b", ws / "loop_a")
    os.symlink("loop_a", ws / "loop_b")
    os.symlink("self/x", ws / "self")
    (ws / "ok.txt").write_text("fine\n")
    call = make_call(ws)
    for path in ("loop_a", "loop_b/x", "self"):
        with pytest.raises(ToolError, match="too many levels of symbolic links"):
            call("read_file", path=path)
        with pytest.raises(ToolError, match="too many levels of symbolic links"):
            call("write_file", path=path, content="x")
    assert call("grep", pattern="fine").output.splitlines()[0] == "ok.txt:1: fine"
    assert "ok.txt" in call("glob", pattern="**/*").output
    assert "ok.txt  (5 bytes)" in call("list_dir").output
    assert sorted(p.name for p in ws.iterdir()) == ["loop_a", "loop_b", "ok.txt", "self"]


def test_a_relative_link_climbing_out_is_refused_and_one_coming_back_is_not(
    ws: Path, tmp_path: Path
) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/x.txt").write_text("OUTSIDE\n")
    (ws / "in.txt").write_text("inside\n")
    os.symlink("..", ws / "up")
    call = make_call(ws)
    with pytest.raises(ToolError, match="leads outside the workspace"):
        call("read_file", path="up/outside/x.txt")
    with pytest.raises(ToolError, match="leads outside the workspace"):
        call("write_file", path="up/outside/new.txt", content="x")
    with pytest.raises(ToolError, match="leads outside the workspace"):
        call("list_dir", path="up")
    assert call("read_file", path=f"up/{ws.name}/in.txt").output == "     1\tinside"
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["x.txt"]
