"""``[api] auth_strategy = keystone``: tokens validated by keystonemiddleware's auth_token.

As OpenStack Placement deploys it: ``auth_token`` validates the X-Auth-Token
against Keystone (its settings are the ``[keystone_authtoken]`` section of the
configuration file, read by keystonemiddleware itself), answers 401 for a
token Keystone does not know, and passes the token's roles on in
``X-Roles`` (dropping any a client sent); placement's policy
(:mod:`.policy`, upstream's defaults) decides on them.  The version document
``/`` needs no token, as upstream.

The stack is WSGI (keystonemiddleware is WSGI middleware): uvicorn serves it
through its WSGI adapter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import InputError

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]


def keystone_app(placement_wsgi: WSGIApp, config_file: Path | None) -> WSGIApp:
    """The WSGI application: ``/`` as it is, the rest behind auth_token."""
    if config_file is None:
        raise InputError("[api] auth_strategy = keystone needs a configuration file with [keystone_authtoken]")
    try:
        from keystonemiddleware import auth_token
    except ImportError:
        raise InputError(
            "[api] auth_strategy = keystone needs keystonemiddleware (pip install keystonemiddleware)"
        ) from None

    protected = auth_token.AuthProtocol(
        placement_wsgi,
        {"oslo_config_project": "devtag", "oslo_config_file": str(config_file), "delay_auth_decision": "false"},
    )

    def dispatch(environ: dict, start_response: Callable) -> Any:
        if environ.get("PATH_INFO", "/") in ("", "/"):
            return placement_wsgi(environ, start_response)
        return protected(environ, start_response)

    return dispatch
