"""Watching a run while it happens and after it: the event stream, the published schemas, the
transcript's added fields, and the trials summary that keeps infrastructure failures apart."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

import agent
from conftest import schema_errors
from fakes import Chunked, FakeAPIError, FakeClient, reply, text, tool_use
from test_agent import run
from test_sdk_http import agent_env, serve


def events_of(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def assert_well_formed(events):
    """What every stream promises: run.start first, run.stop last, seq 1..n, one run_id."""
    assert events[0]["type"] == "run.start" and events[-1]["type"] == "run.stop"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert len({e["run_id"] for e in events}) == 1
    assert [e["type"] for e in events].count("run.stop") == 1
    for e in events:
        assert not schema_errors(e, "events"), schema_errors(e, "events")


def test_a_run_tells_its_story_in_events(capsys, workdir, tmp_path):
    events_path, transcript = tmp_path / "run.events.jsonl", tmp_path / "run.json"
    long_answer = ("The average is 85. " * 40 + "\n") * 3
    client = FakeClient(
        reply(text("Let me look."), tool_use("read_file", {"path": "scores.csv"}),
              tool_use("run_python", {"code": "print(85)"})),
        FakeAPIError(529, "overloaded_error", "Overloaded", {"retry-after": "0"}),
        Chunked(reply(text(long_answer)), size=7))
    code, out, _ = run(capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox",
                                "--events", str(events_path), "--transcript", str(transcript)],
                       client)
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


def test_the_transcript_has_every_field_its_schema_names(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(FakeAPIError(529, "overloaded_error", "Overloaded", {"retry-after": "0"}),
                        reply(tool_use("run_python", {"code": "raise SystemExit(3)"})),
                        reply(text("done")))
    run(capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox", "--transcript",
                 str(path)], client)
    saved = json.loads(path.read_text())
    schema = agent.TRANSCRIPT_SCHEMA
    assert set(schema["properties"]) - {"trial", "cleared"} <= set(saved)  # those when used
    turn = schema["properties"]["turns"]["items"]
    assert set(turn["properties"]) - {"context_edits", "cleared"} <= set(saved["turns"][0])
    call = saved["turns"][0]["tool_calls"][0]
    assert set(turn["properties"]["tool_calls"]["items"]["properties"]) <= set(call)
    assert (call["exit_code"], call["declined"], call["is_error"]) == (3, False, True)
    assert saved["turns"][0]["retries"][0]["status"] == 529
    assert saved["stop"]["exit_code"] == 0 and saved["ended_at"] >= saved["started_at"]
    assert not schema_errors(saved, "transcript")


def test_a_declined_call_is_marked_so(capsys, workdir, tmp_path):
    path = tmp_path / "run.json"
    client = FakeClient(reply(tool_use("run_python", {"code": "1"})), reply(text("ok")))
    run(capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], client, stdin="n\n")
    call = json.loads(path.read_text())["turns"][0]["tool_calls"][0]
    assert call["declined"] is True and call["exit_code"] is None


@pytest.mark.parametrize("ending, label, code", [
    (FakeAPIError(400, "invalid_request_error", "messages: bad"), "api_error", 1),
    (KeyboardInterrupt(), "interrupted", 130)])
def test_run_stop_is_last_however_the_run_ends(capsys, workdir, tmp_path, ending, label, code):
    path = tmp_path / "e.jsonl"

    def fail(request):
        raise ending

    client = FakeClient(reply(tool_use("read_file", {"path": "notes.md"})), fail)
    got, _, _ = run(capsys, ["q", "--workdir", str(workdir), "--events", str(path)], client)
    events = events_of(path)
    assert_well_formed(events)
    assert got == code and (events[-1]["stop"], events[-1]["exit_code"]) == (label, code)


def test_run_stop_is_last_after_an_internal_error(capsys, workdir, tmp_path, monkeypatch):
    path = tmp_path / "e.jsonl"
    monkeypatch.setattr(agent, "drive", lambda *a: 1 / 0)
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--events", str(path)],
                       FakeClient())
    events = events_of(path)
    assert_well_formed(events)
    assert code == 1 and events[-1]["stop"] == "error" and "ZeroDivisionError" in err


def test_events_on_stdout_are_all_stdout_carries(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "notes.md"})), reply(text("42")))
    code, out, err = run(capsys, ["q", "--workdir", str(workdir), "--events", "-"], client)
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and "42" in err
    assert_well_formed(events)
    assert events[-1]["answer"] == "42"


def test_events_inside_the_workdir_or_sharing_stdout_are_refused(capsys, workdir):
    client = FakeClient()
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--events",
                                str(workdir / "e.jsonl")], client)
    assert (code, client.requests) == (2, []) and "inside the workdir" in err
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--events", "-",
                                "--transcript", "-"], client)
    assert code == 2 and "share stdout" in err


def test_trials_events_carry_the_trial_and_end_with_the_summary(capsys, workdir, tmp_path):
    path, summary_path = tmp_path / "e.jsonl", tmp_path / "s.json"
    client = FakeClient(reply(text("42")), FakeAPIError(400, "invalid_request_error", "bad"),
                        reply(text("41")))
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--trials", "3", "--expect",
                                "42", "--events", str(path), "--transcript", str(summary_path)],
                       client)
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


def test_the_summary_keeps_infrastructure_failures_apart(capsys, workdir, tmp_path):
    path = tmp_path / "s.json"
    client = FakeClient(reply(text("42")), FakeAPIError(400, "invalid_request_error", "bad"),
                        reply(text("41")), reply(text("42")))
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--trials", "4", "--expect",
                                r"\b42\b", "--transcript", str(path)], client)
    s = json.loads(path.read_text())
    assert code == 6 and (s["n"], s["scored"], s["passes"], s["failed"], s["errored"]) == \
        (4, 3, 2, 1, 1)
    assert s["pass@1"] == pytest.approx(2 / 3) and s["pass_at_k"]["3"] == 1.0
    assert "4" not in s["pass_at_k"]  # over the 3 scored trials only
    low, high = s["pass@1_wilson95"]
    assert low == pytest.approx(0.2077, abs=1e-3) and high == pytest.approx(0.9385, abs=1e-3)
    assert s["stops"] == {"api_error": 1, "end_turn": 3}
    assert (s["question"], s["model"], s["expect"]) == (
        "q", "claude-haiku-5-5", {"regex": r"\b42\b", "tool": None, "stop": None})
    assert s["decline_message"] == agent.DECLINE_MESSAGE
    assert s["per_trial"]["turns"] == {"mean": 0.75, "median": 1.0}
    assert "1 errored" in err and "Wilson" in err and "median" in err


def test_wilson_interval_by_hand():
    # 8 of 10: centre (0.8 + 1.92/10) / 1.38416 = 0.7167; half 1.96*sqrt(.016+.000960)/1.38416
    assert agent.wilson(8, 10) == pytest.approx([0.4902, 0.9433], abs=1e-4)
    assert agent.wilson(0, 0) is None and agent.wilson(0, 5)[0] == 0.0


@pytest.mark.parametrize("name", sorted(agent.SCHEMAS))
def test_schema_prints_a_valid_json_schema(capsys, name):
    assert agent.main(["--schema", name]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_strict_check_catches_an_undocumented_field():
    event = {"type": "turn.start", "seq": 1, "at": agent.now(), "run_id": "r", "turn": 1}
    assert not schema_errors(event, "events")
    assert schema_errors(dict(event, surprise=1), "events")
    assert schema_errors(dict(event, turn="one"), "events")


def test_sigterm_still_ends_the_stream_with_run_stop(request, workdir, tmp_path):
    api = serve(request, reply(tool_use("run_python", {"code": "import time; time.sleep(60)"})))
    copy = tmp_path / "bin" / "agent.py"
    copy.parent.mkdir()
    copy.write_bytes(Path(agent.__file__).read_bytes())
    path = tmp_path / "e.jsonl"
    proc = subprocess.Popen([sys.executable, str(copy), "q", "--workdir", str(workdir), "--yes",
                             "--no-sandbox", "--events", str(path)], env=agent_env(api),
                            cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and '"tool.start"' not in (
            path.read_text() if path.exists() else ""):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=15)
    events = events_of(path)
    assert_well_formed(events)
    assert proc.returncode == 130 and events[-1]["stop"] == "interrupted"
    assert "SIGTERM" in events[-1]["detail"]  # not only "Ctrl-C": it was a SIGTERM
