"""What ``pip install 'devtag[host]'`` brings, by import name: a command that
meets a missing one says in one line what to install (docs/install.md)."""

from __future__ import annotations

from typing import Dict, Optional

# import name -> the distribution of setup.py's "host" extra that provides it
HOST_EXTRA: Dict[str, str] = {
    "libvirt": "libvirt-python",
    "defusedxml": "defusedxml",
    "jsonschema_rs": "jsonschema-rs",
    "pycdlib": "pycdlib",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
    "httptools": "httptools",
    "uvloop": "uvloop",
    "sqlalchemy": "SQLAlchemy",
    "alembic": "alembic",
    "psycopg": "psycopg",
    "pymysql": "PyMySQL",
    "os_traits": "os-traits",
    "os_resource_classes": "os-resource-classes",
    "orjson": "orjson",
    "prometheus_client": "prometheus-client",
    "requests": "requests",
    "argparse_manpage": "argparse-manpage",
}

_HOW = (
    "install devtag's host extra (pip install 'devtag[host]'; libvirt-python needs libvirt-dev, pkg-config, "
    "gcc and python3-dev) or the devtag-host package"
)


def missing_extra(exc: ModuleNotFoundError, what: str = "devtag-host") -> Optional[str]:
    """One line naming the missing module of the host extra and what to install; None for another module."""
    top = (exc.name or "").split(".")[0]
    if top not in HOST_EXTRA:
        return None
    if top == "libvirt":
        how = "install python3-libvirt (Debian) or libvirt-python (pip install 'devtag[host]')"
        return f"{what} needs the Python module 'libvirt', which is not installed: {how}"
    module = repr(top) if HOST_EXTRA[top] == top else f"{top!r} ({HOST_EXTRA[top]})"
    return f"{what} needs the Python module {module}, which is not installed: {_HOW}"
