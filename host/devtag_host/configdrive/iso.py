"""ISO 9660 images (Rock Ridge + Joliet, label ``config-2``) built in-process.

pycdlib stamps every volume descriptor and directory record with
``time.time()`` and converts it with the local time zone.  For reproducible
images we build with a fixed timestamp: pycdlib's modules see a ``time``
proxy that answers the build's timestamp (in UTC) to the thread that is
building, and the real clock to everyone else.
"""

from __future__ import annotations

import io
import os
import tempfile
import threading
import time as _real_time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import pycdlib
import pycdlib.dates
import pycdlib.headervd
import pycdlib.pycdlib

VOLUME_LABEL = "config-2"
MAX_IMAGE_BYTES = 64 * 1024 * 1024
DEFAULT_TIMESTAMP = 0  # 1970-01-01T00:00:00Z unless SOURCE_DATE_EPOCH says otherwise
_PUBLISHER = "devtag"


class ImageTooLargeError(ValueError):
    """The files do not fit in the config drive size limit."""


class _BuildClock(threading.local):
    fixed: Optional[float] = None


_clock = _BuildClock()


class _TimeProxy:
    """``time`` for pycdlib: a fixed UTC clock while this thread builds an image."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_time, name)

    def time(self) -> float:
        return _real_time.time() if _clock.fixed is None else _clock.fixed

    def localtime(self, seconds: Optional[float] = None) -> _real_time.struct_time:
        if _clock.fixed is None:
            return _real_time.localtime(seconds)
        return _real_time.gmtime(seconds)


for _module in (pycdlib.pycdlib, pycdlib.headervd, pycdlib.dates):
    _module.time = _TimeProxy()  # type: ignore[attr-defined]


@contextmanager
def _fixed_clock(timestamp: float) -> Iterator[None]:
    _clock.fixed = timestamp
    try:
        yield
    finally:
        _clock.fixed = None


def default_timestamp() -> int:
    """``$SOURCE_DATE_EPOCH`` when set (reproducible-builds.org), else 0."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    return int(value) if value.isdigit() else DEFAULT_TIMESTAMP


def _iso_name(name: str) -> str:
    # Level 4 allows any name; upper case mirrors what genisoimage -l writes.
    return name.upper()


def build_iso(
    files: Mapping[str, bytes],
    *,
    label: str = VOLUME_LABEL,
    timestamp: Optional[float] = None,
    max_bytes: int = MAX_IMAGE_BYTES,
) -> bytes:
    """An ISO 9660 image holding ``files`` (``{"dir/name": content}``).

    The same files give the same bytes.  Raises :class:`ImageTooLargeError`
    when the image would exceed ``max_bytes``.
    """
    payload = sum(len(content) for content in files.values())
    if payload > max_bytes:
        raise ImageTooLargeError(f"the config drive files total {payload} bytes; the limit is {max_bytes} bytes")
    stamp = default_timestamp() if timestamp is None else timestamp
    with _fixed_clock(stamp):
        iso = pycdlib.PyCdlib()
        iso.new(
            interchange_level=4,
            vol_ident=label,
            pub_ident_str=_PUBLISHER,
            joliet=3,
            rock_ridge="1.09",
        )
        made = {""}
        for path in sorted(files):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory in made:
                    continue
                iso.add_directory(
                    "/" + "/".join(_iso_name(p) for p in parts[:depth]),
                    rr_name=parts[depth - 1],
                    joliet_path="/" + directory,
                )
                made.add(directory)
            content = files[path]
            iso.add_fp(
                io.BytesIO(content),
                len(content),
                "/" + "/".join(_iso_name(p) for p in parts) + ";1",
                rr_name=parts[-1],
                joliet_path="/" + path,
            )
        out = io.BytesIO()
        iso.write_fp(out)
        iso.close()
    image = out.getvalue()
    if len(image) > max_bytes:
        raise ImageTooLargeError(f"the config drive image would be {len(image)} bytes; the limit is {max_bytes} bytes")
    return image


def current_umask() -> int:
    """The process umask, read without changing it (``os.umask`` sets it, racing other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):  # pragma: no cover - Linux < 4.7 or no /proc
        pass
    return 0o022  # pragma: no cover


def write_atomically(path: Path | str, data: bytes, *, mode: Optional[int] = None) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same directory and a rename.

    Readers see the old file or the complete new one, never a partial image.
    Without ``mode`` the file gets what ``open()`` would give it: 0666 less the
    umask.  A config drive may hold passwords in its user data: under
    ``umask 077`` it is 0600 (libvirt's DAC labelling still gives QEMU access).
    """
    if mode is None:
        mode = 0o666 & ~current_umask()
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)
    return target
