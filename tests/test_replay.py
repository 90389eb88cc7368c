"""--replay: a recorded run's model turns, run again against the real tools and sandbox, with no
key and no connection; the differences per call; the recorded stop; the shipped example."""

import json
import os
import socket
import subprocess
from pathlib import Path

import make_example
import pytest
from fakes import FakeAPIError, FakeClient, reply, text, tool_use
from helpers import (
    AGENT,
    agent_env,
    as_documented,
    assert_well_formed,
    documented,
    events_of,
    measured,
    run_agent_py,
    run_cli,
    schema_errors,
)

import agent

ROOT = AGENT.parent
SUM = "import csv; print(sum(int(r['score']) for r in csv.DictReader(open('scores.csv'))))"


def three_turns():
    """A scripted model: two reads at once, a script in the sandbox, an answer."""
    return [
        reply(
            text("Reading."),
            tool_use("read_file", {"path": "scores.csv"}, id="toolu_A"),
            tool_use("read_file", {"path": "notes.md"}, id="toolu_B"),
            input_tokens=700,
        ),
        reply(tool_use("run_python", {"code": SUM}, id="toolu_C"), input_tokens=800),
        reply(text("The scores add up to 255."), input_tokens=900),
    ]


def record(capsys, workdir, tmp_path, *replies, flags=()):
    """Run `replies` through the CLI on `workdir`; return the transcript's path and content."""
    path = tmp_path / "recorded.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--yes", "--transcript", str(path), *flags],
        FakeClient(*(replies or three_turns())),
    )
    return path, json.loads(path.read_text())


def replay(capsys, path, workdir, tmp_path, *flags, stdin=""):
    """Replay `path` on `workdir` (with a client that must not be asked); return the exit code,
    stdout, stderr and the new transcript."""
    new, client = tmp_path / "replayed.json", FakeClient()
    code, out, err = run_cli(
        capsys,
        [
            "--replay",
            str(path),
            "--workdir",
            str(workdir),
            "--transcript",
            str(new),
            *map(str, flags),
        ],
        client,
        stdin=stdin,
    )
    assert client.requests == []
    return code, out, err, json.loads(new.read_text()) if new.exists() else None


# --- the same run again ---


def test_a_quiet_replay_prints_the_answer_only(capsys, workdir, tmp_path):
    """-q is "no progress on stderr": the `replaying ...` header was printed anyway."""
    path, _ = record(capsys, workdir, tmp_path)
    code, out, err, _ = replay(capsys, path, workdir, tmp_path, "--yes", "-q")
    assert (code, out) == (0, "The scores add up to 255.\n")
    assert err == "", err


def test_the_replay_header_names_the_server_a_run_was_recorded_against(
    capsys, workdir, tmp_path, monkeypatch
):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:8765")  # a FakeClient answers
    path, recorded = record(capsys, workdir, tmp_path)
    assert recorded["base_url"] == "http://127.0.0.1:8765"
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    _, _, err, _ = replay(capsys, path, workdir, tmp_path, "--yes")
    assert (
        f"replaying {path}: 3 turns recorded from the model claude-haiku-5-5 at "
        "http://127.0.0.1:8765; workdir" in err
    ), err


def test_a_replay_gives_the_recorded_answer_stop_and_history(capsys, workdir, tmp_path):
    path, recorded = record(capsys, workdir, tmp_path)
    assert recorded["stop"]["reason"] == "end_turn"
    events = tmp_path / "events.jsonl"
    code, out, err, new = replay(capsys, path, workdir, tmp_path, "--yes", "--events", events)
    assert (code, out) == (0, "The scores add up to 255.\n")
    assert f"replaying {path}: 3 turns recorded from the model claude-haiku-5-5" in err
    assert "replay: 3 tool results, each as recorded" in err and "differs" not in err
    assert new["stop"] == recorded["stop"] and new["answer"] == recorded["answer"]
    assert new["messages"] == recorded["messages"] and new["usage"] == recorded["usage"]
    assert [t["message_id"] for t in new["turns"]] == [t["message_id"] for t in recorded["turns"]]
    assert new["replay"] == {"source": str(path), "differences": []}
    assert new["run_id"] != recorded["run_id"] and "produced_by" not in new
    stream = events_of(events)
    assert_well_formed(stream)
    assert stream[0]["replayed_from"] == str(path) and stream[0]["question"] == "q"
    assert [e["name"] for e in stream if e["type"] == "tool.end"] == [
        "read_file",
        "read_file",
        "run_python",
    ]


