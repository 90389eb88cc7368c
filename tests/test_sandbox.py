"""Path safety and the sandbox: run_python's boundary attacked from outside; scripts still work."""

import contextlib
import ctypes
import errno
import json
import marshal
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import replace
from importlib.util import MAGIC_NUMBER
from pathlib import Path

import bpf
import pytest
from fakes import FakeClient, alive, reply, text, tool_use
from helpers import (
    AGENT,
    agent_env,
    as_other_users,
    call,
    final_messages,
    need_other_users,
    run_agent_py,
    run_cli,
    serve,
    tool_context,
)

import agent

MACHINE = agent.platform.machine()


def landlock_abi():
    if sys.platform != "linux" or MACHINE not in agent.ARCHES:
        return 0
    return agent.landlock_abi(agent.libc_call())[0]


ABI = landlock_abi()
needs_landlock = pytest.mark.skipif(
    ABI < 6, reason=f"needs Landlock ABI >= 6 on Linux (have {ABI})"
)
needs_root = as_other_users  # to also test as another user


def new_box(workdir, **limits):
    box = agent.Sandbox(Path(os.path.realpath(workdir)), True, agent.Limits(**limits))
    box.ready()
    return box


@pytest.fixture
def box(workdir):
    box = new_box(workdir)
    yield box
    box.close()  # its launcher


def execute(box, workdir, code, timeout=20, chars=30_000, cancel=None):
    return agent.execute(code, Path(os.path.realpath(workdir)), box, timeout, chars, cancel)


# --- path safety: what read_file opens is what it checked ---


@pytest.mark.parametrize("path", ["../secret.txt", "/etc/passwd", "sub/../../secret.txt"])
def test_read_file_refuses_paths_outside(ctx, path):
    result = call(ctx, "read_file", path=path)
    assert result["is_error"] and "outside the working directory" in result["content"]


def test_read_file_resolves_symlinks_before_the_check(ctx):
    (ctx.workdir / "link").symlink_to("/etc/passwd")
    (ctx.workdir / "inner").symlink_to(ctx.workdir / "scores.csv")
    assert "outside" in call(ctx, "read_file", path="link")["content"]
    assert "Alice" in call(ctx, "read_file", path="inner")["content"]


SWAPPER = """
import os, sys, time
d, parked, outside = sys.argv[1:]
ends, swaps = time.monotonic() + 2, 0
while time.monotonic() < ends:  # d is, in turn, the real directory and a symlink out
    os.rename(d, parked)
    os.symlink(outside, d)
    os.unlink(d)
    os.rename(parked, d)
    swaps += 1
print(swaps)
"""


def test_a_directory_swapped_for_a_symlink_never_leaks_a_file_outside(workdir, tmp_path):
    (workdir / "d").mkdir()
    (workdir / "d" / "f.txt").write_text("inside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("SECRET\n")
    ctx = tool_context(workdir, tmp_path)
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(workdir / "d"), str(workdir / "parked"), str(outside)],
        stdout=subprocess.PIPE,
        text=True,
    )  # another process, as a concurrent trial's script
    seen = []
    while swapper.poll() is None:
        seen.append(call(ctx, "read_file", path="d/f.txt")["content"])
    swaps = int(swapper.stdout.read())
    assert swaps > 300 and len(seen) > 300, "the race never ran"
    assert not [s for s in seen if "SECRET" in s]
    assert any("inside" in s for s in seen)


@pytest.mark.parametrize(
    "path, fragment",
    [
        ("a\0b", "not a usable path"),
        ("x" * 5000, "File name too long"),
        ("scores.csv/inner", "Not a directory"),
        ("loop/x", "Too many levels of symbolic links"),
        ("..", "outside the working directory"),
        ("", "not a usable path"),
        ("/", "outside the working directory"),
    ],
)
def test_every_bad_path_is_a_tool_error(workdir, tmp_path, path, fragment):
    (workdir / "loop").symlink_to("loop")
    result = call(tool_context(workdir, tmp_path), "read_file", path=path)
    assert result["is_error"] and fragment in result["content"], result["content"]
    assert "internal tool error" not in result["content"]


# --- files and sockets: a model-written script under --yes ---


def run_script(capsys, workdir, code):
    """What one run_python call under --yes sends back to the model."""
    client = FakeClient(reply(tool_use("run_python", {"code": code})), reply(text("ok")))
    exit_code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--yes"], client)
    assert exit_code == 0
    return final_messages(client)[-1]["content"][0], err


@needs_landlock
@pytest.mark.parametrize(
    "code",
    [
        "print(open('/etc/passwd').read())",
        "print(open('../secret.txt').read())",
        "import os; print(os.listdir('/'))",
        "open('../planted.txt', 'w').write('x')",
        "import os; os.symlink('../secret.txt', 'link'); print(open('link').read())",
        "import os; os.chmod('/usr/bin/env', 0o777)",
        "import os; print(os.stat('..')); os.rename('scores.csv', '../stolen.csv')",
        "import os; os.link('../secret.txt', 'hard'); print(open('hard').read())",
        "import os, sys; print(os.listdir(sys.prefix))",  # the venv's root: pip.conf, tokens
        "import os, sys; print(open(os.path.join(os.path.dirname(sys.executable), 'activate')).read())",
    ],
    ids=[
        "etc-passwd",
        "parent-secret",
        "list-root",
        "write-outside",
        "symlink-out",
        "chmod",
        "move-out",
        "hard-link-in",
        "venv-root",
        "venv-bin",
    ],
)
def test_scripts_cannot_reach_outside_the_workdir(capsys, workdir, code):
    result, err = run_script(capsys, workdir, code)
    assert result["is_error"] and any(
        refusal in result["content"]
        for refusal in ("PermissionError", "Operation not permitted", "Invalid cross-device link")
    )
    assert "top secret" not in result["content"]
    assert not (workdir.parent / "planted.txt").exists()
    assert not (workdir.parent / "stolen.csv").exists()
    assert "sandbox: landlock ABI" in err


@needs_landlock
def test_tcp_to_a_local_port_is_refused(capsys, workdir):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        result, _ = run_script(
            capsys,
            workdir,
            (
                "import socket\ns = socket.create_connection(('127.0.0.1', %d), timeout=2)\n"
                "print('connected')" % port
            ),
        )
    finally:
        server.close()
    assert result["is_error"] and "connected" not in result["content"].split("stderr")[0]
    assert "PermissionError" in result["content"]


# --- every route that is not a file or a socket: the probe and its errnos ---

PROBE = r"""
import ctypes, errno, json, os, socket, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
NR, AGENT, out = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {NR}, {AGENT}, {{}}
L = lambda v: ctypes.c_long(v) if isinstance(v, int) else v

def sc(name, *args):
    nr = NR.get(name) if isinstance(name, str) else name
    if nr is None:
        return "n/a"
    r = libc.syscall(ctypes.c_long(nr), *map(L, args))
    if r == 0 and name == "clone":  # the filter let a clone through: the copy must not go on
        os._exit(0)
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]

def attempt(name, fn):
    try:
        out[name] = fn()
    except OSError as e:
        out[name] = errno.errorcode[e.errno]

def ioctl(fd, cmd, arg):
    r = libc.ioctl(fd, ctypes.c_ulong(cmd), arg)
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]

buf = ctypes.create_string_buffer(256)
limit = (ctypes.c_uint64 * 2)(1, 1)
attempt("reboot", lambda: sc("reboot", 0, 0, 0, None))  # bad magic: EINVAL if it got past
attempt("kexec_load", lambda: sc("kexec_load", 0, 0, None, 0))
attempt("init_module", lambda: sc("init_module", None, 0, b""))
attempt("finit_module", lambda: sc("finit_module", -1, b"", 0))
attempt("delete_module", lambda: sc("delete_module", b"no_such_module", 0))
attempt("mount", lambda: sc("mount", b"none", b"/nonexistent-agent-test", b"tmpfs", 0, None))
attempt("umount2", lambda: sc("umount2", b"/nonexistent-agent-test", 0))
attempt("pivot_root", lambda: sc("pivot_root", b"/nonexistent-a", b"/nonexistent-b"))
attempt("chroot", lambda: sc("chroot", b"/nonexistent-agent-test"))
attempt("swapon", lambda: sc("swapon", b"/nonexistent-agent-test", 0))
attempt("fsopen", lambda: sc("fsopen", b"no_such_fs", 0))
attempt("open_tree", lambda: sc("open_tree", -100, b"/nonexistent-agent-test", 0))
attempt("unshare_user", lambda: sc("unshare", 0x10000000))
attempt("unshare_mount", lambda: sc("unshare", 0x20000))
attempt("setns", lambda: sc("setns", -1, 0))
attempt("clone_newuser", lambda: sc("clone", 0x10000000 | 17, 0, 0, 0, 0))
attempt("clone_parent", lambda: sc("clone", 0x8000 | 17, 0, 0, 0, 0))
attempt("clone3", lambda: sc("clone3", None, 0))
attempt("settimeofday", lambda: sc("settimeofday", None, None))  # a no-op if it got past
attempt("clock_settime", lambda: sc("clock_settime", 0, None))
attempt("adjtimex", lambda: sc("adjtimex", None))
attempt("sethostname", lambda: sc("sethostname", None, -1))
attempt("syslog", lambda: sc("syslog", 10, None, 0))
attempt("acct", lambda: sc("acct", None))
attempt("iopl", lambda: sc("iopl", 3))
attempt("bpf", lambda: sc("bpf", 0, None, 0))
attempt("perf_event_open", lambda: sc("perf_event_open", None, 0, -1, -1, 0))
attempt("userfaultfd", lambda: sc("userfaultfd", 0))
attempt("fanotify_init", lambda: sc("fanotify_init", 0, 0))
attempt("inotify_add_watch", lambda: sc("inotify_add_watch", libc.inotify_init1(0), b"/", 1))
attempt("keyctl", lambda: sc("keyctl", 0, -3, 0))
attempt("add_key", lambda: sc("add_key", b"no_such_type", b"x", b"y", 1, -2))
attempt("request_key", lambda: sc("request_key", b"user", b"x", None, 0))
attempt("ptrace_agent", lambda: sc("ptrace", 16, AGENT, 0, 0))
attempt("process_vm_readv", lambda: sc("process_vm_readv", AGENT, buf, 1, buf, 1, 0))
attempt("kcmp", lambda: sc("kcmp", AGENT, os.getpid(), 0, 0, 0))
attempt("pidfd_open_agent", lambda: sc("pidfd_open", AGENT, 0))
attempt("prlimit_agent_cpu", lambda: sc("prlimit64", AGENT, 0, limit, None))
attempt("prlimit_agent_fsize", lambda: sc("prlimit64", AGENT, 1, limit, None))
attempt("prlimit_self", lambda: sc("prlimit64", 0, 7, None, buf))
attempt("setpriority_agent", lambda: sc("setpriority", 0, AGENT, 19))
attempt("setpriority_user", lambda: sc("setpriority", 2, 0, 19))
attempt("setpriority_self", lambda: sc("setpriority", 0, 0, 19))  # nicer: always allowed
attempt("ioprio_agent", lambda: sc("ioprio_set", 1, AGENT, (2 << 13) | 7))
attempt("affinity_agent", lambda: sc("sched_setaffinity", AGENT, 8, buf))
OWN = os.getpid() != int(os.readlink("/proc/self"))  # a PID namespace of the call's own, where
attempt("signal_agent", lambda: os.kill(AGENT, 0) or "ok")  # the agent has no pid
# its pid 1 is the call's own first process, which the kernel shields from the namespace's
# signals: were the SIGKILL taken, this probe would die with it (elsewhere, the machine's init)
attempt("signal_init", lambda: os.kill(1, 9 if OWN else 0) or ("shielded" if OWN else "ok"))
attempt("mknod_char", lambda: os.mknod("null", 0o600 | stat.S_IFCHR, os.makedev(1, 3)) or "ok")
attempt("mknod_block", lambda: os.mknod("disk", 0o600 | stat.S_IFBLK, os.makedev(7, 0)) or "ok")
attempt("mkfifo", lambda: os.mkfifo("fifo") or "ok")
flags = ctypes.c_uint(0)
readonly = os.open(os.__file__, os.O_RDONLY)
ioctl(readonly, 0x80086601, ctypes.byref(flags))  # FS_IOC_GETFLAGS, then set the same ones
attempt("chattr", lambda: ioctl(readonly, 0x40086602, ctypes.byref(flags)))
attempt("fssetxattr", lambda: ioctl(readonly, 0x401C5820, buf))
attempt("file_setattr", lambda: sc("file_setattr", -100, os.__file__.encode(), buf, 24, 0))
attempt("tiocsti", lambda: ioctl(0, 0x5412, b"x"))
attempt("msgget", lambda: sc("msgget", 0x4A61, 0))  # ENOENT if it got past
attempt("shmget", lambda: sc("shmget", 0x4A61, 4096, 0))
attempt("semget", lambda: sc("semget", 0x4A61, 1, 0))
attempt("mq_open", lambda: sc("mq_open", b"agent-test", 0, 0, None))
attempt("io_uring", lambda: sc("io_uring_setup", 1, buf))
attempt("open_by_handle_at", lambda: sc("open_by_handle_at", -100, buf, 0))
attempt("setsid", lambda: os.setsid() or "ok")
attempt("socket_inet", lambda: socket.socket(socket.AF_INET) and "ok")
attempt("socket_netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW) and "ok")
attempt("socket_unix", lambda: socket.socket(socket.AF_UNIX) and "ok")
attempt("socketpair", lambda: socket.socketpair() and "ok")
attempt("socketpair_dgram", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) and "ok")
attempt("socketpair_raw", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_RAW) and "ok")
attempt("socketpair_inet", lambda: sc("socketpair", 2, 1, 0, buf))
attempt("bind_abstract", lambda: socket.socketpair()[0].bind(b"\\0agent-test-squat") or "ok")
import fcntl
directory = os.open("/usr/lib", os.O_RDONLY)
attempt("dnotify", lambda: fcntl.fcntl(directory, 1026, 0x80000001) and "ok")
attempt("lease", lambda: fcntl.fcntl(readonly, 1024, fcntl.F_RDLCK) and "ok")
attempt("io_setup", lambda: sc("io_setup", 1, buf))
attempt("inotify_init1", lambda: sc("inotify_init1", 0))
mine = os.open("scores.csv", os.O_RDONLY)
attempt("enable_verity", lambda: ioctl(mine, 0x40806685, buf))
attempt("encryption_key", lambda: ioctl(mine, 0xC0506617, buf))
attempt("future_syscall", lambda: sc(470))
caps = (ctypes.c_uint32 * 6)()
libc.syscall(ctypes.c_long(NR["capget"]), (ctypes.c_uint32 * 2)(0x20080522, 0), caps)
out["capabilities"] = list(caps)
out["bounding"] = sum(libc.prctl(23, ctypes.c_ulong(c), 0, 0, 0) == 1 for c in range(64))
out["ambient"] = sum(libc.prctl(47, ctypes.c_ulong(1), ctypes.c_ulong(c), 0, 0) == 1 for c in range(64))
out["no_new_privs"] = libc.prctl(39, 0, 0, 0, 0)
out["own_namespace"] = OWN
print(json.dumps(out))
"""

