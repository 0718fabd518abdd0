"""The JSON body of ``GET /allocation_candidates``, from the objects' answer
(``objects/candidate_answer.py``).

Decides how the answer's bytes are written: the flat path's requests and summaries
are plain data, encoded as they are; the general path's requests (1.12+) are joined
from each part's entries, encoded once per part, and its summaries on kept rows are
remembered per provider, encoded, for as long as the kept world lives
(``StaticWorld.memo``).  Either way the bytes are orjson's encoding of the dicts
upstream's handler would build, byte for byte.
"""

from __future__ import annotations

import operator
from typing import Any, Dict, List, Optional, Tuple

import orjson

from .objects.candidate_answer import Candidates, PendingSummaries, Picks, Shape, allocation_request


def body(found: Candidates, shape: Shape) -> Dict[str, Any]:
    """The answer's body, for the app's encoder: parts of it may be pre-encoded fragments."""
    requests = found.requests if isinstance(found.requests, list) else _requests(found.requests, shape)
    summaries = found.summaries
    if isinstance(summaries, PendingSummaries):
        summaries = _encoded_summaries(summaries, shape)
    return {"allocation_requests": requests, "provider_summaries": summaries}


def _requests(picks: Picks, shape: Shape) -> List[Any]:
    """The allocation requests of ``chosen`` in the API's shape.

    What a part contributes (its providers' uuids with their resources, its
    ``mappings`` entry) is worked out once per part; a candidate whose parts take
    from distinct providers is then their entries side by side, sorted by uuid.
    Repeated amounts are one shared object each."""
    if shape.dict_format:
        return [_encoded_requests(picks, shape.with_mappings)]
    uuid, suffixes, chosen, parts, names = picks.uuid, picks.suffixes, picks.chosen, picks.parts, picks.names
    same: Dict[Tuple[Tuple[int, int], ...], Any] = {}

    def entry_of(amounts: Tuple[Tuple[int, int], ...]) -> Any:
        """{"resources": {class: amount}} from 1.12, else the resources alone (shared)."""
        entry = same.get(amounts)
        if entry is None:
            resources = {names[rc_id]: amount for rc_id, amount in amounts}
            entry = same[amounts] = {"resources": resources} if shape.dict_format else resources
        return entry

    # id(part) -> ([(uuid, entry), ...], the uuids of its mappings entry)
    rendered = {
        key: ([(uuid[rp_id], entry_of(amounts)) for rp_id, amounts in part[1]], [uuid[rp] for rp in part[2]])
        for key, part in parts.items()
    }
    requests: List[Dict[str, Any]] = []
    for pick, merged in chosen:
        of_parts = [rendered[id(part)] for part in pick]
        if merged is None:
            taken: List[Tuple[str, Any]] = []
            for entries, _uuids in of_parts:
                taken += entries
        else:
            taken = [(uuid[rp_id], entry_of(amounts)) for rp_id, amounts in merged]
        taken.sort()  # by uuid: a provider is there once, the entries are never compared
        body: Dict[str, Any] = {"allocations": dict(taken)} if shape.dict_format else allocation_request(taken, False)
        if shape.with_mappings:
            body["mappings"] = dict(zip(suffixes, [uuids for _entries, uuids in of_parts]))
        requests.append(body)
    return requests


