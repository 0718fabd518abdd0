"""A throw-away Keystone (OpenStack Identity, from PyPI) for tests.

:func:`throwaway_keystone` writes a ``keystone.conf`` (SQLite, Fernet keys in a
temporary directory), runs ``keystone-manage db_sync``, ``fernet_setup``,
``credential_setup`` and ``bootstrap`` (the ``admin`` user, project and role
and the identity endpoint), and serves Keystone's own WSGI application from a
child process on a free loopback port.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx

from .services import free_port, wait_for_port

ADMIN_PASSWORD = "keystone-admin-secret"
_SERVER = """
import os, sys
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from keystone.server import wsgi

class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass

class Threading(ThreadingMixIn, WSGIServer):
    daemon_threads = True

port = int(sys.argv.pop())  # keystone parses the command line: it is ours alone
application = wsgi.initialize_public_application()
make_server("127.0.0.1", port, application, server_class=Threading, handler_class=Quiet).serve_forever()
"""


@dataclass
class Keystone:
    url: str  # the identity endpoint, http://127.0.0.1:PORT/v3
    admin_password: str

    def admin_token(self) -> str:
        return self.token("admin", self.admin_password, "admin")

    def token(self, user: str, password: str, project: str) -> str:
        body = {
            "auth": {
                "identity": {
                    "methods": ["password"],
                    "password": {"user": {"name": user, "domain": {"id": "default"}, "password": password}},
                },
                "scope": {"project": {"name": project, "domain": {"id": "default"}}},
            }
        }
        reply = httpx.post(f"{self.url}/auth/tokens", json=body, timeout=30)
        reply.raise_for_status()
        return reply.headers["x-subject-token"]

    def user_with_role(self, name: str, password: str, role: str) -> None:
        """A user with ``role`` on the admin project (the role is created if missing)."""
        headers = {"x-auth-token": self.admin_token()}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as client:
            user = client.post("/users", json={"user": {"name": name, "password": password, "domain_id": "default"}})
            user.raise_for_status()
            roles = client.get("/roles", params={"name": role}).json()["roles"]
            if roles:
                role_id = roles[0]["id"]
            else:
                created = client.post("/roles", json={"role": {"name": role}})
                created.raise_for_status()
                role_id = created.json()["role"]["id"]
            project = client.get("/projects", params={"name": "admin"}).json()["projects"][0]["id"]
            client.put(f"/projects/{project}/users/{user.json()['user']['id']}/roles/{role_id}").raise_for_status()


@contextlib.contextmanager
def throwaway_keystone(base: Optional[Path] = None) -> Iterator[Keystone]:
    base = Path(tempfile.mkdtemp(prefix="keystone-")) if base is None else base
    port = free_port()
    url = f"http://127.0.0.1:{port}/v3"
    conf = base / "keystone.conf"
    conf.write_text(
        f"[database]\nconnection = sqlite:///{base / 'keystone.sqlite'}\n"
        f"[fernet_tokens]\nkey_repository = {base / 'fernet-keys'}\n"
        f"[fernet_receipts]\nkey_repository = {base / 'fernet-receipts'}\n"
        f"[credential]\nkey_repository = {base / 'credential-keys'}\n"
        "[token]\nprovider = fernet\n"
    )
    manage = [str(Path(sys.executable).parent / "keystone-manage"), "--config-file", str(conf)]
    user = ["--keystone-user", str(os.getuid()), "--keystone-group", str(os.getgid())]
    for step in (
        ["db_sync"],
        ["fernet_setup", *user],
        ["credential_setup", *user],
        [
            "bootstrap",
            "--bootstrap-password",
            ADMIN_PASSWORD,
            "--bootstrap-admin-url",
            url,
            "--bootstrap-public-url",
            url,
            "--bootstrap-internal-url",
            url,
            "--bootstrap-region-id",
            "RegionOne",
        ],
    ):
        done = subprocess.run([*manage, *step], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"keystone-manage {step[0]}: {done.stderr[-2000:]}"
    env = {**os.environ, "OS_KEYSTONE_CONFIG_FILES": str(conf)}
    log = open(base / "keystone.log", "ab")
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)], env=env, stdout=log, stderr=log)
    try:
        wait_for_port(port, timeout=120)
        yield Keystone(url, ADMIN_PASSWORD)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
