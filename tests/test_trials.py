"""Trials: pass@k and pass^k, the summary, trials' events, --jobs, and how trials stop."""

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fakes import FakeAPIError, FakeClient, reply, text, tool_use
from helpers import (
    agent_env,
    assert_well_formed,
    events_of,
    run_agent_py,
    run_cli,
    schema_errors,
    serve,
)

import agent

# --- scoring ---


def test_pass_at_k_and_pass_hat_k_by_hand():
    # n=5, c=3: pass@2 = 1 - C(2,2)/C(5,2) = 0.9; pass^2 = C(3,2)/C(5,2) = 0.3
    assert [agent.pass_at_k(5, 3, k) for k in range(1, 6)] == pytest.approx([0.6, 0.9, 1, 1, 1])
    assert [agent.pass_hat_k(5, 3, k) for k in range(1, 6)] == pytest.approx([0.6, 0.3, 0.1, 0, 0])


def test_wilson_interval_by_hand():
    # 8 of 10: centre (0.8 + 1.92/10) / 1.38416 = 0.7167; half 1.96*sqrt(.016+.000960)/1.38416
    assert agent.wilson(8, 10) == pytest.approx([0.4902, 0.9433], abs=1e-4)
    assert agent.wilson(0, 0) is None and agent.wilson(0, 5)[0] == 0.0


# --- the summary ---


def test_trials_summary_and_transcripts(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    answers = ["42", "41", "42", "nope", "42"]
    client = FakeClient(*[reply(text(a)) for a in answers])
    code, out, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--trials",
            "5",
            "--expect",
            r"\b42\b",
            "--transcript",
            str(path),
        ],
        client,
    )
    summary = json.loads(path.read_text())
    assert (code, out) == (6, "")
    assert summary["n"] == 5 and summary["passes"] == 3 and summary["pass@1"] == 0.6
    assert summary["pass_at_k"]["2"] == pytest.approx(0.9)
    assert summary["pass_hat_k"]["3"] == pytest.approx(0.1)
    assert [t["passed"] for t in summary["trials"]] == [True, False, True, False, True]
    for t in summary["trials"]:
        assert t["transcript"] == str(tmp_path / f"run.{t['index']}.json")
        assert json.loads(Path(t["transcript"]).read_text())["answer"] == answers[t["index"] - 1]
        assert set(t) >= {"index", "stop", "turns", "tokens", "cost_usd", "passed"}
    assert "pass@k" in err and "pass^k" in err
    assert [len(r["messages"]) for r in client.requests] == [1] * 5  # fresh history each


def test_trials_all_passing_exit_0_and_dash_prints_the_summary(capsys, workdir):
    client = FakeClient(
        reply(tool_use("read_file", {"path": "notes.md"})),
        reply(text("a")),
        reply(tool_use("read_file", {"path": "notes.md"})),
        reply(text("b")),
    )
    code, out, _ = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--trials",
            "2",
            "--expect-tool",
            "read_file",
            "--expect-stop",
            "end_turn",
            "--transcript",
            "-",
        ],
        client,
    )
    assert code == 0 and json.loads(out)["passes"] == 2


def test_a_trial_failing_on_an_api_error_counts_as_failed(capsys, workdir):
    client = FakeClient(
        reply(tool_use("read_file", {"path": "notes.md"})),
        FakeAPIError(400, "invalid_request_error", "bad"),
        reply(tool_use("read_file", {"path": "notes.md"})),
        reply(text("ok")),
    )
    code, out, _ = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--trials",
            "2",
            "--expect-tool",
            "read_file",
            "--transcript",
            "-",
        ],
        client,
    )
    summary = json.loads(out)
    assert code == 6 and [t["stop"] for t in summary["trials"]] == ["api_error", "end_turn"]


