"""``devtag-agent``: publish a VM's device role tags through udev, and look them up.

Verbs and exit status:

* ``apply``: 0 state written and published, 1 no usable metadata (previous
  state kept), 3 system error (cannot write /run/devtag, udevadm failed, lock
  held too long), 4 state written and published but some tagged entries
  resolved to no device (each logged as ``unmatched``; invalid entries and
  untagged ones are warnings only).  The boot units and cloud-init's bootcmd
  count 4 as success: the tags that resolved are published.
* ``lookup TAG`` / ``list``: 0 found, 1 nothing matches (or apply never ran).
* ``prune``: 0 (drops detached devices from the state).
* ``check``: 0 udev's properties and links match the state, 1 problems.
* ``validate FILE``: 0 valid, 1 invalid, 2 unreadable.
* 2 for usage errors everywhere.
"""

from __future__ import annotations

import os
import sys
import time

import devtag_schema

from . import jsoncodec, spawn
from .agentlog import DEBUG, ERROR, INFO, WARNING, log
from .apply import apply_document, prune
from .check import check_published
from .encoding import encode_name
from .lookup import NoState, list_devices, lookup
from .publish import Publisher, PublishError
from .sources import (
    DEFAULT_METADATA_URL,
    SOURCES,
    SourceError,
    fetch_document,
    load_json,
    local_sources,
    read_bounded,
    read_file,
)
from .state import Database
from .sysfs import System
from .unit_argv import parse_unit_argv

TYPE_CHECKING = False  # typing is for the type checker only: importing it costs every run (docs/agent.md, "Boot cost")
if TYPE_CHECKING:
    import argparse
    from typing import Any, List, Optional, Sequence


UNRESOLVED = 4  # apply: published, but some tagged entries resolved to no device


def _start_if_unpublished(system: System, unit: str) -> None:
    """``systemctl --no-block start UNIT`` when no tags are published (what the boot unit's ExecStartPost did).

    One process where the unit had a shell and systemctl (docs/agent.md, "Boot cost").  Its failure is
    logged, not the apply's: the state is what it is either way.
    """
    if Database(system).read_index() is not None:
        return
    systemctl = os.environ.get("DEVTAG_AGENT_SYSTEMCTL")
    if system.root != "/" and not systemctl:
        log.info("nothing published; --root %s is not the running system: not starting %s", system.root, unit)
        return
    log.info("nothing published: starting %s", unit)
    argv = [*(systemctl.split() if systemctl else ["systemctl"]), "--no-block", "start", unit]
    try:
        done = spawn.run(argv, timeout=30)
    except OSError as exc:  # cannot start, or spawn.CommandTimeout
        log.warning("cannot start %s: %s", unit, exc)
        return
    if done.returncode != 0:
        log.warning("cannot start %s: %s", unit, (done.stderr or done.stdout).strip() or f"exit {done.returncode}")


def _validate(name: str) -> int:
    try:
        data = read_bounded(name, sys.stdin.fileno()) if name == "-" else read_bounded(name)
        document = load_json(data, name)
    except (OSError, SourceError) as exc:
        sys.stderr.write(f"devtag-agent: error: cannot read {name}: {exc}\n")
        return 2
    reasons = devtag_schema.describe_errors(document)
    if reasons:
        for reason in reasons:
            sys.stderr.write(f"devtag-agent: invalid: {reason}\n")
        return 1
    return 0


def _sources(text: str) -> List[str]:
    names = list(SOURCES) if text == "auto" else [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in SOURCES]
    if unknown or not names:
        raise ValueError(f"unknown source {', '.join(unknown) or text!r}; use auto or {', '.join(SOURCES)}")
    return names


def _apply(args: Any) -> int:
    try:
        sources = _sources(args.source)
    except ValueError as exc:
        sys.stderr.write(f"devtag-agent: error: {exc}\n")
        return 2
    system = System(args.root)
    explicit_url = args.metadata_url or os.environ.get("DEVTAG_AGENT_METADATA_URL")
    url = explicit_url or DEFAULT_METADATA_URL
    if system.root != "/" and not explicit_url and "metadata" in sources:
        # An image builder's --root: 169.254.169.254 would be the build host's own metadata.
        log.info("metadata: skipped under --root %s (give --metadata-url to ask one)", system.root)
        sources.remove("metadata")
        if not sources:
            sys.stderr.write("devtag-agent: error: --source metadata under --root needs --metadata-url\n")
            return 2
    database = Database(system)
    # Tags already published this boot: the second pass only looks for a changed local copy.
    refresh_only = args.second_pass and database.read_index() is not None
    if refresh_only:
        sources = local_sources(sources)
    try:
        database.mark_started()  # from now on the hot-plug rule starts an apply for each new device
    except OSError as exc:
        log.error("%s", exc)
        return 3
    publisher = Publisher(enabled=not args.no_trigger, root=system.root)
    waited_for = _device_path(system, args.wait_for_device) if args.wait_for_device else None
    deadline = time.monotonic() + max(0.0, args.wait)
    pause = 0.2
    while True:
        try:
            if args.from_file:
                source, document = args.from_file, read_file(args.from_file)
            else:
                source, document = fetch_document(system, sources, url)
        except SourceError as exc:
            if refresh_only:
                log.info("%s; the tags published earlier this boot stay", exc)
                return 0
            log.error("%s; previous state kept", exc)
            return 1
        try:
            report = apply_document(system, document, source, publisher, keep_unchanged=args.second_pass)
        except ValueError as exc:  # the document as a whole is unusable
            log.error("%s: %s; previous state kept", source, exc)
            return 1
        except (OSError, TimeoutError, PublishError) as exc:
            log.error("%s", exc)
            return 3
        if waited_for is None or any(record["syspath"] == waited_for for record in report.tagged):
            break
        if time.monotonic() + pause > deadline:
            log.info("%s: no tag for %s after %.0f s: an untagged device", source, waited_for, args.wait)
            break
        log.info("%s: no tag for %s yet; reading again in %.1f s", source, waited_for, pause)
        time.sleep(pause)
        pause = min(pause * 2, 2.0)
    if args.json:
        sys.stdout.write(jsoncodec.dumps(report.to_dict(), indent=2))
        sys.stdout.write("\n")
    if report.unchanged:
        return 0
    log.info(
        "applied %s: %d device(s) tagged, %d entr%s unmatched, %d invalid, %s",
        source,
        len(report.tagged),
        len(report.unmatched),
        "y" if len(report.unmatched) == 1 else "ies",
        len(report.invalid),
        _triggered_text(len(report.triggered), publisher, args),
    )
    if report.unresolved_tagged:
        log.warning(
            "%d tagged entr%s resolved to no device (exit status %d)",
            report.unresolved_tagged,
            "y" if report.unresolved_tagged == 1 else "ies",
            UNRESOLVED,
        )
        return UNRESOLVED
    return 0