def test_the_question_model_system_prompt_and_thinking_are_the_recordings(
    capsys, workdir, tmp_path
):
    thinking = {"type": "thinking", "thinking": "The scores first.", "signature": "sig"}
    path, recorded = record(
        capsys,
        workdir,
        tmp_path,
        reply(thinking, tool_use("read_file", {"path": "scores.csv"})),
        reply(text("done")),
        flags=["--model", "claude-sonnet-5-5"],
    )
    recorded["system"] = "A prompt of an older agent.py."
    path.write_text(json.dumps(recorded))
    code, _, err, new = replay(capsys, path, workdir, tmp_path)
    assert code == 0 and "[thinking] The scores first." in err
    assert (new["question"], new["model"], new["system"]) == (
        "q",
        "claude-sonnet-5-5",
        "A prompt of an older agent.py.",
    )
    assert new["messages"] == recorded["messages"]


def test_a_changed_file_is_reported_per_call_and_kept_in_the_transcript(capsys, workdir, tmp_path):
    path, _ = record(capsys, workdir, tmp_path)
    (workdir / "scores.csv").write_text("name,score\nAlice,88\nBob,70\nChen,95\n")
    code, out, err, new = replay(capsys, path, workdir, tmp_path, "--yes")
    assert (code, out) == (0, "The scores add up to 255.\n")  # the recorded replies, as they were
    lines = err.splitlines()
    said = lines.index("  replay: turn 1, read_file toolu_A: the result differs from the recording")
    assert lines[said + 1 : said + 3] == ["    -Bob,72", "    +Bob,70"]
    assert "(the recorded replies that follow answered the recorded result" in err
    assert "replay: turn 2, run_python toolu_C: the result differs" in err
    assert "    -255" in err and "    +253" in err
    assert "read_file toolu_B" not in err  # notes.md did not change
    assert "replay: 2 of 3 tool results differ from " + str(path) in err
    assert new["replay"]["differences"] == [
        {"turn": 1, "id": "toolu_A", "name": "read_file", "diff": ["-Bob,72", "+Bob,70"]},
        {"turn": 2, "id": "toolu_C", "name": "run_python", "diff": ["-255", "+253"]},
    ]


def test_a_difference_is_bounded_and_made_visible(capsys, workdir, tmp_path):
    path, _ = record(capsys, workdir, tmp_path)
    (workdir / "notes.md").write_text("".join(f"\x1b[2Jline {i} {'x' * 300}\n" for i in range(40)))
    code, _, err, new = replay(capsys, path, workdir, tmp_path, "--yes")
    (diff,) = [d["diff"] for d in new["replay"]["differences"] if d["id"] == "toolu_B"]
    assert len(diff) == agent.DIFF_LINES and diff[-1] == "… and 31 more changed lines"
    assert all(len(line) <= agent.DIFF_WIDTH for line in diff)
    assert code == 0 and "\x1b" not in err and "\\x1b[2Jline 0" in err


def test_an_error_that_is_no_longer_one_is_a_difference(capsys, workdir, tmp_path):
    path, recorded = record(capsys, workdir, tmp_path)
    recorded["messages"][2]["content"][1]["is_error"] = True  # notes.md's read, same text
    path.write_text(json.dumps(recorded))
    code, _, err, new = replay(capsys, path, workdir, tmp_path, "--yes")
    assert [d["diff"] for d in new["replay"]["differences"]] == [
        ["-is_error: true", "+is_error: false"]
    ]


def test_a_declined_call_differs_from_the_recorded_run(capsys, workdir, tmp_path):
    path, _ = record(capsys, workdir, tmp_path)
    code, _, err, new = replay(capsys, path, workdir, tmp_path, stdin="n\n")  # --yes is absent
    assert code == 0 and "run it? [y/N]" in err
    assert [d["id"] for d in new["replay"]["differences"]] == ["toolu_C"]
    assert "+The user declined to run this code." in err


