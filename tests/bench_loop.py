"""Benchmark: a 100-turn session against a local stand-in that answers instantly.

    .venv/bin/python tests/bench_loop.py [--turns 100]

Reports (a) agent.py's time per turn, with --transcript and --events, next to a bare SDK
loop sending the same requests, as a script has it and holding the SDK's reply class as
agent.py does (rounds alternated, each way first in turn; ratio of medians; wall time, and
the CPU time of this process, since the stand-in runs in a process of its own), (b) the time
from starting the process to its first request, against a bare SDK script (and that script
with the garbage collector off while it imports anthropic, as agent.py does), (c) input
tokens billed with prompt caching and without, and (d) the bytes sent per request as the
session grows. The stand-in bills as the API's prompt cache does (tests/cache_model.py;
tokens are bytes / 4). Not part of the test run.
"""

import argparse
import gc
import io
import json
import multiprocessing
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

import agent  # noqa: E402
from cache_model import PromptCache  # noqa: E402
from fake_api import FakeAPI  # noqa: E402


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
            content = [{"type": "tool_use", "id": f"toolu_{self.n:04d}", "name": "read_file",
                        "input": {"path": "scores.csv"}}]
            return {"id": f"msg_{self.n}", "type": "message", "role": "assistant",
                    "model": body["model"], "content": content, "stop_reason": "tool_use",
                    "usage": usage}
        return {"id": f"msg_{self.n}", "type": "message", "role": "assistant",
                "model": body["model"], "content": [{"type": "text", "text": "done"}],
                "stop_reason": "end_turn", "usage": usage}


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
    """A client as a bare script makes it. Not agent.make_client: its gc.freeze(), run again
    at every round, would make whatever is alive then immortal, the SDK's reply class too."""
    import anthropic
    return anthropic.Anthropic(api_key="bench", base_url=url, max_retries=0)


def harness_round(turns, workspace, keep=True):
    """One 100-turn session through agent.main, keeping a transcript and an event stream
    (or, with keep False, neither)."""
    with StandIn(turns) as api, tempfile.TemporaryDirectory() as tmp:
        client = client_for(api.url)
        argv = ["q", "--workdir", str(workspace), "--quiet", "--no-sandbox",
                "--max-turns", str(turns + 2)]
        if keep:
            argv += ["--transcript", os.path.join(tmp, "bench.json"),
                     "--events", os.path.join(tmp, "bench.events.jsonl")]
        started, cpu = time.perf_counter(), time.process_time()
        with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
            code = agent.main(argv, client=client)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert code == 0, f"the harness exited {code}"
    return (seconds, cpu), api.requests, api.bills


def bare_round(requests, held=False):
    """The same requests through the SDK with no harness around them: the floor. As a bare
    script has it, the SDK rebuilds its reply class whenever a collection freed it; `held`
    keeps it as agent.py does (hold_reply_class), for agent.py's own overhead like for like."""
    with StandIn(len(requests)) as api:
        client = client_for(api.url)
        if not held:  # not kept alive by the hold of the rounds before either
            agent.REPLY_CLASSES.clear()
            gc.collect()
        started, cpu = time.perf_counter(), time.process_time()
        for body in requests:
            body = {k: v for k, v in body.items() if k != "stream"}
            with client.messages.stream(**body) as stream:
                for _ in stream:
                    pass
                stream.get_final_message()
            if held:
                agent.hold_reply_class(False)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return seconds, cpu


BARE_FIRST = """
import sys, anthropic
client = anthropic.Anthropic(api_key="bench", base_url=sys.argv[1], max_retries=0)
with client.messages.stream(model="claude-haiku-5-5", max_tokens=16000, messages=[
        {"role": "user", "content": [{"type": "text", "text": "q"}]}],
        cache_control={"type": "ephemeral"}) as stream:
    stream.get_final_message()
"""
# The same script, importing anthropic as agent.py does: with the garbage collector off.
BARE_FIRST_NO_GC = BARE_FIRST.replace("import sys, anthropic", (
    "import gc, sys\ngc.disable()\nimport anthropic\ngc.freeze()\ngc.enable()"))


