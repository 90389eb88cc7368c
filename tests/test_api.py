"""API plumbing and retries: streaming, watchdog, retry_delay, request_turn, check_reply."""

import functools
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fake_api import sse, stream_of
from fakes import (
    RECORDED,
    APIConnectionError,
    FakeAPIError,
    FakeClient,
    Midstream,
    Truncated,
    recorded_loop,
    reply,
    text,
    tool_use,
)
from helpers import documented, drive, final_messages, run_cli, serve

import agent

# --- retries, with a scripted client ---


@pytest.mark.parametrize(
    "failure",
    [
        FakeAPIError(529, "overloaded_error", "Overloaded"),
        FakeAPIError(500, "api_error", "Internal server error"),
        FakeAPIError(429, "rate_limit_error", "slow down", {"retry-after": "0"}),
        APIConnectionError("Connection error."),
        Midstream(reply(text("par")), FakeAPIError(200, "overloaded_error", "Overloaded")),
        Truncated(reply(text("half"))),
    ],
)
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
    client = FakeClient(
        FakeAPIError(429, "rate_limit_error", "wait", {"retry-after": "0.3"}), reply(text("ok"))
    )
    started = time.monotonic()
    stop, _ = drive(client, workdir, tmp_path)
    assert stop.reason == "end_turn" and time.monotonic() - started >= 0.3


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e999", "soon", "-0.5"])
def test_a_retry_after_that_is_not_a_sane_number_is_ignored(value):
    error = FakeAPIError(529, "overloaded_error", "Overloaded", {"retry-after": value})
    assert agent.retry_delay(error, 1, agent.Limits()) == agent.Limits.retry_base


# --- a tool call cut at max_tokens ---


def test_a_cut_tool_call_is_retried_once_with_twice_the_max_tokens(capsys, workdir):
    cut = reply(
        text("Let me run"),
        tool_use("run_python", {"code": "open('ran','w')"}),
        stop_reason="max_tokens",
        output_tokens=16000,
    )  # it hit max_tokens
    client = FakeClient(
        cut, reply(tool_use("read_file", {"path": "notes.md"})), reply(text("done"))
    )
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--yes", "--no-sandbox", "--transcript", "-"],
        client,
    )
    assert code == 0 and len(client.requests) == 3
    first, second = client.requests[:2]
    assert (first["max_tokens"], second["max_tokens"]) == (16000, 32000)
    assert second["messages"] == first["messages"]  # the cut reply never entered history
    assert not (workdir / "ran").exists()
    saved = json.loads(out)
    assert saved["turns"][0]["attempts"] == 2 and saved["turns"][0]["turn"] == 1
    assert saved["turns"][0]["usage"]["input_tokens"] == 200  # both responses were billed


def test_a_cut_tool_call_whose_retry_fails_keeps_what_the_cut_reply_was_billed(capsys, workdir):
    """The cut reply was billed; its retry then failed outright (a 400): the stop's
    failed_usage holds the cut reply's usage, and its retries say the cut was a failed attempt,
    so the stop line counts it (before, both were lost with the failed retry)."""
    cut = reply(
        text("Let me run"),
        tool_use("run_python", {"code": "open('ran','w')"}),
        stop_reason="max_tokens",
        input_tokens=300,
        output_tokens=16000,
    )
    client = FakeClient(cut, FakeAPIError(400, "invalid_request_error", "no"))
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--yes", "--no-sandbox", "--transcript", "-"],
        client,
    )
    session = json.loads(out)
    stop = session["stop"]
    assert (code, stop["reason"], len(client.requests)) == (1, "api_error", 2), err
    assert stop["failed_usage"]["input_tokens"] == 300
    assert stop["failed_usage"]["output_tokens"] == 16000
    assert session["failed_usage"] == stop["failed_usage"]
    assert [r["error"] for r in stop["retries"]] == [
        "the reply was cut inside a tool call at max_tokens 16000; retried with 32000"
    ]
    stop_line = next(line for line in err.splitlines() if line.startswith("stop: api_error"))
    assert "16300 tokens" in stop_line and "2 failed attempts" in stop_line, stop_line
    assert not (workdir / "ran").exists()


def test_a_tool_call_cut_twice_stops_with_max_tokens(capsys, workdir):
    def cut(body):  # a reply that writes until max_tokens, whatever it is
        return reply(
            tool_use("run_python", {"code": "open('ran','w')"}),
            stop_reason="max_tokens",
            output_tokens=body["max_tokens"],
        )

    client = FakeClient(cut, cut)
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--yes", "--no-sandbox", "--max-tokens", "100000"],
        client,
    )
    assert (code, len(client.requests)) == (5, 2)
    assert client.requests[1]["max_tokens"] == 128000  # doubled, capped at the model's limit
    assert "cut inside a tool call at max_tokens 100000 and again at 128000" in err
    assert not (workdir / "ran").exists()


