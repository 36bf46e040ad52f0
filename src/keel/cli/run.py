"""`keel run`, `resume`, `approve`, `answer`, `cancel`: driving runs and deciding for them.

Exit codes of run/resume (SPEC): 0 completed, 1 failed, 2 usage or config error,
3 waiting (approval or answer needed) or paused (``keel pause``; ``keel resume`` goes
on), 4 blocked, 5 cancelled; 130 interrupted (the run stays resumable).
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from keel.cli.common import (
    JsonOption,
    StoreOption,
    console,
    err_console,
    fail,
    keel_errors,
    print_json,
    shown,
    store_url,
)
from keel.cli.live import LiveView
from keel.cli.runs import answer_store_flag, describe_wait
from keel.cli.waiting import LeaseCountdown, lease_held_line, taken_over_line
from keel.core.budget import Budget, check_budget, check_seconds
from keel.core.errors import LeaseHeld
from keel.core.events import Event, EventType
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.core.text import terminal_safe
from keel.models.context_sizes import check_context_tokens

if TYPE_CHECKING:
    from keel.runtime.harness import Harness, RunOutcome

# Each command imports the harness (the whole runtime: loop, tools, models, httpx, OTel)
# when it runs: this module is loaded at every `keel` start, `keel --help` included.


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
    app.command("resume")(resume_command)
    app.command("approve")(approve_command)
    app.command("answer")(answer_command)
    app.command("cancel")(cancel_command)


@keel_errors
def run_command(
    context: typer.Context,
    task: str = typer.Argument(..., help="What the run should achieve."),
    cwd: Path = typer.Option(Path("."), "--cwd", help="The workspace the tools work in."),
    model: str | None = typer.Option(
        None, "--model", envvar="KEEL_MODEL", help="deepseek:M, openai:M or scripted:PATH."
    ),
    mode: str | None = typer.Option(None, "--mode", help="plan, ask, edit (default) or auto."),
    plan_then: str | None = typer.Option(
        None, "--plan-then", help="Start in plan mode; after approval switch to edit or auto."
    ),
    # Ranges are checked by ``check_run_options`` (one line naming the option), not by click.
    max_steps: int = typer.Option(50, "--max-steps", help="Model turns (1 or more)."),
    max_tool_calls: int = typer.Option(200, "--max-tool-calls", help="Tool calls (1 or more)."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Tokens (1 or more)."),
    max_cost: float | None = typer.Option(None, "--max-cost", help="US dollars (above 0)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Wall seconds (above 0)."),
    verify: list[str] = typer.Option(
        [],
        "--verify",
        help="A verifier command, or NAME=COMMAND to file its evidence under NAME "
        '(unit_tests="pytest -q"; a lowercase NAME). Repeatable.',
    ),
    verify_human: list[str] = typer.Option(
        [],
        "--verify-human",
        help="A person who must sign off once the commands pass: the run waits for "
        "`keel approve RUN --verifier NAME`. Repeatable.",
    ),
    verify_agent: list[str] = typer.Option(
        [],
        "--verify-agent",
        metavar="NAME=AGENT",
        help="A reviewer agent (an agent spec whose result lists blocking_issues, e.g. the "
        "built-in reviewer: review=reviewer) that reviews the change once the commands "
        "pass; its review must list no blocking issue. Repeatable.",
    ),
    outcome: str | None = typer.Option(
        None,
        "--outcome",
        help="What a completed run's result declares, e.g. change_ready_for_approval "
        "(default task_completed).",
    ),
    policy: Path | None = typer.Option(None, "--policy", help="A policy TOML file."),
    approval_timeout: float | None = typer.Option(
        None,
        "--approval-timeout",
        help="Seconds an approval request may stay unanswered (above 0; default 24 h, "
        "or [approvals] timeout_seconds).",
    ),
    sandbox: str | None = typer.Option(
        None, "--sandbox", help="required, auto (default) or off: confine commands with bubblewrap."
    ),
    key: str | None = typer.Option(None, "--key", help="Idempotency key for the run."),
    detach: bool = typer.Option(False, "--detach", help="Only enqueue; a worker runs it."),
    workspace_git: str | None = typer.Option(
        None,
        "--workspace-git",
        help="URL[@REF]: the workspace is this git source, checked out by whichever "
        "process executes the run (--cwd is then only where config and policy are read).",
    ),
    record: Path | None = typer.Option(
        None,
        "--record",
        help="Write every model request and answer to this cassette file "
        "(replay it with --model replay:FILE).",
    ),
    tools: str | None = typer.Option(
        None,
        "--tools",
        help="Comma-separated tools the run is offered and may call, e.g. read_file,grep "
        "(request_completion always; default: every tool).",
    ),
    agent: str | None = typer.Option(
        None,
        "--agent",
        help="Follow this agent spec (.keel/agents/NAME.md or a built-in): its instructions, "
        "tools, output schema, and its budget unless a budget option is given.",
    ),
    context_tokens: int | None = typer.Option(
        None,
        "--context-tokens",
        help="The model's context size in tokens (1000 or more; default: the known size of "
        "the model, else 128000). Older turns are compacted into a continuation before a "
        "request would pass it.",
    ),
    context_summary: bool = typer.Option(
        False,
        "--context-summary",
        help="A compaction also asks the model to summarise the turns it drops (a model "
        "call of its own, counted in the run's usage).",
    ),
    json_out: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Start a run and drive it; prints the run id first.

    Exit codes: 0 completed, 1 failed, 2 usage error, 3 waiting for a person or paused
    (`keel pause`: `keel resume RUN` goes on), 4 blocked, 5 cancelled.
    """
    if plan_then and mode not in (None, "plan"):
        fail(f"--plan-then starts the run in plan mode; drop --mode {mode} (or use --mode plan)")
    if record is not None and detach:
        fail(
            "--record cannot be used with --detach: recording happens in the process that "
            "talks to the model; run without --detach to record"
        )
    mode_used = "plan" if plan_then else (mode or "edit")
    budget = Budget(
        max_steps=max_steps,
        max_tool_calls=max_tool_calls,
        max_tokens=max_tokens,
        max_cost=max_cost,
        max_wall_seconds=timeout,
    )
    check_run_options(budget, approval_timeout, context_tokens)  # before the store is opened
    from keel.runtime.harness import Harness  # noqa: PLC0415 - see the imports

    harness = Harness(store=store_url(store), model=model)
    state = harness.create(
        task,
        cwd=cwd,
        budget=None if agent is not None and not _budget_given(context) else budget,
        verify=verify,
        verify_human=verify_human,
        verify_agent=verify_agent,
        outcome=outcome,
        mode=mode_used,
        plan_then=plan_then,
        approval_timeout=approval_timeout,
        policy_file=policy,
        idempotency_key=key,
        queued=detach,
        sandbox=sandbox,
        record=record,
        workspace_git=workspace_git,
        agent=agent,
        tools=tools.split(",") if tools is not None else None,
        context_tokens=context_tokens,
        context_summary=context_summary,
    )
    if json_out:
        print_json({"run_id": state.run_id, "status": state.status.value})
    else:
        console.print(state.run_id, highlight=False)
    if detach:
        return
    _warn_unconfined(harness, state)
    drive(harness, state.run_id, json_out, answer_store_flag(store), record=record)