# --- how a replay ends: as the recording did ---


@pytest.mark.parametrize(
    "flags, replies, label",
    [
        (
            ["--max-turns", "2"],
            [
                reply(tool_use("read_file", {"path": "scores.csv"})),
                reply(text("So far: 88, 72, 95.")),
            ],
            "max_turns",
        ),
        (
            ["--token-budget", "1500"],
            [
                reply(tool_use("read_file", {"path": "scores.csv"})),
                reply(tool_use("read_file", {"path": "notes.md"}), input_tokens=1500),
            ],
            "token_budget",
        ),
        (
            ["--budget-usd", "0.0001"],
            [
                reply(tool_use("read_file", {"path": "scores.csv"}), input_tokens=600),
                reply(tool_use("read_file", {"path": "notes.md"}), input_tokens=600),
            ],
            "cost_budget",
        ),
        (
            [],
            [
                reply(tool_use("read_file", {"path": "scores.csv"})),
                reply(text("cut"), stop_reason="max_tokens"),
            ],
            "max_tokens",
        ),
        ([], [reply(tool_use("read_file", {"path": "scores.csv"})), reply(text(" "))], "end_turn"),
    ],
)
def test_a_limit_stops_the_replay_where_it_stopped_the_recording(
    capsys, workdir, tmp_path, flags, replies, label
):
    """The recording's limits are not in it: replay_limits sets them so that the same turn
    stops the same way, within the limits this command line sets (the defaults here)."""
    path, recorded = record(capsys, workdir, tmp_path, *replies, flags=flags)
    assert recorded["stop"]["reason"] == label and len(recorded["turns"]) == 2
    code, out, err, new = replay(capsys, path, workdir, tmp_path)
    assert code == agent.EXIT_CODES[label] and new["stop"]["reason"] == label
    if label in ("max_turns", "max_tokens"):  # a budget's detail names the replay's budget
        assert new["stop"] == recorded["stop"]
    assert new["messages"] == recorded["messages"]  # the final turn's note too, for max_turns
    assert [t.get("in_history") for t in new["turns"]] == [
        t.get("in_history") for t in recorded["turns"]
    ]  # a blank reply is kept out of both
    assert "replay: 1 tool result, each as recorded" in err and "not replayed" not in err


@pytest.mark.parametrize(
    "ending, label",
    [
        (KeyboardInterrupt(), "interrupted"),
        (
            FakeAPIError(529, "overloaded_error", "Overloaded", {"x-should-retry": "false"}),
            "api_error",
        ),
    ],
)
def test_a_recording_that_ended_without_a_reply_ends_with_its_recorded_stop(
    capsys, workdir, tmp_path, ending, label
):
    def end(request):
        raise ending

    path, recorded = record(
        capsys, workdir, tmp_path, reply(tool_use("read_file", {"path": "scores.csv"})), end
    )
    assert recorded["stop"]["reason"] == label and len(recorded["turns"]) == 1
    code, out, err, new = replay(capsys, path, workdir, tmp_path)
    assert code == agent.EXIT_CODES[label]
    assert new["stop"]["reason"] == label and new["stop"]["detail"] == (
        f"{recorded['stop']['detail']} (the recorded stop: {path} has no reply after turn 1)"
    )
    assert f"stop: {label} ({recorded['stop']['detail']} (the recorded stop" in err
    assert new["messages"] == recorded["messages"]


def test_a_recording_cut_off_before_its_stop_ends_the_replay_with_an_error(
    capsys, workdir, tmp_path
):
    path, recorded = record(capsys, workdir, tmp_path)
    del recorded["messages"][-1], recorded["turns"][-1]  # as a kill -9 leaves it: no stop
    recorded["stop"] = None
    path.write_text(json.dumps(recorded))
    code, out, err, new = replay(capsys, path, workdir, tmp_path, "--yes")
    assert (code, out) == (1, "") and new["stop"]["reason"] == "error"
    assert new["stop"]["detail"] == (
        f"the replay asks for more replies than were recorded: "
        f"{path} has no reply after turn 2 (it has no stop: the "
        "run that made it was cut off)"
    )
    assert "replay: 3 tool results, each as recorded" in err