def test_a_tool_call_cut_at_the_models_limit_is_not_retried(capsys, workdir):
    cut = reply(
        tool_use("run_python", {"code": "open('ran','w')"}),
        stop_reason="max_tokens",
        output_tokens=128000,
    )
    client = FakeClient(cut)
    code, out, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--yes",
            "--no-sandbox",
            "--max-tokens",
            "128000",
            "--transcript",
            "-",
        ],
        client,
    )
    assert (code, len(client.requests)) == (5, 1)
    saved = json.loads(out)
    assert "at max_tokens 128000; the incomplete call was not run" in saved["stop"]["detail"]
    assert saved["messages"][-1]["role"] == "user"  # the cut call was not kept


def test_a_cut_tool_call_that_cannot_fit_is_not_retried(capsys, workdir):
    cut = reply(
        tool_use("run_python", {"code": "x = 1"}),
        stop_reason="max_tokens",
        input_tokens=990_000,
        output_tokens=16000,
    )
    client = FakeClient(cut)
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox"], client
    )
    assert (code, len(client.requests)) == (5, 1)
    assert (
        "not retried: its prompt of 990000 tokens and 32000 more would not fit the context "
        "window of 1000000" in err
    )


# --- what goes back of a reply: check_reply ---


def test_empty_text_blocks_are_dropped_from_history(capsys, workdir):
    client = FakeClient(
        reply(text(""), tool_use("read_file", {"path": "notes.md"})), reply(text("done"))
    )
    code, _, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert code == 0 and [b["type"] for b in final_messages(client)[1]["content"]] == ["tool_use"]


def test_duplicate_tool_use_ids_are_dropped_so_the_next_request_is_valid(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(
        reply(
            tool_use("read_file", {"path": "notes.md"}, id="toolu_D"),
            tool_use("read_file", {"path": "scores.csv"}, id="toolu_D"),
        ),
        reply(text("done")),
    )
    code, _, _ = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], client
    )
    saved = json.loads(path.read_text())
    assert code == 0 and len(final_messages(client)[-1]["content"]) == 1
    assert "repeated or missing id ('toolu_D')" in saved["turns"][0]["notes"][0]


@pytest.mark.parametrize(
    "mangle",
    [
        lambda m: m.update(content=None),
        lambda m: m.update(content="text"),
        lambda m: m.update(usage={"input_tokens": "lots", "output_tokens": -3}),
        lambda m: m["content"].append(7),
        lambda m: m.pop("stop_reason"),
        lambda m: m["usage"].update(input_tokens=10**400),
    ],
)  # priced as a float: OverflowError
def test_a_malformed_reply_never_ends_in_a_traceback(capsys, workdir, tmp_path, mangle):
    message = reply(text("partial"))
    mangle(message)
    path = tmp_path / "run.json"
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], FakeClient(message)
    )
    assert "Traceback" not in err and "internal error" not in err
    saved = json.loads(path.read_text())
    assert code in (0, 1) and saved["stop"]["reason"] in ("end_turn", "error")
    streamable = isinstance(message.get("content"), list) and all(
        isinstance(b, dict) for b in message["content"]
    )  # what a stream of events can carry
    assert len(saved["turns"]) == streamable  # then the turn is recorded, whatever it held


# --- the real SDK against a local Messages API ---


def overloaded():
    return {
        "status": 529,
        "body": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    }


def test_a_recorded_thinking_stream_goes_back_exactly_as_the_api_accepted_it(
    request, capsys, workdir
):
    accepted = recorded_loop("thinking_tool_use_stream_loop.jsonl")[1]["request"]["body"]
    api = serve(request, {"sse": "thinking_tool_use_stream.sse"}, reply(text("done")))
    code, _, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert code == 0
    sent, recorded = api.requests[1]["messages"][1]["content"], accepted["messages"][1]["content"]
    assert sent[0] == recorded[0]  # thinking text and signature exactly as streamed
    assert sent[1].pop("caller") == {"type": "direct"}  # in the stream; that client dropped it
    assert sent[1] == recorded[1]


def test_a_recorded_parallel_stream_gets_both_results_in_one_message(request, capsys, workdir):
    api = serve(request, {"sse": "parallel_tool_use_stream.sse"}, reply(text("done")))
    code, _, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    uses = [b["id"] for b in api.requests[1]["messages"][1]["content"] if b["type"] == "tool_use"]
    results = api.requests[1]["messages"][2]["content"]
    assert code == 0 and len(uses) == 2 and [r["tool_use_id"] for r in results] == uses


def test_overloaded_is_retried_and_the_sdk_adds_no_retries_of_its_own(request, capsys, workdir):
    api = serve(request, overloaded(), reply(text("ok")))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert (code, out, len(api.requests)) == (0, "ok\n", 2) and "retrying" in err


