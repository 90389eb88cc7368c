"""agent.py without a model: tools on tmp_path, the loop driven by a scripted FakeClient."""

import io
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import agent
from api_rules import check_request
from conftest import DOTENV_FILES
from fakes import (APIConnectionError, FakeAPIError, FakeClient, Midstream, RECORDED, Truncated,
                   recorded_loop, reply, text, tool_use)


def run(capsys, argv, client, stdin=""):
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    code = agent.main(argv, client=client, stdin=io.StringIO(stdin))
    out, err = capsys.readouterr()
    return code, out, err


def unconfined(tmp_path):
    return agent.Sandbox(tmp_path, False, agent.Limits())


@pytest.fixture
def ctx(workdir, tmp_path):
    return agent.ToolContext(Path(os.path.realpath(workdir)), agent.Limits(),
                             unconfined(tmp_path), approve=lambda code: True)


def call(ctx, name, **args):
    return agent.call_tool(tool_use(name, args), ctx)[0]


# --- tools: read_file ---

def test_read_file_returns_the_text(ctx):
    result = call(ctx, "read_file", path="scores.csv")
    assert result == {"type": "tool_result", "tool_use_id": result["tool_use_id"],
                      "content": "name,score\nAlice,88\nBob,72\nChen,95\n"}


def test_read_file_accepts_an_absolute_path_inside(ctx):
    assert "Alice" in call(ctx, "read_file", path=str(ctx.workdir / "scores.csv"))["content"]


@pytest.mark.parametrize("path", ["../secret.txt", "/etc/passwd", "sub/../../secret.txt"])
def test_read_file_refuses_paths_outside(ctx, path):
    result = call(ctx, "read_file", path=path)
    assert result["is_error"] and "outside the working directory" in result["content"]


def test_read_file_resolves_symlinks_before_the_check(ctx):
    (ctx.workdir / "link").symlink_to("/etc/passwd")
    (ctx.workdir / "inner").symlink_to(ctx.workdir / "scores.csv")
    assert "outside" in call(ctx, "read_file", path="link")["content"]
    assert "Alice" in call(ctx, "read_file", path="inner")["content"]


def test_missing_file_suggests_listing_with_run_python(ctx):
    result = call(ctx, "read_file", path="winter.md")
    assert result["is_error"] and "run_python" in result["content"]
    assert "os.listdir" in result["content"]


def test_directory_is_an_error_that_says_how_to_list_it(ctx):
    (ctx.workdir / "reports").mkdir()
    result = call(ctx, "read_file", path="reports")
    assert result["is_error"] and "is a directory" in result["content"]


def test_non_utf8_is_an_error(ctx):
    (ctx.workdir / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    result = call(ctx, "read_file", path="blob.bin")
    assert result["is_error"] and "not UTF-8" in result["content"]


def test_fifo_and_device_are_refused_without_blocking(ctx):
    os.mkfifo(ctx.workdir / "pipe")
    os.mknod(ctx.workdir / "null", 0o600 | 0o020000, os.makedev(1, 3))  # a char device
    results = {}
    worker = threading.Thread(target=lambda: results.update(
        fifo=call(ctx, "read_file", path="pipe"), dev=call(ctx, "read_file", path="null")))
    worker.start()
    worker.join(timeout=3)
    assert not worker.is_alive(), "read_file blocked on a FIFO"
    assert results["fifo"]["is_error"] and "not a regular file" in results["fifo"]["content"]
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


# --- tools: the dispatcher ---

def test_unknown_tool_lists_the_real_ones(ctx):
    result = call(ctx, "write_file", path="x")
    assert result["is_error"] and "read_file, run_python" in result["content"]


@pytest.mark.parametrize("args, fragment", [
    ({}, "missing the required argument 'path'"),
    ({"path": 5}, "'path' must be a string"),
    ({"path": "a", "offset": True}, "'offset' must be a integer"),
    ({"path": "a", "offset": 0}, "at least 1"),
    ({"path": "a", "mode": "r"}, "no argument 'mode'"),
])
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


class Silent(agent.Reporter):
    def line(self, *a, **k):
        pass


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
    blocks = [tool_use("run_python", {"code": "1"}), tool_use("read_file", {"path": "a"}),
              tool_use("read_file", {"path": "b"}), tool_use("run_python", {"code": "2"}),
              tool_use("read_file", {"path": "c"})]
    results, calls = agent.run_tools(blocks, ctx, Silent())
    assert [r["tool_use_id"] for r in results] == [b["id"] for b in blocks]
    assert [r["content"] for r in results] == ["ran 1", "read a", "read b", "ran 2", "read c"]
    assert order == ["1", "2"]
    assert [c["name"] for c in calls] == [b["name"] for b in blocks]
    assert all(not c["is_error"] and c["seconds"] >= 0 for c in calls)


# --- tools: run_python ---

def test_run_python_returns_exit_code_and_both_streams(ctx):
    result = call(ctx, "run_python", code="import sys; print('out'); print('err', file=sys.stderr)")
    assert "is_error" not in result
    assert "exit code: 0" in result["content"]
    assert "--- stdout ---\nout" in result["content"] and "--- stderr ---\nerr" in result["content"]


def test_run_python_runs_in_the_workdir_with_this_interpreter(ctx):
    result = call(ctx, "run_python", code="import os, sys; print(os.getcwd()); print(sys.executable)")
    assert str(ctx.workdir) in result["content"] and os.sys.executable in result["content"]


def test_non_zero_exit_sends_output_and_code_back(ctx):
    result = call(ctx, "run_python", code="print('partial'); raise SystemExit(3)")
    assert result["is_error"] and "exit code: 3" in result["content"]
    assert "partial" in result["content"]


def test_timeout_is_an_error_that_says_how_long(ctx):
    ctx = agent.ToolContext(ctx.workdir, agent.Limits(tool_timeout=0.5), ctx.sandbox,
                            ctx.approve)
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


# --- stop conditions: one test per label ---

def final_messages(client):
    return client.requests[-1]["messages"]


def test_end_turn(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "scores.csv"})),
                        reply(text("The average is 85.")))
    code, out, err = run(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out) == (0, "The average is 85.\n")
    assert len(client.requests) == 2
    assert final_messages(client)[-1]["content"][0]["content"].startswith("name,score")
    assert "stop: end_turn" in err


