"""``--instance-data DIR``: per-instance user data, keys and documents from ``DIR/<uuid>/``.

Files read (each optional): ``user_data``, ``meta.json``, ``public_keys``,
``vendor_data.json``, ``network_data.json``; re-read on every refresh of
the instance.

The tree is written by whoever provisions instances, so it is read
defensively:

* symbolic links are not followed (neither ``<uuid>`` nor the files: a link
  to ``/etc/devtag/metadata-proxy-secret`` would serve the secret); only
  regular files are read (a FIFO would block the watcher forever);
* sizes are capped and JSON nesting is limited to :data:`MAX_JSON_DEPTH`;
* ``public_keys`` is checked as ``configdrive --public-key`` is
  (:func:`~devtag_host.inputs.checked_public_keys`): OpenSSH public key
  lines only, a private key refused by name, an empty file refused (an
  instance without keys has no ``public_keys`` file);
* every problem is an :class:`~devtag_host.errors.InputError` about that one
  instance: the watcher logs it and keeps the instance's previous pages
  (checked when they were read) or, at its first read, does not serve the
  instance at all rather than serve it without the keys its owner expects
  (cloud-init takes the keys at first boot: served without them, the owner
  is locked out for good; not served, the instance is served at the next
  resync after the file is fixed); the other instances are unaffected.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

from ..errors import InputError
from ..inputs import MAX_INPUT_BYTES, checked_public_keys

MAX_JSON_DEPTH = 64
MAX_KEYS_BYTES = 1 << 20
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def instance_data_reader(directory: Path) -> Callable[[str], Mapping[str, Any]]:
    """``extras(uuid)`` for :class:`~.libvirt_watch.LibvirtWatcher`: the fields found in ``directory/<uuid>/``.

    ``directory`` must be a directory now (a typo would otherwise serve no instance's data,
    silently); an instance without its own directory there has no extra fields."""
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is not a directory"
        raise InputError(f"--instance-data {directory}: {what}")

    def extras(uuid: str) -> Mapping[str, Any]:
        if not _UUID.fullmatch(uuid):
            return {}
        try:
            base = os.open(directory / uuid, _OPEN_DIR)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise InputError(f"{directory / uuid} is not a directory (symbolic links are not followed)") from None
            raise InputError(f"cannot open {directory / uuid}: {exc.strerror}") from None
        try:
            return _fields(base, directory / uuid)
        finally:
            os.close(base)

    return extras


def _fields(base: int, where: Path) -> Dict[str, Any]:
    fields: Dict[str, Any] = {}
    user_data = _read(base, where, "user_data", MAX_INPUT_BYTES)
    if user_data is not None:
        fields["user_data"] = user_data
    meta = _read_json_object(base, where, "meta.json")
    if meta is not None:
        fields["meta"] = tuple((str(k), str(v)) for k, v in meta.items())
    keys = _read(base, where, "public_keys", MAX_KEYS_BYTES)
    if keys is not None:
        try:
            text = keys.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{where / 'public_keys'} is not UTF-8 text") from None
        fields["public_keys"] = tuple(checked_public_keys(text, "key", str(where / "public_keys")))
    for name, field in (("vendor_data.json", "vendor_data"), ("network_data.json", "network_data")):
        document = _read_json_object(base, where, name)
        if document is not None:
            fields[field] = document
    return fields


def _read(base: int, where: Path, name: str, limit: int) -> Optional[bytes]:
    """The regular file ``name`` in the directory ``base``; None if absent."""
    try:
        handle = os.open(name, _OPEN_FILE, dir_fd=base)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{where / name} is a symbolic link (not followed)") from None
        raise InputError(f"cannot read {where / name}: {exc.strerror}") from None
    with os.fdopen(handle, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise InputError(f"{where / name} is not a regular file")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{where / name} is larger than {limit} bytes")
    return data


def _read_json_object(base: int, where: Path, name: str) -> Optional[Dict[str, Any]]:
    data = _read(base, where, name, MAX_INPUT_BYTES)
    if data is None:
        return None
    try:
        value = json.loads(data)
    except RecursionError:
        raise InputError(f"{where / name} is nested too deeply") from None
    except ValueError as exc:
        raise InputError(f"{where / name} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InputError(f"{where / name} must hold a JSON object")
    if _depth(value) > MAX_JSON_DEPTH:
        raise InputError(f"{where / name} is nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value, without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest
