"""What more than one test file uses: running the CLI (in-process, or as a subprocess), a local
Messages API per test, tool contexts, and reading and checking what a run wrote.

The test doubles are in their own modules: fakes.py (FakeClient and reply builders),
fake_api.py (a loopback Messages API), api_rules.py (the request checker), cache_model.py and
bpf.py. The fixtures are in conftest.py. No test module imports another one (test_api_rules.py
checks that).
"""

import io
import ipaddress
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import pytest
from fake_api import FakeAPI
from fakes import FakeAPIError, FakeClient, reply, text, tool_use

import agent

AGENT = Path(agent.__file__).resolve()
DOTENV_PATH = agent.dotenv_path  # the real one, for the tests of .env itself (conftest.py
# replaces it for every test)


class Silent(agent.Reporter):
    def line(self, *a, **k):
        pass


# --- the CLI, in-process or as a user runs it ---


def run_cli(capsys, argv, client=None, api=None, stdin="", **limits):
    """Run the CLI in-process; return (exit code, stdout, stderr). The model is `client` (a
    FakeClient), or the real SDK against `api` (a FakeAPI, made with `limits`), or, with
    neither, whatever main() makes of the config. `stdin` answers the approval prompt: a
    string, or a file-like object."""
    if api is not None:
        assert client is None, "a FakeClient or a FakeAPI, not both"
        client = sdk_client(api, **limits)
    else:
        assert not limits, "limits go to the SDK client made for `api`"
    code = agent.main(
        argv, client=client, stdin=io.StringIO(stdin) if isinstance(stdin, str) else stdin
    )
    out, err = capsys.readouterr()
    return code, out, err


DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, every request fails


def agent_env(api=None, **extra):
    """An environment with none of the user's ANTHROPIC_* and no way off loopback: any request
    not to 127.0.0.1 goes to a proxy that is not there."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ANTHROPIC") and "proxy" not in k.lower()
    }
    env.update(
        HTTPS_PROXY=DEAD_PROXY,
        HTTP_PROXY=DEAD_PROXY,
        ALL_PROXY=DEAD_PROXY,
        NO_PROXY="127.0.0.1,localhost",
        **extra,
    )
    if api is not None:
        env.update(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url)
    return env


def run_agent_py(script, *args, flags=(), background=False, **kwargs):
    """`python [flags] agent.py ARGS` in a subprocess, as a user runs it (give env=agent_env()):
    to its end, output captured as text (a CompletedProcess); or, with background, left
    running (a Popen, text mode)."""
    argv = [sys.executable, *flags, str(script), *map(str, args)]
    if background:
        return subprocess.Popen(argv, text=True, **kwargs)
    return subprocess.run(argv, capture_output=True, text=True, **kwargs)


MEASURE = """import os, sys, time
start = time.monotonic()
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable] + sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss, time.monotonic() - start)
"""  # a small interpreter forks agent.py: a fork of pytest would count pytest's pages too


def measured(script, *args, cwd):
    """`python agent.py ARGS` as a user runs it, measured: (exit code, stderr, peak RSS in MiB,
    seconds) of that process alone."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=agent_env(),
        timeout=200,
        stdin=subprocess.DEVNULL,
    )
    code, rss, seconds = done.stdout.split()[-3:]
    return int(code), done.stderr, int(rss) / 1024, float(seconds)


# --- what root may do here: probed, for the tests that act as another user ---


def unmapped(uid):
    """`; uid N is not mapped in this user namespace (...)`, when /proc/self/uid_map says so."""
    try:
        ranges = [
            tuple(map(int, line.split()))
            for line in Path("/proc/self/uid_map").read_text().splitlines()
        ]
    except (OSError, ValueError):
        return ""
    if any(inside <= uid < inside + count for inside, _, count in ranges):
        return ""
    shown = "; ".join(" ".join(map(str, r)) for r in ranges)
    return f": uid {uid} is not mapped in this user namespace (/proc/self/uid_map: {shown})"


