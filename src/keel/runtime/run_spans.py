"""A run's spans, made from the events its driver stores (OpenTelemetry GenAI conventions).

One ``RunTracer`` per process that drives a run (``Harness.execute``):

    invoke_agent AGENT              the drive (gen_ai.operation.name invoke_agent)
    ├── keel.step                   one per model turn: the call and the tools it asked for
    │   ├── chat MODEL              the model call (chat): model, tokens, cost
    │   ├── execute_tool TOOL       each tool call (execute_tool); a failed one is an error
    │   └── keel.verify             the verification the turn's final answer asked for
    └── keel.wait                   a wait for a person (approval, answer, sign-off) that
                                    ended before this drive: made by the process resuming

Spans are made after their events are stored, never while the loop decides, and carry
the times the events hold: a call's span ends at its event's ``recorded_at`` and starts
``elapsed_s`` before it (a read's result may be stored with the next step; its time is
its own). A step ends where the next one starts, or where the drive ends. The spans go
to a ``SpanWriter``: Keel's OTLP exporter, or an OpenTelemetry tracer (``Tracing``).

Guarantees: tracing adds one event per drive to the run's log (``trace_started``: the
trace id and the run span's id) and nothing else; the ``trace_started`` records already
in the log become span links of the new run span, so a resumed run's trace points to
the traces before it (a killed process's too: its record was stored before it died);
a failure inside tracing stops this run's tracing (logged once), never the run.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Protocol

from keel.core.events import Event, EventType, NewEvent
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.loop.driver import EventSink
from keel.store.base import Store, iter_all_events

if TYPE_CHECKING:
    from keel.runtime.tracing import Tracing

SpanIds = tuple[int, int]  # (trace id, span id)

LOG = logging.getLogger("keel.tracing")
MAX_LINKS = 32  # earlier traces a run span links to, the latest ones
MAX_DESCRIPTION = 200  # characters of an error message kept as a span's status
DEFAULT_AGENT = "keel"

# A person's wait: what asks (by event type) and what answers it. Sign-offs are matched
# by the verifier's name, the others by the call id the request is about.
WAIT_ASKED = {"approval_requested", "input_requested", "signoff_requested"}
WAIT_ANSWERED = {"approval_granted", "approval_denied", "input_received", "signoff_recorded"}
DRIVE_STARTED = {"trace_started", "run_resumed"}  # a later drive began here


class SpanWriter(Protocol):
    """Where a tracer's spans go: an OpenTelemetry tracer (``keel.runtime.api_spans``) or
    Keel's own OTLP exporter (``keel.runtime.otlp_export``). Times are ns since the
    epoch; a span handle is the writer's own."""

    def open(
        self,
        name: str,
        parent: Any,
        *,
        kind: str,
        attributes: dict[str, Any],
        start: int | None,
        links: Sequence[SpanIds] = (),
        fixed: Mapping[str, Any] = ...,
    ) -> Any:
        """A span started at ``start`` (None: now) under ``parent``: a handle ``open``
        returned, the ids of a span elsewhere, or None (a new trace, or the caller's
        current span). ``fixed``: more attributes, a mapping passed again unchanged for
        span after span (a writer may keep its encoding)."""

    def record(
        self,
        name: str,
        parent: Any,
        *,
        kind: str,
        fixed: Mapping[str, Any],
        attributes: dict[str, Any],
        start: int,
        end: int,
        error: str | None = None,
    ) -> None:
        """A span under ``parent`` (a handle ``open`` returned) whose start and end are
        both known: opened and closed at once."""

    def close(
        self,
        span: Any,
        end: int | None,
        *,
        attributes: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        """End ``span`` (None: now), with more attributes; ``error``: it ended in error."""

    def event(self, span: Any, name: str, attributes: dict[str, Any], at: int) -> None: ...

    def ids(self, span: Any) -> SpanIds: ...


class RunTracer:
    """The spans of one drive of one run, made from its stored events (module doc)."""

    def __init__(
        self,
        writer: SpanWriter,
        store: Store,
        state: RunState,
        *,
        parent: SpanIds | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``parent``: the run span of this run's parent, when it is driven in this
        process too (the child's spans are then in the parent's trace)."""
        self.run_id = state.run_id
        self._writer = writer
        self._store = store
        self._state = state  # the run as last stored
        self._parent = parent
        self._tracing = tracing
        self._run: Any = None
        self._step: Any = None
        self._step_no = 0
        self._model_spec = ""  # the latest model_requested's model
        self._started: dict[str, tuple[int, str]] = {}  # call id -> (start ns, effect)
        self._verifying: int | None = None  # when the open verification started (ns)
        self._fixed: dict[tuple[str, ...], dict[str, Any]] = {}  # ("chat", spec), ("tool", ...)
        self._broken = False
        self._handlers: dict[EventType, Callable[[Event, int], None]] = {
            EventType.MODEL_REQUESTED: self._model_requested,
            EventType.MODEL_RESPONDED: self._model_responded,
            EventType.TOOL_STARTED: self._tool_started,
            EventType.TOOL_FINISHED: self._tool_ended,
            EventType.TOOL_FAILED: self._tool_ended,
            EventType.VERIFICATION_STARTED: self._verification_started,
            EventType.VERIFICATION_PASSED: self._verification_ended,
            EventType.VERIFICATION_FAILED: self._verification_ended,
            EventType.RETRY_SCHEDULED: self._retry_scheduled,
        }

    # --- the drive ---------------------------------------------------------------------

    def begin(self, state: RunState) -> list[NewEvent]:
        """Open the run span of a drive of ``state`` (as read under the run's lease),
        linked to the traces the log names (a resumed run's log is read once, here); the
        ``trace_started`` event to store with the drive's first step. If that fails, the
        drive goes on untraced (logged) and nothing is recorded."""
        try:
            return self._begin(state)
        except Exception:
            self._run = None
            LOG.warning("tracing of run %s could not start", self.run_id, exc_info=True)
            return []

    def _begin(self, state: RunState) -> list[NewEvent]:
        self._state = state
        earlier, waits = self._read_log() if state.last_seq > 1 else ([], [])
        agent = str((state.options.agent or {}).get("name") or DEFAULT_AGENT)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": self.run_id,
            "keel.run_id": self.run_id,
        }
        provider, model = model_names(state.options.model or "")
        if provider:
            attributes["gen_ai.provider.name"] = provider
        if model:
            attributes["gen_ai.request.model"] = model
        if state.parent_id:
            attributes["keel.parent_run_id"] = state.parent_id
        if state.last_seq > 1:
            attributes["keel.resumed"] = True  # driven before (the log names its traces)
        self._run = self._writer.open(
            f"invoke_agent {agent}",
            self._parent,
            kind="internal",
            attributes=attributes,
            start=None,
            links=earlier[-MAX_LINKS:],
        )
        trace_id, span_id = ids = self._writer.ids(self._run)
        if self._tracing is not None:
            self._tracing.opened(self.run_id, ids)
        for asked, answered, asked_in in waits:
            self._wait_span(asked, answered, asked_in)
        data = {"trace_id": f"{trace_id:032x}", "span_id": f"{span_id:016x}"}
        return [NewEvent(type=EventType.TRACE_STARTED, data=data)]

    def observing(self, downstream: EventSink | None) -> EventSink:
        """The driver's event sink: this tracer, then ``downstream`` (the harness's)."""
        observe = self.observe
        if downstream is None:
            return observe

        def both(event: Event, state: RunState) -> None:
            observe(event, state)
            downstream(event, state)

        return both

    def observe(self, event: Event, state: RunState) -> None:
        """Make the spans ``event`` (just stored) ends."""
        self._state = state
        handler = self._handlers.get(event.type)
        if handler is None or self._broken or self._run is None or event.run_id != self.run_id:
            return
        try:
            handler(event, _ns(event.recorded_at))
        except Exception:
            self._broken = True
            LOG.warning("tracing of run %s stopped", self.run_id, exc_info=True)

    def end(self, state: RunState, error: BaseException | None = None) -> None:
        """Close the step and the run span with where the run stands (``state``);
        ``error`` is what stopped the drive, if anything did."""
        run = self._run
        if run is None:
            return
        self._run = None
        try:
            now = time.time_ns()
            if self._step is not None:
                self._writer.close(self._step, now)
                self._step = None
            usage = state.usage
            attributes: dict[str, Any] = {
                "keel.status": state.status.value,
                "keel.steps": usage.steps,
                "keel.tool_calls": usage.tool_calls,
                "keel.cost_usd": usage.cost,
                "gen_ai.usage.input_tokens": usage.input_tokens,
                "gen_ai.usage.output_tokens": usage.output_tokens,
            }
            if state.reason:
                attributes["keel.stop_reason"] = state.reason
            failure = None
            if error is not None:
                attributes["error.type"] = type(error).__name__
                failure = _short(f"{type(error).__name__}: {error}")
            elif state.status is RunStatus.FAILED:
                attributes["error.type"] = (state.reason or "failed").split(":")[0]
                failure = _short(state.reason or "failed")
            self._writer.close(run, now, attributes=attributes, error=failure)
        except Exception:
            LOG.warning("tracing of run %s could not end its span", self.run_id, exc_info=True)
        finally:
            if self._tracing is not None:
                self._tracing.closed(self.run_id)

    # --- steps, model calls, tool calls, verifications ----------------------------------

    def _enter_step(self, step: int, start: int) -> None:
        if self._step is not None:
            if step == self._step_no:
                return
            self._writer.close(self._step, start)
        self._step_no = step
        self._step = self._writer.open(
            "keel.step", self._run, kind="internal", attributes={"keel.step": step}, start=start
        )

    def _model_requested(self, event: Event, at: int) -> None:
        self._model_spec = str(event.data.get("model") or "")

    def _model_responded(self, event: Event, at: int) -> None:
        d = event.data
        start = _start(at, d.get("elapsed_s"), at)
        step = d.get("step")
        step = step if isinstance(step, int) else self._step_no + 1
        self._enter_step(step, start)
        fixed = self._chat_attributes(self._model_spec or self._state.options.model or "")
        usage = d.get("usage") or {}
        attributes: dict[str, Any] = {
            "gen_ai.usage.input_tokens": _count(usage.get("input_tokens")),
            "gen_ai.usage.output_tokens": _count(usage.get("output_tokens")),
            "keel.cost_usd": float(d.get("cost") or 0.0),
        }
        cached, reasoning = usage.get("cached_input_tokens"), usage.get("reasoning_tokens")
        if cached:
            attributes["gen_ai.usage.cache_read.input_tokens"] = _count(cached)
        if reasoning:
            attributes["gen_ai.usage.reasoning.output_tokens"] = _count(reasoning)
        if d.get("model"):
            attributes["gen_ai.response.model"] = str(d["model"])
        finish = d.get("finish_reason")
        if finish:
            attributes["gen_ai.response.finish_reasons"] = (str(finish),)
        failure = None
        if finish in ("content_filter", "refusal"):
            attributes["error.type"] = str(finish)
            failure = f"the provider declined ({finish})"
        self._writer.record(
            f"chat {fixed['gen_ai.request.model']}",
            self._step,
            kind="client",
            fixed=fixed,
            attributes=attributes,
            start=start,
            end=at,
            error=failure,
        )
        self._model_spec = ""

    def _chat_attributes(self, spec: str) -> Mapping[str, Any]:
        """The attributes every chat span of model ``spec`` in this run has (one mapping
        per model, passed as ``fixed``)."""
        found = self._fixed.get(("chat", spec))
        if found is None:
            provider, model = model_names(spec)
            found = self._fixed[("chat", spec)] = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": model,
                "gen_ai.conversation.id": self.run_id,
            }
        return found

    def _tool_attributes(self, tool: str, effect: str) -> Mapping[str, Any]:
        """The attributes every span of ``tool`` with ``effect`` has (``fixed``)."""
        found = self._fixed.get(("tool", tool, effect))
        if found is None:
            found = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.type": "extension" if tool.startswith("mcp__") else "function",
            }
            if effect:
                found["keel.tool.effect"] = effect
            self._fixed[("tool", tool, effect)] = found
        return found

    def _tool_started(self, event: Event, at: int) -> None:
        d = event.data
        self._started[str(d.get("call_id", ""))] = (at, str(d.get("effect") or ""))

    def _tool_ended(self, event: Event, at: int) -> None:
        d = event.data
        call_id = str(d.get("call_id", ""))
        started = self._started.pop(call_id, None)
        start = _start(at, d.get("elapsed_s"), started[0] if started else at)
        if self._step is None:  # a resumed drive finishing the calls of an earlier turn
            self._enter_step(self._state.usage.steps or 1, start)
        tool = str(d.get("tool") or "?")
        attributes: dict[str, Any] = {"gen_ai.tool.call.id": call_id}
        failure = None
        if event.type is EventType.TOOL_FAILED:
            attributes["error.type"] = str(d.get("error_kind") or "_OTHER")
            failure = _short(str(d.get("message") or ""))
        self._writer.record(
            f"execute_tool {tool}",
            self._step,
            kind="internal",
            fixed=self._tool_attributes(tool, started[1] if started is not None else ""),
            attributes=attributes,
            start=start,
            end=at,
            error=failure,
        )

    def _verification_started(self, event: Event, at: int) -> None:
        self._verifying = at

    def _verification_ended(self, event: Event, at: int) -> None:
        d = event.data
        start = _start(at, d.get("elapsed_s"), self._verifying or at)
        self._verifying = None
        passed = event.type is EventType.VERIFICATION_PASSED
        records = d.get("records") or []
        gaps = d.get("gaps") or []
        attributes: dict[str, Any] = {
            "keel.verify.passed": passed,
            "keel.verify.commands": len(records),
        }
        if gaps:
            attributes["keel.verify.gaps"] = len(gaps)
        failure = None if passed else _short(str(gaps[0]) if gaps else "failed")
        span = self._writer.open(
            "keel.verify",
            self._step if self._step is not None else self._run,
            kind="internal",
            attributes=attributes,
            start=start,
        )
        self._writer.close(span, at, error=failure)

    def _retry_scheduled(self, event: Event, at: int) -> None:
        if self._run is not None:
            d = event.data
            self._writer.event(
                self._run,
                "keel.retry",
                {
                    "keel.retry.attempt": _count(d.get("attempt")),
                    "keel.retry.wait_seconds": float(d.get("wait_seconds") or 0.0),
                    "keel.retry.error": _short(str(d.get("error") or "")),
                },
                at,
            )

    # --- what earlier drives left in the log ---------------------------------------------

    def _read_log(
        self,
    ) -> tuple[list[SpanIds], list[tuple[Event, Event, SpanIds | None]]]:
        """The run spans earlier drives recorded, and the waits for a person answered
        since the latest drive began (each with the run span of the drive that asked)."""
        earlier: list[SpanIds] = []
        asked: dict[str, tuple[Event, SpanIds | None]] = {}
        waits: list[tuple[Event, Event, SpanIds | None]] = []
        for event in iter_all_events(self._store, self.run_id):
            kind = event.type.value
            if kind in DRIVE_STARTED:
                waits.clear()  # answered before that drive: its spans were that drive's
                if kind == "trace_started":
                    ids = _recorded_span(event.data)
                    if ids is not None:
                        earlier.append(ids)
            elif kind in WAIT_ASKED:
                asked[_wait_key(event)] = (event, earlier[-1] if earlier else None)
            elif kind in WAIT_ANSWERED:
                found = asked.pop(_wait_key(event), None)
                if found is not None:
                    waits.append((found[0], event, found[1]))
        return earlier, waits

    def _wait_span(self, asked: Event, answered: Event, asked_in: SpanIds | None) -> None:
        a, b = asked.data, answered.data
        kind = a.get("kind") or asked.type.value.removesuffix("_requested")
        attributes: dict[str, Any] = {
            "keel.wait.kind": str(kind),
            "keel.wait.answer": answered.type.value,
        }
        if a.get("tool"):
            attributes["gen_ai.tool.name"] = str(a["tool"])
        if a.get("call_id"):
            attributes["gen_ai.tool.call.id"] = str(a["call_id"])
        if a.get("verifier"):
            attributes["keel.wait.verifier"] = str(a["verifier"])
        if b.get("by"):
            attributes["keel.wait.by"] = str(b["by"])
        span = self._writer.open(
            "keel.wait",
            self._run,
            kind="internal",
            attributes=attributes,
            start=_ns(asked.recorded_at),
            links=[asked_in] if asked_in is not None else (),
        )
        self._writer.close(span, _ns(answered.recorded_at))


@functools.lru_cache(maxsize=64)
def model_names(spec: str) -> tuple[str, str]:
    """(provider, model) of a model spec: ``deepseek:deepseek-chat`` is ("deepseek",
    "deepseek-chat"); a scripted or replayed model is named by its file's name."""
    provider, colon, name = spec.partition(":")
    if not colon:
        return "", spec.strip()
    provider, name = provider.strip(), name.strip()
    if provider in ("scripted", "replay"):
        name = PurePath(name).name
    return provider, name


def _recorded_span(data: dict[str, Any]) -> SpanIds | None:
    """The run span a ``trace_started`` event names (None if it names none validly)."""
    try:
        trace_id, span_id = int(str(data["trace_id"]), 16), int(str(data["span_id"]), 16)
    except (KeyError, ValueError):
        return None
    valid = 0 < trace_id < 1 << 128 and 0 < span_id < 1 << 64
    return (trace_id, span_id) if valid else None


def _wait_key(event: Event) -> str:
    if event.type.value.startswith("signoff"):
        return f"signoff:{event.data.get('verifier')}"
    return str(event.data.get("call_id"))


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def _start(end: int, elapsed_s: Any, otherwise: int) -> int:
    """When a call that ended at ``end`` started: ``elapsed_s`` before, when recorded."""
    if isinstance(elapsed_s, int | float) and elapsed_s >= 0:
        return end - int(elapsed_s * 1_000_000_000)
    return otherwise


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _short(text: str) -> str:
    return text if len(text) <= MAX_DESCRIPTION else text[: MAX_DESCRIPTION - 1] + "…"