def _triggered_text(count: int, publisher: object, args: Any) -> str:
    """What happened to the changed devices: re-triggered, or why not (no udevadm ran)."""
    if getattr(publisher, "trigger_enabled", False):
        seconds = getattr(publisher, "trigger_seconds", None)
        settled = f" (udev settled them in {seconds:.2f} s)" if count and seconds is not None else ""
        return f"{count} device(s) re-triggered{settled}"
    if args.no_trigger:
        why = "--no-trigger"
    elif args.root != "/":
        why = f"--root {args.root} is not the running system; DEVTAG_AGENT_UDEVADM names a udevadm to run there"
    else:
        why = "udevd is not running"
    return f"{count} changed device(s) not re-triggered ({why}): state written only"


def _device_path(system: System, given: str) -> str:
    """The in-machine sysfs path of ``given``: systemd's ``%I`` of a device unit
    drops the leading slash, and the path may go through /sys/block or /sys/class links."""
    path = given if given.startswith("/") else "/" + given
    return system.realpath(path)


def _show(devices: list, as_json: bool, with_tags: bool) -> None:
    """Print devices; tags appear \\xNN-encoded as udev shows them (JSON: \\u escapes), never raw."""
    if as_json:
        sys.stdout.write(jsoncodec.dumps([d.to_dict() for d in devices], indent=2))
        sys.stdout.write("\n")
        return
    for device in devices:
        target = device.devnode if device.type == "disk" else device.ifname
        if with_tags:
            sys.stdout.write(f"{device.type}\t{target}\t{' '.join(encode_name(t) for t in device.tags)}\n")
        else:
            sys.stdout.write(f"{target}\n")


def _lookup(args: Any, tag: Optional[str]) -> int:
    try:
        devices = lookup(tag, args.type, args.root) if tag is not None else list_devices(args.root, args.type)
    except NoState as exc:
        sys.stderr.write(f"devtag-agent: {exc}\n")
        return 1
    _show(devices, args.json, with_tags=tag is None)
    if not devices:
        what = f"tag {tag!r}" if tag is not None else "any tag"
        sys.stderr.write(f"devtag-agent: no {args.type or 'device'} carries {what}\n")
        return 1
    return 0


def _check(args: Any) -> int:
    try:
        checked, problems = check_published(args.root)
    except NoState as exc:
        sys.stderr.write(f"devtag-agent: {exc}\n")
        return 1
    for problem in problems:
        sys.stdout.write(f"problem: {problem}\n")
    sys.stdout.write(f"{checked} tagged device(s) checked, {len(problems)} problem(s)\n")
    return 1 if problems else 0


def _prune(args: Any) -> int:
    system = System(args.root)
    try:
        prune(system, Publisher(enabled=False, root=system.root))
    except (OSError, TimeoutError) as exc:
        log.error("%s", exc)
        return 3
    return 0


def _setup_logging(verbose: int, quiet: bool) -> None:
    """Records to stderr as ``devtag-agent: LEVEL: message``, without importing logging (agentlog.py)."""
    level = ERROR if quiet else (DEBUG if verbose > 1 else INFO if verbose else WARNING)
    if os.environ.get("INVOCATION_ID") and not quiet and verbose == 0:
        level = INFO  # under systemd: the journal gets the summary
    log.to_stderr(level)


def build_parser(verbs: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The command line's parser, with the subparsers of ``verbs`` only (all by default): cli_parser's."""
    from . import cli_parser  # argparse: not on the units' path (unit_argv)

    return cli_parser.build_parser(cli_parser.VERBS if verbs is None else verbs)


def parse_arguments(argv: Sequence[str]) -> Any:
    """The command line's values: the units' own command lines without argparse (unit_argv), any other by it."""
    fast = parse_unit_argv(argv)
    if fast is not None:
        return fast
    from . import cli_parser  # argparse: not on the units' path (unit_argv)

    return cli_parser.build_parser(cli_parser.verbs_to_build(argv)).parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    args = parse_arguments(argv)
    _setup_logging(args.verbose, args.quiet)
    if args.command == "validate":
        return _validate(args.file)
    if args.command == "apply":
        code = _apply(args)
        if args.start_if_unpublished and code in (0, 1, UNRESOLVED):
            _start_if_unpublished(System(args.root), args.start_if_unpublished)
        return code
    if args.command == "lookup":
        return _lookup(args, args.tag)
    if args.command == "list":
        return _lookup(args, None)
    if args.command == "prune":
        return _prune(args)
    if args.command == "check":
        return _check(args)
    return 2  # pragma: no cover - argparse enforces a command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
