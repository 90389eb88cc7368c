"""Transcript, events, schemas and resume: what a run writes, and what --resume trusts of it."""

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from api_rules import check_request
from fakes import Chunked, FakeAPIError, FakeClient, reply, text, tool_use
from helpers import (
    MKNOD,
    agent_env,
    assert_well_formed,
    budget_stopped,
    events_of,
    lone_surrogates,
    run_agent_py,
    run_cli,
    schema_errors,
    serve,
    surrogate_run,
    with_lone_surrogates,
)

import agent

# --- transcript ---


def test_transcript_schema(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(
        reply(
            tool_use("read_file", {"path": "scores.csv"}),
            input_tokens=671,
            output_tokens=40,
            write=0,
            read=0,
        ),
        reply(text("85"), input_tokens=80, output_tokens=5, read=671),
    )
    code, _, _ = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], client
    )
    saved = json.loads(path.read_text())
    assert code == 0
    assert {
        "version",
        "model",
        "system",
        "tools",
        "workdir",
        "question",
        "messages",
        "turns",
        "stop",
        "answer",
        "usage",
    } <= set(saved)
    assert saved["version"] == 1 and saved["workdir"] == os.path.realpath(workdir)
    assert saved["stop"] == {"reason": "end_turn", "detail": "the model finished", "exit_code": 0}
    assert saved["answer"] == "85"
    turn = saved["turns"][0]
    assert set(turn) >= {"turn", "stop_reason", "usage", "request_id", "seconds", "tool_calls"}
    assert set(turn["usage"]) >= {
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "cost_usd",
    }
    assert turn["tool_calls"][0]["name"] == "read_file" and not turn["tool_calls"][0]["is_error"]
    assert (
        saved["usage"]["input_tokens"] == 751 and saved["usage"]["cache_read_input_tokens"] == 671
    )
    assert saved["usage"]["tokens"] == 671 + 40 + 80 + 5 + 671
    # replayable as-is: history plus a follow-up is a valid request
    follow = saved["messages"] + [{"role": "user", "content": [text("and the median?")]}]
    assert (
        check_request(
            {"model": saved["model"], "max_tokens": 10, "tools": saved["tools"], "messages": follow}
        )
        is None
    )


def test_the_transcript_has_every_field_its_schema_names(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(
        FakeAPIError(529, "overloaded_error", "Overloaded", {"retry-after": "0"}),
        reply(tool_use("run_python", {"code": "raise SystemExit(3)"})),
        reply(text("done")),
    )
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--yes", "--no-sandbox", "--transcript", str(path)],
        client,
    )
    saved = json.loads(path.read_text())
    schema = agent.TRANSCRIPT_SCHEMA
    assert set(schema["properties"]) - {
        "trial",
        "cleared",
        "events_lost",
        "produced_by",
        "replay",
        "base_url",
        "failed_usage",
    } <= set(saved)
    # (those in test_replay.py; base_url with ANTHROPIC_BASE_URL; failed_usage in test_api.py)
    turn = schema["properties"]["turns"]["items"]
    assert set(turn["properties"]) - {
        "context_edits",
        "cleared",
        "in_history",
        "failed_usage",
    } <= set(saved["turns"][0])  # when they happen
    call = saved["turns"][0]["tool_calls"][0]
    assert set(turn["properties"]["tool_calls"]["items"]["properties"]) <= set(call)
    assert (call["exit_code"], call["declined"], call["is_error"]) == (3, False, True)
    assert saved["turns"][0]["retries"][0]["status"] == 529
    assert saved["stop"]["exit_code"] == 0 and saved["ended_at"] >= saved["started_at"]
    assert not schema_errors(saved, "transcript")


@pytest.mark.parametrize(
    "given, recorded",
    [
        (
            "http://agent:s3cret-pass@127.0.0.1:8080/gateway/?api_key=sk-in-query#t=1",
            "http://127.0.0.1:8080/gateway/",
        ),
        ("https://api.anthropic.com", "https://api.anthropic.com"),
        (None, None),  # the SDK's default, Anthropic's API: no field, so the golden file stands
    ],
)
def test_the_server_a_run_talked_to_is_recorded_without_credentials(
    capsys, workdir, tmp_path, monkeypatch, given, recorded
):
    if given:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", given)
    path = tmp_path / "run.json"
    client = FakeClient(reply(text("ok")), reply(text("again")))
    code, _, _ = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], client
    )
    saved = json.loads(path.read_text())
    assert code == 0 and saved.get("base_url") == recorded
    assert "s3cret" not in path.read_text() and "sk-in-query" not in path.read_text()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")  # resumed elsewhere
    code, _, _ = run_cli(
        capsys, ["--resume", str(path), "more", "--workdir", str(workdir)], client, stdin="y\n"
    )  # agreed to: its history goes elsewhere
    assert code == 0 and json.loads(path.read_text())["base_url"] == "http://127.0.0.1:9"


def test_a_declined_call_is_marked_so(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(reply(tool_use("run_python", {"code": "1"})), reply(text("ok")))
    run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], client, stdin="n\n"
    )
    call = json.loads(path.read_text())["turns"][0]["tool_calls"][0]
    assert call["declined"] is True and call["exit_code"] is None


def test_the_transcript_is_on_disk_before_any_tool_runs(capsys, workdir, tmp_path, monkeypatch):
    path, seen, real = tmp_path / "run.json", [], agent.run_tools

    def peek(blocks, ctx, report, *more):  # what a crash during these tools would leave on disk
        seen.append(json.loads(path.read_text()) if path.exists() else None)
        return real(blocks, ctx, report, *more)

    monkeypatch.setattr(agent, "run_tools", peek)
    client = FakeClient(
        reply(tool_use("read_file", {"path": "notes.md"})),
        reply(tool_use("read_file", {"path": "scores.csv"})),
        reply(text("done")),
    )
    run_cli(capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], client)
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
    client = FakeClient(
        reply(tool_use("read_file", {"path": "notes.md"})),
        reply(
            tool_use("read_file", {"path": "scores.csv"}),
            tool_use("read_file", {"path": "notes.md"}),
        ),
        reply(tool_use("read_file", {"path": "scores.csv"})),
        reply(text("ok")),
        reply(text("again")),
    )
    code, _, _ = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path), "--max-turns", "4"],
        client,
    )
    assert code == 3  # the last turn: its note was appended to the last message
    code, _, _ = run_cli(
        capsys, ["--resume", str(path), "and now?", "--workdir", str(workdir)], client
    )
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
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--transcript", "-"], client)
    assert code == 0 and json.loads(out)["answer"] == "42"  # the streamed text went to stderr


def test_text_that_is_not_valid_unicode_keeps_the_transcript(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(reply(text("bad \ud800 surrogate")))
    code, out, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], client
    )
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert "Traceback" not in err, err
    assert code == 0 and saved["answer"] == "bad \ufffd surrogate"
    assert "surrogate" in out


