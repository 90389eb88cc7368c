"""Terminal output (Reporter, visible) and the CLI: flags, .env, make_client, main, subprocess."""

import io
import json
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeAPIError, FakeClient, alive, reply, text, tool_use
from helpers import (
    AGENT,
    DOTENV_PATH,
    Silent,
    agent_env,
    as_other_users,
    run_agent_py,
    run_cli,
    serve,
)

import agent

# --- the terminal shows the truth ---


def test_streamed_text_and_tool_output_reach_the_terminal_escaped(capsys, workdir):
    osc52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"
    client = FakeClient(
        reply(
            text(f"copy this {osc52}\x1b[2J"), tool_use("read_file", {"path": "no\x1b[31mred.txt"})
        ),
        reply(text("done")),
    )
    _, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert "\x1b" not in err and "\x07" not in err
    assert "\\x1b]52;c;" in err and "\\x1b[2J" in err


def on_a_terminal(api, agent_copy, workdir, **env):
    """agent.py run as a user runs it, its stderr on a terminal (a pty); what it drew there."""
    import pty

    main, screen = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, str(agent_copy), "q", "--workdir", str(workdir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=screen,
        env=agent_env(api, **env),
    )
    os.close(screen)
    drawn = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the last holder of the terminal is gone
            break
        if not chunk:
            break
        drawn += chunk
    os.close(main)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, drawn
    return drawn.decode().replace("\r\n", "\n"), out.decode()


DIM, PLAIN = "\x1b[2m", "\x1b[22m"


def test_on_a_terminal_agent_py_s_own_lines_are_dim_and_the_models_text_is_not(
    request, workdir, agent_copy
):
    script = (
        reply(text("Let me count."), tool_use("run_python", {"code": "print(6 * 7)"})),
        reply(text("The answer is 42.")),
    )
    drawn, out = on_a_terminal(serve(request, *script), agent_copy, workdir)
    assert out == "The answer is 42.\n"
    assert f"{DIM}turn 1: tool_use · " in drawn and f"{DIM}stop: end_turn (" in drawn
    assert f"{DIM}--- run_python wants to run 1 line ---{PLAIN}\n   1│ print(6 * 7)\n" in drawn
    assert f"{DIM}--- run it? [y/N] {PLAIN}" in drawn
    for said in ("Let me count.", "The answer is 42.", "   1│ print(6 * 7)"):  # plain, as written
        before = drawn[: drawn.index(said)]
        assert before.count(DIM) == before.count(PLAIN), said  # no dim line left open
    for line in drawn.splitlines():  # every dim line ends plain: nothing leaks past it
        assert line.count(DIM) == line.count(PLAIN), line
    drawn, _ = on_a_terminal(serve(request, *script), agent_copy, workdir, NO_COLOR="1")
    assert "turn 1: tool_use" in drawn and "\x1b" not in drawn
    piped = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        env=agent_env(serve(request, *script)),
        stdin=subprocess.DEVNULL,
        timeout=60,
    )  # not a terminal: plain
    assert "turn 1: tool_use" in piped.stderr and "\x1b" not in piped.stderr


def test_progress_is_cut_at_a_word_with_an_ellipsis_and_counts_turns_in_words(capsys, workdir):
    long_code = "print('" + "word " * 60 + "')"
    client = FakeClient(reply(tool_use("run_python", {"code": long_code})), reply(text("ok")))
    _, _, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--yes", "--no-sandbox", "--model", "claude-next-9"],
        client,
    )
    line = next(l for l in err.splitlines() if l.startswith("  run_python"))
    assert "word…" in line or "word …" in line.replace("word …", "word…")
    assert "2 turns" in err and "cost unknown" in err and "$0.000000" not in err
    assert agent.shorten("alpha beta gamma delta", 15) == "alpha beta…"
    client = FakeClient(reply(text("42")))
    _, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert "; 1 turn," in err


# --- flags ---


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["q", "--max-turns", "0"], "--max-turns must be at least 1"),
        (["q", "--workdir", "/no/such/dir"], "agent.py: --workdir /no/such/dir does not exist\n"),
        (
            ["q", "--workdir", "/etc/hostname"],
            "agent.py: --workdir /etc/hostname is not a directory\n",
        ),
        (
            ["q", "--workdir", "~/data"],
            "does not exist; a ~ in quotes is not your home directory: "
            "leave it unquoted, or write $HOME\n",
        ),
        (["q", "--frobnicate"], "unrecognized arguments"),
        (["q", "--effort", "extreme"], "invalid choice"),
        ([], "give a question"),
        (["q", "--budget-usd", "1", "--model", "gpt-7"], "not in the pricing table"),
        (["q", "--transcript", "/no/such/dir/run.json"], "does not exist"),
        (["q", "--expect", "("], "not a valid regex"),
        (["q", "--decline-message", " "], "must not be empty"),
        (["q", "--expect", "x"], "need --trials"),
        (["q", "--jobs", "2"], "--jobs needs --trials"),
        (["q", "-o", "x.html"], "goes with --report"),
        (["-o", "x.html"], "goes with --report"),  # the flag's mistake, even with no question
        (["q", "--no"], "unrecognized arguments: --no"),  # no abbreviation of --no-sandbox
        (["q", "--max-turn", "3"], "unrecognized arguments: --max-turn"),
        (["q", "--report", "run.json"], "takes no question"),
        (["q", "--schema", "transcript"], "takes no question"),
        (["q", "--export", "atif", "run.json"], "takes no question"),
        (["--export", "otlp", "run.json"], "one format, atif"),
        (["--replay", "run.json", "q"], "give it no question"),
        (
            ["q", "--model", ""],
            "agent.py: --model is empty (an unset shell variable, as in -m "
            '"$MODEL"?): give a model id, or leave -m out for the default\n',
        ),
        (["q", "-m", " "], "agent.py: --model is empty"),
        (
            ["--", "-5 degrees?", "-C", "w", "--yes"],
            "agent.py: unrecognized arguments: -C w --yes; "
            "options go before --, after which every word is the question's\n",
        ),
        (
            ["q", "-C", "workspace", "-C", "/tmp/ws"],
            "agent.py: -C/--workdir was given twice (workspace, then /tmp/ws): give it once\n",
        ),  # newuser #40: the last one silently won
        (
            ["q", "--transcript", "a.json", "--transcript=b.json"],
            "agent.py: --transcript was given twice (a.json, then b.json): give it once\n",
        ),
        (
            ["q", "-s", "Be brief."],
            "agent.py: --system-prompt takes a FILE, and there is no file "
            "'Be brief.' (llm's -s and claude's --system-prompt take the text itself; here, put it in a "
            "file)\n",
        ),  # newuser2 N1
        (
            ["-c", "and the median?"],
            "agent.py: unrecognized arguments: -c (did you mean -C? to go "
            "on with the last run, as claude -c and llm -c do: --resume last)\n",
        ),  # newuser2 N2
        (
            ["-p", "q"],
            "agent.py: unrecognized arguments: -p (no -p is needed: the question is the "
            "argument, and the answer goes to stdout)\n",
        ),
        (
            ["q", "--max-steps", "3"],
            "agent.py: unrecognized arguments: --max-steps (did you mean --max-turns?)\n",
        ),
        (
            ["help"],
            "agent.py: a question of one word, 'help': did you mean --help? (to ask it, give "
            "more words)\n",
        ),  # newuser #61
        (["version"], "did you mean --version?"),
        (
            ["q", "--cost-limit", "1"],
            "agent.py: unrecognized arguments: --cost-limit (did you mean --budget-usd?)\n",
        ),  # newuser2 N23: mini-swe-agent's
        (
            ["-t", "q"],
            "agent.py: unrecognized arguments: -t (no -t is needed: the question is the "
            "argument)\n",
        ),
        (
            ["q", "-o", "ans.txt"],
            "agent.py: -o/--output goes with --report or --export (the answer "
            "goes to stdout: > ans.txt; the transcript: --transcript FILE)\n",
        ),
        (
            ["-r"],
            "agent.py: argument -r/--resume: expected one argument (last: the newest kept run; "
            "or a run id, or a transcript's path) (see --help)\n",
        ),
        (
            ["q", "--transcript", ""],
            "agent.py: --transcript is empty (an unset shell variable, as in "
            '--transcript "$OUT"?): give a path\n',
        ),  # newuser2 N11: it silently meant none
        (["q", "--events", ""], "agent.py: --events is empty"),  # it meant the current directory
        (["--report", "RUN", "-o", ""], "agent.py: -o/--output is empty"),  # newuser #53
        (["q", "-C", ""], "agent.py: -C/--workdir is empty"),
        (
            ["--report", "-"],
            "agent.py: --report reads a file, not stdin: give the path of a "
            "transcript or summary (or last)\n",
        ),  # newuser #53
    ],
)
def test_usage_errors_exit_2_with_one_line_and_send_nothing(capsys, argv, fragment):
    client = FakeClient()
    code, out, err = run_cli(capsys, argv, client)
    assert (code, out, client.requests) == (2, "", []) and fragment in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "flag, seconds", [("--tool-timeout", "1e19"), ("--request-timeout", "1e10")]
)
def test_a_timeout_no_clock_can_hold_is_one_usage_line(
    request, workdir, tmp_path, agent_copy, flag, seconds
):
    """A timeout larger than the clocks agent.py waits on can hold (red-team F15). Before,
    --tool-timeout 1e19 was taken, and every run_python call then failed with 'could not
    start the sandboxed interpreter' (the CPU limit overflowed), --no-sandbox or not; and
    --request-timeout 1e10 made every request a 'Connection error' (the socket's timeout
    overflowed): 5 attempts, then exit 1, the server blamed. Now it is one usage line, exit 2,
    and nothing is sent."""
    api = serve(
        request, reply(tool_use("run_python", {"code": "print('ran')"})), reply(text("done"))
    )
    done = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        "--yes",
        "--no-sandbox",
        "--no-keep",
        flag,
        seconds,
        env=agent_env(api),
        cwd=tmp_path,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert (done.returncode, api.requests) == (2, []), done.stderr
    assert done.stderr == f"agent.py: {flag} must be at most 1,000,000,000 seconds\n"


