"""The file's story, config and Limits, the loop, how a run stops: one test per stop label; the
golden transcript."""

import ast
import builtins
import io
import json
import os
import re
import signal
import threading
from pathlib import Path

import pytest
from fakes import RECORDED, Chunked, FakeAPIError, FakeClient, recorded_loop, reply, text, tool_use
from helpers import events_of, final_messages, run_cli, tool_context

import agent

# --- the file reads as the loop it teaches ---

SOURCE = Path(agent.__file__).read_text()
TREE = ast.parse(SOURCE)
LEARNERS_PATH = ("TOOLS", "read_file", "run_python", "EXIT_CODES", "check_stop", "run_session")


def defined_at(name):
    """(first line, last line) of the module-level definition of `name`."""
    for node in TREE.body:
        targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if (
            getattr(node, "name", None) == name
            or name in targets
            or isinstance(getattr(node, "target", None), ast.Name)
            and node.target.id == name
        ):
            return node.lineno, node.end_lineno
    raise AssertionError(f"{name} is not defined at module level")


def test_the_learners_path_comes_first_and_ends_before_line_700():
    divider = (
        SOURCE.splitlines().index(
            "# The machinery. Everything above is the agent; "
            "everything below keeps it bounded, recorded and"
        )
        + 1
    )
    ends = {name: defined_at(name)[1] for name in LEARNERS_PATH}
    assert max(ends.values()) < min(700, divider), ends
    first_code = next(
        n for n in TREE.body if not isinstance(n, (ast.Expr, ast.Import, ast.ImportFrom, ast.If))
    )
    assert first_code.lineno < min(defined_at(name)[0] for name in LEARNERS_PATH)
    assert "gc." not in SOURCE[: SOURCE.index("# The machinery.")]  # no optimisation in the story


def test_the_formatter_sees_every_line_and_there_are_at_most_8000():
    """agent.py's size is counted as `ruff format` writes it (.ci/run fails on a file it would
    change): no line is kept from the formatter, and the budget of issue 32 holds."""
    kept = [n for n, line in enumerate(SOURCE.splitlines(), 1) if re.search(r"#\s*fmt:", line)]
    assert kept == [], kept
    assert len(SOURCE.splitlines()) <= 8_000