def test_no_transcript_or_event_holds_a_lone_surrogate(capsys, tmp_path):
    """From a workdir's name, a server's reply and error, a file name in a tool call, and a
    transcript read back by --resume: every string is text, a lone surrogate written U+FFFD."""
    events = tmp_path / "events.jsonl"
    code, transcript, err = surrogate_run(capsys, tmp_path, "--events", str(events))
    assert code == 0 and "Traceback" not in err, err
    for path in (transcript, events):
        assert not lone_surrogates(path.read_bytes()), path
    saved = json.loads(transcript.read_text())
    assert saved["answer"] == "done \ufffd" and saved["workdir"].endswith("/w\ufffd")
    assert saved["turns"][0]["retries"][0]["error"] == "529 overloaded_error: busy \ufffd"
    forged = with_lone_surrogates(transcript)
    (tmp_path / "work2").mkdir()
    client = FakeClient(reply(text("on")))
    code, _, err = run_cli(
        capsys,
        [
            "--resume",
            str(forged),
            "more",
            "--workdir",
            str(tmp_path / "work2"),
            "--events",
            str(events),
        ],
        client,
    )
    assert code == 0, err
    assert not lone_surrogates(forged.read_bytes()) and not lone_surrogates(events.read_bytes())


# --- where a transcript may be written ---


@pytest.mark.parametrize("inside", ["run.json", "sub/run.json"])
def test_a_transcript_inside_the_workdir_is_refused(capsys, workdir, inside):
    (workdir / "sub").mkdir()
    client = FakeClient()
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(workdir / inside)], client
    )
    assert (code, client.requests) == (2, []) and "inside the workdir" in err
    assert "--resume would trust it" in err  # a transcript is what --resume reads
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--events", str(workdir / inside)], client
    )
    assert (code, client.requests) == (2, []) and "inside the workdir" in err
    assert "--resume" not in err  # events are not


def test_the_transcript_is_never_written_through_a_symlink(capsys, workdir, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "run.json"
    link.symlink_to(victim)
    client = FakeClient(reply(text("done")))
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(link)], client
    )
    assert (code, client.requests) == (2, []) and "is a symlink" in err
    assert victim.read_text() == "precious\n" and link.is_symlink()


@pytest.fixture
def node(tmp_path):
    """Make a FIFO or (as root) a character device like /dev/null, in tmp_path: what an output
    must never replace, without putting the machine's own /dev/null at stake."""

    def make(kind):
        path = tmp_path / kind
        if kind == "fifo":
            os.mkfifo(path)
        else:
            if MKNOD:
                pytest.skip(MKNOD)
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, {"null": 3, "full": 7}[kind]))
        return path

    return make


@pytest.mark.parametrize("flag", ["--transcript", "--events", "-o"])
@pytest.mark.parametrize("kind", ["fifo", "null"])
def test_an_output_never_replaces_a_device_or_fifo(capsys, workdir, tmp_path, node, flag, kind):
    """A transcript onto one is refused before anything is sent; events and a report are
    written through it (a FIFO nobody reads is refused, never waited on). The node stays."""
    path = node(kind)
    before = os.stat(path)
    client = FakeClient(reply(text("done")))
    if flag == "-o":
        source = tmp_path / "run.json"
        run_cli(capsys, ["q", "--workdir", str(workdir), "--transcript", str(source)], client)
        code, _, err = run_cli(capsys, ["--report", str(source), "-o", str(path)])
    else:
        code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), flag, str(path)], client)
    after = os.stat(path)
    assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (
        before.st_ino,
        stat.S_IFMT(before.st_mode),
    )
    if flag == "--transcript" or kind == "fifo":  # no one reads the FIFO
        assert code == 2 and client.requests == [] or flag == "-o" and code == 2, err
        assert "not a regular file" in err or "no one reads from it" in err
    else:
        assert code == 0, err


def test_events_go_through_a_pipe_someone_reads(capsys, workdir, tmp_path, node):
    fifo = node("fifo")
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        code, _, err = run_cli(
            capsys,
            ["q", "--workdir", str(workdir), "--events", str(fifo)],
            FakeClient(reply(text("done"))),
        )
        received = os.read(reader, 1 << 20).decode()
    finally:
        os.close(reader)
    assert code == 0, err
    assert [json.loads(line)["type"] for line in received.splitlines()][-1] == "run.stop"


@pytest.mark.parametrize(
    "flags",
    [
        ["--events", "{p}", "--transcript", "{p}"],
        ["--events", "{dir}/run.1.json", "--transcript", "{dir}/run.json", "--trials", "2"],
        ["--events", "{p}", "--resume", "{p}"],
        ["--system-prompt", "{p}", "--transcript", "{p}"],  # before: the prompt file replaced
        ["--system-prompt", "{p}", "--events", "{p}"],
        ["--system-prompt", "{dir}/run.1.json", "--transcript", "{p}", "--trials", "2"],
    ],
)
def test_two_outputs_on_one_file_are_refused_and_nothing_is_lost(capsys, workdir, tmp_path, flags):
    p = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(p)],
        FakeClient(reply(text("done"))),
    )
    (tmp_path / "run.1.json").write_text("the first trial's\n")
    kept = {f: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()}
    client = FakeClient(reply(text("again")))
    argv = [f.format(p=p, dir=tmp_path) for f in flags]
    code, _, err = run_cli(
        capsys, argv + ["more" if "--resume" in argv else "q", "--workdir", str(workdir)], client
    )
    assert (code, client.requests) == (2, []) and "would" in err, err
    assert {f: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()} == kept


def test_events_that_cannot_be_written_are_said_once_and_kept_in_the_transcript(
    capsys, workdir, tmp_path
):
    read, write = os.pipe()
    os.close(read)  # a reader that went away: every write is EPIPE
    path = tmp_path / "run.json"
    try:
        code, _, err = run_cli(
            capsys,
            [
                "q",
                "--workdir",
                str(workdir),
                "--events",
                f"/dev/fd/{write}",
                "--transcript",
                str(path),
            ],
            FakeClient(reply(tool_use("read_file", {"path": "notes.md"})), reply(text("done"))),
        )
    finally:
        os.close(write)
    assert code == 0 and err.count("event stream could not be written") == 1, err
    saved = json.loads(path.read_text())
    assert "events from seq 1 (run.start) on were dropped" in saved["events_lost"]
    assert not schema_errors(saved, "transcript")


@pytest.mark.parametrize(
    "target, fragment",
    [
        ("{tmp}", "is a directory"),
        ("/sys/agent-test.json", "cannot be written"),
        ("{tmp}/missing/run.json", "does not exist"),
    ],
)
def test_an_unwritable_transcript_is_a_usage_error_before_any_request(
    capsys, workdir, tmp_path, target, fragment
):
    client = FakeClient()
    code, _, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", target.format(tmp=tmp_path)],
        client,
    )
    assert (code, client.requests) == (2, []) and fragment in err


# --- events ---


