"""A workspace driven by the real ``keel`` command, for acceptance tests.

Every command is its own process with standard input on /dev/null (no terminal, so a
waiting run exits 3 at once); the store is the default SQLite file under the
workspace unless a URL is given; only the model's turns are scripted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.store.base import iter_all_events
from keel.store.url import open_store

KEEL = str(Path(sys.executable).with_name("keel"))
TIMEOUT_S = 60


def run_command_call(*argv: str) -> dict[str, Any]:
    return {"name": "run_command", "arguments": {"argv": list(argv)}}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def turn(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(calls)}


DONE = turn(call("request_completion", summary="done"))


@dataclass
class KeelWorkspace:
    root: Path
    store_url: str | None = None  # None: the default sqlite:///.keel/keel.db under root
    scripts: int = field(default=0)
    env: dict[str, str] = field(default_factory=dict)  # set for every command (e.g. PATH)

    def script(self, *turns: dict[str, Any]) -> str:
        """Write a scripted model file; returns the ``--model`` spec for it."""
        self.scripts += 1
        path = self.root / f"model-{self.scripts}.json"
        path.write_text(json.dumps(list(turns)), encoding="utf-8")
        return f"scripted:{path}"

    def keel(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env["COLUMNS"] = "200"
        env.update(self.env)
        store = ["--store", self.store_url] if self.store_url else []
        return subprocess.run(
            [KEEL, *args, *store],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
            check=False,
        )

    def start(self, task: str, *args: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        """``keel run TASK ARGS``; returns the run id (its first line of output) and the result."""
        result = self.keel("run", task, *args)
        first = result.stdout.splitlines()[0] if result.stdout else ""
        assert first.startswith("run_"), result
        return first.strip(), result

    @property
    def url(self) -> str:
        return self.store_url or f"sqlite:///{self.root / '.keel' / 'keel.db'}"

    def state(self, run_id: str) -> RunState:
        store = open_store(self.url)
        try:
            return store.load_run(run_id)
        finally:
            store.close()

    def events(self, run_id: str) -> list[Event]:
        store = open_store(self.url)
        try:
            return list(iter_all_events(store, run_id))
        finally:
            store.close()

    def of_type(self, run_id: str, kind: EventType) -> list[Event]:
        return [e for e in self.events(run_id) if e.type is kind]


def expect(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The command's stdout, after checking its exit code (the whole result shown if not)."""
    assert result.returncode == code, (
        f"exit {result.returncode}, expected {code}\n"
        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The single error line of a refused command (exit 2, no traceback)."""
    expect(result, 2)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def flat(text: str) -> str:
    """Output with rich's line wrapping undone, for substring checks."""
    return " ".join(text.split())
