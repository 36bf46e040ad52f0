"""Running an evaluation suite (``keel eval``): every attempt an ordinary run, tagged.

For each configuration, case and attempt the runner makes a fresh workspace (a copy of
the case's folder committed to a new git repository, so the run's diff is its own; or,
for a ``git`` case, an empty folder the run's checkout is made for) and queues a run
tagged ``suite``, ``case``, ``attempt`` and ``config`` — ``keel show``, ``keel runs --tag``
and the console open it like any other. Everything is checked and queued before the
first run starts; a run that cannot be queued cancels the ones queued before it.

``concurrency`` threads then execute exactly these runs (``Harness.execute``, one
lease each). Not a ``keel.runtime.worker.Worker``: a worker takes the oldest queued run
or ready task of the whole store, so on a shared store an eval would execute other
people's work, and two configurations with different middleware need two harnesses. A
``keel worker`` on the same store may still take some of the suite's queued runs: the
lease decides, and the runner waits for such a run to stop before reading it.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from keel.core.errors import ConfigError, KeelError, LeaseHeld
from keel.core.eval_report import AttemptResult, EvalReport, build_report
from keel.core.eval_suite import (
    AttemptSettings,
    EvalCase,
    EvalConfig,
    EvalSuite,
    attempt_settings,
    parse_suite,
)
from keel.core.events import EventType, NewEvent
from keel.core.state import RunState, transition
from keel.core.status import RunStatus
from keel.models.resolve import resolve_model
from keel.policy.modes import parse_mode
from keel.runtime.harness import Harness
from keel.store.base import Store

DRIVEN = frozenset({RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.VERIFYING})
POLL_S = 0.2  # how often a run another process executes is looked at
# A fixture's .keel (config, policy, agents, hooks) is copied; a store in it is not.
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.db", "*.db-wal", "*.db-shm")
T = TypeVar("T")
_GIT_IDENTITY = ("-c", "user.name=Keel eval", "-c", "user.email=eval@keel.invalid")


def load_suite(path: Path) -> EvalSuite:
    """The suite file at ``path`` (relative paths in it are relative to its folder)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"suite file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read suite file {path}: {exc}") from None
    return parse_suite(text, str(path), path.resolve().parent)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedAttempt:
    config: EvalConfig
    case: EvalCase
    attempt: int  # 1-based
    settings: AttemptSettings


def plan_attempts(
    suite: EvalSuite, configs: Sequence[EvalConfig], repetitions: int | None
) -> list[PlannedAttempt]:
    """Every attempt, interleaved (attempt 1 of every case under every configuration,
    then attempt 2, ...) so slow and fast cases and the two configurations share the
    slots alike. ``repetitions`` (``--repetitions``) overrides the suite's and cases'."""
    planned = []
    counts = {
        case.name: repetitions or case.repetitions or suite.repetitions for case in suite.cases
    }
    for attempt in range(1, max(counts.values()) + 1):
        for case in suite.cases:
            if attempt > counts[case.name]:
                continue
            for config in configs:
                settings = attempt_settings(case, config, suite.source)
                planned.append(
                    PlannedAttempt(config=config, case=case, attempt=attempt, settings=settings)
                )
    return planned


def check_plan(suite: EvalSuite, planned: Sequence[PlannedAttempt]) -> None:
    """What can be checked before anything is stored, each error naming the file and
    key: modes, folders and policy files, and that every model resolves (a ``scripted:``
    file exists and parses; a provider has its key)."""
    models: set[str] = set()
    for item in planned:
        case, where = item.case, f"{suite.source}: {item.case.where}"
        _located(f"{where}.mode", partial(parse_mode, case.mode))
        if case.workspace is not None and not case.workspace.is_dir():
            raise ConfigError(f"{where}.workspace: {case.workspace} is not a folder")
        if case.policy is not None and not case.policy.is_file():
            raise ConfigError(f"{where}.policy: {case.policy} is not a file")
        spec = item.settings.model
        if spec not in models:
            origin = f"configs.{item.config.name}" if item.config.model else item.case.where
            _located(
                f"{suite.source}: {origin}.model", partial(resolve_model, spec, cwd=Path.cwd())
            )
            models.add(spec)


