"""The tools: read_file, run_python, the dispatcher (call_tool, run_tools), the approval prompt."""

import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fakes import FakeClient, reply, text, tool_use
from helpers import (
    AGENT,
    Silent,
    agent_env,
    call,
    final_messages,
    measured,
    run_agent_py,
    run_cli,
    tool_context,
)

import agent

# --- read_file ---


def test_read_file_returns_the_text(ctx):
    result = call(ctx, "read_file", path="scores.csv")
    assert result == {
        "type": "tool_result",
        "tool_use_id": result["tool_use_id"],
        "content": "name,score\nAlice,88\nBob,72\nChen,95\n",
    }


def test_read_file_accepts_an_absolute_path_inside(ctx):
    assert "Alice" in call(ctx, "read_file", path=str(ctx.workdir / "scores.csv"))["content"]


def test_missing_file_suggests_listing_with_run_python(ctx):
    result = call(ctx, "read_file", path="winter.md")
    assert result["is_error"] and "run_python" in result["content"]
    assert "os.listdir" in result["content"]


def test_directory_is_an_error_that_says_how_to_list_it(ctx):
    (ctx.workdir / "reports").mkdir()
    result = call(ctx, "read_file", path="reports")
    assert result["is_error"] and "is a directory" in result["content"]


def test_a_name_that_is_not_utf8_is_read_as_run_python_lists_it(ctx):
    """run_python prints the byte 0xe9 of a file's name as \\udce9 (backslashreplace), and
    that is the name the model then gives read_file: it reads that file."""
    (ctx.workdir / os.fsdecode(b"caf\xe9.txt")).write_text("price,3\n")
    listing = call(ctx, "run_python", code="import os\nprint(sorted(os.listdir('.')))")
    assert "'caf\\udce9.txt'" in listing["content"], listing
    result = call(ctx, "read_file", path="caf\\udce9.txt")
    assert not result.get("is_error") and result["content"] == "price,3\n", result
    missing = call(ctx, "read_file", path="caf\\udce8.txt")
    assert missing["is_error"] and "'caf\\udce8.txt' does not exist" in missing["content"]


