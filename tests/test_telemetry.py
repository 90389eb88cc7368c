"""Telemetry (--otel): the run as OpenTelemetry GenAI spans, in memory and over OTLP/HTTP."""

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import FakeAPIError, FakeClient, reply, text, tool_use
from helpers import AGENT, agent_env, as_documented, documented, run_agent_py, run_cli, serve
from otlp_receiver import HostileCollector, OTLPReceiver, attributes

import agent

CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


def run(capsys, workdir, client, *flags, stdin=""):
    return run_cli(capsys, ["q", "--workdir", str(workdir), "--otel", *flags], client, stdin=stdin)


def two_turns():
    return FakeClient(
        reply(
            tool_use("read_file", {"path": "notes.md"}),
            tool_use("read_file", {"path": "missing.md"}),
            input_tokens=100,
            write=700,
            output_tokens=30,
        ),
        reply(
            text("The notes say two lines."), input_tokens=20, read=700, write=90, output_tokens=12
        ),
    )


def test_one_invoke_agent_span_a_chat_span_per_turn_and_a_tool_span_per_call(
    capsys, workdir, spans
):
    code, _, _ = run(capsys, workdir, two_turns())
    assert code == 0
    got = spans()
    root = [s for s in got if s.name == "invoke_agent agent.py"]
    chats = [s for s in got if s.name == "chat claude-haiku-5-5"]
    tools = [s for s in got if s.name == "execute_tool read_file"]
    assert (len(root), len(chats), len(tools), len(got)) == (1, 2, 2, 5)
    root = root[0]
    assert root.parent is None and all(
        s.parent.span_id == root.context.span_id for s in chats + tools
    )
    assert {s.kind.name for s in chats} == {"CLIENT"} and root.kind.name == "INTERNAL"
    a = root.attributes
    assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["gen_ai.agent.name"]) == (
        "invoke_agent",
        "anthropic",
        "agent.py",
    )
    assert (a["agent_py.stop"], a["agent_py.exit_code"], a["agent_py.turns"]) == ("end_turn", 0, 2)
    assert a["agent_py.cost_usd"] == pytest.approx(
        agent.cost_usd(
            "claude-haiku-5-5",
            {
                "input_tokens": 120,
                "output_tokens": 42,
                "cache_creation_input_tokens": 790,
                "cache_read_input_tokens": 700,
            },
        )
    )
    first = chats[0].attributes
    assert (
        first["gen_ai.operation.name"] == "chat"
        and first["gen_ai.request.model"] == "claude-haiku-5-5"
    )
    assert first["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert first["gen_ai.response.id"].startswith("msg_")
    # for Anthropic, input tokens count the cache's reads and writes too (the conventions)
    assert (
        first["gen_ai.usage.input_tokens"],
        first["gen_ai.usage.cache_creation.input_tokens"],
        first["gen_ai.usage.cache_read.input_tokens"],
        first["gen_ai.usage.output_tokens"],
    ) == (800, 700, 0, 30)
    assert chats[1].attributes["gen_ai.usage.input_tokens"] == 20 + 700 + 90
    assert a["gen_ai.usage.input_tokens"] == 800 + 810
    ok, missing = sorted(tools, key=lambda s: s.attributes["agent_py.is_error"])
    assert ok.attributes["gen_ai.tool.name"] == "read_file" and ok.attributes[
        "gen_ai.tool.call.id"
    ].startswith("toolu_")
    assert ok.status.status_code.name == "UNSET" and missing.status.status_code.name == "ERROR"
    assert missing.attributes["error.type"] == "tool_error"


def test_content_only_when_the_user_opts_in(capsys, workdir, spans, monkeypatch):
    agent.SECRETS.add("sk-secret-key-123456")
    (workdir / "notes.md").write_text("the key is sk-secret-key-123456\n")
    run(capsys, workdir, two_turns())
    content = (
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "gen_ai.system_instructions",
        "input.value",
    )
    assert not [k for s in spans() for k in s.attributes if k in content]
    monkeypatch.setenv(CAPTURE, "SPAN_ONLY")
    code, _, err = run(capsys, workdir, two_turns())
    assert code == 0 and "--otel" not in err, err
    got = [s for s in spans() if s.name.startswith("chat")][-1].attributes
    sent = json.loads(got["gen_ai.input.messages"])
    assert sent[0] == {"role": "user", "parts": [{"type": "text", "content": "q"}]}
    assert [m["role"] for m in sent[1:]] == ["assistant", "tool", "tool"]  # a message a result
    assert (
        json.loads(got["gen_ai.output.messages"])[0]["parts"][0]["content"]
        == "The notes say two lines."
    )
    result = [s for s in spans() if s.name == "execute_tool read_file"][-2].attributes
    text_ = " ".join(str(v) for s in spans() for v in s.attributes.values())
    assert "sk-secret-key-123456" not in text_ and "[redacted secret]" in text_
    assert json.loads(result["gen_ai.tool.call.arguments"]) in (
        {"path": "notes.md"},
        {"path": "missing.md"},
    )


def test_retries_stop_and_trial_are_attributes(capsys, workdir, spans):
    client = FakeClient(
        FakeAPIError(529, "overloaded_error", "Overloaded", {"retry-after": "0"}),
        reply(text("ok")),
        reply(text("ok")),
        FakeAPIError(400, "invalid_request_error", "bad"),
    )
    code, _, _ = run(capsys, workdir, client, "--trials", "3")
    roots = sorted(
        (s for s in spans() if s.name == "invoke_agent agent.py"),
        key=lambda s: s.attributes["agent_py.trial"],
    )
    assert code == 6 and [s.attributes["agent_py.trial"] for s in roots] == [1, 2, 3]
    assert len({s.attributes["gen_ai.conversation.id"] for s in roots}) == 3
    assert roots[0].attributes["agent_py.retries"] == 1
    chat = [
        s
        for s in spans()
        if s.name.startswith("chat") and s.parent.span_id == roots[0].context.span_id
    ][0]
    assert [e.name for e in chat.events] == ["api.retry"] and chat.attributes[
        "agent_py.retries"
    ] == 1
    failed = roots[2]
    assert failed.attributes["agent_py.stop"] == "api_error"
    assert (
        failed.status.status_code.name == "ERROR" and failed.attributes["error.type"] == "api_error"
    )


def otel_env(collector_url, **extra):
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": collector_url, **extra}


def test_over_otlp_http_to_a_collector_configured_by_the_standard_variables(
    request, tmp_path, workdir, agent_copy
):
    api = serve(request, reply(tool_use("read_file", {"path": "notes.md"})), reply(text("done")))
    with OTLPReceiver() as collector:
        done = run_agent_py(
            agent_copy,
            "q",
            "--workdir",
            workdir,
            "--otel",
            timeout=60,
            env=agent_env(
                api,
                **otel_env(
                    collector.endpoint,
                    OTEL_EXPORTER_OTLP_HEADERS="x-team=agents,authorization=Bearer%20t0k",
                    OTEL_SERVICE_NAME="my-agent",
                ),
            ),
        )
        assert done.returncode == 0, done.stderr
        got = collector.spans()
    names = sorted(span.name for _, span in got)
    assert names == ["chat claude-haiku-5-5"] * 2 + [
        "execute_tool read_file",
        "invoke_agent agent.py",
    ]
    assert {res["service.name"] for res, _ in got} == {"my-agent"}
    assert (
        collector.headers[0]["x-team"] == "agents"
        and collector.headers[0]["authorization"] == "Bearer t0k"
    )
    tool = next(span for _, span in got if span.name == "execute_tool read_file")
    assert attributes(tool)["gen_ai.tool.name"] == "read_file"
    assert not [h for h in api.headers if "traceparent" in h]  # no trace context to the API


def test_spans_hold_no_lone_surrogate_and_none_is_lost_to_one(request, workdir, agent_copy):
    """A lone surrogate cannot be encoded in a span's protobuf: one in a reply would cost the
    spans that hold it (the SDK itself refuses one in a tool call's input)."""
    api = serve(
        request,
        reply(text("bad \ud800 text"), tool_use("read_file", {"path": "notes.md"})),
        reply(text("done \udce9")),
    )
    with OTLPReceiver() as collector:
        done = run_agent_py(
            agent_copy,
            "q",
            "--workdir",
            workdir,
            "--otel",
            timeout=60,
            env=agent_env(api, **otel_env(collector.endpoint, **{CAPTURE: "true"})),
        )
        assert done.returncode == 0 and "--otel" not in done.stderr, done.stderr
        got = collector.spans()
    assert len(got) == 4, done.stderr.splitlines()  # the run, two chats, the tool call
    values = [str(v) for _, span in got for v in attributes(span).values()]
    assert not [v for v in values if any("\ud800" <= ch <= "\udfff" for ch in v)]
    assert any("done \ufffd" in v for v in values)


@pytest.mark.parametrize("collector", ["refuses", "never answers"])
def test_an_unreachable_collector_costs_a_bounded_delay_and_one_line(
    request, workdir, agent_copy, collector
):
    api = serve(request, reply(text("done")), reply(text("done")))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    if collector == "never answers":
        silent.listen(8)  # accepts, never reads, never answers
    port = silent.getsockname()[1]
    if collector == "refuses":
        silent.close()
    try:
        started = time.monotonic()
        plain = run_agent_py(agent_copy, "q", "--workdir", workdir, env=agent_env(api), timeout=60)
        alone = time.monotonic() - started
        started = time.monotonic()
        done = run_agent_py(
            agent_copy,
            "q",
            "--workdir",
            workdir,
            "--otel",
            timeout=60,
            env=agent_env(api, **otel_env(f"http://127.0.0.1:{port}")),
        )
        with_otel = time.monotonic() - started
    finally:
        silent.close()
    assert plain.returncode == done.returncode == 0 and done.stdout == "done\n"
    assert with_otel - alone < agent.OTEL_GRACE + 3, (alone, with_otel)
    said = [line for line in done.stderr.splitlines() if "--otel" in line]
    assert len(said) == 1 and said[0].startswith("agent.py: --otel:"), done.stderr
    lost = re.search(
        r"--otel: (\d+) of (\d+) spans did not reach the collector at "
        rf"http://127.0.0.1:{port}/v1/traces \((.+)\)$",
        said[0],
    )
    assert lost and 0 < int(lost[1]) <= int(lost[2]) and int(lost[2]) >= 2, said[0]  # run, chat
    assert "Connection refused" in lost[3] if collector == "refuses" else lost[3], said[0]
    assert all(
        as_documented(said[0], line)  # docs/telemetry.md quotes it as it is
        for line in documented("docs/telemetry.md", "agent.py: --otel:")
    ), said[0]
    assert "Traceback" not in done.stderr and "Failed to export" not in done.stderr


def test_without_the_packages_otel_is_a_usage_error_naming_the_install(tmp_path, workdir):
    blocked = (
        "import sys; sys.modules['opentelemetry.sdk'] = None; sys.argv[0] = %r; "
        "sys.path.insert(0, %r); import agent; "
        "sys.exit(agent.main(['q', '--workdir', %r, '--otel'], client=object()))"
        % (str(AGENT), str(AGENT.parent), str(workdir))
    )
    env = agent_env(ANTHROPIC_API_KEY="test-key")
    env.pop("UV", None)  # not under `uv run` (which the next test is)
    done = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2 and "pip install opentelemetry-sdk" in done.stderr
    assert f"{sys.executable} -m pip install" in done.stderr  # the pip of this interpreter
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_sdk_is_imported_only_with_otel(request, workdir, agent_copy):
    api = serve(request, reply(text("done")))
    probe = (
        "import runpy, sys; sys.argv = [%r, 'q', '--workdir', %r]\n"
        "try:\n    runpy.run_path(%r, run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('opentelemetry.sdk' in sys.modules)"
        % (str(agent_copy), str(workdir), str(agent_copy))
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=agent_env(api),
        timeout=60,
    )
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr


# --- the key never reaches a collector; a collector cannot hurt the run ---

KEY = "sk-ant-api03-OTEL-TEST-KEY-0123456789abcdef"


def otel_run(agent_copy, workdir, env):
    """agent.py run with --otel to a stand-in collector: the run, the spans, the bytes sent."""
    with OTLPReceiver() as collector:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.endpoint
        done = run_agent_py(agent_copy, "q", "--workdir", workdir, "--otel", timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        return done, collector.spans(), b"".join(collector.bodies)


@pytest.mark.parametrize("content", ["off", "on"])
def test_nothing_a_collector_receives_carries_the_key(request, workdir, agent_copy, content):
    """A server that echoes the key wherever it can (an error's text, the request-id header, a
    message id, the reply's text) and a file that holds it: not one byte sent to the
    collector holds it, content capture on or off."""
    (workdir / "leak.txt").write_text(f"key={KEY}\n")
    echoed = {"request-id": f"req_{KEY}"}
    first = reply(tool_use("read_file", {"path": "leak.txt"}))
    first.update(id=f"msg_{KEY}", _headers=echoed)
    api = serve(
        request,
        {
            "status": 529,
            "body": {
                "type": "error",
                "error": {"type": "overloaded_error", "message": f"Overloaded; your key is {KEY}"},
            },
            "headers": {"retry-after": "0", **echoed},
        },
        first,
        dict(reply(text(f"The key is {KEY}.")), _headers=echoed),
        request_id=False,
    )
    env = agent_env(api, **otel_env("", **({CAPTURE: "true"} if content == "on" else {})))
    env["ANTHROPIC_API_KEY"] = KEY
    done, got, sent = otel_run(agent_copy, workdir, env)
    assert len(got) == 4 and api.requests[0]["messages"], done.stderr  # run, 2 chats, a tool
    assert KEY.encode() not in sent and KEY[8:24].encode() not in sent
    assert b"[redacted secret]" in sent  # the echoes were there, and redacted
    strings = [
        str(v)
        for _, span in got
        for v in [
            span.name,
            *attributes(span).values(),
            span.status.message,
            *(str(attributes(e)) for e in span.events),
        ]
    ]
    assert not [s for s in strings if KEY in s]
    assert KEY not in done.stderr + done.stdout


@pytest.mark.parametrize(
    "limit", ["OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"]
)
def test_a_length_limit_on_attributes_leaves_no_piece_of_the_key(
    request, workdir, agent_copy, limit
):
    """The user caps attribute values at 64 characters (a standard OTel setting); a server
    echoes the key in a message id and a request-id header, 40 characters in, so that the cut
    falls inside it. Before, the SDK cut each value when it was set, before agent.py redacted
    the finished span, and the collector received 20 characters of the key. Now it receives
    no piece of 12, and every value is still at most 64 characters."""
    echoed = {"request-id": "req_" + "B" * 40 + KEY}
    first = dict(reply(text("done")), id="msg_" + "B" * 40 + KEY, _headers=echoed)
    api = serve(request, first, request_id=False)
    env = agent_env(api, **otel_env("", **{limit: "64"}))
    env["ANTHROPIC_API_KEY"] = KEY
    done, got, sent = otel_run(agent_copy, workdir, env)
    assert len(got) == 2, done.stderr  # the run and its chat
    pieces = [KEY[i : i + 12] for i in range(len(KEY) - 11)]
    assert [p for p in pieces if p.encode() in sent] == []
    values = [v for _, span in got for v in attributes(span).values() if isinstance(v, str)]
    assert values and max(len(v) for v in values) <= 64


@pytest.mark.parametrize(
    "variable, url",
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://agent:c0llect0r-pass@127.0.0.1:9"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://agent:c0llect0r-pass@127.0.0.1:9/v1/traces?api_key=q3ry-t0ken#f",
        ),
    ],
)
def test_the_collectors_credentials_are_never_shown(request, workdir, agent_copy, variable, url):
    """A collector's URL with a password or a key in its query (red-team F19): stderr named it
    whole, in the 'otel: traces to' line and the line that says spans were lost, as it shows
    no header (OTEL_EXPORTER_OTLP_HEADERS) and no ANTHROPIC_BASE_URL credentials. Now it
    names scheme, host, port and path only."""
    api = serve(request, reply(text("done")))
    done = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        "--otel",
        timeout=60,
        env=agent_env(api, **{variable: url}),
    )
    assert done.returncode == 0, done.stderr
    assert "otel: traces to http://127.0.0.1:9/v1/traces (http/protobuf)" in done.stderr
    assert "the collector at http://127.0.0.1:9/v1/traces (" in done.stderr
    assert "c0llect0r" not in done.stderr + done.stdout and "q3ry" not in done.stderr


