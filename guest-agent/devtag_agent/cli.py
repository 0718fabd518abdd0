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

import argparse
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Any, List, Optional, Sequence, Set

import devtag_schema

from . import __version__
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

log = logging.getLogger("devtag_agent")


UNRESOLVED = 4  # apply: published, but some tagged entries resolved to no device


def _start_if_unpublished(system: System, unit: str) -> None:
    """``systemctl --no-block start UNIT`` when no tags are published: the boot's first pass pulls in the second.

    Its failure is logged, not the apply's: the state is what it is either way.
    """
    if Database(system).read_index() is not None:
        return
    systemctl = os.environ.get("DEVTAG_AGENT_SYSTEMCTL")
    if system.root != "/" and not systemctl:
        log.info("nothing published; --root %s is not the running system: not starting %s", system.root, unit)
        return
    log.info("nothing published: starting %s", unit)
    argv = [*(shlex.split(systemctl) if systemctl else ["systemctl"]), "--no-block", "start", unit]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as exc:  # cannot start, or timed out (then killed)
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
    # A hot-plugged virtiofs device shows no mount tag: wait for a tagged share the state did not have.
    shares_before = _share_tags(database) if waited_for is not None and system.is_virtiofs(waited_for) else None
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
        if shares_before is not None and {record["tag"] for record in report.shares} - shares_before:
            break
        if time.monotonic() + pause > deadline:
            log.info("%s: no tag for %s after %.0f s: an untagged device", source, waited_for, args.wait)
            break
        log.info("%s: no tag for %s yet; reading again in %.1f s", source, waited_for, pause)
        time.sleep(pause)
        pause = min(pause * 2, 2.0)
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2))
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


def _share_tags(database: Database) -> Set[str]:
    """Mount tags of the shares in the current state."""
    return {record["tag"] for record in (database.read_index() or {}).get("shares", [])}


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
        sys.stdout.write(json.dumps([d.to_dict() for d in devices], indent=2))
        sys.stdout.write("\n")
        return
    for device in devices:
        # A mount tag as udev shows names: \xNN for white space and controls (none in a usable tag).
        share = encode_name(device.mount_tag or "")
        target = {"disk": device.devnode, "nic": device.ifname}.get(device.type, share)
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


def reset_logging() -> None:
    """Undo :func:`_setup_logging`: the "devtag_agent" logger as a library user finds it."""
    for handler in [h for h in log.handlers if getattr(h, "devtag_cli", False)]:
        log.removeHandler(handler)
    log.setLevel(logging.NOTSET)


def _setup_logging(verbose: int, quiet: bool) -> None:
    """Records to stderr as ``devtag-agent: LEVEL: message``; under systemd the journal gets the summary."""
    level = logging.ERROR if quiet else (logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)
    if os.environ.get("INVOCATION_ID") and not quiet and verbose == 0:
        level = logging.INFO
    reset_logging()  # a previous main() in this process
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("devtag-agent: %(levelname)s: %(message)s"))
    handler.devtag_cli = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(level)