def test_non_utf8_is_an_error(ctx):
    (ctx.workdir / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    result = call(ctx, "read_file", path="blob.bin")
    assert result["is_error"] and "not UTF-8" in result["content"]


def test_fifo_and_device_are_refused_without_blocking(ctx):
    os.mkfifo(ctx.workdir / "pipe")
    paths = {"fifo": "pipe", "dev": "null"}
    try:
        os.mknod(ctx.workdir / "null", 0o600 | 0o020000, os.makedev(1, 3))  # a char device
    except PermissionError:  # it takes CAP_MKNOD: an ordinary user's run tests the FIFO only
        del paths["dev"]
    results = {}
    worker = threading.Thread(
        target=lambda: results.update(
            {kind: call(ctx, "read_file", path=path) for kind, path in paths.items()}
        )
    )
    worker.start()
    worker.join(timeout=3)
    assert not worker.is_alive(), "read_file blocked on a FIFO"
    assert results["fifo"]["is_error"] and "not a regular file" in results["fifo"]["content"]
    if "dev" not in paths:
        pytest.skip(
            "the FIFO was refused; no character device could be made to try (mknod "
            "needs CAP_MKNOD, which an ordinary user lacks)"
        )
    assert results["dev"]["is_error"] and "not a regular file" in results["dev"]["content"]


def test_offset_and_limit_select_lines(ctx):
    (ctx.workdir / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = call(ctx, "read_file", path="long.txt", offset=3, limit=2)["content"]
    assert result.startswith("line 3\nline 4\n")
    assert "lines 3-4 of 10" in result and "offset=5" in result


def test_a_long_file_comes_back_cut_with_where_to_continue(ctx):
    (ctx.workdir / "big.txt").write_text("".join(f"row {i}\n" for i in range(1, 5001)))
    result = call(ctx, "read_file", path="big.txt")["content"]
    assert result.count("\n") == 2000 + 1 and "row 2000\n" in result and "row 2001" not in result
    assert "lines 1-2000 of 5000" in result and "offset=2001" in result
    rest = call(ctx, "read_file", path="big.txt", offset=4001)["content"]
    assert rest.startswith("row 4001\n") and rest.endswith("row 5000\n")


def test_a_file_over_100_kb_is_cut_by_bytes(ctx):
    (ctx.workdir / "wide.txt").write_text(("x" * 999 + "\n") * 300)  # 300 KB in 300 lines
    result = call(ctx, "read_file", path="wide.txt")["content"]
    body, note = result.rsplit("\n[read_file:", 1)
    assert len(body.encode()) <= 100_000 and "of 300" in note


def test_limit_cannot_exceed_one_calls_worth(ctx):
    (ctx.workdir / "big.txt").write_text("".join(f"row {i}\n" for i in range(1, 5001)))
    result = call(ctx, "read_file", path="big.txt", limit=4000)["content"]
    assert "lines 1-2000 of 5000" in result


def test_offset_past_the_end_says_how_long_the_file_is(ctx):
    result = call(ctx, "read_file", path="notes.md", offset=50)
    assert result["is_error"] and "has 2 lines" in result["content"]


def test_read_file_counts_lines_across_chunks(workdir, tmp_path):
    lines = [f"line {i} " + "x" * (i % 7000) for i in range(1, 3001)]
    (workdir / "big.txt").write_text("\n".join(lines))  # no newline at the end
    ctx = tool_context(workdir, tmp_path)
    first = call(ctx, "read_file", path="big.txt", offset=2999)["content"]
    assert first == lines[2998] + "\n" + lines[2999]
    cut = call(ctx, "read_file", path="big.txt", offset=1500, limit=300)["content"]
    body, note = cut.rsplit("\n[read_file: ", 1)
    assert body.split("\n")[0] == lines[1499] and "of 3000" in note
    assert len(body.encode()) <= 100_000


def test_a_line_cut_where_a_64_kib_read_ends_is_said_to_be_cut(ctx):
    """The window fills exactly at the end of a 64 KiB read, in the middle of a line: the line
    is still cut, and the note says so (not "lines 1-1", as if it had been shown whole)."""
    (ctx.workdir / "wide.txt").write_text("x" * 70_000 + "\nend\n")
    ctx = agent.ToolContext(ctx.workdir, agent.Limits(read_bytes=1 << 16), ctx.sandbox, None)
    body, note = call(ctx, "read_file", path="wide.txt")["content"].rsplit("\n[read_file: ", 1)
    assert note.startswith("lines 1-1 of 2 (line 1 cut at 65536 bytes)")
    assert body == "x" * 65536


def test_reading_a_huge_file_without_newlines_keeps_memory_bounded(tmp_path):
    wd = tmp_path / "work"
    wd.mkdir()
    with open(wd / "huge.txt", "wb") as f:
        f.truncate(512 << 20)  # 512 MiB of NUL bytes, sparse: no line end anywhere
    probe = f"""
import resource, sys
sys.path.insert(0, {str(Path(agent.__file__).parent)!r})
import agent
from pathlib import Path
ctx = agent.ToolContext(Path({str(wd)!r}), agent.Limits(), None, approve=None)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
results = [agent.call_tool({{"id": "t", "name": "read_file", "input": {{"path": "huge.txt"}}}}, ctx)[0]
           for _ in range(2)]
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, results[0]["content"][-90:])
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    grown_kb, note = done.stdout.split(maxsplit=1)
    assert "lines 1-1 of 1 (line 1 cut at 100000 bytes)" in note, done.stderr
    assert int(grown_kb) < 20_000, f"peak RSS grew {grown_kb} KB reading 512 MiB twice"


# --- run_python ---


def test_run_python_returns_exit_code_and_both_streams(ctx):
    result = call(ctx, "run_python", code="import sys; print('out'); print('err', file=sys.stderr)")
    assert "is_error" not in result
    assert "exit code: 0" in result["content"]
    assert "--- stdout ---\nout" in result["content"] and "--- stderr ---\nerr" in result["content"]


def test_run_python_runs_in_the_workdir_with_this_interpreter(ctx):
    result = call(
        ctx, "run_python", code="import os, sys; print(os.getcwd()); print(sys.executable)"
    )
    assert str(ctx.workdir) in result["content"] and os.sys.executable in result["content"]


def test_non_zero_exit_sends_output_and_code_back(ctx):
    result = call(ctx, "run_python", code="print('partial'); raise SystemExit(3)")
    assert result["is_error"] and "exit code: 3" in result["content"]
    assert "partial" in result["content"]


def test_timeout_is_an_error_that_says_how_long(ctx):
    ctx = agent.ToolContext(ctx.workdir, agent.Limits(tool_timeout=0.5), ctx.sandbox, ctx.approve)
    started = time.monotonic()
    result = call(ctx, "run_python", code="import time; print('start', flush=True); time.sleep(30)")
    assert time.monotonic() - started < 5
    assert result["is_error"] and "timed out after 0.5 s" in result["content"]
    assert "start" in result["content"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # meant to be
def test_a_sigterm_that_python_swallows_still_stops_the_running_script(ctx, monkeypatch):
    """A signal can land in an at-fork hook (subprocess runs them) or a __del__, where the
    handler's KeyboardInterrupt is reported and dropped: seen as a SIGTERM that left the agent
    waiting for its script. The handler's flag must stop the wait all the same."""
    monkeypatch.setattr(agent, "STOPPING", threading.Event())
    previous = signal.signal(signal.SIGTERM, agent.on_stop_signal)

    class Swallows:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)  # the KeyboardInterrupt dies here

    try:
        Swallows()
        assert agent.STOPPING.is_set()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            agent.execute("import time; time.sleep(30)", ctx.workdir, ctx.sandbox, 20, 1000)
        assert time.monotonic() - started < 5
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_declined_call_still_gets_a_result_telling_the_model_to_ask(ctx):
    ctx = agent.ToolContext(ctx.workdir, ctx.limits, ctx.sandbox, approve=lambda code: False)
    result = call(ctx, "run_python", code="open('ran', 'w')")
    assert result["is_error"] and "declined" in result["content"]
    assert "Do not retry" in result["content"] and "ask" in result["content"]
    assert not (ctx.workdir / "ran").exists()


# --- the dispatcher: call_tool and run_tools ---


def test_unknown_tool_lists_the_real_ones(ctx):
    result = call(ctx, "write_file", path="x")
    assert result["is_error"] and "read_file, run_python" in result["content"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({}, "missing the required argument 'path'"),
        ({"path": 5}, "'path' must be a string"),
        ({"path": "a", "offset": True}, "'offset' must be a integer"),
        ({"path": "a", "offset": 0}, "at least 1"),
        ({"path": "a", "mode": "r"}, "no argument 'mode'"),
    ],
)
def test_arguments_are_checked_even_though_the_schema_says_required(ctx, args, fragment):
    result, _ = agent.call_tool(tool_use("read_file", args), ctx)
    assert result["is_error"] and fragment in result["content"]