REFUSED = {  # route -> the errno that says the sandbox stopped it
    **dict.fromkeys(
        "reboot kexec_load init_module finit_module delete_module mount umount2 pivot_root chroot "
        "swapon fsopen open_tree unshare_user unshare_mount setns clone_newuser clone_parent "
        "settimeofday clock_settime adjtimex sethostname syslog acct bpf perf_event_open "
        "userfaultfd fanotify_init inotify_add_watch keyctl add_key request_key ptrace_agent "
        "process_vm_readv kcmp pidfd_open_agent prlimit_agent_cpu prlimit_agent_fsize "
        "setpriority_agent setpriority_user ioprio_agent affinity_agent signal_agent signal_init "
        "mknod_char mknod_block chattr fssetxattr file_setattr tiocsti msgget shmget semget "
        "mq_open io_uring open_by_handle_at setsid dnotify lease io_setup inotify_init1 "
        "enable_verity encryption_key".split(),
        "EPERM",
    ),
    "iopl": "EPERM" if MACHINE == "x86_64" else "n/a",
    "clone3": "ENOSYS",  # so glibc falls back to clone, whose flags the filter reads
    "future_syscall": "ENOSYS",
    "socket_inet": "EACCES",
    "socket_netlink": "EACCES",
    "socket_unix": "EACCES",  # named unix sockets are open to Landlock only from ABI 9
    "socketpair_dgram": "EACCES",  # its sendto would reach /dev/log and the like
    "socketpair_raw": "EACCES",  # AF_UNIX makes SOCK_RAW a datagram pair too
    "socketpair_inet": "EACCES",  # no other family, nor the kernel module it would load
    "bind_abstract": "EACCES",  # squatting a name the host's programs use
}
STILL_ALLOWED = ("prlimit_self", "setpriority_self", "mkfifo", "socketpair")


def probe_code(workdir):  # the workdir must hold scores.csv
    column = agent.ARCHES[MACHINE][1]
    numbers = {name: nrs[column] for name, nrs in agent.SYSCALLS.items()}
    return PROBE.format(NR=repr(numbers), AGENT=os.getpid())


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """The probe's findings, run once as a model's script would run."""
    if ABI < 6:
        pytest.skip(f"needs Landlock ABI >= 6 on Linux (have {ABI})")
    wd = tmp_path_factory.mktemp("probe")
    (wd / "scores.csv").write_text("name,score\n")
    run = agent.execute(probe_code(wd), wd, new_box(wd), 30, 100_000)
    assert run.code == 0, run.stderr
    return json.loads(run.stdout)


def refused(probed, route):
    """The errno that says the route was stopped, or, where the call has a PID namespace of its
    own, what says that a signal could not reach its aim: the agent has no pid there (ESRCH),
    and the first process there ignores its namespace's signals ("shielded")."""
    if probed["own_namespace"] and route in ("signal_agent", "signal_init"):
        return {"signal_agent": "ESRCH", "signal_init": "shielded"}[route]
    return REFUSED[route]


@pytest.mark.parametrize("route", sorted(REFUSED))
def test_every_route_to_the_host_is_refused(probed, route):
    assert probed[route] == refused(probed, route)


@pytest.mark.parametrize("route", STILL_ALLOWED)
def test_the_same_calls_on_itself_still_work(probed, route):
    assert probed[route] == "ok"


def test_the_child_holds_no_capability(probed):
    assert probed["capabilities"] == [0] * 6  # effective, permitted, inheritable (both words)
    assert probed["bounding"] == 0 and probed["ambient"] == 0
    assert probed["no_new_privs"] == 1


def bounding_set(pid="self"):
    """A process's capability bounding set, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("CapBnd:")[1].split()[0], 16)


@needs_landlock
def test_roots_launcher_gives_up_its_bounding_set_once_every_call_is_confined(workdir):
    """Root's launcher drops its own capability bounding set once the self-test has passed, so
    each call's process inherits it empty (docs/benchmarks.md): not before, and not in a run
    without the sandbox, whose scripts keep root's."""
    if os.geteuid() != 0 or not bounding_set():
        pytest.skip("only root's launcher holds a bounding set to give up")
    # (a confined script cannot read /proc/self/status: it asks the kernel, cap by cap)
    show = "import ctypes\nlibc = ctypes.CDLL(None)\nprint(sum(libc.prctl(23, c, 0, 0, 0) == 1 for c in range(64)))"
    held = bin(bounding_set()).count("1")
    box = new_box(workdir)
    try:
        assert bounding_set(box.launcher.pid) == bounding_set(), "dropped before the self-test"
        run = execute(box, workdir, show)
        assert (run.code, run.stdout) == (0, "0\n"), run.stderr
        assert bounding_set(box.launcher.pid) == 0
    finally:
        box.close()
    open_box = agent.Sandbox(Path(os.path.realpath(workdir)), False, agent.Limits())
    try:
        run = execute(open_box, workdir, show)
        assert (run.code, run.stdout) == (0, f"{held}\n"), run.stderr
        assert bounding_set(open_box.launcher.pid) == bounding_set()
    finally:
        open_box.close()


@needs_root
@needs_landlock
def test_the_same_holds_when_the_agent_is_an_ordinary_user(as_nobody):
    """The probe again, with agent.py run as `nobody` by the system's own Python."""
    (as_nobody.dir / "scores.csv").write_text("name,score\n")
    ordinary_user_probe(as_nobody)


def ordinary_user_probe(as_nobody):
    python, nobody, wd = as_nobody.python, as_nobody.user, as_nobody.dir
    driver = (
        f"import sys, json; sys.path.insert(0, {str(as_nobody.agent_dir)!r})\n"
        "import agent\nfrom pathlib import Path\n"
        f"box = agent.Sandbox(Path({str(wd)!r}), True, agent.Limits())\n"
        "ok = box.ready()\n"
        "run = agent.execute(sys.stdin.read(), box.workdir, box, 30, 100_000)\n"
        "print(json.dumps({'status': box.status, 'ok': ok, 'run': run.stdout, 'err': run.stderr}))\n"
    )
    done = subprocess.run(
        [python, "-c", driver],
        input=probe_code(wd),
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ok"], result["status"]
    found = json.loads(result["run"])
    for route in REFUSED:
        if route not in (
            "ptrace_agent",
            "process_vm_readv",
            "kcmp",
            "pidfd_open_agent",
            "prlimit_agent_cpu",
            "prlimit_agent_fsize",
            "setpriority_agent",
            "ioprio_agent",
            "affinity_agent",
            "signal_agent",
        ):  # aimed at the test
            assert found[route] == refused(found, route), route
    assert found["capabilities"] == [0] * 6 and found["no_new_privs"] == 1


# --- the seccomp policy, for each architecture, without a kernel ---


@pytest.mark.parametrize("machine", sorted(agent.ARCHES))
def test_every_rule_answers_as_the_table_says(machine):
    arch, column = agent.ARCHES[machine]
    prog = agent.seccomp_filter(machine, agent.SECCOMP_RULES + agent.UNIX_SOCKET_RULES)
    for names, test, code, _why in agent.SECCOMP_RULES:
        for name in names.split():
            nr = agent.SYSCALLS[name][column]
            if nr is None:
                continue
            if test is None:
                assert bpf.run(prog, nr, arch) == ("errno", code), name
                continue
            arg, mask, op, value = test
            hit = [0] * 6
            hit[arg] = mask if op == "&" else value if op == "==" else value ^ 1
            assert bpf.run(prog, nr, arch, hit) == ("errno", code), (name, hit)


@pytest.mark.parametrize("machine", sorted(agent.ARCHES))
def test_the_filter_allows_the_harmless_forms(machine):
    arch, column = agent.ARCHES[machine]
    prog = agent.seccomp_filter(machine, agent.SECCOMP_RULES + agent.UNIX_SOCKET_RULES)
    nr = lambda name: agent.SYSCALLS[name][column]  # noqa: E731
    allowed = [
        ("clone", [17]),  # fork: SIGCHLD only
        ("clone", [0x003D0F00]),  # pthread_create's flags
        ("prlimit64", [0, 7]),
        ("setpriority", [0, 0, 5]),
        ("ioprio_set", [1, 0, 7]),
        ("sched_setaffinity", [0]),
        ("mknodat", [0, 0, 0o010644]),  # a FIFO
        ("ioctl", [0, 0x5401]),  # TCGETS: isatty()
        ("socket", [1]),
    ]  # AF_UNIX only as far as the caller allows it (below)
    for name, args in allowed[:-1]:
        assert bpf.run(prog, nr(name), arch, args) == ("allow",), name
    assert bpf.run(prog, {"x86_64": 39, "aarch64": 172}[machine], arch) == ("allow",)  # getpid
    assert bpf.run(prog, nr("socket"), arch, [1]) == ("errno", agent.EACCES)
    with_unix = agent.seccomp_filter(machine, agent.SECCOMP_RULES)
    assert bpf.run(with_unix, nr("socket"), arch, [1]) == ("allow",)
    assert bpf.run(with_unix, nr("socket"), arch, [2]) == ("errno", agent.EACCES)
    # only the low 32 bits count, as in the kernel: a high bit cannot smuggle a pid past it
    assert bpf.run(prog, nr("prlimit64"), arch, [1 << 32]) == ("allow",)
    assert bpf.run(prog, nr("prlimit64"), arch, [(1 << 32) | 5]) == ("errno", agent.EPERM)


@pytest.mark.parametrize("machine", sorted(agent.ARCHES))
def test_foreign_arches_die_and_unknown_numbers_get_enosys(machine):
    arch, _ = agent.ARCHES[machine]
    prog = agent.seccomp_filter(machine, agent.SECCOMP_RULES + agent.UNIX_SOCKET_RULES)
    assert bpf.run(prog, 0, 0x40000003) == ("kill",)  # i386 from a 64-bit process
    assert bpf.run(prog, agent.LAST_SYSCALL + 1, arch) == ("errno", agent.ENOSYS)
    assert bpf.run(prog, 0x40000000 | 1, arch) == ("errno", agent.ENOSYS)  # x32


@pytest.mark.parametrize("machine", sorted(agent.ARCHES))
def test_the_filter_finds_each_number_by_a_search_not_a_list(machine):
    """The kernel runs the filter for every syscall number when a call's process loads it (its
    cache of fixed answers): a search over the numbers decides each in at most 59 steps (the
    leaf with ioctl's 14 rules) where a list of every rule took up to 181, and loads in about
    half the time (docs/benchmarks.md)."""
    arch, _ = agent.ARCHES[machine]
    prog = agent.seccomp_filter(machine, agent.SECCOMP_RULES + agent.UNIX_SOCKET_RULES)
    steps = [bpf.walk(prog, nr, arch)[1] for nr in range(agent.LAST_SYSCALL + 1)]
    assert max(steps) <= 64, max(steps)


def test_each_table_line_names_known_syscalls():
    for names, _test, code, why in agent.SECCOMP_RULES:
        assert why and code in (agent.EPERM, agent.EACCES, agent.ENOSYS)
        for name in names.split():
            assert name in agent.SYSCALLS, name
    assert max(n for nrs in agent.SYSCALLS.values() for n in nrs if n) == agent.LAST_SYSCALL


# --- Landlock rights by ABI ---


@pytest.mark.parametrize(
    "abi, fs, net, scope",
    [
        (1, 0x1FFF, 0, 0),
        (2, 0x3FFF, 0, 0),
        (3, 0x7FFF, 0, 0),
        (4, 0x7FFF, 3, 0),
        (5, 0xFFFF, 3, 0),
        (6, 0xFFFF, 3, 3),
        (7, 0xFFFF, 3, 3),
        (8, 0xFFFF, 3, 3),
        (9, 0x1FFFF, 3, 3),
        (10, 0x1FFFF, 0xF, 3),
    ],
)
def test_handled_rights_follow_the_abi(abi, fs, net, scope):
    assert agent.rights(agent.LANDLOCK_FS, abi) == fs
    assert agent.rights(agent.LANDLOCK_NET, abi) == net
    assert agent.rights(agent.LANDLOCK_SCOPE, abi) == scope


@pytest.mark.parametrize("abi, unix", [(7, False), (9, True)])
def test_unix_sockets_are_allowed_only_where_landlock_handles_them(monkeypatch, workdir, abi, unix):
    if sys.platform != "linux" or MACHINE not in agent.ARCHES:
        pytest.skip("Linux policy")
    monkeypatch.setattr(agent, "landlock_abi", lambda libc: (abi, ""))
    box = agent.Sandbox(Path(os.path.realpath(workdir)), True, agent.Limits())
    box.plan()
    arch, column = agent.ARCHES[MACHINE]
    verdict = bpf.run(box.program.raw, agent.SYSCALLS["socket"][column], arch, [agent.AF_UNIX])
    assert bool(box.handled[0] & (1 << 16)) is unix
    assert verdict == (("allow",) if unix else ("errno", agent.EACCES))
    resolve_unix = agent.rights(agent.LANDLOCK_FS, abi, agent.READ_WRITE) & (1 << 16)
    assert bool(resolve_unix) is unix  # granted inside the workdir, where the script's own live


# --- nothing outlives the call ---

AFTER_A_CALL = """
import json, os, sys, time
sys.path.insert(0, sys.argv[2])
import agent
from pathlib import Path

def tree():
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            state, parent = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            found[int(proc.name)] = (int(parent), state, (proc / "cmdline").read_bytes())
        except (OSError, ValueError):
            continue
    return found

box = agent.Sandbox(Path(sys.argv[1]), True, agent.Limits())
box.ready()
run = agent.execute(sys.stdin.read(), box.workdir, box, 30, 1000)
launcher, deadline = box.launcher.pid, time.monotonic() + 10
while True:  # the launcher may still be reaping
    now = tree()
    mine = [(p, s) for p, (parent, s, _) in now.items() if parent == os.getpid()]
    below = [(p, s) for p, (parent, s, c) in now.items() if parent == launcher]
    if mine == [(launcher, "S")] and not below or time.monotonic() > deadline:
        break
    time.sleep(0.05)
print(json.dumps({"out": run.stdout, "mine": mine, "launcher": launcher, "below": below}))
"""


@needs_landlock
def test_after_a_call_the_agent_is_parent_of_its_launcher_alone(workdir):
    """The script's orphans (double forks, left zombies) are reaped by the launcher, their
    subreaper: after the call the agent's one child is its launcher, which has none left."""
    code = (
        "import os\n"
        "for _ in range(50):\n"
        "    if os.fork() == 0:\n"
        "        if os.fork() == 0:\n"
        "            os._exit(0)\n"  # an orphan, reparented and left a zombie
        "        os._exit(0)\n"
        "print('forked')"
    )
    done = subprocess.run(
        [sys.executable, "-c", AFTER_A_CALL, os.path.realpath(workdir), str(AGENT.parent)],
        input=code,
        capture_output=True,
        text=True,
        timeout=60,
    )
    seen = json.loads(done.stdout)
    assert seen["out"] == "forked\n", done.stderr
    assert seen["mine"] == [[seen["launcher"], "S"]], seen
    assert seen["below"] == [], seen


def agent_running(code, workdir):
    """An agent process whose run_python call runs `code`, once the script has written `info`."""
    driver = (
        f"import sys; sys.path.insert(0, {str(Path(agent.__file__).parent)!r})\n"
        "import agent\nfrom pathlib import Path\n"
        f"box = agent.Sandbox(Path({str(os.path.realpath(workdir))!r}), True, agent.Limits())\n"
        "box.ready()\n"
        f"agent.execute({code!r}, box.workdir, box, 60, 1000)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", driver])
    deadline = time.monotonic() + 30
    while not (workdir / "info").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, (workdir / "info").read_text().split()


