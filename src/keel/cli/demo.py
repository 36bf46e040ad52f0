"""`keel demo`: a whole run offline, with no API key — a scripted model fixes a vulnerable pin.

The sample service is copied into a fresh workspace; the scripted model's calls and
the verifiers (the test suite and the security check) run for real; the run is stored
like any other, so `keel show` and `keel events` inspect it afterwards.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from keel.cli.common import DEFAULT_STORE, StoreOption, console, keel_errors, shown, store_url
from keel.core.events import Event, EventType

if TYPE_CHECKING:
    from keel.core.state import RunState

# the harness (the whole runtime) is imported when the demo runs, not at every `keel` start


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_command)


@keel_errors
def demo_command(
    workspace: Path | None = typer.Option(
        None, "--workspace", help="Where to copy the sample service (default: a new temp dir)."
    ),
    store: str | None = StoreOption,
) -> None:
    """Run the offline demo: remediate a vulnerable dependency pin, verified by tests."""
    from keel.core.budget import Budget  # noqa: PLC0415 - see the top
    from keel.demo.story import (  # noqa: PLC0415
        GOAL,
        prepare_workspace,
        verify_commands,
        write_policy,
        write_script,
    )
    from keel.runtime.harness import Harness  # noqa: PLC0415

    url = store_url(store)
    home = Path(tempfile.mkdtemp(prefix="keel-demo-"))
    target = prepare_workspace((workspace or home / "inventory").resolve())
    script = write_script(home / "model-turns.json")
    console.print(
        "[bold]Keel demo[/] — offline: a scripted model plays the agent, the harness runs "
        "the real tools and verifiers.",
    )
    console.print(
        f"  workspace  {shown(str(target))}  (a git repository)", highlight=False, soft_wrap=True
    )
    console.print(f"  store      {shown(url)}", highlight=False, soft_wrap=True)

    harness = Harness(store=url, model=f"scripted:{script}", on_event=narrate)
    with harness:
        state = harness.create(
            GOAL,
            cwd=target,
            mode="auto",
            policy_file=write_policy(home / "demo-policy.toml"),
            verify=verify_commands(),
            budget=Budget(max_steps=20, max_tool_calls=40, max_wall_seconds=600),
        )
        console.print(f"  run        [bold]{state.run_id}[/]\n", highlight=False, soft_wrap=True)
        outcome = harness.execute(state.run_id)
        final = outcome.state

    console.print()
    console.print(f"run {final.run_id}: [bold]{final.status.value}[/] ({final.reason})")
    for name, ref in outcome.evidence_by_name.items():
        console.print(f"  evidence  {name}: {ref}", highlight=False, soft_wrap=True)
    flag = "" if url == DEFAULT_STORE else f" --store {url}"
    console.print("\nInspect it:", highlight=False, soft_wrap=True)
    keel = keel_invocation()
    console.print(f"  {keel} show {final.run_id}{flag}", highlight=False, soft_wrap=True)
    console.print(f"  {keel} events {final.run_id}{flag}", highlight=False, soft_wrap=True)
    console.print(f"  git -C {target} diff", highlight=False, soft_wrap=True)
    raise typer.Exit(outcome.exit_code)


def keel_invocation() -> str:
    """How the user can run this same `keel`: plain `keel` when it is on PATH, else
    the path they ran (after `make demo` that is `.venv/bin/keel`)."""
    running = Path(sys.argv[0])
    on_path = shutil.which("keel")
    if on_path and Path(on_path).resolve() == running.resolve():
        return "keel"
    if running.name == "keel" and running.exists():
        try:
            return str(running.resolve().relative_to(Path.cwd()))
        except ValueError:
            return str(running)
    return "keel"


def narrate(event: Event, state: RunState) -> None:
    """One line per meaningful event; the model's own words when it says something."""
    from keel.cli.live import describe_event  # noqa: PLC0415 - rich.live, keel.models

    d = event.data
    if event.type is EventType.MODEL_RESPONDED:
        line = f"agent: {d.get('content') or ''}"
    elif event.type is EventType.TOOL_FINISHED:
        line = f"  {d.get('tool')} {_brief(d.get('arguments') or {})}  [{_first_line(d)}]"
    elif event.type is EventType.TOOL_STARTED:
        return
    else:
        line = describe_event(event) or ""
    if line:
        console.print(
            f"  [dim]#{event.seq:<3}[/] {shown(_fit(line))}", highlight=False, soft_wrap=True
        )


def _brief(arguments: dict[str, Any]) -> str:
    if "argv" in arguments:
        return " ".join("python" if a == sys.executable else a for a in arguments["argv"])
    if "path" in arguments:
        return str(arguments["path"])
    if "todos" in arguments:
        done = sum(t.get("status") == "completed" for t in arguments["todos"])
        return f"{done}/{len(arguments['todos'])} done"
    return ""


def _first_line(data: dict[str, Any]) -> str:
    lines = [ln.strip() for ln in str(data.get("output", "")).splitlines() if ln.strip()]
    shown = [ln for ln in lines if not ln.startswith("$ ")]
    return shown[0] if shown else "ok"


def _fit(text: str, width: int = 96) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