class EvalRunner:
    """Queues a suite's attempts in ``store`` and executes them with ``concurrency`` slots."""

    def __init__(
        self,
        suite: EvalSuite,
        configs: Sequence[EvalConfig],
        *,
        store: str,
        workdir: Path,
        repetitions: int | None = None,
        concurrency: int = 4,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.suite = suite
        self.configs = tuple(configs)
        self.workdir = workdir
        self.concurrency = max(1, concurrency)
        self.planned = plan_attempts(suite, self.configs, repetitions)
        self._log = log or (lambda _line: None)
        check_plan(suite, self.planned)
        self.harnesses: dict[str, Harness] = {}
        try:
            for config in self.configs:
                self.harnesses[config.name] = _located(
                    f"{suite.source}: configs.{config.name}.middleware",
                    partial(Harness, store=store, middleware=config.middleware),
                )
        except BaseException:
            self.close()
            raise
        self._stop = threading.Event()

    def run(self) -> EvalReport:
        """Queue every attempt, execute them, and report. ConfigError (nothing left
        queued) when an attempt cannot be queued."""
        queued = self.queue()
        results: list[AttemptResult] = []
        lock = threading.Lock()
        pending = list(queued)

        def slot() -> None:
            while not self._stop.is_set():
                with lock:
                    if not pending:
                        return
                    item, run_id = pending.pop(0)
                result = self._execute(item, run_id)
                with lock:
                    results.append(result)
                verdict = "pass" if result.passed else f"FAIL: {result.shortfall}"
                self._log(
                    f"{item.case.name} #{item.attempt} [{item.config.name}] {run_id}: "
                    f"{result.status} ({result.stop_reason}) {verdict}"
                )

        slots = [threading.Thread(target=slot, name=f"eval-{i}") for i in range(self.concurrency)]
        for thread in slots:
            thread.start()
        try:
            for thread in slots:
                while thread.is_alive():
                    thread.join(timeout=0.2)
        except KeyboardInterrupt:
            self._stop.set()  # every slot stops after its run's current step
            for thread in slots:
                thread.join()
            raise
        return build_report(
            self.suite.name,
            self.suite.source,
            results,
            cases=[case.name for case in self.suite.cases],
            configs={config.name: config.to_dict() for config in self.configs},
        )

    def queue(self) -> list[tuple[PlannedAttempt, str]]:
        """Make each attempt's workspace and queue its run, in plan order."""
        queued: list[tuple[PlannedAttempt, str]] = []
        for item in self.planned:
            try:
                queued.append((item, self._create(item)))
            except KeelError as exc:
                for done, run_id in queued:
                    self.harnesses[done.config.name].cancel(run_id, f"eval aborted: {exc}")
                raise ConfigError(f"{self.suite.source}: {item.case.where}: {exc}") from None
        self._log(f"queued {len(queued)} run(s); executing with {self.concurrency} slot(s)")
        return queued

    def _create(self, item: PlannedAttempt) -> str:
        case = item.case
        home = self.workdir / item.config.name / case.name / f"attempt-{item.attempt}"
        if case.workspace is not None:
            fresh_workspace(case.workspace, home)
        else:
            home.mkdir(parents=True, exist_ok=False)
        state = self.harnesses[item.config.name].create(
            item.settings.goal,
            cwd=home,
            workspace_git=case.git,
            model=item.settings.model,
            agent=item.settings.agent,
            mode=case.mode,
            budget=case.budget,
            verify=case.verify,
            verify_human=case.verify_human,
            verify_agent=case.verify_agent,
            outcome=case.outcome,
            tools=case.tools,
            policy_file=case.policy,
            queued=True,
            tags={
                "suite": self.suite.name,
                "case": case.name,
                "attempt": str(item.attempt),
                "config": item.config.name,
            },
        )
        return state.run_id

    def _execute(self, item: PlannedAttempt, run_id: str) -> AttemptResult:
        harness = self.harnesses[item.config.name]
        try:
            state = harness.execute(run_id, should_stop=self._stop.is_set).state
        except LeaseHeld:  # a `keel worker` on this store took it: wait for it to stop
            state = self._wait_until_stopped(harness.store, run_id)
        except ConfigError as exc:  # left queued, any worker would claim it again
            state = end_unrunnable(harness.store, run_id, f"config_error: {exc}")
        return attempt_result(item, state)

    def _wait_until_stopped(self, store: Store, run_id: str) -> RunState:
        state = store.load_run(run_id)
        while state.status in DRIVEN and not self._stop.is_set():
            time.sleep(POLL_S)
            state = store.load_run(run_id)
        return state

    def close(self) -> None:
        for harness in self.harnesses.values():
            harness.close()

    def __enter__(self) -> EvalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def attempt_result(item: PlannedAttempt, state: RunState) -> AttemptResult:
    """How the attempt's run ended, judged against its case's expectation."""
    outcome = (state.result or {}).get("outcome")
    outcome = str(outcome) if outcome is not None else None
    usage = state.usage
    return AttemptResult(
        config=item.config.name,
        case=item.case.name,
        attempt=item.attempt,
        run_id=state.run_id,
        status=state.status.value,
        reason=state.reason,
        outcome=outcome,
        shortfall=item.case.expect.shortfall(state.status.value, outcome, state.reason),
        steps=usage.steps,
        tool_calls=usage.tool_calls,
        tokens=usage.tokens,
        cost=usage.cost,
        wall_seconds=usage.wall_seconds,
        workspace=state.workspace,
    )


def fresh_workspace(source: Path, target: Path) -> Path:
    """Copy ``source`` (without caches or database files) to the new ``target`` and
    commit it to a fresh git repository, so the run's diff shows only its own changes.
    Without git on PATH the copy is still made (the run then has no diff evidence)."""
    shutil.copytree(source, target, ignore=_IGNORED)
    if shutil.which("git") is None or (target / ".git").exists():
        return target
    for argv in (
        ["git", "init", "--quiet"],
        ["git", "add", "--all"],
        [
            "git",
            *_GIT_IDENTITY,
            "commit",
            "--quiet",
            "--no-gpg-sign",
            "--allow-empty",
            "-m",
            "case",
        ],
    ):
        done = subprocess.run(argv, cwd=target, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigError(f"`{' '.join(argv)}` failed in {target}: {done.stderr.strip()}")
    return target


def end_unrunnable(store: Store, run_id: str, reason: str) -> RunState:
    """End a run this process cannot drive (its configuration is broken): failed, with
    why, instead of queued for a worker to claim again."""
    state = store.load_run(run_id)
    if state.status.terminal:
        return state
    events = []
    if state.status is RunStatus.QUEUED:
        events.append(transition(state, RunStatus.RUNNING, None))
    events.append(
        NewEvent(
            type=EventType.STATUS_CHANGED,
            data={"to": RunStatus.FAILED.value, "reason": reason, "result": {}},
        )
    )
    ended, _ = store.append_events(run_id, events, expected_seq=state.last_seq)
    return ended


def _located(where: str, make: Callable[[], T]) -> T:
    """``make()``, with a ConfigError's message prefixed by ``where``."""
    try:
        return make()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


__all__ = [
    "EvalRunner",
    "PlannedAttempt",
    "attempt_result",
    "check_plan",
    "end_unrunnable",
    "fresh_workspace",
    "load_suite",
    "plan_attempts",
]
