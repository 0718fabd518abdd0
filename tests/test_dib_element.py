"""packaging/dib/devtag-agent without building an image (that is tests/vm/test_image.py, marker ``image``).

diskimage-builder runs every executable file of an element's hook
directories in name order and skips the rest silently, so a hook that lost
its executable bit or has a syntax error breaks images without a word; and
the element's final check must name the files the package really installs.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ELEMENT = REPO / "packaging" / "dib" / "devtag-agent"
HOOKS = sorted(path for path in ELEMENT.glob("*.d/*") if path.is_file())


def test_element_has_the_hooks_that_install_and_check_the_agent() -> None:
    names = {f"{path.parent.name}/{path.name}" for path in HOOKS}
    assert {
        "environment.d/10-devtag-agent.bash",
        "extra-data.d/50-devtag-agent-deb",
        "install.d/60-devtag-agent",
        "post-install.d/60-devtag-agent-enable",
    } <= names
    assert (ELEMENT / "README.rst").exists()


@pytest.mark.parametrize("hook", HOOKS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_hook_is_valid_bash_and_runnable(hook: Path) -> None:
    subprocess.run(["bash", "-n", str(hook)], check=True)
    if hook.parent.name == "environment.d":  # sourced, not run
        return
    assert hook.stat().st_mode & 0o111, f"{hook} is not executable: dib would skip it"
    text = hook.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert "set -eu" in text and "set -o pipefail" in text


def test_final_check_names_what_the_package_installs() -> None:
    """The units, rule and drop-in the post-install check requires are those debian/rules installs."""
    rules = (REPO / "packaging" / "debian" / "rules").read_text()
    check = (ELEMENT / "post-install.d" / "60-devtag-agent-enable").read_text()
    installed = set(re.findall(r"packaging/systemd/(devtag-agent[\w@.-]*\.service)", rules))
    required = set(re.findall(r"/lib/systemd/system/(devtag-agent[\w@.-]*\.service)", check))
    assert installed and installed == required
    stages = re.search(r"for stage in ([\w -]+); do", rules)
    assert stages, "debian/rules no longer installs the drop-in per cloud-init stage name"
    dropins = set(re.findall(r"/lib/systemd/system/([\w-]+)\.service\.d/10-devtag\.conf", check))
    assert dropins == set(stages.group(1).split())
    assert "udev-rules/70-devtag.rules" in rules and "/usr/lib/udev/rules.d/70-devtag.rules" in check
    # qemu_fw_cfg for the fw_cfg transport: systemd-modules-load loads it, not the boot unit
    assert "/usr/lib/modules-load.d/devtag-agent.conf" in rules and "/usr/lib/modules-load.d/devtag-agent.conf" in check
