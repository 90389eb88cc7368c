"""Kept runs: every run's transcript in the user's state directory, and `last` or a run id
wherever a transcript is read. Each test has a state directory of its own (conftest.py sets
XDG_STATE_HOME for every test), so nothing here touches the real home."""

import json
import os
import pwd
import re
import stat
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from fakes import FakeClient, reply, text, tool_use
from helpers import agent_env, need_other_users, run_agent_py, run_cli, serve

import agent

KEPT_LINE = re.compile(
    r"^kept: run (\d{8}-\d{6}-[0-9a-f]{8}) in (\S+) \(--resume last, or "
    r"--resume \1\)$",
    re.M,
)


def runs():
    """The runs directory of this test's state directory."""
    return Path(os.environ["XDG_STATE_HOME"]) / "agent.py" / "runs"


def kept_files():
    return sorted(p.name for p in runs().iterdir()) if runs().exists() else []


def ask(capsys, workdir, answer="42", *flags, question="q"):
    """One run through the CLI whose model answers `answer`; (code, stdout, stderr, kept id)."""
    code, out, err = run_cli(
        capsys, [question, "--workdir", str(workdir), *flags], FakeClient(reply(text(answer)))
    )
    found = KEPT_LINE.search(err)
    return code, out, err, found and found[1]


