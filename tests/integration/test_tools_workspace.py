"""The workspace boundary: no read, write, listing or search reaches outside it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keel.core.errors import ToolError
from keel.tools import ToolContext, ToolResult, default_registry, resolve_in_workspace, sha256_file

Call = Callable[..., ToolResult]


@dataclass
class Layout:
    ws: Path
    outside: Path
    secret: Path


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    """A workspace with links leading out, next to a directory holding a secret."""
    ws = (tmp_path / "ws").resolve()
    outside = (tmp_path / "outside").resolve()
    ws.mkdir()
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("SECRET-VALUE\n")
    (ws / "inside.txt").write_text("inside\n")
    (ws / "sub").mkdir()
    os.symlink(secret, ws / "file_link")  # file symlink to outside
    os.symlink(outside, ws / "dir_link")  # directory symlink to outside
    os.symlink(outside / "not-yet.txt", ws / "dangling")  # dangling, pointing outside
    os.symlink(ws / "inside.txt", ws / "ok_link")  # stays inside
    return Layout(ws, outside, secret)


@pytest.fixture
def call(layout: Layout) -> Call:
    registry = default_registry()
    ctx = ToolContext(workspace=layout.ws, run_id="run_1", call_id="c", owner="me")

    def run(name: str, **args: Any) -> ToolResult:
        return registry.execute(name, args, ctx)

    return run


def _outside_untouched(layout: Layout) -> None:
    assert sorted(p.name for p in layout.outside.iterdir()) == ["secret.txt"]
    assert layout.secret.read_text() == "SECRET-VALUE\n"


ESCAPES = [
    pytest.param("../outside/secret.txt", "is outside the workspace", id="dotdot"),
    pytest.param("sub/../../outside/secret.txt", "is outside the workspace", id="nested-dotdot"),
    pytest.param("{outside}/secret.txt", "is outside the workspace", id="absolute"),
    pytest.param("file_link", "leads outside the workspace", id="file-symlink"),
    pytest.param("dir_link/secret.txt", "leads outside the workspace", id="dir-symlink"),
]


@pytest.mark.parametrize(("path", "reason"), ESCAPES)
def test_read_file_refuses_paths_leading_outside(
    layout: Layout, call: Call, path: str, reason: str
) -> None:
    path = path.format(outside=layout.outside)
    with pytest.raises(ToolError) as info:
        call("read_file", path=path)
    assert str(info.value).startswith(f"path {path!r} {reason} {layout.ws}")
    assert "SECRET-VALUE" not in str(info.value)


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        *ESCAPES,
        pytest.param("dangling", "leads outside the workspace", id="dangling-symlink"),
        pytest.param("dir_link/new.txt", "leads outside the workspace", id="new-file-via-link"),
        pytest.param("../new.txt", "is outside the workspace", id="new-file-dotdot"),
    ],
)
def test_write_and_edit_refuse_paths_leading_outside(
    layout: Layout, call: Call, path: str, reason: str
) -> None:
    path = path.format(outside=layout.outside)
    with pytest.raises(ToolError, match=reason):
        call("write_file", path=path, content="pwned")
    with pytest.raises(ToolError, match=reason):
        call("edit_file", path=path, old_text="SECRET", new_text="pwned")
    _outside_untouched(layout)
    assert not (layout.ws.parent / "new.txt").exists()


def test_escape_message_names_the_path_and_the_workspace(layout: Layout) -> None:
    with pytest.raises(ToolError) as info:
        resolve_in_workspace(layout.ws, "../x", for_write=False)
    assert str(info.value) == f"path '../x' is outside the workspace {layout.ws}"


def test_dotdot_after_a_link_is_judged_where_the_link_really_leads(layout: Layout) -> None:
    # "deeper_link/.." is lexically the workspace, but really the outside directory
    (layout.outside / "deeper").mkdir()
    os.symlink(layout.outside / "deeper", layout.ws / "deeper_link")
    os.symlink(layout.ws.parent, layout.ws / "up")
    with pytest.raises(ToolError, match="leads outside the workspace"):
        resolve_in_workspace(layout.ws, "deeper_link/../secret.txt", for_write=False)
    with pytest.raises(ToolError, match="leads outside the workspace"):
        resolve_in_workspace(layout.ws, "up/outside/secret.txt", for_write=False)
    # a detour that really ends inside the workspace is fine
    assert resolve_in_workspace(layout.ws, "up/ws/inside.txt", for_write=False) == (
        layout.ws / "inside.txt"
    )


def test_paths_inside_are_accepted_however_written(layout: Layout, call: Call) -> None:
    ws = layout.ws
    assert resolve_in_workspace(ws, f"{ws}/inside.txt", for_write=False) == ws / "inside.txt"
    assert resolve_in_workspace(ws, "sub/../inside.txt", for_write=False) == ws / "inside.txt"
    assert resolve_in_workspace(ws, "ok_link", for_write=False) == ws / "inside.txt"
    assert resolve_in_workspace(ws, "sub/new/x.txt", for_write=True) == ws / "sub/new/x.txt"
    assert call("read_file", path="ok_link").output == "     1\tinside"
    call("write_file", path="ok_link", content="via link\n")  # writes the target, inside
    assert (ws / "inside.txt").read_text() == "via link\n"
    assert sha256_file(ws / "inside.txt") == sha256_file(ws / "ok_link")


def test_workspace_itself_is_not_a_file_to_write(layout: Layout) -> None:
    with pytest.raises(ToolError, match="is the workspace itself"):
        resolve_in_workspace(layout.ws, ".", for_write=True)
    with pytest.raises(ToolError, match="path is empty"):
        resolve_in_workspace(layout.ws, "", for_write=False)


def test_list_dir_does_not_follow_links_out(layout: Layout, call: Call) -> None:
    out = call("list_dir").output.splitlines()
    assert "dir_link (symbolic link leading outside the workspace)" in out
    assert "file_link (symbolic link leading outside the workspace)" in out
    assert "dangling (symbolic link leading outside the workspace)" in out
    assert "ok_link -> inside.txt" in out
    assert not any("secret" in line for line in out)
    with pytest.raises(ToolError, match="leads outside the workspace"):
        call("list_dir", path="dir_link")


def test_glob_does_not_return_or_descend_into_links_out(layout: Layout, call: Call) -> None:
    everything = call("glob", pattern="**/*").output
    assert "secret" not in everything
    assert "dir_link" not in everything and "file_link" not in everything
    assert "ok_link" in everything
    assert "[3 symbolic links leading outside the workspace not shown]" in everything
    with pytest.raises(ToolError, match="leads outside the workspace"):
        call("glob", pattern="dir_link/*")
    with pytest.raises(ToolError, match="is outside the workspace"):
        call("glob", pattern="../outside/*")
    with pytest.raises(ToolError, match="is outside the workspace"):
        call("glob", pattern=f"{layout.outside}/*")


def test_grep_does_not_read_through_links_out(layout: Layout, call: Call) -> None:
    assert call("grep", pattern="SECRET").output == "no lines match 'SECRET' in ."
    with pytest.raises(ToolError, match="leads outside the workspace"):
        call("grep", pattern="SECRET", path="dir_link")
    with pytest.raises(ToolError, match="leads outside the workspace"):
        call("grep", pattern="SECRET", path="file_link")
