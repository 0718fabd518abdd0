"""The placement application: routing, auth, microversions, errors.

``Placement(store)`` is an ASGI application (``uvicorn``) and, through
``Placement.wsgi``, a WSGI one; both call the same synchronous ``handle``.
Auth follows OpenStack Placement's no-keystone mode: every request but the
version root needs ``X-Auth-Token``; with a configured token only that one
(:mod:`.access` decides).  ``Host``, the token and ``Content-Length`` are
checked as soon as a request's head is in (:meth:`Placement.admit`), before
its body is read.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import os
import random
import re
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple
from urllib.parse import parse_qsl

import orjson
from sqlalchemy.exc import DBAPIError, IntegrityError

from .. import db
from ..db import error_line
from ..inputs import read_secret_file
from . import collector, errors, microversion, policy
from .access import Access, generated_token, listen_hosts
from .candidate_settings import CandidateSettings
from .candidate_settings import from_env as candidate_settings_from_env
from .db import Store
from .error_log import ErrorLog, database_unavailable
from .errors import PlacementError
from .exception import PlacementException
from .handlers import aggregate, allocation, allocation_candidate, inventory, reshaper, resource_class, trait, usage
from .handlers import resource_provider as provider
from .objects import resource_provider as provider_objects
from .web import CUT_SHORT_HEADER, Call, Reply, cache_headers, decode_json

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024
# Runs of a request whose transaction the database rolled back for another one's sake (a deadlock).
DB_RETRIES = 5


Handler = Callable[[Call], Reply]


def root(call: Call) -> Reply:
    version = {
        "id": "v1.0",
        "max_version": microversion.max_version_string(),
        "min_version": microversion.min_version_string(),
        "status": "CURRENT",
        "links": [{"rel": "self", "href": ""}],
    }
    return Reply(200, {"versions": [version]}, cache_headers(call))


# path template -> {method: (minimum minor version, handler, takes a JSON body)}
ROUTES: Dict[str, Dict[str, Tuple[int, Handler, bool]]] = {
    "/": {"GET": (0, root, False)},
    "/resource_providers": {
        "GET": (0, provider.list_providers, False),
        "POST": (0, provider.create_provider, True),
    },
    "/resource_providers/{uuid}": {
        "GET": (0, provider.get_provider, False),
        "PUT": (0, provider.update_provider, True),
        "DELETE": (0, provider.delete_provider, False),
    },
    "/resource_providers/{uuid}/inventories": {
        "GET": (0, inventory.list_inventories, False),
        "POST": (0, inventory.create_inventory, True),
        "PUT": (0, inventory.replace_inventories, True),
        "DELETE": (5, inventory.delete_inventories, False),
    },
    "/resource_providers/{uuid}/inventories/{resource_class}": {
        "GET": (0, inventory.get_inventory, False),
        "PUT": (0, inventory.update_inventory, True),
        "DELETE": (0, inventory.delete_inventory, False),
    },
    "/resource_providers/{uuid}/aggregates": {
        "GET": (1, aggregate.get_aggregates, False),
        "PUT": (1, aggregate.set_aggregates, True),
    },
    "/resource_providers/{uuid}/usages": {"GET": (0, usage.provider_usages, False)},
    "/resource_providers/{uuid}/allocations": {"GET": (0, allocation.provider_allocations, False)},
    "/resource_providers/{uuid}/traits": {
        "GET": (6, trait.get_provider_traits, False),
        "PUT": (6, trait.set_provider_traits, True),
        "DELETE": (6, trait.delete_provider_traits, False),
    },
    "/allocations": {"POST": (13, allocation.post_allocations, True)},
    "/allocations/{consumer}": {
        "GET": (0, allocation.get_allocations, False),
        "PUT": (0, allocation.put_allocations, True),
        "DELETE": (0, allocation.delete_allocations, False),
    },
    "/usages": {"GET": (9, usage.project_usages, False)},
    "/traits": {"GET": (6, trait.list_traits, False)},
    "/traits/{name}": {
        "GET": (6, trait.get_trait, False),
        "PUT": (6, trait.put_trait, False),
        "DELETE": (6, trait.delete_trait, False),
    },
    "/resource_classes": {
        "GET": (2, resource_class.list_classes, False),
        "POST": (2, resource_class.create_class, True),
    },
    "/resource_classes/{name}": {
        "GET": (2, resource_class.get_class, False),
        "PUT": (2, resource_class.put_class, False),  # a body only before 1.7; checked in the handler
        "DELETE": (2, resource_class.delete_class, False),
    },
    "/allocation_candidates": {"GET": (10, allocation_candidate.list_candidates, False)},
    "/reshaper": {"POST": (30, reshaper.reshape, True)},
}


def _compile(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template) + r"\Z")


_COMPILED = [(_compile(template), methods) for template, methods in ROUTES.items()]
_TEMPLATES = {pattern.pattern: template for (pattern, _m), template in zip(_COMPILED, ROUTES)}


def _find_route(path: str) -> Tuple[re.Match[str], Dict[str, Tuple[int, Handler, bool]]]:
    for pattern, methods in _COMPILED:
        match = pattern.match(path)
        if match:
            return match, methods
    raise errors.not_found("The resource could not be found.")


class Response:
    def __init__(self, status: int, headers: List[Tuple[str, str]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def _accepts_json(accept: str) -> bool:
    for item in accept.split(","):
        media = item.split(";", 1)[0].strip().lower()
        if media in ("", "*/*", "application/*", "application/json"):
            return True
    return False


class Placement:
    """The placement service on one ``Store``."""

    def __init__(
        self,
        store: Store,
        auth_token: Optional[str] = None,
        access: Optional[Access] = None,
        candidate_settings: Optional[CandidateSettings] = None,
    ) -> None:
        self.store = store
        self.access = Access(token=auth_token) if access is None else access
        self.auth_token = self.access.token
        self.candidate_settings = candidate_settings if candidate_settings is not None else CandidateSettings()
        self.errors = ErrorLog(log)

    def admit(self, method: str, path: str, query_string: str, headers: Mapping[str, str]) -> Optional[Response]:
        """The answer to a request refused on its head alone (Host, token, Content-Length), else None.

        Called before the body is read: a refused client cannot make the
        server wait for, or hold, a body.
        """
        if not self.access.host_accepted(headers.get("host")):
            return _refusal(400, "The Host header names a host this service does not answer as.")
        if path != "/" and not self.access.token_accepted(headers.get("x-auth-token")):
            response = self.handle(method, path, query_string, headers, b"")  # the usual 401 (or 404)
            response.headers.append(("connection", "close"))
            return response
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return _refusal(413, "Request body too large.")
        return None

    # -- the synchronous core ----------------------------------------------------------------
    def handle(
        self,
        method: str,
        path: str,
        query_string: str,
        headers: Mapping[str, str],
        body: bytes,
        scheme: str = "http",
    ) -> Response:
        request_id = errors.new_request_id()
        version: Optional[microversion.Version] = None
        try:
            version = microversion.negotiate(headers.get(microversion.HEADER))
            reply = self._route_again_on_deadlock(method, path, query_string, headers, body, version)
        except PlacementError as exc:
            reply = self._error(exc, request_id, version)
        except PlacementException as exc:  # what the objects refused: errors.RULES words it
            reply = self._error(errors.from_domain(exc), request_id, version)
        except IntegrityError:
            reply = self._error(
                PlacementError(409, "Conflicting concurrent update, please retry.", errors.CONCURRENT_UPDATE),
                request_id,
                version,
            )
        except DBAPIError as exc:
            if db.is_retryable(exc) or db.is_busy(exc):
                error = PlacementError(409, "Conflicting concurrent update, please retry.", errors.CONCURRENT_UPDATE)
            elif database_unavailable(exc) or db.is_unreachable(exc):  # a Galera node down: another is tried
                words = error_line(exc)
                said = f"{request_id}: {method} {path}: answered 503: database: {words}"
                self.errors.error(f"unavailable {words}", said)
                error = PlacementError(503, "The database is not available now, please retry later.")
            else:
                words = error_line(exc)
                self.errors.error(f"database {words}", f"{request_id}: {method} {path}: database error: {words}")
                error = PlacementError(500, "A database error occurred.")
            reply = self._error(error, request_id, version)
        except Exception as exc:
            # A bug: its traceback, once per kind and interval.
            kind = f"unexpected {type(exc).__name__} {exc}"[:300]
            self.errors.error(kind, f"{request_id}: unexpected error on {method} {path}", exc)
            reply = self._error(PlacementError(500, "An unexpected error occurred."), request_id, version)
        out_headers = [(errors.REQUEST_ID_HEADER, request_id)]
        if version is not None:
            out_headers.append((microversion.HEADER, f"{microversion.SERVICE_TYPE} {version}"))
            out_headers.append(("vary", microversion.HEADER))
        out_headers.extend(reply.headers.items())
        if CUT_SHORT_HEADER in reply.headers:
            log.warning(
                "%s: GET /allocation_candidates?%s: the search stopped after %s steps, the answer may miss "
                "candidates; ask with limit or set max_allocation_candidates",
                request_id,
                query_string[:500],
                reply.headers[CUT_SHORT_HEADER],
            )
        if reply.status >= 400 and not (version and version.at_least(23)) and isinstance(reply.body, dict):
            for error in reply.body.get("errors", []):  # 1.23 added ``code`` to errors
                error.pop("code", None)
        location = reply.headers.get("location", "")
        if location.startswith("/") and headers.get("host"):  # absolute, as upstream (webob) sends it
            out_headers = [(k, v) for k, v in out_headers if k != "location"]
            out_headers.append(("location", f"{scheme}://{headers['host']}{location}"))
        if reply.body is None:
            return Response(reply.status, out_headers, b"")
        accept = headers.get("accept")
        if reply.status >= 400 and accept and not _accepts_json(accept):
            return _error_as_text(reply, out_headers, accept)
        out_headers.append(("content-type", "application/json"))
        return Response(reply.status, out_headers, orjson.dumps(reply.body))

    def _route_again_on_deadlock(
        self,
        method: str,
        path: str,
        query_string: str,
        headers: Mapping[str, str],
        body: bytes,
        version: microversion.Version,
    ) -> Reply:
        """As upstream's writes (oslo.db's ``wrap_db_retry(retry_on_deadlock=True)``): a
        request whose transaction the database rolled back for another one's sake
        (:func:`devtag_host.db.is_retryable`: InnoDB's deadlocks and lock wait timeouts,
        Galera's certification conflicts, PostgreSQL's deadlocks) runs again, up to
        ``DB_RETRIES`` times, after a short random pause; then the client gets 409.
        Every handler writes in one transaction, so nothing of a failed try remains."""
        for attempt in range(DB_RETRIES):
            try:
                return self._route(method, path, query_string, headers, body, version)
            except DBAPIError as exc:
                if attempt == DB_RETRIES - 1 or not db.is_retryable(exc):
                    raise
                log.info("%s %s: %s; running it again", method, path, str(exc.orig).splitlines()[0][:200])
                time.sleep(random.uniform(0, min(0.2, 0.005 * 2**attempt)))  # noqa: S311 - jitter
        raise AssertionError("unreachable")  # pragma: no cover

    def _route(
        self,
        method: str,
        path: str,
        query_string: str,
        headers: Mapping[str, str],
        body: bytes,
        version: microversion.Version,
    ) -> Reply:
        match, methods = _find_route(path)
        who: Optional[policy.Credentials] = None
        if path != "/":
            who = self._check_token(headers.get("x-auth-token"), headers)
        if body and not headers.get("content-type"):
            raise errors.bad_request("content-type header required when content-length > 0")
        if method == "HEAD" and "GET" in methods:
            method = "GET"
        if method not in methods:  # as upstream: every method of the route, whatever the version
            allowed = ", ".join(sorted(methods))
            raise PlacementError(
                405, f"The method {method} is not allowed for this resource.", headers={"allow": allowed}
            )
        minor, handler, takes_body = methods[method]
        if not version.at_least(minor):
            if (path.endswith("/inventories"), method) == (True, "DELETE"):
                # Upstream declares this one method as 405 below its version.
                raise PlacementError(405, f"The method {method} is not allowed for this resource.")
            raise errors.not_found("The resource could not be found.")
        # No name or identifier holds a NUL (every write refuses one; PostgreSQL's text
        # cannot): a path naming one names nothing, a query with one is malformed.
        if "\x00" in path:
            raise errors.not_found("The resource could not be found.")
        if method == "GET" and headers.get("accept") and not _accepts_json(headers["accept"]):
            raise PlacementError(406, "Only application/json is provided")
        parsed: Any = None
        provider_first: Optional[str] = None
        if takes_body or (body and method in ("PUT", "POST")):
            content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if content_type != "application/json":
                raise PlacementError(
                    415,
                    f"The media type {content_type or 'None'} is not supported, use application/json",
                )
        if who is not None:
            self._authorize(match.re.pattern, method, who, query_string)
        if takes_body or (body and method in ("PUT", "POST")):
            if "uuid" in match.groupdict() and path.startswith("/resource_providers/") and not path.endswith("/traits"):
                # As upstream: an unknown provider is a 404 before its body is read
                # (but for PUT .../traits, whose body upstream reads first).  Its
                # handler looks the provider up first thing in its own transaction,
                # so only a body refused before that needs the look-up here: a
                # separate read transaction per write cost a fifth of the load path.
                provider_first = match.group("uuid")
            try:
                parsed = decode_json(body)
            except PlacementError:
                self._require_provider(provider_first)
                raise
        try:
            query = parse_qsl(query_string, keep_blank_values=True, strict_parsing=False, max_num_fields=100)
        except ValueError:
            raise errors.bad_request("Invalid query string parameters: too many fields") from None
        if any("\x00" in key or "\x00" in value for key, value in query):
            raise errors.bad_request("Invalid query string parameters: NUL character")
        call = Call(self.store, version, match.groupdict(), query, parsed, self.candidate_settings)
        try:
            return handler(call)
        except (PlacementError, PlacementException):
            self._require_provider(provider_first)
            raise

    def _require_provider(self, uuid: Optional[str]) -> None:
        """404 if the provider ``uuid`` (if any) does not exist."""
        if uuid is not None:
            with self.store.read() as connection:
                provider_objects.get_or_404(connection, uuid)

    def _check_token(self, token: Optional[str], headers: Mapping[str, str]) -> policy.Credentials:
        if token is None or not self.access.token_accepted(token):
            raise PlacementError(401, "The request you have made requires authentication.")
        return policy.credentials(token, headers, trusted=self.auth_token is not None)

    def _authorize(self, pattern: str, method: str, who: policy.Credentials, query_string: str) -> None:
        """403 unless upstream's default policy lets ``who`` do this."""
        rule = policy.RULES.get((_TEMPLATES[pattern], method))
        if rule is None:
            return
        project_id = None
        if rule in policy.PROJECT_READER:
            project_id = dict(parse_qsl(query_string, keep_blank_values=True, max_num_fields=100)).get("project_id")
        if not policy.allows(rule, who, project_id):
            raise PlacementError(403, policy.refusal(rule, who))

    def _error(self, exc: PlacementError, request_id: str, version: Optional[microversion.Version]) -> Reply:
        """The API-WG error document.  (Upstream adds ``code`` only from 1.23 on:
        the differential test's normaliser ignores it until devtag serves 1.23.)"""
        title = errors.TITLES.get(exc.status, "Error")
        error: Dict[str, Any] = {"status": exc.status, "title": title, "detail": exc.detail, "code": exc.code}
        error["request_id"] = request_id
        error.update(exc.extra)
        return Reply(exc.status, {"errors": [error]}, dict(exc.headers))

    # -- ASGI ----------------------------------------------------------------------------------
    async def __call__(self, scope: Dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    collector.tune()  # the serving process starts: no request runs yet
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        from starlette.concurrency import run_in_threadpool

        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        query_string = scope.get("query_string", b"").decode("latin-1")
        refused = self.admit(scope["method"], scope["path"], query_string, headers)
        if refused is not None:
            await self._send(scope, refused, send)
            return
        chunks: List[bytes] = []
        size = 0
        more = True
        too_big = False
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                too_big = True
                break
            chunks.append(chunk)
            more = message.get("more_body", False)
        if too_big:
            response = _refusal(413, "Request body too large.")
        else:
            response = await run_in_threadpool(
                self.handle,
                scope["method"],
                scope["path"],
                query_string,
                headers,
                b"".join(chunks),
                scope.get("scheme", "http"),
            )
        await self._send(scope, response, send)

    async def _send(self, scope: Dict[str, Any], response: Response, send: Callable) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
        if not any(name.lower() == b"content-length" for name, _value in headers):
            # Its length, as upstream's WSGI servers send it: else uvicorn would send the body
            # chunked, which clients read piece by piece (a HEAD gets the length of the GET).
            headers.append((b"content-length", str(len(response.body)).encode("latin-1")))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else response.body})

    # -- WSGI ----------------------------------------------------------------------------------
    def wsgi(self, environ: Dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        headers = {
            key[5:].replace("_", "-").lower(): value for key, value in environ.items() if key.startswith("HTTP_")
        }
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        if environ.get("CONTENT_LENGTH"):
            headers["content-length"] = environ["CONTENT_LENGTH"]
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        path = environ.get("PATH_INFO", "") or "/"
        refused = self.admit(environ["REQUEST_METHOD"], path, environ.get("QUERY_STRING", ""), headers)
        if refused is not None:
            hop_free = [(name, value) for name, value in refused.headers if name != "connection"]  # PEP 3333
            start_response(f"{refused.status} {errors.TITLES.get(refused.status, 'Error')}", hop_free)
            return [refused.body]
        body = environ["wsgi.input"].read(length) if length else b""
        scheme = environ.get("wsgi.url_scheme", "http")
        response = self.handle(environ["REQUEST_METHOD"], path, environ.get("QUERY_STRING", ""), headers, body, scheme)
        start_response(f"{response.status} {errors.TITLES.get(response.status, 'OK')}", response.headers)
        return [b"" if environ["REQUEST_METHOD"] == "HEAD" else response.body]


def _error_as_text(reply: Reply, headers: List[Tuple[str, str]], accept: str) -> Response:
    """An error for a client that does not take JSON: HTML if it takes that, else
    plain text, in the words of upstream's error pages (webob)."""
    (error,) = reply.body["errors"]
    title = f"{error['status']} {error['title']}"
    if "html" in accept.lower():
        detail = html.escape(error["detail"])
        head = f"<html>\n <head>\n  <title>{title}</title>\n </head>\n"
        page = f"{head} <body>\n  <h1>{title}</h1>\n  {detail}\n </body>\n</html>"
        return Response(reply.status, [*headers, ("content-type", "text/html; charset=UTF-8")], page.encode())
    text = f"{title}\n\n{error['detail']}"
    return Response(reply.status, [*headers, ("content-type", "text/plain; charset=UTF-8")], text.encode())


_CLOSE_JSON = [("content-type", "application/json"), ("connection", "close")]


def _refusal(status: int, detail: str) -> Response:
    """An answer given before routing (the Host header, the body's size), the same for ASGI
    and WSGI: the error document with ``code``, and a request id of its own as every answer
    has (header, body and request log); the connection is closed after it."""
    request_id = errors.new_request_id()
    error = {"status": status, "title": errors.TITLES[status], "detail": detail, "code": errors.DEFAULT}
    error["request_id"] = request_id
    headers = [(errors.REQUEST_ID_HEADER, request_id), *_CLOSE_JSON]
    return Response(status, headers, orjson.dumps({"errors": [error]}))


def create_app(
    db_url: Optional[str] = None,
    auth_token: Optional[str] = None,
    access: Optional[Access] = None,
    candidate_settings: Optional[CandidateSettings] = None,
) -> Placement:
    """An application on ``db_url`` (default: ``$DEVTAG_PLACEMENT_DB`` or the SQLite file);
    ``candidate_settings`` default to upstream's."""
    return Placement(Store(db_url), auth_token, access, candidate_settings)


TOKEN_FILE_ENV = "DEVTAG_PLACEMENT_TOKEN_FILE"  # noqa: S105 - a variable name
ANY_TOKEN_ENV = "DEVTAG_PLACEMENT_ANY_TOKEN"  # noqa: S105 - a variable name
LISTEN_HOST_ENV = "DEVTAG_PLACEMENT_LISTEN_HOST"
ALLOWED_HOSTS_ENV = "DEVTAG_PLACEMENT_ALLOWED_HOSTS"


def read_token_file(path: str) -> str:
    return read_secret_file(path, "--auth-token-file")


def access_from_env() -> Access:
    """The rule of ``placement serve``, for the factories: the token in ``$DEVTAG_PLACEMENT_TOKEN_FILE``,
    else any token if ``$DEVTAG_PLACEMENT_ANY_TOKEN=1``, else the generated one; the Host names of
    ``$DEVTAG_PLACEMENT_LISTEN_HOST`` and ``$DEVTAG_PLACEMENT_ALLOWED_HOSTS`` (comma-separated).
    Without either, any Host is answered, unless any token is: then only loopback names."""
    token_file = os.environ.get(TOKEN_FILE_ENV)
    any_token = os.environ.get(ANY_TOKEN_ENV) == "1"
    token = read_token_file(token_file) if token_file else None if any_token else generated_token()
    listen_host = os.environ.get(LISTEN_HOST_ENV)
    extra = [name for name in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if name.strip()]
    if listen_host or extra or any_token:
        return dataclasses.replace(listen_hosts(listen_host or "localhost", extra), token=token)
    return Access(token=token)


def create_app_from_env() -> Placement:
    """For ``uvicorn --factory devtag_host.placement.app:create_app_from_env`` (several workers)."""
    return create_app(None, access=access_from_env(), candidate_settings=candidate_settings_from_env())


def create_wsgi_app_from_env() -> Callable:
    """For WSGI servers: ``gunicorn 'devtag_host.placement.app:create_wsgi_app_from_env()'``."""
    return create_app_from_env().wsgi