def test_no_local_name_hides_a_module_level_one():
    """A reader who sees `size` or `outside` inside a function should find the module's own."""
    module = {n.name for n in TREE.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    module |= {
        t.id
        for n in TREE.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    hidden = []
    for function in ast.walk(TREE):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        arguments = function.args
        names = {a.arg for a in arguments.args + arguments.kwonlyargs + arguments.posonlyargs}
        names |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a}
        names |= {
            n.id
            for n in ast.walk(function)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        hidden += [
            (getattr(function, "name", "lambda"), function.lineno, name)
            for name in sorted(names & (module - set(dir(builtins))))
        ]
    assert hidden == []


# --- config: the key is a secret, whatever route it takes ---

KEY = "sk-ant-api03-THIS-IS-THE-TEST-KEY-0123456789"


def test_the_key_is_redacted_from_every_route(capsys, workdir, tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    (workdir / "leak.txt").write_text(f"key={KEY}\n")
    transcript = tmp_path / "run.json"
    client = FakeClient(
        reply(
            tool_use("read_file", {"path": "leak.txt"}),
            tool_use("run_python", {"code": "print(open('leak.txt').read())"}),
            tool_use("run_python", {"code": "raise SystemExit(open('leak.txt').read())"}),
        ),
        reply(text("done")),
    )
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--yes", "--no-sandbox", "--transcript", str(transcript)],
        client,
    )
    results = final_messages(client)[-1]["content"]
    assert code == 0 and all("[redacted secret]" in r["content"] for r in results)
    assert KEY not in json.dumps(client.requests) and KEY not in transcript.read_text()
    assert KEY not in out + err


def test_redact_removes_whole_secrets_from_text_and_bytes_alike(monkeypatch):
    """The longest secret first (one that holds another goes whole), in str and in bytes that
    are not UTF-8 around it, in a document's keys and values."""
    monkeypatch.setattr(agent, "SECRETS", {KEY, KEY[:20]})
    marker = agent.REDACTED
    assert agent.redact(f"a {KEY} b {KEY[:20]}") == f"a {marker} b {marker}"
    assert agent.redact(b"\xff" + KEY.encode() + b"\xfe") == b"\xff" + marker.encode() + b"\xfe"
    assert agent.redact({KEY: [KEY, 1]}) == {marker: [marker, 1]}


@pytest.mark.parametrize("key", ["Kx9#pQ2", "Kx9#pQ2z"])
def test_a_key_too_short_to_redact_is_said_so(capsys, workdir, monkeypatch, key):
    """A key shorter than 8 characters (a local server's --api-key, say) is not redacted: it
    would hide ordinary words. Before, nothing said so and a server's echo of it went
    everywhere; now the screen says, once, that it is not kept out of what agent.py writes.
    A key of 8 is redacted, and nothing is said."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    code, out, err = run_cli(
        capsys, ["q", "--workdir", str(workdir)], FakeClient(reply(text(f"your key is {key}.")))
    )
    short = len(key) < 8
    assert code == 0 and (key in out) is short
    assert err.count("shorter than 8 characters") == short, err


def pieces(key, size=12):
    """Every run of `size` characters of the key: none may be written anywhere."""
    return {key[i : i + size] for i in range(len(key) - size + 1)}


def test_no_cut_leaves_a_piece_of_the_key(workdir, tmp_path, monkeypatch):
    """The key where run_python's output is clipped (head and tail), and a reply's text that
    brings it in two pieces, across the point where the event stream cuts its text events and
    stderr writes what came: no piece of 12 characters of it is in the tool result, the
    events or stderr."""
    agent.SECRETS.add(KEY)
    ctx = tool_context(workdir, tmp_path, agent.Limits(output_chars=200))  # 50 + 50 bytes kept
    code = (
        "import sys; key = open('leak.txt').read(); "
        "sys.stdout.write('x' * 30 + key + 'y' * 300 + key + 'z' * 30)"
    )
    (workdir / "leak.txt").write_text(KEY)
    result = agent.call_tool(tool_use("run_python", {"code": code}), ctx)[0]["content"]
    assert "bytes cut" in result and not [p for p in pieces(KEY) if p in result], result
    events, stderr = tmp_path / "events.jsonl", io.StringIO()
    with open(events, "wb") as stream:
        report = agent.Reporter(stream=stderr, events=agent.Events(stream, "run"))
        report.turn_start(1)
        report.text("a" * 1990 + KEY[:20])
        report.text(KEY[20:] + " and the rest.\n")
        report.flush_text()
        report.emit("sandbox", status="after the text", confined=False)
    written = events.read_text() + stderr.getvalue()
    assert not [p for p in pieces(KEY) if p in written], written[-300:]
    said = "".join(e["text"] for e in events_of(events) if e["type"] == "text")
    assert said == "a" * 1990 + "[redacted secret] and the rest.\n"


EXAMPLE = Path(agent.__file__).parent / "workspace" / "example-run.json"


def cut_attack(route, workdir, tmp_path, capsys):
    """Perform one attack on a cut: text holding the key where agent.py cuts it for an output.
    Returns {what the user or a reader of the outputs receives: its text}."""
    transcript, events = tmp_path / "run.json", tmp_path / "events.jsonl"
    outputs = ["--transcript", str(transcript), "--events", str(events)]
    if route in ("a server's stop_reason", "a tool input", "a file read_file cuts"):
        if route == "a server's stop_reason":  # a server that echoes the key, in a list
            first = reply(text("hi"), stop_reason=["B" * 59 + KEY])
        elif route == "a tool input":  # a read_file offset that is no integer
            first = reply(tool_use("read_file", {"path": "scores.csv", "offset": "B" * 60 + KEY}))
        else:  # a file whose one line is cut at read_bytes, in the middle of the key
            (workdir / "big.txt").write_text("x" * (100_000 - 20) + KEY + "\n")
            first = reply(tool_use("read_file", {"path": "big.txt"}))
        client = FakeClient(first, reply(text("done")))
        code, out, err = run_cli(
            capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox", *outputs], client
        )
        results = [
            b
            for r in client.requests
            for m in r["messages"]
            if m["role"] == "user"
            for b in m["content"]
            if b["type"] == "tool_result"
        ]
        return {
            "transcript": transcript.read_text(),
            "events": events.read_text(),
            "stdout": out,
            "stderr": err,
            "tool results sent": json.dumps(results),
        }
    document = json.loads(EXAMPLE.read_text())  # a transcript that holds the key
    question = "Q" * 60 + KEY  # the page's title is cut at 80 characters
    document["question"] = document["messages"][0]["content"][0]["text"] = question
    unknown = {"type": "mystery_block", "data": "A" * 4940 + KEY}  # cut at 5,000 characters
    document["messages"][1]["content"].append(unknown)
    path = tmp_path / "held.json"
    path.write_text(json.dumps(document))
    code, out, err = run_cli(capsys, ["--report", str(path), "-o", str(tmp_path / "page.html")])
    assert code == 0, err
    return {"page": (tmp_path / "page.html").read_text(), "stdout": out, "stderr": err}


@pytest.mark.parametrize(
    "route",
    [
        "a server's stop_reason",
        "a tool input",
        "a file read_file cuts",
        "a report's title and blocks",
    ],
)
def test_no_cut_of_text_bound_for_an_output_leaves_a_piece_of_the_key(
    capsys, workdir, tmp_path, monkeypatch, route
):
    """The key (in the environment) where agent.py cuts text for an output: a server's
    stop_reason that is no string, kept as 80 characters of JSON; a tool input's bad value,
    quoted in the error; a line read_file cuts at read_bytes; a report's title (80
    characters of the question) and an unknown block (5,000). No piece of 12 characters of
    the key is in anything written: transcript, events, stdout, stderr, tool results, page."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    written = cut_attack(route, workdir, tmp_path, capsys)
    leaked = {name: sorted(p for p in pieces(KEY) if p in value) for name, value in written.items()}
    assert leaked == dict.fromkeys(written, []), leaked


@pytest.mark.parametrize("capture", ["off", "on"])
@pytest.mark.parametrize("size", [5, 7])
def test_a_key_split_across_stream_chunks_is_removed_whole(
    capsys, workdir, tmp_path, monkeypatch, spans, size, capture
):
    """A reply whose text brings the key in deltas of 5 or 7 characters, across the point where
    the event stream cuts its text events (2,000 characters): stderr and the events hold back
    only an end that could begin the key, so the key is found whole and redacted in stdout,
    stderr, the transcript, the events (and their text joined), the kept run and the spans,
    content capture on and off."""
    if capture == "on":
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    transcript, events = tmp_path / "run.json", tmp_path / "events.jsonl"
    client = FakeClient(Chunked(reply(text("a" * 1985 + f" {KEY} end")), size=size))
    outputs = ["--otel", "--transcript", str(transcript), "--events", str(events)]
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir), *outputs], client)
    assert code == 0, err
    joined = "".join(e.get("text", "") for e in events_of(events) if e["type"] == "text")
    written = {
        "stdout": out,
        "stderr": err,
        "transcript": transcript.read_text(),
        "the events' text, joined": joined,
    }
    for kept in Path(os.environ["XDG_STATE_HOME"]).rglob("*.json"):
        written[f"kept {kept.name}"] = kept.read_text()
    written["spans"] = "\n".join(str(v) for s in spans() for v in [s.name, *s.attributes.values()])
    leaked = [name for name, value in written.items() if KEY in value]
    assert leaked == [] and joined == "a" * 1985 + " [redacted secret] end", leaked
    assert "[redacted secret]" in written["stderr"] + written["transcript"]


