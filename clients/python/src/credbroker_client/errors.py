"""What a derive can end in besides a token, as exceptions.

A refusal from the broker is a :class:`Refused` subclass carrying the
members the broker sent; a broker that cannot be reached is
:class:`BrokerNotRunning`, apart from them (nothing was decided). No
exception's text or ``repr`` carries a token, a proof, a key or a link's
URL: they may end up in logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class CredbrokerError(Exception):
    """The base of every error this library raises."""


class BrokerNotRunning(CredbrokerError):
    """Nothing answers on the socket (missing, refused, or not a socket)."""

    def __init__(self, socket: str, cause: str) -> None:
        super().__init__(f"no credbroker answers on socket {socket}: {cause}")
        self.socket = socket


class IncompatibleBroker(CredbrokerError):
    """The broker speaks a socket API version this library does not."""

    def __init__(self, socket: str, theirs: str, ours: str) -> None:
        super().__init__(
            f"the credbroker on socket {socket} speaks socket API version {theirs!r}; "
            f"this library speaks version {ours!r}: use a library release for API {theirs!r}"
        )
        self.socket = socket
        self.api_version = theirs


class UnexpectedAnswer(CredbrokerError):
    """The broker answered something this library cannot read."""


class Refused(CredbrokerError):
    """The broker refused the derive; ``error`` is the OAuth error code."""

    def __init__(
        self,
        status: int,
        error: str,
        description: str | None,
        reason: str | None = None,
    ) -> None:
        text = f"credbroker refused the derive (HTTP {status}, {error}"
        text += f", reason {reason})" if reason else ")"
        if description:
            text += f": {description}"
        super().__init__(text)
        self.status = status
        self.error = error
        self.description = description
        self.reason = reason


class AccessDenied(Refused):
    """The policy denies it (``reason``: ``tool_not_allowed``,
    ``step_not_allowed``, ``scope_not_allowed``, ``resource_mismatch``,
    ``frozen``)."""


class InvalidRequest(Refused):
    """The request was malformed: body, subject token, proof or resource
    (``error`` says which: ``invalid_request``, ``invalid_dpop_proof``,
    ``invalid_target``)."""


class RateLimited(Refused):
    """Too many derives; try again after ``retry_after`` seconds."""

    def __init__(
        self, status: int, error: str, description: str | None, retry_after: int | None
    ) -> None:
        super().__init__(status, error, description)
        self.retry_after = retry_after


class Unavailable(Refused):
    """The broker could not decide now (a provider did not answer, the
    replay cache is full, an internal error); nothing was issued."""

    def __init__(
        self,
        status: int,
        error: str,
        description: str | None,
        reason: str | None,
        retry_after: int | None,
    ) -> None:
        super().__init__(status, error, description, reason)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Link:
    """A link the person must open before the derive can succeed.

    ``uri`` is passed on to the person unchanged (the page behind it checks
    who opens it); it is kept out of ``repr`` all the same, as it names a
    pending grant.
    """

    uri: str = field(repr=False)
    id: str
    expires_in: int
    expires_at: float
    message: str


class LinkRequired(Refused):
    """The person must open a link first, then the derive is tried again.

    ``reason`` is ``connect`` (no account connected yet), ``allow`` (a new
    agent or scope to allow), ``reconnect`` (the connection no longer works)
    or, with brokers that have approvals, ``approval``.
    """

    def __init__(self, status: int, error: str, raw_reason: str, link: Link) -> None:
        super().__init__(status, error, link.message, raw_reason.removesuffix("_required"))
        self.link = link


def refusal(status: int, body: dict[str, Any], retry_after: int | None, now: float) -> Refused:
    """Maps one refusal answer to its exception, in one place."""
    error = body.get("error")
    if not isinstance(error, str):
        raise UnexpectedAnswer(f"the broker answered HTTP {status} without an OAuth error code")
    description = _str(body.get("error_description"))
    reason = _str(body.get("reason"))
    if error == "invalid_grant" and reason is not None and reason.endswith("_required"):
        uri, link_id = _str(body.get("connect_uri")), _str(body.get("connect_id"))
        expires_in = body.get("connect_expires_in")
        if uri is None or link_id is None or not isinstance(expires_in, int):
            raise UnexpectedAnswer(
                f"the broker's {reason} refusal lacks connect_uri, connect_id or connect_expires_in"
            )
        message = _str(body.get("connect_message")) or "Open this link to continue."
        link = Link(uri, link_id, expires_in, now + expires_in, message)
        return LinkRequired(status, error, reason, link)
    if status == 403 or error == "access_denied":
        return AccessDenied(status, error, description, reason)
    if status == 429:
        return RateLimited(status, error, description, retry_after)
    if status >= 500:
        return Unavailable(status, error, description, reason, retry_after)
    return InvalidRequest(status, error, description, reason)


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None
