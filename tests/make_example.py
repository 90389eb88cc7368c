"""Make workspace/example-run.json, the recorded run that `agent.py --replay` plays without a key
(README, "Try it without a key"; docs/replay.md).

    python tests/make_example.py

A scripted model (FakeClient, tests/fakes.py) asks for the calls below; agent.py runs them for
real, run_python in its sandbox, on workspace/, and records the run. The transcript says so in
its own field, produced_by. Its workdir is written as "workspace", the one path that holds on
any clone, so that replaying with --workdir workspace works wherever the repository is. The
scripted answer states only what the tool results show: make() checks that it does.
test_replay.py checks that the committed file is what this script makes now (stable() drops
the times and ids that differ from one run to the next).
"""

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fakes import FakeClient, reply, text, tool_use  # noqa: E402

import agent  # noqa: E402  (after the path above, as a script)

EXAMPLE = ROOT / "workspace" / "example-run.json"
QUESTION = "Which class did better in scores.csv, and does that match what spring.md says?"
CODE = """import csv, statistics

rows = list(csv.DictReader(open("scores.csv")))
for name in sorted({r["class"] for r in rows}):
    scores = [int(r["score"]) for r in rows if r["class"] == name]
    print(f"class {name}: {len(scores)} students, average {statistics.mean(scores):.1f}")
print(f"all: {len(rows)} students, average {statistics.mean(int(r['score']) for r in rows):.1f}")
"""
ANSWER = (
    "Class A did better: its average is 82.8, against 77.0 for class B (79.9 over all 10 "
    "students, computed from scores.csv).\n\nThat matches spring.md, which says class A "
    "met the reading goal and class B missed it by two books per student. spring.md "
    "gives a mid-term average of 76.4 for everyone; the scores in scores.csv are higher."
)
SHOWN = (
    "class A: 5 students, average 82.8",
    "class B: 5 students, average 77.0",
    "all: 10 students, average 79.9",
)  # what the run_python result must hold
PRODUCED_BY = {
    "kind": "scripted",
    "script": "tests/make_example.py",
    "note": "the model's replies and their usage are scripted (no model was asked); "
    "the tool results are real, run_python's in agent.py's sandbox",
}


def scripted(id, *blocks, **usage):
    """A reply of the scripted model, with a fixed message id."""
    return dict(reply(*blocks, **usage), id=id)


def replies():
    return [
        scripted(
            "msg_example_1",
            text("I'll read the scores and the spring report."),
            tool_use("read_file", {"path": "scores.csv"}, id="toolu_example_1"),
            tool_use("read_file", {"path": "spring.md"}, id="toolu_example_2"),
            input_tokens=18,
            write=1240,
            output_tokens=92,
        ),
        scripted(
            "msg_example_2",
            text("Now the average of each class, computed from the file."),
            tool_use("run_python", {"code": CODE}, id="toolu_example_3"),
            input_tokens=10,
            read=1240,
            write=286,
            output_tokens=171,
        ),
        scripted(
            "msg_example_3", text(ANSWER), input_tokens=9, read=1526, write=214, output_tokens=104
        ),
    ]


def make(path=EXAMPLE):
    """Run the scripted model through agent.py on workspace/ and write the transcript to
    `path`; return it."""
    with (
        tempfile.TemporaryDirectory() as scratch,
        contextlib.redirect_stdout(io.StringIO()),
    ):  # the answer is in the transcript
        out = Path(scratch) / "run.json"  # a transcript may not be in the workdir
        code = agent.main(
            [
                QUESTION,
                "--workdir",
                str(ROOT / "workspace"),
                "--model",
                agent.DEFAULT_MODEL,
                "--yes",
                "--quiet",
                # a scripted run is no run of the user's: --resume last must never take it
                "--no-keep",
                "--transcript",
                str(out),
            ],
            client=FakeClient(*replies()),
            stdin=io.StringIO(""),
        )
        run = json.loads(out.read_text())
    results = [
        b
        for m in run["messages"]
        if m["role"] == "user"
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    if (
        code != 0
        or any(r.get("is_error") for r in results)
        or not all(line in results[-1]["content"] for line in SHOWN)
    ):
        sys.exit(
            f"make_example: the run did not go as scripted (exit {code}): "
            f"{[r['content'][:200] for r in results]}"
        )
    run = {"version": run.pop("version"), "produced_by": PRODUCED_BY, **run, "workdir": "workspace"}
    data = agent.dump(run)
    if str(ROOT).encode() in data:
        sys.exit(f"make_example: the transcript names {ROOT}, which no other clone has")
    Path(path).write_bytes(data)
    return run


VOLATILE = ("run_id", "started_at", "ended_at", "seconds", "api_seconds", "request_id")


def stable(document):
    """A transcript without what differs from one run to the next: ids, times, durations."""
    if isinstance(document, dict):
        return {k: stable(v) for k, v in document.items() if k not in VOLATILE}
    if isinstance(document, list):
        return [stable(v) for v in document]
    return document


if __name__ == "__main__":
    make()
    print(f"wrote {EXAMPLE.relative_to(ROOT)}")