def test_the_summary_keeps_infrastructure_failures_apart(capsys, workdir, tmp_path):
    path = tmp_path / "s.json"
    client = FakeClient(
        reply(text("42")),
        FakeAPIError(400, "invalid_request_error", "bad"),
        reply(text("41")),
        reply(text("42")),
    )
    code, _, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--trials",
            "4",
            "--expect",
            r"\b42\b",
            "--transcript",
            str(path),
        ],
        client,
    )
    s = json.loads(path.read_text())
    assert code == 6 and (s["n"], s["scored"], s["passes"], s["failed"], s["errored"]) == (
        4,
        3,
        2,
        1,
        1,
    )
    assert s["pass@1"] == pytest.approx(2 / 3) and s["pass_at_k"]["3"] == 1.0
    assert "4" not in s["pass_at_k"]  # over the 3 scored trials only
    low, high = s["pass@1_wilson95"]
    assert low == pytest.approx(0.2077, abs=1e-3) and high == pytest.approx(0.9385, abs=1e-3)
    assert s["stops"] == {"api_error": 1, "end_turn": 3}
    assert (s["question"], s["model"], s["expect"]) == (
        "q",
        "claude-haiku-5-5",
        {"regex": r"\b42\b", "tool": None, "stop": None},
    )
    assert s["decline_message"] == agent.DECLINE_MESSAGE
    assert s["per_trial"]["turns"] == {"mean": 0.75, "median": 1.0}
    assert "1 errored" in err and "Wilson" in err and "median" in err


def test_trials_events_carry_the_trial_and_end_with_the_summary(capsys, workdir, tmp_path):
    path, summary_path = tmp_path / "e.jsonl", tmp_path / "s.json"
    client = FakeClient(
        reply(text("42")), FakeAPIError(400, "invalid_request_error", "bad"), reply(text("41"))
    )
    code, _, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--trials",
            "3",
            "--expect",
            "42",
            "--events",
            str(path),
            "--transcript",
            str(summary_path),
        ],
        client,
    )
    events = events_of(path)
    assert_well_formed(events)
    kinds = [e["type"] for e in events]
    assert kinds.count("trial.start") == kinds.count("trial.end") == 3
    assert kinds[-2:] == ["trials.summary", "run.stop"] and events[-1]["exit_code"] == code == 6
    for e in events:
        if e["type"] in ("turn.start", "turn.end", "text", "trial.start", "trial.end"):
            assert e["trial"] in (1, 2, 3)
    summary = json.loads(summary_path.read_text())
    assert events[-2]["summary"] == summary and not schema_errors(summary, "summary")


# --- running and stopping them ---


def test_jobs_run_trials_at_once_without_interleaving_lines(capsys, workdir):
    barrier = threading.Barrier(2, timeout=5)

    def together(request):
        barrier.wait()  # both trials must be in flight at the same time
        return reply(text("line one\nline two"))

    client = FakeClient(together, together)
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--trials", "2", "--jobs", "2"], client
    )
    assert code == 0
    trial_lines = [l for l in err.splitlines() if "line one" in l or "line two" in l]
    assert len(trial_lines) == 4 and all(l.startswith("[trial ") for l in trial_lines)


def test_trials_stop_on_a_signal_whose_keyboardinterrupt_python_swallowed(
    capsys, workdir, monkeypatch
):
    """The handler's flag alone (its KeyboardInterrupt dropped in a __del__ or an at-fork
    hook, see on_stop_signal) must end trials as it ends a session: exit 130, not the next
    trial started and cut short as a failure."""
    monkeypatch.setattr(agent, "STOPPING", threading.Event())

    def slow(request):
        agent.STOPPING.set()  # what on_stop_signal does before its exception is lost
        time.sleep(1.0)
        return reply(text("late"))

    client = FakeClient(reply(text("first")), slow, reply(text("never")))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--trials", "3"], client)
    assert code == 130 and "interrupted: " in err