def test_a_run_is_kept_0600_in_a_0700_directory_and_says_where(capsys, workdir):
    code, out, err, run = ask(capsys, workdir)
    assert code == 0 and out == "42\n" and run, err
    path = runs() / f"{run}.json"
    assert KEPT_LINE.search(err)[2] == str(path)  # one line, at the end, after the stop line
    assert (
        err.splitlines()[-1].startswith("kept: run ") and "stop: end_turn" in err.splitlines()[-2]
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(runs().stat().st_mode) == 0o700
    assert stat.S_IMODE(runs().parent.stat().st_mode) == 0o700
    kept = json.loads(path.read_text())
    assert kept["answer"] == "42" and kept["stop"]["reason"] == "end_turn"
    assert kept["run_id"].startswith(run[-8:])  # the run id: its start (UTC) and run_id
    assert (
        re.fullmatch(r"\d{8}-\d{6}", run[:15])
        and kept["started_at"][:10] == f"{run[:4]}-{run[4:6]}-{run[6:8]}"
    )


def test_an_explicit_transcript_is_written_as_before_and_the_run_kept_too(
    capsys, workdir, tmp_path
):
    path = tmp_path / "run.json"
    code, _, err, run = ask(capsys, workdir, "42", "--transcript", str(path))
    assert code == 0 and path.read_bytes() == (runs() / f"{run}.json").read_bytes()


def test_resume_last_goes_on_in_the_newest_kept_run(capsys, workdir):
    _, _, _, first = ask(capsys, workdir, "one")
    _, _, _, second = ask(capsys, workdir, "two")
    assert first != second
    client = FakeClient(reply(text("three")))
    code, out, err = run_cli(
        capsys, ["--resume", "last", "and then?", "--workdir", str(workdir)], client
    )
    assert code == 0 and out == "three\n", err
    assert f"resuming {runs() / second}.json" in err and KEPT_LINE.search(err)[1] == second
    assert kept_files() == sorted([f"{first}.json", f"{second}.json"])  # no copy: it went on
    saved = json.loads((runs() / f"{second}.json").read_text())
    assert [t["turn"] for t in saved["turns"]] == [1, 2] and saved["answer"] == "three"
    sent = client.requests[0]["messages"]
    assert sent[1]["content"][0]["text"] == "two" and sent[2]["content"][0]["text"] == "and then?"
    code, _, err = run_cli(
        capsys,
        ["--resume", "last", "again?", "--workdir", str(workdir)],
        FakeClient(reply(text("four"))),
    )
    assert code == 0 and f"resuming {runs() / second}.json" in err  # the one just continued


@pytest.mark.parametrize("form", ["id", "hex"])
def test_a_run_id_names_that_run(capsys, workdir, form):
    _, _, _, first = ask(capsys, workdir, "one")
    ask(capsys, workdir, "two")
    name = first if form == "id" else first[-8:]
    code, out, err = run_cli(
        capsys,
        ["--resume", name, "more?", "--workdir", str(workdir)],
        FakeClient(reply(text("more"))),
    )
    assert code == 0 and f"resuming {runs() / first}.json" in err, err
    code, _, err = run_cli(capsys, ["--report", name, "-o", "-"])
    assert code == 0
    code, _, err = run_cli(
        capsys, ["--resume", "0123abcd", "--workdir", str(workdir)], FakeClient()
    )
    assert code == 2 and err == (
        f"agent.py: --resume 0123abcd: no kept run is named 0123abcd "
        f"in {runs()} (runs are kept there unless --no-keep): give a "
        "transcript's path\n"
    )


def test_report_replay_and_export_take_the_newest(capsys, workdir, tmp_path):
    ask(capsys, workdir, "older")
    client = FakeClient(reply(tool_use("read_file", {"path": "scores.csv"})), reply(text("new")))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    newest = runs() / f"{KEPT_LINE.search(err)[1]}.json"
    code, _, err = run_cli(capsys, ["--report", "last"])
    assert code == 0 and err == f"report: {newest.with_suffix('.html')}\n"
    assert "new" in newest.with_suffix(".html").read_text()
    code, _, err = run_cli(capsys, ["--export", "atif", "last", "-o", str(tmp_path / "t.json")])
    trajectory = json.loads((tmp_path / "t.json").read_text())
    assert code == 0 and trajectory["steps"][-1]["message"] == "new"
    before = kept_files()
    code, out, err = run_cli(capsys, ["--replay", "last", "--workdir", str(workdir)], FakeClient())
    assert code == 0 and out == "new\n" and f"replaying {newest}:" in err, err
    assert kept_files() == before and "kept:" not in err  # a replay is not kept


def test_no_keep_and_its_variable_write_nothing(capsys, workdir, monkeypatch):
    state = Path(os.environ["XDG_STATE_HOME"])
    code, _, err, run = ask(capsys, workdir, "42", "--no-keep")
    assert code == 0 and run is None and "kept" not in err
    assert list(state.iterdir()) == []
    monkeypatch.setenv("AGENT_PY_NO_KEEP", "1")
    code, _, err, run = ask(capsys, workdir, "42")
    assert code == 0 and run is None and list(state.iterdir()) == []
    monkeypatch.setenv("AGENT_PY_NO_KEEP", "0")  # 0, or empty, keeps
    assert ask(capsys, workdir, "42")[3]


@pytest.mark.parametrize(
    "value, kept",
    [
        ("1", False),
        ("true", False),
        ("YES", False),
        ("on", False),
        ("0", True),
        ("false", True),
        ("No", True),
        ("off", True),
        ("", True),
        (" ", True),
    ],
)
def test_the_no_keep_variable_reads_as_the_words_people_write(
    capsys, workdir, monkeypatch, value, kept
):
    """AGENT_PY_NO_KEEP=false used to turn keeping off without a word: anything but empty or
    0 did."""
    monkeypatch.setenv("AGENT_PY_NO_KEEP", value)
    code, _, err, run = ask(capsys, workdir, "42")
    assert code == 0 and bool(run) is kept, err


@pytest.mark.parametrize("value", ["maybe", "2", "y es"])
def test_a_no_keep_variable_neither_yes_nor_no_is_a_usage_error(
    capsys, workdir, monkeypatch, value
):
    monkeypatch.setenv("AGENT_PY_NO_KEEP", value)
    client = FakeClient(reply(text("42")))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert (code, out, client.requests) == (2, "", []) and list(runs().glob("*")) == []
    assert (
        err == f"agent.py: AGENT_PY_NO_KEEP is {value!r}: give 1, true, yes or on to keep no "
        "run, or 0, false, no, off or nothing to keep them\n"
    )


@pytest.mark.parametrize(
    "flag",
    [
        ["--resume", "last"],
        ["--replay", "last"],
        ["--report", "last"],
        ["--export", "atif", "last"],
    ],
)
def test_none_kept_is_a_usage_error_saying_where_it_looked(capsys, workdir, flag):
    client = FakeClient()
    code, out, err = run_cli(
        capsys,
        [*flag] + (["--workdir", str(workdir)] if flag[0] in ("--resume", "--replay") else []),
        client,
    )
    assert code == 2 and out == "" and client.requests == []
    assert err == (
        f"agent.py: {flag[0]} last: no run is kept in {runs()} (runs are kept there "
        "unless --no-keep): give a transcript's path\n"
    )


def test_a_file_named_last_is_named_so_and_told(capsys, workdir):
    ask(capsys, workdir, "kept")
    Path("last").write_text("{}")  # in the current directory
    code, _, err = run_cli(capsys, ["--report", "last", "-o", "-"])
    assert (
        code == 0
        and "note: --report last names a kept run; for the file last here, give ./last" in err
    )
    code, _, err = run_cli(capsys, ["--report", "./last"])
    assert code == 2 and "is an empty JSON object" in err


def planted(tmp_path):
    """A directory another party prepared, where agent.py must write nothing."""
    place = tmp_path / "planted"
    place.mkdir()
    (place / "runs").mkdir()
    return place


@pytest.mark.parametrize("which", ["agent.py", "runs"])
def test_a_state_directory_planted_as_a_symlink_is_refused(capsys, workdir, tmp_path, which):
    target = planted(tmp_path)
    (runs().parent if which == "runs" else runs().parent.parent).mkdir(
        parents=True, mode=0o700, exist_ok=True
    )
    link = runs() if which == "runs" else runs().parent
    link.symlink_to(target / "runs" if which == "runs" else target)
    forged = target / "runs" / "20990101-000000-deadbeef.json"
    code, out, err, run = ask(capsys, workdir, "42")
    assert code == 0 and out == "42\n" and run is None  # the run goes on, unkept, and says so
    assert (
        f"note: this run is not kept: {link} is a symlink: agent.py keeps runs only in a "
        "directory of its own" in err
    )
    assert list((target / "runs").iterdir()) == []  # nothing written through it
    forged.write_text(
        json.dumps(
            json.loads((Path(agent.__file__).parent / "workspace" / "example-run.json").read_text())
        )
    )
    code, _, err = run_cli(capsys, ["--resume", "last", "--workdir", str(workdir)], FakeClient())
    assert (
        code == 2
        and err
        == f"agent.py: --resume last: {link} is a symlink: agent.py keeps "
        "runs only in a directory of its own\n"
    )


def test_nothing_is_made_through_another_users_symlink_on_the_state_path(
    capsys, workdir, tmp_path, monkeypatch
):
    """XDG_STATE_HOME through a symlink `nobody` made (in a directory of nobody's), to a place
    where the state directory does not exist yet: the run is not kept, and now nothing is made
    there either. Before, the check came after os.makedirs, which followed nobody's link and
    made the directories it named, as root."""
    need_other_users()
    nobody = pwd.getpwnam("nobody")
    theirs, target = tmp_path / "theirs", tmp_path / "where-nobody-chose"
    theirs.mkdir()
    target.mkdir()
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    link = theirs / "link"
    link.symlink_to(target)
    os.lchown(link, nobody.pw_uid, nobody.pw_gid)
    monkeypatch.setenv("XDG_STATE_HOME", str(link / "planted" / "state"))
    code, out, err, run = ask(capsys, workdir, "42")
    assert code == 0 and out == "42\n" and run is None
    assert f"{link} is a symlink that another user (uid {nobody.pw_uid}) made" in err
    assert list(target.iterdir()) == []  # nothing made through it


def test_a_runs_directory_another_user_owns_or_can_write_is_refused(capsys, workdir):
    need_other_users()
    nobody = pwd.getpwnam("nobody")
    runs().mkdir(parents=True, mode=0o700)
    os.chown(runs(), nobody.pw_uid, nobody.pw_gid)
    code, _, err, run = ask(capsys, workdir, "42")
    assert code == 0 and run is None and list(runs().iterdir()) == []
    assert (
        f"note: this run is not kept: {runs()} belongs to another user (uid {nobody.pw_uid})" in err
    )
    code, _, err = run_cli(capsys, ["--report", "last"])
    assert code == 2 and "belongs to another user" in err
    os.chown(runs(), 0, 0)
    os.chmod(runs(), 0o777)  # this user's, but anyone may plant a file in it
    code, _, err, run = ask(capsys, workdir, "42")
    assert run is None and list(runs().iterdir()) == []
    assert f"{runs()} can be written by other users (mode 777)" in err
    os.chmod(runs(), 0o755)  # readable by others: made 0700, and used
    assert ask(capsys, workdir, "42")[3] and stat.S_IMODE(runs().stat().st_mode) == 0o700


def test_a_workdir_that_holds_the_runs_directory_is_refused(capsys, workdir, monkeypatch):
    """The attack: the model's code plants a run where --resume last would take it up. The
    workdir is refused before anything is sent, so no code of the model's runs."""
    monkeypatch.setenv("XDG_STATE_HOME", str(workdir / "state"))
    plant = (
        "import os; p = 'state/agent.py/runs'; os.makedirs(p, mode=0o700); "
        "open(p + '/20990101-000000-deadbeef.json', 'w').write('{}')"
    )
    client = FakeClient(reply(tool_use("run_python", {"code": plant})), reply(text("done")))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--yes"], client)
    assert code == 2 and client.requests == [] and not (workdir / "state").exists()
    assert err == (
        f"agent.py: --workdir {workdir} and the directory of kept runs, "
        f"{workdir}/state/agent.py/runs, overlap: the model's code could read kept "
        "runs or plant one that --resume last would take up; give --workdir a "
        "directory of data only (or set XDG_STATE_HOME elsewhere)\n"
    )
    monkeypatch.setenv("XDG_STATE_HOME", str(workdir.parent / "s"))  # and a workdir in it
    (runs() / "data").mkdir(parents=True)
    client = FakeClient()
    code, _, err = run_cli(capsys, ["q", "--workdir", str(runs() / "data")], client)
    assert code == 2 and "overlap" in err and client.requests == []


def test_a_trials_run_keeps_its_summary_and_each_trial(capsys, workdir):
    client = FakeClient(reply(text("a")), reply(text("b")))
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--trials", "2"], client)
    run = re.search(r"kept: trials run (\S+) in ", err)[1]
    assert code == 0 and kept_files() == [f"{run}.trials.{i}.json" for i in (1, 2)] + [
        f"{run}.trials.json"
    ]
    summary = json.loads((runs() / f"{run}.trials.json").read_text())
    assert [t["transcript"] for t in summary["trials"]] == [
        str(runs() / f"{run}.trials.{i}.json") for i in (1, 2)
    ]
    code, _, err = run_cli(capsys, ["--report", "last"])
    assert code == 0 and err == f"report: {runs() / run}.trials.html\n"
    code, _, err = run_cli(capsys, ["--export", "atif", "last", "-o", "-"])
    assert code == 0
    code, _, err = run_cli(capsys, ["--resume", "last", "--workdir", str(workdir)], FakeClient())
    assert code == 2 and err == (
        f"agent.py: --resume last: no run is kept in {runs()} but "
        f"trials (name one trial, e.g. --resume {run}.1) (runs are "
        "kept there unless --no-keep): give a transcript's path\n"
    )
    code, _, err = run_cli(capsys, ["--resume", run, "--workdir", str(workdir)], FakeClient())
    assert code == 2 and err == (
        f"agent.py: --resume {run} is a trials run: name one of its trials, e.g. --resume {run}.1\n"
    )
    trial = (runs() / f"{run}.trials.1.json").read_bytes()
    code, out, err = run_cli(
        capsys,
        ["--resume", f"{run}.1", "more?", "--workdir", str(workdir)],
        FakeClient(reply(text("c"))),
    )
    went_on = KEPT_LINE.search(err)[1]
    assert code == 0 and out == "c\n" and went_on != run
    assert (runs() / f"{run}.trials.1.json").read_bytes() == trial  # a kept trial stays as it ran
    assert json.loads((runs() / f"{went_on}.json").read_text())["answer"] == "c"


@pytest.mark.parametrize("state", ["file", "proc"])
def test_a_state_directory_that_cannot_hold_runs_is_named_with_the_reason(
    capsys, workdir, tmp_path, monkeypatch, state
):
    """XDG_STATE_HOME=/proc said `the runs directory cannot be used: No such file or
    directory` (which directory?); XDG_STATE_HOME=README.md said `File exists`."""
    home = {"file": tmp_path / "README.md", "proc": Path("/proc")}[state]
    if state == "file":
        home.write_text("# a file\n")
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    code, out, err, run = ask(capsys, workdir, "42")
    assert (code, out, run) == (0, "42\n", None), err
    note = next(line for line in err.splitlines() if line.startswith("note: this run is not kept"))
    runs_dir = home / "agent.py" / "runs"
    assert note == (
        f"note: this run is not kept: {home} is not a directory, so {runs_dir} cannot be made"
        if state == "file"
        else f"note: this run is not kept: {runs_dir} cannot be made: No such file or directory"
    ), note


def test_a_run_never_takes_another_runs_file(capsys, workdir, monkeypatch):
    """Two runs with one id (the same second, the same 8 hex digits): the second is not kept,
    and the first's file is left as it was (O_EXCL), not replaced or removed."""
    monkeypatch.setattr(agent.uuid, "uuid4", lambda: uuid.UUID("0badc0de" + "0" * 24))
    runs().mkdir(parents=True, mode=0o700)
    now = time.time()
    for second in range(120):  # whenever in the next two minutes the run starts
        name = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now + second)) + "-0badc0de.json"
        (runs() / name).write_text("precious")
    code, out, err, run = ask(capsys, workdir, "42")
    assert code == 0 and out == "42\n" and run is None
    assert "note: this run is not kept: another run has its id, " in err
    assert {p.read_text() for p in runs().iterdir()} == {"precious"} and len(kept_files()) == 120


