"""A run whose workspace is a git source: queued from one place, executed by a `keel worker`
process that checks the source out itself; the change comes back as the diff artifact in
the store, and the source repository is never written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from keel.core.errors import ConfigError
from keel.core.status import RunStatus
from keel.core.verifiers import evidence_map
from keel.runtime.git_source import parse_source
from keel.runtime.harness import Harness
from keel.testing.agents import write_script

KEEL = str(Path(sys.executable).with_name("keel"))
EDIT = [
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "README"}}]},
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "made\n"}}]},
    {"tool_calls": [{"name": "request_completion", "arguments": {"summary": "made out.txt"}}]},
]


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@e", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    (work / "README").write_text("main branch\n")
    git("add", "README", cwd=work)
    git("commit", "-qm", "main", cwd=work)
    git("checkout", "-q", "-b", "feature", cwd=work)
    (work / "README").write_text("feature branch\n")
    git("commit", "-qam", "feature", cwd=work)
    bare = tmp_path / "origin.git"
    git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    return bare


def test_a_worker_checks_the_source_out_and_the_change_comes_back_as_a_diff(
    tmp_path: Path, origin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    roots = tmp_path / "checkouts"
    monkeypatch.setenv("KEEL_GIT_WORKSPACES", str(roots))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config_dir = tmp_path / "here"
    config_dir.mkdir()
    store = f"sqlite:///{tmp_path / 'keel.db'}"
    model = write_script(tmp_path / "edit.json", EDIT)
    before = git("for-each-ref", cwd=origin)
    with Harness(store=store) as h:
        queued = h.create(
            "make out.txt",
            cwd=config_dir,
            model=model,
            queued=True,
            workspace_git=f"{origin}@feature",
            verify=["test -f out.txt"],
        )
    assert Path(queued.workspace).parent == roots and not Path(queued.workspace).exists()
    env = {**os.environ, "KEEL_GIT_WORKSPACES": str(roots)}
    env["XDG_CACHE_HOME"] = str(tmp_path / "worker-cache")  # the worker's own mirror
    done = subprocess.run(
        [KEEL, "worker", "--store", store, "--until-idle"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with Harness(store=store) as h:
        run = h.get(queued.run_id)
        assert run.status is RunStatus.COMPLETED, run.reason
        # the model read the feature branch's README
        read = next(e for e in h.events(run.run_id) if e.data.get("tool") == "read_file")
        assert "feature branch" in read.data["output"]
        diffs = [ref for ref in evidence_map(run.result).values() if ref.startswith("art")]
        texts = [h.store.get_artifact(ref.removeprefix("artifact:"))[1] for ref in diffs]
        assert any(b"out.txt" in text and b"made" in text for text in texts)
    assert not Path(queued.workspace).exists()  # checked out for the run, removed after
    assert git("for-each-ref", cwd=origin) == before  # the source is never written


def test_an_unknown_ref_fails_the_run_naming_it(
    tmp_path: Path, origin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEEL_GIT_WORKSPACES", str(tmp_path / "checkouts"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = write_script(tmp_path / "edit.json", EDIT)
    with Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model) as h:
        state = h.create("x", cwd=tmp_path, workspace_git=f"{origin}@no-such-branch")
        with pytest.raises(ConfigError, match="no commit named 'no-such-branch'"):
            h.execute(state.run_id)
        assert h.get(state.run_id).last_seq == 1  # nothing written


@pytest.mark.parametrize(
    ("given", "url", "ref"),
    [
        ("https://host/org/repo.git@release/2.1", "https://host/org/repo.git", "release/2.1"),
        ("https://host/org/repo.git", "https://host/org/repo.git", None),
        ("git@host:org/repo.git", "git@host:org/repo.git", None),
        ("git@host:org/repo.git@v2", "git@host:org/repo.git", "v2"),
    ],
)
def test_sources_are_read_as_url_and_ref(given: str, url: str, ref: str | None) -> None:
    source = parse_source(given)
    assert (source.url, source.ref) == (url, ref)


def test_an_empty_source_or_ref_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs a URL"):
        parse_source("  ")
    with pytest.raises(ConfigError, match="REF after @ is empty"):
        parse_source("https://host/repo.git@ ")


def test_an_option_shaped_source_is_never_read_as_a_git_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEEL_GIT_WORKSPACES", str(tmp_path / "checkouts"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    marker = tmp_path / "ran"
    model = write_script(tmp_path / "edit.json", EDIT)
    with Harness(store=f"sqlite:///{tmp_path / 'keel.db'}", model=model) as h:
        state = h.create("x", cwd=tmp_path, workspace_git=f"--upload-pack=touch {marker}")
        with pytest.raises(ConfigError):
            h.execute(state.run_id)
    assert not marker.exists()


RACER = """
import sys, time
from pathlib import Path
from keel.runtime.git_source import materialize, parse_source
start, source, path = float(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
time.sleep(max(0.0, start - time.time()))
materialize(parse_source(source), path)
print((path / "README").read_text(), end="")
"""


def test_runs_of_one_source_checked_out_at_once_all_get_their_checkout(
    tmp_path: Path, origin: Path
) -> None:
    # keel eval's attempts and a machine's workers start runs of one source together; git
    # refuses concurrent writers of one repository, so each must wait its turn at the mirror.
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    start = __import__("time").time() + 1.0
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(start), f"{origin}@feature", str(tmp_path / f"c{i}")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    results = [(p.wait(timeout=120), *p.communicate()) for p in racers]
    assert [(code, out, err) for code, out, err in results] == [(0, "feature branch\n", "")] * 6
