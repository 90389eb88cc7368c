"""Benchmark: a 100-turn session against a local stand-in that answers instantly.

    .venv/bin/python tests/bench_loop.py [--turns 100]

Reports (a) the harness's own time per turn next to a bare SDK loop sending the same
requests, (b) input tokens billed with prompt caching and without, and (c) the bytes
sent per request as the session grows. Tokens are estimated as bytes/4 of the prompt
(system + tools + messages); the stand-in treats the previous request's prompt as cached
when the new one starts with it, as the API's cache_control does (no minimum length).
Not part of the test run.
"""

import argparse
import io
import json
import os
import platform
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

import agent  # noqa: E402
from fake_api import FakeAPI  # noqa: E402


def prompt_tokens(body):
    return len(json.dumps([body.get("system"), body.get("tools"), body["messages"]],
                          ensure_ascii=False).encode()) // 4


class CachingStandIn:
    """Replies read_file until `turns` tool turns are done; bills as the cache would."""

    def __init__(self, turns):
        self.turns, self.n, self.previous, self.bills = turns, 0, None, []

    def __call__(self, body):
        self.n += 1
        total = prompt_tokens(body)
        history = json.dumps(body["messages"])
        cached = self.previous[1] if self.previous and body.get("cache_control") and \
            history.startswith(self.previous[0][:-1]) else 0
        write = total - cached if body.get("cache_control") else 0
        usage = {"input_tokens": total - cached - write, "output_tokens": 20,
                 "cache_creation_input_tokens": write, "cache_read_input_tokens": cached}
        self.bills.append((total, usage, len(json.dumps(body).encode())))
        self.previous = (history, total)
        if self.n <= self.turns:
            content = [{"type": "tool_use", "id": f"toolu_{self.n:04d}", "name": "read_file",
                        "input": {"path": "scores.csv"}}]
            return {"id": f"msg_{self.n}", "type": "message", "role": "assistant",
                    "model": body["model"], "content": content, "stop_reason": "tool_use",
                    "usage": usage}
        return {"id": f"msg_{self.n}", "type": "message", "role": "assistant",
                "model": body["model"], "content": [{"type": "text", "text": "done"}],
                "stop_reason": "end_turn", "usage": usage}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=100)
    args = parser.parse_args()
    workspace = Path(__file__).resolve().parent.parent / "workspace"
    timings = {}
    for label, keep in (("with --transcript", True), ("without", False)):
        stand_in = CachingStandIn(args.turns)
        with FakeAPI([stand_in] * (args.turns + 1)) as api, tempfile.TemporaryDirectory() as tmp:
            client = agent.make_client({"ANTHROPIC_API_KEY": "bench", "ANTHROPIC_BASE_URL": api.url,
                                        "ANTHROPIC_MODEL": None})
            argv = ["q", "--workdir", str(workspace), "--quiet", "--no-sandbox",
                    "--max-turns", str(args.turns + 2)]
            argv += ["--transcript", os.path.join(tmp, "bench.json")] if keep else []
            started = time.perf_counter()
            with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
                code = agent.main(argv, client=client)
            timings[label] = time.perf_counter() - started
            assert code == 0, f"the harness exited {code}"
            requests = list(api.requests)

    bare_stand_in = CachingStandIn(args.turns)
    with FakeAPI([bare_stand_in] * len(requests)) as api:
        client = agent.make_client({"ANTHROPIC_API_KEY": "bench", "ANTHROPIC_BASE_URL": api.url,
                                    "ANTHROPIC_MODEL": None})
        started = time.perf_counter()
        for body in requests:  # the same requests, with no harness around them
            body = {k: v for k, v in body.items() if k != "stream"}
            with client.messages.stream(**body) as stream:
                for _ in stream:
                    pass
                stream.get_final_message()
        bare = time.perf_counter() - started

    n = len(requests)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}")
    harness = " and ".join(f"{t / n * 1000:.2f} ms/turn {label}" for label, t in timings.items())
    ratio = timings["with --transcript"] / bare
    print(f"(a) {n} requests: harness {harness}; bare SDK loop {bare / n * 1000:.2f} ms/request; "
          f"ratio {ratio:.2f} with the transcript, {timings['without'] / bare:.2f} without")
    uncached = sum(total for total, _, _ in stand_in.bills)
    read = sum(u["cache_read_input_tokens"] for _, u, _ in stand_in.bills)
    write = sum(u["cache_creation_input_tokens"] for _, u, _ in stand_in.bills)
    plain = sum(u["input_tokens"] for _, u, _ in stand_in.bills)
    price = agent.PRICING["claude-haiku-5-5"][0][1]
    with_cache = (plain * price.input + write * price.write_5m + read * price.read) / 1e6
    without = uncached * price.input / 1e6
    print(f"(b) prompt tokens over the session: {uncached} without caching (all billed as "
          f"input, ${without:.4f} on Haiku 5.5); with caching {plain} input + {write} cache "
          f"writes + {read} cache reads = ${with_cache:.4f} ({with_cache / without:.0%})")
    marks = sorted({1, 10, 25, 50, n // 2, n} & set(range(1, n + 1)))
    sizes = ", ".join(f"#{i}: {stand_in.bills[i - 1][2] / 1024:.1f} KiB" for i in marks)
    print(f"(c) bytes sent per request: {sizes}")


if __name__ == "__main__":
    main()
