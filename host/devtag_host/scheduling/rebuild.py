"""The rebuild pre-flight (pure): can the instance's current providers take the new image?

A rebuild keeps the host and the flavor and changes the image; asking placement
for new candidates would exclude a full host (the glance-image-traits spec's
"rebuild should not check with placement").  Instead the caller collects the
traits of every provider in the instance's allocations and of each one's whole
provider tree (a trait may sit on a nested provider, e.g. a NIC under the
compute node), and :func:`check_rebuild` compares them with what the new image
requires: its ``trait:`` properties and, when the prefilter option is on, its
device-model traits (Nova skips the prefilter on rebuild; a host that cannot
emulate ``hw_disk_bus=ide`` would only fail later, in the virt driver).

The flavor's forbidden traits against the image's required ones are checked
when the request is built (:class:`~.errors.TraitConflict`).  The flavor's own
requirements are not re-checked: the flavor did not change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Set

from .errors import RebuildRefused
from .request import IMAGE, RequestGroup


@dataclass
class RebuildVerdict:
    providers: Mapping[str, str]  # UUID -> name, every provider whose traits were collected
    required: Dict[str, str]  # trait -> origin, what the new image needs
    missing: Dict[str, str] = field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        return not self.missing

    def message(self) -> str:
        hosts = ", ".join(sorted(self.providers.values())) or "(none)"
        if self.accepted:
            return f"rebuild accepted: {hosts} have every trait the image requires ({len(self.required)})"
        listed = ", ".join(f"{name} ({_origin(origin)})" for name, origin in sorted(self.missing.items()))
        return f"rebuild refused: the instance's providers ({hosts}) lack {listed}"

    def raise_if_refused(self) -> None:
        if not self.accepted:
            raise RebuildRefused(self.message())


def _origin(origin: str) -> str:
    return "image trait" if origin == IMAGE else origin


def check_rebuild(group: RequestGroup, tree_traits: Set[str], providers: Mapping[str, str]) -> RebuildVerdict:
    """Which of the image's required traits the providers' trees lack."""
    required = group.image_required()
    missing = {name: origin for name, origin in required.items() if name not in tree_traits}
    return RebuildVerdict(providers=dict(providers), required=required, missing=missing)
