"""Where outputs go (issue 25, property 1): the one writer every output uses (OutputFile), attacked
as another user would attack it. A file, FIFO, terminal or symlink another user planted at an
output's path receives nothing; a hard link's other name keeps its content; every file agent.py
writes is JSON it reads back. Each test performs the attack and asserts what the victim or the
attacker observes: the bytes that reached the attacker, the victim file's content, the exit code.
"""

import itertools
import json
import os
import pty
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeClient, reply, text
from helpers import AGENT, OTHER_USERS, agent_env, as_other_users, run_cli, serve

import agent

needs_root = as_other_users  # planting another user's files: root, with other uids mapped
NOBODY = 65534
OTHER = 12345  # an attacker that is neither the user nor root, when the user is `nobody`


@pytest.fixture
def shared(request):
    """A directory like /tmp: root's, sticky, open to all; removed after the test."""
    top = Path(tempfile.mkdtemp(prefix="agent-test-shared-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    top.chmod(0o1777)
    return top


def planted_fifo(path, owner=NOBODY):
    """A FIFO another user made (and holds open for reading): returns the read end."""
    os.mkfifo(path, 0o666)
    os.chown(path, owner, owner)
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK)


def drain(fd):
    got = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        got += chunk
    return got


@pytest.fixture
def recorded(capsys, workdir, tmp_path):
    """A transcript of a finished run, outside any shared directory."""
    path = tmp_path / "run.json"
    code, _, _ = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(path)],
        FakeClient(reply(text("the secret answer"))),
    )
    assert code == 0
    return path


def run_writing(capsys, workdir, recorded, flag, path):
    """Run agent.py so that it writes one output, `flag`, to `path`; its exit code and stderr."""
    if flag in ("--events", "--transcript"):
        argv = ["q", "--workdir", str(workdir), flag, str(path)]
        code, _, err = run_cli(capsys, argv, FakeClient(reply(text("the secret answer"))))
    elif flag == "--report -o":
        code, _, err = run_cli(capsys, ["--report", str(recorded), "-o", str(path)])
    else:
        code, _, err = run_cli(capsys, ["--export", "atif", str(recorded), "-o", str(path)])
    return code, err


OUTPUTS = ["--events", "--transcript", "--report -o", "--export -o"]


# --- an existing file is replaced, never rewritten in place ---


@pytest.mark.parametrize("flag", OUTPUTS)
def test_a_hard_links_other_name_keeps_its_content(capsys, workdir, tmp_path, recorded, flag):
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"precious\n")
    target = tmp_path / "out.json"
    os.link(precious, target)
    code, err = run_writing(capsys, workdir, recorded, flag, target)
    assert code == 0, err
    assert precious.read_bytes() == b"precious\n"  # before: --events truncated it to the events
    assert target.read_bytes() != b"precious\n" and b"secret answer" in target.read_bytes()
    assert os.stat(target).st_ino != os.stat(precious).st_ino


@needs_root
@pytest.mark.parametrize("flag", OUTPUTS)
def test_another_users_open_file_at_the_path_receives_nothing(
    capsys, workdir, shared, recorded, flag
):
    """`nobody` leaves a file of its own, writable by all, where the user will write an output,
    and keeps it open: the output goes to a new file that only the user can read."""
    target = shared / "out.json"
    target.write_bytes(b"")
    os.chown(target, NOBODY, NOBODY)
    target.chmod(0o666)
    spy = os.open(target, os.O_RDONLY)
    try:
        code, err = run_writing(capsys, workdir, recorded, flag, target)
        stolen = drain(spy)
    finally:
        os.close(spy)
    assert stolen == b""  # before, --events: the whole event stream, the answer included
    assert code == 2 and "another user" in err and target.read_bytes() == b"", err


# --- nothing goes through what another user planted ---


@needs_root
@pytest.mark.parametrize("flag", OUTPUTS)
def test_a_fifo_another_user_owns_receives_nothing(capsys, workdir, shared, recorded, flag):
    fifo = shared / "out.json"
    spy = planted_fifo(fifo)
    try:
        code, err = run_writing(capsys, workdir, recorded, flag, fifo)
        stolen = drain(spy)
    finally:
        os.close(spy)
    assert stolen == b""  # before: events, report and export all went to the spy
    assert code == 2 and ("another user" in err or "not a regular file" in err), err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # and the FIFO is left as it was


