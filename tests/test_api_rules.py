"""The test doubles: the request checker held against recorded traffic; fixtures; the layout."""

import ast
import json
import socket
from pathlib import Path

import pytest
from api_rules import check_request
from fakes import RECORDED

import agent

ACCEPTED_LOOPS = sorted(
    p.name
    for p in RECORDED.glob("*.jsonl")
    if p.name
    not in ("stop_sequence_prefill_stream_loop.jsonl", "error_bodies_from_issue_threads.jsonl")
)


@pytest.mark.parametrize("name", ACCEPTED_LOOPS)
def test_recorded_accepted_requests_pass(name):
    for line in (RECORDED / name).read_text().splitlines():
        exchange = json.loads(line)
        if exchange["response"]["status"] == 200:
            assert check_request(exchange["request"]["body"]) is None


def test_prefill_is_rejected_although_haiku_4_5_once_accepted_it():
    # Newer models reject prefill (R8); the harness must never rely on it.
    first = json.loads(
        (RECORDED / "stop_sequence_prefill_stream_loop.jsonl").read_text().splitlines()[0]
    )
    assert "prefill" in check_request(first["request"]["body"])


@pytest.mark.parametrize(
    "name", ["error_tool_use_without_tool_result_400.json", "error_unexpected_tool_use_id_400.json"]
)
def test_recorded_rejections_get_the_apis_own_message(name):
    exchange = json.loads((RECORDED / name).read_text())
    expected = exchange["response"]["body"]["error"]["message"]
    assert check_request(exchange["request"]["body"]) == expected


def base(messages, **extra):
    return {
        "model": "claude-haiku-5-5",
        "max_tokens": 100,
        "messages": messages,
        "tools": [{"name": "read_file", "input_schema": {"type": "object"}}],
        **extra,
    }


USE = {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a"}}
RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "x"}
Q = {"role": "user", "content": [{"type": "text", "text": "q"}]}


@pytest.mark.parametrize(
    "messages, fragment",
    [
        ([Q, {"role": "assistant", "content": [USE]}], "without `tool_result`"),
        (
            [
                Q,
                {"role": "assistant", "content": [USE]},
                {"role": "user", "content": [{"type": "text", "text": "hi"}, RESULT]},
            ],
            "at the beginning",
        ),
        (
            [
                Q,
                {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
                {"role": "user", "content": [RESULT]},
            ],
            "unexpected `tool_use_id`",
        ),
        ([{"role": "user", "content": [{"type": "text", "text": ""}]}], "must be non-empty"),
        ([{"role": "user", "content": [{"type": "text", "text": "  "}]}], "non-whitespace"),
        ([Q, {"role": "assistant", "content": [{"type": "text", "text": "prefill"}]}], "prefill"),
        ([Q, {"role": "assistant", "content": []}, Q], "non-empty content"),
    ],
)
def test_checker_rejects_what_the_api_rejects(messages, fragment):
    assert fragment in check_request(base(messages))


def test_separate_result_messages_are_merged_and_accepted():
    r2 = dict(RESULT, tool_use_id="t2")
    two = {"role": "assistant", "content": [USE, dict(USE, id="t2")]}
    assert (
        check_request(
            base([Q, two, {"role": "user", "content": [RESULT]}, {"role": "user", "content": [r2]}])
        )
        is None
    )


def test_checker_rejects_bad_parameters():
    assert "4 blocks" in check_request(
        base(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
                    ]
                    * 4,
                }
            ],
            cache_control={"type": "ephemeral"},
        )
    )
    assert "pattern" in check_request(
        dict(base([Q]), tools=[{"name": "read.file", "input_schema": {}}])
    )
    assert "effort" in check_request(base([Q], output_config={"effort": "extreme"}))
    assert "Extra inputs" in check_request(base([Q], temperature_x=1))
    assert "maximum allowed" in check_request(dict(base([Q]), max_tokens=200_000))
    assert "must define tools" in check_request(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                Q,
                {"role": "assistant", "content": [USE]},
                {"role": "user", "content": [RESULT]},
            ],
        }
    )


def test_modified_thinking_is_rejected():
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    issued = {"thinking": {json.dumps(thinking, sort_keys=True)}}
    ok = base(
        [
            Q,
            {"role": "assistant", "content": [thinking, USE]},
            {"role": "user", "content": [RESULT]},
        ]
    )
    assert check_request(ok, issued) is None
    bad = json.loads(json.dumps(ok))
    bad["messages"][1]["content"][0]["thinking"] = "hmm "
    assert "cannot be modified" in check_request(bad, issued)
    bad["messages"][1]["content"].reverse()
    assert "first block must be `thinking`" in check_request(bad, issued)


# --- a clone passes its own tests, on its own ---


def test_the_recorded_traffic_is_part_of_the_project():
    project = Path(agent.__file__).resolve().parent
    assert RECORDED.is_relative_to(project) and (RECORDED / "SOURCES.md").is_file()
    assert (RECORDED / "API_RULES.md").is_file() and len(list(RECORDED.glob("*.sse"))) >= 10


def test_the_network_guard_stops_what_is_not_loopback(loopback_only):
    with pytest.raises(OSError):
        socket.create_connection(("192.0.2.1", 443), timeout=1)
    with pytest.raises(OSError):
        socket.getaddrinfo("api.anthropic.com", 443)
    assert len(loopback_only) == 2
    loopback_only.clear()


# --- how the tests are laid out ---


def imports_of_tests(source):
    """The test modules (test_*) and conftest that `source` imports, at any depth: a test
    module imports helpers, fakes and the other doubles, never another test module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) or isinstance(node, ast.ImportFrom) and not node.module:
            names = [a.name for a in node.names]  # import test_x; from . import test_x
        else:
            names = [node.module] if isinstance(node, ast.ImportFrom) else []
        found += [
            n for n in names if n.split(".")[0].startswith("test_") or n.split(".")[0] == "conftest"
        ]
    return found


def test_the_check_of_imports_catches_each_form():
    assert imports_of_tests("import json\nfrom helpers import run_cli\nimport fakes") == []
    assert imports_of_tests("from test_agent import run") == ["test_agent"]
    assert imports_of_tests("import test_events as e, os") == ["test_events"]
    assert imports_of_tests("def f():\n    from conftest import DOTENV_FILES\n") == ["conftest"]
    assert imports_of_tests("from . import test_trust") == ["test_trust"]


def test_no_test_module_imports_another():
    tests = sorted(Path(__file__).parent.glob("test_*.py"))
    assert len(tests) >= 10
    found = {path.name: imports_of_tests(path.read_text()) for path in tests}
    assert not {name: imported for name, imported in found.items() if imported}, (
        "shared helpers belong in helpers.py (functions) or conftest.py (fixtures)"
    )