def test_help_names_the_stop_labels_what_passes_a_trial_and_that_resume_rewrites_its_file(capsys):
    code, out, _ = run_cli(capsys, ["--help"])

    def help_of(flag):  # the flag's own entry in its group: its lines, up to the next flag's
        lines = out.splitlines()
        first = next(
            i
            for i, line in enumerate(lines)
            if line.startswith("  -") and re.match(rf"(-\w \S+, )?{flag}\b", line.strip())
        )
        rest = next(
            i
            for i in range(first + 1, len(lines) + 1)
            if i == len(lines) or not lines[i].strip() or lines[i].startswith("  -")
        )
        return " ".join(" ".join(lines[first:rest]).split())

    assert code == 0
    assert all(label in help_of("--expect-stop") for label in agent.EXIT_CODES), help_of(
        "--expect-stop"
    )
    assert (
        "with no --expect, --expect-tool or --expect-stop, a trial passes if it stopped with "
        "end_turn" in help_of("--trials")
    )
    assert "rewrites PATH" in help_of("--resume") and "--transcript" in help_of("--resume")


def test_an_endless_question_on_stdin_is_one_usage_line(request, workdir, tmp_path, agent_copy):
    """`agent.py - < /dev/zero` (or `yes | agent.py -`): the question was read whole, however
    long, so memory grew until the kernel or the allocator stopped it (red-team F20; here
    under a 1 GiB address-space limit, an internal error with a MemoryError). Now at most
    32 MiB, the most the API takes in one request, is read: past that, one usage line,
    exit 2, nothing sent."""
    import resource

    api = serve(request)
    with open("/dev/zero", "rb") as endless:
        done = run_agent_py(
            agent_copy,
            "-",
            "--workdir",
            workdir,
            "--no-keep",
            env=agent_env(api),
            cwd=tmp_path,
            timeout=120,
            stdin=endless,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)),
        )
    assert (done.returncode, api.requests) == (2, []), done.stderr[-300:]
    assert done.stderr == (
        "agent.py: the question on stdin is over 32 MiB, more than the API takes in one request\n"
    )


def test_a_dash_question_is_read_from_stdin_and_an_empty_one_refused(capsys, workdir):
    client = FakeClient(reply(text("4")))
    code, out, _ = run_cli(
        capsys, ["-", "--workdir", str(workdir)], client, stdin="  what is 2 + 2?\n"
    )
    assert (code, out) == (0, "4\n")
    assert client.requests[0]["messages"][0]["content"][0]["text"] == "what is 2 + 2?"
    client = FakeClient()
    code, out, err = run_cli(capsys, ["-", "--workdir", str(workdir)], client, stdin="\n")
    assert (code, out, client.requests) == (2, "", []) and "stdin held none" in err


@pytest.mark.parametrize("how", ["argument", "stdin"])
def test_a_question_that_is_not_utf8_is_a_usage_error_before_anything_is_sent(capsys, workdir, how):
    """Python hands such an argument over with a lone surrogate (\\udce9 for byte 0xe9): it
    must not be sent, nor recorded as text that is not Unicode."""
    client = FakeClient(reply(text("never")))
    argv, stdin = (
        (["caf\udce9 ?"], "")
        if how == "argument"
        else (["-"], io.TextIOWrapper(io.BytesIO(b"caf\xe9 ?\n"), encoding="utf-8"))
    )
    code, out, err = run_cli(capsys, argv + ["--workdir", str(workdir)], client, stdin=stdin)
    assert (code, out, client.requests) == (2, "", [])
    assert err == (
        f"agent.py: the question{' on stdin' * (how == 'stdin')} is not valid UTF-8: "
        "byte 0xe9 after 'caf'; give it as UTF-8 text (iconv -t UTF-8 converts a "
        "file)\n"
    ), err


def test_a_question_that_is_not_utf8_is_refused_as_a_user_gives_it(
    request, workdir, tmp_path, agent_copy
):
    api = serve(request)
    for argv, given in (([b"caf\xe9 ?"], None), (["-"], b"caf\xe9 ?\n")):
        done = subprocess.run(
            [
                sys.executable,
                str(agent_copy),
                *argv,
                "--workdir",
                str(workdir),
                "--transcript",
                str(tmp_path / "run.json"),
                "--events",
                str(tmp_path / "events.jsonl"),
            ],
            input=given or b"",
            capture_output=True,
            env=agent_env(api),
            timeout=60,
        )
        assert done.returncode == 2 and b"not valid UTF-8" in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1 and done.stdout == b""
    assert api.requests == [] and not (tmp_path / "run.json").exists()


def test_count_tokens_without_a_question_says_what_it_counted(capsys):
    client = FakeClient()
    code, out, err = run_cli(capsys, ["--count-tokens"], client)
    assert code == 0 and f"for {agent.EXAMPLE_QUESTION!r}" in out
    assert f"counting the example {agent.EXAMPLE_QUESTION!r}" in err
    assert client.counted[0]["messages"][0]["content"][0]["text"] == agent.EXAMPLE_QUESTION
    code, out, err = run_cli(capsys, ["--count-tokens", "q"], client)
    assert code == 0 and "for 'q'" in out and "example" not in err


@pytest.mark.parametrize(
    "flags",
    [
        ["--replay", "run.json"],
        ["--resume", "run.json"],
        ["--trials", "3"],
        ["--transcript", "t.json"],
        ["--events", "e.jsonl"],
        ["--report", "run.json"],
        ["--export", "atif", "run.json"],
        ["--schema", "transcript"],
    ],
)
def test_count_tokens_with_a_flag_it_would_ignore_is_a_usage_error(capsys, flags):
    """--count-tokens --replay used to count the example question through the server (which
    --replay promises never to contact) and ignore the replay; --trials, --transcript ... were
    ignored without a word."""
    client = FakeClient()
    code, out, err = run_cli(capsys, ["--count-tokens", *flags], client)
    assert (code, out, client.requests, client.counted) == (2, "", [], []), err
    assert (
        err == f"agent.py: --count-tokens cannot be combined with {flags[0]}: it counts a "
        "question's tokens and runs nothing; give one of them\n"
    )


@pytest.mark.parametrize(
    "answer",
    [
        {"input_tokens": "\x1b[2J5"},
        {},
        {"input_tokens": None},
        {"input_tokens": 1e308},
        {"input_tokens": True},
        FakeAPIError(401, "authentication_error", "invalid x-api-key"),
    ],
)
def test_count_tokens_says_in_one_line_when_the_server_gives_no_count(capsys, monkeypatch, answer):
    client = FakeClient()

    def count_tokens(**request):
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(**answer)

    monkeypatch.setattr(client, "count_tokens", count_tokens)
    code, out, err = run_cli(capsys, ["--count-tokens", "q"], client)
    assert (code, out) == (1, "") and len(err.strip().splitlines()) == 1, err
    assert err.startswith("agent.py: --count-tokens: ") and "internal error" not in err
    assert "\x1b" not in err
    assert ("api_error" if isinstance(answer, Exception) else "no token count") in err


def test_quiet_silences_the_sandbox_line_too(capsys, workdir):
    for quiet in (False, True):
        client = FakeClient(
            reply(tool_use("run_python", {"code": "print(6 * 7)"})), reply(text("42"))
        )
        code, out, err = run_cli(
            capsys,
            ["q", "--workdir", str(workdir), "--yes", "--no-sandbox"] + ["--quiet"] * quiet,
            client,
        )
        assert (code, out) == (0, "42\n")
        assert ("sandbox: off" in err) is not quiet, err


def test_every_line_of_a_trial_carries_its_number(capsys, workdir):
    client = FakeClient(
        reply(tool_use("read_file", {"path": "notes.md"})), reply(text("a\nb")), reply(text("c"))
    )
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--trials", "2"], client)
    assert code == 0
    lines = [l for l in err.splitlines() if l.strip()]
    summary = next(i for i, l in enumerate(lines) if l.startswith("trials: "))
    assert all(l.startswith(("[trial 1] ", "[trial 2] ")) for l in lines[:summary]), lines
    assert {l[:9] for l in lines[:summary]} == {"[trial 1]", "[trial 2]"}


def test_an_events_path_error_comes_before_the_sdk_is_imported(tmp_path, workdir, agent_copy):
    done = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        "--events",
        tmp_path / "no" / "such" / "e.jsonl",
        flags=("-X", "importtime"),
        env=agent_env(ANTHROPIC_API_KEY="test-key"),
        timeout=60,
    )
    assert done.returncode == 2 and "does not exist" in done.stderr
    assert "| anthropic" not in done.stderr  # -X importtime lists every module imported


@pytest.mark.parametrize("where", ["agent", "prefix", "root"])
def test_a_workdir_holding_the_harness_is_refused(capsys, where):
    workdir = {"agent": Path(agent.__file__).parent, "prefix": Path(sys.prefix), "root": "/"}[where]
    client = FakeClient()
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, client.requests) == (2, []) and "a workdir must be" in err and "-C" in err


@pytest.mark.parametrize("given", ["/", ".", "/no/such/dir"])
def test_a_refused_workdir_is_named_once(capsys, given, monkeypatch):
    monkeypatch.chdir(Path(agent.__file__).parent)  # "." holds agent.py
    client = FakeClient()
    code, _, err = run_cli(capsys, ["q", "--workdir", given], client)
    if code != 2:  # a container's / may be allowed: then nothing to say
        assert given == "/"
        return
    real = os.path.realpath(given)
    shown = f"--workdir {given}" + ("" if real == given else f" ({real})")
    assert err.startswith(f"agent.py: {shown} ") and f"{given}, {given}," not in err, err