def test_five_requests_per_turn_at_most(request, capsys, workdir):
    limited = [dict(overloaded(), headers={"retry-after": "0"}) for _ in range(6)]
    api = serve(request, *limited)
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert (code, len(api.requests)) == (1, 5) and "Overloaded" in err


def test_an_error_event_mid_stream_is_retried(request, capsys, workdir):
    api = serve(request, {"sse": "error_overloaded_midstream.sse"}, reply(text("ok")))
    code, out, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert (code, out, len(api.requests)) == (0, "ok\n", 2)


def test_a_stream_without_message_stop_is_retried(request, capsys, workdir):
    api = serve(request, dict(reply(text("half")), _cut=True), reply(text("ok")))
    code, out, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert (code, out, len(api.requests)) == (0, "ok\n", 2)


def test_a_recorded_cut_tool_call_is_retried_with_more_max_tokens(request, capsys, workdir):
    api = serve(request, {"sse": "max_tokens_truncated_tool_use.sse"}, reply(text("ok")))
    code, out, _ = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--max-tokens", "124"], api=api
    )  # the recording's: it wrote 124 output tokens
    assert (code, out) == (0, "ok\n")
    assert [r["max_tokens"] for r in api.requests] == [124, 248]
    assert api.requests[0]["messages"] == api.requests[1]["messages"]


def test_a_recorded_401_stops_with_the_apis_message(request, capsys, workdir):
    recorded = json.loads((RECORDED / "error_authentication_401.json").read_text())
    api = serve(request, {"status": recorded["status"], "body": recorded["body"]})
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert code == 1 and "invalid x-api-key" in err and "ANTHROPIC_API_KEY" in err
    assert len(api.requests) == 1


def test_a_server_that_only_pings_is_retried(request, capsys, workdir):
    api = serve(request, {"pings": 30}, reply(text("ok")))
    started = time.monotonic()
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--request-timeout", "1"],
        api=api,
        request_timeout=1,
    )
    assert (code, out, len(api.requests)) == (0, "ok\n", 2)
    assert time.monotonic() - started < 10 and "no event for 1 s" in err


def test_a_reply_that_never_stops_is_cut_at_the_size_max_tokens_allows(
    request, capsys, workdir, tmp_path
):
    """A server that sends text forever, fast: each attempt is cut once the reply has streamed
    more than max_tokens can hold, and the turn ends, with its stop recorded."""
    api = serve(request, *[{"endless": "word " * 20, "every": 0.001}] * 5)
    path = tmp_path / "run.json"
    started = time.monotonic()
    code, _, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--request-timeout",
            "3",
            "--max-tokens",
            "100",
            "--transcript",
            str(path),
        ],
        api=api,
        request_timeout=3,
        retry_base=0.01,
    )
    seconds = time.monotonic() - started
    saved = json.loads(path.read_text())
    assert code == 1 and saved["stop"]["reason"] == "api_error" and len(api.requests) == 5
    assert "more than max_tokens 100 can hold" in saved["stop"]["detail"]
    assert seconds < 20, seconds  # the issue saw 45 s and more with these flags


def test_a_reply_that_never_stops_slowly_is_cut_at_its_time(request, capsys, workdir, tmp_path):
    """Slow enough never to look stalled (an event every 0.2 s), never enough text to be cut
    by size: the reply may take request_timeout + max_tokens / 10 s, no more."""
    api = serve(request, {"endless": "x", "every": 0.2}, reply(text("ok")))
    limits = dict(request_timeout=1, max_tokens=20, retry_base=0.0)
    started = time.monotonic()
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--request-timeout", "1", "--max-tokens", "20"],
        api=api,
        **limits,
    )
    seconds = time.monotonic() - started
    assert (code, out) == (0, "ok\n") and "went on past 3 s" in err
    assert 2.5 < seconds < 8, seconds


def test_a_long_tool_call_shows_its_growing_size_on_stderr(request, capsys, workdir):
    """A model writing a long script takes minutes: stderr says every 2 s how far it has come."""
    written = json.dumps({"code": "print(1)\n" * 40})
    pieces = [written[i : i + 10] for i in range(0, len(written), 10)]  # ~40 deltas, 4 s
    slow = {
        "drip": garbled(
            (
                {"type": "tool_use", "id": "toolu_w", "name": "run_python", "input": {}},
                [json_delta(p) for p in pieces],
            )
        )["sse_text"],
        "every": 0.1,
    }
    api = serve(request, slow, reply(text("ok")))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api, stdin="n\n")
    sizes = [
        int(line.split(": ")[1].split()[0].replace(",", ""))
        for line in err.splitlines()
        if line.startswith("  writing a run_python call: ")
    ]
    assert code == 0 and len(sizes) >= 1 and sizes == sorted(sizes) and 0 < sizes[-1] < len(written)


