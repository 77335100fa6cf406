"""The real broker for the tests: the `credbroker` binary (debug or release,
CREDBROKER_BIN, else target/debug/credbroker) set up by its own quick start
in a temp directory, then served with the test's edits (a free port for the
example resource server's audience, nonces, rate limits). One broker per test
module (module-scoped fixtures), never per test: CI runs on two cores.

Nothing here fakes the broker; the tests fail, not skip, when the binary
is missing (scripts/test builds it first).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]


def binary(name: str, env: str) -> Path:
    p = Path(os.environ.get(env) or REPO / "target" / "debug" / name)
    if not p.is_file():
        pytest.fail(f"{p} is missing: build it first (cargo build, or set {env})")
    return p


def broker_bin() -> Path:
    return binary("credbroker", "CREDBROKER_BIN")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def poll(what: str, ok: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def _socket_answers(path: Path) -> bool:
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=2.0) as c:
            return c.get("http://credbroker/v1/info").status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class QuickstartBroker:
    """A served quick-start directory."""

    dir: Path
    port: int
    demo_port: int
    resource: str
    proc: subprocess.Popen[bytes] | None = None
    #: The issuer of the connected service's provider, when there is one
    #: (the `acme` fixture's oauth-service peer).
    service_issuer: str | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.dir / "broker.log"

    @property
    def socket(self) -> Path:
        return self.dir / "credbroker.sock"

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config(self) -> Path:
        return self.dir / "credbroker.toml"

    def quickstart(self) -> list[str]:
        """The quick start's command for this directory; its first run
        writes the files, later runs serve them as they are now (edits
        included), with the quick start's demo service on its own port."""
        return [
            str(broker_bin()),
            "quickstart",
            "--dir",
            str(self.dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--demo-listen",
            f"127.0.0.1:{self.demo_port}",
        ]

    def serve(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.quickstart(),
                stdout=log,
                stderr=log,
                env={**os.environ, "RUST_LOG": "info"},
            )
        poll(f"the broker answering on {self.socket}", lambda: self._ready())

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the broker exited: {self.log.read_text()[-3000:]}")
        return _socket_answers(self.socket)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def subject_token(self, sub: str = "alice") -> str:
        out = subprocess.run(
            [str(broker_bin()), "subject-token", "--dir", str(self.dir), "--sub", sub],
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    def local_account(self, name: str, dir: Path) -> Path:
        """Gives local account `name` (the person `sub` = name) a fresh
        random password through the running broker, and returns the file
        (mode 0600, in `dir`) that holds it, for a browser to sign in with."""
        password = secrets.token_urlsafe(18)
        path = dir / f"{name}.password"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, password.encode())
        os.close(fd)
        r = subprocess.run(
            [
                *(str(broker_bin()), "users", "add", name, "--replace"),
                *("--config", str(self.config), "--password-stdin"),
            ],
            input=password + "\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        return path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def audit_text(self) -> str:
        p = self.dir / "data" / "audit.jsonl"
        return p.read_text(errors="replace") if p.exists() else ""


def start_broker(
    tmp: Path,
    *,
    extra_config: str = "",
    extra_policy: str = "",
    resource_port: int | None = None,
    broker_port: int | None = None,
) -> QuickstartBroker:
    """Runs `credbroker quickstart` once to write its files (stopped as soon
    as it answers), applies the edits, then runs it again on them."""
    port = broker_port or free_port()
    rport = resource_port or free_port()
    d = tmp / "qs"
    b = QuickstartBroker(d, port, free_port(), f"http://127.0.0.1:{rport}/notes")
    log_path = tmp / "quickstart.log"
    with open(log_path, "wb") as log:
        qs = subprocess.Popen(b.quickstart(), stdout=log, stderr=log)

    def first_run_answers() -> bool:
        if qs.poll() is not None:
            raise AssertionError(f"the quick start exited: {log_path.read_text()[-3000:]}")
        return _socket_answers(d / "credbroker.sock")

    try:
        poll("the quick start answering", first_run_answers)
    finally:
        qs.send_signal(signal.SIGTERM)
        qs.wait(timeout=10)
    policy = d / "policy.toml"
    policy.write_text(
        policy.read_text().replace("http://127.0.0.1:9090/notes", b.resource) + extra_policy
    )
    with open(b.config, "a") as f:
        f.write(extra_config)
    b.serve()
    return b


@pytest.fixture(scope="module")
def tmp_module() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="credbroker-py-") as t:
        yield Path(t)


@pytest.fixture(scope="module")
def broker(tmp_module: Path) -> Iterator[QuickstartBroker]:
    """A quick-start broker on its defaults (no nonces)."""
    b = start_broker(tmp_module)
    yield b
    b.stop()


@dataclass
class ResourceServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def start_resource_server(b: QuickstartBroker, tmp: Path) -> ResourceServer:
    """examples/resource_server, for the broker's notes resource."""
    exe = binary("examples/resource_server", "CREDBROKER_RESOURCE_SERVER_BIN")
    listen = b.resource.removeprefix("http://").split("/", 1)[0]
    log = tmp / "resource_server.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [str(exe), "--listen", listen, "--issuer", b.issuer, "--audience", b.resource],
            stdout=f,
            stderr=f,
        )

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"resource_server exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", int(listen.split(":")[1])), 1):
                return True
        except OSError:
            return False

    poll("resource_server listening", up)
    return ResourceServer(b.resource, proc, log)