def test_a_workdir_holding_pythons_user_site_is_refused(capsys, tmp_path, monkeypatch):
    """A script writing ~/.local/lib/python3.X/site-packages/x.pth would run, unsandboxed, in
    every later Python: it could set ANTHROPIC_BASE_URL for the next run of agent.py."""
    import site

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setattr(site, "USER_BASE", str(home / ".local"))  # not made yet: not on sys.path
    client = FakeClient(reply(tool_use("run_python", {"code": "print(1)"})), reply(text("ok")))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(home), "--yes"], client)
    assert (code, client.requests) == (2, [])
    assert "Python's user base" in err and ".pth" in err and str(home / ".local") in err


# --- a workdir never holds what runs agent.py next time (N44, N46, N47) ---


def attack_writes(path):
    """A run_python script that plants `path` (absolute) and says so."""
    return (
        f"import os\np = {str(path)!r}\nos.makedirs(os.path.dirname(p), exist_ok=True)\n"
        "open(p, 'a').write('# planted by the model\\n')\nprint('planted', p)"
    )


def refused_once(code, err, client):
    """The refusal the user sees: one line, exit 2, nothing sent."""
    assert (code, client.requests) == (2, []), err
    assert err.startswith("agent.py: ") and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(
    "kind",
    [
        "/etc",
        "a directory inside /etc",
        "/usr/lib",
        "/usr",
        "/usr/local/bin",
        "a directory on PATH",
        "a directory holding one on PATH",
        "LD_LIBRARY_PATH",
        "the home directory",
    ],
)
def test_a_workdir_holding_what_runs_the_next_run_is_refused(capsys, tmp_path, monkeypatch, kind):
    """The attack of N44: the sandbox lets the model's code write anywhere in the workdir, and
    the kernel lets root (and a user, in its own ~/bin) write there: ld.so.preload in /etc, a
    library in a directory the loader searches, a python3 early on PATH, a ~/.profile would run,
    unsandboxed and with the key, in the next agent.py. Each is planted by the script the run
    would approve; refused up front, nothing is sent and nothing planted."""
    probe = f".agent-test-probe-{os.getpid()}-{time.monotonic_ns()}"
    mine = tmp_path / "mine"
    if kind == "/etc":
        workdir, planted = Path("/etc"), Path("/etc") / probe
    elif kind == "a directory inside /etc":
        workdir = next(
            Path(e.path)
            for e in sorted(os.scandir("/etc"), key=lambda e: e.name)
            if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
        )
        planted = workdir / probe
    elif kind in ("/usr/lib", "/usr", "/usr/local/bin"):
        workdir, planted = Path(kind), Path(kind) / probe
    elif kind == "LD_LIBRARY_PATH":
        monkeypatch.setenv("LD_LIBRARY_PATH", str(mine / "lib"))
        workdir, planted = mine, mine / "lib" / "libc.so.6"
    elif kind == "the home directory":
        monkeypatch.setenv("HOME", str(mine))
        monkeypatch.setenv("PYTHONUSERBASE", str(tmp_path / "userbase"))
        import site

        monkeypatch.setattr(site, "USER_BASE", str(tmp_path / "userbase"))
        monkeypatch.setattr(site, "USER_SITE", str(tmp_path / "userbase" / "site"))
        workdir, planted = mine, mine / ".profile"
    else:  # ~/bin first on PATH, as Debian's ~/.profile puts it
        monkeypatch.setenv("PATH", f"{mine / 'bin'}:{os.environ['PATH']}")
        workdir = mine / "bin" if kind == "a directory on PATH" else mine
        planted = mine / "bin" / "python3"
    (mine / "bin").mkdir(parents=True)
    if not workdir.is_dir():
        pytest.skip(f"no {workdir} here")
    client = FakeClient(
        reply(tool_use("run_python", {"code": attack_writes(planted)})), reply(text("ok"))
    )
    try:
        code, _, err = run_cli(
            capsys, ["q", "--workdir", str(workdir), "--yes", "--no-keep"], client
        )
        assert not planted.exists(), f"the model's code planted {planted}"
    finally:
        if str(planted).startswith(("/etc/", "/usr/")) and planted.exists():
            planted.unlink()
    refused_once(code, err, client)
    assert f"--workdir {workdir} " in err and "next run" in err, err


@pytest.mark.parametrize("linked", ["agent.py", "its .env"])
def test_a_hard_link_to_agent_py_or_its_dotenv_in_the_workdir_is_refused(
    capsys, tmp_path, monkeypatch, linked
):
    """The attack of N46: a hard-link snapshot (cp -al, rsync --link-dest) of the checkout in
    the workdir is agent.py (or its .env) under another name: Landlock allows the write, since
    the path is in the workdir. Refused up front; agent.py's bytes are unchanged."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy(AGENT, checkout / "agent.py")
    (checkout / ".env").write_text("ANTHROPIC_MODEL=claude-haiku-5-5\n")
    monkeypatch.setattr(agent, "__file__", str(checkout / "agent.py"))
    monkeypatch.setattr(agent, "dotenv_path", lambda: checkout / ".env")
    victim = checkout / ("agent.py" if linked == "agent.py" else ".env")
    before = victim.read_bytes()
    workdir = tmp_path / "snapshot" / "deep"
    workdir.mkdir(parents=True)
    os.link(victim, workdir / "tool.py")
    client = FakeClient(
        reply(tool_use("run_python", {"code": attack_writes(workdir / "tool.py")})),
        reply(text("ok")),
    )
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(tmp_path / "snapshot"), "--yes", "--no-keep"], client
    )
    assert victim.read_bytes() == before, "the model's code rewrote it through the hard link"
    refused_once(code, err, client)
    assert str(workdir / "tool.py") in err and "hard link" in err, err


@pytest.mark.parametrize("mounted", ["as the workdir", "under the workdir"])
def test_the_checkout_bind_mounted_as_or_under_the_workdir_is_refused(
    request, tmp_path, agent_copy, mounted
):
    """The attack of N47: the checkout reached through a bind mount (a container mounting one
    host directory at two paths) is the same directory under another path. Performed in a
    private mount namespace: the script appends to agent.py through the mount."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) to make a private mount namespace")
    workdir = tmp_path / "data"
    mount_point = workdir if mounted == "as the workdir" else workdir / "app"
    mount_point.mkdir(parents=True)
    before = agent_copy.read_bytes()
    api = serve(
        request,
        reply(tool_use("run_python", {"code": attack_writes(mount_point / "agent.py")})),
        reply(text("ok")),
    )
    script = 'mount --make-rprivate / && mount --bind "$1" "$2" && shift 2 && exec "$@"'
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "sh",
            "-c",
            script,
            "sh",
            str(agent_copy.parent),
            str(mount_point),
            sys.executable,
            str(agent_copy),
            "q",
            "--workdir",
            str(workdir),
            "--yes",
            "--no-keep",
        ],
        capture_output=True,
        text=True,
        env=agent_env(api),
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    if "mount" in done.stderr and done.returncode not in (0, 2):
        pytest.skip(f"no bind mount here: {done.stderr.strip()}")
    assert agent_copy.read_bytes() == before, "the model's code rewrote agent.py through the mount"
    assert done.returncode == 2 and api.requests == [], done.stderr
    assert done.stderr.startswith("agent.py: --workdir ") and len(done.stderr.splitlines()) == 1
    assert "agent.py" in done.stderr and "mount" in done.stderr, done.stderr


# --- what a task harness needs: its own system prompt, a container's workdir, the version ---


def test_system_prompt_file_is_sent_recorded_and_counted(capsys, workdir, tmp_path):
    prompt = tmp_path / "task-prompt.txt"
    prompt.write_text("You solve terminal tasks.\n解决任务，然后写下答案。\n")
    transcript = tmp_path / "run.json"
    client = FakeClient(reply(text("ok")), reply(text("a")), reply(text("b")))
    code, out, _ = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--system-prompt",
            str(prompt),
            "--transcript",
            str(transcript),
        ],
        client,
    )
    assert (code, out) == (0, "ok\n")
    assert client.requests[0]["system"] == prompt.read_text()
    assert json.loads(transcript.read_text())["system"] == prompt.read_text()
    code, _, _ = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--system-prompt", str(prompt), "--trials", "2"],
        client,
    )  # every trial gets it
    assert code == 0 and [r["system"] for r in client.requests[1:]] == [prompt.read_text()] * 2
    code, out, _ = run_cli(capsys, ["--count-tokens", "q", "--system-prompt", str(prompt)], client)
    assert code == 0 and client.counted[-1]["system"] == prompt.read_text()
    code, _, err = run_cli(
        capsys, ["--replay", str(transcript), "--system-prompt", str(prompt)], client
    )
    assert code == 2 and "--system-prompt" in err and len(client.requests) == 3


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "not utf-8", "empty", "huge"])
def test_a_system_prompt_file_that_cannot_be_read_is_one_usage_line(
    capsys, workdir, tmp_path, kind
):
    path = tmp_path / "prompt.txt"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # no writer: an open that waits for one would hang the run
    elif kind == "not utf-8":
        path.write_bytes(b"caf\xe9 au lait")
    elif kind == "empty":
        path.write_text(" \n")
    elif kind == "huge":
        path.write_text("x" * (agent.MAX_SYSTEM_PROMPT + 1))
    client = FakeClient(reply(text("never")))
    code, out, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--system-prompt", str(path)], client
    )
    assert (code, out, client.requests) == (2, "", [])
    assert len(err.strip().splitlines()) == 1 and err.startswith(
        f"agent.py: --system-prompt {path}"
    )
    assert "Traceback" not in err


def test_version_prints_one_line_without_importing_the_sdk(agent_copy):
    done = run_agent_py(
        agent_copy, "--version", flags=("-X", "importtime"), env=agent_env(), timeout=30
    )
    assert done.returncode == 0 and done.stdout == f"agent.py {agent.AGENT_VERSION}\n"
    assert "| anthropic" not in done.stderr  # -X importtime lists every module imported


