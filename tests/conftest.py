"""The fixtures. What every test gets: none of the user's config, a home of its own (nothing
written in the real one), no network beyond loopback, no request the real API would reject,
and nothing left behind in the temp directory. And what tests ask for by name: workdir, ctx,
spans, agent_copy, as_nobody. Helper functions are in helpers.py. Harbor's container jobs
run only when asked (HARBOR_ASKED)."""

import gc
import json
import os
import pwd
import re
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import fakes
import pytest
from helpers import AGENT, OTHER_USERS, kept_by_the_tests, loopback, schema_errors, tool_context

import agent

HARBOR_ASKED = (
    "Harbor's jobs in podman containers (minutes, on the host's network) run only when asked: "
    "`pytest -m harbor`, or AGENT_HARBOR=1 (CI=true and .ci/run run them)"
)


def harbor_asked(config):
    """Harbor's tests start real jobs in podman containers, on the host's network, for minutes:
    they run only under CI, with AGENT_HARBOR=1, or when `-m` names them."""
    return bool(
        os.environ.get("CI")
        or os.environ.get("AGENT_HARBOR") == "1"
        or re.search(r"\bharbor\b", config.getoption("markexpr") or "")
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if harbor_asked(config):
        return
    skip = pytest.mark.skip(reason=HARBOR_ASKED)
    for item in items:
        if item.get_closest_marker("harbor"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_test_hangs(request):
    """A test that would hang (an open of a FIFO nobody reads, a stream that never ends) fails
    after 4 minutes instead, with the place it hung: no test takes near that long."""
    if request.node.get_closest_marker("live") or request.node.get_closest_marker("harbor"):
        # (each Harbor job is bounded by its subprocess timeout instead)
        yield
        return

    def expire(signum, frame):
        raise TimeoutError("the test ran for 240 s: something in it hangs")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(240)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def own_home(setenv, home, state):
    """HOME and the XDG directories in `home` (and XDG_STATE_HOME at `state`): what the tests
    run (agent.py, a subprocess, a browser, Harbor) writes there, never in the real home."""
    # (not made ahead: what writes there makes them, and each test's would cost a mkdir)
    setenv("XDG_CONFIG_HOME", str(home / ".config"))
    setenv("XDG_CACHE_HOME", str(home / ".cache"))
    setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    setenv("HOME", str(home))
    setenv("XDG_STATE_HOME", str(state))


@pytest.fixture(scope="session", autouse=True)
def session_home(nothing_kept_in_the_real_home, nothing_written_in_the_real_home, tmp_path_factory):
    """A home of the session's for what module and session fixtures start (a browser, Harbor's
    jobs); each test then gets its own (no_user_config). Set after the real home was looked at."""
    with pytest.MonkeyPatch.context() as patch:
        own_home(patch.setenv, tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("state"))
        yield


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path_factory):
    """No ANTHROPIC_* from the environment, no .env found anywhere, a cwd of the test's own,
    and a home and state directory of the test's own: the runs agent.py keeps (in-process, or in
    a subprocess, which inherits the environment) never go to the real home."""
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC", "AGENT_PY_")):
            monkeypatch.delenv(name)
    monkeypatch.setattr(agent, "dotenv_path", lambda: None)
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    own_home(monkeypatch.setenv, tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("state"))
    agent.SECRETS.clear()


def real_runs():
    """The files of kept runs in the real home (or the state directory the tests were started
    with), with when each was last changed."""
    state = os.environ.get("XDG_STATE_HOME", "")
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    places = {home / ".local" / "state" / "agent.py"} | (
        {Path(state) / "agent.py"} if os.path.isabs(state) else set()
    )
    found = {}
    for place in places:
        for path in place.rglob("*"):
            try:
                found[path] = path.stat().st_mtime_ns
            except OSError:  # a save's temporary file, renamed meanwhile
                pass
    return found


@pytest.fixture(scope="session", autouse=True)
def nothing_kept_in_the_real_home(tmp_path_factory):
    """No test leaves a kept run in the real home. What agent.py keeps there while the tests
    run may be the user's own (or, on a shared machine, another session's) runs, even README's
    `--workdir workspace` in this checkout: a new or changed file counts as the tests' only if
    a workdir it records lies in this session's temporary directory (kept_by_the_tests)."""
    before, basetemp = real_runs(), tmp_path_factory.getbasetemp()
    yield
    left = sorted(
        str(p)
        for p, changed in real_runs().items()
        if before.get(p) != changed and kept_by_the_tests(p, basetemp)
    )
    assert not left, f"tests kept runs in the real home: {left[:5]}"


# Where the programs the tests run would write in a home: Harbor's notices, the browser's
# profile and caches. With HOME and the XDG directories in tmp (own_home) nothing lands there.
HOME_PLACES = (
    ".cache/harbor",
    ".config/chromium",
    ".cache/chromium",
    ".cache/ms-playwright",
    ".cache/fontconfig",
    ".pki",
    ".local/share/harbor",
)


def real_home_files():
    """The entries at the top of the real home, and every file in HOME_PLACES there."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    found = set(home.iterdir()) if home.is_dir() else set()
    for place in HOME_PLACES:
        found |= set((home / place).rglob("*"))
    return found


@pytest.fixture(scope="session", autouse=True)
def nothing_written_in_the_real_home():
    """No test, subprocess or browser adds a file to the real home (a program another session
    runs on this machine meanwhile would be blamed too: the places looked at are few)."""
    before = real_home_files()
    yield
    added = sorted(map(str, real_home_files() - before))
    assert not added, f"the tests wrote in the real home: {added[:5]}"


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Any connection or name lookup beyond loopback fails the test (and the call)."""
    tried = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def guard(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not loopback(address[0]):
            tried.append(address)
            raise ConnectionRefusedError(f"test tried to reach {address} beyond loopback")

    def connect(sock, address):
        guard(sock, address)
        return real_connect(sock, address)

    def connect_ex(sock, address):
        guard(sock, address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if not loopback(name):
            tried.append(name)
            raise socket.gaierror(f"test tried to look up {name}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield tried  # a test of this guard takes the list and empties it
    assert not tried, f"the test reached beyond loopback: {tried}"


@pytest.fixture(autouse=True)
def no_rejected_requests():
    """Every request a FakeClient saw must be one the real API would accept."""
    fakes.ALL_CLIENTS.clear()
    yield
    rejected = [
        v
        for c in fakes.ALL_CLIENTS
        if not getattr(c, "expect_rejection", False)
        for v in c.violations
    ]
    assert not rejected, f"the API would reject a request: {rejected}"


@pytest.fixture(autouse=True)
def no_request_a_fake_api_rejected(request):
    """Every request a FakeAPI of the test's (helpers.serve) saw must be one the real API would
    accept."""
    yield
    for api in getattr(request.node, "apis", []):
        assert not api.rejected, f"the API would reject a request: {api.rejected}"


@dataclass(frozen=True)
class QuickRetries(agent.Limits):
    retry_base: float = 0.01


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """A run in the test's process backs off 0.01 s, not 0.5 s, before its first retry (a
    server's retry-after still counts as given): five failed attempts cost 0.15 s, not 7.5 s.
    How long agent.py waits is tested on retry_delay itself, and in the subprocess runs."""
    monkeypatch.setattr(agent, "Limits", QuickRetries)


@pytest.fixture(autouse=True)
def documents_match_their_schema(monkeypatch):
    """Every transcript, event and trials summary a test makes agent.py write is checked
    against the schema `python agent.py --schema` publishes."""
    real, errors = agent.dump, []

    def dump(document):
        data = real(document)
        errors.extend(schema_errors(json.loads(data)))
        return data

    def encode(saver, document):  # a transcript save, encoded piece by piece
        data = real_encode(saver, document)
        errors.extend(schema_errors(json.loads(data), "transcript"))
        return data

    real_encode = agent.Saver.encode
    monkeypatch.setattr(agent, "dump", dump)
    monkeypatch.setattr(agent.Saver, "encode", encode)
    yield
    assert not errors, errors[:5]


def agent_paths(temp_dirs, cgroups):
    """This user's agent-* directories in the temp directories (a call's, a self-test's canary,
    a test's own agent-test-*), and the agent-* cgroups."""
    found = set()
    for parent in temp_dirs:
        for path in Path(parent).glob("agent-*"):
            try:
                if path.lstat().st_uid == os.getuid():
                    found.add(str(path))
            except FileNotFoundError:  # removed since the listing: by its launcher, say
                pass
    return found | {str(p) for parent in cgroups for p in Path(parent).glob("agent-*")}


def still_cleaning(basetemp):
    """The processes of this session that may still be removing a call's directory or cgroup:
    a fork of this process, and a process run from the session's temp directory (a copy of
    agent.py, or a driver of agent.execute). A launcher removes what it made when its Sandbox is
    closed or dropped (below)."""
    me, own, found = os.getpid(), Path("/proc/self/cmdline").read_bytes(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            state, parent = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            cmdline = (proc / "cmdline").read_bytes()
            if state == "Z" or proc.stat().st_uid != os.getuid():
                continue
        except (OSError, ValueError):  # gone meanwhile
            continue
        if int(parent) == me and cmdline == own or os.fsencode(basetemp + os.sep) in cmdline:
            found.append(int(proc.name))
    return found


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_tmp(tmp_path_factory):
    """agent.py's per-call directories, canaries and cgroups, and the tests' own agent-test-*
    directories, are gone when the tests are. A launcher may still be removing a call's
    directory when the last test ends: the check first waits for whatever of this session
    may still be at it, then gives what is left 20 seconds more (another session's run on
    this machine makes and removes such directories too: only what stays is left behind)."""
    temp_dirs = {tempfile.gettempdir(), "/tmp"}
    cgroups = (agent.cgroup_parents() or (None, []))[1]
    basetemp = str(tmp_path_factory.getbasetemp())
    before = agent_paths(temp_dirs, cgroups)
    yield
    gc.collect()  # a Sandbox in a reference cycle, or one pytest still holds (the last test's):
    for box in [o for o in gc.get_objects() if isinstance(o, agent.Sandbox)]:
        box.close()  # its launcher removes what it prepared for a next call when it goes
    deadline = time.monotonic() + 120
    while (
        agent_paths(temp_dirs, cgroups) - before
        and still_cleaning(basetemp)
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    left, deadline = agent_paths(temp_dirs, cgroups) - before, time.monotonic() + 20
    while left & agent_paths(temp_dirs, cgroups) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = sorted(left & agent_paths(temp_dirs, cgroups))
    assert not left, f"left behind: {left}; still running: {still_cleaning(basetemp)}"


@pytest.fixture
def workdir(tmp_path):
    """A small workdir like workspace/, with a secret next to it."""
    wd = tmp_path / "work"
    wd.mkdir()
    (wd / "scores.csv").write_text("name,score\nAlice,88\nBob,72\nChen,95\n")
    (wd / "notes.md").write_text("# Notes\nline two\n")
    (tmp_path / "secret.txt").write_text("top secret\n")
    return wd


@pytest.fixture
def ctx(workdir, tmp_path):
    """A ToolContext on the workdir: no sandbox, every run_python call approved."""
    return tool_context(workdir, tmp_path)


@pytest.fixture
def spans(monkeypatch):
    """--otel with the SDK's in-memory exporter in place of OTLP: the finished spans as they
    leave (after agent.py's own door, Counted), of every run in the test."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memories, real_start = [], agent.Telemetry.start

    def start(report):
        telemetry = real_start(report)  # what the environment says (content or not), then
        memories.append(InMemorySpanExporter())  # spans kept in memory instead of sent (one
        provider = TracerProvider()  # exporter a run: the end of a run shuts its own down)
        counted = agent.Counted(memories[-1])
        counted.where = "memory"
        provider.add_span_processor(SimpleSpanProcessor(counted))
        return agent.Telemetry(provider, counted, telemetry.content)

    monkeypatch.setattr(agent.Telemetry, "start", staticmethod(start))
    return lambda: [span for memory in memories for span in memory.get_finished_spans()]


@pytest.fixture
def agent_copy(tmp_path):
    """agent.py alone in a directory: no .env of the user's beside it, nothing else."""
    copy = tmp_path / "agent" / "agent.py"
    copy.parent.mkdir()
    shutil.copy(AGENT, copy)
    return copy


@pytest.fixture
def as_nobody(request):
    """What a test that runs agent.py as `nobody` needs, where nobody can read it: the checkout
    may be in a 0700 home or temp directory, so agent.py is copied to a directory of its own in
    /tmp (root's, sticky and open to all, as /tmp is), beside a directory that nobody owns. All
    of it is removed after the test however it ends, what nobody made there included."""
    if OTHER_USERS:
        pytest.skip(OTHER_USERS)
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no /usr/bin/python3 an ordinary user can run")
    if not os.stat("/tmp").st_mode & 0o001:
        pytest.skip("/tmp is closed to other users: nowhere to put what nobody runs")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user `nobody` here")
    top = Path(tempfile.mkdtemp(prefix="agent-test-nobody-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(top))
    top.chmod(0o1777)  # nobody may remove what it owns in it, and nothing else
    shutil.copyfile(AGENT, top / "agent.py")
    (top / "agent.py").chmod(0o644)
    (top / "nobody").mkdir()
    os.chown(top / "nobody", nobody.pw_uid, nobody.pw_gid)
    return SimpleNamespace(python=python, user=nobody, agent_dir=top, dir=top / "nobody")
