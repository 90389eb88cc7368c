"""Export: --export atif, a transcript (or each trial of a trials summary) as an ATIF v1.8
trajectory, checked by the atif package's models and by what they leave unchecked: every tool
call answered once, the metrics of each turn, the totals to the cent, the order of the steps."""

import json
import os
import shutil
from pathlib import Path

import atif
import pytest
from fakes import FakeAPIError, FakeClient, reply, text, tool_use
from helpers import (
    budget_stopped,
    lone_surrogates,
    measured,
    run_cli,
    surrogate_run,
    with_lone_surrogates,
)

import agent

THINKING = {
    "type": "thinking",
    "thinking": "Read both files, then compute.",
    "signature": "c2lnbmF0dXJl",
}


# --- what every trajectory must be ---


def export(capsys, source, *extra):
    """Run --export atif; return the paths it says it wrote."""
    code, _, err = run_cli(capsys, ["--export", "atif", str(source), *extra])
    assert code == 0, err
    return [line.split("atif: ", 1)[1] for line in err.splitlines() if line.startswith("atif: ")]


def trajectory_of(capsys, source, *extra):
    """The one trajectory --export atif writes for a transcript, checked."""
    [path] = export(capsys, source, *extra)
    return valid(json.loads(Path(path).read_text()))


def valid(document):
    """`document` if the atif package takes it and it holds what that package does not check:
    the version, every tool call answered by exactly one result (and no result without a
    call), call ids unique, and final_metrics the sum of the steps' metrics."""
    atif.Trajectory.model_validate(document)
    assert document["schema_version"] == "ATIF-v1.8"
    steps = document["steps"]
    ids = [c["tool_call_id"] for s in steps for c in s.get("tool_calls") or []]
    assert len(ids) == len(set(ids))
    for s in steps:
        calls = [c["tool_call_id"] for c in s.get("tool_calls") or []]
        answered = [r["source_call_id"] for r in (s.get("observation") or {}).get("results", [])]
        assert sorted(answered) == sorted(calls), (s["step_id"], calls, answered)
    totals, metrics = document["final_metrics"], [s["metrics"] for s in steps if "metrics" in s]
    for key in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        assert totals[f"total_{key}"] == sum(m[key] for m in metrics)
    assert totals["total_steps"] == len(steps)
    return document


def matches(document, transcript):
    """The trajectory says what the transcript says: an agent step per turn, in order, with the
    turn's usage as its metrics; the replies' tool calls and results, in order; the questions
    as user steps, in order; the totals equal to the transcript's, cost included."""
    steps = document["steps"]
    agents = [s for s in steps if s["source"] == "agent"]
    assert [s["extra"]["turn"] for s in agents] == [t["turn"] for t in transcript["turns"]]
    assert [s["step_id"] for s in steps] == list(range(1, len(steps) + 1))
    for step, turn in zip(agents, transcript["turns"]):
        u = turn["usage"]
        assert step["metrics"] == {
            "prompt_tokens": u["input_tokens"]
            + u["cache_read_input_tokens"]
            + u["cache_creation_input_tokens"],
            "completion_tokens": u["output_tokens"],
            "cached_tokens": u["cache_read_input_tokens"],
            "cost_usd": u["cost_usd"],
            "extra": {"cache_creation_input_tokens": u["cache_creation_input_tokens"]},
        }
    blocks = [b for m in transcript["messages"] for b in m["content"]]
    assert [c["tool_call_id"] for s in agents for c in s.get("tool_calls", [])] == [
        b["id"] for b in blocks if b["type"] == "tool_use"
    ]
    results = {
        r["source_call_id"]: r
        for s in agents
        for r in (s.get("observation") or {}).get("results", [])
    }
    for b in blocks:
        if b["type"] == "tool_result":
            assert results[b["tool_use_id"]]["content"] == b["content"]
            assert results[b["tool_use_id"]]["extra"]["is_error"] == bool(b.get("is_error"))
    questions = [
        b["text"]
        for m in transcript["messages"]
        if m["role"] == "user"
        for b in m["content"]
        if b["type"] == "text" and b["text"] != agent.FINAL_TURN_NOTE
    ]
    assert [s["message"] for s in steps if s["source"] == "user"] == questions
    assert steps[0]["source"] == "user"
    u, totals = transcript["usage"], document["final_metrics"]
    assert (
        totals["total_prompt_tokens"],
        totals["total_completion_tokens"],
        totals["total_cached_tokens"],
        totals["total_cost_usd"],
        totals["extra"]["cache_creation_input_tokens"],
    ) == (
        u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"],
        u["output_tokens"],
        u["cache_read_input_tokens"],
        u["cost_usd"],
        u["cache_creation_input_tokens"],
    )
    assert document["agent"]["model_name"] == transcript["model"]
    assert document["extra"]["stop"] == transcript["stop"]
    return document


