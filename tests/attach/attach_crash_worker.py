"""A devtag process that dies for real: ``python attach_crash_worker.py MODE URI STATE DB DOMAIN FLOW STEP``.

``setup`` defines and starts DOMAIN with a volume ``victim`` (attached for a
detach flow); ``crash`` runs FLOW with a step hook that SIGKILLs this process
before STEP runs (no rollback, no ``finally``: the journal, the store, QEMU
and the qemu-nbd exports are left as a real crash leaves them); ``cleanup``
destroys and undefines DOMAIN.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import libvirt

from devtag_host import virt
from devtag_host.attach import AttachmentStore, ComputeHost
from devtag_host.attach.host import default_backends

DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><features><acpi/></features><devices>
  <controller type='scsi' index='0' model='virtio-scsi'/>
</devices></domain>"""


def main() -> None:
    mode, uri, state, db, name, flow, step = sys.argv[1:]
    connection = virt.open_connection(uri)
    if mode == "cleanup":
        handle = connection.lookupByName(name)
        for _ in range(50):  # the new process may still be reconnecting to QEMU
            try:
                if handle.isActive():
                    handle.destroy()
                break
            except libvirt.libvirtError:
                time.sleep(0.1)
        handle.undefine()
        return

    def hook(current_flow: str, current_step: str) -> None:
        if mode == "crash" and (current_flow, current_step) == (flow, step):
            os.kill(os.getpid(), signal.SIGKILL)

    store = AttachmentStore(db)
    host = ComputeHost(
        connection, store, host="node1", backends=default_backends(connection, Path(state)), step_hook=hook
    )
    if mode == "setup":
        connection.defineXML(DOMAIN.format(name=name)).create()
        host.create_volume("victim", 1 << 20, backend="nbd")
        if flow == "detach-volume":
            host.attach_volume(name, "victim", tag="victim", bus="scsi")
    elif flow == "attach-volume":
        host.attach_volume(name, "victim", tag="victim", bus="scsi")
    elif flow == "detach-volume":
        host.detach_volume(name, "victim")
    print("flow finished without crashing")


if __name__ == "__main__":
    main()