def test_stop_sequence(capsys, workdir):
    client = FakeClient(reply(text("The beautiful city of "), stop_reason="stop_sequence"))
    code, out, _ = run(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out, len(client.requests)) == (0, "The beautiful city of \n", 1)


def test_max_turns_last_turn_has_tools_off_and_prints_an_interim_answer(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "scores.csv"})),
                        reply(tool_use("read_file", {"path": "notes.md"})),
                        reply(text("Interim: I read two files.")))
    code, out, err = run(capsys, ["q", "--workdir", str(workdir), "--max-turns", "3"], client)
    assert (code, out) == (3, "Interim: I read two files.\n")
    assert len(client.requests) == 3
    assert [r.get("tool_choice") for r in client.requests] == [None, None, {"type": "none"}]
    last_user = final_messages(client)[-1]["content"]
    assert last_user[0]["type"] == "tool_result" and "# Notes" in last_user[0]["content"]
    assert last_user[-1] == {"type": "text", "text": agent.FINAL_TURN_NOTE}
    assert "stop: max_turns" in err


def test_max_turns_one_is_a_single_request_with_tools_off(capsys, workdir):
    client = FakeClient(reply(text("Without tools: unknown.")))
    code, out, _ = run(capsys, ["q", "--workdir", str(workdir), "--max-turns", "1"], client)
    assert (code, out, len(client.requests)) == (3, "Without tools: unknown.\n", 1)
    assert client.requests[0]["tool_choice"] == {"type": "none"}
    assert client.requests[0]["messages"][0]["content"][-1]["text"] == agent.FINAL_TURN_NOTE


def test_token_budget_stops_before_the_tools_run(capsys, workdir, tmp_path):
    transcript = tmp_path / "run.json"
    client = FakeClient(reply(tool_use("run_python", {"code": "open('ran', 'w')"}),
                              input_tokens=900, output_tokens=200))
    code, out, err = run(capsys, ["q", "--workdir", str(workdir), "--token-budget", "1000",
                                  "--yes", "--no-sandbox", "--transcript", str(transcript)], client)
    assert (code, out, len(client.requests)) == (4, "", 1)
    assert not (workdir / "ran").exists()
    saved = json.loads(transcript.read_text())
    assert saved["stop"]["reason"] == "token_budget"
    assert saved["messages"][-1]["role"] == "assistant"  # the dangling tool_use stays
    assert saved["messages"][-1]["content"][0]["type"] == "tool_use"
    assert saved["turns"][0]["tool_calls"] == []


def test_an_answer_that_crosses_the_budget_is_still_an_answer(capsys, workdir):
    client = FakeClient(reply(text("42"), input_tokens=5000))
    code, out, _ = run(capsys, ["q", "--workdir", str(workdir), "--token-budget", "10"], client)
    assert (code, out) == (0, "42\n")


def test_token_budget_counts_cache_tokens(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "a"}), input_tokens=1,
                              output_tokens=1, write=500, read=600))
    code, _, _ = run(capsys, ["q", "--workdir", str(workdir), "--token-budget", "1100"], client)
    assert code == 4


def test_cost_budget(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "a"}), input_tokens=10_000))
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--budget-usd", "0.0005"], client)
    assert (code, len(client.requests)) == (4, 1)
    assert "stop: cost_budget" in err


def test_max_tokens_prints_the_partial_text(capsys, workdir):
    client = FakeClient(reply(text("The answer is"), stop_reason="max_tokens"))
    code, out, err = run(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out, len(client.requests)) == (5, "The answer is\n", 1)


def test_refusal(capsys, workdir):
    client = FakeClient(reply(text(""), stop_reason="refusal"))
    code, out, err = run(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out, len(client.requests)) == (5, "", 1)
    assert "stop: refusal" in err


def test_model_context_window_exceeded(capsys, workdir):
    client = FakeClient(reply(text("Partial"), stop_reason="model_context_window_exceeded"))
    code, out, _ = run(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out) == (5, "Partial\n")


def test_api_error_keeps_the_turns_done(capsys, workdir, tmp_path):
    transcript = tmp_path / "run.json"
    client = FakeClient(reply(tool_use("read_file", {"path": "scores.csv"})),
                        FakeAPIError(400, "invalid_request_error", "max_tokens: Field required"))
    code, out, err = run(capsys, ["q", "--workdir", str(workdir), "--transcript",
                                  str(transcript)], client)
    assert (code, out, len(client.requests)) == (1, "", 2)
    assert "max_tokens: Field required" in err and "Traceback" not in err
    saved = json.loads(transcript.read_text())
    assert saved["stop"]["reason"] == "api_error" and len(saved["turns"]) == 1
    assert saved["messages"][-1]["content"][0]["type"] == "tool_result"