def test_a_run_that_cannot_be_kept_any_more_goes_on(capsys, workdir, monkeypatch):
    """A kept file that can no longer be written (a full disk) ends the keeping, not the run."""

    def full(self, data, durable=False):
        if "runs" in str(self.path) and data:  # the probe at the start (b"") still passes
            raise OSError(28, "No space left on device")
        return real(self, data, durable)

    real = agent.OutputFile.write
    monkeypatch.setattr(agent.OutputFile, "write", full)
    client = FakeClient(reply(tool_use("read_file", {"path": "scores.csv"})), reply(text("ok")))
    code, out, err = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert code == 0 and out == "ok\n" and len(client.requests) == 2
    assert err.count("note: this run is no longer kept in ") == 1
    assert "No space left on device" in err


def test_runs_go_to_the_home_state_directory_without_xdg_state_home(
    capsys, workdir, tmp_path, monkeypatch
):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for value in (None, "relative/state"):  # a relative XDG_STATE_HOME is ignored (XDG spec)
        if value is None:
            monkeypatch.delenv("XDG_STATE_HOME")
        else:
            monkeypatch.setenv("XDG_STATE_HOME", value)
        code, _, err = run_cli(
            capsys, ["q", "--workdir", str(workdir)], FakeClient(reply(text("42")))
        )
        run = KEPT_LINE.search(err)[1]
        assert code == 0 and (home / ".local/state/agent.py/runs" / f"{run}.json").exists()
    assert not Path("relative").exists()


