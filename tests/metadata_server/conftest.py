"""Fixtures: sample instances and a live metadata server on loopback."""

from __future__ import annotations

from typing import Any, Callable, Iterator, List

import pytest

from devtag_host.metadata_server import InstanceDirectory
from devtag_host.metadata_server.server import BackgroundServer

from .metadata_server_samples import MAC_A, MAC_B, UUID_A, UUID_B, sample_instance


@pytest.fixture
def directory() -> InstanceDirectory:
    directory = InstanceDirectory()
    directory.put(sample_instance(UUID_A, MAC_A, "alpha", user_data=b"#cloud-config\n"))
    directory.put(sample_instance(UUID_B, MAC_B, "bravo", public_keys=(("k", "ssh-ed25519 AAAA b@b"),)))
    return directory


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """``serve(app, host=..., **limits)`` -> base URL of a live server of ``app``; stopped after the test."""
    servers: List[BackgroundServer] = []

    def start(app: Any, host: str = "127.0.0.1", **limits: Any) -> str:
        server = BackgroundServer(app, host=host, **limits)
        servers.append(server)
        return f"http://{host}:{server.port}"

    yield start
    for server in servers:
        server.stop()
