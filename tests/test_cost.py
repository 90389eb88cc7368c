"""Usage and cost: prices, what a run reports of them, why the cache missed, token counts."""

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeClient, reply, text, tool_use
from helpers import run_cli, serve

import agent

# --- prices ---


def usage_(input_tokens=0, output_tokens=0, write=0, read=0, split=None):
    u = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
    }
    if split:
        u["cache_creation"] = {
            "ephemeral_5m_input_tokens": split[0],
            "ephemeral_1h_input_tokens": split[1],
        }
    return u


def test_cost_haiku_5_5_lower_band():
    # 1000*0.10 + 500*0.50 + 2000*0.125 + 10000*0.01 = 700 per million
    assert agent.cost_usd("claude-haiku-5-5", usage_(1000, 500, 2000, 10000)) == pytest.approx(
        0.0007
    )


def test_cost_haiku_5_5_upper_band_counts_cache_tokens_in_the_prompt():
    # prompt 50k + 30k + 30k = 110k > 100k: 50000*0.5 + 1000*2.5 + 30000*0.625 + 30000*0.05
    assert agent.cost_usd(
        "claude-haiku-5-5", usage_(50_000, 1000, 30_000, 30_000)
    ) == pytest.approx(0.04775)


def test_cost_band_edge_is_inclusive():
    # exactly 100,000 prompt tokens stays in the lower band: 100000*0.10 = 10000 per million
    assert agent.cost_usd("claude-haiku-5-5", usage_(100_000)) == pytest.approx(0.01)
    assert agent.cost_usd("claude-haiku-5-5", usage_(100_001)) == pytest.approx(0.0500005)


def test_cost_one_hour_writes_use_their_own_rate():
    # Sonnet 5.5: 600 five-minute writes at 2.50 + 400 one-hour writes at 4.00 = 3100 per million
    assert agent.cost_usd(
        "claude-sonnet-5-5", usage_(write=1000, split=(600, 400))
    ) == pytest.approx(0.0031)


def test_cost_of_a_dated_id_and_an_unknown_model():
    assert agent.cost_usd("claude-haiku-4-5-20251001", usage_(1_000_000)) == pytest.approx(1.0)
    assert agent.cost_usd("claude-unknown", usage_(10)) is None


def test_compaction_iterations_are_priced_too():
    usage = {
        "input_tokens": 23000,
        "output_tokens": 1000,
        "iterations": [
            {"type": "compaction", "input_tokens": 180000, "output_tokens": 3500},
            {"type": "message", "input_tokens": 23000, "output_tokens": 1000},
        ],
    }
    # Haiku 5.5: the compaction step is over 100k, second band: 180000*0.5 + 3500*2.5
    #            the message step: 23000*0.10 + 1000*0.50
    expected = (180000 * 0.5 + 3500 * 2.5 + 23000 * 0.10 + 1000 * 0.50) / 1e6
    assert agent.cost_usd("claude-haiku-5-5", usage) == pytest.approx(expected)
    record = agent.usage_record("claude-haiku-5-5", usage)
    assert (record["input_tokens"], record["output_tokens"]) == (203000, 4500)


def test_sonnet_5_5_cache_reads_cost_ten_cents():
    usage = {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 1_000_000}
    assert agent.cost_usd("claude-sonnet-5-5", usage) == pytest.approx(0.10)


# --- what a run reports ---


def test_cost_lands_in_the_transcript(capsys, workdir):
    client = FakeClient(
        reply(text("ok"), input_tokens=1000, output_tokens=500, write=2000, read=10000)
    )
    _, out, err = run_cli(capsys, ["q", "--workdir", str(workdir), "--transcript", "-"], client)
    saved = json.loads(out)
    assert saved["turns"][0]["usage"]["cost_usd"] == pytest.approx(0.0007)
    assert saved["usage"]["cost_usd"] == pytest.approx(0.0007)
    assert "cache write 2000, read 10000" in err


def test_unknown_model_has_null_cost_and_says_so_once(capsys, workdir):
    client = FakeClient(reply(tool_use("read_file", {"path": "notes.md"})), reply(text("ok")))
    code, out, err = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--model", "claude-next-9", "--transcript", "-"],
        client,
    )
    saved = json.loads(out)
    assert code == 0 and saved["usage"]["cost_usd"] is None
    assert all(t["usage"]["cost_usd"] is None for t in saved["turns"])
    assert err.count("no price is known for claude-next-9") == 1


