"""Fixtures every VM test shares: one scratch directory, one agent package per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterator

import pytest

from .guest_image import GuestImage, Release, build_guest_image

REPO = Path(__file__).resolve().parents[2]
BOOT_COST_PROPERTY = "boot_cost"  # user_properties key of test_releases' boot-cost lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The boot-cost lines of test_releases at the end of every run's output, without -s.

    So a CI log records each release's figures (docs/benchmarks.md, "Guest agent")
    even when pytest captured the tests' output.
    """
    lines = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == BOOT_COST_PROPERTY
    ]
    if lines:
        terminalreporter.write_sep("=", "boot cost per release (tests/vm/test_releases.py)")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def vm_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="devtag-e2e-"))
    directory.chmod(0o755)
    yield directory
    if os.environ.get("DEVTAG_E2E_KEEP"):
        print(f"\nkept the end-to-end VM files in {directory}")
    else:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def agent_deb(vm_dir: Path) -> Path:
    """devtag-agent built from this checkout: the one .deb every release's guest installs."""
    out = vm_dir / "debs"
    subprocess.run([str(REPO / "packaging/build-debs.sh"), "--agent-only", str(out)], check=True, timeout=900)
    return next(out.glob("devtag-agent_*.deb"))


@pytest.fixture(scope="session")
def guest_images(agent_deb: Path, vm_dir: Path) -> Callable[[Release], GuestImage]:
    """The guest image of a release, built on first use and shared by every test of the session.

    Keyed by the whole Release: two variants of one Debian release are two images."""
    built: Dict[Release, GuestImage] = {}

    def image_of(release: Release) -> GuestImage:
        if release not in built:
            built[release] = build_guest_image(agent_deb, vm_dir / f"image-{release.suite}-{len(built)}", release)
        return built[release]

    return image_of