def test_a_run_tells_its_story_in_events(capsys, workdir, tmp_path):
    events_path, transcript = tmp_path / "run.events.jsonl", tmp_path / "run.json"
    long_answer = ("The average is 85. " * 40 + "\n") * 3
    client = FakeClient(
        reply(
            text("Let me look."),
            tool_use("read_file", {"path": "scores.csv"}),
            tool_use("run_python", {"code": "print(85)"}),
        ),
        FakeAPIError(529, "overloaded_error", "Overloaded", {"retry-after": "0"}),
        Chunked(reply(text(long_answer)), size=7),
    )
    code, out, _ = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--yes",
            "--no-sandbox",
            "--events",
            str(events_path),
            "--transcript",
            str(transcript),
        ],
        client,
    )
    events, saved = events_of(events_path), json.loads(transcript.read_text())
    assert code == 0 and out == long_answer + "\n"
    assert_well_formed(events)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["run.start", "turn.start", "text"]
    assert kinds.count("turn.start") == kinds.count("turn.end") == 2
    assert kinds.count("tool.start") == kinds.count("tool.end") == 2
    assert events[0]["run_id"] == saved["run_id"] and events[0]["model"] == saved["model"]
    retry = next(e for e in events if e["type"] == "api.retry")
    assert (retry["attempt"], retry["status"], retry["delay"]) == (1, 529, 0.0)
    ends = {e["name"]: e for e in events if e["type"] == "tool.end"}
    assert ends["run_python"]["exit_code"] == 0 and ends["run_python"]["declined"] is False
    assert ends["read_file"]["bytes"] == len("name,score\nAlice,88\nBob,72\nChen,95\n")
    said = [e for e in events if e["type"] == "text" and e["turn"] == 2]
    assert "".join(e["text"] for e in said) == long_answer
    assert len(said) <= 4, "text is coalesced: a long answer is a few events, not hundreds"
    stop = events[-1]
    assert (stop["stop"], stop["exit_code"], stop["answer"]) == ("end_turn", 0, long_answer)
    assert stop["usage"] == saved["usage"] and stop["turns"] == 2
    turn_end = [e for e in events if e["type"] == "turn.end"][1]
    assert turn_end["usage"] == saved["turns"][1]["usage"] and turn_end["attempts"] == 2


@pytest.mark.parametrize(
    "ending, label, code",
    [
        (FakeAPIError(400, "invalid_request_error", "messages: bad"), "api_error", 1),
        (KeyboardInterrupt(), "interrupted", 130),
    ],
)
def test_run_stop_is_last_however_the_run_ends(capsys, workdir, tmp_path, ending, label, code):
    path = tmp_path / "e.jsonl"

    def fail(request):
        raise ending

    client = FakeClient(reply(tool_use("read_file", {"path": "notes.md"})), fail)
    got, _, _ = run_cli(capsys, ["q", "--workdir", str(workdir), "--events", str(path)], client)
    events = events_of(path)
    assert_well_formed(events)
    assert got == code and (events[-1]["stop"], events[-1]["exit_code"]) == (label, code)


def test_run_stop_is_last_after_an_internal_error(capsys, workdir, tmp_path, monkeypatch):
    path = tmp_path / "e.jsonl"
    monkeypatch.setattr(agent, "drive", lambda *a: 1 / 0)
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--events", str(path)], FakeClient()
    )
    events = events_of(path)
    assert_well_formed(events)
    assert code == 1 and events[-1]["stop"] == "error" and "ZeroDivisionError" in err


@pytest.mark.parametrize(
    "args",
    [
        ["--replay", "RUN", "--workdir", "WORK", "--events", "EVENTS", "--quiet"],
        ["--schema", "transcript"],
    ],
)
def test_a_reader_that_goes_away_ends_the_output_not_the_run(
    capsys, workdir, tmp_path, agent_copy, args
):
    """`agent.py ... | head -c 5`: the answer cannot all be printed, and the run still ended as
    it did: its exit code, its transcript and its events agree, and stderr blames no bug."""
    recording = tmp_path / "rec.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(recording)],
        FakeClient(reply(text("the answer " * 20_000))),
    )
    events = tmp_path / "e.jsonl"
    args = [{"RUN": recording, "WORK": workdir, "EVENTS": events}.get(a, a) for a in args]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    done = subprocess.run(
        [sys.executable, str(agent_copy), *map(str, args)],
        stdout=write,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=agent_env(),
        cwd=tmp_path,
        timeout=60,
    )
    os.close(write)
    assert done.returncode == 0 and "internal error" not in done.stderr, done.stderr[-300:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    if "--events" in args:
        assert events_of(events)[-1]["stop"] == "end_turn"


def test_a_stderr_reader_that_goes_away_ends_the_progress_not_the_run(
    capsys, workdir, tmp_path, agent_copy
):
    """`agent.py ... 2>&1 | head`: progress can no longer be shown; the run goes on and ends as
    it would have, its answer on stdout, its stop and run.stop recorded (before: api_error,
    usage zeroed, no run.stop)."""
    recording, new, events = tmp_path / "rec.json", tmp_path / "new.json", tmp_path / "e.jsonl"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(recording)],
        FakeClient(reply(text("the answer " * 20_000))),
    )
    read, write = os.pipe()
    os.close(read)
    done = subprocess.run(
        [
            sys.executable,
            str(agent_copy),
            "--replay",
            str(recording),
            "--workdir",
            str(workdir),
            "--transcript",
            str(new),
            "--events",
            str(events),
        ],
        stdout=subprocess.PIPE,
        stderr=write,
        text=True,
        stdin=subprocess.DEVNULL,
        env=agent_env(),
        cwd=tmp_path,
        timeout=60,
    )
    os.close(write)
    saved = json.loads(new.read_text())
    assert done.returncode == 0 and done.stdout.startswith("the answer the answer")
    assert saved["stop"]["reason"] == "end_turn" and saved["usage"]["input_tokens"] == 100
    assert events_of(events)[-1]["type"] == "run.stop"


def test_events_on_stdout_are_all_stdout_carries(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "notes.md"})), reply(text("42")))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--events", "-"], client)
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and "42" in err
    assert_well_formed(events)
    assert events[-1]["answer"] == "42"


def test_events_inside_the_workdir_or_sharing_stdout_are_refused(capsys, workdir):
    client = FakeClient()
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--events", str(workdir / "e.jsonl")], client
    )
    assert (code, client.requests) == (2, []) and "inside the workdir" in err
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--events", "-", "--transcript", "-"], client
    )
    assert code == 2 and "share stdout" in err


def test_sigterm_still_ends_the_stream_with_run_stop(request, workdir, tmp_path, agent_copy):
    api = serve(request, reply(tool_use("run_python", {"code": "import time; time.sleep(60)"})))
    path = tmp_path / "e.jsonl"
    proc = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        "--yes",
        "--no-sandbox",
        "--events",
        path,
        background=True,
        env=agent_env(api),
        cwd=tmp_path,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and '"tool.start"' not in (
        path.read_text() if path.exists() else ""
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=15)
    events = events_of(path)
    assert_well_formed(events)
    assert proc.returncode == 130 and events[-1]["stop"] == "interrupted"
    assert "SIGTERM" in events[-1]["detail"]  # not only "Ctrl-C": it was a SIGTERM


# --- schemas ---


@pytest.mark.parametrize("name", sorted(agent.SCHEMAS))
def test_schema_prints_a_valid_json_schema(capsys, name):
    code, out, _ = run_cli(capsys, ["--schema", name])
    assert code == 0
    schema = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_strict_check_catches_an_undocumented_field():
    event = {"type": "turn.start", "seq": 1, "at": agent.now(), "run_id": "r", "turn": 1}
    assert not schema_errors(event, "events")
    assert schema_errors(dict(event, surprise=1), "events")
    assert schema_errors(dict(event, turn="one"), "events")


# --- resume ---


