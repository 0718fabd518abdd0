"""The agent's log: the "devtag_agent" logger's interface without importing ``logging`` on the boot path.

``logging`` brings ``traceback``, ``linecache``, ``tokenize``, ``string`` and
``threading``: about a fifth of the agent's instructions over the
interpreter's start, paid on every boot under TCG (docs/agent.md, "Boot
cost").  The agent's modules log through ``log`` below, which has the few
methods they call.  Two modes:

* **as a library** (the default): each record goes to
  ``logging.getLogger("devtag_agent")``, ``logging`` imported at the first
  record; a program that imports the agent configures logging as it always
  did, and tests' ``caplog`` sees the records.
* **the command line** (``to_stderr``, called once by ``devtag_agent.cli``):
  each record at or above the level is written as ``devtag-agent: LEVEL:
  message`` to stderr, which is what the CLI's ``logging.StreamHandler``
  with that format wrote before.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing is for the type checker only (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    from typing import Any

__all__ = ["DEBUG", "ERROR", "INFO", "WARNING", "log"]

# logging's numeric levels, so a library user's logger level means the same.
DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40
_LEVEL_NAMES = {DEBUG: "DEBUG", INFO: "INFO", WARNING: "WARNING", ERROR: "ERROR"}
LOGGER_NAME = "devtag_agent"


class AgentLog:
    """logging.Logger's ``debug``/``info``/``warning``/``error``/``log`` for the agent's records."""

    def __init__(self) -> None:
        self._to_stderr = False
        self._level = WARNING

    def to_stderr(self, level: int) -> None:
        """From now on write records at ``level`` or above to stderr, without ``logging`` (the CLI's mode).

        ``sys.stderr`` is looked up at each record (a test or an embedding
        program may replace it); a record that cannot be written (stderr
        closed) is dropped, as logging's handlers drop it.
        """
        self._to_stderr = True
        self._level = level

    def to_logging(self) -> None:
        """Back to the library mode: records go to ``logging.getLogger("devtag_agent")``."""
        self._to_stderr = False
        self._level = WARNING

    def log(self, level: int, msg: str, *args: Any) -> None:
        if not self._to_stderr:
            import logging  # only a library user pays for it, at its first record

            logging.getLogger(LOGGER_NAME).log(level, msg, *args)
            return
        if level < self._level:
            return
        text = msg % args if args else msg
        try:
            sys.stderr.write(f"devtag-agent: {_LEVEL_NAMES.get(level, f'Level {level}')}: {text}\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):  # closed, or None (pythonw-like embedding)
            pass

    def debug(self, msg: str, *args: Any) -> None:
        self.log(DEBUG, msg, *args)

    def info(self, msg: str, *args: Any) -> None:
        self.log(INFO, msg, *args)

    def warning(self, msg: str, *args: Any) -> None:
        self.log(WARNING, msg, *args)

    def error(self, msg: str, *args: Any) -> None:
        self.log(ERROR, msg, *args)


log = AgentLog()
