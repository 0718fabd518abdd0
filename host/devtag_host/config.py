"""The host's configuration file, ``/etc/devtag/devtag.conf``: one INI file for every service.

Each setting is one :class:`Option` in :data:`OPTIONS`: its section and name,
the ``DEVTAG_*`` environment variable and the command-line flags it stands
for, its default and its help.  The commented sample shipped in the packages
is :func:`sample` of that list, so the two cannot drift apart.

Precedence, highest first: a flag, the environment variable, the file, the
default.  :func:`apply` does it without the verbs knowing: a flag's default
becomes the environment's or the file's value, and a setting read from the
environment by the code (``DEVTAG_STATE_DIR``, ...) is exported from the file
when the environment does not set it.  ``DEVTAG_CONFIG`` or ``--config FILE``
name another file.  Sections and names follow OpenStack's where one exists
(``[placement_database] connection``, ``[api] auth_strategy``, ...) so that an
operator's ``placement.conf`` mostly carries over; upstream's spellings of the
same setting are accepted as aliases.
"""

from __future__ import annotations

import argparse
import configparser
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, MutableMapping, Optional, Sequence, Tuple

from .errors import InputError

DEFAULT_PATH = Path("/etc/devtag/devtag.conf")
CONFIG_ENV = "DEVTAG_CONFIG"
MAX_FILE_BYTES = 1024 * 1024
# Sections of an upstream placement.conf that devtag reads nothing from: no warning for them.
FOREIGN_SECTIONS = frozenset({"keystone_authtoken", "oslo_policy", "oslo_middleware", "oslo_concurrency", "cors"})

Verb = Tuple[str, ...]


def _text(value: str) -> Any:
    return value


def _positive_int(value: str) -> Any:
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None
    if number < 1:
        raise ValueError(f"{value!r} is not a positive integer")
    return number


def _integer(value: str) -> Any:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None


def _positive_float(value: str) -> Any:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None
    if not number > 0:
        raise ValueError(f"{value!r} is not a positive number")
    return number


def _boolean(value: str) -> Any:
    try:
        return configparser.ConfigParser.BOOLEAN_STATES[value.strip().lower()]
    except KeyError:
        raise ValueError(f"{value!r} is not a boolean (true/false, yes/no, on/off, 1/0)") from None


def _negated(value: str) -> Any:
    """For ``--no-X`` flags: ``X = true`` is the flag's absence."""
    return not _boolean(value)


def _words(value: str) -> Any:
    """A list: comma- or line-separated (``listen = 10.0.0.1:80, [fe80::1%br0]:80``)."""
    return [word.strip() for line in value.splitlines() for word in line.split(",") if word.strip()]


def _one_of(*choices: str) -> Callable[[str], Any]:
    def check(value: str) -> Any:
        if value not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return value

    return check


@dataclass(frozen=True)
class Option:
    section: str
    name: str
    help: str
    default: str = ""  # as the sample shows it ("" : unset, the help says what happens)
    env: Optional[str] = None  # the DEVTAG_* variable of the same setting
    flags: Tuple[Tuple[Verb, str, str], ...] = ()  # (verb, argparse dest, flag) whose default it sets
    convert: Callable[[str], Any] = _text
    aliases: Tuple[Tuple[str, str], ...] = ()  # upstream's (section, name) of the same setting
    packaged: Optional[str] = None  # set in the file the packages ship (what their units used to pass)
    exported: bool = True  # a value from the file reaches the code through ``env`` too

    @property
    def key(self) -> str:
        return f"[{self.section}] {self.name}"


_SERVE: Verb = ("placement", "serve")
_REPORT: Verb = ("placement", "report")
_METADATA: Verb = ("metadata-server",)