def test_a_containers_root_is_a_workdir_once_the_sandbox_is_off(capsys, tmp_path):
    """In a throwaway container a task works in /, which holds agent.py and its Python. With the
    sandbox on, / stays refused: the model's code could write anywhere in it. With --no-sandbox
    its code can write wherever agent.py can, whatever the workdir: refusing / protects nothing."""
    transcript = tmp_path / "run.json"
    script = "import os; print(sorted(os.listdir('.'))[:3], os.getcwd())"
    client = FakeClient(
        reply(
            tool_use("read_file", {"path": str(tmp_path / "note.txt")[1:]}),
            tool_use("run_python", {"code": script}),
        ),
        reply(text("done")),
    )
    (tmp_path / "note.txt").write_text("a task file\n")
    code, out, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            "/",
            "--no-sandbox",
            "--yes",
            "--transcript",
            str(transcript),
            "--events",
            str(tmp_path / "events.jsonl"),
        ],
        client,
    )
    assert (code, out) == (0, "done\n"), err
    results = client.requests[1]["messages"][-1]["content"]
    assert "a task file" in results[0]["content"] and "] /" in results[1]["content"]
    assert json.loads(transcript.read_text())["workdir"] == "/"
    client = FakeClient()
    code, _, err = run_cli(capsys, ["q", "--workdir", "/", "--yes"], client)  # sandbox on
    assert (code, client.requests) == (2, []) and "a workdir must" in err and "--no-sandbox" in err


# --- the conventions of the tools people know: short forms, quoting ---

SHORT_FORMS = {
    "-C": "--workdir",
    "-m": "--model",
    "-y": "--yes",
    "-r": "--resume",
    "-s": "--system-prompt",
    "-q": "--quiet",
    "-V": "--version",
}


def test_short_forms_do_what_the_long_ones_do(capsys, workdir, tmp_path):
    """codex exec's -C and -m, llm's -m and -s, claude's -r, and the -y, -q and -V of every
    tool: each the same as its long flag, and named in --help and README."""
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Be brief.")
    path = tmp_path / "run.json"
    client = FakeClient(reply(tool_use("run_python", {"code": "print(6 * 7)"})), reply(text("42")))
    code, out, err = run_cli(
        capsys,
        [
            "q",
            "-C",
            str(workdir),
            "-m",
            "claude-sonnet-5-5",
            "-y",
            "-q",
            "-s",
            str(prompt),
            "--no-sandbox",
            "--transcript",
            str(path),
        ],
        client,
    )
    assert (code, out, err) == (0, "42\n", "")  # -q: nothing on stderr; -y: nothing asked
    request = client.requests[0]
    assert (request["model"], request["system"]) == ("claude-sonnet-5-5", "Be brief.")
    assert json.loads(path.read_text())["workdir"] == str(workdir)
    client = FakeClient(reply(text("more")))
    code, out, _ = run_cli(
        capsys,
        [
            "-r",
            str(path),
            "go on",
            "-C",
            str(workdir),
            "-s",
            str(prompt),
            "-m",
            "claude-sonnet-5-5",
        ],
        client,
    )
    assert (code, out) == (0, "more\n") and len(client.requests[0]["messages"]) == 5
    code, out, _ = run_cli(capsys, ["-V"], FakeClient())
    assert (code, out) == (0, f"agent.py {agent.AGENT_VERSION}\n")
    code, shown, _ = run_cli(capsys, ["--help"], FakeClient())
    readme = (AGENT.parent / "README.md").read_text()
    for short, long in SHORT_FORMS.items():
        assert re.search(rf"^  {short}( [A-Z]+)?, {long}\b", shown, re.M), (short, long)
        assert f"`{short}/{long}" in readme, (short, long)
    code, _, err = run_cli(capsys, ["q", "--work", str(workdir)], FakeClient())  # long: never
    assert code == 2 and "unrecognized arguments: --work" in err  # abbreviated


@pytest.mark.parametrize(
    "argv, quoted",
    [
        (["what", "is", "the", "average?", "--workdir", "w"], "'what is the average?'"),
        (["--workdir", "w", "scores.csv", "里平均分是多少？"], "'scores.csv 里平均分是多少？'"),
        (["--resume", "run.json", "and", "the", "median"], "'and the median'"),
    ],
)
def test_an_unquoted_question_gets_one_line_saying_to_quote_it(capsys, argv, quoted):
    client = FakeClient()
    code, out, err = run_cli(capsys, argv, client)
    assert (code, out, client.requests) == (2, "", [])
    assert len(err.strip().splitlines()) == 1 and "unrecognized arguments:" in err
    assert f"a question of several words goes in quotes: agent.py {quoted}" in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["q"],
        ["--replay", "RECORDED", "--yes"],
        ["--replay", "RECORDED", "--yes", "--workdir", "WORKDIR"],
    ],
)
def test_a_current_directory_removed_meanwhile_is_one_usage_line(
    tmp_path, workdir, agent_copy, argv
):
    """Run from a directory that was removed (rmdir from another shell): it used to end as
    'internal error: FileNotFoundError', exit 1, the label of a bug in agent.py."""
    recorded = Path(agent.__file__).parent / "workspace" / "example-run.json"
    argv = [
        str(recorded) if a == "RECORDED" else str(workdir) if a == "WORKDIR" else a for a in argv
    ]
    gone = tmp_path / "gone"
    done = subprocess.run(
        [
            "sh",
            "-c",
            'mkdir "$0" && cd "$0" && rmdir "$0" && exec "$@"',
            str(gone),
            sys.executable,
            str(agent_copy),
            *argv,
            "--no-keep",
        ],
        capture_output=True,
        text=True,
        env=agent_env(ANTHROPIC_API_KEY="test-key"),
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert (
        done.stderr == "agent.py: the current directory no longer exists (it was removed): cd "
        "to one that does\n"
    )


def closed(stream, *argv, **kwargs):
    """agent.py run as `agent.py ARGS <&-` or `>&-`: with that stream closed."""
    return subprocess.run(
        ["sh", "-c", f'exec "$@" {stream}&-', "sh", sys.executable, *map(str, argv)],
        capture_output=stream == "<",
        text=True,
        timeout=60,
        **kwargs,
    )


def test_a_closed_stdin_or_stdout_is_one_line_not_an_internal_error(
    request, workdir, tmp_path, agent_copy
):
    """`agent.py - <&-` ended as `internal error: AttributeError: 'NoneType' object has no
    attribute 'read'`, `>&-` as `... no attribute 'isatty'`."""
    api = serve(request, reply(text("42")))
    done = closed("<", agent_copy, "-", "--workdir", workdir, env=agent_env(api))
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == "agent.py: the question is - but stdin held none\n"
    err = tmp_path / "err.txt"
    with open(err, "w") as stderr:
        done = closed(">", agent_copy, "q", "--workdir", workdir, env=agent_env(api), stderr=stderr)
    assert done.returncode == 2 and err.read_text() == (
        "agent.py: stdout is closed: nowhere to write the answer (give > FILE, or > /dev/null)\n"
    )
    assert api.requests == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize(
    "argv",
    [["q"], ["--report", "RECORDED", "-o", "-"], ["--report", "RECORDED", "-o", "/dev/full"]],
)
def test_a_full_stdout_or_device_is_one_line_exit_1(request, workdir, agent_copy, argv):
    """`> /dev/full` ended as `internal error: OSError: [Errno 28] No space left on device`."""
    recorded = Path(agent.__file__).parent / "workspace" / "example-run.json"
    argv = [str(recorded) if a == "RECORDED" else a for a in argv]
    api = serve(request, *[reply(text("42"))] * (argv == ["q"]))
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [
                sys.executable,
                str(agent_copy),
                *argv,
                *["--workdir", str(workdir)] * (argv == ["q"]),
            ],
            env=agent_env(api),
            timeout=60,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert done.returncode == 1, done.stderr
    where = "/dev/full" if "/dev/full" in argv else "stdout"
    assert (
        f"agent.py: cannot write to {where}: No space left on device" in done.stderr.splitlines()
        and "internal error" not in done.stderr
    ), done.stderr
    kept = [line for line in done.stderr.splitlines() if line.startswith("kept: ")]
    assert len(kept) == (argv == ["q"]), done.stderr  # said once, not again after the error


# --- .env and config ---


@pytest.fixture
def beside(tmp_path, monkeypatch):
    """The directory agent.py (as far as load_config knows) sits in, with the real .env lookup."""
    home = tmp_path / "agent"
    home.mkdir()
    monkeypatch.setattr(agent, "dotenv_path", DOTENV_PATH)
    monkeypatch.setattr(agent, "__file__", str(home / "agent.py"))
    return home


def notes_of(report):
    notes = []
    report.error = notes.append
    return notes


def test_the_dotenv_beside_agent_py_is_read_and_the_environment_wins(beside, tmp_path, monkeypatch):
    (beside / ".env").write_text(
        "ANTHROPIC_API_KEY=from-file\nANTHROPIC_MODEL=m-file\n"
        "ANTHROPIC_BASE_URL=http://127.0.0.1:9/${HOME}\n"
    )
    monkeypatch.setenv("ANTHROPIC_MODEL", "m-env")
    config = agent.load_config(tmp_path / "data", Silent())
    assert config["ANTHROPIC_API_KEY"] == "from-file" and config["ANTHROPIC_MODEL"] == "m-env"
    assert config["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/${HOME}"  # no ${VAR} expansion
    assert "ANTHROPIC_API_KEY" not in os.environ  # read, never loaded into the environment


def test_no_dotenv_in_the_current_directory_or_above_it_is_ever_read(beside, tmp_path, monkeypatch):
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    for directory in (cwd, cwd.parent, tmp_path):  # what scripts of earlier runs could write
        (directory / ".env").write_text(
            "ANTHROPIC_API_KEY=planted\nANTHROPIC_BASE_URL=http://attacker.example\n"
        )
    monkeypatch.chdir(cwd)
    report = Silent()
    assert agent.load_config(cwd, report) == dict.fromkeys(
        ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL")
    )
    assert agent.load_config(None, report)["ANTHROPIC_BASE_URL"] is None  # --count-tokens too


@pytest.mark.parametrize("kind", ["symlink", "hard link", "fifo", "directory"])
def test_a_dotenv_that_could_lead_to_the_models_files_is_not_read(beside, workdir, kind):
    planted = workdir / "planted.env"  # a script wrote this; the .env only leads to it
    planted.write_text("ANTHROPIC_API_KEY=planted\nANTHROPIC_BASE_URL=http://attacker.example\n")
    dotenv = beside / ".env"
    {
        "symlink": lambda: dotenv.symlink_to(planted),
        "hard link": lambda: os.link(planted, dotenv),
        "fifo": lambda: os.mkfifo(dotenv),
        "directory": dotenv.mkdir,
    }[kind]()
    report = Silent()
    notes = notes_of(report)
    config = agent.load_config(workdir, report)  # a FIFO there must not block it either
    assert config["ANTHROPIC_API_KEY"] is None and config["ANTHROPIC_BASE_URL"] is None
    assert len(notes) == 1 and f"not reading {dotenv}" in notes[0]


def test_a_dotenv_linked_to_a_report_agent_py_wrote_is_not_read(capsys, beside, workdir, tmp_path):
    """A report holds the model's text as it wrote it; a .env that leads there counts not."""
    transcript = tmp_path / "run.json"
    client = FakeClient(reply(text("ok\nANTHROPIC_BASE_URL=http://attacker.example\n")))
    run_cli(capsys, ["q", "--workdir", str(workdir), "--transcript", str(transcript)], client)
    run_cli(capsys, ["--report", str(transcript)])
    from dotenv import dotenv_values  # the attack is real: read as a .env, the page sets it

    page = tmp_path / "run.html"
    assert dotenv_values(page)["ANTHROPIC_BASE_URL"] == "http://attacker.example"
    (beside / ".env").symlink_to(page)
    assert agent.load_config(workdir, Silent())["ANTHROPIC_BASE_URL"] is None


@pytest.mark.parametrize("others", [[], ["cwd"], ["cwd", "workdir"]])
def test_missing_key_names_the_one_dotenv_read_and_says_others_are_not(
    capsys, beside, workdir, tmp_path, monkeypatch, others
):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for where in others:
        ({"cwd": cwd, "workdir": workdir}[where] / ".env").write_text("ANTHROPIC_API_KEY=k\n")
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)])
    line = (
        f"agent.py: no API key: set ANTHROPIC_API_KEY in the environment or in "
        f"{beside / '.env'} (copy .env.example there), the one .env agent.py reads"
    )
    unread = {
        (): "",
        ("cwd",): f"; {cwd / '.env'} is never read",
        ("cwd", "workdir"): f"; {cwd / '.env'} and {workdir / '.env'} are never read",
    }[tuple(others)]
    why = ": the model's code could have written it" + "them" * (len(others) > 1)
    assert code == 2 and err == line + (unread and unread + why.replace("itthem", "them")) + "\n", (
        err
    )


