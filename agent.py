#!/usr/bin/env python3
# /// script
# requires-python = ">=3.11"
# dependencies = ["anthropic>=2.0", "python-dotenv>=1.0"]
# ///
"""agent.py: a hand-written agent loop on the Anthropic Messages API, with two tools.

    python agent.py "scores.csv 里平均分是多少？" --workdir workspace --transcript run.json

Each turn sends the system prompt, the tools and the whole history; streams the reply; runs
the tool calls it asks for (read_file concurrently; run_python one at a time, in an OS
sandbox, once the user approves); and sends all the results back in one message, until the
model answers or `check_stop` ends the run. Every turn is saved to a transcript.

How to read this file. The first 700 lines are the agent; read them in order:

  1. Config and limits   what the model is told, and `Limits`: every bound of a run
  2. The loop            `run_session` (the turn loop) and `drive`, which runs it to a stop
  3. How a run stops     `EXIT_CODES`, `check_stop`, `stop_for`: every way a run ends
  4. The tools           `read_file`, `run_python` and the approval step beside it; and
                         `call_tool`, which turns every failure into an is_error result

After the divider comes the machinery, to skip until you need a part of it: the results of
calls a turn does not run or send, stopping on Ctrl-C, API plumbing and retries, usage and
cost, clearing old tool results, the transcript, events, schemas and resume, kept runs (every
run, in the user's state directory), replay (a recorded run, without a key), trials, the HTML
report, the ATIF export, OpenTelemetry traces, terminal output, path safety, the sandbox (its
whole policy is one value, `SandboxPolicy`; read in the order a call runs), and the command
line.
"""

import sys

if sys.version_info < (3, 11):  # checked before the first import an older Python lacks
    sys.stderr.write(
        f"agent.py: needs Python 3.11 or newer, and {sys.executable} is "
        f"{sys.version.split()[0]}: run it with python3.11 (or uv run agent.py)\n"
    )
    sys.exit(2)

import argparse
import contextlib
import ctypes
import difflib
import errno
import gc
import html
import http
import importlib.util
import io
import json
import logging
import math
import os
import platform
import pwd
import re
import resource
import select
import selectors
import shlex
import signal
import site
import socket
import stat
import statistics
import struct
import subprocess
import sysconfig
import tempfile
import threading
import time
import unicodedata
import urllib.parse
import uuid
import warnings
import weakref
from collections import Counter, namedtuple
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from functools import cache, cached_property, partial, reduce
from itertools import accumulate, count
from pathlib import Path
from types import SimpleNamespace

# ================================================================================================
# 1. Config and limits
# ================================================================================================

TRANSCRIPT_VERSION = 1  # fields are only added within a version; a removal or change bumps it
AGENT_VERSION = "1.1.0"
SUMMARY_VERSION = 2  # trials summaries: 2 counts pass@k without the trials that failed to run
EVENTS_VERSION = 1
DEFAULT_MODEL = "claude-haiku-5-5"
EFFORTS = ("low", "medium", "high", "xhigh", "max")
SYSTEM_PROMPT = (
    "You answer questions about the files in a working directory. Use read_file to read "
    "text files and run_python to list directories or compute; paths are relative to the "
    "working directory. Check numbers with code when it matters, say what you could not "
    "find, and answer in the language of the question."
)
FINAL_TURN_NOTE = (
    "[harness] This is the last turn: tools are now disabled. Answer with what you have "
    "so far, and say what is still unknown."
)
DECLINE_MESSAGE = (
    "The user declined to run this code. Do not retry it or try to get the same result "
    "another way; tell the user what you wanted to run and why, and ask how to proceed."
)


@dataclass(frozen=True)
class Limits:
    max_turns: int = 20  # requests per run; the last one goes out with tools off
    token_budget: int = 1_000_000  # input + cache writes + cache reads + output, per run
    budget_usd: float | None = None  # dollar ceiling per run; None means no dollar limit
    max_tokens: int = 16_000  # output cap per response; doubled once for a cut tool call
    max_attempts: int = 5  # HTTP requests per turn, retries included
    request_timeout: float = 180.0  # seconds a streamed reply may go without an event, pings aside
    clear_at: int | None = 80_000  # prompt tokens that trigger clearing old results; None: never
    keep_results: int = 3  # the newest tool results, never cleared
    clear_at_least: int = 10_000  # tokens a clearing must free, or it waits: it breaks the cache
    context_edit: str = "client"  # who clears: agent.py ("client") or the API ("server", beta)
    retry_base: float = 0.5  # first backoff in seconds; doubles per retry
    tool_timeout: float = 30.0  # seconds per run_python call
    output_chars: int = 30_000  # run_python output kept for the model, head + tail
    read_lines: int = 2_000  # lines one read_file call returns
    read_bytes: int = 100_000  # bytes one read_file call returns
    turn_bytes: int = 400_000  # tool-result bytes sent back in one turn; calls past it get an error
    turn_calls: int = 64  # tool calls run in one turn; the calls past it are answered, never run
    max_tasks: int = 256  # processes and threads of one run_python call, where a cgroup can cap it
    memory_mb: int = 4096  # memory of one run_python call, all its processes, likewise
    scratch_mb: int = 1024  # the call's home and /dev/shm, a tmpfs where mounts are allowed


# ================================================================================================
# 2. The loop
# ================================================================================================


def new_session(question, model, workdir, effort, run_id=None, system=SYSTEM_PROMPT):
    """A run as the transcript keeps it: the history, each turn's record, how it stopped."""
    return {
        "version": TRANSCRIPT_VERSION,
        "agent_version": AGENT_VERSION,
        "run_id": run_id or uuid.uuid4().hex,
        "started_at": now(),
        "ended_at": None,
        "model": model,
        "effort": effort,
        "system": system,
        "tools": TOOLS,
        "workdir": str(workdir),
        "question": question,
        "messages": [{"role": "user", "content": [{"type": "text", "text": question}]}],
        "turns": [],
        "stop": None,
        "answer": None,
        "usage": empty_usage(),
    }


def mark_final_turn(messages):
    """Tell the model the next reply is its last and tools are off (after any tool results)."""
    last = messages[-1]
    if last["role"] == "user" and last["content"][-1] != {"type": "text", "text": FINAL_TURN_NOTE}:
        last["content"].append({"type": "text", "text": FINAL_TURN_NOTE})


def build_request(session, limits, final):
    """The whole request of a turn: the API is stateless, so the whole history goes again."""
    request = {
        "model": session["model"],
        "max_tokens": limits.max_tokens,
        "system": session["system"],
        "tools": session["tools"],
        "messages": sent_view(session),
        "cache_control": {"type": "ephemeral"},  # caches everything up to the last block
        "diagnostics": {
            "previous_message_id": next(  # the API says why a cache missed
                (t.get("message_id") for t in reversed(session["turns"])), None
            )
        },
    }
    if final:
        request["tool_choice"] = {"type": "none"}
    if session.get("effort"):
        request["output_config"] = {"effort": session["effort"]}
    if base_model(session["model"]) in SHOW_THINKING:  # thinking is on; show what it says
        request["thinking"] = {"type": "adaptive", "display": "summarized"}
    # the API clears old tool results itself, in its beta (else clear_old_results does)
    if limits.clear_at and limits.context_edit == "server":
        request.update(server_clearing(limits))
    return request


def run_session(client, session, ctx, report, save):
    """The turn loop. Returns the Stop; `drive` maps an exception out of it to one."""
    limits = ctx.limits
    first = max([t["turn"] for t in session["turns"]], default=0) + 1
    last_turn = first + limits.max_turns - 1
    used = empty_usage()
    for turn in range(first, last_turn + 1):
        check_cancelled(ctx.cancel)
        if turn == last_turn:
            mark_final_turn(session["messages"])
        started = time.monotonic()
        record = {"turn": turn, "started_at": now()}
        report.turn_start(turn)
        cleared = clear_old_results(session, limits)
        if cleared:
            record["cleared"] = {"tool_results": cleared[0], "estimated_tokens": cleared[1]}
            report.line(
                f"cleared {plural(cleared[0], 'old tool result')} (about {cleared[1]} "
                "tokens) from what is sent; the history keeps them"
            )
        reply = request_turn(
            client,
            build_request(session, limits, final=turn == last_turn),
            limits,
            report,
            ctx.cancel,
        )
        content, notes = check_reply(reply.message, reply.cut_off)
        record.update(
            stop_reason=reply.message.get("stop_reason"),
            usage=empty_usage(),
            request_id=reply.request_id,
            attempts=reply.attempts,
            retries=reply.retries,
            seconds=round(time.monotonic() - started, 3),
            api_seconds=round(reply.api_seconds, 3),
            tool_calls=[],
            notes=notes,
            **reply_facts(reply),
        )
        for usage in reply.usages:  # a retried cut tool call was billed too
            add_usage(record["usage"], usage_record(session["model"], usage))
        add_usage(used, record["usage"])
        if reply.failed["tokens"]:  # attempts that failed were billed too: budgets see them
            record["failed_usage"] = reply.failed
            add_usage(used, reply.failed)
        session["turns"].append(record)
        if content:
            session["messages"].append({"role": "assistant", "content": content})
        else:
            record["in_history"] = False  # nothing of the reply could go back
        report.turn(record)
        stop = check_stop(reply.message, content, turn, last_turn, used, limits, reply.cut)
        tool_uses = [] if stop else [b for b in content if b["type"] == "tool_use"]
        stopped = None  # a Ctrl-C or SIGTERM while the tools ran: recorded, then the run ends
        if tool_uses:  # pause_turn has none: the paused content itself is the next request's end
            results, record["tool_calls"], stopped = run_tools(
                tool_uses, ctx, report, reply.cut_off
            )
            session["messages"].append({"role": "user", "content": results})
        record["seconds"] = round(time.monotonic() - started, 3)  # tools included
        report.turn_end(record)
        if stop:
            return stop
        if stopped:
            raise stopped
        save(session)
    raise AssertionError("check_stop always stops at the last turn")


def drive(client, session, ctx, report, save):
    """Run the loop to a Stop, whatever happens; the transcript is saved either way."""
    try:
        stop = run_session(client, session, ctx, report, save)
    except (KeyboardInterrupt, Interrupted, Exception) as exc:
        stop = stop_for(exc)
    session["stop"] = {
        "reason": stop.reason,
        "detail": redact(stop.detail),
        "exit_code": stop.exit_code,
    }
    if stop.retries:  # the attempts of the turn that failed
        session["stop"]["retries"] = stop.retries
    if stop.failed_usage and stop.failed_usage["tokens"]:  # and what they reported spending
        session["stop"]["failed_usage"] = stop.failed_usage
    failed_usage(session)
    session["answer"] = final_text(session) if stop.reason in TEXT_STOPS else None
    session["usage"] = total_usage(session)
    session["ended_at"] = now()
    save(session, final=True)
    return stop


# ================================================================================================
# 3. How a run stops
# ================================================================================================

# Every way a run can end: label -> exit code. The labels are the transcript's stop.reason, the
# run.stop event's stop, and what stderr and the tests say. check_stop decides after each
# response; stop_for decides when an exception ends the run; trials_stop how --trials ends.
EXIT_CODES = {
    "end_turn": 0,
    "stop_sequence": 0,  # the model finished
    "max_turns": 3,  # the last allowed turn ran with tools off; its text is an interim answer
    "token_budget": 4,
    "cost_budget": 4,  # checked after a response, before its tools run
    "max_tokens": 5,
    "refusal": 5,
    "model_context_window_exceeded": 5,  # stopped unfinished
    "api_error": 1,
    "error": 1,  # the API refused or failed; a bug or unknown stop_reason
    "interrupted": 130,  # Ctrl-C, SIGTERM or SIGHUP
    "replay_differs": 7,  # --replay --strict: a tool result is not the recorded one
}
# stops whose final text goes to stdout: the model's own ends, finished or cut short
TEXT_STOPS = {reason for reason, code in EXIT_CODES.items() if code in (0, 3, 5)}
EXIT_USAGE = 2  # a mistake on the command line (UsageError): nothing was sent
EXIT_TRIALS_FAILED = 6  # --trials: not every trial passed


@dataclass
class Stop:
    reason: str  # a label of EXIT_CODES
    detail: str  # what happened, in words, for stderr and the transcript
    retries: list = field(default_factory=list)  # the failed attempts of the last turn, if any
    failed_usage: dict | None = None  # what that turn's failed attempts reported they spent

    @property
    def exit_code(self):
        return EXIT_CODES[self.reason]


class UsageError(Exception):
    """A mistake on the command line: exit 2, nothing sent."""


def check_stop(message, content, turn, last_turn, used, limits, cut=None):
    """Decide after each response whether the run ends here; a Stop or None to go on."""
    reason = message.get("stop_reason")
    calls = sum(b.get("type") == "tool_use" for b in content)
    if turn >= last_turn:
        detail = (
            f"reached the limit of {plural(limits.max_turns, 'turn')}; the last one ran with "
            "tools off"
        )
        if calls:
            were = "was" if calls == 1 else "were"
            detail += (
                f"; the server ignored tool_choice none, and its {plural(calls, 'tool call')} "
                f"{were} not run"
            )
        return Stop("max_turns", detail)
    if reason in ("end_turn", "stop_sequence"):
        return Stop(reason, "the model finished")
    if reason == "max_tokens":
        return Stop(reason, cut or "the reply hit max_tokens; the text is partial")
    if reason == "refusal":
        return Stop(reason, "the model declined to answer")
    if reason == "model_context_window_exceeded":
        return Stop(reason, cut or "the conversation filled the model's context window")
    if reason not in ("tool_use", "pause_turn"):
        return Stop("error", f"unknown stop_reason {reason!r}")
    if reason == "tool_use" and not calls:  # nothing to answer: a request now would be prefill
        return Stop(
            "end_turn",
            "the reply said tool_use but held no tool call; its text is taken as the answer",
        )
    if used["tokens"] >= limits.token_budget:
        return Stop(
            "token_budget",
            f"used {used['tokens']} tokens of the {limits.token_budget} "
            "budget; the pending tool calls were not run",
        )
    if limits.budget_usd is not None and (used["cost_usd"] or 0) >= limits.budget_usd:
        return Stop(
            "cost_budget",
            f"spent ${used['cost_usd']:.6f} of the ${limits.budget_usd:.6f} "
            "budget; the pending tool calls were not run",
        )
    return None


def stop_for(exc, api=True):
    """The Stop an exception means: Ctrl-C, SIGTERM or SIGHUP, the API's or the network's
    refusal or failure (when `api`: it came out of the loop, which talks to the API), or a bug."""
    if isinstance(exc, (KeyboardInterrupt, Interrupted)):
        return Stop("interrupted", stopped_by(exc))
    if isinstance(exc, ReplayEnded):  # --replay asked past the recording: it knows the Stop
        return exc.stop
    if isinstance(exc, OutputLost):  # a full disk, a closed stdout: said as it is, not a bug
        return Stop("error", str(exc))
    if isinstance(exc, ReplayDiffers):  # --strict: the replies that follow answered other results
        return Stop("replay_differs", str(exc))
    status = getattr(exc, "status_code", None)
    retries = getattr(exc, "retries", [])
    spent = getattr(exc, "failed_usage", None)
    from_api = status is not None or transport_error(exc)
    if not api or not from_api and not type(exc).__module__.startswith("anthropic"):
        return Stop("error", f"{type(exc).__name__}: {exc}", retries, spent)
    detail = api_message(exc)
    if status == 401:
        detail += " (check ANTHROPIC_API_KEY)"
    if status == 400 and CONTEXT_ERROR.search(detail):
        return Stop("model_context_window_exceeded", detail, retries, spent)
    return Stop("api_error", detail, retries, spent)


# ================================================================================================
# 4. The tools, and the approval step
# ================================================================================================


class ToolError(Exception):
    """A tool failure, reported to the model as an is_error tool_result."""

    def __init__(self, message, exit_code=None, declined=False):
        super().__init__(message)
        # for the transcript and events
        self.exit_code = exit_code
        self.declined = declined


TOOLS = [
    {
        "name": "read_file",
        "description": (
            "Read a UTF-8 text file inside the working directory. Returns at most 2000 lines "
            "or 100 KB; a longer file comes back cut, with the offset to continue from."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "Path relative to the working directory.",
                },
                "offset": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "First line to return (1-based).",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Number of lines to return.",
                },
            },
            "required": ["path"],
        },
    },
    {
        "name": "run_python",
        "description": (
            "Run a Python script with the working directory as cwd and return its exit code, "
            "stdout and stderr. Times out after 30 s. It runs in a sandbox: only the working "
            "directory is readable and writable, and there is no network."
        ),
        "input_schema": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The complete script."}},
            "required": ["code"],
        },
    },
]


@dataclass
class ToolContext:
    """What the loop and the tools of one run share."""

    workdir: Path  # where the tools work: read_file cannot leave it, run_python is confined to it
    limits: Limits  # the run's only Limits
    sandbox: "Sandbox"  # run_python's boundary, proven at its first call
    approve: object  # callable: code -> True to run it (make_approver)
    decline_message: str = DECLINE_MESSAGE  # what a declined call tells the model
    cancel: threading.Event | None = None  # set to stop this run (its trial) from outside

    def __post_init__(self):
        box = self.sandbox  # its workdir, opened at the start: the directory run_python works in
        self.workdir_fd = (
            os.dup(box.pinned)
            if getattr(box, "workdir", None) == self.workdir
            else os.open(self.workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        )
        self.asking = threading.local()  # seconds this thread spent waiting for approval


# A byte of a file's name that is not UTF-8, as run_python prints it: caf\udce9.txt for 0xe9.
ESCAPED_BYTE = re.compile(r"\\udc([89a-f][0-9a-f])", re.IGNORECASE)


def read_file(ctx, path, offset=1, limit=None):
    """Return lines [offset, offset+limit) of a regular UTF-8 file inside the workdir."""
    try:
        fd = open_inside(ctx, path)
    except ToolError:
        # the name as run_python lists it (caf\udce9.txt): the file whose name has that byte
        real = ESCAPED_BYTE.sub(lambda m: chr(0xDC00 + int(m[1], 16)), path)
        if real == path:
            raise
        fd = open_inside(ctx, real)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(
                f"{path!r} is a directory. List it with run_python "
                f"(os.listdir({path!r})) and read one of its files."
            )
        if not stat.S_ISREG(info.st_mode):  # never opened for reading: a FIFO would block
            raise ToolError(
                f"{path!r} is not a regular file (a FIFO, socket or device); "
                "read_file only reads regular text files."
            )
        reading = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)  # the same inode
    except OSError as e:
        raise ToolError(f"cannot open {path!r}: {e.strerror}.")
    finally:
        os.close(fd)
    try:
        lines = min(limit or ctx.limits.read_lines, ctx.limits.read_lines)
        return read_window(reading, path, offset, lines, ctx.limits.read_bytes)
    finally:
        os.close(reading)


def run_python(ctx, code):
    """Run `code` in the sandbox, after the user approves; return exit code and output."""
    ctx.sandbox.ready()  # proves the boundary (once) before anyone is asked to rely on it
    # a Ctrl-C while the user is asked comes before the code ran
    asked = time.monotonic()
    ctx.asking.now = True
    approved = ctx.approve(code)
    ctx.asking.now = False
    ctx.asking.seconds = getattr(ctx.asking, "seconds", 0.0) + time.monotonic() - asked
    if not approved:
        raise ToolError(ctx.decline_message, declined=True)
    run = execute(
        code, ctx.workdir, ctx.sandbox, ctx.limits.tool_timeout, ctx.limits.output_chars, ctx.cancel
    )
    output = f"--- stdout ---\n{run.stdout}\n--- stderr ---\n{run.stderr}"
    if run.timed_out:
        raise ToolError(
            f"timed out after {ctx.limits.tool_timeout:g} s; the script and every "
            f"process it started were killed. Output so far:\n{output}"
        )
    report = f"exit code: {run.code}\n{output}"
    if run.oom:
        report = (
            f"killed: the script and its processes went over their memory cap of "
            f"{ctx.limits.memory_mb} MiB.\n{report}"
        )
    if run.code != 0:
        raise ToolError(f"the script failed.\n{report}", exit_code=run.code)
    return report


def make_approver(yes, no_sandbox, sandbox, stdin):
    """run_python runs unasked only with --yes and a proven sandbox (or --no-sandbox)."""

    def approve(code):
        if yes and (no_sandbox or sandbox.confined):
            return True
        # The question is approval_question, under "Terminal": no two programs look alike there.
        # Without the sandbox, the question itself says that a y runs the code unconfined.
        unconfined = None if no_sandbox or sandbox.confined else sandbox.why
        return agreed(approval_question(code, *terminal_size(), unconfined), stdin)

    return approve


TOOL_FUNCTIONS = {"read_file": read_file, "run_python": run_python}
JSON_TYPES = {"string": str, "integer": int}


def check_arguments(name, arguments):
    """Validate tool input against its schema; the API does not guarantee it."""
    schema = next(t["input_schema"] for t in TOOLS if t["name"] == name)
    props = schema["properties"]
    if not isinstance(arguments, dict):
        raise ToolError(f"{name} takes an object with {', '.join(props)}.")
    missing = [p for p in schema["required"] if p not in arguments]
    if missing:
        raise ToolError(f"{name} is missing the required argument {missing[0]!r}.")
    for key, value in arguments.items():
        if key not in props:
            raise ToolError(f"{name} has no argument {key!r}; it takes {', '.join(props)}.")
        kind = props[key]["type"]
        if not isinstance(value, JSON_TYPES[kind]) or isinstance(value, bool):
            raise ToolError(
                f"{name}: {key!r} must be a {kind}, got {shorten(json.dumps(value), 80)}."
            )
        if kind == "integer" and value < props[key].get("minimum", value):
            raise ToolError(f"{name}: {key!r} must be at least {props[key]['minimum']}.")
    return arguments


def call_tool(block, ctx, cut_off=None):
    """Run one tool_use block; every failure becomes an is_error tool_result. Returns the
    result and the facts the transcript keeps about the call (exit code, declined). A call
    whose arguments' JSON was cut off (`cut_off`: id -> that JSON) is not run."""
    result = {"type": "tool_result", "tool_use_id": block["id"]}
    facts = {"exit_code": 0 if block["name"] == "run_python" else None, "declined": False}
    try:
        function = TOOL_FUNCTIONS.get(block["name"])
        if function is None:
            raise ToolError(
                f"there is no tool {block['name']!r}; the tools are {', '.join(TOOL_FUNCTIONS)}."
            )
        if block["id"] in (cut_off or {}):
            raise ToolError(
                f"{block['name']}'s arguments did not arrive whole: the JSON was cut "
                f"off ({shorten(cut_off[block['id']], 100)!r}); the call was not run. "
                "Send it again with all its arguments."
            )
        result["content"] = function(ctx, **check_arguments(block["name"], block.get("input")))
    except ToolError as e:
        result["content"] = str(e)
        result["is_error"] = True
        facts.update(exit_code=e.exit_code, declined=e.declined)
    except Interrupted:
        raise
    except Exception as e:  # a bug in a tool must not end the loop
        result["content"] = f"internal tool error: {type(e).__name__}: {e}"
        result["is_error"] = True
        facts["exit_code"] = None
    result["content"] = clean(redact(result["content"]))  # no secret, by whatever route it came
    return result, facts


def run_tools(blocks, ctx, report, cut_off=None):
    """Run a turn's tool calls: reads concurrently, the rest in order; results in call order,
    within the turn's budget of bytes (the calls past it are answered with an error). Returns
    the results, what the transcript keeps of each call, and the Ctrl-C or SIGTERM that stopped
    them, if one did: every call is answered even then, the one it cut short saying so."""
    results = [None] * len(blocks)
    facts = [None] * len(blocks)
    seconds = [0.0] * len(blocks)

    def timed(i):
        report.tool_start(blocks[i])
        started = time.monotonic()
        asked = getattr(ctx.asking, "seconds", 0.0)
        try:
            results[i], facts[i] = call_tool(blocks[i], ctx, cut_off)
        except (KeyboardInterrupt, Interrupted) as e:
            when = "while it ran, before it finished"
            if getattr(ctx.asking, "now", False):
                when = "at its approval question: it was not run"
            results[i], facts[i] = unfinished(blocks[i], e, when)
            raise
        finally:
            # the time the user took to answer is theirs, not the tool's
            waited = getattr(ctx.asking, "seconds", 0.0) - asked
            seconds[i] = time.monotonic() - started - waited
            if results[i] is not None:
                report.tool(blocks[i], results[i], seconds[i], facts[i])

    # the calls past the most one turn runs are never run
    for i in range(ctx.limits.turn_calls, len(blocks)):
        results[i], facts[i] = not_run(blocks[i], ctx.limits.turn_calls)
        report.tool_start(blocks[i])
        report.tool(blocks[i], results[i], 0.0, facts[i])
    stopped = None
    try:
        reads = [i for i, b in enumerate(blocks) if b["name"] == "read_file" and results[i] is None]
        if len(reads) > 1:
            with ThreadPoolExecutor(max_workers=min(8, len(reads))) as pool:
                for future in [pool.submit(timed, i) for i in reads]:
                    future.result()
        # run_python has side effects: one at a time, in order
        for i in range(len(blocks)):
            if results[i] is None:
                timed(i)
    except (KeyboardInterrupt, Interrupted) as e:
        stopped = e
        for i, block in enumerate(blocks):
            if results[i] is None:
                results[i], facts[i] = unfinished(block, e, "before it ran: it was not run")
    spent = 0
    for i, block in enumerate(blocks):
        if spent + size(results[i]) > ctx.limits.turn_bytes:
            results[i] = over_budget(block, results[i], ctx.limits.turn_bytes)
            report.tool(block, results[i], seconds[i], dict(facts[i], withheld=True))
        spent += size(results[i])
    calls = [
        {
            "id": b["id"],
            "name": b["name"],
            "is_error": bool(r.get("is_error")),
            "declined": f["declined"],
            "exit_code": f["exit_code"],
            "bytes": size(r),
            "seconds": round(s, 3),
        }
        for b, r, f, s in zip(blocks, results, facts, seconds, strict=True)
    ]
    return results, calls, stopped


# ================================================================================================
# The machinery. Everything above is the agent; everything below keeps it bounded, recorded and
# safe. Each section stands on its own: read the one you need.
# ================================================================================================


# --- A turn's tool results: the calls one turn does not run or send, and the answer ---


def error_result(block, content):
    """An is_error tool_result that answers the call `block`."""
    return {"type": "tool_result", "tool_use_id": block["id"], "is_error": True, "content": content}


def not_run(block, limit):
    """The answer to a call past the most calls one turn runs (a turn stays bounded)."""
    said = (
        f"Not run: one turn runs at most {limit} tool calls. Read fewer files at once (one or "
        "two per turn), and make fewer calls in one turn."
    )
    return error_result(block, said), {"exit_code": None, "declined": False}


def over_budget(block, result, limit):
    """The answer to a call whose result no longer fits this turn's budget of bytes."""
    ran = f"Its {size(result)} bytes were not sent"
    if block["name"] == "run_python":
        ran = f"The script ran, but its {size(result)} bytes of output were not sent"
    return error_result(
        block,
        f"{ran}: this turn's tool results already reached the limit of {limit} bytes. Read "
        "fewer files at once (one or two per turn), or parts of them with offset and limit.",
    )


def size(result):
    return len(result["content"].encode("utf-8", "surrogatepass"))


def final_text(session):
    """The text of the last assistant message, or None if it has none."""
    last = (session["messages"] or [{}])[-1]
    blocks = last["content"] if last.get("role") == "assistant" else []
    return "".join(b.get("text", "") for b in blocks if b.get("type") == "text") or None


# --- Stopping: Ctrl-C, SIGTERM, SIGHUP and a trial's cancel ---

STOPPING = threading.Event()  # set by on_stop_signal (with the signal: .signum), cleared by main


def stopped_by(exc):
    """The interrupted stop's detail: SIGHUP is named; Ctrl-C and SIGTERM are said as one."""
    sighup = isinstance(exc, StopSignal) and exc.args == (signal.SIGHUP,)
    return "stopped by SIGHUP" if sighup else "stopped by Ctrl-C or SIGTERM"


def unfinished(block, stopped, when):
    """The answer to a call that a stop cut short, or kept from running, and its facts."""
    said = f"interrupted: {stopped_by(stopped)} {when}."
    return error_result(block, said), {"exit_code": None, "declined": False}


class StopSignal(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP, as a KeyboardInterrupt whose argument says which."""


class Interrupted(Exception):
    """Raised in a worker thread when the run was cancelled (Ctrl-C in trials)."""


def check_cancelled(cancel):
    """Raise if the run must stop: a stop signal (even a swallowed one), or `cancel` set."""
    if STOPPING.is_set():  # signum: the handler's; none when the flag was set by hand
        raise StopSignal(getattr(STOPPING, "signum", None))
    if cancel is not None and cancel.is_set():
        raise Interrupted()


def on_stop_signal(signum, frame):
    """Ctrl-C, SIGTERM and SIGHUP: kill the running tool, save, exit 130. The flag stays set for
    the loops that wait, as Python swallows the StopSignal in some places (a __del__)."""
    STOPPING.signum = signum
    STOPPING.set()
    raise StopSignal(signum)


class Connections:
    """Every connection the SDK's client opens (httpcore's trace, make_client's hook), so Ctrl-C in
    trials can shut the sockets other threads wait on; once cut, a new one is shut as it opens."""

    lock = threading.Lock()
    opened = weakref.WeakSet()
    cut = False

    @staticmethod
    def hook(request):  # an httpx request hook: trace this request's connections
        request.extensions["trace"] = Connections.trace

    @staticmethod
    def trace(name, info):
        stream = info.get("return_value")
        if name.endswith((".connect_tcp.complete", ".start_tls.complete")) and stream:
            with Connections.lock:
                Connections.opened.add(stream)
            if Connections.cut:
                Connections.cut_all()

    @staticmethod
    def cut_all():
        with Connections.lock:
            Connections.cut = True
            streams = list(Connections.opened)
        # shutdown, not close: it wakes a read blocked in another thread (a socket closed
        # already, or the raw socket of a TLS one, is let be)
        for stream in streams:
            with contextlib.suppress(Exception):
                stream.get_extra_info("socket").shutdown(socket.SHUT_RDWR)


# --- API plumbing and retries ---

MAX_COUNT = 1 << 53  # the largest count agent.py reads or writes: what JSON carries exactly
# Tokens a second a reply averages at least, after its first event (16,000 tokens: 27 min).
MIN_TOKEN_RATE = 10
# Characters one token can stream at most (the longest are ~16): bounds a reply's size too.
TOKEN_CHARS = 64
PLAIN_HTTP = "the server answers in plain HTTP, not TLS"
# the API's words for a prompt longer than the context window (stop_for)
CONTEXT_ERROR = re.compile(
    r"(?i)prompt is too long|context (window|length|size)|exceeds the (available )?context"
    r"|maximum context"
)
WORD = "a non-empty string"  # what an id or a name must be
BLOCK_FIELDS = {  # what a block of each kind must hold to be sent (a reply's, or a resumed one)
    "text": {"text": str},
    "tool_use": {"id": WORD, "name": WORD, "input": dict},
    "tool_result": {"tool_use_id": WORD},
    "thinking": {"thinking": str, "signature": str},
    "redacted_thinking": {"data": str},
}
# the blocks of the API's own tools, which go back as they came
SERVER_TOOL_BLOCKS = (
    "server_tool_use web_search_tool_result web_fetch_tool_result code_execution_tool_result "
    "bash_code_execution_tool_result text_editor_code_execution_tool_result "
    "tool_search_tool_result mcp_tool_use mcp_tool_result container_upload"
).split()
# the kinds of block each side may send
ROLE_BLOCKS = {
    "user": {"text", "tool_result"},
    "assistant": {"text", "thinking", "redacted_thinking", "tool_use", *SERVER_TOOL_BLOCKS},
}


def number(value):
    """A token count as a server sent it, or 0 when it is not a count up to 2**53."""
    return value if is_count(value) else 0


def json_safe(value):
    """True if `value` holds no NaN, infinity or integer past 2**53 (which JSON loses)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, (dict, list)):
            todo.extend(v.values() if isinstance(v, dict) else v)
        elif isinstance(v, float) and not math.isfinite(v):
            return False
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_COUNT:
            return False
    return True


def fields(value):
    """An object of a reply or document, or an empty one if it is something else."""
    return value if isinstance(value, dict) else {}


def items(value):
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


class StreamIncomplete(Exception):
    """A stream that stopped before message_stop, stalled, or ran past its time or size: retried."""


def watchdog(stream, seconds, lasts):
    """Shut the stream's socket after `seconds` without an event, or `lasts` in all: no server can
    hold a turn forever. The caller sets `last` at each event, `done` at the end; `fired`: why."""
    watch = SimpleNamespace(last=time.monotonic(), done=threading.Event(), fired=None)
    deadline = watch.last + lasts

    def run():
        moment = time.monotonic()
        while moment - watch.last <= seconds and moment <= deadline:
            if watch.done.wait(0.2):
                return
            moment = time.monotonic()
        watch.fired = (
            f"the reply went on past {lasts:.0f} s, the most its max_tokens may take at "
            f"{MIN_TOKEN_RATE} tokens a second"
            if moment > deadline
            else f"no event for {seconds:g} s; the server may be stuck"
        )
        # shutdown, not close: it wakes a read blocked in another thread
        with contextlib.suppress(Exception):
            network = stream.response.extensions.get("network_stream")
            sock = network.get_extra_info("socket") if network else None
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
            else:
                stream.close()

    threading.Thread(target=run, daemon=True).start()
    return watch


def stream_reply(client, request, report, cancel, limits, seen):
    """Send one request, stream its text to the reporter; return the Reply's message, request_id
    and cut_off ({id: arguments' JSON of each call cut off}). `seen` gets the usage so far."""
    messages = client.beta.messages if "betas" in request else client.messages
    most = request["max_tokens"] * TOKEN_CHARS  # characters the reply may stream
    lasts = limits.request_timeout + request["max_tokens"] / MIN_TOKEN_RATE  # seconds it may take
    with messages.stream(**request) as stream:
        if hasattr(stream, "response"):  # (a test's fake stream has none)
            not_a_stream(stream.response)
        watch = watchdog(stream, limits.request_timeout, lasts)
        # characters streamed; the tool call being written; calls whose JSON came cut off; what
        # is wrong with the reply if the stream ends here
        streamed = 0
        call = None
        cut_off = {}
        early = "the response stream ended before message_stop"
        try:
            for event in stream:
                watch.last = time.monotonic()
                check_cancelled(cancel)
                if event.type in ("text", "thinking"):
                    delta = getattr(event, event.type)
                    report.text(delta, thinking=event.type == "thinking")
                    streamed += len(delta)
                elif event.type == "content_block_start":
                    block = event.content_block
                    call = None
                    if block.type == "tool_use":
                        call = dict(name=getattr(block, "name", "?"), id=getattr(block, "id", None))
                        call.update(chars=0, pieces=[])
                        report.writing(call["name"], 0)
                elif event.type == "input_json" and call:
                    call["chars"] += len(event.partial_json)
                    # kept: the SDK reads a prefix as whole
                    call["pieces"].append(event.partial_json)
                    streamed += len(event.partial_json)
                    report.writing(call["name"], call["chars"])
                elif event.type == "content_block_stop" and call:
                    arguments = "".join(call["pieces"])
                    # whole JSON, not a prefix the SDK's partial reader took as whole
                    try:
                        json.loads(arguments if arguments.strip() else "{}")
                    except ValueError:
                        cut_off[call["id"]] = arguments
                    call = None
                elif event.type == "message_stop":
                    early = None
                elif event.type in ("message_start", "message_delta"):
                    # the usage the SDK's snapshot holds so far (none in a test's fake stream)
                    snapshot = getattr(stream, "current_message_snapshot", None)
                    usage = getattr(snapshot, "usage", None)
                    seen["usage"] = usage.to_dict() if hasattr(usage, "to_dict") else {}
                if streamed > most:
                    raise StreamIncomplete(
                        f"the reply streamed over {most:,} characters, more than max_tokens "
                        f"{request['max_tokens']} can hold; the server does not stop"
                    )
            if early:
                raise StreamIncomplete(watch.fired or early)
            message = stream.get_final_message()
        # the SDK's own parsing, of a stream a server garbled
        except (AssertionError, AttributeError, KeyError, TypeError, ValueError) as e:
            raise StreamIncomplete(
                f"the stream could not be read ({type(e).__name__}: {e}); "
                "a server left out or garbled an event"
            ) from e
        except Exception as e:
            check_cancelled(cancel)
            if watch.fired:
                raise StreamIncomplete(watch.fired) from e
            raise
        finally:
            watch.done.set()
        request_id = getattr(stream, "request_id", None)
    message = message.to_dict() if hasattr(message, "to_dict") else message
    return {"message": message, "request_id": request_id, "cut_off": cut_off}


class NotAStream(Exception):
    """A server answered a streamed request with something else: api_error, not retried."""

    status_code = 200


def not_a_stream(response):
    """Raise NotAStream when the response is not an event stream (its content-type says)."""
    kind = response.headers.get("content-type") or ""
    if kind.split(";")[0].strip().lower() != "text/event-stream":
        root = (server_url(str(response.url)) or "").split("/v1/messages")[0]  # no password
        raise NotAStream(
            f"the server answered {response.status_code} with "
            f"{'content-type ' + one_line(kind, 80) if kind else 'no content-type'}, "
            "not an event stream (text/event-stream), to a streamed request: is "
            f"ANTHROPIC_BASE_URL ({root}) an Anthropic Messages API server?"
        )


def transport_error(exc):
    """A network failure below HTTP (reset, refused, closed, timed out): worth another try."""
    names = {k.__name__ for e in (exc, exc.__cause__) if e is not None for k in type(e).__mro__}
    transport = {"APIConnectionError", "APITimeoutError", "TransportError", "ConnectionError"}
    return bool(names & (transport | {"StreamIncomplete"}))


def unreachable(exc):
    """Why the server cannot be reached at all (no retry mends it), or None."""
    while exc is not None:
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused: is the server running?"
        if isinstance(exc, socket.gaierror):
            return f"no such host: {exc.strerror}"
        # the answer to a TLS hello was not TLS
        wrong_version = getattr(exc, "reason", "") == "WRONG_VERSION_NUMBER"
        if type(exc).__name__ == "SSLError" and wrong_version:
            return PLAIN_HTTP
        exc = exc.__cause__ or exc.__context__
    return None


def retry_delay(exc, attempt, limits):
    """Seconds to wait before retrying after `exc`, or None if it is not worth retrying."""
    if unreachable(exc):
        return None
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    status = getattr(exc, "status_code", None)
    kind = fields(fields(getattr(exc, "body", None)).get("error")).get("type")
    # a kept-alive connection the server closed between replies: a new one at once
    cause = exc.__cause__ or exc
    stale = type(cause).__name__ == "RemoteProtocolError" and "without sending" in str(cause)
    if transport_error(exc):
        if stale and attempt == 1:
            return 0.0
        transient = True
    elif status is None:
        transient = False
    elif headers.get("x-should-retry") in ("true", "false"):
        transient = headers["x-should-retry"] == "true"
    elif status < 400:  # an error event inside a 200 stream
        transient = kind in ("overloaded_error", "api_error", "rate_limit_error", "timeout_error")
    else:
        # not 501 (not implemented) or 505 (HTTP version not supported): no retry mends those
        transient = status in (408, 409, 429) or status >= 500 and status not in (501, 505)
    if not transient:
        return None
    # a retry-after that is not a finite number of seconds from now is ignored
    with contextlib.suppress(TypeError, ValueError):
        after = float(headers.get("retry-after"))
        if math.isfinite(after) and after >= 0:
            return min(after, 60.0)
    return min(limits.retry_base * 2 ** (attempt - 1), 30.0)


def request_with_retries(client, request, limits, report, cancel):
    """Up to max_attempts requests for one turn, backing off on transient failures; returns
    the Reply. What a failed attempt was billed is kept in the Reply's `failed` (or, when the
    turn fails, in the exception's `failed_usage`, beside its `retries`)."""
    reply = Reply(None, None, 0, [], [], 0.0)
    for attempt in range(1, limits.max_attempts + 1):
        started = time.monotonic()
        seen = {}
        try:
            got = stream_reply(client, request, report, cancel, limits, seen)
        except Exception as exc:
            # a request that Ctrl-C cut (Connections) is not a failure, nor a cancelled run
            check_cancelled(cancel)
            reply.api_seconds += time.monotonic() - started
            if seen.get("usage"):
                add_usage(reply.failed, usage_record(request["model"], seen["usage"]))
            delay = retry_delay(exc, attempt, limits)
            if delay is None or attempt == limits.max_attempts:
                # kept in the transcript
                exc.retries = reply.retries
                exc.failed_usage = reply.failed
                raise
            retry = {"attempt": attempt, "status": getattr(exc, "status_code", None)}
            retry.update(error=api_message(exc), delay=round(delay, 3))
            reply.retries.append(retry)
            report.retry(retry, limits.max_attempts)
            # a trial cancelled while it waits: by a stop signal, check_cancelled says so
            if (cancel or threading.Event()).wait(delay):
                check_cancelled(cancel)
        else:
            reply.usages.append(got["message"].get("usage") or {})
            reply.api_seconds += time.monotonic() - started
            return replace(reply, attempts=attempt, **got)


def is_cut_tool_call(message):
    """True if max_tokens cut the reply inside a tool call (its last block)."""
    content = message.get("content")
    last = content[-1] if isinstance(content, list) and content else None
    return message.get("stop_reason") == "max_tokens" and fields(last).get("type") == "tool_use"


@dataclass
class Reply:
    message: dict  # the final reply, a cut tool call removed
    request_id: str | None
    attempts: int  # HTTP requests for this turn, retries included
    usages: list  # usage of every response billed for this turn
    retries: list  # a record per failed attempt that was retried
    api_seconds: float  # time spent waiting on the API, backoff excluded
    cut: str | None = None  # why a cut tool call was dropped
    cut_off: dict = field(default_factory=dict)  # tool_use id -> its arguments, JSON cut off
    failed: dict = field(default_factory=lambda: empty_usage())  # what failed attempts reported


def request_turn(client, request, limits, report, cancel):
    """One turn: a reply cut inside a tool call is retried once with twice the max_tokens."""
    reply = request_with_retries(client, request, limits, report, cancel)
    asked = request["max_tokens"]
    cut = f"the reply was cut inside a tool call at max_tokens {asked}"
    model = base_model(request["model"])
    bigger = min(2 * asked, MAX_OUTPUT.get(model, 128_000))
    window = CONTEXT_WINDOW.get(model)
    prompt = prompt_tokens(reply.usages[0])
    written = number(fields(reply.message.get("usage")).get("output_tokens"))
    why_not = ""
    if window and prompt + bigger > window:
        why_not = (
            f"; not retried: its prompt of {prompt} tokens and {bigger} more would not fit "
            f"the context window of {window}"
        )
    elif 0 < written < asked:
        why_not = (
            f"; not retried: it stopped at {written} output tokens, below max_tokens {asked}, "
            "so the server's context, not max_tokens, was full"
        )
    if is_cut_tool_call(reply.message) and bigger > asked and not why_not:
        report.line(f"{cut}; retrying the turn with {bigger}")
        request = dict(request, max_tokens=bigger)
        try:
            again = request_with_retries(client, request, limits, report, cancel)
        except Exception as exc:
            # the cut reply was billed: a failed attempt of the turn, with what it reported
            spent = add_usage(usage_record(request["model"], reply.usages[0]), reply.failed)
            exc.failed_usage = add_usage(spent, getattr(exc, "failed_usage", empty_usage()))
            error = f"{cut}; retried with {bigger}"
            retry = {"attempt": reply.attempts, "status": None, "error": error, "delay": 0}
            exc.retries = reply.retries + [retry] + getattr(exc, "retries", [])
            raise
        # the second reply, with what both requests took and were billed
        add_usage(again.failed, reply.failed)
        for name in ("usages", "attempts", "api_seconds", "retries"):
            setattr(again, name, getattr(reply, name) + getattr(again, name))
        reply = again
        cut += f" and again at {bigger}"
    message = reply.message
    if is_cut_tool_call(message):  # never keep or run a tool call whose input is incomplete
        message = dict(message, content=message["content"][:-1])
        reply.cut = f"{cut}{why_not}; the incomplete call was not run"
    if not isinstance(message.get("stop_reason"), (str, type(None))):  # kept, as a string
        message = dict(message, stop_reason=shorten(json.dumps(message["stop_reason"]), 80))
    reply.message = clean(message)  # a server's "\\ud800" is not text: kept as U+FFFD
    return reply


def block_problem(block, role):
    """Why a content block cannot be sent to the API as it is, in a message of `role`, or None."""
    if not isinstance(block, dict) or not is_str(block.get("type")):
        return "a content block that is not an object with a type"
    if block["type"] not in ROLE_BLOCKS[role]:
        return f"a {shorten(block['type'], 40)!r} block, which the {role} side cannot send"
    for key, kind in BLOCK_FIELDS.get(block["type"], {}).items():
        if not (is_str(block.get(key)) if kind is WORD else isinstance(block.get(key), kind)):
            what = kind if kind is WORD else "a string" if kind is str else "an object"
            return f"a {block['type']} block whose {key} is not {what}"
    if not json_safe(block):
        return f"a {block['type']} block holding NaN, an infinity or a number past 2**53"
    return None


def check_reply(message, cut_off=None):
    """The reply's content as it can go back, and notes on what was mended: a block the API
    would not take back, empty text, a repeated tool_use id are dropped (a dropped call is never
    run; neither is one whose arguments were cut off, which stays, answered with an error)."""
    content = message.get("content")
    if not isinstance(content, list):
        return [], [f"the reply's content was {type(content).__name__}, not a list"] * bool(content)
    kept, notes = [], []
    ids = set()  # of the tool calls kept (a set: a server decides how many blocks come)
    for block in content:
        problem = block_problem(block, "assistant")
        if problem:
            notes.append(f"{problem} was dropped, not run: {shorten(repr(block), 100)}")
        elif block["type"] == "tool_use" and block["id"] in ids:
            notes.append(
                f"a tool_use with a repeated or missing id ({block['id']!r}) was dropped, not run"
            )
        elif block["type"] != "text" or block["text"].strip():
            kept.append(block)
            ids.add(block.get("id"))
            if block["type"] == "tool_use" and block["id"] in (cut_off or {}):
                notes.append(
                    f"the arguments of tool call {block['id']} ({block['name']}) did not "
                    f"arrive whole (the JSON was cut off: "
                    f"{shorten(cut_off[block['id']], 100)!r}); it was not run"
                )
    return kept, notes


def reply_facts(reply):
    """What the transcript keeps of a reply besides its content: its id, its prompt size, why
    the cache missed and what the API cleared, where it said so."""
    message = reply.message
    miss = fields(message.get("diagnostics")).get("cache_miss_reason")
    edits = fields(message.get("context_management")).get("applied_edits")
    return {
        "message_id": message.get("id") if isinstance(message.get("id"), str) else None,
        "prompt_tokens": prompt_tokens(billed(reply.usages[-1])[-1]),
        "cache_miss": miss if json_safe(miss) else None,
        **({"context_edits": edits} if isinstance(edits, list) and json_safe(edits) else {}),
    }


def api_message(exc):
    """The server's error in one line, for stderr and the transcript: the API's own message,
    or what another server answered (foreign_error)."""
    body = getattr(exc, "body", None)
    error = body.get("error") if isinstance(body, dict) else None
    status = getattr(exc, "status_code", None)
    asked = asked_url(exc) if isinstance(status, int) and status >= 400 else None
    if isinstance(error, dict):  # the API's {"type": "error", "error": {...}}, or a server's
        kind = error.get("type") or error.get("code") or "error"
        text = f"{kind}: {one_line(str(error.get('message', '')), 300)}"
        if asked and (status == 404 or "/v1/v1/" in asked):  # a wrong path: say which
            text += f", from {asked}"
    elif asked:
        return clean(foreign_error(exc, status, body, asked))
    else:
        text = error if isinstance(error, str) else (str(exc) or type(exc).__name__)
    host = asked_url(exc, path=False) if transport_error(exc) else None
    why = unreachable(exc) if host else None
    if why:
        if why == PLAIN_HTTP and host.startswith("https://"):
            base = asked_url(exc).rpartition("/v1/messages")[0] or host
            why += f": give ANTHROPIC_BASE_URL as http://{base.removeprefix('https://')}"
        return f"cannot reach {host} ({why})"
    text += f" (talking to {host})" if host and host not in text else ""
    text += f": {wrong_root(asked)}" if wrong_root(asked) else ""
    return clean(f"{status} {text}" if isinstance(status, int) and status >= 400 else text)


def asked_url(exc, path=True):
    """The URL a failed request asked (scheme://host:port, then its path if `path`), without
    credentials or query, or None if the exception does not know."""
    for e in (exc, exc.__cause__):
        with contextlib.suppress(Exception):
            url = e.request.url
            host = f"[{url.host}]" if ":" in url.host else url.host  # an IPv6 address
            return f"{url.scheme}://{host}{f':{url.port}' if url.port else ''}" + url.path * path
    return None


def wrong_root(asked):
    """A base URL ending in /v1 or /v1/messages, which this SDK adds again: what to give."""
    given = (asked or "").rpartition("/v1/messages")[0]
    root = re.sub(r"/v1(/messages)?/?$", "", given)
    if root == given:
        return ""
    without = given.removeprefix(root).rstrip("/")
    return f"ANTHROPIC_BASE_URL is the server's root, without {without} ({root})"


def foreign_error(exc, status, body, asked):
    """One line for a status whose body is not the API's JSON error (a web server, a proxy's
    page, nothing): the status, the URL asked, a clean excerpt of the body."""
    # the standard phrase, not the server's own: that could say anything
    known = status in {code.value for code in http.HTTPStatus}
    reason = f" {http.HTTPStatus(status).phrase}" if known else ""
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    raw = body if isinstance(body, str) else "" if body is None else json.dumps(body)
    is_page = "html" in str(headers.get("content-type", "")).lower() or raw.lstrip()[:1] == "<"
    if is_page:
        raw = re.sub(r"(?is)<(head|script|style)\b.*?</\1\s*>|<!--.*?-->|<[^>]*>", " ", raw)
        raw = html.unescape(raw)
    excerpt = one_line(raw, 100)
    what = ("an HTML page" if is_page else "a body") if excerpt else "an empty body"
    line = f"{status}{reason} from {asked}: {what}, not the API's JSON error"
    line += f" ({excerpt})" if excerpt else ""
    if wrong_root(asked):
        return f"{line}; {wrong_root(asked)}"
    base = asked.split("/v1/messages")[0]
    if urllib.parse.urlsplit(base).hostname == "api.anthropic.com":
        return line
    return f"{line}; is ANTHROPIC_BASE_URL ({base}) an Anthropic Messages API server?"


def one_line(text, width):
    """Text as one line of at most `width` characters: whitespace runs and what a terminal
    would obey (controls, bidi marks) made single spaces."""
    return shorten(" ".join(INVISIBLE.sub(" ", clean(text)).split()), width)


# --- Usage and cost ---


# USD per million tokens of input, output, cache writes (5-minute, 1-hour) and cache reads, as
# billed on the Claude API (platform.claude.com/docs/en/about-claude/pricing, 2026-12-02). Haiku
# 5.5 bills a request whose prompt (input + cache reads + writes) exceeds 100,000 tokens at its
# second band, output included. Each entry: ((prompt tokens up to, price), ...); None: no bound.
Price = namedtuple("Price", "input output write_5m write_1h read")
OPUS_4 = ((None, Price(5.00, 25.00, 6.25, 10.00, 0.50)),)
SONNET_4 = ((None, Price(3.00, 15.00, 3.75, 6.00, 0.30)),)
PRICING = {
    "claude-haiku-5-5": (
        (100_000, Price(0.10, 0.50, 0.125, 0.20, 0.01)),
        (None, Price(0.50, 2.50, 0.625, 1.00, 0.05)),
    ),
    "claude-sonnet-5-5": ((None, Price(2.00, 10.00, 2.50, 4.00, 0.10)),),
    "claude-opus-5-5": ((None, Price(4.00, 20.00, 5.00, 8.00, 0.20)),),
    "claude-fable-5-2": ((None, Price(8.00, 40.00, 10.00, 16.00, 0.20)),),
    "claude-fable-5-1": ((None, Price(10.00, 50.00, 12.50, 20.00, 0.25)),),
    "claude-fable-5": ((None, Price(10.00, 50.00, 12.50, 20.00, 1.00)),),
    "claude-opus-5": OPUS_4,
    "claude-sonnet-5": ((None, Price(2.00, 10.00, 2.50, 4.00, 0.20)),),
    **dict.fromkeys(
        ("claude-opus-4-8", "claude-opus-4-7", "claude-opus-4-6", "claude-opus-4-5"), OPUS_4
    ),
    **dict.fromkeys(("claude-sonnet-4-6", "claude-sonnet-4-5"), SONNET_4),
    "claude-haiku-4-5": ((None, Price(1.00, 5.00, 1.25, 2.00, 0.10)),),
}
# the billed token counts of a response's usage
COUNTS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
# output-token ceiling; 128K for the others
MAX_OUTPUT = dict.fromkeys(("claude-haiku-4-5", "claude-sonnet-4-5", "claude-sonnet-4-6"), 64_000)
# models whose notes between tool calls are thinking, shown only on request ("display"
# defaults to "omitted"): without it, stderr goes silent between tool calls.
SHOW_THINKING = {"claude-opus-5-5", "claude-sonnet-5-5", "claude-fable-5", "claude-fable-5-1"}
# tokens of prompt + output, where the model overview pages give them
CONTEXT_WINDOW = {
    **dict.fromkeys(("claude-haiku-5-5", "claude-sonnet-5-5", "claude-opus-5-5"), 1_000_000),
    **dict.fromkeys(("claude-haiku-4-5", "claude-sonnet-4-5", "claude-opus-4-5"), 200_000),
}
# tokens the API adds with tools (pricing page, 2026-12-02)
TOOL_USE_PROMPT = dict.fromkeys(("claude-haiku-5-5", "claude-sonnet-5-5", "claude-opus-5-5"), 286)
EXAMPLE_QUESTION = "scores.csv 里平均分是多少？"  # the article's experiment 1 (--count-tokens)


def base_model(model):
    """The pricing key of a model id: a trailing -YYYYMMDD date is dropped."""
    return re.sub(r"-\d{8}$", "", model)


def billed(usage):
    """The parts of a response's usage that are billed: each entry of usage.iterations (from
    server-side compaction) when it has them, all objects, else the usage itself."""
    parts = fields(usage).get("iterations")
    return parts if parts and items(parts) == parts else [fields(usage)]


def cost_usd(model, usage):
    """What one response costs, priced the way the API bills it; None for an unknown model."""
    bands = PRICING.get(base_model(model))
    if bands is None:
        return None
    total = 0.0
    for part in billed(usage):  # each iteration is priced on its own, band included
        fresh, out, written, read = (number(part.get(k)) for k in COUNTS)
        price = next(p for limit, p in bands if limit is None or fresh + written + read <= limit)
        write_1h = number((part.get("cache_creation") or {}).get("ephemeral_1h_input_tokens"))
        # without the split, every write is a 5-minute write
        counts = (fresh, out, written - write_1h, write_1h, read)
        # added one by one: sum() of floats rounds otherwise on Python 3.12 and later
        cost = 0.0
        for n, p in zip(counts, price, strict=True):
            cost += n * p
        total += cost
    return total / 1_000_000


def prompt_tokens(usage):
    return min(sum(number(usage.get(k)) for k in COUNTS if k != "output_tokens"), MAX_COUNT)


def usage_record(model, usage):
    """A response's usage as the transcript keeps it: the four counts, their sum, the cost."""
    record = {k: min(sum(number(p.get(k)) for p in billed(usage)), MAX_COUNT) for k in COUNTS}
    record["tokens"] = min(sum(record.values()), MAX_COUNT)  # past it, a server's story
    record["cost_usd"] = cost_usd(model, usage)
    return record


def add_usage(total, part):
    """Add a usage record into a total; one unknown cost makes the total unknown."""
    for key in COUNTS + ("tokens",):
        total[key] = min(total[key] + part[key], MAX_COUNT)
    costs = (total["cost_usd"], part["cost_usd"])
    total["cost_usd"] = None if None in costs else round(sum(costs), 10)
    return total


def empty_usage():
    return {**dict.fromkeys(COUNTS, 0), "tokens": 0, "cost_usd": 0.0}


def total_usage(session):
    return reduce(add_usage, [t["usage"] for t in session["turns"]], empty_usage())


def failed_usage(session):
    """Set the transcript's `failed_usage` (left out when zero): what the server reported for
    failed attempts over every turn and the stop, kept apart from `usage`."""
    parts = [r.get("failed_usage") for r in session["turns"] + [session.get("stop") or {}]]
    total = reduce(add_usage, items(parts), empty_usage())
    if total["tokens"]:
        session["failed_usage"] = total
    return total


def count_tokens(client, model, question, system=SYSTEM_PROMPT):
    """What one request's fixed part costs in input tokens, by the API's count_tokens."""
    asked = [{"role": "user", "content": [{"type": "text", "text": question}]}]
    counts = []
    for parts in ({}, {"system": system}, {"system": system, "tools": TOOLS}):
        answer = client.messages.count_tokens(model=model, messages=asked, **parts)
        value = getattr(answer, "input_tokens", None)
        if number(value) != value:
            raise ValueError(
                f"the server's count_tokens reply held no token count "
                f"(input_tokens: {shorten(repr(value), 40)})"
            )
        counts.append(value)
    bare, with_system, everything = counts
    tools = everything - with_system
    added = TOOL_USE_PROMPT.get(base_model(model))  # from the pricing page, where it says
    rows = [("the question", bare), ("the system prompt", with_system - bare)]
    named = f"the {len(TOOLS)} tool definitions"
    if added is not None and tools >= added:
        rows += [(named, tools - added), ("the tool-use system prompt the API adds", added)]
    else:
        rows.append((f"{named}, with the API's tool-use system prompt", tools))
    rows.append(("every request starts with", with_system + tools))
    width = max(len(label) for label, _ in rows)
    head = f"{model}, input tokens by the API's count_tokens, for {question!r}:"
    return "\n".join([head] + [f"  {label:<{width}}  {n:>7,}" for label, n in rows])


# --- Clearing old tool results ---


def server_clearing(limits):
    """The request's fields that ask the API to clear old tool results (its beta)."""
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": limits.clear_at},
        "keep": {"type": "tool_uses", "value": limits.keep_results},
        "clear_at_least": {"type": "input_tokens", "value": limits.clear_at_least},
    }
    return {"betas": ["context-management-2025-06-27"], "context_management": {"edits": [edit]}}


def clear_old_results(session, limits):
    """Once the last prompt reached the trigger, clear every tool result but the newest
    keep_results, if that frees clear_at_least tokens. The ids only ever grow; the history
    is never edited. Returns (how many, tokens freed) or None."""
    prompt = (session["turns"] or [{}])[-1].get("prompt_tokens", 0)
    if not limits.clear_at or limits.context_edit != "client" or prompt < limits.clear_at:
        return None
    cleared = set(session.setdefault("cleared", []))
    # (only the user's side holds tool results: a resumed run and a reply are checked for it)
    results = [b for m in session["messages"] for b in m["content"] if b["type"] == "tool_result"]
    older = results[: max(0, len(results) - limits.keep_results)]
    old = [b for b in older if b["tool_use_id"] not in cleared]
    # roughly 4 bytes a token: enough to decide a clearing
    sizes = [b.get("content") for b in old]
    freed = sum(len(c if isinstance(c, str) else json.dumps(c)) // 4 for c in sizes)
    if not old or freed < limits.clear_at_least:
        return None
    # a new list: a snapshot being written keeps the old one
    session["cleared"] = session["cleared"] + [b["tool_use_id"] for b in old]
    return len(old), freed


def sent_view(session):
    """The history as it is sent: cleared tool results as placeholders, and a cache breakpoint
    where the previous request ended (automatic caching looks back only 20 blocks)."""
    cleared = set(session.get("cleared", ()))
    messages = session["messages"]
    # messages are shared, never changed: a new one replaces one in the view
    view = list(messages)
    calls = {b["id"]: b for m in messages for b in m["content"] if b["type"] == "tool_use"}
    for i, m in enumerate(messages if cleared else ()):
        blocks = [
            placeholder(b, calls) if b.get("tool_use_id") in cleared else b for b in m["content"]
        ]
        if m["role"] == "user" and blocks != m["content"]:
            view[i] = {"role": "user", "content": blocks}
    answers = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    previous_end = answers[-1] - 1 if answers else -1
    if previous_end >= 0 and view[previous_end]["role"] == "user":
        content = view[previous_end]["content"]
        last = dict(content[-1], cache_control={"type": "ephemeral"})
        view[previous_end] = {"role": "user", "content": content[:-1] + [last]}
    return view


def placeholder(block, calls):
    """A cleared tool result: same id, same error flag, a line saying what it was."""
    call = calls.get(block["tool_use_id"], {})
    what = f"the result of {call.get('name', 'a tool call')}"
    if call.get("name") == "read_file":
        what += " " + shorten(json.dumps(call.get("input"), ensure_ascii=False), 100)
    kept = {k: v for k, v in block.items() if k in ("type", "tool_use_id", "is_error")}
    return dict(kept, content=f"[cleared to save context: {what}; call it again if you need it]")


# --- Transcript, events, schemas and resume ---

SECRETS = set()  # values agent.py read as secrets (the API key): never sent or written out
REDACTED = "[redacted secret]"


def redact(value):
    """`value` with every whole secret replaced by a marker: in text (str or UTF-8 bytes), or in
    every string of a document, keys too. Every door out redacts (docs/threat-model.md)."""
    if not SECRETS:
        return value
    if isinstance(value, dict):
        return {redact(k): redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    # the longest first, so that a secret that holds another is replaced whole
    for secret in sorted(SECRETS, key=len, reverse=True):
        if isinstance(value, str):
            value = value.replace(secret, REDACTED)
        elif isinstance(value, bytes):
            value = value.replace(secret.encode("utf-8", "surrogateescape"), REDACTED.encode())
    return value


def secret_start(text, least=1, ends=False):
    """How many characters (at least `least`) at the end of `text` could begin a secret (with
    `ends`, of a reversed text: end one): a stream holds them back, a cut drops them."""
    secrets = [s[::-1] if ends else s for s in SECRETS]
    starts = [n for s in secrets for n in range(least, len(s)) if text.endswith(s[:n])]
    return max(starts, default=0)


def now():
    """The time as the transcript and events write it: ISO-8601 UTC, milliseconds."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# made once, not per call; NaN and Infinity are not JSON
ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dump(document):
    """A document as the bytes agent.py writes: one line of JSON, secrets redacted, a lone
    surrogate as U+FFFD, and a NaN or Infinity that slipped through as null."""
    try:
        text = ENCODER.encode(document)
    except ValueError:
        document = json.loads(json.dumps(document), parse_constant=lambda _: None)
        text = ENCODER.encode(document)
    # JSON writes a secret's quote or backslash escaped, so it is looked for as JSON writes it,
    # and then redacted in the document's strings, not in the text: the file stays JSON
    if any(ENCODER.encode(secret)[1:-1] in text for secret in SECRETS):
        text = ENCODER.encode(redact(document))
    return utf8(text) + b"\n"


LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str, never part of a valid character


def utf8(text):
    # a text holds a lone surrogate rarely: looked for only then (30 ms on 10 MB of non-ASCII)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return clean(text).encode("utf-8")


def clean(value):
    """A value from outside with each lone surrogate in its strings replaced by U+FFFD."""
    if isinstance(value, str):
        return value if value.isascii() else LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


TRANSCRIPT_NEEDS_A_FILE = "a transcript is rewritten after every turn, so it only replaces a file; give a file name, or --transcript - for stdout at the end (with --no-keep for no copy at all)"


# Every file agent.py writes: new (nothing planted is opened), through no symlink, closed on exec
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class OutputFile:
    """The one writer of every file agent.py writes, checked before the first request: outside
    the workdir, through no symlink another user made, never over another user's file; an
    existing file is replaced (a new file, O_EXCL, then a rename), never written in place; no
    symlink at the path itself, except a stream the user named may go through their own FIFO
    or character device (`named=False`: a path agent.py chose)."""

    def __init__(self, path, workdir, flag="--transcript", stream=False, named=True):
        path = Path(os.path.abspath(path))
        self.path = path
        self.name = path.name
        self.device = None
        self.tty = False
        # /dev/stdout, /dev/fd/N: agent.py's own descriptor, which the shell opened, written
        # through as `-` writes stdout; a transcript, rewritten after every turn, needs a file
        own = own_descriptor(path) if named else None
        if own is not None and not stream:
            raise UsageError(f"{flag} {path} is not a regular file: {TRANSCRIPT_NEEDS_A_FILE}")
        if own is not None:
            try:
                self.device = os.dup(own)
            except OSError:
                raise UsageError(f"{flag} {path}: agent.py's descriptor {own} is not open")
            self.tty = os.isatty(self.device)
            self.identity = file_identity(self.device)
            return
        parent = real_directory(path, flag)
        check_harness(parent / self.name, flag, path)
        if workdir is not None and (parent / self.name).is_relative_to(workdir):
            trusted = " (and --resume would trust it)" if flag == "--transcript" else ""
            raise UsageError(
                f"{flag} {path} is inside the workdir {workdir}, where the model's code could rewrite it{trusted}: put it outside, e.g. next to the workdir"
            )
        try:
            self.dir_fd = open_directory(parent)
        except OSError as e:
            why = "does not exist" if e.errno == errno.ENOENT else e.strerror
            raise UsageError(f"{flag} {path}: the directory {parent} {why}")
        try:
            there = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            there = None
        except OSError as e:  # a name too long, say
            raise UsageError(f"{flag} {path} cannot be written: {e.strerror}")
        mine = there is not None and there.st_uid in (os.geteuid(), 0)
        # a stream the user named may go through their own link to a pipe or device (/dev/fd/63)
        if mine and stat.S_ISLNK(there.st_mode) and stream and named:
            target = os.path.realpath(path)
            if workdir is not None and Path(target).is_relative_to(workdir):
                raise UsageError(f"{flag} {path} leads into the workdir {workdir} ({target})")
            with contextlib.suppress(OSError):
                followed = os.stat(path)
                if stat.S_IFMT(followed.st_mode) in (stat.S_IFIFO, stat.S_IFCHR):
                    there = followed
        kind = there and stat.S_IFMT(there.st_mode)
        if kind == stat.S_IFDIR:
            raise UsageError(f"{flag} {path} is a directory; give a file name")
        if kind == stat.S_IFLNK:
            raise UsageError(
                f"{flag} {path} is a symlink; agent.py writes no file through one: give the file itself"
            )
        if there and there.st_uid not in (os.geteuid(), 0):
            other = " with --transcript" if flag == "--resume" else ""
            raise UsageError(
                f"{flag} {path} is {FILE_KINDS.get(kind, 'a file')} that belongs to another user (uid {there.st_uid}); agent.py writes into or over no one else's file: give another name{other}"
            )
        self.identity = (there.st_dev, there.st_ino) if there else str(parent / self.name)
        if kind in (stat.S_IFIFO, stat.S_IFCHR) and stream and named:
            # the FIFO or device at the path, never blocking for want of a reader
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError as e:
                why = "no one reads from it" if e.errno == errno.ENXIO else e.strerror
                raise UsageError(f"{flag} {path} cannot be written: {why}")
            if file_identity(fd) != self.identity:
                os.close(fd)
                raise UsageError(f"{flag} {path} changed while it was opened")
            os.set_blocking(fd, True)
            self.device = fd
            # the user's own terminal: written to as stdout would be
            self.tty = os.isatty(fd)
        elif kind and kind != stat.S_IFREG:
            what = FILE_KINDS.get(kind, "a special file")
            if not named:
                what += ", and it is no path you named"
            why = "agent.py only replaces regular files: give a file name"
            if flag == "--transcript" and named:
                why = TRANSCRIPT_NEEDS_A_FILE
            raise UsageError(f"{flag} {path} is not a regular file ({what}); {why}")
        else:
            # in agent.py's checkout, only what agent.py writes is replaced
            if there:
                check_not_the_checkouts(parent / self.name, flag, path, self.dir_fd)
            # proves the directory writable before anything is paid for
            try:
                self.write(b"")
            except OSError as e:
                raise UsageError(f"{flag} {path} cannot be written: {e.strerror}")

    def stream(self):
        """A binary file to append to: the device, or a new file already in the old one's place."""
        if self.device is not None:
            return os.fdopen(self.device, "wb")
        fd = self.create()
        try:
            os.replace(self.temp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException:
            os.close(fd)
            self.discard()
            raise
        return os.fdopen(fd, "wb")

    def put(self, data):
        """Write a whole document once: through the device, or replacing the file."""
        data = redact(data)
        if self.device is None:
            return self.write(data, durable=True)
        if self.tty:
            data = for_terminal(data, html=data.startswith(b"<"), terminal=True)
        try:
            with self.stream() as f:
                f.write(data)
        except OSError as e:  # /dev/full
            raise OutputLost(f"{OutputLost.prefix}{self.path}: {e.strerror}") from e

    def create(self):
        """A new, empty file beside the target under a random name (O_EXCL: nothing planted)."""
        for _ in range(100):
            self.temp = temp_name(self.name)
            with contextlib.suppress(FileExistsError):
                return os.open(self.temp, NEW_FILE, 0o600, dir_fd=self.dir_fd)
        raise OSError(errno.EEXIST, "no free name for a new file beside it")

    def discard(self):
        with contextlib.suppress(OSError):
            os.unlink(self.temp, dir_fd=self.dir_fd)

    def write(self, data, durable=False):
        """Write `data` to a new file beside the target, then swap it in: a turn's save swaps
        the names (RENAME_EXCHANGE, cheaper on ext4 than a rename over a file) and unlinks the
        old; `durable` (the last save) fsyncs and renames."""
        fd = self.create()
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            if not data:
                self.discard()
                return
            exchange = not durable and getattr(LIBC, "renameat2", None)
            names = (self.dir_fd, self.temp.encode(), self.dir_fd, self.name.encode())
            # 2: RENAME_EXCHANGE
            if exchange and exchange(*names, 2) == 0:
                os.unlink(self.temp, dir_fd=self.dir_fd)  # now the old transcript
            else:  # the first save, or no RENAME_EXCHANGE here
                os.replace(self.temp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException:
            self.discard()
            raise


def own_descriptor(path):
    """The descriptor of agent.py's own that a path names (/dev/stdout: 1), or None."""
    numbered = re.fullmatch(r"(?:/dev|/proc/self)/fd/(\d+)", str(path))
    return int(numbered[1]) if numbered else {"/dev/stdout": 1, "/dev/stderr": 2}.get(str(path))


def temp_name(name):
    """The new file's name beside `name`: its start only, to stay within 255 bytes."""
    return f".{name[:40]}.{uuid.uuid4().hex[:16]}.tmp"


def real_directory(path, flag):
    """The real path of `path`'s directory, refusing a symlink another user (not root) made."""
    hops = 0
    real = Path("/")
    todo = list(reversed(path.parent.parts[1:]))  # still to resolve, the next one last
    while todo:
        part = todo.pop()
        if part == "..":
            real = real.parent
            continue
        step = real / part
        try:
            there = os.lstat(step)
        except OSError:
            return step.joinpath(*reversed(todo))
        if not stat.S_ISLNK(there.st_mode):
            real = step
            continue
        if there.st_uid not in (os.geteuid(), 0):
            raise UsageError(
                f"{flag} {path}: {step} is a symlink that another user (uid {there.st_uid}) made; agent.py follows no one else's link to write: give the real path"
            )
        hops += 1
        if hops > 40:
            raise UsageError(f"{flag} {path}: too many levels of symlinks")
        target = Path(os.readlink(step))
        if target.is_absolute():
            real = Path("/")
        todo.extend(reversed([p for p in target.parts if p != "/"]))
    return real


def open_directory(real):
    """A descriptor of the directory at `real`, reached through no symlink at all."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        return openat2(-100, str(real), flags, RESOLVE_NO_SYMLINKS)  # AT_FDCWD; absolute anyway
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UsageError(f"{real} changed into a symlink while it was being opened")
        if e.errno != errno.ENOSYS:
            raise
    return os.open(real, flags | os.O_NOFOLLOW)


FILE_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def file_identity(path):
    """What names a file or descriptor for the outputs' checks: its inode, else its path."""
    return file_id(path) or str(Path(os.path.realpath(Path(path).parent)) / Path(path).name)


def check_distinct(outputs, inputs=()):
    """Refuse two outputs on one file, or an output on an input: (flag, OutputFile or path)."""
    seen = {}
    for flag, out in outputs:
        if out.identity in seen:
            raise UsageError(
                f"{flag} {out.path} is also {seen[out.identity]}: two outputs on one file would destroy each other; give another name"
            )
        seen[out.identity] = f"{flag} {out.path}"
    for flag, path in inputs:
        if file_identity(path) in seen:
            raise UsageError(
                f"{seen[file_identity(path)]} would overwrite {flag} {path}, which it reads; give another name"
            )


# The published schemas (agent.py --schema transcript|events|summary), JSON Schema 2020-12.
# A version only adds fields (let unknown ones pass); those added after its release are optional.
STRING = {"type": "string"}
COUNT = {"type": "integer", "minimum": 0}
NUMBER = {"type": "number"}
OBJECT = {"type": "object"}
# the types of the fields below, by name
TYPES = dict(string=STRING, count=COUNT, number=NUMBER, object=OBJECT, int={"type": "integer"})
TYPES.update(bool={"type": "boolean"}, label={"enum": list(EXIT_CODES)})
TYPES["time"] = {**STRING, "format": "date-time"}


def published(title, body):
    draft = "https://json-schema.org/draft/2020-12/schema"
    return {"$schema": draft, "title": f"agent.py {title}", **body}


def nullable(schema):
    return {"anyOf": [schema, {"type": "null"}]}


def array(schema):
    return {"type": "array", "items": schema}


def typed(spec, **types):
    """Properties from "name:type ...", each type one of TYPES or `types`; "?type": it, or null."""
    properties = {}
    for entry in spec.split():
        name, kind = entry.split(":")
        schema = {**TYPES, **types}[kind.lstrip("?")]
        properties[name] = nullable(schema) if kind.startswith("?") else schema
    return properties


def obj(required, optional=None):
    properties = {**required, **(optional or {})}
    return {"type": "object", "required": sorted(required), "properties": properties}


RETRY = "attempt:count status:?int error:string delay:number"
# the records several schemas hold, by name
TYPES["usage"] = obj({**dict.fromkeys(COUNTS + ("tokens",), COUNT), "cost_usd": nullable(NUMBER)})
TYPES["retries"] = array(obj(typed(RETRY)))
TYPES["strings"] = array(STRING)
TYPES["objects"] = array(OBJECT)
# what a turn's record and its turn.end event both begin with
TURN = "turn:count stop_reason:?string usage:usage request_id:?string"
TOOL_CALL = obj(
    typed("id:string name:string is_error:bool seconds:number"),
    typed("declined:bool exit_code:?int bytes:count"),
)
TURN_RECORD = obj(
    typed(f"{TURN} seconds:number tool_calls:calls", calls=array(TOOL_CALL)),
    typed(
        "started_at:time attempts:count retries:retries failed_usage:usage api_seconds:number"
        " notes:strings message_id:?string prompt_tokens:count cache_miss:?object"
        " context_edits:objects cleared:cleared in_history:false",
        cleared=obj(typed("tool_results:count estimated_tokens:count")),
        false={"const": False},
    ),
)
BLOCK = {**obj({"type": STRING}), "additionalProperties": True}
MESSAGE = obj({"role": {"enum": ["user", "assistant"]}, "content": {**array(BLOCK), "minItems": 1}})
DIFFERENCE = obj(typed("turn:count id:string name:string diff:strings"))
TRANSCRIPT_SCHEMA = published(
    f"transcript, version {TRANSCRIPT_VERSION}",
    obj(
        typed(
            "version:version model:string effort:?effort system:string tools:objects"
            " workdir:string question:string messages:messages turns:turns stop:?stop"
            " answer:?string usage:usage",
            version={"const": TRANSCRIPT_VERSION},
            effort={"enum": list(EFFORTS)},
            messages=array(MESSAGE),
            turns=array(TURN_RECORD),
            stop=obj(
                typed("reason:label detail:string"),
                typed("exit_code:int retries:retries failed_usage:usage"),
            ),
        ),
        typed(
            "agent_version:string run_id:string started_at:time failed_usage:usage"
            " ended_at:?time trial:count cleared:strings events_lost:string"
            " produced_by:produced_by base_url:string replay:replay",
            produced_by=obj(
                typed("kind:string"), typed("model:string script:string note:string turns:count")
            ),
            replay=obj({"source": STRING, "differences": array(DIFFERENCE)}),
        ),
    ),
)
# each event's type -> the fields it always has; EVENT_OPTIONAL: those it may have
EVENT_TYPES = {
    "run.start": typed(
        "schema_version:version agent_version:string model:string workdir:string"
        " question:?string limits:object sandbox:object",
        version={"const": EVENTS_VERSION},
    ),
    "sandbox": typed("status:string confined:bool"),
    "turn.start": typed("turn:count"),
    "text": typed("turn:count text:string"),
    "api.retry": typed(f"turn:count {RETRY}"),
    "tool.start": typed("turn:count id:string name:string input:any", any={}),
    "tool.end": typed(
        "turn:count id:string name:string is_error:bool declined:bool exit_code:?int"
        " bytes:count seconds:number withheld:bool"
    ),
    "turn.end": typed(
        f"{TURN} attempts:count seconds:number api_seconds:number tool_calls:count notes:strings"
    ),
    "trial.start": typed("transcript:?string"),
    "trial.end": typed(
        "index:count stop:label passed:bool turns:count tokens:count cost_usd:?number"
        " seconds:number transcript:?string"
    ),
    "trials.summary": typed("summary:object"),
    "run.stop": typed(
        "stop:?label detail:string exit_code:int answer:?string usage:?usage turns:?count"
        " seconds:?number"
    ),
}
EVENT_OPTIONAL = {
    "run.start": typed("resumed_from:string replayed_from:string trials:count"),
    "text": typed("thinking:bool"),
}
EVENT_COMMON = {"type": {"enum": list(EVENT_TYPES)}, **typed("seq:count at:time run_id:string")}
EVENTS_SCHEMA = published(
    f"event (one JSON Lines record), version {EVENTS_VERSION}",
    {
        "oneOf": [
            obj(
                {**EVENT_COMMON, "type": {"const": kind}, **always},
                {"trial": COUNT, **EVENT_OPTIONAL.get(kind, {})},
            )
            for kind, always in EVENT_TYPES.items()
        ]
    },
)
SPREAD = obj(typed("mean:?number median:?number"))
# a trial's record in a summary: trial.end's fields, in another order
SUMMARY_TRIAL = (
    "index:count stop:label turns:count tokens:count cost_usd:?number seconds:number passed:bool"
    " transcript:?string"
)
SUMMARY_SCHEMA = published(
    f"trials summary, version {SUMMARY_VERSION}",
    obj(
        typed(
            "version:version kind:kind agent_version:string requested:count n:count"
            " scored:count passes:count failed:count errored:count pass@1:?number"
            " pass@1_wilson95:?pair pass_at_k:numbers pass_hat_k:numbers stops:counts"
            " per_trial:per_trial tokens:count cost_usd:?number trials:trials"
            " interrupted:bool question:string model:string expect:expect"
            " decline_message:string",
            version={"const": SUMMARY_VERSION},
            kind={"const": "trials"},
            pair={**array(NUMBER), "minItems": 2, "maxItems": 2},
            numbers={"type": "object", "additionalProperties": NUMBER},
            counts={"type": "object", "additionalProperties": COUNT},
            per_trial=obj(dict.fromkeys(("turns", "tokens", "cost_usd", "seconds"), SPREAD)),
            trials=array(obj(typed(SUMMARY_TRIAL))),
            expect=obj(typed("regex:?string tool:?string stop:?string")),
        ),
        typed("events_lost:string base_url:string budget_usd:number"),
    ),
)
SCHEMAS = {"transcript": TRANSCRIPT_SCHEMA, "events": EVENTS_SCHEMA, "summary": SUMMARY_SCHEMA}


class Saver:
    """Keeps a transcript on disk: after every turn, before the next request, and at the end."""

    def __init__(self, output, kept=None):
        # --transcript's file, and the kept run's (KeptRun)
        self.output = output
        self.kept = kept
        # the finished messages and turns, each encoded once
        self.done = {"messages": [], "turns": []}

    def __call__(self, session, final=False):
        # with --transcript, the kept run is written once, at the stop
        kept = self.kept and (final or not self.output)
        if self.output or kept:
            data = self.encode(session)  # once for both files
            if self.output:
                self.output.write(data, durable=final)
            if kept:
                self.kept.write(data, final)

    def events_lost(self, session, events):
        """At the end: if the event stream was lost, the transcript says why."""
        if events and events.lost and session.get("events_lost") != events.lost:
            session["events_lost"] = events.lost
            self(session, final=True)

    def encode(self, document):
        """dump(document), byte for byte, each finished message and turn encoded once."""
        parts = []
        for key, value in document.items():
            if key not in self.done:
                parts.append(dump(key)[:-1] + b":" + dump(value)[:-1])
                continue
            done = self.done[key]
            done.extend(dump(item)[:-1] for item in value[len(done) : -1])
            last = [dump(item)[:-1] for item in value[-1:]]
            parts.append(dump(key)[:-1] + b":[" + b",".join(done + last) + b"]")
        return b"{" + b",".join(parts) + b"}\n"


class Events:
    """The event stream (--events), JSON Lines; one that cannot be written ends, not the run."""

    def __init__(self, stream, run_id, owned=False, tty=False):
        self.stream = stream
        self.run_id = run_id
        self.seq = 0
        self.lock = threading.Lock()
        # a file of its own to close, not stdout
        self.owned = owned
        # on a terminal: its controls escaped there
        self.shown = tty or not owned and sys.stdout.isatty()
        # why no more events are written, and whether stderr was told
        self.lost = None
        self.told = False

    @classmethod
    def open(cls, out, run_id):
        """`out` is an OutputFile, or None for stdout."""
        if out is None:
            return cls(sys.stdout.buffer, run_id)
        return cls(out.stream(), run_id, owned=True, tty=out.tty)

    def emit(self, kind, trial=None, **data):
        with self.lock:
            if self.stream is None:
                return
            self.seq += 1
            event = {"type": kind, "seq": self.seq, "at": now(), "run_id": self.run_id}
            event.update({"trial": trial} if trial else {}, **data)
            try:
                data = dump(event)
                self.stream.write(for_terminal(data, terminal=True) if self.shown else data)
                self.stream.flush()
            except (OSError, ValueError) as e:
                self.stream = None
                self.lost = f"the event stream could not be written ({getattr(e, 'strerror', 0) or e}); events from seq {self.seq} ({kind}) on were dropped"

    def news(self):
        """Why events are lost, the first time it is asked after they were; else None."""
        with self.lock:
            news = None if self.told else self.lost
            self.told = bool(self.lost)
        return news

    def close(self):
        with self.lock:
            if self.stream is not None and self.owned:
                with contextlib.suppress(OSError):
                    self.stream.close()
            self.stream = None


def run_stop_event(report, stop, session, started):
    """The event that always ends a stream: how the run stopped, with its totals."""
    report.emit(
        "run.stop",
        stop=stop.reason,
        detail=stop.detail,
        exit_code=stop.exit_code,
        answer=session and session.get("answer"),
        usage=session["usage"] if session else empty_usage(),
        turns=len(session["turns"]) if session else 0,
        seconds=round(time.monotonic() - started, 3),
    )


def is_str(value, empty=False):
    return isinstance(value, str) and (empty or bool(value))


def transcript_problem(session):
    """What makes `session` unfit to resume, or None: its fields and its tool_use pairing."""
    if session.get("version") != TRANSCRIPT_VERSION:
        return f"its version is {session.get('version')!r}, not {TRANSCRIPT_VERSION}"
    for key, kind in (("model", str), ("workdir", str), ("messages", list), ("turns", list)):
        if not isinstance(session.get(key), kind) or not session[key] and kind is not list:
            return f"{key} is missing or not a {kind.__name__}"
    if "\0" in session["workdir"]:
        return "workdir is not a path (it holds a NUL byte)"
    if session.get("effort") not in (None, *EFFORTS):
        return "effort is not one of " + ", ".join(EFFORTS)
    stop = session.get("stop")
    # the labels as a list: a label that is a list or an object is compared, not hashed
    labelled = fields(stop).get("reason") in list(EXIT_CODES) and is_str(stop.get("detail"), True)
    if stop is not None and not labelled:
        return "stop is not an object with a stop label and its detail"
    cleared = session.get("cleared", [])
    if not isinstance(cleared, list) or not all(isinstance(c, str) for c in cleared):
        return "cleared is not a list of tool call ids"
    return messages_problem(session["messages"]) or turns_problem(session)


def messages_problem(messages):
    """What makes the history unfit to send, or None: its blocks, each tool_use's answer."""
    if not messages:
        return "it has no messages"
    asked = set()
    for i, m in enumerate(messages):
        with_role = isinstance(m, dict) and m.get("role") in ("user", "assistant")
        if not with_role or not isinstance(m.get("content"), list) or not m["content"]:
            return f"messages[{i}] is not a message with a role and content"
        for j, b in enumerate(m["content"]):
            problem = block_problem(b, m["role"])
            if problem:
                return f"messages[{i}].content[{j}] is not a well-formed block: {problem}"
            # block_problem refuses a tool_result in a reply
            if b["type"] == "tool_result" and b["tool_use_id"] not in asked:
                return f"messages[{i}].content[{j}] answers a tool_use that is not just before it"
            # what the API would refuse: an empty text, a result not text or text and image blocks
            content = b.get("content", "")
            kinds = [fields(x).get("type") for x in content] if isinstance(content, list) else []
            valid = isinstance(content, (str, list)) and all(k in ("text", "image") for k in kinds)
            if b["type"] == "text" and not b["text"] or b["type"] == "tool_result" and not valid:
                return f"messages[{i}].content[{j}] is an empty text, or a tool_result whose content is neither text nor a list of blocks"
        answered = {b.get("tool_use_id") for b in m["content"] if b["type"] == "tool_result"}
        if asked - answered:
            return f"messages[{i}] leaves tool_use {sorted(asked - answered)[0]} unanswered"
        asked = {b["id"] for b in m["content"] if b["type"] == "tool_use"}
    return None


def turns_problem(session):
    """What makes the turn records unfit to resume from, or None."""
    for i, t in enumerate(session["turns"]):
        usage = fields(fields(t).get("usage"))
        if (
            not is_count(fields(t).get("turn"), MAX_TURN)
            or not all(is_count(usage.get(k)) for k in COUNTS + ("tokens",))
            or not isinstance(usage.get("cost_usd", ""), (int, float, type(None)))
            or not isinstance(t.get("stop_reason"), (str, type(None)))
        ):
            return f"turns[{i}] is not a turn record with its usage and stop_reason"
        calls = t.get("tool_calls", [])
        if not isinstance(calls, list) or not all(is_str(fields(c).get("id"), True) for c in calls):
            return f"turns[{i}].tool_calls is not a list of tool calls with their ids"
        if not is_count(t.get("prompt_tokens", 0)):
            return f"turns[{i}].prompt_tokens is not a count"
    # each turn's reply is in the history, or its record says it is not
    replies = sum(m["role"] == "assistant" for m in session["messages"])
    kept = sum(t.get("in_history") is not False for t in session["turns"])
    if replies != kept:
        return f"its messages hold {replies} replies, and its turns say {kept} were kept"
    return sum_problem(session["turns"])


MAX_TURN = 1 << 31  # a turn number a transcript may hold: a run goes on from it, one at a time


def is_count(value, most=MAX_COUNT):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def sum_problem(turns):
    """Why the turns' costs or seconds cannot be added up (1e308 + 1e308), or None."""
    for key in ("cost_usd", "seconds", "api_seconds"):
        records = [fields(t.get("usage")) if key == "cost_usd" else t for t in items(turns)]
        if not math.isfinite(sum((num(r.get(key)) for r in records), 0.0)):
            return f"its turns' {key} add up past what a number can hold"
    return None


def summary_problem(summary):
    """Why a trials summary cannot be rendered, or None: pass@k and pass^k keyed by numbers."""
    for key in ("pass_at_k", "pass_hat_k"):
        table = summary.get(key, {})
        if not isinstance(table, dict):
            return f"{key} is not an object"
        for k in table:
            if not re.fullmatch(r"[1-9][0-9]{0,8}", k):
                return f"{key} has the key {shorten(repr(k), 40)}, not a plain number of trials"
    return None


MAX_DOCUMENT = 1 << 26  # bytes of a JSON document agent.py reads (a 1,000-turn transcript: ~5 MB)
MAX_CONTAINERS = 2_000_000  # its objects and lists: 64 MiB of {} would take ~7 GB to parse


def read_regular(named, path, most):
    """At most `most` bytes of the regular file at `path`; else a UsageError naming `named`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
        if kind == stat.S_IFREG:
            with os.fdopen(fd, "rb") as f:
                return f.read(most)
        os.close(fd)
    except FileNotFoundError:
        raise UsageError(f"{named} does not exist")
    except OSError as e:
        raise UsageError(f"{named} cannot be read: {e.strerror}")
    what = "a directory" if kind == stat.S_IFDIR else FILE_KINDS.get(kind, "not a file")
    raise UsageError(f"{named} is {what}, not a regular file")


def read_document(path, flag, sized=False):
    """The JSON document at `path`, bounded in size, depth and numbers; else a UsageError saying
    what is there. With `sized`, the document and its size in bytes."""
    named = f"{flag} {path}"
    data = read_regular(named, path, MAX_DOCUMENT + 1)
    if len(data) > MAX_DOCUMENT:
        raise UsageError(f"{named} is over {MAX_DOCUMENT >> 20} MiB: not a document agent.py wrote")
    if data.count(b"{") + data.count(b"[") > MAX_CONTAINERS:
        raise UsageError(
            f"{named} holds over {MAX_CONTAINERS:,} objects and lists: not a document agent.py wrote"
        )
    try:
        bounds = dict(parse_int=bounded_int, parse_float=bounded_float, parse_constant=no_constant)
        document = clean(json.loads(data.decode("utf-8"), **bounds))
        return (document, len(data)) if sized else document
    except RecursionError:
        raise UsageError(f"{named} is nested too deeply: not a document agent.py wrote")
    except Unbounded as e:
        raise UsageError(f"{named} holds a number too large ({e}): not a document agent.py wrote")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        # the first line of an event stream is an event
        first = None
        with contextlib.suppress(ValueError, RecursionError):
            first = json.loads(data.split(b"\n", 1)[0].decode("utf-8"))
        error = f"{named} is not a JSON document ({e})"
        if isinstance(first, dict) and "seq" in first and "type" in first:
            error = f"{named} is an event stream (--events, JSON Lines), not the one JSON document {flag} reads"
        elif data.startswith(b"\xef\xbb\xbf"):
            error = f"{named} starts with a byte-order mark (saved by an editor?), which no JSON document starts with: save it without one"
        raise UsageError(error)


class Unbounded(Exception):
    """A number in a document that no count, cost or time agent.py writes could be."""


def bounded_int(text):
    """An integer of a document: at most 2**53 (what JSON promises to carry exactly)."""
    if len(text) > 17 or abs(int(text)) > 1 << 53:
        raise Unbounded(f"{shorten(text, 24)}, {len(text)} digits")
    return int(text)


def bounded_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise Unbounded(shorten(text, 24))
    return value


def no_constant(name):
    """NaN and Infinity: not JSON, and never in what agent.py writes."""
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


# what a document that is no object is, in JSON's words
JSON_NAMES = {type(None): "null", str: "string", int: "number", float: "number", bool: "boolean"}


def document_kind(document):
    """What a JSON document is, in words, to tell the user what they gave."""
    if not isinstance(document, dict):
        return f"a JSON {JSON_NAMES.get(type(document), 'list')}"
    if document.get("kind") == "trials":
        return "a trials summary"
    if str(document.get("schema_version", "")).startswith("ATIF"):
        return "an ATIF trajectory"
    if "seq" in document and "type" in document:
        return "one event of an event stream"
    if "messages" in document:
        return "a transcript"
    return "an empty JSON object" if not document else "a JSON object"


def load_transcript(path, flag="--resume", doing=None):
    return checked_transcript(read_document(path, flag), path, doing or flag[2:])


def checked_transcript(session, path, doing):
    """`session` if it is a transcript fit to resume (replay, export); else a UsageError."""
    kind = document_kind(session)
    if kind != "a transcript":
        raise UsageError(f"cannot {doing}: {path} is {kind}, not a transcript")
    problem = transcript_problem(session)
    if problem:
        raise UsageError(
            f"cannot {doing}: {path} is not a version {TRANSCRIPT_VERSION} agent.py transcript: {problem}"
        )
    return session


def prepare_resume(session, question):
    """The history made valid to send again, with the question; and how many calls were not run."""
    messages = session["messages"]
    stop = session.get("stop") or {}
    if isinstance(session.get("produced_by"), dict):  # the turns so far; the rest are the model's
        session["produced_by"].setdefault("turns", len(session["turns"]))
    session.pop("replay", None)  # it told of a replay run; this one is not
    # continuing after a refusal needs the refused turn removed, with any calls it held
    if stop.get("reason") == "refusal" and messages[-1]["role"] == "assistant":
        messages.pop()
        session["turns"][-1]["in_history"] = False
    # the calls a stop (the token budget, say) left unanswered; only a reply holds tool_use blocks
    pending = [b for b in messages[-1]["content"] if b["type"] == "tool_use"]
    if pending:
        note = f"not run: the previous session stopped ({stop.get('reason', 'unknown')}) before this call ran. Call it again if you still need it."
        messages.append({"role": "user", "content": [error_result(b, note) for b in pending]})
    paused = (session["turns"] or [{}])[-1].get("stop_reason") == "pause_turn"
    if question:
        if messages[-1]["role"] != "user":
            messages.append({"role": "user", "content": []})
        messages[-1]["content"].append({"type": "text", "text": question})
    elif messages[-1]["role"] == "assistant" and not paused:
        raise UsageError(
            f"the transcript is finished (stop: {stop.get('reason', 'finished')}); give a follow-up question to continue it"
        )
    # What the model may do comes from this agent.py, never from a file: only history is data.
    # Its system prompt too, unless the user agrees to the recorded one (main, own_prompt).
    session.update(system=own_prompt(session) or SYSTEM_PROMPT, tools=TOOLS)
    session.update(stop=None, answer=None, ended_at=None, agent_version=AGENT_VERSION)
    session.setdefault("run_id", uuid.uuid4().hex)
    return session, len(pending)


def own_prompt(session):
    """The transcript's own system prompt (--system-prompt), if not agent.py's; else None."""
    system = session.get("system")
    return system if is_str(system) and system.strip() and system != SYSTEM_PROMPT else None


# --- Kept runs: every run in the user's state directory ---
#
# Each run's transcript is kept in runs_dir(), 0600 in a 0700 directory, as ID.json (UTC start,
# 8 hex digits of run_id), named by `last` or its id; the model's code must not reach it (runs.md).

KEPT_FILE = re.compile(r"(\d{8}-\d{6}-([0-9a-f]{8}))(?:\.trials(?:\.(\d+))?)?\.json")
RUN_NAME = re.compile(r"(?:(\d{8}-\d{6})-)?([0-9a-f]{8})[0-9a-f]{0,24}(?:\.(\d+))?")


def no_keep_variable():
    """AGENT_PY_NO_KEEP as a boolean; a word that is not one is a usage error."""
    value = os.environ.get("AGENT_PY_NO_KEEP", "")
    word = value.strip().lower()
    if word in ("1", "true", "yes", "on", "", "0", "false", "no", "off"):
        return word in ("1", "true", "yes", "on")
    raise UsageError(
        f"AGENT_PY_NO_KEEP is {value!r}: give 1, true, yes or on to keep no run, or 0, false, no, off or nothing to keep them"
    )


def runs_dir():
    """$XDG_STATE_HOME/agent.py/runs (if absolute), else ~/.local/state/agent.py/runs."""
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):
        try:
            state = os.path.join(Path.home(), ".local", "state")
        except RuntimeError:  # no HOME, and no home in the password database
            raise OSError(errno.ENOENT, "there is no home directory: set XDG_STATE_HOME")
    return Path(state) / "agent.py" / "runs"


def open_runs(create=False):
    """The runs directory, opened: (descriptor, real path); with `create`, made (0700). It and
    agent.py/ above it must be no symlink, this user's, writable by no one else: else a
    UsageError. OSError when it cannot be opened or made at all."""
    path = runs_dir()
    home = None if os.path.isabs(os.environ.get("XDG_STATE_HOME", "")) else Path.home()
    # HOME=/nonexistent, as service accounts have on purpose
    if create and home and not home.is_dir():
        raise UsageError(
            f"the home directory {home} does not exist, and agent.py makes none: set XDG_STATE_HOME to keep runs elsewhere, or --no-keep"
        )
    # no other user's symlink on the way; made where that check led: never through such a link
    where = real_directory(path.parent, "the kept runs")
    if create:
        os.makedirs(where, mode=0o700, exist_ok=True)
        where = real_directory(path.parent, "the kept runs")
    fd = open_directory(where)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        for name in (path.parent.name, path.name):
            where = where / name
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fd)
            try:
                inner = os.open(name, flags, dir_fd=fd)
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                link = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
                there = "a symlink" if link else "not a directory"
                raise UsageError(
                    f"{where} is {there}: agent.py keeps runs only in a directory of its own"
                )
            os.close(fd)
            fd = inner
            info = os.fstat(inner)
            if info.st_uid != os.geteuid():
                raise UsageError(
                    f"{where} belongs to another user (uid {info.st_uid}): agent.py keeps runs only in a directory of its user's"
                )
            if info.st_mode & 0o022:
                raise UsageError(
                    f"{where} can be written by other users (mode {stat.S_IMODE(info.st_mode):o}): agent.py keeps runs only in a directory no one else can change"
                )
            if stat.S_IMODE(info.st_mode) != 0o700:
                os.fchmod(fd, 0o700)
        try:
            real = Path(os.readlink(f"/proc/self/fd/{fd}"))  # the directory this descriptor is
        except OSError:
            real = Path(os.path.realpath(path))
        return fd, real
    except BaseException:
        os.close(fd)
        raise


class KeptRun:
    """A run's kept transcript: a save that fails stops keeping it, with a note, not the run."""

    def __init__(self, run, output, report):
        self.run = run
        self.output = output
        self.report = report
        self.lost = None

    def write(self, data, final=False):
        if self.lost is None:
            try:
                self.output.write(data, durable=final)
            except OSError as e:
                self.lost = e.strerror or str(e)
                self.report.error(
                    f"note: this run is no longer kept in {self.output.path}: {self.lost}"
                )

    def said(self):
        """The line that ends a run: where it was kept, and how to name it."""
        if self.output.name.endswith(".trials.json"):
            return f"kept: trials run {self.run} in {self.output.path}, trial i beside it as {self.run}.trials.i.json (--report last; --resume {self.run}.1)"
        return f"kept: run {self.run} in {self.output.path} (--resume last, or --resume {self.run})"


def keep_run(run_id, workdir, report, trials=0):
    """Make this run's kept file (O_EXCL): its KeptRun and each trial's, {i: KeptRun} ({} without
    trials); None and {}, with a note on stderr, when runs cannot be kept here."""
    try:
        return make_kept_run(run_id, workdir, report, trials)
    except UsageError as e:
        report.error(f"note: this run is not kept: {e}")
        return None, {}


def make_kept_run(run_id, workdir, report, trials):
    """keep_run's file: its KeptRun and each trial's ({} without trials), or a UsageError."""
    try:
        fd, real = open_runs(create=True)
    except OSError as e:
        raise UsageError(runs_unusable(e))
    run = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{run_id[:8]}"
    name = f"{run}.trials.json" if trials else f"{run}.json"
    made = False
    try:
        # the directory moved since check_runs_apart
        if workdir and (real.is_relative_to(workdir) or workdir.is_relative_to(real)):
            raise UsageError(f"{real} and the workdir {workdir} overlap")
        os.close(os.open(name, NEW_FILE, 0o600, dir_fd=fd))
        made = True
        kept = KeptRun(run, OutputFile(real / name, workdir, "the kept run"), report)
        if not os.path.samestat(os.fstat(kept.output.dir_fd), os.fstat(fd)):
            raise UsageError(f"{real} changed while it was opened")
        each = {}
        for i in range(1, trials + 1):
            output = OutputFile(trial_path(real / name, i), workdir, "the kept run")
            each[i] = KeptRun(f"{run}.{i}", output, report)
        return kept, each
    except (UsageError, OSError) as e:
        # never another run's file, which O_EXCL found there
        if made:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)
        if isinstance(e, FileExistsError):
            raise UsageError(f"another run has its id, {run}")
        if isinstance(e, OSError):
            raise UsageError(f"{real} cannot be written: {e.strerror}")
        raise
    finally:
        os.close(fd)


def runs_unusable(e):
    """Why the runs directory could not be made or opened (`e`): what is in the way, if any."""
    try:
        path = runs_dir()
    except OSError:  # no home directory: that is the reason
        return f"the runs directory cannot be used: {e.strerror}"
    for above in [*reversed(path.parents), path]:
        if os.path.lexists(above) and not os.path.isdir(above):
            return f"{above} is not a directory, so {path} cannot be made"
    made = "used" if os.path.lexists(path) else "made"
    at = f" ({e.filename})" if os.path.isabs(e.filename or "") and Path(e.filename) != path else ""
    return f"{path} cannot be {made}: {e.strerror}{at}"


def kept_run(name, flag, report):
    """The path of the kept run `name` names: `last` or a run id (a unique hex prefix; ID.i for
    trial i). Any other name is a path, and returned as it is."""
    asked = RUN_NAME.fullmatch(name or "")
    if name != "last" and not asked:
        return name
    try:
        place = runs_dir()
        fd, real = open_runs()
    except FileNotFoundError as e:
        where = f"in {place}" if e.filename else f"({e.strerror})"
        raise UsageError(
            f"{flag} {name}: no run is kept {where} (runs are kept there unless --no-keep): give a transcript's path"
        )
    except (UsageError, OSError) as e:
        why = e if isinstance(e, UsageError) else f"the kept runs cannot be read: {e.strerror}"
        raise UsageError(f"{flag} {name}: {why}")
    # (mtime, file) of the kept runs it names and of empty ones; ids of trials runs passed over
    found, empty, trials = [], [], []
    try:
        for entry in os.listdir(fd):
            kept = KEPT_FILE.fullmatch(entry)
            # the trial asked for (`last`: a run, not one trial), the id, and the time if given
            if not kept or kept[3] != (asked[3] if asked else None):
                continue
            if asked and (kept[2] != asked[2] or not kept[1].startswith(asked[1] or "")):
                continue
            # a trials run's file is not a transcript
            if flag in ("--resume", "--replay") and entry.endswith(".trials.json"):
                trials.append(kept[1])
                continue
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                    (found if info.st_size else empty).append((info.st_mtime_ns, entry))
    finally:
        os.close(fd)
    if not found and trials and name != "last":
        raise UsageError(
            f"{flag} {name} is a trials run: name one of its trials, e.g. {flag} {max(trials)}.1"
        )
    if not found:
        what = "no run is kept" if name == "last" else f"no kept run is named {name}"
        but = f" but trials (name one trial, e.g. {flag} {max(trials)}.1)" if trials else ""
        raise UsageError(
            f"{flag} {name}: {what} in {real}{but} (runs are kept there unless --no-keep): give a transcript's path"
        )
    if os.path.lexists(name):
        report.error(
            f"note: {flag} {name} names a kept run; for the file {name} here, give ./{name}"
        )
    written, newest = max(found)
    newer = [entry for when, entry in empty if when > written] if name == "last" else []
    if newer:  # never pass over the run the user just had without a word
        said = time.strftime("%H:%M:%S", time.localtime(written / 1e9))
        report.error(
            f"note: the newest kept run, {max(newer).removesuffix('.json')}, is empty (still running before its first turn ended, or killed then: kill -9, out of memory; with --transcript, that file has its turns); {flag} last takes the one before it, {newest.removesuffix('.json')}, last written at {said}; give {flag} ID to choose"
        )
    return str(real / newest)


def check_runs_apart(workdir, where):
    """Refuse a workdir that holds the runs directory or lies inside it, kept or not: the
    model's code could read kept runs there, or plant one."""
    with contextlib.suppress(OSError):  # nowhere to keep runs: none are kept (keep_run says so)
        runs = Path(os.path.realpath(runs_dir()))
        if runs.is_relative_to(workdir) or workdir.is_relative_to(runs):
            raise UsageError(
                f"{where} and the directory of kept runs, {runs}, overlap: the model's code could read kept runs or plant one that --resume last would take up; give --workdir a directory of data only (or set XDG_STATE_HOME elsewhere)"
            )


def in_runs_dir(path):
    """True if `path` is a file directly in the directory of kept runs."""
    here = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    with contextlib.suppress(OSError):  # no home directory: no runs directory
        return here == os.path.realpath(runs_dir())
    return False


def own_kept_run(path):
    """True if `path` is a run agent.py kept and no one replaced: named so, in the runs directory
    (open_runs checks it), a regular file of this user's, 0600, with no other name (hard link)."""
    name = Path(path).name
    if not KEPT_FILE.fullmatch(name) or not in_runs_dir(path):
        return False
    try:
        fd = open_runs()[0]
    except (UsageError, OSError):
        return False
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    finally:
        os.close(fd)
    return (info.st_mode, info.st_uid, info.st_nlink) == (stat.S_IFREG | 0o600, os.geteuid(), 1)


def is_kept(path, trial=False):
    """Is `path` a kept run (with `trial`: a kept trial), which a run going on in it keeps?"""
    kept = KEPT_FILE.fullmatch(Path(path).name)
    return bool(kept) and bool(kept[3]) == trial and in_runs_dir(path)


# --- Replay: a recorded run without a key ---
#
# --replay runs a transcript's recorded replies again against the real tools: ReplayClient stands
# in for the SDK's client (the loop runs unchanged, nothing is sent); ReplayCheck says what differs.


class ReplayEnded(Exception):
    """A request the recording has no reply for: the run stops with `stop` (see stop_for)."""

    def __init__(self, stop):
        super().__init__(stop.detail)
        self.stop = stop


class ReplayDiffers(Exception):
    """--replay --strict: a turn's tool results differ from the recording (the next request)."""

    def __init__(self, record, differed, source):
        calls = plural(len(record["tool_calls"]), "tool result")
        verb = "differs" if len(differed) == 1 else "differ"
        message = f"turn {record['turn']}: {len(differed)} of {calls} {verb} from {source}, and the recorded replies after it answered the recorded results (--strict)"
        declined = sum(c["declined"] for c in differed)
        if declined:
            message += f"; {declined} of them not run: declined (no working sandbox, and no y)"
        super().__init__(message)


def load_recording(path):
    """A transcript --replay can run, or a UsageError saying why not."""
    recording = load_transcript(path, "--replay")
    if not is_str(recording.get("question")) or not is_str(recording.get("system"), empty=True):
        raise UsageError(f"cannot replay: {path} has no question or no system prompt")
    asked = [m["content"] for m in recording["messages"][1:] if m["role"] == "user"]
    if any(b["type"] == "text" and b["text"] != FINAL_TURN_NOTE for c in asked for b in c):
        raise UsageError(
            f"cannot replay: {path} was continued with --resume and a follow-up question; only a run from its first question can be replayed (--resume with --transcript NEW.json goes on in a new file, and leaves the one it continues as it was)"
        )
    return recording


def replay_limits(recording, limits):
    """The user's `limits`, tightened so that the recorded replies end as the recording did
    (the limit it stopped on is reached at its last turn; others never are), never loosened:
    the user's limits bound a replay as they bound a live run."""
    used = empty_usage()
    reason = (recording.get("stop") or {}).get("reason")
    for turn in recording["turns"]:  # priced as the loop will price them
        add_usage(used, usage_record(recording["model"], turn["usage"]))
    recorded = len(recording["turns"])
    turns = min(limits.max_turns, recorded if reason == "max_turns" else recorded + 2)
    tokens = min(limits.token_budget, used["tokens"] + (reason != "token_budget"))
    spent = used["cost_usd"] if reason == "cost_budget" else None
    dollars = min([d for d in (limits.budget_usd, spent) if d is not None], default=None)
    return replace(limits, max_turns=turns, token_budget=tokens, budget_usd=dollars)


def replay_session(recording, workdir, run_id, source):
    """The new run's session: the recording's question, model, effort, prompt, `produced_by`."""
    asked = (recording["question"], recording["model"], workdir, recording.get("effort"), run_id)
    session = new_session(*asked, recording["system"])
    if is_str(fields(recording.get("produced_by")).get("kind")):  # who wrote the replies
        session["produced_by"] = recording["produced_by"]
    if is_str(recording.get("base_url")):  # the server that sent them
        session["base_url"] = server_url(recording["base_url"]) or recording["base_url"]
    session["replay"] = {"source": str(source), "differences": []}
    return session


def made_by(recording):
    """Who wrote a recording's replies, in words, from its produced_by field."""
    made = fields(recording.get("produced_by"))
    if made.get("kind") == "scripted":
        return f"a scripted model ({one_line(str(made.get('script', 'a script')), 100)})"
    server = recording.get("base_url")  # recorded only for a server that is not Anthropic's
    at = f" at {one_line(str(server), 100)}" if server else ""
    return f"the model {one_line(str(made.get('model') or recording['model']), 100)}{at}"


class ReplayClient:
    """Stands in for anthropic.Anthropic in stream_reply: each request is answered with the next
    recorded reply, and nothing is sent. Past the last reply it raises ReplayEnded."""

    def __init__(self, recording, source):
        # each turn's reply as the loop reads it (no content for one left out of the history)
        kept = iter(m["content"] for m in recording["messages"] if m["role"] == "assistant")
        self.replies = [
            {
                "id": t.get("message_id"),
                "stop_reason": t.get("stop_reason"),
                "content": [] if t.get("in_history") is False else next(kept),
                "usage": {k: t["usage"][k] for k in COUNTS},
            }
            for t in recording["turns"]
        ]
        self.source = source
        self.recorded_stop = recording.get("stop")
        self.given = 0  # replies given so far
        self.differs = None  # the ReplayDiffers the next request raises (--strict)
        self.messages = self.beta = self  # client.messages.stream, client.beta.messages.stream

    def stream(self, **request):
        if self.differs:  # --strict, and the last turn's results were not the recorded ones
            raise self.differs
        if self.given == len(self.replies):
            raise ReplayEnded(self.ended())
        reply = self.replies[self.given]
        self.given += 1
        # the characters it streams, as stream_reply counts them: text, thinking, tool input
        calls = [b.get("input") for b in reply["content"] if b.get("type") == "tool_use"]
        chars = sum(len(b.get("text", "")) + len(b.get("thinking", "")) for b in reply["content"])
        chars += sum(len(json.dumps(i, ensure_ascii=False)) for i in calls)
        most = request["max_tokens"] * TOKEN_CHARS
        if chars > most:  # what a live reply is cut at (stream_reply)
            detail = f"{self.source}'s reply {self.given} is {chars:,} characters, more than max_tokens {request['max_tokens']} lets a reply stream ({most:,}); a live run would have cut it (give --max-tokens)"
            raise ReplayEnded(Stop("max_tokens", detail))
        return contextlib.nullcontext(ReplayStream(reply))

    def ended(self):
        """The Stop of a request past the last recorded reply."""
        stop = self.recorded_stop
        where = f"{self.source} has no reply after turn {self.given}"
        if stop and stop["reason"] in INFRA_STOPS:  # the recorded run ended here, not a reply
            return Stop(stop["reason"], f"{stop['detail']} (the recorded stop: {where})")
        why = "it has no stop: the run that made it was cut off"
        if stop:
            why = f"it stopped with {stop['reason']}"
        detail = f"the replay asks for more replies than were recorded: {where} ({why})"
        return Stop("error", detail)


class ReplayStream:
    """One recorded reply, read as stream_reply reads the SDK's stream (in a nullcontext)."""

    def __init__(self, message):
        self.message = json.loads(json.dumps(message))  # the loop's own copy, as if it came

    def __iter__(self):
        for block in self.message["content"]:
            kind = block.get("type")
            if kind in ("thinking", "text"):
                yield SimpleNamespace(**{"type": kind, kind: block[kind]})
        yield SimpleNamespace(type="message_stop")

    def get_final_message(self):
        return self.message


DIFF_LINES, DIFF_WIDTH = 12, 160  # the most a difference shows, in lines and characters a line


def result_diff(recorded, replayed):
    """The changed lines of a unified diff from the recorded result to the replayed one."""

    def lines(result):
        if result is None:
            return ["(no result for this call)"]
        text = as_text(result)
        return [f"is_error: {json.dumps(bool(result.get('is_error')))}"] + text.splitlines()

    changed = list(difflib.unified_diff(lines(recorded), lines(replayed), lineterm="", n=0))
    diff = [shorten(line, DIFF_WIDTH) for line in changed[2:] if not line.startswith("@@")]
    if len(diff) > DIFF_LINES:
        diff[DIFF_LINES - 1 :] = [f"… and {len(diff) - DIFF_LINES + 1} more changed lines"]
    return diff


def tool_results(messages):
    """The tool_result blocks of `messages`, by the id of the call each answers."""
    blocks = [b for m in messages if m["role"] == "user" for b in m["content"]]
    return {b["tool_use_id"]: b for b in blocks if b["type"] == "tool_result"}


class ReplayCheck:
    """Wraps the transcript's save: compares the tool results of the turns since the last save
    with the recorded ones, says where they differ and keeps it in the session's `replay`."""

    def __init__(self, recording, client, report, save, strict=False):
        self.recorded = tool_results(recording["messages"])
        self.client = client
        self.report = report
        self.save = save
        self.strict = strict
        self.checked = 0  # how many turns were compared

    def __call__(self, session, final=False):
        replay = session["replay"]
        results = tool_results(session["messages"])
        for record in session["turns"][self.checked :]:
            differed = [c for c in record["tool_calls"] if self.changed(replay, record, c, results)]
            if differed and self.strict and not self.client.differs:  # the next request stops
                self.client.differs = ReplayDiffers(record, differed, replay["source"])
        self.checked = len(session["turns"])
        if final:
            self.summary(session)
        self.save(session, final)

    def changed(self, replay, record, call, results):
        """Say so, and keep it, if this call's result is not the recorded one; True if so."""
        then = self.recorded.get(call["id"])
        result = results.get(call["id"])
        same_error = then and result and bool(then.get("is_error")) == bool(result.get("is_error"))
        if same_error and then.get("content") == result["content"]:
            return False
        diff = result_diff(then, result)
        turn = record["turn"]
        replay["differences"].append(dict(turn=turn, id=call["id"], name=call["name"], diff=diff))
        # (a call declined then too would have the same result)
        how = "the result differs from the recording"
        if call.get("declined"):
            how = "not run (declined: without a working sandbox run_python asks even with --yes, and no one said y), so its result differs from the recording"
        self.report.error(f"  replay: turn {turn}, {call['name']} {call['id']}: {how}")
        for line in diff:
            self.report.error(f"    {line}")
        replies_left = self.client.given < len(self.client.replies)
        if len(replay["differences"]) == 1 and replies_left and not self.strict:
            self.report.error(
                "    (the recorded replies that follow answered the recorded result; they are replayed as they were)"
            )
        return True

    def summary(self, session):
        calls = plural(sum(len(t["tool_calls"]) for t in session["turns"]), "tool result")
        replay = session["replay"]
        differed = len(replay["differences"])
        if differed:
            self.report.error(f"replay: {differed} of {calls} differ from {replay['source']}")
        else:
            self.report.line(f"replay: {calls}, each as recorded")
        left = len(self.client.replies) - self.client.given
        if left and not self.client.differs:  # else the stop says why
            replies = "reply" if left == 1 else "replies"
            self.report.error(
                f"replay: the run stopped with {left} recorded {replies} not replayed: it stopped before the recording did"
            )


# --- Trials ---

EXPECT_SECONDS = 5.0  # an --expect regex may search one answer this long (it may backtrack)
SEARCH = "import re, sys; sys.exit(0 if re.search(sys.argv[1], sys.stdin.read()) else 1)"


def trials_stop(summary):
    """How --trials ends: (label, exit code, detail): 0 if every trial passed, else 6 or 130."""
    detail = f"{summary['passes']} of {summary['requested']} trials passed"
    if summary["interrupted"]:
        return "interrupted", EXIT_CODES["interrupted"], detail
    every = summary["passes"] == summary["n"] == summary["requested"]
    return None, 0 if every else EXIT_TRIALS_FAILED, detail


def expect_found(regex, answer):
    """True if the --expect regex is in the answer, False if not, None if the search took over
    EXPECT_SECONDS: in a child, which can be killed, as a backtracking `re` holds the GIL."""
    command = [sys.executable, "-I", "-S", "-c", SEARCH, regex]
    data = answer.encode("utf-8", "surrogatepass")
    try:
        done = subprocess.run(command, input=data, capture_output=True, timeout=EXPECT_SECONDS)
    except subprocess.TimeoutExpired:
        return None
    return done.returncode == 0


def unmet(session, expect):
    """The first --expect condition the session did not meet, in words, or None (an interrupted
    session's answer is not searched)."""
    stop = (session.get("stop") or {}).get("reason")
    if not any(expect.values()) and stop != "end_turn":
        return f"it stopped with {stop}, not end_turn (no --expect was given)"
    # the regex as a shell takes it, always in single quotes (as the user most likely typed it)
    regex = "'" + (expect["regex"] or "").replace("'", "'\"'\"'") + "'"
    answer = session.get("answer") or ""
    found = expect["regex"] and stop != "interrupted" and expect_found(expect["regex"], answer)
    if expect["regex"] and found is None:
        return f"--expect {regex} timed out after {EXPECT_SECONDS:g} s on an answer of {len(answer):,} characters: the regex backtracks"
    if expect["regex"] and not found:
        return f"--expect {regex} is not in the answer"
    called = {c["name"] for t in session["turns"] for c in t["tool_calls"]}
    if expect["tool"] and expect["tool"] not in called:
        return f"--expect-tool {expect['tool']} was not called"
    if expect["stop"] and stop != expect["stop"]:
        return f"--expect-stop {expect['stop']}, and it stopped with {stop}"
    return None


def pass_at_k(n, c, k):
    """Unbiased pass@k: the chance that at least one of k trials drawn from n passes."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n, c, k):
    """pass^k: the chance that k trials drawn from n all pass."""
    return math.comb(c, k) / math.comb(n, k)


def trial_path(path, index):
    """run.json -> run.1.json: where trial `index` keeps its transcript."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.{index}{p.suffix}"))


# the harness's or the network's, not the model's
INFRA_STOPS = ("api_error", "error", "interrupted")


def wilson(passes, n, z=1.96):
    """The Wilson score interval (95%) for a pass rate of passes/n."""
    if n == 0:
        return None
    p = passes / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(max(0.0, centre - half), 6), round(min(1.0, centre + half), 6)]


def spread(values):
    """Mean and median of the values that are known."""
    known = [v for v in values if v is not None]
    average = {"mean": statistics.fmean, "median": statistics.median}
    return {key: round(f(known), 6) if known else None for key, f in average.items()}


def summarize(trials, requested):
    """The summary of the trials that ran: pass@k and pass^k count only the trials without an
    infrastructure failure (INFRA_STOPS), as tau-bench does."""
    trials = sorted(trials, key=lambda t: t["index"])
    scored = [t for t in trials if t["stop"] not in INFRA_STOPS]
    n, c = len(scored), sum(t["passed"] for t in scored)
    costs = [t["cost_usd"] for t in trials]
    return {
        "version": SUMMARY_VERSION,
        "kind": "trials",
        "agent_version": AGENT_VERSION,
        "requested": requested,
        "n": len(trials),
        "scored": n,
        "passes": c,
        "failed": n - c,
        "errored": len(trials) - n,
        "pass@1": c / n if n else None,
        "pass@1_wilson95": wilson(c, n),
        "pass_at_k": {str(k): pass_at_k(n, c, k) for k in range(1, n + 1)},
        "pass_hat_k": {str(k): pass_hat_k(n, c, k) for k in range(1, n + 1)},
        "stops": dict(sorted(Counter(t["stop"] for t in trials).items())),
        "per_trial": {
            key: spread([t[key] for t in trials])
            for key in ("turns", "tokens", "cost_usd", "seconds")
        },
        "tokens": sum(t["tokens"] for t in trials),
        "cost_usd": None if None in costs else round(sum(costs), 10),
        "trials": trials,
    }


def print_summary(summary, report):
    """The trials' summary on stderr, -q or not."""
    say = partial(report.line, always=True)
    say(
        f"trials: {summary['n']} of {summary['requested']} ran: {summary['passes']} passed, {summary['failed']} failed, {summary['errored']} errored (api_error, error, interrupted: not counted below)"
    )
    if summary["scored"]:
        say(
            f"pass@1 = {summary['pass@1']:.3f} (95% Wilson interval {summary['pass@1_wilson95'][0]:.3f}-{summary['pass@1_wilson95'][1]:.3f}) over {plural(summary['scored'], 'scored trial')}"
        )
        say("   k   pass@k   pass^k")
        for k in summary["pass_at_k"]:
            say(f"{k:>4}   {summary['pass_at_k'][k]:.3f}    {summary['pass_hat_k'][k]:.3f}")
    total = f"total {summary['tokens']} tokens, {money(summary['cost_usd'])}"
    if summary["n"]:  # else Ctrl-C before any began: nothing per trial to tell
        say("stops: " + ", ".join(f"{label} {n}" for label, n in summary["stops"].items()))
        per = summary["per_trial"]
        for key, show in (("turns", "{:.1f}"), ("tokens", "{:.0f}"), ("seconds", "{:.1f}")):
            if per[key]["mean"] is not None:
                mean, median = map(show.format, per[key].values())
                say(f"per trial: {key} mean {mean}, median {median}")
        mean, median = map(money, per["cost_usd"].values())
        total = f"per trial: cost mean {mean}, median {median}; {total}"
    say(total)


TRIAL = threading.local()  # .index: the trial this thread runs, if any (approval_question)
MAX_TRIALS = 1000  # --trials at most: a typo'd zero (1000000) is a usage error, not a bill
MAX_JOBS = 32  # --jobs at most: trials at once, each a thread, a connection and a sandbox


def room_for_trials(k):
    """Open files enough for k trials: the soft limit raised if need be, else a UsageError."""
    need = 2 * k + 256  # and the rest of the process: the SDK, the sandbox, the outputs
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        top = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
            soft = top
        if soft < need:
            raise UsageError(
                f"--trials {k} needs about {need} open files, and this process may open {soft} (ulimit -n): give fewer trials, or raise the limit"
            )


@dataclass(frozen=True)
class TrialSpec:
    """What --trials measures: one question asked k times, `jobs` at once, and what passes."""

    question: str
    model: str
    effort: str | None  # sent as output_config.effort; None: the model's default
    k: int  # trials to run
    jobs: int = 1  # trials at once; their lines are prefixed [trial i]
    regex: str | None = None  # --expect: a trial passes if this is found in its answer...
    tool: str | None = None  # --expect-tool: ... and it called this tool ...
    stop: str | None = None  # --expect-stop: ... and stopped so (with none: with end_turn)
    quiet: bool = False  # no progress on stderr, only the summary
    system: str = SYSTEM_PROMPT  # the system prompt every trial is sent (--system-prompt)
    server: str | None = None  # ANTHROPIC_BASE_URL as recorded (server_url); None: Anthropic's
    budget_usd: float | None = None  # --trials-budget-usd: no trial starts once all spent this


def run_trials(spec, client, ctx, outputs, events, telemetry, kept):
    """Run the trials and print their summary; return it. `outputs` and `kept`: each trial's
    transcript file and KeptRun. A Ctrl-C cancels the trials still running."""
    ctx = replace(ctx, cancel=threading.Event())
    expect = {"regex": spec.regex, "tool": spec.tool, "stop": spec.stop}
    results = []
    pool = ThreadPoolExecutor(max_workers=spec.jobs)
    running = {}
    starting = threading.Lock()

    def spent():
        """Dollars of the trials that began, ended or running (an ended one's is its result's)."""
        return sum(total_usage(t[0])["cost_usd"] or 0 for t in list(running.values()) if t)

    def trial_result(index, stop, usage, ok):
        """What the summary keeps of a trial that began (`ok`: it passed)."""
        session, path, started = running[index]
        return {
            "index": index,
            "stop": stop,
            "turns": len(session["turns"]),
            "tokens": usage["tokens"],
            "cost_usd": usage["cost_usd"],
            "seconds": round(time.monotonic() - started, 3),
            "passed": ok,
            "transcript": path,
        }

    def trial(index):
        TRIAL.index = index  # for the approval question, asked in this thread
        with starting:  # the total decides whether it starts; then it counts in the total
            if spec.budget_usd is not None and spent() >= spec.budget_usd:
                return
            running[index] = None
        report = Reporter(spec.quiet, events=events, trial=index, telemetry=telemetry)
        save = Saver(outputs.get(index), kept.get(index))
        run_id = events.run_id if events else None
        asked = (spec.question, spec.model, ctx.workdir, spec.effort, run_id, spec.system)
        session = new_session(*asked)
        session["trial"] = index
        if spec.server:
            session["base_url"] = spec.server
        output = save.output or save.kept and save.kept.output
        path = str(output.path) if output else None
        report.emit("trial.start", transcript=path)
        running[index] = (session, path, time.monotonic())
        report.trace("begin", session)
        stop = drive(client, session, ctx, report, save)
        report.trace("end", stop, session)
        save.events_lost(session, events)
        report.line(f"stop: {stop.reason} ({said_stop(stop)})", always=True)
        missed = unmet(session, expect)
        # said only of a stop of the model's own; a failed session never passes
        if missed and stop.reason not in INFRA_STOPS:
            report.line(f"fail: {missed}", always=True)
        ok = missed is None and stop.reason not in ("api_error", "error")
        result = trial_result(index, stop.reason, session["usage"], ok)
        # (results[-1] may be another thread's trial by now)
        results.append(result)
        report.emit("trial.end", **result)

    futures = [pool.submit(trial, i) for i in range(1, spec.k + 1)]
    try:
        while not all(f.done() for f in futures):
            wait(futures, timeout=0.2)
            check_cancelled(None)  # a Ctrl-C or SIGTERM whose KeyboardInterrupt was lost
    except KeyboardInterrupt:
        ctx.cancel.set()
        for f in futures:
            f.cancel()
        Connections.cut_all()  # the requests in flight end now, not when their server answers
        wait(futures, timeout=10)
    pool.shutdown(wait=False, cancel_futures=True)
    interrupted = ctx.cancel.is_set()  # only a Ctrl-C sets the trials' cancel
    for index, begun in list(running.items()):  # the trials that began and did not end
        if begun and index not in {r["index"] for r in results}:
            results.append(trial_result(index, "interrupted", total_usage(begun[0]), False))
    summary = summarize(results, spec.k)
    # what was measured
    summary.update(interrupted=interrupted, question=spec.question, model=spec.model, expect=expect)
    summary["decline_message"] = ctx.decline_message
    summary.update(present({"base_url": spec.server, "budget_usd": spec.budget_usd}))
    report = Reporter(events=events)  # the summary is said -q or not
    print_summary(summary, report)
    if spec.budget_usd is not None and summary["n"] < spec.k and not interrupted:
        report.line(
            f"budget: the trials spent {money(summary['cost_usd'])} of the --trials-budget-usd {money(spec.budget_usd)}; the other {plural(spec.k - summary['n'], 'trial')} did not start"
        )
    if interrupted:
        finished = sum(r["stop"] != "interrupted" for r in results)
        report.line(f"interrupted: {finished} of {spec.k} trials finished")
    report.emit("trials.summary", summary=summary)
    return summary


# --- Report ---

# Everything in a transcript is untrusted (the model wrote it, or a script rewrote it): every
# string is HTML-escaped, and the page has no script at all and a Content-Security-Policy that
# allows none, loads nothing (no font, image or style from anywhere) and submits nothing.

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
.q{font-size:1.1em;background:#f6f6f6;padding:.6em;white-space:pre-wrap}
.cards{display:flex;flex-wrap:wrap;gap:.6em}.card{border:1px solid #ddd;border-radius:6px;
padding:.4em .8em}.card b{display:block;font-size:1.2em}table{border-collapse:collapse}
td,th{border-bottom:1px solid #eee;padding:.25em .6em;text-align:left;vertical-align:top}
pre{white-space:pre-wrap;word-break:break-word;margin:.3em 0;background:#fafafa;padding:.4em}
.ok{color:#176317}.error{color:#a11}.declined,.withheld{color:#8a5a00}.chip{display:inline-block;
border:1px solid #ccc;border-radius:4px;padding:0 .4em;margin:.1em}.msg{margin:.6em 0}
.role{font-weight:bold}.seg-input{fill:#4e79a7}.seg-write{fill:#f28e2b}.seg-read{fill:#59a14f}
.seg-output{fill:#e15759}.cost{fill:none;stroke:#222;stroke-width:2}.axis{font-size:11px}
.legend span{display:inline-block;width:.8em;height:.8em;margin:0 .3em 0 1em}
.l-input{background:#4e79a7}.l-write{background:#f28e2b}.l-read{background:#59a14f}
.l-output{background:#e15759}.l-cost{background:#222;height:.2em!important}
.line-at{fill:none;stroke:#4e79a7;stroke-width:2}.line-hat{fill:none;stroke:#e15759;stroke-width:2;
stroke-dasharray:6 4}"""
SEGMENTS = (
    ("input_tokens", "input", "fresh input"),
    ("cache_creation_input_tokens", "write", "cache writes"),
    ("cache_read_input_tokens", "read", "cache reads"),
    ("output_tokens", "output", "output"),
)


def esc(value):
    return html.escape(str(value), quote=True)


def num(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def money(value):
    return "unknown" if not isinstance(value, (int, float)) else f"${value:.6f}"


def table_head(*names):
    return "<table><tr>" + "".join(f"<th>{name}</th>" for name in names) + "</tr>"


def page(title, body):
    """The whole document: no script, nothing loaded, styles only through this nonce."""
    nonce = uuid.uuid4().hex
    policy = (
        f"default-src 'none'; style-src 'nonce-{nonce}'; img-src 'none'; script-src "
        "'none'; base-uri 'none'; form-action 'none'"
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">'
        f'<meta name="viewport" content="width=device-width"><title>{esc(title)}</title>'
        f'<style nonce="{nonce}">{CSS}</style></head><body>{body}</body></html>\n'
    )


def token_chart(turns):
    """Per-turn stacked bars of each request's tokens and the running cost, in parts."""
    width, height, left, bottom = 760, 260, 60, 30
    usages = [fields(t.get("usage")) for t in turns]
    peak = max([sum(num(u.get(k)) for k, _, _ in SEGMENTS) for u in usages] + [1])
    costs = list(accumulate(num(u.get("cost_usd")) for u in usages))
    total = costs[-1] if costs else 0.0
    step = (width - left - 20) / max(len(turns), 1)
    bar = max(step * 0.7, 1)
    yield (
        f'<svg class="tokens" width="{width}" height="{height}" viewBox="0 0 {width} '
        f'{height}" role="img" aria-label="tokens per turn"><text class="axis" x="4" y="14">'
        f'{peak:,} tokens</text><line x1="{left}" y1="{height - bottom}" x2="{width - 10}" '
        f'y2="{height - bottom}" stroke="#999"/>'
    )
    for i, (t, usage) in enumerate(zip(turns, usages, strict=True)):
        x, y = left + i * step + (step - bar) / 2, height - bottom
        yield '<g class="turn">'
        for key, cls, label in SEGMENTS:
            h = num(usage.get(key)) / peak * (height - bottom - 20)
            y -= h
            yield (
                f'<rect class="bar seg-{cls}" x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" '
                f'height="{h:.1f}"><title>turn {esc(t.get("turn"))}: '
                f"{num(usage.get(key)):,} {label}</title></rect>"
            )
        yield (
            f'<text class="axis" x="{x + bar / 2:.1f}" y="{height - 12}" '
            f'text-anchor="middle">{esc(t.get("turn", i + 1))}</text></g>'
        )
    if total > 0:
        points = " ".join(
            f"{left + i * step + step / 2:.1f},"
            f"{height - bottom - c / total * (height - bottom - 20):.1f}"
            for i, c in enumerate(costs)
        )
        yield (
            f'<polyline class="cost" points="{points}"><title>running cost, up to '
            f'{money(total)}</title></polyline><text class="axis" x="{width - 10}" y="14" '
            f'text-anchor="end">{money(total)}</text>'
        )
    legend = "".join(f'<span class="l-{cls}"></span>{label}' for _, cls, label in SEGMENTS)
    yield f'</svg><p class="legend">{legend}<span class="l-cost"></span>running cost</p>'


def block_html(block):
    """One content block of the conversation; long and hidden things collapsed."""
    kind = block.get("type")
    if kind == "text":
        return f"<pre>{esc(block.get('text', ''))}</pre>"
    if kind == "tool_use":
        # code as code, the rest as JSON
        given = block.get("input")
        code = isinstance(given, dict) and isinstance(given.get("code"), str)
        shown = given["code"] if code else json.dumps(given, ensure_ascii=False, indent=1)
        return (
            f'<div><span class="chip">{esc(block.get("name"))}</span> <code>'
            f"{esc(block.get('id'))}</code><pre>{esc(shown)}</pre></div>"
        )
    if kind == "tool_result":
        body = as_text(block)
        state = "error" if block.get("is_error") else "ok"
        return (
            f'<details><summary class="{state}">result for {esc(block.get("tool_use_id"))}'
            f": {state}, {len(body):,} characters</summary><pre>{esc(body)}</pre></details>"
        )
    if kind == "thinking":
        shown = block.get("thinking", "")
    else:
        shown = shorten(json.dumps(block, ensure_ascii=False), 5000)
    return f"<details><summary>{esc(kind)}</summary><pre>{esc(shown)}</pre></details>"


def as_text(block):
    """A tool result's content as text (JSON if it is a list of blocks)."""
    content = block.get("content")
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def server_said(t):
    """The server a run talked to (base_url), if the transcript names one."""
    return f" · server <code>{esc(t['base_url'])}</code>" if is_str(t.get("base_url")) else ""


def priced_as(t):
    """What a cost means when the run talked to a server that is not Anthropic's API."""
    url = t.get("base_url")
    if not is_str(url) or urllib.parse.urlsplit(url).hostname == ANTHROPIC_HOST:
        return ""
    model = t.get("model") if is_str(t.get("model")) else "the model"
    if base_model(model) not in PRICING:
        return (
            f"<p>No cost is shown: agent.py knows no price for {esc(model)} (it prices "
            f"Anthropic's models as Anthropic's API bills them), and {esc(url)} may bill "
            "otherwise, or nothing.</p>"
        )
    return (
        f"<p>The cost is priced as {esc(model)} would be on Anthropic's API, not by "
        f"{esc(url)}, which may bill otherwise, or nothing.</p>"
    )


def run_report(t):
    """One run's report, in parts: what was asked, how it ended, what each turn cost and did."""
    turns = items(t.get("turns"))
    usage = fields(t.get("usage"))
    stop = fields(t.get("stop"))
    prompt = sum(num(usage.get(k)) for k, _, _ in SEGMENTS[:3])
    share = f"{num(usage.get('cache_read_input_tokens')) / prompt:.0%}" if prompt else "n/a"
    cards = [
        ("stop", f"{stop.get('reason', 'running')} (exit {stop.get('exit_code', '?')})"),
        ("turns", len(turns)),
        ("tokens", f"{num(usage.get('tokens')):,}"),
        ("cost", money(usage.get("cost_usd"))),
        ("time", f"{sum(num(x.get('seconds')) for x in turns):.1f} s"),
        ("cache-read share of the prompt", share),
    ]
    # where the replies came from, when not from the run's model
    made, replayed = fields(t.get("produced_by")), fields(t.get("replay"))
    provenance = ""
    if made:
        who = "a scripted model" if made.get("kind") == "scripted" else "the model"
        by = made.get("script") or made.get("model") or "?"
        upto = f", turns 1-{made['turns']}" if isinstance(made.get("turns"), int) else ""
        provenance += f" · replies by {who} ({esc(by)}{upto})"
    if replayed:
        provenance += (
            f" · a replay of <code>{esc(replayed.get('source'))}</code>, "
            f"{len(items(replayed.get('differences')))} tool results differing"
        )
    yield (
        f'<h1>agent.py run</h1><div class="q">{esc(t.get("question", ""))}</div>'
        f"<p>model <b>{esc(t.get('model'))}</b> · workdir <code>{esc(t.get('workdir'))}"
        f"</code> · run <code>{esc(t.get('run_id', '?'))}</code> · started "
        f'{esc(t.get("started_at", "?"))}{provenance}{server_said(t)}</p><div class="cards">'
        + "".join(f'<div class="card">{k}<b>{esc(v)}</b></div>' for k, v in cards)
        + f"</div><p>{esc(stop.get('detail', ''))}</p>{priced_as(t)}"
    )
    if t.get("answer"):
        yield f"<h2>Answer</h2><pre>{esc(t['answer'])}</pre>"
    yield "<h2>Tokens per turn</h2>"
    yield from token_chart(turns)
    # each call's input, for its preview
    calls_input = {
        str(b.get("id")): json.dumps(b.get("input"), ensure_ascii=False)
        for m in items(t.get("messages"))
        for b in items(m.get("content"))
        if b.get("type") == "tool_use"
    }
    yield "<h2>Turns</h2>" + table_head("turn", "stop", "tokens", "cost", "time", "tool calls")
    for x in turns:
        u, chips = fields(x.get("usage")), []
        for c in items(x.get("tool_calls")):
            state = "declined" if c.get("declined") else "error" if c.get("is_error") else "ok"
            chips.append(
                f'<span class="chip {state}">{esc(c.get("name"))} '
                f"{esc(shorten(calls_input.get(str(c.get('id')), ''), 60))} · {state} · "
                f"{num(c.get('seconds')):.2f}s</span>"
            )
        yield (
            f"<tr><td>{esc(x.get('turn'))}</td><td>{esc(x.get('stop_reason'))}</td>"
            f"<td>{num(u.get('tokens')):,}</td><td>{money(u.get('cost_usd'))}</td>"
            f"<td>{num(x.get('seconds')):.1f}s ({num(x.get('api_seconds')):.1f}s API)"
            f"</td><td>{''.join(chips)}</td></tr>"
        )
    yield "</table><h2>Conversation</h2>"
    yield from (
        f'<div class="msg"><span class="role">{esc(m.get("role"))}</span>'
        + "".join(block_html(b) for b in items(m.get("content")))
        + "</div>"
        for m in items(t.get("messages"))
    )


def trials_report(summary):
    """The report of --trials, in parts: pass@k and pass^k, a row per trial (it opens no file)."""
    at, hat = fields(summary.get("pass_at_k")), fields(summary.get("pass_hat_k"))
    ks = sorted(int(k) for k in at)  # plain numbers: summary_problem checked them
    trials = items(summary.get("trials"))
    requested = esc(summary.get("requested"))
    expect = {k: v for k, v in fields(summary.get("expect")).items() if v}
    passes_when = json.dumps(expect, ensure_ascii=False) if expect else "it ends with end_turn"
    p1, interval = summary.get("pass@1"), summary.get("pass@1_wilson95")
    scored = "No trial was scored, so pass@k is unknown."
    if isinstance(p1, (int, float)) and ks:
        pair = isinstance(interval, list) and len(interval) == 2
        low, high = [f"{num(v):.3f}" for v in interval] if pair else ["?", "?"]
        scored = f"pass@1 = {p1:.3f}, 95% Wilson interval {low}–{high}."
    yield (
        f'<h1>agent.py trials</h1><div class="q">{esc(summary.get("question", ""))}</div>'
        f"<p>model <b>{esc(summary.get('model', '?'))}</b>{server_said(summary)} · a trial "
        f"passes when {esc(passes_when)} · a declined call tells the model: "
        f"{esc(summary.get('decline_message', '?'))}</p><p>{esc(summary.get('n'))} of "
        f"{requested} ran: {esc(summary.get('passes'))} passed, {esc(summary.get('failed'))} "
        f"failed, {esc(summary.get('errored'))} errored (not counted in pass@k). {scored}</p>"
    )
    if summary.get("interrupted") is True:
        finished = sum(t.get("stop") != "interrupted" for t in trials)
        yield f"<p>Interrupted (Ctrl-C): {finished} of {requested} trials finished.</p>"
    yield priced_as(summary)
    # pass@k and pass^k for k = 1..scored: a table and a chart
    if ks:
        width, height = 360, 180
        span = max(len(ks) - 1, 1)
        xs = {k: f"{30 + (k - 1) / span * (width - 50):.1f}" for k in ks}
        yield "<h2>pass@k and pass^k</h2>" + table_head("k", "pass@k", "pass^k")
        yield from (
            f"<tr><td>{k}</td><td>{num(at.get(str(k))):.3f}</td><td>"
            f"{num(hat.get(str(k))):.3f}</td></tr>"
            for k in ks
        )
        yield (
            f'</table><svg class="passk" width="{width}" height="{height}" viewBox="0 0 '
            f'{width} {height}" role="img" aria-label="pass@k and pass^k">'
        )
        for key, values in (("at", at), ("hat", hat)):
            points = " ".join(
                f"{xs[k]},{height - 20 - num(values.get(str(k))) * (height - 40):.1f}" for k in ks
            )
            yield f'<polyline class="line-{key}" points="{points}"/>'
        yield from (
            f'<text class="axis" x="{xs[k]}" y="{height - 4}" text-anchor="middle">k={k}</text>'
            for k in ks
        )
        yield (
            '<text class="axis" x="4" y="14">1.0</text><text class="axis" x="4" '
            f'y="{height - 20}">0</text></svg><p class="legend"><span class="l-input">'
            '</span>pass@k<span class="l-output"></span>pass^k (dashed; the lines meet '
            "where every trial passed or none did)</p>"
        )
    heads = ("trial", "stop", "result", "turns", "tokens", "cost", "transcript")
    yield "<h2>Trials</h2>" + table_head(*heads)
    for tr in trials:
        passed = tr.get("passed")
        result = "pass" if passed else "errored" if tr.get("stop") in INFRA_STOPS else "fail"
        yield (
            f"<tr><td>trial {esc(tr.get('index'))}</td><td>{esc(tr.get('stop'))}</td>"
            f'<td class="{"ok" if passed else "error"}">{result}</td><td>'
            f"{esc(tr.get('turns'))}</td><td>{num(tr.get('tokens')):,}</td><td>"
            f"{money(tr.get('cost_usd'))}</td><td><code>"
            f"{esc(tr['transcript']) if is_str(tr.get('transcript')) else ''}</code></td></tr>"
        )
    yield "</table>"


def bounded(parts, cap, error):
    """The parts joined, or `error` raised as soon as they pass `cap` characters."""
    kept = []
    for part in parts:
        cap -= len(part)
        if cap < 0:
            raise error
        kept.append(part)
    return "".join(kept)


OUTPUT_FACTOR = 8  # a report or export writes at most 8 characters per byte of its input...
OUTPUT_SLACK = 1 << 20  # ... plus 1 MiB (a shipped 1,000-turn transcript's report: 1.6 times)


def output_cap(flag, path, input_bytes, what):
    """The most characters `what` made from `input_bytes` of input may have; the error past it."""
    cap = OUTPUT_FACTOR * input_bytes + OUTPUT_SLACK
    return cap, UsageError(
        f"{flag} {path} would make {what} over {cap >> 20} MiB, {OUTPUT_FACTOR} times its "
        f"{input_bytes:,} bytes: no document agent.py writes comes near that "
        "(docs/transcript.md); nothing was written"
    )


def write_report(path, output=None):
    """--report: a transcript or trials summary as HTML to `output` (default: beside it)."""
    document, length = read_document(path, "--report", sized=True)
    kind = document_kind(document)
    if kind not in ("a transcript", "a trials summary"):
        raise UsageError(f"--report {path} is {kind}; it renders a transcript or a trials summary")
    trials = kind == "a trials summary"
    problem = summary_problem(document) if trials else sum_problem(document.get("turns"))
    if problem:
        raise UsageError(f"--report {path} is {kind} agent.py did not write: {problem}")
    # redacted before any string is escaped or shown as JSON, where a secret would not be found
    document = redact(document)
    parts = trials_report(document) if trials else run_report(document)
    question = shorten(str(document.get("question", "")), 80)
    title = "agent.py trials" if trials else f"agent.py run: {question}"
    body = bounded(parts, *output_cap("--report", path, length, "a report"))
    return write_out(path, output, ".html", [utf8(page(title, body))], [("--report", path)])


def write_out(path, output, suffix, texts, inputs, indexes=()):
    """Each of `texts` to stdout ("-"), to `output`, or beside `path` with `suffix` (.i for
    trial i with `indexes`); refused if it would overwrite `inputs`. Returns the paths."""
    if output == "-":
        for data in texts:
            to_stdout(for_terminal(data, html=suffix == ".html"))
        return []
    base = output or Path(path).with_suffix(suffix)
    names = [trial_path(base, i) for i in indexes] or [base]
    named = output is not None and not indexes
    targets = [OutputFile(name, None, "-o", stream=True, named=named) for name in names]
    check_distinct([("-o", target) for target in targets], inputs)
    for target, data in zip(targets, texts, strict=True):
        target.put(data)
    return [str(target.path) for target in targets]


# --- Export: ATIF, the Agent Trajectory Interchange Format ---
#
# --export atif RUN.json writes an ATIF v1.8 trajectory (docs/export.md): the question a user step,
# each turn an agent step, the rest in `extra`; a summary's trials from where --trials wrote them.

ATIF_VERSION = "ATIF-v1.8"
# the transcript's facts of the run that ATIF has no field for: the trajectory's extra
RUN_FACTS = (
    "run_id workdir started_at ended_at stop answer trial cleared events_lost produced_by replay "
    "base_url"
).split()


def export_atif(path, output):
    """--export atif: the trajectory of a transcript, or one per trial of a trials summary, to
    `output` (default: beside it, .atif.json, .i for trial i; "-": stdout). Returns the paths."""
    document, length = read_document(path, "--export", sized=True)
    kind = document_kind(document)
    if kind == "a transcript":
        data = exported("--export", path, (document, length))
        return write_out(path, output, ".atif.json", [data], [("--export", path)])
    if kind != "a trials summary":
        raise UsageError(f"--export {path} is {kind}; it exports a transcript or a trials summary")
    # the trials that kept a transcript
    indexes = []
    for trial in items(document.get("trials")):
        index = trial.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 1:
            raise UsageError(f"--export {path}: a trial's index is {index!r}, not a number from 1")
        if trial.get("transcript") is not None:
            indexes.append(index)
    if not indexes:
        raise UsageError(
            f"--export {path} is a trials summary whose trials kept no "
            "transcript (run --trials with --transcript PATH to keep them)"
        )
    sources = [(f"trial {i}'s transcript", trial_path(path, i)) for i in indexes]
    # all checked before anything is written, then made again one at a time as written; N names
    # of one file would pass its cap N times
    seen = {}
    for flag, source in sources:
        identity = file_identity(source)
        if identity in seen:
            raise UsageError(
                f"--export {path}: {flag} {source} is the same file as "
                f"{seen[identity]}: each trial has its own"
            )
        seen[identity] = flag
        exported(flag, source)
    trajectories = (exported(flag, source) for flag, source in sources)
    inputs = sources + [("--export", path)]
    return write_out(path, output, ".atif.json", trajectories, inputs, indexes)


def exported(flag, path, read=None):
    """The trajectory of the transcript at `path` (or `read`: it and its size), within its cap."""
    transcript, length = read or read_document(path, flag, sized=True)
    data = dump(trajectory(checked_transcript(transcript, path, "export")))
    cap, error = output_cap(flag, path, length, "a trajectory")
    if len(data) > cap:
        raise error
    return data


def trajectory(session):
    steps, unanswered = atif_steps(session)
    version = session.get("agent_version")
    totals = step_metrics(total_usage(session))
    document = {
        "schema_version": ATIF_VERSION,
        "agent": {
            "name": "agent.py",
            "version": version if is_str(version) else "unknown",
            "model_name": session["model"],
            "tool_definitions": tool_definitions(items(session.get("tools"))),
            "extra": {
                "system_prompt": session.get("system"),
                "effort": session.get("effort"),
                "transcript_version": session["version"],
            },
        },
        "steps": steps,
        "final_metrics": {
            **{f"total_{k}": v for k, v in totals.items() if k != "extra"},
            "total_steps": len(steps),
            "extra": totals["extra"],
        },
        "extra": {k: session[k] for k in RUN_FACTS if k in session},
    }
    if is_str(session.get("run_id")):
        document["session_id"] = session["run_id"]
    if unanswered:
        document["notes"] = (
            f"{plural(unanswered, 'tool call')} had no result in the transcript (the run stopped "
            "first): each is answered 'not run' here, with not_in_transcript in its extra"
        )
    return document


def atif_steps(session):
    """The history as ATIF steps, and how many tool calls had no result (answered 'not run')."""
    steps = []
    turns = list(session["turns"])
    messages = session["messages"]
    calls = {b["id"]: b for m in messages for b in m["content"] if b["type"] == "tool_use"}
    facts = {c.get("id"): c for t in turns for c in items(t.get("tool_calls"))}
    cleared = set(session.get("cleared") or ())
    for message in messages:
        if message["role"] == "assistant":
            while turns and turns[0].get("in_history") is False:  # a reply not in the history
                steps.append(agent_step(turns.pop(0), []))
            # transcript_problem counted a turn record for each reply in the history
            agent = agent_step(turns.pop(0), message["content"])
            steps.append(agent)
            continue
        for block in message["content"]:
            if block["type"] != "tool_result":
                source = "system" if block["text"] == FINAL_TURN_NOTE else "user"
                steps.append({"source": source, "message": block["text"]})
                continue
            # its extra: is_error, the call's facts, and clearing's placeholder if any
            call = block["tool_use_id"]
            extra = {k: v for k, v in facts.get(call, {}).items() if k not in ("id", "name")}
            extra["is_error"] = bool(block.get("is_error"))
            if call in cleared:
                extra.update(cleared=True, placeholder=placeholder(block, calls)["content"])
            result = {"source_call_id": call, "extra": extra, "content": as_text(block)}
            agent["observation"]["results"].append(result)
    # replies not in the history, at the end
    steps += [agent_step(turn, []) for turn in turns]
    # each call without a result is answered 'not run'
    stop = session.get("stop")
    why = f"the run stopped ({stop['reason']})" if stop else "the transcript ends"
    not_run_result = {
        "content": f"not run: {why} before it ran",
        "extra": {"is_error": True, "not_in_transcript": True},
    }
    unanswered = 0
    for step in steps:
        results = step.get("observation", {}).get("results", [])
        answered = {r["source_call_id"] for r in results}
        for call in step.get("tool_calls", []):
            if call["tool_call_id"] not in answered:
                unanswered += 1
                results.append({"source_call_id": call["tool_call_id"], **not_run_result})
    if steps[0]["source"] == "user" and iso_time(session.get("started_at")):
        steps[0]["timestamp"] = session["started_at"]
    return [{"step_id": i, **step} for i, step in enumerate(steps, 1)], unanswered


def agent_step(turn, content):
    """One turn as an agent step; the rest of its record and other blocks' kinds in extra."""
    text = "".join(b["text"] for b in content if b["type"] == "text")
    step = {"source": "agent", "message": text}
    if iso_time(turn.get("started_at")):
        step["timestamp"] = turn["started_at"]
    thinking = [b["thinking"] for b in content if b["type"] == "thinking"]
    if thinking:
        step["reasoning_content"] = "\n\n".join(thinking)
    uses = [b for b in content if b["type"] == "tool_use"]
    if uses:
        step["tool_calls"] = [
            {"tool_call_id": b["id"], "function_name": b["name"], "arguments": b["input"]}
            for b in uses
        ]
        step["observation"] = {"results": []}
    step["metrics"] = step_metrics(turn["usage"])
    step["extra"] = {k: turn[k] for k in turn if k not in ("usage", "started_at", "tool_calls")}
    others = [b["type"] for b in content if b["type"] not in ("text", "thinking", "tool_use")]
    if others:
        step["extra"]["other_blocks"] = others
    return step


def step_metrics(usage):
    """A usage record as ATIF metrics (the prompt counts the cache's tokens; writes in extra)."""
    return {
        "prompt_tokens": prompt_tokens(usage),
        "completion_tokens": usage["output_tokens"],
        "cached_tokens": usage["cache_read_input_tokens"],
        "cost_usd": usage["cost_usd"],
        "extra": {"cache_creation_input_tokens": usage["cache_creation_input_tokens"]},
    }


def iso_time(value):
    """Whether `value` is a time as ISO 8601 writes it (ATIF's timestamps are)."""
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        return bool(datetime.fromisoformat(value.replace("Z", "+00:00")))
    return False


# --- Telemetry: the run as OpenTelemetry GenAI traces (--otel) ---
#
# An invoke_agent span per run (per trial), under it a chat span per turn and an execute_tool
# span per tool call (docs/telemetry.md). The SDK is imported only with --otel.

OTEL_GRACE = 3.0  # seconds the end of a run may wait for the last spans to reach the collector


class Telemetry:
    """Spans for the moments the Reporter sees; a failure is said once and never ends a run."""

    def __init__(self, provider, exporter, content=False):
        from opentelemetry import trace

        self.trace = trace
        self.provider = provider
        self.exporter = exporter
        self.content = content
        self.tracer = provider.get_tracer("agent.py", AGENT_VERSION)
        self.lock = threading.Lock()
        self.runs = {}
        # why recording stopped; next(started): the spans started, plus one
        self.failed = None
        self.started = count(1)
        self.replay = None  # --replay's source (begin)

    @classmethod
    def start(cls, report):
        """The OTLP exporter the environment describes, or a UsageError saying what is missing."""
        if (os.environ.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
            raise UsageError(
                "--otel: OTEL_SDK_DISABLED=true is set, so no span would be sent: unset it, or leave --otel out"
            )
        protocol = otlp_setting("PROTOCOL") or "http/protobuf"
        packages = ["opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"]
        packages += ["opentelemetry-exporter-otlp-proto-grpc"] if protocol == "grpc" else []
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import SpanLimits, TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            elif protocol == "http/protobuf":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            else:
                raise UsageError(
                    f"--otel: OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} is not one the Python exporters speak: use http/protobuf or grpc"
                )
        except ImportError:
            python = sys.executable
            fix = f"{python} -m pip install " + " ".join(packages)
            # `uv run`: its environment has no pip, and is uv's to make
            if os.environ.get("UV"):
                python = f"uv's environment for agent.py ({sys.executable})"
                fix = f"run it as uv run --with {' --with '.join(packages)} agent.py ... --otel"
            raise UsageError(
                f"--otel needs the OpenTelemetry SDK and its OTLP exporter, which {python} cannot import: {fix}"
            )
        root = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or ""
        named = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        where = named or (root or "http://localhost:4318").rstrip("/") + "/v1/traces"
        if protocol == "grpc":
            exporter = Counted(OTLPSpanExporter())
        else:
            check_otlp_settings(where)
            exporter = Counted(OTLPSpanExporter(endpoint=where, session=bounded_session()))
        # the SDK's failures: one line of ours, at the end
        sdk_log = logging.getLogger("opentelemetry")
        sdk_log.handlers, sdk_log.propagate = [exporter], False
        service = os.environ.get("OTEL_SERVICE_NAME") or "agent.py"
        resource = Resource.create({"service.name": service, "service.version": AGENT_VERSION})
        try:
            limits = SpanLimits()
        except ValueError as e:
            raise UsageError(f"--otel: {e}")
        # the user's value length limits are applied after redaction (redacted_span)
        exporter.lengths = (limits.max_span_attribute_length, limits.max_attribute_length)
        limits.max_span_attribute_length = limits.max_attribute_length = None
        provider = TracerProvider(resource=resource, shutdown_on_exit=False, span_limits=limits)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        capture = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
        content = capture.strip().upper() in ("TRUE", "SPAN_ONLY", "SPAN_AND_EVENT")
        # no password, no query: they may hold its keys
        exporter.where = server_url(where) or "the collector's URL"
        recorded = "recorded" if content else "not recorded"
        report.line(f"otel: traces to {exporter.where} ({protocol}); message content {recorded}")
        # /v1/traces added to a URL that ends in it, said as ANTHROPIC_BASE_URL's /v1 is
        if not named and protocol != "grpc" and root.rstrip("/").endswith("/v1/traces"):
            root = server_url(root) or root
            report.error(
                f"note: OTEL_EXPORTER_OTLP_ENDPOINT {root} ends in /v1/traces, and /v1/traces is added to it: give the collector's root ({root.rstrip('/').removesuffix('/v1/traces')}), or the whole URL as OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
            )
        return cls(provider, exporter, content)

    def span(self, name, kind, parent, attributes):
        next(self.started)
        # a span is named "{operation} {target}"; a replay's spans say no model was called
        attributes = {"gen_ai.operation.name": name.split()[0], **attributes}
        attributes["agent_py.replay"] = self.replay
        context = self.trace.set_span_in_context(parent) if parent else None
        kind = getattr(self.trace.SpanKind, kind)
        return self.tracer.start_span(name, context, kind, present(attributes))

    def close(self, span, attributes, error=None):
        """A span ends with its last attributes (those not None), failed if `error` names why."""
        span.set_attributes(present(attributes))
        if error:
            span.set_attribute("error.type", error)
            span.set_status(self.trace.Status(self.trace.StatusCode.ERROR, error))
        span.end()

    @property
    def cost_key(self):
        """The name of the cost a span shows: a replay spent nothing, it shows the recording's."""
        return "agent_py.recorded_cost_usd" if self.replay else "agent_py.cost_usd"

    def begin(self, trial, session):
        """A run (a trial) starts: its invoke_agent span."""
        run_id = session["run_id"] + (f".{trial}" if trial else "")
        self.replay = fields(session.get("replay")).get("source")  # --replay: the recording
        attributes = {
            "gen_ai.provider.name": "anthropic",
            "gen_ai.agent.name": "agent.py",
            "gen_ai.agent.version": AGENT_VERSION,
            "gen_ai.conversation.id": run_id,
            "gen_ai.request.model": session["model"],
            "agent_py.trial": trial,
        }
        if self.content:
            system = [{"type": "text", "content": session["system"]}]
            attributes["input.value"] = redact(str(session.get("question")))
            attributes["gen_ai.system_instructions"] = as_json(system)
            attributes["gen_ai.tool.definitions"] = as_json(tool_definitions())
        span = self.span("invoke_agent agent.py", "INTERNAL", None, attributes)
        run = dict(span=span, session=session, conversation=run_id, chat=None, tools={}, retries=0)
        with self.lock:
            self.runs[trial] = run

    def turn_start(self, trial, turn):
        run = self.runs.get(trial)
        if run:
            model = run["session"]["model"]
            attributes = {
                "gen_ai.provider.name": "anthropic",
                "gen_ai.request.model": model,
                "gen_ai.request.stream": True,
                "gen_ai.conversation.id": run["conversation"],
                "agent_py.turn": turn,
            }
            run["chat"] = self.span(f"chat {model}", "CLIENT", run["span"], attributes)

    def retry(self, trial, record):
        run = self.runs.get(trial)
        if run and run["chat"]:
            run["retries"] += 1
            run["chat"].add_event("api.retry", present(record))

    def reply(self, trial, record):
        """The reply of a turn is in: its chat span ends."""
        run = self.runs.get(trial)
        if not run or not run["chat"]:
            return
        chat, run["chat"] = run["chat"], None
        attributes = {
            **usage_attributes(record["usage"]),
            "gen_ai.response.finish_reasons": [str(record["stop_reason"])],
            "agent_py.attempts": record["attempts"],
            "agent_py.retries": len(record["retries"]),
            "gen_ai.response.id": record.get("message_id"),
            "anthropic.request.id": record.get("request_id"),
            self.cost_key: record["usage"]["cost_usd"],
        }
        if self.content:
            messages = run["session"]["messages"]
            # the reply is the last message, unless the turn kept it out of the history
            asked = messages[:-1] if record.get("in_history") is not False else messages
            parts = [p for m in genai_messages(messages[len(asked) :]) for p in m["parts"]]
            said = dict(role="assistant", parts=parts, finish_reason=str(record["stop_reason"]))
            attributes["gen_ai.input.messages"] = as_json(genai_messages(asked))
            attributes["gen_ai.output.messages"] = as_json([said])
        self.close(chat, attributes)

    def tool_start(self, trial, block):
        run = self.runs.get(trial)
        if run:
            attributes = {
                "gen_ai.tool.name": block["name"],
                "gen_ai.tool.call.id": block["id"],
                "gen_ai.tool.type": "function",
                "gen_ai.tool.call.arguments": as_json(block.get("input")) if self.content else None,
            }
            span = self.span(f"execute_tool {block['name']}", "INTERNAL", run["span"], attributes)
            with self.lock:
                run["tools"][block["id"]] = span

    def tool_end(self, trial, block, result, facts):
        run = self.runs.get(trial)
        with self.lock:
            span = run and run["tools"].pop(block["id"], None)
        # a result withheld for the turn's budget comes after its span ended
        if span:
            error_type = "declined" if facts["declined"] else "tool_error"
            attributes = {
                "agent_py.is_error": bool(result.get("is_error")),
                "agent_py.declined": facts["declined"],
                "agent_py.bytes": size(result),
                "agent_py.exit_code": facts["exit_code"],
                "gen_ai.tool.call.result": result["content"] if self.content else None,
            }
            self.close(span, attributes, error_type if result.get("is_error") else None)

    def end(self, trial, stop, session):
        """A run (a trial) ended: whatever is still open ends with it, as its stop says."""
        with self.lock:
            run = self.runs.pop(trial, None)
        if not run:
            return
        for open_span in filter(None, [run["chat"], *run["tools"].values()]):
            self.close(open_span, {}, stop.reason)
        attributes = {
            **usage_attributes(session["usage"]),
            "agent_py.stop": stop.reason,
            "agent_py.exit_code": stop.exit_code,
            "agent_py.turns": len(session["turns"]),
            "agent_py.retries": run["retries"] + len(stop.retries),
            self.cost_key: session["usage"]["cost_usd"],
        }
        if self.content and session.get("answer"):
            attributes["output.value"] = redact(session["answer"])
        self.close(run["span"], attributes, stop.reason if stop.reason in INFRA_STOPS else None)

    def finish(self, report):
        """Send what is left, waiting OTEL_GRACE seconds at most; say once if any was lost."""
        ending = threading.Thread(target=self.provider.shutdown, daemon=True)
        ending.start()
        interrupted = False
        try:
            ending.join(OTEL_GRACE)
        except KeyboardInterrupt:  # the run is done: Ctrl-C now gives up the spans, not the run
            interrupted = True
        if ending.is_alive():  # the collector is slow or away: stop its retries, go on
            self.exporter.shutdown()
        started = next(self.started) - 1
        lost = started - self.exporter.sent
        if not self.failed and not lost:
            return
        why = self.failed or self.exporter.why
        if interrupted and lost:
            why = "interrupted by Ctrl-C while they were sent"
        elif not why and ending.is_alive():
            why = f"no answer within {OTEL_GRACE:g} s"
        report.error(
            f"agent.py: --otel: {lost} of {plural(started, 'span')} did not reach the collector at {self.exporter.where} ({why or 'the collector refused them'})"
        )


def present(attributes):
    """The attributes that have a value (the OpenTelemetry SDK refuses None, with a warning)."""
    return {k: v for k, v in attributes.items() if v is not None}


class Counted(logging.Handler):
    """The OTLP exporter, counting the spans it sent and redacting each (redacted_span); and
    the SDK log's handler, keeping the last failure to say why spans were lost."""

    def __init__(self, exporter):
        super().__init__(logging.WARNING)
        self.inner = exporter
        self.sent = 0
        # the last failure the exporter reported, and the collector's URL as shown
        self.why = self.where = None
        # the user's OTEL_*_VALUE_LENGTH_LIMIT: the span's, and its events' and links'
        self.lengths = (None, None)
        self.stopped = False

    def export(self, spans):
        # a copy loses the spans' counts of dropped attributes: made only to redact or to cut
        if SECRETS or any(self.lengths):
            spans = [redacted_span(s, *self.lengths) for s in spans]
        try:
            result = self.inner.export(spans)
        except Exception as e:
            result, self.why = None, f"{type(e).__name__}: {e}"
        if getattr(result, "name", "") == "SUCCESS":
            self.sent += len(spans)
        return result

    def emit(self, record):
        # after shutdown, what the exporter says (a retry given up) is not why spans were lost
        if self.stopped:
            return
        message = record.getMessage()
        errno_said = re.search(r"\[Errno -?\d+\] [^'\")]+", message)
        self.why = errno_said[0] if errno_said else shorten(message, 160)

    def shutdown(self):
        # the provider's shutdown and the end of the grace may both ask; the SDK ignores a second
        self.stopped = True
        self.inner.shutdown()


def redacted_span(span, length=None, others=None):
    """A finished span's copy, its strings redacted and then (a cut secret would pass) cut to the
    user's length limits: `length` the span's, `others` its events' and links'."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import Link, Status

    def scrub(attributes, width=others):
        def cut(value):
            if isinstance(value, (tuple, list)):
                return tuple(map(cut, value))
            if not isinstance(value, str):
                return value
            return redact(value) if width is None else shorten(value, width) if width else ""

        return {redact(k): cut(v) for k, v in (attributes or {}).items()}

    return ReadableSpan(
        name=redact(span.name),
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=scrub(span.attributes, length),
        kind=span.kind,
        events=[Event(redact(e.name), scrub(e.attributes), e.timestamp) for e in span.events],
        links=[Link(link.context, scrub(link.attributes)) for link in span.links],
        status=Status(span.status.status_code, redact(span.status.description)),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def otlp_setting(name):
    """An OTEL_EXPORTER_OTLP_ setting for traces: its TRACES_ variable, else the general one."""
    traces = os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
    return traces or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")


def check_otlp_settings(url):
    """A UsageError for a setting the SDK would replace, fail with, or print (a header)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--otel: the collector {url!r} is not an http(s) URL with a host")
    traces = "TRACES_" if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") else ""
    pairs = (otlp_setting("HEADERS") or "").split(",")
    # one name=value as the SDK parses it; it prints any other whole
    name_value = re.compile(r"[ \t]*[!#-'*+.0-9A-Z^-z|~-]+[ \t]*=[ \t]*[ !#-+\--:<-\[\]-~]*[ \t]*")
    for i, pair in enumerate(pairs):
        if not pair.strip() or name_value.fullmatch(pair):
            continue
        said = "a character a header name or value cannot hold"
        if "=" not in pair:
            said = 'no =: a header written "Name: value"?'
        elif not pair.split("=")[0].strip():
            said = "no name before its ="
        raise UsageError(
            f"--otel: OTEL_EXPORTER_OTLP_{traces}HEADERS is not a comma-separated list of name=value (item {i + 1} of {len(pairs)} has {said}); its values are not shown"
        )
    compression = (otlp_setting("COMPRESSION") or "none").strip().lower()
    if compression not in ("none", "gzip", "deflate"):
        raise UsageError(
            f"--otel: OTEL_EXPORTER_OTLP_COMPRESSION {compression!r} is not none, gzip or deflate"
        )
    try:
        float(otlp_setting("TIMEOUT") or 10)
    except ValueError:
        raise UsageError(
            f"--otel: OTEL_EXPORTER_OTLP_TIMEOUT {otlp_setting('TIMEOUT')!r} is not a number of seconds"
        )
    if parts.scheme == "https":
        import ssl

        try:
            context = ssl.create_default_context(cafile=otlp_setting("CERTIFICATE"))
            client = otlp_setting("CLIENT_CERTIFICATE")
            if client:
                context.load_cert_chain(client, otlp_setting("CLIENT_KEY"))
        except (OSError, ssl.SSLError) as e:
            raise UsageError(
                f"--otel: the certificates OTEL_EXPORTER_OTLP_*CERTIFICATE or _CLIENT_KEY name cannot be used: {e}"
            )


def bounded_session():
    """The exporter's HTTP session: it reads an answer's status and headers, never its body,
    and follows no redirect (a 3xx loses the batch, which the SDK would count delivered)."""
    import requests

    # called as the answer's head is in, before the session reads its body or follows it
    def answered(response, **kwargs):
        response.close()
        if 300 <= response.status_code < 400:
            location = one_line(response.headers.get("Location", "?"), 100)
            raise requests.TooManyRedirects(
                f"the collector answered {response.status_code} (a redirect to {location}, not followed)"
            )

    session = requests.Session()
    session.stream = True
    session.hooks["response"].append(answered)
    return session


def as_json(value):
    """A content attribute: JSON text, secrets redacted (the conventions' string form)."""
    return clean(json.dumps(redact(value), ensure_ascii=False))


def usage_attributes(usage):
    """A usage record as the conventions count it: input tokens include the cache's."""
    read, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
    return {
        "gen_ai.usage.input_tokens": usage["input_tokens"] + read + written,
        "gen_ai.usage.output_tokens": usage["output_tokens"],
        "gen_ai.usage.cache_read.input_tokens": read,
        "gen_ai.usage.cache_creation.input_tokens": written,
    }


def tool_definitions(tools=TOOLS):
    """Tools in the OpenAI function form both the conventions and ATIF use."""
    names = {"name": "name", "description": "description", "parameters": "input_schema"}
    return [{"type": "function", **{k: t.get(v) for k, v in names.items()}} for t in tools]


def genai_messages(messages):
    """History in the conventions' message form; each tool result a message with role tool."""
    out = []
    for m in messages:
        parts, results = [], []
        for b in m["content"]:
            kind = b.get("type")
            if kind == "text":
                parts.append({"type": "text", "content": b["text"]})
            elif kind == "thinking":
                parts.append({"type": "reasoning", "content": b["thinking"]})
            elif kind == "tool_use":
                call = dict(type="tool_call", id=b["id"], name=b["name"], arguments=b.get("input"))
                parts.append(call)
            elif kind == "tool_result":
                answer = dict(
                    type="tool_call_response", id=b["tool_use_id"], response=b.get("content")
                )
                results.append({"role": "tool", "parts": [answer]})
        out += results + ([{"role": m["role"], "parts": parts}] if parts else [])
    return out


# --- Terminal: progress on stderr, text made visible ---


def agreed(question, stdin):
    """Ask on stderr (or the answering terminal); True only for y or yes; no answer is a no."""
    with Reporter.lock, answer_screen(stdin) as screen:
        if not to_stderr(dimmed(visible(question), screen), screen):
            return False  # a question no one can see is not agreed to
        answer = stdin.readline()
        if not answer.endswith("\n"):  # no one answered: end the line
            to_stderr(dimmed(getattr(stdin, "no_answer", "(no answer)") + "\n", screen), screen)
    return answer.strip().lower() in ("y", "yes")


def plural(n, word):
    return f"{n} {word}{'s' * (n != 1)}"


# Characters a terminal obeys instead of showing, or draws as nothing: controls but newline
# and tab, bidi marks, line separators, lone surrogates, and every default-ignorable code point.
INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u034f\u061c\u115f\u1160\u17b4\u17b5"
    "\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u2800\u3164"
    "\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\ud800-\udfff\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)


def visible(text):
    """Text for a terminal: what would drive the terminal, or hide in it, is shown escaped as
    Python writes it in a string (\\x7f, \\u200b, \\U000e0001), a carriage return as \\x0d."""
    return INVISIBLE.sub(lambda m: "\\x0d" if m[0] == "\r" else ascii(m[0])[1:-1], text)


def for_terminal(data, html=False, terminal=None):
    """JSON (or HTML) bytes bound for stdout (or `terminal`): on a terminal, each character
    `visible` would escape is written as \\uXXXX (or &#xXXXX;), which means the same there."""
    if not (sys.stdout.isatty() if terminal is None else terminal):
        return data
    text = data.decode("utf-8", "surrogateescape")
    # only inside JSON strings can such a character be
    escape = (lambda m: f"&#x{ord(m[0]):x};") if html else (lambda m: json.dumps(m[0])[1:-1])
    return INVISIBLE.sub(escape, text).encode("utf-8", "surrogateescape")


# What the approval question shows by its code point: all but printable ASCII and CJK text and
# punctuation, and of those the kana drawn like a Han character or each other (エ 工, カ 力, ロ 口,
# ー 一), compatibility ideographs and brackets drawn like the question's own ⟦ ⟧ (〘 〙 〚 〛).
NOT_AS_IS = re.compile(
    "[^\t\n -~\u3001-\u3003\u3008-\u3011\u3014-\u3017\u3041-\u3096\u30a1-\u30fa"
    "\u30fd\u30fe\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3\uff01\uff08\uff09"
    "\uff0c\uff1a\uff1b\uff1f\U00020000-\U0003134f]|[エカタトニハロヘベペ]"
)


def terminal_size():
    """(rows, columns) of the terminal stderr shows on; 24 x 80 when it is not one."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        columns, rows = os.get_terminal_size(sys.stderr.fileno())
        if rows and columns:  # a terminal of no size (a bare pty) is not one
            return rows, columns
    return 24, 80


def display_width(text):
    """Columns `text` takes on a terminal: wide and full-width characters take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def approval_question(code, rows, columns, unconfined=None):
    """What stderr shows before run_python's [y/N] question: the code numbered, and no two programs
    that differ look the same (NOT_AS_IS shown as ⟦U+0430⟧, a tab as ␉, a space ending a line as ␠);
    code taller than the screen gets its header again. `unconfined`: why there is no sandbox."""
    shown = NOT_AS_IS.sub(lambda m: f"\u27e6U+{ord(m[0]):04X}\u27e7", code).replace("\t", "\u2409")
    shown = re.sub("(?m) +$", lambda m: "\u2420" * len(m[0]), shown)
    lines = [f"{n:>4}\u2502 {line}" for n, line in enumerate(shown.split("\n"), 1)]
    legend = [
        f"  \u27e6U+{ord(ch):04X}\u27e7 is {unicodedata.name(ch, 'an unnamed character')}{f' ({n} times)' if n > 1 else ''}"
        for ch, n in sorted(Counter(NOT_AS_IS.findall(code)).items())
    ]
    if len(legend) > 12:
        legend = legend[:11] + [f"  and {len(legend) - 11} more characters shown by code point"]
    who = f"[trial {TRIAL.index}] " if getattr(TRIAL, "index", None) else ""  # --trials
    head = f"--- {who}run_python wants to run {plural(len(lines), 'line')} ---"
    body = lines + (["--- characters shown by their code point:"] + legend if legend else [])
    tall = sum(max(1, -(-display_width(line) // max(columns, 20))) for line in body)
    text = "\n" + head + "\n" + "\n".join(body) + "\n"
    if tall + 3 > rows:  # the header has scrolled away: say it again, with what is off screen
        text += f"--- run_python wants to run the {plural(len(lines), 'line')} above; {plural(tall + 3 - rows, 'row')} of them scrolled off the top of the screen (scroll up to read them) ---\n"
    if unconfined:
        unconfined = f" UNCONFINED, as you, with your files and network (no sandbox: {shorten(unconfined, 60)})"
    return text + f"--- {who}run it{unconfined or ''}? [y/N] "


DIM, UNDIM = "\x1b[2m", "\x1b[22m"  # SGR faint, and back to normal intensity
# a line of agent.py's own: not empty, and not a numbered line of code in the approval question
OWN_LINE = re.compile("^(?! *\\d+\u2502 ).+$", re.MULTILINE)


def styled(stream=None):
    """True when `stream` (stderr) is a terminal, without NO_COLOR or TERM=dumb."""
    with contextlib.suppress(AttributeError, ValueError):
        if (stream or sys.stderr).isatty():
            return not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
    return False


def dimmed(text, stream=None):
    """agent.py's own lines faint on a terminal; the code in an approval question stays as is."""
    return OWN_LINE.sub(lambda m: f"{DIM}{m[0]}{UNDIM}", text) if styled(stream) else text


def consent_question(source, taken, columns):
    """What --resume and --replay ask before using what a transcript says: each value (label,
    value, note) quoted and escaped on a line of its own, cut in the middle to fit its rows
    (the workdir 6, others one), so every line the user answers is agent.py's."""
    rows = [f"{quoted(source)} asks to go on with its own:"]  # the user's own path, in full
    rows += [
        fitted(f"  {label} ", value, note, columns, 6 if label == "workdir" else 1)
        for label, value, note in taken
    ]
    ask = f"\nA transcript is only a file, which anything could have written.\nGo on with {'it' if len(rows) == 2 else 'them'}? [y/N] "
    return "\n".join(rows) + ask


def quoted(text):
    """`text` between double quotes on one line, every character that is not itself escaped."""
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{visible(text)}"'


def fitted(before, text, after, columns, rows=1):
    """before + quoted(text) + after in `rows` rows: a text too wide loses its middle."""
    shown = quoted(redact(text))
    room = max(rows * columns - 1 - display_width(before + after), 40)
    if display_width(shown) > room:
        # the marker says how many characters it stands for: cut until that number holds
        cut, marker = len(shown), ""
        while marker != f"…[{cut:,} characters not shown]…":
            marker = f"…[{cut:,} characters not shown]…"
            half = (room - display_width(marker)) // 2
            head, tail = shown[:half], shown[len(shown) - half :]
            while display_width(head) > half:
                head = head[:-1]
            while display_width(tail) > half:
                tail = tail[1:]
            cut = len(shown) - len(head) - len(tail)
        shown = head + marker + tail
    return before + shown + after


def shorten(text, width):
    """At most `width` characters, cut after a word, secrets redacted first (while whole)."""
    text = redact(text)
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > width // 2 else cut).rstrip() + "…"


class Reporter:
    """Progress, streamed text and prompts on stderr (under a lock), and the same as events."""

    lock = threading.Lock()

    def __init__(self, quiet=False, stream=None, events=None, trial=None, telemetry=None):
        self.quiet = quiet
        self.prefix = f"[trial {trial}] " if trial else ""  # each line says whose it is
        self.stream = stream or sys.stderr
        self.events = events
        self.trial = trial
        self.turn_no = None
        self.telemetry = telemetry  # --otel: the same moments as spans
        self.pending = ""  # streamed text not yet ended by a newline
        self.held = ""  # its end, not yet written: it could be part of a secret
        self.said = ""  # streamed text not yet sent as an event
        self.thinking = False  # streaming the summary of the model's thinking, not its text
        self.said_writing = 0.0  # when stderr last said how far a tool call's input has come
        self.dim = styled(self.stream)  # agent.py's own lines faint on a terminal, not the model's

    def write(self, text, always=False):
        if always or not self.quiet:
            with self.lock:
                to_stderr(text, self.stream)

    def emit(self, kind=None, **data):
        """An event, after any text streamed before it (with no `kind`, only that text)."""
        if self.events:
            if self.said:
                self.emit_said()
            if kind:
                self.events.emit(kind, self.trial, **data)
            news = self.events.news()
            if news:
                self.error(f"agent.py: {news}")

    def trace(self, moment, *args):
        """Tell the telemetry (--otel), if any; a failure there never ends the run."""
        if self.telemetry and not self.telemetry.failed:
            try:
                getattr(self.telemetry, moment)(self.trial, *args)
            except Exception as e:
                self.telemetry.failed = f"{type(e).__name__}: {e}"
                self.error(f"agent.py: --otel stopped recording: {self.telemetry.failed}")

    def emit_said(self, whole=True):
        """The text streamed so far as an event; mid-stream (not `whole`), an end that could
        begin a secret waits for the next event, where redact finds the secret whole."""
        extra = {"thinking": True} if self.thinking else {}
        cut = len(self.said) - (0 if whole else secret_start(self.said))
        said, self.said = self.said[:cut], self.said[cut:]
        self.events.emit("text", self.trial, turn=self.turn_no, text=said, **extra)

    def line(self, text, always=False, plain=False):
        """One line of agent.py's own, dim on a terminal (an error plain); a line break in the
        text is shown as \\n, so no line can pass for one of agent.py's own."""
        self.flush_text()
        shown = visible(text).replace(chr(10), chr(92) + "n")
        shown = shown if plain or not self.dim else f"{DIM}{shown}{UNDIM}"
        self.write(f"{self.prefix}{shown}\n", always)

    def text(self, delta, thinking=False):
        """Model text (or its thinking) as it streams; with a prefix (trials) whole lines."""
        shown = visible(delta)
        # a switch: what was said so far is an event of its own; stderr says which on a new line
        if thinking != self.thinking:
            self.emit()
            self.thinking = thinking
            self.flush_text()
            shown = "[thinking] " + shown if thinking else shown
        if self.events:  # coalesced: a paragraph, or 2000 characters, an event
            self.said += delta
            if len(self.said) >= 2000 or ("\n" in delta and len(self.said) >= 200):
                self.emit_said(whole=False)
        self.pending += shown
        if self.prefix:
            *lines, self.pending = self.pending.split("\n")
            # (no write for a delta without a newline: each takes the lock all trials share)
            if lines:
                self.write("".join(f"{self.prefix}{line}\n" for line in lines))
            return
        # an end that could begin a secret waits for the next delta
        shown = self.held + shown
        cut = len(shown) - secret_start(shown)
        self.write(shown[:cut])
        self.held = shown[cut:]
        self.pending = self.pending.rpartition("\n")[2]

    def writing(self, name, chars):
        """A tool call's input as it streams: a line every 2 s, so stderr never goes silent."""
        moment = time.monotonic()
        if chars == 0 or moment - self.said_writing >= 2:
            self.said_writing = moment
            if chars:
                self.line(f"  writing a {name} call: {chars:,} characters so far")

    def flush_text(self):
        """End a half-written line of streamed text before anything else is printed."""
        if self.pending:
            self.write(f"{self.prefix}{self.pending}\n" if self.prefix else self.held + "\n")
            self.pending = self.held = ""

    def error(self, text):
        self.line(text, always=True, plain=True)

    def turn_start(self, turn):
        self.turn_no, self.thinking = turn, False
        self.emit("turn.start", turn=turn)
        self.trace("turn_start", turn)

    def retry(self, record, attempts):
        self.line(
            f"retrying in {record['delay']:.1f}s (attempt {record['attempt'] + 1} of {attempts}): {record['error']}"
        )
        self.emit("api.retry", turn=self.turn_no, **record)
        self.trace("retry", record)

    def turn(self, r):
        """The progress line once a reply is in: tokens, cache, cost, time."""
        u = r["usage"]
        cost = " · cost unknown" if u["cost_usd"] is None else f" · ${u['cost_usd']:.6f}"
        self.line(
            f"turn {r['turn']}: {r['stop_reason']} · in {u['input_tokens']} (cache write {u['cache_creation_input_tokens']}, read {u['cache_read_input_tokens']}) · out {u['output_tokens']}{cost} · {r['seconds']:.1f}s"
        )
        self.trace("reply", r)

    def turn_end(self, r):
        # the fields the events schema names for turn.end, in its order
        facts = {**r, "tool_calls": len(r["tool_calls"])}
        self.emit("turn.end", **{key: facts[key] for key in EVENT_TYPES["turn.end"]})

    def tool_start(self, block):
        call = {"id": block["id"], "name": block["name"], "input": block.get("input")}
        self.emit("tool.start", turn=self.turn_no, **call)
        self.trace("tool_start", block)

    def tool(self, block, result, seconds, facts):
        args = shorten(json.dumps(block.get("input"), ensure_ascii=False), 100)
        is_error = bool(result.get("is_error"))
        lines = result["content"].strip().splitlines() if is_error else []
        if lines and lines[-1] == "--- stderr ---":  # nothing on stderr: how the script ended
            ended = facts.get("exit_code")
            lines = [lines[0].split(";")[0] if ended is None else f"exit code {ended}"]
        outcome = f"error: {shorten(lines[-1], 100)}" if lines else "error" if is_error else "ok"
        self.line(f"  {block['name']} {args} -> {outcome} ({seconds:.2f}s)")
        # the fields the events schema names for tool.end, in its order
        done = {**block, "turn": self.turn_no, "is_error": is_error, "withheld": False, **facts}
        done.update(bytes=size(result), seconds=round(seconds, 3))
        self.emit("tool.end", **{key: done[key] for key in EVENT_TYPES["tool.end"]})
        self.trace("tool_end", block, result, facts)


# --- Path safety: read_file never leaves the workdir ---

RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x02, 0x04, 0x08  # openat2(2)
LIBC = ctypes.CDLL(None, use_errno=True)


def openat2(dir_fd, path, flags, resolve):
    """openat2(2) through ctypes (Linux 5.6+): the kernel resolves `path` under `resolve` rules."""
    how = struct.pack("QQQ", flags, 0, resolve)
    # 437: openat2's number on every architecture; the kernel reads each number as a long
    long = ctypes.c_long
    fd = LIBC.syscall(long(437), long(dir_fd), os.fsencode(path), how, long(len(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def outside(path, target, workdir):
    return ToolError(
        f"refused: {path!r} resolves to {target}, outside the working directory {workdir}. Only files inside it can be read; do not try to reach it another way, ask the user."
    )


def open_inside(ctx, path):
    """An O_PATH descriptor of `path`, resolved by the kernel without ever leaving the workdir."""
    if "\0" in path or not path:
        raise ToolError(
            f"{path!r} is not a usable path (empty, or with a NUL byte); give the file's path relative to the working directory."
        )
    workdir = ctx.workdir
    relative = os.path.relpath(path, workdir) if os.path.isabs(path) else path
    if os.path.normpath(relative).split(os.sep)[0] == "..":  # leaves it by its very spelling
        raise outside(path, os.path.realpath(os.path.join(workdir, relative)), workdir)
    flags = os.O_PATH | os.O_CLOEXEC
    beneath = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
    try:
        try:
            fd = openat2(ctx.workdir_fd, relative, flags, beneath)
        except OSError as e:
            if e.errno not in (errno.ENOSYS, errno.EXDEV):
                raise
            # No openat2 (before Linux 5.6), or a step left the workdir (an absolute symlink may
            # land inside it): resolve here, then open beneath it again (or plainly, checked below).
            target = os.path.realpath(os.path.join(workdir, relative))
            if not Path(target).is_relative_to(workdir):
                raise outside(path, target, workdir)
            if e.errno == errno.ENOSYS:
                fd = os.open(target, flags)
            else:
                fd = openat2(ctx.workdir_fd, os.path.relpath(target, workdir), flags, beneath)
    except FileNotFoundError:
        raise ToolError(
            f"{path!r} does not exist. List the files with run_python, e.g. print(sorted(os.listdir('.'))) or os.walk('.') for subdirectories."
        )
    except OSError as e:
        raise ToolError(f"cannot open {path!r}: {e.strerror}.")
    try:  # checked again on the descriptor: whatever was swapped in, this is what was opened
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        opened = str(workdir)  # no /proc: openat2's RESOLVE_BENEATH is the check
    if not Path(opened).is_relative_to(workdir):
        os.close(fd)
        raise outside(path, opened, workdir)
    return fd


def read_window(fd, path, offset, limit, max_bytes):
    """Lines [offset, offset+limit) (at most max_bytes), read a line or 64 KiB of one at a time,
    never a whole line: the rest of the file is only counted, so memory stays bounded."""
    kept = bytearray()
    line = 1
    last = offset - 1
    cut_line = False
    tail = b"\n"
    with open(fd, "rb", closefd=False) as file:
        while line < offset + limit and len(kept) < max_bytes:
            # a piece one byte longer than the room left says whether the line fits
            room = max_bytes - len(kept)
            piece = file.readline(room + 1 if room <= 1 << 16 else 1 << 16)
            if not piece:
                break
            if line >= offset:
                kept += piece[:room]
                last = line
                # a line that does not fit: what does is kept, and the window ends there
                cut_line = len(piece) > room
            tail = piece[-1:]
            line += tail == b"\n"
        # past the window: count the lines, keep nothing
        for piece in iter(lambda: file.read(1 << 16), b""):
            tail = piece[-1:]
            line += piece.count(b"\n")
    total = line - (tail == b"\n")  # a last line without a newline still counts
    if total == 0:
        return "(empty file)"
    if offset > total:
        raise ToolError(f"offset {offset} is past the end of {path!r}, which has {total} lines.")
    try:
        text = kept.decode("utf-8")
    except UnicodeDecodeError as e:
        if not (cut_line and e.reason == "unexpected end of data"):
            raise ToolError(
                f"{path!r} is not UTF-8 text (bad byte at offset {e.start} of the lines read); if it is binary, inspect it with run_python."
            )
        text = kept[: e.start].decode("utf-8")
    if cut_line:  # a secret cut in two here would be found whole in neither part: cut it out
        text = text[: len(text) - secret_start(text, least=8)]
    if last < total or cut_line:
        more = f" (line {last} cut at {max_bytes} bytes)" if cut_line else ""
        text += f"\n[read_file: lines {offset}-{last} of {total}{more}; call read_file with offset={last + 1} to continue]"
    return text


# --- The sandbox: where run_python's code runs ---
#
# On Linux each run has one launcher, a fresh single-threaded interpreter of this file started at
# the first call: agent -> launcher -> call. For each call it makes the call's directory (the
# script, a private home), forks a child that confines itself (cgroup and mount namespace where
# allowed, no capability, Landlock, seccomp) and spawns `python main.py`; it ends the call's group
# and removes what it made. Read in call order: the policy; execute; each call, down to the exec;
# the set-up once per run; the policy's tables, as data.


@dataclass(frozen=True, kw_only=True)
class SandboxPolicy:
    """Everything run_python's code may do; what this does not grant is denied. The mechanism
    below (Sandbox, Call, execute) is built from it alone; the defaults hold for every run."""

    read_exec: tuple  # trees it may read and execute: system programs and libraries, this Python
    read_files: tuple  # files it may read: of /etc only what programs need; the random devices
    write_files: tuple = ("/dev/null",)  # files it may also write
    read_write: tuple  # trees it may change (but make devices in): the workdir
    # its call's own trees, made for it and gone after it: a private tmpfs where mounts are allowed
    own_read_write: tuple = ("home", "shm")
    own_read: tuple = ("script",)  # its call's own files it may read, not change: the approved code
    shm: str = "/dev/shm"  # where it sees its own "shm" (without a mount namespace, nowhere)
    # variables passed on from agent.py's environment, and every LC_*
    env_keep: frozenset = frozenset({"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME"})
    # names never passed, even if kept: no key, token or password
    env_secret: str = r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|ANTHROPIC|AUTH"
    env_set: tuple = (  # (name, value) set for every script; {home} is the call's private home
        ("HOME", "{home}"),
        ("TMPDIR", "{home}"),
        ("TEMP", "{home}"),
        ("TMP", "{home}"),
        ("PYTHONNOUSERSITE", "1"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("PYTHONSAFEPATH", "1"),  # no script dir or cwd on sys.path: no stdlib shadowed
        # a name that is not UTF-8 prints as an escape Python reads again (caf\udce9.csv), no crash
        ("PYTHONIOENCODING", "utf-8:backslashreplace"),
        ("MPLBACKEND", "Agg"),
        # what a script printed before a timeout or Ctrl-C killed it reaches the model
        ("PYTHONUNBUFFERED", "1"),
    )
    rlimits: tuple  # (RLIMIT_*, soft, hard) for each of its processes, never above agent.py's
    max_tasks: int  # processes and threads of one call, all told (its cgroup, where allowed)
    memory_mb: int  # memory of one call, all its processes, no swap (likewise)
    scratch_mb: int  # the size of the call's private tmpfs
    network: tuple  # Landlock rights handled with no port granted: no TCP, no UDP (ABI 10)
    scopes: tuple  # Landlock scopes: no signal, no abstract unix socket beyond the call
    syscalls: tuple  # SECCOMP_RULES: the calls refused, and why; sockets only AF_UNIX
    unix_sockets: tuple  # UNIX_SOCKET_RULES, where Landlock cannot refuse named sockets (ABI < 9)


def sandbox_policy(workdir, limits, system=None):
    """The policy of a run: its workdir, this interpreter's files, the caps in `limits`; the
    system's own files are Linux's, or macOS's (`system` "Darwin")."""
    macos = (system or platform.system()) == "Darwin"
    dirs, files = python_paths(macos)
    gib, cpu = 1 << 30, int(limits.tool_timeout) + 5
    return SandboxPolicy(
        read_exec=(*dirs, *(MACOS_DIRS if macos else SYSTEM_DIRS), *files),
        read_files=MACOS_FILES if macos else SYSTEM_FILES,
        read_write=(str(workdir),),
        rlimits=(
            ("RLIMIT_CORE", 1, 1),  # 1, not 0: no core-dump pipe helper either
            ("RLIMIT_SIGPENDING", 256, 256),  # a count the kernel keeps per user
            ("RLIMIT_NOFILE", 4096, 4096),  # the machine's file table is shared
            ("RLIMIT_FSIZE", gib, gib),
            ("RLIMIT_AS", 4 * gib, 4 * gib),
            ("RLIMIT_CPU", cpu, cpu + 1),
        ),
        max_tasks=limits.max_tasks,
        memory_mb=limits.memory_mb,
        scratch_mb=limits.scratch_mb,
        network=tuple(LANDLOCK_NET),
        scopes=tuple(LANDLOCK_SCOPE),
        syscalls=SECCOMP_RULES,
        unix_sockets=UNIX_SOCKET_RULES,
    )


# A call in the order it happens: in the agent, execute hands it to the launcher (ask_launcher)
# and reads the output; in the launcher, launch makes its Child: the directory with the approved
# script, cgroup and ruleset (Call), a fork that confines itself (Call.run, Call.enter), the exec.


def execute(code, workdir, box, timeout, output_chars, cancel=None):
    """Run a script in the sandbox with bounded time and output; nothing of it outlives the call."""
    if box.shown:
        why = f"the temp directory shows inside the workdir at {box.shown}, where a script could"
        raise ToolError(f"{why} swap other runs' calls: set TMPDIR elsewhere; nothing was run")
    launcher = box.launched()
    if launcher:
        run = ask_launcher(launcher, code, workdir, box, timeout)
    else:
        run = start_here(code, workdir, box)
    status = None
    try:  # from here the launcher is told when the call is over, however it ends
        clips = {run.out: Clip(output_chars // 4), run.err: Clip(output_chars // 4)}
        ended_at, timed_out = None, False
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for fd in (run.out, run.err):
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            if run.report:
                sel.register(run.report, selectors.EVENT_READ)
            while True:
                check_cancelled(cancel)
                moment = time.monotonic()
                if moment >= deadline:
                    timed_out = status is None
                    # what the pipes hold is kept; a script still writing is not waited for
                    for fd in (run.out, run.err):
                        with contextlib.suppress(OSError):
                            clips[fd].add(os.read(fd, 65536))
                    break
                if status is None and run.proc and run.proc.poll() is not None:
                    status = (run.proc.returncode, 0)
                    kill_group(run.proc.pid)  # a grandchild holding the pipes dies with it
                if status is not None:  # the group is dead: drain the pipes, briefly
                    ended_at = ended_at or moment
                    if len(sel.get_map()) == 0 or moment - ended_at > 2:
                        break
                for key, _ in sel.select(timeout=min(0.1, deadline - moment)):
                    if key.fileobj is run.report:
                        status = run.read_answer(box)
                        if status is not None:
                            sel.unregister(run.report)
                    else:
                        data = os.read(key.fd, 65536)
                        if data:
                            clips[key.fd].add(data)
                        else:
                            sel.unregister(key.fd)
    finally:
        run.end(status)
    # "timed out": the call's first process ended it, a grace after the agent's timeout
    timed_out = timed_out or status == "timed out"
    code, oom = (None, 0) if status in (None, "gone", "timed out") else status
    return Execution(code, clips[run.out].text(), clips[run.err].text(), timed_out, bool(oom))


@dataclass
class Execution:
    code: int | None  # exit code, negative for a signal; None when it timed out
    stdout: str
    stderr: str
    timed_out: bool
    oom: bool = False  # the call went over its memory cap and the kernel killed a process


def ask_launcher(launcher, code, workdir, box, timeout):
    """Send a call to the launcher with a socket of its own (the launcher answers on it; closing
    it ends the call). The first answer: the script's pid and its stdout and stderr, or why not."""
    # code the script's file cannot hold fails here, as without a launcher
    script_bytes(code)
    request = {"code": code, "workdir": str(workdir), "parent": call_parent(), "timeout": timeout}
    request.update((name, getattr(box, name)) for name in FOUND_AT_FIRST_CALL)
    # (home is the launcher's to fill in)
    request["env"] = child_env(box.policy, "")
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        with theirs:
            send_whole(launcher.control, request, [theirs.fileno()])
        answer, pipes, _, _ = socket.recv_fds(mine, 65536, 2)
        if len(pipes) != 2:  # no script: why, or (nothing at all) the launcher has ended
            for fd in pipes:
                os.close(fd)
            if not answer:
                raise OSError("the launcher has ended")
            raise ToolError(json.loads(answer)["error"])
    except BaseException as e:
        mine.close()
        if isinstance(e, OSError):
            launcher.gone()
            why = "run_python's launcher has ended (was it killed?); nothing was run"
            raise ToolError(f"{why}: start agent.py again") from None
        raise
    run = Running(*pipes, report=mine, launcher=launcher)
    run.read_answer(box, answer)
    return run


# What the agent's plan and self-test found, which the launcher's calls follow
FOUND_AT_FIRST_CALL = ("cgroup", "tested", "landlock", "mounts")


def script_bytes(code):
    """The approved code as the script's bytes. With a BOM Python reads the file as UTF-8 or not
    at all: a coding declaration (utf-7, say) cannot make it run other text than the text shown."""
    return ("\ufeff" + code).encode("utf-8")


def call_parent():
    """Where a call's directory is made: the temp directory, if no other user can rename what
    is in it or above it (and so swap the call's directory for one of theirs)."""
    parent, me = Path(os.path.realpath(tempfile.gettempdir())), os.geteuid()
    for directory in (parent, *parent.parents):
        there = os.stat(directory)
        if there.st_uid not in (me, 0):
            why = f"{directory} belongs to another user (uid {there.st_uid})"
        elif there.st_mode & 0o022 and not there.st_mode & stat.S_ISVTX:
            why = f"{directory} can be written by others and has no sticky bit"
        else:
            continue
        raise ToolError(
            f"the call's directory would be made in {parent}, but {why}, who could "
            "swap it for their own: set TMPDIR to a directory of yours that no other "
            "user can write (or /tmp, whose sticky bit stops that); nothing was run"
        )
    return str(parent)


def child_env(policy, home, environ=None):
    """The child's environment: the policy's allowlist, nothing like a secret (check_exec_room)."""
    secret = re.compile(policy.env_secret, re.I)
    env = {
        k: v
        for k, v in (os.environ if environ is None else environ).items()
        if (k in policy.env_keep or k.startswith("LC_")) and not secret.search(k)
    }
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update((name, value.format(home=home)) for name, value in policy.env_set)
    check_exec_room(env)
    return env


def check_exec_room(env):
    """One line, before anything runs, for an environment execve would refuse (E2BIG): on Linux
    one "NAME=value" over 128 KiB, or all of them, with the command line, over a quarter of the
    stack limit (at most 6 MiB; fs/exec.c); elsewhere over ARG_MAX."""
    sizes = {k: len(os.fsencode(k)) + 1 + len(os.fsencode(v)) for k, v in env.items()}
    name = max(sizes, key=sizes.get, default=None)
    linux = sys.platform == "linux"
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    if stack == resource.RLIM_INFINITY:
        stack = 24 << 20
    room = max(min(stack // 4, 6 << 20), 128 << 10) if linux else os.sysconf("SC_ARG_MAX")
    # less 16 KiB for the script's command line; each variable takes its NUL and its pointer
    room -= 16 << 10
    used = sum(n + 1 + 8 for n in sizes.values())
    if linux and name and sizes[name] >= 128 << 10:
        why = f"{name} is {sizes[name]:,} bytes, and Linux gives a program no variable over 131,071"
        which = name
    elif used > room:
        why = (
            f"its variables take {used:,} bytes, and a program may be given at most "
            f"{room:,} here (a quarter of `ulimit -s`, on Linux)"
        )
        which = f"the largest, {name},"
    else:
        return
    raise ToolError(
        f"run_python's environment is too large: {why}: unset or shorten {which} in "
        "agent.py's environment; nothing was run"
    )


def send_whole(sock, value, fds):
    """Send `value` as JSON with the descriptors `fds`, in a memfd beside them: a message
    itself is refused over the socket's buffer (208 KiB), and an environment may be larger."""
    data = os.memfd_create("message")
    try:
        with open(data, "wb", closefd=False) as file:
            file.write(json.dumps(value).encode())
        socket.send_fds(sock, [b"json"], [*fds, data])
    finally:
        os.close(data)


def receive_whole(sock, count):
    """What send_whole sent: (the value, its `count` descriptors); (None, []) once closed."""
    message, fds, _, _ = socket.recv_fds(sock, 16, count + 1)
    if not message or len(fds) != count + 1:
        for fd in fds:
            os.close(fd)
        if not message:
            return None, []
        raise OSError(f"a message came with {len(fds)} descriptors, not {count + 1}")
    *fds, data = fds
    with open(data, "rb") as file:  # (one file offset, shared with the sender's copy)
        file.seek(0)
        return json.loads(file.read()), fds


def start_here(code, workdir, box):
    """Without a launcher (not Linux, or it could not start): confined by the same Call.enter."""
    call = Call(box)
    try:
        call.deliver(script_bytes(code))
        if call.uncapped:
            box.cgroup = None  # found out by the self-test: the status line says so
        proc = subprocess.Popen(  # in the workdir pinned at the start (its descriptor)
            call.command(),
            env=child_env(box.policy, call.home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            start_new_session=True,
            preexec_fn=lambda: (os.fchdir(box.pinned), call.enter()),
        )
    except BaseException as e:  # Ctrl-C included: the call's directory must not stay
        call.release()
        if isinstance(e, (OSError, subprocess.SubprocessError)):
            raise ToolError(f"could not start the sandboxed interpreter: {e}")
        raise
    call.close_inherited()
    return Running(proc.stdout.fileno(), proc.stderr.fileno(), proc=proc, call=call)


# In the launcher, for each call: its Child; in the Child, the confinement, the exec, the script.


def launch(box, request, fds):
    """Start the call the agent asked for and send it the read ends of the script's stdout and
    stderr; the Child, or None (the agent was told why)."""
    report = socket.socket(fileno=fds[0])
    try:
        child = Child(box, request, report)
    except Exception as e:
        with contextlib.suppress(OSError):
            report.send(json.dumps({"error": str(e)}).encode())
        report.close()
        return None
    message = {
        # no pid when the script has a PID namespace: it dies with the namespace
        "pid": None if child.call.pidns else child.pid,
        "root": child.call.root,
        "cgroups": child.call.cgroups,
        "uncapped": child.call.uncapped,
    }
    try:
        socket.send_fds(report, [json.dumps(message).encode()], child.pipes)
    except OSError:
        # the agent has closed the call already
        child.kill(report=False)
    finally:
        for fd in child.pipes:
            os.close(fd)
        child.pipes = ()
    return child


class Child:
    """In the launcher: a call's child (Call.run), watched until nothing of its group is left."""

    def __init__(self, box, request, report):
        for name in FOUND_AT_FIRST_CALL:
            setattr(box, name, request[name])
        if box.landlock and not hasattr(box, "handled"):
            box.plan()
        self.call = prepared_call(box, request["parent"]) or Call(box, request["parent"])
        self.report = report
        self.status = None
        self.killed_at = None
        self.tell = True
        self.pipes = ()
        theirs = []
        try:
            self.call.deliver(script_bytes(request["code"]))
            env = child_env(box.policy, self.call.home, request["env"])
            # the child says why it could not start, or how the script ended (init)
            self.messages, messages = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            theirs.append(messages.detach())
            # the script's stdout and stderr, each pipe noted as it is made (EMFILE leaks none)
            for _ in range(2):
                read, write = os.pipe()
                self.pipes += (read,)
                theirs.append(write)
            pid = fork_call(box, self.call)
            if pid == 0:
                self.call.run(*theirs, box.pinned, env, request.get("timeout"))
        except BaseException:
            for fd in (*self.pipes, *theirs):
                os.close(fd)
            self.call.release()
            raise
        for fd in theirs:
            os.close(fd)
        self.call.close_inherited()
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)

    def kill(self, report=True):
        """End the child's group; `report` False: the agent closed the call, or is gone."""
        self.tell = self.tell and report
        # its group while the unreaped child keeps the id from another group; then the child itself
        kill_group(self.pid)
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        self.killed_at = self.killed_at or time.monotonic()

    def over(self):
        """The child reaped and its group gone, or a second since the kill (stuck in the kernel)."""
        if self.status is None:
            return False
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return time.monotonic() - self.killed_at > 1

    def finish(self):
        """Tell the agent how the script ended, once the call's home is gone; then clean up."""
        call = self.call
        os.close(self.pidfd)
        # the call's processes are gone: read what they said, without waiting
        self.messages.setblocking(False)
        error = ""
        timed_out = told = False
        # read until BlockingIOError (no := here: Python 3.7 must parse the file)
        with contextlib.suppress(OSError):
            for message in iter(lambda: self.messages.recv(4096), b""):
                if message == TIMED_OUT:
                    timed_out = True
                elif message.startswith(b"="):
                    # the script's exit code, from the call's first process (init)
                    self.status = int(message[1:].split()[0])
                    told = True
                else:
                    error = message.decode(errors="replace")
        self.messages.close()
        if call.pidns and not (told or error or timed_out) and self.status == 0:
            error = "the sandboxed interpreter ended before the script's end was told"
        if error:
            self.tell_agent({"error": error})
        elif timed_out:
            self.tell_agent({"timed_out": True})
        else:
            self.tell_agent({"status": [self.status, oom_kills(call.cgroups)]})
        self.report.close()
        call.release()

    def tell_if_ended(self):
        """If the call's first process wrote that the script ended and left nothing running, tell
        the agent now, not after its exit (0.8 ms: it holds a copy of the launcher's memory)."""
        with contextlib.suppress(OSError):
            message = self.messages.recv(4096, socket.MSG_PEEK)
            if message.startswith(b"=") and message.endswith(ALONE):
                status = int(message[1:].split()[0])
                self.tell_agent({"status": [status, oom_kills(self.call.cgroups)]})

    def tell_agent(self, message):
        """Send the agent how the call ended, once (never to an agent that closed the call),
        its home gone first, whatever it holds on disk (removed after the report)."""
        if self.tell and self.report:
            with contextlib.suppress(OSError):
                here = self.call.directory
                os.rename("scratch", "scratch.gone", src_dir_fd=here, dst_dir_fd=here)
            with contextlib.suppress(OSError):
                self.report.send(json.dumps(message).encode())
        self.tell = False


def fork_call(box, call):
    """fork, in the launcher, for a call: where the kernel allows (root, or a user namespace), the
    child is pid 1 of its own PID namespace, all of whose processes die with it (killed, or with
    the launcher: PDEATHSIG), even with the agent and launcher killed at once; else a plain fork."""
    if box.pidns:
        flags = CLONE_NEWPID | (CLONE_NEWUSER if os.geteuid() else 0) | signal.SIGCHLD
        nr = SYSCALLS["clone"][ARCHES[platform.machine()][1]]
        # none of the at-fork hooks os.fork runs (threading's, random's, logging's: 0.4 ms a call):
        # they serve other threads (the launcher has none) and modules the call never uses
        pid = box.libc.syscall(ctypes.c_long(nr), ctypes.c_ulong(flags), None, None, None, None)
        error = ctypes.get_errno()
        if pid >= 0:
            call.pidns = True
            return pid
        # EAGAIN, ENOMEM: this call fails, as a fork would; EPERM, EINVAL: plain forks from now (S6)
        if error not in (errno.EPERM, errno.EINVAL):
            raise OSError(error, os.strerror(error))
        box.pidns = False
    return os.fork()


# A call's own paths, in its directory, opened only beneath its descriptor
OWN_PATHS = {"home": "scratch/home", "shm": "scratch/shm", "script": "main.py"}
OWN_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class Call:
    """One run_python call's own things: its directory (the script, read-only to the child, and
    a private home), its cgroup and its Landlock ruleset; the script is delivered at the call."""

    def __init__(self, box, parent=None):
        self.box = box
        self.cgroups = []
        self.ruleset = -1
        self.directory = -1  # the call's directory, opened once it is made: never by name again
        self.namespace = ()  # root's prepared call: its mount namespace, root, workdir
        self.uncapped = False
        self.pidns = False  # its process is the first of a PID namespace of its own (fork_call)
        self.ids = (os.getuid(), os.getgid())
        self.rlimits = box.rlimits  # worked out here, not in the forked child
        # a new directory (0700) made by mkdir, which never reuses a name
        self.root = tempfile.mkdtemp(
            prefix="-".join(["agent-call", *box.tag, ""]), dir=parent or call_parent()
        )
        # from here on, whatever happens (Ctrl-C included), nothing is left behind
        try:
            self.own = {name: os.path.join(self.root, path) for name, path in OWN_PATHS.items()}
            self.script = self.own["script"]
            self.home = self.own["home"]
            # by its descriptor from now on, never its name (a script may move it, leave a link)
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            self.directory = os.open(self.root, flags)
            for path in ("scratch", OWN_PATHS["home"], OWN_PATHS["shm"]):
                os.mkdir(path, 0o700, dir_fd=self.directory)
            self.scratch = os.stat("scratch", dir_fd=self.directory)
            if box.cgroup:
                try:
                    self.cgroups = make_cgroups(box.cgroup, box.policy, box.tag)
                except OSError as e:
                    # a promised cap is kept; one the self-test found missing is on the status line
                    if box.tested:
                        raise ToolError(
                            f"could not make this call's cgroup ({e.strerror}); the "
                            "script was not run without its caps"
                        )
                    self.uncapped = True
            if box.landlock:
                self.ruleset = make_ruleset(box)
                # home and shm, unless a tmpfs goes over them (private_scratch grants its own)
                if not box.mounts:
                    self.add_own_rules(box.policy.own_read_write, READ_WRITE)
        except BaseException:
            self.release()
            raise

    def deliver(self, source):
        """Write the script, at the call, through the directory's descriptor (a name a script
        planted makes this fail, ELOOP, EEXIST, never write elsewhere); then grant it."""
        script = os.open(OWN_PATHS["script"], NEW_FILE, 0o600, dir_fd=self.directory)
        with open(script, "wb") as file:
            file.write(source)
        if self.box.landlock:
            self.add_own_rules(self.box.policy.own_read, {"read_file"})

    def in_place(self, here, scratch):
        """Whether `here` and `scratch`, found by name, are the directory and scratch made for the
        call (a script of another run may have moved them: red team 32.4, 32.7)."""
        made = os.fstat(self.directory), self.scratch
        return all(map(os.path.samestat, (here, scratch), made))

    def add_own_rules(self, names, granted):
        """Grant the call's own paths `names` (of OWN_PATHS), opened beneath its directory's
        descriptor a component at a time, never following a symlink."""
        for name in names:
            opened = []
            try:
                for part in OWN_PATHS[name].split("/"):
                    where = opened[-1] if opened else self.directory
                    opened.append(os.open(part, OWN_PATH_FLAGS, dir_fd=where))
                add_rule(self.box, self.ruleset, opened[-1], granted)
            finally:
                for fd in opened:
                    os.close(fd)

    def command(self):
        """The argv that runs the script: this interpreter, wrapped on macOS."""
        argv = [sys.executable, self.script]
        if not self.box.macos:
            return argv
        # the profile names the call's own paths; they are given here
        own = self.own.items()
        params = [x for n, p in own for x in ("-D", f"OWN_{n.upper()}={os.path.realpath(p)}")]
        return ["/usr/bin/sandbox-exec", "-p", self.box.macos, *params, *argv]

    def run(self, messages, out, err, workdir, env, timeout):
        """In the launcher's fork: go into the pinned workdir, take the call's stdio (fd 3: the
        socket `messages` to the launcher) and a session of its own, confine itself (enter),
        spawn the script and stay as its init. Never returns; an error goes back on fd 3."""
        try:
            # in the user namespace fork_call made: be the same user in it as outside
            if self.pidns and self.ids[0] != 0:
                own_ids(*self.ids)
            # not the launcher's wakeup pipe (its SIGCHLD handler does nothing else; exec resets it)
            signal.set_wakeup_fd(-1)
            null = os.open(os.devnull, os.O_RDONLY)
            for fd, target in ((null, 0), (out, 1), (err, 2), (messages, 3)):
                os.dup2(fd, target)
            # the directory pinned at the start, not what its name is now
            os.fchdir(workdir)
            # nothing else of the launcher's but the ruleset (-1 without Landlock), the call's
            # directory and its namespace
            start = 4
            kept = (self.ruleset, self.directory, *self.namespace)
            for fd in sorted(fd for fd in kept if fd >= start):
                os.closerange(start, fd)
                start = fd + 1
            os.closerange(start, MAX_FD)
            # the group the launcher kills
            os.setsid()
            # over the command line, as setproctitle does: `pkill -STOP -f agent.py` misses the
            # call's first process (before Landlock, which hides /proc/self)
            start, cover = command_line_cover()
            ctypes.memmove(start, cover, len(cover))
            self.enter()
            self.close_inherited()
            # the script's process: posix_spawn copies none of this process's memory, as a fork
            # would (2.1 ms a call); the signals the launcher ignores are default again, as in Popen
            argv = self.command()
            closed = [(os.POSIX_SPAWN_CLOSE, 3)]
            default = (*LAUNCHER_IGNORES, signal.SIGXFSZ)
            script = os.posix_spawn(argv[0], argv, env, file_actions=closed, setsigdef=default)
            init(script, timeout)
        except BaseException as e:
            with contextlib.suppress(BaseException):
                os.write(3, f"could not start the sandboxed interpreter: {e}".encode())
        finally:
            os._exit(127)

    def enter(self):
        """In the child, before exec (the launcher's fork, or Popen's preexec_fn without one): the
        call's cgroup, its mount namespace, rlimits, no capabilities, Landlock and seccomp."""
        box, parent = self.box, os.getppid()
        # on v1 "tasks" moves this one thread without the lock on every thread group "cgroup.procs"
        # takes (7.8 ms against 0.3); and "0", this process (the launcher writing its pid: 20 ms)
        joined = "tasks" if box.cgroup and box.cgroup[0] == "v1" else "cgroup.procs"
        for directory in self.cgroups:
            write_file(os.path.join(directory, joined), "0")
        # out of memory, the kernel kills the script's processes first, never the agent's (a
        # container's limit may be below the call's cap)
        with contextlib.suppress(OSError):
            write_file("/proc/self/oom_score_adj", "1000")
        if self.namespace:
            # its namespace; setns leaves a process outside any chroot: back into the agent's
            syscall(box.libc, "setns", self.namespace[0], CLONE_NEWNS)
            os.fchdir(self.namespace[1])
            os.chroot(".")
            os.fchdir(self.namespace[2])
        elif box.mounts:
            private_scratch(box.libc, self)
        for which, soft, hard in self.rlimits:
            resource.setrlimit(which, (soft, hard))
        if box.landlock:
            drop_capabilities(box.libc, box.bounded)
        # after every change of credentials, which would clear it
        if box.linux:
            box.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent or self.pidns and launcher_gone():
                os._exit(1)
        if box.landlock:
            if box.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
            syscall(box.libc, "landlock_restrict_self", self.ruleset, 0)
            fprog = ctypes.addressof(box.fprog)
            if box.libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fprog, 0, 0):
                raise OSError(ctypes.get_errno(), "seccomp filter failed")

    def close_inherited(self):
        """After the fork: the child has the ruleset and namespace; the maker needs them no more."""
        for fd in (self.ruleset, *self.namespace):
            if fd >= 0:
                os.close(fd)
        self.ruleset = -1
        self.namespace = ()

    def release(self):
        """Remove what the call made (idempotent)."""
        self.close_inherited()
        cleanup(self.root, self.cgroups, self.directory)
        if self.directory >= 0:
            os.close(self.directory)
        self.directory = -1


def make_ruleset(box):
    """A Landlock ruleset with the run's shared grants; each call adds its own directory."""
    fs, net, scope = box.handled
    attr = struct.pack("QQQ", fs, net, scope)[: 8 if box.abi < 4 else 16 if box.abi < 6 else 24]
    buffer = ctypes.create_string_buffer(attr, len(attr))
    fd = syscall(box.libc, "landlock_create_ruleset", buffer, len(attr), 0)
    try:
        for path, names in box.grants:
            add_rule(box, fd, path, names)
    except BaseException:
        os.close(fd)
        raise
    return fd


def add_rule(box, ruleset, path, names):
    """Grant `names` beneath `path` (or on the file), as far as this kernel knows them. A
    descriptor (the pinned workdir) is the rule's parent as it is, never reopened by name."""
    pinned = isinstance(path, int)
    try:
        parent = path if pinned else os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # not on this machine
    try:
        if not stat.S_ISDIR(os.fstat(parent).st_mode):
            names = names & FILE_RIGHTS
        rule = PathBeneath(rights(LANDLOCK_FS, box.abi, names) & box.handled[0], parent)
        syscall(box.libc, "landlock_add_rule", ruleset, 1, ctypes.byref(rule), 0)
    finally:
        if not pinned:
            os.close(parent)


def init(script, timeout):
    """The call's first process: reap what comes to it, tell the launcher (fd 3) the script's exit
    code and end, which ends all left in its PID namespace; it keeps the deadline (LAUNCHER_GRACE
    past the timeout). The script cannot stop or kill a namespace's init from inside."""
    os.dup2(0, 1)
    os.dup2(0, 2)

    def overdue(*_):
        os.write(3, TIMED_OUT)
        os.killpg(0, signal.SIGKILL)

    if timeout is not None:
        signal.signal(signal.SIGALRM, overdue)
        signal.setitimer(signal.ITIMER_REAL, timeout + LAUNCHER_GRACE)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == script:
            code = b"=%d" % os.waitstatus_to_exitcode(status)
            # pid 1 with no child left: nothing runs in the namespace; the launcher may report now
            if os.getpid() == 1 and not children_left():
                os.write(3, code + ALONE)
                os.read(3, 1)
            else:
                os.write(3, code)
            os._exit(0)


def children_left():
    """Reap every child that has ended; True if one still runs."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


TIMED_OUT = b"timed out"
ALONE = b" alone"  # after the script's exit code: nothing of it runs on


@cache
def command_line_cover():
    """Where this process's command line is, and a title of its length to write over it: read
    once, by the launcher, for the forks that write it (the same address in each)."""
    with open("/proc/self/stat", "rb") as file:
        # after the command's name, in parentheses; arg_start and arg_end are fields 48 and 49
        stat_fields = file.read().rpartition(b")")[2].split()
    start, end = int(stat_fields[45]), int(stat_fields[46])
    title = b"run_python call"[: end - start - 1]
    return start, title + bytes(end - start - len(title))


def launcher_gone():
    """In a PID namespace, where the launcher has no pid: has it closed its end of fd 3?"""
    poller = select.poll()
    poller.register(3, select.POLLHUP)
    return any(event & select.POLLHUP for _, event in poller.poll(0))


def make_cgroups(cgroup, policy, tag=()):
    """Make a call's cgroup (one per controller on v1), named at random, with its caps."""
    name = "-".join(["agent", *tag, uuid.uuid4().hex[:16]])
    memory = policy.memory_mb << 20
    caps = {
        "pids.max": policy.max_tasks,
        "memory.max": memory,
        "memory.swap.max": 0,
        "memory.oom.group": 1,  # v2: out of memory, the call's processes go together
        "memory.limit_in_bytes": memory,
        "memory.memsw.limit_in_bytes": memory,
    }  # v1
    made = []
    try:
        for parent in cgroup[1]:
            os.mkdir(os.path.join(parent, name))
            made.append(os.path.join(parent, name))  # only what this call made is removed
            for file, value in caps.items():
                if os.path.exists(os.path.join(made[-1], file)):
                    write_file(os.path.join(made[-1], file), str(value))
    except OSError:
        cleanup(None, made)
        raise
    return made


def private_scratch(libc, call):
    """A mount namespace with a fresh, capped tmpfs holding the home and the shm (seen at /dev/shm),
    freed with the call's last process; made detached (fsmount), granted through its descriptor,
    then attached: a name resolved twice once led the home's rule onto / (red team 32.3)."""
    user = os.geteuid() != 0 and not call.pidns  # (fork_call made one already)
    if libc.unshare(CLONE_NEWNS | (CLONE_NEWUSER if user else 0)) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")
    if user:
        own_ids(*call.ids)
    policy = call.box.policy

    def mount(source, target, kind, flags, data=None):
        if libc.mount(source, target.encode(), kind, flags, data) != 0:
            raise OSError(ctypes.get_errno(), f"mount {target} failed")

    # nothing propagates to the host
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    setup = syscall(libc, "fsopen", b"tmpfs", FSOPEN_CLOEXEC)
    options = {"size": f"{policy.scratch_mb}m", "nr_inodes": "65536", "mode": "0700"}
    for key, value in options.items():
        syscall(libc, "fsconfig", setup, FSCONFIG_SET_STRING, key.encode(), value.encode(), 0)
    syscall(libc, "fsconfig", setup, FSCONFIG_CMD_CREATE, None, None, 0)
    tmpfs = syscall(libc, "fsmount", setup, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID_NODEV)
    # new inodes in the new tmpfs: the parent's ruleset cannot know them
    own = {}
    for name in policy.own_read_write:
        os.mkdir(name, 0o700, dir_fd=tmpfs)
        own[name] = os.open(name, OWN_PATH_FLAGS, dir_fd=tmpfs)
        add_rule(call.box, call.ruleset, own[name], READ_WRITE)
    # the call's directory and scratch as this namespace mounts them (move_mount refuses what was
    # opened before the unshare): found by name once, and refused unless the same (red team 32.7e)
    here = os.open(call.root, OWN_PATH_FLAGS | os.O_DIRECTORY)
    scratch = os.open("scratch", OWN_PATH_FLAGS, dir_fd=here)
    if not call.in_place(os.fstat(here), os.fstat(scratch)):
        raise OSError(errno.ENOENT, "the call's directory or scratch was moved")
    syscall(libc, "move_mount", tmpfs, b"", scratch, b"", MOVE_MOUNT_EMPTY_PATHS)
    if "shm" in policy.own_read_write and policy.shm:
        mount(f"/proc/self/fd/{own['shm']}".encode(), policy.shm, None, MS_BIND)


def make_namespace(box, call):
    """Root's launcher, for the call it prepares: a child makes the call's mount namespace
    (private_scratch) while no call runs and sends it, with the root (a chroot's) and pinned
    workdir in it; the call's process only enters it (0.4 ms, 1% of a call: docs/benchmarks.md)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        pid = os.fork()
        if pid == 0:
            with contextlib.suppress(BaseException):
                # unshare carries this process's root and directory into the namespace
                os.fchdir(box.pinned)
                private_scratch(box.libc, call)
                inside = [os.open(path, os.O_RDONLY) for path in ("/proc/self/ns/mnt", "/", ".")]
                socket.send_fds(theirs, [b"made"], inside)
            os._exit(0)
        theirs.close()
        os.waitpid(pid, 0)
        fds = socket.recv_fds(ours, 16, 3, socket.MSG_CMSG_CLOEXEC)[1]
    if len(fds) == 3:
        return tuple(fds)
    for fd in fds:
        os.close(fd)
    raise OSError("the call's mount namespace could not be made")


def own_ids(uid, gid):
    """In a new user namespace, be who one is outside it: all an unprivileged process may map."""
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", f"{uid} {uid} 1")
    write_file("/proc/self/gid_map", f"{gid} {gid} 1")


def write_file(path, text):
    """Write a kernel file (a cgroup's, /proc/self's) with os calls: in a call's forked child
    each Python object touched costs a copied page (2.5 µs), and pathlib's touch many."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def drop_capabilities(libc, inherited_empty=False):
    """Empty every capability set, the bounding set unless inherited empty: no privilege left."""
    if not inherited_empty:
        drop_bounding_set(libc)
    # the ambient set (CLEAR_ALL), then the other three
    libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)
    syscall(libc, "capset", *CAPSET_NONE)


def drop_bounding_set(libc):
    """Drop every capability from the bounding set; True if none is left. EINVAL past the last
    one; EPERM for a non-root agent, whose child cannot gain any (no_new_privs stops exec)."""
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    return not any(libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1 for cap in range(64))


# While the script runs, and after: its output, the end of its group, what it left.


@dataclass
class Running:
    """The agent's side of one call: the script's stdout and stderr, and the launcher's socket for
    the call (closing it ends the call); without a launcher, the child. `pid` is the script's
    group where the launcher names it (no PID namespace); `made` its directory and cgroups."""

    out: int
    err: int
    report: socket.socket | None = None
    proc: subprocess.Popen | None = None
    call: object = None
    launcher: object = None
    pid: int | None = None
    made: tuple | None = None

    def read_answer(self, box, data=None):
        """The launcher's message: None (the call started), the script's (code, OOM kills), a
        ToolError, "gone" (the launcher was killed) or "timed out" (by the call's init)."""
        data = self.report.recv(65536) if data is None else data
        if not data:
            # the script died with the launcher; its group dies now (a PID namespace went whole)
            if self.pid:
                kill_group(self.pid)
            return "gone"
        message = json.loads(data)
        if "error" in message:
            raise ToolError(message["error"])
        if "status" in message:
            return tuple(message["status"])
        if "timed_out" in message:
            return "timed out"
        self.pid = message["pid"]
        self.made = (message["root"], message["cgroups"])
        self.launcher.note(*self.made)
        if message["uncapped"]:
            box.cgroup = None
        return None

    def end(self, status):
        """Close the launcher's socket (it ends the group, removes the call's things) and the
        pipes; without a launcher, do that here."""
        if not self.report:
            kill_group(self.proc.pid)
            self.proc.stdout.close()
            self.proc.stderr.close()
            # what it killed leaves the cgroups a moment later
            threading.Thread(target=self.remove_later, daemon=True).start()
            return
        # timed out, cancelled or failed: the launcher ends the group and says when it is gone
        if status in (None, "timed out"):
            with contextlib.suppress(OSError):
                self.report.shutdown(socket.SHUT_WR)
                self.report.settimeout(1)
                while self.report.recv(65536):
                    pass
        self.report.close()
        os.close(self.out)
        os.close(self.err)
        # the launcher was killed: this call's things are the agent's to remove, and what it noted
        if status == "gone":
            if self.made:
                cleanup_later(*self.made)
            self.launcher.gone()

    def remove_later(self):
        self.proc.wait()
        # its cgroups once they are empty, then the rest through the directory's descriptor
        cleanup_later(None, self.call.cgroups)
        self.call.release()


def reap(children):
    """Reap every child that has ended: a call's child (its group killed first, while the child
    still holds the group's id) and the orphans that came here."""
    while True:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if ended is None:
            return
        child = children.get(ended.si_pid)
        if child and child.killed_at is None:
            child.kill()
        code = os.waitpid(ended.si_pid, 0)[1]
        if child:
            child.status = os.waitstatus_to_exitcode(code)


class Clip:
    """Keeps the first and last `half` bytes of a stream and counts what falls between."""

    def __init__(self, half):
        self.half = half
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data):
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        del self.tail[: max(0, len(self.tail) - self.half)]

    def text(self):
        cut = self.total - len(self.head) - len(self.tail)
        head, tail = self.head.decode("utf-8", "replace"), self.tail.decode("utf-8", "replace")
        if cut:  # a secret cut in two here would be found whole in neither part: cut it out
            start, end = secret_start(head, least=8), secret_start(tail[::-1], least=8, ends=True)
            head = head[: len(head) - start]
            tail = tail[end:]
            cut = cut + start + end
        return head + (f"\n[... {cut} bytes cut ...]\n" if cut else "") + tail


def kill_group(pid):
    """SIGKILL a process group; it may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def oom_kills(cgroups):
    """How many of the call's processes the kernel killed over its memory cap, read with os calls
    (pathlib's took 0.3 ms) from the memory controller's directory, the last (cgroup_parents)."""
    for name in ("memory.events", "memory.oom_control") if cgroups else ():  # v2, v1
        try:
            fd = os.open(os.path.join(cgroups[-1], name), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            text = os.read(fd, 4096)
        finally:
            os.close(fd)
        for line in text.splitlines():
            if line.startswith(b"oom_kill "):
                return int(line.split()[1])
    return 0


def cleanup(root, cgroups, opened=-1):
    """Remove a call's directory (through `opened`, its descriptor, if it has one) and cgroups;
    already gone is fine, and so is failing."""
    # the cgroups first: they cannot fail on what the directory holds
    for directory in cgroups:
        with contextlib.suppress(OSError):
            os.rmdir(directory)
    if root:
        remove_tree(root, opened)


def cleanup_later(root, cgroups):
    """cleanup, until the cgroups are empty enough to go (a launcher killed mid-call)."""
    for _ in range(50):
        cleanup(root, cgroups)
        if not any(os.path.exists(d) for d in cgroups):
            return
        time.sleep(0.1)


def remove_tree(root, opened=-1):
    """Remove a directory tree however a script shaped it (any depth, name length, permission):
    each subdirectory is moved up to the top before it is emptied, so the walk is one level deep
    and follows no symlink. Through `opened`, its descriptor, if given (`root` may be a symlink)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        top = os.dup(opened) if opened >= 0 else os.open(root, flags)
    except OSError:
        return
    queue, moved = [None], count()
    while queue:
        name = queue.pop()
        try:
            fd = os.dup(top) if name is None else os.open(name, flags, dir_fd=top)
        except OSError:
            continue
        # as any failure here: what cannot be removed stays
        with contextlib.suppress(OSError):
            for entry in list(os.scandir(fd)):
                with contextlib.suppress(OSError):
                    if not entry.is_dir(follow_symlinks=False):
                        os.unlink(entry.name, dir_fd=fd)
                        continue
                    # 0700 (a script may have taken r, w or x away), through an O_PATH descriptor
                    # seen to be a directory: a link swapped in since the listing takes no chmod
                    node = os.open(entry.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    try:
                        if not stat.S_ISDIR(os.fstat(node).st_mode):
                            os.unlink(entry.name, dir_fd=fd)
                            continue
                        with contextlib.suppress(OSError):
                            os.chmod(f"/proc/self/fd/{node}", 0o700)
                    finally:
                        os.close(node)
                    flat = f".gone-{next(moved)}"
                    os.rename(entry.name, flat, src_dir_fd=fd, dst_dir_fd=top)
                    queue.append(flat)
        os.close(fd)
        if name is not None:
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=top)
    os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(root)


class Sandbox:
    """run_python's boundary for one run, set up at the first call: the plan (which mechanisms this
    machine has), the launcher, and the self-test that proves it before anyone relies on it."""

    def __init__(self, workdir, enabled, limits, report=None, pinned=None):
        self.workdir = workdir
        self.limits = limits
        self.report = report or (lambda line: None)
        # The workdir as opened at the run's start, whatever its name names later (a user who can
        # rename it may swap in a symlink to /): every call's cwd. `workdir`: its name.
        flags = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
        self.pinned = os.open(workdir, flags) if pinned is None else pinned
        self.tag = []  # in a launcher, its run's tag, in every name it makes (Launcher.gone)
        self.prepared = None  # in a launcher: the next call, made while none runs (serve)
        self.mountinfo = None  # in a launcher: /proc/self/mountinfo, watched (mounts_changed)
        self.bounded = False  # in a launcher: its capability bounding set is empty (serve)
        self.shown = None  # a mount at or below the workdir that shows the temp directory
        self.unpin = weakref.finalize(self, os.close, self.pinned)
        self.linux = sys.platform == "linux"  # elsewhere the agent kills the group itself
        self.libc = libc_call() if self.linux else None
        self.landlock = False  # Landlock, seccomp and no capabilities for every call
        self.mounts = self.linux and enabled  # own tmpfs and /dev/shm, unless the kernel refuses
        self.pidns = self.linux  # a PID namespace for each call, unless the kernel refuses
        self.cgroup = cgroup_parents() if self.linux else None
        self.tested = not enabled  # the self-test has run (with --no-sandbox there is none)
        self.confined = False  # every call runs inside the boundary: the self-test proved it
        self.status = "sandbox: off (--no-sandbox); run_python runs unconfined"
        self.said = False
        self.lock = threading.Lock()
        self.macos = self.launcher = None
        self.no_launcher = ""
        self.starting = threading.Lock()
        self.why = None  # why there is no sandbox, once unavailable() said so

    @cached_property
    def policy(self):
        return sandbox_policy(self.workdir, self.limits)

    @cached_property
    def rlimits(self):
        return [lowered(*limit) for limit in self.policy.rlimits]

    def plan(self):
        """Find which mechanisms this machine has and build the policy; the self-test proves it."""
        system, machine = platform.system(), platform.machine()
        if system == "Darwin" and os.path.exists("/usr/bin/sandbox-exec"):
            self.macos = macos_profile(self.policy)
            self.kind = "sandbox-exec (deny by default, no network)"
            return
        if system != "Linux" or machine not in ARCHES:
            return self.unavailable(f"no sandbox for {system} {machine}")
        self.abi, why = landlock_abi(self.libc)
        if self.abi < 4:
            return self.unavailable(why or f"Landlock ABI {self.abi} cannot block TCP (needs 4)")
        policy = self.policy
        self.handled = (
            rights(LANDLOCK_FS, self.abi),
            rights(LANDLOCK_NET, self.abi, policy.network),
            rights(LANDLOCK_SCOPE, self.abi, policy.scopes),
        )
        named_unix = rights(LANDLOCK_FS, self.abi, {"resolve_unix"})
        bpf = seccomp_filter(machine, policy.syscalls + (() if named_unix else policy.unix_sockets))
        self.program = ctypes.create_string_buffer(bpf, len(bpf))
        self.fprog = SockFprog(len(bpf) // 8, ctypes.addressof(self.program))
        # the workdir by its descriptor
        writable = [self.pinned if d == str(self.workdir) else d for d in policy.read_write]
        self.grants = (
            [(p, READ_EXEC) for p in policy.read_exec]
            + [(f, {"read_file"}) for f in policy.read_files]
            + [(f, {"read_file", "write_file", "truncate"}) for f in policy.write_files]
            + [(d, READ_WRITE) for d in writable]
        )
        parts = ["fs"] + ["tcp"] * bool(self.handled[1]) + ["scope"] * bool(self.handled[2])
        self.kind = f"landlock ABI {self.abi} ({', '.join(parts)}) + seccomp, no capabilities"
        self.landlock = True

    def unavailable(self, why):
        """No working boundary: say so; run_python then asks before every call, even with --yes."""
        self.landlock = self.mounts = self.confined = False
        self.macos = None
        self.tested, self.why = True, why
        self.status = (
            f"sandbox: unavailable ({why}); run_python will ask before every call, even with "
            "--yes, and a y runs it unconfined (--no-sandbox runs it unasked)"
        )

    def launched(self):
        """The run's launcher, started at the first call; None without one (not Linux, or it
        could not start: `no_launcher` says why, and the agent starts each call itself)."""
        with self.starting:
            if self.no_launcher == "closed":
                raise ToolError("this run's sandbox is closed; nothing was run")
            if self.launcher is None and self.linux and not self.no_launcher:
                try:
                    self.launcher = Launcher(self)
                except OSError as e:
                    self.no_launcher = str(e)
            return self.launcher

    def ready(self):
        """Prove the boundary at the first run_python call and say once what guards it."""
        with self.lock:
            if not self.tested:
                try:
                    self.plan()  # the first run_python call pays for this, not the run's start
                except OSError as e:
                    self.unavailable(f"cannot build the policy: {e}")
            if not self.tested and self.linux and not self.launched():
                self.unavailable(f"its launcher could not start: {self.no_launcher}")
            if not self.tested:
                failure = self.self_test()
                if failure and self.mounts:  # no mount namespace here: /dev/shm stays shut
                    self.mounts = False
                    failure = self.self_test()
                if failure:
                    self.unavailable(failure)
                else:
                    self.tested, self.confined = True, True
                    # there a script could run its code in other runs' calls (red team 32.6)
                    with contextlib.suppress(ToolError, OSError):
                        self.shown = shown_below(self.workdir, call_parent())
                    self.status = f"sandbox: {self.kind}; {self.extras()}"
            if not self.said:
                self.said = True
                if self.status.startswith("sandbox: off") and self.linux and not self.launched():
                    self.status += f"; no launcher ({self.no_launcher}): agent.py starts each call"
                self.report(self.status)
        return self.confined

    def extras(self):
        """What the cgroup and the mount namespace add, or what stays open without them."""
        p = self.policy
        caps = "no cgroup: tasks uncapped, memory capped per process"
        if self.cgroup:
            caps = (
                f"cgroup {self.cgroup[0]} caps a call at {p.max_tasks} tasks and {p.memory_mb} MiB"
            )
        scratch = "home on disk, /dev/shm not writable"
        if self.mounts:
            scratch = f"home and /dev/shm a private {p.scratch_mb} MiB tmpfs"
        return f"{caps}; {scratch}"

    def self_test(self):
        """Run one sandboxed probe that every way out must refuse; '' when it was refused."""
        with tempfile.TemporaryDirectory(prefix="agent-canary-") as elsewhere:
            canary = os.path.join(elsewhere, "canary.txt")
            if Path(os.path.realpath(canary)).is_relative_to(self.workdir):
                return "the canary cannot be placed outside the workdir"
            Path(canary).write_text("canary")
            column = ARCHES.get(platform.machine(), (0, 0))[1]
            code = SELF_TEST.format(
                canary=canary,
                agent=os.getpid(),
                linux=self.linux,
                launcher=self.launcher.pid if self.launcher else os.getpid(),
                prlimit=SYSCALLS["prlimit64"][column],
                capget=SYSCALLS["capget"][column],
            )
            try:
                run = execute(code, self.workdir, self, 20, 2000)
            except ToolError as e:
                return f"self-test could not start: {e}"
        out = run.stdout.strip()
        if out.startswith("LEAK: "):
            return f"self-test could {out[6:]}"
        if out != "OK":
            return f"self-test failed: {(run.stderr.strip() or out)[-200:]}"
        return ""

    def close(self):
        """End the launcher (it kills what is left of any call and removes what it made)."""
        with self.starting:
            if self.launcher:
                self.launcher.close()
            self.launcher, self.no_launcher = None, "closed"
            self.unpin()
            if self.mountinfo is not None:
                os.close(self.mountinfo)
                self.mountinfo = None


SELF_TEST = """import contextlib, ctypes, os
libc, leaks = ctypes.CDLL(None, use_errno=True), []
with contextlib.suppress(PermissionError):
    open({canary!r}).read()
    leaks.append("read a file outside the workdir")
for name, pid in (("the agent", {agent}), ("its launcher", {launcher})):
    # refused, or not in this PID namespace
    with contextlib.suppress(PermissionError, ProcessLookupError):
        os.kill(pid, 0)
        leaks.append("signal " + name)
if {linux}:
    long = ctypes.c_long
    for name, pid in (("the agent", {agent}), ("its launcher", {launcher})):
        if libc.syscall(long({prlimit}), long(pid), long(0), None, (ctypes.c_uint64 * 2)()) == 0:
            leaks.append("reach the limits of " + name)
    caps = (ctypes.c_uint32 * 6)()
    libc.syscall(long({capget}), (ctypes.c_uint32 * 2)(0x20080522, 0), caps)
    admin = libc.prctl(23, ctypes.c_ulong(21), 0, 0, 0)  # CAP_SYS_ADMIN in the bounding set?
    if any(caps) or (os.geteuid() == 0 and admin == 1):
        leaks.append("hold a capability")
print("LEAK: " + ", ".join(leaks) if leaks else "OK")
"""


class Launcher:
    """The agent's end of the run's launcher: a fresh interpreter (not a fork of the agent, big
    and threaded) running serve() on this file's source; it goes when this end closes."""

    def __init__(self, box):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.fileno()
        argv = [sys.executable, "-I", "-S", "-B", "-c", LAUNCHER_BOOT, AGENT_FILE, str(fd)]
        # nothing of the agent's environment; a session a kill of the agent's group misses
        options = {"env": {}, "cwd": "/", "start_new_session": True, "pass_fds": [fd]}
        try:
            pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.DEVNULL}
            self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, **pipes, **options)
            # (if it ended, it says why on stderr)
            with contextlib.suppress(OSError), self.proc.stdin:
                self.proc.stdin.write(AGENT_SOURCE)
        finally:
            theirs.close()
        self.control = ours
        self.pid = self.proc.pid
        self.made = []
        # every name the launcher makes carries this tag: gone() finds what it had not noted
        self.tag = os.urandom(6).hex()
        self.where = [call_parent(), *(box.cgroup[1] if box.cgroup else [])]
        policy = asdict(box.policy)
        policy["env_keep"] = sorted(policy["env_keep"])
        config = {"workdir": str(box.workdir), "tag": self.tag, "policy": policy}
        answer, why = b"", ""
        try:
            send_whole(ours, config, [box.pinned])
            ours.settimeout(60)
            answer = ours.recv(4096)
            ours.settimeout(None)
        except OSError as e:
            why = str(e)
        self.ended = weakref.finalize(self, end_launcher, ours, self.proc)  # a Sandbox dropped
        if answer != b"ready":  # what it said, or its last line on stderr
            self.close()
            text = (answer or self.proc.stderr.read()).decode(errors="replace").strip()
            self.proc.stderr.close()
            why = why or f"it exited {self.proc.returncode}"
            raise OSError((text.splitlines() or [why])[-1])
        self.proc.stderr.close()

    def close(self):
        """Close the agent's end: the launcher ends every call and removes what it made."""
        self.ended.detach()
        self.control.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.returncode:  # killed: what it made is the agent's to remove
            self.gone()

    def note(self, root, cgroups):
        """What the launcher made for a call: the last few, to remove should it be killed."""
        self.made = self.made[-15:] + [(root, cgroups)]

    def gone(self):
        """The launcher was killed: remove what it had made (what it removed already is gone)."""
        made, self.made = self.made, []
        for root, cgroups in made:
            cleanup_later(root, cgroups)
        for parent in self.where:  # what it was making when it was killed, not yet noted
            with contextlib.suppress(OSError):
                for name in os.listdir(parent):
                    path = os.path.join(parent, name)
                    if name.startswith(f"agent-call-{self.tag}-"):
                        cleanup_later(path, [])
                    elif name.startswith(f"agent-{self.tag}-"):
                        cleanup_later(None, [path])


def end_launcher(control, proc):
    """A launcher whose Sandbox was dropped: close its socket (it ends), reap it meanwhile."""
    control.close()
    threading.Thread(target=proc.wait, daemon=True).start()


AGENT_FILE = os.path.abspath(__file__)
# The launcher runs the source this agent runs, on its stdin: not agent.py as it is on disk later,
# nor a bytecode cache a script could have written there (red-team S3); it reads no file.
AGENT_SOURCE = globals().get("AGENT_SOURCE") or Path(AGENT_FILE).read_bytes()
LAUNCHER_BOOT = (
    "import sys, types\n"
    "agent = sys.modules['agent_launcher'] = types.ModuleType('agent_launcher')\n"
    "agent.__file__, agent.AGENT_SOURCE = sys.argv[1], sys.stdin.buffer.read()\n"
    "exec(compile(agent.AGENT_SOURCE, sys.argv[1], 'exec'), agent.__dict__)\n"
    "agent.serve(int(sys.argv[2]))\n"
)
LAUNCHER_IGNORES = (signal.SIGPIPE, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def serve(fd):
    """The launcher's loop, single-threaded: start each call (launch); watch its child's pidfd, its
    socket (closed: end the call) and the agent's (closed: gone); end, reap, report, clean up."""
    control = socket.socket(fileno=fd)
    # `pkill -f agent.py` or Ctrl-C hit the launcher too: it goes with the agent, ending every call
    for sig in LAUNCHER_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    wake, woken = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(woken)  # a child's end wakes the loop: reap it
    signal.signal(signal.SIGCHLD, lambda *_: None)
    try:
        config, fds = receive_whole(control, 1)
        os.set_inheritable(fds[0], False)
        box = Sandbox(Path(config["workdir"]), True, Limits(), pinned=fds[0])
        box.tag = [config["tag"]]
        policy = {k: tupled(v) for k, v in config["policy"].items()}
        box.policy = SandboxPolicy(**{**policy, "env_keep": frozenset(policy["env_keep"])})
        # Linux 5.3, or no launcher
        os.close(os.pidfd_open(os.getpid()))
        # orphans come here
        if box.libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_CHILD_SUBREAPER failed")
        # read before any fork: each call's process only writes it
        command_line_cover()
        box.mountinfo = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        # what compiling this file left, 28 MB to 13: each call's fork copies less
        with contextlib.suppress(AttributeError):
            box.libc.malloc_trim(0)
    except Exception as e:
        control.send(f"{type(e).__name__}: {e}".encode())
        return
    control.send(b"ready")
    poller = select.poll()
    children, by_fd = {}, {}
    # first: a mount changed is handled before a request that comes in the same wakeup
    poller.register(box.mountinfo, select.POLLPRI)
    poller.register(control, select.POLLIN)
    poller.register(wake, select.POLLIN)
    try:
        while True:
            killing = 50 if any(c.killed_at for c in children.values()) else None
            for fd, _ in poller.poll(killing):
                if fd == control.fileno():
                    message, fds = receive_whole(control, 1)
                    if message is None:
                        return shut_down(children, box)
                    # confined: the bounding set dropped here, each call inherits it (0.1 ms)
                    confined = message["tested"] and message["landlock"]
                    if confined and not box.bounded and os.geteuid() == 0:
                        box.bounded = drop_bounding_set(box.libc)
                    child = launch(box, message, fds)
                    if child:
                        children[child.pid] = child
                        # its end, the agent's end of the call, what its first process writes
                        for fd in (child.pidfd, child.report.fileno(), child.messages.fileno()):
                            by_fd[fd] = child
                            poller.register(fd, select.POLLIN)
                elif fd == wake:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake, 4096):
                            pass
                elif fd == box.mountinfo and box.prepared and box.prepared[1].namespace:
                    # a namespace made ahead would keep alive what the host unmounts (red team 32.7)
                    release_prepared(box)
                elif fd in by_fd:
                    # its first process wrote or ended, or the agent ended the call: end the group
                    child = by_fd.pop(fd)
                    poller.unregister(fd)
                    if fd == child.messages.fileno():
                        child.tell_if_ended()
                    child.kill()
            reap(children)
            for child in [c for c in children.values() if c.killed_at and c.over()]:
                del children[child.pid]
                for fd in [fd for fd, c in by_fd.items() if c is child]:
                    del by_fd[fd]
                    poller.unregister(fd)
                child.finish()
                # the next call's directory, cgroups and ruleset, while the model thinks
                if not children and box.prepared is None:
                    box.prepared = prepare_next_call(box, os.path.dirname(child.call.root))
    # a bug here must not leave a call running or its things behind
    except BaseException:
        shut_down(children, box)
        raise


def prepare_next_call(box, parent):
    """The next call's directory, cgroups, ruleset and (root's) mount namespace, made while none
    runs (docs/benchmarks.md); None if that failed or made no cgroup (red team 32.5)."""
    call = None
    try:
        # before the ruleset and namespace: a file replaced or a mount changed meanwhile shows
        mounts_changed(box)
        made_for = prepared_for(box, parent)
        call = Call(box, parent)
        if call.uncapped:
            raise OSError("no cgroup")
        if box.mounts and os.geteuid() == 0:
            call.namespace = make_namespace(box, call)
        return made_for, call
    except (OSError, ToolError):
        if call:
            call.release()
        return None


def prepared_call(box, parent):
    """The prepared call, if made for the box as it is and still in place; else None (released)."""
    prepared, box.prepared = box.prepared, None
    if not prepared:
        return None
    made_for, call = prepared
    with contextlib.suppress(OSError):
        here = os.lstat(call.root)
        scratch = os.stat("scratch", dir_fd=call.directory, follow_symlinks=False)
        # root's namespace made ahead: no mount changed since (32.7b)
        stale = call.namespace and mounts_changed(box)
        fits = made_for == prepared_for(box, parent) and not stale
        if fits and call.in_place(here, scratch):
            return call
    call.release()
    return None


def release_prepared(box):
    """Remove the prepared call, which no call will take (a mount changed, or the agent is gone)."""
    if box.prepared:
        box.prepared[1].release()
    box.prepared = None


def tupled(value):
    return tuple(map(tupled, value)) if isinstance(value, list) else value


# seconds past a call's timeout before its first process ends it, should the agent or launcher not
LAUNCHER_GRACE = 2.0


def prepared_for(box, parent):
    """What a prepared call was made for: its parent, the box's cgroup parents, Landlock, mounts
    and which file each grant names (a ruleset holds files as they were: one replaced since, as
    ldconfig renames /etc/ld.so.cache, would be denied)."""
    files = []
    for path, _ in box.grants if box.landlock else ():
        try:
            there = os.stat(path)  # (the pinned workdir, a descriptor: its fstat)
            files.append((there.st_dev, there.st_ino))
        except OSError:
            files.append(None)
    return parent, box.cgroup, box.landlock, box.mounts, files


def mounts_changed(box):
    """Whether a mount changed since the last look: POLLPRI on mountinfo counts every change, even
    one undone or one whose line reads as before (proc(5)). Root's namespace made ahead is a copy
    of the mounts as they were (make_namespace); serve shares the descriptor."""
    if box.mountinfo is None:
        box.mountinfo = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
    poller = select.poll()
    poller.register(box.mountinfo, select.POLLPRI)
    return bool(poller.poll(0))


def shut_down(children, box):
    """The agent is gone: end every call's group, reap, remove every call's things."""
    release_prepared(box)
    for child in children.values():
        child.kill(report=False)
    deadline = time.monotonic() + 2
    while children and time.monotonic() < deadline:
        reap(children)
        for child in [c for c in children.values() if c.over()]:
            del children[child.pid]
            child.finish()
        time.sleep(0.01)
    for child in children.values():
        child.call.release()


def macos_profile(policy):
    """The sandbox-exec profile, built from the policy as the Landlock ruleset is: deny by
    default, then each field's paths (realpaths: /tmp is /private/tmp there). The call's own
    paths are parameters, OWN_HOME, OWN_SHM and OWN_SCRIPT, given for each call (Call.command)."""

    def allow(operations, paths, own=(), kind="literal"):
        # a tree is a subpath, a file a literal; what is not here is left out
        rules = []
        for path in filter(os.path.exists, paths):
            escaped = os.path.realpath(path).replace("\\", "\\\\").replace('"', '\\"')
            rules.append(f'({"subpath" if os.path.isdir(path) else "literal"} "{escaped}")')
        rules += [f'({kind} (param "OWN_{name.upper()}"))' for name in own]
        return [f"(allow {operations}\n  " + "\n  ".join(rules) + ")"] if rules else []

    scoped = " (target same-sandbox)" if "signal" in policy.scopes else ""
    ipc = " ipc-posix-sem ipc-posix-shm" if "shm" in policy.own_read_write else ""
    writable = policy.write_files + policy.read_write
    lines = [
        "(version 1)\n(deny default)\n(allow process-fork process-exec)",
        f"(allow signal{scoped})",
        f"(allow file-read-metadata sysctl-read{ipc})",
        *([] if policy.network else ["(allow network*)"]),
        *allow("file-read* file-map-executable", policy.read_exec),
        *allow("file-read*", policy.read_files, policy.own_read),
        *allow("file-read* file-write*", writable, policy.own_read_write, "subpath"),
    ]
    return "\n".join(lines) + "\n"


def lowered(name, soft, hard):
    """(which, soft, hard) of RLIMIT_`name`, never above the agent's: raising one is privileged."""
    which = getattr(resource, name)
    current = resource.getrlimit(which)[1]
    hard = hard if current == resource.RLIM_INFINITY else min(hard, current)
    return which, min(soft, hard), hard


def landlock_abi(libc):
    """The kernel's Landlock ABI version, or a reason it has none."""
    try:
        return syscall(libc, "landlock_create_ruleset", None, 0, 1), ""
    except OSError as e:
        return 0, {
            38: "the kernel has no Landlock",
            95: "Landlock is disabled at boot",
            1: "Landlock is blocked (container seccomp profile?)",
        }.get(e.errno, e.strerror)


def python_paths(macos=False):
    """The running interpreter's own files: stdlib and site-packages dirs, binary, libraries;
    on macOS its whole prefixes (no /proc to list the libraries it loaded)."""
    dirs = [sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    dirs += site.getsitepackages() + ([sys.prefix, sys.base_prefix] if macos else [])
    dirs = {os.path.realpath(d) for d in dirs if d and os.path.isdir(d)}
    # and the venv's pyvenv.cfg, by its unresolved path
    venv_cfg = str(Path(sys.executable).parent.parent / "pyvenv.cfg")
    files = {os.path.realpath(sys.executable), *filter(os.path.isfile, [venv_cfg])}
    if not macos:
        with open("/proc/self/maps") as maps:  # shared libraries this interpreter has loaded
            paths = (line.split(maxsplit=5)[-1].strip() for line in maps)
            files.update(p for p in paths if ".so" in os.path.basename(p) and os.path.isfile(p))
    inside = tuple(d + "/" for d in (*dirs, *(MACOS_DIRS if macos else SYSTEM_DIRS)))
    return sorted(dirs), sorted(f for f in files if not f.startswith(inside))


def cgroup_parents():
    """Where the agent may make a cgroup that caps tasks and memory: ("v1"|"v2", dirs) or None."""
    try:
        where = {}
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(","):
                where[name] = path.rstrip("/")
        # memory last: oom_kills reads the last directory
        v1 = [f"/sys/fs/cgroup/{c}{where[c]}" for c in ("pids", "memory") if c in where]
        if len(v1) == 2 and all(os.access(d, os.W_OK) for d in v1):
            return "v1", v1
        v2 = f"/sys/fs/cgroup{where.get('', '/-')}"  # "0::/path" on a unified hierarchy
        delegated = set(Path(v2, "cgroup.subtree_control").read_text().split())
    except OSError:
        return None
    return ("v2", [v2]) if {"pids", "memory"} <= delegated and os.access(v2, os.W_OK) else None


def seccomp_filter(machine, rules):
    """Seccomp rules as a BPF program: foreign arches are killed, unknown numbers get ENOSYS."""
    arch, column = ARCHES[machine]
    # the arch (at offset 4) or death; then the number (at 0): ENOSYS above the table's, x32's too
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, SECCOMP_KILL)]
    prog += [(LD, 0, 0, 0), (JGT, 0, 1, LAST_SYSCALL), (RET, 0, 0, SECCOMP_ERRNO | ENOSYS)]
    # each syscall's rules in the table's order: the first whose test holds answers
    bodies = {}
    for names, test, err, _why in rules:
        body = [(RET, 0, 0, SECCOMP_ERRNO | err)]
        if test is not None:
            arg, mask, op, value = test
            jump = {"&": (JSET, 0, 1, mask), "==": (JEQ, 0, 1, value), "!=": (JEQ, 1, 0, value)}
            masked = [] if op == "&" or mask == ALL else [(AND, 0, 0, mask)]
            # seccomp_data.args[arg], low word (little-endian); then the number, for the next rule
            body = [(LD, 0, 0, 16 + 8 * arg), *masked, jump[op], *body, (LD, 0, 0, 0)]
        for name in names.split():
            if SYSCALLS[name][column] is not None:
                bodies.setdefault(SYSCALLS[name][column], []).extend(body)
    prog += search_tree(sorted(bodies.items()))
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def search_tree(numbers):
    """BPF for a binary search over [(syscall number, its rules)], up to eight to a leaf, then
    ALLOW. The kernel runs a filter for every number as it loads it: 18 steps a number where a
    list of every rule took 140, loaded in 190 µs, not 330 (docs/benchmarks.md)."""
    if len(numbers) <= 8:
        # each rule returns right after its test: no long jumps
        leaf = [ins for nr, body in numbers for ins in [(JEQ, 0, len(body), nr), *body]]
        return [*leaf, (RET, 0, 0, SECCOMP_ALLOW)]
    middle = len(numbers) // 2
    low, high = search_tree(numbers[:middle]), search_tree(numbers[middle:])
    # at or above the middle number: jump over the lower half (JA's offset has 32 bits)
    return [(JGE, 0, 1, numbers[middle][0]), (JA, 0, 0, len(low)), *low, *high]


# The tables the policy and the mechanism are made of: data, one line per right or rule.
def landlock_table(text):
    """Words "name:abi", each right's bit its place: {name: (bit, the ABI that introduced it)}."""
    pairs = (word.split(":") for word in text.split())
    return {name: (bit, int(abi)) for bit, (name, abi) in enumerate(pairs)}


# Landlock rights in the order of their bits (include/uapi/linux/landlock.h). refer: link or rename
# across directories; ioctl_dev: on device files; resolve_unix: connect to a named unix socket
# (docker.sock, D-Bus). The ruleset handles every right the kernel knows: none granted is denied.
LANDLOCK_FS = landlock_table(
    "execute:1 write_file:1 read_file:1 read_dir:1 remove_dir:1 remove_file:1 make_char:1 "
    "make_dir:1 make_reg:1 make_sock:1 make_fifo:1 make_block:1 make_sym:1 refer:2 truncate:3 "
    "ioctl_dev:5 resolve_unix:9"
)
# handled with no port granted: no TCP, no UDP
LANDLOCK_NET = landlock_table("bind_tcp:4 connect_tcp:4 bind_udp:10 connect_send_udp:10")
# no signal and no abstract unix socket beyond the call's own processes
LANDLOCK_SCOPE = landlock_table("abstract_unix_socket:6 signal:6")
# all a rule on a file (not a directory) takes
FILE_RIGHTS = {"execute", "write_file", "read_file", "truncate", "ioctl_dev"}
READ_EXEC = {"execute", "read_file", "read_dir"}
# everything but devices
READ_WRITE = set(LANDLOCK_FS) - {"make_char", "make_block", "ioctl_dev"}


# What the child may read and execute besides the Python it runs (found at startup): programs a
# script may start and the libraries they load; of /etc only the files below; never /proc or $HOME.
SYSTEM_DIRS = tuple("/usr/bin /bin /usr/lib /usr/lib64 /lib /lib64 /usr/share/zoneinfo".split())
SYSTEM_FILES = tuple(
    "/etc/ld.so.cache /etc/localtime /etc/mime.types /etc/hosts /etc/host.conf "
    "/etc/nsswitch.conf /etc/gai.conf /dev/urandom /dev/random /dev/zero".split()
)
# the same, on macOS
MACOS_DIRS = ("/usr/lib", "/usr/share", "/usr/bin", "/bin", "/System", "/Library/Apple")
MACOS_FILES = ("/private/etc/localtime", "/dev/urandom", "/dev/random")


# Syscall numbers: name, x86_64, aarch64 ("-" where the architecture has no such call); from
# arch/x86/entry/syscalls/syscall_64.tbl and include/uapi/asm-generic/unistd.h, Linux 6.18.
SYSCALLS_TABLE = """
ioctl 16 29, shmget 29 194, shmat 30 196, shmctl 31 195, socket 41 198, clone 56 220
semget 64 190, semop 65 193, semctl 66 191, shmdt 67 197, msgget 68 186, msgsnd 69 189
msgrcv 70 188, msgctl 71 187, chmod 90 -, fchmod 91 52, chown 92 -, fchown 93 55, lchown 94 -
ptrace 101 117, syslog 103 116, setpgid 109 154, setsid 112 157, capget 125 90, capset 126 91
utime 132 -, mknod 133 -, uselib 134 -, ustat 136 -, sysfs 139 -, setpriority 141 140
sched_setparam 142 118, sched_setscheduler 144 119, vhangup 153 58, modify_ldt 154 -
pivot_root 155 41, _sysctl 156 -, adjtimex 159 171, chroot 161 51, acct 163 89
settimeofday 164 170, mount 165 40, umount2 166 39, swapon 167 224, swapoff 168 225
reboot 169 142, sethostname 170 161, setdomainname 171 162, iopl 172 -, ioperm 173 -
create_module 174 -, init_module 175 105, delete_module 176 106, get_kernel_syms 177 -
query_module 178 -, quotactl 179 60, nfsservctl 180 42, setxattr 188 5, lsetxattr 189 6
fsetxattr 190 7, removexattr 197 14, lremovexattr 198 15, fremovexattr 199 16
sched_setaffinity 203 122, lookup_dcookie 212 18, clock_settime 227 112, utimes 235 -
mq_open 240 180, mq_unlink 241 181, mq_timedsend 242 182, mq_timedreceive 243 183
mq_notify 244 184, mq_getsetattr 245 185, kexec_load 246 104, add_key 248 217
request_key 249 218, keyctl 250 219, ioprio_set 251 30, inotify_add_watch 254 27
migrate_pages 256 238, mknodat 259 33, fchownat 260 54, futimesat 261 -, fchmodat 268 53
unshare 272 97, move_pages 279 239, utimensat 280 88, semtimedop 220 192
perf_event_open 298 241, fanotify_init 300 262, fanotify_mark 301 263, prlimit64 302 261
name_to_handle_at 303 264, open_by_handle_at 304 265, clock_adjtime 305 266, setns 308 268
process_vm_readv 310 270, process_vm_writev 311 271, kcmp 312 272, finit_module 313 273
sched_setattr 314 274, kexec_file_load 320 294, bpf 321 280, userfaultfd 323 282
io_uring_setup 425 425, io_uring_enter 426 426, io_uring_register 427 427, open_tree 428 428
move_mount 429 429, fsopen 430 430, fsconfig 431 431, fsmount 432 432, fspick 433 433
pidfd_open 434 434, clone3 435 435, pidfd_getfd 438 438, process_madvise 440 440
mount_setattr 442 442, quotactl_fd 443 443, landlock_create_ruleset 444 444
landlock_add_rule 445 445, landlock_restrict_self 446 446, process_mrelease 448 448
fchmodat2 452 452, statmount 457 457, listmount 458 458, lsm_set_self_attr 460 460
setxattrat 463 463, removexattrat 466 466, open_tree_attr 467 467, file_setattr 469 469
socketpair 53 199, bind 49 200, fcntl 72 25, io_setup 206 0, inotify_init 253 -
inotify_init1 294 26
"""
SYSCALLS = {
    name: (int(x86_64), None if aarch64 == "-" else int(aarch64))
    for name, x86_64, aarch64 in map(str.split, re.split(r"[,\n]\s*", SYSCALLS_TABLE.strip()))
}
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # AUDIT_ARCH_*, column above
LAST_SYSCALL = 469  # the newest call in the table: newer ones get ENOSYS, as from an older kernel
# CLONE_PARENT (a sibling outside the script's group), CLONE_NEW{NS,CGROUP,UTS,IPC,USER,PID,NET}
CLONE_ESCAPES = 0x8000 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x70000000
S_IFMT, S_IFCHR, S_IFBLK, AF_UNIX, ALL = 0o170000, 0o020000, 0o060000, 1, 0xFFFFFFFF
EPERM, EACCES, ENOSYS = 1, 13, 38
# the names a seccomp table may use for a number: the constants above
SECCOMP_NAMES = {
    name: globals()[name]
    for name in "CLONE_ESCAPES S_IFMT S_IFCHR S_IFBLK AF_UNIX ALL EPERM EACCES ENOSYS".split()
}


# The seccomp policy, checked top to bottom, a rule a line (an indented line goes on the one
# above): syscalls | test | errno | what it would let a script do. A test "argN [& mask] op value"
# matches when (argument N & mask) op value, on the low 32 bits (all the kernel reads of each
# argument tested here); "argN & mask" when any bit of mask is set; "-" always. Every other call
# is allowed: files and sockets are Landlock's, resources the rlimits' and cgroup's. The list
# came from asking of every syscall: does it act on something outside this process and its files
# (the host, the kernel, other processes, shared objects)?
SECCOMP_TABLE = """
reboot kexec_load kexec_file_load | - | EPERM | power off the host, boot another kernel
init_module finit_module delete_module create_module query_module get_kernel_syms | - | EPERM |
    load or unload kernel code
bpf perf_event_open userfaultfd | - | EPERM | run programs in the kernel, read performance
    counters, stall kernel threads
mount umount2 pivot_root chroot swapon swapoff open_tree open_tree_attr move_mount fsopen
    fsconfig fsmount fspick mount_setattr statmount listmount | - | EPERM | change or inspect
    the host's mounts
unshare setns | - | EPERM | enter or make namespaces (and regain capabilities in them)
clone | arg0 & CLONE_ESCAPES | EPERM | make a sibling of the agent or new namespaces
clone3 | - | ENOSYS | its flags are in memory the filter cannot read; glibc then falls back to
    clone, whose flags it can
settimeofday clock_settime clock_adjtime adjtimex sethostname setdomainname | - | EPERM | set
    the host's clock or name
syslog acct quotactl quotactl_fd vhangup lookup_dcookie iopl ioperm modify_ldt uselib _sysctl
    sysfs ustat nfsservctl lsm_set_self_attr | - | EPERM | read the kernel log, change host-wide
    settings, touch I/O ports
keyctl add_key request_key | - | EPERM | read or add kernel keys
ptrace process_vm_readv process_vm_writev kcmp pidfd_open pidfd_getfd process_madvise
    process_mrelease | - | EPERM | inspect or reach into another process
prlimit64 sched_setaffinity sched_setscheduler sched_setparam sched_setattr migrate_pages
    move_pages | arg0 != 0 | EPERM | change another process's limits, CPUs, scheduling or memory
    (0 means itself)
setpriority | arg0 != 0 | EPERM | renice a group or a user (PRIO_PROCESS only)
setpriority | arg1 != 0 | EPERM | renice another process
ioprio_set | arg0 != AF_UNIX | EPERM | set the I/O priority of a group or a user
ioprio_set | arg1 != 0 | EPERM | set another process's I/O priority
setsid setpgid | - | EPERM | leave the process group the launcher kills
fanotify_init fanotify_mark inotify_init inotify_init1 inotify_add_watch | - | EPERM | watch
    file activity, the machine's included (and use up the user's inotify instances)
fcntl | arg1 == 1026 | EPERM | F_NOTIFY: watch a directory, the machine's too
fcntl | arg1 == 1024 | EPERM | F_SETLEASE: stall another program's open of a file it owns, as
    root does every root file
io_setup | - | EPERM | take the machine's whole quota of AIO events
msgget msgsnd msgrcv msgctl semget semop semtimedop semctl shmget shmat shmdt shmctl mq_open
    mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr | - | EPERM | IPC objects
    shared with other programs that outlive the call
io_uring_setup io_uring_enter io_uring_register | - | EPERM | file and socket operations this
    filter cannot see
name_to_handle_at open_by_handle_at | - | EPERM | open files by handle, past path checks
chmod fchmod fchmodat fchmodat2 chown fchown lchown fchownat utime utimes futimesat utimensat
    setxattr lsetxattr fsetxattr removexattr lremovexattr fremovexattr setxattrat removexattrat
    file_setattr | - | EPERM | change the mode, owner, times or attributes of files it may only
    read (Landlock cannot)
mknod | arg1 & S_IFMT == S_IFCHR | EPERM | make a character device
mknod | arg1 & S_IFMT == S_IFBLK | EPERM | make a block device
mknodat | arg2 & S_IFMT == S_IFCHR | EPERM | make a character device
mknodat | arg2 & S_IFMT == S_IFBLK | EPERM | make a block device
ioctl | arg1 == 0x40086602 | EPERM | FS_IOC_SETFLAGS: chattr +i on a read-only fd
ioctl | arg1 == 0x40046602 | EPERM | FS_IOC32_SETFLAGS, the same
ioctl | arg1 == 0x401c5820 | EPERM | FS_IOC_FSSETXATTR: inode flags, project id
ioctl | arg1 == 0x40087602 | EPERM | FS_IOC_SETVERSION: the inode generation
ioctl | arg1 == 0x40047602 | EPERM | FS_IOC32_SETVERSION, the same
ioctl | arg1 == 0x800c6613 | EPERM | FS_IOC_SET_ENCRYPTION_POLICY on a directory
ioctl | arg1 == 0xc0506617 | EPERM | FS_IOC_ADD_ENCRYPTION_KEY: a key that stays
ioctl | arg1 == 0xc0406618 | EPERM | FS_IOC_REMOVE_ENCRYPTION_KEY
ioctl | arg1 == 0xc0406619 | EPERM | FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS
ioctl | arg1 == 0x40806685 | EPERM | FS_IOC_ENABLE_VERITY: a file made read-only
ioctl | arg1 == 0x6609 | EPERM | EXT4_IOC_MIGRATE: rewrite a file's block map
ioctl | arg1 == 0x660c | EPERM | EXT4_IOC_ALLOC_DA_BLKS: force a file's blocks
ioctl | arg1 == 0x5412 | EPERM | TIOCSTI: type into a terminal
ioctl | arg1 == 0x541c | EPERM | TIOCLINUX: the console's selection and keys
socket socketpair | arg0 != AF_UNIX | EACCES | open a network, netlink or raw socket (or load
    the module of one)
"""
# Where Landlock cannot govern named unix sockets (below ABI 9)
UNIX_SOCKET_TABLE = """
socket | - | EACCES | connect to a named unix socket (docker.sock, D-Bus, ssh-agent)
socketpair | arg1 & 0xf == 2 | EACCES | a datagram pair: its sendto reaches any named socket
    (/dev/log, systemd's notify socket)
socketpair | arg1 & 0xf == 3 | EACCES | SOCK_RAW, which AF_UNIX turns into the same
bind | - | EACCES | take an abstract socket name the host's programs use
"""


def seccomp_rules(table):
    """Yield a seccomp table's rules: (syscalls, (arg, mask, op, value) or None, errno, why)."""
    for line in table.strip().replace("\n    ", " ").splitlines():
        names, test, code, why = (part.strip() for part in line.split("|"))
        match = re.fullmatch(r"arg(\d)(?: & (\S+))?(?: (==|!=) (\S+))?", test)
        if match:
            # "argN & mask" tests (mask, "&", 0); "argN op value" tests (ALL, op, value)
            arg, mask, op, value = match.groups()
            mask, value = (SECCOMP_NAMES.get(w) or int(w, 0) for w in (mask or "ALL", value or "0"))
            test = (int(arg), mask, op or "&", value)
        yield names, test if match else None, SECCOMP_NAMES[code], why


SECCOMP_RULES = tuple(seccomp_rules(SECCOMP_TABLE))
UNIX_SOCKET_RULES = tuple(seccomp_rules(UNIX_SOCKET_TABLE))


PR_SET_PDEATHSIG, PR_CAPBSET_READ, PR_CAPBSET_DROP, PR_SET_SECCOMP = 1, 23, 24, 22
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 36, 38, 47
SECCOMP_MODE_FILTER, CAP_VERSION_3, MAX_FD = 2, 0x20080522, 1 << 16
# capset's arguments, made before any fork (each call's process copies less: 0.1 ms a call)
CAPSET_NONE = ((ctypes.c_uint32 * 2)(CAP_VERSION_3, 0), (ctypes.c_uint32 * 6)())
SECCOMP_ALLOW, SECCOMP_KILL, SECCOMP_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
# BPF opcodes: BPF_LD|W|ABS, BPF_RET, BPF_ALU|AND; jumps (relative, 8-bit) JEQ JGT JGE JSET; JA by k
LD, RET, AND, JEQ, JGT, JGE, JSET, JA = 0x20, 0x06, 0x54, 0x15, 0x25, 0x35, 0x45, 0x05
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x20000, 0x10000000, 0x20000000
MS_BIND, MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV = 0x1000, 0x4000, 1 << 18, 0x2, 0x4
# the mount API that works on descriptors: fsopen, fsconfig, fsmount, move_mount (Linux 5.2)
FSOPEN_CLOEXEC, FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE, FSMOUNT_CLOEXEC = 1, 1, 6, 1
MOUNT_ATTR_NOSUID_NODEV, MOVE_MOUNT_EMPTY_PATHS = MS_NOSUID | MS_NODEV, 0x4 | 0x40


def rights(table, abi, names=None):
    """The bit mask of the rights in `names` (all by default) that Landlock ABI `abi` knows."""
    names = table if names is None else names
    return sum(1 << bit for name, (bit, since) in table.items() if since <= abi and name in names)


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def libc_call():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    # made before any fork: a call's forked process finds the function ready (17 pages fewer to copy)
    libc.unshare.argtypes = [ctypes.c_int]
    return libc


def syscall(libc, name, *args):
    """Make a raw syscall by name; raise OSError on failure."""
    nr = SYSCALLS[name][ARCHES[platform.machine()][1]]
    result = libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in (nr, *args)))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")
    return result


# --- CLI ---


def meant_flags(parser, extra):
    """Each unknown flag among `extra`, with the flag it most likely meant (`--work`:
    --workdir; `-c`: -C), or --help when none is near."""
    known = list(parser._option_string_actions)
    longs = [k for k in known if k.startswith("--")]
    shown = []
    for flag in (a for a in extra if a.startswith("-") and a != "-"):
        name = flag.split("=")[0]
        same = [k for k in known if k.lower() == name.lower()]
        near = same or difflib.get_close_matches(name, longs, 1, 0.7)
        # what another agent CLI means by it, else the flag most like it
        hint = OTHER_TOOLS_FLAGS.get(name) or (f"did you mean {near[0]}?" if near else "see --help")
        shown.append(f"{flag} ({hint})")
    return shown


OTHER_TOOLS_FLAGS = {  # flags of claude, llm, codex exec, mini-swe-agent, and what they are here
    "-c": "did you mean -C? to go on with the last run, as claude -c and llm -c do: --resume last",
    "--continue": "to go on with the last run: --resume last",
    "-p": "no -p is needed: the question is the argument, and the answer goes to stdout",
    "--print": "no --print is needed: the answer goes to stdout",
    "--max-steps": "did you mean --max-turns?",
    "--max-iterations": "did you mean --max-turns?",
    "--cost-limit": "did you mean --budget-usd?",
    "-t": "no -t is needed: the question is the argument",
}


class Parser(argparse.ArgumentParser):
    def error(self, message):
        if message.startswith("argument -r/--resume: expected one argument"):  # claude -r
            message += " (last: the newest kept run; or a run id, or a transcript's path)"
        raise UsageError(f"{message} (see --help)")


class Once(argparse.Action):
    """An option's value, given once: a second, different one (`-C a -C b`) is a usage error."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given", {})
        before = given.get(self.dest, values)
        if before != values:
            shown = [" ".join(v) if isinstance(v, list) else str(v) for v in (before, values)]
            raise UsageError(
                f"{'/'.join(self.option_strings)} was given twice ({shown[0]}, then {shown[1]}): give it once"
            )
        given[self.dest] = values
        setattr(namespace, self.dest, values)


DESCRIPTION = """Answer a question about the files in a directory with Claude, through a
hand-written agent loop with two tools: read_file, and run_python in an OS sandbox.

The API key comes from ANTHROPIC_API_KEY, else from the .env beside agent.py (copy
.env.example); ANTHROPIC_BASE_URL points agent.py at another Anthropic-compatible server, and
ANTHROPIC_MODEL sets the default model. No other .env is ever read.

Every run is kept in $XDG_STATE_HOME/agent.py/runs (else ~/.local/state/agent.py/runs):
--resume last goes on with the newest, and last or a run id names a kept run for --replay,
--report and --export too; --no-keep or AGENT_PY_NO_KEEP=1 keeps none."""

EPILOG = """examples:
  agent.py "scores.csv 里平均分是多少？" --workdir workspace
  agent.py --replay workspace/example-run.json --workdir workspace   (no key needed)
  agent.py "Compare spring.md and fall.md." --workdir workspace --transcript run.json --events -

exit codes:
  0    answered: end_turn, stop_sequence
  1    api_error, error
  2    usage error (nothing sent)
  3    max_turns: the last turn ran with tools off; stdout has the interim answer
  4    token_budget, cost_budget: stopped before running the pending tool calls
  5    max_tokens, refusal, model_context_window_exceeded: stdout has the partial text
  6    --trials: some trials failed (or, past --trials-budget-usd, did not start)
  7    replay_differs: --replay --strict, and a tool result differs from the recording
  130  interrupted (Ctrl-C, SIGTERM or SIGHUP)"""


def whole_number(value):
    """A count as --help shows it (1,000,000) or Python writes it (1_000_000), or as digits."""
    if not re.fullmatch(r"[+-]?(\d{1,3}(,\d{3})+|\d+(_\d+)*)", value.strip()):  # 1,0 is no count
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number")
    return int(value.replace(",", "").replace("_", ""))


def tokens_or_off(value):
    """--clear-tool-results: a number of tokens, or off."""
    try:
        return None if value == "off" else whole_number(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError("give a number of tokens, or off")


LONGEST_WAIT = 10**9  # seconds a timeout may be: every clock agent.py waits on holds it


# What --help says of each option and of the question, by its last flag (helped)
HELP = {
    "--version": "print agent.py's version, and exit",
    "question": "the question; - reads it from stdin (with --resume: an optional follow-up)",
    "--workdir": "the directory the tools work in (default: the current one); one that holds agent.py or its Python is refused, unless --no-sandbox",
    "--model": f"model id (default: $ANTHROPIC_MODEL, else {DEFAULT_MODEL})",
    "--effort": "sent as output_config.effort (default: the model's)",
    "--yes": "run run_python without asking, once the sandbox is proven (default: ask every time)",
    "--no-sandbox": "run run_python unconfined (default: sandboxed)",
    "--resume": "continue a saved transcript (last: the newest kept run; or a run id); rewrites PATH as the run goes on (give --transcript to write elsewhere)",
    "--replay": "run a saved transcript's model turns again against the real tools: no key, no connection (last, or a run id: a kept run)",
    "--strict": "with --replay: stop at the first turn whose tool results differ from the recording, and exit 7 (replay_differs): a regression check for CI",
    "--system-prompt": "the system prompt, from this UTF-8 file (default: agent.py's, for questions about files); recorded in the transcript, and kept by --resume",
    "--max-turns": f"requests per run (default: {Limits.max_turns})",
    "--token-budget": f"input + cache + output tokens per run (default: {Limits.token_budget:,})",
    "--budget-usd": "dollars per run, priced like the bill (default: no dollar limit)",
    "--max-tokens": f"output tokens per response (default: {Limits.max_tokens:,})",
    "--tool-timeout": f"seconds per run_python call (default: {Limits.tool_timeout:g})",
    "--request-timeout": f"seconds a streamed reply may go without an event before the turn is retried (default: {Limits.request_timeout:g})",
    "--transcript": "write the transcript JSON here, outside the workdir; - for stdout (default: none)",
    "--events": "write the run's events as JSON Lines here, outside the workdir; - for stdout (default: none)",
    "--otel": "send the run as OpenTelemetry traces over OTLP, as OTEL_EXPORTER_OTLP_* say (optional packages)",
    "--quiet": "no progress on stderr (default: progress)",
    "--no-keep": "keep no copy of this run in $XDG_STATE_HOME/agent.py/runs or ~/.local/state/agent.py/runs (default: every run is kept there; AGENT_PY_NO_KEEP=1 keeps none)",
    "--trials": f"run the question K times (at most {MAX_TRIALS:,}); report pass@k and pass^k (with no --expect, --expect-tool or --expect-stop, a trial passes if it stopped with end_turn)",
    "--jobs": f"trials run at once (default: 1; at most {MAX_JOBS})",
    "--trials-budget-usd": "dollars over all the trials: once they have spent X, no more start (--budget-usd bounds each one; default: no total)",
    "--expect": "a trial passes if this regex is in the answer",
    "--expect-tool": "... and it used this tool",
    "--expect-stop": "... and stopped so: one of " + ", ".join(EXIT_CODES),
    "--decline-message": "what a declined run_python call tells the model (default: not to retry it, and to ask the user how to proceed)",
    "--clear-tool-results": f"once a prompt reaches TOKENS, send old tool results as a one-line placeholder (default: {Limits.clear_at:,})",
    "--keep-tool-results": f"the newest tool results, never cleared (default: {Limits.keep_results})",
    "--clear-at-least": f"clear only when that frees this many tokens, since a clearing breaks the cache once (default: {Limits.clear_at_least:,})",
    "--context-edit": "who clears: agent.py, or the API's context editing (beta) (default: client)",
    "--count-tokens": "print what the system prompt, the tools and QUESTION cost in input tokens (the API's count_tokens), and exit",
    "--schema": "print the JSON Schema of a transcript, an event or a trials summary, and exit",
    "--report": "write an HTML report of a transcript or trials summary (last, or a run id: a kept run), and exit",
    "--export": "convert a transcript or trials summary (last, or a run id: a kept run): atif (the Agent Trajectory Interchange Format, v1.8), and exit",
    "--output": "where --report or --export writes; - for stdout (default: beside JSON)",
}


def helped(group):
    """`group.add_argument`, given --help's words for the option from HELP."""
    return lambda *flags, **given: group.add_argument(*flags, help=HELP[flags[-1]], **given)


def parse_args(argv):
    p = Parser(
        prog="agent.py",
        epilog=EPILOG,
        description=DESCRIPTION,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for name in (None, "store"):  # every option with a value, in every group
        p.register("action", name, Once)
    add = helped(p)
    add("-V", "--version", action="version", version=f"agent.py {AGENT_VERSION}")
    add = helped(p.add_argument_group("run"))
    add("question", nargs="?")
    add("-C", "--workdir", metavar="DIR")
    add("-m", "--model", metavar="ID")
    add("--effort", choices=EFFORTS)
    add("-y", "--yes", action="store_true")
    add("--no-sandbox", action="store_true")
    add("-r", "--resume", metavar="PATH")
    add("--replay", metavar="PATH")
    add("--strict", action="store_true")
    add("-s", "--system-prompt", metavar="FILE")
    add = helped(p.add_argument_group("limits"))
    add("--max-turns", type=whole_number, metavar="N", default=Limits.max_turns)
    add("--token-budget", type=whole_number, metavar="N", default=Limits.token_budget)
    add("--budget-usd", type=float, metavar="X")
    add("--max-tokens", type=whole_number, metavar="N", default=Limits.max_tokens)
    add("--tool-timeout", type=float, metavar="SECONDS", default=Limits.tool_timeout)
    add("--request-timeout", type=float, metavar="SECONDS", default=Limits.request_timeout)
    add = helped(p.add_argument_group("outputs"))
    add("--transcript", metavar="PATH")
    add("--events", metavar="PATH")
    add("--otel", action="store_true")
    add("-q", "--quiet", action="store_true")
    add("--no-keep", action="store_true")
    add = helped(p.add_argument_group("trials: how stable is a behaviour"))
    add("--trials", type=whole_number, metavar="K")
    add("--jobs", type=whole_number, metavar="N", default=1)
    add("--trials-budget-usd", type=float, metavar="X")
    add("--expect", metavar="REGEX")
    add("--expect-tool", metavar="NAME", choices=list(TOOL_FUNCTIONS))
    add("--expect-stop", metavar="LABEL", choices=list(EXIT_CODES))
    add("--decline-message", metavar="TEXT")
    add = helped(p.add_argument_group("context: clearing old tool results"))
    add("--clear-tool-results", type=tokens_or_off, metavar="TOKENS|off", default=Limits.clear_at)
    add("--keep-tool-results", type=whole_number, metavar="N", default=Limits.keep_results)
    add("--clear-at-least", type=whole_number, metavar="TOKENS", default=Limits.clear_at_least)
    add("--context-edit", choices=("client", "server"), default=Limits.context_edit)
    add = helped(
        p.add_argument_group("inspection: print or convert, send nothing (but --count-tokens)")
    )
    add("--count-tokens", action="store_true")
    add("--schema", choices=list(SCHEMAS))
    add("--report", metavar="JSON")
    add("--export", nargs=2, metavar=("FORMAT", "JSON"))
    add("-o", "--output", metavar="PATH")
    args, extra = p.parse_known_args(argv)
    if extra:  # argparse's own message; for words alone, what they most likely are
        words = [a for a in extra if not a.startswith("-") or a == "-"]
        if "--" in argv and argv.index("--") < len(argv) - len(extra):  # flags after --
            raise UsageError(
                f"unrecognized arguments: {' '.join(extra)}; options go before --, after which every word is the question's"
            )
        if words != extra:  # a mistyped flag: the words after it may be its value, not extra
            raise UsageError(f"unrecognized arguments: {' '.join(meant_flags(p, extra))}")
        both = [args.question, *words] if args.question is not None and len(words) == 1 else []
        folders = [w for w in both if os.path.isdir(w)]
        if len(folders) == 1:  # `agent.py "avg?" workspace`: the directory is the workdir
            asked = next(w for w in both if w != folders[0])
            raise UsageError(
                f"unrecognized arguments: {' '.join(extra)}; {folders[0]} is a directory: did you mean agent.py {shlex.quote(asked)} --workdir {shlex.quote(folders[0])}?"
            )
        hint = " (see --help)"
        if args.question is not None:
            whole = shlex.quote(" ".join([args.question, *words]))
            hint = f"; a question of several words goes in quotes: agent.py {whole} ..."
        raise UsageError(f"unrecognized arguments: {' '.join(extra)}{hint}")
    for action in p._actions:  # a path given as "" is an unset variable, never a choice
        if action.metavar in ("PATH", "DIR", "JSON", "FILE") and getattr(args, action.dest) == "":
            raise UsageError(
                f'{"/".join(action.option_strings)} is empty (an unset shell variable, as in {action.option_strings[-1]} "$OUT"?): give a path'
            )
    if args.report == "-" or args.export and args.export[1] == "-":
        raise UsageError(
            f"{'--report' if args.report else '--export'} reads a file, not stdin: give the path of a transcript or summary (or last)"
        )
    inspecting = [f"--{name}" for name in ("schema", "report", "export") if getattr(args, name)]
    # --count-tokens, --schema, --report and --export run nothing: a run's flag would be dropped
    run_flags = ("replay", "resume", "trials", "transcript", "events")
    dropped = [f"--{name}" for name in run_flags if getattr(args, name) is not None]
    if args.count_tokens and (dropped or inspecting):
        raise UsageError(
            f"--count-tokens cannot be combined with {(dropped or inspecting)[0]}: it counts a question's tokens and runs nothing; give one of them"
        )
    if len(inspecting) > 1:
        raise UsageError(f"{' and '.join(inspecting)} cannot be combined: give one")
    dropped += ["--otel"] * args.otel
    if inspecting and dropped:
        # (one of the three: two were refused above)
        what = "prints a schema" if args.schema else "writes a report of a saved run"
        what = "converts a saved run" if args.export else what
        raise UsageError(
            f"{inspecting[0]} cannot be combined with {dropped[0]}: it {what}, and runs nothing; give one of them"
        )
    if args.output and not (args.report or args.export):
        raise UsageError(
            f"-o/--output goes with --report or --export (the answer goes to stdout: > {shlex.quote(args.output)}; the transcript: --transcript FILE)"
        )
    if inspecting and args.question is not None:
        raise UsageError(f"{inspecting[0]} takes no question, and {args.question!r} was given")
    if args.export and args.export[0] != "atif":
        raise UsageError(f"--export knows one format, atif, not {args.export[0]!r}")
    if args.model is not None and not args.model.strip():
        raise UsageError(
            '--model is empty (an unset shell variable, as in -m "$MODEL"?): give a model id, or leave -m out for the default'
        )
    if inspecting or args.count_tokens:
        return args
    if args.question in ("help", "version"):  # a first try at what --help and --version do
        raise UsageError(
            f"a question of one word, {args.question!r}: did you mean --{args.question}? (to ask it, give more words)"
        )
    counts = ("max_turns", "token_budget", "max_tokens", "jobs", "trials")
    for name in (*counts, "clear_tool_results", "clear_at_least"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    for name, most in (("trials", MAX_TRIALS), ("jobs", MAX_JOBS)):
        value = getattr(args, name)
        if value is not None and value > most:
            raise UsageError(
                f"--{name} {value:,} is over {most:,}, the most agent.py runs in one go: give at most {most:,}"
                + (" (split a bigger measurement into several runs)" if name == "trials" else "")
            )
    for name in ("tool_timeout", "budget_usd", "request_timeout", "trials_budget_usd"):
        value = getattr(args, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise UsageError(f"--{name.replace('_', '-')} must be a positive number")
        if name.endswith("timeout") and value > LONGEST_WAIT:  # a socket's, a CPU limit's
            raise UsageError(f"--{name.replace('_', '-')} must be at most {LONGEST_WAIT:,} seconds")
    not_replayed = (args.resume, args.trials, args.model, args.effort, args.system_prompt)
    if args.replay and (args.question is not None or any(not_replayed)):
        raise UsageError(
            "--replay runs the recorded question and turns again: give it no question, --model, --effort, --system-prompt, --resume or --trials"
        )
    if args.strict and not args.replay:
        raise UsageError("--strict goes with --replay")
    check_text(args.question, "the question")
    check_text(args.model, "--model")
    check_text(args.expect, "--expect")
    check_text(args.decline_message, "--decline-message")
    if args.resume is None and args.replay is None and not (args.question or "").strip():
        raise UsageError("give a question (- reads it from stdin), --resume PATH or --replay PATH")
    if args.expect:
        try:
            re.compile(args.expect)
        except re.error as e:
            raise UsageError(f"--expect is not a valid regex: {e}")
    if args.decline_message is not None and not args.decline_message.strip():
        raise UsageError("--decline-message must not be empty")
    if args.trials is None and (args.expect or args.expect_tool or args.expect_stop):
        raise UsageError("--expect, --expect-tool and --expect-stop need --trials")
    if args.trials is None and args.jobs != 1:
        raise UsageError("--jobs needs --trials")
    if args.trials is None and args.trials_budget_usd is not None:
        raise UsageError("--trials-budget-usd needs --trials (for one run, --budget-usd)")
    if args.trials is not None and args.resume:
        raise UsageError("--trials cannot be combined with --resume")
    if args.events and own_descriptor(args.events) == 1:  # stdout by its name: as - says it
        args.events = "-"
    if args.events == "-" and args.transcript == "-":
        raise UsageError("--events - and --transcript - cannot share stdout")
    if args.keep_tool_results < 0:
        raise UsageError("--keep-tool-results must be at least 0")
    return args


def check_text(value, what):
    """`value`, or a UsageError if it is not valid UTF-8 (Python hands such bytes of the command
    line or the environment over as lone surrogates): agent.py can neither send nor record it."""
    try:
        if value is not None:
            value.encode("utf-8")
    except UnicodeEncodeError as e:
        byte = os.fsencode(value[e.start])[0] if "\udc80" <= value[e.start] <= "\udcff" else None
        not_utf8(what, byte, value[: e.start])
    return value


def not_utf8(what, byte, before):
    said = f"byte 0x{byte:02x}" if byte is not None else "a lone surrogate"
    raise UsageError(
        f"{what} is not valid UTF-8: {said} after {shorten(before, 40)!r}; give it as UTF-8 text (iconv -t UTF-8 converts a file)"
    )


class QuestionWasRead(io.StringIO):
    """stdin once the question (-) was read from it: no answer is left in it, as agreed says."""

    no_answer = "(no answer: stdin held the question; give --yes to run it unasked)"


ELSEWHERE = "y"  # what --resume's consent to another server is: a y, which no flag gives


class PipedAnswers:
    """stdin that is not a terminal (`echo y | agent.py ...`): the answer read from it, which no
    terminal echoes, is shown after the question as from stdin, its line ended."""

    def __init__(self, stdin):
        self.stdin = stdin

    def __getattr__(self, name):  # isatty, no_answer, buffer ...: stdin's own
        return getattr(self.stdin, name)

    def readline(self):
        answer = self.stdin.readline()
        if answer.strip():
            shown = f"{shorten(visible(answer.strip()), 40)} (from stdin)\n"
            to_stderr(dimmed(shown, sys.stderr), sys.stderr)
            return answer if answer.endswith("\n") else answer + "\n"
        return answer


MAX_QUESTION = 32 << 20  # bytes of a question on stdin: the API takes no larger request
MAX_SYSTEM_PROMPT = 1 << 20  # bytes of a --system-prompt file: more than any context window holds


def read_question(stdin):
    """The question on stdin (-): its bytes, which must be UTF-8, when it has them."""
    raw = getattr(stdin, "buffer", None)
    if raw is None:
        return check_text(stdin.read(), "the question on stdin")
    data = raw.read(MAX_QUESTION + 1).removeprefix(b"\xef\xbb\xbf")  # a BOM (Notepad's): no text
    if len(data) > MAX_QUESTION:  # `yes | agent.py -` ends here, not when memory does
        raise UsageError(
            f"the question on stdin is over {MAX_QUESTION >> 20} MiB, more than the API takes in one request"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        not_utf8("the question on stdin", data[e.start], data[: e.start].decode("utf-8", "replace"))


def read_system_prompt(path):
    """The text of --system-prompt FILE, read only from a regular file (nothing at the path can
    make agent.py block), as UTF-8; else a UsageError saying what is there."""
    flag = f"--system-prompt {path}"
    if not os.path.lexists(path) and " " in path:  # text where a file is meant, as llm's -s?
        raise UsageError(
            f"--system-prompt takes a FILE, and there is no file {path!r} (llm's -s and claude's --system-prompt take the text itself; here, put it in a file)"
        )
    data = read_regular(flag, path, MAX_SYSTEM_PROMPT + 1)
    if len(data) > MAX_SYSTEM_PROMPT:
        raise UsageError(
            f"{flag} is over {MAX_SYSTEM_PROMPT >> 20} MiB: too long for a system prompt"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{flag} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} (iconv -t UTF-8 converts it)"
        )
    if not text.strip():
        raise UsageError(
            f"{flag} holds no text: give a file with the prompt (without --system-prompt, agent.py's own is used)"
        )
    return text


def install_hint():
    """What to run to install agent.py's packages, with paths that work from where the user
    stands; its line begins with `agent.py: `, so it does not name agent.py again."""
    venv = beside_agent(".venv")
    agent_py = beside_agent("agent.py")
    return f"needs the anthropic and python-dotenv packages, which {sys.executable} cannot import: python3 -m venv {venv} && {venv}/bin/pip install -r {beside_agent('requirements.txt')}, then run {venv}/bin/python {agent_py} ...; or run it with uv run {agent_py} ..."


def harness():
    """What runs agent.py, as (what, its path, what an output must not do to it): "file", be it;
    "tree", be anywhere below it; "modules", be a module Python imports from it; None, only be
    held by a workdir (/usr holds far more than Python; the user base holds the kept runs)."""
    venv = sys.prefix != sys.base_prefix
    found = [
        ("agent.py", __file__, "file"),
        ("the .env agent.py reads", dotenv_path(), "file"),
        ("the Python interpreter", sys.executable, "file"),
        ("the environment agent.py runs in", sys.prefix, "tree" if venv else None),
        ("Python's standard library", sysconfig.get_path("stdlib"), "tree"),
        ("agent.py's __pycache__", os.path.join(os.path.dirname(__file__), "__pycache__"), "tree"),
        ("Python's user base, whose .pth files run at every start", site.getuserbase(), None),
        ("Python's user site-packages", site.getusersitepackages(), "tree"),
    ]
    found += [("a directory agent.py imports from", p, "modules") for p in sys.path if p]
    # The name the user typed, symlinks and all: a symlink in the workdir could be swapped.
    if os.path.realpath(sys.argv[0] or ".") == os.path.realpath(__file__):
        found.append(("agent.py", sys.argv[0], "file"))
    return [(what, path, kind) for what, path, kind in found if path]


MODULE_SUFFIXES = (".py", ".pyc", ".pth", ".so", ".zip")  # what Python imports from a directory


# How each file agent.py writes begins: transcript, summary or ATIF; events (JSONL); a report
OWN_OUTPUTS = re.compile(
    rb'\s*\{\s*"(version|schema_version)"\s*:|'
    rb'\{"type":"[a-z.]+","seq":|'
    rb'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="Content-'
    rb'Security-Policy" content="default-src \'none\'; style-src \'nonce-'
)


def check_not_the_checkouts(path, flag, given, dir_fd):
    """Refuse to replace a file in agent.py's checkout unless it is empty or one agent.py wrote:
    `--events requirements.txt` is one tab away from `--events run.jsonl`."""
    home = Path(os.path.realpath(__file__)).parent
    if not path.is_relative_to(home):
        return
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        # (os.read: a buffered read of a FIFO with nothing in it gives None, not BlockingIOError)
        with os.fdopen(os.open(path.name, flags, dir_fd=dir_fd), "rb") as file:
            head = os.read(file.fileno(), 4096)
    except OSError:
        head = b"?"  # cannot be read: not shown to be agent.py's own
    if head and not OWN_OUTPUTS.match(head):
        raise UsageError(
            f"{flag} {given} would replace {path}, a file of agent.py's checkout ({home}) that agent.py did not write; there an output replaces only agent.py's own outputs (or an empty file): give another name"
        )


def check_harness(path, flag, given):
    """Refuse an output at `path` (`given` as the user named it) over what runs agent.py: one
    typo must not break agent.py, its venv or its interpreter, nor plant the .env it trusts."""
    for what, named, kind in harness():
        real = Path(os.path.realpath(named))
        if kind == "file" and path == real:
            done = f"is {what}" + (f" ({real})" if str(given) != str(real) else "")
        elif kind == "tree" and path.is_relative_to(real) and real != Path("/"):
            done = f"is inside {what} ({real})"
        elif kind == "modules" and path.parent == real and path.suffix in MODULE_SUFFIXES:
            done = f"would be a module in {what} ({real})"
        else:
            continue
        raise UsageError(
            f"{flag} {given} {done}: agent.py writes no output over what runs it; give another name"
        )


# What a workdir may be: a directory of ordinary data on an ordinary filesystem. The sandbox lets
# the model's code write anywhere in its workdir, so a workdir that reaches the kernel, the system
# or what runs agent.py next time would let that code act outside the sandbox. With the sandbox
# on, refused (with --no-sandbox the code can write wherever agent.py can: any workdir goes):
# - a kernel filesystem (KERNEL_FILESYSTEMS, by type) as the workdir or mounted below it;
# - a tree the system runs from (SYSTEM_TREES): the workdir is one, is inside one or holds one;
# - a directory all users share or a user's home (SHARED_DIRECTORIES, every home in the password
#   database, $HOME): the workdir is one or holds one. A directory below one (/tmp/data,
#   ~/project) is allowed: what runs at login or boot is not there;
# - what runs agent.py next time (harness(), the Python's prefixes, PATH and LD_LIBRARY_PATH):
#   the workdir holds one, is inside a "tree" one (the venv, the standard library, user
#   site-packages), or holds a hard link to one of its files.
# Directories are compared by (st_dev, st_ino), so a bind mount reaching one by another path is
# the same directory; a path as given is compared too, for a symlink in the workdir on the way.

# The kernel's interfaces, not data: writing their files changes the machine (core_pattern in
# proc, cgroup.procs in cgroup2, a block device in devtmpfs).
KERNEL_FILESYSTEMS = set(
    "proc sysfs devtmpfs devpts cgroup cgroup2 debugfs tracefs securityfs bpf configfs pstore "
    "efivarfs fusectl mqueue hugetlbfs binfmt_misc nsfs selinuxfs smackfs rpc_pipefs nfsd binder "
    "autofs".split()
)

SYSTEM_TREES = tuple(
    "/bin /boot /dev /etc /lib /lib32 /lib64 /libx32 /opt /proc /run /sbin /sys /usr /var".split()
)

SHARED_DIRECTORIES = ("/", "/home", "/media", "/mnt", "/srv", "/tmp")


def check_workdir(workdir, where):
    """Refuse a workdir that is not a directory of ordinary data (the rule above)."""
    mounts = mounts_at_or_below(workdir)
    for point, kind in mounts:
        if kind in KERNEL_FILESYSTEMS:
            said = "is on" if workdir.is_relative_to(point) else f"has mounted at {point}"
            refuse_workdir(where, f"{said} a kernel filesystem ({kind})")
    # Where the workdir's tree begins (itself and each mount below it), and what is above it.
    starts = {file_id(p) for p, _ in mounts if p.is_relative_to(workdir)} | {file_id(workdir)}
    above = {file_id(up) for up in (workdir, *workdir.parents)}
    found = [("a tree the system runs from", p, True) for p in SYSTEM_TREES]
    found += [("a directory all users share", p, False) for p in SHARED_DIRECTORIES]
    homes = {os.path.expanduser("~")} | {user.pw_dir for user in pwd.getpwall()}
    found += [("a user's home", p, False) for p in sorted(homes)]
    found += [(what, path, kind == "tree") for what, path, kind in harness()]
    for p in (sys.exec_prefix, sys.base_exec_prefix):
        found.append(("the Python agent.py runs on", p, False))
    for name in ("PATH", "LD_LIBRARY_PATH"):
        what = f"a directory on {name}, where the next run's programs are"
        # An empty entry on PATH is the current directory.
        entries = os.environ.get(name, "").split(os.pathsep)
        found += [(what, p, False) for p in entries if p or name == "PATH"]
    for what, path, inside_too in found:
        path = path or "."
        real = Path(os.path.realpath(path))
        if starts & {file_id(up) for up in (real, *real.parents)} - {None}:
            refuse_workdir(where, f"{'is' if real == workdir else 'holds'} {what} ({real})")
        if Path(os.path.abspath(path)).is_relative_to(workdir):
            refuse_workdir(where, f"holds {what} ({os.path.abspath(path)})")
        if inside_too and file_id(real) in above - {None}:
            refuse_workdir(where, f"is inside {what} ({real})")
    files = [(what, path) for what, path, _ in harness() if os.path.isfile(path)]
    linked = {file_id(path): (what, path) for what, path in files if os.stat(path).st_nlink > 1}
    for top, _, names in os.walk(workdir) if linked else ():
        for name in names:
            what, path = linked.get(file_id(os.path.join(top, name), follow=False), (None, None))
            if what:
                refuse_workdir(where, f"holds {top}/{name}, a hard link to {what} ({path})")


def refuse_workdir(where, said):
    raise UsageError(
        f"{where} {said}: a workdir must be a directory of ordinary data, as the model's code may write anywhere in it and the next run would run what it wrote; give -C such a directory (in a throwaway container, --no-sandbox allows any)"
    )


def file_id(path, follow=True):
    """(st_dev, st_ino) of `path`: the file itself, whatever name or mount reaches it."""
    try:
        found = os.stat(path, follow_symlinks=follow)
    except (OSError, ValueError):
        return None
    return found.st_dev, found.st_ino


def mounts_at_or_below(workdir):
    """(mount point, filesystem type) of the mount the workdir is on and of every one below it,
    from /proc/self/mountinfo (the kernel's octal escapes in a mount point undone)."""
    try:
        with open("/proc/self/mountinfo") as info:
            lines = info.read().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        head, _, rest = line.partition(" - ")
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), head.split()[4])
        mounts.append((Path(point), rest.split()[0]))
    below = [m for m in mounts if m[0] != workdir and m[0].is_relative_to(workdir)]
    # The workdir is on the last mount listed at the deepest mount point above it.
    above = [m for m in reversed(mounts) if workdir.is_relative_to(m[0])]
    return [max(above, key=lambda m: len(m[0].parts))] + below if above else below


def shown_below(workdir, path):
    """The mount point at or below the workdir that shows `path`, that directory or one above
    it bound there (as schroot binds /tmp); None if none does."""
    above = [os.stat(p) for p in (path, *Path(path).parents)]
    for point, _ in mounts_at_or_below(workdir):
        with contextlib.suppress(OSError):
            seen = os.stat(point)
            if point.is_relative_to(workdir) and any(os.path.samestat(seen, s) for s in above):
                return point
    return None


def beside_agent(name):
    """A path beside agent.py as the user can type it from where they stand: relative when it
    is below the current directory, else absolute."""
    path = Path(os.path.realpath(__file__)).parent / name
    try:
        relative = os.path.relpath(path)
    except (OSError, ValueError):  # no current directory any more
        relative = ".."
    return shlex.quote(str(path) if relative.startswith("..") else relative)


def shown_path(path):
    """A path a file named, as it is when plain, else quoted, escaped and cut to two rows."""
    shown = str(path)
    if len(shown) > 200 or quoted(shown) != f'"{shown}"':
        shown = fitted("", shown, "", 80, 2)
    return shown


def dotenv_path():
    """The one .env agent.py reads: beside agent.py. Never one in the current directory or above
    it, where a run_python script of some earlier run could have written it."""
    return Path(__file__).resolve().with_name(".env")


# the settings agent.py reads from the environment, else from the .env beside it
CONFIG_NAMES = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL")
ANTHROPIC_HOST = "api.anthropic.com"  # the SDK's default server, which prices are for
ANTHROPIC_URL = f"https://{ANTHROPIC_HOST}"  # that server as a transcript records it


def load_config(workdir, report):
    """API settings: the environment, else the .env beside agent.py if it counts (read_dotenv),
    read as plain values (no ${VAR} expansion) and never loaded into os.environ."""
    try:
        found = dotenv_settings(workdir, report)
    except ImportError:
        raise UsageError(install_hint())
    config = {n: os.environ.get(n) or found.get(n) for n in CONFIG_NAMES}
    model = config["ANTHROPIC_MODEL"]
    if model and model != model.strip():  # sent as it is, a model id with a space is a 404
        raise UsageError(f"ANTHROPIC_MODEL {model!r} has white space around it: give it without")
    key = config["ANTHROPIC_API_KEY"]
    odd = next((i for i, c in enumerate(key or "") if not c.isascii()), None)
    if odd is not None:  # where, and never a character of the key itself (it is a secret)
        where = "" if os.environ.get("ANTHROPIC_API_KEY") else f" (from {dotenv_path()})"
        said = "has a character that is not ASCII"
        if "\udc80" <= key[odd] <= "\udcff":
            said = f"is not valid UTF-8: byte 0x{os.fsencode(key[odd])[0]:02x}"
        raise UsageError(
            f"ANTHROPIC_API_KEY{where} {said} at position {odd + 1} of {len(key)}: copy the key again"
        )
    return {n: check_text(config[n], n) for n in CONFIG_NAMES}


def dotenv_settings(workdir, report):
    """The settings in the .env beside agent.py, if it counts (read_dotenv), as plain values."""
    text = read_dotenv(dotenv_path(), workdir, report)
    if not text:
        return {}
    from dotenv import dotenv_values

    return dotenv_values(stream=io.StringIO(text), interpolate=False)


def learn_secrets(report):
    """Fill SECRETS, which every writer redacts, in every mode (a --replay's output holds the key
    no more than a live run's): the API key from the environment and the .env (if it counts)."""
    keys = [os.environ.get("ANTHROPIC_API_KEY")]
    # without python-dotenv, load_config says what to install, if the run needs the file
    with contextlib.suppress(ImportError):
        keys.append(dotenv_settings(None, None).get("ANTHROPIC_API_KEY"))
    SECRETS.update(k for k in keys if k and len(k) >= 8)  # a shorter one would redact words
    if any(k and len(k) < 8 for k in keys):
        report.line(
            "note: the API key is shorter than 8 characters, too short to redact without hiding ordinary words: agent.py cannot keep it out of what it writes (a server's error that echoes it, say)",
            always=True,
        )


def read_dotenv(path, workdir, report):
    """The text of the .env at `path`, or None when there is none or it does not count (stderr
    says why, unless `report` is None). It counts only as a regular file with no other name (a
    symlink or a hard link could lead to a file the model's code wrote) outside the workdir,
    owned by the user or root and writable by no one else: no file a script or another user
    could have written decides where the key and the data go."""
    # the tests' stand-in for the one .env: none
    if path is None:
        return None
    why, who = None, "the model's code"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except PermissionError as e:  # not a file anyone else could write: one this user cannot read
        if report:
            try:
                info = os.lstat(path)
                whose = f": it is {'root' if info.st_uid == 0 else user_name(info.st_uid)}'s, mode {stat.filemode(info.st_mode)}"
            except OSError:
                whose = ""
            report.error(
                f"note: cannot read {path} ({e.strerror}{whose}), so its settings are not used (set ANTHROPIC_* in the environment, or make it readable to you)"
            )
        return None
    except OSError as e:
        why = "it is a symlink" if e.errno == errno.ELOOP else e.strerror
    else:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                why = "it is not a regular file"
            elif info.st_nlink != 1:
                why = f"it has {info.st_nlink} names (hard links)"
            elif info.st_uid not in (os.geteuid(), 0):  # whoever owns it can rewrite it
                who = "another user"
                why = f"it is owned by {user_name(info.st_uid)}, not by you ({user_name(os.geteuid())}) or root"
            elif info.st_mode & 0o022:  # (an ACL granting a user write shows in the group bits)
                who = "another user"
                why = f"it is writable by {'anyone' if info.st_mode & 0o002 else 'its group'} ({stat.filemode(info.st_mode)})"
            elif workdir and Path(os.path.realpath(path)).is_relative_to(workdir):
                why = "it is inside the workdir"
            else:
                return os.read(fd, 1 << 20).decode("utf-8", "replace")
        finally:
            os.close(fd)
    fix = "make it a plain file beside agent.py"
    if who == "another user":
        fix = "chown it to yourself and chmod go-w it"
    if report:
        report.error(
            f"note: not reading {path}: {why}, so {who} could have written it (set ANTHROPIC_* in the environment, or {fix})"
        )
    return None


def no_key(workdir):
    """The missing-key line: the one .env agent.py reads, by its path, and any other .env where
    the user may expect it to be read (the current directory, the workdir), which is not."""
    path = dotenv_path()
    line = "no API key: set ANTHROPIC_API_KEY in the environment"
    # (None: the tests' stand-in for no .env)
    if path is not None:
        state = "which you cannot read"
        if not os.path.lexists(path):
            state = "copy .env.example there"
        elif os.access(path, os.R_OK):
            state = "it holds none"
        line += f" or in {path} ({state}), the one .env agent.py reads"
    places = [Path(workdir)] if workdir else []
    with contextlib.suppress(OSError):  # no current directory any more
        places.insert(0, Path.cwd())
    others = dict.fromkeys(place / ".env" for place in places)
    unread = [other for other in others if other != path and os.path.lexists(other)]
    if unread:
        line += f"; {' and '.join(map(str, unread))} {'is' if len(unread) == 1 else 'are'} never read: the model's code could have written {'it' if len(unread) == 1 else 'them'}"
    return line


def user_name(uid):
    """`nobody (uid 65534)`, or the uid alone when it has no name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def make_client(config, limits, otel=False, workdir=None):
    if importlib.util.find_spec("anthropic") is None:  # first what to install, then the key
        raise UsageError(install_hint())
    key = config["ANTHROPIC_API_KEY"]  # checked before the 2 s import, so it says so at once
    if not key:
        raise UsageError(no_key(workdir))
    if key.endswith("..."):
        raise UsageError(
            "ANTHROPIC_API_KEY is still the placeholder from .env.example: put your own key there"
        )
    odd = [i for i, c in enumerate(key) if c.isspace() or not c.isprintable()]
    if odd:  # (never the key itself in the line: where the odd character is, only)
        where = "at its start" if odd[0] == 0 else "inside it"
        where = "at its end" if odd[-1] == len(key) - 1 else where
        raise UsageError(
            f"ANTHROPIC_API_KEY has white space or a control character {where}: copy the key again, without it"
        )
    url = config["ANTHROPIC_BASE_URL"]
    if url and url != url.strip():
        raise UsageError(f"ANTHROPIC_BASE_URL {url!r} has white space around it: give it without")
    if url and not url.isprintable() or " " in (url or ""):
        raise UsageError(
            f"ANTHROPIC_BASE_URL {url!r} holds a space or a control character, which no URL has"
        )
    try:
        parts = urllib.parse.urlsplit(url or "https://api.anthropic.com")
        # raises on a port that is not a number in range
        _ = parts.port
    except ValueError as e:
        raise UsageError(f"ANTHROPIC_BASE_URL {url!r} is not a URL ({e})")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"ANTHROPIC_BASE_URL {url!r} is not an http(s) URL with a host, e.g. http://127.0.0.1:8080"
        )
    # The SDK's 200,000 objects live as long as the process: frozen, the collections of a long
    # run no longer walk them (bench_loop --compare, 100 turns: 1.32x the bare loop's CPU time
    # a turn without this, 0.97x with; docs/benchmarks.md).
    gc.disable()
    try:
        import anthropic  # here, not at the top: --help 0.085x import anthropic, 0.83x at the top
    except ImportError:
        raise UsageError(install_hint())
    finally:
        gc.freeze()
        gc.enable()
    # A server's malformed reply makes the SDK's models warn as they serialize it; agent.py
    # mends such replies itself (check_reply) and says so in the turn's notes, not on stderr.
    warnings.filterwarnings("ignore", "Pydantic serializer warnings", UserWarning)
    Connections.cut = False  # (tests make many clients in one process)
    # The URL is always given: left None, the SDK reads ANTHROPIC_BASE_URL itself, and takes an
    # empty one for a URL ('talking to ://'); empty means unset here, as in .env. The hook lets
    # Ctrl-C cut trials' requests. With --otel: agent.py's own chat spans, and no trace context
    # sent to the API.
    return anthropic.Anthropic(
        api_key=key,
        max_retries=0,
        base_url=url or ANTHROPIC_URL,
        timeout=anthropic.Timeout(limits.request_timeout, connect=10.0),
        http_client=anthropic.DefaultHttpxClient(event_hooks={"request": [Connections.hook]}),
        **({"open_telemetry": False} if otel else {}),
    )


def server_url(url):
    """ANTHROPIC_BASE_URL as a transcript records it (None if it is no URL): scheme, host, port
    and path, never a user:password@, query or fragment, which can carry keys."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host:
        return None
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    return parts._replace(netloc=netloc, query="", fragment="").geturl()


def already_streamed(report):
    """True when stdout is the very file, pipe or terminal stderr is (`> log 2>&1`,
    `2>&1 | tee log`): the answer streamed there already, and printing it again shows it twice."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return not report.quiet and (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino)


def main(argv=None, client=None, stdin=None):
    """Parse the flags, run the mode they name and return its exit code. A failure before a run
    starts becomes one line and its exit code here; a run says how it stopped itself."""
    report = Reporter()
    STOPPING.clear()
    if hasattr(sys.stdout, "reconfigure"):
        # a lone surrogate must not crash it
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        if args.schema:
            return schema_mode(args)
        # before any file is read: whatever it holds, the key is never written
        learn_secrets(report)
        if args.report:
            return report_mode(args, report)
        if args.export:
            return export_mode(args, report)
        stdin = checked_stdin(args, stdin)
        system = read_system_prompt(args.system_prompt) if args.system_prompt else None
        if args.count_tokens:
            return count_tokens_mode(args, client, system, report)
        run = Run(args, client, stdin, system, report)
    except UsageError as e:
        report.error(f"agent.py: {e}")
        return EXIT_USAGE
    except SystemExit as e:  # --help, --version
        return e.code or 0
    except (KeyboardInterrupt, Exception) as e:  # Ctrl-C before anything was sent, or a bug
        if isinstance(e, FileNotFoundError) and cwd_gone():
            report.error(f"agent.py: {CWD_GONE}")
            return EXIT_USAGE
        return failed(report, stop_for(e, api=False))
    return run_mode(run)


def schema_mode(args):
    """--schema: print one JSON Schema."""
    to_stdout(json.dumps(SCHEMAS[args.schema], indent=2))
    return 0


def report_mode(args, report):
    """--report: an HTML report of a saved run."""
    for written in write_report(kept_run(args.report, "--report", report), args.output):
        report.line(f"report: {written}", always=True)
    return 0


def export_mode(args, report):
    """--export atif: a saved run as an ATIF trajectory."""
    for written in export_atif(kept_run(args.export[1], "--export", report), args.output):
        report.line(f"atif: {written}", always=True)
    return 0


def checked_stdin(args, stdin):
    """stdin as a run reads it, once the question was taken from it (-); a UsageError when the
    current directory or stdout is gone."""
    stdin = stdin or sys.stdin or io.StringIO()  # closed (<&-): as if it held nothing
    # every relative path, a recorded workdir's too, would fail
    if cwd_gone():
        raise UsageError(CWD_GONE)
    if sys.stdout is None:  # >&-
        raise UsageError(
            "stdout is closed: nowhere to write the answer (give > FILE, or > /dev/null)"
        )
    if args.question == "-":
        args.question = read_question(stdin).strip()
        stdin = QuestionWasRead()
        if not args.question:
            raise UsageError("the question is - but stdin held none")
    # no terminal shows the answer: agreed's question does (a stdin with no file is left as is)
    with contextlib.suppress(AttributeError, ValueError, OSError):
        if not stdin.isatty():
            stdin = PipedAnswers(stdin)
    return stdin


def count_tokens_mode(args, client, system, report):
    """--count-tokens: what the question would cost in input tokens, from the API."""
    config = load_config(None, report)
    model = args.model or config["ANTHROPIC_MODEL"] or DEFAULT_MODEL
    if args.question is None:
        report.line(f"no question given: counting the example {EXAMPLE_QUESTION!r}", always=True)
    client = client or make_client(config, Limits())
    question = args.question or EXAMPLE_QUESTION
    try:
        to_stdout(count_tokens(client, model, question, system or SYSTEM_PROMPT))
    except Exception as e:  # the server's answer, or its refusal: one line
        stop = stop_for(e)
        report.error(f"agent.py: --count-tokens: {stop.reason}: {stop.detail}")
        return stop.exit_code
    return 0


class Run:
    """A run checked and set up, nothing sent yet, which each mode reads. Setting it up checks
    all a run checks before its first request: the file it goes on from, its workdir, the
    settings, the user's consent to what the file says, the outputs and the kept copy."""

    def __init__(self, args, client, stdin, system, report):
        self.args = args
        self.report = report
        self.stdin = stdin
        self.system = system
        self.run_id = uuid.uuid4().hex
        report.quiet = args.quiet
        # the variable is checked either way
        args.no_keep = no_keep_variable() or args.no_keep
        asked = args.resume
        args.resume = kept_run(args.resume, "--resume", report)
        args.replay = kept_run(args.replay, "--replay", report)
        # the resumed session, and how many of its tool calls were left unanswered
        self.session, self.unanswered = None, 0
        if args.resume:
            loaded = load_transcript(args.resume)
            self.session, self.unanswered = prepare_resume(loaded, args.question)
        self.replay = load_recording(args.replay) if args.replay else None
        # a file: what it says is used only if the user agrees
        recorded = self.session or self.replay or {}
        self.workdir = run_workdir(args, recorded)
        check_resumed_outside(args, asked, self.workdir, recorded)
        config = dict.fromkeys(CONFIG_NAMES) if self.replay else load_config(self.workdir, report)
        # ANTHROPIC_BASE_URL as the transcript records it; None: Anthropic's
        self.server = server_url(config["ANTHROPIC_BASE_URL"] or "")
        if self.server and "@" in urllib.parse.urlsplit(config["ANTHROPIC_BASE_URL"]).netloc:
            report.error(
                "note: ANTHROPIC_BASE_URL holds a user:password@, which is sent as the Authorization header in place of the API key's"
            )
        model = args.model or config["ANTHROPIC_MODEL"] or recorded.get("model") or DEFAULT_MODEL
        self.model = model
        ask_to_go_on(self, client, config)
        if self.session is not None and system:
            self.session["system"] = system
        # --resume goes on in the file it continues, but a kept trial stays as it ran: the run
        # goes on as a new kept run
        target = args.transcript or args.resume
        if target == args.resume and args.resume and is_kept(args.resume, trial=True):
            target = None
        # where the model's code can write, if not everywhere
        reach = None if args.no_sandbox else self.workdir
        self.output, self.trial_outputs, events_out = open_outputs(args, target, reach)
        budgets = {"--budget-usd": args.budget_usd, "--trials-budget-usd": args.trials_budget_usd}
        flag = next((name for name, given in budgets.items() if given is not None), None)
        if flag and base_model(model) not in PRICING:
            raise UsageError(f"{flag} needs a known price, and {model} is not in the pricing table")
        # each limit a flag of the same name sets, and the two flags named otherwise
        limits = {name: value for name, value in vars(args).items() if hasattr(Limits, name)}
        limits.update(clear_at=args.clear_tool_results, keep_results=args.keep_tool_results)
        self.limits = Limits(**limits)
        # a replay runs the recording's replies, under the limits in which they ended as they did
        if self.replay:
            self.limits = replay_limits(self.replay, self.limits)
            client = ReplayClient(self.replay, args.replay)
        if client is None:
            client = make_client(config, self.limits, otel=args.otel, workdir=self.workdir)
        self.client = client
        self.telemetry = Telemetry.start(report) if args.otel else None
        self.events = Events.open(events_out, self.run_id) if args.events else None
        # Every run is kept but a replay, and a run that goes on in a kept file (--resume last)
        going_on = bool(args.resume) and target == args.resume and is_kept(args.resume)
        self.kept, self.kept_trials = None, {}
        if not (args.no_keep or self.replay or going_on):
            self.kept, self.kept_trials = keep_run(self.run_id, reach, report, args.trials or 0)
        named = self.kept
        if going_on:
            named = KeptRun(KEPT_FILE.fullmatch(self.output.name)[1], self.output, report)
        # the line that names the kept run, said once
        self.kept_line = named.said() if named else None


def run_workdir(args, recorded):
    """The run's workdir: --workdir, else the one the resumed or replayed file recorded, else
    the current directory; a UsageError if it is no directory or is refused."""
    source = args.resume or args.replay
    given = args.workdir or recorded.get("workdir")
    # `why` it is no directory ("" if it is none, None if it is one): a path a transcript
    # recorded may be anything (a name too long, 6,000 characters)
    try:
        workdir = Path(os.path.realpath(given or "."))
        why = None if workdir.is_dir() else ""
    except OSError as e:
        workdir, why = given, f" ({e.strerror})"
    if args.workdir:
        # and its real path, when that says more
        where = f"--workdir {args.workdir}"
        if args.workdir != str(workdir):
            where += f" ({workdir})"
    elif recorded:
        where = f"the workdir {source} recorded ({shown_path(workdir)})"
    else:
        where = f"the current directory ({workdir}; no --workdir was given)"
    if why is not None:
        gone = not why and not os.path.lexists(workdir)
        missing = "does not exist" if gone else "is not a directory"
        # not the user's word: name the file, and the way out
        if recorded and not args.workdir:
            # as the file recorded it, and where that is from here if it differs (a relative one)
            shown = shown_path(given)
            if shown != shown_path(workdir):
                shown += f" (here {shown_path(workdir)})"
            raise UsageError(
                f"{source} recorded the workdir {shown}, which {missing}{why} here: give -C DIR (--workdir) to {'replay' if args.replay else 'resume'} it in another directory"
            )
        home = ""
        if gone and args.workdir.startswith("~"):
            home = "; a ~ in quotes is not your home directory: leave it unquoted, or write $HOME"
        raise UsageError(f"{where} {missing}{why}{home}")
    # unconfined, the model's code can write anywhere anyway
    if not args.no_sandbox:
        check_workdir(workdir, where)
        check_runs_apart(workdir, where)
    return workdir


def check_resumed_outside(args, asked, workdir, recorded):
    """Refuse to resume a file inside the workdir (this run's or the recorded one), where the
    model's code could have rewritten it."""
    if not args.resume:
        return
    resumed = Path(os.path.realpath(args.resume))
    for inside in {workdir, Path(os.path.realpath(recorded.get("workdir") or workdir))}:
        if not resumed.is_relative_to(inside):
            continue
        # a kept run, by its name
        if inside != workdir and asked != args.resume:
            raise UsageError(
                f"--resume {asked} is the kept run {args.resume}, made by a run whose workdir, {inside}, holds the kept runs (only --no-sandbox allows that): its code could have rewritten this file, so it is not resumed; give another run's id (--resume ID; they are in {Path(args.resume).parent}), or remove this one (rm {args.resume})"
                + (" and last names the one before" if asked == "last" else "")
            )
        raise UsageError(
            f"--resume {args.resume} is inside the workdir {inside}, where the model's code could have rewritten it; it is not resumed (move it out of the workdir if you trust it)"
        )


def ask_to_go_on(run, client, config):
    """What a resumed or replayed file decides (its workdir, model, system prompt, server) is
    used only when the user agrees; a UsageError if they do not."""
    args = run.args
    session = run.session
    source = args.resume or args.replay
    taken = {}
    if (session or run.replay) and not args.workdir:
        taken["--workdir DIR"] = ("workdir", str(run.workdir), "")
    # the model the resumed file recorded, taken where neither -m nor ANTHROPIC_MODEL names one
    default = args.model or config["ANTHROPIC_MODEL"] or DEFAULT_MODEL
    if session is not None and run.model != default:
        taken["--model ID"] = ("model", run.model, "")
    made_with = session.get("base_url") if session is not None else run.server
    made_with = (server_url(made_with) or made_with if is_str(made_with) else None) or ANTHROPIC_URL
    going_to = run.server or ANTHROPIC_URL
    # its whole history goes to this server: the user says so, in one line, its URL fitted
    if made_with != going_to:
        moved = f" (its history would now go to {visible(going_to)})"
        taken[ELSEWHERE] = ("server", made_with, moved)
    prompt = own_prompt(session) if session is not None and run.system is None else None
    if prompt:
        taken["--system-prompt FILE"] = ("system prompt", prompt, f" ({len(prompt):,} characters)")
    # a run agent.py kept itself, as it wrote it: only a server change is asked about
    if taken and own_kept_run(source):
        taken = {flag: value for flag, value in taken.items() if flag == ELSEWHERE}
    if not taken:
        return
    # what to install comes first, before any question
    if not run.replay and client is None and importlib.util.find_spec("anthropic") is None:
        raise UsageError(install_hint())
    if agreed(consent_question(source, taken.values(), terminal_size()[1]), run.stdin):
        return
    if run.replay:
        raise UsageError(f"not replayed: give --workdir DIR to say where {source} runs")
    # what a flag can say
    given = [flag for flag in taken if flag != ELSEWHERE]
    why = [f"give {' and '.join(given)} to say how {source} goes on"] if given else []
    # ANTHROPIC_BASE_URL was given: only a y consents
    if ELSEWHERE in taken:
        why.append(
            f"{source} goes on with a server other than the one that made it only when you answer y (echo y | agent.py ...)"
        )
    raise UsageError("not resumed: " + "; and ".join(why))


def open_outputs(args, target, reach):
    """The transcript (at `target`), each trial's transcript and the events file, each checked
    to be writable and none the same file as another or as an input; `reach` None: everywhere."""
    # agent.py names the files of kept runs
    if args.transcript not in (None, "-") and in_runs_dir(args.transcript):
        raise UsageError(
            f"--transcript {args.transcript} is in the directory of kept runs, whose files agent.py names by run id: give a path elsewhere (the run is kept there anyway)"
        )
    output = None
    if target not in (None, "-"):
        output = OutputFile(target, reach, "--transcript" if args.transcript else "--resume")
    if args.trials:
        room_for_trials(args.trials)
    indices = range(1, args.trials + 1) if args.trials and output else ()
    trial_outputs = {i: OutputFile(trial_path(output.path, i), reach, named=False) for i in indices}
    events_out = None
    if args.events not in (None, "-"):
        events_out = OutputFile(args.events, reach, "--events", stream=True)
    written = [(flag, o) for flag, o in (("--transcript", output), ("--events", events_out)) if o]
    trials = [(f"trial {i}'s transcript", o) for i, o in trial_outputs.items()]
    check_distinct(written + trials)
    if events_out and args.resume:
        check_distinct([("--events", events_out)], [("--resume", args.resume)])
    # each read once at the start: an output on one would replace it
    given = (("--replay", args.replay), ("--system-prompt", args.system_prompt))
    read = [(flag, path) for flag, path in given if path]
    if read:
        check_distinct(written + trials, read)
    return output, trial_outputs, events_out


def run_mode(run):
    """Run the trials or the one session Run set up, and say how they stopped; the exit code."""
    report = run.report
    args = run.args
    report.events = run.events
    report.telemetry = run.telemetry
    if base_model(run.model) not in PRICING:
        report.error(f"note: no price is known for {run.model}; cost_usd will be null")

    # on stderr unless --quiet; in the events always
    def sandbox_status(status):
        report.line(status)
        report.emit("sandbox", status=status, confined=bool(sandbox.confined))

    sandbox = Sandbox(run.workdir, not args.no_sandbox, run.limits, sandbox_status)
    approve = make_approver(args.yes, args.no_sandbox, sandbox, run.stdin)
    decline = args.decline_message or DECLINE_MESSAGE
    ctx = ToolContext(run.workdir, run.limits, sandbox, approve, decline)
    started = time.monotonic()
    sources = {"resumed_from": args.resume, "replayed_from": args.replay, "trials": args.trials}
    report.emit(
        "run.start",
        schema_version=EVENTS_VERSION,
        agent_version=AGENT_VERSION,
        model=run.model,
        workdir=str(run.workdir),
        question=run.replay["question"] if run.replay else args.question,
        limits=asdict(run.limits),
        sandbox={"enabled": not args.no_sandbox, "status": "proven at the first run_python call"},
        **{name: value for name, value in sources.items() if value},
    )
    try:
        if args.trials:
            return trials_mode(run, ctx)
        run.session = session_of(run)
        return session_mode(run, ctx, started)
    # the disk filled up, Ctrl-C outside a turn, a bug: one line
    except BaseException as e:
        stop = stop_for(e, api=False)
        failed(report, stop)
        if run.kept_line and run.session and not args.trials:
            report.line(run.kept_line)
        run_stop_event(report, stop, run.session, started)
        return stop.exit_code
    finally:
        # its launcher, if the run started one, ends with the run
        sandbox.close()
        if run.telemetry:
            run.telemetry.finish(report)
        if run.events:
            run.events.close()


def trials_mode(run, ctx):
    """--trials: run the question K times, write the summary, and exit as the trials went."""
    args = run.args
    asked = (args.question, run.model, args.effort, args.trials, args.jobs)
    expected = (args.expect, args.expect_tool, args.expect_stop)
    system = run.system or SYSTEM_PROMPT
    spec = TrialSpec(*asked, *expected, args.quiet, system, run.server, args.trials_budget_usd)
    summary = run_trials(
        spec, run.client, ctx, run.trial_outputs, run.events, run.telemetry, run.kept_trials
    )
    if run.events and run.events.lost:
        summary["events_lost"] = run.events.lost
    if args.transcript == "-":
        to_stdout(for_terminal(dump(summary)))
    elif run.output:
        run.output.write(dump(summary), durable=True)
    # the kept copy: the same summary, naming the kept trials' files
    if run.kept:
        paths = {i: str(kept.output.path) for i, kept in run.kept_trials.items()}
        trials = [{**t, "transcript": paths[t["index"]]} for t in summary["trials"]]
        run.kept.write(dump({**summary, "trials": trials}), final=True)
        run.report.line(run.kept_line)
    label, code, detail = trials_stop(summary)
    # trials have no one answer, usage, turn count or time
    none = dict.fromkeys(("answer", "usage", "turns", "seconds"))
    run.report.emit("run.stop", stop=label, detail=detail, exit_code=code, **none)
    return code


def session_of(run):
    """The session a run drives: the recording's turns run again (--replay), the saved one set to
    go on with this run's model, workdir and server (--resume), or a new one."""
    args = run.args
    if run.replay:
        run.report.line(
            f"replaying {args.replay}: {plural(len(run.replay['turns']), 'turn')} recorded from {made_by(run.replay)}; workdir {run.workdir}; nothing is sent"
        )
        return replay_session(run.replay, run.workdir, run.run_id, args.replay)
    session = run.session
    if session is None:
        asked = (args.question, run.model, run.workdir, args.effort, run.run_id)
        session = new_session(*asked, run.system or SYSTEM_PROMPT)
    else:
        session.update(model=run.model, workdir=str(run.workdir), run_id=run.run_id)
        session["effort"] = args.effort or session.get("effort")
        pending = ""
        if run.unanswered:
            pending = f"; {plural(run.unanswered, 'pending tool call')} answered 'not run'"
        run.report.line(
            f"resuming {args.resume}: {plural(len(session['turns']), 'turn')} so far; workdir {run.workdir}; model {run.model}{pending}"
        )
    # the server of this run, not the last one's
    session.pop("base_url", None)
    if run.server:
        session["base_url"] = run.server
    return session


def session_mode(run, ctx, started):
    """Drive the session to its stop, say the stop line, print the answer; the exit code."""
    args = run.args
    report = run.report
    session = run.session
    save = Saver(run.output, run.kept)
    # a replay also checks each turn's tool results against the recording
    checked = ReplayCheck(run.replay, run.client, report, save, args.strict) if run.replay else save
    report.trace("begin", session)
    stop = drive(run.client, session, ctx, report, checked)
    report.trace("end", stop, session)
    report.flush_text()
    usage = session["usage"]
    turns = plural(len(session["turns"]), "turn")
    cost = "cost unknown" if usage["cost_usd"] is None else f"${usage['cost_usd']:.6f}"
    say = report.error if stop.exit_code not in (0, 3) else report.line
    # nothing on stdout: say so here
    empty = ""
    if stop.reason in TEXT_STOPS and stop.exit_code == 0 and not (session["answer"] or "").strip():
        empty = ", with no text"
    say(
        f"stop: {stop.reason} ({said_stop(stop)}{empty}); {turns}, {usage['tokens']} tokens, {cost}{failed_said(session)}"
    )
    if run.kept_line:
        report.line(run.kept_line)
        # said: not again if the answer cannot be written
        run.kept_line = None
    if args.transcript == "-":
        to_stdout(for_terminal(dump(session)))
    elif session["answer"] and args.events != "-" and not already_streamed(report):
        to_stdout(visible(session["answer"]) if sys.stdout.isatty() else session["answer"])
    run_stop_event(report, stop, session, started)
    # the transcript says so, if they were
    save.events_lost(session, run.events)
    return stop.exit_code


def failed_said(session):
    """The stop line's word on what failed attempts reported spending, if they did."""
    spent = session.get("failed_usage")
    if not spent:
        return ""
    ended = session.get("stop") or {}
    # each retry, and the last attempt of a failed turn
    retries = sum(len(t.get("retries") or []) for t in session["turns"])
    attempts = retries + len(ended.get("retries") or []) + ("failed_usage" in ended)
    cost = "cost unknown" if spent["cost_usd"] is None else f"${spent['cost_usd']:.6f}"
    return f", and {spent['tokens']} tokens, {cost} that the server reported for {plural(attempts, 'failed attempt')} (billed, not in the totals above)"


def said_stop(stop):
    """A Stop's detail as the stop line says it: with how many attempts failed, when the turn
    was retried (with -q, the retry lines before it do not show)."""
    return stop.detail + (f"; after {len(stop.retries) + 1} attempts" if stop.retries else "")


def failed(report, stop):
    """Say in one line why agent.py stopped outside a turn; return its exit code."""
    said = "internal error: " + stop.detail
    if stop.reason == "interrupted":
        said = "interrupted"
    elif stop.detail.startswith(OutputLost.prefix):
        said = stop.detail
    report.error(f"agent.py: {said}")
    return stop.exit_code


class OutputLost(Exception):
    """What agent.py had to write could not be (stdout or a device full, or closed): one line,
    exit 1 (error), never the label of a bug."""

    prefix = "cannot write to "


CWD_GONE = "the current directory no longer exists (it was removed): cd to one that does"


def cwd_gone():
    """True when the current directory was removed while agent.py stood in it."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


@contextlib.contextmanager
def answer_screen(stdin):
    """Where a question is asked: stderr, or the terminal (/dev/tty) the answer comes from when
    stderr is not one (`2>log`): a question in the log would leave the run waiting unseen."""
    screen = None
    # no controlling terminal: stderr it is
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if stdin.isatty() and not sys.stderr.isatty():
            screen = open("/dev/tty", "w", encoding="utf-8", errors="replace")
    try:
        yield screen
    finally:
        if screen:
            with contextlib.suppress(OSError):
                screen.close()


def to_stderr(text, stream=None):
    """Text on stderr (or `stream`); True if it could be written. A reader that went away
    (`2>&1 | head`) ends the progress, not the run: what is left goes nowhere."""
    stream = stream or sys.stderr
    try:
        stream.write(redact(text))
        stream.flush()
        return True
    except BrokenPipeError:
        if stream is sys.stderr:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
        return False


def to_stdout(data):
    """Bytes or a line of text on stdout. A reader that goes away (`| head`) ends the output,
    not the run: what is left goes nowhere, and the run ends as it would have."""
    data = redact(data)
    try:
        sys.stdout.flush()
        if isinstance(data, str):
            sys.stdout.write(data + "\n")
        else:
            sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as e:  # /dev/full, a full disk
        raise OutputLost(f"{OutputLost.prefix}stdout: {e.strerror}") from e
    except AttributeError as e:  # closed (>&-): Python's sys.stdout is None
        raise OutputLost(f"{OutputLost.prefix}stdout: it is closed") from e


if __name__ == "__main__":
    # SIGHUP: the terminal closed or ssh dropped; the run is kept
    for stop_signal in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(stop_signal, on_stop_signal)
    sys.exit(main())