def test_401_names_the_key(capsys, workdir):
    client = FakeClient(FakeAPIError(401, "authentication_error", "invalid x-api-key"))
    code, _, err = run(capsys, ["q", "--workdir", str(workdir)], client)
    assert code == 1 and "invalid x-api-key" in err and "ANTHROPIC_API_KEY" in err


def test_unknown_stop_reason_is_an_error(capsys, workdir):
    client = FakeClient(reply(text("?"), stop_reason="compaction_v9"))
    code, _, err = run(capsys, ["q", "--workdir", str(workdir)], client)
    assert code == 1 and "stop: error" in err and "compaction_v9" in err


def test_interrupted(capsys, workdir, tmp_path):
    transcript = tmp_path / "run.json"

    def ctrl_c(request):
        raise KeyboardInterrupt

    client = FakeClient(reply(tool_use("read_file", {"path": "scores.csv"})), ctrl_c)
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--transcript",
                                str(transcript)], client)
    assert code == 130 and "Traceback" not in err
    saved = json.loads(transcript.read_text())
    assert saved["stop"]["reason"] == "interrupted" and len(saved["turns"]) == 1


def test_every_label_has_an_exit_code_and_the_help_lists_them():
    labels = {"end_turn", "stop_sequence", "max_turns", "token_budget", "cost_budget",
              "max_tokens", "refusal", "model_context_window_exceeded", "api_error", "error",
              "interrupted"}
    assert set(agent.EXIT_CODES) == labels
    for label in labels:
        assert label in agent.EPILOG


# --- the loop: what goes over the wire ---

def test_every_request_sends_system_tools_history_and_caching(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "scores.csv"})),
                        reply(text("done")))
    run(capsys, ["q", "--workdir", str(workdir), "--effort", "low"], client)
    for request in client.requests:
        assert request["system"] == agent.SYSTEM_PROMPT and request["tools"] == agent.TOOLS
        assert request["cache_control"] == {"type": "ephemeral"}
        assert request["output_config"] == {"effort": "low"}
        assert request["max_tokens"] == 16000
    assert len(client.requests[1]["messages"]) == 3  # question, tool_use, results


def test_parallel_calls_from_a_recorded_reply_get_one_message_in_order(capsys, workdir):
    first = recorded_loop("parallel_tool_use_four_calls_loop.jsonl")[0]["response"]["body"]
    client = FakeClient(first, reply(text("done")))
    code, _, _ = run(capsys, ["q", "--workdir", str(workdir)], client)
    ids = [b["id"] for b in first["content"] if b["type"] == "tool_use"]
    results = final_messages(client)[-1]
    assert code == 0 and len(ids) == 4
    assert [b["tool_use_id"] for b in results["content"]] == ids
    assert all(b["is_error"] and "no tool" in b["content"] for b in results["content"])


@pytest.mark.parametrize("name", ["thinking_signature_tool_use_loop.jsonl",
                                  "redacted_thinking_loop.jsonl"])
def test_thinking_blocks_go_back_byte_for_byte(capsys, workdir, name):
    first = recorded_loop(name)[0]["response"]["body"]
    if first["stop_reason"] != "tool_use":  # the redacted loop answers in text: ask a follow-up
        first = dict(first, stop_reason="tool_use",
                     content=first["content"] + [tool_use("read_file", {"path": "notes.md"})])
    client = FakeClient(first, reply(text("done")))
    code, _, _ = run(capsys, ["q", "--workdir", str(workdir)], client)
    sent = final_messages(client)[1]["content"]
    expected = [b for b in first["content"] if not (b["type"] == "text" and not b["text"])]
    assert code == 0 and json.dumps(sent) == json.dumps(expected)


def test_empty_text_blocks_are_dropped_from_history(capsys, workdir):
    client = FakeClient(reply(text(""), tool_use("read_file", {"path": "notes.md"})),
                        reply(text("done")))
    code, _, _ = run(capsys, ["q", "--workdir", str(workdir)], client)
    assert code == 0 and [b["type"] for b in final_messages(client)[1]["content"]] == ["tool_use"]


def test_pause_turn_sends_the_paused_content_back_as_the_last_message(capsys, workdir):
    paused = json.loads((RECORDED / "pause_turn.json").read_text())["response"]["body"]
    done = json.loads((RECORDED / "pause_turn_continuation_response.json").read_text())
    done = done["body"]
    client = FakeClient(paused, done)
    code, out, _ = run(capsys, ["q", "--workdir", str(workdir), "--transcript", "-"], client)
    assert code == 0 and len(client.requests) == 2
    last = client.requests[1]["messages"][-1]
    assert last["role"] == "assistant"
    assert json.dumps(last["content"]) == json.dumps(agent.check_reply(paused)[0])
    assert [t["stop_reason"] for t in json.loads(out)["turns"]] == ["pause_turn", "end_turn"]


