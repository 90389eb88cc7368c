"""Report: the one-file HTML report, its untrusted content kept inert, in a real browser too."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from fakes import FakeAPIError, FakeClient, reply, text, tool_use
from helpers import lone_surrogates, measured, run_cli, surrogate_run, with_lone_surrogates

import agent

HOSTILE = '</pre><script>window.__pwned = 1</script><img src=x onerror="window.__pwned=2">'


def a_run(capsys, workdir, tmp_path, name="run.json"):
    """A four-turn run whose tool output and answer carry markup meant to run in a browser."""
    (workdir / "evil.md").write_text(f"# notes\n{HOSTILE}\n")
    path = tmp_path / name
    client = FakeClient(
        reply(
            text("Reading."),
            tool_use("read_file", {"path": "scores.csv"}),
            input_tokens=671,
            output_tokens=60,
        ),
        reply(
            tool_use("read_file", {"path": "evil.md"}),
            tool_use("read_file", {"path": "no.md"}),
            input_tokens=20,
            output_tokens=70,
            write=751,
        ),
        reply(
            tool_use("run_python", {"code": "print('<b>bold</b>')"}),
            input_tokens=15,
            output_tokens=50,
            read=751,
            write=300,
        ),
        reply(text(f"Done. {HOSTILE}"), input_tokens=12, output_tokens=40, read=1051, write=80),
    )
    code, _, _ = run_cli(
        capsys,
        [
            "q <i>?</i>",
            "--workdir",
            str(workdir),
            "--yes",
            "--no-sandbox",
            "--transcript",
            str(path),
        ],
        client,
    )
    assert code == 0
    return path


def report(capsys, source, *extra):
    code, _, err = run_cli(capsys, ["--report", str(source), *extra])
    assert code == 0, err
    return err


def test_a_run_report_is_self_contained_and_inert(capsys, workdir, tmp_path):
    source = a_run(capsys, workdir, tmp_path)
    err = report(capsys, source)
    page = (tmp_path / "run.html").read_text()
    assert f"report: {tmp_path / 'run.html'}" in err
    assert "<script" not in page and 'onerror="' not in page
    assert "&lt;script&gt;window.__pwned" in page and "q &lt;i&gt;?&lt;/i&gt;" in page
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)[1]
    assert "default-src 'none'" in policy and "script-src 'none'" in policy
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)  # nothing fetched
    assert page.count('class="turn"') == 4 and page.count('class="bar ') == 16
    assert "read_file" in page and "error" in page and "cost" in page


@pytest.mark.parametrize(
    "server, note",
    [
        ("http://127.0.0.1:8080/v2", True),  # a local model, a proxy: priced as Anthropic's
        ("https://api.anthropic.com", False),
        (None, False),
    ],
)
def test_the_report_names_the_server_and_how_its_cost_is_priced(
    capsys, workdir, tmp_path, monkeypatch, server, note
):
    if server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server)
    page = tmp_path / "run.html"
    report(capsys, a_run(capsys, workdir, tmp_path))
    page = page.read_text()
    assert (f"server <code>{server}</code>" in page) is bool(server)
    priced = (
        "priced as claude-haiku-5-5 would be on Anthropic's API, not by http://127.0.0.1:8080/v2"
    )
    assert (priced in page) is note, page[:3000]


def test_the_report_shows_the_token_growth(capsys, workdir, tmp_path):
    source = a_run(capsys, workdir, tmp_path)
    report(capsys, source, "-o", str(tmp_path / "out.html"))
    page = (tmp_path / "out.html").read_text()
    heights = [float(h) for h in re.findall(r'class="bar seg-read"[^>]* height="([\d.]+)"', page)]
    assert heights[0] == 0 and heights[3] > heights[2] > 0  # cache reads grow turn by turn
    assert "cache-read share" in page and "running cost" in page


def test_a_report_holds_no_lone_surrogate(capsys, tmp_path):
    """Text that is not Unicode, from a run or in a transcript read back, is U+FFFD on the page."""
    _, transcript, _ = surrogate_run(capsys, tmp_path)
    for source in (transcript, with_lone_surrogates(transcript)):
        code, _, err = run_cli(capsys, ["--report", str(source), "-o", str(tmp_path / "r.html")])
        page = (tmp_path / "r.html").read_bytes()
        assert code == 0 and not lone_surrogates(page), err
        assert b"\\ud800" not in page and "done \ufffd".encode() in page


def test_a_trials_report_names_each_trials_transcript_and_writes_one_page(
    capsys, workdir, tmp_path
):
    summary = tmp_path / "trials.json"
    client = FakeClient(
        reply(text("42")), FakeAPIError(400, "invalid_request_error", "bad"), reply(text("41"))
    )
    run_cli(
        capsys,
        [
            "q",
            "--workdir",
            str(workdir),
            "--trials",
            "3",
            "--expect",
            "42",
            "--transcript",
            str(summary),
        ],
        client,
    )
    before = set(tmp_path.iterdir())
    err = report(capsys, summary)
    page = (tmp_path / "trials.html").read_text()
    assert set(tmp_path.iterdir()) - before == {tmp_path / "trials.html"}  # that page alone
    assert "pass@k" in page and "pass^k" in page and 'class="passk"' in page
    for i in (1, 2, 3):
        assert f"<code>{tmp_path / f'trials.{i}.json'}</code>" in page and "href=" not in page
    assert "1 errored" in page and err.count("report:") == 1
    assert "claude-haiku-5-5" in page and "{&quot;regex&quot;: &quot;42&quot;}" in page


def test_a_document_never_makes_report_open_another_file(capsys, workdir, tmp_path, monkeypatch):
    """A summary names a transcript (its own trial's, or any file at all): --report renders the
    name, never opens or copies the file, and writes only the page it was told to."""
    secret = a_run(capsys, workdir, tmp_path, "secret.json")
    (tmp_path / "secret.html").unlink(missing_ok=True)
    summary = tmp_path / "trials.json"
    summary.write_text(
        json.dumps(
            {
                "version": 2,
                "kind": "trials",
                "n": 2,
                "requested": 2,
                "trials": [
                    {"index": 1, "transcript": str(secret)},
                    {"index": 2, "transcript": "/etc/shadow"},
                ],
            }
        )
    )
    opened, real_open = [], os.open

    def watch(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", watch)
    before = set(tmp_path.iterdir())
    report(capsys, summary, "-o", str(tmp_path / "page.html"))
    page = (tmp_path / "page.html").read_text()
    assert str(secret) in page and "window.__pwned" not in page  # its name, not its content
    assert not [p for p in opened if "secret" in p or p == "/etc/shadow"], opened
    assert set(tmp_path.iterdir()) - before == {tmp_path / "page.html"}


def test_report_never_writes_over_what_it_reads_and_dash_is_stdout(capsys, workdir, tmp_path):
    source = a_run(capsys, workdir, tmp_path)
    kept = source.read_bytes()
    code, _, err = run_cli(capsys, ["--report", str(source), "-o", str(source)])
    assert code == 2 and "would overwrite --report" in err and source.read_bytes() == kept
    code, out, err = run_cli(capsys, ["--report", str(source), "-o", "-"])
    assert code == 0 and out.startswith("<!doctype html>") and not (tmp_path / "-").exists()


@pytest.mark.parametrize(
    "document",
    [
        {"messages": "no", "turns": [1, None, {"usage": "x"}], "stop": ["?"], "question": 5},
        {
            "kind": "trials",
            "trials": [None, {"index": "<b>", "transcript": "/etc/passwd"}],
            "pass_at_k": {"1": "y"},
            "pass@1_wilson95": "?",
        },
    ],
)
def test_a_malformed_document_still_gives_a_page(capsys, tmp_path, document):
    source = tmp_path / "odd.json"
    source.write_text(json.dumps(document))
    report(capsys, source)
    page = (tmp_path / "odd.html").read_text()
    assert page.startswith("<!doctype html>") and "<script" not in page


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("[1, 2]", "is a JSON list"),
        ("{}", "is an empty JSON object"),
        (None, "does not exist"),
        ('{"type": "run.start", "seq": 1}\n{"type": "run.stop", "seq": 2}\n', "an event stream"),
        ('{"schema_version": "ATIF-v1.8", "steps": []}', "is an ATIF trajectory"),
    ],
)
def test_a_report_of_something_else_says_what_it_was_given(capsys, tmp_path, content, fragment):
    source = tmp_path / "given.json"
    if content is not None:
        source.write_text(content)
    code, _, err = run_cli(capsys, ["--report", str(source)])
    assert code == 2 and fragment in err and not (tmp_path / "given.html").exists()


# --- in a real browser ---

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]  # no DNS lookup at all, loopback or not
CSP_HOOK = (
    "window.__csp = []; document.addEventListener('securitypolicyviolation', "
    "e => window.__csp.push(e.violatedDirective));"
)


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip("playwright.sync_api", reason="no playwright installed")
    if not CHROMIUM:
        pytest.skip("no chromium installed (.ci/run installs Debian's)")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_page(browser, path, shot):
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    page, seen = context.new_page(), {"console": [], "errors": [], "requests": []}
    page.on("console", lambda m: seen["console"].append((m.type, m.text)))
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    context.on("request", lambda r: seen["requests"].append(r.url))
    page.add_init_script(CSP_HOOK)
    page.goto(Path(path).resolve().as_uri(), wait_until="load")
    page.wait_for_timeout(100)
    seen["bars"] = page.evaluate("document.querySelectorAll('svg.tokens rect.bar').length")
    seen["turns"] = page.evaluate("document.querySelectorAll('svg.tokens g.turn').length")
    seen["pwned"] = page.evaluate("typeof window.__pwned !== 'undefined'")
    seen["csp"] = page.evaluate("window.__csp")
    page.screenshot(path=str(shot), full_page=True)
    context.close()
    return seen


def test_the_report_in_headless_chromium(browser, capsys, workdir, tmp_path):
    source = a_run(capsys, workdir, tmp_path)
    report(capsys, source)
    seen = open_page(browser, tmp_path / "run.html", tmp_path / "run.png")
    assert seen["console"] == [] and seen["errors"] == []
    assert seen["requests"] == [(tmp_path / "run.html").resolve().as_uri()]  # the file only
    assert (seen["bars"], seen["turns"]) == (16, 4)
    assert seen["pwned"] is False and seen["csp"] == []
    assert (tmp_path / "run.png").stat().st_size > 10_000
    if os.environ.get("UPDATE_SCREENSHOT"):
        shutil.copy(tmp_path / "run.png", Path(agent.__file__).parent / "docs" / "report.png")


def test_the_policy_stops_a_script_that_got_in_anyway(browser, capsys, workdir, tmp_path):
    """A second line of defence: were escaping ever to fail, the page still runs nothing."""
    source = a_run(capsys, workdir, tmp_path)
    report(capsys, source)
    page = (tmp_path / "run.html").read_text()
    (tmp_path / "broken.html").write_text(
        page.replace(
            "<h1>",
            '<script>window.__pwned = 3</script><img src=x onerror="window.__pwned=4"><h1>',
            1,
        )
    )
    seen = open_page(browser, tmp_path / "broken.html", tmp_path / "broken.png")
    assert seen["pwned"] is False
    assert "script-src-elem" in seen["csp"] or "script-src" in seen["csp"]
    assert [u for u in seen["requests"] if not u.startswith("file://")] == []


# --- bounded by what it is given ---


def test_a_report_is_bounded_by_the_size_of_its_input(capsys, workdir, tmp_path, agent_copy):
    """150,000 tiny turns (445 KB): before, --report wrote 100 MB of HTML in 11 s with a peak
    of 555 MiB (6 MB of them: 1.3 GB and 4.3 GB). Now the output is at most 8 times the input
    plus 1 MiB, or a usage error with nothing written."""
    source = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(source)],
        FakeClient(reply(text("done"))),
    )
    t = json.loads(source.read_text())
    t["turns"] += [{}] * 150_000
    source.write_text(json.dumps(t, separators=(",", ":")))
    out = tmp_path / "out.html"
    code, err, rss, _ = measured(agent_copy, "--report", source, "-o", out, cwd=tmp_path)
    assert not out.exists() and rss < 200, rss  # MiB
    assert code == 2 and len(err.strip().splitlines()) == 1 and "8 times its" in err, err


def test_an_export_past_its_cap_is_a_usage_error_with_nothing_written(
    capsys, workdir, tmp_path, monkeypatch
):
    """ATIF is about the size of its transcript (1.0x measured, 300 turns), so the cap (the same as a
    report's) is shown here by lowering it: past it, exit 2 and no file, never a partial one."""
    source = tmp_path / "run.json"
    run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "--transcript", str(source)],
        FakeClient(reply(text("done"))),
    )
    monkeypatch.setattr(agent, "OUTPUT_FACTOR", 0)
    monkeypatch.setattr(agent, "OUTPUT_SLACK", 100)
    code, out, err = run_cli(capsys, ["--export", "atif", str(source)])
    assert (code, out) == (2, "") and "would make a trajectory over" in err, err
    assert not source.with_suffix(".atif.json").exists()


