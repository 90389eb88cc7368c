"""A scripted stand-in for anthropic.Anthropic, and helpers to write replies.

FakeClient pops one scripted reply per request, records a deep copy of every request
and checks each against the API's rules (api_rules.py): a request the real API would
reject raises a 400 and is kept in `violations`, which the autouse fixture in
conftest.py turns into a test failure.
"""

import copy
import itertools
import json
from pathlib import Path
from types import SimpleNamespace

from api_rules import check_request, remember

RECORDED = Path(__file__).resolve().parent / "fixtures" / "recorded"  # see its SOURCES.md
ALL_CLIENTS = []
_ids = itertools.count(1)


def text(s):
    return {"type": "text", "text": s}


def tool_use(name, input, id=None):
    return {"type": "tool_use", "id": id or f"toolu_{next(_ids):04d}", "name": name, "input": input}


def usage(input_tokens=100, output_tokens=10, write=0, read=0, **extra):
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
        **extra,
    }


def reply(*blocks, stop_reason=None, **usage_fields):
    """An assistant message; stop_reason defaults to tool_use if it calls a tool."""
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return {
        "id": f"msg_{next(_ids):04d}",
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku-5-5",
        "content": list(blocks),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage(**usage_fields),
    }


class FakeAPIError(Exception):
    """Shaped like anthropic.APIStatusError: status_code, body, response.headers."""

    def __init__(self, status, kind, message, headers=None):
        super().__init__(message)
        self.status_code = status
        self.message = message
        self.body = {"type": "error", "error": {"type": kind, "message": message}}
        self.response = SimpleNamespace(headers=headers or {})


class APIConnectionError(Exception):
    """Named like the SDK's, which is how agent.py recognises a network failure."""


class Midstream:
    """A reply whose stream sends its text, then fails with `error` (an SSE error event)."""

    def __init__(self, message, error):
        self.message, self.error = message, error


class Truncated:
    """A reply whose stream closes before message_stop."""

    def __init__(self, message):
        self.message = message


class Chunked:
    """A reply whose text streams in deltas of `size` characters, as a long answer does."""

    def __init__(self, message, size=5):
        self.message, self.size = message, size


class FakeStream:
    def __init__(self, item):
        self.item = item
        self.request_id = f"req_fake_{next(_ids):04d}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __iter__(self):
        message = getattr(self.item, "message", self.item)
        size = getattr(self.item, "size", None)
        for block in message["content"]:
            if block["type"] == "thinking" and block.get("thinking"):
                yield SimpleNamespace(type="thinking", thinking=block["thinking"])
            if block["type"] == "text" and block["text"]:
                step = size or len(block["text"])
                for i in range(0, len(block["text"]), step):
                    yield SimpleNamespace(type="text", text=block["text"][i : i + step])
        if isinstance(self.item, Midstream):
            raise self.item.error
        if not isinstance(self.item, Truncated):
            yield SimpleNamespace(type="message_stop")

    def get_final_message(self):
        return copy.deepcopy(getattr(self.item, "message", self.item))


class FakeClient:
    """Pops scripted replies; an Exception item is raised, a callable item is called."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.requests, self.violations, self.issued, self.counted = [], [], {}, []
        self.messages = self
        self.beta = SimpleNamespace(messages=SimpleNamespace(stream=self.stream))
        ALL_CLIENTS.append(self)

    def count_tokens(self, **request):
        """messages.count_tokens, as a stand-in: 4 bytes a token, plus the tool-use system
        prompt the API adds when there are tools (286 tokens for the 5.5 models)."""
        self.counted.append(json.loads(json.dumps(request)))
        size = (
            len(
                json.dumps(
                    [request.get("system"), request.get("tools"), request["messages"]],
                    ensure_ascii=False,
                ).encode()
            )
            // 4
        )
        return SimpleNamespace(input_tokens=size + (286 if request.get("tools") else 0))

    def stream(self, betas=(), **request):
        body = json.loads(json.dumps(request))  # what would go over the wire
        body["_betas"] = list(betas)
        self.requests.append(body)
        error = check_request({k: v for k, v in body.items() if k != "_betas"}, self.issued, betas)
        if error:
            self.violations.append(error)
            raise FakeAPIError(400, "invalid_request_error", error)
        if not self.replies:
            raise AssertionError("FakeClient ran out of scripted replies")
        item = self.replies.pop(0)
        if callable(item) and not isinstance(item, type):
            item = item(body)
        if isinstance(item, BaseException):
            raise item
        remember(self.issued, getattr(item, "message", item))
        return FakeStream(item)


def recorded_loop(name):
    """The exchanges of a recorded multi-turn loop (*.jsonl)."""
    return [json.loads(line) for line in (RECORDED / name).read_text().splitlines() if line]


def alive(pid):
    """True unless the process is gone or a zombie (PID 1 here may never reap orphans)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # (gone between the open and the read)
        return False
