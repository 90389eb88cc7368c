"""Clearing old tool results: the sent view and its cache breakpoints, client and server side."""

import json

from api_rules import check_request
from cache_model import PromptCache
from fakes import FakeClient, reply, text, tool_use
from helpers import run_cli, serve

import agent


def big_files(workdir, n=8, size=4000):
    for i in range(n):
        (workdir / f"doc{i}.md").write_text(f"# doc {i}\n" + f"line of doc {i}\n" * (size // 14))


def reading(n, **usage):
    return reply(tool_use("read_file", {"path": f"doc{n % 8}.md"}), **usage)


def results_sent(request):
    return [
        b
        for m in request["messages"]
        if m["role"] == "user"
        for b in m["content"]
        if b["type"] == "tool_result"
    ]


# --- the sent view ---


def a_session(workdir, n=6):
    session = agent.new_session("q", "claude-haiku-5-5", workdir, None)
    for i in range(n):
        use = tool_use("read_file", {"path": f"doc{i}.md"}, id=f"toolu_{i}")
        session["messages"] += [
            {"role": "assistant", "content": [use]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{i}",
                        "content": f"content of doc {i} " * 200,
                        **({"is_error": True} if i == 1 else {}),
                    }
                ],
            },
        ]
    return session


def test_the_sent_view_is_deterministic_pair_safe_and_leaves_history_alone(workdir):
    session = a_session(workdir)
    before = json.dumps(session["messages"])
    session["cleared"] = ["toolu_0", "toolu_1", "toolu_2"]
    view = agent.sent_view(session)
    assert json.dumps(view) == json.dumps(agent.sent_view(session))  # the same prefix each turn
    assert json.dumps(session["messages"]) == before
    body = {
        "model": "claude-haiku-5-5",
        "max_tokens": 10,
        "tools": agent.TOOLS,
        "messages": view,
        "cache_control": {"type": "ephemeral"},
    }
    assert check_request(body) is None  # every tool_use still has its result, in place
    sent = [b for m in view for b in m["content"] if b["type"] == "tool_result"]
    assert [b["tool_use_id"] for b in sent] == [f"toolu_{i}" for i in range(6)]
    assert sent[0]["content"] == (
        "[cleared to save context: the result of read_file "
        '{"path": "doc0.md"}; call it again if you need it]'
    )
    assert sent[1]["is_error"] is True and len(sent[1]["content"]) < 120
    assert sent[3]["content"].startswith("content of doc 3")


def test_a_breakpoint_marks_where_the_previous_request_ended(workdir):
    view = agent.sent_view(a_session(workdir, 3))
    marked = [
        (i, b["type"]) for i, m in enumerate(view) for b in m["content"] if "cache_control" in b
    ]
    assert marked == [(4, "tool_result")]  # the end of the request before the last reply


# --- caching that never silently misses ---


def billed_run(capsys, workdir, monkeypatch, breakpoint):
    """A run whose second turn adds 24 positions (text and tool calls interleaved), billed by
    the cache stand-in; `breakpoint` False sends no breakpoint at the previous end."""
    big_files(workdir)
    if not breakpoint:
        real = agent.sent_view

        def without(session):
            return [
                {
                    "role": m["role"],
                    "content": [
                        {k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]
                    ],
                }
                for m in real(session)
            ]

        monkeypatch.setattr(agent, "sent_view", without)
    cache, bills = PromptCache(minimum=0), []

    def billed(message):
        def answer(body):
            bills.append(cache.bill(body))
            return dict(message, usage=bills[-1])

        return answer

    many = []
    for i in range(12):
        many += [text(f"Now doc {i}."), tool_use("read_file", {"path": f"doc{i % 8}.md"})]
    client = FakeClient(billed(reading(0)), billed(reply(*many)), billed(reply(text("done"))))
    code, _, _ = run_cli(capsys, ["q", "--workdir", str(workdir)], client)
    assert code == 0
    return bills


def test_a_turn_of_more_than_20_blocks_still_reads_the_cache(workdir, monkeypatch, capsys):
    with_mark = billed_run(capsys, workdir, monkeypatch, breakpoint=True)
    assert with_mark[2]["cache_read_input_tokens"] > 0
    assert with_mark[2]["cache_read_input_tokens"] >= sum(
        with_mark[1][k] for k in ("cache_read_input_tokens", "cache_creation_input_tokens")
    )  # all of turn 2's prefix


def test_without_the_breakpoint_that_turn_would_miss(workdir, monkeypatch, capsys):
    without = billed_run(capsys, workdir, monkeypatch, breakpoint=False)
    assert without[2]["cache_read_input_tokens"] == 0  # so the test above can fail


# --- clearing, client side ---


def clearing_run(capsys, workdir, tmp_path, *flags, turns=7):
    big_files(workdir)
    replies = [reading(i, input_tokens=3000 * (i + 1)) for i in range(turns)] + [
        reply(text("done"))
    ]
    client, path = FakeClient(*replies), tmp_path / "run.json"
    code, _, err = run_cli(
        capsys, ["q", "--workdir", str(workdir), "--transcript", str(path), *flags], client
    )
    assert code == 0, err
    return client, json.loads(path.read_text()), err


