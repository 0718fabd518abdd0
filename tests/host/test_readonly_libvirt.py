"""The metadata server only reads libvirt: a read-only connection is all it needs.

libvirt's read-only socket is open to every local user, so the packaged unit
runs as a dynamic user without the ``libvirt`` group.  Here a throw-away
libvirtd: the watcher loads a domain and follows a tag change through events
on a connection that cannot define anything.
"""

from __future__ import annotations

import time

import libvirt
import pytest

from devtag_host import virt
from devtag_host.metadata import add_tags
from devtag_host.metadata_server.directory import InstanceDirectory
from devtag_host.metadata_server.libvirt_watch import LibvirtWatcher
from tests.support.migration_testing import libvirtd_available, throwaway_libvirt_host

pytestmark = [
    pytest.mark.libvirt,
    pytest.mark.skipif(not libvirtd_available(), reason="needs libvirtd and qemu-system-x86_64"),
]
MAC = "52:54:00:00:00:31"
DOMAIN = f"""<domain type='qemu'><name>ro-reader</name><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <devices><interface type='user'><mac address='{MAC}'/><model type='virtio'/></interface></devices>
</domain>"""


def _tags(directory: InstanceDirectory) -> list:
    entry = directory.by_mac(MAC)
    if entry is None:
        return []
    return [tag for device in entry.instance.devices for tag in device.get("tags", [])]


def test_the_watcher_works_on_a_read_only_connection() -> None:
    with throwaway_libvirt_host("ro") as host:
        writer = virt.open_connection(host.uri)
        reader = virt.open_connection(host.uri, read_only=True)
        try:
            handle = writer.defineXML(DOMAIN)
            with pytest.raises(libvirt.libvirtError, match="read only"):
                reader.defineXML(DOMAIN.replace("ro-reader", "ro-writer"))
            directory = InstanceDirectory()
            watcher = LibvirtWatcher(reader, directory, lease_interval=0.2)
            watcher.start()
            try:
                assert directory.by_mac(MAC) is not None and _tags(directory) == []
                virt.update_tags(handle, lambda domain: add_tags(domain, MAC, ["ro-tag"]))
                deadline = time.monotonic() + 20
                while _tags(directory) != ["ro-tag"] and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert _tags(directory) == ["ro-tag"], "the metadata-change event reached the read-only reader"
            finally:
                watcher.stop()
        finally:
            reader.close()
            writer.close()
