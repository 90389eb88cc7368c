"""Benchmark: when should old tool results be cleared? (the article's open question)

    .venv/bin/python tests/bench_context.py [--turns 100] [--trigger 80000]

A 100-turn session whose every turn reads a file of several KB, against a stand-in that
bills like the API's prompt cache (tests/cache_model.py: breakpoints, the 20-position
lookback, tool_choice invalidating messages, the 512-token minimum) and checks every request
against the API's rules (tests/api_rules.py). Side by side: no clearing, and client-side
clearing at a few triggers. For each: the peak prompt (tokens and bytes), the total billed
on Claude Haiku 5.5, the share of prompt tokens read from the cache, requests the API would
reject; and what the last turn's tool_choice: none costs against the same request without
it. Not part of the test run.
"""

import argparse
import io
import json
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

from cache_model import PromptCache  # noqa: E402
from fakes import FakeClient, reply, text, tool_use  # noqa: E402

import agent  # noqa: E402
from agent import Limits  # noqa: E402

MODEL = "claude-haiku-5-5"


def session(turns, workdir, flags):
    """Run `turns` reading turns and an answer; return the bills and what was sent."""
    cache, bills = PromptCache(minimum=512), []

    def answer(i):
        def respond(body):
            if body.get("tool_choice"):  # what tools-off costs: the same request without it
                what_if = cache.bill(dict(body, tool_choice=None), commit=False)
                bills.append(("what_if", what_if, 0))
            usage = cache.bill(body)
            bills.append(("sent", usage, len(json.dumps(body).encode())))
            message = (
                reply(tool_use("read_file", {"path": f"doc{i % 10}.md"}))
                if i < turns
                else reply(text("All files read."))
            )
            return dict(message, usage=usage)

        return respond

    client = FakeClient(*[answer(i) for i in range(turns + 1)])
    argv = [
        "read them all",
        "--workdir",
        str(workdir),
        "--quiet",
        "--max-turns",
        str(turns + 1),
        "--token-budget",
        "100000000",
        # a benchmark's run is no run of the user's: --resume last must never take it
        "--no-keep",
        *flags,
    ]
    with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
        code = agent.main(argv, client=client)
    assert code == 3, f"expected the run to end at max_turns, got {code}"
    return bills, client


def summary(label, bills, client):
    sent = [u for kind, u, _ in bills if kind == "sent"]
    prompts = [sum(u[k] for k in agent.COUNTS if k != "output_tokens") for u in sent]
    cost = sum(agent.cost_usd(MODEL, u) for u in sent)
    sonnet = sum(agent.cost_usd("claude-sonnet-5-5", u) for u in sent)
    read = sum(u["cache_read_input_tokens"] for u in sent)
    peak_bytes = max(size for kind, _, size in bills if kind == "sent")
    what_if = next(u for kind, u, _ in bills if kind == "what_if")
    tools_off = agent.cost_usd(MODEL, sent[-1]) - agent.cost_usd(MODEL, what_if)
    return (
        f"{label:<28} peak {max(prompts):>7,} tokens {peak_bytes / 1024:>4.0f} KiB · "
        f"${cost:.4f} (Sonnet 5.5 ${sonnet:.3f}) · cache reads {read / sum(prompts):.0%} · "
        f"rejected {len(client.violations)} · tools-off last turn +${tools_off:.5f}"
    ), cost


def files(workdir, lines):
    for i in range(10):  # 17 bytes a line: 320 lines, several KB, about 1,500 tokens a read
        (workdir / f"doc{i}.md").write_text(f"# doc {i}\n" + f"a line of doc {i}.\n" * lines)


def costs(turns, workdir, flags):
    sent = [u for kind, u, _ in session(turns, workdir, flags)[0] if kind == "sent"]
    return [sum(agent.cost_usd(m, u) for u in sent) for m in (MODEL, "claude-sonnet-5-5")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument(
        "--trigger",
        type=int,
        default=Limits.clear_at,
        help="the --clear-tool-results that (b) holds against no clearing",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp) / "work"
        workdir.mkdir()
        files(workdir, 320)
        print(
            f"{args.turns} turns, each reading a {len((workdir / 'doc0.md').read_bytes()):,}-"
            f"byte file; priced as {MODEL}"
        )
        rows = [("--clear-tool-results off", ["--clear-tool-results", "off"])] + [
            (f"--clear-tool-results {at:,}", ["--clear-tool-results", str(at)])
            for at in (20_000, 40_000, 80_000)
        ]
        baseline = None
        for label, flags in rows:
            bills, client = session(args.turns, workdir, flags)
            line, cost = summary(label, bills, client)
            baseline = baseline or cost
            print(f"{line} · {cost / baseline - 1:+.0%} cost")
        print(
            f"(b) does --clear-tool-results {args.trigger:,}"
            f"{' (the default)' * (args.trigger == Limits.clear_at)} ever cost more? cost "
            "with it against without, Haiku 5.5 / Sonnet 5.5:"
        )
        for lines in (60, 320, 1200):
            files(workdir, lines)
            deltas = []
            for turns in (10, 25, 50, 100, 150):
                off, on = (
                    costs(turns, workdir, ["--clear-tool-results", "off"]),
                    costs(turns, workdir, ["--clear-tool-results", str(args.trigger)]),
                )
                deltas.append(
                    f"{turns} turns {on[0] / off[0] - 1:+.1%} / {on[1] / off[1] - 1:+.1%}"
                )
            print(f"    {lines * 17 + 9:>6,}-byte results: " + ", ".join(deltas))


if __name__ == "__main__":
    main()