def cgroups_of(pid):
    """The cgroup directories a process is in that agent.py made (agent-...)."""
    found = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if Path(path).name.startswith("agent-"):  # v1: one line per hierarchy; v2: "0::/path"
            found += [
                d
                for name in controllers.split(",")
                if (d := Path("/sys/fs/cgroup", name, path.lstrip("/"))).is_dir()
            ]
    return found


# A script's own pid (os.getpid()) is its PID namespace's; /proc is the machine's, so
# /proc/self names it as the tests see it
HOST_PID = 'int(os.readlink("/proc/self"))'


def parent_of(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def descendants(pid):
    """A process's descendants, by the machine's pids."""
    found, todo = [], [pid]
    while todo:
        found += (kids := children_of(todo.pop()))
        todo += kids
    return found


def launcher_of(pid):
    """The launcher above a script: its parent, or its namespace's first process's."""
    while b"agent_launcher" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        pid = parent_of(pid)
    return pid


SWAP_THE_CALL_DIRECTORY = """
import os
view = 'tmp'
mine = [d for d in os.listdir(view) if d.startswith('agent-call-')][0]
os.rename(os.path.join(view, mine), os.path.join(view, 'moved'))
os.symlink({outside!r}, os.path.join(view, mine))
print(mine)
"""


@needs_landlock
def test_a_call_directory_swapped_for_a_symlink_moves_nothing_outside(
    workdir, tmp_path, shared_tmp
):
    """Red-team (issue 32's attacker): the temp directory visible inside the workdir (an
    operator's bind mount, as schroot makes). The script moved its call's directory away and
    left a symlink to another directory in its place; the launcher, as root, then renamed that
    directory's `scratch` (before the report, by name). What the launcher does in the call's
    directory after the script goes through the directory's own descriptor: the outside
    `scratch` stays, and the moved directory is emptied."""
    outside = tmp_path / "outside"
    (outside / "scratch").mkdir(parents=True)
    (outside / "scratch" / "kept").write_text("precious")
    box = new_box(workdir)
    # (calls here are refused since 32.6: set aside, to attack the launcher's own defences)
    assert box.shown == workdir / "tmp"
    box.shown = None
    try:
        run = execute(box, workdir, SWAP_THE_CALL_DIRECTORY.format(outside=str(outside)))
    finally:
        box.close()
    assert run.code == 0 and run.stdout.startswith("agent-call-"), run.stderr
    assert sorted(os.listdir(outside)) == ["scratch"]
    assert (outside / "scratch" / "kept").read_text() == "precious"
    assert os.listdir(shared_tmp / "moved") == []  # emptied through its descriptor


def test_kill_9_of_the_agent_takes_the_script_and_its_traces_with_it(workdir, tmp_path):
    code = (
        "import os, subprocess, time\n"
        "kids = [subprocess.Popen(['sleep', '60']) for _ in range(3)]\n"
        f"open('info.tmp', 'w').write(os.environ['HOME'] + ' ' + str({HOST_PID}))\n"
        "os.rename('info.tmp', 'info')\n"
        "time.sleep(60)\n"
    )
    proc, (home, script) = agent_running(code, workdir)
    pids = [int(script), *descendants(int(script))]
    assert len(pids) == 4, pids
    cgroups = cgroups_of(pids[0])
    if agent.cgroup_parents():
        assert cgroups, "the script was in no cgroup of its call"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)]
    time.sleep(0.3)
    assert not os.path.exists(os.path.dirname(home)), "the call's directory outlived the agent"
    assert not [d for d in cgroups if d.exists()], "the call's cgroup outlived the agent"


def test_a_pkill_of_agent_py_hits_the_launcher_too_and_still_nothing_survives(workdir):
    """The launcher runs agent.py too: `pkill -f agent.py` signals both. It ignores the
    signal, sees the agent go, kills the group and cleans up."""
    code = (
        "import os, subprocess, time\n"
        "kid = subprocess.Popen(['sleep', '60'])\n"
        f"open('info.tmp', 'w').write(os.environ['HOME'] + ' ' + str({HOST_PID}))\n"
        "os.rename('info.tmp', 'info')\n"
        "time.sleep(60)\n"
    )
    proc, (home, script) = agent_running(code, workdir)
    launcher, (kid,) = launcher_of(int(script)), descendants(int(script))
    for pid in (proc.pid, launcher):
        os.kill(pid, signal.SIGTERM)
    proc.wait()
    deadline = time.monotonic() + 5
    while (alive(int(kid)) or os.path.exists(home)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(int(kid)) and not os.path.exists(os.path.dirname(home))


@needs_landlock
def test_kill_9_of_the_agent_and_its_launcher_at_once_leaves_nothing_running(
    workdir, tmp_path, monkeypatch
):
    """Red-team S2: `pkill -9 -f agent.py` kills the agent and the launcher together. The
    script dies with the launcher (PDEATHSIG), and before, what it had started ran on: a child,
    a grandchild, an orphan of a double fork. Now the call's PID namespace goes with it."""
    private = tmp_path / "tmp"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(private))  # what nobody is left to remove, removed below
    code = (
        "import os, subprocess, time\n"
        "kid = subprocess.Popen(['sh', '-c', 'sleep 60 & sleep 60'])\n"  # a grandchild too
        "if os.fork() == 0:\n"  # an orphan: its parent ends at once
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(1)\n"
        f"open('info.tmp', 'w').write(os.environ['HOME'] + ' ' + str({HOST_PID}))\n"
        "os.rename('info.tmp', 'info')\n"
        "time.sleep(60)\n"
    )
    proc, (home, script) = agent_running(code, workdir)
    launcher = launcher_of(int(script))
    started = [
        int(script),
        *descendants(int(script)),
        *[  # the orphan, and the namespace's
            p for p in children_of(parent_of(int(script))) if p != int(script)
        ],
    ]  # first, above it
    cgroups = cgroups_of(int(script))
    assert len(started) >= 5, started  # the script, sh, two sleeps, the orphan
    for pid in (proc.pid, launcher):  # what pkill -9 -f agent.py does
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while [p for p in started if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in started if alive(p)]
    for pid in left:  # (after the proof)
        os.kill(pid, signal.SIGKILL)
    for directory in cgroups:
        with contextlib.suppress(OSError):
            directory.rmdir()
    for name in os.listdir(private):
        agent.remove_tree(str(private / name))
    assert left == [], f"{len(left)} of the script's {len(started)} processes outlived both"


def test_only_the_kernels_refusal_turns_the_pid_namespace_off(monkeypatch):
    """Red-team S6: a task limit full for a moment (a container's, or one trial's script filling
    it) made the launcher's clone fail with EAGAIN, and fork_call gave up the PID namespace for
    the rest of the run: kill -9 of agent and launcher then left later calls' processes running
    again (S2). A passing want fails that call alone; EPERM or EINVAL turn it off."""

    class Refusing:  # the kernel's answer to the clone, whatever its errno
        def syscall(self, *args):
            return -1

    box, call = types.SimpleNamespace(pidns=True, libc=Refusing()), types.SimpleNamespace()
    monkeypatch.setattr(os, "fork", lambda: 4242)  # the plain fork it falls back to
    for want in (errno.EAGAIN, errno.ENOMEM):
        monkeypatch.setattr(ctypes, "get_errno", lambda want=want: want)
        with pytest.raises(OSError) as failed:
            agent.fork_call(box, call)
        assert failed.value.errno == want and box.pidns is True
    monkeypatch.setattr(ctypes, "get_errno", lambda: errno.EPERM)
    assert agent.fork_call(box, call) == 4242 and box.pidns is False


# --- the launcher: what a script may not do to it or to another call, and what its end leaves ---

AT_THE_LAUNCHER = r"""
import ctypes, errno, json, os, sys
libc, out = ctypes.CDLL(None, use_errno=True), {{}}
NR, launcher = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {NR}, {LAUNCHER}
L = lambda v: ctypes.c_long(v) if isinstance(v, int) else v

def sc(name, *args):
    r = libc.syscall(ctypes.c_long(NR[name]), *map(L, args))
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]

def attempt(name, fn):
    try:
        out[name] = fn()
    except OSError as e:
        out[name] = errno.errorcode[e.errno]

buf = ctypes.create_string_buffer(64)
attempt("signal", lambda: os.kill(launcher, 0) or "ok")
attempt("sigkill", lambda: os.kill(launcher, 9) or "ok")
attempt("group", lambda: os.killpg(os.getpgid(launcher), 0) or "ok")
attempt("ptrace", lambda: sc("ptrace", 16, launcher, 0, 0))
attempt("pidfd_open", lambda: sc("pidfd_open", launcher, 0))
attempt("process_vm_readv", lambda: sc("process_vm_readv", launcher, buf, 1, buf, 1, 0))
attempt("prlimit", lambda: sc("prlimit64", launcher, 7, None, buf))
attempt("mem", lambda: open(f"/proc/{{launcher}}/mem", "rb").read(1) and "ok")
attempt("environ", lambda: open(f"/proc/{{launcher}}/environ", "rb").read() and "ok")
attempt("fds", lambda: os.listdir(f"/proc/{{launcher}}/fd") and "ok")
attempt("fd0", lambda: os.readlink(f"/proc/{{launcher}}/fd/0") and "ok")
out["fds_held"] = [fd for fd in range(3, 4096) if not ctypes.CDLL(None).fcntl(fd, 1, 0) < 0]
out["launcher"] = launcher
out["own_namespace"] = os.getpid() != int(os.readlink("/proc/self"))
print(json.dumps(out))
"""


@needs_landlock
def test_a_script_cannot_reach_its_launcher(box, workdir):
    """The launcher is above the script (its parent, or its PID namespace's first process's): it
    may not be signalled (where the script has a PID namespace of its own, the launcher has no
    pid in it), traced, read (memory, environment, descriptors through /proc) or connected to,
    and the script holds no descriptor of it or of anything else but its own stdio. The launcher
    then serves the next call."""
    column = agent.ARCHES[MACHINE][1]
    numbers = {name: nrs[column] for name, nrs in agent.SYSCALLS.items()}
    run = execute(box, workdir, AT_THE_LAUNCHER.format(NR=repr(numbers), LAUNCHER=box.launcher.pid))
    assert run.code == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen.pop("launcher") == box.launcher.pid
    assert seen.pop("fds_held") == []
    unseen = "ESRCH" if seen.pop("own_namespace") else "EPERM"
    assert seen == {
        "signal": unseen,
        "sigkill": unseen,
        "group": unseen,
        "ptrace": "EPERM",
        "pidfd_open": "EPERM",
        "process_vm_readv": "EPERM",
        "prlimit": "EPERM",
        "mem": "EACCES",
        "environ": "EACCES",
        "fds": "EACCES",
        "fd0": "EACCES",
    }
    assert execute(box, workdir, "print('next')").stdout == "next\n"