def test_a_run_as_a_user_runs_it_is_kept_where_its_environment_says(request, workdir, tmp_path):
    api = serve(request, reply(text("42")))
    state = tmp_path / "elsewhere"
    done = run_agent_py(
        agent.__file__,
        "q",
        "--workdir",
        workdir,
        env=agent_env(api, XDG_STATE_HOME=str(state)),
        cwd=tmp_path,
    )
    run = KEPT_LINE.search(done.stderr)[1]
    assert (
        done.returncode == 0
        and json.loads((state / "agent.py/runs" / f"{run}.json").read_text())["answer"] == "42"
    )
    done = run_agent_py(
        agent.__file__,
        "--report",
        "last",
        "-o",
        "-",
        env=agent_env(XDG_STATE_HOME=str(state)),
        cwd=tmp_path,
    )
    assert done.returncode == 0 and "42" in done.stdout


def test_resume_with_a_transcript_keeps_a_new_run_and_leaves_the_old_one(capsys, workdir, tmp_path):
    _, _, _, first = ask(capsys, workdir, "one")
    before = (runs() / f"{first}.json").read_bytes()
    out_path = tmp_path / "went-on.json"
    code, out, err = run_cli(
        capsys,
        ["--resume", "last", "more?", "--workdir", str(workdir), "--transcript", str(out_path)],
        FakeClient(reply(text("2"))),
    )
    went_on = KEPT_LINE.search(err)[1]
    assert code == 0 and went_on != first and (runs() / f"{first}.json").read_bytes() == before
    assert (runs() / f"{went_on}.json").read_bytes() == out_path.read_bytes()
    mine = tmp_path / "mine.json"  # --resume of a file of the user's: rewritten, and kept too
    mine.write_bytes(before)
    code, _, err = run_cli(
        capsys,
        ["--resume", str(mine), "more?", "--workdir", str(workdir)],
        FakeClient(reply(text("3"))),
    )
    assert code == 0 and json.loads(mine.read_text())["answer"] == "3"
    assert (runs() / f"{KEPT_LINE.search(err)[1]}.json").read_bytes() == mine.read_bytes()


