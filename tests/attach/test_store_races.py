"""Concurrent attaches of one volume, from real threads and real processes, on SQLite and PostgreSQL.

The multiattach rule is checked inside the transaction that inserts the
attachment, after the volume row is locked: however the writers interleave,
a non-multiattach volume ends with one instance's attachments only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import List

import pytest

from devtag_host.attach import AttachmentStore, VolumeInUse

WORKER = Path(__file__).resolve().parent / "attach_race_worker.py"
ROUNDS = 5
PROCESSES = 6


def ready(store: AttachmentStore, name: str, multiattach: bool = False) -> str:
    volume = store.create_volume(name, "pool", 1 << 20, multiattach=multiattach)
    return store.set_volume_ready(volume.id, f"/v/{name}").id


def race_processes(url: str, jobs_per_process: List[List[str]]) -> List[list]:
    start_at = time.time() + 2.0  # interpreter start-up and imports first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    workers = [
        subprocess.Popen([sys.executable, str(WORKER), url, str(start_at), *jobs], stdout=subprocess.PIPE, env=env)
        for jobs in jobs_per_process
    ]
    results: List[list] = []
    for worker in workers:
        out, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0
        results.extend(json.loads(out))
    return results


def test_processes_racing_for_one_volume_one_instance_wins(store: AttachmentStore, store_url: str) -> None:
    volumes = [ready(store, f"race-{n}") for n in range(ROUNDS)]
    jobs = [[f"{v}:{uuid.uuid4()}:host-{p}" for v in volumes] for p in range(PROCESSES)]
    results = race_processes(store_url, jobs)
    for volume_id in volumes:
        outcomes = [r[3] for r in results if r[0] == volume_id]
        assert sorted(outcomes) == ["refused"] * (PROCESSES - 1) + ["won"], outcomes
        volume = store.get_volume(volume_id)
        assert len(volume.attachments) == 1 and volume.status == "in-use"


def test_one_instance_on_many_hosts_gets_at_most_the_migration_pair(store: AttachmentStore, store_url: str) -> None:
    """Two attachments of one instance on two hosts (a live migration) are allowed; never a third."""
    volumes = [ready(store, f"pair-{n}") for n in range(ROUNDS)]
    instance = str(uuid.uuid4())
    jobs = [[f"{v}:{instance}:host-{p}" for v in volumes] for p in range(PROCESSES)]
    results = race_processes(store_url, jobs)
    for volume_id in volumes:
        outcomes = [r[3] for r in results if r[0] == volume_id]
        assert outcomes.count("won") == 2, outcomes
        hosts = {a.host for a in store.get_volume(volume_id).attachments}
        assert len(hosts) == 2


def test_threads_racing_for_a_multiattach_volume_on_one_host_attach_each_instance_once(
    store: AttachmentStore,
) -> None:
    volume = ready(store, "shared", multiattach=True)
    instances = [str(uuid.uuid4()) for _ in range(4)]
    barrier = threading.Barrier(len(instances) * 2)
    outcomes: List[str] = []

    def attach(instance: str) -> None:
        barrier.wait()
        try:
            attachment = store.reserve(volume, instance)
            store.update(attachment.id, {"host": "h1"}, {})
            outcomes.append("won")
        except VolumeInUse:
            outcomes.append("refused")

    threads = [threading.Thread(target=attach, args=(i,)) for i in instances for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Each instance twice on the same host: the second is a double attach.
    assert outcomes.count("won") == len(instances)
    connected = [a for a in store.get_volume(volume).attachments if a.host == "h1"]
    assert sorted(a.instance_uuid for a in connected) == sorted(instances)


def test_delete_racing_attach_never_leaves_an_attachment_to_a_deleted_volume(store: AttachmentStore) -> None:
    for n in range(ROUNDS):
        volume = ready(store, f"del-{n}")
        barrier = threading.Barrier(2)
        results: dict = {}

        def attach(volume: str = volume, barrier: threading.Barrier = barrier, results: dict = results) -> None:
            barrier.wait()
            try:
                results["attach"] = store.reserve(volume, str(uuid.uuid4())).id
            except Exception as exc:
                results["attach"] = exc

        def delete(volume: str = volume, barrier: threading.Barrier = barrier, results: dict = results) -> None:
            barrier.wait()
            try:
                store.begin_volume_delete(volume)
                results["delete"] = "deleting"
            except Exception as exc:
                results["delete"] = exc

        threads = [threading.Thread(target=attach), threading.Thread(target=delete)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        record = store.get_volume(volume)
        # Exactly one of them won.
        assert (record.lifecycle == "deleting") != bool(record.attachments), (results, record)


@pytest.mark.parametrize("threads", [8])
def test_threads_racing_for_one_volume(store: AttachmentStore, threads: int) -> None:
    volume = ready(store, "threads")
    barrier = threading.Barrier(threads)
    wins: List[str] = []

    def attach() -> None:
        instance = str(uuid.uuid4())
        barrier.wait()
        try:
            attachment = store.reserve(volume, instance)
            store.update(attachment.id, {"host": f"h-{instance[:4]}"}, {})
            wins.append(instance)
        except VolumeInUse:
            pass

    workers = [threading.Thread(target=attach) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(wins) == 1
    assert [a.instance_uuid for a in store.get_volume(volume).attachments] == wins