def _encoded_requests(picks: Picks, with_mappings: bool) -> Any:
    """``_requests`` (1.12+) as one JSON fragment (the caller's list holds it; orjson
    writes its bytes where the list's items would be).  Each part's entries and
    ``mappings`` list are encoded once; a request is then bytes joined in the order
    encoding its dicts gives: the same answer, byte for byte, without building and
    walking a dict, a list and their strings per request."""
    encode = orjson.dumps
    uuid, suffixes, chosen, parts, names = picks.uuid, picks.suffixes, picks.chosen, picks.parts, picks.names
    same: Dict[Tuple[Tuple[int, int], ...], bytes] = {}

    def entry_of(rp_id: int, amounts: Tuple[Tuple[int, int], ...]) -> Tuple[str, bytes]:
        """(uuid, b'"uuid":{"resources":{...}}'), the resources encoded once per amounts."""
        resources = same.get(amounts)
        if resources is None:
            resources = same[amounts] = encode({"resources": {names[rc_id]: amount for rc_id, amount in amounts}})
        key = uuid[rp_id]
        return key, encode(key) + b":" + resources

    # id(part) -> ([(uuid, entry), ...], its mappings list encoded)
    rendered = {
        key: ([entry_of(rp_id, amounts) for rp_id, amounts in part[1]], encode([uuid[rp] for rp in part[2]]))
        for key, part in parts.items()
    }
    keys = [encode(suffix) + b":" for suffix in suffixes]
    encoded: List[bytes] = []
    second = operator.itemgetter(1)
    join = b",".join
    for pick, merged in chosen:
        of_parts = [rendered[id(part)] for part in pick]
        if merged is None:
            taken: List[Tuple[str, bytes]] = []
            for entries, _uuids in of_parts:
                taken += entries
        else:
            taken = [entry_of(rp_id, amounts) for rp_id, amounts in merged]
        taken.sort()  # by uuid, as the dict's keys: a provider is there once
        allocations = join(map(second, taken))
        if with_mappings:
            mappings = join(map(operator.add, keys, map(second, of_parts)))
            encoded.append(b'{"allocations":{' + allocations + b'},"mappings":{' + mappings + b"}}")
        else:
            encoded.append(b'{"allocations":{' + allocations + b"}}")
    return orjson.Fragment(join(encoded))


def _encoded_summaries(pending: PendingSummaries, shape: Shape) -> Any:
    """The summaries as one JSON fragment: each provider's entry is encoded once per
    kept world and shape and reused by every request until a write changes the stamp;
    for a provider with rows in use, as long as the same rows have the same usage
    (its entry is remembered with the (class, used) pairs it was built on).  The
    bytes are orjson's own encoding of the entry, so the answer is byte for byte
    what encoding the dicts gives."""
    encode = orjson.dumps
    world, provider_ids = pending.world, pending.provider_ids
    assert world.kept is not None
    memo = world.kept.memo
    # {provider: its entry, while none of its rows is in use}
    remembered: Dict[int, bytes] = memo.setdefault(("summaries", shape), {})
    # {provider: (its (class, used) pairs, its entry)}: one per provider (the last usage seen)
    remembered_in_use: Dict[int, Tuple[Tuple[Tuple[int, int], ...], bytes]] = memo.setdefault(
        ("summaries in use", shape), {}
    )
    in_use = world.in_use
    entries: List[Optional[bytes]] = []
    missing: List[int] = []
    usage_keys: Dict[int, Tuple[Tuple[int, int], ...]] = {}
    for rp_id in provider_ids:
        usage = in_use.get(rp_id)
        if usage is None:
            entry = remembered.get(rp_id)
        else:
            # The pairs in the order read: another order only misses, never mismatches.
            key = usage_keys[rp_id] = tuple(usage)
            found = remembered_in_use.get(rp_id)
            entry = found[1] if found is not None and found[0] == key else None
        if entry is None:
            missing.append(rp_id)
        entries.append(entry)
    if missing:
        built = pending.build(missing)
        fresh: Dict[int, bytes] = {}
        for rp_id, (key_uuid, summary) in zip(missing, built.items()):
            entry = fresh[rp_id] = encode(key_uuid) + b":" + encode(summary)
            if rp_id in usage_keys:
                remembered_in_use[rp_id] = (usage_keys[rp_id], entry)
            else:
                remembered[rp_id] = entry
        entries = [fresh[rp_id] if entry is None else entry for rp_id, entry in zip(provider_ids, entries)]
    return orjson.Fragment(b"{" + b",".join(entries) + b"}")  # type: ignore[arg-type]