def test_a_redirecting_collector_gets_nothing_followed_and_its_spans_count_as_lost(
    request, workdir, agent_copy
):
    api = serve(request, reply(text("done")))
    with (
        OTLPReceiver() as elsewhere,
        HostileCollector(
            "redirect", location=f"{OTLPReceiver.endpoint.fget(elsewhere)}/v1/traces"
        ) as hostile,
    ):
        done = run_agent_py(
            agent_copy,
            "q",
            "--workdir",
            workdir,
            "--otel",
            timeout=60,
            env=agent_env(api, **otel_env(hostile.endpoint)),
        )
        assert hostile.connections, done.stderr  # it was asked
        assert (elsewhere.requests, elsewhere.bodies) == ([], [])  # and nothing followed it
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    said = [line for line in done.stderr.splitlines() if "--otel:" in line]
    assert len(said) == 1 and re.search(r"--otel: (\d+) of \1 spans did not reach", said[0]), said
    assert "307" in said[0] and "redirect" in said[0], said[0]


PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, done.returncode)"
)


def peak_rss(agent_copy, workdir, env):
    """Run agent.py under a parent of its own; (peak RSS in KiB, exit code, seconds, stderr)."""
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PEAK_RSS,
            sys.executable,
            str(agent_copy),
            "q",
            "--workdir",
            str(workdir),
            "--otel",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    rss, code = map(int, done.stdout.splitlines()[-1].split())
    return rss, code, time.monotonic() - started, done.stderr


