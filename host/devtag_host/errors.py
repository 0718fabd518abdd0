"""The kinds of failure devtag's library code reports.

Domain exceptions derive from one of these; the command line maps the kinds
to exit statuses (:func:`devtag_host.cli.exit_status`), HTTP handlers map
their own errors to status codes.  Nothing here knows about either.
"""


class DevtagError(Exception):
    """Something devtag could not do."""


class InputError(DevtagError):
    """The user asked for something impossible: bad XML, unknown domain, bad tag."""


class RuntimeFailure(DevtagError):
    """The request was fine but the system failed: libvirt down, disk full, ..."""


class Refused(DevtagError):
    """The request was fine and the system healthy, but the answer is no: no host fits, a rebuild is refused."""
