"""A test OTLP receiver (HTTP/protobuf), decoding with the official
`opentelemetry-proto` package: no collector is installable from the
registries the tests reach.

Listens on 127.0.0.1 (port 0 unless given), prints {"port": N} on its first
line, then serves:
- POST /v1/traces and /v1/metrics: decodes the body (a body that is not a
  valid ExportTraceServiceRequest / ExportMetricsServiceRequest answers
  400 and is counted in "rejected"), answers 200 with an empty export
  response;
- GET /spans: every span received, as JSON (ids in hex, attributes as a
  flat object of their values, links, parent, kind, status code, the
  resource's attributes);
- GET /metrics: every metric received, as JSON (name, type, data points
  with their attributes and values);
- GET /raw: every body received, concatenated, as bytes (a secret must be
  found nowhere in them);
- GET /headers: the headers of each export request, as JSON.
Stops on stdin's end.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

LOCK = threading.Lock()
SPANS = []
METRICS = []
RAW = []
HEADERS = []
REJECTED = []


def value_of(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def attrs(kvs):
    return {kv.key: value_of(kv.value) for kv in kvs}


def decode_traces(body):
    req = trace_service_pb2.ExportTraceServiceRequest()
    req.ParseFromString(body)
    out = []
    for rs in req.resource_spans:
        resource = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    {
                        "name": s.name,
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "trace_state": s.trace_state,
                        "kind": s.kind,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "attributes": attrs(s.attributes),
                        "dropped_attributes": s.dropped_attributes_count,
                        "links": [
                            {
                                "trace_id": link.trace_id.hex(),
                                "span_id": link.span_id.hex(),
                                "trace_state": link.trace_state,
                            }
                            for link in s.links
                        ],
                        "status": s.status.code,
                        "status_message": s.status.message,
                        "resource": resource,
                        "scope": ss.scope.name,
                    }
                )
    return out


def points(data):
    out = []
    for p in data.data_points:
        point = {"attributes": attrs(p.attributes)}
        if hasattr(p, "bucket_counts"):
            point["count"] = p.count
            point["sum"] = p.sum
            point["bucket_counts"] = list(p.bucket_counts)
            point["explicit_bounds"] = list(p.explicit_bounds)
        else:
            point["value"] = getattr(p, p.WhichOneof("value"))
        out.append(point)
    return out


def decode_metrics(body):
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    req.ParseFromString(body)
    out = []
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                data = getattr(m, kind)
                entry = {"name": m.name, "type": kind, "points": points(data)}
                if kind in ("sum", "histogram"):
                    entry["temporality"] = data.aggregation_temporality
                if kind == "sum":
                    entry["monotonic"] = data.is_monotonic
                out.append(entry)
    return out


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body, ctype):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with LOCK:
            RAW.append(body)
            HEADERS.append({k.lower(): v for k, v in self.headers.items()})
        try:
            if self.path == "/v1/traces":
                got = decode_traces(body)
                answer = trace_service_pb2.ExportTraceServiceResponse()
                with LOCK:
                    SPANS.extend(got)
            elif self.path == "/v1/metrics":
                got = decode_metrics(body)
                answer = metrics_service_pb2.ExportMetricsServiceResponse()
                with LOCK:
                    METRICS.append(got)
            else:
                self.reply(404, b"", "text/plain")
                return
        except DecodeError as e:
            with LOCK:
                REJECTED.append(f"{self.path}: {e}")
            self.reply(400, b"", "text/plain")
            return
        self.reply(200, answer.SerializeToString(), "application/x-protobuf")

    def do_GET(self):
        with LOCK:
            if self.path == "/spans":
                body = json.dumps({"spans": SPANS, "rejected": REJECTED}).encode()
            elif self.path == "/metrics":
                body = json.dumps({"exports": METRICS, "rejected": REJECTED}).encode()
            elif self.path == "/headers":
                body = json.dumps(HEADERS).encode()
            elif self.path == "/raw":
                self.reply(200, b"".join(RAW), "application/octet-stream")
                return
            else:
                self.reply(404, b"", "text/plain")
                return
        self.reply(200, body, "application/json")


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
