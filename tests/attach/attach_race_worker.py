"""One racing attacher: ``python attach_race_worker.py URL START_AT VOLUME:INSTANCE:HOST ...``.

Waits until the wall clock reaches START_AT (so every process starts its
transactions together), then for each job reserves the volume for the
instance and updates the attachment with a connector on HOST, as a compute
host attaching it would.  Prints a JSON list of [volume, instance, host, outcome].
"""

from __future__ import annotations

import json
import sys
import time

from devtag_host.attach import AttachmentStore, VolumeInUse


def main() -> None:
    url, start_at, *jobs = sys.argv[1:]
    store = AttachmentStore(url, migrate=False)
    results = []
    delay = float(start_at) - time.time()
    if delay > 0:
        time.sleep(delay)
    for job in jobs:
        volume, instance, host = job.split(":")
        try:
            attachment = store.reserve(volume, instance)
            store.update(attachment.id, {"host": host}, {"driver_volume_type": "file", "data": {}})
            store.complete(attachment.id)
            outcome = "won"
        except VolumeInUse:
            outcome = "refused"
        results.append([volume, instance, host, outcome])
    store.close()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