def test_a_replay_that_wants_more_than_was_recorded_says_so(capsys, workdir, tmp_path):
    path, recorded = record(capsys, workdir, tmp_path)
    del recorded["messages"][-1], recorded["turns"][-1]  # it says end_turn, yet calls a tool
    path.write_text(json.dumps(recorded))
    code, _, _, new = replay(capsys, path, workdir, tmp_path, "--yes")
    assert code == 1 and new["stop"]["detail"].endswith("(it stopped with end_turn)")


def test_a_replay_that_stops_before_the_recording_did_says_so(capsys, workdir, tmp_path):
    path, recorded = record(capsys, workdir, tmp_path)
    recorded["turns"][0]["stop_reason"] = "end_turn"  # edited: the first reply now ends the run
    path.write_text(json.dumps(recorded))
    code, _, err, new = replay(capsys, path, workdir, tmp_path, "--yes")
    assert code == 0 and new["stop"]["reason"] == "end_turn" and len(new["turns"]) == 1
    assert "replay: the run stopped with 2 recorded replies not replayed" in err
    said = next(line for line in err.splitlines() if line.startswith("replay: the run stopped"))
    assert all(
        as_documented(said, line)  # docs/replay.md quotes it as it is
        for line in documented("docs/replay.md", "replay: the run stopped")
    ), said


# --- what it is given ---

RESUMED = "resumed"


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "--replay {path} does not exist"),
        ("{}", "cannot replay: {path} is an empty JSON object, not a transcript"),
        ('{"version": 2, "kind": "trials", "trials": []}', "is a trials summary, not a transcript"),
        (
            '{"type": "run.start", "seq": 1}\n{"type": "run.stop", "seq": 2}\n',
            "--replay {path} is an event stream (--events, JSON Lines)",
        ),
        ("<!doctype html><title>report</title>", "--replay {path} is not a JSON document"),
        ("directory", "--replay {path} is a directory, not a regular file"),
        (
            RESUMED,
            "cannot replay: {path} was continued with --resume and a follow-up question; only "
            "a run from its first question can be replayed (--resume with --transcript NEW.json "
            "goes on in a new file, and leaves the one it continues as it was)",
        ),
    ],
)
def test_a_wrong_file_is_a_usage_error_saying_what_it_was_given(
    capsys, workdir, tmp_path, content, fragment
):
    path = tmp_path / "given.json"
    if content == "directory":
        path.mkdir()
    elif content == RESUMED:
        path, _ = record(capsys, workdir, tmp_path, reply(text("done")))
        run_cli(
            capsys,
            ["--resume", str(path), "and more?", "--workdir", str(workdir)],
            FakeClient(reply(text("more"))),
        )
    elif content is not None:
        path.write_text(content)
    code, out, err, new = replay(capsys, path, workdir, tmp_path)
    assert (code, out, new) == (2, "", None)
    assert fragment.format(path=path) in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "flags", [["q"], ["--model", "claude-opus-5-5"], ["--trials", "2"], ["--resume", "other.json"]]
)
def test_replay_takes_no_question_model_resume_or_trials(capsys, flags):
    code, _, err = run_cli(capsys, ["--replay", "run.json", *flags], FakeClient())
    assert code == 2 and "--replay runs the recorded question and turns again" in err


def test_the_recorded_workdir_is_used_only_once_the_user_agrees(capsys, workdir, tmp_path):
    path, _ = record(capsys, workdir, tmp_path)
    for answer in ("", "n\n"):  # --yes is no consent to it
        code, _, err = run_cli(capsys, ["--replay", str(path), "--yes"], FakeClient(), stdin=answer)
        assert code == 2 and f'asks to go on with its own:\n  workdir "{workdir}"\n' in err
        assert "\nGo on with it? [y/N] " in err  # one thing: it, not them
        assert "not replayed: give --workdir DIR" in err and "turn 1" not in err
    code, out, err = run_cli(capsys, ["--replay", str(path), "--yes"], FakeClient(), stdin="y\n")
    assert (code, out) == (0, "The scores add up to 255.\n") and "each as recorded" in err