def test_resume_answers_a_dangling_tool_use_and_keeps_numbering(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    budget_stopped(capsys, workdir, path)
    client = FakeClient(reply(text("Resumed answer.")))
    code, out, _ = run_cli(
        capsys, ["--resume", str(path), "go on", "--workdir", str(workdir)], client
    )
    assert (code, out) == (0, "Resumed answer.\n")
    sent = client.requests[0]["messages"]
    assert sent[-1]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_X",
        "is_error": True,
        "content": sent[-1]["content"][0]["content"],
    }
    assert "not run" in sent[-1]["content"][0]["content"]
    assert sent[-1]["content"][-1] == text("go on")
    saved = json.loads(path.read_text())  # updated in place
    assert [t["turn"] for t in saved["turns"]] == [1, 2]
    assert saved["stop"]["reason"] == "end_turn" and saved["workdir"] == os.path.realpath(workdir)


def test_resume_without_a_question_continues_a_budget_stop(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    budget_stopped(capsys, workdir, path)
    client = FakeClient(reply(text("ok")))
    code, _, _ = run_cli(
        capsys,
        [
            "--resume",
            str(path),
            "--transcript",
            str(tmp_path / "b.json"),
            "--workdir",
            str(workdir),
        ],
        client,
    )
    assert code == 0 and (tmp_path / "b.json").exists()
    assert json.loads(path.read_text())["stop"]["reason"] == "token_budget"  # left alone


def test_resumed_limits_count_afresh(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    budget_stopped(capsys, workdir, path)
    client = FakeClient(
        reply(tool_use("read_file", {"path": "notes.md"}), input_tokens=900), reply(text("ok"))
    )
    code, _, _ = run_cli(
        capsys, ["--resume", str(path), "--token-budget", "1000", "--workdir", str(workdir)], client
    )
    assert code == 0 and len(client.requests) == 2


REFUSED = {
    "text alone": [text("I can't help with that part")],
    "with a tool call": [text("no"), tool_use("read_file", {"path": "scores.csv"})],
}


@pytest.mark.parametrize("refused", sorted(REFUSED))
def test_resume_after_a_refusal_drops_the_refused_turn(capsys, workdir, tmp_path, refused):
    """A refused reply goes from the history whole, with any calls it asked for: their answers
    would be the message removed, leaving the calls without results."""
    path = tmp_path / "run.json"
    first = FakeClient(reply(*REFUSED[refused], stop_reason="refusal"))
    run_cli(capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], first)
    client = FakeClient(reply(text("ok")))
    code, _, _ = run_cli(
        capsys, ["--resume", str(path), "something else", "--workdir", str(workdir)], client
    )
    sent = client.requests[0]["messages"]
    check_request(client.requests[0])
    assert code == 0 and [m["role"] for m in sent] == ["user"]
    assert sent[0]["content"][-1] == text("something else")


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "does not exist"),
        ("{not json", "is not a JSON document"),
        ('{"version": 1, "messages": []}', "not a version 1"),
        (
            '{"version": 1, "model": "m", "turns": [], "messages": [{"role": "user", "content": '
            '[{"type": "tool_use"}]}]}',
            "not a version 1",
        ),
        (
            '{"version": 1, "model": "m", "turns": [{}], "messages": [{"role": "user", "content": '
            '[{"type": "text", "text": "q"}]}]}',
            "not a version 1",
        ),
        ("[1, 2]", "cannot resume: {path} is a JSON list, not a transcript\n"),
        ("null", "cannot resume: {path} is a JSON null, not a transcript\n"),  # newuser2 N12
        ('"text"', "cannot resume: {path} is a JSON string, not a transcript\n"),
        (
            '\ufeff{"version": 1}',
            "--resume {path} starts with a byte-order mark (saved by an "
            "editor?), which no JSON document starts with: save it without one\n",
        ),
        (
            '{"version": 99, "turns": []}',
            "cannot resume: {path} is a JSON object, not a transcript\n",
        ),
        ("{}", "is an empty JSON object, not a transcript"),
        ('{"version": 2, "kind": "trials", "trials": []}', "is a trials summary, not a transcript"),
        (
            '{"type": "run.start", "seq": 1}\n{"type": "run.stop", "seq": 2}\n',
            "is an event stream (--events, JSON Lines)",
        ),
    ],
)
def test_resume_of_a_bad_file_says_what_it_was_given(capsys, tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    client = FakeClient()
    code, _, err = run_cli(capsys, ["--resume", str(path), "more"], client)
    assert (code, client.requests) == (2, []) and fragment.format(path=path) in err, err
    assert len(err.strip().splitlines()) == 1


HOSTILE_DOCUMENTS = {
    "nested 200,000 deep": ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
    "a 5,000-digit number": ('{"version": 1, "n": ' + "9" * 5000 + "}", "a number too large"),
    "a 400-digit token count": (None, "a number too large"),
    "an infinite cost": ('{"version": 1, "cost_usd": 1e400}', "a number too large"),
    "NaN": ('{"version": 1, "cost_usd": NaN}', "not a JSON document"),
    "2.5 million empty objects": ("[" + "{}," * 2_500_000 + "{}]", "objects and lists"),
}


@pytest.mark.parametrize("flag", ["--resume", "--replay", "--report", "--export"])
@pytest.mark.parametrize("name", HOSTILE_DOCUMENTS)
def test_a_hostile_document_is_a_usage_error_in_every_mode(capsys, workdir, tmp_path, flag, name):
    """Deep nesting, huge numbers and millions of tiny objects: each would end agent.py with a
    RecursionError, a ValueError or an OverflowError, or take gigabytes to parse."""
    content, fragment = HOSTILE_DOCUMENTS[name]
    path = tmp_path / "doc.json"
    if content is None:  # a transcript agent.py wrote, with one count made absurd
        run_cli(
            capsys,
            ["q", "--workdir", str(workdir), "--transcript", str(path)],
            FakeClient(reply(text("done"))),
        )
        content = re.sub(r'"input_tokens": ?100', '"input_tokens": ' + "9" * 400, path.read_text())
        assert "9" * 400 in content
    path.write_text(content)
    argv = {
        "--resume": ["--resume", str(path), "more"],
        "--replay": ["--replay", str(path)],
        "--report": ["--report", str(path)],
        "--export": ["--export", "atif", str(path)],
    }
    client = FakeClient()
    code, out, err = run_cli(
        capsys,
        argv[flag] + ["--workdir", str(workdir)] * (flag in ("--resume", "--replay")),
        client,
    )
    assert (code, out, client.requests) == (2, "", []), err
    assert fragment in err and "internal error" not in err and len(err.strip().splitlines()) == 1


def two_turns(capsys, workdir, path):
    """A transcript agent.py wrote: a tool call, then an answer."""
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(reply(tool_use("read_file", {"path": "notes.md"})), reply(text("done"))),
    )
    return json.loads(path.read_text())


def costs_past_a_float(t):
    for turn in t["turns"]:
        turn["usage"]["cost_usd"] = 1.7e308  # each finite; their sum is not
    return t


def refused_with_no_turns(t):
    t["turns"], t["stop"] = [], {"reason": "refusal", "detail": "x", "exit_code": 5}
    return t


