"""A small client of the Placement API for devtag's own callers (the compute
node reporter, the scheduler): the token, the microversion, the error bodies.

:data:`MICROVERSION` is the version calls are made at unless they ask for
another (``call(..., microversion=(1, 30))``); :meth:`PlacementClient.served_versions`
reads the range a service advertises in its root document, so a caller (the
scheduler) can use the newest one both sides know and say clearly when the
service is too old.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import time
from typing import Any, ClassVar, Dict, List, Optional, Set, Tuple
from urllib.parse import urljoin, urlsplit

from . import http_deadline
from .errors import InputError, RuntimeFailure
from .state import placement_token_path

MICROVERSION: Tuple[int, int] = (1, 17)
VERSION = f"placement {MICROVERSION[0]}.{MICROVERSION[1]}"  # the OpenStack-API-Version header
_VERSION_TEXT = re.compile(r"^([0-9]{1,4})\.([0-9]{1,4})\Z")
# Placement's no-keystone convention: the token a client sends when it has no other (`placement serve --any-token`).
NOAUTH_TOKEN = "admin"  # noqa: S105 - not a secret
# Where devtag's callers find the service unless told: the default address of `placement serve`.
URL_ENV = "DEVTAG_PLACEMENT_URL"
DEFAULT_URL = "http://127.0.0.1:8778"
URL_HELP = f"the placement service (default: ${URL_ENV}, else {DEFAULT_URL})"


def service_url(given: Optional[str]) -> str:
    """``--placement-url``, else ``$DEVTAG_PLACEMENT_URL``, else the default address of ``placement serve``;
    bad input unless it is an http:// or https:// URL with a host."""
    url = given or os.environ.get(URL_ENV) or DEFAULT_URL
    try:
        parts = urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        usable = False
    if not usable:
        where = "--placement-url" if given else f"${URL_ENV}"
        raise InputError(f"{where} {url!r} is not an http:// or https:// URL (e.g. {DEFAULT_URL})")
    return url