RUN_OPTION_NAMES = {
    "max_steps": "--max-steps",
    "max_tool_calls": "--max-tool-calls",
    "max_tokens": "--max-tokens",
    "max_cost": "--max-cost",
    "max_wall_seconds": "--timeout",
}


def _budget_given(context: typer.Context) -> bool:
    """Whether the command line named any budget option (else an agent spec's applies)."""
    return any(
        getattr(context.get_parameter_source(name), "name", None) == "COMMANDLINE"
        for name in ("max_steps", "max_tool_calls", "max_tokens", "max_cost", "timeout")
    )


def check_run_options(
    budget: Budget, approval_timeout: float | None, context_tokens: int | None = None
) -> None:
    """ConfigError (exit 2, one line) naming the first option out of its accepted range."""
    check_budget(budget, RUN_OPTION_NAMES)
    check_seconds("--approval-timeout", approval_timeout)
    check_context_tokens("--context-tokens", context_tokens)


def _warn_unconfined(harness: Harness, state: RunState) -> None:
    """Say once that commands run unconfined (``sandbox: none`` is on every call's record)."""
    containment = harness.containment(state)
    if containment.sandbox.kind != "none":
        return
    why = (
        "the sandbox is off"
        if containment.settings.mode == "off"
        else "bubblewrap is not available (apt-get install bubblewrap)"
    )
    err_console.print(
        f"warning: commands run without an OS sandbox: {why}; in auto mode they need approval",
        highlight=False,
        soft_wrap=True,
    )