EPILOG = """\
how tags reach applications:
  apply writes /run/devtag/ atomically; the static rule 70-devtag.rules imports
  it at event time and sets, per tagged device:
    DEVTAG_TAGS=<encoded tags, space separated>   DEVTAG_TAG_<encoded tag>=1
    disks: /dev/disk/by-tag/<encoded tag> and /dev/disk/by-tag/<encoded tag>-part<N>
    NICs: the tag as interface altname when it is a valid, non-kernel-like name
  Encoding: characters other than [A-Za-z0-9#+-.:=@_] and printable non-ASCII
  become \\xNN per UTF-8 byte (udev's *_ENC convention); see the guide
  /usr/share/doc/devtag-agent/agent.md (docs/agent.md in the source).

examples:
  devtag-agent apply                      # at boot: config drive, metadata service, cloud-init
  devtag-agent lookup squidcache --type disk
  mkfs.ext4 "$(devtag-agent lookup oracledb --type disk)"
  devtag-agent list --json
  mount -t virtiofs "$(devtag-agent lookup build-cache --type share)" /mnt

shares (virtiofs) by role: one line per mount in /etc/devtag/shares.conf,
  ROLE MOUNTPOINT [OPTIONS]          e.g.  build-cache /var/cache/build ro
  Each apply writes a mount unit for it to /run/systemd/system and starts it
  once the role is on a share (a share attached later: within seconds).
"""


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    parser = argparse.ArgumentParser(
        prog="devtag-agent",
        description="Guest agent of devtag: publishes the device role tags of this VM's NICs and disks "
        "through udev (properties, /dev/disk/by-tag links, interface altnames) and looks devices up by tag. "
        "Exit status: 0 success, 1 nothing matches / no usable metadata, 2 usage, 3 system error, "
        "4 (apply) some tagged entries resolved to no device.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version="%(prog)s " + __version__)
    parser.add_argument(
        "--root", default="/", metavar="DIR", help="resolve every path (/sys, /dev, /run) under DIR (default: /)"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="log errors only")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for add in (_add_apply, _add_lookup, _add_list, _add_check, _add_prune, _add_validate):
        add(commands)
    return parser


def _add_verb(commands: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A verb's subparser; --root is accepted after the verb too (devtag-agent apply --root DIR)."""
    verb: argparse.ArgumentParser = commands.add_parser(name, **kwargs)
    verb.add_argument("--root", default=argparse.SUPPRESS, metavar="DIR", help="as above: resolve paths under DIR")
    return verb


def _add_apply(commands: Any) -> None:
    apply = _add_verb(
        commands,
        "apply",
        help="read the metadata, resolve devices through sysfs, publish tags through udev",
        description="Read the devices metadata, validate it against the devtag schema (bad entries are "
        "skipped), find each device through sysfs, write the state database under /run/devtag atomically "
        "and re-trigger exactly the devices whose tags changed. Exit 0 applied, 1 no usable metadata "
        "(previous state kept), 3 system error, 4 applied but some tagged entries resolved to no device "
        "(logged as 'unmatched'; the rest is published).",
    )
    apply.add_argument(
        "--source",
        default="auto",
        metavar="SOURCES",
        help="auto (= fwcfg,configdrive,metadata,instance-data) or a comma-separated order of "
        "fwcfg, configdrive, metadata, instance-data (default: auto)",
    )
    apply.add_argument("--metadata-url", default=None, metavar="URL", help="metadata service URL of meta_data.json")
    apply.add_argument("--from-file", metavar="FILE", help="read this meta_data.json / devices document instead")
    apply.add_argument(
        "--no-trigger",
        action="store_true",
        help="write the state only: no udevadm trigger, no altnames (under a --root other than /, each "
        "happens only if DEVTAG_AGENT_UDEVADM / DEVTAG_AGENT_IP name the command, split on whitespace)",
    )
    apply.add_argument("--json", action="store_true", help="print a JSON report of what was done")
    apply.add_argument(
        "--wait-for-device",
        metavar="SYSPATH",
        help="hot-plug: the new device (its /sys/devices/... path). The host records a new device's tag "
        "a moment after the guest sees the device, so until the document tags this device (a virtiofs "
        "device: until it lists a tagged share the state did not have), read the sources again (backing "
        "off) for up to --wait seconds; an untagged device just costs the wait",
    )
    apply.add_argument(
        "--second-pass",
        action="store_true",
        help="the boot's second pass (devtag-agent-network.service, after cloud-init's network stage): if an "
        "earlier apply of this boot published tags, read only the sources that need no network and change "
        "nothing unless the outcome differs (exit 0 either way); if none did, read every given source",
    )
    apply.add_argument(
        "--start-if-unpublished",
        type=_unit_name,
        metavar="UNIT",
        help="when this apply ends (exit 0, 1 or 4) and no tags are published (no /run/devtag/current), "
        "start UNIT without waiting for it (systemctl --no-block start): the boot's first pass pulls in the "
        "second, devtag-agent-network.service, this way. Under a --root other than / only if "
        "DEVTAG_AGENT_SYSTEMCTL names the command",
    )
    apply.add_argument(
        "--wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="with --wait-for-device: how long to keep re-reading (default: 10)",
    )


def _add_lookup(commands: Any) -> None:
    lookup = _add_verb(
        commands,
        "lookup",
        help="print the device(s) carrying a tag",
        description="Print the device(s) carrying TAG: the device node for disks, the interface name for NICs, "
        "the virtiofs mount tag for shares (mount -t virtiofs TAG DIR), one per line; --json for everything "
        "(links, sysfs path, MAC, serial, share id). Exit 1 when nothing matches.",
    )
    lookup.add_argument("tag", metavar="TAG")
    lookup.add_argument("--type", choices=("nic", "disk", "share"), help="only NICs, disks or shares")
    lookup.add_argument("--json", action="store_true", help="JSON list of device objects")


def _add_list(commands: Any) -> None:
    listing = _add_verb(
        commands,
        "list",
        help="list every tagged device",
        description="List every tagged device: type, device node, interface or share mount tag, tags "
        "(\\xNN-encoded). Exit 1 when there is none.",
    )
    listing.add_argument("--type", choices=("nic", "disk", "share"), help="only NICs, disks or shares")
    listing.add_argument("--json", action="store_true", help="JSON list of device objects")


def _add_check(commands: Any) -> None:
    _add_verb(
        commands,
        "check",
        help="cross-check udev's properties and /dev/disk/by-tag links against the state",
        description="For every tagged device, check that udev holds DEVTAG_TAGS and DEVTAG_TAG_<name>=1 and that "
        "every /dev/disk/by-tag link points at the device. Exit 0 consistent, 1 problems (printed) or no state.",
    )


def _add_prune(commands: Any) -> None:
    _add_verb(
        commands,
        "prune",
        help="drop detached devices from the state (run when a device goes away)",
        description="Remove devices that no longer exist from the state database.",
    )


def _add_validate(commands: Any) -> None:
    """``validate`` takes no --root: it reads a file, not the machine."""
    validate = commands.add_parser(
        "validate",
        help="check a devices / meta_data.json document against the devtag schema",
        description="Check a JSON document (a devices document or an OpenStack meta_data.json) "
        "against the device-role-tagging schema. Exit 0 if valid, 1 if not, 2 if unreadable.",
    )
    validate.add_argument("file", metavar="FILE", nargs="?", default="-", help="JSON file ('-': stdin)")


_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]{1,247}\.(service|target)\Z")


def _unit_name(text: str) -> str:
    """``--start-if-unpublished``'s value: a service or target unit name (an argument of systemctl:
    no option, no path, no glob, no space), or a usage error."""
    if text.startswith("-") or not _UNIT_NAME.match(text):
        raise argparse.ArgumentTypeError(f"not a service or target unit name: {text!r}")
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    args = build_parser().parse_args(argv)
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
