"""A Nova-style metadata proxy for the end-to-end tests.

In OpenStack the guest never talks to the metadata API directly: Neutron's
metadata agent (or nova-api-metadata's own proxy) receives the guest's request,
works out which instance sent it from the network it came from, and forwards it
with ``X-Instance-ID``, ``X-Tenant-ID`` and ``X-Instance-ID-Signature`` (hex
HMAC-SHA256 of the instance id under the shared secret) to the metadata
service, which trusts only those signed headers (``devtag-host metadata-server
--proxy-shared-secret-file``).

Here every guest request reaches the proxy from QEMU's user networking, so the
proxy serves exactly one instance, the one it was started for.  Whatever the
guest sends in those headers is replaced, as Neutron's agent does.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import http.server
import threading
from typing import Dict

_FORWARDED_RESPONSE_HEADERS = ("Content-Type", "Content-Length")
_PROXY_HEADERS = ("x-instance-id", "x-tenant-id", "x-instance-id-signature", "x-forwarded-for")


class SigningProxy:
    """Forward GET/HEAD from ``listen`` to the metadata service at ``upstream``, signed for one instance."""

    def __init__(
        self, listen: tuple, upstream: tuple, secret: bytes, instance_id: str, tenant_id: str, timeout: float = 10.0
    ) -> None:
        signature = hmac.new(secret, instance_id.encode("utf-8"), hashlib.sha256).hexdigest()
        signed = {"X-Instance-ID": instance_id, "X-Tenant-ID": tenant_id, "X-Instance-ID-Signature": signature}
        self.requests: list = []  # (method, path, status) of every forwarded request
        self._server = http.server.ThreadingHTTPServer(listen, _handler(upstream, signed, timeout, self.requests))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="signing-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def _handler(upstream: tuple, signed: Dict[str, str], timeout: float, log: list) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request a connection: nothing to keep track of

        def _forward(self, method: str) -> None:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _PROXY_HEADERS and k.lower() != "host"}
            headers.update(signed)
            headers["X-Forwarded-For"] = self.client_address[0]
            connection = http.client.HTTPConnection(*upstream, timeout=timeout)
            try:
                connection.request(method, self.path, headers=headers)
                response = connection.getresponse()
                body = response.read()
            except OSError as exc:
                log.append((method, self.path, 502))
                self.send_error(502, f"metadata service unreachable: {exc}")
                return
            finally:
                connection.close()
            log.append((method, self.path, response.status))
            self.send_response(response.status)
            for name in _FORWARDED_RESPONSE_HEADERS:
                if response.getheader(name) is not None:
                    self.send_header(name, response.getheader(name))
            self.end_headers()
            if method == "GET":
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._forward("GET")

        def do_HEAD(self) -> None:
            self._forward("HEAD")

        def log_message(self, *args: object) -> None:
            pass

    return Handler
