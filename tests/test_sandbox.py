"""run_python's boundary: Landlock + seccomp, clean environment, bounded time and output."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import agent
from fakes import FakeClient, alive, reply, text, tool_use
from test_agent import final_messages, run


def landlock_abi():
    if sys.platform != "linux" or agent.platform.machine() not in agent.SYSCALLS:
        return 0
    return agent.landlock_abi(agent.libc_call())[0]


needs_landlock = pytest.mark.skipif(landlock_abi() < 4, reason="needs Landlock ABI >= 4 (Linux)")


@pytest.fixture
def box(workdir):
    sandbox = agent.make_sandbox(Path(os.path.realpath(workdir)), True, 30)
    yield sandbox
    sandbox.close()


def execute(box, workdir, code, timeout=20, chars=30_000, cancel=None):
    return agent.execute(code, Path(os.path.realpath(workdir)), box, timeout, chars, cancel)


# --- the boundary, from outside: a model-written script under --yes ---

def run_script(capsys, workdir, code):
    """What one run_python call under --yes sends back to the model."""
    client = FakeClient(reply(tool_use("run_python", {"code": code})), reply(text("ok")))
    exit_code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--yes"], client)
    assert exit_code == 0
    return final_messages(client)[-1]["content"][0], err


@needs_landlock
@pytest.mark.parametrize("code", [
    "print(open('/etc/passwd').read())",
    "print(open('../secret.txt').read())",
    "import os; print(os.listdir('/'))",
    "open('../planted.txt', 'w').write('x')",
    "import os; os.symlink('../secret.txt', 'link'); print(open('link').read())",
    "import os; os.chmod('/usr/bin/env', 0o777)",
    "import os; print(os.stat('..')); os.rename('scores.csv', '../stolen.csv')",
    "import os; os.link('../secret.txt', 'hard'); print(open('hard').read())",
], ids=["etc-passwd", "parent-secret", "list-root", "write-outside", "symlink-out", "chmod",
        "move-out", "hard-link-in"])
def test_scripts_cannot_reach_outside_the_workdir(capsys, workdir, code):
    result, err = run_script(capsys, workdir, code)
    assert result["is_error"] and any(refusal in result["content"] for refusal in (
        "PermissionError", "Operation not permitted", "Invalid cross-device link"))
    assert "top secret" not in result["content"]
    assert not (workdir.parent / "planted.txt").exists()
    assert not (workdir.parent / "stolen.csv").exists()
    assert "sandbox: landlock ABI" in err


@needs_landlock
def test_tcp_to_a_local_port_is_refused(capsys, workdir):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        result, _ = run_script(capsys, workdir, (
            "import socket\ns = socket.create_connection(('127.0.0.1', %d), timeout=2)\n"
            "print('connected')" % port))
    finally:
        server.close()
    assert result["is_error"] and "connected" not in result["content"].split("stderr")[0]
    assert "PermissionError" in result["content"]


@needs_landlock
def test_signals_to_the_agent_and_new_sessions_are_refused(box, workdir):
    run = execute(box, workdir, f"import os\ntry:\n    os.kill({os.getpid()}, 0)\n"
                                "except PermissionError:\n    print('kill refused')\n"
                                "try:\n    os.setsid()\nexcept PermissionError:\n"
                                "    print('setsid refused')\n")
    assert "kill refused" in run.stdout and "setsid refused" in run.stdout


@needs_landlock
def test_ordinary_work_still_runs(box, workdir):
    code = """
import csv, json, os, statistics, subprocess, threading, sqlite3, zipfile
rows = list(csv.DictReader(open('scores.csv')))
scores = [int(r['score']) for r in rows]
out = {'mean': statistics.mean(scores), 'stdev': round(statistics.stdev(scores), 3)}
with open('result.json', 'w') as f:
    json.dump(out, f)