@pytest.mark.parametrize(
    "key",
    [
        'sk-ant-api03-A-QUOTE"IN-THE-KEY-0123456789',
        "sk-ant-api03-A-BACKSLASH\\IN-THE-KEY-0123456789",
        "sk-ant-api03-TWO-BACKSLASHES-0123\\\\",
        '"sk-ant-api03-QUOTED-FIRST-0123456789',
    ],
)
def test_a_key_holding_a_character_json_escapes_leaves_every_file_json(
    capsys, workdir, tmp_path, monkeypatch, key
):
    """A key with a quote or a backslash, which JSON writes as two characters (\\" or \\\\),
    echoed by a server: the files redact it whole, as JSON writes it, and stay JSON that
    agent.py reads back. Before, a piece that began at the escaped quote was cut out of its
    escape, leaving a lone backslash: the transcript and the events were no JSON at all, and
    the run ended in an internal error reading its own transcript back."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    transcript, events = tmp_path / "run.json", tmp_path / "events.jsonl"
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(transcript), "--events", str(events)],
        FakeClient(reply(text(f"your key is {key}, is it not?"))),
    )
    assert code == 0, err
    document = json.loads(transcript.read_text())
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    values = [document["answer"]] + [e.get("text", "") for e in lines]
    assert "[redacted secret]" in document["answer"] and lines[-1]["type"] == "run.stop"
    assert not [p for p in pieces(key) for v in values if p in v], values
    code, _, err = run_cli(capsys, ["--report", str(transcript), "-o", str(tmp_path / "r.html")])
    assert code == 0, err  # and agent.py reads it back


def test_the_consent_question_leaves_no_piece_of_the_key_where_it_cuts():
    """A transcript's model or workdir holding the key where the question cuts the value in
    the middle to fit its rows: the screen shows no piece of 12 characters of it."""
    agent.SECRETS.add(KEY)
    for before in range(0, 80, 3):
        value = "m" * before + KEY + "z" * 500 + KEY + "m" * before
        shown = agent.consent_question(
            "run.json", [("model", value, ""), ("workdir", value, "")], 80
        )
        assert "characters not shown" in shown
        assert not [p for p in pieces(KEY) if p in shown], (before, shown)


# Every slice of agent.py, reviewed: none cuts text bound for an output but the cutters, which
# redact first or drop a piece of a secret at the cut. A new slice fails here until it is one of
# these or the text goes through `shorten` (or `fitted`, `Clip`, `read_window`).
CUTTERS = {
    "shorten",
    "fitted",
    "Clip",
    "read_window",
    "secret_start",
    "Reporter",
    "redact",
}
NOT_TEXT_FOR_AN_OUTPUT = {  # (function, slice): what it cuts
    ("result_diff", "diff[DIFF_LINES - 1:]"): "a list of lines, each shortened",
    ("result_diff", "changed[2:]"): "a list of lines, each shortened",
    ("ReplayCheck", "session['turns'][self.checked:]"): "a list",
    (
        "make_ruleset",
        "struct.pack('QQQ', fs, net, scope)[:8 if box.abi < 4 else 16 if box.abi < 6 else 24]",
    ): "bytes for the kernel",
    ("foreign_error", "raw.lstrip()[:1]"): "one character, compared",
    ("clear_old_results", "results[:max(0, len(results) - limits.keep_results)]"): "a list",
    ("temp_name", "uuid.uuid4().hex[:16]"): "a random name",
    ("temp_name", "name[:40]"): "a file name the user gave, for a name beside it",
    ("make_cgroups", "uuid.uuid4().hex[:16]"): "a random name",
    ("Launcher", "self.made[-15:]"): "a list of what the launcher made",
    ("search_tree", "numbers[:middle]"): "a list of syscall numbers",
    ("search_tree", "numbers[middle:]"): "a list of syscall numbers",
    ("make_kept_run", "run_id[:8]"): "a run id agent.py made",
    ("real_directory", "path.parent.parts[1:]"): "a list",
    ("load_transcript", "flag[2:]"): "a flag's name",
    ("load_recording", "recording['messages'][1:]"): "a list",
    ("for_terminal", "json.dumps(m[0])[1:-1]"): "the quotes around one escaped character",
    ("visible", "ascii(m[0])[1:-1]"): "the quotes around one escaped character",
    ("approval_question", "legend[:11]"): "a list of lines",
    ("request_turn", "message['content'][:-1]"): "a list of blocks",
    ("sent_view", "content[:-1]"): "a list of blocks",
    ("run_report", "SEGMENTS[:3]"): "a constant list",
    ("Telemetry", "messages[len(asked):]"): "a list",
    ("Telemetry", "messages[:-1]"): "a list",
    ("check_text", "value[:e.start]"): "whole text up to a bad byte, then shortened",
    ("read_question", "data[:e.start]"): "whole text up to a bad byte, then shortened",
    ("main", "sys.argv[1:]"): "a list",
    ("dump", "ENCODER.encode(secret)[1:-1]"): "a secret as JSON writes it, only looked for",
    ("Saver", "dump(item)[:-1]"): "a line's newline",
    ("Saver", "dump(key)[:-1]"): "a newline",
    ("Saver", "dump(value)[:-1]"): "a newline",
    ("Saver", "value[len(done):-1]"): "a list",
    ("Saver", "value[-1:]"): "a list",
    ("Sandbox", "out[6:]"): "the self-test's own word after LEAK: ",
    ("Sandbox", "(run.stderr.strip() or out)[-200:]"): "the self-test's stderr, no secret in it",
    ("Child", "message[1:]"): "the exit code the call's first process sent",
    (
        "command_line_cover",
        "b'run_python call'[:end - start - 1]",
    ): "a constant title, for the kernel",
}


def test_every_cut_of_text_bound_for_an_output_goes_through_a_cutter():
    """A raw cut (`text[:80]`) of text that could hold the key leaves a prefix of it that the
    final redaction cannot recognise. Every slice in agent.py is in a cutter, which redacts
    first, or is reviewed above as cutting no such text: a new one fails here."""
    outer = {}
    for top in TREE.body:
        for node in ast.walk(top):
            outer.setdefault(id(node), getattr(top, "name", "-"))
    new = sorted(
        {
            (outer[id(node)], ast.unparse(node))
            for node in ast.walk(TREE)
            if isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Slice)
            and outer[id(node)] not in CUTTERS
        }
        - set(NOT_TEXT_FOR_AN_OUTPUT)
    )
    assert new == [], f"route these cuts through shorten, or review them above: {new}"


def test_every_request_sends_system_tools_history_and_caching(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "scores.csv"})), reply(text("done")))
    run_cli(capsys, ["q", "--workdir", str(workdir), "--effort", "low"], client)
    for request in client.requests:
        assert request["system"] == agent.SYSTEM_PROMPT and request["tools"] == agent.TOOLS
        assert request["cache_control"] == {"type": "ephemeral"}
        assert request["output_config"] == {"effort": "low"}
        assert request["max_tokens"] == 16000
    assert len(client.requests[1]["messages"]) == 3  # question, tool_use, results


def test_parallel_calls_from_a_recorded_reply_get_one_message_in_order(capsys, workdir):
    first = recorded_loop("parallel_tool_use_four_calls_loop.jsonl")[0]["response"]["body"]
    client = FakeClient(first, reply(text("done")))
    code, _, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    ids = [b["id"] for b in first["content"] if b["type"] == "tool_use"]
    results = final_messages(client)[-1]
    assert code == 0 and len(ids) == 4
    assert [b["tool_use_id"] for b in results["content"]] == ids
    assert all(b["is_error"] and "no tool" in b["content"] for b in results["content"])


@pytest.mark.parametrize(
    "name", ["thinking_signature_tool_use_loop.jsonl", "redacted_thinking_loop.jsonl"]
)
def test_thinking_blocks_go_back_byte_for_byte(capsys, workdir, name):
    first = recorded_loop(name)[0]["response"]["body"]
    if first["stop_reason"] != "tool_use":  # the redacted loop answers in text: ask a follow-up
        first = dict(
            first,
            stop_reason="tool_use",
            content=first["content"] + [tool_use("read_file", {"path": "notes.md"})],
        )
    client = FakeClient(first, reply(text("done")))
    code, _, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    sent = final_messages(client)[1]["content"]
    expected = [b for b in first["content"] if not (b["type"] == "text" and not b["text"])]
    assert code == 0 and json.dumps(sent) == json.dumps(expected)


def test_pause_turn_sends_the_paused_content_back_as_the_last_message(capsys, workdir):
    paused = json.loads((RECORDED / "pause_turn.json").read_text())["response"]["body"]
    done = json.loads((RECORDED / "pause_turn_continuation_response.json").read_text())
    done = done["body"]
    client = FakeClient(paused, done)
    code, out, _ = run_cli(capsys, ["q", "--workdir", str(workdir), "--transcript", "-"], client)
    assert code == 0 and len(client.requests) == 2
    last = client.requests[1]["messages"][-1]
    assert last["role"] == "assistant"
    assert json.dumps(last["content"]) == json.dumps(agent.check_reply(paused)[0])
    assert [t["stop_reason"] for t in json.loads(out)["turns"]] == ["pause_turn", "end_turn"]


@pytest.mark.parametrize(
    "model, shown",
    [("claude-sonnet-5-5", True), ("claude-opus-5-5", True), ("claude-haiku-5-5", False)],
)
def test_between_tool_notes_are_asked_for_and_shown(capsys, workdir, tmp_path, model, shown):
    thinking = {
        "type": "thinking",
        "thinking": "The scores are in scores.csv; read it.",
        "signature": "sig",
    }
    client = FakeClient(
        reply(thinking, tool_use("read_file", {"path": "scores.csv"})), reply(text("85"))
    )
    path = tmp_path / "e.jsonl"
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--model", model, "--events", str(path)], client
    )
    asked = [r.get("thinking") for r in client.requests]
    assert code == 0
    assert asked == ([{"type": "adaptive", "display": "summarized"}] * 2 if shown else [None, None])
    assert "[thinking] The scores are in scores.csv; read it." in err
    said = [e for e in events_of(path) if e["type"] == "text"]
    assert said[0] == dict(said[0], thinking=True, text=thinking["thinking"])
    assert said[-1]["text"] == "85" and "thinking" not in said[-1]


def test_thinking_and_text_of_one_reply_are_events_of_their_own(capsys, workdir, tmp_path):
    thinking = {"type": "thinking", "thinking": "Nothing to read.", "signature": "sig"}
    path = tmp_path / "e.jsonl"
    argv = ["q", "--workdir", str(workdir), "--events", str(path)]
    code, _, err = run_cli(capsys, argv, FakeClient(reply(thinking, text("85"))))
    said = [(e["text"], e.get("thinking")) for e in events_of(path) if e["type"] == "text"]
    assert code == 0 and said == [("Nothing to read.", True), ("85", None)]
    assert "[thinking] Nothing to read.\n85" in err


def normalise(transcript):
    """Drop what changes between runs: ids, times, paths."""
    text_ = json.dumps(transcript, ensure_ascii=False)
    text_ = text_.replace(transcript["workdir"], "<workdir>")
    data = json.loads(text_)
    data.update(run_id="<id>", started_at="<time>", ended_at="<time>")
    for turn in data["turns"]:
        turn.update(
            request_id="<id>", seconds=0, api_seconds=0, started_at="<time>", message_id="<id>"
        )
        for call_ in turn["tool_calls"]:
            call_["seconds"] = 0
    return data


def test_golden_transcript(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(
        reply(
            text("Reading."),
            tool_use("read_file", {"path": "scores.csv"}, id="toolu_A"),
            tool_use("read_file", {"path": "winter.md"}, id="toolu_B"),
            input_tokens=700,
            output_tokens=50,
        ),
        reply(
            tool_use("run_python", {"code": "print((88+72+95)/3)"}, id="toolu_C"),
            input_tokens=20,
            output_tokens=30,
            write=800,
            read=0,
        ),
        reply(text("The average is 85."), input_tokens=10, output_tokens=12, read=850),
    )
    code, _, _ = run_cli(
        capsys,
        [
            "scores.csv 里平均分是多少？",
            "--workdir",
            str(workdir),
            "--yes",
            "--transcript",
            str(path),
        ],
        client,
    )
    assert code == 0
    golden = Path(__file__).with_name("golden_transcript.json")
    got = normalise(json.loads(path.read_text()))
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(json.dumps(got, ensure_ascii=False, indent=1) + "\n")
    assert got == json.loads(golden.read_text())


# --- how a run stops: one test per label ---


def test_end_turn(capsys, workdir):
    client = FakeClient(
        reply(tool_use("read_file", {"path": "scores.csv"})), reply(text("The average is 85."))
    )
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out) == (0, "The average is 85.\n")
    assert len(client.requests) == 2
    assert final_messages(client)[-1]["content"][0]["content"].startswith("name,score")
    assert "stop: end_turn" in err


def test_stop_sequence(capsys, workdir):
    client = FakeClient(reply(text("The beautiful city of "), stop_reason="stop_sequence"))
    code, out, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out, len(client.requests)) == (0, "The beautiful city of \n", 1)


def test_max_turns_last_turn_has_tools_off_and_prints_an_interim_answer(capsys, workdir):
    client = FakeClient(
        reply(tool_use("read_file", {"path": "scores.csv"})),
        reply(tool_use("read_file", {"path": "notes.md"})),
        reply(text("Interim: I read two files.")),
    )
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--max-turns", "3"], client)
    assert (code, out) == (3, "Interim: I read two files.\n")
    assert len(client.requests) == 3
    assert [r.get("tool_choice") for r in client.requests] == [None, None, {"type": "none"}]
    last_user = final_messages(client)[-1]["content"]
    assert last_user[0]["type"] == "tool_result" and "# Notes" in last_user[0]["content"]
    assert last_user[-1] == {"type": "text", "text": agent.FINAL_TURN_NOTE}
    assert "stop: max_turns" in err


def test_max_turns_one_is_a_single_request_with_tools_off(capsys, workdir):
    client = FakeClient(reply(text("Without tools: unknown.")))
    code, out, _ = run_cli(capsys, ["q", "--workdir", str(workdir), "--max-turns", "1"], client)
    assert (code, out, len(client.requests)) == (3, "Without tools: unknown.\n", 1)
    assert client.requests[0]["tool_choice"] == {"type": "none"}
    assert client.requests[0]["messages"][0]["content"][-1]["text"] == agent.FINAL_TURN_NOTE


def test_token_budget_stops_before_the_tools_run(capsys, workdir, tmp_path):
    transcript = tmp_path / "run.json"
    client = FakeClient(
        reply(
            tool_use("run_python", {"code": "open('ran', 'w')"}),
            input_tokens=900,
            output_tokens=200,
        )
    )
    code, out, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--token-budget",
            "1000",
            "--yes",
            "--no-sandbox",
            "--transcript",
            str(transcript),
        ],
        client,
    )
    assert (code, out, len(client.requests)) == (4, "", 1)
    assert not (workdir / "ran").exists()
    saved = json.loads(transcript.read_text())
    assert saved["stop"]["reason"] == "token_budget"
    assert saved["messages"][-1]["role"] == "assistant"  # the dangling tool_use stays
    assert saved["messages"][-1]["content"][0]["type"] == "tool_use"
    assert saved["turns"][0]["tool_calls"] == []


def test_an_answer_that_crosses_the_budget_is_still_an_answer(capsys, workdir):
    client = FakeClient(reply(text("42"), input_tokens=5000))
    code, out, _ = run_cli(capsys, ["q", "--workdir", str(workdir), "--token-budget", "10"], client)
    assert (code, out) == (0, "42\n")


def test_token_budget_counts_cache_tokens(capsys, workdir):
    client = FakeClient(
        reply(
            tool_use("read_file", {"path": "a"}),
            input_tokens=1,
            output_tokens=1,
            write=500,
            read=600,
        )
    )
    code, _, _ = run_cli(capsys, ["q", "--workdir", str(workdir), "--token-budget", "1100"], client)
    assert code == 4


def test_cost_budget(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "a"}), input_tokens=10_000))
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--budget-usd", "0.0005"], client
    )
    assert (code, len(client.requests)) == (4, 1)
    assert "stop: cost_budget" in err


def test_max_tokens_prints_the_partial_text(capsys, workdir):
    client = FakeClient(reply(text("The answer is"), stop_reason="max_tokens"))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out, len(client.requests)) == (5, "The answer is\n", 1)


def test_refusal(capsys, workdir):
    client = FakeClient(reply(text(""), stop_reason="refusal"))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out, len(client.requests)) == (5, "", 1)
    assert "stop: refusal" in err


def test_model_context_window_exceeded(capsys, workdir):
    client = FakeClient(reply(text("Partial"), stop_reason="model_context_window_exceeded"))
    code, out, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out) == (5, "Partial\n")


def test_api_error_keeps_the_turns_done(capsys, workdir, tmp_path):
    transcript = tmp_path / "run.json"
    client = FakeClient(
        reply(tool_use("read_file", {"path": "scores.csv"})),
        FakeAPIError(400, "invalid_request_error", "max_tokens: Field required"),
    )
    code, out, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(transcript)], client
    )
    assert (code, out, len(client.requests)) == (1, "", 2)
    assert "max_tokens: Field required" in err and "Traceback" not in err
    saved = json.loads(transcript.read_text())
    assert saved["stop"]["reason"] == "api_error" and len(saved["turns"]) == 1
    assert saved["messages"][-1]["content"][0]["type"] == "tool_result"


def test_401_names_the_key(capsys, workdir):
    client = FakeClient(FakeAPIError(401, "authentication_error", "invalid x-api-key"))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert code == 1 and "invalid x-api-key" in err and "ANTHROPIC_API_KEY" in err


def test_unknown_stop_reason_is_an_error(capsys, workdir):
    client = FakeClient(reply(text("?"), stop_reason="compaction_v9"))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert code == 1 and "stop: error" in err and "compaction_v9" in err


def test_interrupted(capsys, workdir, tmp_path):
    transcript = tmp_path / "run.json"

    def ctrl_c(request):
        raise KeyboardInterrupt

    client = FakeClient(reply(tool_use("read_file", {"path": "scores.csv"})), ctrl_c)
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(transcript)], client
    )
    assert code == 130 and "Traceback" not in err
    saved = json.loads(transcript.read_text())
    assert saved["stop"]["reason"] == "interrupted" and len(saved["turns"]) == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # meant to be
def test_a_sighup_whose_keyboardinterrupt_was_lost_still_names_sighup(
    capsys, workdir, tmp_path, monkeypatch
):
    """SIGHUP's exception dropped in a __del__ (see on_stop_signal): the handler's flag alone
    stops the run, and the stop still says which signal it was, a closed terminal (N16)."""
    monkeypatch.setattr(agent, "STOPPING", threading.Event())
    transcript = tmp_path / "run.json"

    class Swallows:
        def __del__(self):
            signal.raise_signal(signal.SIGHUP)  # the handler's KeyboardInterrupt dies here

    def hangup(request):
        Swallows()
        return reply(text("late"))

    previous = signal.signal(signal.SIGHUP, agent.on_stop_signal)
    try:
        code, _, err = run_cli(
            capsys,
            ["q", "--workdir", str(workdir), "--transcript", str(transcript)],
            FakeClient(hangup),
        )
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert code == 130 and "stop: interrupted (stopped by SIGHUP)" in err
    assert json.loads(transcript.read_text())["stop"]["detail"] == "stopped by SIGHUP"


def test_every_label_has_an_exit_code_and_the_help_lists_them():
    labels = {
        "end_turn",
        "stop_sequence",
        "max_turns",
        "token_budget",
        "cost_budget",
        "max_tokens",
        "refusal",
        "model_context_window_exceeded",
        "api_error",
        "error",
        "interrupted",
        "replay_differs",
    }
    assert set(agent.EXIT_CODES) == labels
    for label in labels:
        assert label in agent.EPILOG


def test_a_tool_use_stop_without_a_tool_call_ends_the_run(capsys, workdir):
    client = FakeClient(reply(text("I would call a tool here."), stop_reason="tool_use"))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out, len(client.requests)) == (0, "I would call a tool here.\n", 1)
    assert "held no tool call" in err


def test_a_tools_off_turn_that_still_calls_a_tool_ends_cleanly(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    stubborn = reply(text("Let me look first."), tool_use("read_file", {"path": "notes.md"}))
    client = FakeClient(stubborn)  # the stand-in ignores tool_choice: none
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--max-turns", "1", "--transcript", str(path)],
        client,
    )
    saved = json.loads(path.read_text())
    assert client.requests[0]["tool_choice"] == {"type": "none"}
    assert (code, out) == (3, "Let me look first.\n")
    assert "ignored tool_choice none, and its 1 tool call was not run" in saved["stop"]["detail"]
    assert "not run" in err
    assert saved["turns"][0]["tool_calls"] == []  # never run
    resumed = FakeClient(reply(text("Without it: no idea.")))
    code, _, _ = run_cli(
        capsys, ["--resume", str(path), "go on", "--workdir", str(workdir)], resumed
    )
    answer = resumed.requests[0]["messages"][-1]["content"][0]
    assert code == 0 and answer["type"] == "tool_result" and "not run" in answer["content"]