def a_run(capsys, workdir, tmp_path, *flags, name="run.json"):
    """Four turns: thinking and two reads at once (one of a file that is not there), a script,
    then the answer; cache writes and reads along the way."""
    path = tmp_path / name
    client = FakeClient(
        reply(
            THINKING,
            text("Reading both."),
            tool_use("read_file", {"path": "scores.csv"}),
            tool_use("read_file", {"path": "nope.md"}),
            input_tokens=671,
            output_tokens=60,
        ),
        reply(
            tool_use("run_python", {"code": "print((88+72+95)/3)"}),
            input_tokens=20,
            output_tokens=70,
            write=751,
        ),
        reply(text("The average is 85."), input_tokens=12, output_tokens=40, read=751, write=80),
    )
    code, _, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--yes",
            "--no-sandbox",
            "--transcript",
            str(path),
            *flags,
        ],
        client,
    )
    assert code == 0, err
    return path


# --- the mapping ---


def test_a_run_with_parallel_calls_maps_turn_by_turn(capsys, workdir, tmp_path):
    source = a_run(capsys, workdir, tmp_path)
    transcript = json.loads(source.read_text())
    document = matches(trajectory_of(capsys, source), transcript)
    assert [s["source"] for s in document["steps"]] == ["user", "agent", "agent", "agent"]
    first = document["steps"][1]
    assert first["message"] == "Reading both."
    assert first["reasoning_content"] == THINKING["thinking"]
    assert [(c["function_name"], c["arguments"]) for c in first["tool_calls"]] == [
        ("read_file", {"path": "scores.csv"}),
        ("read_file", {"path": "nope.md"}),
    ]
    ok, missing = first["observation"]["results"]
    assert ok["content"].startswith("name,score") and ok["extra"]["is_error"] is False
    assert missing["extra"]["is_error"] is True and "does not exist" in missing["content"]
    script = document["steps"][2]["observation"]["results"][0]
    assert script["extra"]["exit_code"] == 0 and "85.0" in script["content"]
    assert document["steps"][3]["message"] == "The average is 85." == transcript["answer"]
    assert document["steps"][0]["timestamp"] == transcript["started_at"]
    assert document["steps"][1]["timestamp"] == transcript["turns"][0]["started_at"]
    assert document["session_id"] == transcript["run_id"]
    assert document["extra"]["workdir"] == transcript["workdir"]
    assert document["agent"]["name"] == "agent.py"
    assert document["agent"]["version"] == agent.AGENT_VERSION
    assert [t["name"] for t in document["agent"]["tool_definitions"]] == [
        t["name"] for t in agent.TOOLS
    ]
    assert document["agent"]["tool_definitions"][0]["parameters"] == agent.TOOLS[0]["input_schema"]
    assert document["final_metrics"]["total_cost_usd"] > 0 and "notes" not in document


