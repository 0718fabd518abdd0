"""The two kinds of failure the CLI distinguishes (exit 2 and exit 1)."""


class DevtagError(Exception):
    exit_code = 1


class InputError(DevtagError):
    """The user asked for something impossible: bad XML, unknown domain, bad tag."""

    exit_code = 2


class RuntimeFailure(DevtagError):
    """The request was fine but the system failed: libvirt down, disk full, ..."""

    exit_code = 1