def garbled(*blocks, stop="tool_use"):
    """A reply's stream as a server might garble it: each block as (its start, its deltas)."""
    start = {
        "id": "msg_bad",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    out = [sse("message_start", {"type": "message_start", "message": start})]
    for i, (first, deltas) in enumerate(blocks):
        out.append(
            sse(
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": first},
            )
        )
        out += [
            sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})
            for d in deltas
        ]
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": i}))
    out.append(
        sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 3},
            },
        )
    )
    out.append(sse("message_stop", {"type": "message_stop"}))
    return {"sse_text": "".join(out)}


def json_delta(text_):
    return {"type": "input_json_delta", "partial_json": text_}


GOOD_CALL = (
    {"type": "tool_use", "id": "toolu_good", "name": "read_file", "input": {}},
    [json_delta('{"path": "notes.md"}')],
)
UNREADABLE = {"a block that is a string": ("str", []), "a block that is a list": ([1, 2], [])}
MALFORMED = {
    "a block of an unknown type": ({"type": "weird", "x": 1}, []),
    "a tool_result from the model": (
        {"type": "tool_result", "tool_use_id": "toolu_good", "content": "made up"},
        [],
    ),
    "a text that is not a string": ({"type": "text", "text": 5}, []),
    "a tool call without a name": (
        {"type": "tool_use", "id": "toolu_x", "input": {}},
        [json_delta("{}")],
    ),
    "a tool call with an empty name": (
        {"type": "tool_use", "id": "toolu_x", "name": "", "input": {}},
        [json_delta("{}")],
    ),
    "a tool call whose name is a number": (
        {"type": "tool_use", "id": "toolu_x", "name": 5, "input": {}},
        [json_delta("{}")],
    ),
    "a tool call whose input is a list": (
        {"type": "tool_use", "id": "toolu_x", "name": "run_python", "input": {}},
        [json_delta('["rm -rf"]')],
    ),
}


def test_a_tool_call_whose_arguments_were_cut_off_is_answered_so_and_noted(
    request, capsys, workdir, tmp_path
):
    """A server (a local model) sent a tool call's JSON cut off: '{"path": "scores'. The SDK
    reads what it can of it, {}, and the model used to be told `read_file is missing the
    required argument 'path'`, with no note in the turn."""
    cut = (
        {"type": "tool_use", "id": "toolu_cut", "name": "read_file", "input": {}},
        [json_delta('{"path": "scores')],
    )
    api = serve(request, garbled(cut, GOOD_CALL), reply(text("done")))
    path = tmp_path / "run.json"
    code, out, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], api=api
    )
    saved = json.loads(path.read_text())
    assert (code, out) == (0, "done\n"), err
    answered = {r["tool_use_id"]: r for r in api.requests[1]["messages"][-1]["content"]}
    assert answered["toolu_cut"]["is_error"] is True
    assert answered["toolu_cut"]["content"] == (
        "read_file's arguments did not arrive whole: the JSON was cut off ('{\"path\": "
        "\"scores'); the call was not run. Send it again with all its arguments."
    )
    assert "is_error" not in answered["toolu_good"]  # the whole call beside it ran
    assert saved["turns"][0]["notes"] == [
        "the arguments of tool call toolu_cut (read_file) did not arrive whole (the JSON was cut "
        'off: \'{"path": "scores\'); it was not run'
    ]
    assert api.rejected == []


@pytest.mark.parametrize("what", sorted(UNREADABLE))
def test_a_stream_the_sdk_cannot_read_is_retried(request, capsys, workdir, tmp_path, what):
    api = serve(request, garbled(UNREADABLE[what], GOOD_CALL), reply(text("done")))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert (code, out) == (0, "done\n") and "the stream could not be read" in err
    assert "internal error" not in err and api.rejected == [] and len(api.requests) == 2


@pytest.mark.parametrize("what", sorted(MALFORMED))
def test_a_malformed_block_is_dropped_never_run_and_the_run_goes_on(
    request, capsys, workdir, tmp_path, what
):
    """Through the real SDK: the turn and its note are recorded, the next request is one the
    API accepts (the fake rejects any other), and --resume takes the transcript back."""
    api = serve(
        request, garbled(MALFORMED[what], GOOD_CALL), reply(text("done")), reply(text("resumed"))
    )
    path = tmp_path / "run.json"
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path), "--yes", "--no-sandbox"],
        api=api,
    )
    saved = json.loads(path.read_text())
    assert (code, out, saved["stop"]["reason"]) == (0, "done\n", "end_turn"), err
    assert "internal error" not in err and "Warning" not in err
    assert (
        len(saved["turns"][0]["notes"]) == 1 and "dropped, not run" in saved["turns"][0]["notes"][0]
    )
    assert [c["id"] for c in saved["turns"][0]["tool_calls"]] == ["toolu_good"]
    assert api.rejected == [] and len(api.requests) == 2
    code, out, _ = run_cli(
        capsys, ["--resume", str(path), "more", "--workdir", str(workdir)], api=api
    )
    assert (code, out) == (0, "resumed\n") and api.rejected == []


