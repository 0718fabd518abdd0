"""The fw_cfg transport: the devices document inside the domain definition.

QEMU exports named blobs to the guest through its firmware configuration
device (fw_cfg); Linux shows them at
``/sys/firmware/qemu_fw_cfg/by_name/<name>/raw`` (module ``qemu_fw_cfg``).
libvirt adds them with ``<sysinfo type='fwcfg'><entry name=...>``, so the
guest has its tags from the first instant of boot, without a network, a
mount or a config drive, and nothing outside the domain XML must be kept.

The blob is not the JSON itself: libvirt 9 passes an inline entry to QEMU as
``-fw_cfg name=...,string=VALUE`` without escaping the commas QEMU's option
parser splits on, so JSON (full of commas) breaks the domain or injects QEMU
options.  The payload is therefore ``devtag-fwcfg-1:`` + base64 of the
gzip-compressed JSON: no commas, and smaller.  The guest agent decodes it.

The entry lives in the *persistent* definition: it takes effect at the next
boot (QEMU's fw_cfg cannot change under a running guest).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import json
from typing import Any, Dict

# A name in the "opt/" namespace QEMU reserves for users; ours by reverse DNS.
FW_CFG_NAME = "opt/org.devtag/devices"
PAYLOAD_PREFIX = "devtag-fwcfg-1:"
# QEMU's fw_cfg file names are at most 55 characters (FW_CFG_MAX_FILE_PATH - 1).
MAX_NAME_LENGTH = 55
# One command-line argument is at most 128 KiB on Linux (MAX_ARG_STRLEN);
# leave room for "name=...,string=".
MAX_PAYLOAD_BYTES = 120 * 1024
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024

__all__ = ["FW_CFG_NAME", "MAX_PAYLOAD_BYTES", "FwCfgError", "decode_payload", "encode_payload"]


class FwCfgError(ValueError):
    """The document cannot be carried by fw_cfg (the message says why)."""


def encode_payload(document: Dict[str, Any]) -> str:
    """The fw_cfg entry text for a devices document; deterministic for a given document."""
    raw = json.dumps(document, separators=(",", ":"), sort_keys=True).encode("utf-8")
    payload = PAYLOAD_PREFIX + base64.b64encode(gzip.compress(raw, mtime=0)).decode("ascii")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise FwCfgError(
            f"the devices document needs {len(payload)} bytes in fw_cfg (compressed); the limit is {MAX_PAYLOAD_BYTES}"
        )
    return payload


def decode_payload(text: str) -> Dict[str, Any]:
    """Invert :func:`encode_payload` (the guest agent has its own copy of this)."""
    if not text.startswith(PAYLOAD_PREFIX):
        raise FwCfgError("not a devtag fw_cfg payload")
    try:
        compressed = base64.b64decode(text[len(PAYLOAD_PREFIX) :].strip(), validate=True)
        with gzip.GzipFile(fileobj=io.BytesIO(compressed)) as stream:
            raw = stream.read(MAX_DOCUMENT_BYTES + 1)
    except (binascii.Error, OSError, EOFError) as exc:
        raise FwCfgError(f"corrupt fw_cfg payload: {exc}") from None
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise FwCfgError("fw_cfg payload expands beyond 16 MiB")
    document = json.loads(raw)
    if not isinstance(document, dict):
        raise FwCfgError("fw_cfg payload is not a JSON object")
    return document
