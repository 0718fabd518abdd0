"""The example domain behind ``devtag-host demo``.

It exists so a new user (and CI) can see devtag work on a fresh machine with
nothing but the embedded libvirt: define a domain with one device of every
kind devtag maps, tag some of them, print the devices document.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from string import Template
from typing import Dict, Tuple
from xml.sax.saxutils import escape

DEMO_DOMAIN_NAME = "devtag-demo"
# device selector -> tags, as an operator would set them with `devtag-host tag`
DEMO_TAGS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("52:54:00:de:00:01", ("nfvfunc1",)),
    ("52:54:00:de:00:02", ("nfvfunc2", "squidcache")),
    ("demo-oracle", ("oracledb",)),
    ("sdb", ("squidcache", "fast-cache")),
    ("sdc", ("legacy",)),
    ("demo-sata", ("archive",)),
    ("demo-usb", ("usbkey",)),
    ("sdf", ("install-media",)),
    ("vda", ("root",)),
)
_IMAGES: Dict[str, int] = {
    "root.img": 64,
    "oracle.img": 16,
    "squid.img": 16,
    "legacy.img": 16,
    "sata.img": 16,
    "usb.img": 16,
    "media.iso": 1,
    "scratch.img": 16,
}


def demo_domain_xml(images: Path) -> str:
    """The example domain XML with its disk images under ``images``."""
    template = resources.files("devtag_host.examples").joinpath("demo-domain.xml").read_text(encoding="utf-8")
    return Template(template).substitute(images=escape(str(images), {"'": "&apos;"}))


def create_demo_images(images: Path) -> None:
    """Sparse raw images, so the domain can really start (they hold no data)."""
    images.mkdir(parents=True, exist_ok=True)
    for name, mebibytes in _IMAGES.items():
        path = images / name
        if not path.exists():
            with open(path, "wb") as image:
                image.truncate(mebibytes * 1024 * 1024)
