"""Roles for guests without the agent: the devices document as systemd credentials.

systemd (252 and later) imports credentials from the host before udev starts:
SMBIOS type 11 OEM strings ``io.systemd.credential.binary:NAME=BASE64`` and
QEMU fw_cfg files ``opt/io.systemd.credentials/NAME`` (systemd.system-credentials(7),
smbios-type-11(7)).  Some it acts upon itself:

* ``udev.rules.NAME`` becomes ``/run/udev/rules.d/NAME.rules``
  (systemd-udev-load-credentials.service, systemd 256 and later): here, rules
  that give a tagged disk the ``/dev/disk/by-tag/<role>`` links and every
  tagged disk and NIC the ``DEVTAG_TAGS`` / ``DEVTAG_TAG_<role>=1``
  properties the agent publishes, matching the device by where the guest sees
  it (``pci_path``, SCSI/SATA/USB address under its controller, as the agent
  resolves it), else by serial;
* ``network.link.NAME`` becomes ``/run/systemd/network/NAME.link``
  (systemd-network-generator): one per tagged NIC, matching its MAC, giving it
  ``AlternativeName=<role>`` and otherwise the naming policies of systemd's own
  ``99-default.link`` (only the first matching ``.link`` file applies, so the
  kernel name stays what it would be without it);
* ``systemd.unit-dropin.UNIT~NAME`` becomes a drop-in of UNIT (systemd-debug-generator,
  systemd 256): here one making ``systemd-udevd.service`` want
  ``systemd-udev-load-credentials.service`` and ``systemd-network-generator.service``
  (both run before udevd): Debian 13's udevd wants the first itself, but the
  network generator is not enabled there, and without it no ``.link`` file is written.

A role reaches a rule or a ``.link`` file only through the agent's encoding
(:mod:`.encoding`): every character but ASCII letters, digits, ``#+-.:=@_``
and printable non-ASCII ones is written as udev's ``\\xNN``; serials, MACs and
addresses are used only when they match a strict pattern.  So no quote,
``$``, ``%``, back-slash (other than an escape's), glob or line break of a
tenant's tag or a definition's serial reaches a rule.

Everything here is pure: :mod:`.domain` writes the result into a domain
definition, :mod:`.commands` is the ``devtag-host credentials`` verb.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import InputError
from .encoding import altname_for, encode_key, encode_name, link_name

__all__ = [
    "FWCFG_PREFIX",
    "SMBIOS_PREFIX",
    "Credential",
    "CredentialSet",
    "CredentialsError",
    "credentials_for",
    "fwcfg_entries",
    "smbios_strings",
]

SMBIOS_PREFIX = "io.systemd.credential.binary:"
FWCFG_PREFIX = "opt/io.systemd.credentials/"
RULES_PREFIX = "udev.rules.70-devtag-"
LINK_PREFIX = "network.link.70-devtag-"
UDEV_DROPIN_NAME = "systemd.unit-dropin.systemd-udevd.service~devtag-credentials"
UDEV_DROPIN = "[Unit]\nWants=systemd-udev-load-credentials.service systemd-network-generator.service\n"
TRANSPORTS = ("smbios", "fwcfg")
# Passed-through devices: the rules give the PCI function (or the TPM) the DEVTAG properties.
PASSTHROUGH_TYPES = ("hostdev", "mdev", "tpm")

# QEMU's fw_cfg file names are at most 55 characters (FW_CFG_MAX_FILE_PATH 56 with its NUL).
FWCFG_MAX_NAME = 55
# QEMU has 32 fw_cfg file slots on every q35 and pc machine type since 2.9
# (FW_CFG_FILE_SLOTS_DFLT; 16 before) and fills about twenty itself (ACPI
# tables, e820, SMBIOS, boot order, option ROMs, the kernel loader), and
# devtag's own fw_cfg transport takes one: credentials may take eight.
FWCFG_MAX_ENTRIES = 8
# One fw_cfg blob is passed to QEMU as a file; systemd imports at most 1 MiB of credentials in all.
FWCFG_MAX_BYTES = 512 * 1024
# QEMU's SMBIOS 2.1 entry point (the default of machine types before 8.1) caps
# the whole SMBIOS table at 65535 bytes, the system, processor and memory
# structures included; a type 11 structure counts its strings in one byte.
SMBIOS_MAX_BYTES = 60000
SMBIOS_MAX_STRINGS = 255
# One credential of rules is packed up to this many bytes before another is started.
RULES_CREDENTIAL_BYTES = 32 * 1024
# A udev rule line is read into a 16 KiB buffer (UDEV_LINE_SIZE); keep well below.
MAX_RULE_LINE = 8192

_PCI_PATH = re.compile(r"([0-9a-f]{2}):([0-9a-f]{2}\.[0-7](?:/[0-9a-f]{2}\.[0-7]){0,15})\Z")
_ROOT_PCI_ADDRESS = re.compile(r"0000:00:[0-9a-f]{2}\.[0-7]\Z")
_SCSI_ADDRESS = re.compile(r"([0-9]{1,5}):([0-9]{1,5}):([0-9]{1,5}):([0-9]{1,5})\Z")
_SATA_ADDRESS = re.compile(r"([0-9]{1,5}):([0-9]{1,3})\Z")
_USB_ADDRESS = re.compile(r"([0-9]{1,5}):([1-9][0-9]{0,2}(?:\.[1-9][0-9]{0,2}){0,4})\Z")
_MAC = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}\Z")
# A serial used in a rule: no glob character, quote, white space or '$'/'%'.
_SAFE_SERIAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:@=-]{0,63}\Z")
_HEX = "[0-9a-f][0-9a-f]"
VIRTIO_BLK_SERIAL_BYTES = 20


class CredentialsError(InputError, ValueError):
    """The credentials do not fit the transport (the message says what does not)."""


@dataclass(frozen=True)
class Credential:
    name: str
    data: bytes


@dataclass
class CredentialSet:
    """The credentials of one document, and the devices or roles they could not carry (with why)."""

    credentials: List[Credential] = field(default_factory=list)
    left_out: List[str] = field(default_factory=list)


def _pci_dir(where: Dict[str, Any]) -> Optional[str]:
    """A DEVPATH glob for the PCI function described by ``pci_path`` (else a root-bus address)."""
    match = _PCI_PATH.match(str(where.get("pci_path") or ""))
    if match:
        root, hops = match.group(1), match.group(2).split("/")
        glob = f"/devices/pci0000:{root}/0000:{root}:{hops[0]}"
        for hop in hops[1:]:  # the bus numbers behind a bridge are the guest firmware's
            glob += f"/0000:{_HEX}:{hop}"
        return glob
    address = str(where.get("address") or "")
    if where.get("bus", "pci") == "pci" and _ROOT_PCI_ADDRESS.match(address):
        return f"/devices/pci0000:00/{address}"
    return None


def _location_match(entry: Dict[str, Any]) -> List[str]:
    """DEVPATH (and ID_PATH) match keys for where the guest sees the device, as the agent resolves it; or []."""
    kind, bus, address = entry.get("type"), entry.get("bus"), str(entry.get("address") or "")
    given = entry.get("controller")
    controller: Dict[str, Any] = given if isinstance(given, dict) else {}
    if bus == "pci":
        found = _pci_dir(entry)
        return [f'DEVPATH=="{found}/*"'] if found else []
    if bus == "usb" and _USB_ADDRESS.match(address):
        ctrl = _pci_dir(controller)
        return [f'DEVPATH=="{ctrl}/usb[0-9]*/[0-9]*-{address.split(":")[1]}/*"'] if ctrl else []
    if kind != "disk":
        return []
    if bus == "scsi" and _SCSI_ADDRESS.match(address):
        ctrl = _pci_dir(controller)
        _, channel, target, lun = address.split(":")
        unit = f"{channel}:{target}"  # target<H>:<C>:<T>/<H>:<C>:<T>:<L>, under the HBA or its virtioN
        return [f'DEVPATH=="{ctrl}/*/target[0-9]*:{unit}/[0-9]*:{unit}:{lun}/block/*"'] if ctrl else []
    if bus == "sata" and _SATA_ADDRESS.match(address):
        ctrl = _pci_dir(controller)
        port = int(address.split(":")[1]) + 1  # the kernel's port_no, as udev's path_id names the port
        return [f'DEVPATH=="{ctrl}/ata[0-9]*/*"', f'ENV{{ID_PATH}}=="*-ata-{port}|*-ata-{port}.0"'] if ctrl else []
    return []


def _disk_match(entry: Dict[str, Any]) -> Tuple[List[str], Optional[str]]:
    """The match keys of a disk entry (its location, else its serial), or ([], why not)."""
    found = _location_match(entry)
    if found:
        return found, None
    serial = entry.get("serial")
    if isinstance(serial, str) and _SAFE_SERIAL.match(serial):
        # ID_SERIAL: virtio-blk's serial (its first 20 bytes); SCSI, ATA and USB disks: vendor_model_serial
        shown = [serial, f"*_{serial}"] + (
            [serial[:VIRTIO_BLK_SERIAL_BYTES]] if len(serial) > VIRTIO_BLK_SERIAL_BYTES else []
        )
        return [f'ENV{{ID_SERIAL}}=="{"|".join(shown)}"'], None
    bus, address = entry.get("bus"), entry.get("address") or "-"
    return [], f"no guest address a rule can match (bus {bus}, address {address}) and no plain serial"


def _rule(keys: Iterable[str]) -> str:
    return ", ".join(keys)


def _disk_rules(entry: Dict[str, Any], names: Sequence[str], keys: Sequence[str]) -> Tuple[List[str], Optional[str]]:
    match, why = _disk_match(entry)
    if not match:
        return [], why
    words = " ".join(names)
    disk = [
        'SUBSYSTEM=="block"',
        'ENV{DEVTYPE}=="disk"',
        *match,
        'SYMLINK+="' + " ".join(f"disk/by-tag/{name}" for name in names) + '"',
        f'ENV{{DEVTAG_TAGS}}="{words}"',
        *(f'ENV{{DEVTAG_TAG_{key}}}="1"' for key in keys),
    ]
    part = [
        'SUBSYSTEM=="block"',
        'ENV{DEVTYPE}=="partition"',
        *match,
        'SYMLINK+="' + " ".join(f"disk/by-tag/{name}-part%n" for name in names) + '"',
        f'ENV{{DEVTAG_TAGS}}="{words}"',
    ]
    return [_rule(disk), _rule(part)], None


def _passthrough_rule(
    entry: Dict[str, Any], names: Sequence[str], keys: Sequence[str]
) -> Tuple[List[str], Optional[str]]:
    """The properties of a passed-through PCI device (the PCI function itself) or of the TPM."""
    if not names:
        return [], None
    if entry.get("type") == "tpm":
        match = ['SUBSYSTEM=="tpm"', 'KERNEL=="tpm[0-9]*"']
    else:
        found = _pci_dir(entry)
        if not found:
            return [], f"no guest PCI address a rule can match (address {entry.get('address') or '-'})"
        match = ['SUBSYSTEM=="pci"', f'DEVPATH=="{found}"']
    return [
        _rule([*match, f'ENV{{DEVTAG_TAGS}}="{" ".join(names)}"', *(f'ENV{{DEVTAG_TAG_{k}}}="1"' for k in keys)])
    ], None


def _nic_rule(entry: Dict[str, Any], mac: str, names: Sequence[str], keys: Sequence[str]) -> str:
    match = _location_match(entry) or ['TEST=="device"', f'ATTR{{address}}=="{mac}"']
    return _rule(
        [
            'SUBSYSTEM=="net"',
            *match,
            f'ENV{{DEVTAG_TAGS}}="{" ".join(names)}"',
            *(f'ENV{{DEVTAG_TAG_{key}}}="1"' for key in keys),
        ]
    )


def link_file(mac: str, altnames: Sequence[str]) -> str:
    """The ``.link`` file of one tagged NIC: its altnames, and 99-default.link's policies otherwise."""
    return (
        "# devtag: the roles of this NIC as alternative names (from the host's credentials)\n"
        "[Match]\n"
        f"MACAddress={mac}\n"
        "Type=ether\n"
        "\n"
        "[Link]\n"
        "NamePolicy=keep kernel database onboard slot path\n"
        "AlternativeNamesPolicy=database onboard slot path\n"
        "MACAddressPolicy=persistent\n" + "".join(f"AlternativeName={name}\n" for name in altnames)
    )