@needs_landlock
def test_two_calls_at_once_keep_their_own_caps_and_cannot_signal_each_other(workdir):
    """Calls run at once through one Sandbox (trials): each has its own cgroup, so each may
    make its own 40 tasks, and neither can signal the other (nor the other's children)."""
    box = capped_box(workdir, max_tasks=40)
    code = (
        "import os, sys, time\n"
        "open(f'pid.{sys.argv[0][-20:].replace(\"/\", \"_\")}', 'w')"
        f".write(str({HOST_PID}))\n"
        "made = 0\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(6)\n"
        "            os._exit(0)\n"
        "        made += 1\n"
        "    except BlockingIOError:\n"
        "        break\n"
        "time.sleep(1)\n"  # both are now at their caps, and both still run
        "others = [int(open(p).read()) for p in os.listdir('.') if p.startswith('pid.')]\n"
        "refused = []\n"
        "for pid in others:\n"
        f"    if pid != {HOST_PID}:\n"
        "        try:\n"
        "            os.kill(pid, 9)\n"
        "        except (PermissionError, ProcessLookupError):\n"  # (not in its namespace)
        "            refused.append(pid)\n"
        "time.sleep(1)\n"  # still running while the other tries
        "print(made, len(others), len(refused))\n"
    )
    runs = {}
    threads = [
        threading.Thread(target=lambda i=i: runs.update({i: execute(box, workdir, code)}))
        for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seen = [runs[i].stdout.split() for i in range(2)]
    assert all(run.code == 0 for run in runs.values()), [r.stderr for r in runs.values()]
    for made, others, refused in seen:
        assert 30 <= int(made) < 40 and others == "2" and refused == "1", seen


LAUNCHER_KILLED = f"""
import os, subprocess, time
kids = [subprocess.Popen(['sleep', '60']) for _ in range(3)]
info = [os.environ['HOME'], {HOST_PID}]
open('info.tmp', 'w').write(' '.join(map(str, info)))
os.rename('info.tmp', 'info')
time.sleep(60)
"""


def test_the_launcher_killed_mid_call_leaves_nothing_running(workdir):
    """kill -9 of the launcher: the script dies with it (PDEATHSIG), the agent sees the call's
    socket close, kills what the script started and removes the call's directory and cgroup;
    the call ends at once, not at its timeout."""
    proc, (home, script) = agent_running(LAUNCHER_KILLED, workdir)
    launcher, pids = launcher_of(int(script)), [int(script), *descendants(int(script))]
    assert len(pids) == 4, pids
    cgroups = cgroups_of(pids[0])
    os.kill(int(launcher), signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)]
    assert proc.wait(timeout=10) == 0  # the call ended, long before its 60 s
    deadline = time.monotonic() + 5
    while (
        os.path.exists(os.path.dirname(home)) or any(d.exists() for d in cgroups)
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(os.path.dirname(home)), "the call's directory outlived the launcher"
    assert not [d for d in cgroups if d.exists()], "the call's cgroup outlived the launcher"


def test_the_launcher_killed_with_many_calls_running_leaves_no_directory(
    workdir, tmp_path, monkeypatch
):
    """S5: more calls at once (trials, --jobs) than the agent's note of what the launcher made
    holds (16): the launcher killed, each call removes its own directory and cgroups."""
    private = tmp_path / "tmp"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", None)
    box = new_box(workdir)
    n, runs = 20, []
    code = f"import os, time\nopen(f'up.{{{HOST_PID}}}', 'w').close()\ntime.sleep(60)\n"
    threads = [
        threading.Thread(target=lambda: runs.append(execute(box, workdir, code, 90, 1000)))
        for _ in range(n)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(list(workdir.glob("up.*"))) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    groups = {d for up in workdir.glob("up.*") for d in cgroups_of(int(up.name[3:]))}
    os.kill(box.launcher.pid, signal.SIGKILL)
    for t in threads:
        t.join()
    deadline = time.monotonic() + 8
    while (
        os.listdir(private) or [d for d in groups if d.exists()]
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    left, kept = os.listdir(private), [d for d in groups if d.exists()]
    box.close()
    for d in kept:  # (after the proof: what the agent forgot, if it is still there)
        with contextlib.suppress(OSError):
            d.rmdir()
    assert len(runs) == n and left == [], f"{len(left)} calls' directories outlived the launcher"
    assert kept == [], f"{len(kept)} calls' cgroups outlived the launcher"


def test_after_its_launcher_is_killed_a_call_is_refused_in_one_line(box, workdir):
    """Killed as the self-test's first note comes, the launcher is making the child of the call
    after the self-test's last, whose directory and cgroups it has not noted yet: the agent
    finds them by the run's tag (before, they stayed, and the session's nothing-left check
    failed, 3 runs of 3)."""
    deadline = time.monotonic() + 10
    while not box.launcher.made and time.monotonic() < deadline:
        box.launcher.drain()
        time.sleep(0.02)
    os.kill(box.launcher.pid, signal.SIGKILL)
    box.launcher.proc.wait()
    with pytest.raises(agent.ToolError, match="launcher has ended .*nothing was run"):
        execute(box, workdir, "open('ran', 'w')")
    assert not (workdir / "ran").exists()


NO_LAUNCHER = "import sys; sys.exit('no launcher on this machine')"


@needs_landlock
def test_where_the_launcher_cannot_start_the_sandbox_is_unavailable_and_says_why(
    workdir, monkeypatch
):
    """No launcher, no boundary the self-test could prove: the status line says why, and
    run_python asks before every call, even with --yes."""
    monkeypatch.setattr(agent, "LAUNCHER_BOOT", NO_LAUNCHER)
    box = agent.Sandbox(Path(os.path.realpath(workdir)), True, agent.Limits())
    assert not box.ready()
    assert box.status.startswith(
        "sandbox: unavailable (its launcher could not start: no "
        "launcher on this machine); run_python will ask"
    ), box.status


def test_no_sandbox_without_a_launcher_says_so_and_still_ends_the_group(
    capsys, workdir, monkeypatch
):
    """--no-sandbox where the launcher cannot start: the status line says so, the agent starts
    the call itself, and what the script left running dies when it ends."""
    if sys.platform != "linux":
        pytest.skip("the launcher is Linux's")
    monkeypatch.setattr(agent, "LAUNCHER_BOOT", NO_LAUNCHER)
    code_ = (
        "import subprocess\np = subprocess.Popen(['sleep', '60'])\n"
        "open('child.pid', 'w').write(str(p.pid))\nprint('ran')\n"
    )
    client = FakeClient(reply(tool_use("run_python", {"code": code_})), reply(text("ok")))
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox"], client
    )
    assert (
        code == 0
        and (
            "sandbox: off (--no-sandbox); run_python runs unconfined; no launcher "
            "(no launcher on this machine): agent.py starts each call"
        )
        in err
    )
    assert "ran" in final_messages(client)[-1]["content"][0]["content"]
    time.sleep(0.1)
    assert not alive(int((workdir / "child.pid").read_text()))


def children_of(pid):
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid
            ):
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


@needs_root
def test_remove_tree_as_an_ordinary_user_takes_directories_without_permission(as_nobody):
    python, nobody, root = as_nobody.python, as_nobody.user, as_nobody.dir
    make = (
        "import os, sys\nos.chdir(sys.argv[1])\n"
        "for i in range(50):\n    os.mkdir(f'z{i}', 0)\n"  # no r, w or x: not even its own
        "os.mkdir('d'); os.mkdir('d/inner'); os.chmod('d', 0o500)\n"
        "for i in range(20):\n    os.makedirs(f'n{i}/m'); os.chmod(f'n{i}/m', 0)\n"
    )
    remove = (
        f"import sys; sys.path.insert(0, {str(as_nobody.agent_dir)!r}); "
        "import agent; agent.remove_tree(sys.argv[1])"
    )
    for script in (make, remove):
        subprocess.run(
            [python, "-c", script, str(root)],
            check=True,
            timeout=60,
            user=nobody.pw_uid,
            group=nobody.pw_gid,
            extra_groups=[],
            cwd="/",
        )
    assert not root.exists()


@needs_landlock
def test_dev_shm_is_private_to_the_call_and_gone_after_it(box, workdir):
    if not box.mounts:
        pytest.skip("no mount namespace here: /dev/shm is not writable instead")
    before = set(os.listdir("/dev/shm"))
    first = execute(box, workdir, "open('/dev/shm/left-behind', 'w').write('x'); print('ok')")
    second = execute(box, workdir, "import os; print(os.listdir('/dev/shm'))")
    assert first.stdout == "ok\n" and second.stdout == "[]\n"
    assert set(os.listdir("/dev/shm")) == before


DEEP_MESS = (
    "import os\n"
    "os.chdir(os.environ['HOME'])\n"
    "for _ in range(1200):\n"  # deeper than shutil.rmtree can recurse
    "    os.mkdir('d' * 200)\n"  # and longer than PATH_MAX, all together
    "    os.chdir('d' * 200)\n"
    "open('blob', 'wb').write(b'x' * (8 << 20))\n"
    "os.mkdir('shut', 0o000)\n"
    "print(os.environ['HOME'])\n"
)


@needs_landlock
@pytest.mark.parametrize("mounts", [True, False], ids=["tmpfs", "on-disk"])
def test_a_deep_mess_in_home_is_gone_after_the_call(workdir, mounts):
    box = new_box(workdir)
    if mounts and not box.mounts:
        pytest.skip("no mount namespace here")
    box.mounts = mounts
    run = execute(box, workdir, DEEP_MESS, timeout=60)
    assert run.code == 0, run.stderr
    root = Path(run.stdout.strip()).parent.parent
    deadline = time.monotonic() + 30  # the launcher may still be removing it
    while root.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not root.exists()


@needs_landlock
def test_the_scratch_space_is_capped(workdir):
    box = new_box(workdir, scratch_mb=16)
    if not box.mounts:
        pytest.skip("no mount namespace here: home is on disk, capped only per file")
    run = execute(
        box,
        workdir,
        "import os\n"
        "p = os.path.join(os.environ['HOME'], 'big')\n"
        "try:\n"
        "    open(p, 'wb').write(b'x' * (32 << 20))\n"
        "except OSError as e:\n"
        "    print(e.errno)\n",
    )
    assert run.stdout.strip() == "28"  # ENOSPC


def test_remove_tree_takes_any_shape(tmp_path):
    root = tmp_path / "mess"
    deep = root
    for _ in range(30):
        deep = deep / ("n" * 200)
    os.makedirs(root)
    fd = os.open(root, os.O_RDONLY)
    for _ in range(30):  # names longer than PATH_MAX in all, made one level at a time
        os.mkdir("n" * 200, dir_fd=fd)
        nxt = os.open("n" * 200, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    (root / "shut").mkdir(0o000)
    (root / "link").symlink_to(tmp_path)  # never followed
    (tmp_path / "keep.txt").write_text("keep")
    agent.remove_tree(str(root))
    assert not root.exists() and (tmp_path / "keep.txt").exists()


def test_remove_tree_never_chmods_a_file_swapped_in_for_a_directory(tmp_path, monkeypatch):
    """A directory listed, then swapped for a hard link to a file outside, or a symlink, before
    it is opened: the file keeps its mode, and the names are unlinked, so that the whole tree
    goes (the listing is made to say "directory" for both)."""
    outside = tmp_path / "id_key"
    outside.write_text("secret")
    outside.chmod(0o600)
    root = tmp_path / "mess"
    root.mkdir()
    os.link(outside, root / "was-a-dir")
    os.symlink(tmp_path, root / "was-a-dir-too")
    real = os.scandir

    class Listed:
        def __init__(self, entry):
            self.name = entry.name

        def is_dir(self, follow_symlinks=True):
            return True

    monkeypatch.setattr(agent.os, "scandir", lambda fd: [Listed(e) for e in real(fd)])
    agent.remove_tree(str(root))
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600
    assert not os.path.lexists(root) and outside.read_text() == "secret"


@needs_landlock
def test_a_call_whose_cgroup_cannot_be_made_is_refused(workdir):
    """Also when the launcher has prepared the next call's cgroups under the parents as they
    were: those are not taken (the review found this test passing or not by a race)."""
    box = new_box(workdir)
    if not box.cgroup:
        pytest.skip("no cgroup here")
    assert prepared_call(box)
    box.cgroup = (box.cgroup[0], [str(workdir / "no-such-parent")] * len(box.cgroup[1]))
    with pytest.raises(agent.ToolError, match="not run without its caps"):
        execute(box, workdir, "open('ran', 'w')")
    assert not (workdir / "ran").exists()


# --- the workdir is the one opened at the start, not whatever its name names later ---

SWAPPED_WORKDIR = (
    "import os, time\nopen('started', 'w').close()\n"
    "while not os.path.exists('swapped'):\n    time.sleep(0.02)\n"
)


@as_other_users
@pytest.mark.parametrize("way", ["sandboxed", "no-sandbox", "no-launcher"])
def test_another_user_cannot_swap_the_workdir_of_the_next_call(way, tmp_path, monkeypatch):
    """S1: root works in a directory of nobody's in /tmp (whose sticky bit lets its owner rename
    it). During the first call nobody renames it and puts a symlink to a root-only directory in
    its place: the next call still runs in, and may write only, the directory opened at the
    start: it lists that one's files, and what it writes lands there, not behind the link. With
    the launcher and Landlock, without Landlock (--no-sandbox), and without a launcher (the agent
    starts the call itself)."""
    if not os.stat("/tmp").st_mode & stat.S_ISVTX:
        pytest.skip("/tmp has no sticky bit")
    if way == "no-launcher":
        monkeypatch.setattr(agent, "LAUNCHER_BOOT", NO_LAUNCHER)
    roots = tmp_path / "roots"  # root's: nobody cannot even look in
    roots.mkdir(mode=0o700)
    (roots / "private.txt").write_text("root's\n")
    theirs, moved = Path(f"/tmp/agent-s1-{os.getpid()}"), Path(f"/tmp/agent-s1-{os.getpid()}.old")
    nobody_does("mkdir", "-m", "0777", str(theirs))  # (a capless root must write it)
    (theirs / "data.csv").write_text("a,b\n")  # (root may write in nobody's directory)
    box = agent.Sandbox(theirs, way == "sandboxed", agent.Limits())
    try:
        assert box.ready() == (way == "sandboxed"), box.status
        done = {}
        first = threading.Thread(
            target=lambda: done.update(run=agent.execute(SWAPPED_WORKDIR, theirs, box, 30, 2000))
        )
        first.start()
        deadline = time.monotonic() + 20
        while not (theirs / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        nobody_does("sh", "-c", f"mv {theirs} {moved} && ln -s {roots} {theirs}")
        (moved / "swapped").touch()  # the first call may end: the launcher makes the next one's
        first.join()
        assert done["run"].code == 0, done["run"]
        assert os.path.realpath(theirs) == str(roots)  # the swap took
        second = agent.execute(
            "import os\nprint(sorted(os.listdir('.')))\nopen('planted', 'w').write('x')\n",
            theirs,
            box,
            30,
            2000,
        )
        assert second.code == 0, second
        assert "private.txt" not in second.stdout and "data.csv" in second.stdout, second
        assert not (roots / "planted").exists(), "the script wrote into root's directory"
        assert (moved / "planted").read_text() == "x"  # where the run's workdir went
    finally:
        box.close()
        if theirs.is_symlink():
            theirs.unlink()
        for d in (theirs, moved):
            subprocess.run(["rm", "-rf", str(d)], check=False)


def nobody_does(*argv):
    nobody = pwd.getpwnam("nobody")
    subprocess.run(argv, check=True, user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])


# --- what runs is what was approved ---


@needs_landlock
def test_another_call_cannot_rewrite_a_running_script(box, workdir):
    slow = threading.Thread(
        target=execute,
        args=(
            box,
            workdir,
            (
                "import os, time\nopen('first', 'w').write(__file__)\ntime.sleep(2)\nprint('approved')"
            ),
        ),
    )
    slow.start()
    deadline = time.monotonic() + 10
    while (
        not ((workdir / "first").exists() and (workdir / "first").read_text())
        and time.monotonic() < deadline
    ):  # made, then written: wait for its text
        time.sleep(0.02)
    target = (workdir / "first").read_text()
    attack = execute(box, workdir, f"open({target!r}, 'w').write('print(\"replaced\")')")
    slow.join()
    assert "PermissionError" in attack.stderr
    assert execute(box, workdir, f"print(open({target!r}).read())").code != 0  # gone, or unreadable


@needs_landlock
def test_a_script_cannot_rewrite_itself(box, workdir):
    run = execute(box, workdir, "print('before')\nopen(__file__, 'a').write('x')")
    assert run.stdout == "before\n" and "PermissionError" in run.stderr


@needs_landlock
def test_modules_left_in_the_workdir_or_home_do_not_shadow_the_stdlib(box, workdir):
    (workdir / "json.py").write_text("raise SystemExit('shadowed')\n")
    code = (
        "import json, os, subprocess, sys\n"
        "open(os.path.join(os.environ['HOME'], 'csv.py'), 'w').write('raise SystemExit(1)')\n"
        "print(json.dumps(1))\n"
        "child = subprocess.run([sys.executable, '-c', 'import json, csv; print(json.dumps(2))'],\n"
        "                       capture_output=True, text=True)\n"
        "print(child.stdout.strip(), child.stderr.strip())\n"
    )
    run = execute(box, workdir, code)
    assert run.code == 0 and run.stdout.split() == ["1", "2"], run.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="Linux sandbox")
def test_a_coding_declaration_cannot_change_what_runs(capsys, workdir):
    code_ = "# -*- coding: utf-7 -*-\n# +AAo-open('pwned', 'w').write('x')\nprint('shown')\n"
    client = FakeClient(reply(tool_use("run_python", {"code": code_})), reply(text("ok")))
    run_cli(capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox"], client)
    result = final_messages(client)[-1]["content"][0]
    assert not (workdir / "pwned").exists()
    assert result["is_error"] and "encoding problem: utf-7 with BOM" in result["content"]


@needs_landlock
def test_a_file_name_that_is_not_utf8_survives_a_scripts_print(capsys, workdir):
    """os.listdir gives such a name with a lone surrogate: printed, it must not end the script,
    and the model gets text that names the file the way Python source can write it again."""
    os.close(os.open(os.path.join(os.fsencode(workdir), b"caf\xe9.csv"), os.O_CREAT | os.O_WRONLY))
    result, _ = run_script(
        capsys,
        workdir,
        "import os\nprint(*sorted(os.listdir('.')))\nprint(open('caf\\udce9.csv').read() == '')\n",
    )
    assert not result.get("is_error"), result["content"]
    assert "caf\\udce9.csv" in result["content"] and "True" in result["content"]
    result["content"].encode("utf-8")  # valid text: no lone surrogate reaches the model


@pytest.mark.parametrize("opened", ["open to all, no sticky bit", "another user's"])
def test_a_call_is_made_nowhere_another_user_could_swap_it(
    box, workdir, tmp_path, monkeypatch, opened
):
    """Red-team F14: where TMPDIR is a directory another user can rename entries of, they swap
    the call's directory for one whose main.py is a symlink, and the approved script is written
    wherever it leads. The attacker here renames every call directory it sees and plants the
    link; the call is refused, nothing is made there, and the victim file is as it was."""
    shared = tmp_path / "shared"
    shared.mkdir()
    if opened == "another user's":
        need_other_users()
        os.chown(shared, 65534, 65534)  # nobody's, 0755: nobody alone may rename in it
        shared.chmod(0o755)
    else:
        shared.chmod(0o777)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    done = threading.Event()

    def attacker():
        while not done.is_set():
            for name in os.listdir(shared):
                if name.startswith("agent-call-") and not name.endswith(".taken"):
                    try:
                        os.rename(shared / name, shared / f"{name}.taken")
                        os.mkdir(shared / name)
                        os.symlink(victim, shared / name / "main.py")
                    except OSError:
                        pass

    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    try:
        with pytest.raises(agent.ToolError, match="set TMPDIR") as refused:
            execute(box, workdir, "print('written where the link led')")
    finally:
        done.set()
        thread.join()
    assert str(shared) in str(refused.value)
    assert os.listdir(shared) == [] and victim.read_text() == "precious"


# --- a script runs as `python main.py` runs it


def plainly(tmp_path, workdir, code, home):
    """The script run as a plain interpreter runs it, in the same directory and environment."""
    script = tmp_path / "plain" / "main.py"
    script.parent.mkdir(exist_ok=True)
    script.write_bytes(agent.script_bytes(code))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        env=agent.child_env(agent.sandbox_policy(workdir, agent.Limits()), home),
    )
    return done.returncode, done.stdout, done.stderr.replace(str(script), "MAIN")


LOOKS = """import json, os, stat, sys
def opened(fd):
    try:
        return os.fstat(fd)
    except OSError:
        return None
print(json.dumps({"globals": sorted(globals()), "argv": [os.path.basename(a) for a in sys.argv],
                  "orig_argv": [os.path.basename(a) for a in sys.orig_argv],
                  "modules": sorted(sys.modules), "fds": [fd for fd in range(64) if opened(fd)],
                  "stdin": os.fstat(0).st_rdev == os.stat(os.devnull).st_rdev,
                  "stdin_read": sys.stdin.read(), "name": __name__,
                  "file": os.path.basename(__file__), "flags": str(sys.flags)}))
"""


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandbox", "no-sandbox"])
def test_a_script_sees_what_a_plainly_started_one_sees(workdir, tmp_path, sandboxed):
    """Its globals, argv, modules, open descriptors (0, 1, 2: stdin /dev/null, read empty),
    __name__, __file__ and flags are those of `python main.py` in the same environment."""
    box = agent.Sandbox(Path(os.path.realpath(workdir)), sandboxed, agent.Limits())
    try:
        box.ready()
        run = execute(box, workdir, LOOKS)
    finally:
        box.close()
    code, out, err = plainly(tmp_path, workdir, LOOKS, str(tmp_path))
    assert code == 0, err
    assert run.code == 0 and run.stderr == "", run.stderr
    assert json.loads(run.stdout) == json.loads(out)


RECURSION = """import sys
depth = 0
def f():
    global depth
    depth += 1
    f()
try:
    f()
except RecursionError:
    print(depth)
"""

# what ends a script, and how the interpreter reports it
ENDINGS = {
    "recursion-limit": RECURSION,
    "no-frame-below": "import sys\nprint(sys._getframe().f_back is None)\n",
    "exception": "def f():\n    1 / 0\nf()\n",
    "syntax": "x = (\n",
    "keyboard-interrupt": "print('before')\nraise KeyboardInterrupt\n",
    "sigint": "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n",
    "exit-text": "import sys\nsys.exit('bye')\n",
    "exit-code": "import sys\nsys.exit(3)\n",
    "os-exit": "import os\nprint('before', flush=True)\nos._exit(7)\n",
    "own-excepthook": "import sys\nsys.excepthook = lambda t, v, tb: print('hook', t.__name__, "
    "tb.tb_frame.f_code.co_name)\nraise ValueError('x')\n",
    "atexit": "import atexit\natexit.register(print, 'at exit')\nraise ValueError('x')\n",
    "chained": "try:\n    1 / 0\nexcept ZeroDivisionError:\n    raise KeyError('k')\n",
    "keyboard-interrupt-blocked": "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, "
    "{signal.SIGINT})\nraise KeyboardInterrupt\n",
    "raising-excepthook": "import sys\ndef hook(*args):\n    raise RuntimeError('in the hook')\n"
    "sys.excepthook = hook\nraise KeyboardInterrupt\n",
    "thread-then-keyboard-interrupt": "import threading, time\nthreading.Thread(target=lambda: "
    "(time.sleep(0.5), print('thread done'))).start()\n"
    "raise KeyboardInterrupt\n",
    "traceback-property": "class E(Exception):\n    __traceback__ = property(lambda self: None)\n"
    "raise E('boom')\n",
    "excepthook-none": "import sys\nsys.excepthook = None\nraise ValueError('x')\n",
    "excepthook-missing": "import sys\ndel sys.excepthook\nraise ValueError('x')\n",
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_script_ends_as_python_main_py_does(box, workdir, tmp_path, ending):
    """Exit code (or signal), stdout and stderr, traceback included, are those of `python
    main.py` run on the same file in the same environment: the recursion limit a script
    reaches, its bottom frame, its exceptions, exits and signals."""
    code = ENDINGS[ending]
    run = execute(box, workdir, code)
    main = next(
        (line.split('"')[1] for line in run.stderr.splitlines() if line.startswith('  File "')),
        "MAIN",
    )
    expected = plainly(tmp_path, workdir, code, str(tmp_path))
    assert (run.code, run.stdout, run.stderr.replace(main, "MAIN")) == expected


# A script whose workdir holds the temp directory (schroot, mock) replaces every call directory
# it finds there, and plants more, with symlinks to a file outside (a .pth of a venv, which the
# next `agent.py` would run): the launcher, unconfined, must never write through one.
PLANT = """import os, sys
target, tmp = sys.argv[1:] or (TARGET, TMP)
for name in os.listdir(tmp):
    path = os.path.join(tmp, name)
    if os.path.dirname(os.path.realpath(__file__)) == os.path.realpath(path):
        continue
    if os.path.isdir(path):
        # the call's script replaced by a link
        script = os.path.join(path, "main.py")
        if os.path.lexists(script):
            os.unlink(script)
        os.symlink(target, script)
        # and the call's directory by a link to a directory holding such a script
        os.rename(path, path + ".moved")
        os.symlink(path + ".moved", path)
# names planted where a call's directory or script may come
os.mkdir(os.path.join(tmp, "planted"))
os.symlink(target, os.path.join(tmp, "planted", "main.py"))
for name in ("main.py", "agent-call-main.py", "agent-call-"):
    os.symlink(target, os.path.join(tmp, name))
print("planted")
"""


@needs_landlock
def test_a_script_cannot_redirect_the_next_calls_script(workdir, tmp_path, monkeypatch):
    venv = tmp_path / "venv" / "site-packages"
    venv.mkdir(parents=True)
    target = venv / "evil.pth"
    target.write_text("import os\n")
    tmp = workdir / "tmp"
    tmp.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    box = new_box(workdir)
    plant = PLANT.replace("TARGET", repr(str(target))).replace("TMP", repr(str(tmp)))
    # the first call made, then its own directory removed: what the planter finds is the next
    assert execute(box, workdir, "pass").code == 0
    first = execute(box, workdir, plant)
    assert first.stdout == "planted\n", first.stderr
    approved = "print('approved')\n"
    for _ in range(3):
        run = execute(box, workdir, approved)
        assert (run.code, run.stdout) == (0, "approved\n"), run.stderr
    assert target.read_text() == "import os\n"
    assert os.listdir(venv) == ["evil.pth"]


@pytest.fixture
def shared_tmp(workdir, tmp_path, monkeypatch):
    """The temp directory shown inside the workdir as `tmp` (an operator's bind mount, as
    schroot makes): a script there can rename what the launcher makes in it."""
    if os.geteuid() != 0:
        pytest.skip("needs root for the bind mount")
    real = tmp_path / "tmp"
    real.mkdir(mode=0o700)
    (workdir / "tmp").mkdir()
    subprocess.run(["mount", "--bind", str(real), str(workdir / "tmp")], check=True)
    monkeypatch.setattr(tempfile, "tempdir", str(real))
    yield real
    subprocess.run(["umount", "-l", str(workdir / "tmp")], check=True)


@needs_landlock
def test_a_call_whose_directory_name_leads_elsewhere_mounts_nothing_there(box, workdir, tmp_path):
    """Red team 32.3: where TMPDIR shows inside the workdir, a script of another call can flip a
    starting call's directory name between directories of its own. The call's first process
    resolved that name twice, to mount its tmpfs and to grant the home in it, and the flip won
    the race once in 512 calls: the home's rule on / (docs/threat-model.md). It now finds the
    directory by name once, and refuses unless it is the one the launcher made: here the name
    leads to a decoy, and nothing is mounted or granted there."""
    if not box.mounts:
        pytest.skip("no mount namespace here")
    call = agent.Call(box)
    decoy = tmp_path / "decoy"
    (decoy / "scratch").mkdir(parents=True)
    os.rename(call.root, call.root + ".moved")
    os.symlink(decoy, call.root)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            before = os.stat(decoy / "scratch").st_dev
            try:
                call.enter()
                said = "entered"
            except OSError as e:
                said = f"refused: {e}"
            if os.stat(decoy / "scratch").st_dev != before:
                said += ", the decoy mounted"
            os.write(write, said.encode())
        finally:
            os._exit(0)
    os.close(write)
    said = os.read(read, 200).decode()
    os.close(read)
    os.waitpid(pid, 0)
    os.unlink(call.root)
    os.rename(call.root + ".moved", call.root)
    call.release()
    # (ENOTDIR: the name is a symlink; ENOENT: another directory)
    assert said.startswith("refused: [Errno 20]"), said


@needs_landlock
def test_a_workdir_that_shows_the_temp_directory_runs_no_call(workdir, shared_tmp):
    """Red team 32.6: where a confined run's workdir shows the temp directory (a bind mount, as
    schroot makes), its script renamed another run's call directories before their exec and
    left its own main.py: 1,323 of 1,323 calls of a --no-sandbox run sharing that TMPDIR ran it,
    unconfined. Such a workdir gets no call, and one line says to set TMPDIR elsewhere."""
    box = new_box(workdir)
    try:
        assert box.confined and box.shown == workdir / "tmp", box.status
        with pytest.raises(agent.ToolError, match="shows inside the workdir at .*TMPDIR") as e:
            execute(box, workdir, "open('ran', 'w').close()")
        assert str(workdir / "tmp") in str(e.value) and not (workdir / "ran").exists()
    finally:
        box.close()
    # the same workdir without the mount: calls run
    subprocess.run(["umount", "-l", str(workdir / "tmp")], check=True)
    box = new_box(workdir)
    try:
        assert box.shown is None and execute(box, workdir, "print('ran')").stdout == "ran\n"
    finally:
        box.close()
    subprocess.run(["mount", "--bind", str(shared_tmp), str(workdir / "tmp")], check=True)


@needs_landlock
def test_another_run_cannot_put_its_script_in_place_of_a_prepared_call(workdir, shared_tmp):
    """Red team 32.4: where TMPDIR shows inside the workdir, a script of another run moved the
    next call's prepared directory away and put its own in its place, and the call ran the
    script found there. A prepared call is taken only if its directory is still where its name
    says; otherwise the call makes its own."""
    tmp = shared_tmp
    victim, other = new_box(workdir), new_box(workdir)
    # (calls here are refused since 32.6: set aside, to attack the launcher's own defences)
    victim.shown = other.shown = None
    try:
        assert victim.confined and other.confined, victim.status
        assert execute(victim, workdir, "pass").code == 0
        deadline = time.monotonic() + 10
        while not list(tmp.glob(f"agent-call-{victim.launcher.tag}-*")):
            assert time.monotonic() < deadline, "no call was prepared"
            time.sleep(0.01)
        swap = (
            "import os\n"
            f"for name in os.listdir('tmp'):\n    if name.startswith('agent-call-{victim.launcher.tag}-'):\n"
            "        path = os.path.join('tmp', name)\n"
            "        os.rename(path, path + '.moved')\n"
            "        os.makedirs(path + '/scratch/home')\n        os.makedirs(path + '/scratch/shm')\n"
            "        open(path + '/main.py', 'w').write('print(\"planted\")')\n"
            "        print('swapped')\n"
        )
        assert execute(other, workdir, swap).stdout == "swapped\n"
        run = execute(victim, workdir, "print('approved')")
        assert (run.code, run.stdout) == (0, "approved\n"), run
    finally:
        victim.close()
        other.close()


@needs_landlock
def test_a_scratch_replaced_by_a_symlink_is_not_followed_and_leaks_no_descriptor(box, tmp_path):
    """A call's own paths are opened beneath its directory a component at a time, never
    following a symlink: a scratch a script of another run replaced by a link to a directory
    with a home of its own is refused (ENOTDIR), and the launcher, which lives for the run,
    keeps no descriptor of the steps before it."""
    (tmp_path / "home").mkdir()
    call = agent.Call(box)
    try:
        for name in ("home", "shm"):
            os.rmdir(os.path.join(call.root, "scratch", name))
        os.rename(os.path.join(call.root, "scratch"), os.path.join(call.root, "moved"))
        os.symlink(tmp_path, os.path.join(call.root, "scratch"))
        call.ruleset = agent.make_ruleset(box)
        before = sorted(os.listdir("/proc/self/fd"))
        with pytest.raises(OSError) as refused:
            call.add_own_rules(["home"], agent.READ_WRITE)
        assert refused.value.errno == errno.ENOTDIR
        assert sorted(os.listdir("/proc/self/fd")) == before
    finally:
        call.release()


@needs_landlock
def test_a_call_prepared_without_its_cgroup_is_not_kept(workdir, monkeypatch):
    """Red team 32.5: the call prepared after the self-test's was made while the launcher's box
    was untested, so a cgroup it could not make left it uncapped, and the next call took it:
    uncapped, with the status line promising caps. Such a call is not kept; the next call makes
    its own cgroup, or is refused."""
    box = capped_box(workdir)
    box.tested = False

    def no_room(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(agent, "make_cgroups", no_room)
    parent = agent.call_parent()

    def made_here():
        # named without a launcher's tag (launchers make theirs meanwhile)
        return {p for p in Path(parent).glob("agent-call-*") if p.name.count("-") == 2}

    before = made_here()
    try:
        assert agent.prepare_next_call(box, parent) is None
        assert made_here() == before
    finally:
        box.close()


@needs_landlock
def test_a_change_of_the_agents_environment_reaches_the_next_call(box, workdir, monkeypatch):
    """Each call gets the agent's environment as it is at the call."""
    show = "import os\nprint(os.environ.get('LC_PAPER'))"
    monkeypatch.setenv("LC_PAPER", "first")
    assert execute(box, workdir, show).stdout == "first\n"
    monkeypatch.setenv("LC_PAPER", "second")
    assert execute(box, workdir, show).stdout == "second\n"


# --- bounded as a whole ---


@needs_landlock
def test_a_script_that_closes_its_stdio_runs_to_its_end(box, workdir):
    run = execute(
        box,
        workdir,
        "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(0.5)\n"
        "open('done', 'w').write('yes')\n",
    )
    assert run.code == 0 and (workdir / "done").read_text() == "yes"


def capped_box(workdir, **limits):
    box = new_box(workdir, **limits)
    if not box.cgroup:
        pytest.skip("no cgroup the agent may create here: README says what is capped instead")
    return box


@needs_landlock
def test_processes_of_one_call_are_capped_together(workdir):
    box = capped_box(workdir, max_tasks=40)
    code = (
        "import os, time\nmade = 0\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(5)\n"
        "            os._exit(0)\n"
        "        made += 1\n"
        "    except BlockingIOError:\n"
        "        break\n"
        "print(made)\n"
    )
    run = execute(box, workdir, code)
    assert 30 <= int(run.stdout) < 40, run.stderr


@needs_landlock
def test_memory_of_one_call_is_capped_together(workdir):
    box = capped_box(workdir, memory_mb=200)
    code = (
        "import subprocess, sys\n"
        "grab = 'b = bytearray(150 << 20); import time; time.sleep(3)'\n"
        "kids = [subprocess.Popen([sys.executable, '-c', grab]) for _ in range(2)]\n"
        "print([k.wait() for k in kids])\n"
    )
    run = execute(box, workdir, code)
    assert run.oom and "-9" in run.stdout, (run.stdout, run.stderr)


def launcher_cgroups(box):
    """The cgroups a box's launcher has made and not yet removed (named with its run's tag)."""
    return sorted(p for d in box.cgroup[1] for p in Path(d).glob(f"agent-{box.launcher.tag}-*"))


def prepared_call(box):
    """The next call's directory and cgroups, once the launcher has made them: one directory of
    its run, with no script in it yet (the last call's had one), and a cgroup a controller."""
    calls = f"agent-call-{box.launcher.tag}-*"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        made = list(Path(agent.call_parent()).glob(calls))
        cgroups = launcher_cgroups(box)
        if len(made) == 1 and not (made[0] / "main.py").exists():
            if len(cgroups) == len(box.cgroup[1]):
                return made[0], cgroups
        time.sleep(0.01)
    raise AssertionError("the launcher prepared no next call")


@needs_landlock
def test_the_next_call_is_prepared_between_calls_and_goes_with_the_launcher(workdir):
    """While no call runs, the launcher holds the next call's directory (no script yet) and its
    cgroups, prepared with their caps (docs/benchmarks.md: about 1.1 ms of a call): the next call
    runs there and removes them, a new set is made, and the launcher's end removes a set no
    call took."""
    box = capped_box(workdir, max_tasks=40)
    directory, prepared = prepared_call(box)
    assert len(prepared) == len(box.cgroup[1]), prepared
    assert "40" in [
        (d / "pids.max").read_text().strip() for d in prepared if (d / "pids.max").exists()
    ]
    code = "import time\nopen('started', 'w').write(__file__)\ntime.sleep(1)\n"
    running = threading.Thread(target=execute, args=(box, workdir, code))
    running.start()
    deadline = time.monotonic() + 10
    while not (workdir / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    script = [p for d in prepared for p in (d / "cgroup.procs").read_text().split()]
    running.join()
    assert script, "the call did not run in the cgroups made for it"
    assert (workdir / "started").read_text() == str(directory / "main.py")
    next_directory, after = prepared_call(box)
    assert len(after) == len(prepared) and not set(after) & set(prepared)
    assert next_directory != directory and not directory.exists()
    assert not [d for d in prepared if d.exists()], "the call's cgroups outlived it"
    box.close()
    assert not [d for d in after if d.exists()], "the launcher's end left the next call's cgroups"
    assert not next_directory.exists(), "the launcher's end left the next call's directory"


def root_mounts_box(workdir):
    box = capped_box(workdir)
    if not box.mounts or os.geteuid() != 0:
        box.close()
        pytest.skip("root's launcher makes a call's mount namespace ahead; not here")
    return box


@needs_landlock
def test_a_prepared_call_enters_a_namespace_made_ahead_as_mounts_are_at_the_call(workdir):
    """Root's launcher has a child make the next call's mount namespace (its private tmpfs)
    while no call runs, and stays in its own; the call's process only enters it. A namespace is
    a copy of the mounts when it was made: a call after a mount changed makes its own, as
    `python main.py` would see the mount. The launcher keeps no descriptor of calls made."""
    box = root_mounts_box(workdir)
    late = workdir / "late"
    late.mkdir()
    fds = f"/proc/{box.launcher.pid}/fd"
    try:
        code = "import os\nprint(os.listdir('late'), os.statvfs(os.environ['HOME']).f_blocks)"
        first = execute(box, workdir, code)
        prepared_call(box)
        mine = os.readlink("/proc/self/ns/mnt")
        assert os.readlink(f"/proc/{box.launcher.pid}/ns/mnt") == mine
        held = len(os.listdir(fds))
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "late", str(late)], check=True)
        (late / "file").write_text("made after the call was prepared\n")
        second = execute(box, workdir, code)
        assert second.stdout.split(" [")[0].startswith("['file']"), (first, second)
        # the home a private tmpfs each time, its size the policy's
        assert first.stdout.split()[-1] == second.stdout.split()[-1] != "0", (first, second)
        for _ in range(3):
            assert execute(box, workdir, code).stdout == second.stdout
        prepared_call(box)
        assert os.readlink(f"/proc/{box.launcher.pid}/ns/mnt") == mine
        assert len(os.listdir(fds)) == held, "the launcher keeps descriptors of calls made"
    finally:
        box.close()
        subprocess.run(["umount", "-l", str(late)], check=False)


def held_namespaces(box):
    """The mount namespaces the launcher holds by a descriptor."""
    fds = f"/proc/{box.launcher.pid}/fd"
    links = []
    for fd in os.listdir(fds):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            links.append(os.readlink(f"{fds}/{fd}"))
    return [link for link in links if link.startswith("mnt:")]


@needs_landlock
def test_a_host_unmount_between_calls_leaves_no_filesystem_held_by_the_launcher(workdir, tmp_path):
    """Red team 32.7: a namespace made ahead is a copy of every mount, so a filesystem the host
    unmounted while the model thought stayed alive, held by the launcher alone (no process in
    it: lsns and fuser showed nothing; mkfs and fsck refused the disk) until the next call. A
    mount changing now ends the namespace made ahead; the next call makes its own."""
    box = root_mounts_box(workdir)
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "disk", str(disk)], check=True)
    try:
        assert execute(box, workdir, "print('one')").stdout == "one\n"
        prepared_call(box)
        assert held_namespaces(box), "no namespace was made ahead"
        subprocess.run(["umount", str(disk)], check=True)
        deadline = time.monotonic() + 5
        while held_namespaces(box) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held_namespaces(box) == [], "the unmounted filesystem is still held"
        run = execute(box, workdir, "import os\nprint(os.path.ismount(%r))" % str(disk))
        assert (run.code, run.stdout) == (0, "False\n"), run.stderr
        prepared_call(box)
        assert held_namespaces(box), "the next call made after it was not prepared again"
    finally:
        box.close()
        subprocess.run(["umount", "-l", str(disk)], check=False)