def first_request(argv, env, timeout=60):
    """Seconds from starting a process to its first request reaching the server."""
    seen = []

    def answer(body):
        seen.append(time.perf_counter())
        return {"id": "msg_1", "type": "message", "role": "assistant",
                "model": body["model"], "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}}

    with FakeAPI([answer]) as api:
        started = time.perf_counter()
        subprocess.run([a.replace("{url}", api.url) for a in argv], env=dict(
            env, ANTHROPIC_BASE_URL=api.url), capture_output=True, check=True, timeout=timeout)
        return seen[0] - started


def instructions_to_first_request(argv, env):
    """Instructions a process executes up to its first request: callgrind dumps its counts
    before the first send(). A count, not a time: the same on a busy machine as on a quiet one
    (one run is enough; the hash seed is fixed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        first_request(["valgrind", "--tool=callgrind", "--dump-before=send",
                       f"--callgrind-out-file={out}", *argv],
                      dict(env, PYTHONHASHSEED="0"), timeout=3600)
        first = Path(f"{out}.1").read_text()  # the dump before the first send()
        return int(re.search(r"^summary: (\d+)$", first, re.M).group(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--instructions", action="store_true",
                        help="also count the instructions to the first request under valgrind "
                             "(about 90 s a script)")
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    workspace = root / "workspace"
    # A warm-up round, not counted: the bare loop replays its requests.
    _, requests, bills = harness_round(args.turns, workspace)
    ways = {"with": lambda: harness_round(args.turns, workspace)[0],
            "without": lambda: harness_round(args.turns, workspace, keep=False)[0],
            "bare": lambda: bare_round(requests), "held": lambda: bare_round(requests, held=True)}
    times = {name: [] for name in ways}
    for i in range(args.rounds):  # alternated, so that the machine's drift hits all alike,
        for name in list(ways)[i % 4:] + list(ways)[:i % 4]:  # each first in turn: no place
            times[name].append(ways[name]())  # in a round favours one
    harness, plain, bare, held = times.values()
    n = len(requests)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    (h, hc), (p, pc), (b, bc), (k, kc) = ((statistics.median(s for s, _ in x),
                                           statistics.median(c for _, c in x))
                                          for x in (harness, plain, bare, held))
    print(f"(a) {n} requests, {args.rounds} rounds (alternated, order rotated), medians: "
          f"agent.py with --transcript and --events {h / n * 1000:.2f} ms/turn, without them "
          f"{p / n * 1000:.2f} ms/turn; bare SDK loop {b / n * 1000:.2f} ms/request, holding "
          f"the SDK's reply class as agent.py does {k / n * 1000:.2f}; the transcript and events "
          f"cost {(h - p) / n * 1000:+.2f} ms/turn")
    for floor, fs, fc, name in ((bare, b, bc, "the bare loop"),
                                (held, k, kc, "the bare loop holding the class (like for like)")):
        print(f"    ratios to {name}: {h / fs:.3f} with them, {p / fs:.3f} without; CPU time "
              f"of this process (the stand-in runs in another) {hc / fc:.3f} and {pc / fc:.3f}")
        for which, rounds in (("with", harness), ("without", plain)):
            low, mid, high = quartiles([r[0] / f[0] for r, f in zip(rounds, floor)])
            print(f"        round by round, {which} them (each against the round next to it): "
                  f"median {mid:.3f}, quartiles {low:.3f}-{high:.3f}")
    print(f"    CPU ms/turn: {hc / n * 1000:.2f} and {pc / n * 1000:.2f}; bare {bc / n * 1000:.2f}"
          f", holding the class {kc / n * 1000:.2f}")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ANTHROPIC") and k != "PYTHONDONTWRITEBYTECODE"}
    env["ANTHROPIC_API_KEY"] = "bench-key-0123456789"
    with tempfile.TemporaryDirectory() as tmp:
        flags = ["q", "--workdir", str(workspace), "--quiet", "--transcript",
                 os.path.join(tmp, "t.json"), "--events", os.path.join(tmp, "e.jsonl")]
        scripts = {"python agent.py": [sys.executable, str(root / "agent.py"), *flags],
                   "bare": [sys.executable, "-c", BARE_FIRST, "{url}"],
                   "bare, no GC in import": [sys.executable, "-c", BARE_FIRST_NO_GC, "{url}"]}
        starts = {name: [] for name in scripts}
        for _ in range(args.starts):  # alternated; each difference below is within one round
            for name, argv in scripts.items():
                starts[name].append(first_request(argv, env))
        counts = {name: instructions_to_first_request(argv, env)
                  for name, argv in scripts.items()} if args.instructions else {}
    source = (root / "agent.py").read_text(encoding="utf-8")
    compiling = []
    for _ in range(5):
        started = time.perf_counter()
        compile(source, "agent.py", "exec")
        compiling.append(time.perf_counter() - started)
    ms = lambda v: f"{v * 1000:+.0f}"  # noqa: E731
    print(f"(b) time to the first request, {args.starts} alternated process starts of each, "
          "median (quartiles):")
    for name, seconds in starts.items():
        low, mid, high = quartiles(seconds)
        print(f"    {name}: {mid * 1000:.0f} ms ({low * 1000:.0f}-{high * 1000:.0f})")
    for name in ("bare", "bare, no GC in import"):
        low, mid, high = quartiles([a - b for a, b in zip(starts["python agent.py"],
                                                           starts[name])])
        print(f"    python agent.py minus {name}, paired by round: {ms(mid)} ms "
              f"({ms(low)} to {ms(high)})")
    if counts:  # at the bare script's pace (its instructions over its median time), as ms
        pace = counts["bare"] / statistics.median(starts["bare"])
        for name in ("bare", "bare, no GC in import"):
            more = counts["python agent.py"] - counts[name]
            print(f"    instructions to the first request (callgrind): python agent.py "
                  f"{counts['python agent.py'] / 1e6:,.0f}M, {name} {counts[name] / 1e6:,.0f}M: "
                  f"{more / 1e6:+,.0f}M ({more / counts[name]:+.1%}; {ms(more / pace)} ms at the "
                  "bare script's pace)")
    print(f"    compiling agent.py, timed apart: {statistics.median(compiling) * 1000:.0f} ms (a "
          "script run as `python agent.py` is compiled at every start; only imported modules "
          "are cached)")
    uncached = sum(total for total, _, _ in bills)
    read = sum(u["cache_read_input_tokens"] for _, u, _ in bills)
    write = sum(u["cache_creation_input_tokens"] for _, u, _ in bills)
    plain = sum(u["input_tokens"] for _, u, _ in bills)
    price = agent.PRICING["claude-haiku-5-5"][0][1]
    with_cache = (plain * price.input + write * price.write_5m + read * price.read) / 1e6
    without = uncached * price.input / 1e6
    print(f"(c) prompt tokens over the session: {uncached} without caching (all billed as "
          f"input, ${without:.4f} on Haiku 5.5); with caching {plain} input + {write} cache "
          f"writes + {read} cache reads = ${with_cache:.4f} ({with_cache / without:.0%})")
    marks = sorted({1, 10, 25, 50, n // 2, n} & set(range(1, n + 1)))
    sizes = ", ".join(f"#{i}: {bills[i - 1][2] / 1024:.1f} KiB" for i in marks)
    print(f"(d) bytes sent per request: {sizes}")


if __name__ == "__main__":
    main()