@pytest.mark.parametrize("key", ["²", "١", "1" + "0" * 400, "0", "-1", " 1", "1e3"])
def test_a_summary_whose_pass_at_k_keys_are_not_plain_numbers_is_a_usage_error(
    capsys, tmp_path, key
):
    """Before: '²' passed isdigit() and int() raised ValueError, a 401-digit k overflowed a
    float division: an internal error (exit 1); '١', '0', '-1' drew a page of nonsense."""
    source = tmp_path / "summary.json"
    source.write_text(
        json.dumps(
            {
                "version": 2,
                "kind": "trials",
                "n": 1,
                "trials": [],
                "pass_at_k": {"1": 1.0, key: 0.5},
                "pass_hat_k": {"1": 1.0},
            }
        )
    )
    code, out, err = run_cli(capsys, ["--report", str(source)])
    assert (code, out) == (2, "") and "not a plain number" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "summary.html").exists()


def test_the_report_of_an_unpriced_model_does_not_say_it_was_priced(
    capsys, workdir, tmp_path, monkeypatch
):
    """-m my-local-model against a server of one's own: the cost is unknown, and the page said
    it was priced as that model would be on Anthropic's API (newuser #16)."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:8080")
    path = tmp_path / "run.json"
    code, _, _ = run_cli(
        capsys,
        ["q", "--workdir", str(workdir), "-m", "my-local-model", "--transcript", str(path)],
        FakeClient(reply(text("42"))),
    )
    assert code == 0
    report(capsys, path)
    page = (tmp_path / "run.html").read_text()
    assert "priced as" not in page
    assert (
        "<p>No cost is shown: agent.py knows no price for my-local-model (it prices "
        "Anthropic's models as Anthropic's API bills them), and http://127.0.0.1:8080 may "
        "bill otherwise, or nothing.</p>"
    ) in page


def test_the_report_of_interrupted_trials_says_so_and_scores_nothing(capsys, tmp_path):
    """Ctrl-C before any trial finished: the page said `pass@1 = None, 95% Wilson interval ?–?`,
    drew an empty table and chart, and marked the interrupted trials `fail` under `0 failed, 2
    errored`, with no word of the interruption (newuser2 N30)."""
    trials = [
        {
            "index": i,
            "stop": "interrupted",
            "turns": 0,
            "tokens": 0,
            "cost_usd": 0.0,
            "seconds": 1.0,
            "passed": False,
            "transcript": None,
        }
        for i in (1, 2)
    ]
    summary = agent.summarize(trials, 3)
    summary.update(
        interrupted=True,
        question="q",
        model="claude-haiku-5-5",
        expect={"regex": None, "tool": None, "stop": None},
        decline_message=agent.DECLINE_MESSAGE,
    )
    path = tmp_path / "s.json"
    path.write_text(json.dumps(summary))
    report(capsys, path)
    page = (tmp_path / "s.html").read_text()
    assert "None" not in page and "?–?" not in page
    assert "No trial was scored, so pass@k is unknown." in page
    assert "Interrupted (Ctrl-C): 0 of 3 trials finished." in page
    assert "<h2>pass@k and pass^k</h2>" not in page and '<svg class="passk"' not in page
    assert page.count('<td class="error">errored</td>') == 2 and ">fail<" not in page
