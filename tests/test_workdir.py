"""What a workdir may be (issue 33): a directory of ordinary data on an ordinary filesystem.

Each attack below is what a root script did with the kernel's interfaces as its workdir. The
rule refuses such a workdir before anything is sent or run: each test runs the CLI with a model
that asks for the attack, and checks exit 2, one line naming the rule, and the target unchanged.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import FakeClient, reply, text, tool_use
from helpers import agent_env, run_cli, serve

import agent

TOKEN = f"agent-test-{os.getpid()}"


def block_device():
    for path in sorted(Path("/dev").iterdir()):
        if path.is_block_device():
            return str(path)
    return None


def cgroup_procs():
    for path in ("/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/unified/cgroup.procs"):
        if os.path.exists(path):
            return path
    return None


# (workdir, the file the attack writes, the attack's code); a harmless value where the write
# would change the machine (core_pattern is restored after the test if it ever changed).
ATTACKS = {
    "core_pattern": (
        "/proc",
        "/proc/sys/kernel/core_pattern",
        f"open('sys/kernel/core_pattern', 'w').write('core.{TOKEN}')",
    ),
    "cgroup.procs": (
        "/sys",
        cgroup_procs(),
        f"import os  # {TOKEN}\nopen({str(cgroup_procs())!r}, 'w').write(str(os.getpid()))",
    ),
    "kmsg": ("/dev", "/dev/kmsg", f"open('kmsg', 'w').write('{TOKEN}\\n')"),
    "a block device": (
        "/dev",
        block_device(),
        f"fd = open({str(block_device())!r}, 'r+b')\nprint('{TOKEN} opened')",
    ),
}


def refused(code, err, client):
    """The refusal the user sees: exit 2, one line naming the rule, nothing sent."""
    assert (code, client.requests) == (2, []), err
    assert err.startswith("agent.py: ") and err.count("\n") == 1, err
    assert "a workdir must be a directory of ordinary data" in err and "Traceback" not in err


def content(path):
    """What a reader sees in `path` now (the kernel log: the lines that carry TOKEN)."""
    if path == "/dev/kmsg":
        done = subprocess.run(["dmesg"], capture_output=True, text=True)
        return [line for line in done.stdout.splitlines() if TOKEN in line]
    if path.endswith("cgroup.procs"):  # processes come and go: the attack's would carry TOKEN
        found = []
        for pid in Path(path).read_text().split():
            try:
                found += [pid] if TOKEN in Path(f"/proc/{pid}/cmdline").read_text("latin-1") else []
            except OSError:  # it ended since
                continue
        return found
    with open(path, "rb") as f:
        return f.read(4096)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_kernel_interface_as_the_workdir_is_refused_and_nothing_is_written(capsys, attack):
    workdir, target, code = ATTACKS[attack]
    if target is None or not os.access(target, os.W_OK):
        pytest.skip(f"{target or attack} is not writable here: the kernel forbids it anyway")
    if attack == "kmsg" and not shutil.which("dmesg"):
        pytest.skip("no dmesg to read the kernel log with")
    before = content(target)
    client = FakeClient(reply(tool_use("run_python", {"code": code})), reply(text("ok")))
    try:
        exit_code, _, err = run_cli(capsys, ["q", "-C", workdir, "--yes", "--no-keep"], client)
    finally:
        after = content(target)
        if attack == "core_pattern" and after != before:
            Path(target).write_bytes(before)
    assert after == before, f"the attack wrote {target}: {after!r}"
    refused(exit_code, err, client)
    assert "kernel filesystem" in err, err


def test_a_kernel_filesystem_mounted_below_an_ordinary_directory_is_refused(
    request, tmp_path, agent_copy
):
    """proc mounted at data/p (as a container runtime or a bind mount would): the workdir data
    is ordinary, but the script could write data/p/sys/kernel/core_pattern."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) to mount proc in a private mount namespace")
    workdir = tmp_path / "data"
    (workdir / "p").mkdir(parents=True)
    target = "/proc/sys/kernel/core_pattern"
    before = Path(target).read_bytes()
    attack = f"open('p/sys/kernel/core_pattern', 'w').write('core.{TOKEN}')"
    api = serve(request, reply(tool_use("run_python", {"code": attack})), reply(text("ok")))
    script = 'mount --make-rprivate / && mount -t proc proc "$1" && shift && exec "$@"'
    argv = [sys.executable, str(agent_copy), "q", "-C", str(workdir), "--yes", "--no-keep"]
    try:
        done = subprocess.run(
            ["unshare", "--mount", "sh", "-c", script, "sh", str(workdir / "p"), *argv],
            capture_output=True,
            text=True,
            env=agent_env(api),
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
    finally:
        after = Path(target).read_bytes()
        if after != before:
            Path(target).write_bytes(before)
    assert after == before, f"the attack wrote {target}: {after!r}"
    if "mount" in done.stderr and done.returncode not in (0, 2):
        pytest.skip(f"cannot mount proc here: {done.stderr.strip()}")
    assert (done.returncode, api.requests) == (2, []), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"has mounted at {workdir / 'p'} a kernel filesystem (proc)" in done.stderr


@pytest.mark.parametrize(
    "workdir", ["/var", "/boot", "/run", "/srv", "/opt", "/mnt", "/home", "/usr/lib", "/tmp"]
)
def test_a_tree_the_system_runs_from_or_all_users_share_is_refused(capsys, workdir):
    if not os.path.isdir(workdir):
        pytest.skip(f"no {workdir} here")
    probe = Path(workdir) / f".{TOKEN}"
    attack = f"open({str(probe)!r}, 'w').write('planted')"
    client = FakeClient(reply(tool_use("run_python", {"code": attack})), reply(text("ok")))
    try:
        code, _, err = run_cli(capsys, ["q", "-C", workdir, "--yes", "--no-keep"], client)
        assert not probe.exists(), f"the attack wrote {probe}"
    finally:
        probe.unlink(missing_ok=True)
    refused(code, err, client)
    assert err.startswith(f"agent.py: --workdir {workdir} "), err


def test_from_tmp_the_refusal_names_the_rule_and_suggests_no_sample_data(capsys, monkeypatch):
    """Issue 34: from /tmp, the refusal suggested --workdir newcomer/agent/workspace."""
    monkeypatch.chdir("/tmp")
    client = FakeClient()
    code, _, err = run_cli(capsys, ["q"], client)
    refused(code, err, client)
    assert "is a directory all users share (/tmp)" in err and "workspace" not in err, err


def test_a_users_home_is_refused_and_a_directory_below_it_or_below_tmp_is_a_workdir(
    capsys, tmp_path, monkeypatch
):
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("HOME", str(home))
    client = FakeClient()
    code, _, err = run_cli(capsys, ["q", "-C", str(home)], client)
    refused(code, err, client)
    assert f"is a user's home ({home})" in err, err
    for workdir in (home / "project", tmp_path / "data"):
        client = FakeClient(
            reply(tool_use("run_python", {"code": "open('x', 'w')"})), reply(text("ok"))
        )
        code, out, err = run_cli(capsys, ["q", "-C", str(workdir), "--yes", "--no-keep"], client)
        assert (code, out) == (0, "ok\n"), err
        assert (workdir / "x").exists()


def test_with_no_sandbox_any_workdir_is_allowed(capsys):
    """A throwaway container's /proc is still no workdir to want, but the sandbox is what the
    rule protects: without it the code can write wherever agent.py can."""
    client = FakeClient(reply(text("ok")))
    code, out, err = run_cli(capsys, ["q", "-C", "/proc", "--no-sandbox", "--no-keep"], client)
    assert (code, out) == (0, "ok\n"), err
    assert agent.KERNEL_FILESYSTEMS >= {"proc", "sysfs", "devtmpfs", "cgroup2"}
