"""``devtag-host schedule`` and ``devtag-host rebuild-check``."""

from __future__ import annotations

import argparse
import json
import sys
import uuid as uuidlib
from typing import Any, Callable, Optional, Tuple, TypeVar

from ..errors import InputError
from ..placement_client import DEFAULT_URL, URL_ENV, PlacementClient, client_token, parse_version, service_url
from .client import NEWEST_MICROVERSION, OLDEST_MICROVERSION, check_instance_rebuild, schedule, summary
from .errors import NoValidHost
from .prefilter import ENVIRONMENT_VARIABLE, setting_from_environment
from .request import Image, build_request, flavor_from_json, image_from_json, query_path, trait_group

PLACEMENT_URL_ENV = URL_ENV
DEFAULT_PLACEMENT_URL = DEFAULT_URL
MAX_JSON_BYTES = 1024 * 1024
T = TypeVar("T")

_SCHEDULE_DESCRIPTION = f"""\
Build the placement request for booting IMAGE with FLAVOR and print the
GET /allocation_candidates query and the candidate hosts, best first.

The unnumbered group: VCPU, MEMORY_MB and DISK_GB (disk + ephemeral + swap)
from the flavor, its resources:CLASS=N overrides, its
trait:NAME=required|forbidden extra specs, the image's trait:NAME=required
properties and, with --image-metadata-prefilter, the traits of the image's
hw_disk_bus, hw_cdrom_bus, hw_video_model, hw_vif_model, hw_architecture and
hw_emulation_architecture (e.g. hw_disk_bus=scsi -> COMPUTE_STORAGE_BUS_SCSI).
Granular groups, as Nova reads them: the flavor's resourcesS:CLASS=N and
traitS:NAME=required|forbidden extra specs form group S (a number, or from
placement 1.33 any [A-Za-z0-9_-]{1, 64}); two or more groups need the extra
spec group_policy=none|isolate.

Ranking: the candidate that keeps the largest fraction of its capacity free,
in the tightest requested class, after placing the instance comes first; ties
by the mean over the requested classes, then provider UUID.

Microversion: the newest the service advertises (GET /), up to 1.39, or
--microversion.  Forbidden traits go into the query as required=!TRAIT
(1.22+), except those placement has never heard of (no provider can have
them: they are left out, with an INFO line), and granular groups as
resourcesS/requiredS/group_policy (1.25+, string suffixes 1.33+).  Against
a service older than 1.22, forbidden traits are checked here against the candidates' provider traits and the hosts
dropped for them are listed; granular groups are refused (exit 1) rather than
merged.  If the service answers 406 to the advertised version, the query is
asked again at 1.17 when it needs nothing newer.

FLAVOR is Nova's flavor JSON (vcpus, ram, disk, ephemeral, swap, extra_specs
or OSC's properties); IMAGE is Glance's image JSON (properties at top level or
in "properties").  The prefilter is off unless --image-metadata-prefilter or
${ENVIRONMENT_VARIABLE}=1.
"""

_SCHEDULE_EPILOG = """\
example:
  echo '{"name": "m1.small", "vcpus": 1, "ram": 512, "disk": 1,
         "extra_specs": {"trait:HW_CPU_X86_AVX2": "required"}}' > flavor.json
  echo '{"name": "debian", "hw_disk_bus": "scsi", "hw_vif_model": "e1000"}' > image.json
  devtag-host schedule --flavor flavor.json --image image.json --image-metadata-prefilter

exit status: 0 candidates found, 3 no valid host, 2 bad input (file, JSON, property, conflict),
1 placement unreachable, failing, or too old for the request (granular groups need 1.25)
"""

_REBUILD_DESCRIPTION = """\
The rebuild pre-flight: may INSTANCE (a placement consumer UUID) be rebuilt
with IMAGE where it is?  Collects the traits of every provider in the
instance's allocations and of their whole provider trees (in_tree), and
refuses, naming the missing traits, when the image requires one they lack.
With --flavor, a trait the flavor forbids and the image requires is refused
too.  The prefilter option applies as for 'schedule' (Nova skips it on
rebuild; devtag checks both image traits and prefilter traits).
"""

_REBUILD_EPILOG = """\
exit status: 0 accepted, 3 refused, 2 bad input, 1 placement unreachable or failing
"""


