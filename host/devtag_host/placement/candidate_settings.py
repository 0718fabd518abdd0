"""The operator's settings of ``GET /allocation_candidates``, with OpenStack
Placement's names, meanings and defaults (its ``[placement]`` options):

* ``max_allocation_candidates``: at most this many candidates are generated per
  request (-1: no limit); ``limit`` then chooses among them.
* ``allocation_candidates_generation_strategy``: ``depth-first`` generates every
  candidate of the first viable root provider before the next; ``breadth-first``
  one candidate of each viable root in turn, so a cap spreads over all of them.
* ``randomize_allocation_candidates``: with ``limit``, a random sample of the
  generated candidates instead of the first ones (and the answer shuffled).

They are read in one place, :func:`from_env`, from ``DEVTAG_PLACEMENT_<NAME>``
environment variables; ``placement serve`` options set those variables, so worker
processes started by uvicorn read the same values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Mapping, MutableMapping, Optional

from ..errors import InputError

DEPTH_FIRST = "depth-first"
BREADTH_FIRST = "breadth-first"
STRATEGIES = (DEPTH_FIRST, BREADTH_FIRST)

MAX_ENV = "DEVTAG_PLACEMENT_MAX_ALLOCATION_CANDIDATES"
STRATEGY_ENV = "DEVTAG_PLACEMENT_ALLOCATION_CANDIDATES_GENERATION_STRATEGY"
RANDOMIZE_ENV = "DEVTAG_PLACEMENT_RANDOMIZE_ALLOCATION_CANDIDATES"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class CandidateSettings:
    max_allocation_candidates: int = -1
    generation_strategy: str = DEPTH_FIRST
    randomize: bool = False

    def cap(self) -> Optional[int]:
        """How many candidates may be generated (None: no cap)."""
        return None if self.max_allocation_candidates < 0 else self.max_allocation_candidates


UPSTREAM_DEFAULTS = CandidateSettings()


def parse(max_candidates: Optional[str], strategy: Optional[str], randomize: Optional[str]) -> CandidateSettings:
    """Settings from their text (None: the default); ``InputError`` names a bad one."""
    result = CandidateSettings()
    cap = result.max_allocation_candidates
    if max_candidates is not None and max_candidates.strip():
        try:
            cap = int(max_candidates)
        except ValueError:
            raise InputError(f"max_allocation_candidates: not an integer: {max_candidates!r}") from None
        if cap < -1:
            raise InputError(f"max_allocation_candidates: must be -1 (no limit) or at least 0, not {cap}")
    chosen = result.generation_strategy
    if strategy is not None and strategy.strip():
        chosen = strategy.strip()
        if chosen not in STRATEGIES:
            raise InputError(
                f"allocation_candidates_generation_strategy: {chosen!r} is not one of {', '.join(STRATEGIES)}"
            )
    shuffled = result.randomize
    if randomize is not None and randomize.strip():
        word = randomize.strip().lower()
        if word not in _TRUE + _FALSE:
            raise InputError(f"randomize_allocation_candidates: not a boolean: {randomize!r}")
        shuffled = word in _TRUE
    return CandidateSettings(cap, chosen, shuffled)


def from_env(environ: Optional[Mapping[str, str]] = None) -> CandidateSettings:
    """The settings from ``DEVTAG_PLACEMENT_*`` variables (unset: upstream's default)."""
    return resolve(None, None, None, environ)


def resolve(
    max_candidates: Optional[str],
    strategy: Optional[str],
    randomize: Optional[bool],
    environ: Optional[Mapping[str, str]] = None,
) -> CandidateSettings:
    """The settings from command-line options, each unset one (None) from its
    environment variable, else upstream's default."""
    env = os.environ if environ is None else environ
    return parse(
        env.get(MAX_ENV) if max_candidates is None else max_candidates,
        env.get(STRATEGY_ENV) if strategy is None else strategy,
        env.get(RANDOMIZE_ENV) if randomize is None else str(randomize),
    )


def to_env(settings: CandidateSettings, environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Write ``settings`` where :func:`from_env` reads them (for worker processes)."""
    env = os.environ if environ is None else environ
    values: Dict[str, str] = {
        MAX_ENV: str(settings.max_allocation_candidates),
        STRATEGY_ENV: settings.generation_strategy,
        RANDOMIZE_ENV: "true" if settings.randomize else "false",
    }
    env.update(values)