SERVICE = "https://api.acme.example"


@dataclass
class Service:
    """The `acme` service's provider (the oauth-service peer) and the broker
    that uses it."""

    broker: QuickstartBroker
    provider: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.broker.stop()
        self.provider.terminate()
        self.provider.wait(timeout=10)


def start_acme(
    tmp: Path, *, extra_config: str = "", extra_policy: str = "", api_base: bool = False
) -> Service:
    """A broker with the service `acme` (played by the oauth-service peer in
    tests/peers, on loopback) and the tool `acme.issues` in step `triage`;
    nobody has connected an account yet. With `api_base`, the provider's
    own origin is the service's API too (its userinfo endpoint, `/me`, is
    what the egress proxy's tests call). `extra_config` comes after the
    `[providers.acme]` table; `{issuer}` in `extra_policy` is the broker's
    issuer (a proxy resource is `{issuer}/proxy/acme`)."""
    peers = REPO / "tests" / "peers"
    if not (peers / "node_modules" / "oidc-provider").is_dir():
        pytest.fail("tests/peers/node_modules is missing: run scripts/install-test-deps")
    secret = f"client-secret-canary-{secrets.token_hex(12)}"
    port = free_port()
    provider = subprocess.Popen(
        [
            "node",
            str(peers / "oauth-service.mjs"),
            "--client-id",
            "credbroker-test",
            "--client-secret",
            secret,
            "--redirect-uri",
            f"http://127.0.0.1:{port}/callback/acme",
        ],
        cwd=peers,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert provider.stdout is not None
    issuer = json.loads(provider.stdout.readline())["issuer"]
    secret_file = tmp / "acme.secret"
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secret.encode())
    os.close(fd)
    policy = f"""
[resources."{SERVICE}"]
source = "service"
service = "acme"
delivery = "provider_token"

[tools."acme.issues"]
resource = "{SERVICE}"
scopes = ["read:org"]
steps = ["triage"]
"""
    config = f"""
[providers.acme]
display_name = "Acme"
issuer = "{issuer}"
client_id = "credbroker-test"
client_secret_file = "{secret_file}"
scopes = ["openid", "profile", "read:org"]
"""
    if api_base:
        config += f'api_base = "{issuer}"\n'
    b = start_broker(
        tmp,
        extra_config=config + extra_config,
        extra_policy=policy + extra_policy.replace("{issuer}", f"http://127.0.0.1:{port}"),
        broker_port=port,
    )
    b.service_issuer = issuer
    return Service(b, provider)


@pytest.fixture(scope="module")
def acme(tmp_module: Path) -> Iterator[QuickstartBroker]:
    """A broker with the service `acme` (see :func:`start_acme`)."""
    s = start_acme(tmp_module)
    yield s.broker
    s.stop()


def require_browser() -> None:
    if not Path("/usr/bin/chromium").exists():
        pytest.fail("chromium is not installed: run scripts/install-test-deps")
    if not (REPO / "tests" / "peers" / "node_modules" / "playwright-core").is_dir():
        pytest.fail("playwright-core is not installed: run scripts/install-test-deps")


def browser_of(tmp_path: Path, person: str, password_file: Path) -> list[str]:
    """The command that opens a link in `person`'s own browser profile,
    signing in with her local account when the broker asks."""
    return [
        "node",
        str(REPO / "tests" / "peers" / "mcp_open_link.mjs"),
        str(tmp_path / "browsers" / person),
        person,
        str(password_file),
    ]


def provider_account(b: QuickstartBroker, account: str) -> None:
    """Makes the next browser sign-in at the provider be `account`."""
    r = httpx.get(f"{b.service_issuer}/test/browser-account", params={"account": account})
    assert r.status_code == 200 and r.json()["browser_account"] == account, r.text


def open_in_browser(tmp: Path, person: str, password_file: Path, url: str) -> str:
    """Opens `url` in `person`'s browser as mcp_client.py's opener does;
    returns how the browser finished (`completed`, `other_person`...)."""
    r = subprocess.run(
        [*browser_of(tmp, person, password_file), url], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    for line in r.stdout.splitlines():
        if line.startswith("{") and "done" in json.loads(line):
            return str(json.loads(line)["done"])
    raise AssertionError(f"the browser did not finish: {r.stdout[-2000:]}")


def read_json(path: Path) -> object:
    return json.loads(path.read_text(encoding="utf-8"))