OPTIONS: Tuple[Option, ...] = (
    Option(
        "DEFAULT",
        "state_dir",
        "Where devtag keeps its state: the embedded libvirt root, the SQLite databases, the node's "
        "compute_id. Unset: /var/lib/devtag for root, else $XDG_DATA_HOME/devtag.",
        env="DEVTAG_STATE_DIR",
        aliases=(("DEFAULT", "state_path"),),
    ),
    Option(
        "DEFAULT",
        "lock_dir",
        "Where devtag's per-domain lock files live. Unset: /run/lock/devtag for root, else a private "
        "per-user directory.",
        env="DEVTAG_LOCK_DIR",
        aliases=(("oslo_concurrency", "lock_path"),),
    ),
    Option(
        "DEFAULT",
        "host",
        "This compute node's name: the provider name 'placement report' uses and the host name of the "
        "attach verbs. Unset: the host name.",
        env="DEVTAG_HOST",
        flags=((_REPORT, "name", "--name"),),
    ),
    Option(
        "libvirt",
        "uri",
        "The libvirt URI of every verb without --connect. Unset: devtag's own embedded QEMU driver "
        "(qemu:///embed?root=<state_dir>/libvirt).",
        env="DEVTAG_LIBVIRT_URI",
        aliases=(("libvirt", "connection_uri"),),
    ),
    Option(
        "libvirt",
        "virt_type",
        "The domain type 'placement report' reads the capability traits for (qemu, kvm, xen, lxc, vz).",
        default="qemu",
        flags=((_REPORT, "virt_type", "--virt-type"),),
        convert=_one_of("qemu", "kvm", "xen", "lxc", "vz"),
    ),
    # -- the metadata server -----------------------------------------------------------------------
    Option(
        "metadata_server",
        "connect",
        "The libvirt URI the metadata server reads (read-only). Unset: [libvirt] uri.",
        env="DEVTAG_LIBVIRT_URI",
        flags=((_METADATA, "connect", "--connect"),),
        packaged="qemu:///system",
        exported=False,  # the other verbs keep [libvirt] uri
    ),
    Option(
        "metadata_server",
        "listen",
        "Where to listen, comma-separated, one listener per network: ADDR:PORT, [IPV6]:PORT, "
        "'169.254.169.254%br0:80' (bound to one interface). The address must exist on the host.",
        default="127.0.0.1:8775",
        env="DEVTAG_METADATA_LISTEN",
        flags=((_METADATA, "listen", "--listen"),),
        convert=_words,
        packaged="169.254.169.254:80",
    ),
    Option(
        "metadata_server",
        "proxy_shared_secret_file",
        "Trust Nova's metadata proxy headers signed with the secret in this file (and only them).",
        flags=((_METADATA, "proxy_shared_secret_file", "--proxy-shared-secret-file"),),
    ),
    Option(
        "metadata_server",
        "instance_data",
        "A directory of per-instance extras: DIR/<uuid>/{user_data,meta.json,public_keys,...}.",
        flags=((_METADATA, "instance_data", "--instance-data"),),
    ),
    Option(
        "metadata_server",
        "access_log",
        "Log each request, one JSON line on standard error.",
        default="true",
        flags=((_METADATA, "no_access_log", "--no-access-log"),),
        convert=_negated,
    ),
    Option(
        "metadata_server",
        "metrics_listen",
        "Serve Prometheus metrics at http://ADDR:PORT/metrics, a listener of their own. Unset: no metrics.",
        flags=((_METADATA, "metrics_listen", "--metrics-listen"),),
    ),
    Option(
        "metadata_server",
        "all_devices",
        "List every NIC and disk in meta_data.json (false: as Nova, tagged ones and NICs with a VLAN).",
        default="false",
        flags=((_METADATA, "all_devices", "--all-devices"),),
        convert=_boolean,
    ),
    # -- the placement service ---------------------------------------------------------------------
    Option(
        "placement_database",
        "connection",
        "The placement database, a SQLAlchemy URL: sqlite:////var/lib/devtag/placement.sqlite or "
        "postgresql://user@host/placement (several workers or hosts). Unset: placement.sqlite in state_dir.",
        env="DEVTAG_PLACEMENT_DB",
        flags=(
            (_SERVE, "db", "--db"),
            (("placement", "db-sync"), "db", "--db"),
            (("placement", "import"), "db", "--db"),
            (("placement", "export"), "db", "--db"),
        ),
    ),
    Option(
        "placement_database",
        "sync_on_startup",
        "Create or upgrade the schema when 'placement serve' starts.",
        default="true",
        flags=((_SERVE, "no_db_sync", "--no-db-sync"),),
        convert=_negated,
    ),
    Option(
        "placement",
        "listen",
        "Where 'placement serve' listens: ADDR:PORT, a host name, [IPV6]:PORT. Without a token file, loopback only.",
        default="127.0.0.1:8778",
        env="DEVTAG_PLACEMENT_LISTEN",
        flags=((_SERVE, "listen", "--listen"),),
    ),
    Option(
        "placement",
        "workers",
        "uvicorn worker processes (more than one: use PostgreSQL).",
        default="1",
        env="DEVTAG_PLACEMENT_WORKERS",
        flags=((_SERVE, "workers", "--workers"),),
        convert=_positive_int,
    ),
    Option(
        "placement",
        "auth_token_file",
        "Accept only the X-Auth-Token in this file. Unset: any token (the server then listens on loopback only).",
        env="DEVTAG_PLACEMENT_TOKEN_FILE",
        flags=((_SERVE, "auth_token_file", "--auth-token-file"),),
    ),
    Option(
        "placement",
        "request_timeout",
        "Close a connection whose request (request line, headers and body) takes longer than this many "
        "seconds to arrive.",
        default="10",
        env="DEVTAG_PLACEMENT_REQUEST_TIMEOUT",
        flags=((_SERVE, "request_timeout", "--request-timeout"),),
        convert=_positive_float,
        aliases=(("placement", "request_head_timeout"),),
    ),
    Option(
        "placement",
        "connections_per_source",
        "Answer 503 and close beyond this many open connections from one address.",
        default="64",
        env="DEVTAG_PLACEMENT_PER_SOURCE_LIMIT",
        flags=((_SERVE, "connections_per_source", "--connections-per-source"),),
        convert=_positive_int,
    ),
    Option(
        "placement",
        "any_token",
        "Accept any X-Auth-Token, as OpenStack's noauth2 (loopback only). Neither this nor auth_token_file: "
        "a token generated at first start into the state directory's placement-token.",
        default="false",
        env="DEVTAG_PLACEMENT_ANY_TOKEN",
        flags=((_SERVE, "any_token", "--any-token"),),
        convert=_boolean,
    ),
    Option(
        "placement",
        "allowed_hosts",
        "Also answer requests whose Host header is one of these names (comma-separated DNS names clients use).",
        env="DEVTAG_PLACEMENT_ALLOWED_HOSTS",
        flags=((_SERVE, "allowed_host", "--allowed-host"),),
        convert=_words,
    ),
    Option(
        "placement",
        "request_log",
        "Log each request, one JSON line on standard error.",
        default="true",
        flags=((_SERVE, "no_request_log", "--no-request-log"),),
        convert=_negated,
    ),
    Option(
        "placement",
        "metrics_listen",
        "Serve Prometheus metrics at http://ADDR:PORT/metrics, a listener of their own (one worker only). "
        "Unset: no metrics.",
        flags=((_SERVE, "metrics_listen", "--metrics-listen"),),
    ),
    Option(
        "placement",
        "max_allocation_candidates",
        "The most allocation candidates one GET /allocation_candidates generates (-1: no limit), as upstream's option.",
        default="-1",
        env="DEVTAG_PLACEMENT_MAX_ALLOCATION_CANDIDATES",
        convert=_integer,
    ),
    Option(
        "placement",
        "allocation_candidates_generation_strategy",
        "Which candidates come first when max_allocation_candidates cuts the list: depth-first or "
        "breadth-first, as upstream's option.",
        default="depth-first",
        env="DEVTAG_PLACEMENT_ALLOCATION_CANDIDATES_GENERATION_STRATEGY",
        convert=_one_of("depth-first", "breadth-first"),
    ),
    Option(
        "placement",
        "randomize_allocation_candidates",
        "With limit, answer a random sample of the generated candidates, as upstream's option.",
        default="false",
        env="DEVTAG_PLACEMENT_RANDOMIZE_ALLOCATION_CANDIDATES",
        convert=_boolean,
    ),
    Option(
        "api",
        "auth_strategy",
        "How placement authenticates requests: noauth2 (X-Auth-Token: any token, or the one in "
        "[placement] auth_token_file) or keystone (keystonemiddleware's auth_token validates tokens "
        "against Keystone, set up in [keystone_authtoken]; the roles admin and service may use the API).",
        default="noauth2",
        flags=((_SERVE, "auth_strategy", "--auth-strategy"),),
        convert=_one_of("noauth2", "keystone"),
    ),
    # -- the compute node reporting to placement ---------------------------------------------------
    Option(
        "placement_client",
        "url",
        "The placement endpoint 'placement report' and the scheduling verbs talk to.",
        default="http://127.0.0.1:8778",
        env="DEVTAG_PLACEMENT_URL",
        flags=((_REPORT, "placement_url", "--placement-url"),),
    ),
    Option(
        "placement_client",
        "token_file",
        "The X-Auth-Token the clients send, from this file. Unset: 'admin'.",
        flags=((_REPORT, "token_file", "--token-file"),),
    ),
    Option(
        "compute",
        "report_interval",
        "'placement report' repeats every this many seconds. Unset: it reports once.",
        flags=((_REPORT, "interval", "--interval"),),
        convert=_positive_float,
    ),
    Option(
        "compute",
        "storage_pool",
        "The libvirt storage pool whose capacity is the node's DISK_GB.",
        flags=((_REPORT, "storage_pool", "--storage-pool"),),
    ),
    Option(
        "compute",
        "disk_path",
        "The file system whose capacity is the node's DISK_GB (without a storage pool).",
        flags=((_REPORT, "disk_path", "--disk-path"),),
    ),
    Option(
        "DEFAULT",
        "cpu_allocation_ratio",
        "VCPU overcommit of the node's inventory.",
        default="16.0",
        flags=((_REPORT, "cpu_allocation_ratio", "--cpu-allocation-ratio"),),
        convert=_positive_float,
    ),
    Option(
        "DEFAULT",
        "ram_allocation_ratio",
        "MEMORY_MB overcommit of the node's inventory.",
        default="1.5",
        flags=((_REPORT, "ram_allocation_ratio", "--ram-allocation-ratio"),),
        convert=_positive_float,
    ),
    Option(
        "DEFAULT",
        "disk_allocation_ratio",
        "DISK_GB overcommit of the node's inventory.",
        default="1.0",
        flags=((_REPORT, "disk_allocation_ratio", "--disk-allocation-ratio"),),
        convert=_positive_float,
    ),
    Option(
        "DEFAULT",
        "reserved_host_cpus",
        "VCPUs kept for the host.",
        default="0",
        flags=((_REPORT, "reserved_vcpus", "--reserved-vcpus"),),
        convert=_integer,
    ),
    Option(
        "DEFAULT",
        "reserved_host_memory_mb",
        "MEMORY_MB kept for the host.",
        default="512",
        flags=((_REPORT, "reserved_memory_mb", "--reserved-memory-mb"),),
        convert=_integer,
    ),
    Option(
        "DEFAULT",
        "reserved_host_disk_gb",
        "DISK_GB kept for the host.",
        default="0",
        flags=((_REPORT, "reserved_disk_gb", "--reserved-disk-gb"),),
        convert=_integer,
    ),
    # -- scheduling ---------------------------------------------------------------------------------
    Option(
        "scheduler",
        "image_metadata_prefilter",
        "Ask placement for the traits the image's properties need (hw_disk_bus, hw_vif_model, ...), as Nova's option.",
        default="false",
        env="DEVTAG_IMAGE_METADATA_PREFILTER",
        convert=_boolean,
    ),
    # -- attach -------------------------------------------------------------------------------------
    Option(
        "attach",
        "connection",
        "The attachment store, a SQLAlchemy URL. Unset: attach.sqlite in state_dir.",
        env="DEVTAG_ATTACH_DB",
    ),
    Option(
        "attach",
        "secrets_dir",
        "The root-only directory of the domains' display secrets. Unset: <state_dir>/secrets.",
        env="DEVTAG_ATTACH_SECRETS_DIR",
    ),
    Option(
        "attach",
        "storage_uri",
        "The libvirt URI of the storage pools volumes are created in. Unset: the domains' URI for a "
        "libvirt daemon, a private storage daemon in the state directory for an embedded driver.",
        env="DEVTAG_STORAGE_URI",
    ),
    Option(
        "attach",
        "storage_user",
        "The user QEMU runs as, who must read the volumes. Unset: libvirt-qemu for root.",
        env="DEVTAG_STORAGE_USER",
    ),
)