def test_the_placeholder_key_is_a_usage_error(capsys, workdir, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-...")
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)])
    assert code == 2 and "placeholder" in err and len(err.strip().splitlines()) == 1


# --- the checkout: what the docs' commands write there is ignored ---


def written_by_the_docs():
    """Each path inside the checkout that a command in README.md or docs/ writes: the outputs it
    names (--transcript, --events, -o, > and tee; a trial's transcripts beside its summary with
    --trials), what --report and --export write beside their input when no -o is given, and
    a report or export of the shipped example."""
    commands = []
    for doc in [AGENT.parent / "README.md", *sorted((AGENT.parent / "docs").glob("*.md"))]:
        text = doc.read_text().replace("\\\n", " ")  # a command continued on the next line
        commands += re.findall(
            r"`([^`\n]*(?:agent\.py|--transcript|--events|--report|-o |> |"
            r"tee )[^`\n]*)`",
            text,
        )
        commands += [line for line in text.splitlines() if "agent.py " in line]
    out = r"[a-z0-9][\w./-]*\.\w+"  # a relative path; not a PLACEHOLDER.json, -, /dev/null
    named = {"workspace/example-run.html", "workspace/example-run.atif.json"}  # the example's
    for command in commands:
        named |= set(re.findall(rf"(?:--transcript|--events|-o|--output|>|tee) ({out})", command))
        if "--trials" in command:
            named |= {
                f"{t[: -len('.json')]}.1.json"
                for t in re.findall(rf"--transcript ({out})", command)
                if t.endswith(".json")
            }
        if " -o " not in command and "--output" not in command:
            named |= {
                f"{d[: -len('.json')]}.html"
                for d in re.findall(rf"--report ({out})", command)
                if d.endswith(".json")
            }
            named |= {
                f"{d[: -len('.json')]}.atif.json"
                for d in re.findall(rf"--export atif ({out})", command)
                if d.endswith(".json")
            }
    return sorted(named)


@pytest.mark.skipif(
    not (AGENT.parent / ".git").exists() or shutil.which("git") is None,
    reason="needs the git checkout",
)
def test_gitignore_covers_every_file_the_docs_commands_write_in_the_checkout():
    paths = written_by_the_docs()
    assert "workspace/example-run.html" in paths and "answer.txt" in paths  # what it finds
    tracked = subprocess.run(
        ["git", "ls-files", *paths], cwd=AGENT.parent, capture_output=True, text=True, check=True
    ).stdout.split()
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths],
        cwd=AGENT.parent,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert sorted(set(paths) - set(tracked) - set(ignored)) == []


# --- make_client, and what agent.py imports when ---


def test_dependencies_are_declared_inline_for_uv():
    header = Path(agent.__file__).read_text().split('"""', 1)[0]
    block = header[header.index("# /// script") : header.index("# ///\n")]
    assert '"anthropic' in block and '"python-dotenv' in block and "dependencies" in block
    requirements = Path(agent.__file__).with_name("requirements.txt").read_text().split()
    assert {r.split(">")[0] for r in requirements} == {"anthropic", "python-dotenv"}


@pytest.mark.parametrize("stand", ["in the checkout", "above it"])
def test_without_its_dependencies_agent_py_says_how_to_install_them(
    tmp_path, workdir, agent_copy, stand
):
    """With paths that work from where the user stands."""
    cwd = agent_copy.parent if stand == "in the checkout" else tmp_path
    done = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        flags=["-S"],
        cwd=cwd,
        env=agent_env(ANTHROPIC_API_KEY="x" * 20),
        timeout=30,
    )
    at = "" if stand == "in the checkout" else "agent/"
    assert done.returncode == 2 and "Traceback" not in done.stderr
    # issue 34: the line names agent.py once, not `agent.py: agent.py needs ...`
    assert done.stderr.startswith("agent.py: needs the anthropic and python-dotenv packages, ")
    assert (
        f": python3 -m venv {at}.venv && {at}.venv/bin/pip install -r {at}requirements.txt, "
        f"then run {at}.venv/bin/python {at}agent.py ...; or run it with uv run {at}agent.py "
        "...\n" in done.stderr
    ), done.stderr


def test_help_and_usage_errors_do_not_import_the_sdk(tmp_path):
    probe = (
        "import sys, agent\n"
        "code = agent.main(['--max-turns', '0', 'q'])\n"
        "print(code, 'anthropic' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=AGENT.parent, capture_output=True, text=True, timeout=30
    )
    assert done.stdout.split() == ["2", "False"]
    started = time.monotonic()
    done = run_agent_py(AGENT, "--help", timeout=30)
    assert done.returncode == 0 and "exit codes" in done.stdout
    assert time.monotonic() - started < 2


