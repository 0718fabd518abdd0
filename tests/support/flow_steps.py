"""The steps each attach flow journals, in order: what the failure-injection tests fail or crash before.

Only the tests read these (the flows are their own list of steps, see
docs/attach.md "The runner"); ``test_failures.py`` checks that a clean run of
each basic flow journals exactly its tuple, and the lifecycle and migration
tests parametrise over theirs.
"""

from __future__ import annotations

ATTACH_VOLUME_STEPS = ("validate", "reserve", "update", "connect", "attach", "record", "complete")
DETACH_VOLUME_STEPS = ("begin-detaching", "detach-config", "detach-live", "disconnect", "delete", "untag")
ATTACH_INTERFACE_STEPS = ("validate", "reserve", "attach", "record", "complete")
DETACH_INTERFACE_STEPS = ("begin-detaching", "detach-config", "detach-live", "delete", "untag")
CREATE_VOLUME_STEPS = ("insert", "create", "ready")
DELETE_VOLUME_STEPS = ("begin-delete", "delete-storage", "remove")

# The destination side of live migration and evacuate (live_migration.prepare_destination).
DESTINATION_STEPS = ("reserve-destination", "update-destination", "connect-destination")
LIVE_MIGRATION_STEPS = (
    "validate",
    *DESTINATION_STEPS,
    "migrate",
    "complete-destination",
    "disconnect-source",
    "delete-source",
    "check-tags",
)
EVACUATE_STEPS = ("validate", *DESTINATION_STEPS, "define", "start", "complete-destination", "delete-source")
SHELVE_STEPS = ("validate", "stop", "reserve-shelved", "disconnect", "delete-old", "undefine")
UNSHELVE_STEPS = ("validate", "update", "connect", "define", "start", "complete")
SWAP_STEPS = (
    "validate",
    "reserve",
    "update",
    "connect",
    "copy",
    "pivot",
    "update-config",
    "rekey-tag",
    "disconnect-old",
    "delete-old",
    "complete",
)
