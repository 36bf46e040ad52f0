"""The eval runner in-process on a real SQLite file: it executes exactly its own runs, and
a configuration that cannot run is an error naming where in the suite file it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keel.core.errors import ConfigError
from keel.core.status import RunStatus
from keel.runtime.eval_runner import EvalRunner, load_suite
from keel.runtime.harness import Harness
from keel.store.url import open_store
from keel.testing.cli import DONE, call, turn


@pytest.fixture
def suite_dir(tmp_path: Path) -> Path:
    home = tmp_path / "suite"
    (home / "ws").mkdir(parents=True)
    (home / "ws" / "README").write_text("fixture\n", encoding="utf-8")
    writes = [turn(call("write_file", path="fix.txt", content="fixed\n")), DONE]
    (home / "writes.json").write_text(json.dumps(writes), encoding="utf-8")
    return home


def write_suite(home: Path, body: str) -> Path:
    path = home / "suite.toml"
    path.write_text(
        '[defaults]\nworkspace = "ws"\nmodel = "scripted:writes.json"\n'
        'verify = ["check=grep -q fixed fix.txt"]\n' + body,
        encoding="utf-8",
    )
    return path


def runner(
    path: Path,
    url: str,
    tmp_path: Path,
    *,
    compare: list[str] | None = None,
    repetitions: int | None = None,
    concurrency: int = 4,
) -> EvalRunner:
    suite = load_suite(path)
    return EvalRunner(
        suite,
        suite.chosen_configs(compare),
        store=url,
        workdir=tmp_path / "attempts",
        repetitions=repetitions,
        concurrency=concurrency,
    )


def test_eval_executes_its_own_runs_and_leaves_other_queued_work_alone(
    suite_dir: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/keel.db"
    with Harness(store=url) as other:
        foreign = other.create(
            "someone else's run", cwd=suite_dir / "ws", model="scripted:x.json", queued=True
        )
    path = write_suite(suite_dir, '[[cases]]\nname = "a"\ngoal = "write fix.txt"\n')
    with runner(path, url, tmp_path, repetitions=3, concurrency=2) as eval_runner:
        report = eval_runner.run()
    assert report.passed and len(report.configs[0].attempts) == 3
    store = open_store(url)
    try:
        assert store.load_run(foreign.run_id).status is RunStatus.QUEUED
        workspaces = {store.load_run(str(r.run_id)).workspace for r in report.configs[0].attempts}
    finally:
        store.close()
    assert workspaces == {
        str(tmp_path / "attempts" / "default" / "a" / f"attempt-{n}") for n in (1, 2, 3)
    }


def test_an_attempt_whose_workspace_cannot_run_ends_failed_with_config_error(
    suite_dir: Path, tmp_path: Path
) -> None:
    (suite_dir / "ws" / ".keel").mkdir()
    (suite_dir / "ws" / ".keel" / "hooks.toml").write_text(
        "[[hooks]]\nname = 3\n", encoding="utf-8"
    )
    path = write_suite(suite_dir, '[[cases]]\nname = "a"\ngoal = "write fix.txt"\n')
    url = f"sqlite:///{tmp_path}/keel.db"
    with runner(path, url, tmp_path) as eval_runner:
        report = eval_runner.run()
    (result,) = report.configs[0].attempts
    assert result.status == "failed" and result.stop_kind == "config_error"
    assert "hooks.toml" in (result.reason or "")
    assert not report.passed


def test_a_case_that_cannot_be_queued_cancels_the_runs_queued_before_it(
    suite_dir: Path, tmp_path: Path
) -> None:
    path = write_suite(
        suite_dir,
        '[[cases]]\nname = "a"\ngoal = "g"\n[[cases]]\nname = "b"\ngoal = "g"\nagent = "nobody"\n',
    )
    url = f"sqlite:///{tmp_path}/keel.db"
    with runner(path, url, tmp_path) as eval_runner, pytest.raises(ConfigError) as caught:
        eval_runner.run()
    assert str(caught.value).startswith(f"{path}: cases[1]: ")
    store = open_store(url)
    try:
        (only,) = store.list_runs()
        assert only.status is RunStatus.CANCELLED and only.options.tags == {
            "suite": "suite",
            "case": "a",
            "attempt": "1",
            "config": "default",
        }
    finally:
        store.close()


def test_an_unknown_middleware_names_its_configuration(suite_dir: Path, tmp_path: Path) -> None:
    path = write_suite(
        suite_dir,
        '[[cases]]\nname = "a"\ngoal = "g"\n[configs.a]\n[configs.b]\nmiddleware = ["no-such"]\n',
    )
    with pytest.raises(ConfigError, match=r"suite.toml: configs.b.middleware: "):
        runner(path, f"sqlite:///{tmp_path}/keel.db", tmp_path, compare=["a", "b"])


def test_harness_refuses_a_bad_tag_before_storing_anything(suite_dir: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/keel.db"
    with Harness(store=url, model="scripted:x.json") as harness:
        with pytest.raises(ConfigError, match="tag key 'Suite'"):
            harness.create("g", cwd=suite_dir / "ws", queued=True, tags={"Suite": "x"})
        assert harness.store.list_runs() == []
        made = harness.create("g", cwd=suite_dir / "ws", queued=True, tags={"suite": "x"})
        assert harness.get(made.run_id).options.tags == {"suite": "x"}
