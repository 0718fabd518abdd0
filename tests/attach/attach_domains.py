"""Domain XML the attach tests define (a module of its own: ``conftest`` is not
importable by name once several test folders have one)."""

RUNNING_DOMAIN = """<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>
  <os><type arch='x86_64' machine='pc'>hvm</type></os><features><acpi/></features><devices>
  <controller type='scsi' index='0' model='virtio-scsi'/>
  <controller type='usb' index='0' model='piix3-uhci'/>
</devices></domain>"""