def test_last_passes_over_what_is_not_a_finished_file_of_its_own(capsys, workdir, tmp_path):
    """An empty file (a run killed before its first save) and a symlink, even newer, are not
    `last`: it is the newest regular, non-empty file of this user's."""
    _, _, _, run = ask(capsys, workdir, "real")
    (runs() / "20990101-000000-0000aaaa.json").write_text("")
    forged = tmp_path / "forged.json"
    forged.write_bytes((runs() / f"{run}.json").read_bytes().replace(b'"real"', b'"forged"'))
    (runs() / "20990101-000000-0000bbbb.json").symlink_to(forged)
    code, out, _ = run_cli(capsys, ["--report", "last", "-o", "-"])
    assert code == 0 and "real" in out and "forged" not in out


def test_a_state_directory_reached_through_another_users_symlink_is_refused(
    capsys, workdir, tmp_path, monkeypatch
):
    need_other_users()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    link = tmp_path / "state-link"
    link.symlink_to(theirs)
    nobody = pwd.getpwnam("nobody")
    os.lchown(link, nobody.pw_uid, nobody.pw_gid)
    monkeypatch.setenv("XDG_STATE_HOME", str(link))
    code, out, err, run = ask(capsys, workdir, "42")
    assert code == 0 and out == "42\n" and run is None and list(theirs.iterdir()) == []
    assert (
        f"note: this run is not kept: the kept runs {link}/agent.py: {link} is a "
        f"symlink that another user (uid {nobody.pw_uid}) made" in err
    )