def register(commands: argparse._SubParsersAction) -> None:
    schedule = commands.add_parser(
        "schedule",
        help="print the placement query and ranked candidate hosts for a flavor and an image",
        description=_SCHEDULE_DESCRIPTION,
        epilog=_SCHEDULE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    schedule.add_argument("--flavor", metavar="F.json", required=True, help="the flavor ('-' for stdin)")
    schedule.add_argument("--image", metavar="I.json", help="the image (default: no properties)")
    _placement_options(schedule)
    schedule.add_argument("--limit", type=_positive, metavar="N", help="show the best N candidates")
    schedule.add_argument(
        "--microversion",
        type=_microversion,
        metavar="X.Y",
        help="ask placement at this microversion (1.17 to 1.39; default: the newest the service advertises)",
    )
    schedule.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    schedule.set_defaults(handler=_cmd_schedule)

    rebuild = commands.add_parser(
        "rebuild-check",
        help="may an instance be rebuilt with a new image on its current providers?",
        description=_REBUILD_DESCRIPTION,
        epilog=_REBUILD_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rebuild.add_argument("instance", metavar="INSTANCE", help="the instance's consumer UUID in placement")
    rebuild.add_argument("--image", metavar="I.json", required=True, help="the new image ('-' for stdin)")
    rebuild.add_argument("--flavor", metavar="F.json", help="the instance's flavor (checks its forbidden traits)")
    _placement_options(rebuild)
    rebuild.set_defaults(handler=_cmd_rebuild_check)


def _placement_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--placement-url", metavar="URL", help=f"default: ${PLACEMENT_URL_ENV}, else {DEFAULT_PLACEMENT_URL}"
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="X-Auth-Token from FILE (default: for a service on loopback, the token "
        "'placement serve' generated, if readable; else 'admin')",
    )
    prefilter = parser.add_mutually_exclusive_group()
    prefilter.add_argument(
        "--image-metadata-prefilter",
        dest="prefilter",
        action="store_true",
        default=None,
        help=f"require the traits of the image's device-model properties (default: ${ENVIRONMENT_VARIABLE}, else off)",
    )
    prefilter.add_argument(
        "--no-image-metadata-prefilter",
        dest="prefilter",
        action="store_false",
        help=f"do not (whatever ${ENVIRONMENT_VARIABLE} says)",
    )


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _microversion(text: str) -> Tuple[int, int]:
    version = parse_version(text)
    if version is None or not OLDEST_MICROVERSION <= version <= NEWEST_MICROVERSION:
        raise argparse.ArgumentTypeError(f"expected a version from 1.17 to 1.39, got {text[:20]!r}")
    return version


def read_json(path: str, option: str) -> Any:
    """A JSON document from a file ('-': stdin), with one-line errors naming the option."""
    try:
        if path == "-":
            text = sys.stdin.read(MAX_JSON_BYTES + 1)
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{option} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(f"{option} {path}: not UTF-8 text") from None
    if len(text) > MAX_JSON_BYTES:
        raise InputError(f"{option} {path}: larger than {MAX_JSON_BYTES} bytes")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{option} {path}: invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def load(path: str, option: str, parse: Callable[[Any], T]) -> T:
    """Read and parse a flavor or image file; errors in its content name the file too."""
    data = read_json(path, option)
    try:
        return parse(data)
    except InputError as exc:
        raise type(exc)(f"{option} {path}: {exc}") from None


def prefilter_enabled(flag: Optional[bool]) -> bool:
    return setting_from_environment() if flag is None else flag


def _client(args: argparse.Namespace) -> Any:

    url = service_url(args.placement_url)
    return PlacementClient(url, client_token(args.token_file, url))


def _cmd_schedule(args: argparse.Namespace) -> None:
    flavor = load(args.flavor, "--flavor", flavor_from_json)
    image = load(args.image, "--image", image_from_json) if args.image else Image("image", {})
    request = build_request(flavor, image, prefilter=prefilter_enabled(args.prefilter))
    result = schedule(_client(args), request, limit=args.limit, microversion=args.microversion)
    if args.json:
        sys.stdout.write(json.dumps(summary(result), indent=2) + "\n")
    else:
        _print_schedule(result)
    if not result.ranking.candidates:
        raise NoValidHost("no valid host: no candidate satisfies the request")


def _shown(text: str) -> str:
    """A provider name as the terminal shows it: control characters escaped (names are anyone's input)."""
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


def _print_schedule(result: Any) -> None:
    group = result.request.group
    out = sys.stdout
    version = "{}.{}".format(*result.microversion)
    out.write(f"query (placement {version}): GET {query_path(result.query)}\n")
    if group.required:
        listed = ", ".join(f"{name} ({origin})" for name, origin in group.required.items())
        out.write(f"required: {listed}\n")
    if group.forbidden:
        listed = ", ".join(sorted(group.forbidden))
        if result.forbidden_filtered_client_side:
            out.write(f"forbidden (checked against the candidates' traits; placement {version} has no !TRAIT): ")
        else:
            out.write("forbidden (in the query): ")
        out.write(f"{listed}\n")
    for uuid, names in sorted(result.ranking.excluded.items()):
        out.write(f"excluded: {_shown(result.name(uuid))} ({uuid}) has forbidden {', '.join(names)}\n")
    if not result.ranking.candidates:
        out.write("candidates: none\n")
        return
    out.write("candidates (most free capacity of the requested classes after placing first):\n")
    for index, candidate in enumerate(result.ranking.candidates, start=1):
        free = ", ".join(f"{name} {value:.0%}" for name, value in candidate.free_after.items())
        out.write(f"{index:3d}. {_shown(result.name(candidate.host))} ({candidate.host})  free after: {free}\n")
        if len(candidate.allocations) > 1 or candidate.host not in candidate.allocations:
            for uuid, resources in candidate.allocations.items():
                amounts = ", ".join(f"{name}:{amount}" for name, amount in sorted(resources.items()))
                out.write(f"       {amounts} from {_shown(result.name(uuid))}\n")


def _cmd_rebuild_check(args: argparse.Namespace) -> None:
    try:
        instance = str(uuidlib.UUID(args.instance))
    except ValueError:
        raise InputError(f"INSTANCE {args.instance[:60]!r} is not a UUID") from None
    image = load(args.image, "--image", image_from_json)
    flavor = load(args.flavor, "--flavor", flavor_from_json) if args.flavor else None
    group = trait_group(image, flavor, prefilter=prefilter_enabled(args.prefilter))
    verdict = check_instance_rebuild(_client(args), instance, group)
    verdict.raise_if_refused()
    print(verdict.message())
