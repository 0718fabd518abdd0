"""Remember the database ids of standard traits and resource classes.

Every write of a provider's inventory or traits, and every allocation-candidates
query, turns names into ids.  For the standard names (os-traits,
os-resource-classes) that mapping never changes once ``db-sync`` inserted them:
the API refuses to delete or rename a standard name.  So each process keeps the
ids it has looked up, per engine (one database), and asks the database only for
custom names (``CUSTOM_*`` can be deleted and re-created with a new id by another
worker) and for standard names it has not seen yet.

``forget`` drops an engine's ids; the migrations call it, since a downgrade
followed by an upgrade re-creates the tables.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Collection, Dict, MutableMapping, Tuple

from sqlalchemy.engine import Connection, Engine

Lookup = Callable[[Connection, list], Dict[str, int]]

_IDS: MutableMapping[Engine, Dict[Tuple[str, str], int]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def ids_by_name(
    connection: Connection, kind: str, names: Collection[str], standard: Collection[str], lookup: Lookup
) -> Dict[str, int]:
    """``{name: id}`` for the ``names`` that exist; ``lookup`` queries the database."""
    known = _IDS.get(connection.engine)
    found: Dict[str, int] = {}
    missing = []
    for name in names:
        cached = known.get((kind, name)) if known is not None else None
        if cached is None:
            missing.append(name)
        else:
            found[name] = cached
    if not missing:
        return found
    looked_up = lookup(connection, sorted(set(missing)))
    found.update(looked_up)
    remember = {(kind, name): id_ for name, id_ in looked_up.items() if name in standard}
    if remember:
        with _LOCK:
            _IDS.setdefault(connection.engine, {}).update(remember)
    return found


def forget(engine: Engine) -> None:
    with _LOCK:
        _IDS.pop(engine, None)
