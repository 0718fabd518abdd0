"""Migration 0003: journal rows written before the shelve-offload secret change lose their display passwords.

A database is written in the old format (schema 0002, shelve-offload and
evacuate rows holding ``VIR_DOMAIN_XML_SECURE`` definitions) and upgraded,
on SQLite and on a throw-away PostgreSQL.
"""

from __future__ import annotations

import secrets
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator, List

import pytest
from sqlalchemy import select

from devtag_host.attach import AttachmentStore, display_secrets, schema_upgrade
from devtag_host.attach.db import journal
from devtag_host.attach.lifecycle import shelved_definition
from tests.support.services import create_database

PENDING = "aaaaaaaa-0000-4000-8000-00000000000a"  # shelved, not unshelved: unshelve needs the passwords
OPEN = "aaaaaaaa-0000-4000-8000-00000000000b"  # shelve interrupted: reconcile may roll it forward
UNSHELVED = "aaaaaaaa-0000-4000-8000-00000000000c"  # shelved then unshelved: nothing needs them
ROLLED_BACK = "aaaaaaaa-0000-4000-8000-00000000000d"
EVACUATED = "aaaaaaaa-0000-4000-8000-00000000000e"
NEW_FORMAT = "aaaaaaaa-0000-4000-8000-00000000000f"


def secure_definition(instance: str) -> str:
    """A definition as ``XMLDesc(VIR_DOMAIN_XML_SECURE)`` gave it: passwords in the clear, Nova's namespace."""
    return f"""<domain type="qemu"><name>vm-{instance[-1]}</name><uuid>{instance}</uuid>
  <metadata><nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1"><nova:name>n</nova:name>
  </nova:instance></metadata>
  <devices><graphics type="vnc" port="-1" autoport="yes" passwd="vnc-{instance[-1]}-s3cret"/>
  <graphics type="spice" autoport="yes"/>
  <graphics type="spice" autoport="yes" passwd="spice-{instance[-1]}-s3cret"/></devices></domain>"""


def old_database(store: AttachmentStore) -> None:
    """Journal rows as the code before the change wrote them."""

    def shelve(operation: str, instance: str, outcome: str | None) -> None:
        detail = {"definition": secure_definition(instance), "volumes": [], "running": True}
        store.journal_step(operation, "shelve-offload", "validate", instance_uuid=instance, detail=detail)
        store.journal_step(operation, "shelve-offload", "stop", instance_uuid=instance)
        if outcome:
            store.journal_step(operation, "shelve-offload", "end", instance_uuid=instance, detail={"outcome": outcome})

    shelve("op-pending-old", PENDING, "completed")
    store.journal_step("op-unshelve-old", "unshelve", "end", instance_uuid=PENDING, detail={"outcome": "completed"})
    shelve("op-pending", PENDING, "completed")  # shelved again after an unshelve: this one is pending
    shelve("op-open", OPEN, None)
    shelve("op-unshelved", UNSHELVED, "completed")
    store.journal_step("op-unshelve", "unshelve", "validate", instance_uuid=UNSHELVED, detail={"host": "h1"})
    store.journal_step("op-unshelve", "unshelve", "end", instance_uuid=UNSHELVED, detail={"outcome": "completed"})
    shelve("op-rolled-back", ROLLED_BACK, "rolled-back")
    store.journal_step(
        "op-evacuate",
        "evacuate",
        "validate",
        instance_uuid=EVACUATED,
        detail={"source": "h1", "volumes": [], "definition": secure_definition(EVACUATED), "start": True},
    )
    store.journal_step("op-evacuate", "evacuate", "end", instance_uuid=EVACUATED, detail={"outcome": "completed"})


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)])
def old_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AttachmentStore]:
    """An attach store at schema 0002 holding old-format journal rows."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'attach.sqlite'}"
    else:
        url = create_database(request.getfixturevalue("postgres_url"), f"attach_old_{secrets.token_hex(4)}")
    store = AttachmentStore(url, migrate=False)
    schema_upgrade.upgrade(store, "0002")
    old_database(store)
    yield store
    store.close()


@pytest.fixture
def secrets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "secrets"
    monkeypatch.setenv(display_secrets.SECRETS_DIR_ENV, str(directory))
    return directory


def journal_text(store: AttachmentStore) -> List[str]:
    with store.db.read() as connection:
        return [row.detail or "" for row in connection.execute(select(journal.c.detail))]


def test_upgrade_scrubs_every_display_password_from_the_journal(old_store: AttachmentStore, secrets_dir: Path) -> None:
    assert any("s3cret" in detail for detail in journal_text(old_store)), "the old format held them"

    schema_upgrade.upgrade(old_store)

    assert schema_upgrade.current_revision(old_store) == "0003"
    assert not any("s3cret" in detail for detail in journal_text(old_store))
    # Pending shelves (the last one of an instance not unshelved since, an open one): kept root-only.
    kept = sorted(path.name for path in secrets_dir.iterdir())
    assert kept == [f"shelved-{PENDING}.json", f"shelved-{OPEN}.json"]
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    for instance in (PENDING, OPEN):
        assert stat.S_IMODE((secrets_dir / f"shelved-{instance}.json").stat().st_mode) == 0o600
        passwords = display_secrets.recall(instance, None)
        assert passwords == [f"vnc-{instance[-1]}-s3cret", None, f"spice-{instance[-1]}-s3cret"]


def test_unshelve_after_the_upgrade_gets_the_passwords_back(old_store: AttachmentStore, secrets_dir: Path) -> None:
    schema_upgrade.upgrade(old_store)
    host = SimpleNamespace(store=old_store)
    definition = shelved_definition(host, PENDING)  # type: ignore[arg-type] - only its store is used
    assert 'passwd="vnc-a-s3cret"' in definition and 'passwd="spice-a-s3cret"' in definition
    assert "nova:instance" in definition and "ns0:" not in definition  # Nova's prefix survives the rewrite
    plan = old_store.plan("op-pending")
    assert plan.detail["display_passwords"] == 2 and "passwd" not in plan.detail["definition"]
    # Not pending: the passwords are gone, nothing is kept for them.
    for operation in ("op-pending-old", "op-unshelved", "op-rolled-back", "op-evacuate"):
        detail = old_store.plan(operation).detail
        assert "passwd" not in detail["definition"] and "display_passwords" not in detail, operation
        assert "<graphics" in detail["definition"], "only the passwords go"
    for instance in (UNSHELVED, ROLLED_BACK, EVACUATED):
        assert not (secrets_dir / f"shelved-{instance}.json").exists()


def test_rows_written_after_the_change_are_left_alone(tmp_path: Path, secrets_dir: Path) -> None:
    store = AttachmentStore(f"sqlite:///{tmp_path / 'new.sqlite'}", migrate=False)
    try:
        schema_upgrade.upgrade(store, "0002")
        clean = display_secrets.without_display_passwords(secure_definition(NEW_FORMAT))
        detail = {"definition": clean, "display_passwords": 2, "volumes": [], "running": False}
        store.journal_step("op-new", "shelve-offload", "validate", instance_uuid=NEW_FORMAT, detail=detail)
        store.journal_step("op-new", "shelve-offload", "end", instance_uuid=NEW_FORMAT, detail={"outcome": "completed"})
        before = journal_text(store)
        schema_upgrade.upgrade(store)
        assert journal_text(store) == before
        assert not secrets_dir.exists()
    finally:
        store.close()
