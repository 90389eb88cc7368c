"""Anthropic-compatible servers that deviate from the API, as llama.cpp's llama-server does
(tested by hand: README, "A local model"), each played by a stand-in that deviates the same
way. The harness absorbs each deviation: a documented stop, a valid next request, no traceback."""

import json
import time

import pytest

from fakes import FakeClient, reply, text, tool_use
from fake_api import stream_of
from test_agent import run
from test_events import events_of
from test_sdk_http import run as run_http, serve


def llama_ids(message, n):
    """What llama-server's replies look like: chatcmpl- ids, tool ids without toolu_, the
    model file as the model, and no cache_creation_input_tokens."""
    message = json.loads(json.dumps(message))
    message.update(id=f"chatcmpl-{n:032d}", model="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    for block in message["content"]:
        if block["type"] == "tool_use":
            block["id"] = f"{n:032x}"
    message["usage"].pop("cache_creation_input_tokens", None)
    return message


def test_a_tools_off_turn_that_still_calls_a_tool_ends_cleanly(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    stubborn = reply(text("Let me look first."), tool_use("read_file", {"path": "notes.md"}))
    client = FakeClient(stubborn)  # the stand-in ignores tool_choice: none
    code, out, err = run(capsys, ["q", "--workdir", str(workdir), "--max-turns", "1",
                                  "--transcript", str(path)], client)
    saved = json.loads(path.read_text())
    assert client.requests[0]["tool_choice"] == {"type": "none"}
    assert (code, out) == (3, "Let me look first.\n")
    assert "ignored tool_choice none, and its 1 tool call was not run" in saved["stop"]["detail"]
    assert "not run" in err
    assert saved["turns"][0]["tool_calls"] == []  # never run
    resumed = FakeClient(reply(text("Without it: no idea.")))
    code, _, _ = run(capsys, ["--resume", str(path), "go on"], resumed)
    answer = resumed.requests[0]["messages"][-1]["content"][0]
    assert code == 0 and answer["type"] == "tool_result" and "not run" in answer["content"]


def test_a_closed_kept_alive_connection_is_retried_at_once(request, capsys, workdir):
    api = serve(request, {"disconnect": True}, reply(text("ok")))
    started = time.monotonic()
    code, out, err = run_http(capsys, api, ["q", "--workdir", str(workdir)])
    assert (code, out, len(api.requests)) == (0, "ok\n", 2)
    assert "retrying in 0.0s" in err and time.monotonic() - started < 5


def test_a_servers_context_error_is_a_context_stop(request, capsys, workdir):
    too_long = {"status": 400, "body": {"error": {
        "code": 400, "message": "the request exceeds the available context size, try increasing "
        "it", "type": "exceed_context_size_error", "n_prompt_tokens": 9120, "n_ctx": 8192}}}
    api = serve(request, too_long)
    code, _, err = run_http(capsys, api, ["q", "--workdir", str(workdir)])
    assert code == 5 and "stop: model_context_window_exceeded" in err
    assert "exceeds the available context size" in err


def test_an_error_body_without_the_top_level_type_is_reported(request, capsys, workdir):
    broken = {"status": 500, "body": {"error": {"code": 500, "message": "slot unavailable",
                                                "type": "server_error"}}}
    api = serve(request, *[dict(broken, headers={"retry-after": "0"})] * 5)
    code, _, err = run_http(capsys, api, ["q", "--workdir", str(workdir)])
    assert code == 1 and "server_error: slot unavailable" in err and "Traceback" not in err


def test_a_cut_tool_call_that_cannot_fit_is_not_retried(capsys, workdir):
    cut = reply(tool_use("run_python", {"code": "x = 1"}), stop_reason="max_tokens",
                input_tokens=990_000)
    client = FakeClient(cut)
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox"], client)
    assert (code, len(client.requests)) == (5, 1)
    assert "not retried: its prompt of 990000 tokens and 32000 more would not fit the context " \
           "window of 1000000" in err


def test_llama_shaped_replies_go_through(request, capsys, workdir, tmp_path):
    from fake_api import FakeAPI
    api = FakeAPI([llama_ids(reply(tool_use("read_file", {"path": "notes.md"})), 1),
                   llama_ids(reply(text("Done.")), 2)], request_id=False).__enter__()
    request.addfinalizer(lambda: api.__exit__(None, None, None))
    path = tmp_path / "run.json"
    code, out, _ = run_http(capsys, api, ["q", "--workdir", str(workdir), "--transcript",
                                          str(path)])
    saved = json.loads(path.read_text())
    assert (code, out) == (0, "Done.\n") and not api.rejected
    assert [t["request_id"] for t in saved["turns"]] == [None, None]
    assert saved["turns"][0]["message_id"].startswith("chatcmpl-")
    assert saved["usage"]["cost_usd"] is not None


def test_a_stream_without_message_start_is_retried(request, capsys, workdir):
    events = stream_of(reply(text("broken"))).split("\n\n")
    api = serve(request, {"sse_text": "\n\n".join(events[1:])}, reply(text("ok")))
    code, out, err = run_http(capsys, api, ["q", "--workdir", str(workdir)])
    assert (code, out, len(api.requests)) == (0, "ok\n", 2) and "could not be read" in err


# --- models that think between tool calls, shown only on request ---

@pytest.mark.parametrize("model, shown", [("claude-sonnet-5-5", True), ("claude-opus-5-5", True),
                                          ("claude-haiku-5-5", False)])
def test_between_tool_notes_are_asked_for_and_shown(capsys, workdir, tmp_path, model, shown):
    thinking = {"type": "thinking", "thinking": "The scores are in scores.csv; read it.",
                "signature": "sig"}
    client = FakeClient(reply(thinking, tool_use("read_file", {"path": "scores.csv"})),
                        reply(text("85")))
    path = tmp_path / "e.jsonl"
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--model", model, "--events",
                                str(path)], client)
    asked = [r.get("thinking") for r in client.requests]
    assert code == 0
    assert asked == ([{"type": "adaptive", "display": "summarized"}] * 2 if shown else
                     [None, None])
    assert "[thinking] The scores are in scores.csv; read it." in err
    said = [e for e in events_of(path) if e["type"] == "text"]
    assert said[0] == dict(said[0], thinking=True, text=thinking["thinking"])
    assert said[-1]["text"] == "85" and "thinking" not in said[-1]
