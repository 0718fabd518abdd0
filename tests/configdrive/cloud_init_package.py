"""Debian's cloud-init, unpacked (never installed) so the tests can run its readers.

Installing the package would enable cloud-init on the next boot of the host,
so the tests download the .deb with apt (``apt-get download``, no root needed
for that step beyond an up-to-date package list) and unpack it with
``dpkg-deb -x`` under ``~/.cache/devtag/cloud-init``.  Its Python
dependencies that the readers import (requests, PyYAML, configobj) come from
the ``test`` extra.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "devtag" / "cloud-init"
SITE = CACHE / "root" / "usr" / "lib" / "python3" / "dist-packages"


def _download() -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    for deb in CACHE.glob("*.deb"):
        deb.unlink()
    command = ["apt-get", "download", "-q", "cloud-init"]
    result = subprocess.run(command, cwd=CACHE, capture_output=True, text=True)
    if result.returncode != 0 and os.geteuid() == 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, check=False)
        result = subprocess.run(command, cwd=CACHE, capture_output=True, text=True)
    debs = list(CACHE.glob("cloud-init_*.deb"))
    if result.returncode != 0 or not debs:
        raise RuntimeError(f"cannot download Debian's cloud-init package: {result.stderr.strip()}")
    unpacked = CACHE / "root.tmp"
    shutil.rmtree(unpacked, ignore_errors=True)
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True)
    shutil.rmtree(CACHE / "root", ignore_errors=True)
    unpacked.rename(CACHE / "root")


def openstack_helpers() -> Any:
    """``cloudinit.sources.helpers.openstack`` from Debian's package (downloaded once)."""
    if not (SITE / "cloudinit" / "sources" / "helpers" / "openstack.py").is_file():
        _download()
    if str(SITE) not in sys.path:
        sys.path.insert(0, str(SITE))
    from cloudinit.sources.helpers import openstack

    return openstack
