"""``--instance-data``: one bad instance affects only itself; symbolic links are not followed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Tuple

import pytest

from devtag_host.errors import InputError
from devtag_host.metadata_server import InstanceDirectory
from devtag_host.metadata_server.instance_data import instance_data_reader
from devtag_host.metadata_server.libvirt_watch import LibvirtWatcher

from .test_metadata_server_watch import FakeConnection, FakeDomain

GOOD, BAD = "11111111-2222-4333-8444-000000000001", "11111111-2222-4333-8444-000000000002"
SECRET = b"the-hmac-secret-of-the-proxy"


def domain_xml(uuid: str, mac: str) -> str:
    return f"""<domain type='qemu'><name>d-{uuid[-1]}</name><uuid>{uuid}</uuid>
    <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
    <interface type='user'><mac address='{mac}'/></interface></devices></domain>"""


def watched(tmp_path: Path) -> Tuple[LibvirtWatcher, InstanceDirectory, Path]:
    data = tmp_path / "instances"
    for uuid in (GOOD, BAD):
        (data / uuid).mkdir(parents=True)
        (data / uuid / "user_data").write_bytes(f"#cloud-config\n# {uuid}\n".encode())
    connection = FakeConnection()
    connection.domains[GOOD] = FakeDomain(GOOD, domain_xml(GOOD, "52:54:00:77:00:01"))
    connection.domains[BAD] = FakeDomain(BAD, domain_xml(BAD, "52:54:00:77:00:02"))
    directory = InstanceDirectory()
    watcher = LibvirtWatcher(connection, directory, extras=instance_data_reader(data))  # type: ignore[arg-type]
    return watcher, directory, data


def user_data(directory: InstanceDirectory, uuid: str) -> object:
    entry = directory.by_uuid(uuid)
    return None if entry is None else entry.site["/latest/user-data"].body


@pytest.mark.parametrize("depth", [100, 100_000])
def test_a_deeply_nested_meta_json_at_startup_affects_only_its_instance(tmp_path: Path, depth: int) -> None:
    watcher, directory, data = watched(tmp_path)
    (data / BAD / "meta.json").write_text('{"a": ' * depth + "1" + "}" * depth)
    watcher.start()  # today: RecursionError out of start(), the service never comes up
    try:
        assert user_data(directory, GOOD) == f"#cloud-config\n# {GOOD}\n".encode()
        assert directory.by_uuid(BAD) is None
    finally:
        watcher.stop()


def test_a_bad_instance_does_not_stop_the_resync_and_keeps_its_previous_pages(tmp_path: Path) -> None:
    watcher, directory, data = watched(tmp_path)
    watcher.resync()
    before = user_data(directory, BAD)
    assert before is not None
    (data / BAD / "vendor_data.json").write_text("[" * 200_000 + "]" * 200_000)
    (data / GOOD / "user_data").write_bytes(b"#cloud-config\n# changed\n")
    watcher.resync()
    assert user_data(directory, GOOD) == b"#cloud-config\n# changed\n", "the others are still refreshed"
    assert user_data(directory, BAD) == before, "the bad one keeps what it had"
    (data / BAD / "vendor_data.json").write_text(json.dumps({"ok": True}))
    watcher.resync()
    assert b"ok" in directory.by_uuid(BAD).site["/openstack/latest/vendor_data.json"].body


def test_symbolic_links_in_the_tree_are_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "metadata-proxy-secret"
    secret.write_bytes(SECRET)
    watcher, directory, data = watched(tmp_path)
    (data / BAD / "user_data").unlink()
    (data / BAD / "user_data").symlink_to(secret)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "user_data").symlink_to(secret)
    linked_dir = "11111111-2222-4333-8444-000000000003"
    (data / linked_dir).symlink_to(other, target_is_directory=True)
    watcher.resync()
    assert directory.by_uuid(BAD) is None
    extras = instance_data_reader(data)
    for uuid, message in ((BAD, "symbolic link"), (linked_dir, "not a directory")):
        with pytest.raises(InputError, match=message):
            extras(uuid)
    for entry in (directory.by_uuid(GOOD),):
        assert all(SECRET not in page.body for page in entry.site.values())


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    _watcher, _directory, data = watched(tmp_path)
    os.mkfifo(data / BAD / "meta.json")
    with pytest.raises(InputError, match="not a regular file"):
        instance_data_reader(data)(BAD)


def test_nesting_within_the_limit_is_served(tmp_path: Path) -> None:
    watcher, directory, data = watched(tmp_path)
    (data / GOOD / "vendor_data.json").write_text(json.dumps({"a": {"b": {"c": [1, [2, [3]]]}}}))
    watcher.resync()
    assert json.loads(directory.by_uuid(GOOD).site["/openstack/latest/vendor_data.json"].body)["a"]["b"]["c"][1]


ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@example"
PRIVATE = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


def served_keys(directory: InstanceDirectory, uuid: str) -> object:
    entry = directory.by_uuid(uuid)
    return None if entry is None else json.loads(entry.site["/openstack/latest/meta_data.json"].body)["public_keys"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (PRIVATE, "holds a PRIVATE key; give the public one"),
        (ED25519 + "\n" + PRIVATE, "holds a PRIVATE key"),
        ("ssh-ed25519 not-base64!\n", "line 1: not an OpenSSH public key (the key is not base64)"),
        ("# only a comment\n\n", "holds no public key"),
        ("", "holds no public key"),
    ],
)
def test_public_keys_are_checked_as_the_config_drives(tmp_path: Path, content: str, message: str) -> None:
    """Same validator as ``configdrive --public-key``; a bad file affects only its instance."""
    (tmp_path / "instances" / BAD).mkdir(parents=True)
    (tmp_path / "instances" / BAD / "public_keys").write_text(content)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        instance_data_reader(tmp_path / "instances")(BAD)


def test_a_private_key_is_never_served_and_affects_only_its_instance(tmp_path: Path) -> None:
    watcher, directory, data = watched(tmp_path)
    (data / GOOD / "public_keys").write_text(ED25519 + "\n")
    (data / BAD / "public_keys").write_text(PRIVATE)
    watcher.resync()  # first read: the bad instance is not served at all (not served without its keys)
    assert served_keys(directory, GOOD) == {"key": ED25519}
    assert directory.by_uuid(BAD) is None

    (data / BAD / "public_keys").write_text(ED25519 + "\n")
    watcher.resync()
    assert served_keys(directory, BAD) == {"key": ED25519}

    (data / BAD / "public_keys").write_text(ED25519 + "\n" + PRIVATE)  # the operator appends the wrong file
    (data / BAD / "user_data").write_bytes(b"#cloud-config\n# changed\n")
    watcher.resync()
    entry = directory.by_uuid(BAD)
    assert entry is not None and served_keys(directory, BAD) == {"key": ED25519}, "its previous pages are kept"
    assert all(b"PRIVATE KEY" not in page.body for page in entry.site.values())
    assert user_data(directory, BAD) == f"#cloud-config\n# {BAD}\n".encode(), "nothing of the bad read is served"
    assert user_data(directory, GOOD) == f"#cloud-config\n# {GOOD}\n".encode()


def test_public_keys_not_utf8_are_refused(tmp_path: Path) -> None:
    (tmp_path / "instances" / BAD).mkdir(parents=True)
    (tmp_path / "instances" / BAD / "public_keys").write_bytes(b"ssh-ed25519 \xff\xfe\n")
    with pytest.raises(InputError, match="is not UTF-8 text"):
        instance_data_reader(tmp_path / "instances")(BAD)
