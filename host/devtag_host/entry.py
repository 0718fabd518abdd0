"""The ``devtag-host`` command: :func:`devtag_host.cli.main`, except that a
missing dependency of the host extra (``pip install devtag`` without
``[host]``) is one line saying what to install, not an import traceback.

cli.py loads the device model (defusedxml, jsonschema) as it is imported and
every verb's module (pycdlib, starlette, SQLAlchemy, os-traits, ...) as it
builds its parser: both happen before cli.main can map an error.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from .extras import missing_extra


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        from .cli import main as run  # loads the host extra: a missing library becomes one line below

        return run(argv)  # builds every verb's parser first: their modules load the extra too
    except ModuleNotFoundError as exc:
        message = missing_extra(exc)
        if message is None:
            raise
        sys.stderr.write(f"devtag-host: error: {message}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