SECTION_TITLES: Dict[str, str] = {
    "DEFAULT": "Every verb of devtag-host",
    "libvirt": "libvirt",
    "metadata_server": "devtag-host metadata-server",
    "placement_database": "devtag-host placement serve / db-sync: the database",
    "placement": "devtag-host placement serve",
    "api": "devtag-host placement serve: authentication",
    "placement_client": "Clients of placement: placement report, schedule, ...",
    "compute": "devtag-host placement report (the compute node)",
    "scheduler": "Scheduling",
    "attach": "The attach verbs",
}


@dataclass
class Loaded:
    """The file's settings that devtag knows, by option, and warnings about the rest."""

    path: Optional[Path]
    values: Dict[Option, str]
    warnings: List[str]


def config_path(argv: Sequence[str], environ: Mapping[str, str]) -> Tuple[Optional[Path], bool]:
    """(the file to read, whether it was asked for): --config FILE, $DEVTAG_CONFIG, the default."""
    for index, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--config" and index + 1 < len(argv):
            return Path(argv[index + 1]), True
        if arg.startswith("--config="):
            return Path(arg.partition("=")[2]), True
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]), True
    return DEFAULT_PATH, False


def load(path: Optional[Path], required: bool) -> Loaded:
    """The file at ``path`` (absent and not ``required``: nothing set); bad syntax or values are InputError."""
    if path is None:
        return Loaded(None, {}, [])
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        if required:
            raise InputError(f"configuration file {path}: no such file") from None
        return Loaded(None, {}, [])
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read configuration file {path}: {exc}") from None
    if len(text) > MAX_FILE_BYTES:
        raise InputError(f"configuration file {path} is larger than {MAX_FILE_BYTES} bytes")
    return parse(text, path)