def test_a_collector_answering_without_end_costs_the_run_no_memory(request, workdir, agent_copy):
    """512 MiB of body, as fast as loopback carries it: the run's peak RSS stays within 64 MiB
    of a run whose collector answers as it should, and the run ends in bounded time."""
    api = serve(request, reply(text("done")), reply(text("done")))
    with OTLPReceiver() as collector:
        plain, code, plain_seconds, _ = peak_rss(
            agent_copy, workdir, agent_env(api, **otel_env(collector.endpoint))
        )
    assert code == 0
    with HostileCollector("huge") as hostile:
        rss, code, seconds, err = peak_rss(
            agent_copy, workdir, agent_env(api, **otel_env(hostile.endpoint))
        )
        assert hostile.connections and hostile.connections[0]["read"] > 0, err
    assert code == 0, err
    assert rss - plain < 64 << 10, (plain, rss)
    assert seconds < plain_seconds + agent.OTEL_GRACE + 5, (plain_seconds, seconds)


def test_a_dripping_collector_holds_the_run_no_longer_than_its_grace(request, workdir, agent_copy):
    """Headers a byte at a time, forever: each read is within the export's timeout, so the
    exporter's thread waits on; the run does not. It ends, after OTEL_GRACE at most, with its
    answer and one line saying the spans were lost, and the collector is hung up on."""
    api = serve(request, reply(text("done")))
    with HostileCollector("drip") as hostile:
        started = time.monotonic()
        done = run_agent_py(
            agent_copy,
            "q",
            "--workdir",
            workdir,
            "--otel",
            timeout=60,
            env=agent_env(api, **otel_env(hostile.endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="1")),
        )
        seconds = time.monotonic() - started
        time.sleep(0.5)  # the collector notices a hang-up at its next byte
        first = hostile.connections[0]
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    assert first["gone"] is not None, first
    assert seconds < 30
    said = [line for line in done.stderr.splitlines() if "--otel:" in line]
    assert len(said) == 1 and "did not reach the collector" in said[0], done.stderr