def seconds_past_a_float(t):
    for turn in t["turns"]:
        turn["seconds"] = turn["api_seconds"] = 1.7e308
    return t


def without_stop(t):
    del t["stop"]  # a run copied while it went on: read as one with no stop yet
    return t


def without_a_cost(t):
    del t["turns"][0]["usage"]["cost_usd"]
    return t


def stop_reason_not_a_string(t):
    t["turns"][-1]["stop_reason"] = {"a": 1}
    return t


def workdir_with_a_nul(t):
    t["workdir"] = "/tmp/a\u0000b"
    return t


CHECKED = ("--resume", "--replay", "--export")  # --report renders what it can of any
MALFORMED = {  # name: (how a transcript is made malformed, the modes that must refuse it)
    "no stop": (without_stop, ()),  # before: --replay was an internal error (KeyError)
    "a turn without its cost": (without_a_cost, CHECKED),  # before: --export, KeyError
    "a turn's stop_reason not a string": (stop_reason_not_a_string, CHECKED),  # before:
    # --replay sent it on as a server's, stop error, exit 1
    "a workdir with a NUL byte": (workdir_with_a_nul, CHECKED),  # before: ValueError
    "costs too large to sum": (
        costs_past_a_float,
        ("--resume", "--replay", "--report", "--export"),
    ),
    "seconds too large to sum": (seconds_past_a_float, ("--report",)),
    "ends on a refused reply with no turns": (
        refused_with_no_turns,
        ("--resume", "--replay", "--export"),
    ),
}


@pytest.mark.parametrize("flag", ["--resume", "--replay", "--report", "--export"])
@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_transcript_is_one_line_and_exit_2_in_every_mode(
    capsys, workdir, tmp_path, flag, name
):
    """Before: --export wrote `Infinity` into the trajectory (exit 0, a file no JSON reader
    accepts), --resume saved a transcript with `Infinity` in it, --resume of a refusal with no
    turns was an internal error (IndexError, exit 1)."""
    mutate, refusing = MALFORMED[name]
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(mutate(two_turns(capsys, workdir, path))))
    out_path = tmp_path / "out.json"
    argv = {
        "--resume": [
            "--resume",
            str(path),
            "more",
            "--workdir",
            str(workdir),
            "--transcript",
            str(out_path),
        ],
        "--replay": [
            "--replay",
            str(path),
            "--workdir",
            str(workdir),
            "--transcript",
            str(out_path),
        ],
        "--report": ["--report", str(path), "-o", str(out_path)],
        "--export": ["--export", "atif", str(path), "-o", str(out_path)],
    }[flag]
    client = FakeClient(reply(text("more")))
    code, out, err = run_cli(capsys, argv, client)
    assert "internal error" not in err and "Traceback" not in err, err
    if flag in refusing:
        assert (code, out, client.requests) == (2, "", []), err
        assert len(err.strip().splitlines()) == 1 and not out_path.exists()
    elif out_path.exists() and flag != "--report":  # what it wrote, it reads back
        assert agent.read_document(out_path, "-") is not None


@pytest.mark.parametrize("flag", ["--resume", "--replay"])
@pytest.mark.parametrize(
    "recorded", ["/tmp/" + "a" * 300, "/tmp/x/" + "b/" * 3000, "/tmp/" + "\u0301" * 1000]
)
def test_a_recorded_workdir_no_directory_can_have_is_one_short_line_and_exit_2(
    capsys, workdir, tmp_path, flag, recorded
):
    """A transcript's workdir with a name too long, or 6,000 characters: before, an internal
    error (exit 1) before the consent question, the whole value on one line of up to 6,000
    characters. Now a usage error, one line, the value quoted, escaped and cut."""
    path = tmp_path / "doc.json"
    document = two_turns(capsys, workdir, path)
    path.write_text(json.dumps(dict(document, workdir=recorded)))
    argv = [flag, str(path), *(["more"] if flag == "--resume" else []), "--yes"]
    client = FakeClient(reply(text("more")))
    code, out, err = run_cli(capsys, argv, client)
    assert (code, out, client.requests) == (2, "", []), err
    assert len(err.strip().splitlines()) == 1 and len(err) < 400, err


def test_what_a_hostile_server_sends_is_written_as_json_agent_py_reads_back(
    capsys, workdir, tmp_path
):
    """NaN and a 2**60 integer in a tool call's input, and every usage count at 2**53 in every
    turn: before, the transcript held NaN (and tokens past 2**53), which --resume, --report and
    every JSON reader refuse."""
    path = tmp_path / "run.json"
    huge = dict(input_tokens=1 << 53, output_tokens=1 << 53, write=1 << 53, read=1 << 53)
    client = FakeClient(
        reply(text("a"), tool_use("read_file", {"path": "notes.md", "x": float("nan")}), **huge),
        reply(tool_use("read_file", {"path": "notes.md", "n": 1 << 60}), **huge),
        reply(text("done"), **huge),
    )
    code, _, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path), "--token-budget", str(1 << 60)],
        client,
    )
    assert code == 0, err
    saved = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} written"))
    assert saved["usage"]["tokens"] == 1 << 53 and agent.load_transcript(path)
    code, _, err = run_cli(capsys, ["--report", str(path), "-o", str(tmp_path / "r.html")])
    assert code == 0, err
    export = tmp_path / "run.atif.json"
    code, _, err = run_cli(capsys, ["--export", "atif", str(path), "-o", str(export)])
    assert code == 0 and agent.read_document(export, "-")["final_metrics"], err


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "huge"])
def test_resume_reads_only_a_regular_file_and_nothing_there_makes_it_block(
    tmp_path, kind, agent_copy
):
    """Whatever sits at the path, agent.py answers at once (a FIFO nobody writes to would
    block an open or a read forever; /dev/zero never ends; a sparse file is all too big)."""
    path = tmp_path / "run.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(agent.MAX_DOCUMENT + 1)
    else:
        path = Path("/dev/zero")
    done = run_agent_py(
        agent_copy, "--resume", path, "more", env=agent_env(), timeout=20, stdin=subprocess.DEVNULL
    )
    what = {
        "fifo": "is a FIFO",
        "directory": "is a directory",
        "device": "character device",
        "huge": f"is over {agent.MAX_DOCUMENT >> 20} MiB",
    }[kind]
    assert done.returncode == 2 and what in done.stderr, done.stderr


