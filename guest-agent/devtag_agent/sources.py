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
  is read in-process (iso9660.py: ``openstack/latest/meta_data.json`` from
  the directory records, by ``pread`` of the device, nothing mounted); a vfat
  drive, or an ISO using what that reader does not read, is mounted read-only
  in a private temporary directory just long enough to read the file, then
  unmounted.  (Under a test root, a *directory* standing in for the device is
  read directly, and an image *file* by the in-process reader.)
* ``metadata``: ``http://169.254.169.254/openstack/latest/meta_data.json``,
  three tries within 10 s, never through a proxy from the environment.
* ``instance-data``: cloud-init's ``/run/cloud-init/instance-data.json``,
  ``ds.meta_data.devices``.

``auto`` tries them in that order (``metadata`` is the one source that needs
the network: :func:`local_sources` drops it for the boot's second pass); the first that answers is used whole
(documents from two sources are never mixed, so a device detached since boot
cannot survive from a stale copy).  ``requests`` is imported only when the
metadata service is asked.
"""

from __future__ import annotations

import binascii
import os
import stat
import sys
import time
import zlib

from . import iso9660, jsoncodec, spawn
from .agentlog import INFO, WARNING, log
from .sysfs import System

TYPE_CHECKING = False  # typing is for the type checker only: importing it costs every run (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple


__all__ = [
    "DEFAULT_METADATA_URL",
    "NETWORK_SOURCES",
    "SOURCES",
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
FW_CFG_NAME = "opt/org.devtag/devices"
FW_CFG_PAYLOAD_PREFIX = b"devtag-fwcfg-1:"
_FW_CFG_DIR = "/sys/firmware/qemu_fw_cfg"
_MAX_FW_CFG_BYTES = 256 * 1024
_MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
CONFIG_DRIVE_LABELS = ("config-2", "CONFIG-2")
_META_DATA = "openstack/latest/meta_data.json"


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
        document = jsoncodec.loads(text)
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


def probe_label(path: str) -> Optional[str]:
    """The iso9660 or FAT volume label of a block device (or image file), read directly."""
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
    if descriptor[:6] == b"\x01CD001":
        return descriptor[40:72].decode("ascii", "replace").strip()
    if len(boot) == 512 and boot[510:512] == b"\x55\xaa":
        for offset in (0x47, 0x2B):  # FAT32, FAT12/16 extended boot record: signature 0x29, label
            if boot[offset - 5] == 0x29:
                return boot[offset : offset + 11].decode("ascii", "replace").strip()
    return None


def _config_drive_device(system: System) -> Optional[str]:
    for label in CONFIG_DRIVE_LABELS:
        link = "/dev/disk/by-label/" + label
        if os.path.lexists(system.path(link)):
            return link
    # Early boot, before udev made the by-label links: udev's database ...
    for name in system.listdir("/run/udev/data"):
        if name.startswith("b"):
            properties = system.udev_properties(name)
            if properties.get("ID_FS_LABEL") in CONFIG_DRIVE_LABELS and properties.get("DEVNAME"):
                return properties["DEVNAME"]
    # ... or before udev has even processed the device: read the labels ourselves.
    for name in system.listdir("/sys/class/block"):
        if name.startswith(("loop", "ram", "zram", "dm-", "md")):
            continue
        node = "/dev/" + name
        if probe_label(system.path(node)) in CONFIG_DRIVE_LABELS:
            return node
    return None


def _private_directory(prefix: str) -> str:
    """A new directory only root can enter, under $TMPDIR or /tmp: ``tempfile.mkdtemp``'s promise.

    Not tempfile itself: it imports shutil and random (bz2, lzma, hashlib), a
    cost every boot run would pay for one directory (docs/agent.md, "Boot cost").
    ``mkdir`` fails rather than reuse a name that exists (a planted directory or link).
    """
    parent = os.environ.get("TMPDIR") or "/tmp"  # noqa: S108 - a random name, created exclusively, mode 0700
    for _ in range(100):
        path = os.path.join(parent, prefix + os.urandom(8).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free directory name {prefix}* in {parent}")


def read_config_drive(system: System) -> Dict[str, Any]:
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
    try:
        return _parse(_read_iso9660(device, real), "configdrive")
    except iso9660.NotIso9660:
        pass  # vfat: mounted below
    except iso9660.UnsupportedIso as exc:
        log.info("configdrive: %s: %s; mounting it instead", device, exc)
    if system.root != "/":
        raise SourceError("configdrive: will not mount a device of another root")
    mountpoint = _private_directory("devtag-configdrive-")
    try:
        by_syscall = _mount_read_only(real, mountpoint)
        if not by_syscall:
            _mount_with_command(device, real, mountpoint)
        try:
            return _parse(read_bounded(os.path.join(mountpoint, _META_DATA)), "configdrive")
        except OSError as exc:
            raise SourceError(f"configdrive: {exc}") from None
        finally:
            if not (by_syscall and _unmount(mountpoint)):
                _unmount_with_command(mountpoint)
    finally:
        try:
            os.rmdir(mountpoint)
        except OSError:
            log.warning("configdrive: could not remove %s (still mounted?)", mountpoint)


def _read_iso9660(device: str, real: str) -> bytes:
    """meta_data.json read from the ISO 9660 image ``real`` by ``pread``, nothing mounted (iso9660.py says why).

    Raises iso9660's NotIso9660 and UnsupportedIso for the caller to mount
    instead, SourceError when the image has no such file or cannot be read,
    CorruptSourceError when it is malformed.
    """
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # probe_label's flags: a drive without a disc
    except OSError as exc:
        raise SourceError(f"configdrive: {exc}") from None
    try:
        return iso9660.read_file(lambda offset, size: os.pread(fd, size, offset), _META_DATA, _MAX_DOCUMENT_BYTES)
    except iso9660.FileNotInIso as exc:
        # The words the mount path gave: "[Errno 2] No such file or directory: '<mount point>/openstack/...'".
        raise SourceError(f"configdrive: {OSError(exc.errno, exc.strerror, device + ':/' + _META_DATA)}") from None
    except iso9660.CorruptIso as exc:
        raise CorruptSourceError(f"configdrive: {device}: corrupt ISO 9660 image: {exc}") from None
    except OSError as exc:
        raise SourceError(f"configdrive: {device}: {exc}") from None
    finally:
        os.close(fd)


# mount(2) flags (linux/mount.h): the config drive is hostile input, mounted read-only, nosuid, nodev, noexec.
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_CONFIG_DRIVE_FSTYPES = ("iso9660", "vfat")


_LIBC: List[Tuple[Any, Any]] = []  # _libc()'s answer, once made


def _libc() -> Tuple[Any, Any]:
    """libc's mount(2) and umount2(2) through ctypes, imported here: only the config drive needs it.

    mount(8) and umount(8) are two processes (libmount, libblkid, SELinux
    libraries loaded, mountinfo parsed) for what two system calls do: 0.5-0.9 s
    of the boot run under TCG, against ~0.05 s for importing ctypes
    (docs/agent.md, "Boot cost").  Made once per process: mount and unmount share it.
    """
    if not _LIBC:
        import ctypes  # here, not at the top: only the config drive source needs it

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
        libc.mount.restype = ctypes.c_int
        libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        libc.umount2.restype = ctypes.c_int
        _LIBC.append((libc, ctypes.get_errno))
    return _LIBC[0]


def _mount_read_only(device: str, mountpoint: str) -> bool:
    """Mount ``device`` (a block device) as iso9660, else vfat, read-only, nosuid, nodev, noexec, by mount(2).

    False when the system call is not usable (no ctypes or libc symbol, not a
    block device, not permitted, neither file system): the caller then runs
    mount(8), which also sets up a loop device for an image file and words the error.
    """
    try:
        libc, errno = _libc()
    except (ImportError, OSError, AttributeError) as exc:
        log.debug("configdrive: mount(2) not usable: %s", exc)
        return False
    flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    for fstype in _CONFIG_DRIVE_FSTYPES:
        if libc.mount(os.fsencode(device), os.fsencode(mountpoint), fstype.encode(), flags, None) == 0:
            return True
        log.debug("configdrive: mount(2) %s as %s: %s", device, fstype, os.strerror(errno()))
    return False


def _unmount(mountpoint: str) -> bool:
    """umount2(2); False when it failed (the caller then runs umount(8))."""
    try:
        libc, errno = _libc()
        if libc.umount2(os.fsencode(mountpoint), 0) == 0:
            return True
        log.debug("configdrive: umount2 %s: %s", mountpoint, os.strerror(errno()))
    except (ImportError, OSError, AttributeError) as exc:
        log.debug("configdrive: umount2 not usable: %s", exc)
    return False


def _mount_with_command(device: str, real: str, mountpoint: str) -> None:
    """mount(8), same options: for what mount(2) alone cannot do (an image file needs a loop device)."""
    for fstype in _CONFIG_DRIVE_FSTYPES:
        try:
            done = spawn.run(["mount", "-t", fstype, "-o", "ro,nosuid,nodev,noexec", real, mountpoint], timeout=60)
        except OSError as exc:
            raise SourceError(f"configdrive: cannot mount {device}: {exc}") from None
        if done.returncode == 0:
            return
    raise SourceError(f"configdrive: cannot mount {device}: {done.stderr.strip()}")


def _unmount_with_command(mountpoint: str) -> None:
    """umount(8), when umount2(2) was not used or failed; a failure shows when the mount point cannot be removed."""
    try:
        spawn.run(["umount", mountpoint], timeout=60)
    except OSError as exc:
        log.debug("configdrive: umount %s: %s", mountpoint, exc)


def read_metadata_service(url: str, total_timeout: float = 10.0, tries: int = 3) -> Dict[str, Any]:
    import requests  # imported here: costs ~50 ms and only this source needs it

    deadline = time.monotonic() + total_timeout
    last = "no attempt"
    session = requests.Session()
    session.trust_env = False  # the metadata service is link-local: never through http_proxy
    for attempt in range(tries):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            with session.get(url, timeout=(min(2.0, remaining), min(5.0, remaining)), stream=True) as response:
                if response.status_code == 200:
                    return _parse(_bounded_body(response), "metadata")
            last = f"HTTP {response.status_code}"
            if 400 <= response.status_code < 500:
                break  # will not change by asking again
        except requests.RequestException as exc:
            last = str(exc)
        if attempt + 1 < tries:
            time.sleep(min(0.5 * 2**attempt, max(0.0, deadline - time.monotonic())))
    raise SourceError(f"metadata: {url}: {last}")


def _bounded_body(response: Any) -> bytes:
    """The body of a streamed ``requests`` response, read up to one byte past the cap."""
    chunks = []
    size = 0
    for chunk in response.iter_content(64 * 1024):
        chunks.append(chunk)
        size += len(chunk)
        if size > _MAX_DOCUMENT_BYTES:
            break
    return b"".join(chunks)


_BASE64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _strict_base64(data: bytes) -> bytes:
    """``base64.b64decode(data, validate=True)``, on each Python exactly what it does there.

    Not the ``base64`` module: it imports ``re``, a cost on every boot run
    (docs/agent.md, "Boot cost").  From 3.11 ``b64decode`` hands ``validate``
    to binascii's strict mode; before, it checked the standard alphabet followed
    by at most two ``=`` with a regular expression, then decoded leniently.
    Raises ``binascii.Error``.
    """
    if sys.version_info >= (3, 11):
        return binascii.a2b_base64(data, strict_mode=True)
    body = data.rstrip(b"=")
    if len(data) - len(body) > 2 or body.translate(None, _BASE64_ALPHABET):
        raise binascii.Error("Non-base64 digit found")
    return binascii.a2b_base64(data)


def decode_fw_cfg(data: bytes) -> Dict[str, Any]:
    """The document in a devtag fw_cfg payload (bounded: no decompression bombs)."""
    if len(data) > _MAX_FW_CFG_BYTES:
        raise CorruptSourceError(f"fwcfg: entry of {len(data)} bytes is larger than any devtag writes")
    if not data.startswith(FW_CFG_PAYLOAD_PREFIX):
        raise CorruptSourceError("fwcfg: not a devtag payload")
    try:
        compressed = _strict_base64(data[len(FW_CFG_PAYLOAD_PREFIX) :].strip())
        raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(compressed, _MAX_DOCUMENT_BYTES + 1)
    except (binascii.Error, zlib.error) as exc:
        raise CorruptSourceError(f"fwcfg: corrupt payload: {exc}") from None
    if len(raw) > _MAX_DOCUMENT_BYTES:
        raise CorruptSourceError("fwcfg: payload expands beyond 16 MiB")
    return _parse(raw, "fwcfg")


def read_fw_cfg(system: System) -> Dict[str, Any]:
    raw_path = f"{_FW_CFG_DIR}/by_name/{FW_CFG_NAME}/raw"
    if system.root == "/" and not os.path.isdir(_FW_CFG_DIR):
        # Debian/Ubuntu build qemu_fw_cfg as a module that nothing loads by itself.
        try:
            spawn.run(["modprobe", "-q", "qemu_fw_cfg"], timeout=10, capture=False)
        except OSError as exc:  # cannot start, or spawn.CommandTimeout
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
            if source == "fwcfg":
                document = read_fw_cfg(system)
            elif source == "configdrive":
                document = read_config_drive(system)
            elif source == "metadata":
                document = read_metadata_service(metadata_url)
            elif source == "instance-data":
                document = read_instance_data(system)
            else:
                raise SourceError(f"unknown source {source!r}")
        except SourceError as exc:
            # Absent is routine (no config drive on this cloud); present but broken is worth a look.
            log.log(WARNING if isinstance(exc, CorruptSourceError) else INFO, "%s", exc)
            failures.append(str(exc))
            continue
        log.info("metadata from %s", source)
        return source, document
    raise SourceError("no metadata source answered: " + "; ".join(failures))