def test_input_that_is_not_an_object_is_an_error(ctx):
    result, _ = agent.call_tool(tool_use("run_python", "print(1)"), ctx)
    assert result["is_error"] and "takes an object" in result["content"]


def test_a_crashing_tool_becomes_an_error_result(ctx, monkeypatch):
    monkeypatch.setitem(agent.TOOL_FUNCTIONS, "read_file", lambda ctx, path: 1 / 0)
    result = call(ctx, "read_file", path="x")
    assert result["is_error"] and "ZeroDivisionError" in result["content"]


def test_results_keep_call_order_and_reads_run_concurrently(ctx, monkeypatch):
    barrier, order = threading.Barrier(3, timeout=3), []

    def slow_read(ctx, path):
        barrier.wait()  # only passes if all three reads are in flight at once
        return f"read {path}"

    def ordered_python(ctx, code):
        order.append(code)
        return f"ran {code}"

    monkeypatch.setitem(agent.TOOL_FUNCTIONS, "read_file", slow_read)
    monkeypatch.setitem(agent.TOOL_FUNCTIONS, "run_python", ordered_python)
    blocks = [
        tool_use("run_python", {"code": "1"}),
        tool_use("read_file", {"path": "a"}),
        tool_use("read_file", {"path": "b"}),
        tool_use("run_python", {"code": "2"}),
        tool_use("read_file", {"path": "c"}),
    ]
    results, calls, _ = agent.run_tools(blocks, ctx, Silent())
    assert [r["tool_use_id"] for r in results] == [b["id"] for b in blocks]
    assert [r["content"] for r in results] == ["ran 1", "read a", "read b", "ran 2", "read c"]
    assert order == ["1", "2"]
    assert [c["name"] for c in calls] == [b["name"] for b in blocks]
    assert all(not c["is_error"] and c["seconds"] >= 0 for c in calls)