def parse(text: str, path: Path) -> Loaded:
    parser = configparser.ConfigParser(interpolation=None, default_section="\0none")
    try:
        parser.read_string(text, source=str(path))
    except configparser.Error as exc:
        raise InputError(f"configuration file {path}: {' '.join(str(exc).split())}") from None
    by_key = {(option.section, option.name): option for option in OPTIONS}
    for option in OPTIONS:
        for alias in option.aliases:
            by_key.setdefault(alias, option)
    values: Dict[Option, str] = {}
    warnings: List[str] = []
    for section in parser.sections():
        for name, value in parser.items(section):
            known = by_key.get((section, name))
            if known is None:
                if section not in FOREIGN_SECTIONS:
                    warnings.append(f"{path}: [{section}] {name}: not a devtag setting, ignored")
                continue
            if (section, name) != (known.section, known.name) and known in values:
                continue  # devtag's own name wins over upstream's alias
            values[known] = value.strip()
    for option, value in values.items():
        try:
            option.convert(value)
        except ValueError as exc:
            raise InputError(f"configuration file {path}: {option.key}: {exc}") from None
    return Loaded(path, values, warnings)


def apply(loaded: Loaded, parser: argparse.ArgumentParser, environ: MutableMapping[str, str]) -> None:
    """Make the environment's and the file's values the flags' defaults; export file values to
    the environment variables the code reads (where the environment does not set them)."""
    for option in OPTIONS:
        from_env = environ.get(option.env) if option.env else None
        from_file = loaded.values.get(option)
        raw = from_env if from_env else from_file
        if raw is None or (from_env and not option.flags):
            continue  # nothing set; or a variable only the code reads, which checks it in its own words
        try:
            value = option.convert(raw)
        except ValueError as exc:
            where = f"${option.env}" if from_env else f"configuration file {loaded.path}: {option.key}"
            raise InputError(f"{where}: {exc}") from None
        for verb, dest, _flag in option.flags:
            sub = _subparser(parser, verb)
            if sub is not None:
                sub.set_defaults(**{dest: value})
                for action in sub._actions:
                    if action.dest == dest:
                        action.required = False  # configured: the flag may be left out
        if option.env and option.exported and not from_env and from_file is not None:
            environ[option.env] = from_file


