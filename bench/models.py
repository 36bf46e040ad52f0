"""The model adapter's cost: building and parsing requests, reading streams, serving workers.

(a) adapter cost per call: the bytes ``OpenAICompatModel.complete`` POSTs for a
    200-message history (a system prompt, the goal, then 99 tool-calling turns with their
    ~700-character results; Keel's built-in tools offered, the same specs object every
    turn as in a run, so their JSON is encoded once) — ``request_content``: the history
    repaired and built by ``keel.models.wire.request_body``, then encoded — and a
    response with 4 tool calls decoded and read with ``wire.parse_response``; median µs
    of each (``request_body_us`` alone too), for DeepSeek's and OpenAI's profiles.
(b) streaming parse cost per 1,000 deltas: a pre-built ``text/event-stream`` of 1,000
    content deltas fed to ``keel.models.stream``'s SSE reader and accumulator (split into
    lines first, as httpx hands them over), then the payload; median ms, without and
    with an ``on_delta`` watcher (which the live view sets).
(c) delta delay: the time from a delta leaving the loopback ``FakeProvider`` (the clock
    read just before its event is written to the socket) to the adapter's ``on_delta``
    receiving it, with ``OpenAICompatModel`` streaming, one event every ``--event-gap``
    seconds (server and client share this process and its clock); p50/p99 ms.
(d) ``keel worker --concurrency 64`` (a real subprocess on a SQLite file) draining 64
    queued runs of 6 turns each (5 turns calling ``read_file`` on a small file, a new
    one each turn, then a final answer) against a FakeProvider that answers every
    request after 0.5 s: makespan (first request to worker exit; also process start to
    exit) against the ideal 6 x 0.5 s, and the worker's CPU (user + sys from its
    rusage) per model turn, also less the CPU of an idle worker (start-up, one empty
    poll, exit) on an empty store, after the first request (read from /proc), and in
    the middle half of the requests (between the 1/4 and 3/4 marks: the steady state,
    past start-up and the lazy imports of a first run, before the runs wind down).
    The worker runs without PYTHONDONTWRITEBYTECODE, as an installed keel does.

    .venv/bin/python bench/models.py [--quick] [--parts abcd] [--repeat 300] [--deltas 1000]
        [--event-gap 0.002] [--runs 64] [--concurrency 64] [--turn-delay 0.5] [--tool-turns 5]

``--quick`` is a smoke run (seconds): few repeats, 100 deltas, 8 runs of 0.1 s turns.

Prints one JSON object; each figure sits next to its target.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from keel.models import stream as sse
from keel.models import wire
from keel.models.base import Message, ModelRequest, StreamDelta, ToolCall, ToolSpec
from keel.models.openai_compat import OpenAICompatModel
from keel.models.profiles import DEEPSEEK, OPENAI
from keel.models.resolve import resolve_model
from keel.runtime.harness import Harness
from keel.testing.provider import FakeProvider
from keel.tools.builtin import default_registry

TARGETS = {
    "adapter_us_per_call": 1000.0,
    "stream_ms_per_1000_deltas": 2.0,
    "delta_delay_p99_ms": 5.0,
    "makespan_vs_ideal": 1.5,
    "worker_cpu_ms_per_step": 3.0,
}
TOOL_OUTPUT = "".join(
    f"{i:>4}  def handler_{i}(request):  # returns the parsed body\n" for i in range(12)
)


def median_of(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of `repeat` calls (after a few warm-up calls)."""
    for _ in range(min(repeat, 5)):
        fn()
    times = []
    gc.collect()
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --- (a) request body and response parsing ---------------------------------------------------


