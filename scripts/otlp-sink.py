"""A loopback OTLP sink for the benchmarks (scripts/bench-telemetry,
scripts/bench-callgrind): it reads each export and answers 200, decoding
nothing, so that it costs the machine little. Listens on 127.0.0.1, port 0;
prints its port on its first line. GET (any path) answers its counts as
JSON: {"traces": N, "metrics": N, "bytes": N}. Runs until killed.
"""
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
counts = {"traces": 0, "metrics": 0, "bytes": 0}
lock = threading.Lock()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = int(self.headers.get("content-length", "0"))
        self.rfile.read(n)
        with lock:
            counts["traces" if self.path == "/v1/traces" else "metrics"] += 1
            counts["bytes"] += n
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def do_GET(self):
        with lock:
            body = json.dumps(counts).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