def test_a_cut_tool_call_is_retried_once_with_twice_the_max_tokens(capsys, workdir):
    cut = reply(text("Let me run"), tool_use("run_python", {"code": "open('ran','w')"}),
                stop_reason="max_tokens")
    client = FakeClient(cut, reply(tool_use("read_file", {"path": "notes.md"})),
                        reply(text("done")))
    code, out, err = run(capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox",
                                  "--transcript", "-"], client)
    assert code == 0 and len(client.requests) == 3
    first, second = client.requests[:2]
    assert (first["max_tokens"], second["max_tokens"]) == (16000, 32000)
    assert second["messages"] == first["messages"]  # the cut reply never entered history
    assert not (workdir / "ran").exists()
    saved = json.loads(out)
    assert saved["turns"][0]["attempts"] == 2 and saved["turns"][0]["turn"] == 1
    assert saved["turns"][0]["usage"]["input_tokens"] == 200  # both responses were billed


def test_a_tool_call_cut_twice_stops_with_max_tokens(capsys, workdir):
    cut = reply(tool_use("run_python", {"code": "open('ran','w')"}), stop_reason="max_tokens")
    client = FakeClient(cut, json.loads(json.dumps(cut)))
    code, out, err = run(capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox",
                                  "--max-tokens", "100000"], client)
    assert (code, len(client.requests)) == (5, 2)
    assert client.requests[1]["max_tokens"] == 128000  # doubled, capped at the model's limit
    assert "cut inside a tool call at max_tokens 100000 and again at 128000" in err
    assert not (workdir / "ran").exists()


def test_a_tool_call_cut_at_the_models_limit_is_not_retried(capsys, workdir):
    cut = reply(tool_use("run_python", {"code": "open('ran','w')"}), stop_reason="max_tokens")
    client = FakeClient(cut)
    code, out, err = run(capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox",
                                  "--max-tokens", "128000", "--transcript", "-"], client)
    assert (code, len(client.requests)) == (5, 1)
    saved = json.loads(out)
    assert "at max_tokens 128000; the incomplete call was not run" in saved["stop"]["detail"]
    assert saved["messages"][-1]["role"] == "user"  # the cut call was not kept


# --- retries ---

def drive(client, workdir, tmp_path, **limits):
    session = agent.new_session("q", "claude-haiku-5-5", workdir, None)
    limits = agent.Limits(retry_base=0.0, **limits)
    ctx = agent.ToolContext(Path(os.path.realpath(workdir)), limits, unconfined(tmp_path),
                            approve=lambda c: True)
    stop = agent.drive(client, session, ctx, Silent(quiet=True), agent.Saver(None))
    return stop, session


@pytest.mark.parametrize("failure", [
    FakeAPIError(529, "overloaded_error", "Overloaded"),
    FakeAPIError(500, "api_error", "Internal server error"),
    FakeAPIError(429, "rate_limit_error", "slow down", {"retry-after": "0"}),
    APIConnectionError("Connection error."),
    Midstream(reply(text("par")), FakeAPIError(200, "overloaded_error", "Overloaded")),
    Truncated(reply(text("half"))),
])
def test_transient_failures_are_retried_within_the_turn(workdir, tmp_path, failure):
    client = FakeClient(failure, reply(text("ok")))
    stop, session = drive(client, workdir, tmp_path)
    assert stop.reason == "end_turn" and len(client.requests) == 2
    assert session["turns"][0]["attempts"] == 2 and len(session["turns"]) == 1


def test_at_most_five_requests_per_turn(workdir, tmp_path):
    client = FakeClient(*[FakeAPIError(529, "overloaded_error", "Overloaded")] * 6)
    stop, session = drive(client, workdir, tmp_path)
    assert stop.reason == "api_error" and "Overloaded" in stop.detail
    assert len(client.requests) == 5 and session["turns"] == []


def test_other_errors_are_not_retried(workdir, tmp_path):
    client = FakeClient(FakeAPIError(429, "rate_limit_error", "no", {"x-should-retry": "false"}))
    stop, _ = drive(client, workdir, tmp_path)
    assert stop.reason == "api_error" and len(client.requests) == 1


def test_retry_after_is_honoured(workdir, tmp_path):
    client = FakeClient(FakeAPIError(429, "rate_limit_error", "wait", {"retry-after": "0.3"}),
                        reply(text("ok")))
    started = time.monotonic()
    stop, _ = drive(client, workdir, tmp_path)
    assert stop.reason == "end_turn" and time.monotonic() - started >= 0.3


# --- transcript ---

def test_transcript_schema(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(reply(tool_use("read_file", {"path": "scores.csv"}), input_tokens=671,
                              output_tokens=40, write=0, read=0),
                        reply(text("85"), input_tokens=80, output_tokens=5, read=671))
    code, _, _ = run(capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], client)
    saved = json.loads(path.read_text())
    assert code == 0
    assert {"version", "model", "system", "tools", "workdir", "question", "messages", "turns",
            "stop", "answer", "usage"} <= set(saved)
    assert saved["version"] == 1 and saved["workdir"] == os.path.realpath(workdir)
    assert saved["stop"] == {"reason": "end_turn", "detail": "the model finished", "exit_code": 0}
    assert saved["answer"] == "85"
    turn = saved["turns"][0]
    assert set(turn) >= {"turn", "stop_reason", "usage", "request_id", "seconds", "tool_calls"}
    assert set(turn["usage"]) >= {"input_tokens", "output_tokens", "cache_creation_input_tokens",
                                  "cache_read_input_tokens", "cost_usd"}
    assert turn["tool_calls"][0]["name"] == "read_file" and not turn["tool_calls"][0]["is_error"]
    assert saved["usage"]["input_tokens"] == 751 and saved["usage"]["cache_read_input_tokens"] == 671
    assert saved["usage"]["tokens"] == 671 + 40 + 80 + 5 + 671
    # replayable as-is: history plus a follow-up is a valid request
    follow = saved["messages"] + [{"role": "user", "content": [text("and the median?")]}]
    assert check_request({"model": saved["model"], "max_tokens": 10, "tools": saved["tools"],
                          "messages": follow}) is None