@needs_landlock
def test_a_prepared_call_whose_scratch_another_run_swapped_is_not_used(workdir):
    """Red team 32.7: a run whose workdir holds this run's temp directory renamed a prepared
    call's `scratch` (a mount point only inside the namespace made for it) and made its own:
    the call's HOME then led there, and its writes failed (EACCES). A prepared call is taken
    only while its scratch is the one made with it."""
    box = root_mounts_box(workdir)
    try:
        assert execute(box, workdir, "print('one')").stdout == "one\n"
        directory, _ = prepared_call(box)
        os.rename(directory / "scratch", directory / "scratch.moved")
        (directory / "scratch" / "home").mkdir(parents=True)
        code = "import os\nopen(os.path.join(os.environ['HOME'], 'f'), 'w').write('x')\nprint('ok')"
        run = execute(box, workdir, code)
        assert (run.code, run.stdout) == (0, "ok\n"), run.stderr
    finally:
        box.close()


def mountinfo_line(path):
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in lines if f" {path} " in line]


@needs_landlock
def test_a_mount_changed_while_the_launcher_was_busy_ends_the_namespace_made_ahead(
    workdir, tmp_path
):
    """Red team 32.7d: a call's request and a mount change seen in the same wakeup of the
    launcher (here: the launcher stopped meanwhile, as a busy one is) took the namespace made
    before the change, when the new mount's mountinfo line read as the old one's: the call read
    the unmounted tree. A mount change is handled before a request."""
    box = root_mounts_box(workdir)
    source = tmp_path / "source"
    source.mkdir()
    (source / "which").write_text("old")
    mount = workdir / "mnt"
    mount.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(mount)], check=True)
    runs = []
    try:
        assert execute(box, workdir, "print('one')").stdout == "one\n"
        prepared_call(box)
        before = mountinfo_line(mount)
        os.kill(box.launcher.pid, signal.SIGSTOP)
        try:
            subprocess.run(["umount", str(mount)], check=True)
            os.rename(source, tmp_path / "source.old")
            source.mkdir()
            (source / "which").write_text("new")
            subprocess.run(["mount", "--bind", str(source), str(mount)], check=True)
            if mountinfo_line(mount) != before:
                pytest.skip("the new mount's line differs here: the byte check alone sees it")
            code = "print(open('mnt/which').read())"
            call = threading.Thread(target=lambda: runs.append(execute(box, workdir, code)))
            call.start()
            time.sleep(0.3)
        finally:
            os.kill(box.launcher.pid, signal.SIGCONT)
        call.join()
        assert (runs[0].code, runs[0].stdout) == (0, "new\n"), runs[0]
    finally:
        box.close()
        subprocess.run(["umount", "-l", str(mount)], check=False)


