"""``/runs``: submit, list, read and steer runs; download their artifacts.

Every route here is behind the bearer token (``keel.server.app`` adds
``require_token`` to this router). Endpoints are plain ``def``s: they run in the
threadpool, each doing the one or two store calls it needs — except ``GET
/runs/{id}``, the one a dashboard polls, which reads through ``ServerContext.read``
(on the event loop for SQLite, where the hop to a thread costs more than the read).
Decisions record who took them as ``token:NAME``. Errors are problem documents with
the CLI's words (``keel.server.problems``).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, cast
from urllib.parse import quote

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from keel.core.budget import Budget
from keel.core.errors import ConfigError, NotFound, UsageError
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.models.context_sizes import MAX_CONTEXT_TOKENS, MIN_CONTEXT_TOKENS
from keel.models.profiles import profile_for
from keel.models.resolve import ACCEPTED_FORMS
from keel.runtime import decisions, steering
from keel.runtime.child_runs import task_of
from keel.runtime.harness import Harness
from keel.runtime.secrets import load_redactor
from keel.server.auth import Caller, require_token
from keel.server.context import context_of
from keel.server.problems import ApiProblem
from keel.server.views import run_view
from keel.store.base import Store

router = APIRouter(tags=["runs"])

IDEMPOTENCY_NAMESPACE = "api:"  # keys of API submissions never meet `keel run --key` ones
MAX_KEY_LENGTH = 200
PAGE_LIMIT_MAX = 200
TEXT_ARTIFACT_SUFFIXES = frozenset({".txt", ".log", ".diff", ".patch"})
_KEY_LOCKS = tuple(threading.Lock() for _ in range(64))

CallerDep = Annotated[Caller, Depends(require_token)]
RunView = dict[str, Any]


# --- request bodies -------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BudgetIn(_Body):
    """Limits of a run; an omitted one takes the CLI's default (50 steps, 200 tool
    calls, no token, cost or time limit)."""

    max_steps: int | None = Field(50, gt=0)
    max_tool_calls: int | None = Field(200, gt=0)
    max_tokens: int | None = Field(None, gt=0)
    max_cost: float | None = Field(None, gt=0, allow_inf_nan=False)
    timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False)

    def budget(self) -> Budget:
        return Budget(
            max_steps=self.max_steps,
            max_tool_calls=self.max_tool_calls,
            max_tokens=self.max_tokens,
            max_cost=self.max_cost,
            max_wall_seconds=self.timeout_s,
        )


class RunIn(_Body):
    goal: str = Field(min_length=1, max_length=100_000, description="What the run should achieve.")
    workspace: str = Field(
        min_length=1, description="Absolute path of an existing directory on the server."
    )
    model: str | None = Field(
        None,
        description="deepseek:M, openai:M, scripted:PATH or replay:PATH (a relative PATH "
        "is read from the workspace); default: the server's model (KEEL_MODEL).",
    )
    mode: Literal["plan", "ask", "edit", "auto"] = "edit"
    budget: BudgetIn | None = Field(
        None, description="Limits; omitted: the agent spec's, else the CLI's defaults."
    )
    verify: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="Verifier commands the run must pass; NAME=COMMAND (a lowercase NAME) "
        "files that verifier's evidence under NAME.",
    )
    verify_human: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list,
        max_length=20,
        description="People who must sign off once the commands pass (POST /runs/{id}/signoff).",
    )
    verify_agent: list[Annotated[str, Field(min_length=3, max_length=200)]] = Field(
        default_factory=list,
        max_length=10,
        description="Reviewer agents, NAME=AGENT (review=reviewer): an agent spec whose "
        "review of the change must list no blocking issue.",
    )
    outcome: str | None = Field(
        None,
        max_length=64,
        description="What a completed run's result declares, e.g. change_ready_for_approval.",
    )
    tools: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None,
        max_length=500,
        description="The only tools the run is offered and may call (request_completion "
        "always); default: every tool.",
    )
    agent: str | None = Field(
        None,
        description="An agent spec to follow (the workspace's .keel/agents/NAME.md, else a "
        "built-in): its instructions, tools, output schema and budget; mode never wider "
        "than `mode`.",
    )
    context_tokens: int | None = Field(
        None,
        ge=MIN_CONTEXT_TOKENS,
        le=MAX_CONTEXT_TOKENS,
        strict=True,
        description="The model's context size in tokens; older turns are compacted into a "
        "continuation before a request would pass it. Default: the known size of the "
        "model, else 128000.",
    )
    context_summary: bool = Field(
        False,
        strict=True,
        description="A compaction also asks the model to summarise the turns it drops.",
    )


class ApproveIn(_Body):
    digest: str | None = Field(
        None, description="The digest of the call being approved (refused if it changed)."
    )


class SignoffIn(_Body):
    verifier: str = Field(min_length=1, max_length=64, description="The sign-off's name.")
    deny: bool = Field(False, strict=True, description="Decline (a reason is required).")
    reason: str | None = Field(None, max_length=10_000, description="Why (sent to the model).")


class ReasonIn(_Body):
    reason: str = Field(min_length=1)


class OptionalReasonIn(_Body):
    reason: str | None = None


class AnswerIn(_Body):
    text: str = Field(min_length=1)


class EmptyIn(_Body):
    pass


# --- submitting and reading -----------------------------------------------------------


@router.post("/runs", status_code=201, responses={200: {"description": "a repeated key"}})
def submit_run(
    body: RunIn,
    request: Request,
    response: Response,
    caller: CallerDep,
    idempotency_key: Annotated[str | None, Header(max_length=MAX_KEY_LENGTH)] = None,
) -> RunView:
    """Queue a run for the workers. With ``Idempotency-Key`` the same key never makes
    two runs: a repeat answers 200 with the first run (409 if its goal, workspace or
    agent differ)."""
    context = context_of(request)
    workspace = _workspace(body.workspace, context.config.workspace_roots)
    model = _model_spec(body.model or context.config.model, workspace)
    if idempotency_key is not None and not idempotency_key.strip():
        raise UsageError("the Idempotency-Key header is blank; send a non-blank key or none")
    key = IDEMPOTENCY_NAMESPACE + idempotency_key if idempotency_key else None
    harness = Harness(
        store=cast(Store, _Attributed(context.store, caller.by)),
        model=model,
        owner=context.harness.owner,
        child_slots=0,
    )
    lock = _KEY_LOCKS[hash(key) % len(_KEY_LOCKS)] if key else threading.Lock()
    with lock:  # in this process a repeat of a key waits for its first to be stored
        started = datetime.now().astimezone()
        state = harness.create(
            body.goal,
            cwd=workspace,
            budget=body.budget.budget() if body.budget is not None else None,
            agent=body.agent,
            tools=body.tools,
            context_tokens=body.context_tokens,
            context_summary=body.context_summary,
            verify=body.verify,
            verify_human=body.verify_human,
            verify_agent=body.verify_agent,
            outcome=body.outcome,
            mode=body.mode,
            model=model,
            idempotency_key=key,
            queued=True,
        )
    if key is not None and not _made_since(state, started):
        _check_same_request(state, body.goal, workspace, body.agent, idempotency_key or "")
        response.status_code = 200
    return run_view(state)


@router.get("/runs")
def list_runs(
    request: Request,
    status: RunStatus | None = None,
    parent: str | None = None,
    creator: str | None = None,
    top_level: bool = False,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=PAGE_LIMIT_MAX)] = 50,
) -> dict[str, Any]:
    """Runs newest first, a page at a time: pass ``next_cursor`` back as ``cursor``."""
    runs, next_cursor = context_of(request).store.page_runs(
        status=status,
        parent_id=parent,
        creator=creator,
        before=cursor,
        limit=limit,
        top_level=top_level,
    )
    return {"runs": [run_view(run) for run in runs], "next_cursor": next_cursor}


@router.get("/runs/{run_id}")
async def get_run(run_id: str, request: Request) -> RunView:
    context = context_of(request)
    return run_view(await context.read(context.store.load_run, run_id))


@router.get("/runs/{run_id}/tree")
def run_tree(run_id: str, request: Request) -> dict[str, Any]:
    """The run with its child runs, nested (``children`` of each node)."""
    store = context_of(request).store
    return _tree(store, store.load_run(run_id), depth=0)


def _tree(store: Store, state: RunState, *, depth: int) -> dict[str, Any]:
    node = run_view(state)
    node["children"] = (
        [_tree(store, child, depth=depth + 1) for child in store.child_runs(state.run_id)]
        if depth < 32
        else []
    )
    return node


# --- deciding -------------------------------------------------------------------------


@router.post("/runs/{run_id}/approve")
def approve(run_id: str, body: ApproveIn, request: Request, caller: CallerDep) -> RunView:
    """Approve what the run waits for; with ``digest``, only if it is still that call."""
    store = context_of(request).store
    state = decisions.decide_approval(
        store, run_id, deny=False, reason=None, by=caller.by, digest=body.digest
    )
    return run_view(state)


@router.post("/runs/{run_id}/deny")
def deny(run_id: str, body: ReasonIn, request: Request, caller: CallerDep) -> RunView:
    store = context_of(request).store
    state = decisions.decide_approval(store, run_id, deny=True, reason=body.reason, by=caller.by)
    return run_view(state)


@router.post("/runs/{run_id}/signoff")
def signoff(run_id: str, body: SignoffIn, request: Request, caller: CallerDep) -> RunView:
    """Sign off (or decline) as a verifier the run waits for; a worker then finishes it."""
    store = context_of(request).store
    state = decisions.sign_off(
        store, run_id, body.verifier, by=caller.by, deny=body.deny, reason=body.reason
    )
    return run_view(state)


@router.post("/runs/{run_id}/answer")
def answer(run_id: str, body: AnswerIn, request: Request, caller: CallerDep) -> RunView:
    store = context_of(request).store
    return run_view(decisions.answer_question(store, run_id, body.text, by=caller.by))


@router.post("/runs/{run_id}/cancel")
def cancel(run_id: str, body: ReasonIn, request: Request, caller: CallerDep) -> RunView:
    """Cancel the run and every live run below it."""
    store = context_of(request).store
    return run_view(decisions.cancel_run(store, run_id, body.reason, by=caller.by))


@router.post("/runs/{run_id}/pause")
def pause(run_id: str, body: OptionalReasonIn, request: Request, caller: CallerDep) -> RunView:
    """The run finishes its current step, then stops ``paused`` with its lease released."""
    store = context_of(request).store
    return run_view(steering.request_pause(store, run_id, by=caller.by, reason=body.reason))


@router.post("/runs/{run_id}/resume")
def resume(run_id: str, body: EmptyIn, request: Request, caller: CallerDep) -> RunView:
    """A paused run goes on: the next free worker picks it up."""
    store = context_of(request).store
    return run_view(steering.resume_run(store, run_id, by=caller.by))


@router.post("/runs/{run_id}/messages", status_code=201)
def message(run_id: str, body: AnswerIn, request: Request, caller: CallerDep) -> dict[str, Any]:
    """Tell a live run something (the model reads it at its next turn); a finished run
    gets a queued follow-up run with its outcome in context."""
    store = context_of(request).store
    result = steering.send_message(store, run_id, body.text, by=caller.by, queue=True)
    follow_up = result.follow_up
    return {
        "run": run_view(result.state),
        "follow_up": run_view(follow_up) if follow_up is not None else None,
    }


# --- artifacts ------------------------------------------------------------------------


@router.get(
    "/runs/{run_id}/artifacts/{artifact_id}",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
def artifact(run_id: str, artifact_id: str, request: Request) -> Response:
    """The artifact's bytes, as a download; 404 unless it belongs to this run."""
    store = context_of(request).store
    store.load_run(run_id)  # an unknown run is a RunNotFound, not an unknown artifact
    try:
        found, content = store.get_artifact(artifact_id)
    except NotFound:
        found = None
    if found is None or found.run_id != run_id:
        raise NotFound(
            f"run {run_id} has no artifact {artifact_id!r}; `keel show {run_id}` lists its"
        )
    name = PurePath(found.name).name or found.id
    text = PurePath(name).suffix.lower() in TEXT_ARTIFACT_SUFFIXES
    return Response(
        content,
        media_type="text/plain; charset=utf-8" if text else "application/octet-stream",
        headers={
            "Content-Disposition": _attachment(name),
            "X-Content-Type-Options": "nosniff",
        },
    )