@pytest.mark.parametrize(
    "setting",
    [
        {"OTEL_EXPORTER_OTLP_TIMEOUT": "ten"},
        {"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"},
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:9",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem",
        },
    ],
)
def test_a_collector_setting_agent_py_cannot_use_is_one_usage_line(
    capsys, workdir, monkeypatch, setting
):
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    client = FakeClient(reply(text("done")))
    code, out, err = run(capsys, workdir, client)
    assert (code, client.requests, out) == (2, [], "")
    assert len(err.strip().splitlines()) == 1 and err.startswith("agent.py: --otel: "), err


@pytest.mark.parametrize(
    "name", ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"]
)
@pytest.mark.parametrize(
    "headers",
    [
        "Authorization: Bearer phx-SECRET-123",
        "x-team=ops,Authorization Bearer phx-SECRET-123",
        "=phx-SECRET-123",
    ],
)
def test_malformed_collector_headers_are_one_line_without_their_secret(
    capsys, workdir, monkeypatch, name, headers
):
    """N39: `Name: value` where name=value is meant: the SDK printed the header, the
    collector's secret, to stderr, and the spans went out without it. Now one usage line
    that names the variable and the mistake, and no character of the value."""
    monkeypatch.setenv(name, headers)
    client = FakeClient(reply(text("done")))
    code, out, err = run(capsys, workdir, client)
    assert (code, client.requests, out) == (2, [], "")
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"agent.py: --otel: {name} "), err
    assert "SECRET" not in err and "phx" not in err and "Bearer" not in err, err