def probe_other_users(uids=(65534, 12345, 1)):
    """None if this process can give a file to each of `uids` (what the tests that plant another
    user's files, or run as `nobody`, need); else why not, as the skip reason: not root, or root
    in a user namespace that maps no other uid (`unshare -Ur`, a rootless container)."""
    if os.geteuid() != 0:
        return "needs root, to make files another user owns and to run as another user"
    with tempfile.TemporaryDirectory() as d:
        probe = os.path.join(d, "probe")
        open(probe, "w").close()
        for uid in uids:
            try:
                os.chown(probe, uid, uid)
            except OSError as e:
                return (
                    f"needs root able to act as another user, and os.chown to uid {uid} "
                    f"fails here ({e.strerror}){unmapped(uid)}"
                )
    return None


def probe_mknod():
    """None if this process can make a character device node (1, 3: what /dev/null is); else
    why not, as the skip reason."""
    with tempfile.TemporaryDirectory() as d:
        try:
            os.mknod(os.path.join(d, "null"), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except OSError as e:
            return f"needs to make a device node, and os.mknod fails here ({e.strerror})"
    return None


OTHER_USERS = probe_other_users()  # None, or why the tests cannot act as another user here
MKNOD = probe_mknod()  # None, or why no device node can be made here
as_other_users = pytest.mark.skipif(OTHER_USERS is not None, reason=str(OTHER_USERS))


def need_other_users():
    """Skip the test, saying why, where this process cannot act as another user."""
    if OTHER_USERS:
        pytest.skip(OTHER_USERS)


# --- a local Messages API for the real SDK ---


def serve(request, *script, **options):
    """A FakeAPI serving `script` for this test; stopped after it, and every request it rejected
    fails the test (conftest.py)."""
    api = FakeAPI(script, **options).__enter__()
    request.node.apis = getattr(request.node, "apis", []) + [api]
    request.addfinalizer(lambda: api.__exit__(None, None, None))
    return api


def sdk_client(api, **limits):
    return agent.make_client(
        {"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_MODEL": None},
        agent.Limits(**limits),
    )


# --- tools and the loop, without the CLI ---


def unconfined(workdir):
    return agent.Sandbox(workdir, False, agent.Limits())


def tool_context(workdir, tmp_path, limits=None):
    """A ToolContext on `workdir`: no sandbox, every run_python call approved."""
    workdir = Path(os.path.realpath(workdir))  # (run_python works in its sandbox's workdir)
    return agent.ToolContext(
        workdir, limits or agent.Limits(), unconfined(workdir), approve=lambda code: True
    )


def call(ctx, name, **args):
    """One tool call through the dispatcher; its tool_result."""
    return agent.call_tool(tool_use(name, args), ctx)[0]


def drive(client, workdir, tmp_path, **limits):
    """agent.drive on a new session, no retry delay; return (stop, session)."""
    session = agent.new_session("q", "claude-haiku-5-5", workdir, None)
    limits = agent.Limits(retry_base=0.0, **limits)
    ctx = tool_context(workdir, tmp_path, limits)
    stop = agent.drive(client, session, ctx, Silent(quiet=True), agent.Saver(None))
    return stop, session


# --- what a run wrote ---


def final_messages(client):
    return client.requests[-1]["messages"]


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


def strict(schema):
    """The published schema, with no field allowed that it does not name: what agent.py
    writes today must all be documented (readers of a version should still let new ones by)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema:
            schema.setdefault("additionalProperties", False)
    elif isinstance(schema, list):
        schema = [strict(v) for v in schema]
    return schema


VALIDATORS = {
    name: jsonschema.Draft202012Validator(strict(schema), format_checker=jsonschema.FormatChecker())
    for name, schema in agent.SCHEMAS.items()
}


def kind_of(document):
    if isinstance(document, dict):
        if document.get("kind") == "trials":
            return "summary"
        if "seq" in document and "type" in document:
            return "events"
        if "messages" in document:
            return "transcript"
    return None


def schema_errors(document, kind=None):
    kind = kind or kind_of(document)
    return (
        [
            f"{kind}: {'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in VALIDATORS[kind].iter_errors(document)
        ]
        if kind
        else []
    )


def loopback(host):
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def lone_surrogates(document):
    """The strings in a document agent.py wrote (its bytes, or JSON already read) that hold a
    lone surrogate, which is not Unicode: none may. Bytes must be UTF-8 to begin with."""
    if isinstance(document, bytes):
        document = document.decode("utf-8")  # raises on a raw surrogate or any invalid byte
        try:
            document = json.loads(document)
        except json.JSONDecodeError:  # JSON Lines, or a page: its text itself
            lines = document.splitlines()
            try:
                document = [json.loads(line) for line in lines]
            except json.JSONDecodeError:
                document = lines
    if isinstance(document, dict):
        document = [*document.keys(), *document.values()]
    if isinstance(document, list):
        return [s for item in document for s in lone_surrogates(item)]
    return (
        [document]
        if isinstance(document, str) and any("\ud800" <= ch <= "\udfff" for ch in document)
        else []
    )


def surrogate_run(capsys, tmp_path, *flags):
    """A run where text that is not Unicode comes in by every route it can: a workdir whose name
    is not UTF-8, a server's error message and reply text with a lone surrogate, a tool call on
    a file name that holds one. Returns (exit code, the transcript's path, stderr)."""
    workdir = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), b"w\xe9")))
    workdir.mkdir()
    (workdir / "scores.csv").write_text("name,score\nAlice,88\n")
    busy = FakeAPIError(529, "overloaded_error", "busy \ud800", {"retry-after": "0"})
    client = FakeClient(
        busy,
        reply(text("bad \ud800 text"), tool_use("read_file", {"path": "caf\udce9.csv"})),
        reply(text("done \udce9")),
    )
    transcript = tmp_path / "run.json"
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(transcript), *flags], client
    )
    return code, transcript, err