def test_resume_takes_the_transcripts_model_only_if_the_user_agrees(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    budget_stopped(capsys, workdir, path)
    saved = json.loads(path.read_text())
    saved["model"] = "claude-opus-5-5"
    path.write_text(json.dumps(saved))
    given = ["--resume", str(path), "more", "--workdir", str(workdir)]
    client = FakeClient()
    code, _, err = run_cli(capsys, given, client, stdin="")  # no answer: not resumed
    assert (code, client.requests) == (2, []) and 'model "claude-opus-5-5"' in err
    client = FakeClient(reply(text("a")))
    run_cli(capsys, given, client, stdin="y\n")
    assert client.requests[0]["model"] == "claude-opus-5-5"
    client = FakeClient(reply(text("b")))
    code, _, err = run_cli(capsys, given + ["--model", "claude-sonnet-5-5"], client, stdin="")
    assert code == 0 and client.requests[0]["model"] == "claude-sonnet-5-5" and "[y/N]" not in err
    assert json.loads(path.read_text())["model"] == "claude-sonnet-5-5"


@pytest.mark.parametrize("recorded", ["http://127.0.0.1:8765", None])
def test_resume_sends_its_history_to_another_server_only_if_the_user_agrees(
    capsys, workdir, tmp_path, monkeypatch, recorded
):
    """A run made against one server (or Anthropic's API: no base_url), resumed where
    ANTHROPIC_BASE_URL names another: its whole history would go there. --yes is not
    agreement; no answer is a no; the same server asks nothing."""
    path = tmp_path / "run.json"
    budget_stopped(capsys, workdir, path)
    saved = json.loads(path.read_text())
    saved.pop("base_url", None)
    if recorded:
        saved["base_url"] = recorded
    path.write_text(json.dumps(saved))
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:8767")
    given = ["--resume", str(path), "more", "--workdir", str(workdir), "--yes"]
    client = FakeClient()
    code, _, err = run_cli(capsys, given, client, stdin="")  # no answer: not resumed
    shown = recorded or "https://api.anthropic.com"
    assert (code, client.requests) == (2, []), err
    assert f'  server "{shown}" (its history would now go to http://127.0.0.1:8767)\n' in err
    assert err.rstrip().endswith(  # newuser2 N4: not "give ANTHROPIC_BASE_URL", which was given
        f"not resumed: {path} goes on with a server other than the one that made it only when "
        "you answer y (echo y | agent.py ...)"
    ), err
    client = FakeClient(reply(text("a")))
    code, _, err = run_cli(capsys, given, client, stdin="y\n")
    assert code == 0 and len(client.requests) == 1
    assert json.loads(path.read_text())["base_url"] == "http://127.0.0.1:8767"
    client = FakeClient(reply(text("b")))  # now made with this server: nothing to ask
    code, _, err = run_cli(capsys, given, client, stdin="")
    assert code == 0 and len(client.requests) == 1 and "[y/N]" not in err, err


def test_resume_of_a_finished_transcript_needs_a_question(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(reply(text("done"))),
    )
    client = FakeClient()
    code, _, err = run_cli(capsys, ["--resume", str(path)], client)
    assert (code, client.requests) == (2, []) and "finished" in err


# --- what --resume trusts: nothing the model's code could have written ---


def test_resuming_a_transcript_inside_the_workdir_is_refused(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(reply(text("done"))),
    )
    moved = workdir / "run.json"
    path.rename(moved)
    client = FakeClient()
    code, _, err = run_cli(capsys, ["--resume", str(moved), "more"], client)
    assert (code, client.requests) == (2, []) and "inside the workdir" in err


@pytest.fixture
def home(tmp_path):
    """Somewhere a forged transcript would like the run to work: the user's home."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (home / ".bashrc").write_text("# the user's\n")
    return home


def forged_in(capsys, workdir, tmp_path, home):
    """A transcript a script left behind, naming the user's home as its workdir."""
    path = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(reply(text("done"))),
    )
    forged = json.loads(path.read_text())
    forged["workdir"] = str(home)
    path.write_text(json.dumps(forged))
    return path


@pytest.mark.parametrize("answer", ["", "n\n"])
def test_a_transcript_cannot_choose_where_the_run_works(capsys, workdir, tmp_path, home, answer):
    path = forged_in(capsys, workdir, tmp_path, home)
    reads = FakeClient(
        reply(tool_use("read_file", {"path": ".ssh/id_ed25519"})),
        reply(tool_use("run_python", {"code": "open('.bashrc', 'a').write('x')"})),
        reply(text("done")),
    )
    code, _, err = run_cli(
        capsys, ["--resume", str(path), "continue", "--yes"], reads, stdin=answer
    )  # --yes is not consent to the transcript's workdir
    assert (code, reads.requests) == (2, [])
    assert f'workdir "{home}"' in err and "[y/N]" in err and "not resumed" in err
    assert (home / ".bashrc").read_text() == "# the user's\n"


def test_the_consent_question_cannot_be_redrawn_by_the_transcript(capsys, workdir, tmp_path):
    """A forged model name (or workdir name) holding ESC[2K and a carriage return would erase
    the line naming what the user is asked about, and draw a harmless one in its place."""
    home = tmp_path / "home\x1b[1A\x1b[2K\rnothing to see"
    home.mkdir()
    path = forged_in(capsys, workdir, tmp_path, home)
    forged = json.loads(path.read_text())
    forged["model"] = "claude\x1b[2K\r\x9b2Kharmless\u202e"
    path.write_text(json.dumps(forged))
    for argv in (["--resume", str(path), "go on"], ["--replay", str(path)]):
        client = FakeClient()
        code, _, err = run_cli(capsys, argv, client, stdin="")
        assert (code, client.requests) == (2, [])
        question = err[: err.index("[y/N]")]
        assert not set(question) & set("\x1b\r\x9b\u202e"), repr(question)
        assert "\\x1b[1A\\x1b[2K\\x0dnothing to see" in question


def on_a_24_row_screen(agent_copy, argv, cwd):
    """agent.py run in a 24 x 80 terminal (tmux), left at its question: the screen the user
    answers, as tmux shows it (wrapped rows joined), with the answer n given after."""
    if shutil.which("tmux") is None:
        pytest.skip("no tmux to draw a terminal's screen (apt-get install tmux)")
    sock = cwd / "tmux.sock"
    tmux = ["tmux", "-S", str(sock), "-f", "/dev/null"]
    command = shlex.join([sys.executable, str(agent_copy), *map(str, argv)])
    subprocess.run(
        tmux + ["new-session", "-d", "-x", "80", "-y", "24", command],
        check=True,
        cwd=cwd,
        env=agent_env(TERM="xterm"),
        timeout=30,
    )
    try:
        deadline, screen = time.monotonic() + 60, ""
        while "[y/N]" not in screen and time.monotonic() < deadline:
            time.sleep(0.2)
            screen = subprocess.run(
                tmux + ["capture-pane", "-p", "-J"], capture_output=True, text=True, timeout=30
            ).stdout
        rows = (
            subprocess.run(
                tmux + ["capture-pane", "-p"], capture_output=True, text=True, timeout=30
            )
            .stdout.rstrip("\n")
            .split("\n")
        )
        subprocess.run(tmux + ["send-keys", "n", "Enter"], timeout=30)
        return screen, rows
    finally:
        time.sleep(0.3)
        subprocess.run(tmux + ["kill-server"], capture_output=True, timeout=30)


FAKE = "agent.py: note: this transcript was checked and is safe"


