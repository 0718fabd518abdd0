"""Where the metadata document comes from.

* ``fwcfg``: the QEMU fw_cfg entry ``opt/org.devtag/devices`` that
  ``devtag-host fwcfg --enable`` puts into the domain definition, read from
  ``/sys/firmware/qemu_fw_cfg/by_name/.../raw`` (loading ``qemu_fw_cfg`` if
  needed): available from the first instant of boot, no network, no mount.
  Its payload is ``devtag-fwcfg-1:`` + base64(gzip(JSON)) (commas would break
  QEMU's command line).  It is fixed for the life of the QEMU process, so the
  hot-plug path asks the metadata service first.
* ``configdrive``: the block device labelled ``config-2``/``CONFIG-2`` (iso9660
  or vfat; found through ``/dev/disk/by-label``, udev's database, or by reading
  the labels when udev has not processed the devices yet).  An iso9660 drive
  is read with ``pycdlib`` from the device itself, nothing mounted (the boot
  unit needs no mount privilege for it); a vfat drive, or any drive where
  ``pycdlib`` is not installed (Debian 11 does not package it), is mounted
  read-only with mount(8) in a private temporary directory just long enough
  to read the file.  (Under a test root, a *directory* standing in for the
  device is read directly, and an ISO image *file* with ``pycdlib``.)
* ``metadata``: ``http://169.254.169.254/openstack/latest/meta_data.json``,
  three tries, never through a proxy.
* ``instance-data``: cloud-init's ``/run/cloud-init/instance-data.json``,
  ``ds.meta_data.devices``.

``auto`` tries them in that order (``metadata`` is the one source that needs
the network: :func:`local_sources` drops it for the boot's second pass); the
first that answers is used whole (documents from two sources are never mixed,
so a device detached since boot cannot survive from a stale copy).

Each source has one total deadline (:data:`SOURCE_SECONDS`): tries, reads and
the commands it runs all end by then, so a metadata service trickling its
answer cannot hold the boot.
"""

from __future__ import annotations

import base64
import binascii
import errno
import io
import json
import logging
import os
import stat
import subprocess
import tempfile
import time
import zlib
from typing import Any, Dict, List, Optional, Tuple

from .sysfs import System

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_METADATA_URL",
    "NETWORK_SOURCES",
    "SOURCES",
    "SOURCE_SECONDS",
    "CorruptSourceError",
    "SourceError",
    "fetch_document",
    "load_json",
    "local_sources",
    "read_bounded",
]

DEFAULT_METADATA_URL = "http://169.254.169.254/openstack/latest/meta_data.json"
SOURCES = ("fwcfg", "configdrive", "metadata", "instance-data")
NETWORK_SOURCES = ("metadata",)  # the others are files, devices or the firmware: no network, no waiting
SOURCE_SECONDS = 10.0  # each source's whole budget: every try, read and command included
FW_CFG_NAME = "opt/org.devtag/devices"
FW_CFG_PAYLOAD_PREFIX = b"devtag-fwcfg-1:"
_FW_CFG_DIR = "/sys/firmware/qemu_fw_cfg"
_MAX_FW_CFG_BYTES = 256 * 1024
_MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
CONFIG_DRIVE_LABELS = ("config-2", "CONFIG-2")
_META_DATA = "openstack/latest/meta_data.json"
_ISO_MAGIC = b"\x01CD001"  # the primary volume descriptor, at sector 16 of an ISO 9660 image


class SourceError(RuntimeError):
    """This source has no usable document (the message says why)."""


class CorruptSourceError(SourceError):
    """This source answered, but with something unusable (too big, not UTF-8, not JSON,
    nested too deep): worth a warning, and the next source is tried."""


_MAX_DEPTH = 64  # meta_data.json nests 4 deep, instance-data.json about 10


def _depth_ok(document: Any) -> bool:
    """Whether ``document`` nests at most ``_MAX_DEPTH`` levels (iteratively: no recursion to exhaust)."""
    pending = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            if depth > _MAX_DEPTH:
                return False
            pending.extend((item, depth + 1) for item in value if isinstance(item, (dict, list)))
    return True