def _subparser(parser: argparse.ArgumentParser, verb: Verb) -> Optional[argparse.ArgumentParser]:
    current: Optional[argparse.ArgumentParser] = parser
    for word in verb:
        if current is None or current._subparsers is None:
            return None
        found = None
        for action in current._subparsers._group_actions:
            found = getattr(action, "choices", {}).get(word) or found
        current = found
    return current


class ReplacingAppend(argparse._AppendAction):
    """``append``, but the first flag replaces a configured default list instead of adding to it."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        if getattr(namespace, f"_{self.dest}_given", False) is False:
            setattr(namespace, self.dest, None)
            setattr(namespace, f"_{self.dest}_given", True)
        super().__call__(parser, namespace, values, option_string)


def sample() -> str:
    """The commented configuration file the packages ship: every option, its default, its help."""
    lines = [
        "# /etc/devtag/devtag.conf: the devtag host services' configuration.",
        "#",
        "# Precedence, highest first: a command-line flag, the DEVTAG_* environment",
        "# variable, this file, the default.  DEVTAG_CONFIG=FILE or devtag-host",
        "# --config FILE reads another file.  Generated by 'devtag-host config sample';",
        "# lines starting with '#' show the defaults.",
    ]
    sections: Dict[str, List[Option]] = {}
    for option in OPTIONS:
        sections.setdefault(option.section, []).append(option)
    for section, options in sections.items():
        lines += ["", f"[{section}]", f"# {SECTION_TITLES[section]}"]
        for option in options:
            lines.append("")
            lines += _comment(option.help)
            also = [f"${option.env}"] if option.env else []
            also += sorted({f"'{' '.join(verb)} {flag}'" for verb, _dest, flag in option.flags})
            also += [f"[{s}] {n}" for s, n in option.aliases]
            if also:
                lines += _comment("Also: " + ", ".join(also))
            if option.packaged is not None:
                lines.append(f"{option.name} = {option.packaged}")
            else:
                lines.append(f"#{option.name} = {option.default}".rstrip())
    return "\n".join(lines) + "\n"


def register(commands: argparse._SubParsersAction) -> None:
    config = commands.add_parser(
        "config",
        help="print the configuration file's sample or the settings in effect",
        description=f"devtag-host reads {DEFAULT_PATH} ($DEVTAG_CONFIG or --config FILE: another file). "
        "Precedence, highest first: a flag, the DEVTAG_* environment variable, the file, the default.",
    )
    verbs = config.add_subparsers(dest="config_command", metavar="VERB", required=True)
    verbs.add_parser("sample", help="print the commented sample (what the packages ship)").set_defaults(
        handler=_cmd_sample
    )
    verbs.add_parser("show", help="print each setting in effect and where it comes from").set_defaults(
        handler=_cmd_show
    )


def _cmd_sample(_args: argparse.Namespace) -> None:
    print(sample(), end="")


def _cmd_show(args: argparse.Namespace) -> None:
    loaded: Loaded = args.loaded_config
    for option in OPTIONS:
        if option.env and option.env in args.environment_at_start:
            value, origin = args.environment_at_start[option.env], f"${option.env}"
        elif option in loaded.values:
            value, origin = loaded.values[option], str(loaded.path)
        else:
            value, origin = option.default, "default"
        print(f"{option.key} = {value}  ({origin})".replace(" =   (", " = (unset) ("))


def _comment(text: str) -> List[str]:
    return textwrap.wrap(text, 76, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)