def test_the_server_travels_in_the_trajectorys_extra(capsys, workdir, tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://key:pw@127.0.0.1:8080/?token=t0k")
    document = trajectory_of(capsys, a_run(capsys, workdir, tmp_path))
    assert document["extra"]["base_url"] == "http://127.0.0.1:8080/"
    assert "pw@" not in json.dumps(document) and "t0k" not in json.dumps(document)


def test_an_export_holds_no_lone_surrogate(capsys, tmp_path):
    _, transcript, _ = surrogate_run(capsys, tmp_path)
    for source in (transcript, with_lone_surrogates(transcript)):
        out = tmp_path / "run.atif.json"
        code, _, err = run_cli(capsys, ["--export", "atif", str(source), "-o", str(out)])
        assert code == 0 and not lone_surrogates(out.read_bytes()), err
        assert "done \ufffd" in out.read_text()


def test_the_golden_transcript(capsys, tmp_path):
    golden = Path(__file__).with_name("golden_transcript.json")
    source = tmp_path / "golden.json"
    shutil.copy(golden, source)
    document = matches(trajectory_of(capsys, source), json.loads(golden.read_text()))
    assert [s["source"] for s in document["steps"]] == ["user", "agent", "agent", "agent"]
    assert document["final_metrics"] == {
        "total_prompt_tokens": 2380,
        "total_completion_tokens": 92,
        "total_cached_tokens": 850,
        "total_cost_usd": 0.0002275,
        "total_steps": 4,
        "extra": {"cache_creation_input_tokens": 800},
    }
    assert "timestamp" not in document["steps"][1]  # the golden file's "<time>" is no time


def test_cleared_results_are_whole_and_say_they_were_cleared(capsys, workdir, tmp_path):
    for i in range(8):
        (workdir / f"doc{i}.md").write_text(f"# doc {i}\n" + f"line of doc {i}\n" * 285)
    client = FakeClient(
        *[
            reply(tool_use("read_file", {"path": f"doc{i}.md"}), input_tokens=3000 * (i + 1))
            for i in range(7)
        ],
        reply(text("done")),
    )
    source = tmp_path / "run.json"
    code, _, err = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--transcript",
            str(source),
            "--clear-tool-results",
            "9000",
            "--keep-tool-results",
            "2",
            "--clear-at-least",
            "500",
        ],
        client,
    )
    transcript = json.loads(source.read_text())
    assert code == 0 and len(transcript["cleared"]) == 5, err
    document = matches(trajectory_of(capsys, source), transcript)
    results = {
        r["source_call_id"]: r
        for s in document["steps"]
        for r in (s.get("observation") or {}).get("results", [])
    }
    for call_id, result in results.items():
        cleared = call_id in transcript["cleared"]
        assert result["extra"].get("cleared", False) is cleared
        assert result["content"].startswith("# doc ")  # the whole result, as first seen
        if cleared:
            assert result["extra"]["placeholder"].startswith(
                "[cleared to save context: the result of read_file"
            )
    assert document["extra"]["cleared"] == transcript["cleared"]
    assert [s["extra"].get("cleared") for s in document["steps"] if s["source"] == "agent"] == [
        t.get("cleared") for t in transcript["turns"]
    ]


def test_a_call_the_run_never_answered_is_answered_not_run(capsys, workdir, tmp_path):
    source = tmp_path / "run.json"
    budget_stopped(capsys, workdir, source)
    document = trajectory_of(capsys, source)
    [result] = document["steps"][1]["observation"]["results"]
    assert result["source_call_id"] == "toolu_X" and result["content"].startswith("not run")
    assert "token_budget" in result["content"]
    assert result["extra"] == {"is_error": True, "not_in_transcript": True}
    assert "1 tool call had no result in the transcript" in document["notes"]
    assert document["extra"]["stop"]["reason"] == "token_budget"


def test_a_transcript_cut_off_mid_run_still_exports(capsys, workdir, tmp_path):
    """As a kill -9 leaves it: no stop yet, the last call unanswered, totals not yet summed."""
    source = tmp_path / "run.json"
    budget_stopped(capsys, workdir, source)
    transcript = json.loads(source.read_text())
    transcript.update(stop=None, answer=None, ended_at=None, usage=agent.empty_usage())
    source.write_text(json.dumps(transcript))
    document = trajectory_of(capsys, source)
    [result] = document["steps"][1]["observation"]["results"]
    assert result["content"] == "not run: the transcript ends before it ran"
    assert document["final_metrics"]["total_prompt_tokens"] == 2000  # from the turns