@pytest.mark.parametrize("attack", ["lines in the workdir's name", "a model 3,000 long"])
@pytest.mark.parametrize("flag", ["--resume", "--replay"])
def test_the_screen_the_user_answers_shows_the_truth(
    capsys, workdir, tmp_path, agent_copy, attack, flag
):
    """Before: a workdir named with line breaks drew lines that looked like agent.py's own, and
    a 3,000-character model name pushed the workdir's line off the top of a 24-row screen, so
    the user answered a question whose subject they could not see."""
    if attack == "a model 3,000 long" and flag == "--replay":
        pytest.skip("--replay takes no model from the file")
    home = tmp_path / "home"
    if attack == "lines in the workdir's name":
        home = tmp_path / ("x\n" + "\n".join([FAKE] * 3)) / ("y\n" + "\n".join([FAKE] * 3))
    home.mkdir(parents=True)
    path = forged_in(capsys, workdir, tmp_path, home)
    forged = json.loads(path.read_text())
    if attack == "a model 3,000 long":
        forged["model"] = "claude-" + "x" * 3000
    path.write_text(json.dumps(forged))
    screen, rows = on_a_24_row_screen(
        agent_copy, [flag, path] + ["go on"] * (flag == "--resume"), cwd=tmp_path
    )
    assert not any(row.startswith("agent.py:") for row in rows), rows
    assert not any(FAKE in row and "\\n" not in row for row in rows), rows
    shown = str(home).replace("\n", "\\n")
    assert shown in screen, screen  # the whole workdir is on the screen
    assert f'  workdir "{shown}"' in screen.splitlines(), screen  # on a line of its own
    asked = "them" if attack == "a model 3,000 long" else "it"  # the workdir alone: it
    assert len(rows) <= 24 and rows[-1].startswith(f"Go on with {asked}? [y/N]"), rows


@pytest.mark.parametrize("flag", ["--resume", "--replay"])
def test_once_agreed_the_lines_that_follow_are_agent_pys_own(capsys, workdir, tmp_path, flag):
    """The line that names the workdir and model once the user said yes: before, a workdir
    or model name with line breaks drew lines like agent.py's own right after the answer."""
    home = tmp_path / ("x\n" + FAKE)
    home.mkdir()
    path = forged_in(capsys, workdir, tmp_path, home)
    forged = json.loads(path.read_text())
    forged["model"] = "claude-haiku-5-5\n" + FAKE
    path.write_text(json.dumps(forged))
    argv = [flag, str(path)] + ["go on"] * (flag == "--resume")
    code, _, err = run_cli(capsys, argv, FakeClient(reply(text("ok"))), stdin="y\n")
    assert not [line for line in err.splitlines() if line.startswith(FAKE)], err


def test_the_transcripts_workdir_is_used_once_the_user_agrees(capsys, workdir, tmp_path, home):
    path = forged_in(capsys, workdir, tmp_path, home)
    client = FakeClient(reply(tool_use("read_file", {"path": ".bashrc"})), reply(text("ok")))
    code, _, err = run_cli(capsys, ["--resume", str(path), "continue"], client, stdin="y\n")
    assert code == 0 and "the user's" in client.requests[1]["messages"][-1]["content"][0]["content"]
    client = FakeClient(reply(text("ok")))
    code, _, err = run_cli(
        capsys, ["--resume", str(path), "more", "--workdir", str(workdir)], client, stdin=""
    )  # given on the command line: nothing to ask
    assert code == 0 and "[y/N]" not in err


def test_resume_with_a_deleted_workdir_names_the_transcripts(capsys, tmp_path):
    workdir = tmp_path / "gone"
    workdir.mkdir()
    path = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(reply(text("done"))),
    )
    workdir.rmdir()
    code, _, err = run_cli(capsys, ["--resume", str(path), "more"], FakeClient())
    assert code == 2 and err == (
        f"agent.py: {path} recorded the workdir {workdir}, which does "
        "not exist here: give -C DIR (--workdir) to resume it in "
        "another directory\n"
    )  # the way out named (newuser #3, #24)


def test_replay_of_a_recording_whose_workdir_is_not_here_names_the_way_out(capsys, tmp_path):
    """The example from another directory: its relative workdir `workspace` is not there."""
    example = Path(agent.__file__).with_name("workspace") / "example-run.json"
    code, out, err = run_cli(capsys, ["--replay", str(example), "--yes"])
    assert (code, out) == (2, "")
    assert err == (
        f"agent.py: {example} recorded the workdir workspace (here "
        f"{Path.cwd() / 'workspace'}), which does not exist here: give -C DIR "
        "(--workdir) to replay it in another directory\n"
    )


def test_a_transcript_inside_its_recorded_workdir_is_refused(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(reply(text("done"))),
    )
    moved = workdir / "run.json"
    path.rename(moved)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    client = FakeClient()
    code, _, err = run_cli(
        capsys,
        [
            "--resume",
            str(moved),
            "more",
            "--workdir",
            str(elsewhere),
            "--transcript",
            str(tmp_path / "new.json"),
        ],
        client,
    )
    assert (code, client.requests) == (2, []) and "inside the workdir" in err


def finished_transcript(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(
            reply(tool_use("read_file", {"path": "notes.md"}, id="toolu_R")), reply(text("done"))
        ),
    )
    return path, json.loads(path.read_text())


RLO_CSI = "\u202e\u009b2J"  # right-to-left override; the 8-bit CSI: ESC [ on some terminals


def on_a_terminal(agent_copy, *args, cwd):
    """agent.py's stdout as a terminal shows it: (exit code, what was written there)."""
    import pty

    master, slave = pty.openpty()
    done = subprocess.run(
        [sys.executable, str(agent_copy), *map(str, args)],
        stdout=slave,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=agent_env(),
        timeout=60,
    )
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side is closed and drained
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return done.returncode, out.decode("utf-8")


def test_json_and_html_on_a_terminal_carry_no_raw_bidi_or_c1(capsys, workdir, tmp_path, agent_copy):
    """What the model wrote (an answer with U+202E and U+009B) reaches a terminal escaped in
    --transcript -, --events -, --export -o - and --report -o -; through a pipe, as it is."""
    path = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(reply(text(f"evil{RLO_CSI}answer"))),
    )
    for args in (
        ["--export", "atif", path, "-o", "-"],
        ["--report", path, "-o", "-"],
        ["--replay", path, "--workdir", workdir, "--transcript", "-"],
        ["--replay", path, "--workdir", workdir, "--events", "-"],
    ):
        code, shown = on_a_terminal(agent_copy, *args, cwd=tmp_path)
        assert code == 0 and "evil" in shown
        assert not set(shown) & {"\u202e", "\u009b"}, (args, shown[shown.index("evil") - 20 :][:80])
        piped = run_agent_py(agent_copy, *args, cwd=tmp_path, env=agent_env(), timeout=60)
        assert piped.returncode == 0 and f"evil{RLO_CSI}answer" in piped.stdout  # unchanged
        if args[0] != "--report":
            line = shown.strip().splitlines()[-1] if "--events" in args else shown
            assert "\\u202e" in json.dumps(json.loads(line)) or "\\u202e" in shown


def test_resume_takes_the_tools_from_agent_py_and_says_where(capsys, workdir, tmp_path):
    path, saved = finished_transcript(capsys, workdir, tmp_path)
    saved["tools"] = [
        {"name": "shell", "description": "run anything", "input_schema": {"type": "object"}}
    ]
    path.write_text(json.dumps(saved))
    client = FakeClient(reply(text("ok")))
    code, _, err = run_cli(capsys, ["--resume", str(path), "more"], client, stdin="y\n")
    assert code == 0 and client.requests[0]["system"] == agent.SYSTEM_PROMPT
    assert client.requests[0]["tools"] == agent.TOOLS
    assert f"resuming {path}: 2 turns so far; workdir {os.path.realpath(workdir)}" in err


