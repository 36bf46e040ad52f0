"""``Harness``: the Python front door — start, resume, approve, answer, cancel runs.

A run is executed only under its lease (one executing process per run, fenced
writes, a heartbeat thread); everything else — approve, answer, cancel — is an
optimistic append that any process on any machine may make.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keel.core.budget import Budget, check_budget, check_seconds
from keel.core.errors import ConfigError
from keel.core.events import Event
from keel.core.records import RunOptions
from keel.core.state import RunState
from keel.core.tags import check_tags
from keel.core.verifiers import check_outcome, check_signoffs, named_verifiers
from keel.loop.driver import DeltaSink, Driver, EventSink, LeaseGuard
from keel.loop.middleware import Middleware
from keel.models.base import Model
from keel.models.connections import close_shared_clients
from keel.models.context_sizes import check_context_tokens
from keel.policy.modes import parse_mode
from keel.policy.rules import Policy
from keel.runtime.agent_config import load_agent_settings
from keel.runtime.agent_runs import agent_run, allowlist
from keel.runtime.agent_specs import load_agent_spec
from keel.runtime.approval_config import load_approval_settings
from keel.runtime.child_slots import execute_child
from keel.runtime.config import load_sandbox_settings
from keel.runtime.containment import Containment, contain, store_files
from keel.runtime.delegation import Delegation
from keel.runtime.git_source import (
    GitSource,
    checkout_done,
    discard,
    materialize,
    new_workspace_path,
    parse_source,
)
from keel.runtime.heartbeat import Heartbeat
from keel.runtime.hooks import RunMiddleware
from keel.runtime.identity import process_owner
from keel.runtime.mcp_servers import load_mcp_servers
from keel.runtime.outcome import EXIT_CODES, RunOutcome
from keel.runtime.people import PeopleDecisions
from keel.runtime.resume import read_policy_again, resume_events
from keel.runtime.reviews import Reviews, reviewer_verifiers
from keel.runtime.run_models import (
    RunModels,
    RunRedaction,
    absolute_scripted,
    check_priced,
    check_record,
    recording,
)
from keel.runtime.run_tools import RunTools
from keel.runtime.secrets import WorkspaceSecrets, load_redactor, refuse_secret_commands
from keel.runtime.steering import follow_up_events
from keel.runtime.streaming import stream_run
from keel.runtime.takeover import (
    TakeOver,
    WaitListener,
    lease_ttl_from_environment,
    take_run_lease,
    this_holder,
)
from keel.runtime.task_claims import RunTaskClaims, claim_lease_for
from keel.runtime.tracing import Tracing
from keel.sandbox.choose import open_sandbox
from keel.store.base import Lease, Store, iter_all_events
from keel.store.url import open_store
from keel.tools.builtin import default_registry
from keel.tools.registry import ToolRegistry
from keel.tools.skills import workspace_skills

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider


class Harness(PeopleDecisions):
    """Drive runs against a store with a model and tools."""

    def __init__(
        self,
        store: str | Store | None = None,
        model: str | Model | None = None,
        *,
        tools: ToolRegistry | None = None,
        owner: str | None = None,
        lease_ttl: float | None = None,
        on_event: EventSink | None = None,
        child_slots: int | None = None,
        middleware: Sequence[Middleware | str] = (),
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """``child_slots``: threads this harness gives to executing background children
        (None: ``[agents] child_slots`` of the working directory's config, default 4; 0:
        only ``keel worker``s execute them).

        ``middleware``: `Middleware` objects, or names of ``keel.middleware`` entry
        points, asked at the loop's lifecycle points of every run this harness executes
        (children included), before the run's own ``.keel/hooks.toml``
        (``keel.runtime.hooks``). ConfigError for an unknown entry point or two with
        one name.

        ``tracer_provider``: an OpenTelemetry provider that gets a span per run, step,
        model call, tool call, verification and wait (``keel.runtime.run_spans``); by
        default one is made from the ``OTEL_EXPORTER_OTLP_*`` variables when they are
        set (``keel.runtime.tracing``), and none otherwise."""
        self.store: Store = store if not isinstance(store, str | None) else open_store(store)
        self.models = RunModels(model)  # which model drives each run (runtime.run_models)
        self.tools = tools or default_registry()
        self.owner = process_owner(owner)
        self.lease_ttl = lease_ttl if lease_ttl is not None else lease_ttl_from_environment()
        claim_lease_for(self.lease_ttl)  # a bad KEEL_TASK_LEASE stops here, before any run
        self.on_event = on_event
        self._child_slots = child_slots
        self.delegation = Delegation(self)
        self.reviews = Reviews(self.delegation)  # reviewer verifiers (runtime.reviews)
        self.run_tools = RunTools(self.tools)  # each run's registry (keel.runtime.run_tools)
        self.run_middleware = RunMiddleware(middleware)  # each run's chain (runtime.hooks)
        self.tracing = (
            Tracing(tracer_provider) if tracer_provider is not None else Tracing.from_environment()
        )

    # --- starting ------------------------------------------------------------------------

    def create(
        self,
        goal: str,
        *,
        cwd: str | Path = ".",
        budget: Budget | None = None,
        verify: Sequence[str] | Mapping[str, str] = (),
        mode: str = "edit",
        plan_then: str | None = None,
        model: str | None = None,
        verify_human: Sequence[str] = (),
        verify_agent: Sequence[str] | Mapping[str, str] = (),
        outcome: str | None = None,
        approval_timeout: float | None = None,
        grant_ttl: float | None = None,
        policy_file: str | Path | None = None,
        idempotency_key: str | None = None,
        queued: bool = False,
        parent_id: str | None = None,
        task_id: str | None = None,
        sandbox: str | None = None,
        record: str | Path | None = None,
        workspace_git: str | None = None,
        agent: str | None = None,
        tools: Sequence[str] | None = None,
        context_tokens: int | None = None,
        context_summary: bool = False,
        tags: Mapping[str, str] | None = None,
    ) -> RunState:
        """Record a new run (``queued`` for a worker, else ready to execute here).

        ``agent`` names an agent spec (the workspace's ``.keel/agents/NAME.md``, else a
        built-in) the run follows as a top-level agent (``keel.runtime.agent_runs``): its
        instructions and output schema around the goal, its tool allowlist and mode never
        wider than this call's ``mode``, its model and budget where the call gives none,
        its verifiers after the call's. An invalid or unknown spec is a ConfigError
        naming the file and line (or the names that exist), raised before anything is
        stored.

        ``tools`` is the run's allowlist: the only tools its model is offered and may
        call (``request_completion`` always, so it can finish; with ``agent``, the
        spec's allowlist is narrowed to it). A name this harness has no tool for is a
        ConfigError listing the tools there are.

        ``context_tokens`` is the model's context size in tokens (default: the known size
        of the run's model, ``keel.models.context_sizes``); older turns are compacted
        into a continuation before a request would pass it (``keel.loop.context``), and
        ``context_summary`` adds the model's own summary of them. Both are fixed at
        creation, so a resume builds the same context.

        ``verify`` holds the verifier commands: ``"pytest -q"``, or named
        ``"unit_tests=pytest -q"`` (or a mapping name -> command); a completed run's
        result files each one's output under its name (``keel.core.verifiers``).
        ``verify_human`` names people who must sign off after the commands pass (the
        run waits for ``sign_off``); ``verify_agent`` names reviewer agents
        (``"review=reviewer"``: verifier name, agent spec) whose review of the change must
        list no blocking issue (``keel.runtime.reviews``); ``outcome`` is what a
        completed result declares (default ``task_completed``). Bad names, and a reviewer
        that is no agent spec or cannot review, are a ConfigError, before anything is
        stored.

        ``tags`` label the run (``keel.core.tags``: lowercase keys, text values), stored
        in its options for ``keel runs --tag KEY=VALUE``; a bad one is a ConfigError.

        ``workspace_git`` (``URL[@REF]``) makes the run's workspace a checkout of that
        git source made by whichever process executes it (``keel.runtime.git_source``);
        ``cwd`` is then only where the configuration and policy are read.

        ``sandbox`` (required | auto | off) overrides ``[sandbox] mode`` of the
        workspace's ``.keel/config.toml``; a run this process must drive is refused
        (ConfigError) when it requires a sandbox this machine cannot provide.
        ``approval_timeout`` (seconds a request may wait) and ``grant_ttl`` (seconds a
        grant stays usable) override ``[approvals]`` of that file (default 24 h each).
        Budgets and times out of range (not positive, not finite) are a ConfigError
        naming the argument, raised before anything is stored; so is a cost budget
        (``max_cost``) with a model Keel has no price for, and ``record`` (a cassette
        file, written by ``execute``) for a ``queued`` run: recording happens in the
        process that talks to the model.
        """
        check_budget(budget or Budget())
        check_seconds("approval_timeout", approval_timeout)
        check_seconds("grant_ttl", grant_ttl)
        check_context_tokens("context_tokens", context_tokens)
        check_outcome(outcome)
        run_tags = check_tags(tags)
        verify, verifier_names = named_verifiers(verify)
        signoffs = check_signoffs(verify_human, verifier_names or verify)
        if record is not None:
            check_record(record, queued=queued)
        if not goal.strip():
            raise ConfigError("the task is empty: say what the run should achieve")
        workspace = Path(cwd).resolve()
        if not workspace.is_dir():
            raise ConfigError(f"workspace {workspace} is not a directory")
        source = parse_source(workspace_git) if workspace_git is not None else None
        # Verify commands are stored as written (a resume or a worker runs them), so one
        # holding a secret is refused; the goal is stored redacted.
        redactor = load_redactor(workspace)
        refuse_secret_commands(verify, redactor)
        reviewers = reviewer_verifiers(
            verify_agent,
            taken=(*(verifier_names or verify), *signoffs),
            workspace=workspace,
            known_tools=self.tools.names(),
        )
        parse_mode(mode)
        if plan_then is not None:
            parse_mode(plan_then)
            mode = "plan"  # a follow-on mode means: plan first (as `keel run --plan-then`)
        # The file's absolute path is stored, so a resume from anywhere reads it again.
        policy = Policy.from_sources(
            workspace, Path(os.path.abspath(policy_file)) if policy_file else None
        )
        confinement = load_sandbox_settings(workspace, mode=sandbox)
        approvals = load_approval_settings(workspace)
        if not queued:
            open_sandbox(confinement)  # `required` without bubblewrap stops here
        followed = (
            agent_run(
                load_agent_spec(agent, workspace, known_tools=self.tools.names()),
                goal=goal,
                mode=mode,
                registry=self.tools,
            )
            if agent is not None
            else None
        )
        if followed is not None:
            goal, mode = followed.goal, followed.mode
            model = model or followed.spec.model
            budget = budget or followed.budget
            added = tuple(v for v in followed.spec.verify if v not in verify)
            if verifier_names is not None:
                verifier_names = (*verifier_names, *added)
            verify = (*verify, *added)
            refuse_secret_commands(verify, redactor)
        servers = load_mcp_servers(workspace) if source is None else ()  # a broken file: here
        allowed = allowlist(
            tools,
            self.tools,
            followed.tools if followed else None,
            mcp_servers=tuple(server.name for server in servers),
        )
        # The skills' names and descriptions are fixed at creation (the prompt of a resumed
        # run is the same); a git-source run's checkout does not exist yet: none.
        skills = tuple(s.summary() for s in workspace_skills(workspace)) if not source else ()
        spec = self.models.spec_for(model)
        self.models.check(spec, budget or Budget(), queued=queued)
        spec_options = followed.options() if followed is not None else {}
        outcome = outcome or spec_options.pop("outcome", None)  # the call's, else the spec's
        options = RunOptions(
            model=spec,
            mode=mode,
            verify=tuple(verify),
            budget=budget or Budget(),
            approval_timeout_s=approval_timeout or approvals.timeout_s,
            grant_ttl_s=grant_ttl or approvals.grant_ttl_s,
            plan_then=plan_then,
            policy=policy.to_dict(),
            sandbox=confinement.to_dict(),
            workspace_git=source.to_dict() if source is not None else None,
            **spec_options,
            tools=allowed,
            skills=skills or None,
            context_tokens=context_tokens,
            context_summary=context_summary,
            verifier_names=verifier_names,
            signoffs=signoffs,
            reviewers=reviewers,
            outcome=outcome,
            tags=run_tags,
        )
        return self.store.create_run(
            goal=redactor.scrub_text(goal),
            workspace=str(new_workspace_path() if source is not None else workspace),
            options=options,
            parent_id=parent_id,
            task_id=task_id,
            idempotency_key=idempotency_key,
            queued=queued,
        )

    def run(
        self,
        goal: str,
        *,
        on_delta: DeltaSink | None = None,
        record: str | Path | None = None,
        **options: Any,
    ) -> RunOutcome:
        """Create a run and drive it until it completes, fails, or waits for a person.

        ``on_delta`` sees a streaming model's text as it arrives (never stored);
        ``record`` writes every model exchange of this process to a cassette file.
        """
        state = self.create(goal, record=record, **options)
        outcome = self.execute(state.run_id, on_delta=on_delta, record=record)
        return self.follow_handoffs(outcome)

    def stream(self, goal: str, **options: Any) -> Iterator[Event]:
        """Create a run (``run``'s arguments) and drive it in a background thread, yielding
        each event as committed until it ends, waits or pauses (``keel.runtime.streaming``)."""
        return stream_run(self, goal, **options)

    def follow_handoffs(self, outcome: RunOutcome) -> RunOutcome:
        """Drive the runs ``outcome``'s run handed its task to, in turn, here; the last
        one's outcome (a run no one else already executes)."""
        while (outcome.state.result or {}).get("outcome") == "handed_off":
            target = str(outcome.state.result["handed_off_to"])  # type: ignore[index]
            state = self.store.load_run(target)
            state = execute_child(self, target, task_id=state.task_id, token=None)
            outcome = RunOutcome(state=state)
        return outcome

    def resume(
        self,
        run_id: str,
        *,
        wait: float | None = 0.0,
        on_wait: WaitListener | None = None,
        on_delta: DeltaSink | None = None,
        record: str | Path | None = None,
        model: str | None = None,
        by: str | None = None,
    ) -> RunOutcome:
        """Continue a run from the store alone (in this or any other process).

        A lease whose holder died on this machine is taken over at once; one a live
        process holds is waited for up to ``wait`` seconds (None: until it lapses),
        ``on_wait`` told as it goes; past that, ``LeaseHeld``. ``model`` (a spec)
        drives the rest of this run instead of the one it was created with — say after
        a provider ran out of credit; every later ``model_requested`` names it. A
        paused run is resumed (its ``status_changed`` names ``by``, default this
        harness's owner) and driven here.
        """
        return self.execute(
            run_id,
            wait=wait,
            on_wait=on_wait,
            on_delta=on_delta,
            record=record,
            model=model,
            resume_paused_by=by or self.person,
        )

    def execute(
        self,
        run_id: str,
        *,
        lease: Lease | None = None,
        should_stop: Callable[[], bool] | None = None,
        wait: float | None = 0.0,
        on_wait: WaitListener | None = None,
        on_delta: DeltaSink | None = None,
        record: str | Path | None = None,
        model: str | None = None,
        resume_paused_by: str | None = None,
    ) -> RunOutcome:
        """Drive ``run_id`` under its lease; ``LeaseHeld`` if another process has it
        (after waiting up to ``wait`` seconds for it, as ``resume`` does).

        A paused run stays paused (the driver stops at once, the lease given back)
        unless ``resume_paused_by`` names who resumes it; a run that gets paused while
        driven (``keel pause``) stops after its current step, leaving its lease free.
        A follow-up run (``options.follows``) first records the run it follows's
        outcome and evidence for its model (``keel.runtime.steering``).

        ``should_stop`` is asked between steps: when it says yes the run is left
        resumable (its lease released) instead of being driven further. A resumed run
        first records what changed while it was stopped (``keel.runtime.resume``); a
        policy file that became invalid refuses the resume before anything is written;
        so does a cost budget the model cannot be priced for (ConfigError). ``on_delta``
        and ``record`` are as for ``run``, ``model`` as for ``resume``.
        """
        state = self.store.load_run(run_id)
        if state.status.terminal:
            return RunOutcome(state=state)
        driving = (
            self.models.resolve(absolute_scripted(model)) if model else self.models.for_run(state)
        )
        check_priced(driving, state.options.budget)
        source = state.options.workspace_git
        if source:  # checked out here before anything else looks at the workspace
            materialize(GitSource.from_dict(source), Path(state.workspace))
        redaction = RunRedaction()
        if record is not None:  # a cassette of another model is refused before the lease
            check_record(record, queued=False)
            driving = recording(driving, Path(record), redaction)
        containment = self.containment(state)  # `required` without bubblewrap stops here
        registry = self.run_tools.for_run(state)  # MCP servers connect here, before the lease
        chain = self.run_middleware.for_run(state)  # a broken hooks.toml stops here too
        tracer = self.tracing.for_run(self.store, state) if self.tracing else None  # no SDK: here
        claims = RunTaskClaims.for_run(self.store, run_id, heartbeat_ttl=self.lease_ttl)
        policy = read_policy_again(state) if state.last_seq > 1 else None
        taken: TakeOver | None = None
        if lease is None:
            lease, taken = take_run_lease(
                self.store, run_id, owner=self.owner, ttl=self.lease_ttl, wait=wait, on_wait=on_wait
            )
        held = lease
        # Another process may have finished or moved the run between the read and the lease.
        state = self.store.load_run(run_id)
        if state.status.terminal:
            self.store.release_run_lease(held)
            return RunOutcome(state=state)
        guard = LeaseGuard(token=held.token)

        def lost(why: str) -> None:
            guard.lost = why

        heartbeat = Heartbeat(
            held,
            ttl=self.lease_ttl,
            renew=lambda current, ttl: self.store.renew_run_lease(current, ttl=ttl),
            on_lost=lost,
            on_beat=claims.renew,  # the run's task claims live as long as it runs
        )
        # An isolated child's copy leaves out the git-ignored .env files of the workspace
        # it was made from; their values are still secrets in its log.
        home = (state.options.isolated or {}).get("parent")
        secrets = WorkspaceSecrets(Path(state.workspace), cwd=Path(home) if home else None)
        driver = Driver(
            store=self.store,
            model=driving,
            registry=registry,
            gate=containment.gate,
            state=state,
            owner=f"run:{run_id}",
            lease=guard,
            on_event=tracer.observing(self.on_event) if tracer else self.on_event,
            should_stop=should_stop,
            sandbox=containment.sandbox,
            guard=containment.guard,
            settings=containment.settings,
            redactor=secrets.load(),
            secrets=secrets,
            on_delta=on_delta,
            delegation=self.delegation,
            reviews=self.reviews,
            middleware=chain,
        )
        redaction.driver = driver
        try:
            with heartbeat:
                holder = held.holder or this_holder()
                driver.commit(
                    [
                        *resume_events(
                            state,
                            owner=self.owner,
                            holder=holder,
                            takeover=taken,
                            policy=policy,
                            resumed_by=resume_paused_by,
                        ),
                        *follow_up_events(self.store, state),
                        *(tracer.begin(state) if tracer else ()),
                    ]
                )
                if driver.state.options.policy != state.options.policy:  # policy_changed
                    containment = self.containment(driver.state)
                    driver.gate, driver.guard = containment.gate, containment.guard
                final = driver.drive()
                claims.settle(final)  # an ended run gives back the tasks it still holds
                if final.status.terminal:
                    self.delegation.end_of_run(final)  # its live children end with it
                    if source and checkout_done(final):
                        discard(GitSource.from_dict(source), Path(final.workspace))
        finally:
            if tracer is not None:
                tracer.end(driver.state, sys.exc_info()[1])
            if guard.lost is None:
                self.store.release_run_lease(heartbeat.lease)
        return RunOutcome(state=final)

    def child_slot_count(self) -> int:
        """Threads for background children (see ``__init__``)."""
        if self._child_slots is not None:
            return self._child_slots
        try:
            return load_agent_settings(Path.cwd()).child_slots
        except ConfigError:
            return 0

    def redact_for(self, state: RunState) -> Callable[[str], str]:
        """Scrubs the secrets of ``state``'s workspace from text (goals of new runs)."""
        return load_redactor(Path(state.workspace)).scrub_text

    def containment(self, state: RunState) -> Containment:
        """The run's sandbox, path guard and gate, from its stored options.

        ConfigError when the run requires a sandbox this machine cannot provide.
        """
        return contain(state, store_files=store_files(self.store), artifacts=self.store)

    # --- reading -------------------------------------------------------------------------

    def get(self, run_id: str) -> RunState:
        return self.store.load_run(run_id)

    def events(self, run_id: str, after: int = 0) -> Iterator[Event]:
        for event in iter_all_events(self.store, run_id):
            if event.seq > after:
                yield event

    def close(self) -> None:
        """Stop this harness's child slots (each hands its child back, resumable), then
        close the store and the process's shared model connections (a later model call
        opens them again)."""
        try:
            self.delegation.close()
            self.run_tools.close()
            self.store.close()
        finally:
            close_shared_clients()
            if self.tracing is not None:
                self.tracing.flush()  # spans still queued are sent now

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["EXIT_CODES", "Harness", "RunOutcome"]