def load_json(data: bytes, where: str) -> Any:
    """The JSON value in ``data``: strict UTF-8, at most 16 MiB, nested at most 64 deep."""
    if len(data) > _MAX_DOCUMENT_BYTES:
        raise CorruptSourceError(f"{where}: larger than {_MAX_DOCUMENT_BYTES // (1024 * 1024)} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptSourceError(f"{where}: not UTF-8: {exc}") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise CorruptSourceError(f"{where}: not JSON: {exc}") from None
    except RecursionError:
        raise CorruptSourceError(f"{where}: JSON nested too deep") from None
    if not _depth_ok(document):
        raise CorruptSourceError(f"{where}: JSON nested deeper than {_MAX_DEPTH} levels")
    return document


def _parse(data: bytes, where: str) -> Dict[str, Any]:
    document = load_json(data, where)
    if not isinstance(document, dict):
        raise CorruptSourceError(f"{where}: not a JSON object")
    return document


def _left(deadline: float, what: str) -> float:
    """Seconds left before ``deadline``; SourceError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise SourceError(f"{what}: no answer within {SOURCE_SECONDS:g} s")
    return left


def read_bounded(path: str, fd: Optional[int] = None) -> bytes:
    """At most one byte more than the document cap of the regular file ``path`` (a FIFO or
    /dev/zero cannot hang us), or of the already open ``fd`` (stdin: a pipe is fine there)."""
    if fd is None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"{path}: not a regular file")
        opened = True
    else:
        opened = False
    try:
        chunks = []
        size = 0
        while size <= _MAX_DOCUMENT_BYTES:
            chunk = os.read(fd, min(1024 * 1024, _MAX_DOCUMENT_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        if opened:
            os.close(fd)


def probe_label(path: str, iso_only: bool = False) -> Optional[str]:
    """The iso9660 or (unless ``iso_only``) FAT volume label of a block device or image file, read directly."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        boot = os.pread(fd, 512, 0)
        descriptor = os.pread(fd, 2048, 16 * 2048)  # iso9660: primary volume descriptor at sector 16
    except OSError:  # a CD-ROM drive without a disc, ...
        return None
    finally:
        os.close(fd)
    if descriptor[:6] == _ISO_MAGIC:
        return descriptor[40:72].decode("ascii", "replace").strip()
    if not iso_only and len(boot) == 512 and boot[510:512] == b"\x55\xaa":
        for offset in (0x47, 0x2B):  # FAT32, FAT12/16 extended boot record: signature 0x29, label
            if boot[offset - 5] == 0x29:
                return boot[offset : offset + 11].decode("ascii", "replace").strip()
    return None


def _config_drive_device(system: System) -> Optional[str]:
    for label in CONFIG_DRIVE_LABELS:
        link = "/dev/disk/by-label/" + label
        if os.path.lexists(system.path(link)):
            return link
    # Early boot, before udev made the by-label links: udev's database, or, before udev
    # has even processed the device, the labels read from the devices themselves.
    names = [
        name for name in system.listdir("/sys/class/block") if not name.startswith(("loop", "ram", "zram", "dm-", "md"))
    ]
    for name in names:
        properties = system.udev_properties(system.realpath("/sys/class/block/" + name))
        if properties.get("ID_FS_LABEL") in CONFIG_DRIVE_LABELS and properties.get("DEVNAME"):
            return properties["DEVNAME"]
    for name in names:
        if probe_label(system.path("/dev/" + name)) in CONFIG_DRIVE_LABELS:
            return "/dev/" + name
    return None


def read_config_drive(system: System, deadline: Optional[float] = None) -> Dict[str, Any]:
    deadline = time.monotonic() + SOURCE_SECONDS if deadline is None else deadline
    device = _config_drive_device(system)
    if device is None:
        raise SourceError("configdrive: no block device labelled config-2")
    real = os.path.realpath(system.path(device))
    if os.path.isdir(real):  # a test root: the directory stands in for the filesystem
        path = os.path.join(real, _META_DATA)
        try:
            return _parse(read_bounded(path), "configdrive")
        except OSError as exc:
            raise SourceError(f"configdrive: {exc}") from None
    is_iso = probe_label(real, iso_only=True) is not None
    if is_iso and _pycdlib() is not None:
        return _parse(_read_iso9660(device, real), "configdrive")
    if system.root != "/":
        raise SourceError("configdrive: will not mount a device of another root")
    with tempfile.TemporaryDirectory(prefix="devtag-configdrive-") as mountpoint:
        _mount(device, real, mountpoint, "iso9660" if is_iso else "vfat", deadline)
        try:
            return _parse(read_bounded(os.path.join(mountpoint, _META_DATA)), "configdrive")
        except OSError as exc:
            raise SourceError(f"configdrive: {exc}") from None
        finally:
            _unmount(mountpoint)


def _pycdlib() -> Any:
    """The ``pycdlib`` module, or None where it is not installed (then ISO drives are mounted)."""
    try:
        import pycdlib
    except ImportError:
        return None
    return pycdlib


def _read_iso9660(device: str, real: str) -> bytes:
    """meta_data.json read from the ISO 9660 image ``real`` with pycdlib, nothing mounted.

    Names as the kernel's isofs shows them by default: Rock Ridge where the
    image has it, else Joliet, else the plain ISO 9660 name in upper case.
    """
    pycdlib = _pycdlib()
    try:
        with open(real, "rb") as image:
            iso = pycdlib.PyCdlib()
            try:
                iso.open_fp(image)
            except Exception as exc:  # pycdlib parsing a hostile image: any failure means "corrupt"
                raise CorruptSourceError(f"configdrive: {device}: corrupt ISO 9660 image: {exc}") from None
            try:
                return _iso_file(pycdlib, iso, device)
            finally:
                iso.close()
    except OSError as exc:
        raise SourceError(f"configdrive: {device}: {exc}") from None


def _iso_file(pycdlib: Any, iso: Any, device: str) -> bytes:
    """meta_data.json out of the opened image ``iso``, by its Rock Ridge, Joliet or ISO 9660 name."""
    if iso.has_rock_ridge():
        where = {"rr_path": "/" + _META_DATA}
    elif iso.has_joliet():
        where = {"joliet_path": "/" + _META_DATA}
    else:
        where = {"iso_path": "/" + _META_DATA.upper() + ";1"}
    try:
        size = iso.get_record(**where).get_data_length()
    except pycdlib.pycdlibexception.PyCdlibInvalidInput:  # no such path in the image
        missing = OSError(errno.ENOENT, os.strerror(errno.ENOENT), f"{device}:/{_META_DATA}")
        raise SourceError(f"configdrive: {missing}") from None
    if size > _MAX_DOCUMENT_BYTES:
        raise CorruptSourceError(f"configdrive: {device}: {_META_DATA} is larger than 16 MiB")
    out = io.BytesIO()
    try:
        iso.get_file_from_iso_fp(out, **where)
    except Exception as exc:  # an extent past the end, ...: the image is corrupt
        raise CorruptSourceError(f"configdrive: {device}: corrupt ISO 9660 image: {exc}") from None
    return out.getvalue()


def _mount(device: str, real: str, mountpoint: str, fstype: str, deadline: float) -> None:
    """mount(8) read-only, nosuid, nodev, noexec (a loop device for an image file)."""
    argv = ["mount", "-t", fstype, "-o", "ro,nosuid,nodev,noexec", real, mountpoint]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, errors="replace", timeout=_left(deadline, "configdrive")
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SourceError(f"configdrive: cannot mount {device}: {exc}") from None
    if done.returncode != 0:
        raise SourceError(f"configdrive: cannot mount {device}: {done.stderr.strip()}")


def _unmount(mountpoint: str) -> None:
    """umount(8); a failure shows as the mount point that cannot be removed."""
    try:
        subprocess.run(["umount", mountpoint], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("configdrive: umount %s: %s", mountpoint, exc)


def read_metadata_service(url: str, total_timeout: float = SOURCE_SECONDS, tries: int = 3) -> Dict[str, Any]:
    """The document at ``url`` (http), within ``total_timeout`` seconds for every try and read."""
    import urllib.parse  # here, as below: only this source needs them

    from .metadata_http import DeadlineConnection, HTTPException, SocketTimeout

    deadline = time.monotonic() + total_timeout
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise SourceError(f"metadata: {url}: not an http:// URL")
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    last = "no attempt"
    for attempt in range(tries):
        if deadline - time.monotonic() <= 0:
            last = f"no answer within {total_timeout:g} s"
            break
        connection = DeadlineConnection(parts.hostname, parts.port, deadline)
        try:
            connection.request("GET", target, headers={"Accept": "application/json"})
            response = connection.getresponse()
            if response.status == 200:
                return _parse(response.read(_MAX_DOCUMENT_BYTES + 1), "metadata")
            last = f"HTTP {response.status}"
            if 400 <= response.status < 500:
                break  # will not change by asking again
        except SocketTimeout:
            last = f"no answer within {total_timeout:g} s"
            break
        except (OSError, HTTPException) as exc:
            last = str(exc) or type(exc).__name__
        finally:
            connection.close()
        if attempt + 1 < tries:
            time.sleep(min(0.5 * 2**attempt, max(0.0, deadline - time.monotonic())))
    raise SourceError(f"metadata: {url}: {last}")


def decode_fw_cfg(data: bytes) -> Dict[str, Any]:
    """The document in a devtag fw_cfg payload (bounded: no decompression bombs)."""
    if len(data) > _MAX_FW_CFG_BYTES:
        raise CorruptSourceError(f"fwcfg: entry of {len(data)} bytes is larger than any devtag writes")
    if not data.startswith(FW_CFG_PAYLOAD_PREFIX):
        raise CorruptSourceError("fwcfg: not a devtag payload")
    try:
        compressed = base64.b64decode(data[len(FW_CFG_PAYLOAD_PREFIX) :].strip(), validate=True)
        raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(compressed, _MAX_DOCUMENT_BYTES + 1)
    except (binascii.Error, zlib.error) as exc:
        raise CorruptSourceError(f"fwcfg: corrupt payload: {exc}") from None
    if len(raw) > _MAX_DOCUMENT_BYTES:
        raise CorruptSourceError("fwcfg: payload expands beyond 16 MiB")
    return _parse(raw, "fwcfg")


def read_fw_cfg(system: System, deadline: Optional[float] = None) -> Dict[str, Any]:
    deadline = time.monotonic() + SOURCE_SECONDS if deadline is None else deadline
    raw_path = f"{_FW_CFG_DIR}/by_name/{FW_CFG_NAME}/raw"
    if system.root == "/" and not os.path.isdir(_FW_CFG_DIR):
        # Debian/Ubuntu build qemu_fw_cfg as a module that nothing loads by itself.
        try:
            subprocess.run(["modprobe", "-q", "qemu_fw_cfg"], timeout=_left(deadline, "fwcfg"), check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            log.debug("modprobe qemu_fw_cfg: %s", exc)
    data = system.read_bytes(raw_path)
    if data is None:
        raise SourceError(f"fwcfg: no entry {FW_CFG_NAME} (not enabled for this domain, or not QEMU)")
    return decode_fw_cfg(data)  # present but unusable: CorruptSourceError, a warning


def read_instance_data(system: System) -> Dict[str, Any]:
    path = system.path("/run/cloud-init/instance-data.json")
    try:
        document = _parse(read_bounded(path), "instance-data")
    except OSError as exc:
        raise SourceError(f"instance-data: {exc}") from None
    ds = document.get("ds")
    meta = ds.get("meta_data") if isinstance(ds, dict) else None
    if not isinstance(meta, dict) or "devices" not in meta:
        raise SourceError("instance-data: no ds.meta_data.devices")
    return meta


def read_file(path: str) -> Dict[str, Any]:
    try:
        return _parse(read_bounded(path), path)
    except OSError as exc:
        raise SourceError(f"{path}: {exc}") from None


def local_sources(sources: List[str]) -> List[str]:
    """``sources`` without those that need the network, in the same order.

    The boot's second pass reads only these once an earlier pass has published
    tags: a cloud without a metadata service must not make every boot wait
    for one, and the tags it has are already right unless a local copy changed.
    """
    return [source for source in sources if source not in NETWORK_SOURCES]


def fetch_document(system: System, sources: List[str], metadata_url: str) -> Tuple[str, Dict[str, Any]]:
    """Try ``sources`` in order; return (source name, document) of the first that answers."""
    failures = []
    for source in sources:
        try:
            deadline = time.monotonic() + SOURCE_SECONDS
            if source == "fwcfg":
                document = read_fw_cfg(system, deadline)
            elif source == "configdrive":
                document = read_config_drive(system, deadline)
            elif source == "metadata":
                document = read_metadata_service(metadata_url, SOURCE_SECONDS)
            elif source == "instance-data":
                document = read_instance_data(system)
            else:
                raise SourceError(f"unknown source {source!r}")
        except SourceError as exc:
            # Absent is routine (no config drive on this cloud); present but broken is worth a look.
            log.log(logging.WARNING if isinstance(exc, CorruptSourceError) else logging.INFO, "%s", exc)
            failures.append(str(exc))
            continue
        log.info("metadata from %s", source)
        return source, document
    raise SourceError("no metadata source answered: " + "; ".join(failures))