def test_a_refused_turn_not_in_the_history_is_still_a_step(capsys, workdir, tmp_path):
    source = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(source)],
        FakeClient(reply(text("I can't help with that"), stop_reason="refusal", input_tokens=30)),
    )
    code, _, _ = run_cli(
        capsys,
        ["--resume", str(source), "something else", "--workdir", str(workdir)],
        FakeClient(reply(text("ok"))),
    )
    transcript = json.loads(source.read_text())
    assert code == 0 and transcript["turns"][0]["in_history"] is False
    document = matches(trajectory_of(capsys, source), transcript)
    refused = [s for s in document["steps"] if s["source"] == "agent"][0]
    assert refused["message"] == "" and refused["extra"]["in_history"] is False
    assert refused["extra"]["stop_reason"] == "refusal"
    assert refused["metrics"]["prompt_tokens"] == 30


def test_a_resumed_run_has_a_user_step_per_question_in_order(capsys, workdir, tmp_path):
    source = tmp_path / "run.json"
    budget_stopped(capsys, workdir, source)
    client = FakeClient(
        reply(tool_use("read_file", {"path": "notes.md"}), input_tokens=50),
        reply(text("Resumed answer."), input_tokens=60, read=40),
    )
    code, _, _ = run_cli(
        capsys, ["--resume", str(source), "go on", "--workdir", str(workdir)], client
    )
    assert code == 0
    transcript = json.loads(source.read_text())
    document = matches(trajectory_of(capsys, source), transcript)
    assert [(s["source"], s["message"]) for s in document["steps"]] == [
        ("user", "q"),
        ("agent", "Let me read."),
        ("user", "go on"),
        ("agent", ""),
        ("agent", "Resumed answer."),
    ]
    [answer] = document["steps"][1]["observation"]["results"]  # resume's own 'not run'
    assert "not run" in answer["content"] and answer["extra"]["is_error"] is True
    assert "not_in_transcript" not in answer["extra"] and "notes" not in document


def test_ctrl_c_during_a_tool_answers_every_call(capsys, workdir, tmp_path, monkeypatch):
    def ctrl_c(ctx, code):
        raise KeyboardInterrupt

    monkeypatch.setitem(agent.TOOL_FUNCTIONS, "run_python", ctrl_c)
    source = tmp_path / "run.json"
    client = FakeClient(
        reply(
            tool_use("run_python", {"code": "import time"}, id="toolu_slow"),
            tool_use("read_file", {"path": "notes.md"}, id="toolu_after"),
        )
    )
    code, _, _ = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--yes", "--no-sandbox", "--transcript", str(source)],
        client,
    )
    transcript = json.loads(source.read_text())
    assert code == 130 and transcript["stop"]["reason"] == "interrupted"
    document = matches(trajectory_of(capsys, source), transcript)
    slow, after = document["steps"][1]["observation"]["results"]
    assert slow["source_call_id"] == "toolu_slow" and "while it ran" in slow["content"]
    assert after["source_call_id"] == "toolu_after" and "it was not run" in after["content"]
    assert slow["extra"]["is_error"] and after["extra"]["is_error"]
    assert document["extra"]["stop"]["exit_code"] == 130


def test_max_turns_shows_the_harness_note_as_a_system_step(capsys, workdir, tmp_path):
    source = tmp_path / "run.json"
    client = FakeClient(
        reply(tool_use("read_file", {"path": "scores.csv"})),
        reply(text("Interim: 85, I think."), read=100),
    )
    code, _, _ = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--max-turns", "2", "--transcript", str(source)],
        client,
    )
    transcript = json.loads(source.read_text())
    assert code == 3
    document = matches(trajectory_of(capsys, source), transcript)
    assert [s["source"] for s in document["steps"]] == ["user", "agent", "system", "agent"]
    assert document["steps"][2]["message"] == agent.FINAL_TURN_NOTE
    assert document["extra"]["stop"]["reason"] == "max_turns"