def history(messages: int) -> list[Message]:
    """A system prompt, the goal, then tool-calling turns with results: `messages` in all."""
    out = [
        Message(role="system", content="You are Keel's coding agent. " * 60),
        Message(role="user", content="Find where request bodies are parsed and fix the bug."),
    ]
    turn = 0
    while len(out) < messages:
        call = ToolCall(
            id=f"call_{turn}",
            name="read_file",
            arguments=json.dumps({"path": f"src/app/module_{turn}.py"}),
        )
        out.append(
            Message(
                role="assistant",
                content=f"Reading module {turn}." if turn % 3 == 0 else None,
                tool_calls=(call,),
                reasoning=f"module {turn} may hold the parser" if turn % 2 else None,
            )
        )
        out.append(Message(role="tool", tool_call_id=call.id, content=TOOL_OUTPUT))
        turn += 1
    return out[:messages]


def tool_response(calls: int) -> str:
    message = {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I need to read four more files before deciding.",
        "tool_calls": [
            {
                "id": f"call_00_{i}",
                "type": "function",
                "function": {
                    "name": "read_file",
                    "arguments": json.dumps({"path": f"src/app/module_{i}.py"}),
                },
            }
            for i in range(calls)
        ],
    }
    payload = {
        "id": "0f6c1a2e-bench",
        "object": "chat.completion",
        "created": 1_750_000_000,
        "model": "deepseek-chat",
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}
        ],
        "usage": {
            "prompt_tokens": 41_000,
            "completion_tokens": 180,
            "total_tokens": 41_180,
            "prompt_tokens_details": {"cached_tokens": 40_960},
            "prompt_cache_hit_tokens": 40_960,
            "prompt_cache_miss_tokens": 40,
        },
    }
    return json.dumps(payload)


def adapter_cost(repeat: int) -> dict[str, Any]:
    messages = history(200)
    tools = [
        ToolSpec(name=s["name"], description=s["description"], parameters=s["parameters"])
        for s in default_registry().specs()
    ]
    response = tool_response(4)
    result: dict[str, Any] = {"messages": len(messages), "tools": len(tools)}
    request = ModelRequest(messages=tuple(messages), tools=tuple(tools), step=100)
    for profile in (DEEPSEEK, OPENAI):
        adapter = OpenAICompatModel(
            spec=f"{profile.name}:bench",
            model="bench",
            base_url="https://example.invalid/v1",
            api_key="sk-bench",
            profile=profile,
        )

        def build(profile: Any = profile) -> dict[str, Any]:
            return wire.request_body(profile, "deepseek-chat", messages, tools, stream=True)

        def send_bytes(adapter: OpenAICompatModel = adapter) -> bytes:
            return adapter.request_content(request)  # what complete() POSTs, as it does

        def parse(profile: Any = profile) -> object:
            return wire.parse_response(profile, json.loads(response), model="m", step=7)

        built, sent, parsed = (median_of(f, repeat) for f in (build, send_bytes, parse))
        result[profile.name] = {
            "request_bytes": len(send_bytes()),
            "request_body_us": round(built * 1e6, 1),
            "request_bytes_us": round(sent * 1e6, 1),
            "decode_and_parse_response_us": round(parsed * 1e6, 1),
            "us_per_call": round((sent + parsed) * 1e6, 1),
        }
    worst = max(result[p.name]["us_per_call"] for p in (DEEPSEEK, OPENAI))
    result["target_us_per_call"] = TARGETS["adapter_us_per_call"]
    result["met"] = worst <= TARGETS["adapter_us_per_call"]
    return result


# --- (b) stream parsing ----------------------------------------------------------------------


def stream_text(deltas: int) -> str:
    """An OpenAI-shaped stream: role chunk, `deltas` content chunks, finish, usage, DONE."""
    head = '{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1750000000,'
    head += '"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_bench","choices":'

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return f"data: {head}{json.dumps([choice], separators=(',', ':'))}}}\n\n"

    events = [chunk({"role": "assistant", "content": "", "refusal": None})]
    events += [chunk({"content": f" word{i}"}) for i in range(deltas)]
    events.append(chunk({}, "stop"))
    usage = {"prompt_tokens": 900, "completion_tokens": deltas, "total_tokens": 900 + deltas}
    events.append(f'data: {head}[],"usage":{json.dumps(usage)}}}\n\n')
    events.append("data: [DONE]\n\n")
    return "".join(events)