def test_a_reset_mid_stream_is_retried(request, capsys, workdir):
    api = serve(request, {"reset": reply(text("half an answer")), "after": 3}, reply(text("ok")))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert (code, out, len(api.requests)) == (0, "ok\n", 2) and "retrying" in err


def test_a_connection_failure_names_the_host(workdir, tmp_path):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now
    client = agent.make_client(
        {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}"},
        agent.Limits(),
    )
    stop, _ = drive(client, workdir, tmp_path, max_attempts=2)
    assert stop.reason == "api_error" and "127.0.0.1" in stop.detail


# --- servers that deviate from the API, as llama.cpp's llama-server does ---
# (tested by hand: README, "A local model"). Each deviation is played by a stand-in that deviates
# the same way; the harness absorbs it: a documented stop, a valid next request, no traceback.


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


def test_a_closed_kept_alive_connection_is_retried_at_once(request, capsys, workdir):
    api = serve(request, {"disconnect": True}, reply(text("ok")))
    started = time.monotonic()
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert (code, out, len(api.requests)) == (0, "ok\n", 2)
    assert "retrying in 0.0s" in err and time.monotonic() - started < 5


def test_a_servers_context_error_is_a_context_stop(request, capsys, workdir):
    too_long = {
        "status": 400,
        "body": {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 9120,
                "n_ctx": 8192,
            }
        },
    }
    api = serve(request, too_long)
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert code == 5 and "stop: model_context_window_exceeded" in err
    assert "exceeds the available context size" in err


def test_an_error_body_without_the_top_level_type_is_reported(request, capsys, workdir):
    broken = {
        "status": 500,
        "body": {"error": {"code": 500, "message": "slot unavailable", "type": "server_error"}},
    }
    api = serve(request, *[dict(broken, headers={"retry-after": "0"})] * 5)
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert code == 1 and "server_error: slot unavailable" in err and "Traceback" not in err


def test_llama_shaped_replies_go_through(request, capsys, workdir, tmp_path):
    api = serve(
        request,
        llama_ids(reply(tool_use("read_file", {"path": "notes.md"})), 1),
        llama_ids(reply(text("Done.")), 2),
        request_id=False,
    )
    path = tmp_path / "run.json"
    code, out, _ = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], api=api
    )
    saved = json.loads(path.read_text())
    assert (code, out) == (0, "Done.\n") and not api.rejected
    assert [t["request_id"] for t in saved["turns"]] == [None, None]
    assert saved["turns"][0]["message_id"].startswith("chatcmpl-")
    assert saved["usage"]["cost_usd"] is not None


def test_a_stream_without_message_start_is_retried(request, capsys, workdir):
    events = stream_of(reply(text("broken"))).split("\n\n")
    api = serve(request, {"sse_text": "\n\n".join(events[1:])}, reply(text("ok")))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    assert (code, out, len(api.requests)) == (0, "ok\n", 2) and "could not be read" in err


@pytest.mark.parametrize(
    "url", ["not-a-url", "127.0.0.1:8080", "ftp://127.0.0.1", "http://", "http://127.0.0.1:99999"]
)
def test_a_malformed_base_url_is_a_usage_error_before_anything_is_sent(
    capsys, workdir, url, monkeypatch
):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)])
    assert code == 2 and f"ANTHROPIC_BASE_URL {url!r}" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "key, where",
    [
        ("dummy-key-123\t", "at its end"),
        (" dummy-key-123", "at its start"),
        ("dummy-\nkey-123", "inside it"),
    ],
)
def test_a_key_with_white_space_or_a_control_character_says_so(
    capsys, workdir, key, where, monkeypatch
):
    """A key ending in a tab reached the wire: `Connection ... failed: LocalProtocolError`."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)])
    assert (code, out) == (2, "") and err == (
        f"agent.py: ANTHROPIC_API_KEY has white space or a control character {where}: copy the "
        "key again, without it\n"
    ), err


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8765 ", " http://127.0.0.1:8765", "http://127.0.0.1:8765\t"]
)
def test_a_base_url_with_white_space_around_it_says_so(capsys, workdir, url, monkeypatch):
    """It said `is not a URL (Port could not be cast to integer value as '8765 ')`."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)])
    assert code == 2 and err == (
        f"agent.py: ANTHROPIC_BASE_URL {url!r} has white space around it: give it without\n"
    ), err