@needs_root
@pytest.mark.parametrize("link_owner", [NOBODY, 0])
@pytest.mark.parametrize("flag", ["--events", "--report -o", "--export -o"])
def test_a_planted_symlink_to_a_fifo_leads_nowhere(
    capsys, workdir, shared, recorded, flag, link_owner
):
    """A symlink to another user's FIFO: whoever made the link, the FIFO is not the user's."""
    spy = planted_fifo(shared / "spy.fifo")
    link = shared / "out.json"
    link.symlink_to(shared / "spy.fifo")
    os.lchown(link, link_owner, link_owner)
    try:
        code, err = run_writing(capsys, workdir, recorded, flag, link)
        stolen = drain(spy)
    finally:
        os.close(spy)
    assert (code, stolen) == (2, b""), err  # before: exit 0, and the spy read the output


@needs_root
@pytest.mark.parametrize("mode", ["--report", "--export"])
def test_the_default_path_beside_an_input_is_only_ever_a_regular_file(
    capsys, shared, recorded, mode
):
    """The user names no output: the report (export) goes beside the input. There, `nobody` has
    planted a FIFO it reads, a symlink to its terminal, or a symlink to a file of the user's."""
    source = shared / "run.json"
    shutil.copy(recorded, source)
    default = source.with_suffix(".html" if mode == "--report" else ".atif.json")
    argv = ["--report", str(source)] if mode == "--report" else ["--export", "atif", str(source)]

    spy = planted_fifo(default)  # a FIFO
    try:
        code, _, err = run_cli(capsys, argv)
        assert (code, drain(spy)) == (2, b""), err  # before: exit 0, the spy read it all
    finally:
        os.close(spy)
    default.unlink()

    master, slave = pty.openpty()  # a terminal: nobody's, which it watches
    try:
        os.chown(os.ttyname(slave), NOBODY, NOBODY)
        default.symlink_to(os.ttyname(slave))
        os.lchown(default, NOBODY, NOBODY)
        code, _, err = run_cli(capsys, argv)
        os.set_blocking(master, False)
        assert (code, drain(master)) == (2, b""), err  # before: the report on nobody's screen
    finally:
        os.close(slave)
        os.close(master)
    default.unlink()

    mine = shared / "mine.txt"  # a symlink to a file of the user's
    mine.write_bytes(b"mine\n")
    default.symlink_to(mine)
    os.lchown(default, NOBODY, NOBODY)
    code, _, err = run_cli(capsys, argv)
    assert code == 2 and mine.read_bytes() == b"mine\n", err


@needs_root
def test_a_symlink_in_the_parent_path_made_by_another_user_is_not_followed(
    capsys, workdir, shared, tmp_path, recorded
):
    """`nobody` makes /shared/reports a symlink to a directory of the user's: an output named
    /shared/reports/x.json must not land there (a symlink of the user's own is followed)."""
    private = tmp_path / "private"
    private.mkdir()
    (private / "out.json").write_bytes(b"the user's own\n")
    link = shared / "reports"
    link.symlink_to(private)
    os.lchown(link, NOBODY, NOBODY)
    for flag in OUTPUTS:
        code, err = run_writing(capsys, workdir, recorded, flag, link / "out.json")
        assert code == 2 and "symlink" in err, (flag, err)
        assert (private / "out.json").read_bytes() == b"the user's own\n"
    os.lchown(link, 0, 0)  # the user's own link: followed as before
    code, err = run_writing(capsys, workdir, recorded, "--events", link / "out.json")
    assert code == 0 and b"secret answer" in (private / "out.json").read_bytes(), err


def test_a_fifo_and_a_device_the_user_names_still_work(capsys, workdir, tmp_path, recorded):
    """What README promises stays: an output the user names may be their own FIFO (a pipe),
    /dev/null or /dev/stdout."""
    fifo = tmp_path / "mine.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        code, err = run_writing(capsys, workdir, recorded, "--events", fifo)
        got = drain(reader)
    finally:
        os.close(reader)
    assert code == 0 and b'"run.stop"' in got, err
    for flag in ("--events", "--report -o", "--export -o"):
        code, err = run_writing(capsys, workdir, recorded, flag, "/dev/null")
        assert code == 0, (flag, err)