def test_the_reason_for_a_cache_miss_is_kept_per_turn(capsys, workdir, tmp_path):
    why = {"cache_miss_reason": {"type": "messages_changed", "cache_missed_input_tokens": 1200}}
    client = FakeClient(
        reply(tool_use("read_file", {"path": "notes.md"})),
        dict(reply(text("done")), diagnostics=why),
    )
    path = tmp_path / "run.json"
    run_cli(capsys, ["q", "--workdir", str(workdir), "--transcript", str(path)], client)
    saved = json.loads(path.read_text())
    first_id = saved["turns"][0]["message_id"]
    assert client.requests[0]["diagnostics"] == {"previous_message_id": None}
    assert client.requests[1]["diagnostics"] == {"previous_message_id": first_id}
    assert saved["turns"][0]["cache_miss"] is None
    assert saved["turns"][1]["cache_miss"] == why["cache_miss_reason"]


# --- token counts ---


def test_count_tokens_prints_the_parts_of_a_request_and_runs_nothing(capsys):
    client = FakeClient()
    code, out, _ = run_cli(capsys, ["--count-tokens", "How many rows?"], client)
    assert code == 0
    assert client.requests == [] and len(client.counted) == 3
    assert [list(c) for c in client.counted] == [
        ["model", "messages"],
        ["model", "messages", "system"],
        ["model", "messages", "system", "tools"],
    ]
    lines = dict(line.rsplit(None, 1) for line in out.splitlines()[1:])
    numbers = {k.strip(): int(v.replace(",", "")) for k, v in lines.items()}
    assert numbers["the tool-use system prompt the API adds"] == 286
    assert numbers["every request starts with"] == sum(
        v for k, v in numbers.items() if k != "every request starts with"
    )


def test_count_tokens_through_the_real_sdk(request, capsys):
    api = serve(request)
    code, out, _ = run_cli(capsys, ["--count-tokens"], api=api)
    assert code == 0
    assert api.requests == [] and len(api.counted) == 3
    assert api.counted[0]["messages"][0]["content"][0]["text"] == agent.EXAMPLE_QUESTION
    assert "every request starts with" in out


NEWER_PYTHONS = sorted(Path(os.path.expanduser("~/.pyenv/versions")).glob("3.1[2-9]*/bin/python"))
HAIKU_USAGE = {
    "input_tokens": 11616,
    "output_tokens": 11153,
    "cache_creation_input_tokens": 28446,
    "cache_read_input_tokens": 2154,
}


@pytest.mark.parametrize("python", NEWER_PYTHONS or [None], ids=str)
def test_a_cost_is_the_same_on_every_python(python):
    """A response's cost is its products added one by one: Python 3.12's sum() of floats rounds
    otherwise, and the transcript's cost_usd would differ in its last digit by interpreter."""
    if python is None:
        pytest.skip("no Python 3.12 or newer on this machine (pyenv's are looked for)")
    asked = f"import agent; print(repr(agent.usage_record('claude-haiku-5-5', {HAIKU_USAGE})['cost_usd']))"
    root = Path(agent.__file__).parent
    there = subprocess.run(
        [python, "-I", "-c", f"import sys; sys.path.insert(0, {str(root)!r}); {asked}"],
        capture_output=True,
        text=True,
    )
    here = agent.usage_record("claude-haiku-5-5", HAIKU_USAGE)["cost_usd"]
    assert there.stdout.strip() == repr(here) == "0.01031539", there.stderr


@pytest.mark.parametrize("value", [None, "12", -1, True, 1.5])
def test_a_count_tokens_reply_without_a_count_is_one_line(capsys, monkeypatch, value):
    """The server's answer is not trusted: with no whole count in it, --count-tokens says so in
    one line, exit 1, with no traceback."""
    client = FakeClient()
    monkeypatch.setattr(client, "count_tokens", lambda **_: SimpleNamespace(input_tokens=value))
    code, out, err = run_cli(capsys, ["--count-tokens", "How many rows?"], client)
    assert code == 1 and out == "" and "Traceback" not in err
    assert "count_tokens reply held no token count" in err and len(err.strip().splitlines()) == 1