def test_the_sdk_is_imported_with_the_collector_off_and_frozen_after():
    """anthropic's import makes ~200,000 objects that live for good: collections during it
    only walk them (4% of its instructions under callgrind). Off while it runs, on after,
    even when the import fails, and the objects frozen out of later full collections."""
    probe = (
        "import gc, sys, agent\n"
        "seen = []\n"
        "class Spy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith('anthropic.'):\n"
        "            seen.append(gc.isenabled())\n"
        "sys.meta_path.insert(0, Spy())\n"
        "config = {'ANTHROPIC_API_KEY': 'test-key', 'ANTHROPIC_BASE_URL': None}\n"
        "if sys.argv[1] == 'broken':\n"
        "    sys.modules['anthropic'] = None  # import anthropic raises ImportError\n"
        "try:\n"
        "    agent.make_client(config, agent.Limits())\n"
        "except agent.UsageError:\n"
        "    print('usage-error')\n"
        "print(len(seen) > 100, any(seen), gc.isenabled(), gc.get_freeze_count() > 100_000)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "ok"],
        cwd=AGENT.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.split() == ["True", "False", "True", "True"], done.stderr
    done = subprocess.run(
        [sys.executable, "-c", probe, "broken"],
        cwd=AGENT.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.split() == ["usage-error", "False", "False", "True", "False"], done.stderr


# --- as a user runs it: a subprocess ---


def test_subprocess_end_to_end(request, workdir, tmp_path, agent_copy):
    api = serve(
        request,
        reply(tool_use("read_file", {"path": "scores.csv"})),
        reply(tool_use("run_python", {"code": "print(sum([88, 72, 95]) / 3)"})),
        reply(tool_use("run_python", {"code": "print(open('../secret.txt').read())"})),
        reply(text("平均分是 85。")),
    )
    transcript = tmp_path / "run.json"
    done = run_agent_py(
        agent_copy,
        "scores.csv 里平均分是多少？",
        "--workdir",
        workdir,
        "--yes",
        "--transcript",
        transcript,
        env=agent_env(api),
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "平均分是 85。\n"
    assert "sandbox:" in done.stderr and "Traceback" not in done.stderr
    saved = json.loads(transcript.read_text())
    assert saved["stop"]["reason"] == "end_turn" and len(saved["turns"]) == 4
    assert all(t["request_id"].startswith("req_local_") for t in saved["turns"])
    assert "85.0" in saved["messages"][4]["content"][0]["content"]
    if "landlock" in done.stderr:  # the sandbox, seen from outside under --yes
        refused = saved["messages"][6]["content"][0]
        assert refused["is_error"] and "PermissionError" in refused["content"]
        assert "top secret" not in refused["content"]


@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c", "sigterm", "sighup"]
)  # SIGHUP: a closed terminal
def test_subprocess_ctrl_c_kills_the_tool_and_keeps_the_transcript(
    request, workdir, tmp_path, signum, agent_copy
):
    # the pids of the script and its child as this machine sees them (/proc/self), not as
    # os.getpid() gives them in the call's own PID namespace
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', \"import os, time; open('kid.tmp', "
        "'w').write(os.readlink('/proc/self')); os.rename('kid.tmp', 'kid'); "
        'time.sleep(60)"])\n'
        "while not os.path.exists('kid'):\n"
        "    time.sleep(0.01)\n"
        "open('pids', 'w').write(os.readlink('/proc/self') + ' ' + open('kid').read())\n"
        "time.sleep(60)\n"
    )
    api = serve(
        request,
        reply(
            tool_use("run_python", {"code": code}, id="toolu_slow"),
            tool_use("read_file", {"path": "notes.md"}, id="toolu_after"),
        ),
    )
    transcript, events = tmp_path / "run.json", tmp_path / "events.jsonl"
    proc = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        "--yes",
        "--transcript",
        transcript,
        "--events",
        events,
        background=True,
        env=agent_env(api),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    pids = workdir / "pids"
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signum)
    started = time.monotonic()
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 130 and time.monotonic() - started < 5, err
    assert "Traceback" not in err
    saved = json.loads(transcript.read_text())
    assert saved["stop"]["reason"] == "interrupted"
    # the killed call is on stderr, in the events and in the turn; the call after it answered
    said = "stopped by SIGHUP" if signum == signal.SIGHUP else "stopped by Ctrl-C or SIGTERM"
    assert saved["stop"]["detail"] == said and f"stop: interrupted ({said})" in err  # N16
    assert "run_python" in err and f"-> error: interrupted: {said} while it ran" in err
    ends = [e for e in map(json.loads, events.read_text().splitlines()) if e["type"] == "tool.end"]
    assert [(e["id"], e["is_error"]) for e in ends] == [("toolu_slow", True)]
    assert [(c["id"], c["is_error"]) for c in saved["turns"][0]["tool_calls"]] == [
        ("toolu_slow", True),
        ("toolu_after", True),
    ]
    answers = saved["messages"][-1]["content"]
    assert [b["tool_use_id"] for b in answers] == ["toolu_slow", "toolu_after"]
    assert "before it ran: it was not run" in answers[1]["content"]
    assert agent.transcript_problem(saved) is None  # --resume takes it as it is
    time.sleep(0.2)
    assert not [pid for pid in map(int, pids.read_text().split()) if alive(pid)]


@pytest.mark.parametrize("how", ["> log 2>&1", "2>&1 | tee log", "> out 2> err"])
def test_the_answer_is_printed_once_where_stdout_and_stderr_are_one_file(
    request, workdir, tmp_path, agent_copy, how
):
    """The streamed answer is already in the file or pipe stdout shares with stderr."""
    api = serve(request, reply(text("forty-two")))
    argv = [sys.executable, str(agent_copy), "q", "--workdir", str(workdir)]
    if how == "> log 2>&1":
        with open(tmp_path / "log", "w") as log:
            code = subprocess.run(
                argv, stdout=log, stderr=subprocess.STDOUT, env=agent_env(api), timeout=60
            ).returncode
        both = (tmp_path / "log").read_text()
    elif how == "2>&1 | tee log":
        done = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=agent_env(api),
            timeout=60,
        )
        code, both = done.returncode, done.stdout
    else:
        done = subprocess.run(argv, capture_output=True, text=True, env=agent_env(api), timeout=60)
        code, both = done.returncode, done.stdout + done.stderr
        assert done.stdout == "forty-two\n"
    assert code == 0 and both.count("forty-two") == 1 + (how == "> out 2> err"), both


BASE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"  # the venv's Python, without its packages