def stream_cost(deltas: int, repeat: int) -> dict[str, Any]:
    text = stream_text(deltas)
    per = 1000 / deltas
    result: dict[str, Any] = {"deltas": deltas, "bytes": len(text)}
    for label, watcher in (("no_watcher", None), ("with_on_delta", _ignore)):

        def read(watcher: Callable[[StreamDelta], None] | None = watcher) -> dict[str, Any]:
            accumulator = sse.StreamAccumulator(OPENAI.reasoning_fields, on_delta=watcher)
            accumulator.feed_lines(text.splitlines())
            return accumulator.payload()

        payload = read()
        assert payload["choices"][0]["message"]["content"].count("word") == deltas
        result[f"ms_per_1000_deltas_{label}"] = round(median_of(read, repeat) * 1000 * per, 3)
    result["target_ms_per_1000_deltas"] = TARGETS["stream_ms_per_1000_deltas"]
    target = TARGETS["stream_ms_per_1000_deltas"]
    result["met"] = result["ms_per_1000_deltas_no_watcher"] <= target
    result["met_with_on_delta"] = result["ms_per_1000_deltas_with_on_delta"] <= target
    return result


def _ignore(delta: StreamDelta) -> None:
    return None


# --- (c) delta delay over loopback -----------------------------------------------------------


