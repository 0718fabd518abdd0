"""A small client of the Placement API for devtag's own callers (the compute
node reporter, the scheduler): the token, the microversion, the error bodies.

One source for the microversion devtag's clients speak (:data:`MICROVERSION`):
the scheduler reads it to know what the query may express.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Set, Tuple

from .errors import InputError, RuntimeFailure

MICROVERSION: Tuple[int, int] = (1, 17)
VERSION = f"placement {MICROVERSION[0]}.{MICROVERSION[1]}"  # the OpenStack-API-Version header
# Placement's no-keystone convention: any token is accepted by a server without a token file.
NOAUTH_TOKEN = "admin"  # noqa: S105 - not a secret


def client_token(token_file: Optional[str]) -> str:
    """The token a client sends: the first line of ``--token-file``, else the no-auth token.

    An empty file is refused here: the server would refuse the empty token on
    every request with a 401 that does not say which file was empty.
    """
    if not token_file:
        return NOAUTH_TOKEN
    try:
        with open(token_file, encoding="utf-8") as handle:
            token = handle.read(4096).strip()
    except OSError as exc:
        raise InputError(f"--token-file: {exc.strerror}") from None
    if not token:
        raise InputError(f"--token-file {token_file} is empty")
    return token


class PlacementClient:
    """A few calls of the placement API over ``requests`` (or any session with ``request``).

    ``call`` returns (status, JSON body) for answers below 500; an unreachable
    or failing (5xx) service is a :class:`~devtag_host.errors.RuntimeFailure`.
    """

    def __init__(self, url: str, token: str = NOAUTH_TOKEN, session: Any = None, timeout: float = 30.0) -> None:
        if session is None:
            import requests  # loads only when a client is made: devtag-host starts without it

            session = requests.Session()
        self.url = url.rstrip("/")
        self.session = session
        self.timeout = timeout
        self.headers = {"x-auth-token": token, "openstack-api-version": VERSION, "accept": "application/json"}

    def call(self, method: str, path: str, body: Any = None) -> Tuple[int, Any]:
        kwargs: Dict[str, Any] = {"headers": self.headers, "timeout": self.timeout}
        if body is not None:
            kwargs["json"] = body
        try:
            response = self.session.request(method, self.url + path, **kwargs)
        except Exception as exc:  # requests/httpx connection errors
            raise RuntimeFailure(f"cannot reach placement at {self.url}: {connection_failure(exc)}") from None
        if response.status_code >= 500:
            raise RuntimeFailure(f"placement failed: {method} {path}: {response.status_code} {response.text[:200]}")
        data = response.json() if response.content else None
        return response.status_code, data


def connection_failure(exc: BaseException) -> str:
    """Why a connection failed, in a few words (``connection refused``), not the
    client library's nested repr of every retry and pool object."""
    seen: Set[int] = set()
    pending: List[Optional[BaseException]] = [exc]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno:
            return (current.strerror or os.strerror(current.errno)).lower()
        if "timeout" in type(current).__name__.lower():
            return "timed out"
        pending.extend([current.__cause__, current.__context__, getattr(current, "reason", None)])
        pending.extend(arg for arg in current.args if isinstance(arg, BaseException))
    return type(exc).__name__


def error_code(data: Any) -> str:
    try:
        return data["errors"][0].get("code", "")
    except (TypeError, KeyError, IndexError):
        return ""


def error_detail(data: Any) -> str:
    try:
        return data["errors"][0]["detail"]
    except (TypeError, KeyError, IndexError):
        return str(data)[:200]
