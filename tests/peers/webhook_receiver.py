"""A webhook receiver for tests/it/operations/webhooks.rs.

Verifies every delivery with the Standard Webhooks reference library
(`standardwebhooks` on PyPI) under each `--secret` (or, with
`--public-key`, the `v1a` Ed25519 signature with `cryptography`), checks
that a tampered body does not verify, answers from `--answers` (the n-th
attempt of one webhook-id gets the n-th status; the last repeats), and
appends one JSON line per request to `--log`:
{"id", "timestamp", "arrival", "status", "verified": [per secret], "tamper_rejected", "body"}.

With `--drip N` the first N attempts of each webhook-id are answered as a
slow-drip receiver: a 200 head promising 100 bytes, then one byte every
0.3 s (status "drip" in the log), so only a total timeout per attempt
ends them.

It binds `--port` (0: any free one) on 127.0.0.1 and writes the port to
`--port-file` once it listens.
"""

import argparse
import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--secret", action="append", default=[])
    p.add_argument("--public-key")
    p.add_argument("--answers", default="200")
    p.add_argument("--retry-after")
    p.add_argument("--drip", type=int, default=0)
    args = p.parse_args()
    answers = [int(a) for a in args.answers.split(",")]
    hooks = [Webhook(s) for s in args.secret]
    attempts = {}
    lock = threading.Lock()

    def verify_v1a(body, headers):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        key = Ed25519PublicKey.from_public_bytes(
            base64.b64decode(args.public_key.removeprefix("whpk_"))
        )
        signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
        for part in headers["webhook-signature"].split(" "):
            version, sig = part.split(",", 1)
            if version != "v1a":
                continue
            try:
                key.verify(base64.b64decode(sig), signed)
                return True
            except Exception:
                pass
        return False

    def check(body, headers):
        if args.public_key:
            return [verify_v1a(body, headers)]
        out = []
        for h in hooks:
            try:
                h.verify(body, headers)
                out.append(True)
            except WebhookVerificationError:
                out.append(False)
        return out

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            n = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(n)
            headers = {k.lower(): v for k, v in self.headers.items()}
            verified = check(body, headers)
            tampered = body.replace(b'"agent"', b'"agEnt"', 1)
            tamper_rejected = tampered != body and not any(check(tampered, headers))
            wid = headers.get("webhook-id", "")
            with lock:
                k = attempts.get(wid, 0)
                attempts[wid] = k + 1
                drip = k < args.drip
                status = answers[min(k - args.drip, len(answers) - 1)] if not drip else 200
                with open(args.log, "a") as f:
                    f.write(
                        json.dumps(
                            {
                                "id": wid,
                                "timestamp": headers.get("webhook-timestamp"),
                                "arrival": time.time(),
                                "status": "drip" if drip else status,
                                "verified": verified,
                                "tamper_rejected": tamper_rejected,
                                "body": body.decode(),
                            }
                        )
                        + "\n"
                    )
            if drip:
                self.send_response(200)
                self.send_header("content-length", "100")
                self.end_headers()
                try:
                    for _ in range(100):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.3)
                except OSError:
                    pass  # the sender gave up: what the test expects
                return
            self.send_response(status)
            if status in (429, 503) and args.retry_after:
                self.send_header("retry-after", args.retry_after)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    import os

    os.rename(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