@pytest.mark.skipif(
    not BASE_PYTHON.exists()
    or subprocess.run([str(BASE_PYTHON), "-c", "import anthropic"], capture_output=True).returncode
    == 0,
    reason="needs a Python without the anthropic package",
)
def test_without_its_packages_agent_py_says_so_before_asking_for_a_key(
    tmp_path, workdir, agent_copy
):
    done = subprocess.run(
        [str(BASE_PYTHON), str(agent_copy), "hi", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        env=agent_env(),
        cwd=tmp_path,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "needs the anthropic and python-dotenv packages" in done.stderr
    assert "pip install -r agent/requirements.txt" in done.stderr and "API key" not in done.stderr


@pytest.mark.skipif(
    not BASE_PYTHON.exists()
    or subprocess.run([str(BASE_PYTHON), "-c", "import anthropic"], capture_output=True).returncode
    == 0,
    reason="needs a Python without the anthropic package",
)
def test_without_its_packages_resume_says_so_before_asking_its_question(tmp_path, agent_copy):
    """newuser2 N37: --resume asked its consent question first, and only after a y said that
    the packages were missing."""
    example = tmp_path / "run.json"  # it recorded a workdir (workspace, here too): asked
    example.write_bytes((AGENT.parent / "workspace" / "example-run.json").read_bytes())
    (tmp_path / "workspace").mkdir()
    done = subprocess.run(
        [str(BASE_PYTHON), str(agent_copy), "--resume", str(example), "more"],
        capture_output=True,
        text=True,
        env=agent_env(),
        cwd=tmp_path,
        timeout=60,
        input="y\n",
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "needs the anthropic and python-dotenv packages" in done.stderr
    assert "[y/N]" not in done.stderr


def test_subprocess_without_a_key_is_one_clear_line(tmp_path, workdir, agent_copy):
    done = run_agent_py(
        agent_copy,
        "hi",
        "--workdir",
        workdir,
        env=agent_env(),
        cwd=tmp_path,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "ANTHROPIC_API_KEY" in done.stderr and ".env.example" in done.stderr


@pytest.fixture
def proxy_log():
    """A loopback HTTPS proxy that writes down where each request was going (its CONNECT line)
    and refuses it: where agent.py would send a request, without it leaving the machine."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    seen = []

    def accept():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                seen.append(conn.recv(4096).split(b"\r\n")[0].decode())
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=accept, daemon=True).start()
    yield SimpleNamespace(url=f"http://127.0.0.1:{listener.getsockname()[1]}", seen=seen)
    listener.close()


@pytest.mark.parametrize("where", ["environment", ".env"])
def test_an_empty_base_url_means_anthropics_api_wherever_it_is_set(agent_copy, proxy_log, where):
    """ANTHROPIC_BASE_URL= in the environment used to reach the SDK as a URL, '' ('Connection
    failed: UnsupportedProtocol (talking to ://)'), while the same line in .env meant
    Anthropic's API: empty is unset in both places, as it is for the key and the model."""
    env = agent_env(ANTHROPIC_API_KEY="test-key")
    env["HTTPS_PROXY"] = proxy_log.url
    if where == "environment":
        env["ANTHROPIC_BASE_URL"] = ""
    else:
        (agent_copy.parent / ".env").write_text("ANTHROPIC_API_KEY=test-key\nANTHROPIC_BASE_URL=\n")
    done = run_agent_py(agent_copy, "--count-tokens", "q", env=env, timeout=60)
    assert done.returncode == 1 and "://)" not in done.stderr, done.stderr
    assert proxy_log.seen[:1] == ["CONNECT api.anthropic.com:443 HTTP/1.1"], proxy_log.seen


def test_a_planted_dotenv_cannot_redirect_any_later_run(request, tmp_path, workdir, agent_copy):
    """A script of an earlier run wrote .env into its workdir and above it: the next runs, from
    there, in any mode, still send the key and the data only where the user said."""
    good = serve(request, reply(text("from the real server")))
    evil = serve(request)
    (agent_copy.parent / ".env").write_text(
        f"ANTHROPIC_API_KEY=test-key\nANTHROPIC_BASE_URL={good.url}\n"
    )
    for planted in (workdir / ".env", tmp_path / ".env"):
        planted.write_text(f"ANTHROPIC_BASE_URL={evil.url}\nANTHROPIC_API_KEY=planted-key\n")
    done = run_agent_py(agent_copy, "q", cwd=workdir, env=agent_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "from the real server\n"
    counted = run_agent_py(
        agent_copy, "--count-tokens", "q", cwd=workdir, env=agent_env(), timeout=60
    )
    assert counted.returncode == 0, counted.stderr
    assert len(good.requests) == 1 and len(good.counted) == 3
    assert evil.requests == [] and evil.counted == [] and evil.connections == 0


needs_root = as_other_users  # to make a file another user owns
OTHER_WRITERS = {
    "owned by nobody": (65534, 0o600),
    "group-writable": (0, 0o620),
    "world-writable": (0, 0o602),
}


@needs_root
@pytest.mark.parametrize("kind", sorted(OTHER_WRITERS))
def test_a_dotenv_another_user_could_write_cannot_redirect_the_run(
    request, workdir, agent_copy, kind
):
    """Another user (the .env's owner, or anyone its mode lets write it) put a key and a base
    URL there: the run (root's) sends nothing to that server, and one line says why."""
    evil = serve(request, reply(text("from the other user's server")))
    dotenv = agent_copy.parent / ".env"
    dotenv.write_text(f"ANTHROPIC_API_KEY=planted-key\nANTHROPIC_BASE_URL={evil.url}\n")
    uid, mode = OTHER_WRITERS[kind]
    os.chown(dotenv, uid, uid)
    dotenv.chmod(mode)
    done = run_agent_py(
        agent_copy, "q", "--workdir", workdir, env=agent_env(), timeout=60, stdin=subprocess.DEVNULL
    )
    assert (evil.connections, evil.requests, done.returncode) == (0, [], 2), done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"note: not reading {dotenv}: "), lines
    assert ("owned by nobody (uid 65534)" if uid else "writable by") in lines[0], lines[0]
    assert "another user could have written it" in lines[0] and "no API key" in lines[1]


@pytest.mark.parametrize("mode, who", [(0o666, "anyone"), (0o606, "anyone"), (0o660, "its group")])
def test_a_dotenv_anyone_may_write_is_said_to_be_so(workdir, agent_copy, mode, who):
    """Mode 666 was called `writable by its group`: anyone may write it."""
    dotenv = agent_copy.parent / ".env"
    dotenv.write_text("ANTHROPIC_MODEL=from-the-file\n")
    dotenv.chmod(mode)
    done = run_agent_py(
        agent_copy, "q", "--workdir", workdir, env=agent_env(), timeout=60, stdin=subprocess.DEVNULL
    )
    note = done.stderr.splitlines()[0]
    assert done.returncode == 2 and note.startswith(
        f"note: not reading {dotenv}: it is writable by {who} ({stat.filemode(0o100000 | mode)})"
    ), note


@needs_root
def test_whose_dotenv_counts_as_an_ordinary_user(as_nobody):
    """Run as `nobody`: its own .env and root's are read; one another user owns, or one anyone
    else may write, is not, and one line says why."""
    dotenv = as_nobody.agent_dir / ".env"
    driver = (
        f"import sys, json; sys.path.insert(0, {str(as_nobody.agent_dir)!r})\n"
        "import agent\n"
        "print(json.dumps(agent.read_dotenv(agent.dotenv_path(), None, agent.Reporter())))"
    )
    nobody = as_nobody.user.pw_uid
    seen = {}
    for owner, mode in [
        (nobody, 0o600),
        (0, 0o644),
        (nobody, 0o640),
        (1, 0o644),
        (0, 0o664),
        (nobody, 0o606),
    ]:
        dotenv.unlink(missing_ok=True)
        dotenv.write_text("ANTHROPIC_MODEL=from-the-file\n")
        os.chown(dotenv, owner, owner)
        dotenv.chmod(mode)
        done = subprocess.run(
            [as_nobody.python, "-c", driver],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            user=nobody,
            group=as_nobody.user.pw_gid,
            extra_groups=[],
        )
        assert done.returncode == 0, done.stderr
        seen[owner, oct(mode)] = json.loads(done.stdout), done.stderr.splitlines()
    for (owner, mode), (text_, notes) in seen.items():
        read = owner in (nobody, 0) and mode in ("0o600", "0o644", "0o640")
        assert (text_ == "ANTHROPIC_MODEL=from-the-file\n") == read, (owner, mode, text_)
        assert len(notes) == (0 if read else 1), (owner, mode, notes)
        assert read or "another user could have written it" in notes[0]


OLDER_PYTHONS = sorted(
    p
    for p in Path(os.path.expanduser("~/.pyenv/versions")).glob("3.[6789]*/bin/python")
    if p.exists()
) + sorted(Path(os.path.expanduser("~/.pyenv/versions")).glob("3.10*/bin/python"))


def test_agent_py_reads_as_python_3_6_up_to_its_version_check():
    """Older Pythons must reach the check, not stop at a line they cannot parse (3.6 and 3.7
    stopped at a := with a SyntaxError traceback, newuser #28)."""
    import ast

    ast.parse(AGENT.read_text(), feature_version=(3, 6))


@pytest.mark.parametrize("python", OLDER_PYTHONS or [None], ids=str)
def test_an_older_python_gets_one_line_naming_the_version_needed(python, workdir):
    if python is None:
        pytest.skip("no Python older than 3.11 on this machine (pyenv's are looked for)")
    done = subprocess.run(
        [str(python), str(AGENT), "q", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.startswith("agent.py: needs Python 3.11 or newer")
        and len(done.stderr.splitlines()) == 1
    )


@pytest.mark.parametrize("link", ["agent.py", "its directory"])
def test_a_workdir_holding_the_symlink_agent_py_was_started_through_is_refused(
    request, tmp_path, agent_copy, link
):
    """The attack of finding 55: agent.py is started through a symlink that lies in the
    workdir (the link itself, or a linked directory on the way). The model's sandboxed code
    may replace any name in the workdir: were the run allowed, it would swap the symlink for
    its own agent.py, and the next run would execute that, unconfined and with the key."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if link == "agent.py":
        started = bin_dir / "agent.py"
        started.symlink_to(agent_copy)
    else:
        (bin_dir / "tool").symlink_to(agent_copy.parent)
        started = bin_dir / "tool" / "agent.py"
    replaced = started.parent if link == "agent.py" else bin_dir
    attack = (
        "import os, shutil\n"
        + (
            "os.remove('agent.py')\nopen('agent.py', 'w').write('print(42)\\n')\n"
            if link == "agent.py"
            else "os.remove('tool')\nos.mkdir('tool')\n"
            "open('tool/agent.py', 'w').write('print(42)\\n')\n"
        )
        + "print('done')"
    )
    api = serve(request, reply(tool_use("run_python", {"code": attack})), reply(text("ok")))
    done = run_agent_py(
        started,
        "q",
        "--workdir",
        bin_dir,
        "--yes",
        "--no-keep",
        env=agent_env(api),
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert done.returncode == 2 and api.requests == [], done.stderr  # refused before sending
    assert done.stderr.startswith(f"agent.py: --workdir {bin_dir} holds agent.py ("), done.stderr
    assert started.resolve() == agent_copy.resolve()  # the symlink still leads to agent.py
    again = run_agent_py(started, "--version", env=agent_env(), timeout=30)
    assert again.stdout.strip() != "42" and again.stdout.startswith("agent.py"), again.stdout
    assert replaced.is_dir()


def test_a_workdir_holding_the_interpreter_or_venv_as_given_is_refused(
    capsys, tmp_path, monkeypatch
):
    """sys.executable and the venv as given, not only where they resolve: a venv whose python
    is a symlink into the workdir, or a venv directory reached through one."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "python").symlink_to(os.path.realpath(sys.executable))
    monkeypatch.setattr(sys, "executable", str(workdir / "python"))
    client = FakeClient()
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, client.requests) == (2, []) and "holds the Python interpreter" in err, err


NO_LANDLOCK = """import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def op(code, k, jt=0, jf=0): return struct.pack("HBBI", code, jt, jf, k)
prog = [op(0x20, 0)] + [op(0x15, nr, 3 - i, 0) for i, nr in enumerate((444, 445, 446))]
prog += [op(0x06, 0x7fff0000), op(0x06, 0x00050000 | 38)]  # allow; else ENOSYS
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
fprog = Fprog(len(prog), b"".join(prog))
assert libc.prctl(38, 1, 0, 0, 0) == 0 and libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0
os.execv(sys.argv[1], sys.argv[1:])
"""  # Landlock's three syscalls answer ENOSYS, as under an older container seccomp profile


@pytest.mark.parametrize("flags", [(), ("-q",), ("--yes", "-q")])
def test_without_the_sandbox_the_question_itself_says_a_y_runs_it_unconfined(
    request, workdir, agent_copy, flags
):
    """N34: on a machine without Landlock every call is asked, and a y runs it unconfined. The
    screen the user answers (a terminal; with -q nothing else is drawn) must say so in the
    question itself, with why; the call is declined here and nothing ran."""
    import pty

    if sys.platform != "linux" or agent.platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("Landlock is made unavailable with a seccomp filter for Linux")
    api = serve(
        request, reply(tool_use("run_python", {"code": "open('ran', 'w')"})), reply(text("ok"))
    )
    main, screen = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            NO_LANDLOCK,
            sys.executable,
            str(agent_copy),
            "q",
            "--workdir",
            str(workdir),
            "--no-keep",
            *flags,
        ],
        stdin=screen,
        stdout=subprocess.PIPE,
        stderr=screen,
        env=agent_env(api),
    )
    os.close(screen)
    drawn, out = answered_on_the_screen(main, proc, b"n\n")
    question = re.sub(r"\x1b\[\d+m", "", drawn.decode()).replace("\r\n", "\n").rstrip()
    question = question.splitlines()[-1]
    assert "UNCONFINED" in question and "no Landlock" in question, drawn
    assert question.endswith("[y/N]") and len(question) < 200, question
    assert proc.returncode == 0 and out == b"ok\n" and not (workdir / "ran").exists()


def answered_on_the_screen(main, proc, answer):
    """Read the terminal `main` until the approval question is drawn, type `answer`; (what was
    drawn, the run's stdout), the run ended and the terminal closed."""
    drawn, deadline = b"", time.monotonic() + 60
    while b"[y/N]" not in drawn and time.monotonic() < deadline and proc.poll() is None:
        drawn += os.read(main, 65536) if select.select([main], [], [], 0.2)[0] else b""
    os.write(main, answer)
    out = proc.communicate(timeout=60)[0]
    os.close(main)
    return drawn, out


def test_with_stderr_in_a_file_the_approval_question_is_asked_on_the_terminal(
    request, workdir, tmp_path, agent_copy
):
    """`2>log` on a terminal (finding 63): the question goes to the terminal the answer comes
    from, not into the log, and the run goes on with the answer given there."""
    import fcntl
    import pty
    import termios

    api = serve(
        request,
        reply(tool_use("run_python", {"code": "print(6 * 7)"})),
        reply(text("The answer is 42.")),
    )
    main, screen = pty.openpty()

    def own_terminal():  # the pty is the run's controlling terminal, as a shell's would be
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    with open(tmp_path / "log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(agent_copy), "q", "--workdir", str(workdir)],
            stdin=screen,
            stdout=subprocess.PIPE,
            stderr=log,
            env=agent_env(api),
            preexec_fn=own_terminal,
        )
    os.close(screen)
    drawn, out = answered_on_the_screen(main, proc, b"y\n")
    logged = (tmp_path / "log").read_text()
    assert b"--- run it? [y/N] " in drawn and b"print(6 * 7)" in drawn, (drawn, logged)
    assert "[y/N]" not in logged and "run_python" in logged and "stop: end_turn" in logged
    assert proc.returncode == 0 and out == b"The answer is 42.\n"


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--work", "workspace", "q"], "unrecognized arguments: --work (did you mean --workdir?)"),
        (["--dir", "workspace", "q"], "unrecognized arguments: --dir (did you mean --workdir?)"),
        (["-c", "workspace", "q"], "unrecognized arguments: -c (did you mean -C? to go on with"),
        (
            ["q", "--max-turn", "3"],
            "unrecognized arguments: --max-turn (did you mean --max-turns?)",
        ),
        (["q", "--frobnicate"], "unrecognized arguments: --frobnicate (see --help)"),
    ],
)
def test_a_mistyped_flag_is_named_alone_with_the_flag_meant(capsys, argv, line):
    """`--work workspace q` (finding 60): argparse took `workspace` as the question; the line
    names the mistyped flag and the flag most like it, not the real question."""
    client = FakeClient()
    code, out, err = run_cli(capsys, argv, client)
    assert (code, out, client.requests) == (2, "", [])
    assert err.startswith(f"agent.py: {line}") and len(err.splitlines()) == 1, err
    assert " q" not in err.split("unrecognized arguments:")[1], err


def test_a_question_on_stdin_says_why_run_python_got_no_answer(capsys, workdir):
    """`printf 'q' | agent.py -`: stdin held the question, so the approval question gets no
    answer; the line says so and what to do, not a bare `(no answer)` (newuser #13)."""
    client = FakeClient(reply(tool_use("run_python", {"code": "print(1)"})), reply(text("ok")))
    code, _, err = run_cli(
        capsys,
        ["-", "--workdir", str(workdir), "--no-sandbox"],
        client,
        stdin="What is the average?\n",
    )
    assert (
        code == 0 and "(no answer: stdin held the question; give --yes to run it unasked)" in err
    ), err
    assert client.requests[0]["messages"][0]["content"][0]["text"] == "What is the average?"


def test_a_key_in_the_dotenv_that_is_not_utf8_is_a_usage_error_not_a_mangled_key(
    capsys, beside, workdir
):
    """A Latin-1 byte in the .env's key was replaced by U+FFFD and the key sent so, for a 401
    whose cause no one could see (newuser2 N7)."""
    dotenv = beside / ".env"
    dotenv.write_bytes(b"ANTHROPIC_API_KEY=k-SECRET-\xff-latin1\n")
    dotenv.chmod(0o600)
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)])
    assert (code, out) == (2, "") and err == (
        f"agent.py: ANTHROPIC_API_KEY (from {dotenv}) has a character that is not ASCII at "
        "position 10 of 17: copy the key again\n"
    ), err


