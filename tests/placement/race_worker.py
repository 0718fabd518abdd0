"""One racing client process: ``python race_worker.py URL THREADS ATTEMPTS RP...``.

Each thread claims VCPU:1 for fresh consumers on the providers in turn; a
409 ``placement.concurrent_update`` is retried (as a real client would), any
other 409 is final.  Prints a JSON list of [provider, status, code].
"""

from __future__ import annotations

import json
import sys
import threading
import uuid

import httpx

HEADERS = {"x-auth-token": "admin", "openstack-api-version": "placement 1.23"}  # 1.23: errors carry a code


def claim(client: httpx.Client, providers: list, attempts: int, offset: int, results: list) -> None:
    with client:
        for attempt in range(attempts):
            rp = providers[(attempt + offset) % len(providers)]
            body = {"allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": "race", "user_id": "race"}
            consumer = str(uuid.uuid4())
            for _ in range(100):
                response = client.put(f"/allocations/{consumer}", json=body)
                code = response.json()["errors"][0]["code"] if response.status_code >= 400 else None
                results.append([rp, response.status_code, code])
                if code != "placement.concurrent_update":
                    break


def main() -> None:
    base, threads, attempts, *providers = sys.argv[1:]
    results: list = []
    workers = [
        threading.Thread(
            target=claim,
            args=(httpx.Client(base_url=base, headers=HEADERS, timeout=60), providers, int(attempts), index, results),
        )
        for index in range(int(threads))
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
