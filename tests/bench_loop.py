"""Benchmark: agent.py's own cost per turn, against a bare SDK loop and a local stand-in
for the API that answers at once. Not part of the test run.

    .venv/bin/python tests/bench_loop.py --compare [--turns 100 1000] [--without NAME]

--compare: which optimisations earn their place (docs/benchmarks.md). A copy of agent.py
with each of them taken out in turn (REMOVALS), and one with all of them out, run as a user
runs it, with --transcript and --events (and the run kept, as by default), against a bare SDK
loop replaying the same requests (same cache_control), with --otel against a stand-in
collector, and with --no-keep; in alternated rounds
whose order rotates. Wall and CPU time a turn, from the first request to the last (start-up
left out). Then `python agent.py --help` against `python -c 'import anthropic'`.

    .venv/bin/python tests/bench_loop.py [--turns 100] [--rounds 5]

Without --compare: (a) a session through agent.main in this process, with --transcript and
--events and without, next to a bare SDK loop sending the same requests (rounds alternated,
each way first in turn; ratio of medians; wall time, and the CPU time of this process, since the stand-in runs
in a process of its own), (b) input tokens billed with prompt caching and without, and (c)
the bytes sent per request as the session grows. That stand-in bills as the API's prompt
cache does (tests/cache_model.py; tokens are bytes / 4).
"""

import argparse
import io
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from cache_model import PromptCache  # noqa: E402
from fake_api import FakeAPI, stream_of  # noqa: E402
from otlp_receiver import OTLPReceiver  # noqa: E402

import agent  # noqa: E402


class CachingStandIn:
    """Replies read_file until `turns` tool turns are done; bills as the API's cache would
    (tests/cache_model.py: breakpoints, lookback, the 512-token minimum)."""

    def __init__(self, turns):
        self.turns, self.n, self.cache, self.bills = turns, 0, PromptCache(), []

    def __call__(self, body):
        self.n += 1
        usage = self.cache.bill(body)
        total = sum(usage[k] for k in agent.COUNTS if k != "output_tokens")
        self.bills.append((total, usage, len(json.dumps(body).encode())))
        if self.n <= self.turns:
            content = [
                {
                    "type": "tool_use",
                    "id": f"toolu_{self.n:04d}",
                    "name": "read_file",
                    "input": {"path": "scores.csv"},
                }
            ]
            return {
                "id": f"msg_{self.n}",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": content,
                "stop_reason": "tool_use",
                "usage": usage,
            }
        return {
            "id": f"msg_{self.n}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": "done"}],
            "stop_reason": "end_turn",
            "usage": usage,
        }


class StandIn:
    """The stand-in in a process of its own, as a real server is: its work does not share the
    GIL with the loop being measured. After the round, `requests` and `bills` hold what it saw."""

    def __init__(self, turns):
        self.turns = turns

    def __enter__(self):
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=self.serve, args=(child,), daemon=True)
        self.process.start()
        self.url = self.conn.recv()
        return self

    def serve(self, conn):
        stand_in = CachingStandIn(self.turns)
        with FakeAPI([stand_in] * (self.turns + 1)) as api:
            conn.send(api.url)
            conn.recv()  # the round is over
            conn.send((list(api.requests), stand_in.bills))

    def __exit__(self, *exc):
        self.conn.send(None)
        self.requests, self.bills = self.conn.recv()
        self.process.join()


def quartiles(values):
    """(first quartile, median, third quartile)."""
    return statistics.quantiles(values, n=4) if len(values) > 1 else values * 3


def client_for(url):
    """A client as a bare script makes it."""
    import anthropic

    return anthropic.Anthropic(api_key="bench", base_url=url, max_retries=0)


def harness_round(turns, workspace, keep=True):
    """One 100-turn session through agent.main, keeping a transcript, an event stream and the
    kept run (or, with keep False, none of them)."""
    with StandIn(turns) as api, tempfile.TemporaryDirectory() as tmp:
        client = client_for(api.url)
        argv = [
            "q",
            "--workdir",
            str(workspace),
            "--quiet",
            "--no-sandbox",
            "--max-turns",
            str(turns + 2),
        ]
        if keep:
            argv += [
                "--transcript",
                os.path.join(tmp, "bench.json"),
                "--events",
                os.path.join(tmp, "bench.events.jsonl"),
            ]
        else:
            argv += ["--no-keep"]
        started, cpu = time.perf_counter(), time.process_time()
        with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
            code = agent.main(argv, client=client)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert code == 0, f"the harness exited {code}"
    return (seconds, cpu), api.requests, api.bills


