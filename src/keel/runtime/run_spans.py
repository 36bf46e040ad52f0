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
its own). A step ends where the next one starts, or where the drive ends.

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
from collections.abc import Callable
from datetime import datetime
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    format_span_id,
    format_trace_id,
)

from keel.core.events import Event, EventType, NewEvent
from keel.core.state import RunState
from keel.core.status import RunStatus
from keel.loop.driver import EventSink
from keel.store.base import Store, iter_all_events

if TYPE_CHECKING:
    from keel.runtime.tracing import Tracing

LOG = logging.getLogger("keel.tracing")
MAX_LINKS = 32  # earlier traces a run span links to, the latest ones
MAX_DESCRIPTION = 200  # characters of an error message kept as a span's status
DEFAULT_AGENT = "keel"

# A person's wait: what asks (by event type) and what answers it. Sign-offs are matched
# by the verifier's name, the others by the call id the request is about.
WAIT_ASKED = {"approval_requested", "input_requested", "signoff_requested"}
WAIT_ANSWERED = {"approval_granted", "approval_denied", "input_received", "signoff_recorded"}
DRIVE_STARTED = {"trace_started", "run_resumed"}  # a later drive began here


class RunTracer:
    """The spans of one drive of one run, made from its stored events (module doc)."""

    def __init__(
        self,
        tracer: Tracer,
        store: Store,
        state: RunState,
        *,
        parent: SpanContext | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``parent``: the run span of this run's parent, when it is driven in this
        process too (the child's spans are then in the parent's trace)."""
        self.run_id = state.run_id
        self._tracer = tracer
        self._store = store
        self._state = state  # the run as last stored
        self._parent = parent
        self._tracing = tracing
        self._run: Span | None = None
        self._run_context: Context | None = None
        self._step: Span | None = None
        self._step_context: Context | None = None
        self._step_no = 0
        self._model_spec = ""  # the latest model_requested's model
        self._started: dict[str, tuple[int, str]] = {}  # call id -> (start ns, effect)
        self._verifying: int | None = None  # when the open verification started (ns)
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
        linked to the traces the log names; the ``trace_started`` event to store with
        the drive's first step."""
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
        parent = trace.set_span_in_context(NonRecordingSpan(self._parent)) if self._parent else None
        self._run = self._tracer.start_span(
            f"invoke_agent {agent}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=[Link(ids) for ids in earlier[-MAX_LINKS:]],
        )
        self._run_context = trace.set_span_in_context(self._run)
        ids = self._run.get_span_context()
        if self._tracing is not None:
            self._tracing.opened(self.run_id, ids)
        for asked, answered, asked_in in waits:
            self._wait_span(asked, answered, asked_in)
        data = {"trace_id": format_trace_id(ids.trace_id), "span_id": format_span_id(ids.span_id)}
        return [NewEvent(type=EventType.TRACE_STARTED, data=data)]

    def observing(self, downstream: EventSink | None) -> EventSink:
        """The driver's event sink: this tracer, then ``downstream`` (the harness's)."""
        if downstream is None:
            return self.observe

        def both(event: Event, state: RunState) -> None:
            self.observe(event, state)
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

    def end(self, error: BaseException | None = None) -> None:
        """Close the step and the run span with where the run stands (as last stored);
        ``error`` is what stopped the drive, if anything did."""
        run = self._run
        if run is None:
            return
        self._run = None
        try:
            now = time.time_ns()
            if self._step is not None:
                self._step.end(now)
                self._step = None
            state = self._state
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
            run.set_attributes(attributes)
            if error is not None:
                run.record_exception(error)
                run.set_attribute("error.type", type(error).__name__)
                run.set_status(Status(StatusCode.ERROR, _short(str(error))))
            elif state.status is RunStatus.FAILED:
                run.set_attribute("error.type", (state.reason or "failed").split(":")[0])
                run.set_status(Status(StatusCode.ERROR, _short(state.reason or "failed")))
            run.end(now)
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
            self._step.end(start)
        self._step_no = step
        self._step = self._tracer.start_span(
            "keel.step",
            context=self._run_context,
            attributes={"keel.step": step},
            start_time=start,
        )
        self._step_context = trace.set_span_in_context(self._step)

    def _model_requested(self, event: Event, at: int) -> None:
        self._model_spec = str(event.data.get("model") or "")

    def _model_responded(self, event: Event, at: int) -> None:
        d = event.data
        start = _start(at, d.get("elapsed_s"), at)
        step = d.get("step")
        step = step if isinstance(step, int) else self._step_no + 1
        self._enter_step(step, start)
        provider, model = model_names(self._model_spec or self._state.options.model or "")
        usage = d.get("usage") or {}
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": self.run_id,
            "gen_ai.usage.input_tokens": _count(usage.get("input_tokens")),
            "gen_ai.usage.output_tokens": _count(usage.get("output_tokens")),
            "keel.cost_usd": float(d.get("cost") or 0.0),
            "keel.step": step,
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
        span = self._tracer.start_span(
            f"chat {model}",
            context=self._step_context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=start,
        )
        if finish in ("content_filter", "refusal"):
            span.set_attribute("error.type", str(finish))
            span.set_status(Status(StatusCode.ERROR, f"the provider declined ({finish})"))
        span.end(at)
        self._model_spec = ""

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
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "extension" if tool.startswith("mcp__") else "function",
            "keel.step": self._step_no,
        }
        if started is not None and started[1]:
            attributes["keel.tool.effect"] = started[1]
        span = self._tracer.start_span(
            f"execute_tool {tool}",
            context=self._step_context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start,
        )
        if event.type is EventType.TOOL_FAILED:
            span.set_attribute("error.type", str(d.get("error_kind") or "_OTHER"))
            span.set_status(Status(StatusCode.ERROR, _short(str(d.get("message") or ""))))
        span.end(at)

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
            "keel.step": self._step_no,
        }
        if gaps:
            attributes["keel.verify.gaps"] = len(gaps)
        span = self._tracer.start_span(
            "keel.verify",
            context=self._step_context or self._run_context,
            attributes=attributes,
            start_time=start,
        )
        if not passed:
            span.set_status(Status(StatusCode.ERROR, _short(str(gaps[0]) if gaps else "failed")))
        span.end(at)

    def _retry_scheduled(self, event: Event, at: int) -> None:
        if self._run is not None:
            d = event.data
            self._run.add_event(
                "keel.retry",
                {
                    "keel.retry.attempt": _count(d.get("attempt")),
                    "keel.retry.wait_seconds": float(d.get("wait_seconds") or 0.0),
                    "keel.retry.error": _short(str(d.get("error") or "")),
                },
                timestamp=at,
            )

    # --- what earlier drives left in the log ---------------------------------------------

    def _read_log(
        self,
    ) -> tuple[list[SpanContext], list[tuple[Event, Event, SpanContext | None]]]:
        """The run spans earlier drives recorded, and the waits for a person answered
        since the latest drive began (each with the run span of the drive that asked)."""
        earlier: list[SpanContext] = []
        asked: dict[str, tuple[Event, SpanContext | None]] = {}
        waits: list[tuple[Event, Event, SpanContext | None]] = []
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

    def _wait_span(self, asked: Event, answered: Event, asked_in: SpanContext | None) -> None:
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
        span = self._tracer.start_span(
            "keel.wait",
            context=self._run_context,
            attributes=attributes,
            links=[Link(asked_in)] if asked_in is not None else None,
            start_time=_ns(asked.recorded_at),
        )
        span.end(_ns(answered.recorded_at))


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


def _recorded_span(data: dict[str, Any]) -> SpanContext | None:
    """The run span a ``trace_started`` event names (None if it names none validly)."""
    try:
        trace_id, span_id = int(str(data["trace_id"]), 16), int(str(data["span_id"]), 16)
    except (KeyError, ValueError):
        return None
    ids = SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return ids if ids.is_valid else None


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
