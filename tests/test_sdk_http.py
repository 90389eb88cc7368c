"""The real anthropic SDK against a local Messages API (fake_api.py): streams, retries, CLI."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import agent
from fake_api import FakeAPI
from fakes import RECORDED, alive, recorded_loop, reply, text, tool_use

AGENT = Path(agent.__file__).resolve()


@pytest.fixture(autouse=True)
def no_rejections(request):
    yield
    for api in getattr(request.node, "apis", []):
        assert not api.rejected, f"the API would reject a request: {api.rejected}"


def serve(request, *script):
    api = FakeAPI(script).__enter__()
    request.node.apis = getattr(request.node, "apis", []) + [api]
    request.addfinalizer(lambda: api.__exit__(None, None, None))
    return api


def sdk_client(api, **limits):
    return agent.make_client({"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url,
                              "ANTHROPIC_MODEL": None}, agent.Limits(**limits))


def run(capsys, api, argv, stdin="", **limits):
    import io
    code = agent.main(argv, client=sdk_client(api, **limits), stdin=io.StringIO(stdin))
    out, err = capsys.readouterr()
    return code, out, err


def overloaded():
    return {"status": 529, "body": {"type": "error", "error": {"type": "overloaded_error",
                                                               "message": "Overloaded"}}}


def test_a_recorded_thinking_stream_goes_back_exactly_as_the_api_accepted_it(
        request, capsys, workdir):
    accepted = recorded_loop("thinking_tool_use_stream_loop.jsonl")[1]["request"]["body"]
    api = serve(request, {"sse": "thinking_tool_use_stream.sse"}, reply(text("done")))
    code, _, _ = run(capsys, api, ["q", "--workdir", str(workdir)])
    assert code == 0
    sent, recorded = api.requests[1]["messages"][1]["content"], accepted["messages"][1]["content"]
    assert sent[0] == recorded[0]  # thinking text and signature exactly as streamed
    assert sent[1].pop("caller") == {"type": "direct"}  # in the stream; that client dropped it
    assert sent[1] == recorded[1]


def test_a_recorded_parallel_stream_gets_both_results_in_one_message(request, capsys, workdir):
    api = serve(request, {"sse": "parallel_tool_use_stream.sse"}, reply(text("done")))
    code, _, _ = run(capsys, api, ["q", "--workdir", str(workdir)])
    uses = [b["id"] for b in api.requests[1]["messages"][1]["content"] if b["type"] == "tool_use"]
    results = api.requests[1]["messages"][2]["content"]
    assert code == 0 and len(uses) == 2 and [r["tool_use_id"] for r in results] == uses


def test_overloaded_is_retried_and_the_sdk_adds_no_retries_of_its_own(request, capsys, workdir):
    api = serve(request, overloaded(), reply(text("ok")))
    code, out, err = run(capsys, api, ["q", "--workdir", str(workdir)])
    assert (code, out, len(api.requests)) == (0, "ok\n", 2) and "retrying" in err


def test_five_requests_per_turn_at_most(request, capsys, workdir):
    limited = [dict(overloaded(), headers={"retry-after": "0"}) for _ in range(6)]
    api = serve(request, *limited)
    code, _, err = run(capsys, api, ["q", "--workdir", str(workdir)])
    assert (code, len(api.requests)) == (1, 5) and "Overloaded" in err


def test_an_error_event_mid_stream_is_retried(request, capsys, workdir):
    api = serve(request, {"sse": "error_overloaded_midstream.sse"}, reply(text("ok")))
    code, out, _ = run(capsys, api, ["q", "--workdir", str(workdir)])
    assert (code, out, len(api.requests)) == (0, "ok\n", 2)


def test_a_stream_without_message_stop_is_retried(request, capsys, workdir):
    api = serve(request, dict(reply(text("half")), _cut=True), reply(text("ok")))
    code, out, _ = run(capsys, api, ["q", "--workdir", str(workdir)])
    assert (code, out, len(api.requests)) == (0, "ok\n", 2)


def test_a_recorded_cut_tool_call_is_retried_with_more_max_tokens(request, capsys, workdir):
    api = serve(request, {"sse": "max_tokens_truncated_tool_use.sse"}, reply(text("ok")))
    code, out, _ = run(capsys, api, ["q", "--workdir", str(workdir)])
    assert (code, out) == (0, "ok\n")
    assert [r["max_tokens"] for r in api.requests] == [16000, 32000]
    assert api.requests[0]["messages"] == api.requests[1]["messages"]


def test_a_recorded_401_stops_with_the_apis_message(request, capsys, workdir):
    recorded = json.loads((RECORDED / "error_authentication_401.json").read_text())
    api = serve(request, {"status": recorded["status"], "body": recorded["body"]})
    code, _, err = run(capsys, api, ["q", "--workdir", str(workdir)])
    assert code == 1 and "invalid x-api-key" in err and "ANTHROPIC_API_KEY" in err
    assert len(api.requests) == 1


# --- as a user runs it: a subprocess ---

DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, every request fails


def agent_env(api=None, **extra):
    """An environment with none of the user's ANTHROPIC_* and no way off loopback: any request
    not to 127.0.0.1 goes to a proxy that is not there."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ANTHROPIC") and "proxy" not in k.lower()}
    env.update(HTTPS_PROXY=DEAD_PROXY, HTTP_PROXY=DEAD_PROXY, ALL_PROXY=DEAD_PROXY,
               NO_PROXY="127.0.0.1,localhost", **extra)
    if api is not None:
        env.update(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=api.url)
    return env