def delta_delay(deltas: int, per_stream: int, gap: float) -> dict[str, Any]:
    """Stream `deltas` words in streams of `per_stream`, one event every `gap` seconds."""
    received: list[tuple[str, float]] = []

    def on_delta(delta: StreamDelta) -> None:
        received.append((delta.text, time.perf_counter()))

    with FakeProvider() as provider, tempfile.TemporaryDirectory() as tmp:
        environ = {
            "OPENAI_BASE_URL": provider.base_url,
            "OPENAI_API_KEY": "sk-bench",
            "KEEL_MODEL_STREAM": "1",
        }
        model = resolve_model("openai:bench-model", cwd=Path(tmp), environ=environ)
        request = ModelRequest(
            messages=(Message(role="user", content="count"),), tools=(), step=0, on_delta=on_delta
        )
        provider.reply("warm up")
        model.complete(request)  # imports, the pooled connection
        streams = max(1, deltas // per_stream)
        for s in range(streams):
            words = " ".join(f"s{s}w{i}" for i in range(per_stream))
            provider.reply(words, usage=(10, per_stream), delay_per_event=gap)
        received.clear()
        for _ in range(streams):
            model.complete(request)
        if not all(body.get("stream") is True for body in provider.requests):
            return {"ran": False, "why": "the adapter did not send stream: true"}
        violations = list(provider.violations)
        sent = {}
        for event in provider.sent_events:
            if event.data.startswith("data: {"):
                choices = json.loads(event.data[6:]).get("choices") or [{}]
                piece = choices[0].get("delta", {}).get("content")
                if piece:
                    sent[piece] = event.at
    delays = [(at - sent[text]) * 1000 for text, at in received if text in sent]
    if not delays:
        return {"ran": False, "why": "no content delta reached on_delta"}
    p99 = quantile(delays, 0.99)
    return {
        "deltas": len(delays),
        "event_gap_ms": gap * 1000,
        "p50_ms": round(quantile(delays, 0.5), 3),
        "p99_ms": round(p99, 3),
        "max_ms": round(max(delays), 3),
        "target_p99_ms": TARGETS["delta_delay_p99_ms"],
        "met": p99 <= TARGETS["delta_delay_p99_ms"],
        "request_rule_violations": violations[:5],
    }


# --- (d) one worker process, many slow runs --------------------------------------------------


def worker_drain(runs: int, concurrency: int, turn_delay: float, tool_turns: int) -> dict[str, Any]:
    arrivals: list[float] = []
    turns = tool_turns + 1
    with (
        FakeProvider() as provider,
        tempfile.TemporaryDirectory(prefix="keel-bench-models-") as tmp,
    ):
        folder = Path(tmp)
        workspace = folder / "ws"
        workspace.mkdir()
        for i in range(tool_turns):  # a new file each turn: the same call again is no progress
            (workspace / f"f{i}.py").write_text(TOOL_OUTPUT, encoding="utf-8")
        url = f"sqlite:///{folder / 'keel.db'}"

        worker: dict[str, Any] = {}

        expected = runs * turns
        marks = {
            expected // 4: "cpu_at_first_quarter_s",
            (3 * expected) // 4: "cpu_at_third_quarter_s",
        }

        def answer(body: dict[str, Any]) -> None:
            if not arrivals and "pid" in worker:  # the worker's CPU before its first call
                worker["cpu_at_first_request_s"] = process_cpu_seconds(worker["pid"])
            if len(arrivals) in marks and "pid" in worker:  # a window in full swing
                worker[marks[len(arrivals)]] = process_cpu_seconds(worker["pid"])
            arrivals.append(time.perf_counter())
            done = sum(1 for m in body.get("messages", ()) if m.get("role") == "tool")
            if done < tool_turns:
                call = ("read_file", {"path": f"f{done}.py"})
                provider.reply(tool_calls=[call], usage=(1200, 20), delay=turn_delay)
            else:
                provider.reply("Read it five times; all good.", usage=(1500, 10), delay=turn_delay)

        provider.respond_with(answer)
        with Harness(store=url) as harness:
            ids = [
                harness.create(
                    f"bench run {i}", cwd=workspace, model="openai:bench-model", queued=True
                ).run_id
                for i in range(runs)
            ]
        env = {
            **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
            "OPENAI_BASE_URL": provider.base_url,
            "OPENAI_API_KEY": "sk-bench",
            "KEEL_MODEL_TIMEOUT": "30",
        }
        idle_url = f"sqlite:///{folder / 'idle.db'}"
        Harness(store=idle_url).close()  # an empty, migrated store
        idle = run_worker(concurrency, workspace, idle_url, env)  # start-up and exit alone
        if "why" in idle:
            return {"ran": False, **idle}
        busy = run_worker(concurrency, workspace, url, env, pid_to=worker)
        if "why" in busy:
            return {"ran": False, **busy}
        with Harness(store=url) as harness:
            states = [harness.get(run_id) for run_id in ids]
        statuses = [state.status.value for state in states]
        reasons = sorted({state.reason or "" for state in states})
        requests = len(provider.requests)
        violations = list(provider.violations)
        streamed = sum(1 for body in provider.requests if body.get("stream") is True)
    ideal = turns * turn_delay
    makespan = busy["ended"] - min(arrivals) if arrivals else float("nan")
    steps = max(requests, 1)
    cpu_ms = busy["cpu_s"] / steps * 1000
    working_cpu_ms = (busy["cpu_s"] - idle["cpu_s"]) / steps * 1000
    before_first = worker.get("cpu_at_first_request_s")
    quarter, three_quarters = (
        worker.get("cpu_at_first_quarter_s"),
        worker.get("cpu_at_third_quarter_s"),
    )
    window_steps = (3 * (runs * turns)) // 4 - (runs * turns) // 4
    middle_cpu_ms = (
        (three_quarters - quarter) / window_steps * 1000
        if quarter is not None and three_quarters is not None and window_steps > 0
        else float("nan")
    )
    steady_cpu_ms = (
        (busy["cpu_s"] - before_first) / steps * 1000 if before_first is not None else float("nan")
    )
    return {
        "runs": runs,
        "concurrency": concurrency,
        "turns_per_run": turns,
        "turn_delay_s": turn_delay,
        "completed": statuses.count("completed"),
        "statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
        "stop_reasons": [r[:300] for r in reasons[:3]],
        "model_requests": requests,
        "streamed_requests": streamed,
        "ideal_s": ideal,
        "makespan_s": round(makespan, 3),
        "makespan_vs_ideal": round(makespan / ideal, 3),
        "process_start_to_exit_s": round(busy["wall_s"], 3),
        "worker_cpu_s": round(busy["cpu_s"], 3),
        "idle_worker_cpu_s": round(idle["cpu_s"], 3),
        "worker_cpu_ms_per_step": round(cpu_ms, 3),
        "worker_cpu_ms_per_step_less_idle_worker": round(working_cpu_ms, 3),
        "worker_cpu_s_before_first_request": before_first,
        "worker_cpu_ms_per_step_after_first_request": round(steady_cpu_ms, 3),
        "worker_cpu_ms_per_step_middle_half": round(middle_cpu_ms, 3),
        "target_makespan_vs_ideal": TARGETS["makespan_vs_ideal"],
        "target_worker_cpu_ms_per_step": TARGETS["worker_cpu_ms_per_step"],
        "met_makespan": makespan / ideal <= TARGETS["makespan_vs_ideal"],
        "met_cpu": cpu_ms <= TARGETS["worker_cpu_ms_per_step"],
        "met_cpu_less_idle_worker": working_cpu_ms <= TARGETS["worker_cpu_ms_per_step"],
        "met_cpu_after_first_request": steady_cpu_ms <= TARGETS["worker_cpu_ms_per_step"],
        "met_cpu_middle_half": middle_cpu_ms <= TARGETS["worker_cpu_ms_per_step"],
        "request_rule_violations": violations[:5],
        "worker_says": busy["out"][-300:],
    }


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds `pid` has used so far (Linux /proc), None if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15)