@keel_errors
def resume_command(
    run_id: str = typer.Argument(...),
    json_out: bool = JsonOption,
    model: str | None = typer.Option(
        None, "--model", help="Drive the rest of the run with this model spec instead."
    ),
    no_wait: bool = typer.Option(
        False, "--no-wait", help="Exit 2 at once if a live process holds the run."
    ),
    record: Path | None = typer.Option(
        None,
        "--record",
        help="Append every model request and answer to this cassette file "
        "(a run recorded with keel run --record goes on into the same file).",
    ),
    store: str | None = StoreOption,
) -> None:
    """Continue a run that was paused, stopped cleanly, was interrupted, or crashed.

    A paused run (`keel pause`) goes on here, in the foreground. A run whose process died
    on this machine is taken over at once; one a live process holds is waited for, with
    a countdown, until its lease lapses (--no-wait: exit 2). Exit codes: 0 completed,
    1 failed, 2 usage error, 3 waiting or paused, 4 blocked, 5 cancelled.
    """
    from keel.runtime.harness import Harness  # noqa: PLC0415 - see the imports

    harness = Harness(store=store_url(store))
    try:
        drive(
            harness,
            run_id,
            json_out,
            answer_store_flag(store),
            wait=0.0 if no_wait else None,
            record=record,
            model=model,
        )
    except LeaseHeld as exc:
        fail(lease_held_line(exc, run_id))


def drive(
    harness: Harness,
    run_id: str,
    json_out: bool,
    store_flag: str,
    *,
    wait: float | None = 0.0,
    record: Path | None = None,
    model: str | None = None,
) -> None:
    view = None if json_out else LiveView(run_id=run_id, child_runs=harness.store.child_runs)

    def on_event(event: Event, state: RunState) -> None:
        if json_out:
            if event.run_id == run_id:  # a child's own events are in its own log
                print_json(event.to_dict())
        elif view is not None:
            view.on_event(event, state)
        if event.type is EventType.LEASE_TAKEN_OVER:
            err_console.print(taken_over_line(event), highlight=False, soft_wrap=True)

    harness.on_event = on_event
    while True:
        try:
            with view if view is not None else nullcontext():
                outcome = harness.resume(
                    run_id,
                    wait=wait,
                    on_wait=LeaseCountdown(),
                    on_delta=view.on_delta if view is not None else None,
                    record=record,
                    model=model,
                )
            outcome = harness.follow_handoffs(outcome)  # a run that handed over: the next
        except KeyboardInterrupt:
            err_console.print(f"interrupted: run {run_id} stays resumable — `keel resume {run_id}`")
            harness.close()  # background children stop at their next step, resumable
            raise typer.Exit(130) from None
        waiting = outcome.status is RunStatus.WAITING
        if waiting and sys.stdin.isatty() and not json_out and _decide_inline(harness, outcome):
            continue
        break
    harness.close()  # background children this process runs stop at their next step
    _report(outcome, json_out, store_flag)
    raise typer.Exit(outcome.exit_code)


def _decide_inline(harness: Harness, outcome: RunOutcome) -> bool:
    """On a terminal, offer to decide a waiting run here; True if decided."""
    pending = outcome.state.pending
    if pending is None:
        return False
    if pending.kind == "question":
        question = terminal_safe(pending.question or "")
        answer = typer.prompt(f"The agent asks: {question}\nanswer", default="")
        if not answer.strip():
            return False
        harness.answer(outcome.id, answer)
        return True
    if pending.kind == "signoff":
        name = terminal_safe(pending.question or "")
        choice = typer.prompt(
            f"The verifiers passed; sign off as {name}? [y]es / [n]o / [l]ater", default="l"
        )
        if choice.strip().lower().startswith("y"):
            harness.sign_off(outcome.id, pending.question or "")
            return True
        if choice.strip().lower().startswith("n"):
            reason = typer.prompt("what is missing (the agent is told)")
            harness.sign_off(outcome.id, pending.question or "", deny=True, reason=reason)
            return True
        return False
    console.print(
        f"Approval needed: {shown(pending.tool or '?')} {shown(str(pending.arguments))} "
        f"(risk {shown(pending.risk or '')})",
        highlight=False,
    )
    choice = typer.prompt("approve? [y]es / [n]o / [l]ater", default="l").strip().lower()
    if choice.startswith("y"):
        harness.approve(outcome.id)
        return True
    if choice.startswith("n"):
        reason = typer.prompt("reason for the denial")
        harness.approve(outcome.id, deny=True, reason=reason)
        return True
    return False