def test_the_transcript_is_on_disk_before_any_tool_runs(capsys, workdir, tmp_path,
                                                         monkeypatch):
    path, seen, real = tmp_path / "run.json", [], agent.run_tools

    def peek(blocks, ctx, report):  # what a crash during these tools would leave on disk
        seen.append(json.loads(path.read_text()) if path.exists() else None)
        return real(blocks, ctx, report)

    monkeypatch.setattr(agent, "run_tools", peek)
    client = FakeClient(reply(tool_use("read_file", {"path": "notes.md"})),
                        reply(tool_use("read_file", {"path": "scores.csv"})),
                        reply(text("done")))
    run(capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], client)
    assert seen[0] is None  # nothing done yet that a crash could lose
    assert len(seen[1]["turns"]) == 1 and seen[1]["stop"] is None  # all of turn 1, results too
    assert seen[1]["messages"][-1]["content"][0]["type"] == "tool_result"
    assert json.loads(path.read_text())["stop"]["reason"] == "end_turn"


def test_each_save_writes_what_dump_would_write(capsys, workdir, tmp_path, monkeypatch):
    """Finished messages and turns are encoded once and reused: the bytes must stay those of
    dump(), across a growing history, the last turn's note appended to the last message, and
    a resume that appends its question."""
    saves = []

    class Checked(agent.Saver):
        def encode(self, document):
            got = super().encode(document)
            saves.append((got, agent.dump(document)))
            return got

    monkeypatch.setattr(agent, "Saver", Checked)
    path = tmp_path / "run.json"
    client = FakeClient(reply(tool_use("read_file", {"path": "notes.md"})),
                        reply(tool_use("read_file", {"path": "scores.csv"}),
                              tool_use("read_file", {"path": "notes.md"})),
                        reply(tool_use("read_file", {"path": "scores.csv"})),
                        reply(text("ok")), reply(text("again")))
    code, _, _ = run(capsys, ["q", "--workdir", str(workdir), "--transcript", str(path),
                              "--max-turns", "4"], client)
    assert code == 3  # the last turn: its note was appended to the last message
    code, _, _ = run(capsys, ["--resume", str(path), "and now?"], client)
    assert code == 0 and len(saves) == 5  # three turns, two stops
    assert all(got == want for got, want in saves)
    assert json.loads(path.read_text())["answer"] == "again"