@needs_landlock
def test_a_scratch_swapped_before_the_namespace_is_made_gets_no_tmpfs(box, workdir, tmp_path):
    """Red team 32.7e: a run whose workdir holds this run's temp directory swapped a prepared
    call's `scratch` while the namespace was made (so the tmpfs went onto its own directory),
    then swapped it back before the call was taken: the call's HOME had no tmpfs (EACCES). The
    tmpfs is mounted only on the scratch made with the call."""
    if not box.mounts or os.geteuid() != 0:
        pytest.skip("root's namespace made ahead; not here")
    call = agent.Call(box)
    try:
        os.rename(os.path.join(call.root, "scratch"), os.path.join(call.root, "scratch.made"))
        os.mkdir(os.path.join(call.root, "scratch"))
        with pytest.raises(OSError) as refused:
            call.namespace = agent.make_namespace(box, call)
        assert "could not be made" in str(refused.value)
    finally:
        call.release()


@needs_landlock
def test_a_mount_does_not_end_a_prepared_call_that_has_no_namespace(workdir, tmp_path, monkeypatch):
    """Only root's prepared call holds a namespace made ahead, a copy of the mounts; another
    (a non-root agent's) makes its namespace at the call, so a mount made since does not make
    the launcher throw it away, nor read its mountinfo for it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount")
    box = capped_box(workdir)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    parent = agent.call_parent()
    box.prepared = agent.prepare_next_call(box, parent)
    made = box.prepared[1]
    assert made.namespace == ()
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "disk", str(disk)], check=True)
    try:
        assert agent.prepared_call(box, parent) is made
    finally:
        made.release()
        monkeypatch.undo()
        box.close()
        subprocess.run(["umount", "-l", str(disk)], check=False)


@needs_landlock
def test_a_prepared_call_that_cannot_be_checked_is_released(workdir, monkeypatch):
    """If what a prepared call was made for cannot be read at the call (a grant's file), the call
    makes its own, and the prepared one leaves nothing behind."""
    box = capped_box(workdir)
    parent = agent.call_parent()
    box.prepared = agent.prepare_next_call(box, parent)
    made = box.prepared[1]

    def unreadable(*_):
        raise OSError(errno.EACCES, "cannot read")

    monkeypatch.setattr(agent, "prepared_for", unreadable)
    try:
        assert agent.prepared_call(box, parent) is None and box.prepared is None
        assert not os.path.exists(made.root)
        assert not [d for d in made.cgroups if Path(d).exists()]
    finally:
        box.close()


CHROOTED_RUN = r"""
import json, os, subprocess, sys, time
from pathlib import Path
tmp, workdir, agent_dir = map(Path, sys.argv[1:4])
root = tmp / "root"
root.mkdir()
subprocess.run(["mount", "--rbind", "/", str(root)], check=True)
# a mark only the chroot's view has: an empty directory at the real root
subprocess.run(["mount", "-t", "tmpfs", "mark", str(root) + str(workdir / "mark")], check=True)
Path(str(root) + str(workdir / "mark" / "inside")).touch()
os.chroot(root)
os.chdir("/")
sys.path.insert(0, str(agent_dir))
import agent
box = agent.Sandbox(workdir, True, agent.Limits())
box.ready()
seen = []
for _ in range(3):
    # the launcher has prepared the next call: its directory, with no script yet
    deadline = time.monotonic() + 10
    calls = Path(agent.call_parent()).glob(f"agent-call-{box.launcher.tag}-*")
    while not [c for c in calls if not (c / "main.py").exists()] and time.monotonic() < deadline:
        time.sleep(0.01)
        calls = Path(agent.call_parent()).glob(f"agent-call-{box.launcher.tag}-*")
    code = f"import os\nprint(os.listdir({str(workdir / 'mark')!r}))"
    run = agent.execute(code, workdir, box, 20, 30_000)
    seen.append([run.code, run.stdout, run.stderr[-300:]])
    agent_ns = os.readlink("/proc/self/ns/mnt")
    launcher_ns = os.readlink(f"/proc/{box.launcher.pid}/ns/mnt")
    seen.append(launcher_ns == agent_ns)
box.close()
print(json.dumps([box.confined, seen]))
"""


@needs_landlock
def test_a_chrooted_agent_s_prepared_calls_stay_in_its_chroot(workdir, tmp_path):
    """Entering a mount namespace (setns) puts a process at the namespace's root, outside any
    chroot: the call's process entering the namespace made for it goes back into the chroot the
    agent runs in (schroot, mock), and the launcher never leaves its own. Here the chroot's view
    holds a mark the real root has not."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and util-linux's unshare")
    (workdir / "mark").mkdir()
    argv = ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", CHROOTED_RUN]
    argv += [str(tmp_path), str(os.path.realpath(workdir)), str(Path(agent.__file__).parent)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    confined, seen = json.loads(done.stdout.splitlines()[-1])
    if not confined:
        pytest.skip("no sandbox in the chroot here")
    assert seen == [[0, "['inside']\n", ""], True] * 3, seen


@needs_landlock
@pytest.mark.parametrize(
    "since", ["the cap given up", "another TMPDIR", "a mount made", "a mount made and undone"]
)
def test_a_call_prepared_for_the_box_as_it_was_is_not_used(workdir, tmp_path, since):
    """A call takes what was prepared for it only for the box as it is: with the cgroup given up
    since (the self-test found it failing), under another temp directory, or with a mount made
    since, even one undone, which leaves mountinfo's bytes as they were (a namespace made ahead
    would not show it), the call makes its own and removes what was prepared."""
    if "a mount" in since and os.geteuid() != 0:
        pytest.skip("needs root to mount")
    box = capped_box(workdir)
    parent = agent.call_parent()
    box.prepared = agent.prepare_next_call(box, parent)
    made = box.prepared[1]
    assert made.cgroups and all(Path(d).is_dir() for d in made.cgroups)
    disk = tmp_path / "disk"
    if since == "the cap given up":
        box.cgroup = None
    elif since == "another TMPDIR":
        parent = str(tmp_path)
    else:
        disk.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "disk", str(disk)], check=True)
        if since == "a mount made and undone":
            subprocess.run(["umount", str(disk)], check=True)
    try:
        assert agent.prepared_call(box, parent) is None and box.prepared is None
        assert not [d for d in made.cgroups if Path(d).exists()]
        assert not os.path.exists(made.root)
    finally:
        box.close()
        if disk.exists():
            subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_call_that_cannot_make_its_pipes_leaves_no_descriptor_open(box, workdir, monkeypatch):
    """In the launcher, the second os.pipe() of a call failing (EMFILE) closed the first pipe's
    ends only if both were made: each end is now noted as it is made."""
    request = {name: getattr(box, name) for name in agent.FOUND_AT_FIRST_CALL}
    request.update(code="pass", parent=agent.call_parent(), env={}, timeout=5)
    made = []
    real_pipe = os.pipe

    def pipe():
        if made:
            raise OSError(errno.EMFILE, "Too many open files")
        made.append(real_pipe())
        return made[-1]

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    monkeypatch.setattr(os, "pipe", pipe)
    with pytest.raises(OSError):
        agent.Child(box, request, theirs)
    monkeypatch.undo()
    # (at once: later, another test's object could take the numbers)
    assert made, "the first pipe was never made"
    for fd in made[0]:
        with pytest.raises(OSError) as closed:
            os.fstat(fd)
        assert closed.value.errno == errno.EBADF
    mine.close()
    theirs.close()


