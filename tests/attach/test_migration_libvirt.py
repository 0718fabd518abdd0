"""What devtag's migration flow relies on, checked on a real libvirt-to-libvirt migration.

Two throw-away libvirt daemons on this machine (see
:mod:`tests.support.migration_testing` (tests/support/)), a TCG domain whose disk is an
NBD export from ``qemu-nbd`` on loopback (shared storage: both hosts reach the
same export).  These are facts about libvirt, not about devtag, but the flow
is only right if they hold: tags ride along in the domain's ``<metadata>``,
a failed migration leaves the domain running on the source, and libvirt
refuses "shared" storage that is not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from devtag_host.cli import main as devtag_host
from tests.support.migration_testing import LibvirtHost, free_port, throwaway_libvirt_host

libvirt = pytest.importorskip("libvirt")
pytestmark = pytest.mark.libvirt


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[Tuple[LibvirtHost, LibvirtHost]]:
    with throwaway_libvirt_host("source") as source:
        with throwaway_libvirt_host("destination") as destination:
            yield source, destination


@pytest.fixture
def nbd_export(tmp_path: Path) -> Iterator[Tuple[str, int]]:
    """A 16 MiB raw image exported by ``qemu-nbd`` on 127.0.0.1 (shared storage for both hosts)."""
    image = tmp_path / "volume.raw"
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    port = free_port()
    pid_file = tmp_path / "qemu-nbd.pid"
    command = ["qemu-nbd", "--fork", f"--pid-file={pid_file}", "--persistent", "--shared=8"]
    command += ["--bind=127.0.0.1", f"--port={port}", "--format=raw", "--export-name=vol", str(image)]
    subprocess.run(command, check=True)  # --fork returns once the export listens
    try:
        yield "vol", port
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGTERM)


def domain_xml(name: str, export: str, port: int) -> str:
    return f"""<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
      <os><type arch='x86_64' machine='pc'>hvm</type></os><features><acpi/></features>
      <devices>
        <disk type='network' device='disk'><driver name='qemu' type='raw' cache='none'/>
          <source protocol='nbd' name='{export}'><host name='127.0.0.1' port='{port}'/></source>
          <target dev='vdb' bus='virtio'/><serial>vol-serial</serial><alias name='ua-vol'/></disk>
        <serial type='null'/><memballoon model='none'/>
      </devices></domain>"""


def migrate(domain: object, destination: object, flags: int = 0) -> object:
    params = {
        libvirt.VIR_MIGRATE_PARAM_URI: f"tcp://127.0.0.1:{free_port()}",
        libvirt.VIR_MIGRATE_PARAM_LISTEN_ADDRESS: "127.0.0.1",  # loopback only
    }
    flags |= libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
    return domain.migrate3(destination, params, flags)  # type: ignore[attr-defined]


def test_tags_travel_with_the_domain_and_the_source_forgets_it(
    two_hosts: Tuple[LibvirtHost, LibvirtHost], nbd_export: Tuple[str, int]
) -> None:
    source_host, destination_host = two_hosts
    source = libvirt.open(source_host.uri)
    destination = libvirt.open(destination_host.uri)
    domain = source.defineXML(domain_xml("mig-tags", *nbd_export))
    domain.create()
    assert devtag_host(["tag", "--connect", source_host.uri, "mig-tags", "ua-vol", "db", "fast db"]) == 0

    migrated = migrate(domain, destination)

    assert migrated.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    from devtag_host import virt
    from devtag_host.metadata import find_device, tags_of

    for inactive in (False, True):  # the live and the persisted definition
        model = virt.read_domain(migrated, inactive=inactive)
        assert tags_of(model, find_device(model, "ua-vol")) == ("db", "fast db")
    assert [d.name() for d in source.listAllDomains()] == []
    migrated.destroy()
    migrated.undefine()


def test_a_failed_migration_leaves_the_domain_running_on_the_source(
    two_hosts: Tuple[LibvirtHost, LibvirtHost], nbd_export: Tuple[str, int]
) -> None:
    """The destination cannot open the disk: libvirt aborts, the source keeps the domain."""
    source_host, destination_host = two_hosts
    source = libvirt.open(source_host.uri)
    destination = libvirt.open(destination_host.uri)
    domain = source.defineXML(domain_xml("mig-fail", *nbd_export))
    domain.create()
    unreachable = domain_xml("mig-fail", "vol", free_port())  # nobody listens there
    params = {
        libvirt.VIR_MIGRATE_PARAM_URI: f"tcp://127.0.0.1:{free_port()}",
        libvirt.VIR_MIGRATE_PARAM_LISTEN_ADDRESS: "127.0.0.1",
        libvirt.VIR_MIGRATE_PARAM_DEST_XML: unreachable,
    }
    with pytest.raises(libvirt.libvirtError):
        domain.migrate3(destination, params, libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PERSIST_DEST)
    assert domain.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    assert [d.name() for d in destination.listAllDomains()] == []
    domain.destroy()
    domain.undefine()


def test_local_file_disks_are_refused_as_unsafe(two_hosts: Tuple[LibvirtHost, LibvirtHost]) -> None:
    """A file on a local file system is not shared storage: libvirt says so (unless forced)."""
    source_host, destination_host = two_hosts
    source = libvirt.open(source_host.uri)
    destination = libvirt.open(destination_host.uri)
    image = Path(tempfile.mkdtemp(prefix="dtlv-img-")) / "local.raw"  # reachable by the daemons' user
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    image.chmod(0o666)
    image.parent.chmod(0o755)
    xml = domain_xml("mig-unsafe", "vol", 1).replace(
        "<disk type='network' device='disk'><driver name='qemu' type='raw' cache='none'/>\n"
        "          <source protocol='nbd' name='vol'><host name='127.0.0.1' port='1'/></source>",
        f"<disk type='file' device='disk'><driver name='qemu' type='raw' cache='none'/><source file='{image}'/>",
    )
    domain = source.defineXML(xml)
    domain.create()
    with pytest.raises(libvirt.libvirtError) as refused:
        migrate(domain, destination)
    assert refused.value.get_error_code() == libvirt.VIR_ERR_MIGRATE_UNSAFE
    assert domain.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    domain.destroy()
    domain.undefine()
    shutil.rmtree(image.parent)
