"""The MCP servers of one workspace, connected with the official ``mcp`` SDK.

``McpHub`` owns, for one process, a connection to each server of ``.keel/mcp.toml``:
an stdio server is started as a subprocess of this process (in the workspace, with only
the variables its entry names plus the SDK's safe defaults: PATH, HOME, ...), an HTTP
one is reached over streamable HTTP with headers read from named variables. The SDK is
asyncio; the hub runs it on one event loop in a thread of its own, and each server's
client lives in one task there from connect to close (anyio's scopes must be left by
the task that entered them). Tool calls come from worker threads and wait for their
answer with the server's timeout.

A server that dies (its process exits, its connection closes) fails the call under way
with a ``ToolError`` — never retried: an external effect may have happened — and is
started again once for the next call; a second crash leaves it down, its tools
answering with that error. What the server said is the tool's result: text for the
model, images, audio and binary resources stored as artifacts of the run.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import threading
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from keel.core.errors import ConfigError, ToolError
from keel.core.mcp_config import MCP_FILE, McpServer, parse_mcp_config
from keel.tools.base import Effect, Recovery, ToolContext, ToolResult
from keel.tools.fsroot import WorkspaceRoot
from keel.tools.schema_tool import SchemaTool, schema_tool

log = logging.getLogger("keel.mcp")
MAX_CONFIG_BYTES: Final = 64 * 1024
MAX_OUTPUT_CHARS: Final = 256 * 1024
CONNECT_TIMEOUT_S: Final = 30.0
RESTARTS: Final = 1  # times a crashed server is started again
TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what providers accept as a name


def load_mcp_servers(workspace: Path) -> tuple[McpServer, ...]:
    """The servers of the workspace's ``.keel/mcp.toml`` (none without the file);
    ConfigError naming the file for an invalid one."""
    rel = "/".join(MCP_FILE)
    source = str(workspace / rel)
    with WorkspaceRoot(workspace) as root:
        try:
            opened = root.open(rel, spelled=False)
        except ToolError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        if opened is None:
            return ()
        with opened:
            if not opened.is_file:
                raise ConfigError(f"{source}: not a regular file")
            data = opened.read(MAX_CONFIG_BYTES + 1)  # one more: refused below, not cut
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: over {MAX_CONFIG_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not UTF-8 text") from None
    return parse_mcp_config(text, source)


@dataclass(slots=True)
class ServerStatus:
    """How one server is doing, for ``keel mcp list``."""

    name: str
    transport: str  # stdio | http
    state: str  # running | failed | down (crashed past its restarts) | closed
    tools: list[str] = field(default_factory=list)  # the names the model sees
    error: str | None = None
    restarts: int = 0


class _Crashed(Exception):
    """The server went away while a call was under way."""


@dataclass(slots=True, eq=False)
class _Connection:
    entry: McpServer
    status: ServerStatus
    requests: asyncio.Queue[tuple[Future[Any], str, dict[str, Any]] | None] | None = None
    task: asyncio.Task[None] | None = None
    listed: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class McpHub:
    """Connections to one workspace's MCP servers (see the module docstring)."""

    def __init__(
        self,
        workspace: Path,
        servers: tuple[McpServer, ...],
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.workspace = workspace
        self._environ = dict(os.environ if environ is None else environ)
        self._connections = {
            s.name: _Connection(s, ServerStatus(s.name, "stdio" if s.command else "http", "closed"))
            for s in servers
        }
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        self._closed = False
        self._devnull = open(os.devnull, "w")  # noqa: SIM115 - a server's stderr, kept open

    # --- the process's side -------------------------------------------------------------

    def tools(self) -> list[SchemaTool]:
        """Every server's tools as harness tools (servers connected on first use). A
        server that cannot start offers none; ``statuses`` says why."""
        made: list[SchemaTool] = []
        for conn in self._connections.values():
            self._ensure(conn)
            for listed in conn.listed:
                made.extend(self._tool(conn.entry, listed))
            conn.status.tools = [
                t.name for t in made if t.name.startswith(f"mcp__{conn.entry.name}__")
            ]
        return made

    def statuses(self) -> list[ServerStatus]:
        return [conn.status for conn in self._connections.values()]

    def call(self, server: str, tool: str, arguments: dict[str, Any]) -> Any:
        """The server's answer to ``tool(arguments)``; ToolError when there is none."""
        conn = self._connections[server]
        self._ensure(conn)
        if conn.status.state != "running" or conn.requests is None:
            raise ToolError(f"MCP server {server} is {conn.status.state}: {conn.status.error}")
        answer: Future[Any] = Future()
        queue = conn.requests
        self._run(queue.put((answer, tool, arguments)))
        try:
            return answer.result(conn.entry.timeout_s + 5)
        except _Crashed as exc:
            raise ToolError(
                f"MCP server {server} went away during the call ({exc}); "
                + (
                    "it is started again for the next call"
                    if conn.status.restarts < RESTARTS
                    else "it has crashed before and stays down"
                )
            ) from None
        except (FutureTimeout, TimeoutError):
            raise ToolError(
                f"MCP server {server} did not answer {tool} within {conn.entry.timeout_s:.0f} s"
            ) from None
        except ToolError:
            raise
        except Exception as exc:  # an MCP protocol error, said by the server
            raise ToolError(f"MCP server {server}: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        """Close every connection (stdio servers are stopped) and the loop's thread."""
        with self._guard:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is not None and thread is not None:
            for conn in self._connections.values():
                if conn.requests is not None:
                    asyncio.run_coroutine_threadsafe(conn.requests.put(None), loop)
            tasks = [c.task for c in self._connections.values() if c.task is not None]

            async def finish() -> None:
                running = [task for task in tasks if not task.done()]
                if running:
                    await asyncio.wait(running, timeout=10)

            try:
                asyncio.run_coroutine_threadsafe(finish(), loop).result(15)
            except Exception:  # a server that will not stop: the loop goes anyway
                log.warning("MCP servers did not stop in time")
            loop.call_soon_threadsafe(loop.stop)
            thread.join(15)
            if not thread.is_alive():
                loop.close()
        for conn in self._connections.values():
            conn.status.state = "closed"
        self._devnull.close()

    # --- connecting ---------------------------------------------------------------------

    def _ensure(self, conn: _Connection) -> None:
        """Connect ``conn`` unless it runs; a crashed one is started again while it has
        restarts left."""
        with conn.lock:
            state = conn.status.state
            if state == "running" and conn.task is not None and not conn.task.done():
                return
            if state == "down" or (state == "failed" and conn.task is not None):
                if state == "failed" and conn.status.restarts < RESTARTS:
                    conn.status.restarts += 1
                else:
                    conn.status.state = "down"
                    return
            ready: Future[list[Any]] = Future()
            loop = self._event_loop()

            def start() -> None:
                conn.requests = asyncio.Queue()
                conn.task = loop.create_task(self._serve(conn, ready))

            loop.call_soon_threadsafe(start)
            try:
                conn.listed = ready.result(CONNECT_TIMEOUT_S)
            except Exception as exc:
                conn.status.state = "failed"
                conn.status.error = _why(exc)
                conn.listed = []
                return
            conn.status.state = "running"
            conn.status.error = None

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._closed:
                raise ToolError("the MCP connections of this process are closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="keel-mcp", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _run(self, coroutine: Any) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._event_loop()).result(CONNECT_TIMEOUT_S)

    async def _serve(self, conn: _Connection, ready: Future[list[Any]]) -> None:
        """The server's whole connection: connect, list, answer calls until closed."""
        try:  # the mcp extra, loaded when a server is used
            from mcp import Client  # noqa: PLC0415
            from mcp.shared.exceptions import MCPError  # noqa: PLC0415
            from mcp_types.jsonrpc import CONNECTION_CLOSED  # noqa: PLC0415
        except ImportError as exc:
            ready.set_exception(
                ConfigError(
                    f"MCP servers need the mcp extra ({exc}): pip install 'keel-harness[mcp]'"
                )
            )
            return

        assert conn.requests is not None
        requests = conn.requests
        pending: Future[Any] | None = None
        try:
            async with Client(self._transport(conn.entry), raise_exceptions=False) as client:
                tools: list[Any] = []
                cursor: str | None = None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                ready.set_result(tools)
                while (item := await requests.get()) is not None:
                    pending, name, arguments = item
                    try:
                        result = await asyncio.wait_for(
                            client.call_tool(name, arguments), conn.entry.timeout_s
                        )
                    except MCPError as exc:
                        if exc.code == CONNECTION_CLOSED:
                            # Marked before the caller hears of it: its next call starts a
                            # new connection instead of queueing behind this dying one.
                            conn.status.state = "failed"
                            conn.status.error = _why(exc)
                            pending.set_exception(_Crashed(str(exc)))
                            pending = None
                            raise
                        pending.set_exception(exc)
                    except TimeoutError as exc:
                        pending.set_exception(exc)
                    else:
                        pending.set_result(result)
                    pending = None
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(str(exc)))
            if pending is not None and not pending.done():
                pending.set_exception(_Crashed(_why(exc)))
            if not self._closed:
                conn.status.state = "failed"
                conn.status.error = _why(exc)
            while not requests.empty():  # calls queued behind the crash
                queued = requests.get_nowait()
                if queued is not None and not queued[0].done():
                    queued[0].set_exception(_Crashed(_why(exc)))
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise

    def _transport(self, entry: McpServer) -> Any:
        from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: PLC0415
        from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415

        if entry.command:
            env = {name: self._environ[name] for name in entry.env if name in self._environ}
            cwd = self.workspace / entry.cwd if entry.cwd else self.workspace
            params = StdioServerParameters(
                command=entry.command[0], args=list(entry.command[1:]), env=env, cwd=cwd
            )
            return stdio_client(params, errlog=self._devnull)
        import httpx2  # noqa: PLC0415 - the HTTP client the mcp SDK is built on

        headers = {}
        for header, variable in entry.headers:
            value = self._environ.get(variable)
            if value is None:
                raise ConfigError(
                    f"MCP server {entry.name}: header {header} comes from ${variable}, "
                    "which is not set"
                )
            headers[header] = value
        assert entry.url is not None
        url, timeout = entry.url, entry.timeout_s

        @asynccontextmanager
        async def transport() -> AsyncIterator[Any]:
            # The HTTP client is the caller's to close when it hands one in.
            async with (
                httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
                streamable_http_client(url, http_client=http) as streams,
            ):
                yield streams

        return transport()

    # --- tools --------------------------------------------------------------------------

    def _tool(self, entry: McpServer, listed: Any) -> list[SchemaTool]:
        name = entry.tool_name(str(listed.name))
        if not TOOL_NAME.fullmatch(name):
            log.warning(
                "MCP server %s: tool %r skipped: %s is not a valid tool name",
                entry.name,
                listed.name,
                name,
            )
            return []
        override = entry.override(str(listed.name))
        server, remote = entry.name, str(listed.name)

        def call(ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
            return self._result(ctx, server, remote, self.call(server, remote, arguments))

        description = (listed.description or remote).strip()
        try:
            return [
                schema_tool(
                    name=name,
                    description=f"[MCP server {server}] {description}",
                    input_schema=dict(listed.input_schema or {"type": "object"}),
                    call=call,
                    effect=Effect(override.effect),
                    recovery=Recovery(override.recovery),
                    time_limit_s=entry.timeout_s + 10,
                )
            ]
        except Exception as exc:  # an input schema the harness cannot use
            log.warning("MCP server %s: tool %r skipped: %s", server, remote, exc)
            return []

    def _result(self, ctx: ToolContext, server: str, tool: str, result: Any) -> ToolResult:
        texts: list[str] = []
        artifacts: list[str] = []
        for index, block in enumerate(result.content or []):
            kind = getattr(block, "type", "")
            if kind == "text":
                texts.append(block.text)
            elif kind in ("image", "audio"):
                artifacts.append(
                    self._artifact(
                        ctx,
                        f"mcp-{server}-{tool}-{index}.{_suffix(block.mime_type)}",
                        base64.b64decode(block.data),
                    )
                )
            elif kind == "resource":
                resource = block.resource
                if getattr(resource, "text", None) is not None:
                    texts.append(f"[{resource.uri}]\n{resource.text}")
                else:
                    artifacts.append(
                        self._artifact(
                            ctx, f"mcp-{server}-{tool}-{index}.bin", base64.b64decode(resource.blob)
                        )
                    )
            elif kind == "resource_link":
                texts.append(f"[resource {block.uri}]")
        if not texts and result.structured_content is not None:
            texts.append(json.dumps(result.structured_content, ensure_ascii=False, sort_keys=True))
        output = "\n".join(texts)
        if artifacts:
            output += ("\n" if output else "") + "stored: " + ", ".join(artifacts)
        if len(output) > MAX_OUTPUT_CHARS:
            output = output[:MAX_OUTPUT_CHARS] + f"\n[cut at {MAX_OUTPUT_CHARS} characters]"
        if getattr(result, "is_error", False):
            raise ToolError(f"{tool} (MCP server {server}) failed: {output or 'no detail'}")
        return ToolResult(output=output or "(no output)", data={"artifacts": artifacts})

    @staticmethod
    def _artifact(ctx: ToolContext, name: str, content: bytes) -> str:
        if ctx.store is None:
            return f"{name} ({len(content)} bytes, not stored: no store)"
        return f"artifact:{ctx.store.put_artifact(ctx.run_id, name, content).id}"


def _suffix(mime: str) -> str:
    return {
        "image/png": "png",
        "image/jpeg": "jpg",
        "image/gif": "gif",
        "image/webp": "webp",
        "audio/wav": "wav",
        "audio/mpeg": "mp3",
    }.get(mime, "bin")


def _why(exc: BaseException) -> str:
    """One line saying what went wrong (an exception group: its first leaf)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]
