"""Every setting of ``devtag-host``: its section and name in ``devtag.conf``, its
``DEVTAG_*`` variable, the flags it stands for, its default, its type and range.

Pure data and the functions that read one value: :mod:`devtag_host.config`
reads the file, layers file, environment and flags, and renders the sample
and the reference tables from :data:`OPTIONS`.  A reader raises ValueError
with words that never repeat the value (a file's content stays out of
messages and logs); the caller names where the value came from.
"""

from __future__ import annotations

import configparser
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

Verb = Tuple[str, ...]
# Placement's inventory fields are 32-bit integers (upstream's limit too).
MAX_INVENTORY = 2**31 - 1


def _text(value: str) -> Any:
    return value


class Integer:
    """An integer from ``low`` to ``high`` (both included)."""

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def __call__(self, text: str) -> Any:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError("is not an integer") from None
        return self.check(value)

    def check(self, value: Union[int, float]) -> Any:
        if not (isinstance(value, int) and self.low <= value <= self.high):
            raise ValueError(f"is not an integer from {self.values}")
        return value

    @property
    def values(self) -> str:
        return f"{self.low:,} to {self.high:,}"


class Number:
    """A finite number more than ``low`` and at most ``high``."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def __call__(self, text: str) -> Any:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError("is not a number") from None
        return self.check(value)

    def check(self, value: Union[int, float]) -> Any:
        if not (math.isfinite(value) and self.low < value <= self.high):
            raise ValueError(f"is not a number {self.values}")
        return value

    @property
    def values(self) -> str:
        return f"more than {self.low:g}, at most {self.high:g}"


def _boolean(value: str) -> Any:
    try:
        return configparser.ConfigParser.BOOLEAN_STATES[value.strip().lower()]
    except KeyError:
        raise ValueError("is not a boolean (true/false, yes/no, on/off, 1/0)") from None


def _negated(value: str) -> Any:
    """For ``--no-X`` flags: ``X = true`` is the flag's absence."""
    return not _boolean(value)


def _words(value: str) -> Any:
    """A list: comma- or line-separated (``listen = 10.0.0.1:80, [fe80::1%br0]:80``)."""
    return [word.strip() for line in value.splitlines() for word in line.split(",") if word.strip()]


class OneOf:
    def __init__(self, *choices: str) -> None:
        self.choices = choices

    def __call__(self, value: str) -> Any:
        if value not in self.choices:
            raise ValueError(f"is not one of {', '.join(self.choices)}")
        return value

    @property
    def values(self) -> str:
        return ", ".join(self.choices)