@pytest.mark.parametrize("where", ["refused", "no such host"])
def test_an_unreachable_server_is_named_at_once_not_after_retries(
    capsys, workdir, where, loopback_only
):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now
    url = f"http://127.0.0.1:{port}" if where == "refused" else "http://no-such-host.invalid"
    client = agent.make_client(
        {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": url}, agent.Limits()
    )
    started = time.monotonic()
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    loopback_only.clear()  # the lookup of no-such-host.invalid was the test's own doing
    assert code == 1 and time.monotonic() - started < 2 and "retrying" not in err
    assert f"cannot reach {url}" in err
    assert ("is the server running?" if where == "refused" else "no such host") in err


def test_https_to_a_plain_http_server_says_to_use_http_at_once(request, capsys, workdir):
    """It said `Connection to 127.0.0.1:PORT failed: [SSL: WRONG_VERSION_NUMBER] wrong version
    number (_ssl.c:1006)`, after four retries."""
    api = serve(request)
    https = api.url.replace("http://", "https://")
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--no-keep"], base_client(https)
    )
    assert code == 1 and err == (
        f"stop: api_error (cannot reach {https} (the server answers in plain HTTP, not TLS: "
        f"give ANTHROPIC_BASE_URL as {api.url})); 0 turns, 0 tokens, $0.000000\n"
    ), err


def test_an_ipv6_server_is_named_with_its_brackets(capsys, workdir):
    dead = socket.create_server(("::1", 0), family=socket.AF_INET6)
    url = f"http://[::1]:{dead.getsockname()[1]}"
    dead.close()  # nothing listens there now
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--no-keep"], base_client(url))
    assert code == 1 and f"cannot reach {url} (connection refused" in err, err


def test_a_cut_tool_call_below_max_tokens_is_a_full_context_not_retried(capsys, workdir):
    """llama-server reports a full context as max_tokens: fewer output tokens than max_tokens
    say that doubling max_tokens cannot help, and stderr does not pretend it would."""
    cut = reply(
        tool_use("run_python", {"code": "x = 1"}), stop_reason="max_tokens", output_tokens=700
    )
    client = FakeClient(cut)
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox"], client
    )
    assert (code, len(client.requests)) == (5, 1) and "retrying the turn" not in err
    assert (
        "stopped at 700 output tokens, below max_tokens 16000, so the server's context, not "
        "max_tokens, was full" in err
    )


# --- a server that is not a Messages API, or not at the URL given ---


@pytest.fixture
def web_server(request, tmp_path):
    """A real web server on loopback that is no Messages API: Python's own http.server serving
    a directory (it answers a POST with 501 and an HTML page), or `handler`. Its base URL."""

    def start(handler=functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))):
        class Quiet(handler if isinstance(handler, type) else handler.func):
            def log_message(self, *args):
                pass

        made = (
            functools.partial(Quiet, *handler.args, **handler.keywords)
            if isinstance(handler, functools.partial)
            else Quiet
        )
        server = ThreadingHTTPServer(("127.0.0.1", 0), made)
        server.posts = 0
        serve = functools.partial(server.serve_forever, poll_interval=0.02)  # a quick shutdown()
        threading.Thread(target=serve, daemon=True).start()
        request.addfinalizer(lambda: (server.shutdown(), server.server_close()))
        return server, f"http://127.0.0.1:{server.server_address[1]}"

    return start


def base_client(url):
    return agent.make_client(
        {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": url}, agent.Limits()
    )


def test_a_plain_web_server_is_one_line_not_retried_asking_about_the_base_url(
    capsys, workdir, tmp_path, web_server
):
    server, url = web_server()
    path = tmp_path / "run.json"
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path), "--no-keep"],
        base_client(url),
    )  # stderr: the one line
    detail = (
        f"501 Not Implemented from {url}/v1/messages: an HTML page, not the API's JSON "
        "error (Error response Error code: 501 Message: Unsupported method ('POST'). "
        f"Error code explanation: 501 -…); is ANTHROPIC_BASE_URL ({url}) an Anthropic "
        "Messages API server?"
    )
    assert (code, out) == (1, "")
    assert err == f"stop: api_error ({detail}); 0 turns, 0 tokens, $0.000000\n"
    saved = json.loads(path.read_text())
    assert saved["stop"]["detail"] == detail and "retries" not in saved["stop"]
    assert documented("docs/loop.md", "stop: api_error (501") == [  # as docs/loop.md shows it
        err.strip().replace(url, "http://127.0.0.1:8000")
    ]


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_proxys_html_error_is_retried_each_retry_one_line(request, capsys, workdir, status):
    page = (
        f"<html>\r\n<head><title>{status} Oops</title></head>\r\n<body>\r\n<center><h1>"
        f"{status} Oops</h1></center>\r\n<hr><center>nginx/1.27.0</center>\r\n</body>\r\n"
        "</html>\r\n" + "<!-- a padding to defeat a browser's friendly page -->\r\n" * 6
    )
    failing = {
        "status": status,
        "body": page,
        "headers": {"retry-after": "0", "content-type": "text/html"},
    }
    api = serve(request, failing, failing, reply(text("ok")))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], api=api)
    retries = [line for line in err.splitlines() if line.startswith("retrying")]
    assert (code, out, len(api.requests)) == (0, "ok\n", 3)
    phrase = {502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}[status]
    assert retries == [
        f"retrying in 0.0s (attempt {n} of 5): {status} {phrase} from "
        f"{api.url}/v1/messages: an HTML page, not the API's JSON error "
        f"({status} Oops nginx/1.27.0); is ANTHROPIC_BASE_URL ({api.url}) an "
        "Anthropic Messages API server?"
        for n in (2, 3)
    ], err
    assert "<" not in err