def test_the_real_home_check_blames_only_the_tests_runs(capsys, workdir, tmp_path_factory):
    """A user's README run (`--workdir workspace` in this checkout), kept while the suite runs,
    is theirs: the session's check that no test kept a run in the real home must not blame it
    (finding 43); a run whose workdir is the tests' own is blamed."""
    from helpers import AGENT, kept_by_the_tests

    _, _, err, mine = ask(capsys, workdir)
    _, _, err, users = ask(capsys, AGENT.parent / "workspace", "42", "--model", "claude-haiku-5-5")
    basetemp = tmp_path_factory.getbasetemp()
    assert kept_by_the_tests(runs() / f"{mine}.json", basetemp)
    assert not kept_by_the_tests(runs() / f"{users}.json", basetemp), err
    assert not kept_by_the_tests(runs() / "gone.json", basetemp)


def test_a_missing_home_is_not_made_to_keep_a_run(capsys, workdir, tmp_path, monkeypatch):
    """Service accounts have HOME=/nonexistent on purpose (finding 52): the run goes on, is
    not kept, says why, and no home directory is made."""
    home = tmp_path / "nonexistent-home"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(home))
    code, out, err, run = ask(capsys, workdir)
    assert (code, out, run) == (0, "42\n", None), err
    assert f"note: this run is not kept: the home directory {home} does not exist" in err, err
    assert not home.exists()