def test_trials_export_one_trajectory_per_trial(capsys, workdir, tmp_path):
    summary = tmp_path / "trials.json"
    client = FakeClient(
        reply(tool_use("read_file", {"path": "scores.csv"}), input_tokens=300),
        reply(text("85"), read=200),
        FakeAPIError(400, "invalid_request_error", "bad"),
        reply(text("84"), input_tokens=90),
    )
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--trials", "3", "--transcript", str(summary)],
        client,
    )
    written = export(capsys, summary)
    assert written == [str(tmp_path / f"trials.atif.{i}.json") for i in (1, 2, 3)]
    total = 0.0
    for i, path in enumerate(written, 1):
        transcript = json.loads((tmp_path / f"trials.{i}.json").read_text())
        document = matches(valid(json.loads(Path(path).read_text())), transcript)
        assert document["extra"]["trial"] == i
        total += document["final_metrics"]["total_cost_usd"]
    assert round(total, 10) == json.loads(summary.read_text())["cost_usd"]
    code, out, _ = run_cli(capsys, ["--export", "atif", str(summary), "-o", "-"])
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3  # JSON Lines, one trajectory a trial
    assert [valid(json.loads(line))["extra"]["trial"] for line in lines] == [1, 2, 3]
    written = export(capsys, summary, "-o", str(tmp_path / "t.json"))
    assert written == [str(tmp_path / f"t.{i}.json") for i in (1, 2, 3)]


# --- what it reads, and what it never writes over ---


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("[1, 2]", "is a JSON list; it exports a transcript or a trials summary"),
        ("{}", "is an empty JSON object; it exports a transcript or a trials summary"),
        (None, "does not exist"),
        ('{"type": "run.start", "seq": 1}\n{"type": "run.stop", "seq": 2}\n', "an event stream"),
        ('{"schema_version": "ATIF-v1.8", "steps": []}', "is an ATIF trajectory; it exports"),
        ("<!doctype html><html></html>\n", "is not a JSON document"),
        (
            '{"messages": [], "version": 1}',
            "cannot export: {path} is not a version 1 agent.py transcript",
        ),
    ],
)
def test_something_else_is_one_line_saying_what_it_was_given(capsys, tmp_path, content, fragment):
    source = tmp_path / "given.json"
    if content is not None:
        source.write_text(content)
    code, out, err = run_cli(capsys, ["--export", "atif", str(source)])
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert fragment.format(path=source) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["given.json"] * (content is not None)


def test_a_directory_or_fifo_is_not_read(capsys, tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for given, what in ((tmp_path, "is a directory"), (tmp_path / "fifo", "is a FIFO")):
        code, _, err = run_cli(capsys, ["--export", "atif", str(given)])
        assert code == 2 and what in err and err.count("\n") == 1


def test_the_output_never_replaces_the_input_a_link_or_a_directory(capsys, workdir, tmp_path):
    source = a_run(capsys, workdir, tmp_path)
    kept = source.read_bytes()
    (tmp_path / "other.json").write_text("keep")
    (tmp_path / "link.json").symlink_to(tmp_path / "other.json")
    (tmp_path / "dir").mkdir()
    for target, fragment in (
        (source, "would overwrite --export"),
        (tmp_path / "link.json", "is a symlink"),
        (tmp_path / "dir", "is a directory"),
    ):
        code, _, err = run_cli(capsys, ["--export", "atif", str(source), "-o", str(target)])
        assert code == 2 and fragment in err and err.count("\n") == 1, err
    assert source.read_bytes() == kept and (tmp_path / "other.json").read_text() == "keep"
    assert not (tmp_path / "run.atif.json").exists()


def many_trials(capsys, workdir, tmp_path, n, link):
    """A trials summary naming `n` trials, each transcript a turn of 5,000 tool calls (about
    2 MB): copies of one, or (`link`) hard links of one, as unpacking a small archive gives."""
    summary = tmp_path / "trials.json"
    calls = [tool_use("read_file", {"path": "notes.md"}) for _ in range(5000)]
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--trials", "1", "--transcript", str(summary)],
        FakeClient(reply(*calls), reply(text("done"))),
    )
    document = json.loads(summary.read_text())
    document["trials"] = [dict(document["trials"][0], index=i) for i in range(1, n + 1)]
    summary.write_text(json.dumps(document))
    for i in range(2, n + 1):
        (os.link if link else shutil.copy)(
            tmp_path / "trials.1.json", tmp_path / f"trials.{i}.json"
        )
    return summary