def test_four_hundred_reads_in_one_turn_stay_within_the_budget(capsys, workdir):
    for i in range(5):
        (workdir / f"f{i}.txt").write_text(("%d" % i) * 90_000)
    calls = [tool_use("read_file", {"path": f"f{i % 5}.txt"}) for i in range(400)]
    client = FakeClient(reply(*calls), reply(text("done")))
    code, _, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    results = final_messages(client)[-1]["content"]
    sent = sum(len(r["content"].encode()) for r in results)
    assert code == 0 and len(results) == 400
    assert sent <= agent.Limits.turn_bytes + 400 * 300
    assert len(json.dumps(client.requests[-1])) < 1_000_000  # far below the API's 32 MB
    skipped = [r for r in results if "Read fewer files at once" in r["content"]]
    assert len(skipped) >= 395 and all(r["is_error"] for r in skipped)
    assert results[0]["content"] == "0" * 90_000  # the first ones went through, in order


def test_one_reply_of_thousands_of_reads_costs_the_memory_of_a_few(
    capsys, workdir, tmp_path, agent_copy
):
    """One reply holding 5,000 read_file calls of a 100 KB file (a forged recording, replayed;
    a server can send the same reply live, within max_tokens): before, every result was held
    until the turn's byte budget cut them (5,000 x 100 KB), a peak RSS of about 500 MiB
    (2 GiB for 20,000); now a turn runs at most Limits.turn_calls calls, answers the rest with
    an error, and agent.py's peak stays that of a small run."""
    (workdir / "big.txt").write_text(("y" * 99 + "\n") * 1000)
    path = tmp_path / "wide.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(
            reply(tool_use("read_file", {"path": "big.txt"}, id="toolu_0")), reply(text("done"))
        ),
    )
    recorded = json.loads(path.read_text())
    call_, result = recorded["messages"][1]["content"][0], recorded["messages"][2]["content"][0]
    recorded["messages"][1]["content"] = [{**call_, "id": f"toolu_{i}"} for i in range(5000)]
    recorded["messages"][2]["content"] = [
        {**result, "tool_use_id": f"toolu_{i}", "content": "x"} for i in range(5000)
    ]
    recorded["turns"][0]["tool_calls"] = [
        {**recorded["turns"][0]["tool_calls"][0], "id": f"toolu_{i}"} for i in range(5000)
    ]
    path.write_text(json.dumps(recorded))
    code, err, rss, _ = measured(
        agent_copy, "--replay", path, "--workdir", workdir, "--quiet", "--no-keep", cwd=tmp_path
    )
    assert code == 0, err[-300:]
    assert rss < 150, rss  # MiB