def values_of(convert: Callable[[str], Any]) -> str:
    """What values a reader takes, for the reference table."""
    if convert in (_boolean, _negated):
        return "true, false"
    if convert is _words:
        return "a comma-separated list"
    return str(getattr(convert, "values", "text"))


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
    checks: Tuple[Tuple[Verb, str, str], ...] = ()  # flags only checked: the verb reads the variable itself
    same_as: Tuple[str, ...] = ()  # flags that read ``env`` when not given, for the reference tables

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
        same_as=("attach --host",),
        flags=((_REPORT, "name", "--name"),),
    ),
    Option(
        "libvirt",
        "uri",
        "The libvirt URI of every verb without --connect. Unset: devtag's own embedded QEMU driver "
        "(qemu:///embed?root=<state_dir>/libvirt).",
        env="DEVTAG_LIBVIRT_URI",
        aliases=(("libvirt", "connection_uri"),),
        same_as=("-c/--connect",),
    ),
    Option(
        "libvirt",
        "virt_type",
        "The domain type 'placement report' reads the capability traits for (qemu, kvm, xen, lxc, vz).",
        default="qemu",
        flags=((_REPORT, "virt_type", "--virt-type"),),
        convert=OneOf("qemu", "kvm", "xen", "lxc", "vz"),
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
        "The placement database, a SQLAlchemy URL: sqlite:////var/lib/devtag/placement.sqlite, "
        "postgresql://user@host/placement or mysql+pymysql://user:password@host/placement?charset=utf8mb4 "
        "(several workers or hosts). Unset: placement.sqlite in state_dir.",
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
        convert=Integer(1, 256),
    ),
    Option(
        "placement",
        "auth_token_file",
        "Accept only the X-Auth-Token in this file. Unset: the token generated at first start into the state "
        "directory's placement-token (or, with any_token, any token on loopback only).",
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
        convert=Number(0, 3600),
        aliases=(("placement", "request_head_timeout"),),
    ),
    Option(
        "placement",
        "connections_per_source",
        "Answer 503 and close beyond this many open connections from one address.",
        default="64",
        env="DEVTAG_PLACEMENT_PER_SOURCE_LIMIT",
        flags=((_SERVE, "connections_per_source", "--connections-per-source"),),
        convert=Integer(1, 65536),
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
        convert=Integer(-1, 10**9),
        checks=((_SERVE, "max_allocation_candidates", "--max-allocation-candidates"),),
    ),
    Option(
        "placement",
        "allocation_candidates_generation_strategy",
        "Which candidates come first when max_allocation_candidates cuts the list: depth-first or "
        "breadth-first, as upstream's option.",
        default="depth-first",
        env="DEVTAG_PLACEMENT_ALLOCATION_CANDIDATES_GENERATION_STRATEGY",
        convert=OneOf("depth-first", "breadth-first"),
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
        "How placement authenticates requests: noauth2 (X-Auth-Token: the one in [placement] "
        "auth_token_file, else the generated one, or any with any_token) or keystone "
        "(keystonemiddleware's auth_token validates tokens against Keystone, set up in [keystone_authtoken]; "
        "the roles admin and service may use the API).",
        default="noauth2",
        flags=((_SERVE, "auth_strategy", "--auth-strategy"),),
        convert=OneOf("noauth2", "keystone"),
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
        "The X-Auth-Token the clients send, from this file. Unset: for a service on loopback, the token "
        "'placement serve' generated, if readable; else 'admin'.",
        flags=((_REPORT, "token_file", "--token-file"),),
    ),
    Option(
        "compute",
        "report_interval",
        "'placement report' repeats every this many seconds. Unset: it reports once.",
        flags=((_REPORT, "interval", "--interval"),),
        convert=Number(0, 86400),
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
        convert=Number(0, 10000),
    ),
    Option(
        "DEFAULT",
        "ram_allocation_ratio",
        "MEMORY_MB overcommit of the node's inventory.",
        default="1.5",
        flags=((_REPORT, "ram_allocation_ratio", "--ram-allocation-ratio"),),
        convert=Number(0, 10000),
    ),
    Option(
        "DEFAULT",
        "disk_allocation_ratio",
        "DISK_GB overcommit of the node's inventory.",
        default="1.0",
        flags=((_REPORT, "disk_allocation_ratio", "--disk-allocation-ratio"),),
        convert=Number(0, 10000),
    ),
    Option(
        "DEFAULT",
        "reserved_host_cpus",
        "VCPUs kept for the host.",
        default="0",
        flags=((_REPORT, "reserved_vcpus", "--reserved-vcpus"),),
        convert=Integer(0, MAX_INVENTORY),
    ),
    Option(
        "DEFAULT",
        "reserved_host_memory_mb",
        "MEMORY_MB kept for the host.",
        default="512",
        flags=((_REPORT, "reserved_memory_mb", "--reserved-memory-mb"),),
        convert=Integer(0, MAX_INVENTORY),
    ),
    Option(
        "DEFAULT",
        "reserved_host_disk_gb",
        "DISK_GB kept for the host.",
        default="0",
        flags=((_REPORT, "reserved_disk_gb", "--reserved-disk-gb"),),
        convert=Integer(0, MAX_INVENTORY),
    ),
    # -- scheduling ---------------------------------------------------------------------------------
    Option(
        "scheduler",
        "image_metadata_prefilter",
        "Ask placement for the traits the image's properties need (hw_disk_bus, hw_vif_model, ...), as Nova's option.",
        default="false",
        env="DEVTAG_IMAGE_METADATA_PREFILTER",
        same_as=("schedule/rebuild-check --image-metadata-prefilter",),
        convert=_boolean,
    ),
    # -- attach -------------------------------------------------------------------------------------
    Option(
        "attach",
        "connection",
        "The attachment store, a SQLAlchemy URL. Unset: attach.sqlite in state_dir.",
        env="DEVTAG_ATTACH_DB",
        same_as=("attach --db",),
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