@needs_root
def test_a_dotenv_the_user_cannot_read_is_said_to_be_so(as_nobody):
    """Root's 0600 .env, agent.py run as nobody: `Permission denied, so the model's code could
    have written it`, then `(it holds none)`: a wrong reason, and a file that does hold a key
    (newuser2 N14)."""
    dotenv = as_nobody.agent_dir / ".env"
    dotenv.write_text("ANTHROPIC_API_KEY=root-only-key\n")
    dotenv.chmod(0o600)
    driver = (
        f"import sys; sys.path.insert(0, {str(as_nobody.agent_dir)!r})\n"
        "import agent\n"
        "print(agent.read_dotenv(agent.dotenv_path(), None, agent.Reporter()))\n"
        "print(agent.no_key(None))"
    )
    done = subprocess.run(
        [as_nobody.python, "-c", driver],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        user=as_nobody.user.pw_uid,
        group=as_nobody.user.pw_gid,
        extra_groups=[],
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        f"note: cannot read {dotenv} (Permission denied: it is root's, mode "
        "-rw-------), so its settings are not used (set ANTHROPIC_* in the "
        "environment, or make it readable to you)\n"
    )
    none, line = done.stdout.splitlines()
    assert none == "None" and line == (
        f"no API key: set ANTHROPIC_API_KEY in the environment or in {dotenv} (which you cannot "
        "read), the one .env agent.py reads"
    )


def test_counts_are_taken_as_help_shows_them(capsys, workdir, tmp_path):
    """--help shows `(default: 1,000,000)`; `--token-budget 1,000,000` was `invalid int value`
    (newuser2 N15). A count with , or _ between its digits is that count; anything else is one
    line."""
    path = tmp_path / "events.jsonl"
    code, _, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--token-budget",
            "1,000,000",
            "--max-tokens",
            "16_000",
            "--clear-tool-results",
            "80,000",
            "--events",
            str(path),
        ],
        FakeClient(reply(text("42"))),
    )
    limits = json.loads(path.read_text().splitlines()[0])["limits"]
    assert code == 0, err
    assert (limits["token_budget"], limits["max_tokens"], limits["clear_at"]) == (
        1_000_000,
        16_000,
        80_000,
    )
    for bad in ("1,00,0x", "1,0", "1,00", "10,00,000"):  # a comma only between groups of three
        code, _, err = run_cli(capsys, ["q", "--token-budget", bad], FakeClient())  # (newuser2 N45)
        assert code == 2 and err == (
            f"agent.py: argument --token-budget: {bad!r} is not a whole number (see --help)\n"
        )


@pytest.mark.parametrize("named", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
def test_events_to_stdout_by_its_name_are_events_to_stdout(capsys, workdir, named):
    """`--events /dev/stdout > ev.jsonl` put the answer between the events, where `--events -`
    keeps stdout events-only; and `--transcript - --events /dev/stdout` mixed both documents,
    where `--events - --transcript -` is refused (newuser2 N27)."""
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--events", named],
        FakeClient(reply(text("the answer"))),
    )
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and events[-1]["type"] == "run.stop", out
    assert events[-1]["answer"] == "the answer"
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--events", named, "--transcript", "-"],
        FakeClient(),
    )
    assert (code, out) == (2, "") and err == (
        "agent.py: --events - and --transcript - cannot share stdout\n"
    )


def test_a_model_id_with_white_space_around_it_is_a_usage_error(capsys, workdir, monkeypatch):
    """` claude-haiku-5-5` from the environment was sent as it was, for a 404, with a note that
    no price is known for it (newuser2 N33)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_MODEL", " claude-haiku-5-5")
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)])
    assert (code, out) == (2, "") and err == (
        "agent.py: ANTHROPIC_MODEL ' claude-haiku-5-5' has white space around it: give it without\n"
    )


def test_a_password_in_the_base_url_is_said_to_replace_the_keys_authorization(
    capsys, workdir, monkeypatch
):
    """newuser2 N28: user:password@ in ANTHROPIC_BASE_URL is sent as Authorization: Basic,
    in place of the key's header, and nothing said so; a note does, showing no password."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://user:s3cr3t-pw@127.0.0.1:9")
    code, out, err = run_cli(
        capsys, ["q", "--workdir", str(workdir)], FakeClient(reply(text("ok")))
    )
    assert code == 0 and out == "ok\n", err
    assert (
        "note: ANTHROPIC_BASE_URL holds a user:password@, which is sent as the "
        "Authorization header in place of the API key's\n"
    ) in err
    assert "s3cr3t-pw" not in err
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], FakeClient(reply(text("ok"))))
    assert code == 0 and "user:password" not in err


def test_an_answer_with_no_text_says_so(capsys, workdir):
    """A reply of no content, end_turn (local models do this after a tool result): exit 0 and
    nothing anywhere said the answer was empty (newuser2 N36)."""
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], FakeClient(reply()))
    assert (code, out) == (0, "")
    assert "stop: end_turn (the model finished, with no text); 1 turn," in err, err


def test_a_question_on_stdin_loses_a_byte_order_mark(capsys, workdir):
    """A question file saved by Notepad starts with U+FEFF, which went to the model (newuser2
    N42)."""
    client = FakeClient(reply(text("ok")))
    stdin = io.TextIOWrapper(io.BytesIO("\ufeffavg?\r\n".encode()), encoding="utf-8")
    code, _, _ = run_cli(capsys, ["-", "--workdir", str(workdir)], client, stdin=stdin)
    assert code == 0 and client.requests[0]["messages"][0]["content"][0]["text"] == "avg?"


@pytest.mark.parametrize("argv", [["avg?", "WORK"], ["WORK", "avg?"]])
def test_a_directory_given_as_a_second_word_is_named_as_the_workdir(capsys, workdir, argv):
    """`agent.py "avg?" workspace` got the hint to quote `'avg? workspace'` as one question
    (newuser2 N38): a word that is a directory here is most likely the workdir."""
    argv = [str(workdir) if a == "WORK" else a for a in argv]
    code, out, err = run_cli(capsys, argv, FakeClient())
    assert (code, out) == (2, "") and err == (
        f"agent.py: unrecognized arguments: {argv[1]}; {workdir} is a directory: did you mean "
        f"agent.py 'avg?' --workdir {workdir}?\n"
    ), err


@pytest.mark.parametrize(
    "extra",
    [
        ["--replay", "RUN"],
        ["--trials", "3"],
        ["--transcript", "t.json"],
        ["--otel"],
        ["--resume", "RUN"],
    ],
)
def test_an_inspection_with_a_run_flag_is_refused(capsys, extra):
    """`--report last --replay X` wrote last's report and dropped --replay without a word
    (newuser2 N25), while --report with --export was already refused."""
    code, out, err = run_cli(capsys, ["--report", "last", *extra], FakeClient())
    assert (code, out) == (2, "") and err == (
        f"agent.py: --report cannot be combined with {extra[0]}: it writes a report of a saved "
        "run, and runs nothing; give one of them\n"
    ), err