def test_a_turn_runs_at_most_turn_calls_calls(capsys, workdir):
    """A reply of 200 run_python calls under --yes: each would run (200 scripts, a turn's time
    only bounded by calls x --tool-timeout). Now the first Limits.turn_calls run, in order, and
    the rest are answered, never run."""
    code_ = "open('ran.txt', 'a').write('x')"
    calls = [tool_use("run_python", {"code": code_}) for _ in range(200)]
    client = FakeClient(reply(*calls), reply(text("done")))
    code, _, _ = run_cli(capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox"], client)
    results = final_messages(client)[-1]["content"]
    limit = agent.Limits.turn_calls
    assert code == 0 and (workdir / "ran.txt").read_text() == "x" * limit < "x" * 200
    assert [r["tool_use_id"] for r in results] == [c["id"] for c in calls]
    assert all(r["is_error"] and "Not run" in r["content"] for r in results[limit:])
    assert not any(r.get("is_error") for r in results[:limit])


class SlowStdin(io.StringIO):
    def readline(self, *args):
        time.sleep(1.0)  # the user thinking it over
        return "y\n"


def test_tool_time_leaves_out_the_wait_for_approval(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(reply(tool_use("run_python", {"code": "print(1)"})), reply(text("ok")))
    code, _, _ = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--no-sandbox", "--transcript", str(path)],
        client,
        stdin=SlowStdin(),
    )
    call = json.loads(path.read_text())["turns"][0]["tool_calls"][0]
    assert code == 0 and call["seconds"] < 0.9


# --- the approval prompt ---


def test_without_yes_the_code_is_shown_and_y_runs_it(capsys, workdir):
    client = FakeClient(reply(tool_use("run_python", {"code": "print(6*7)"})), reply(text("42")))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client, stdin="y\n")
    assert code == 0 and "print(6*7)" in err and "[y/N]" in err
    assert "42" in final_messages(client)[-1]["content"][0]["content"]


def test_an_answer_read_from_a_pipe_is_echoed_and_ends_the_line(capsys, workdir):
    """newuser2 N3: `echo y | agent.py ...` showed no answer, so the next line was glued to
    the prompt; the answer is shown after it, said to come from stdin, and the line ends."""
    for given, shown in (("y\n", "y"), ("n\n", "n"), ("y", "y")):
        client = FakeClient(
            reply(tool_use("run_python", {"code": "print(6*7)"})), reply(text("42"))
        )
        code, _, err = run_cli(
            capsys, ["q", "--workdir", str(workdir), "--no-sandbox"], client, stdin=given
        )
        assert code == 0 and f"--- run it? [y/N] {shown} (from stdin)\n" in err, err
        assert "(no answer)" not in err
    done = run_agent_py(
        AGENT,
        "--replay",
        AGENT.parent / "workspace" / "example-run.json",
        "--workdir",
        AGENT.parent / "workspace",
        env=agent_env(),
        input="y\n",
        timeout=60,
    )
    assert done.returncode == 0 and "--- run it? [y/N] y (from stdin)\n" in done.stderr


@pytest.mark.parametrize("stdin", ["n\n", "", "sure\n"])
def test_anything_but_yes_declines(capsys, workdir, stdin):
    client = FakeClient(
        reply(tool_use("run_python", {"code": "open('ran', 'w')"})), reply(text("ok"))
    )
    code, _, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], client, stdin=stdin)
    result = final_messages(client)[-1]["content"][0]
    assert code == 0 and result["is_error"] and "declined" in result["content"]
    assert not (workdir / "ran").exists()


def test_decline_message_can_be_replaced(capsys, workdir):
    client = FakeClient(reply(tool_use("run_python", {"code": "1"})), reply(text("ok")))
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--decline-message", "declined"],
        client,
        stdin="n\n",
    )
    assert final_messages(client)[-1]["content"][0]["content"] == "declined"


def test_the_approval_prompt_shows_what_would_be_hidden(capsys, workdir):
    code_ = "print('harmless')\rimport os; os.remove('scores.csv')  \x1b[2K\u202e# ok"
    client = FakeClient(reply(tool_use("run_python", {"code": code_})), reply(text("ok")))
    _, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client, stdin="n\n")
    assert "\u27e6U+000D\u27e7" in err and "\u27e6U+001B\u27e7[2K" in err
    assert "\u27e6U+202E\u27e7 is RIGHT-TO-LEFT OVERRIDE" in err
    assert "\x1b" not in err and "\r" not in err and "\u202e" not in err
    assert (workdir / "scores.csv").exists()


