"""A path the policy judges resolves exactly as realpath resolves it, in any tree of links.

``keel.policy.resolution`` looks only at the components inside the workspace and keeps the
workspace's own real path; what the rules and the containment layer see must still be
``realpath(join(realpath(workspace), path))`` — a link the model planted (inside, to the
outside, to ``.git``, dangling, in a loop) must lead the policy where the kernel goes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from keel.policy.containment import path_spellings
from keel.policy.resolution import real_root, resolve

NAMES = st.sampled_from(["a", "b", ".git", "c.txt", "..", ".", "missing", "x y", "é"])
TARGETS = st.sampled_from(
    ["a", "b", "../outside", ".git/config", "/", "loop", "missing/deeper", "a/../b", "c.txt"]
)
# (folder or link, where): links named "l0", "l1"... inside folders a, b and the root.
ENTRIES = st.lists(
    st.tuples(st.sampled_from(["", "a", "b", "a/b"]), TARGETS), min_size=0, max_size=5
)
PATHS = st.lists(NAMES | st.sampled_from(["l0", "l1", "l2", "l3"]), min_size=1, max_size=5)


def _tree(base: Path, links: list[tuple[str, str]]) -> Path:
    workspace = base / "ws"
    for folder in ("a", "b", "a/b", ".git"):
        (workspace / folder).mkdir(parents=True, exist_ok=True)
    (workspace / "c.txt").write_text("x")
    (workspace / ".git" / "config").write_text("[core]\n")
    (base / "outside").mkdir(exist_ok=True)
    for number, (folder, target) in enumerate(links):
        os.symlink(target, workspace / folder / f"l{number}")
    os.symlink("loop", workspace / "loop")  # a link to itself: realpath stops, never fails
    return workspace


@settings(max_examples=400, deadline=None)
@given(links=ENTRIES, parts=PATHS, through_link=st.booleans())
def test_a_path_resolves_as_realpath_resolves_it_through_any_links(
    links: list[tuple[str, str]], parts: list[str], through_link: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        workspace = _tree(base, links)
        if through_link:  # the workspace itself reached through a link to it
            os.symlink(workspace, base / "via")
            workspace = base / "via"
        path = "/".join(parts)
        expected_root = os.path.realpath(workspace)
        expected = os.path.realpath(os.path.join(expected_root, path))
        root, real = resolve(path, workspace)
        assert os.path.relpath(real, root) == os.path.relpath(expected, expected_root)
        assert root == expected_root


def test_a_moved_workspace_is_resolved_again_not_from_what_was_kept(tmp_path: Path) -> None:
    first = tmp_path / "first"
    (first / "src").mkdir(parents=True)
    workspace = tmp_path / "ws"
    os.symlink(first, workspace)
    assert real_root(workspace) == str(first)
    second = tmp_path / "second"
    (second / "src").mkdir(parents=True)
    os.remove(workspace)
    os.symlink(second, workspace)  # the same name, another directory
    assert real_root(workspace) == str(second)
    assert resolve("src", workspace) == (str(second), str(second / "src"))


def test_a_link_to_git_internals_is_judged_as_the_file_it_leads_to(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n")
    (tmp_path / "docs").mkdir()
    os.symlink("../.git/config", tmp_path / "docs" / "notes.txt")
    assert path_spellings("docs/notes.txt", tmp_path) == ("docs/notes.txt", ".git/config")
    assert path_spellings("docs/new.txt", tmp_path) == ("docs/new.txt",)