def _device_label(entry: Dict[str, Any]) -> str:
    what = entry.get("mac") or entry.get("serial") or entry.get("address") or "?"
    return f"{entry.get('type')} {what!r}"


def _rules_file(number: int, rules: Sequence[str]) -> bytes:
    end = f"devtag_credentials_{number}_end"
    lines = [
        "# devtag: device roles from the host's devices metadata (systemd credential, no agent needed)",
        f'ACTION=="remove", GOTO="{end}"',
        *rules,
        f'LABEL="{end}"',
        "",
    ]
    return "\n".join(lines).encode("utf-8")


def credentials_for(document: Dict[str, Any], *, dropin: bool = True) -> CredentialSet:
    """The credentials of a (validated) devices document: rules, ``.link`` files, the udev drop-in.

    Rules of several devices are packed into one credential up to
    RULES_CREDENTIAL_BYTES; each tagged NIC with a role usable as an altname
    gets its own ``.link`` credential.  What cannot be carried is listed in
    ``left_out``: a device no rule can match, a role too long for a link name
    or not usable as an interface name.
    """
    result = CredentialSet()
    rules: List[str] = []
    links: List[Tuple[str, str]] = []
    for entry in document.get("devices", []):
        tags = [tag for tag in entry.get("tags") or [] if isinstance(tag, str)]
        kind = entry.get("type")
        if not tags or kind not in ("disk", "nic", *PASSTHROUGH_TYPES):
            continue
        label = _device_label(entry)
        names: List[str] = []
        for tag in tags:
            name = link_name(tag)
            if name is None:
                result.left_out.append(f"{label}: role {tag[:40]!r}... is too long for a link name")
                continue
            names.append(name)
        keys = [encode_key(tag) for tag in tags if link_name(tag) is not None]
        if kind in PASSTHROUGH_TYPES:
            device_rule, why = _passthrough_rule(entry, names, keys)
            if why:
                result.left_out.append(f"{label}: {why}")
            rules.extend(device_rule)
            continue
        if kind == "disk":
            device_rules, why = _disk_rules(entry, names, keys) if names else ([], None)
            if why:
                result.left_out.append(f"{label}: {why}")
            rules.extend(device_rules)
            continue
        mac = str(entry.get("mac") or "").lower()
        if not _MAC.match(mac):
            result.left_out.append(f"{label}: no MAC address")
            continue
        if names:
            rules.append(_nic_rule(entry, mac, names, keys))
        altnames = []
        for tag in tags:
            altname = altname_for(tag)
            if altname is None:
                result.left_out.append(f"{label}: role {encode_name(tag)[:60]!r} cannot be an interface name")
            else:
                altnames.append(altname)
        if altnames:
            links.append((mac, link_file(mac, altnames)))
    for line in rules:
        if len(line.encode("utf-8")) > MAX_RULE_LINE:
            raise CredentialsError(f"a device's rule would be {len(line.encode())} bytes long; udev reads at most "
                                   f"{MAX_RULE_LINE}: fewer or shorter roles on it")  # fmt: skip
    packed: List[List[str]] = []
    size = 0
    for line in rules:
        if not packed or size + len(line) + 1 > RULES_CREDENTIAL_BYTES:
            packed.append([])
            size = 0
        packed[-1].append(line)
        size += len(line.encode("utf-8")) + 1
    for number, lines in enumerate(packed, start=1):
        result.credentials.append(Credential(f"{RULES_PREFIX}{number}", _rules_file(number, lines)))
    for number, (_mac, text) in enumerate(links, start=1):
        result.credentials.append(Credential(f"{LINK_PREFIX}{number}", text.encode("ascii")))
    if packed and dropin:
        result.credentials.append(Credential(UDEV_DROPIN_NAME, UDEV_DROPIN.encode("ascii")))
    return result