def test_transcript_write_is_atomic(tmp_path):
    path = tmp_path / "run.json"
    out = agent.OutputFile(path, None)
    out.write(agent.dump({"ok": 0}))  # the first save renames; the next ones swap names
    inode = path.stat().st_ino
    out.write(agent.dump({"ok": 1}))
    assert path.stat().st_ino != inode and [p.name for p in tmp_path.iterdir()] == ["run.json"]

    class Halfway(bytes):  # a write that fails after the temp file was created
        def __len__(self):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        out.write(Halfway(b"x"))
    assert json.loads(path.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_transcript_dash_puts_only_json_on_stdout(capsys, workdir):
    client = FakeClient(reply(text("42")))
    code, out, err = run(capsys, ["q", "--workdir", str(workdir), "--transcript", "-"], client)
    assert code == 0 and json.loads(out)["answer"] == "42"  # the streamed text went to stderr


def normalise(transcript):
    """Drop what changes between runs: ids, times, paths."""
    text_ = json.dumps(transcript, ensure_ascii=False)
    text_ = text_.replace(transcript["workdir"], "<workdir>")
    data = json.loads(text_)
    data.update(run_id="<id>", started_at="<time>", ended_at="<time>")
    for turn in data["turns"]:
        turn.update(request_id="<id>", seconds=0, api_seconds=0, started_at="<time>",
                    message_id="<id>")
        for call_ in turn["tool_calls"]:
            call_["seconds"] = 0
    return data


def test_golden_transcript(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(
        reply(text("Reading."), tool_use("read_file", {"path": "scores.csv"}, id="toolu_A"),
              tool_use("read_file", {"path": "winter.md"}, id="toolu_B"),
              input_tokens=700, output_tokens=50),
        reply(tool_use("run_python", {"code": "print((88+72+95)/3)"}, id="toolu_C"),
              input_tokens=20, output_tokens=30, write=800, read=0),
        reply(text("The average is 85."), input_tokens=10, output_tokens=12, read=850))
    code, _, _ = run(capsys, ["scores.csv 里平均分是多少？", "--workdir", str(workdir), "--yes",
                              "--transcript", str(path)], client)
    assert code == 0
    golden = Path(__file__).with_name("golden_transcript.json")
    got = normalise(json.loads(path.read_text()))
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(json.dumps(got, ensure_ascii=False, indent=1) + "\n")
    assert got == json.loads(golden.read_text())


# --- resume ---

def budget_stopped(capsys, workdir, path):
    client = FakeClient(reply(tool_use("read_file", {"path": "scores.csv"}, id="toolu_X"),
                              input_tokens=2000))
    code, _, _ = run(capsys, ["q", "--workdir", str(workdir), "--token-budget", "1000",
                              "--transcript", str(path)], client)
    assert code == 4


def test_resume_answers_a_dangling_tool_use_and_keeps_numbering(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    budget_stopped(capsys, workdir, path)
    client = FakeClient(reply(text("Resumed answer.")))
    code, out, _ = run(capsys, ["--resume", str(path), "go on"], client)
    assert (code, out) == (0, "Resumed answer.\n")
    sent = client.requests[0]["messages"]
    assert sent[-1]["content"][0] == {
        "type": "tool_result", "tool_use_id": "toolu_X", "is_error": True,
        "content": sent[-1]["content"][0]["content"]}
    assert "not run" in sent[-1]["content"][0]["content"]
    assert sent[-1]["content"][-1] == text("go on")
    saved = json.loads(path.read_text())  # updated in place
    assert [t["turn"] for t in saved["turns"]] == [1, 2]
    assert saved["stop"]["reason"] == "end_turn" and saved["workdir"] == os.path.realpath(workdir)


def test_resume_without_a_question_continues_a_budget_stop(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    budget_stopped(capsys, workdir, path)
    client = FakeClient(reply(text("ok")))
    code, _, _ = run(capsys, ["--resume", str(path), "--transcript", str(tmp_path / "b.json")],
                     client)
    assert code == 0 and (tmp_path / "b.json").exists()
    assert json.loads(path.read_text())["stop"]["reason"] == "token_budget"  # left alone


def test_resumed_limits_count_afresh(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    budget_stopped(capsys, workdir, path)
    client = FakeClient(reply(tool_use("read_file", {"path": "notes.md"}), input_tokens=900),
                        reply(text("ok")))
    code, _, _ = run(capsys, ["--resume", str(path), "--token-budget", "1000"], client)
    assert code == 0 and len(client.requests) == 2


def test_resume_after_a_refusal_drops_the_refused_turn(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    run(capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(reply(text("I can't help with that part"), stop_reason="refusal")))
    client = FakeClient(reply(text("ok")))
    code, _, _ = run(capsys, ["--resume", str(path), "something else"], client)
    sent = client.requests[0]["messages"]
    assert code == 0 and [m["role"] for m in sent] == ["user"]
    assert sent[0]["content"][-1] == text("something else")


@pytest.mark.parametrize("content, fragment", [
    (None, "does not exist"),
    ("{not json", "not a readable JSON"),
    ('{"version": 1, "messages": []}', "not a version 1"),
    ('{"version": 1, "model": "m", "turns": [], "messages": [{"role": "user", "content": '
     '[{"type": "tool_use"}]}]}', "not a version 1"),
    ('{"version": 1, "model": "m", "turns": [{}], "messages": [{"role": "user", "content": '
     '[{"type": "text", "text": "q"}]}]}', "not a version 1"),
    ('[1, 2]', "not a version 1"),
])
def test_resume_of_a_bad_file_is_a_usage_error(capsys, tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    client = FakeClient()
    code, _, err = run(capsys, ["--resume", str(path), "more"], client)
    assert (code, client.requests) == (2, []) and fragment in err


def test_resume_keeps_the_transcripts_model_unless_told(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    budget_stopped(capsys, workdir, path)
    saved = json.loads(path.read_text())
    saved["model"] = "claude-opus-5-5"
    path.write_text(json.dumps(saved))
    client = FakeClient(reply(text("a")))
    run(capsys, ["--resume", str(path), "more"], client)
    assert client.requests[0]["model"] == "claude-opus-5-5"
    client = FakeClient(reply(text("b")))
    run(capsys, ["--resume", str(path), "more", "--model", "claude-sonnet-5-5"], client)
    assert client.requests[0]["model"] == "claude-sonnet-5-5"
    assert json.loads(path.read_text())["model"] == "claude-sonnet-5-5"


def test_resume_of_a_finished_transcript_needs_a_question(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    run(capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(reply(text("done"))))
    client = FakeClient()
    code, _, err = run(capsys, ["--resume", str(path)], client)
    assert (code, client.requests) == (2, []) and "finished" in err


# --- approval ---

def test_without_yes_the_code_is_shown_and_y_runs_it(capsys, workdir):
    client = FakeClient(reply(tool_use("run_python", {"code": "print(6*7)"})), reply(text("42")))
    code, _, err = run(capsys, ["q", "--workdir", str(workdir)], client, stdin="y\n")
    assert code == 0 and "print(6*7)" in err and "[y/N]" in err
    assert "42" in final_messages(client)[-1]["content"][0]["content"]


@pytest.mark.parametrize("stdin", ["n\n", "", "sure\n"])
def test_anything_but_yes_declines(capsys, workdir, stdin):
    client = FakeClient(reply(tool_use("run_python", {"code": "open('ran', 'w')"})),
                        reply(text("ok")))
    code, _, _ = run(capsys, ["q", "--workdir", str(workdir)], client, stdin=stdin)
    result = final_messages(client)[-1]["content"][0]
    assert code == 0 and result["is_error"] and "declined" in result["content"]
    assert not (workdir / "ran").exists()


def test_decline_message_can_be_replaced(capsys, workdir):
    client = FakeClient(reply(tool_use("run_python", {"code": "1"})), reply(text("ok")))
    run(capsys, ["q", "--workdir", str(workdir), "--decline-message", "declined"], client,
        stdin="n\n")
    assert final_messages(client)[-1]["content"][0]["content"] == "declined"


def test_the_api_key_never_reaches_run_python(capsys, workdir, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok")
    monkeypatch.chdir(workdir)
    (workdir / ".env").write_text("ANTHROPIC_API_KEY=sk-ant-from-dotenv\n")
    client = FakeClient(reply(tool_use("run_python", {"code": "import os; print(dict(os.environ))"})),
                        reply(text("ok")))
    run(capsys, ["q", "--yes"], client)
    shown = final_messages(client)[-1]["content"][0]["content"]
    assert "HOME" in shown and "sk-ant" not in shown and "tok" not in shown
    assert "ANTHROPIC" not in shown and "ANTHROPIC_API_KEY" not in os.environ.get("X", "")


# --- config and CLI ---

def test_dotenv_next_to_agent_py_is_the_fallback(tmp_path, monkeypatch):
    home, elsewhere = tmp_path / "agent", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (home / ".env").write_text("ANTHROPIC_API_KEY=beside-agent\n")
    monkeypatch.setattr(agent, "dotenv_files", DOTENV_FILES)
    monkeypatch.setattr(agent, "__file__", str(home / "agent.py"))
    monkeypatch.chdir(elsewhere)
    workdir = tmp_path / "data"
    assert agent.load_config(workdir, Silent())["ANTHROPIC_API_KEY"] == "beside-agent"
    (elsewhere / ".env").write_text("ANTHROPIC_API_KEY=from-cwd\n")
    assert agent.load_config(workdir, Silent())["ANTHROPIC_API_KEY"] == "from-cwd"


def test_dependencies_are_declared_inline_for_uv():
    header = Path(agent.__file__).read_text().split('"""', 1)[0]
    block = header[header.index("# /// script"):header.index("# ///\n")]
    assert '"anthropic' in block and '"python-dotenv' in block and "dependencies" in block
    requirements = Path(agent.__file__).with_name("requirements.txt").read_text().split()
    assert {r.split(">")[0] for r in requirements} == {"anthropic", "python-dotenv"}


def test_key_comes_from_dotenv_and_the_environment_wins(tmp_path, monkeypatch):
    (tmp_path / ".env").write_text("ANTHROPIC_API_KEY=from-file\nANTHROPIC_MODEL=m-file\n"
                                   "ANTHROPIC_BASE_URL=http://127.0.0.1:9\n")
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    monkeypatch.setattr(agent, "dotenv_files", DOTENV_FILES)
    monkeypatch.chdir(sub)
    monkeypatch.setenv("ANTHROPIC_MODEL", "m-env")
    config = agent.load_config(tmp_path / "data", Silent())
    assert config["ANTHROPIC_API_KEY"] == "from-file" and config["ANTHROPIC_MODEL"] == "m-env"
    assert config["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"  # an Anthropic-compatible server
    assert "ANTHROPIC_API_KEY" not in os.environ  # read, never loaded into the environment


@pytest.mark.parametrize("argv, fragment", [
    (["q", "--max-turns", "0"], "--max-turns must be at least 1"),
    (["q", "--workdir", "/no/such/dir"], "is not a directory"),
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
])
def test_usage_errors_exit_2_with_one_line_and_send_nothing(capsys, argv, fragment):
    client = FakeClient()
    code, out, err = run(capsys, argv, client)
    assert (code, out, client.requests) == (2, "", []) and fragment in err
    assert len(err.strip().splitlines()) == 1


def test_missing_key_is_a_usage_error(capsys, workdir, monkeypatch, tmp_path):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(agent, "__file__", str(tmp_path / "agent.py"))  # no .env beside it
    code = agent.main(["q", "--workdir", str(workdir)])
    err = capsys.readouterr().err
    assert code == 2 and "ANTHROPIC_API_KEY" in err and ".env.example" in err


def test_unknown_model_has_null_cost_and_says_so_once(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "notes.md"})), reply(text("ok")))
    code, out, err = run(capsys, ["q", "--workdir", str(workdir), "--model", "claude-next-9",
                                  "--transcript", "-"], client)
    saved = json.loads(out)
    assert code == 0 and saved["usage"]["cost_usd"] is None
    assert all(t["usage"]["cost_usd"] is None for t in saved["turns"])
    assert err.count("no price is known for claude-next-9") == 1


# --- cost ---

def usage_(input_tokens=0, output_tokens=0, write=0, read=0, split=None):
    u = {"input_tokens": input_tokens, "output_tokens": output_tokens,
         "cache_creation_input_tokens": write, "cache_read_input_tokens": read}
    if split:
        u["cache_creation"] = {"ephemeral_5m_input_tokens": split[0],
                               "ephemeral_1h_input_tokens": split[1]}
    return u


def test_cost_haiku_5_5_lower_band():
    # 1000*0.10 + 500*0.50 + 2000*0.125 + 10000*0.01 = 700 per million
    assert agent.cost_usd("claude-haiku-5-5", usage_(1000, 500, 2000, 10000)) == pytest.approx(0.0007)


def test_cost_haiku_5_5_upper_band_counts_cache_tokens_in_the_prompt():
    # prompt 50k + 30k + 30k = 110k > 100k: 50000*0.5 + 1000*2.5 + 30000*0.625 + 30000*0.05
    assert agent.cost_usd("claude-haiku-5-5", usage_(50_000, 1000, 30_000, 30_000)) == \
        pytest.approx(0.04775)


def test_cost_band_edge_is_inclusive():
    # exactly 100,000 prompt tokens stays in the lower band: 100000*0.10 = 10000 per million
    assert agent.cost_usd("claude-haiku-5-5", usage_(100_000)) == pytest.approx(0.01)
    assert agent.cost_usd("claude-haiku-5-5", usage_(100_001)) == pytest.approx(0.0500005)


def test_cost_one_hour_writes_use_their_own_rate():
    # Sonnet 5.5: 600 five-minute writes at 2.50 + 400 one-hour writes at 4.00 = 3100 per million
    assert agent.cost_usd("claude-sonnet-5-5", usage_(write=1000, split=(600, 400))) == \
        pytest.approx(0.0031)


def test_cost_of_a_dated_id_and_an_unknown_model():
    assert agent.cost_usd("claude-haiku-4-5-20251001", usage_(1_000_000)) == pytest.approx(1.0)
    assert agent.cost_usd("claude-unknown", usage_(10)) is None


def test_cost_lands_in_the_transcript(capsys, workdir):
    client = FakeClient(reply(text("ok"), input_tokens=1000, output_tokens=500, write=2000,
                              read=10000))
    _, out, err = run(capsys, ["q", "--workdir", str(workdir), "--transcript", "-"], client)
    saved = json.loads(out)
    assert saved["turns"][0]["usage"]["cost_usd"] == pytest.approx(0.0007)
    assert saved["usage"]["cost_usd"] == pytest.approx(0.0007)
    assert "cache write 2000, read 10000" in err


# --- trials ---

def test_pass_at_k_and_pass_hat_k_by_hand():
    # n=5, c=3: pass@2 = 1 - C(2,2)/C(5,2) = 0.9; pass^2 = C(3,2)/C(5,2) = 0.3
    assert [agent.pass_at_k(5, 3, k) for k in range(1, 6)] == pytest.approx([0.6, 0.9, 1, 1, 1])
    assert [agent.pass_hat_k(5, 3, k) for k in range(1, 6)] == pytest.approx([0.6, 0.3, 0.1, 0, 0])


def test_trials_summary_and_transcripts(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    answers = ["42", "41", "42", "nope", "42"]
    client = FakeClient(*[reply(text(a)) for a in answers])
    code, out, err = run(capsys, ["q", "--workdir", str(workdir), "--trials", "5", "--expect",
                                  r"\b42\b", "--transcript", str(path)], client)
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
    client = FakeClient(reply(tool_use("read_file", {"path": "notes.md"})), reply(text("a")),
                        reply(tool_use("read_file", {"path": "notes.md"})), reply(text("b")))
    code, out, _ = run(capsys, ["q", "--workdir", str(workdir), "--trials", "2",
                                "--expect-tool", "read_file", "--expect-stop", "end_turn",
                                "--transcript", "-"], client)
    assert code == 0 and json.loads(out)["passes"] == 2


def test_a_trial_failing_on_an_api_error_counts_as_failed(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "notes.md"})),
                        FakeAPIError(400, "invalid_request_error", "bad"),
                        reply(tool_use("read_file", {"path": "notes.md"})), reply(text("ok")))
    code, out, _ = run(capsys, ["q", "--workdir", str(workdir), "--trials", "2",
                                "--expect-tool", "read_file", "--transcript", "-"], client)
    summary = json.loads(out)
    assert code == 6 and [t["stop"] for t in summary["trials"]] == ["api_error", "end_turn"]


def test_jobs_run_trials_at_once_without_interleaving_lines(capsys, workdir):
    barrier = threading.Barrier(2, timeout=5)

    def together(request):
        barrier.wait()  # both trials must be in flight at the same time
        return reply(text("line one\nline two"))

    client = FakeClient(together, together)
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--trials", "2", "--jobs", "2"],
                       client)
    assert code == 0
    trial_lines = [l for l in err.splitlines() if "line one" in l or "line two" in l]
    assert len(trial_lines) == 4 and all(l.startswith("[trial ") for l in trial_lines)


def test_trials_stop_on_a_signal_whose_keyboardinterrupt_python_swallowed(capsys, workdir,
                                                                        monkeypatch):
    """The handler's flag alone (its KeyboardInterrupt dropped in a __del__ or an at-fork
    hook, see on_stop_signal) must end trials as it ends a session: exit 130, not the next
    trial started and cut short as a failure."""
    monkeypatch.setattr(agent, "STOPPING", threading.Event())

    def slow(request):
        agent.STOPPING.set()  # what on_stop_signal does before its exception is lost
        time.sleep(1.0)
        return reply(text("late"))

    client = FakeClient(reply(text("first")), slow, reply(text("never")))
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--trials", "3"], client)
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
        code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--trials", "3",
                                    "--transcript", str(path)], client)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130 and time.monotonic() - started < 8
    assert "interrupted: 1 of 3 trials finished" in err
    summary = json.loads(path.read_text())
    assert summary["interrupted"] is True and summary["n"] == 2  # one finished, one cut short
    assert (summary["scored"], summary["errored"], summary["passes"]) == (1, 1, 1)
    assert json.loads((tmp_path / "run.2.json").read_text())["stop"]["reason"] == "interrupted"
    assert not (tmp_path / "run.3.json").exists()