os.makedirs('sub', exist_ok=True)
os.rename('result.json', 'sub/result.json')
t = threading.Thread(target=lambda: out.update(thread=True)); t.start(); t.join()
out['ls'] = subprocess.run(['ls'], capture_output=True, text=True).stdout.split()
out['sh'] = subprocess.run('echo a | tr a b', shell=True, capture_output=True, text=True).stdout
sqlite3.connect('db.sqlite').execute('create table t (x)')
zipfile.ZipFile('z.zip', 'w').writestr('a.txt', 'a')
import tempfile; tempfile.NamedTemporaryFile().write(b'x')
print(json.dumps(out))
"""
    run = execute(box, workdir, code)
    assert run.code == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["mean"] == 85 and out["stdev"] == 11.79 and out["thread"] is True
    assert "scores.csv" in out["ls"] and out["sh"] == "b\n"
    assert json.loads((workdir / "sub" / "result.json").read_text())["mean"] == 85


@needs_landlock
def test_multiprocessing_with_spawn_works(box, workdir):
    run = execute(box, workdir, "import multiprocessing as mp\n"
                                "if __name__ == '__main__':\n"
                                "    mp.set_start_method('spawn')\n"
                                "    with mp.Pool(2) as pool:\n"
                                "        print(pool.map(abs, [-1, -2]))\n")
    assert run.code == 0 and run.stdout == "[1, 2]\n", run.stderr


@needs_landlock
def test_numpy_works_where_installed(box, workdir):
    pytest.importorskip("numpy")
    run = execute(box, workdir, "import numpy as np; print(np.std([88, 72, 95]))")
    assert run.code == 0 and run.stdout.startswith("9.6"), run.stderr


# --- startup: detection, self-test, approval policy ---

@needs_landlock
def test_startup_line_names_the_boundary(box):
    assert box.confined
    assert box.status.startswith(f"sandbox: landlock ABI {landlock_abi()} (fs, tcp")
    assert box.status.endswith("+ seccomp")


def test_no_sandbox_says_so_and_yes_runs_without_asking(capsys, workdir):
    client = FakeClient(reply(tool_use("run_python", {"code": "print(1)"})), reply(text("ok")))
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox"], client)
    assert code == 0 and "sandbox: off (--no-sandbox)" in err and "[y/N]" not in err


@pytest.mark.parametrize("abi, why", [((0, "the kernel has no Landlock"), "no Landlock"),
                                      ((3, ""), "ABI 3 cannot block TCP")])
def test_without_a_working_sandbox_yes_still_asks(capsys, workdir, monkeypatch, abi, why):
    if sys.platform != "linux":
        pytest.skip("Linux detection path")
    monkeypatch.setattr(agent, "landlock_abi", lambda libc: abi)
    client = FakeClient(reply(tool_use("run_python", {"code": "open('ran', 'w')"})),
                        reply(text("ok")))
    code, _, err = run(capsys, ["q", "--workdir", str(workdir), "--yes"], client, stdin="n\n")
    assert code == 0 and "sandbox: unavailable" in err and why in err
    assert "[y/N]" in err and not (workdir / "ran").exists()


@needs_landlock
def test_self_test_catches_a_sandbox_that_lets_reads_through(workdir, monkeypatch):
    monkeypatch.setattr(agent, "READ_ONLY_FILES", agent.READ_ONLY_FILES + ("/tmp",))
    monkeypatch.setattr(agent.tempfile, "tempdir", "/tmp")
    box = agent.make_sandbox(Path(os.path.realpath(workdir)), True, 30)
    assert not box.confined and "read a file outside" in box.status


def test_seccomp_program_shape():
    prog = agent.seccomp_filter("x86_64", allow_unix_sockets=False)
    assert len(prog) % 8 == 0 and len(prog) // 8 < 256  # jumps are 8-bit
    for i in range(0, len(prog), 8):
        code, jt, jf, k = agent.struct.unpack("HBBI", prog[i:i + 8])
        assert code in (0x20, 0x15, 0x35, 0x06)
        if code in (0x15, 0x35):
            assert i // 8 + 1 + max(jt, jf) < len(prog) // 8  # every jump lands inside


# --- environment, time, output ---

def test_child_env_is_an_allowlist(monkeypatch, tmp_path):
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY",
                 "DB_PASSWORD", "SSH_AUTH_SOCK", "LD_PRELOAD", "PYTHONPATH", "LC_API_KEY"):
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("LC_TIME", "C")
    env = agent.child_env(str(tmp_path))
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "LC_TIME", "TZ", "USER",
                        "LOGNAME", "HOME", "TMPDIR", "TEMP", "TMP", "PYTHONNOUSERSITE",
                        "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "MPLBACKEND"}
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path) and env["LC_TIME"] == "C"


def test_the_private_temp_dir_is_private(box):
    assert os.stat(box.tmpdir).st_mode & 0o777 == 0o700


def test_stdin_is_empty_and_rlimits_are_set(box, workdir):
    run = execute(box, workdir, "import resource, sys\nprint(repr(sys.stdin.read()))\n"
                                "print(resource.getrlimit(resource.RLIMIT_AS)[0] >> 30,\n"
                                "      resource.getrlimit(resource.RLIMIT_CORE),\n"
                                "      resource.getrlimit(resource.RLIMIT_FSIZE)[0] >> 30,\n"
                                "      resource.getrlimit(resource.RLIMIT_CPU)[0])")
    assert run.stdout.split("\n")[:2] == ["''", "4 (0, 0) 1 35"]


def test_timeout_kills_the_whole_group(box, workdir):
    code = ("import subprocess, time\n"
            "p = subprocess.Popen(['sleep', '60'])\n"
            "open('child.pid', 'w').write(str(p.pid))\n"
            "time.sleep(60)\n")
    started = time.monotonic()
    run = execute(box, workdir, code, timeout=1)
    assert run.timed_out and time.monotonic() - started < 5
    assert not alive(int((workdir / "child.pid").read_text()))


def test_a_grandchild_left_running_dies_when_the_script_exits(box, workdir):
    code = ("import subprocess\n"
            "p = subprocess.Popen(['sleep', '60'])\n"
            "open('child.pid', 'w').write(str(p.pid))\n")
    started = time.monotonic()
    run = execute(box, workdir, code)
    assert run.code == 0 and time.monotonic() - started < 5
    time.sleep(0.1)
    assert not alive(int((workdir / "child.pid").read_text()))


def test_cancel_kills_a_running_script(box, workdir):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(agent.Interrupted):
        execute(box, workdir, "import time; time.sleep(60)", cancel=cancel)
    assert time.monotonic() - started < 3


def test_big_output_keeps_head_and_tail_and_says_what_was_cut(box, workdir):
    code = "import sys\nfor i in range(200000):\n    print(f'line {i:06d}')\n"
    run = execute(box, workdir, code)
    assert run.stdout.startswith("line 000000\n") and run.stdout.endswith("line 199999\n")
    assert "bytes cut" in run.stdout and len(run.stdout) < 15_100


def test_50_mb_of_output_does_not_grow_the_agents_memory(workdir, tmp_path):
    probe = f"""
import os, resource, sys
sys.path.insert(0, {str(Path(agent.__file__).parent)!r})
import agent
from pathlib import Path
wd = Path({str(os.path.realpath(workdir))!r})
box = agent.make_sandbox(wd, False, 30)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run = agent.execute("import sys\\nblock = 'x' * 1023 + '\\\\n'\\nfor _ in range(50 * 1024):\\n    sys.stdout.write(block)\\n", wd, box, 60, 30000)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(after - before, len(run.stdout), run.stdout.count('bytes cut'))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    grown_kb, kept, notes = map(int, done.stdout.split())
    assert notes == 1 and kept < 15_100
    assert grown_kb < 10_000, f"peak RSS grew {grown_kb} KB while 50 MB went through"
