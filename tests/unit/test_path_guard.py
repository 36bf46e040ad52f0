"""PathGuard: which workspace paths the model may never write, and which the
directory-wide tools leave out (secrets and paths a policy denies reading)."""

from __future__ import annotations

import pytest

from keel.core.guard import DEFAULT_SECRET, PathGuard


def test_a_protected_path_is_refused_saying_which_pattern_covers_it_and_why() -> None:
    guard = PathGuard()
    assert guard.write_refusal(".keel/keel.db") == (
        ".keel/keel.db is protected ('.keel'): the harness's own configuration and records, "
        "and git's configuration and hooks, are never written by the model"
    )
    assert guard.write_refusal(".git/hooks/pre-commit") is not None
    assert guard.write_refusal("src/app.py") is None


def test_the_stores_own_files_in_the_workspace_are_refused_as_the_stores() -> None:
    guard = PathGuard(store_paths=("data/keel.db",))
    assert guard.write_refusal("data/keel.db") == (
        "data/keel.db is part of Keel's store (data/keel.db); the model never writes it"
    )
    assert guard.write_refusal("data/other.db") is None


@pytest.mark.parametrize(
    ("path", "listable"),
    [
        ("src/app.py", True),
        (".env", False),  # a secret
        ("config/.env.local", False),
        ("vault/key.pem", False),  # a policy's secret
        ("private/notes.txt", False),  # a path the policy denies reading
        ("private2/notes.txt", True),
    ],
)
def test_secrets_and_denied_paths_are_left_out_of_listings(path: str, listable: bool) -> None:
    guard = PathGuard(secret=(*DEFAULT_SECRET, "vault"), hidden=("private",))
    assert guard.listable(path) is listable