def test_trials_whose_transcripts_are_one_file_are_refused(capsys, workdir, tmp_path):
    """30 trials whose transcripts are hard links of one file: before, the export read and
    wrote it 30 times (the cap, per file, passed 30 times: the red team's 300 links of a
    3.1 MB file made 903 MB at 1.9 GB of memory). Now one line, exit 2, nothing written."""
    summary = many_trials(capsys, workdir, tmp_path, 30, link=True)
    code, out, err = run_cli(capsys, ["--export", "atif", str(summary)])
    assert (code, out) == (2, "") and "is the same file as trial 1's" in err, err
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.glob("*.atif*"))


def test_a_trials_export_holds_one_trial_at_a_time(capsys, workdir, tmp_path, agent_copy):
    """20 trials of about 2 MB each: before, every trial's document and trajectory was held until
    the last was made; now one at a time, so the peak is that of one trial."""
    summary = many_trials(capsys, workdir, tmp_path, 20, link=False)
    code, err, rss, _ = measured(agent_copy, "--export", "atif", summary, cwd=tmp_path)
    assert code == 0 and len(list(tmp_path.glob("trials.atif.*.json"))) == 20, err
    assert rss < 100, rss  # MiB: 234 before


def test_a_trials_export_never_writes_over_a_trials_transcript(capsys, workdir, tmp_path):
    summary = tmp_path / "trials.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--trials", "2", "--transcript", str(summary)],
        FakeClient(reply(text("1")), reply(text("2"))),
    )
    kept = (tmp_path / "trials.1.json").read_bytes()
    code, _, err = run_cli(capsys, ["--export", "atif", str(summary), "-o", str(summary)])
    assert code == 2 and "would overwrite trial 1's transcript" in err
    assert (tmp_path / "trials.1.json").read_bytes() == kept


def test_a_summary_never_makes_export_open_the_file_it_names(
    capsys, workdir, tmp_path, monkeypatch
):
    """A trial's transcript is read from beside the summary, where --trials writes it, never
    from the path the summary names: that could be any file at all."""
    secret = a_run(capsys, workdir, tmp_path, name="secret.json")
    (tmp_path / "s").mkdir()
    summary = tmp_path / "s" / "trials.json"
    summary.write_text(
        json.dumps(
            {"version": 2, "kind": "trials", "trials": [{"index": 1, "transcript": str(secret)}]}
        )
    )
    opened, real_open = [], os.open

    def watch(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", watch)
    code, _, err = run_cli(capsys, ["--export", "atif", str(summary)])
    assert (
        code == 2
        and f"trial 1's transcript {tmp_path / 's' / 'trials.1.json'} does not exist" in err
    )
    assert not [p for p in opened if "secret" in p], opened
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["trials.json"]
    shutil.copy(secret, tmp_path / "s" / "trials.1.json")  # where --trials would have put it
    code, _, err = run_cli(capsys, ["--export", "atif", str(summary)])
    assert code == 0 and (tmp_path / "s" / "trials.atif.1.json").exists(), err


def test_a_summary_without_transcripts_says_so(capsys, workdir, tmp_path):
    code, out, _ = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--trials", "1", "--transcript", "-", "--no-keep"],
        FakeClient(reply(text("1"))),
    )
    summary = tmp_path / "trials.json"
    summary.write_text(out)
    code, _, err = run_cli(capsys, ["--export", "atif", str(summary)])
    assert code == 2 and "whose trials kept no transcript" in err


def test_dash_is_stdout_and_writes_no_file(capsys, workdir, tmp_path):
    source = a_run(capsys, workdir, tmp_path)
    before = set(tmp_path.iterdir())
    code, out, err = run_cli(capsys, ["--export", "atif", str(source), "-o", "-"])
    assert code == 0 and "atif:" not in err and set(tmp_path.iterdir()) == before
    assert out.count("\n") == 1
    matches(valid(json.loads(out)), json.loads(source.read_text()))