def test_the_new_transcript_may_not_overwrite_the_recording(capsys, workdir, tmp_path):
    path, _ = record(capsys, workdir, tmp_path)
    code, _, err = run_cli(
        capsys,
        ["--replay", str(path), "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(),
    )
    assert code == 2 and "would overwrite --replay" in err


def test_a_replay_needs_no_key_and_connects_nowhere(capsys, workdir, tmp_path):
    """As a user runs it: no ANTHROPIC_API_KEY, and a base URL and proxies that lead to a
    socket that listens and counts: nothing reaches it, and the SDK is never imported."""
    path, _ = record(capsys, workdir, tmp_path)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    there = f"http://127.0.0.1:{listener.getsockname()[1]}"
    env = dict(
        agent_env(ANTHROPIC_BASE_URL=there),
        HTTPS_PROXY=there,
        HTTP_PROXY=there,
        ALL_PROXY=there,
        NO_PROXY="",
    )
    done = run_agent_py(
        AGENT,
        "--replay",
        path,
        "--workdir",
        workdir,
        "--yes",
        flags=["-X", "importtime"],
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0 and "each as recorded" in done.stderr, done.stderr
    imported = [
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    ]
    assert "json" in imported and not [m for m in imported if m.startswith("anthropic")]
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


KEY = "sk-ant-api03-REPLAY-TEST-KEY-0123456789abcdef"


def kept_files():
    return [p for p in (Path(os.environ["XDG_STATE_HOME"]) / "agent.py").rglob("*") if p.is_file()]


LEAK = "print(open('leak.txt').read())"


@pytest.mark.parametrize("where", ["environment", ".env"])
def test_a_replay_writes_the_key_nowhere(capsys, workdir, tmp_path, monkeypatch, where):
    """A recording made where the key was unknown holds it (a file the model read, a script
    that printed it, the model saying it); it is replayed with the key in the environment or
    the .env, on a workdir where the file changed (so stderr shows the difference): no byte
    of the transcript, events, stdout, stderr, or the report and export of the new
    transcript, holds the key."""
    (workdir / "leak.txt").write_text(f"key={KEY}\n")
    path, recorded = record(
        capsys,
        workdir,
        tmp_path,
        reply(
            text(f"I found {KEY}."),
            tool_use("read_file", {"path": "leak.txt"}),
            tool_use("run_python", {"code": LEAK + f"  # {KEY}"}),
        ),
        reply(text(f"The key is {KEY}, as read.")),
    )
    assert KEY in path.read_text()  # the attack: the recording holds it
    recorded_kept = set(kept_files())
    (workdir / "leak.txt").write_text(f"the new key={KEY}\n")
    if where == "environment":
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    else:
        dotenv = tmp_path / "beside" / ".env"
        dotenv.parent.mkdir()
        dotenv.write_text(f"ANTHROPIC_API_KEY={KEY}\n")
        dotenv.chmod(0o600)
        monkeypatch.setattr(agent, "dotenv_path", lambda: dotenv)
    events = tmp_path / "events.jsonl"
    code, out, err, new = replay(capsys, path, workdir, tmp_path, "--yes", "--events", events)
    assert code == 0 and "differs from the recording" in err, err
    written = {
        "stdout": out,
        "stderr": err,
        "transcript": (tmp_path / "replayed.json").read_text(),
        "events": events.read_text(),
    }
    for flags, name in (
        (["--report", tmp_path / "replayed.json"], "replayed.html"),
        (["--export", "atif", tmp_path / "replayed.json"], "replayed.atif.json"),
    ):
        done, out, err = run_cli(capsys, [str(f) for f in flags] + ["-o", str(tmp_path / name)])
        assert done == 0, err
        written[name] = (tmp_path / name).read_text() + out + err
    kept = set(kept_files()) - recorded_kept  # a replay is not kept; if it were, it counts
    written.update({f"kept {p.name}": p.read_text() for p in kept})
    assert {k: KEY in v for k, v in written.items()} == dict.fromkeys(written, False)
    assert "[redacted secret]" in written["transcript"] and "[redacted secret]" in written["stderr"]
    assert new["answer"] == "The key is [redacted secret], as read."


# --- a regression check for CI: --strict ---


def test_strict_ends_a_replay_at_the_first_difference_with_replay_differs(
    capsys, workdir, tmp_path
):
    path, recorded = record(capsys, workdir, tmp_path)
    code, out, _, new = replay(capsys, path, workdir, tmp_path, "--yes", "--strict")
    assert (code, new["stop"]) == (0, recorded["stop"])  # nothing differs: as without --strict
    (workdir / "scores.csv").write_text("name,score\nAlice,88\nBob,70\nChen,95\n")
    events = tmp_path / "events.jsonl"
    code, out, err, new = replay(
        capsys, path, workdir, tmp_path, "--yes", "--strict", "--events", events
    )
    assert (code, out) == (7, "") and agent.EXIT_CODES["replay_differs"] == 7
    assert new["stop"]["reason"] == "replay_differs" and new["stop"]["exit_code"] == 7
    assert len(new["turns"]) == 1  # the later replies answered the recorded result: not sent
    assert f"stop: replay_differs (turn 1: 1 of 2 tool results differs from {path}" in err
    assert new["replay"]["differences"] == [
        {"turn": 1, "id": "toolu_A", "name": "read_file", "diff": ["-Bob,72", "+Bob,70"]}
    ]
    stop = events_of(events)[-1]
    assert (stop["type"], stop["stop"], stop["exit_code"]) == ("run.stop", "replay_differs", 7)
    assert "| `replay_differs` |" in (ROOT / "README.md").read_text()
    assert "replay_differs" in agent.EPILOG


def test_strict_goes_with_replay(capsys, workdir):
    client = FakeClient()
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--strict"], client)
    assert (code, client.requests) == (2, []) and "--strict goes with --replay" in err


# --- the example the README runs ---


def test_the_readme_command_replays_the_shipped_example(tmp_path):
    """python agent.py --replay workspace/example-run.json --workdir workspace, from the root
    of the repository, as a newcomer types it (and answers y to run the script)."""
    example = json.loads((ROOT / "workspace" / "example-run.json").read_text())
    done = run_agent_py(
        "agent.py",
        "--replay",
        "workspace/example-run.json",
        "--workdir",
        "workspace",
        cwd=ROOT,
        env=agent_env(),
        input="y\n",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == example["answer"] + "\n"
    assert "a scripted model (tests/make_example.py)" in done.stderr
    assert "--- run it? [y/N]" in done.stderr
    assert "replay: 3 tool results, each as recorded" in done.stderr


def test_the_readme_check_needs_no_packages_and_passes_on_the_shipped_example(tmp_path):
    """README: the replay needs no packages, any Python 3.11+: run here with -S (no
    site-packages, so neither anthropic nor python-dotenv can be imported), and --strict."""
    done = run_agent_py(
        "agent.py",
        "--replay",
        "workspace/example-run.json",
        "--workdir",
        "workspace",
        "--strict",
        flags=["-S"],
        cwd=ROOT,
        env=agent_env(),
        input="y\n",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "replay: 3 tool results, each as recorded" in done.stderr


def test_the_shipped_example_is_what_its_script_makes_now(tmp_path):
    """So it cannot rot: a change to agent.py that changes the example's run shows here, and
    python tests/make_example.py brings it up to date."""
    shipped = json.loads((ROOT / "workspace" / "example-run.json").read_text())
    made = make_example.make(tmp_path / "example.json")
    assert make_example.stable(made) == make_example.stable(shipped)
    assert shipped["produced_by"] == {
        "kind": "scripted",
        "script": "tests/make_example.py",
        "note": make_example.PRODUCED_BY["note"],
    }
    assert shipped["workdir"] == "workspace" and str(ROOT) not in json.dumps(shipped)
    assert os.path.getsize(tmp_path / "example.json") > 0


def test_the_example_script_keeps_no_run_in_the_users_history(tmp_path):
    """A scripted run kept among the user's would be the next `--resume last`, and its history
    would go to the real API."""
    make_example.make(tmp_path / "example.json")
    state = Path(os.environ["XDG_STATE_HOME"])
    assert not list(state.rglob("*.json"))


@pytest.mark.parametrize(
    "script", ["tests/bench_context.py", "tests/bench_loop.py", "evals/harbor_agent.py"]
)
def test_every_script_that_runs_agent_py_keeps_no_run(script):
    source = (ROOT / script).read_text()
    assert "--no-keep" in source or 'os.environ["XDG_STATE_HOME"]' in source


# --- where a run came from travels with it ---


def test_provenance_survives_resume_report_and_export(capsys, workdir, tmp_path):
    """The shipped example's replay, then resumed with a real (here: fake) model: the file
    says which turns were scripted, keeps no stale replay record, and the report and the
    ATIF export both say where the run came from."""
    example = json.loads((ROOT / "workspace" / "example-run.json").read_text())
    recorded = tmp_path / "example.json"
    recorded.write_text(json.dumps(dict(example, workdir=str(workdir))))
    for name in ("scores.csv", "spring.md"):
        (workdir / name).write_text((ROOT / "workspace" / name).read_text())
    code, _, _, replayed = replay(capsys, recorded, workdir, tmp_path, "--yes")
    assert code == 0 and replayed["produced_by"]["kind"] == "scripted" and "replay" in replayed
    page = tmp_path / "replayed.html"
    run_cli(capsys, ["--report", str(tmp_path / "replayed.json"), "-o", str(page)])
    assert "scripted" in page.read_text() and "make_example.py" in page.read_text()
    code, out, _ = run_cli(capsys, ["--export", "atif", str(tmp_path / "replayed.json"), "-o", "-"])
    extra = json.loads(out)["extra"]
    assert extra["produced_by"]["kind"] == "scripted" and "replay" in extra
    turns = len(replayed["turns"])
    code, _, _ = run_cli(
        capsys,
        ["--resume", str(tmp_path / "replayed.json"), "And the median?", "--workdir", str(workdir)],
        FakeClient(reply(text("79.5"))),
    )
    resumed = json.loads((tmp_path / "replayed.json").read_text())
    assert code == 0 and len(resumed["turns"]) == turns + 1
    assert resumed["produced_by"]["turns"] == turns  # the scripted ones; the rest, the model's
    assert "replay" not in resumed  # it described the replay, not this run
    assert schema_errors(resumed, "transcript") == []


# --- the user's limits bound a replay, as they bound a live run ---


def test_a_replay_honours_the_users_max_turns_and_token_budget(capsys, workdir, tmp_path):
    """A 30-turn recording: before, --max-turns 5 and --token-budget 2500 were replaced by the
    recording's own counts (30 turns and its 30,000 tokens plus one), and it played all 30."""
    path, recorded = record(
        capsys,
        workdir,
        tmp_path,
        *[
            reply(tool_use("read_file", {"path": "scores.csv"}), input_tokens=1000, output_tokens=0)
            for _ in range(29)
        ],
        reply(text("done"), input_tokens=1000, output_tokens=0),
        flags=["--max-turns", "40", "--token-budget", "100000"],
    )
    assert len(recorded["turns"]) == 30 and recorded["stop"]["reason"] == "end_turn"
    code, _, err, new = replay(capsys, path, workdir, tmp_path, "--max-turns", "5")
    assert (code, new["stop"]["reason"], len(new["turns"])) == (3, "max_turns", 5), err
    code, _, err, new = replay(capsys, path, workdir, tmp_path, "--token-budget", "2500")
    assert (code, new["stop"]["reason"], len(new["turns"])) == (4, "token_budget", 3), err
    code, _, err, new = replay(capsys, path, workdir, tmp_path)  # the default: 20 turns
    assert (code, new["stop"]["reason"], len(new["turns"])) == (3, "max_turns", 20), err
    code, _, err, new = replay(capsys, path, workdir, tmp_path, "--max-turns", "40")
    assert (code, new["stop"]["reason"], len(new["turns"])) == (0, "end_turn", 30), err


def test_a_recorded_reply_longer_than_max_tokens_allows_is_cut_as_a_live_one(
    capsys, workdir, tmp_path
):
    """A forged reply of 2 MB of text (or of tool input): a live run cuts a reply at
    --max-tokens x 64 characters; before, a replay took it whole, whatever its size."""
    path, recorded = record(capsys, workdir, tmp_path, reply(text("short")))
    for block in (
        {"type": "text", "text": "x" * 2_000_000},
        {
            "type": "tool_use",
            "id": "toolu_big",
            "name": "read_file",
            "input": {"path": "scores.csv", "pad": "x" * 2_000_000},
        },
    ):
        recorded["messages"][1]["content"] = [block]
        recorded["turns"][0]["stop_reason"] = "end_turn" if block["type"] == "text" else "tool_use"
        path.write_text(json.dumps(recorded))
        code, out, err, new = replay(capsys, path, workdir, tmp_path, "--max-tokens", "1000")
        assert (code, new["stop"]["reason"], new["turns"]) == (5, "max_tokens", []), err
        assert "more than max_tokens 1000 lets a reply stream (64,000)" in new["stop"]["detail"]


def test_a_long_recording_replays_in_the_memory_of_a_live_run(
    capsys, workdir, tmp_path, agent_copy
):
    """A forged recording of 1,000 turns, each reading a 100 KB file (its recorded results one
    character): the replay's history grows by what the tools return now. Before, all 1,000
    turns ran (about 100 MB of history); now the default --max-turns (20) bounds it, as it
    bounds a live run."""
    (workdir / "big.txt").write_text(("y" * 99 + "\n") * 1000)
    path, recorded = record(
        capsys,
        workdir,
        tmp_path,
        reply(tool_use("read_file", {"path": "big.txt"}, id="toolu_0")),
        reply(text("done")),
    )
    call, result = recorded["messages"][1], recorded["messages"][2]
    turn, last = recorded["turns"][0], recorded["turns"][1]
    messages, turns = recorded["messages"][:1], []
    for i in range(1000):
        messages += [
            {**call, "content": [{**call["content"][0], "id": f"toolu_{i}"}]},
            {
                **result,
                "content": [{**result["content"][0], "tool_use_id": f"toolu_{i}", "content": "x"}],
            },
        ]
        turns.append(
            {**turn, "turn": i + 1, "tool_calls": [{**turn["tool_calls"][0], "id": f"toolu_{i}"}]}
        )
    recorded.update(
        messages=messages + recorded["messages"][3:], turns=turns + [{**last, "turn": 1001}]
    )
    path.write_text(json.dumps(recorded))
    code, err, rss, _ = measured(
        agent_copy, "--replay", path, "--workdir", workdir, "--quiet", cwd=tmp_path
    )
    assert code == 3 and "981 recorded replies not replayed" in err, err[-300:]
    assert rss < 150, rss  # MiB: a run of 20 turns, not of 1,000


def test_a_replay_whose_script_no_one_could_approve_says_so(capsys, workdir, tmp_path, monkeypatch):
    """--replay --strict --yes in CI on a machine without the sandbox: the script was declined
    (no one to approve it), and the replay said only `the result differs`, sending the reader
    hunting for a regression (newuser2 N35). The line and the stop say it was not run."""
    path, _ = record(capsys, workdir, tmp_path)
    monkeypatch.setattr(agent, "landlock_abi", lambda libc: (0, "the kernel has no Landlock"))
    code, out, err, new = replay(capsys, path, workdir, tmp_path, "--yes", "--strict")
    assert (code, out) == (7, ""), err
    assert (
        "  replay: turn 2, run_python toolu_C: not run (declined: without a working sandbox "
        "run_python asks even with --yes, and no one said y), so its result differs from the "
        "recording" in err.splitlines()
    ), err
    assert "stop: replay_differs (turn 2: 1 of 1 tool result differs from " in err
    assert "; 1 of them not run: declined" in new["stop"]["detail"]