MAX_REDIRECTS = 5
# A whole call (connecting, every redirect, the answer's head and body) ends within DEADLINE
# seconds, whatever the per-read timeout sees: a service trickling a byte at a time is cut off.
DEADLINE = 60.0
MAX_ANSWER_BYTES = 256 * 1024 * 1024  # an allocation candidates answer of 50,000 providers is 40 MiB
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def client_token(token_file: Optional[str], url: Optional[str] = None) -> str:
    """The token a client sends: the first line of ``--token-file``; else, for a
    service on this host (loopback ``url``), the token ``placement serve``
    generated if this user can read it; else the no-auth token.

    An empty file is refused here: the server would refuse the empty token on
    every request with a 401 that does not say which file was empty.  The
    generated token is never sent to another host.
    """
    if not token_file:
        if url is not None and _is_loopback_url(url):
            try:
                with open(placement_token_path(), encoding="utf-8") as handle:
                    generated = handle.read(4096).strip()
            except OSError:
                generated = ""
            if generated:
                return generated
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

    def __init__(
        self,
        url: str,
        token: str = NOAUTH_TOKEN,
        session: Any = None,
        timeout: float = 30.0,
        *,
        deadline: Optional[float] = None,
        max_answer_bytes: Optional[int] = None,
    ) -> None:
        # The deadline of a call on a session made here (requests' timeout is per read).
        self._deadline_watch: Any = None
        if session is None:  # requests loads only now: devtag-host starts without it
            session = http_deadline.session()
            self._deadline_watch = http_deadline.watch
        self.url = url.rstrip("/")
        self.session = session
        # Redirects are followed here, not by the session: requests keeps X-Auth-Token across hosts.
        module = type(session).__module__.split(".", 1)[0]
        self._streamed = module == "requests"  # the body read here, in pieces: its size is bounded
        self._no_redirects: Dict[str, Any] = {
            "requests": {"allow_redirects": False, "stream": True},
            "httpx": {"follow_redirects": False},
        }.get(module, {})
        self.timeout = timeout
        self.deadline = DEADLINE if deadline is None else deadline
        self.max_answer_bytes = MAX_ANSWER_BYTES if max_answer_bytes is None else max_answer_bytes
        # The node's roles as Placement's noauth2 reads them: a node moves its own
        # allocations with POST /reshaper, which upstream's policy keeps for services.
        self.headers = {
            "x-auth-token": token,
            "x-roles": "admin,service",
            "openstack-api-version": VERSION,
            "accept": "application/json",
        }

    def call(
        self, method: str, path: str, body: Any = None, *, microversion: Optional[Tuple[int, int]] = None
    ) -> Tuple[int, Any]:
        headers = self.headers
        if microversion is not None:
            headers = {**headers, "openstack-api-version": "placement {}.{}".format(*microversion)}
        kwargs: Dict[str, Any] = {"headers": headers, "timeout": self.timeout}
        if body is not None:
            kwargs["json"] = body
        kwargs.update(self._no_redirects)
        with self._watch() as watch:
            response, content = self._exchange(method, path, kwargs)
        if watch is not None and watch.expired:  # the socket was shut at the deadline: what came is cut short
            raise RuntimeFailure(f"placement at {self.url} did not answer {method} {path} within {self.deadline:g} s")
        if response.status_code >= 500:
            raise RuntimeFailure(f"placement failed: {method} {path}: {response.status_code} {_excerpt(content)}")
        if not content:
            return response.status_code, None
        try:
            data = json.loads(content)
        except ValueError:  # an HTML page from a proxy, a login portal, ...
            kind = response.headers.get("content-type") or "no content type"
            raise RuntimeFailure(
                f"placement answered {method} {path} with {response.status_code} and a body that is not JSON "
                f"({kind}): {_excerpt(content)}"
            ) from None
        return response.status_code, data

    def _watch(self) -> Any:
        if self._deadline_watch is None:  # the caller's session (tests: httpx on the WSGI app): its own timeouts
            return contextlib.nullcontext(None)
        return self._deadline_watch(self.deadline)

    def _exchange(self, method: str, path: str, kwargs: Dict[str, Any]) -> Tuple[Any, bytes]:
        """The answer to the request after same-service redirects, and its body."""
        url = self.url + path
        started = time.monotonic()
        for _hop in range(MAX_REDIRECTS + 1):
            try:
                response = self.session.request(method, url, **kwargs)
                if response.status_code not in _REDIRECTS:
                    return response, self._body(response, method, path, started)
                response.close()
            except RuntimeFailure:
                raise
            except Exception as exc:  # requests/httpx connection errors
                if time.monotonic() - started >= self.deadline:
                    return _CUT_SHORT, b""
                raise RuntimeFailure(f"cannot reach placement at {self.url}: {connection_failure(exc)}") from None
            url = self._redirect_target(method, path, url, response)
        raise RuntimeFailure(f"placement: {method} {path}: more than {MAX_REDIRECTS} redirects")

    def _body(self, response: Any, method: str, path: str, started: float) -> bytes:
        if not self._streamed:
            return bytes(response.content)
        pieces: List[bytes] = []
        size = 0
        try:
            for piece in response.iter_content(64 * 1024):
                size += len(piece)
                if size > self.max_answer_bytes:
                    raise RuntimeFailure(
                        f"placement answered {method} {path} with more than {self.max_answer_bytes} bytes: not read"
                    )
                pieces.append(piece)
        finally:
            response.close()
        return b"".join(pieces)

    def _redirect_target(self, method: str, path: str, url: str, response: Any) -> str:
        """Where a redirect leads, if it stays on the configured service's scheme, host and port.

        The token goes with every request: a redirect to any other place
        would hand it over (``requests`` keeps ``X-Auth-Token`` across hosts).
        """
        location = response.headers.get("location") or ""
        target = urljoin(url, location)
        if _origin(target) != _origin(self.url):
            raise RuntimeFailure(
                f"placement redirected {method} {path} to {_origin(target) or location!r}, another host than "
                f"{self.url}: not followed (the token would go with it)"
            )
        return target

    def served_versions(self) -> Optional[Tuple[Tuple[int, int], Tuple[int, int]]]:
        """(min, max) microversion the service advertises at ``GET /``; None when it says nothing usable.

        A service from before microversions (or a proxy answering for it) has
        no such document: the caller then assumes the versions it always spoke.
        """
        status, data = self.call("GET", "/")
        if status != 200:
            return None
        try:
            document = data["versions"][0]
            low, high = parse_version(document["min_version"]), parse_version(document["max_version"])
        except (TypeError, KeyError, IndexError):
            return None
        if low is None or high is None or low > high:
            return None
        return low, high


def parse_version(text: Any) -> Optional[Tuple[int, int]]:
    """``"1.39"`` -> (1, 39); anything else -> None."""
    match = _VERSION_TEXT.match(text) if isinstance(text, str) else None
    return (int(match.group(1)), int(match.group(2))) if match else None


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


def _is_loopback_url(url: str) -> bool:
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _origin(url: str) -> str:
    """``scheme://host:port`` of ``url`` (default ports filled in); '' if it has none."""
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    except ValueError:
        return ""
    if not parts.hostname:
        return ""
    return f"{parts.scheme}://{parts.hostname}:{port}"


class _CutShort:
    """The answer of a call the deadline ended (nothing usable came)."""

    status_code = 0
    headers: ClassVar[Dict[str, str]] = {}


_CUT_SHORT = _CutShort()


def _excerpt(content: bytes) -> str:
    """The start of a response body, on one line."""
    return " ".join(content[:200].decode("utf-8", "replace").split())
