"""Where a verifier remembers the single-use tokens it accepted.

A token of an ``each_call`` approval carries ``"single_use": true``: a
resource server accepts it for one request. The verifier records the
token's (``iss``, ``jti``) in a store with one atomic operation,
*insert if absent*, until the token's expiry (plus the clock skew); a key
already there means the token was used, and the request is refused.

A store fails closed: an error, or a store full of live entries, refuses the
request (the verifier answers 503 with code ``replay_store_unavailable``). It
never evicts an entry before its expiry, since that would let the token be
used again.

- :class:`MemorySingleUseStore` (the default) keeps them in this process.
  **It is wrong for a server with several worker processes** (gunicorn or
  uvicorn ``--workers``, several replicas): each worker has its own memory,
  so each would accept the token once. Use a store they share.
- :class:`SQLiteSingleUseStore` shares them between the processes of one
  host through an SQLite file.
- Your own: any object with the method of :class:`SingleUseStore` (or, for
  :meth:`Verifier.verify_async <credbroker_client.verify.Verifier.verify_async>`,
  of :class:`AsyncSingleUseStore`), over a store the workers share (for
  example PostgreSQL's ``INSERT ... ON CONFLICT DO NOTHING``, or Redis's
  ``SET key 1 NX EXAT expires_at``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Protocol

from .errors import CredbrokerError


class SingleUseStoreFull(CredbrokerError):
    """The store holds as many live entries as it may: the request is
    refused (fail closed), never let through unrecorded."""


class SingleUseStore(Protocol):
    """A store a synchronous verifier records single-use tokens in."""

    def insert_if_absent(self, iss: str, jti: str, expires_at: int, now: float) -> bool:
        """Records (``iss``, ``jti``) until ``expires_at`` (Unix seconds), in
        one atomic step: ``True`` if it was absent (the token's first use),
        ``False`` if a live entry holds it. ``now`` is the verifier's clock,
        for telling live entries from expired ones. Raises when it cannot
        answer (the request is then refused)."""
        ...


class AsyncSingleUseStore(Protocol):
    """:class:`SingleUseStore` for asyncio servers (``verify_async``)."""

    async def insert_if_absent(self, iss: str, jti: str, expires_at: int, now: float) -> bool:
        """As :meth:`SingleUseStore.insert_if_absent`, awaited."""
        ...


class MemorySingleUseStore:
    """Single-use tokens in this process's memory, at most ``capacity`` live
    entries. Expired entries are removed when the store is full; if it is
    still full, :class:`SingleUseStoreFull` is raised. Wrong for several
    worker processes (see the module's documentation)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._until: dict[tuple[str, str], int] = {}
        self._capacity = max(1, capacity)
        self._lock = threading.Lock()

    def insert_if_absent(self, iss: str, jti: str, expires_at: int, now: float) -> bool:
        key = (iss, jti)
        with self._lock:
            held = self._until.get(key)
            if held is not None and held > now:
                return False
            if held is None and len(self._until) >= self._capacity:
                self._until = {k: t for k, t in self._until.items() if t > now}
                if len(self._until) >= self._capacity:
                    raise SingleUseStoreFull("the single-use store is full of live tokens")
            self._until[key] = expires_at
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._until)


class SQLiteSingleUseStore:
    """Single-use tokens in an SQLite file, shared by every process that
    opens it (the workers of one host). The insert is one ``INSERT ... ON
    CONFLICT DO NOTHING`` on the primary key (``iss``, ``jti``), atomic
    across processes; an expired row of the same key is replaced in the same
    transaction. Expired rows are deleted at most once a minute. Any SQLite
    error (a locked database past ``timeout`` seconds, a full disk) is raised
    and refuses the request.

    It blocks while SQLite waits for its lock: in an asyncio server it is
    called from ``verify_async`` inline, which is fine for a local file and
    short transactions."""

    def __init__(self, path: str | Path, *, timeout: float = 5.0) -> None:
        self._db = sqlite3.connect(
            str(path), timeout=timeout, isolation_level=None, check_same_thread=False
        )
        self._lock = threading.Lock()
        self._swept = float("-inf")
        # Switching a new file to WAL while another process does the same
        # can answer "database is locked" at once, without SQLite's busy
        # wait (seen with several workers starting together): the set-up is
        # retried until ``timeout``, then the error is raised.
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                try:
                    self._db.execute("PRAGMA journal_mode=WAL")
                    self._db.execute(
                        "CREATE TABLE IF NOT EXISTS credbroker_single_use ("
                        " iss TEXT NOT NULL, jti TEXT NOT NULL, expires_at INTEGER NOT NULL,"
                        " PRIMARY KEY (iss, jti))"
                    )
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) or time.monotonic() >= deadline:
                        raise
                    time.sleep(0.01)

    def insert_if_absent(self, iss: str, jti: str, expires_at: int, now: float) -> bool:
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                if now - self._swept >= 60:
                    db.execute("DELETE FROM credbroker_single_use WHERE expires_at <= ?", (now,))
                    self._swept = now
                else:
                    db.execute(
                        "DELETE FROM credbroker_single_use"
                        " WHERE iss = ? AND jti = ? AND expires_at <= ?",
                        (iss, jti, now),
                    )
                cur = db.execute(
                    "INSERT INTO credbroker_single_use (iss, jti, expires_at) VALUES (?, ?, ?)"
                    " ON CONFLICT (iss, jti) DO NOTHING",
                    (iss, jti, expires_at),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return cur.rowcount == 1

    def close(self) -> None:
        """Closes the database connection."""
        with self._lock:
            self._db.close()
