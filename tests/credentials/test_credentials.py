"""Roles as systemd credentials: the rules and .link files a guest without the agent gets.

The rules are run through the udev rule parser and evaluator of the agent's
tests (tests/agent/udevrules.py) on the agent's fake VM (tests/agent/scenario.py),
and must give every device they carry the links and properties the agent's
own resolution and rules give it.  Hostile tags are fed through and the rules
parsed; ``udevadm verify`` (systemd 253 and later) checks them too where it
exists.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtag_agent import encoding as agent_encoding
from devtag_host.credentials import (
    FWCFG_MAX_ENTRIES,
    LINK_PREFIX,
    RULES_PREFIX,
    SMBIOS_MAX_BYTES,
    SMBIOS_PREFIX,
    UDEV_DROPIN_NAME,
    Credential,
    CredentialsError,
    credentials_for,
    fwcfg_entries,
    smbios_strings,
)
from devtag_host.credentials import encoding as host_encoding
from devtag_host.metadata.tags import is_valid_tag

from ..agent import scenario, udevrules
from ..agent.conftest import run_cli
from ..agent.test_agent_rules import HOSTILE as AGENT_RULE_HOSTILE

AGENT_RULES = Path(__file__).resolve().parents[2] / "udev-rules" / "70-devtag.rules"
# The hostile tags of the agent's tests (test_agent_rules, test_agent_apply), and more.
HOSTILE = [
    *AGENT_RULE_HOSTILE,
    *['a b"c', "..\\..\\etc passwd", "x\\x2f", "$(reboot)", "DEVTAG_TAGS=1", "é\u202e"],
    *['"', "\\", "%k", "$env{HOME}", 'a\\"b', "*", "[a-z]", "x|y", "} , {", 'ENV{X}="1"', "..", "-part1"],
]
GENERATED_TAGS = st.text(min_size=1, max_size=60).filter(is_valid_tag)


def rules_of(document: Dict[str, Any]) -> List[udevrules.Rule]:
    result = credentials_for(document)
    text = "".join(c.data.decode() for c in result.credentials if c.name.startswith(RULES_PREFIX))
    return udevrules.parse(text)


def links_of(document: Dict[str, Any]) -> Dict[str, str]:
    """MAC -> .link file text."""
    found = {}
    for credential in credentials_for(document).credentials:
        if credential.name.startswith(LINK_PREFIX):
            text = credential.data.decode()
            mac = re.search(r"^MACAddress=(.*)$", text, re.M)
            assert mac is not None
            found[mac.group(1)] = text
    return found


def udev_view(root: Path, syspath: str) -> Dict[str, str]:
    """What 60-persistent-storage.rules would have set before our rules: ID_SERIAL and, on ATA, ID_PATH."""
    env: Dict[str, str] = {}
    serial = root / syspath.lstrip("/") / "serial"
    if serial.exists():
        env["ID_SERIAL"] = serial.read_text().strip()
    database = root / "run/udev/data" / ("b" + (root / syspath.lstrip("/") / "dev").read_text().strip())
    if database.exists():
        for line in database.read_text().splitlines():
            if line.startswith("E:ID_SCSI_SERIAL="):
                env["ID_SERIAL"] = "0QEMU_QEMU_HARDDISK_" + line.split("=", 1)[1]
    port = re.search(r"/(ata[0-9]+)/", syspath)
    if port:
        port_no = root / syspath.lstrip("/").split(port.group(1))[0] / port.group(1) / "ata_port" / port.group(1)
        if (port_no / "port_no").exists():  # path_id: "ata-<port_no>" (systemd 252: "ata-<port_no>.0")
            env["ID_PATH"] = f"pci-0000:00:1f.2-ata-{(port_no / 'port_no').read_text().strip()}.0"
    return env


def run(rules: List[udevrules.Rule], root: Path, syspath: str, parent_env: Any = None) -> udevrules.Event:
    event = udevrules.event_for(str(root), syspath, parent_env=parent_env)
    if event.env["SUBSYSTEM"] == "block" and event.env.get("DEVTYPE") == "disk":
        event.env.update(udev_view(root, syspath))
    elif parent_env:
        event.env.update({k: v for k, v in parent_env.items() if k in ("ID_SERIAL", "ID_PATH")})
    return udevrules.run_event(rules, event)


def by_name(root: Path, name: str) -> str:
    kind = "net" if (root / "sys/class/net" / name).exists() else "block"
    return "/" + os.path.relpath(os.path.realpath(root / f"sys/class/{kind}" / name), root)


# Devices of the scenario the agent finds and no rule can: IDE (no port a rule can see), a Xen disk by path,
# containers' virtual NICs.
AGENT_ONLY = {"sr0", "sde", "xvda", "eth9", "veth1"}


def test_the_rules_give_every_device_the_links_and_properties_of_the_agent(tmp_path: Path) -> None:
    machine, document = scenario.build(tmp_path / "root")
    root = machine.root
    machine.config_drive(document)
    assert run_cli("--root", str(root), "apply", "--source", "configdrive", "--no-trigger") == 0
    agent_rules = udevrules.parse(AGENT_RULES.read_text())
    ours = rules_of(document)
    for name in scenario.EXPECTED:
        syspath = by_name(root, name)
        theirs = udevrules.run_event(agent_rules, udevrules.event_for(str(root), syspath))
        mine = run(ours, root, syspath)
        assert theirs.env.get("DEVTAG_TAGS"), name
        if name in AGENT_ONLY:
            assert "DEVTAG_TAGS" not in mine.env, name
            continue
        assert mine.env.get("DEVTAG_TAGS") == theirs.env["DEVTAG_TAGS"], (name, mine.env)
        keys = {k for k in theirs.env if k.startswith("DEVTAG_TAG_")}
        assert {k for k in mine.env if k.startswith("DEVTAG_TAG_")} == keys, name
        assert sorted(mine.links) == sorted(theirs.links), name
        partitions = sorted(p.name for p in (root / syspath.lstrip("/")).iterdir() if (p / "partition").exists())
        for part in partitions:
            their_part = udevrules.run_event(
                agent_rules, udevrules.event_for(str(root), f"{syspath}/{part}", parent_env=theirs.env)
            )
            my_part = run(ours, root, f"{syspath}/{part}", parent_env=mine.env)
            assert sorted(my_part.links) == sorted(their_part.links) != [], part
    for name in ("vda", "sdd", "sdi", "sdx", "decoy0", "br0"):  # untagged, decoys, a bridge sharing a MAC
        assert "DEVTAG_TAGS" not in run(ours, root, by_name(root, name)).env, name


def test_each_tagged_nic_gets_a_link_file_with_the_agents_altnames_and_the_default_naming(tmp_path: Path) -> None:
    _, document = scenario.build(tmp_path / "root")
    files = links_of(document)
    for entry in document["devices"]:
        if entry["type"] != "nic" or not entry.get("tags") or not entry.get("mac"):
            continue
        altnames = [t for t in entry["tags"] if agent_encoding.altname_for(t)]
        text = files[entry["mac"].lower()]
        assert re.findall(r"^AlternativeName=(.*)$", text, re.M) == altnames
        assert "NamePolicy=keep kernel database onboard slot path\n" in text  # the kernel name stays
        assert "Type=ether\n" in text  # not the VLANs and bonds that copy its MAC


def test_the_dropin_pulls_in_the_udev_credentials_service_and_packs_rules_into_one_credential() -> None:
    document = {
        "devices": [
            {"type": "disk", "bus": "pci", "address": f"0000:00:{slot:02x}.0", "tags": [f"d{slot}"]}
            for slot in range(2, 30)
        ]
    }
    result = credentials_for(document)
    names = [c.name for c in result.credentials]
    assert names == [f"{RULES_PREFIX}1", UDEV_DROPIN_NAME]
    dropin = result.credentials[-1].data.decode()
    assert dropin == "[Unit]\nWants=systemd-udev-load-credentials.service systemd-network-generator.service\n"
    assert credentials_for({"devices": []}).credentials == []


@pytest.mark.parametrize("tag", HOSTILE)
def test_every_hostile_tag_of_the_agents_tests_stays_harmless(tag: str, tmp_path: Path) -> None:
    check_harmless([tag, "plain"], tmp_path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tags=st.lists(GENERATED_TAGS, min_size=1, max_size=6, unique=True))
def test_generated_tags_stay_harmless(tags: List[str], tmp_path: Path) -> None:
    check_harmless(tags, tmp_path)


@settings(max_examples=300, deadline=None)
@given(tag=st.text(min_size=1, max_size=80))
def test_the_hosts_encoding_is_the_agents(tag: str) -> None:
    assert host_encoding.encode_name(tag) == agent_encoding.encode_name(tag)
    assert host_encoding.encode_key(tag) == agent_encoding.encode_key(tag)
    assert host_encoding.link_name(tag) == agent_encoding.link_name(tag)
    assert host_encoding.altname_for(tag) == agent_encoding.altname_for(tag)


def _vm(root: Path) -> Tuple[Any, str, str]:
    from ..agent.fakesys import FakeMachine

    machine = FakeMachine(root)
    disk = machine.virtio_disk(machine.pci("0000:00:05.0"), "virtio2", "vdb", "252:16", partitions=(1,))
    nic = machine.nic(machine.pci("0000:00:03.0"), "eth0", "52:54:00:00:00:01")
    return machine, disk, nic


RULE_VALUE = re.compile(r'"((?:[^"\\]|\\.)*)"')


def check_harmless(tags: List[str], tmp_path: Path) -> None:
    document = {
        "devices": [
            {"type": "disk", "bus": "pci", "address": "0000:00:05.0", "pci_path": "00:05.0", "tags": tags},
            {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "mac": "52:54:00:00:00:01", "tags": tags},
            {"type": "disk", "bus": "none", "serial": 'x"y$(z)', "tags": tags},  # a serial no rule may carry
        ]
    }
    result = credentials_for(document)
    for credential in result.credentials:
        text = credential.data.decode("utf-8")
        for line in text.split("\n"):
            assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in line), repr(line)
            assert "\u2028" not in line and "\u2029" not in line and "\u202e" not in line
        if not credential.name.startswith(RULES_PREFIX):
            if credential.name.startswith(LINK_PREFIX):
                for name in re.findall(r"^AlternativeName=(.*)$", text, re.M):
                    assert re.fullmatch(r"[A-Za-z0-9_.@+=-]{1,127}", name), name
            continue
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            # Between the quotes only: no quote, no '$', no '%' but the partition number's, and
            # a back-slash only as the start of an \xNN escape.
            for value in RULE_VALUE.findall(line):
                assert '"' not in value and "$" not in value, value
                assert value.replace("-part%n", "").count("%") == 0, value
                assert re.sub(r"\\x[0-9a-f]{2}", "", value).count("\\") == 0, value
        udevrules.parse(text)  # strict: every key and operator known
    assert "x\"y$(z)'" not in "".join(c.data.decode() for c in result.credentials)
    assert any("no plain serial" in why for why in result.left_out)
    machine, disk, nic = _vm(tmp_path / f"root{abs(hash(tuple(tags)))}")
    rules = rules_of(document)
    event = run(rules, machine.root, disk)
    expected = [agent_encoding.link_name(t) for t in tags]
    assert event.links == [f"/dev/disk/by-tag/{name}" for name in expected if name]
    for link in event.links:
        assert os.path.dirname(os.path.normpath(link)) == "/dev/disk/by-tag", link
        assert agent_encoding.decode(os.path.basename(link)) in tags
    assert {k for k in event.env if k.startswith("DEVTAG_TAG_")} == {
        "DEVTAG_TAG_" + agent_encoding.encode_key(t) for t in tags if agent_encoding.link_name(t)
    }
    part = run(rules, machine.root, f"{disk}/vdb1", parent_env=event.env)
    assert part.links == [f"{link}-part1" for link in event.links]
    assert "DEVTAG_TAGS" in run(rules, machine.root, nic).env
    verify = shutil.which("udevadm")
    if verify and subprocess.run([verify, "verify", "--help"], capture_output=True, check=False).returncode == 0:
        rules_file = tmp_path / "70-devtag-1.rules"
        rules_file.write_bytes(result.credentials[0].data)
        done = subprocess.run([verify, "verify", str(rules_file)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_role_too_long_for_a_link_and_a_role_that_cannot_name_a_nic_are_reported() -> None:
    long_tag = "é" * 60  # 120 bytes, escaped nowhere: fits; 60 '\x20'-escaped spaces do not
    spaced = "a" + " " * 58 + "b"
    document = {
        "devices": [
            {"type": "disk", "bus": "pci", "address": "0000:00:05.0", "tags": [long_tag, spaced * 1]},
            {"type": "nic", "bus": "pci", "address": "0000:00:03.0", "mac": "52:54:00:00:00:01", "tags": ["eth0"]},
        ]
    }
    result = credentials_for(document)
    assert any("cannot be an interface name" in why for why in result.left_out), result.left_out
    assert not [c for c in result.credentials if c.name.startswith(LINK_PREFIX)]


def forty_devices(tag_length: int = 12) -> Dict[str, Any]:
    """20 SCSI disks on a virtio-scsi controller behind a root port, and 20 NICs, two roles each."""
    controller = {"type": "scsi", "index": 0, "model": "virtio-scsi", "bus": "pci", "address": "0000:01:00.0",
                  "pci_path": "00:02.0/00.0"}  # fmt: skip
    disks = [
        {
            "type": "disk",
            "bus": "scsi",
            "address": f"0:0:{n}:0",
            "controller": controller,
            "serial": f"vol-{n:04d}",
            "tags": [f"{'d' * tag_length}{n}", f"role-{n}"],
        }
        for n in range(20)
    ]
    nics = [
        {
            "type": "nic",
            "bus": "pci",
            "address": f"0000:00:{3 + n:02x}.0",
            "mac": f"52:54:00:00:01:{n:02x}",
            "tags": [f"net{n}", f"nfv-{n}"],
        }
        for n in range(20)
    ]
    return {"devices": disks + nics}


def test_forty_tagged_devices_fit_smbios_and_not_fw_cfg() -> None:
    result = credentials_for(forty_devices())
    rules = [c for c in result.credentials if c.name.startswith(RULES_PREFIX)]
    assert len(rules) == 1, "the rules of every device packed into one credential"
    assert len([c for c in result.credentials if c.name.startswith(LINK_PREFIX)]) == 20
    strings = smbios_strings(result.credentials)
    assert all(s.startswith(SMBIOS_PREFIX) for s in strings)
    decoded = {s.split("=", 1)[0][len(SMBIOS_PREFIX) :]: base64.b64decode(s.split("=", 1)[1]) for s in strings}
    assert decoded == {c.name: c.data for c in result.credentials}
    assert sum(len(s) + 1 for s in strings) < SMBIOS_MAX_BYTES / 2
    with pytest.raises(CredentialsError, match=f"leave room for {FWCFG_MAX_ENTRIES}"):
        fwcfg_entries(credentials_for(forty_devices(), dropin=False).credentials)


def test_past_the_smbios_limit_the_error_says_what_does_not_fit_and_nothing_is_truncated() -> None:
    big = forty_devices(tag_length=55)
    for device in big["devices"]:
        device["tags"] = [f"{tag}-{extra}" for tag in device["tags"] for extra in range(8)]
    result = credentials_for(big)
    assert len([c for c in result.credentials if c.name.startswith(RULES_PREFIX)]) > 1, "packed in several"
    with pytest.raises(CredentialsError, match=rf"bytes of SMBIOS OEM strings .*the limit is {SMBIOS_MAX_BYTES}"):
        smbios_strings(result.credentials)
    with pytest.raises(CredentialsError, match="at most 255 strings"):
        smbios_strings([Credential(f"{LINK_PREFIX}{n}", b"x") for n in range(256)])


def test_fw_cfg_names_are_bounded_by_qemus_56_bytes() -> None:
    with pytest.raises(CredentialsError, match="QEMU allows 55"):
        fwcfg_entries([Credential(UDEV_DROPIN_NAME, b"x")])
    (entry,) = fwcfg_entries([Credential(f"{RULES_PREFIX}1", b"x")])
    assert entry[0] == "opt/io.systemd.credentials/udev.rules.70-devtag-1" and len(entry[0]) <= 55