def bare_round(requests):
    """The same requests through the SDK with no harness around them: the floor."""
    with StandIn(len(requests)) as api:
        client = client_for(api.url)
        started, cpu = time.perf_counter(), time.process_time()
        for body in requests:
            body = {k: v for k, v in body.items() if k != "stream"}
            with client.messages.stream(**body) as stream:
                for _ in stream:
                    pass
                stream.get_final_message()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return seconds, cpu


# --- --compare: is each optimisation needed? Each taken out of a copy of agent.py in turn ---

# What taking an optimisation out means, as (text, replacement) edits to a copy of agent.py;
# each text must be found there exactly once. The copies run as a user runs agent.py.
REMOVALS = {
    "gc-sdk": [  # `import anthropic` with the collector off, then frozen
        (
            "    gc.disable()\n    try:\n        import anthropic",
            "    try:\n        import anthropic",
        ),
        ("    finally:\n        gc.freeze()\n        gc.enable()\n", ""),
    ],
    "rename_exchange": [
        ('exchange = not durable and getattr(LIBC, "renameat2", None)', "exchange = None")
    ],
    "saver": [
        (
            "data = self.encode(session)",  # dump() it whole
            "data = dump(session)",
        )
    ],
    "lazy-import": [("\nimport argparse\n", "\nimport anthropic\nimport argparse\n")],
}
# The SDK's stream, as a bare script writes it, replaying what agent.py sent (--compare).
BARE_LOOP = """
import json, sys, anthropic
table, requests = json.load(open(sys.argv[1]))
client = anthropic.Anthropic(api_key="bench", base_url=sys.argv[2], max_retries=0)
for head, messages in requests:
    with client.messages.stream(**head, messages=[table[i] for i in messages]) as stream:
        for _ in stream:
            pass
        stream.get_final_message()
"""


def agent_copy(folder, removed):
    """A copy of agent.py in `folder`, with the optimisations named in `removed` taken out."""
    source = (Path(__file__).resolve().parent.parent / "agent.py").read_text(encoding="utf-8")
    for name in removed:
        for old, new in REMOVALS[name]:
            assert source.count(old) == 1, f"{name}: {old!r} is not in agent.py once"
            source = source.replace(old, new)
    path = Path(folder) / ("-".join(removed) or "baseline") / "agent.py"
    path.parent.mkdir()
    path.write_text(source, encoding="utf-8")
    return path


class QuickStandIn(ThreadingHTTPServer):
    """Answers at once and reads nothing but the request's length: `turns` read_file calls,
    then an answer. Notes when each request arrived; with `record`, keeps the requests, each
    message once (a table, and each request's indices into it), for the bare loop to replay."""

    daemon_threads = True

    def __init__(self, turns, record=False):
        super().__init__(("127.0.0.1", 0), QuickHandler)
        self.turns, self.record, self.arrivals, self.cpu, self.pid = turns, record, [], [], None
        self.table, self.requests = [], []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()

    def reply(self, size):
        n = len(self.arrivals)
        content = (
            [
                {
                    "type": "tool_use",
                    "id": f"toolu_{n:04d}",
                    "name": "read_file",
                    "input": {"path": "scores.csv"},
                }
            ]
            if n <= self.turns
            else [{"type": "text", "text": "done"}]
        )
        return stream_of(
            {
                "id": f"msg_{n}",
                "type": "message",
                "role": "assistant",
                "model": "claude-haiku-5-5",
                "content": content,
                "stop_reason": "tool_use" if n <= self.turns else "end_turn",
                "usage": {
                    "input_tokens": 10,
                    "output_tokens": 30,  # 4 bytes a token
                    "cache_read_input_tokens": size // 4,
                },
            }
        ).encode()

    def keep(self, body):
        """Each message once: the same as the previous request's at its place, or new."""
        head = {k: v for k, v in body.items() if k not in ("messages", "stream")}
        before = self.requests[-1][1] if self.requests else []
        indices = []
        for i, message in enumerate(body["messages"]):
            if i < len(before) and self.table[before[i]] == message:
                indices.append(before[i])
            else:
                indices.append(len(self.table))
                self.table.append(message)
        self.requests.append((head, indices))


class QuickHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else a kept-alive connection waits 40 ms a reply

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.server.arrivals.append(time.perf_counter())
        if len(self.server.arrivals) in (1, self.server.turns + 1):
            self.server.cpu.append(cpu_seconds(self.server.pid))
        size = int(self.headers["content-length"])
        body = self.rfile.read(size)
        if self.server.record:
            self.server.keep(json.loads(body))
        data = self.server.reply(size)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def cpu_seconds(pid):
    """CPU time (user and system, all threads) a running process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def session_time(argv, turns, env, record=False):
    """Seconds a turn of a process run against a QuickStandIn, from the first request's
    arrival to the last's (its start-up left out): wall time, and the process's CPU time,
    steadier on a busy machine. And the stand-in."""
    with QuickStandIn(turns, record) as api:
        process = subprocess.Popen(
            [a.replace("{url}", api.url) for a in argv],
            env=dict(env, ANTHROPIC_BASE_URL=api.url),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        api.pid = process.pid
        _, err = process.communicate(timeout=3600)
    assert process.returncode == 0 and len(api.arrivals) == turns + 1, (argv, err[-2000:])
    return ((api.arrivals[-1] - api.arrivals[0]) / turns, (api.cpu[1] - api.cpu[0]) / turns), api


def ratios(seconds, floor):
    """A way's median, its ratio of medians to `floor`'s, and the ratios round by round."""
    low, mid, high = quartiles([a / b for a, b in zip(seconds, floor)])
    median = statistics.median(seconds)
    return (
        f"{median * 1000:6.2f} ms {median / statistics.median(floor):.3f} "
        f"({mid:.3f}, {low:.3f}-{high:.3f})"
    )


def compare(args, root):
    """Rounds of every way, alternated and their order rotated; ratios of medians to the bare
    loop (and of --otel to the same run without it), with the quartiles of the ratios taken
    round by round. Then `--help` against `import anthropic`, likewise."""
    variants = [v.split("+") for v in args.without] if args.without else [[n] for n in REMOVALS]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC", "OTEL")) and k != "PYTHONDONTWRITEBYTECODE"
    }
    env["ANTHROPIC_API_KEY"] = "bench-key-0123456789"
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}; load "
        f"{os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory() as tmp, OTLPReceiver() as collector:  # spans only kept
        copies = {"with all": agent_copy(tmp, [])}
        copies.update({f"without {'+'.join(names)}": agent_copy(tmp, names) for names in variants})
        if not args.without:
            copies["without all"] = agent_copy(tmp, list(REMOVALS))
        for turns in args.turns:
            flags = [
                "q",
                "--workdir",
                str(root / "workspace"),
                "--quiet",
                "--no-sandbox",
                "--max-turns",
                str(turns + 2),
                "--token-budget",
                str(10**12),
                "--transcript",
                os.path.join(tmp, "t.json"),
                "--events",
                os.path.join(tmp, "e.jsonl"),
            ]
            run = {name: [sys.executable, str(path), *flags] for name, path in copies.items()}
            _, api = session_time(run["with all"], turns, env, record=True)  # not counted
            replay = os.path.join(tmp, "requests.json")
            with open(replay, "w") as f:
                json.dump([api.table, api.requests], f)
            run["bare SDK loop"] = [sys.executable, "-c", BARE_LOOP, replay, "{url}"]
            run["with all, --otel"] = run["with all"] + ["--otel"]
            run["with all, --no-keep"] = run["with all"] + ["--no-keep"]
            run["kept only"] = run["with all"][:-4]  # no --transcript, no --events
            run["nothing kept"] = run["kept only"] + ["--no-keep"]
            otel = dict(env, OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint)
            times = {name: [] for name in run}
            for i in range(args.rounds):
                order = list(run)[i % len(run) :] + list(run)[: i % len(run)]
                for name in order:
                    times[name].append(
                        session_time(run[name], turns, otel if "otel" in name else env)[0]
                    )
            print(
                f"{turns} turns, {args.rounds} rounds (alternated, order rotated). Wall time, "
                "then the process's CPU time: ms a turn (median), ratio of medians to the "
                "bare SDK loop, and that ratio round by round: median (quartiles)"
            )
            for name, rounds in times.items():
                print(
                    f"    {name:26}"
                    + "   ".join(
                        ratios([r[kind] for r in rounds], [r[kind] for r in times["bare SDK loop"]])
                        for kind in (0, 1)
                    )
                )
            print(
                "    --otel against the same run without it:"
                + "   ".join(
                    ratios(
                        [r[kind] for r in times["with all, --otel"]],
                        [r[kind] for r in times["with all"]],
                    )
                    for kind in (0, 1)
                )
            )
            for kept, plain in (("with all", "with all, --no-keep"), ("kept only", "nothing kept")):
                print(
                    f"    {kept} against {plain}:"
                    + "   ".join(
                        ratios([r[kind] for r in times[kept]], [r[kind] for r in times[plain]])
                        for kind in (0, 1)
                    )
                )
        if not args.starts:
            return
        helps = {name: [sys.executable, str(path), "--help"] for name, path in copies.items()}
        helps["import anthropic"] = [sys.executable, "-c", "import anthropic"]
        starts = {name: [] for name in helps}
        for i in range(args.starts):
            order = list(helps)[i % len(helps) :] + list(helps)[: i % len(helps)]
            for name in order:
                started = time.perf_counter()
                subprocess.run(helps[name], env=env, capture_output=True, check=True)
                starts[name].append(time.perf_counter() - started)
        imports = starts.pop("import anthropic")
        print(
            f"--help against `python -c 'import anthropic'` ({statistics.median(imports) * 1000:.0f}"
            f" ms), {args.starts} starts of each, alternated: ratio of medians, and round by "
            "round: median (quartiles)"
        )
        for name, seconds in starts.items():
            low, mid, high = quartiles([a / b for a, b in zip(seconds, imports)])
            print(
                f"    {name:30} {statistics.median(seconds) * 1000:7.0f} ms  "
                f"{statistics.median(seconds) / statistics.median(imports):.3f}  "
                f"({mid:.3f}, {low:.3f}-{high:.3f})"
            )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, nargs="+", default=[100])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--starts", type=int, default=10, help="with --compare: runs of --help")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="run agent.py with each optimisation taken out in turn (REMOVALS), "
        "at each --turns, against a bare SDK loop; and --help against "
        "`import anthropic`",
    )
    parser.add_argument(
        "--without",
        action="append",
        metavar="NAME[+NAME...]",
        help="with --compare: only this variant, the names joined by + taken "
        "out together (default: each of REMOVALS, then all of them)",
    )
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as state:  # the runs it keeps go here, not to the home
        os.environ["XDG_STATE_HOME"] = state
        if args.compare:
            return compare(args, root)
        measure(args, root)


def measure(args, root):
    """Without --compare: (a), (b) and (c) of the docstring."""
    workspace = root / "workspace"
    # A warm-up round, not counted: the bare loop replays its requests.
    _, requests, bills = harness_round(args.turns[0], workspace)
    ways = {
        "with": lambda: harness_round(args.turns[0], workspace)[0],
        "without": lambda: harness_round(args.turns[0], workspace, keep=False)[0],
        "bare": lambda: bare_round(requests),
    }
    times = {name: [] for name in ways}
    for i in range(args.rounds):  # alternated, so that the machine's drift hits all alike,
        for name in list(ways)[i % 3 :] + list(ways)[: i % 3]:  # each first in turn: no place
            times[name].append(ways[name]())  # in a round favours one
    harness, plain, bare = times.values()
    n = len(requests)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}"
    )
    (h, hc), (p, pc), (b, bc) = (
        (statistics.median(s for s, _ in x), statistics.median(c for _, c in x))
        for x in (harness, plain, bare)
    )
    print(
        f"(a) {n} requests, {args.rounds} rounds (alternated, order rotated), medians: "
        f"agent.py with --transcript and --events {h / n * 1000:.2f} ms/turn, without them "
        f"{p / n * 1000:.2f} ms/turn; bare SDK loop {b / n * 1000:.2f} ms/request; the "
        f"transcript and events cost {(h - p) / n * 1000:+.2f} ms/turn"
    )
    print(
        f"    ratios to the bare loop: {h / b:.3f} with them, {p / b:.3f} without; CPU time "
        f"of this process (the stand-in runs in another) {hc / bc:.3f} and {pc / bc:.3f}"
    )
    for which, rounds in (("with", harness), ("without", plain)):
        low, mid, high = quartiles([r[0] / f[0] for r, f in zip(rounds, bare)])
        print(
            f"        round by round, {which} them (each against the round next to it): "
            f"median {mid:.3f}, quartiles {low:.3f}-{high:.3f}"
        )
    uncached = sum(total for total, _, _ in bills)
    read = sum(u["cache_read_input_tokens"] for _, u, _ in bills)
    write = sum(u["cache_creation_input_tokens"] for _, u, _ in bills)
    plain = sum(u["input_tokens"] for _, u, _ in bills)
    price = agent.PRICING["claude-haiku-5-5"][0][1]
    with_cache = (plain * price.input + write * price.write_5m + read * price.read) / 1e6
    without = uncached * price.input / 1e6
    print(
        f"(b) prompt tokens over the session: {uncached} without caching (all billed as "
        f"input, ${without:.4f} on Haiku 5.5); with caching {plain} input + {write} cache "
        f"writes + {read} cache reads = ${with_cache:.4f} ({with_cache / without:.0%})"
    )
    marks = sorted({1, 10, 25, 50, n // 2, n} & set(range(1, n + 1)))
    sizes = ", ".join(f"#{i}: {bills[i - 1][2] / 1024:.1f} KiB" for i in marks)
    print(f"(c) bytes sent per request: {sizes}")


if __name__ == "__main__":
    main()