def _report(outcome: RunOutcome, json_out: bool, store_flag: str) -> None:
    state = outcome.state
    if json_out:
        print_json(
            {
                "run_id": state.run_id,
                "status": state.status.value,
                "reason": state.reason,
                "evidence": outcome.evidence_by_name,
                "result": state.result,
            }
        )
        return
    console.print()
    line = f"run {state.run_id}: {state.status.value}"
    if state.reason:
        line += f" ({shown(state.reason)})"
    console.print(line, highlight=False)
    if state.status is RunStatus.WAITING:
        for text in describe_wait(state, store_flag):
            console.print(text, highlight=False)
    if state.status is RunStatus.PAUSED:
        console.print(
            f"  paused: `keel resume {state.run_id}{store_flag}` goes on", highlight=False
        )
    for name, ref in outcome.evidence_by_name.items():
        console.print(
            f"  evidence {name}: {ref}  (keel artifact {ref.removeprefix('artifact:')})",
            highlight=False,
        )
    remaining = (state.result or {}).get("remaining_actions")
    if remaining and state.status is RunStatus.COMPLETED:
        console.print("  left for people: " + shown("; ".join(remaining)), highlight=False)
    unfinished = (state.result or {}).get("unfinished")
    if unfinished:
        console.print("  unfinished todos: " + shown("; ".join(unfinished)), highlight=False)


@keel_errors
def approve_command(
    run_id: str = typer.Argument(...),
    deny: bool = typer.Option(False, "--deny", help="Refuse instead of approving."),
    reason: str | None = typer.Option(None, "--reason", help="Why (required with --deny)."),
    verifier: str | None = typer.Option(
        None,
        "--verifier",
        help="Sign off as this verifier (a run started with --verify-human NAME waits for it).",
    ),
    store: str | None = StoreOption,
) -> None:
    """Approve (or deny) what a waiting run asked for, or sign off as its verifier; the
    run can then resume."""
    from keel.runtime.harness import Harness  # noqa: PLC0415 - see the imports

    harness = Harness(store=store_url(store))
    if verifier is not None:
        state = harness.sign_off(run_id, verifier, deny=deny, reason=reason)
        verb = "declined" if deny else "signed off"
    else:
        state = harness.approve(run_id, deny=deny, reason=reason)
        verb = "denied" if deny else "approved"
    console.print(f"{verb}; run {run_id} is {state.status.value} — `keel resume {run_id}`")


@keel_errors
def answer_command(
    run_id: str = typer.Argument(...),
    text: str = typer.Argument(..., help="The answer to the run's question."),
    store: str | None = StoreOption,
) -> None:
    """Answer the question a waiting run asked."""
    from keel.runtime.harness import Harness  # noqa: PLC0415 - see the imports

    harness = Harness(store=store_url(store))
    state = harness.answer(run_id, text)
    console.print(f"answered; run {run_id} is {state.status.value} — `keel resume {run_id}`")


@keel_errors
def cancel_command(
    run_id: str = typer.Argument(...),
    reason: str = typer.Option(..., "--reason", help="Why the run is stopped."),
    as_json: bool = JsonOption,
    store: str | None = StoreOption,
) -> None:
    """Cancel a run for good, and every live run below it (reason parent_cancelled).

    Side effects already done in the tree are listed: cancelling does not undo them.
    """
    from keel.runtime.harness import Harness  # noqa: PLC0415 - see the imports

    harness = Harness(store=store_url(store))
    report = harness.cancel_tree(run_id, reason)
    if as_json:
        print_json(report.to_dict())
        return
    console.print(f"run {run_id} is {report.state.status.value}", highlight=False)
    if report.cancelled:
        console.print(
            f"  descendants cancelled (parent_cancelled): {', '.join(report.cancelled)}",
            highlight=False,
        )
    for task_id in report.tasks_cancelled:
        console.print(f"  task {task_id} cancelled", highlight=False)
    for task_id, why in report.tasks_left.items():
        console.print(f"  task {task_id} not cancelled: {shown(why)}", highlight=False)
    if not report.side_effects:
        console.print("  already done, stays on record: nothing", highlight=False)
        return
    console.print("  already done, stays on record:", highlight=False)
    for effect in report.side_effects:
        console.print(
            f"    {effect.run_id} {effect.call_id} {shown(effect.tool)} ({effect.effect}) "
            f"{effect.outcome}: {shown(effect.summary)}",
            highlight=False,
            soft_wrap=True,
        )
