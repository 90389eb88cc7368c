"""A local Messages API on 127.0.0.1 for the real anthropic SDK (ANTHROPIC_BASE_URL).

It answers POST /v1/messages from a script, as SSE streams like the real API, and
rejects with a 400 (the API's own error shape and message) every request that
api_rules.check_request says the real API would reject. Script items:

  {"content": [...], "stop_reason": ...}   a message, streamed as SSE events (with its
                                             "_headers", if it has any)
  {"sse": "file.sse"} or {"sse_text": ...}  a recorded stream, sent byte for byte
  {"status": 529, "body": {...}, "headers": {...}}   an HTTP error
  {"pings": seconds}                         headers, then only ping events for that long
  {"drip": message, "every": seconds}        message's stream (or SSE text), an event every
                                             `seconds`
  {"endless": text, "every": seconds}        a text block that never ends: `text` again and
                                             again, every `seconds`, until the client goes
                                             (or 60 s have passed, so that no test can hang)
  {"reset": message, "after": n}             n events of message's stream, then a TCP reset
  {"disconnect": True}                        the request read, then the connection closed unanswered
  callable(request_body) -> one of the above

FakeAPI(script, drop_idle=True) speaks HTTP/1.1 and keeps connections open, then closes each
one after its reply without saying so, as llama.cpp's server does.
"""

import functools
import itertools
import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from api_rules import check_request, remember
from fakes import RECORDED


def sse(event, data):
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def stream_of(message, complete=True):
    """The SSE events the API would send for `message` (text split in two deltas)."""
    usage = message.get("usage", {})
    start = {k: v for k, v in message.items() if not k.startswith("_")}
    start.update(content=[], stop_reason=None, usage=dict(usage, output_tokens=1))
    out = [sse("message_start", {"type": "message_start", "message": start})]
    for i, block in enumerate(message["content"]):
        kind = block["type"]
        first = {
            "text": {"type": "text", "text": ""},
            "tool_use": {**block, "input": {}},
            "thinking": {"type": "thinking", "thinking": "", "signature": ""},
        }.get(kind, block)
        out.append(
            sse(
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": first},
            )
        )
        deltas = []
        if kind == "text":
            half = len(block["text"]) // 2
            deltas = [
                {"type": "text_delta", "text": t}
                for t in (block["text"][:half], block["text"][half:])
                if t
            ]
        elif kind == "tool_use":
            deltas = [
                {"type": "input_json_delta", "partial_json": ""},
                {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
            ]
        elif kind == "thinking":
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        for delta in deltas:
            out.append(
                sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": i, "delta": delta},
                )
            )
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": i}))
    out.append(
        sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": usage,
            },
        )
    )
    if complete:
        out.append(sse("message_stop", {"type": "message_stop"}))
    return "".join(out)


def message_of(sse_text):
    """Accumulate a recorded stream back into the message it carries (for remember())."""
    message, buffers = {"content": []}, {}  # a stream may lack message_start (llama-server)
    for chunk in sse_text.split("\n\n"):
        data = [l[5:].strip() for l in chunk.splitlines() if l.startswith("data:")]
        if not data:
            continue
        event = json.loads(data[0])
        if event["type"] == "message_start":
            message = event["message"]
        elif event["type"] == "content_block_start":
            message["content"].append(event["content_block"])
        elif event["type"] == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            try:  # a malformed stream: the fake only has to remember what it can
                if delta["type"] == "text_delta":
                    block["text"] += delta["text"]
                elif delta["type"] == "thinking_delta":
                    block["thinking"] += delta["thinking"]
                elif delta["type"] == "signature_delta":
                    block["signature"] = delta["signature"]
                elif delta["type"] == "input_json_delta":
                    buffers[event["index"]] = (
                        buffers.get(event["index"], "") + delta["partial_json"]
                    )
            except (TypeError, KeyError):
                continue
        elif event["type"] == "message_delta":
            message["stop_reason"] = event["delta"].get("stop_reason")
    for index, raw in buffers.items():
        try:
            message["content"][index]["input"] = json.loads(raw) if raw else {}
        except (json.JSONDecodeError, TypeError):
            pass
    return message


class FakeAPI:
    """Serve a script on 127.0.0.1; record every request; reject what the API would."""

    def __init__(self, script=(), drop_idle=False, request_id=True):
        self.script, self.requests, self.rejected, self.issued = list(script), [], [], {}
        self.ids, self.request_id = itertools.count(1), request_id
        self.lock, self.connections, self.counted = threading.Lock(), 0, []
        self.stopping = False  # set on exit: an endless stream stops too
        self.headers = []  # of every request, names in lower case
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if drop_idle else "HTTP/1.0"

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                api.connections += 1

            def do_POST(self):
                api.headers.append({k.lower(): v for k, v in self.headers.items()})
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if self.path.split("?")[0] not in ("/v1/messages", "/v1/messages/count_tokens"):
                    return api.send(
                        self,
                        404,
                        {
                            "type": "error",
                            "error": {  # as the API says
                                "type": "not_found_error",
                                "message": "Not Found",
                            },
                        },
                    )
                if self.path.startswith("/v1/messages/count_tokens"):
                    return api.count(self, body)
                body["_betas"] = [
                    b for b in (self.headers.get("anthropic-beta") or "").split(",") if b
                ]
                api.respond(self, body)
                if drop_idle:  # keep-alive was promised; close anyway, without a word
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        # (it looks for shutdown() every 0.02 s: at the default 0.5 s each test's stop of its
        # server waited 0.25 s on average, 30 s over the suite)
        serve = functools.partial(self.server.serve_forever, poll_interval=0.02)
        threading.Thread(target=serve, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stopping = True
        self.server.shutdown()
        self.server.server_close()

    def send(self, handler, status, payload, content_type="application/json", headers=None):
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("content-type", content_type)
        handler.send_header("content-length", str(len(data)))
        if self.request_id:
            handler.send_header("request-id", f"req_local_{next(self.ids)}")
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)

    def count(self, handler, body):
        """POST /v1/messages/count_tokens: 4 bytes a token, + 286 with tools, as FakeClient."""
        self.counted.append(body)
        size = (
            len(
                json.dumps(
                    [body.get("system"), body.get("tools"), body["messages"]], ensure_ascii=False
                ).encode()
            )
            // 4
        )
        self.send(handler, 200, {"input_tokens": size + (286 if body.get("tools") else 0)})

    def respond(self, handler, body):
        betas = body.pop("_betas", [])
        with self.lock:
            self.requests.append(body)
            error = check_request(body, self.issued, betas)
            item = self.script.pop(0) if self.script and not error else None
        if error:
            self.rejected.append(error)
            return self.send(
                handler,
                400,
                {"type": "error", "error": {"type": "invalid_request_error", "message": error}},
                headers={"x-should-retry": "false"},
            )
        if item is None:
            return self.send(
                handler,
                500,
                {
                    "type": "error",
                    "error": {"type": "api_error", "message": "fake_api: script exhausted"},
                },
                headers={"x-should-retry": "false"},
            )
        if callable(item):
            item = item(body)
        if "status" in item:
            return self.send(handler, item["status"], item["body"], headers=item.get("headers"))
        if "pings" in item or "reset" in item or "drip" in item or "endless" in item:
            return self.misbehave(handler, item)
        if item.get("disconnect"):  # as a server does that closed a kept-alive connection
            handler.close_connection = True
            return handler.connection.shutdown(socket.SHUT_RDWR)
        if "sse" in item or "sse_text" in item:
            text = item.get("sse_text") or (RECORDED / item["sse"]).read_text()
            text = text.rstrip("\n") + "\n\n"  # some recordings lost the final blank line
            remember(self.issued, message_of(text))
            return self.send(handler, 200, text, "text/event-stream")
        remember(self.issued, item)
        self.send(
            handler,
            200,
            stream_of(item, complete=not item.get("_cut")),
            "text/event-stream",
            headers=item.get("_headers"),
        )

    def misbehave(self, handler, item):
        """A stream that is slow or never finishes: pings only, events far apart, text without
        end, or a few events and then a TCP reset."""
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.end_headers()
        handler.close_connection = True
        try:
            if "drip" in item:  # a message, or a stream's text as it is sent
                text = item["drip"] if isinstance(item["drip"], str) else stream_of(item["drip"])
                remember(self.issued, message_of(text))
                for event in text.split("\n\n")[:-1]:
                    handler.wfile.write((event + "\n\n").encode())
                    handler.wfile.flush()
                    time.sleep(item["every"])
                return
            if "endless" in item:
                start = stream_of(
                    {
                        "id": "msg_endless",
                        "type": "message",
                        "role": "assistant",
                        "model": "m",
                        "content": [{"type": "text", "text": ""}],
                        "stop_reason": "end_turn",
                        "usage": {},
                    }
                ).split("\n\n")[:2]
                handler.wfile.write(("\n\n".join(start) + "\n\n").encode())
                delta = sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": item["endless"]},
                    },
                )
                ends = time.monotonic() + item.get("for", 60)  # a test of old code fails, no hang
                while not self.stopping and time.monotonic() < ends:
                    handler.wfile.write(delta.encode())
                    handler.wfile.flush()
                    time.sleep(item["every"])
                return
            if "pings" in item:
                ends = time.monotonic() + item["pings"]
                while time.monotonic() < ends:
                    handler.wfile.write(sse("ping", {"type": "ping"}).encode())
                    handler.wfile.flush()
                    time.sleep(0.05)
                return
            events = stream_of(item["reset"]).split("\n\n")[: item["after"]]
            handler.wfile.write(("\n\n".join(events) + "\n\n").encode())
            handler.wfile.flush()
            handler.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )  # close() now sends RST
            handler.connection.close()
        except OSError:
            pass  # the client hung up: what a stalled stream should make it do