def test_ctrl_c_stops_trials_and_keeps_what_finished(capsys, workdir, tmp_path, monkeypatch):
    """Ctrl-C under the handler `python agent.py` installs: were its KeyboardInterrupt dropped
    in a finalizer, its flag would still stop the trials."""
    path = tmp_path / "run.json"
    monkeypatch.setattr(agent, "STOPPING", threading.Event())

    def slow(request):
        threading.Timer(0.2, signal.raise_signal, (signal.SIGINT,)).start()
        time.sleep(1.0)
        return reply(text("late"))

    client = FakeClient(reply(text("first")), slow, reply(text("never")))
    started, previous = time.monotonic(), signal.signal(signal.SIGINT, agent.on_stop_signal)
    try:
        code, _, err = run_cli(
            capsys,
            ["q", "--workdir", str(workdir), "--trials", "3", "--transcript", str(path)],
            client,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130 and time.monotonic() - started < 8
    assert "interrupted: 1 of 3 trials finished" in err
    summary = json.loads(path.read_text())
    assert summary["interrupted"] is True and summary["n"] == 2  # one finished, one cut short
    assert (summary["scored"], summary["errored"], summary["passes"]) == (1, 1, 1)
    assert json.loads((tmp_path / "run.2.json").read_text())["stop"]["reason"] == "interrupted"
    assert not (tmp_path / "run.3.json").exists()


@pytest.mark.parametrize("where", ["reading-a-reply", "waiting-to-retry"])
def test_sighup_stops_trials_and_the_trial_it_cut_names_it(
    capsys, workdir, tmp_path, monkeypatch, where
):
    """SIGHUP (a closed terminal) cuts the running trial short, whether it was reading a reply
    or waiting out a retry-after, and that trial's stop says SIGHUP, as a session's does (N16)."""
    path = tmp_path / "run.json"
    monkeypatch.setattr(agent, "STOPPING", threading.Event())

    def hangup(request):
        threading.Timer(0.2, signal.raise_signal, (signal.SIGHUP,)).start()
        if where == "waiting-to-retry":
            return FakeAPIError(529, "overloaded_error", "Overloaded", {"retry-after": "30"})
        time.sleep(1.0)
        return reply(text("late"))

    client = FakeClient(reply(text("first")), hangup, reply(text("never")))
    started, previous = time.monotonic(), signal.signal(signal.SIGHUP, agent.on_stop_signal)
    try:
        code, _, err = run_cli(
            capsys,
            ["q", "--workdir", str(workdir), "--trials", "3", "--transcript", str(path)],
            client,
        )
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert code == 130 and time.monotonic() - started < 8
    assert "[trial 2] stop: interrupted (stopped by SIGHUP)" in err
    cut = json.loads((tmp_path / "run.2.json").read_text())["stop"]
    assert (cut["reason"], cut["detail"]) == ("interrupted", "stopped by SIGHUP")


@pytest.mark.parametrize("hold", ["before-headers", "mid-stream"])
def test_ctrl_c_ends_trials_at_once_and_records_the_running_ones(
    request, workdir, tmp_path, agent_copy, hold
):
    """Ctrl-C while two trials wait on a slow server (one that has not answered yet, or one
    that streams nothing but pings): the in-flight requests are cut, so agent.py ends in about
    a second, not when the server answers; and both running trials are in the summary, marked
    interrupted, each with its transcript (newuser #48, #49)."""
    released, arrived = threading.Event(), []

    def slow(body):
        arrived.append(time.monotonic())
        released.wait(40)  # a server that takes its time to answer at all
        return reply(text("late"))

    item = slow if hold == "before-headers" else {"pings": 40}
    api = serve(request, item, item, reply(text("never")))
    request.addfinalizer(released.set)
    path = tmp_path / "run.json"
    proc = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        "--trials",
        "3",
        "--jobs",
        "2",
        "--transcript",
        path,
        background=True,
        env=agent_env(api),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while len(api.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # both requests in flight
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - started < 3, err
    assert "Traceback" not in err
    summary = json.loads(path.read_text())
    assert summary["interrupted"] is True and summary["n"] == 2, err
    assert [(t["index"], t["stop"]) for t in summary["trials"]] == [
        (1, "interrupted"),
        (2, "interrupted"),
    ]
    for index in (1, 2):
        saved = json.loads((tmp_path / f"run.{index}.json").read_text())
        assert saved["stop"]["reason"] == "interrupted"
    assert "interrupted: 0 of 3 trials finished" in err
    assert "[trial 1] stop: interrupted" in err and "[trial 2] stop: interrupted" in err


def test_a_summary_of_no_trial_prints_no_empty_lines(capsys):
    """Ctrl-C before any trial began: the summary says so, with no empty `stops:` line and no
    per-trial figures of nothing (newuser #49)."""
    summary = agent.summarize([], 3)
    agent.print_summary(summary, agent.Reporter())
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("trials: 0 of 3 ran")
    assert "stops:" not in err and "per trial" not in err
    assert "total 0 tokens, $0.000000" in err


# --- bounds on a whole trials run ---


@pytest.mark.parametrize(
    "flags, said",
    [
        (
            ["--trials", "1000000"],
            "--trials 1,000,000 is over 1,000, the most agent.py runs in one go",
        ),
        (
            ["--trials", "2", "--jobs", "1000"],
            "--jobs 1,000 is over 32, the most agent.py runs in one go: give at most 32\n",
        ),  # (no advice to split)
        (["--trials-budget-usd", "1"], "--trials-budget-usd needs --trials"),
        (
            ["--trials", "2", "--trials-budget-usd", "0"],
            "--trials-budget-usd must be a positive number",
        ),
        (
            ["--trials", "2", "--trials-budget-usd", "1", "-m", "my-local-model"],
            "--trials-budget-usd needs a known price, and my-local-model is not in the pricing table",
        ),
    ],
)
def test_a_trials_run_has_documented_bounds(capsys, workdir, flags, said):
    """A typo'd zero (--trials 1000000 --jobs 1000) is a usage error before anything is sent,
    not thousands of requests at once (newuser #56)."""
    client = FakeClient(reply(text("42")))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir), *flags], client)
    assert (code, out, client.requests) == (2, "", [])
    assert err.splitlines() == [f"agent.py: {err.splitlines()[0][10:]}"] and said in err