GRANT_CHANGES = [
    "replaced",
    "replaced twice",
    "made",
    "made in a directory made",
    "its directory replaced",
    "a symlink re-pointed",
]


@needs_landlock
@pytest.mark.parametrize("change", GRANT_CHANGES)
def test_a_granted_file_replaced_between_calls_is_read_as_it_is_now(workdir, tmp_path, change):
    """Review of the prepared ruleset: Landlock holds the files a ruleset was made with, so a
    granted file replaced by rename between two calls (as ldconfig replaces /etc/ld.so.cache)
    was denied to the next call (EACCES), as was one made since (it had no rule). An inotify
    watch tried in place of the check at the call missed a second replacement, a directory on
    the path replaced and a symlink re-pointed (its red team): a prepared ruleset is taken only
    if every grant still names the file it was made with."""
    granted = tmp_path / ("etc" if change.startswith("made") else "dir") / "granted.txt"
    if change == "a symlink re-pointed":
        granted = tmp_path / "link"

    def name_anew(text):
        # the grant's name now leads to a new file that holds `text`
        if change == "a symlink re-pointed":
            (tmp_path / f"{text}.txt").write_text(text)
            (tmp_path / "link.new").symlink_to(tmp_path / f"{text}.txt")
            os.rename(tmp_path / "link.new", granted)
        elif change == "its directory replaced" and granted.parent.exists():
            os.rename(granted.parent, tmp_path / f"before-{text}")
            granted.parent.mkdir()
            granted.write_text(text)
        else:
            granted.parent.mkdir(exist_ok=True)
            (tmp_path / "new.txt").write_text(text)
            os.rename(tmp_path / "new.txt", granted)

    if not change.startswith("made"):
        name_anew("v1")
    box = agent.Sandbox(Path(os.path.realpath(workdir)), True, agent.Limits())
    box.policy = replace(box.policy, read_files=(*box.policy.read_files, str(granted)))
    box.ready()
    try:
        if not box.cgroup:
            pytest.skip("no cgroup here, so no sign of the next call's preparation to wait for")
        code = f"print(open({str(granted)!r}).read())"
        run = execute(box, workdir, code)
        assert run.stdout == "v1\n" or "FileNotFoundError" in run.stderr, run.stderr
        for text in ("v2", "v3") if change == "replaced twice" else ("v2",):
            assert prepared_call(box)
            # the old file open, as every process that maps /etc/ld.so.cache holds it
            with open(granted if granted.exists() else os.devnull):
                name_anew(text)
                run = execute(box, workdir, code)
            assert (run.code, run.stdout) == (0, f"{text}\n"), run.stderr
    finally:
        box.close()


def test_the_launcher_has_one_thread(box, workdir):
    """fork_call skips Python's at-fork hooks, which are for a process with other threads (and
    for modules the call's process never uses): the launcher has no other thread."""
    assert execute(box, workdir, "pass").code == 0
    status = Path(f"/proc/{box.launcher.pid}/status").read_text()
    assert "\nThreads:\t1\n" in status, status


UNDER_A_SMALLER_LIMIT = """
import json, os, sys
sys.path.insert(0, sys.argv[3])
import agent
from pathlib import Path
Path(sys.argv[1], "cgroup.procs").write_text(str(os.getpid()))  # a container's limit, smaller
ballast = bytearray(160 << 20)  # than the call's cap; the agent the biggest process in it
for i in range(0, len(ballast), 4096):
    ballast[i] = 1
workdir = Path(sys.argv[2])
box = agent.Sandbox(workdir, True, agent.Limits())
box.ready()
code = ("import os, time\\n"
        "kids = []\\n"
        "for _ in range(10):  # each smaller than the agent, together far over the limit\\n"
        "    pid = os.fork()\\n"
        "    if pid == 0:\\n"
        "        b = bytearray(50 << 20)\\n"
        "        for i in range(0, len(b), 4096): b[i] = 1\\n"
        "        time.sleep(4)\\n"
        "        os._exit(0)\\n"
        "    kids.append(pid)\\n"
        "print(sorted(os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids))\\n")
run = agent.execute(code, workdir, box, 60, 2000)
print(json.dumps({"code": run.code, "stdout": run.stdout, "stderr": run.stderr[-500:]}))
"""