def test_resume_last_of_a_run_that_worked_where_the_runs_are_says_so(
    capsys, workdir, tmp_path, monkeypatch
):
    """A --no-sandbox run in ~ (which holds the kept runs) is kept; `--resume last` then
    refuses it, naming that run's workdir as the kept run's, not as the user's, and what to do
    (newuser #50)."""
    home = tmp_path / "home"
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    home.mkdir()
    code, _, err, run = ask(capsys, home, "42", "--no-sandbox")
    assert code == 0 and run, err
    kept = runs() / f"{run}.json"
    code, out, err = run_cli(
        capsys,
        ["--resume", "last", "and?", "--workdir", str(workdir)],
        FakeClient(reply(text("never"))),
    )
    assert (code, out) == (2, "")
    assert err == (
        f"agent.py: --resume last is the kept run {kept}, made by a run whose "
        f"workdir, {home}, holds the kept runs (only --no-sandbox allows that): its "
        "code could have rewritten this file, so it is not resumed; give another "
        f"run's id (--resume ID; they are in {runs()}), or remove this one (rm "
        f"{kept}) and last names the one before\n"
    )


def test_resume_last_says_so_when_the_newest_run_was_killed_before_it_was_kept(
    request, capsys, workdir, agent_copy
):
    """N31: a run killed with kill -9 (the OOM killer, docker kill) while its first turn's tool
    ran left its kept file empty, and `--resume last` went on with an older, unrelated run
    without a word. Now a note names the newest run, says why it is not taken, and names the
    one that is."""
    _, _, _, older = ask(capsys, workdir, "an older conversation")
    api = serve(request, reply(tool_use("run_python", {"code": "import time; time.sleep(60)"})))
    proc = run_agent_py(
        agent_copy,
        "avg?",
        "--workdir",
        workdir,
        "--yes",
        env=agent_env(api),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        background=True,
    )
    seen = ""
    while "sandbox:" not in seen and proc.poll() is None:
        seen += proc.stderr.readline()
    time.sleep(0.5)
    proc.kill()  # SIGKILL: nothing of agent.py runs after it
    proc.wait(timeout=30)
    proc.stderr.close()
    killed = [n for n in kept_files() if n != f"{older}.json"]
    assert len(killed) == 1 and (runs() / killed[0]).stat().st_size == 0, kept_files()
    client = FakeClient(reply(text("continued")))
    code, out, err = run_cli(
        capsys, ["--resume", "last", "continue", "--workdir", str(workdir)], client
    )
    note = [
        line
        for line in err.splitlines()
        if line.startswith("note: ") and killed[0].removesuffix(".json") in line
    ]
    assert len(note) == 1, err
    assert older in note[0] and "empty" in note[0] and "kill" in note[0], note
    assert code == 0 and out == "continued\n"


def test_a_transcript_is_never_written_into_the_directory_of_kept_runs(capsys, workdir):
    """`--transcript ~/.local/state/agent.py/runs/ID.json` replaced another kept run, whose
    name then named a different run (newuser2 N26): agent.py names the files there."""
    _, _, _, older = ask(capsys, workdir, "one")
    target = runs() / f"{older}.json"
    before = target.read_bytes()
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(target)],
        FakeClient(reply(text("two"))),
    )
    assert (code, out) == (2, "") and err == (
        f"agent.py: --transcript {target} is in the directory of kept runs, whose files agent.py "
        "names by run id: give a path elsewhere (the run is kept there anyway)\n"
    ), err
    assert target.read_bytes() == before