def run_worker(
    concurrency: int,
    workspace: Path,
    url: str,
    env: dict[str, str],
    pid_to: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``keel worker --until-idle`` process: its wall time, end and user + sys CPU
    (from the rusage of the waited-for child; this script starts no other child meanwhile)."""
    keel = Path(sys.executable).with_name("keel")
    command = [str(keel), "worker", "--concurrency", str(concurrency), "--until-idle"]
    command += ["--quiet", "--poll", "0.05", "--cwd", str(workspace), "--store", url]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if pid_to is not None:
        pid_to["pid"] = proc.pid
    out, err = proc.communicate(timeout=600)
    ended = time.perf_counter()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        return {"why": f"worker exited {proc.returncode}: {err.strip()[-800:]}"}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": ended - started, "ended": ended, "cpu_s": cpu, "out": out.strip()}


# --- main ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes")
    parser.add_argument("--parts", default="abcd", help="which parts to run (a, b, c, d)")
    parser.add_argument("--repeat", type=int, default=300, help="timed calls per figure (a, b)")
    parser.add_argument("--deltas", type=int, default=1000, help="deltas timed in (c)")
    parser.add_argument("--event-gap", type=float, default=0.002, help="seconds between events (c)")
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--turn-delay", type=float, default=0.5)
    parser.add_argument("--tool-turns", type=int, default=5)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.deltas, args.event_gap = 30, 100, 0.001
        args.runs, args.concurrency, args.turn_delay = 8, 8, 0.1
    report: dict[str, Any] = {
        "benchmark": "model adapter: request/response cost, stream parsing, delta delay, worker",
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "quick": args.quick,
    }
    if "a" in args.parts:
        report["a_adapter_cost_per_call"] = progress("a", adapter_cost(args.repeat))
    if "b" in args.parts:
        report["b_stream_parse"] = progress("b", stream_cost(1000, args.repeat))
    if "c" in args.parts:
        per_stream = min(250, args.deltas)
        report["c_delta_delay"] = progress(
            "c", delta_delay(args.deltas, per_stream, args.event_gap)
        )
    if "d" in args.parts:
        report["d_worker"] = progress(
            "d", worker_drain(args.runs, args.concurrency, args.turn_delay, args.tool_turns)
        )
    print(json.dumps(report, indent=2))


def progress(label: str, result: dict[str, Any]) -> dict[str, Any]:
    """Say each part on stderr as it finishes (the JSON comes at the end)."""
    print(f"{label}: {json.dumps(result)}", file=sys.stderr, flush=True)
    return result


if __name__ == "__main__":
    main()