DRAWN_AS_NOTHING = {  # one of each kind the question must make visible
    "zero-width space": "\u200b",
    "soft hyphen": "\xad",
    "variation selector": "\ufe0f",
    "tag character": "\U000e0041",
    "Hangul filler": "\u3164",
    "word joiner": "\u2060",
    "combining grapheme joiner": "\u034f",
    "Mongolian vowel separator": "\u180e",
    "braille blank": "\u2800",
    "halfwidth Hangul filler": "\uffa0",
    "BOM": "\ufeff",
    "ideographic space": "\u3000",
    "no-break space": "\xa0",
    "line separator": "\u2028",
}


@pytest.mark.parametrize("name", sorted(DRAWN_AS_NOTHING))
def test_the_approval_prompt_shows_every_character_drawn_as_nothing(name):
    char = DRAWN_AS_NOTHING[name]
    question = agent.approval_question(f"x = 'a{char}b'\n", 24, 80)
    assert char not in question and f"\u27e6U+{ord(char):04X}\u27e7" in question


LOOK_ALIKES = [  # pairs of programs that differ, which a terminal draws alike
    ("print('paypal')", "print('p\u0430yp\u0430l')"),  # Cyrillic а
    ("import os", "imp\u03bfrt os"),  # Greek ο
    ("x = 1", "x = \uff11"),  # a full-width digit
    ("if a: pass", "if a:\u00a0pass"),  # a no-break space
    ("s = '口'", "s = '\u30ed'"),  # katakana ro, drawn like the Han 'mouth'
    ("s = '一'", "s = '\u30fc'"),  # the long-vowel mark, like the Han 'one'
    ("s = 'へ'", "s = '\u30d8'"),  # katakana he, like hiragana he
    ("s = '豈'", "s = '\uf900'"),  # a compatibility ideograph, a copy of a unified one
    ("    x = 1", "\tx = 1"),  # a tab
    ("x = 1", "x = 1 "),  # a space that ends a line
    ("x = 1", "x = 1\n"),  # a final newline
    ("a = 1\nb = 2", "a = 1\u2028b = 2"),  # a line separator
    ("s = '\u27e6U+0430\u27e7'", "s = '\u0430'"),  # the escape itself, written out
]


@pytest.mark.parametrize("a, b", LOOK_ALIKES)
def test_two_programs_that_differ_never_look_the_same_at_the_question(a, b):
    assert agent.approval_question(a, 24, 80) != agent.approval_question(b, 24, 80)


class CtrlC:
    """A terminal where the user presses Ctrl-C instead of answering."""

    def readline(self):
        raise KeyboardInterrupt


def test_ctrl_c_at_the_approval_question_says_the_call_was_not_run(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(reply(tool_use("run_python", {"code": "open('x', 'w')"}, id="toolu_Q")))
    code, _, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--no-sandbox", "--transcript", str(path)],
        client,
        stdin=CtrlC(),
    )
    answer = json.loads(path.read_text())["messages"][-1]["content"][0]
    assert code == 130 and answer["tool_use_id"] == "toolu_Q" and answer["is_error"]
    assert "at its approval question: it was not run" in answer["content"]
    assert "while it ran" not in answer["content"] and not (workdir / "x").exists()


def test_a_terminal_of_no_size_counts_as_a_screen_of_24_rows(monkeypatch):
    """`script` gives its pty 0 rows and 0 columns: no count of rows scrolled off from that."""
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((0, 0)))
    assert agent.terminal_size() == (24, 80)
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((120, 50)))
    assert agent.terminal_size() == (50, 120)


def test_nothing_shown_as_it_is_can_pass_for_the_escape_brackets():
    """〚〛 (and 〘〙) are drawn like ⟦⟧: a real Cyrillic а where the harm is, and a fake
    〚U+0430〛 where it is not, would read the same as the other way round."""
    a = "open('/d\u0430ta').write(''); s = '\u301aU+0430\u301b'"
    b = "open('/d\u301aU+0430\u301bta').write(''); s = '\u0430'"
    drawn = str.maketrans("\u301a\u301b\u3018\u3019", "\u27e6\u27e7\u27e6\u27e7")
    assert agent.approval_question(a, 24, 80).translate(drawn) != agent.approval_question(
        b, 24, 80
    ).translate(drawn)
    for ch in "\u301a\u301b\u3018\u3019":
        assert f"\u27e6U+{ord(ch):04X}\u27e7" in agent.approval_question(f"s = '{ch}'", 24, 80)