def test_clearing_starts_at_the_trigger_keeps_the_newest_and_sticks(capsys, workdir, tmp_path):
    client, saved, err = clearing_run(
        capsys,
        workdir,
        tmp_path,
        "--clear-tool-results",
        "9000",
        "--keep-tool-results",
        "2",
        "--clear-at-least",
        "500",
    )
    placeholders = [
        sum("[cleared" in b["content"] for b in results_sent(r)) for r in client.requests
    ]
    # turn 3's prompt was 9000 tokens: the 4th request clears all but the newest 2 results
    assert placeholders[:4] == [0, 0, 0, 1] and placeholders[4:] == [2, 3, 4, 5]
    for request in client.requests:
        recent = results_sent(request)[-2:]
        assert not any("[cleared" in b["content"] for b in recent)  # the newest stay whole
    assert len(saved["cleared"]) == 5
    assert [t.get("cleared", {}).get("tool_results") for t in saved["turns"]][:6] == [
        None,
        None,
        None,
        1,
        1,
        1,
    ]
    assert "cleared 1 old tool result" in err
    history = [b for m in saved["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert not any("[cleared" in b["content"] for b in history)  # the history keeps them


def test_clearing_waits_until_it_frees_enough(capsys, workdir, tmp_path):
    client, saved, _ = clearing_run(
        capsys, workdir, tmp_path, "--clear-tool-results", "9000", "--clear-at-least", "1000000"
    )
    assert not any("[cleared" in json.dumps(r) for r in client.requests)
    assert saved.get("cleared", []) == []


def test_clearing_is_the_same_after_resume(capsys, workdir, tmp_path):
    client, saved, _ = clearing_run(
        capsys,
        workdir,
        tmp_path,
        "--clear-tool-results",
        "9000",
        "--keep-tool-results",
        "2",
        "--clear-at-least",
        "500",
    )
    path = tmp_path / "run.json"
    resumed = FakeClient(reply(text("again")))
    code, _, _ = run_cli(
        capsys,
        [
            "--resume",
            str(path),
            "more",
            "--workdir",
            str(workdir),
            "--clear-tool-results",
            "9000",
            "--keep-tool-results",
            "2",
        ],
        resumed,
    )

    def plain(messages):  # the content: where the breakpoints sit moves, by design
        return json.dumps(
            [
                [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]
                for m in messages
            ]
        )

    before, after = client.requests[-1]["messages"], resumed.requests[0]["messages"]
    assert code == 0 and "[cleared" in plain(after)
    assert plain(after[: len(before) - 1]) == plain(before[:-1])  # the same prefix


def test_the_newest_results_are_never_cleared(capsys, workdir, tmp_path):
    client, _, _ = clearing_run(
        capsys,
        workdir,
        tmp_path,
        "--clear-tool-results",
        "3000",
        "--keep-tool-results",
        "3",
        "--clear-at-least",
        "1",
    )
    for request in client.requests:
        assert not any("[cleared" in b["content"] for b in results_sent(request)[-3:])


# --- clearing, server side ---


def test_server_side_editing_sends_the_edit_and_records_what_was_cleared(capsys, workdir, tmp_path):
    big_files(workdir)
    applied = {
        "applied_edits": [
            {
                "type": "clear_tool_uses_20250919",
                "cleared_tool_uses": 2,
                "cleared_input_tokens": 4100,
            }
        ]
    }
    client = FakeClient(
        reading(0), dict(reading(1), context_management=applied), reply(text("done"))
    )
    path = tmp_path / "run.json"
    code, _, _ = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--context-edit",
            "server",
            "--clear-tool-results",
            "30000",
            "--keep-tool-results",
            "2",
            "--transcript",
            str(path),
        ],
        client,
    )
    saved = json.loads(path.read_text())
    assert code == 0 and all(
        r["_betas"] == ["context-management-2025-06-27"] for r in client.requests
    )
    edit = client.requests[0]["context_management"]["edits"][0]
    assert edit == {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 30000},
        "keep": {"type": "tool_uses", "value": 2},
        "clear_at_least": {"type": "input_tokens", "value": 10000},
    }
    assert saved["turns"][1]["context_edits"] == applied["applied_edits"]
    assert not any("[cleared" in json.dumps(r) for r in client.requests)  # the API does it


def test_the_real_sdk_sends_the_beta_header(request, capsys, workdir):
    api = serve(request, reply(text("ok")))
    code, _, _ = run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--context-edit",
            "server",
            "--clear-tool-results",
            "50000",
        ],
        api=api,
        clear_at=50000,
        context_edit="server",
    )
    assert code == 0 and api.requests[0]["context_management"]["edits"][0]["trigger"] == {
        "type": "input_tokens",
        "value": 50000,
    }
