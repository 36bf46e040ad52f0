"""`keel` starts without the runtime: every command pays its imports at start-up, so
the command modules, ``keel`` and ``keel.models`` import the harness, the loop, the
tools, the HTTP client, the server and OTel only where a command (or a caller) uses
them. ``keel --help`` and ``keel stats`` need none of it; ``from keel import Harness``
still gives the real class. (How long start-up takes is measured by bench/stats.py.)

Each check runs in a fresh interpreter: this one has long imported everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import keel
import keel.models
from keel.store.sqlite.store import SQLiteStore
from keel.testing.stores import make_run

TIMEOUT = 60

# What no `keel` start may load: the runtime behind the commands that run agents, the
# server's application, and the heavy libraries they bring. (Not pydantic: Typer itself
# checks a command's option values with it.)
NOT_AT_START = (
    "keel.runtime.harness",
    "keel.runtime.async_harness",
    "keel.runtime.worker",
    "keel.runtime.eval_runner",
    "keel.runtime.agent_specs",
    "keel.runtime.child_runs",
    "keel.runtime.mcp_servers",
    "keel.runtime.tracing",
    "keel.loop",
    "keel.tools",
    "keel.policy",
    "keel.models.openai_compat",
    "keel.server.app",
    "httpx",
    "httpcore",
    "fastapi",
    "starlette",
    "uvicorn",
    "opentelemetry",
    "jsonschema",
    "mcp",
)


def python(code: str, *, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**env, "COLUMNS": "200"},
    )


def loaded(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The modules the child process names on its last line of stdout."""
    assert result.returncode == 0, result.stderr
    names: list[str] = json.loads(result.stdout.splitlines()[-1])
    return names


def too_early(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_AT_START)]


def test_importing_the_cli_loads_no_runtime(tmp_path: Path) -> None:
    code = "import json, sys, keel.cli.app; print(json.dumps(sorted(sys.modules)))"
    modules = loaded(python(code, cwd=tmp_path))
    assert "keel.cli.run" in modules  # every command is registered ...
    assert "keel.cli.serve" in modules
    assert too_early(modules) == []  # ... none of what they run is loaded


def test_help_lists_every_command_without_the_runtime(tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "from typer.main import get_command\n"
        "from keel.cli.app import app\n"
        "try:\n"
        "    app(['--help'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "print(json.dumps(sorted(get_command(app).commands)))\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = python(code, cwd=tmp_path)
    modules = loaded(result)
    *shown, names, _ = result.stdout.splitlines()
    commands = json.loads(names)
    assert {"run", "resume", "show", "stats", "serve", "worker", "eval", "tasks"} <= set(commands)
    help_text = "\n".join(shown)
    for command in commands:
        assert f" {command} " in help_text, command
    assert too_early(modules) == []


def test_keel_stats_reads_the_store_without_the_runtime(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "keel.db") as store:
        make_run(store)
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    code = (
        "import json, sys\n"
        "from keel.cli.app import app\n"
        "try:\n"
        f"    app(['stats', '--json', '--store', {url!r}])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = python(code, cwd=tmp_path)
    modules = loaded(result)
    stats: dict[str, Any] = json.loads(result.stdout.splitlines()[0])
    assert stats["runs"] == 1
    assert too_early(modules) == []


def test_the_public_names_are_the_real_ones_once_asked_for(tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "import keel, keel.models\n"
        "before = 'keel.runtime.harness' in sys.modules\n"
        "from keel import Harness, AsyncHarness, open_store, RunState\n"
        "from keel.models import OpenAICompatModel, StreamDelta\n"
        "import keel.runtime.harness, keel.runtime.async_harness, keel.store.url\n"
        "import keel.core.state, keel.models.openai_compat, keel.models.base\n"
        "same = [\n"
        "    Harness is keel.runtime.harness.Harness,\n"
        "    AsyncHarness is keel.runtime.async_harness.AsyncHarness,\n"
        "    open_store is keel.store.url.open_store,\n"
        "    RunState is keel.core.state.RunState,\n"
        "    OpenAICompatModel is keel.models.openai_compat.OpenAICompatModel,\n"
        "    StreamDelta is keel.models.base.StreamDelta,\n"
        "    keel.Harness is Harness,\n"
        "    all(getattr(keel, n) is not None for n in keel.__all__),\n"
        "]\n"
        "print(json.dumps({'before': before, 'same': same}))\n"
    )
    result = python(code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert facts["before"] is False  # importing keel does not load the harness ...
    assert all(facts["same"]), facts["same"]  # ... asking for a name gives the real one


def test_an_unknown_name_is_an_attribute_error() -> None:
    for module in (keel, keel.models):
        with pytest.raises(AttributeError, match="NoSuchThing"):
            getattr(module, "NoSuchThing")  # noqa: B009