def smbios_string(credential: Credential) -> str:
    return f"{SMBIOS_PREFIX}{credential.name}={base64.b64encode(credential.data).decode('ascii')}"


def smbios_strings(credentials: Sequence[Credential], other: Sequence[str] = ()) -> List[str]:
    """The OEM strings of ``credentials``; CredentialsError if they and ``other`` (the domain's
    other OEM strings) do not fit an SMBIOS table."""
    strings = [smbios_string(credential) for credential in credentials]
    total = sum(len(text.encode("utf-8")) + 1 for text in [*strings, *other])
    if len(strings) + len(other) > SMBIOS_MAX_STRINGS:
        raise CredentialsError(
            f"{len(strings)} credentials and {len(other)} other OEM strings: an SMBIOS type 11 structure holds "
            f"at most {SMBIOS_MAX_STRINGS} strings"
        )
    if total > SMBIOS_MAX_BYTES:
        biggest = max(credentials, key=lambda credential: len(credential.data))
        raise CredentialsError(
            f"the credentials need {total} bytes of SMBIOS OEM strings (base64), the limit is {SMBIOS_MAX_BYTES}"
            f" (the SMBIOS table is at most 64 KiB); the largest, {biggest.name}, is {len(biggest.data)} bytes:"
            " fewer tagged devices or roles"
        )
    return strings


def fwcfg_entries(credentials: Sequence[Credential]) -> List[Tuple[str, Credential]]:
    """(fw_cfg name, credential) per credential; CredentialsError if they do not fit fw_cfg."""
    entries = []
    for credential in credentials:
        name = FWCFG_PREFIX + credential.name
        if len(name) > FWCFG_MAX_NAME:
            raise CredentialsError(
                f"fw_cfg name {name!r} is {len(name)} characters, QEMU allows {FWCFG_MAX_NAME}: use --transport smbios"
            )
        entries.append((name, credential))
    if len(entries) > FWCFG_MAX_ENTRIES:
        raise CredentialsError(
            f"{len(entries)} credentials need as many fw_cfg files; QEMU's file slots leave room for"
            f" {FWCFG_MAX_ENTRIES}: use --transport smbios"
        )
    total = sum(len(credential.data) for credential in credentials)
    if total > FWCFG_MAX_BYTES:
        raise CredentialsError(f"the credentials are {total} bytes; fw_cfg carries at most {FWCFG_MAX_BYTES} here")
    return entries