def test_ctrl_c_while_spans_wait_for_a_slow_collector_keeps_the_runs_exit_code(
    request, workdir, agent_copy
):
    """The run is done, its spans wait on a collector that never answers: the Ctrl-C a user
    presses then ended in a traceback and exit 130 (newuser2 N21). Now one --otel line, and the
    run's own exit code."""
    api = serve(request, reply(text("done")))
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts, never reads, never answers
    request.addfinalizer(silent.close)
    proc = run_agent_py(
        agent_copy,
        "q",
        "--workdir",
        workdir,
        "--otel",
        background=True,
        env=agent_env(api, **otel_env(f"http://127.0.0.1:{silent.getsockname()[1]}")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    lines = []
    while not any(line.startswith("stop: ") for line in lines):
        line = proc.stderr.readline()
        assert line, lines
        lines.append(line)
    time.sleep(0.5)  # in the grace the spans are given
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    err = "".join(lines) + err
    assert (proc.returncode, out) == (0, "done\n"), err
    assert "Traceback" not in err
    said = [line for line in err.splitlines() if "--otel" in line]
    assert len(said) == 1 and said[0].endswith("(interrupted by Ctrl-C while they were sent)"), err
    assert all(
        as_documented(said[0], line)
        for line in documented("docs/telemetry.md", "agent.py: --otel:")
    ), said[0]


def test_under_uv_run_the_otel_install_hint_is_uvs(tmp_path, workdir):
    """`uv run agent.py --otel` named `python -m pip install ...`, which uv's environment has no
    pip for, and which is uv's cache, not the user's to install into (newuser #66)."""
    blocked = (
        "import sys; sys.modules['opentelemetry.sdk'] = None; sys.argv[0] = %r; "
        "sys.path.insert(0, %r); import agent; "
        "sys.exit(agent.main(['q', '--workdir', %r, '--otel'], client=object()))"
        % (str(AGENT), str(AGENT.parent), str(workdir))
    )
    done = subprocess.run(
        [sys.executable, "-c", blocked],
        capture_output=True,
        text=True,
        env=agent_env(ANTHROPIC_API_KEY="test-key", UV="/usr/local/bin/uv"),
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr == (
        "agent.py: --otel needs the OpenTelemetry SDK and its OTLP exporter, which uv's "
        f"environment for agent.py ({sys.executable}) cannot import: run it as uv run --with "
        "opentelemetry-sdk --with opentelemetry-exporter-otlp-proto-http agent.py ... --otel\n"
    )


def test_an_endpoint_ending_in_v1_traces_gets_the_hint_the_base_url_gets(
    capsys, workdir, spans, monkeypatch
):
    """Per the spec /v1/traces is added to OTEL_EXPORTER_OTLP_ENDPOINT, so one that already ends
    in it names .../v1/traces/v1/traces: a 404 at every export, unexplained (newuser #62)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/v1/traces")
    code, _, err = run(capsys, workdir, FakeClient(reply(text("done"))), "-q")
    assert code == 0 and err.splitlines() == [
        "note: OTEL_EXPORTER_OTLP_ENDPOINT http://127.0.0.1:4318/v1/traces ends in /v1/traces, "
        "and /v1/traces is added to it: give the collector's root (http://127.0.0.1:4318), or "
        "the whole URL as OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    ], err


@pytest.mark.parametrize(
    "name", ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"]
)
def test_malformed_otlp_headers_are_one_line_that_shows_no_value(
    capsys, workdir, monkeypatch, name
):
    """`Authorization: Bearer phx-SECRET` (not name=value): the SDK printed the header, the
    collector's secret, on stderr, and the spans went without it (newuser2 N39)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv(name, "x-team=agents,Authorization: Bearer phx-SECRET-123")
    client = FakeClient(reply(text("done")))
    code, out, err = run(capsys, workdir, client)
    assert (code, out, client.requests) == (2, "", [])
    assert err == (
        f"agent.py: --otel: {name} is not a comma-separated list of name=value (item "
        '2 of 2 has no =: a header written "Name: value"?); its values are not '
        "shown\n"
    ), err


def test_a_replay_sends_spans_marked_as_a_replay_with_no_cost_of_its_own(capsys, tmp_path, spans):
    """`--replay --strict --otel` in CI sent chat spans with the recording's cost, like real
    model calls: dashboards counted every build as spend (newuser2 N24). Each span of a replay
    says so (agent_py.replay: the recording), and its cost is the recording's, named so."""
    workdir = tmp_path / "workspace"
    shutil.copytree(Path(agent.__file__).with_name("workspace"), workdir)
    example = tmp_path / "example-run.json"
    shutil.copy(workdir / "example-run.json", example)
    code, _, err = run_cli(
        capsys, ["--replay", str(example), "--workdir", str(workdir), "--yes", "--otel"]
    )
    assert code == 0, err
    got = spans()
    assert {s.name for s in got} >= {"invoke_agent agent.py", "chat claude-haiku-5-5"}
    for span in got:
        assert span.attributes["agent_py.replay"] == str(example), span.name
        assert "agent_py.cost_usd" not in span.attributes, span.name
    chats = [s for s in got if s.name.startswith("chat ")]
    assert chats[0].attributes["agent_py.recorded_cost_usd"] == 0.0002028


def test_otel_with_the_sdk_disabled_is_a_usage_error(capsys, workdir, monkeypatch):
    """OTEL_SDK_DISABLED=true: nothing was sent, and the end said the collector refused the
    spans, which it never saw (newuser2 N40)."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    client = FakeClient(reply(text("done")))
    code, out, err = run(capsys, workdir, client)
    assert (code, out, client.requests) == (2, "", [])
    assert err == (
        "agent.py: --otel: OTEL_SDK_DISABLED=true is set, so no span would be sent: "
        "unset it, or leave --otel out\n"
    )


def test_a_sampler_that_drops_every_span_does_not_stop_the_recording(
    capsys, workdir, spans, monkeypatch
):
    """OTEL_TRACES_SAMPLER=always_off: every span is a non-recording one, which has no
    attributes to read back; each moment of the run must still go through without error."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    code, out, err = run(capsys, workdir, two_turns())
    assert (code, out) == (0, "The notes say two lines.\n") and spans() == []
    assert "stopped recording" not in err, err


def test_a_span_with_nothing_to_redact_leaves_with_its_count_of_dropped_attributes(monkeypatch):
    """Counted copies a span only to redact or cut it: a copy would say no attribute was dropped
    where the user's OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT dropped some."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.setattr(agent, "SECRETS", set())
    memory = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=2))
    provider.add_span_processor(SimpleSpanProcessor(agent.Counted(memory)))
    with provider.get_tracer("t").start_as_current_span("s") as span:
        for n in range(5):
            span.set_attribute(f"a{n}", n)
    (sent,) = memory.get_finished_spans()
    assert sent.dropped_attributes == 3
