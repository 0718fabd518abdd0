"""The diskimage-builder element bakes the agent in: tags resolve with no step after the build.

Builds Debian 12 with diskimage-builder and the devtag-agent element
(dib_image.build_dib_image: the element installs the .deb built from this
checkout with the image's apt; ``baremetal`` in place of ``vm``, which needs
device-mapper, see dib_image), boots the image's own kernel, initrd and root
file system under libvirt with test_end_to_end's tagged devices and a config
drive, and checks the guest's report: every tag resolves (lookup, /dev/disk/by-tag, udev properties,
altnames, ``devtag-agent check``), published by the boot unit the element
enabled, from the config drive.  The image has no cloud-init: the agent reads
the config drive itself.

Slow (a cold build debootstraps Debian: ~10-20 min on the 2-core machine, then
dib's cache helps), so it is not in the default run: marker ``image``.

Run alone:  .venv/bin/pytest -m image tests/vm/test_image.py -v -s
Needs: diskimage-builder (pip install -e '.[image]'), debootstrap, qemu-img, root.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from devtag_host.cli import main as devtag_host

from .dib_image import build_dib_image, missing_tools
from .test_end_to_end import TAGS, check_report, domain_xml, own_root_disk, report_timings, wait_for_report

pytestmark = [pytest.mark.image, pytest.mark.timeout(5400)]
BOOT_TIMEOUT = 1200


def test_dib_built_image_resolves_tags_with_no_step_after_the_build(
    agent_deb: Path, libvirt_uri: str, libvirt_conn: Any, vm_dir: Path
) -> None:
    missing = missing_tools()
    if missing:
        pytest.skip(f"diskimage-builder cannot run here: missing {', '.join(missing)}")
    started = time.monotonic()
    image = build_dib_image(agent_deb, vm_dir / "dib")
    print(f"\n[dib] debian-minimal baremetal devtag-agent built in {time.monotonic() - started:.0f} s")
    directory = vm_dir / "dib-boot"
    directory.mkdir(mode=0o755)
    name = "e2e-dib"
    domain = libvirt_conn.defineXML(domain_xml(name, own_root_disk(image, directory), directory))
    try:
        for device, tags in TAGS.items():
            assert devtag_host(["tag", "--connect", libvirt_uri, name, device, *tags]) == 0
        iso = directory / "config.iso"
        assert devtag_host(["configdrive", "--connect", libvirt_uri, name, "-o", str(iso), "--attach"]) == 0
        started = time.monotonic()
        domain.create()
        report = wait_for_report(directory, 1, BOOT_TIMEOUT)
        assert report["release"]["version_id"] == "12", report["release"]
        check_report(report)
        assert report["source"] == "configdrive", report["journal"]
        assert report["agent_unit"]["Result"] == "success", report["agent_unit"]
        report_timings("dib image, config drive", time.monotonic() - started, report)
    finally:
        if domain.isActive():
            domain.destroy()
        domain.undefine()
