"""The live suite: README's five experiments and a --trials 3 against a real server.

    AGENT_LIVE=1 .venv/bin/python -m pytest -m live -s

Skipped unless AGENT_LIVE=1. It is the one place where the tests use the network and your
settings: ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and ANTHROPIC_MODEL from the environment
(the real API with your key, or a local Anthropic-compatible server). Each experiment runs
agent.py as a subprocess on a copy of workspace/, and the test asserts only what must hold
whatever the model says: a documented exit code and stop label, no request the API refused,
every tool_use answered once, a transcript and an event stream that match the published
schemas, cost figures for priced models, and each experiment's own invariant. Transcripts,
events and stderr stay in the directory it names; it prints one line per experiment.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import schema_errors

import agent

LIVE_ENV = {k: v for k, v in os.environ.items() if k.startswith("ANTHROPIC")}  # read at import,
# before the fixture that hides the user's settings from every other test
pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        os.environ.get("AGENT_LIVE") != "1",
        reason="the live suite talks to a real server: set AGENT_LIVE=1 (and ANTHROPIC_API_KEY, "
        "ANTHROPIC_BASE_URL, ANTHROPIC_MODEL as needed)",
    ),
]

ROOT = Path(agent.__file__).resolve().parent
EXPERIMENTS = {  # name -> (arguments after the question, question, stdin)
    "1-basic": (["--yes"], "scores.csv 里平均分是多少？", ""),
    "2-parallel": (["--yes"], "Compare spring.md and fall.md.", ""),
    "3a-missing": (["--yes"], "What does winter.md say?", ""),
    "3b-outside": (["--yes"], "Read ../requirements.txt", ""),
    "4-declined": (
        [],
        "What is the standard deviation of the scores in scores.csv? Compute it with run_python.",
        None,
    ),
    "5-max-turns": (["--yes", "--max-turns", "2"], "Summarise every file in reports/.", ""),
    "trials": (
        ["--yes", "--trials", "3", "--expect-tool", "read_file"],
        "Compare spring.md and fall.md.",
        "",
    ),
}
DOCUMENTED = set(agent.EXIT_CODES.values()) | {agent.EXIT_USAGE, agent.EXIT_TRIALS_FAILED}
SECRET = "LIVE-SUITE-SECRET-0d6f: outside the workdir\n"


@pytest.fixture(scope="module")
def runs():
    where = Path(os.environ.get("AGENT_LIVE_DIR") or ROOT / "live-runs") / time.strftime(
        "%Y%m%d-%H%M%S"
    )
    where.mkdir(parents=True)
    print(
        f"\nlive runs in {where} against {LIVE_ENV.get('ANTHROPIC_BASE_URL', 'the API')}, "
        f"model {LIVE_ENV.get('ANTHROPIC_MODEL', agent.DEFAULT_MODEL)}"
    )
    return where


def live(runs, name):
    """Run one experiment as a user would; return what it left behind."""
    extra, question, stdin = EXPERIMENTS[name]
    workdir = runs / name / "workspace"
    shutil.copytree(ROOT / "workspace", workdir)
    out = runs / name
    (out / "requirements.txt").write_text(SECRET)  # what ../requirements.txt would leak
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
    env.update(LIVE_ENV)
    argv = [
        sys.executable,
        str(ROOT / "agent.py"),
        question,
        "--workdir",
        str(workdir),
        "--transcript",
        str(out / "run.json"),
        "--events",
        str(out / "events.jsonl"),
        *extra,
    ]
    started = time.monotonic()
    runs_of_it = int(extra[extra.index("--trials") + 1]) if "--trials" in extra else 1
    done = subprocess.run(
        argv,
        env=env,
        cwd=out,
        capture_output=True,
        text=True,
        timeout=1800 * runs_of_it,  # a tiny local model may write for 17 min
        stdin=subprocess.DEVNULL if stdin is None else None,
        input=stdin if stdin is not None else None,
    )
    (out / "stderr.txt").write_text(done.stderr)
    (out / "stdout.txt").write_text(done.stdout)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return done, json.loads((out / "run.json").read_text()), events, time.monotonic() - started


def check_transcript(t):
    """What must hold of any transcript, whatever the model said."""
    assert not schema_errors(t, "transcript"), schema_errors(t, "transcript")[:3]
    assert t["stop"]["reason"] in agent.EXIT_CODES
    assert "invalid_request_error" not in t["stop"]["detail"]  # no request the API refused
    assert not [r for turn in t["turns"] for r in turn.get("retries", []) if r["status"] == 400]
    messages = t["messages"]
    for i, m in enumerate(messages):  # every tool_use answered once, in the next message
        asked = [b["id"] for b in m["content"] if b.get("type") == "tool_use"]
        if not asked or m["role"] != "assistant":
            continue
        if i == len(messages) - 1:  # a stop before the tools ran: never run, said so
            assert t["stop"]["reason"] in (
                "max_turns",
                "token_budget",
                "cost_budget",
                "interrupted",
                "api_error",
                "error",
            )
            continue
        answers = [
            b["tool_use_id"] for b in messages[i + 1]["content"] if b.get("type") == "tool_result"
        ]
        assert sorted(answers) == sorted(asked) and len(set(answers)) == len(answers)
    if agent.base_model(t["model"]) in agent.PRICING:
        assert t["usage"]["cost_usd"] is not None


def no_failure_of_agent_py(done, stop, events):
    """agent.py's own failures, judged only by what the model cannot write: the exit code, the
    transcript's (or summary's) stop and the run.stop event. Not stderr: it carries the model's
    streamed text, and a small model makes up tool output with "Traceback" in it."""
    assert done.returncode in DOCUMENTED and events[-1]["type"] == "run.stop"
    assert events[-1]["exit_code"] == done.returncode
    if stop is not None:
        assert stop["exit_code"] == done.returncode
        assert stop["reason"] != "error" or stop["detail"].startswith("unknown stop_reason"), (
            stop
        )  # an error of agent.py's own is its exception's name and message


def summary_line(name, done, t, seconds):
    u = t["usage"]
    cost = "cost unknown" if u["cost_usd"] is None else f"${u['cost_usd']:.4f}"
    return (
        f"{name:<12} exit {done.returncode} {t['stop']['reason']:<13} "
        f"{agent.plural(len(t['turns']), 'turn')}, {u['tokens']:,} tokens, {cost}, "
        f"{seconds:.1f}s: "
        f"{agent.shorten(t['stop']['detail'], 70)}"
    )


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n != "trials"])
def test_experiment(runs, name):
    done, t, events, seconds = live(runs, name)
    print(summary_line(name, done, t, seconds))
    no_failure_of_agent_py(done, t["stop"], events)
    check_transcript(t)
    assert events[0]["type"] == "run.start" and events[-1]["type"] == "run.stop"
    assert not [e for e in events if schema_errors(e, "events")]
    calls = [c for turn in t["turns"] for c in turn["tool_calls"]]
    if name == "4-declined":  # stdin closed: every run_python call declined, and answered so
        for call in calls:
            if call["name"] == "run_python":
                assert call["declined"] and call["is_error"]
    if name == "5-max-turns":  # at the last turn: an interim answer, or a detail saying why not
        flags = EXPERIMENTS[name][0]
        if len(t["turns"]) == int(flags[flags.index("--max-turns") + 1]):  # (it may end sooner)
            assert done.returncode == 3 and t["stop"]["reason"] == "max_turns"
            assert done.stdout.strip() or "tool_choice none" in t["stop"]["detail"]
    if name == "3b-outside":  # whatever the model tried, nothing outside came back
        results = [
            b.get("content")
            for m in t["messages"]
            for b in m["content"]
            if b.get("type") == "tool_result"
        ]
        assert SECRET not in json.dumps(results)


def test_trials(runs):
    done, summary, events, seconds = live(runs, "trials")
    print(
        f"{'trials':<12} exit {done.returncode}: {summary['passes']} of {summary['n']} "
        f"passed, {summary['errored']} errored, pass@1 {summary['pass@1']}, {seconds:.1f}s"
    )
    no_failure_of_agent_py(done, None, events)
    assert done.returncode in (0, 6)
    assert not schema_errors(summary, "summary")
    for trial in summary["trials"]:
        check_transcript(json.loads(Path(trial["transcript"]).read_text()))
    assert [e["type"] for e in events][-2:] == ["trials.summary", "run.stop"]