# --- helpers --------------------------------------------------------------------------


class _Attributed:
    """A store whose new runs are attributed to ``creator`` (``RunOptions.creator``);
    everything else goes to ``store`` as is."""

    def __init__(self, store: Store, creator: str) -> None:
        self._store = store
        self._creator = creator

    def create_run(self, *, options: RunOptions, **kwargs: Any) -> RunState:
        return self._store.create_run(options=replace(options, creator=self._creator), **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _workspace(text: str, roots: tuple[Path, ...]) -> Path:
    """The existing directory ``text`` names, symlinks resolved; with ``roots``, only one
    at or below a root (``keel serve --workspace-root``)."""
    path = Path(text)
    if not path.is_absolute():
        raise ConfigError(f"workspace {text!r} is not an absolute path on the server")
    if not path.is_dir():
        raise ConfigError(f"workspace {text} is not an existing directory on the server")
    resolved = path.resolve()
    if roots and not any(resolved.is_relative_to(root.resolve()) for root in roots):
        raise ConfigError(
            f"workspace {text} is outside the directories this server lets runs work in "
            f"({', '.join(str(root) for root in roots)}; keel serve --workspace-root)"
        )
    return resolved


def _model_spec(spec: str | None, workspace: Path) -> str | None:
    """``spec`` checked for its form (a known provider, a script that exists) and with a
    relative script path made absolute against the workspace. The provider's key is the
    worker's business: it is not needed here."""
    if spec is None:
        return None
    provider, sep, rest = spec.partition(":")
    provider, rest = provider.strip(), rest.strip()
    if not sep or not provider or not rest:
        raise ConfigError(f"malformed model spec {spec!r}: expected PROVIDER:MODEL")
    if provider in ("scripted", "replay"):
        path = Path(rest).expanduser()
        path = path if path.is_absolute() else workspace / path
        if not path.is_file():
            raise ConfigError(f"model {spec!r}: no file {path} on the server")
        return f"{provider}:{path.resolve()}"
    try:
        profile_for(provider, "")
    except ConfigError:
        raise ConfigError(
            f"unknown model provider {provider!r} in {spec!r}: expected {ACCEPTED_FORMS}"
        ) from None
    return f"{provider}:{rest}"


def _made_since(state: RunState, started: datetime) -> bool:
    """Whether ``state``'s run was created at or after ``started`` (by this request: a
    repeat of its key in this process waits for it; see ``submit_run``)."""
    if state.last_seq != 1 or state.updated_at is None:
        return False
    return datetime.fromisoformat(state.updated_at) >= started


def _check_same_request(
    state: RunState, goal: str, workspace: Path, agent: str | None, key: str
) -> None:
    """409 unless the first run of ``key`` had this goal, workspace and agent spec."""
    asked = load_redactor(workspace).scrub_text(goal)
    same_goal = state.goal == asked or (agent is not None and task_of(state) == asked.strip())
    same_agent = (state.options.agent or {}).get("name") == agent
    if same_goal and same_agent and state.workspace == str(workspace):
        return
    raise ApiProblem(
        409,
        f"Idempotency-Key {key!r} was already used for run {state.run_id} with a different "
        "goal, workspace or agent; use a new key for a new run",
        type_="urn:keel:idempotency-key-reused",
    )


def _attachment(name: str) -> str:
    """A Content-Disposition header naming ``name`` safely (RFC 6266 + RFC 5987)."""
    ascii_name = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name
    )
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"