@pytest.mark.parametrize("suffix", ["/v1/messages", "/v1/messages/", "/v1/"])
def test_a_base_url_that_is_the_whole_endpoint_gets_the_same_hint(request, capsys, workdir, suffix):
    """People paste the whole endpoint: the SDK adds /v1/messages to it again."""
    api = serve(request)
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--no-keep"], base_client(api.url + suffix)
    )
    twice = f"{api.url}{suffix.rstrip('/')}/v1/messages"
    assert code == 1 and err == (
        f"stop: api_error (404 not_found_error: Not Found, from {twice}: ANTHROPIC_BASE_URL is "
        f"the server's root, without {suffix.rstrip('/')} ({api.url})); 0 turns, 0 tokens, "
        "$0.000000\n"
    ), err


def test_a_base_url_ending_in_v1_names_the_url_asked_and_the_root(
    request, capsys, workdir, web_server
):
    api = serve(request)
    code, _, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--no-keep"],  # one line
        base_client(api.url + "/v1"),
    )
    assert code == 1 and err == (
        f"stop: api_error (404 not_found_error: Not Found, from {api.url}/v1/v1/messages: "
        f"ANTHROPIC_BASE_URL is the server's root, without /v1 ({api.url})); 0 turns, 0 "
        "tokens, $0.000000\n"
    )
    assert documented("docs/loop.md", "404 not_found_error") == [
        err[len("stop: api_error (") : -len("); 0 turns, 0 tokens, $0.000000\n")].replace(
            api.url.split("//")[1], "HOST"
        )
    ]

    class Empty404(BaseHTTPRequestHandler):  # a server that says nothing but 404
        def do_POST(self):
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()

    _, url = web_server(Empty404)
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--no-keep"], base_client(url + "/v1")
    )
    assert code == 1 and err == (
        f"stop: api_error (404 Not Found from {url}/v1/v1/messages: an empty body, not the API's "
        f"JSON error; ANTHROPIC_BASE_URL is the server's root, without /v1 ({url})); 0 turns, 0 "
        "tokens, $0.000000\n"
    )


def test_the_stop_line_says_how_many_attempts_failed(capsys, workdir):
    """With -q only the stop line shows: five failed attempts read as one (newuser #15)."""
    client = FakeClient(*[FakeAPIError(500, "api_error", "fake 500", {"retry-after": "0"})] * 5)
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "-q"], client)
    assert code == 1 and err.splitlines()[0] == (
        "stop: api_error (500 api_error: fake 500; after 5 attempts); 0 turns, 0 tokens, $0.000000"
    )
    client = FakeClient(FakeAPIError(400, "invalid_request_error", "bad"))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "-q"], client)
    assert code == 1 and "(400 invalid_request_error: bad); 0 turns" in err  # one attempt


def test_a_reply_that_is_not_a_stream_is_named_by_its_content_type(request, capsys, workdir):
    """A 200 answered with JSON (or a page) to a streamed request was `the response stream
    ended before message_stop`, retried as if cut: it is named, once (newuser #19)."""
    api = serve(request, {"status": 200, "body": '"not a message"'}, reply(text("never")))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "-q"], api=api)
    assert code == 1 and len(api.requests) == 1, err
    assert err.splitlines()[0] == (
        "stop: api_error (the server answered 200 with content-type application/json, not an "
        "event stream (text/event-stream), to a streamed request: is ANTHROPIC_BASE_URL "
        f"({api.url}) an Anthropic Messages API server?); 0 turns, 0 tokens, $0.000000"
    )
    api.script.clear()  # the reply never asked for