def test_a_terminal_the_user_names_gets_its_controls_escaped(capsys, workdir, tmp_path):
    """--events on the user's own terminal: what the model wrote (U+202E, an 8-bit CSI) reaches
    it escaped, as on stdout; before, raw."""
    master, slave = pty.openpty()
    try:
        code, _, err = run_cli(
            capsys,
            ["q", "--workdir", str(workdir), "--events", os.ttyname(slave)],
            FakeClient(reply(text("evil\u202e\u009b2Janswer"))),
        )
        os.set_blocking(master, False)
        shown = drain(master).decode("utf-8")
    finally:
        os.close(slave)
        os.close(master)
    assert code == 0 and "evil" in shown, err
    assert not set(shown) & {"\u202e", "\u009b"} and "\\u202e" in shown


def test_dev_stdout_through_a_pipe_is_written_through(workdir, tmp_path, recorded, agent_copy):
    done = subprocess.run(
        [sys.executable, str(agent_copy), "--report", str(recorded), "-o", "/dev/stdout"],
        capture_output=True,
        env=agent_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.startswith(b"<!doctype html>"), done.stderr


# --- never over what runs agent.py (issue 26, new user's finding 21) ---


@pytest.fixture
def harness_copy(tmp_path):
    """agent.py in a checkout of its own, run by the interpreter of a venv of its own (--copies:
    the interpreter is a file of that venv, not the machine's): what a typo could destroy, with
    nothing the machine or the tests need among it."""
    checkout, venv = tmp_path / "checkout", tmp_path / "checkout" / ".venv"
    checkout.mkdir()
    shutil.copyfile(AGENT, checkout / "agent.py")
    subprocess.run(
        [sys.executable, "-m", "venv", "--copies", "--without-pip", str(venv)],
        check=True,
        timeout=120,
    )
    return SimpleNamespace(
        agent=checkout / "agent.py", python=venv / "bin" / "python", venv=venv, checkout=checkout
    )


def harness_files(h):
    return {p: p.read_bytes() for p in (h.agent, h.python, h.venv / "pyvenv.cfg")}


@pytest.mark.parametrize("flag", ["--report -o", "--export -o"])
@pytest.mark.parametrize("target", ["agent.py", ".env", "interpreter", "pyvenv.cfg", "module"])
def test_an_output_never_replaces_what_runs_agent_py(recorded, harness_copy, flag, target):
    """One typo (`-o agent.py`, `--transcript .venv/pyvenv.cfg`) used to replace agent.py, its
    venv or its interpreter, exit 0, and the next run was a traceback; or plant the one .env
    agent.py trusts. Now: one line, exit 2, every file as it was, no .env."""
    h = harness_copy
    path = {
        "agent.py": h.agent,
        ".env": h.checkout / ".env",
        "interpreter": h.python,
        "pyvenv.cfg": h.venv / "pyvenv.cfg",
        "module": h.checkout / "json.py",
    }[target]
    before = harness_files(h)
    argv = ["--report", recorded] if flag == "--report -o" else ["--export", "atif", recorded]
    done = subprocess.run(
        [str(h.python), str(h.agent), *map(str, argv), "-o", str(path)],
        capture_output=True,
        text=True,
        env=agent_env(),
        cwd=h.checkout,
        timeout=60,
    )
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"agent.py: -o {path} ") and "runs it" in done.stderr
    assert harness_files(h) == before and not (h.checkout / ".env").exists()
    assert not (h.checkout / "json.py").exists() and sorted(os.listdir(h.checkout)) == [
        ".venv",
        "agent.py",
    ]  # no temporary file left either


@pytest.mark.parametrize("flag", ["--transcript", "--events"])
def test_a_run_never_writes_its_transcript_or_events_over_agent_py(
    request, workdir, harness_copy, flag
):
    h = harness_copy
    api = serve(request, reply(text("beside it")))
    before = harness_files(h)
    for path in (h.agent, h.checkout / ".env"):  # (its venv is not h.venv: see the test above)
        done = subprocess.run(
            [
                sys.executable,
                str(h.agent),
                "q",
                "--workdir",
                str(workdir),
                "--yes",
                flag,
                str(path),
            ],
            capture_output=True,
            text=True,
            env=agent_env(api),
            cwd=h.checkout,
            timeout=60,
        )
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith(f"agent.py: {flag} {path} ") and "runs it" in done.stderr
    assert harness_files(h) == before and not (h.checkout / ".env").exists()
    assert api.requests == []
    done = subprocess.run(
        [
            sys.executable,
            str(h.agent),
            "q",
            "--workdir",
            str(workdir),
            flag,
            str(h.checkout / "run.json"),
        ],
        capture_output=True,
        text=True,
        env=agent_env(api),
        cwd=h.checkout,
        timeout=60,
    )
    assert done.returncode == 0 and (h.checkout / "run.json").exists(), done.stderr  # beside: fine