def test_the_trials_budget_bounds_the_whole_run(capsys, workdir, tmp_path):
    """--trials-budget-usd: once the trials have spent it, no more start; the summary records
    the budget, and stderr says how many did not start (newuser #56). Each trial here costs
    $0.000015 (haiku, the fakes' usage): a budget of $0.00004 lets three start."""
    path = tmp_path / "run.json"
    client = FakeClient(*[reply(text("42")) for _ in range(5)])
    code, _, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--trials",
            "5",
            "--trials-budget-usd",
            "0.00004",
            "--transcript",
            str(path),
        ],
        client,
    )
    summary = json.loads(path.read_text())
    assert code == 6 and len(client.requests) == 3
    assert (summary["requested"], summary["n"], summary["budget_usd"]) == (5, 3, 0.00004)
    assert summary["cost_usd"] == pytest.approx(0.000045)
    assert (
        "budget: the trials spent $0.000045 of the --trials-budget-usd $0.000040; the other "
        "2 trials did not start" in err
    )
    assert not (tmp_path / "run.4.json").exists()


def test_trials_need_open_files_and_say_so(workdir, tmp_path, agent_copy):
    """Each trial holds two files' directories open: where ulimit -n cannot give that, one
    line says so before anything is sent, not `internal error: Too many open files` after
    hundreds of trials ran."""
    import resource

    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))

    done = subprocess.run(
        [
            sys.executable,
            str(agent_copy),
            "q",
            "--workdir",
            str(workdir),
            "--trials",
            "1000",
            "--transcript",
            str(tmp_path / "run.json"),
        ],
        capture_output=True,
        text=True,
        env=agent_env(),
        cwd=tmp_path,
        preexec_fn=low,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "agent.py: --trials 1000 needs about 2256 open files, and this process "
        "may open 512 (ulimit -n): give fewer trials, or raise the limit\n"
    )


def test_the_approval_question_names_the_trial_that_asks(capsys, workdir):
    """With --trials, two identical questions could not be told apart: which trial got the y
    and which the n showed only in the result lines (newuser #12)."""
    code_ = "print('hi')"
    client = FakeClient(
        reply(tool_use("run_python", {"code": code_})),
        reply(text("a")),
        reply(tool_use("run_python", {"code": code_})),
        reply(text("b")),
    )
    code, _, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--trials", "2", "--no-sandbox"],
        client,
        stdin="y\nn\n",
    )
    assert code == 0, err
    heads = [line for line in err.splitlines() if "run_python wants to run" in line]
    assert heads == [
        "--- [trial 1] run_python wants to run 1 line ---",
        "--- [trial 2] run_python wants to run 1 line ---",
    ]
    assert "--- [trial 1] run it? [y/N] " in err and "--- [trial 2] run it? [y/N] " in err
    assert "[trial 1]   run_python" in err and "-> ok" in err


def test_a_failed_trial_says_which_condition_failed(capsys, workdir):
    """`0 passed, 3 failed` without a word of why meant opening the JSON (newuser #17)."""
    client = FakeClient(
        reply(text("42")), reply(text("99")), reply(text("99"), stop_reason="max_tokens")
    )
    code, _, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--trials",
            "3",
            "--expect",
            "99",
            "--expect-stop",
            "end_turn",
        ],
        client,
    )
    fails = [line for line in err.splitlines() if " fail: " in line]
    assert code == 6 and fails == [
        "[trial 1] fail: --expect '99' is not in the answer",
        "[trial 3] fail: --expect-stop end_turn, and it stopped with max_tokens",
    ], err
    client = FakeClient(reply(text("hi"), stop_reason="max_tokens"))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--trials", "1"], client)
    assert (
        "[trial 1] fail: it stopped with max_tokens, not end_turn (no --expect was given)"
        in err.splitlines()
    )