@needs_landlock
def test_out_of_memory_the_kernel_kills_the_calls_processes_never_the_agent(workdir, tmp_path):
    """The agent runs under a memory limit below the call's 4 GiB cap, as in a container, and
    the script spreads its memory over processes each smaller than the agent. The kernel kills
    the script's processes (oom_score_adj 1000), never the agent or its launcher, and nothing of
    the call outlives it."""
    if os.geteuid() != 0 or not agent.cgroup_parents():
        pytest.skip("needs root and a memory cgroup to put the agent in")
    kind, dirs = agent.cgroup_parents()
    parent = Path(dirs[-1]) / f"oom-test-{os.getpid()}"  # the memory controller's, on v1
    parent.mkdir()
    try:
        (parent / ("memory.limit_in_bytes" if kind == "v1" else "memory.max")).write_text(
            str(400 << 20)
        )
        if (parent / "memory.memsw.limit_in_bytes").exists():
            (parent / "memory.memsw.limit_in_bytes").write_text(str(400 << 20))
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                UNDER_A_SMALLER_LIMIT,
                str(parent),
                str(workdir),
                str(AGENT.parent),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"the agent was killed: {done.returncode} {done.stderr}"
        run = json.loads(done.stdout.splitlines()[-1])
        assert (
            -9 in json.loads(run["stdout"].split("--- stdout ---")[-1].strip() or "[]")
            or run["code"] == -9
        ), run  # the call's own processes were the ones killed
        deadline = time.monotonic() + 10
        while (parent / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not (parent / "cgroup.procs").read_text().strip()  # nothing of the call is left
    finally:
        for child in parent.glob("agent-*"):
            child.rmdir()
        parent.rmdir()


# --- the policy is the one source: change a field, and what the child may do changes ---

TRY = (
    "import errno\n"
    "try:\n"
    "    {action}\n"
    "    print('allowed')\n"
    "except OSError as e:\n"
    "    print(errno.errorcode[e.errno])\n"
)


def elsewhere(tmp_path):
    """A tree outside the workdir with a file in it, which no policy field names yet."""
    tree = tmp_path / "elsewhere"
    tree.mkdir(exist_ok=True)
    (tree / "data.txt").write_text("read")
    return str(tree)


POLICY_CHANGES = {  # field -> (how it changes, what the child tries)
    "write_files": (lambda p, tmp: dict(write_files=()), "open('/dev/null', 'w').write('x')"),
    "read_exec": (
        lambda p, tmp: dict(read_exec=p.read_exec + (elsewhere(tmp),)),
        "open({data!r}).read()",
    ),
    "read_write": (lambda p, tmp: dict(read_write=()), "open('made-here.txt', 'w').write('x')"),
    "own_read_write": (
        lambda p, tmp: dict(own_read_write=("home",)),
        "open('/dev/shm/mine', 'w').write('x')",
    ),
}


@needs_landlock
@pytest.mark.parametrize("field", sorted(POLICY_CHANGES))
def test_one_field_of_the_policy_changes_what_the_child_may_do(workdir, tmp_path, field):
    """The Linux mechanism is built from SandboxPolicy alone: the same attempt, under the
    policy as it is and with one field changed, is allowed in one and refused (EACCES) in the
    other."""
    change, action = POLICY_CHANGES[field]
    code = TRY.format(action=action.format(data=os.path.join(elsewhere(tmp_path), "data.txt")))
    seen = {}
    for changed in (False, True):
        box = agent.Sandbox(Path(os.path.realpath(workdir)), True, agent.Limits())
        if changed:
            box.policy = replace(box.policy, **change(box.policy, tmp_path))
        box.ready()
        assert box.confined, box.status
        seen[changed] = execute(box, workdir, code).stdout.strip()
    granted = field != "read_exec"  # the others take a grant away; read_exec adds one
    assert seen == {
        False: "allowed" if granted else "EACCES",
        True: "EACCES" if granted else "allowed",
    }, seen


@needs_landlock
def test_the_script_is_readable_only_because_the_policy_says_so(workdir):
    box = agent.Sandbox(Path(os.path.realpath(workdir)), True, agent.Limits())
    box.policy = replace(box.policy, own_read=())
    box.ready()  # the self-test cannot run either: the interpreter cannot open its script
    assert not box.confined and "Permission denied" in box.status, box.status


def test_the_macos_profile_is_built_from_the_policy(workdir, tmp_path):
    """macOS cannot be tested here: its sandbox-exec profile is, as text, from the same policy.
    Each field changed alone changes the rule it makes, and nothing else."""
    policy = agent.sandbox_policy(Path(os.path.realpath(workdir)), agent.Limits(), "Darwin")
    profile = agent.macos_profile(policy)
    tree = os.path.realpath(elsewhere(tmp_path))
    assert profile.startswith("(version 1)\n(deny default)\n") and "network" not in profile
    assert f'(subpath "{os.path.realpath(workdir)}")' in profile.split("file-write*")[-1]
    assert '(literal (param "OWN_SCRIPT"))' in profile.split("(allow file-read*\n")[1]
    changes = {
        "write_files": (dict(write_files=()), '(literal "/dev/null")', None),
        "read_exec": (dict(read_exec=policy.read_exec + (tree,)), None, f'(subpath "{tree}")'),
        "read_files": (
            dict(read_files=policy.read_files + (tree + "/data.txt",)),
            None,
            f'(literal "{tree}/data.txt")',
        ),
        "own_read_write": (dict(own_read_write=("home",)), '(param "OWN_SHM")', None),
        "own_read": (dict(own_read=()), '(param "OWN_SCRIPT")', None),
        "network": (dict(network=()), None, "(allow network*)"),
        "scopes": (dict(scopes=()), "(target same-sandbox)", "(allow signal)"),
    }
    for field, (change, gone, added) in changes.items():
        other = agent.macos_profile(replace(policy, **change))
        lost = set(profile.splitlines()) - set(other.splitlines())
        gained = set(other.splitlines()) - set(profile.splitlines())
        assert lost or gained, field
        if gone:
            assert gone in profile and gone not in other, field
        if added:
            assert added not in profile and added in other, field
    box = agent.Sandbox(Path(os.path.realpath(workdir)), True, agent.Limits())
    box.macos = agent.macos_profile(box.policy)
    call = agent.Call(box)
    try:
        call.deliver(agent.script_bytes("pass"))
        argv = call.command()
        assert argv[:3] == ["/usr/bin/sandbox-exec", "-p", box.macos]
        assert f"OWN_SCRIPT={os.path.realpath(call.script)}" in argv
        assert f"OWN_HOME={os.path.realpath(call.home)}" in argv
    finally:
        call.release()


# --- ordinary scripts still work ---


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
out['awk'] = subprocess.run(['awk', 'BEGIN{print 7}'], capture_output=True, text=True).stdout
sqlite3.connect('db.sqlite').execute('create table t (x)')
zipfile.ZipFile('z.zip', 'w').writestr('a.txt', 'a')
import tempfile; tempfile.NamedTemporaryFile().write(b'x')
import zoneinfo, datetime; out['tz'] = str(datetime.datetime(2026, 1, 1, tzinfo=zoneinfo.ZoneInfo('Asia/Shanghai')))
print(json.dumps(out))
"""
    run = execute(box, workdir, code)
    assert run.code == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["mean"] == 85 and out["stdev"] == 11.79 and out["thread"] is True
    assert "scores.csv" in out["ls"] and out["sh"] == "b\n" and out["awk"] == "7\n"
    assert out["tz"] == "2026-01-01 00:00:00+08:00"
    assert json.loads((workdir / "sub" / "result.json").read_text())["mean"] == 85


@needs_landlock
def test_multiprocessing_with_spawn_works(box, workdir):
    run = execute(
        box,
        workdir,
        "import multiprocessing as mp\n"
        "def square(x):\n"
        "    return x * x\n"
        "if __name__ == '__main__':\n"
        "    mp.set_start_method('spawn')\n"
        "    with mp.Pool(2) as pool:\n"
        "        print(pool.map(square, [1, 2]), mp.Lock().acquire())\n",
    )
    assert run.code == 0 and run.stdout == "[1, 4] True\n", run.stderr


@needs_landlock
def test_numpy_works_where_installed(box, workdir):
    pytest.importorskip("numpy")
    run = execute(box, workdir, "import numpy as np; print(np.std([88, 72, 95]))")
    assert run.code == 0 and run.stdout.startswith("9.6"), run.stderr


# --- startup: detection, self-test, approval policy ---


@needs_landlock
def test_the_status_line_names_every_layer(box):
    assert box.confined
    assert box.status.startswith(f"sandbox: landlock ABI {ABI} (fs, tcp, scope)")
    assert "+ seccomp, no capabilities" in box.status
    assert ("cgroup v" in box.status) is bool(box.cgroup)
    assert ("private 1024 MiB tmpfs" in box.status) is box.mounts


@needs_landlock
def test_the_self_test_runs_at_the_first_run_python_call_not_before(capsys, workdir):
    client = FakeClient(reply(text("no tools needed")))
    _, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--yes"], client)
    assert "sandbox:" not in err
    _, err = run_script(capsys, workdir, "print(1)")[0], run_script(capsys, workdir, "print(1)")[1]
    assert err.count("sandbox: landlock") == 1


def test_no_sandbox_says_so_and_yes_runs_without_asking(capsys, workdir):
    client = FakeClient(reply(tool_use("run_python", {"code": "print(1)"})), reply(text("ok")))
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--yes", "--no-sandbox"], client
    )
    assert code == 0 and "sandbox: off (--no-sandbox)" in err and "[y/N]" not in err


@pytest.mark.parametrize(
    "abi, why",
    [((0, "the kernel has no Landlock"), "no Landlock"), ((3, ""), "ABI 3 cannot block TCP")],
)
def test_without_a_working_sandbox_yes_still_asks(capsys, workdir, monkeypatch, abi, why):
    if sys.platform != "linux":
        pytest.skip("Linux detection path")
    monkeypatch.setattr(agent, "landlock_abi", lambda libc: abi)
    client = FakeClient(
        reply(tool_use("run_python", {"code": "open('ran', 'w')"})), reply(text("ok"))
    )
    code, _, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--yes"], client, stdin="n\n")
    assert code == 0 and "sandbox: unavailable" in err and why in err
    assert "[y/N]" in err and not (workdir / "ran").exists()


@needs_landlock
def test_self_test_catches_a_sandbox_that_lets_reads_through(workdir, monkeypatch):
    monkeypatch.setattr(agent, "SYSTEM_DIRS", agent.SYSTEM_DIRS + ("/tmp",))
    monkeypatch.setattr(agent.tempfile, "tempdir", "/tmp")
    box = agent.Sandbox(Path(os.path.realpath(workdir)), True, agent.Limits())
    assert not box.ready() and "read a file outside" in box.status


# --- environment, time, output ---


def test_child_env_is_an_allowlist(monkeypatch, tmp_path):
    for name in (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "GITHUB_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "SSH_AUTH_SOCK",
        "LD_PRELOAD",
        "PYTHONPATH",
        "LC_API_KEY",
    ):
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("LC_TIME", "C")
    env = agent.child_env(agent.sandbox_policy(tmp_path, agent.Limits()), str(tmp_path))
    assert set(env) <= {
        "PATH",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "LC_TIME",
        "TZ",
        "USER",
        "LOGNAME",
        "HOME",
        "TMPDIR",
        "TEMP",
        "TMP",
        "PYTHONNOUSERSITE",
        "PYTHONSAFEPATH",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "MPLBACKEND",
        "PYTHONUNBUFFERED",
    }
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path) and env["LC_TIME"] == "C"


def test_the_api_key_never_reaches_run_python(capsys, workdir, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok")
    monkeypatch.chdir(workdir)
    (workdir / ".env").write_text("ANTHROPIC_API_KEY=sk-ant-from-dotenv\n")
    client = FakeClient(
        reply(tool_use("run_python", {"code": "import os; print(dict(os.environ))"})),
        reply(text("ok")),
    )
    run_cli(capsys, ["q", "--yes"], client)
    shown = final_messages(client)[-1]["content"][0]["content"]
    assert "HOME" in shown and "sk-ant" not in shown and "tok" not in shown
    assert "ANTHROPIC" not in shown and "ANTHROPIC_API_KEY" not in os.environ.get("X", "")


def test_each_call_has_a_private_home_removed_afterwards(box, workdir):
    run = execute(
        box,
        workdir,
        "import os, stat\nhome = os.environ['HOME']\n"
        "print(home, oct(os.stat(os.path.dirname(home)).st_mode & 0o777))",
    )
    home, mode = run.stdout.split()
    assert mode == "0o700" and home.startswith(agent.tempfile.gettempdir())
    assert not os.path.exists(home) and not os.path.exists(os.path.dirname(home))


def test_stdin_is_empty_and_rlimits_are_set(box, workdir):
    run = execute(
        box,
        workdir,
        "import resource, sys\nprint(repr(sys.stdin.read()))\n"
        "print(resource.getrlimit(resource.RLIMIT_AS)[0] >> 30,\n"
        "      resource.getrlimit(resource.RLIMIT_CORE),\n"
        "      resource.getrlimit(resource.RLIMIT_FSIZE)[0] >> 30,\n"
        "      resource.getrlimit(resource.RLIMIT_CPU)[0],\n"
        "      resource.getrlimit(resource.RLIMIT_SIGPENDING)[0])",
    )
    # core 1, not 0: a limit of 1 also stops a core_pattern pipe helper from being started
    assert run.stdout.split("\n")[:2] == ["''", "4 (1, 1) 1 35 256"]


def sleeper(name):
    """Code that starts a child which writes its pid, as the machine sees it, to `name` and
    sleeps; it goes on once the pid is there."""
    return (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', \"import os, time; open('{name}.tmp', 'w')"
        f".write(os.readlink('/proc/self')); os.rename('{name}.tmp', '{name}'); "
        'time.sleep(60)"])\n'
        f"while not os.path.exists('{name}'):\n"
        "    time.sleep(0.01)\n"
    )


def test_timeout_kills_the_whole_group(box, workdir):
    code = sleeper("child.pid") + "time.sleep(60)\n"
    started = time.monotonic()
    run = execute(box, workdir, code, timeout=1)
    assert run.timed_out and time.monotonic() - started < 5
    assert not alive(int((workdir / "child.pid").read_text()))


STALLED = """
import json, sys; sys.path.insert(0, {agent_dir!r})
import agent
from pathlib import Path
box = agent.Sandbox(Path({workdir!r}), True, agent.Limits())
box.ready()
run = agent.execute({code!r}, box.workdir, box, {timeout}, 1000)
print(json.dumps({{"timed_out": run.timed_out, "code": run.code, "out": run.stdout}}), flush=True)
box.close()
"""


def state_of(pid):
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_stalled_agent_does_not_keep_a_script_past_its_timeout(workdir):
    """Red-team S4: the agent enforces the timeout, and the launcher does too, a grace later
    (LAUNCHER_GRACE), so an agent stopped (SIGSTOP) or stalled mid-call does not let the script
    run on: it is killed while the agent is still stopped. Resumed, the agent reports a timeout,
    as it does when it wins, and nothing of the call is left."""
    code = (
        "import os, time\n"
        "open('info.tmp', 'w').write(f\"{os.environ['HOME']} {os.readlink('/proc/self')}\")\n"
        "os.rename('info.tmp', 'info')\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    timeout = 1
    driver = STALLED.format(
        agent_dir=str(AGENT.parent), workdir=os.path.realpath(workdir), code=code, timeout=timeout
    )
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (workdir / "info").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGSTOP)
        started = time.monotonic()  # the script started a moment before: its timeout runs
        home, pid = (workdir / "info").read_text().split()
        cgroups = cgroups_of(int(pid))
        limit = started + timeout + agent.LAUNCHER_GRACE + 5  # (slack for a loaded machine)
        while alive(int(pid)) and time.monotonic() < limit:
            time.sleep(0.05)
        assert not alive(int(pid)), "the script ran on past its timeout while the agent stalled"
        assert state_of(proc.pid) == "T", "the agent was not stopped all along"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert json.loads(out) == {"timed_out": True, "code": None, "out": "started\n"}
    deadline = time.monotonic() + 5
    while (
        os.path.exists(os.path.dirname(home)) or any(d.exists() for d in cgroups)
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(os.path.dirname(home)), "the call's directory outlived the call"
    assert not [d for d in cgroups if d.exists()], "the call's cgroup outlived the call"


@needs_landlock
def test_a_stopped_launcher_does_not_keep_a_script_past_its_timeout(box, workdir):
    """Issue 33: the launcher stopped mid-call (kill -STOP), and with it every process of the
    call whose command line names agent.py, as `pkill -STOP -f agent.py` would: the call's first
    process still ends the script and its child at the timeout plus LAUNCHER_GRACE. Continued,
    the launcher runs the next call."""
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        f"    open('child.tmp', 'w').write(f'{{{HOST_PID}}}')\n"
        "    os.rename('child.tmp', 'child')\n"
        "    time.sleep(60)\n"
        "while not os.path.exists('child'):\n"
        "    time.sleep(0.01)\n"
        f"open('pids.tmp', 'w').write(f'{{{HOST_PID}}} ' + open('child').read())\n"
        "os.rename('pids.tmp', 'pids')\n"
        "time.sleep(60)\n"
    )
    timeout = 2
    runs = []
    call = threading.Thread(target=lambda: runs.append(execute(box, workdir, code, timeout)))
    call.start()
    deadline = time.monotonic() + 60
    while not (workdir / "pids").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    # the script started a moment before: its timeout runs from before this
    started = time.monotonic()
    script, child = map(int, (workdir / "pids").read_text().split())
    launcher = box.launcher.pid
    stopped = [launcher]
    for pid in descendants(launcher):
        with contextlib.suppress(OSError):
            if b"agent.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                stopped.append(pid)
    try:
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        # (slack for a loaded machine)
        limit = started + timeout + agent.LAUNCHER_GRACE + 5
        while (alive(script) or alive(child)) and time.monotonic() < limit:
            time.sleep(0.05)
        ran_on = [pid for pid in (script, child) if alive(pid)]
        assert state_of(launcher) == "T", "the launcher was not stopped all along"
    finally:
        for pid in stopped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        call.join()
    assert ran_on == [], "the call ran on past its timeout while its launcher was stopped"
    assert runs[0].timed_out
    run = execute(box, workdir, "print('after')")
    assert (run.code, run.stdout) == (0, "after\n"), run.stderr


BIG = "é" + "x" * 99_998  # 100,000 bytes as UTF-8, 100,004 as the JSON of a request


@pytest.mark.parametrize(
    "names", [["LC_FOO"], [f"LC_BIG{i}" for i in range(12)]], ids=["100-kb", "1.2-mb"]
)
def test_a_large_environment_reaches_the_script_whole(box, workdir, monkeypatch, names):
    """An LC_* variable of 100 KB (or twelve of them: more than one socket message holds)
    reaches the script as a small one does; before, the launcher's read of the request was
    cut at 64 KiB and it died, and every call after it was refused."""
    for i, name in enumerate(names):
        monkeypatch.setenv(name, BIG + str(i))
    code = (
        "import os\n"
        f"for i, name in enumerate({names!r}):\n"
        f"    assert os.environ[name] == {BIG!r} + str(i), name\n"
        f"print(len(os.environ[{names[0]!r}]))\n"
    )
    run = execute(box, workdir, code)
    assert (run.code, run.stdout) == (0, f"{len(BIG) + 1}\n"), run.stderr
    for name in names:
        monkeypatch.delenv(name)
    assert execute(box, workdir, "print('next')").stdout == "next\n"


@pytest.mark.parametrize(
    "names, size, said",
    [
        (["LC_HUGE"], 200_000, "LC_HUGE is 200,008 bytes, and Linux"),
        ([f"LC_BIG{i}" for i in range(70)], 100_000, "variables take 7,00"),
    ],
    ids=["one", "all"],
)
def test_an_environment_no_program_can_get_is_one_line_and_nothing_runs(
    box, workdir, monkeypatch, names, size, said
):
    """What execve would refuse (Linux: one variable over 128 KiB, or all of them over the
    exec's room, at most 6 MiB): one line that names it and what to do, nothing run, and the
    launcher still serves the next call."""
    for name in names:
        monkeypatch.setenv(name, "x" * size)
    with pytest.raises(agent.ToolError) as raised:
        execute(box, workdir, "open('ran', 'w').close()")
    assert "\n" not in str(raised.value) and said in str(raised.value), raised.value
    assert names[0][:6] in str(raised.value).split("unset or shorten ")[1]  # (the largest)
    assert str(raised.value).endswith("; nothing was run")
    assert not (workdir / "ran").exists()
    for name in names:
        monkeypatch.delenv(name)
    assert execute(box, workdir, "print('next')").stdout == "next\n"


def test_a_grandchild_left_running_dies_when_the_script_exits(box, workdir):
    code = sleeper("child.pid")
    started = time.monotonic()
    run = execute(box, workdir, code)
    assert run.code == 0 and time.monotonic() - started < 5
    time.sleep(0.1)
    assert not alive(int((workdir / "child.pid").read_text()))


def test_the_call_ends_only_once_a_process_it_left_is_gone(box, workdir):
    """The script's end is reported early only when nothing of it runs (init alone): a child
    that holds none of the call's pipes, so that nothing else makes the agent wait for it, is
    gone the moment execute returns (no grace allowed). Reported too early, the child still
    lives then in about half the calls: five calls make that a failure nearly always."""
    for i in range(5):
        code = sleeper(f"child{i}.pid").replace(
            'time.sleep(60)"])', 'time.sleep(60)"], stdout=-3, stderr=-3, stdin=-3)'
        )
        assert "stdout=-3" in code
        run = execute(box, workdir, code)
        assert run.code == 0
        assert not alive(int((workdir / f"child{i}.pid").read_text())), f"call {i + 1}"


def test_the_first_process_says_alone_only_when_no_child_runs():
    """The call's first process reports the script's end before its own exit only when it has
    no child left (children_left): a child still running, or one ended but not yet reaped, is
    seen. Run in a Python of its own, whose only children are the probe's."""
    probe = f"""
import os, subprocess, sys
sys.path.insert(0, {str(Path(agent.__file__).parent)!r})
import agent
running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
print(agent.children_left())
running.kill()
os.waitid(os.P_PID, running.pid, os.WEXITED | os.WNOWAIT)
print(agent.children_left())
try:
    os.waitpid(running.pid, os.WNOHANG)
except ChildProcessError:
    print("reaped")
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "False", "reaped"], done.stdout + done.stderr


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
box = agent.Sandbox(wd, False, agent.Limits())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run = agent.execute("import sys\\nblock = 'x' * 1023 + '\\\\n'\\nfor _ in range(50 * 1024):\\n    sys.stdout.write(block)\\n", wd, box, 60, 30000)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(after - before, len(run.stdout), run.stdout.count('bytes cut'))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    grown_kb, kept, notes = map(int, done.stdout.split())
    assert notes == 1 and kept < 15_100
    assert grown_kb < 10_000, f"peak RSS grew {grown_kb} KB while 50 MB went through"


def test_the_launcher_runs_the_agents_own_source_never_a_bytecode_cache(
    request, tmp_path, agent_copy
):
    """Red-team S3: the launcher imported agent.py, so it read (and wrote, as root) the .pyc in
    agent.py's __pycache__; a script whose workdir was that directory planted one with an
    unchecked hash (never compared with agent.py), and the NEXT run's launcher ran it: root,
    unconfined, in the process that confines every call. Now the launcher runs the source the
    agent itself runs, handed over on its stdin; and that cache is no workdir."""
    cache = agent_copy.parent / "__pycache__"
    cache.mkdir()
    marker = tmp_path / "PWNED"
    source = compile(agent_copy.read_text(), str(agent_copy), "exec")
    payload = compile(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        f"exec(__import__('marshal').loads({marshal.dumps(source)!r}), globals())\n",
        str(agent_copy),
        "exec",
    )
    for name in ("agent", "agent_launcher"):  # (what the launcher imported, and any name it may)
        (cache / f"{name}.{sys.implementation.cache_tag}.pyc").write_bytes(
            MAGIC_NUMBER + (1).to_bytes(4, "little") + b"\0" * 8 + marshal.dumps(payload)
        )
    planted = sorted((p.name, p.read_bytes()) for p in cache.iterdir())
    workdir = tmp_path / "work"
    workdir.mkdir()
    api = serve(
        request, reply(tool_use("run_python", {"code": "print('ran here')"})), reply(text("done"))
    )
    done = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        "--yes",
        "--no-keep",
        "--transcript",
        tmp_path / "t.json",
        env=agent_env(api),
        cwd=tmp_path,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    results = [
        b
        for m in json.loads((tmp_path / "t.json").read_text())["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert "ran here" in json.dumps(results) and "sandbox: landlock" in done.stderr, done.stderr
    assert not marker.exists(), "a planted .pyc ran, unconfined, in the launcher"
    assert sorted((p.name, p.read_bytes()) for p in cache.iterdir()) == planted  # none written
    again = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        cache,
        "--yes",
        "--no-keep",
        env=agent_env(api),
        cwd=tmp_path,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert again.returncode == 2 and "__pycache__ (" in again.stderr, again.stderr
