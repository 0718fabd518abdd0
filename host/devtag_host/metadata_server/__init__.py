"""An OpenStack-compatible metadata service for libvirt domains.

Serves each instance the documents of its config drive (``/openstack/...``,
the EC2 tree), identified by its source address (DHCP lease / neighbour
table -> MAC -> domain) or, behind Nova's metadata proxy, by the signed
``X-Instance-ID`` headers; kept live by libvirt domain events.

Example (in a host daemon)::

    from devtag_host import virt
    from devtag_host.metadata_server import MetadataService
    service = MetadataService(virt.open_connection("qemu:///system"))
    service.run(host="169.254.169.254", port=80)
"""

from __future__ import annotations

import gc
import socket
from typing import Any, Callable, Mapping, Optional, Sequence

from ..serving import listening_socket_for
from .app import create_app
from .directory import InstanceDirectory
from .requester import AddressBook, DirectIdentifier, ProxyIdentifier, instance_signature
from .site import build_site

__all__ = [
    "AddressBook",
    "DirectIdentifier",
    "InstanceDirectory",
    "MetadataService",
    "ProxyIdentifier",
    "build_site",
    "create_app",
    "instance_signature",
]


class MetadataService:
    """Directory + libvirt watcher + ASGI application, ready to serve."""

    def __init__(
        self,
        connection: Any,
        *,
        proxy_secret: Optional[bytes] = None,
        addresses: Optional[AddressBook] = None,
        extras: Callable[[str], Mapping[str, Any]] = lambda _uuid: {},
        log_requests: bool = True,
        access_log: Optional[Callable[[str], None]] = None,
        reconnect: Optional[Callable[[], Any]] = None,
        all_devices: bool = False,
        metrics: Any = None,
    ) -> None:
        from .libvirt_watch import LibvirtWatcher  # libvirt: only a service that watches domains

        self.directory = InstanceDirectory()
        if reconnect is not None and metrics is not None:
            reconnect = metrics.counting_reconnects(reconnect)
        self.watcher = LibvirtWatcher(
            connection, self.directory, extras=extras, reconnect=reconnect, all_devices=all_devices
        )
        if proxy_secret is None and addresses is None:
            addresses = AddressBook(leases=self.watcher.leases)
        self._addresses = addresses
        self.app = create_app(
            self.directory,
            proxy_secret=proxy_secret,
            addresses=addresses,
            log_requests=log_requests,
            access_log=access_log,
            metrics=metrics,
        )
        self._metrics = metrics
        self._server: Any = None
        self._access_log = access_log

    def run(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 8775,
        fd: Optional[int] = None,
        sockets: Optional[Sequence[socket.socket]] = None,
        on_shutdown: Sequence[Callable[[], None]] = (),
    ) -> None:
        """Serve in this thread until interrupted (SIGINT/SIGTERM): on ``sockets`` (listening already,
        one per network), else on the descriptor ``fd``, else on ``host:port``.  ``on_shutdown`` runs
        once the connections are closed, after the access log is flushed."""
        from .server import metadata_server  # httptools and uvloop: only a service that serves

        flush = getattr(self._access_log, "flush", None)
        self.watcher.start()
        # The sites are long-lived: keep the collector from re-scanning them (cheaper collections, lower p99).
        gc.freeze()
        try:
            callbacks = [flush, *on_shutdown] if flush else list(on_shutdown)
            listeners = list(sockets) if sockets else [listening_socket_for(host, port, fd)]
            server = metadata_server(self.app, listeners, on_shutdown=callbacks)
            if self._metrics is not None:
                self._metrics.watch_connections(server.connections)
            server.run()
        finally:
            self.watcher.stop()

    def start_in_thread(self, *, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve from a background thread (tests, embedding); returns the bound port."""
        from .server import BackgroundServer  # httptools: only a service that serves

        self.watcher.start()
        self._server = BackgroundServer(self.app, host=host, port=port)
        return self._server.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.watcher.stop()
        table = getattr(self._addresses, "table", None)
        if table is not None:
            table.close()