@pytest.fixture
def agent_copy(tmp_path):
    """agent.py alone in a directory: no .env of the user's beside it, nothing else."""
    copy = tmp_path / "agent" / "agent.py"
    copy.parent.mkdir()
    shutil.copy(AGENT, copy)
    return copy


def test_subprocess_end_to_end(request, workdir, tmp_path, agent_copy):
    api = serve(request, reply(tool_use("read_file", {"path": "scores.csv"})),
                reply(tool_use("run_python", {"code": "print(sum([88, 72, 95]) / 3)"})),
                reply(tool_use("run_python", {"code": "print(open('../secret.txt').read())"})),
                reply(text("平均分是 85。")))
    transcript = tmp_path / "run.json"
    done = subprocess.run([sys.executable, str(agent_copy), "scores.csv 里平均分是多少？", "--workdir",
                           str(workdir), "--yes", "--transcript", str(transcript)],
                          env=agent_env(api), cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "平均分是 85。\n"
    assert "sandbox:" in done.stderr and "Traceback" not in done.stderr
    saved = json.loads(transcript.read_text())
    assert saved["stop"]["reason"] == "end_turn" and len(saved["turns"]) == 4
    assert all(t["request_id"].startswith("req_local_") for t in saved["turns"])
    assert "85.0" in saved["messages"][4]["content"][0]["content"]
    if "landlock" in done.stderr:  # the sandbox, seen from outside under --yes
        refused = saved["messages"][6]["content"][0]
        assert refused["is_error"] and "PermissionError" in refused["content"]
        assert "top secret" not in refused["content"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_subprocess_ctrl_c_kills_the_tool_and_keeps_the_transcript(request, workdir, tmp_path,
                                                                   signum, agent_copy):
    code = ("import os, subprocess, time\n"
            "child = subprocess.Popen(['sleep', '60'])\n"
            "open('pids', 'w').write(f'{os.getpid()} {child.pid}')\n"
            "time.sleep(60)\n")
    api = serve(request, reply(tool_use("run_python", {"code": code})))
    transcript = tmp_path / "run.json"
    proc = subprocess.Popen([sys.executable, str(agent_copy), "q", "--workdir", str(workdir), "--yes",
                             "--transcript", str(transcript)], env=agent_env(api), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = workdir / "pids"
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signum)
    started = time.monotonic()
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 130 and time.monotonic() - started < 5, err
    assert "Traceback" not in err
    assert json.loads(transcript.read_text())["stop"]["reason"] == "interrupted"
    time.sleep(0.2)
    assert not [pid for pid in map(int, pids.read_text().split()) if alive(pid)]


def test_subprocess_without_a_key_is_one_clear_line(tmp_path, workdir, agent_copy):
    done = subprocess.run([sys.executable, str(agent_copy), "hi", "--workdir", str(workdir)],
                          env=agent_env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "ANTHROPIC_API_KEY" in done.stderr and ".env.example" in done.stderr


def test_help_and_usage_errors_do_not_import_the_sdk(tmp_path):
    probe = ("import sys, agent\n"
             "code = agent.main(['--max-turns', '0', 'q'])\n"
             "print(code, 'anthropic' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=AGENT.parent, capture_output=True,
                          text=True, timeout=30)
    assert done.stdout.split() == ["2", "False"]
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(AGENT), "--help"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and "exit codes" in done.stdout
    assert time.monotonic() - started < 2


def test_the_sdk_is_imported_with_the_collector_off_and_frozen_after():
    """anthropic's import makes ~200,000 objects that live for good: collections during it
    only walk them (4% of its instructions under callgrind). Off while it runs, on after,
    even when the import fails, and the objects frozen out of later full collections."""
    probe = ("import gc, sys, agent\n"
             "seen = []\n"
             "class Spy:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.startswith('anthropic.'):\n"
             "            seen.append(gc.isenabled())\n"
             "sys.meta_path.insert(0, Spy())\n"
             "config = {'ANTHROPIC_API_KEY': 'test-key', 'ANTHROPIC_BASE_URL': None}\n"
             "if sys.argv[1] == 'broken':\n"
             "    sys.modules['anthropic'] = None  # import anthropic raises ImportError\n"
             "try:\n"
             "    agent.make_client(config, agent.Limits())\n"
             "except agent.UsageError:\n"
             "    print('usage-error')\n"
             "print(len(seen) > 100, any(seen), gc.isenabled(), gc.get_freeze_count() > 100_000)\n")
    done = subprocess.run([sys.executable, "-c", probe, "ok"], cwd=AGENT.parent,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "False", "True", "True"], done.stderr
    done = subprocess.run([sys.executable, "-c", probe, "broken"], cwd=AGENT.parent,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["usage-error", "False", "False", "True", "False"], done.stderr


def test_agent_py_defines_itself_with_the_collector_off_and_frozen_after():
    """What agent.py imports and defines lives as long as the process: no collection while
    its body runs (in a real start, ~20 collections found 180 objects and walked the rest),
    the collector on again after, and all of it frozen out of later full collections. Imports
    and compiling are done first, apart, so that a collection they trigger is not counted."""
    probe = ("import ast, gc, sys, types\n"
             "path = sys.argv[1]\n"
             "source = open(path, encoding='utf-8').read()\n"
             "for node in ast.parse(source).body:\n"
             "    if isinstance(node, (ast.Import, ast.ImportFrom)):\n"
             "        for name in [node.module] if isinstance(node, ast.ImportFrom) else \\\n"
             "                [a.name for a in node.names]:\n"
             "            __import__(name)\n"
             "code = compile(source, path, 'exec')\n"
             "module = types.ModuleType('agent')\n"
             "module.__file__ = path\n"
             "sys.modules['agent'] = module\n"
             "seen = []\n"
             "gc.callbacks.append(lambda phase, info: phase == 'start' and seen.append(1))\n"
             "exec(code, module.__dict__)\n"
             "print(len(seen), gc.isenabled(), any(o is module.main for o in gc.get_objects()))\n")
    done = subprocess.run([sys.executable, "-c", probe, str(AGENT)], capture_output=True,
                          text=True, timeout=60, env=agent_env())
    assert done.stdout.split() == ["0", "True", "False"], (done.stdout, done.stderr)


def test_the_sdks_reply_class_is_built_once_not_on_every_reply(workdir):
    """The SDK's stream parametrizes ParsedMessage anew on every message_start, and pydantic
    keeps that class only weakly: once a collection freed it, the next reply built it again
    (about 1 ms, on most of a long session's replies). agent.py holds it once built: with a
    full collection before every reply, each class (the beta stream's too) is built once. In
    a new process, where no earlier test holds (or froze) the class."""
    probe = ("import gc, json, sys\n"
             "import agent, pydantic._internal._generics as generics\n"
             "agent.dotenv_files = lambda: []  # none of the user's config, as in conftest.py\n"
             "from fake_api import FakeAPI\n"
             "from fakes import reply, text, tool_use\n"
             "built, real = [], generics.create_generic_submodel\n"
             "def spy(name, *rest):\n"
             "    built.append(name)\n"
             "    return real(name, *rest)\n"
             "generics.create_generic_submodel = spy\n"
             "def collected(answer):\n"
             "    def respond(body):\n"
             "        gc.collect()  # what any collection between two replies does\n"
             "        return answer\n"
             "    return respond\n"
             "for beta in ('client', 'server'):\n"
             "    with FakeAPI([collected(reply(tool_use('read_file', {'path': 'notes.md'}))),\n"
             "                  collected(reply(tool_use('read_file', {'path': 'scores.csv'}))),\n"
             "                  collected(reply(text('done')))]) as api:\n"
             "        client = agent.make_client({'ANTHROPIC_API_KEY': 'test-key',\n"
             "                                    'ANTHROPIC_BASE_URL': api.url}, agent.Limits())\n"
             "        code = agent.main(['q', '--workdir', sys.argv[1], '--quiet',\n"
             "                           '--context-edit', beta], client=client)\n"
             "        assert code == 0 and len(api.requests) == 3 and not api.rejected\n"
             "        assert ('context_management' in api.requests[0]) == (beta == 'server')\n"
             "print(json.dumps([built, sorted(map(str, agent.REPLY_CLASSES.values()))]))\n")
    path = os.pathsep.join([str(AGENT.parent), str(AGENT.parent / "tests")])
    done = subprocess.run([sys.executable, "-c", probe, str(workdir)], capture_output=True,
                          text=True, timeout=60, env=agent_env(PYTHONPATH=path))
    assert done.returncode == 0, done.stderr
    built, held = json.loads(done.stdout.splitlines()[-1])
    assert [name for name in built if "ParsedMessage[" in name or "ParsedBetaMessage[" in name] \
        == ["ParsedMessage[~ResponseFormatT]", "ParsedBetaMessage[~ResponseFormatT]"], built
    assert len(held) == 2 and all("Parsed" in c for c in held)
