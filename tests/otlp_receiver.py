"""A stand-in OpenTelemetry collector on 127.0.0.1: OTLP/HTTP traces (POST /v1/traces,
protobuf, gzip or not), decoded with opentelemetry-proto; every span it was sent is kept.

    with OTLPReceiver() as collector:   # OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint
        ...
        collector.spans()  # [(resource attributes, span)], span as opentelemetry.proto's Span
        collector.bodies   # every request body as sent (decompressed): the bytes to search

and HostileCollector, one that answers with an endless body, a drip, or a redirect.
"""

import functools
import gzip
import socket
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def value_of(any_value):
    """An OTLP AnyValue as Python: a string, number, bool or list."""
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def attributes(span_or_resource):
    return {kv.key: value_of(kv.value) for kv in span_or_resource.attributes}


class OTLPReceiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests, self.headers, self.bodies = [], [], []

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self):
        return [
            (attributes(rs.resource), span)
            for request in self.requests
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def __enter__(self):
        serve = functools.partial(self.serve_forever, poll_interval=0.02)  # a quick shutdown()
        threading.Thread(target=serve, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = {"gzip": gzip.decompress, "deflate": zlib.decompress}.get(
            self.headers.get("Content-Encoding", ""), lambda b: b
        )(body)
        if (
            self.path != "/v1/traces"
            or self.headers.get("Content-Type") != "application/x-protobuf"
        ):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.server.bodies.append(body)
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.requests.append(request)
        self.server.headers.append({k.lower(): v for k, v in self.headers.items()})
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


class HostileCollector:
    """A collector that answers to hurt the run, on 127.0.0.1 (raw sockets, one thread a
    connection). `answer` is one of:

      "huge"      200 OK, then a body of `size` bytes as fast as the socket takes them
      "drip"      the status line, then a byte of a header every `every` seconds, forever
      "redirect"  307 to `location` (another collector), which a client must not follow

    It keeps, per connection, when it opened, how many bytes it read, and when the client
    went away (a send that failed), so a test can tell how long the client listened."""

    def __init__(self, answer, size=512 << 20, every=0.1, location=None):
        self.answer, self.size, self.every, self.location = answer, size, every, location
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.connections, self.stopping = [], threading.Event()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def __enter__(self):
        threading.Thread(target=self.accept, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.listener.close()

    def accept(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            record = {"opened": time.monotonic(), "read": 0, "gone": None}
            self.connections.append(record)
            threading.Thread(target=self.serve, args=(conn, record), daemon=True).start()

    def serve(self, conn, record):
        with conn:
            conn.settimeout(5)
            try:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                    record["read"] += len(chunk)
                if self.answer == "redirect":
                    conn.sendall(
                        f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {self.location}"
                        "\r\nContent-Length: 0\r\n\r\n".encode()
                    )
                    time.sleep(1)
                    return
                if self.answer == "huge":
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                        b"Content-Length: %d\r\n\r\n" % self.size
                    )
                    block, sent = b"\0" * (1 << 20), 0
                    while sent < self.size and not self.stopping.is_set():
                        conn.sendall(block)
                        sent += len(block)
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Drip: ")
                while not self.stopping.is_set():
                    time.sleep(self.every)
                    conn.sendall(b"a")
            except OSError:
                record["gone"] = time.monotonic()