def with_lone_surrogates(path):
    """A copy of the transcript at `path` whose every U+FFFD is the JSON escape of a lone
    surrogate again, as a forged or older file may hold: what reads it must not pass one on."""
    forged = path.with_name("forged.json")
    forged.write_text(path.read_text().replace("\ufffd", "\\ud800"))
    assert lone_surrogates(forged.read_bytes())
    return forged


def documented(doc, start):
    """What docs/DOC (or README.md) shows agent.py printing that begins with `start`: each line
    of a code block, and each `inline` quote (its wrapping undone)."""
    text = (AGENT.parent / doc).read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(start)]
    quoted = re.findall(r"`(" + re.escape(start) + r"[^`]*)`", " ".join(text.split()))
    found = lines + quoted
    assert found, f"{doc} shows no line beginning {start!r}"
    return found


def as_documented(line, template):
    """Does `line`, as agent.py printed it, read as the documented `template`? Placeholders: N
    and M (a number), URL, and (why) (any reason in parentheses)."""
    means = {" N ": r" \d+ ", " M ": r" \d+ ", "URL": r"\S+", "(why)": r"\(.+\)"}
    pattern = "".join(
        means.get(part, re.escape(part)) for part in re.split(r"( N | M |URL|\(why\))", template)
    )
    return re.fullmatch(pattern, line) is not None


def budget_stopped(capsys, workdir, path):
    """A run the token budget stops with its tool call (toolu_X) unanswered, saved at `path`."""
    client = FakeClient(
        reply(
            text("Let me read."),
            tool_use("read_file", {"path": "scores.csv"}, id="toolu_X"),
            input_tokens=2000,
        )
    )
    code, _, _ = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--token-budget", "1000", "--transcript", str(path)],
        client,
    )
    assert code == 4


def kept_by_the_tests(path, basetemp):
    """True if the kept run at `path` is one the tests made: what the real-home check in
    conftest.py blames. The user's own runs, made while the suite runs, are not blamed:
    every test's workdir lies under the session's basetemp; a kept file counts if a workdir it
    records does (or, half-written and not yet JSON, if it names basetemp at all)."""
    base = os.path.realpath(basetemp)
    try:
        data = path.read_bytes()
    except OSError:  # replaced or removed meanwhile: not a run the tests left
        return False
    try:
        todo, workdirs = [json.loads(data)], []
    except ValueError:
        return base.encode() in data
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            workdirs += [v for k, v in item.items() if k == "workdir" and isinstance(v, str)]
            todo += item.values()
        elif isinstance(item, list):
            todo += item
    return any(Path(os.path.realpath(w)).is_relative_to(base) for w in workdirs)