def test_quiet_resume_says_nothing_on_stderr_but_the_answer_is_printed(capsys, workdir, tmp_path):
    """-q is "no progress on stderr": the `resuming ...` line was printed anyway."""
    path, _ = finished_transcript(capsys, workdir, tmp_path)
    client = FakeClient(reply(text("ok")))
    code, out, err = run_cli(
        capsys, ["--resume", str(path), "more", "--workdir", str(workdir), "-q"], client
    )
    assert (code, out, err) == (0, "ok\n", ""), err


def test_resume_keeps_the_transcripts_system_prompt_only_if_the_user_agrees(
    capsys, workdir, tmp_path
):
    """A run made with --system-prompt goes on with it; but a transcript is only a file, so a
    prompt that is not agent.py's is used once the user, shown it, agrees (like its model)."""
    prompt, other = tmp_path / "task.txt", tmp_path / "other.txt"
    prompt.write_text("You solve terminal tasks.")
    other.write_text("You answer in haiku.")
    path = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path), "--system-prompt", str(prompt)],
        FakeClient(reply(text("done"))),
    )
    given = ["--resume", str(path), "more", "--workdir", str(workdir)]
    client = FakeClient()
    code, _, err = run_cli(capsys, given, client, stdin="")  # no answer: not resumed
    assert (code, client.requests) == (2, []) and "system prompt" in err
    assert '"You solve terminal tasks."' in err
    assert f"not resumed: give --system-prompt FILE to say how {path} goes on" in err
    client = FakeClient(reply(text("a")))
    code, _, _ = run_cli(capsys, given, client, stdin="y\n")
    assert code == 0 and client.requests[0]["system"] == "You solve terminal tasks."
    assert json.loads(path.read_text())["system"] == "You solve terminal tasks."
    client = FakeClient(reply(text("b")))
    code, _, err = run_cli(capsys, given + ["--system-prompt", str(other)], client, stdin="")
    assert code == 0 and client.requests[0]["system"] == "You answer in haiku."
    assert "[y/N]" not in err and json.loads(path.read_text())["system"] == "You answer in haiku."


FORGERIES = {
    "model missing": lambda s: s.pop("model"),
    "model not a string": lambda s: s.update(model=5),
    "workdir not a string": lambda s: s.update(workdir=["/"]),
    "effort unknown": lambda s: s.update(effort="ludicrous"),
    "stop a list": lambda s: s.update(stop=[]),
    "content a string": lambda s: s["messages"][0].update(content="hi"),
    "role unknown": lambda s: s["messages"][0].update(role="system"),
    "text not a string": lambda s: s["messages"][0]["content"][0].update(text=1),
    "tool input a string": lambda s: s["messages"][1]["content"][0].update(input="rm -rf"),
    "orphan result": lambda s: s["messages"][2]["content"][0].update(tool_use_id="toolu_Z"),
    "unanswered call": lambda s: s["messages"].pop(2),
    "turn usage missing": lambda s: s["turns"][0].pop("usage"),
    "turn number a string": lambda s: s["turns"][0].update(turn="1"),
    "usage count a float": lambda s: s["turns"][0]["usage"].update(input_tokens=1.5),
    "stop without a label": lambda s: s.update(stop={"detail": "x"}),
    "stop label a list": lambda s: s.update(stop={"reason": ["end_turn"], "detail": "x"}),
    "stop label unknown": lambda s: s.update(stop={"reason": "done", "detail": "x"}),
    "cleared a number": lambda s: s.update(cleared=5),
    "cleared holds a list": lambda s: s.update(cleared=[[1]]),
    "tool call id an object": lambda s: s["turns"][0]["tool_calls"][0].update(id={}),
    "prompt tokens a string": lambda s: s["turns"][-1].update(prompt_tokens="9"),
    # before, these three went to the server, which must refuse them (exit 1), or were a bug:
    "text empty": lambda s: s["messages"][0]["content"][0].update(text=""),
    "tool result content a number": lambda s: s["messages"][2]["content"][0].update(content=0),
    "tool result content an object": lambda s: s["messages"][2]["content"][0].update(
        content={"a": 1}
    ),
    "tool result content true": lambda s: s["messages"][2]["content"][0].update(content=True),
    "tool result content a list of numbers": lambda s: s["messages"][2]["content"][0].update(
        content=[1]
    ),
    "prompt tokens null": lambda s: s["turns"][-1].update(prompt_tokens=None),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_transcript_is_a_usage_error_with_nothing_sent(capsys, workdir, tmp_path, forgery):
    path, saved = finished_transcript(capsys, workdir, tmp_path)
    FORGERIES[forgery](saved)
    path.write_text(json.dumps(saved))
    for argv, says in (
        (["--resume", str(path), "more"], "cannot resume"),
        (["--replay", str(path), "--workdir", str(workdir)], "cannot replay"),
        (["--export", "atif", str(path), "-o", "-"], "cannot export"),
    ):
        client = FakeClient()
        code, out, err = run_cli(capsys, argv, client)
        assert (code, out, client.requests) == (2, "", []) and says in err, err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["/dev/stdout", "/proc/self/fd/1"])
def test_a_named_stdout_or_stderr_is_the_fd_even_when_it_is_a_file(
    request, workdir, tmp_path, agent_copy, name
):
    """`-o /dev/stdout > r.html` and `--events /dev/stderr 2> ev` (findings 9, 65): a user
    naming /dev/stdout, /dev/stderr, /dev/fd/N means agent.py's own descriptor, which the
    shell opened; written through it whether it is a pipe, a terminal or a file."""
    example = Path(agent.__file__).parent / "workspace" / "example-run.json"
    with open(tmp_path / "r.html", "w") as page:
        done = subprocess.run(
            [sys.executable, str(agent_copy), "--report", str(example), "-o", name],
            stdout=page,
            stderr=subprocess.PIPE,
            text=True,
            env=agent_env(),
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.html").read_text().startswith("<!doctype html>")
    api = serve(request, reply(text("done")))
    with open(tmp_path / "ev", "w") as ev:
        done = subprocess.run(
            [
                sys.executable,
                str(agent_copy),
                "q",
                "--workdir",
                str(workdir),
                "--events",
                name.replace("stdout", "stderr").replace("/1", "/2"),
            ],
            stdout=subprocess.PIPE,
            stderr=ev,
            text=True,
            env=agent_env(api),
            timeout=60,
        )
    assert done.returncode == 0 and done.stdout == "done\n", (tmp_path / "ev").read_text()
    events = [
        json.loads(line)
        for line in (tmp_path / "ev").read_text().splitlines()
        if line.startswith("{")
    ]
    assert events[0]["type"] == "run.start" and events[-1]["type"] == "run.stop"


@pytest.mark.parametrize("name", ["/dev/null", "/dev/stdout"])
def test_a_transcript_onto_a_device_says_why_and_what_to_give(capsys, workdir, name):
    """A transcript is rewritten whole after every turn, so it only ever replaces a regular
    file: /dev/null or /dev/stdout is refused before anything is sent, saying what works."""
    client = FakeClient(reply(text("done")))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--transcript", name], client)
    assert (code, client.requests) == (2, []), err
    assert (
        err.count("\n") == 1
        and "rewritten after every turn" in err
        and "--transcript -" in err
        and "--no-keep" in err
    ), err
