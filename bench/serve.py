"""``keel serve`` benchmarks: SSE fan-out latency, GET /runs/{id} throughput, server RSS.

    .venv/bin/python bench/serve.py [--clients 100] [--events 1000] [--rate 200]
        [--concurrency 32] [--seconds 5] [--store-url URL] [--scratch DIR]

Prints one JSON object:

- ``sse``: ``--clients`` SSE clients (one separate process, uvloop, raw sockets) follow
  one run of a real ``keel serve`` subprocess while this process appends ``--events``
  ``note_added`` events straight to the store (``--rate`` per second; 0: as fast as
  the store takes them), then ends the run. Each event carries ``time.time_ns()`` taken
  just before its append; a client stamps each chunk with ``time.time_ns()`` as it
  reads it (one machine, one clock). ``latency_ms`` p50/p99/max over every (client,
  event); ``missed`` = events some client never got, ``duplicated`` = events a client
  got twice (targets: p99 <= 50 ms, 0 missed on SQLite).
- ``rss_mb``: the server's resident memory with the clients connected (before the
  events, after them, and its peak) — target <= 150 MB.
- ``get_run``: ``GET /runs/{id}`` for ``--seconds`` from ``--concurrency`` keep-alive
  connections (a raw-socket uvloop load generator in a process of its own):
  requests/s, latency p50/p99, errors — target >= 1000 requests/s on 2 cores.

The store is a fresh SQLite file under ``--scratch`` (default TMPDIR) unless
``--store-url`` names another (e.g. a PostgreSQL database).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from keel.core.events import EventType, NewEvent
from keel.core.records import RunOptions
from keel.runtime.api_tokens import hash_token, make_token
from keel.store.base import Store
from keel.store.url import open_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0, help="events/s; 0: flat out")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", choices=("sse", "get_run"), help="run one of the two")
    parser.add_argument("--store-url", default=None)
    parser.add_argument("--scratch", default=None)
    parser.add_argument("--role", choices=("sse-clients", "load"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role is not None:
        # The measuring processes keep every chunk they read: the cyclic GC walking them
        # would pause all clients at once and be counted as the server's latency.
        gc.disable()
    if args.role == "sse-clients":
        print(json.dumps(_uvloop_run(sse_clients(args.url, args.token, args.run, args.clients))))
        return
    if args.role == "load":
        result = _uvloop_run(load(args.url, args.token, args.run, args.concurrency, args.seconds))
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory(dir=args.scratch) as scratch:
        print(json.dumps(bench(args, Path(scratch)), indent=2))


def bench(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    url = args.store_url or f"sqlite:///{scratch / 'keel.db'}"
    store = open_store(url)
    token = make_token()
    store.create_token(f"bench-{os.getpid()}", hash_token(token))
    server, base = start_server(url, scratch, token)
    try:
        results: dict[str, Any] = {}
        if args.only in (None, "sse"):
            results.update(sse_bench(store, server, base, token, args, scratch))
        if args.only in (None, "get_run"):
            run = store.create_run(goal="read me", workspace=str(scratch), options=RunOptions())
            get_run = json.loads(
                _self(
                    "--role",
                    "load",
                    "--url",
                    base,
                    "--token",
                    token,
                    "--run",
                    run.run_id,
                    "--concurrency",
                    str(args.concurrency),
                    "--seconds",
                    str(args.seconds),
                ).stdout
            )
            results["get_run"] = {**get_run, "rss_mb_after": rss_mb(server.pid)}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        store.close()
    return {
        "store": url.split(":", 1)[0],
        "machine": {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()},
        **results,
    }


def start_server(url: str, scratch: Path, token: str) -> tuple[subprocess.Popen[str], str]:
    """``keel serve`` on a free loopback port, once it answers ``/healthz``."""
    log = (scratch / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "keel", "serve", "--store", url, "--port", "0", "--no-console"],
        cwd=scratch,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in (scratch / "serve.log").read_text().splitlines():
            if line.startswith("keel serve: http://"):
                base = line.split()[2]
                _wait_until_answering(base, token, deadline)
                return server, base
        if server.poll() is not None:
            raise SystemExit("keel serve exited:\n" + (scratch / "serve.log").read_text())
        time.sleep(0.05)
    raise SystemExit("keel serve did not start")


def sse_bench(
    store: Store,
    server: subprocess.Popen[str],
    base: str,
    token: str,
    args: argparse.Namespace,
    scratch: Path,
) -> dict[str, Any]:
    state = store.create_run(goal="bench", workspace=str(scratch), options=RunOptions())
    run_id = state.run_id
    clients = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--role",
            "sse-clients",
            "--url",
            base,
            "--token",
            token,
            "--run",
            run_id,
            "--clients",
            str(args.clients),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert clients.stdout is not None
    ready = clients.stdout.readline().strip()  # every client has its backlog
    if ready != "ready":
        raise SystemExit(f"the SSE clients did not start: {ready!r}")
    rss_connected = rss_mb(server.pid)
    seq = state.last_seq
    interval = 1 / args.rate if args.rate > 0 else 0.0
    started = time.perf_counter()
    for n in range(args.events):
        if interval:
            pause = started + n * interval - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        note = NewEvent(type=EventType.NOTE_ADDED, data={"n": n, "t": time.time_ns()})
        store.append_events(run_id, [note], expected_seq=seq)
        seq += 1
    commit_s = time.perf_counter() - started
    end = NewEvent(
        type=EventType.STATUS_CHANGED,
        data={"from": "running", "to": "failed", "reason": "benchmark over"},
    )
    store.append_events(run_id, [end], expected_seq=seq)
    out, _ = clients.communicate(timeout=120)
    received = json.loads(out)
    latencies = sorted(received["latencies_ms"])
    return {
        "sse": {
            "clients": args.clients,
            "events": args.events,
            "rate_per_s": round(args.events / commit_s, 1),
            "latency_ms": {
                "p50": round(_quantile(latencies, 0.50), 2),
                "p99": round(_quantile(latencies, 0.99), 2),
                "max": round(latencies[-1], 2),
                "samples": len(latencies),
            },
            "missed": received["missed"],
            "duplicated": received["duplicated"],
            "streams_ended": received["ended"],
        },
        "rss_mb": {
            "with_clients": rss_connected,
            "after_events": rss_mb(server.pid),
            "peak": rss_mb(server.pid, "VmHWM"),
        },
    }


def _wait_until_answering(base: str, token: str, deadline: float) -> None:
    import httpx  # noqa: PLC0415

    while time.monotonic() < deadline:
        try:
            if httpx.get(
                base + "/healthz", headers={"Authorization": f"Bearer {token}"}
            ).is_success:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"{base}/healthz did not answer")


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _self(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, __file__, *args], check=True, capture_output=True, text=True
    )


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def _uvloop_run(coro: Any) -> Any:
    try:
        import uvloop  # noqa: PLC0415

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


# --- the SSE clients (a process of their own) -----------------------------------------------


async def sse_clients(base: str, token: str, run_id: str, count: int) -> dict[str, Any]:
    host, port = _host_port(base)
    first = [asyncio.Event() for _ in range(count)]
    chunks: list[list[tuple[int, bytes]]] = [[] for _ in range(count)]

    async def follow(index: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            (
                f"GET /runs/{run_id}/events/stream HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        got = chunks[index]
        while True:
            data = await reader.read(65536)
            if not data:
                break
            got.append((time.time_ns(), data))
            if not first[index].is_set() and b"\nid: 1\n" in b"\n" + b"".join(c for _, c in got):
                first[index].set()
        writer.close()

    tasks = [asyncio.create_task(follow(i)) for i in range(count)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first)), 60)
    print("ready", flush=True)
    await asyncio.gather(*tasks)
    return _tally(chunks)


def _tally(chunks: list[list[tuple[int, bytes]]]) -> dict[str, Any]:
    """Latency per (client, note) from the chunk that completed it; misses and repeats."""
    latencies: list[float] = []
    missed: set[int] = set()
    duplicated = 0
    ended = 0
    for got in chunks:
        body = b""
        seen: dict[int, int] = {}
        last_seq = 0
        for stamp, data in got:
            body += data
            *frames, body = body.split(b"\n\n")
            for frame in frames:
                fields = dict(
                    line.split(": ", 1) for line in frame.decode().splitlines() if ": " in line
                )
                if "data" not in fields:
                    continue
                event = json.loads(fields["data"])
                seq = int(event["seq"])
                seen[seq] = seen.get(seq, 0) + 1
                last_seq = max(last_seq, seq)
                if event["type"] == "note_added":
                    latencies.append((stamp - event["data"]["t"]) / 1e6)
                if event["type"] == "status_changed" and event["data"]["to"] == "failed":
                    ended += 1
        duplicated += sum(count - 1 for count in seen.values())
        missed.update(seq for seq in range(1, last_seq + 1) if seq not in seen)
    return {
        "latencies_ms": latencies,
        "missed": len(missed),
        "duplicated": duplicated,
        "ended": ended,
    }


# --- the GET /runs/{id} load generator (a process of its own) -------------------------------


async def load(
    base: str, token: str, run_id: str, concurrency: int, seconds: float
) -> dict[str, Any]:
    host, port = _host_port(base)
    request = (
        f"GET /runs/{run_id} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n"
    ).encode()
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, port)
        while time.perf_counter() < stop_at:
            began = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                errors += 1
            latencies.append((time.perf_counter() - began) * 1000)
        writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "latency_ms": {
            "p50": round(_quantile(latencies, 0.5), 2),
            "p99": round(_quantile(latencies, 0.99), 2),
            "mean": round(statistics.fmean(latencies), 2) if latencies else None,
        },
        "errors": errors,
    }


def _host_port(base: str) -> tuple[str, int]:
    host, _, port = base.removeprefix("http://").rstrip("/").rpartition(":")
    return host, int(port)


if __name__ == "__main__":
    main()
