"""What an OpenSSH public key line looks like, checked before it goes into ``meta_data.json``.

Whatever ``--public-key`` names ends up in every copy of the instance's
metadata, readable by anything in the guest: a private key given by mistake
must be refused, with a message that says so.  A line is accepted when it is
``TYPE BASE64 [COMMENT]`` with a known key type and a blob that is base64 and
starts with that same type (the SSH wire format: uint32 length, then the name).
"""

from __future__ import annotations

import base64
import binascii
import struct
from typing import Optional

# PEM ("-----BEGIN OPENSSH PRIVATE KEY-----", "... RSA PRIVATE KEY", "... ENCRYPTED PRIVATE KEY") and PuTTY.
PRIVATE_KEY_MARKERS = ("PRIVATE KEY-----", "PuTTY-User-Key-File-")

KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ssh-dss",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)
MAX_KEY_LINE = 16 * 1024  # an RSA-16384 key is ~2.8 KiB of base64


def openssh_public_key_problem(line: str) -> Optional[str]:
    """None if ``line`` is one OpenSSH public key, else why not (a few words)."""
    if len(line) > MAX_KEY_LINE:
        return f"longer than {MAX_KEY_LINE} characters"
    fields = line.split(None, 2)
    if len(fields) < 2:
        return "expected: TYPE BASE64 [COMMENT]"
    kind, blob_text = fields[0], fields[1]
    if kind not in KEY_TYPES:
        return f"unknown key type {kind[:40]!r}"
    try:
        blob = base64.b64decode(blob_text, validate=True)
    except (binascii.Error, ValueError):
        return "the key is not base64"
    if len(blob) < 4:
        return "the key is truncated"
    (length,) = struct.unpack(">I", blob[:4])
    if blob[4 : 4 + length] != kind.encode("ascii"):
        return f"the key data is not a {kind} key"
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in line):
        return "control characters"
    return None
