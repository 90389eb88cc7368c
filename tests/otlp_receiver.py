"""A stand-in OpenTelemetry collector on 127.0.0.1: OTLP/HTTP traces (POST /v1/traces,
protobuf, gzip or not), decoded with opentelemetry-proto; every span it was sent is kept.

    with OTLPReceiver() as collector:   # OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint
        ...
        collector.spans()  # [(resource attributes, span)], span as opentelemetry.proto's Span
"""

import gzip
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)


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
        self.requests, self.headers = [], []

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self):
        return [(attributes(rs.resource), span) for request in self.requests
                for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
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
            self.headers.get("Content-Encoding", ""), lambda b: b)(body)
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != \
                "application/x-protobuf":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
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