def test_the_question_is_one_to_one_over_a_hostile_alphabet():
    """No two of 20,000 random programs over look-alikes, invisibles and controls render alike."""
    alphabet = (
        "ao0O1l \t\n'\"\\\u0430\u043e\u03bf\u200b\u2060\ufe0f\xad\u3000\xa0\u202e"
        "\r\x1b\u27e6\u27e7U+\u2420\u2409\u2502口ロ一ー平均"
    )
    rng, seen = random.Random(19), {}
    for _ in range(20_000):
        code_ = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        shown = agent.approval_question(code_, 24, 80)
        assert seen.setdefault(shown, code_) == code_, (seen[shown], code_)


def test_cjk_text_stays_readable_at_the_question(capsys, workdir):
    code_ = "print('scores.csv 里平均分是多少？')  # 「平均」、한국어、ひらがな"
    client = FakeClient(reply(tool_use("run_python", {"code": code_})), reply(text("ok")))
    _, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client, stdin="n\n")
    assert "   1\u2502 " + code_ in err and "code point" not in err


def test_code_longer_than_the_screen_is_asked_about_with_its_header_again():
    long = "\n".join(f"x{i} = {i}" for i in range(60))
    question = agent.approval_question(long, 24, 80)
    above = question.splitlines()[-2:]  # what a 24-row screen shows right above the question
    assert above[0] == (
        "--- run_python wants to run the 60 lines above; 39 rows of them "
        "scrolled off the top of the screen (scroll up to read them) ---"
    )
    assert above[1] == "--- run it? [y/N] "
    assert "above" not in agent.approval_question("x = 1", 24, 80)
    wide = agent.approval_question("s = '" + "平" * 200 + "'", 24, 80)  # wraps onto 6 rows
    assert "lines above" not in wide and "lines above" in agent.approval_question(
        "s = '" + "平" * 200 + "'\n" * 18, 24, 80
    )  # 19 lines on 24 rows: too tall, wrapped


def test_the_line_of_a_failed_script_with_nothing_on_stderr_says_how_it_ended(capsys, workdir):
    """A timeout, or a non-zero exit with an empty stderr, showed `-> error: --- stderr ---`
    (the marker of the empty stderr); now how it ended (newuser #10). A script that writes to
    stderr still shows its last line."""
    client = FakeClient(
        reply(
            tool_use("run_python", {"code": "import time\nprint('partial')\ntime.sleep(30)"}),
            tool_use("run_python", {"code": "import sys\nprint('x')\nsys.exit(3)"}),
            tool_use("run_python", {"code": "1/0"}),
        ),
        reply(text("done")),
    )
    code, _, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--yes", "--no-sandbox", "--tool-timeout", "1"],
        client,
    )
    lines = [line.split(" -> ")[1] for line in err.splitlines() if " -> " in line]
    assert code == 0 and len(lines) == 3, err
    assert lines[0].startswith("error: timed out after 1 s (")
    assert lines[1].startswith("error: exit code 3 (")
    assert lines[2].startswith("error: ZeroDivisionError: division by zero (")


@pytest.mark.parametrize("flags", [["--no-sandbox"], []], ids=["unconfined", "sandboxed"])
def test_what_a_timed_out_script_printed_reaches_the_model(capsys, workdir, flags):
    """Its stdout is a pipe: block-buffered, what it printed died with it, and `Output so far`
    was empty, the very output that shows where it hung (newuser2 N9)."""
    client = FakeClient(
        reply(tool_use("run_python", {"code": "import time\nprint('partial')\ntime.sleep(30)"})),
        reply(text("done")),
    )
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--yes", "--tool-timeout", "2", *flags], client
    )
    result = final_messages(client)[-1]["content"][0]
    assert code == 0 and result["is_error"], err
    assert "Output so far:\n--- stdout ---\npartial\n" in result["content"], result["content"]