def test_an_expect_regex_that_backtracks_cannot_hang_the_run(capsys, workdir, monkeypatch):
    """`--expect '(a+)+$'` on an answer of 40 a's and a `!` ran for ten minutes at full CPU, and
    no Ctrl-C or SIGTERM could end it: `re` holds the GIL (newuser2 N41). The search is bounded;
    the trial fails, saying why, and the next one runs."""
    monkeypatch.setattr(agent, "EXPECT_SECONDS", 1.0)
    client = FakeClient(reply(text("a" * 40 + "!")), reply(text("aaa")))
    started = time.monotonic()
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--trials", "2", "--expect", "(a+)+$"], client
    )
    assert code == 6 and time.monotonic() - started < 10, err
    assert (
        "[trial 1] fail: --expect '(a+)+$' timed out after 1 s on an answer of 41 "
        "characters: the regex backtracks" in err.splitlines()
    )
    assert "trials: 2 of 2 ran: 1 passed, 1 failed" in err


BACKTRACKS = r"^(\w+\s?)+$"  # a realistic "the answer is words only" check (N41)
WORDY = "The average score of all the students in both classes is seventy nine point nine!"


def test_an_expect_regex_that_backtracks_fails_the_trial_in_bounded_time(
    request, workdir, agent_copy
):
    """N41 as the user met it, through the CLI: `^(\\w+\\s?)+$` on this answer backtracks for
    longer than anyone waits (before: still running after 15 minutes, Ctrl-C and SIGTERM
    ignored). The trial fails, saying why, after the time --expect is given (a run that waited
    on the match would outlast run_agent_py's timeout)."""
    api = serve(request, reply(text(WORDY)))
    done = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        "--trials",
        "1",
        "--no-keep",
        "--expect",
        BACKTRACKS,
        env=agent_env(api),
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert done.returncode == 6
    assert (
        f"[trial 1] fail: --expect '{BACKTRACKS}' timed out after "
        f"{agent.EXPECT_SECONDS:g} s on an answer of {len(WORDY)} characters: the regex "
        "backtracks"
    ) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_ends_a_run_while_expect_is_matched(request, workdir, agent_copy, signum):
    """N41: while the regex is matched, Ctrl-C and SIGTERM end the run, with its summary,
    before the match's own time is up (before: ignored; the match then timed out, and the run
    ended with exit 6, not 130)."""
    api = serve(request, reply(text(WORDY)))
    proc = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        "--trials",
        "1",
        "--no-keep",
        "--expect",
        BACKTRACKS,
        env=agent_env(api),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        background=True,
    )
    seen = ""
    while "stop: end_turn" not in seen and proc.poll() is None:
        seen += proc.stderr.readline()
    time.sleep(0.5)  # the match has begun
    proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=agent.EXPECT_SECONDS + 30)
    finally:
        proc.kill()
    assert proc.returncode == 130, seen + err
    assert "trials: " in err and "Traceback" not in err, err


@pytest.mark.parametrize("regex, shown", [("79\\.9$", "'79\\.9$'"), ("it's", "'it'\"'\"'s'")])
def test_a_failed_expect_is_shown_as_a_shell_takes_it(capsys, workdir, regex, shown):
    """The regex as the user typed it in single quotes, its backslash once: pasted back into a
    shell it is the same regex (a quote in it is closed, quoted and reopened)."""
    client = FakeClient(reply(text("80.0")))
    argv = ["q", "--workdir", str(workdir), "--trials", "1", "--expect", regex]
    code, _, err = run_cli(capsys, argv, client)
    assert code == 6 and f"[trial 1] fail: --expect {shown} is not in the answer" in err, err
    pasted = subprocess.run(["sh", "-c", f"printf %s {shown}"], capture_output=True, text=True)
    assert pasted.stdout == regex


class CountingStream:
    """A stderr that counts its writes and flushes."""

    def __init__(self):
        self.text, self.writes, self.flushes = "", 0, 0

    def write(self, text):
        self.writes += 1
        self.text += text

    def flush(self):
        self.flushes += 1

    def isatty(self):
        return False


def test_a_trials_streamed_text_is_written_a_line_at_a_time():
    """Review: a trial's reporter wrote (and flushed, under the lock every trial shares) on each
    streamed delta, even one with no newline: 1,001 writes for 1,000 words and a newline. It
    writes whole lines, each with the trial's prefix."""
    stream = CountingStream()
    reporter = agent.Reporter(stream=stream, trial=3)
    for _ in range(1000):
        reporter.text("word ")
    assert stream.writes == 0
    reporter.text("end\n")
    assert stream.writes == 1 and stream.text == "[trial 3] " + "word " * 1000 + "end\n"
