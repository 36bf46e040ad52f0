"""``keel.client``: the service's verbs for other Python programs (over HTTP, httpx).

``Client(base_url, token)`` and its asyncio twin ``AsyncClient`` speak to ``keel
serve``: submit runs, read and list them, follow their events, approve, deny, answer,
cancel, pause, resume, message, download artifacts, and work with tasks. Every method
returns the API's JSON as plain dicts (``artifact`` returns bytes).

Errors: a response with an error status raises ``ApiError`` (``status``, ``title``,
``detail`` — the CLI's words for the same failure); a server that cannot be reached
raises ``ConnectionFailed``. Both are ``KeelError``s.

``stream(run_id)`` yields each event of the run once, in order, until the run ends
(``until="settled"``: or waits or is paused). A dropped connection — or a server that
cut a client too far behind — is resumed with ``Last-Event-ID``, so nothing is missed
or repeated; it gives up (``ConnectionFailed``) after ``reconnects`` attempts in a
row that brought nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import quote

import httpx

from keel.core.errors import KeelError

Until = Literal["terminal", "settled"]
TERMINAL: Final = frozenset({"completed", "failed", "blocked", "cancelled"})
SETTLED: Final = frozenset({"waiting", "paused"})
STREAM_READ_TIMEOUT_S: Final = 60.0  # > the server's 15 s keep-alive
RECONNECTS: Final = 10
BACKOFF_MAX_S: Final = 2.0
RETRY_STATUSES: Final = frozenset({502, 503, 504})

__all__ = ["ApiError", "AsyncClient", "Client", "ConnectionFailed"]


class ApiError(KeelError):
    """The service answered with an error status (its problem document's fields)."""

    def __init__(self, status: int, title: str, detail: str, *, type: str = "about:blank") -> None:
        super().__init__(f"{status} {title}: {detail}")
        self.status = status
        self.title = title
        self.detail = detail
        self.type = type


class ConnectionFailed(KeelError):
    """The service could not be reached (or the connection broke for good)."""


# --- what each verb sends (shared by both clients) ----------------------------------------


@dataclass(frozen=True, slots=True)
class _Call:
    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def _run(run_id: str, tail: str = "") -> str:
    return f"/runs/{quote(run_id, safe='')}{tail}"


def _present(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _submit(
    goal: str,
    workspace: str,
    *,
    model: str | None,
    mode: str | None,
    budget: Mapping[str, Any] | None,
    verify: Iterable[str] | None,
    agent: str | None,
    idempotency_key: str | None,
) -> _Call:
    body = _present(
        goal=goal,
        workspace=workspace,
        model=model,
        mode=mode,
        budget=dict(budget) if budget is not None else None,
        verify=list(verify) if verify is not None else None,
        agent=agent,
    )
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
    return _Call("POST", "/runs", body=body, headers=headers)


def _runs(
    status: str | None,
    parent: str | None,
    creator: str | None,
    cursor: str | None,
    limit: int | None,
) -> _Call:
    params = _present(status=status, parent=parent, creator=creator, cursor=cursor, limit=limit)
    return _Call("GET", "/runs", params=params)


def _error_of(response: httpx.Response) -> ApiError:
    """The ``ApiError`` for an error response (a problem document, or its raw text)."""
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if isinstance(problem, dict) and "detail" in problem:
        return ApiError(
            response.status_code,
            str(problem.get("title") or response.reason_phrase),
            str(problem["detail"]),
            type=str(problem.get("type") or "about:blank"),
        )
    return ApiError(response.status_code, response.reason_phrase, response.text[:500])


def _checked(response: httpx.Response) -> httpx.Response:
    if response.is_error:
        raise _error_of(response)
    return response


def _unreachable(base_url: str, exc: httpx.TransportError) -> ConnectionFailed:
    return ConnectionFailed(f"cannot reach the Keel service at {base_url}: {exc}")


class _Follow:
    """One ``stream`` call's position: parses SSE lines, knows when the run has ended."""

    def __init__(self, run_id: str, after: int, until: Until) -> None:
        self.run_id = run_id
        self.last = after
        self.ends = TERMINAL | SETTLED if until == "settled" else TERMINAL
        self.until = until
        self.ended = False  # an event ending the stream was received
        self.failures = 0  # attempts in a row that brought nothing
        self._data: list[str] = []

    def call(self) -> _Call:
        return _Call(
            "GET",
            _run(self.run_id, "/events/stream"),
            params={"until": self.until},
            headers={"Last-Event-ID": str(self.last), "Accept": "text/event-stream"},
        )

    def line(self, text: str) -> dict[str, Any] | None:
        """Feed one line; the event it completes (an unseen one), else None."""
        if text.startswith(":"):
            return None
        if text:
            name, _, value = text.partition(":")
            if name == "data":
                self._data.append(value.removeprefix(" "))
            return None
        if not self._data:
            return None
        event: dict[str, Any] = json.loads("\n".join(self._data))
        self._data = []
        seq = int(event["seq"])
        if seq <= self.last:
            return None
        self.last = seq
        self.failures = 0
        if event.get("type") == "status_changed":
            to = (event.get("data") or {}).get("to")
            if to in self.ends:
                self.ended = True
        return event

    def settled(self, run: Mapping[str, Any]) -> bool:
        """Whether a stream that closed with nothing new is over (the run's view)."""
        return str(run.get("status")) in self.ends

    def backoff(self) -> float:
        self.failures += 1
        if self.failures > RECONNECTS:
            raise ConnectionFailed(
                f"the event stream of run {self.run_id} kept breaking "
                f"({RECONNECTS} reconnects in a row brought nothing); last event {self.last}"
            )
        return min(0.05 * 2.0 ** (self.failures - 1), BACKOFF_MAX_S)


def _stream_timeout(timeout: float) -> httpx.Timeout:
    return httpx.Timeout(timeout, read=max(timeout, STREAM_READ_TIMEOUT_S))


# --- the clients -------------------------------------------------------------------------


class Client:
    """A blocking client of one ``keel serve`` (thread-safe like ``httpx.Client``)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    def _send(self, call: _Call) -> httpx.Response:
        try:
            response = self._http.request(
                call.method, call.path, params=call.params, json=call.body, headers=call.headers
            )
        except httpx.TransportError as exc:
            raise _unreachable(self.base_url, exc) from exc
        return _checked(response)

    def _json(self, call: _Call) -> Any:
        return self._send(call).json()

    # --- runs --------------------------------------------------------------------------

    def submit(
        self,
        goal: str,
        workspace: str,
        *,
        model: str | None = None,
        mode: str | None = None,
        budget: Mapping[str, Any] | None = None,
        verify: Iterable[str] | None = None,
        agent: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Queue a run (the service's workers execute it); its view."""
        call = _submit(
            goal,
            workspace,
            model=model,
            mode=mode,
            budget=budget,
            verify=verify,
            agent=agent,
            idempotency_key=idempotency_key,
        )
        result: dict[str, Any] = self._json(call)
        return result

    def get(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json(_Call("GET", _run(run_id)))
        return result

    def runs(
        self,
        status: str | None = None,
        parent: str | None = None,
        creator: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """One page: ``{"runs": [...], "next_cursor": str | None}`` (newest first)."""
        result: dict[str, Any] = self._json(_runs(status, parent, creator, cursor, limit))
        return result

    def iter_runs(
        self,
        status: str | None = None,
        parent: str | None = None,
        creator: str | None = None,
        limit: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every matching run, newest first, following the cursors page by page."""
        cursor: str | None = None
        while True:
            page = self.runs(status, parent, creator, cursor, limit)
            yield from page["runs"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def events(self, run_id: str, after: int = 0, limit: int | None = None) -> dict[str, Any]:
        """One page: ``{"events": [...], "last_seq": int}``."""
        call = _Call("GET", _run(run_id, "/events"), params=_present(after=after, limit=limit))
        result: dict[str, Any] = self._json(call)
        return result

    def stream(
        self, run_id: str, after: int = 0, *, until: Until = "terminal"
    ) -> Iterator[dict[str, Any]]:
        """The run's events after ``after`` as committed, each once, until it ends (see
        the module docstring); reconnects with ``Last-Event-ID`` when cut off."""
        follow = _Follow(run_id, after, until)
        while not follow.ended:
            call = follow.call()
            got = follow.last
            try:
                with self._http.stream(
                    call.method,
                    call.path,
                    params=call.params,
                    headers=call.headers,
                    timeout=_stream_timeout(self.timeout),
                ) as response:
                    if response.status_code in RETRY_STATUSES:
                        time.sleep(follow.backoff())
                        continue
                    if response.is_error:
                        response.read()
                        raise _error_of(response)
                    for line in response.iter_lines():
                        event = follow.line(line)
                        if event is not None:
                            yield event
                            if follow.ended:
                                return
            except httpx.TransportError:
                time.sleep(follow.backoff())
                continue
            if follow.last == got and follow.settled(self.get(run_id)):
                return  # closed with nothing new: the run is over (or settled)
            if follow.last == got:
                time.sleep(follow.backoff())

    # --- deciding and steering ------------------------------------------------------------

    def approve(self, run_id: str, digest: str | None = None) -> dict[str, Any]:
        """Approve the pending call (only if its digest is still ``digest``, when given)."""
        body = _present(digest=digest)
        result: dict[str, Any] = self._json(_Call("POST", _run(run_id, "/approve"), body=body))
        return result

    def deny(self, run_id: str, reason: str) -> dict[str, Any]:
        call = _Call("POST", _run(run_id, "/deny"), body={"reason": reason})
        result: dict[str, Any] = self._json(call)
        return result

    def answer(self, run_id: str, text: str) -> dict[str, Any]:
        call = _Call("POST", _run(run_id, "/answer"), body={"text": text})
        result: dict[str, Any] = self._json(call)
        return result

    def cancel(self, run_id: str, reason: str) -> dict[str, Any]:
        call = _Call("POST", _run(run_id, "/cancel"), body={"reason": reason})
        result: dict[str, Any] = self._json(call)
        return result

    def pause(self, run_id: str, reason: str | None = None) -> dict[str, Any]:
        call = _Call("POST", _run(run_id, "/pause"), body=_present(reason=reason))
        result: dict[str, Any] = self._json(call)
        return result

    def resume(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._json(_Call("POST", _run(run_id, "/resume"), body={}))
        return result

    def message(self, run_id: str, text: str) -> dict[str, Any]:
        """``{"run": view, "follow_up": view | None}``."""
        call = _Call("POST", _run(run_id, "/messages"), body={"text": text})
        result: dict[str, Any] = self._json(call)
        return result

    def artifact(self, run_id: str, artifact_id: str) -> bytes:
        path = _run(run_id, f"/artifacts/{quote(artifact_id, safe='')}")
        return self._send(_Call("GET", path)).content

    # --- tasks ------------------------------------------------------------------------------

    def tasks(self, status: str | None = None, ready: bool = False) -> list[dict[str, Any]]:
        params = _present(status=status, ready="true" if ready else None)
        result: list[dict[str, Any]] = self._json(_Call("GET", "/tasks", params=params))["tasks"]
        return result

    def create_task(
        self,
        subject: str,
        *,
        description: str = "",
        blocked_by: Iterable[str] = (),
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        body = {"subject": subject, "description": description, "blocked_by": list(blocked_by)}
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        result: dict[str, Any] = self._json(_Call("POST", "/tasks", body=body, headers=headers))
        return result

    def task_graph(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json(_Call("GET", "/tasks/graph"))
        return result

    # --- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """``Client`` for asyncio programs: the same methods, awaited."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    async def _send(self, call: _Call) -> httpx.Response:
        try:
            response = await self._http.request(
                call.method, call.path, params=call.params, json=call.body, headers=call.headers
            )
        except httpx.TransportError as exc:
            raise _unreachable(self.base_url, exc) from exc
        return _checked(response)

    async def _json(self, call: _Call) -> Any:
        return (await self._send(call)).json()

    async def submit(
        self,
        goal: str,
        workspace: str,
        *,
        model: str | None = None,
        mode: str | None = None,
        budget: Mapping[str, Any] | None = None,
        verify: Iterable[str] | None = None,
        agent: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        call = _submit(
            goal,
            workspace,
            model=model,
            mode=mode,
            budget=budget,
            verify=verify,
            agent=agent,
            idempotency_key=idempotency_key,
        )
        result: dict[str, Any] = await self._json(call)
        return result

    async def get(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._json(_Call("GET", _run(run_id)))
        return result

    async def runs(
        self,
        status: str | None = None,
        parent: str | None = None,
        creator: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        result: dict[str, Any] = await self._json(_runs(status, parent, creator, cursor, limit))
        return result

    async def iter_runs(
        self,
        status: str | None = None,
        parent: str | None = None,
        creator: str | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        cursor: str | None = None
        while True:
            page = await self.runs(status, parent, creator, cursor, limit)
            for run in page["runs"]:
                yield run
            cursor = page.get("next_cursor")
            if not cursor:
                return

    async def events(self, run_id: str, after: int = 0, limit: int | None = None) -> dict[str, Any]:
        call = _Call("GET", _run(run_id, "/events"), params=_present(after=after, limit=limit))
        result: dict[str, Any] = await self._json(call)
        return result

    async def stream(
        self, run_id: str, after: int = 0, *, until: Until = "terminal"
    ) -> AsyncIterator[dict[str, Any]]:
        """As ``Client.stream``."""
        follow = _Follow(run_id, after, until)
        while not follow.ended:
            call = follow.call()
            got = follow.last
            try:
                async with self._http.stream(
                    call.method,
                    call.path,
                    params=call.params,
                    headers=call.headers,
                    timeout=_stream_timeout(self.timeout),
                ) as response:
                    if response.status_code in RETRY_STATUSES:
                        await asyncio.sleep(follow.backoff())
                        continue
                    if response.is_error:
                        await response.aread()
                        raise _error_of(response)
                    async for line in response.aiter_lines():
                        event = follow.line(line)
                        if event is not None:
                            yield event
                            if follow.ended:
                                return
            except httpx.TransportError:
                await asyncio.sleep(follow.backoff())
                continue
            if follow.last == got and follow.settled(await self.get(run_id)):
                return
            if follow.last == got:
                await asyncio.sleep(follow.backoff())

    async def approve(self, run_id: str, digest: str | None = None) -> dict[str, Any]:
        body = _present(digest=digest)
        call = _Call("POST", _run(run_id, "/approve"), body=body)
        result: dict[str, Any] = await self._json(call)
        return result

    async def deny(self, run_id: str, reason: str) -> dict[str, Any]:
        call = _Call("POST", _run(run_id, "/deny"), body={"reason": reason})
        result: dict[str, Any] = await self._json(call)
        return result

    async def answer(self, run_id: str, text: str) -> dict[str, Any]:
        call = _Call("POST", _run(run_id, "/answer"), body={"text": text})
        result: dict[str, Any] = await self._json(call)
        return result

    async def cancel(self, run_id: str, reason: str) -> dict[str, Any]:
        call = _Call("POST", _run(run_id, "/cancel"), body={"reason": reason})
        result: dict[str, Any] = await self._json(call)
        return result

    async def pause(self, run_id: str, reason: str | None = None) -> dict[str, Any]:
        call = _Call("POST", _run(run_id, "/pause"), body=_present(reason=reason))
        result: dict[str, Any] = await self._json(call)
        return result

    async def resume(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._json(_Call("POST", _run(run_id, "/resume"), body={}))
        return result

    async def message(self, run_id: str, text: str) -> dict[str, Any]:
        call = _Call("POST", _run(run_id, "/messages"), body={"text": text})
        result: dict[str, Any] = await self._json(call)
        return result

    async def artifact(self, run_id: str, artifact_id: str) -> bytes:
        path = _run(run_id, f"/artifacts/{quote(artifact_id, safe='')}")
        return (await self._send(_Call("GET", path))).content

    async def tasks(self, status: str | None = None, ready: bool = False) -> list[dict[str, Any]]:
        params = _present(status=status, ready="true" if ready else None)
        body = await self._json(_Call("GET", "/tasks", params=params))
        result: list[dict[str, Any]] = body["tasks"]
        return result

    async def create_task(
        self,
        subject: str,
        *,
        description: str = "",
        blocked_by: Iterable[str] = (),
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        body = {"subject": subject, "description": description, "blocked_by": list(blocked_by)}
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        call = _Call("POST", "/tasks", body=body, headers=headers)
        result: dict[str, Any] = await self._json(call)
        return result

    async def task_graph(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._json(_Call("GET", "/tasks/graph"))
        return result

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