@pytest.mark.parametrize("flag", OUTPUTS)
def test_a_long_file_name_is_written_or_refused_in_one_line(
    capsys, workdir, tmp_path, recorded, flag
):
    """A name of 250 bytes is a name the file system takes: it used to be refused, as the new
    file beside it (.NAME.HEX.tmp) was too long; one of 300 ended as `internal error: OSError:
    [Errno 36] File name too long`, after the run."""
    fits = tmp_path / ("x" * 245 + ".json")
    code, err = run_writing(capsys, workdir, recorded, flag, fits)
    assert code == 0 and fits.stat().st_size > 0, err
    too_long = tmp_path / ("y" * 300 + ".json")
    code, err = run_writing(capsys, workdir, recorded, flag, too_long)
    assert code == 2 and err.endswith(f"{too_long} cannot be written: File name too long\n"), err
    assert len(err.splitlines()) == 1


# --- as an ordinary user ---


@pytest.fixture
def as_nobody_here(shared):
    """agent.py, copied where `nobody` can run it, and how to run it as `nobody`."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None or OTHER_USERS:
        pytest.skip(OTHER_USERS or "needs a /usr/bin/python3 an ordinary user can run")
    shutil.copyfile(AGENT, shared / "agent.py")
    (shared / "agent.py").chmod(0o644)

    def run(*args):
        return subprocess.run(
            [python, str(shared / "agent.py"), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=shared,
            env={"PATH": "/usr/bin:/bin"},
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
        )

    return run


@needs_root
def test_as_an_ordinary_user_another_users_fifo_receives_nothing(shared, recorded, as_nobody_here):
    source = shared / "run.json"
    shutil.copy(recorded, source)
    source.chmod(0o644)
    spy = planted_fifo(shared / "spy.fifo", owner=OTHER)
    try:
        done = as_nobody_here("--report", source, "-o", shared / "spy.fifo")
        stolen = drain(spy)
    finally:
        os.close(spy)
    assert (done.returncode, stolen) == (2, b""), done.stderr  # before: 0, and the HTML
    assert len(done.stderr.strip().splitlines()) == 1
    done = as_nobody_here("--report", source, "-o", "/dev/null")  # root's device: fine
    assert done.returncode == 0, done.stderr
    (shared / "hers.html").write_text("hers\n")
    os.chown(shared / "hers.html", OTHER, OTHER)
    done = as_nobody_here("--report", source, "-o", shared / "hers.html")
    assert done.returncode == 2 and (shared / "hers.html").read_text() == "hers\n", done.stderr


# --- what agent.py writes, it reads back ---


def test_temp_files_are_never_opened_if_something_is_there(tmp_path, monkeypatch):
    """The new file beside an output is created, never opened: a hard link planted at its
    name (a guessed name) is not written through."""
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"precious\n")
    names = itertools.chain(["planted"], (f"fresh{i}" for i in itertools.count()))
    monkeypatch.setattr(agent, "temp_name", lambda name: f".{name}.{next(names)}.tmp")
    os.link(precious, tmp_path / ".out.json.planted.tmp")
    out = agent.OutputFile(tmp_path / "out.json", None)
    out.write(b"{}\n", durable=True)
    assert (
        precious.read_bytes() == b"precious\n" and (tmp_path / "out.json").read_bytes() == b"{}\n"
    )


@needs_root
def test_resume_never_replaces_another_users_transcript(capsys, workdir, shared, recorded):
    """--resume goes on in the file it continues, unless that file is another user's: then
    one line says to give --transcript, and the file is left as it was."""
    theirs = shared / "run.json"
    shutil.copy(recorded, theirs)
    os.chown(theirs, NOBODY, NOBODY)
    before = theirs.read_bytes()
    client = FakeClient(reply(text("more")))
    code, _, err = run_cli(
        capsys, ["--resume", str(theirs), "go on", "--workdir", str(workdir)], client
    )
    assert (code, client.requests, theirs.read_bytes()) == (2, [], before), err
    assert "belongs to another user" in err and "--transcript" in err
    mine = shared / "mine.json"
    code, _, err = run_cli(
        capsys,
        ["--resume", str(theirs), "go on", "--workdir", str(workdir), "--transcript", str(mine)],
        client,
    )
    assert code == 0 and theirs.read_bytes() == before and b"more" in mine.read_bytes(), err


# --- a file of agent.py's checkout is replaced only by its own kind (old #21) ---


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """agent.py's directory, as a clone has it: files the project needs beside agent.py."""
    root = tmp_path / "checkout"
    (root / "tests").mkdir(parents=True)
    shutil.copy(AGENT, root / "agent.py")
    (root / "requirements.txt").write_text("anthropic>=0.40\npython-dotenv\n")
    (root / "README.md").write_text("# agent.py\n")
    (root / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    monkeypatch.setattr(agent, "__file__", str(root / "agent.py"))
    return root


def test_a_fifo_in_the_checkout_with_nothing_written_yet_is_not_replaced():
    """Review: the checkout's check read a file's start through a buffered reader, which gives
    None, not BlockingIOError, for a FIFO whose writer has written nothing, and so let it be
    replaced (a file swapped for a FIFO after its stat). It is refused, as unreadable files are."""
    home = Path(agent.__file__).resolve().parent
    fifo = home / f".review-fifo-{os.getpid()}"
    os.mkfifo(fifo)
    dir_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    writer = None
    try:
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        writer = os.open(fifo, os.O_WRONLY)
        os.close(reader)
        with pytest.raises(agent.UsageError, match="did not write"):
            agent.check_not_the_checkouts(fifo, "--events", fifo.name, dir_fd)
    finally:
        if writer is not None:
            os.close(writer)
        os.close(dir_fd)
        fifo.unlink()


@pytest.mark.parametrize("flag", ["--events", "--transcript", "--report -o", "--export -o"])
@pytest.mark.parametrize("victim", ["requirements.txt", "README.md", "tests/test_x.py"])
def test_an_output_never_replaces_a_file_of_agent_pys_checkout(
    capsys, workdir, tmp_path, checkout, flag, victim
):
    """`--events requirements.txt` (one tab-completion away from `run.json`) turned the
    project's requirements into JSON Lines, exit 0. In agent.py's own directory tree an output
    replaces only a file agent.py writes (a transcript, trials summary, events, report or
    export) or an empty one: one line, exit 2, the file's bytes unchanged."""
    target = checkout / victim
    before = target.read_bytes()
    if flag in ("--events", "--transcript"):
        argv = ["q", "--workdir", str(workdir), "--no-keep", flag, str(target)]
    else:
        run = tmp_path / "run.json"
        assert (
            run_cli(
                capsys,
                ["q", "--workdir", str(workdir), "--no-keep", "--transcript", str(run)],
                FakeClient(reply(text("42"))),
            )[0]
            == 0
        )
        argv = [
            flag.split()[0],
            *(["atif"] if flag.startswith("--export") else []),
            str(run),
            "-o",
            str(target),
        ]
    client = FakeClient(reply(text("42")))
    code, out, err = run_cli(capsys, argv, client)
    assert target.read_bytes() == before, f"{victim} was replaced"
    assert code == 2 and client.requests == [] and err.count("\n") == 1, err
    assert err.startswith("agent.py: ") and str(target) in err and "agent.py's" in err, err


def test_agent_pys_own_outputs_in_its_checkout_are_replaced_as_before(capsys, workdir, checkout):
    """What agent.py wrote there before (a transcript, events), an empty file and a new name
    are written as before."""
    run, events, empty = checkout / "run.json", checkout / "run.jsonl", checkout / "out.json"
    empty.write_text("")
    for _ in range(2):  # the second time over the files the first wrote
        code, _, err = run_cli(
            capsys,
            [
                "q",
                "--workdir",
                str(workdir),
                "--no-keep",
                "--transcript",
                str(run),
                "--events",
                str(events),
            ],
            FakeClient(reply(text("42"))),
        )
        assert code == 0, err
    assert json.loads(run.read_text())["answer"] == "42"
    assert json.loads(events.read_text().splitlines()[0])["type"] == "run.start"
    for name in ("report", "export"):
        argv = (
            ["--report", str(run), "-o", str(empty)]
            if name == "report"
            else ["--export", "atif", str(run), "-o", str(empty)]
        )
        for _ in range(2):
            code, _, err = run_cli(capsys, argv)
            assert code == 0, err
        empty.write_text("")