def test_a_reply_that_is_not_a_stream_names_the_server_without_its_credentials(
    request, capsys, workdir, tmp_path, monkeypatch
):
    """The same 200, from a server whose ANTHROPIC_BASE_URL carries credentials (user:password@):
    the line named the URL as asked, password and all, so it went to stderr, the transcript,
    the kept run and the events (red-team F16). Now it names the server as the transcript
    records it (server_url): the password is nowhere."""
    api = serve(request, {"status": 200, "body": '"not a message"'})
    port = api.url.rsplit(":", 1)[1]
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-api03-THE-KEY-0123456789")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://agent:s3cret-pass@127.0.0.1:{port}")
    transcript, events = tmp_path / "run.json", tmp_path / "events.jsonl"
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(transcript), "--events", str(events)],
    )
    assert code == 1 and len(api.requests) == 1, err
    assert f"is ANTHROPIC_BASE_URL (http://127.0.0.1:{port}) an Anthropic" in err
    written = [out, err, transcript.read_text(), events.read_text()] + [
        p.read_text() for p in Path(os.environ["XDG_STATE_HOME"]).rglob("*.json")
    ]
    assert len(written) == 5 and not [w for w in written if "s3cret" in w]


@pytest.mark.parametrize(
    "key, said",
    [
        (
            "sk-ant-api03-SECRETSECRET\udcffabc",
            "ANTHROPIC_API_KEY is not valid UTF-8: byte 0xff at position 26 of 29",
        ),
        (
            "sk-ant-api03-SECRETSECRET\u00e9",
            "ANTHROPIC_API_KEY has a character that is not ASCII at position 26 of 26",
        ),
    ],
)
def test_a_key_that_is_not_ascii_is_a_usage_error_that_shows_none_of_it(
    capsys, workdir, key, said, monkeypatch
):
    """A byte that is not UTF-8 printed the key up to it; an é was sent mangled (newuser2 N6,
    N8). Keys are ASCII: where the odd character is, and nothing of the key."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)])
    assert (code, out) == (2, "") and err == f"agent.py: {said}: copy the key again\n", err
    assert "SECRET" not in err


# --- what failed attempts cost: counted as the server reported it (N17) ---


def no_backoff(monkeypatch):
    real = agent.retry_delay
    monkeypatch.setattr(
        agent,
        "retry_delay",
        lambda exc, attempt, limits: None if real(exc, attempt, limits) is None else 0.0,
    )


def test_the_tokens_of_failed_attempts_are_counted_and_said(
    request, capsys, workdir, tmp_path, monkeypatch
):
    """N17: five replies streamed (each message_start says 100 input tokens, message_delta 10
    output), each cut before message_stop: the run said `0 tokens, $0.000000`. What the server
    reported for each failed attempt is now in the transcript (`failed_usage`, a field of its
    own: `usage` stays the totals over turns) and on the stop line."""
    no_backoff(monkeypatch)
    cut = dict(reply(text("Let me read the file."), input_tokens=100, output_tokens=10), _cut=True)
    api = serve(request, *[cut] * 5)
    path = tmp_path / "run.json"
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], api=api
    )
    session = json.loads(path.read_text())
    assert (code, len(api.requests)) == (1, 5), err
    assert session["usage"]["tokens"] == 0  # no turn: the totals over turns are unchanged
    failed = session["failed_usage"]
    assert (failed["input_tokens"], failed["output_tokens"], failed["tokens"]) == (500, 50, 550)
    assert failed["cost_usd"] > 0 and session["stop"]["failed_usage"] == failed
    stop_line = next(l for l in err.splitlines() if l.startswith("stop: api_error"))
    assert "0 turns, 0 tokens, $0.000000" in stop_line and "550 tokens" in stop_line, stop_line
    assert "5 failed attempts" in stop_line, stop_line


def test_failed_attempts_count_against_the_token_budget(
    request, capsys, workdir, tmp_path, monkeypatch
):
    """A turn that succeeds on its third attempt spent what the two cut ones reported too:
    --token-budget sees it (before, the run went on to turn 2 as if only 110 tokens were spent)."""
    no_backoff(monkeypatch)
    cut = dict(reply(text("Let me read."), input_tokens=100, output_tokens=10), _cut=True)
    api = serve(
        request,
        cut,
        cut,
        reply(tool_use("read_file", {"path": "notes.md"}), input_tokens=100, output_tokens=10),
        reply(text("ok")),
    )
    path = tmp_path / "run.json"
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--token-budget", "300", "--transcript", str(path)],
        api=api,
    )
    session = json.loads(path.read_text())
    assert session["stop"]["reason"] == "token_budget", err
    assert len(api.requests) == 3 and out != "ok\n"
    assert session["turns"][0]["failed_usage"]["tokens"] == 220
    assert session["turns"][0]["usage"]["tokens"] == 110  # the turn's own reply, as before
    assert session["failed_usage"]["tokens"] == 220