# --- a run agent.py kept is trusted for its workdir, model and system prompt (issue 34) ---


def kept_run_elsewhere(capsys, workdir, tmp_path, monkeypatch):
    """Keep one run on `workdir` with its own model, then leave for another directory, so that
    going on with it takes its recorded workdir and model. Returns the kept file."""
    _, _, err, run = ask(capsys, workdir, "one", "--model", "claude-opus-5-5")
    assert run, err
    monkeypatch.chdir(tmp_path)
    return runs() / f"{run}.json"


@pytest.mark.parametrize("flag", ["--resume", "--replay"])
def test_a_run_agent_py_kept_goes_on_without_a_question(
    capsys, workdir, tmp_path, monkeypatch, flag
):
    kept = kept_run_elsewhere(capsys, workdir, tmp_path, monkeypatch)
    client = FakeClient(reply(text("two")))
    argv = ["--resume", "last", "and the median?"] if flag == "--resume" else ["--replay", "last"]
    code, out, err = run_cli(capsys, argv, client)
    assert code == 0 and "[y/N]" not in err, err
    assert out == ("two\n" if flag == "--resume" else "one\n")
    if flag == "--resume":  # its recorded model, in its recorded workdir
        assert client.requests[0]["model"] == "claude-opus-5-5"
        assert json.loads(kept.read_text())["workdir"] == str(workdir)


def test_a_copy_of_a_kept_run_elsewhere_is_asked_about(capsys, workdir, tmp_path, monkeypatch):
    kept = kept_run_elsewhere(capsys, workdir, tmp_path, monkeypatch)
    copy = tmp_path / kept.name  # named as a kept run, but elsewhere
    copy.write_bytes(kept.read_bytes())
    copy.chmod(0o600)
    client = FakeClient(reply(text("two")))
    code, _, err = run_cli(capsys, ["--resume", str(copy), "more?"], client)
    assert (code, client.requests) == (2, []) and "only a file" in err and "[y/N]" in err


@pytest.mark.parametrize("how", ["mode", "hard link", "symlink", "owner"])
def test_a_kept_run_someone_replaced_is_asked_about(capsys, workdir, tmp_path, monkeypatch, how):
    """A kept run whose mode was widened, which is a hard link to a file elsewhere (the workdir,
    where the model's code writes), a symlink, or another user's: not as agent.py wrote it."""
    kept = kept_run_elsewhere(capsys, workdir, tmp_path, monkeypatch)
    other = tmp_path / "planted.json"
    other.write_bytes(kept.read_bytes())
    other.chmod(0o600)
    if how == "mode":
        kept.chmod(0o644)
    elif how == "hard link":
        kept.unlink()
        os.link(other, kept)
    elif how == "symlink":
        kept.unlink()
        kept.symlink_to(other)
    else:
        need_other_users()
        os.chown(kept, 65534, -1)
    client = FakeClient(reply(text("two")))
    code, _, err = run_cli(capsys, ["--resume", str(kept), "more?"], client)
    assert (code, client.requests) == (2, []), err
    assert f'workdir "{workdir}"' in err and "only a file" in err and "not resumed" in err


def test_a_kept_run_going_to_another_server_is_asked_about(capsys, workdir, tmp_path, monkeypatch):
    kept_run_elsewhere(capsys, workdir, tmp_path, monkeypatch)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    client = FakeClient(reply(text("two")))
    code, _, err = run_cli(capsys, ["--resume", "last", "more?"], client)
    assert (code, client.requests) == (2, []) and "[y/N]" in err
    assert "server" in err and "127.0.0.1:9" in err
    assert "workdir" not in err.split("asks to go on")[1]  # only the server is asked about
