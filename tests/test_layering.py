"""The host package's layering, written down once and enforced on the source.

Data flows one way (CONTRIBUTING.md, "Architecture"): libvirt's domain XML -> the device
model and the addresses the guest sees -> the documents (``metadata/``) -> the
transports (``configdrive/``, ``metadata_server/``, ``fwcfg/``) -> the agent.
Around it: the Placement service (``placement/``), the compute node that
reports to it (``compute/``), the scheduler that asks it (``scheduling/``), and
attaching devices to running domains (``attach/``).

The import graph is built from the AST of every module, imports inside
functions and under ``TYPE_CHECKING`` included.  A unit is a subpackage of
``devtag_host`` or one of its top-level modules.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

REPO = Path(__file__).resolve().parent.parent
HOST = REPO / "host" / "devtag_host"

# unit -> the units it may import.  Keep it a DAG: lower layers first.
LAYERS: Dict[str, Set[str]] = {
    "errors": set(),
    "locks": {"errors"},
    "state": set(),  # where devtag keeps its state on this host (embedded libvirt root, databases, volumes)
    "db": {"errors", "state"},  # engines, transactions, Alembic upgrades (placement and attach)
    "metadata": {"errors"},  # what is published: device model, addresses, documents (pure)
    "ssh_keys": set(),  # what an OpenSSH public key line looks like (config drive and instance data)
    "inputs": {"errors", "ssh_keys"},  # the operator's files and --listen, for the transports' and serving verbs
    "http_deadline": set(),  # an overall deadline for a requests call (requests' timeout is per read)
    "placement_client": {"errors", "http_deadline", "state"},  # token, microversion, error bodies
    "serving": {"errors", "inputs"},  # the listening socket, start and stop lines of the long-running verbs
    "settings": set(),  # every setting: section, name, variable, flags, type and range (pure data)
    "config": {"errors", "settings"},  # /etc/devtag/devtag.conf: read, checked, layered; the sample, the tables
    "metrics": {"errors", "inputs", "serving"},  # Prometheus metrics of both servers (prometheus_client)
    "json_lines": set(),  # the access log lines both servers write (timestamp, quoting, batching sink)
    "http1": set(),  # the HTTP/1.1 server both run on (httptools): admission, deadlines, refusal counts
    "virt": {"errors", "locks", "metadata", "state"},  # the libvirt edge
    # The transports: each on metadata/ and virt.py, never on each other.
    "configdrive": {"errors", "inputs", "metadata", "virt"},
    "metadata_server": {"config", "errors", "http1", "inputs", "metadata", "json_lines", "metrics", "serving", "virt"},
    "fwcfg": {"errors", "metadata", "virt"},
    "credentials": {"errors", "metadata", "virt"},  # roles as systemd credentials (guests without the agent)
    # Placement's world: the service, the node reporting to it, the scheduler asking it.
    "placement": {"config", "errors", "db", "http1", "inputs", "json_lines", "metrics", "serving", "state"},
    "compute": {"errors", "placement_client", "state", "virt"},
    "scheduling": {"errors", "compute", "placement_client"},
    "attach": {"db", "errors", "locks", "metadata", "state", "virt"},
    "example": set(),
    "examples": set(),
    # The verbs register themselves: cli.py names their modules (COMMAND_MODULES), it does not import them.
    # tag, untag, devices, demo
    "tagging": {"credentials", "errors", "example", "fwcfg", "inputs", "metadata", "state", "virt"},
    "manpage": set(),  # the man page: argparse-manpage's, with the sections --help has no place for
    "cli": {"config", "devtag_host", "errors", "extras", "manpage", "serving"},
    "extras": set(),  # what the host extra provides, for one line when a module of it is missing
    "entry": {"extras", "cli"},  # the devtag-host command: cli.main, a missing host extra in one line
    "api": {"metadata", "virt"},  # the plain Python API
    "devtag_host": {"api"},  # the package's own __init__: the API, loaded on first use
}

# (importing module, imported unit) outside LAYERS, each with its reason.
EXCEPTIONS: Dict[Tuple[str, str], str] = {
    ("devtag_host.placement.commands", "compute"): "the node reporter's verb is 'devtag-host placement report'",
}

# Module cycles not yet broken, each with who breaks them.  Nothing may join them.
KNOWN_CYCLES: List[Set[str]] = []

LIBVIRT = "libvirt: only what talks to libvirt loads it (placement hosts, --help, devices_from_xml run without it)"
SERVICE = "the placement service's stack (uvicorn, the app, SQLAlchemy/Alembic) loads only for 'serve' and 'db-sync'"
STARLETTE = "the metadata_server package loads starlette and uvicorn: only the verb that serves imports it"

# (importing module, imported module) -> why the import is inside a function.
IN_FUNCTION_IMPORTS: Dict[Tuple[str, str], str] = {
    ("devtag_host.http1.server", "uvloop"): "the event loop: only where a server runs (threads and tests may not)",
    ("devtag_host.placement.commands", "devtag_host.http1"): "httptools: only serve serves",
    ("devtag_host", "devtag_host.api"): "the API loads the host extra's libraries: on first use, so that "
    "'import devtag_host' (the command's entry) works without them",
    ("devtag_host.api", "devtag_host.virt"): LIBVIRT,
    ("devtag_host.entry", "devtag_host.cli"): "importing cli.py loads the host extra: a missing one is one line",
    ("devtag_host.metadata_server.commands", "devtag_host.metrics"): "prometheus_client: only with --metrics-listen",
    ("devtag_host.placement.commands", "devtag_host.metrics"): "prometheus_client: only with --metrics-listen",
    ("devtag_host.placement.access_log", "devtag_host.placement.app"): SERVICE,
    ("devtag_host.placement.commands", "devtag_host.placement.keystone"): SERVICE + " (--auth-strategy keystone)",
    ("devtag_host.placement.commands", "uvicorn.middleware.wsgi"): SERVICE + " (--auth-strategy keystone)",
    ("devtag_host.placement.keystone", "keystonemiddleware"): "keystonemiddleware: only --auth-strategy keystone",
    ("devtag_host.tagging.commands", "devtag_host.virt"): LIBVIRT,
    ("devtag_host.tagging.commands", "devtag_host.fwcfg.domain"): LIBVIRT,
    ("devtag_host.compute.commands", "devtag_host.virt"): LIBVIRT,
    ("devtag_host.compute.host_facts", "libvirt"): LIBVIRT,
    ("devtag_host.configdrive", "devtag_host.virt"): LIBVIRT,
    ("devtag_host.configdrive.domain", "devtag_host.virt"): LIBVIRT,
    ("devtag_host.configdrive.domain", "libvirt"): LIBVIRT,
    ("devtag_host.fwcfg.commands", "devtag_host.virt"): LIBVIRT,
    ("devtag_host.fwcfg.commands", "devtag_host.fwcfg.domain"): LIBVIRT,
    ("devtag_host.metadata_server", "devtag_host.metadata_server.libvirt_watch"): LIBVIRT,
    ("devtag_host.metadata_server", "devtag_host.metadata_server.server"): "httptools: only run() serves",
    ("devtag_host.metadata_server.commands", "devtag_host.virt"): LIBVIRT,
    ("devtag_host.metadata_server.commands", "devtag_host.metadata_server"): STARLETTE,
    ("devtag_host.db", "alembic"): "Alembic: loads only when a schema is upgraded or read (a second of start-up)",
    ("devtag_host.db", "alembic.config"): "Alembic, as above",
    ("devtag_host.db", "alembic.runtime.migration"): "Alembic, as above",
    ("devtag_host.metadata.validation", "jsonschema_rs"): "optional: the reference validator serves without it",
    ("devtag_host.http_deadline", "requests"): "requests: only a client making its own session",
    ("devtag_host.http_deadline", "requests.adapters"): "requests: only a client making its own session",
    ("devtag_host.http_deadline", "urllib3.connection"): "urllib3 (requests'): only a client making its own session",
    ("devtag_host.http_deadline", "urllib3.connectionpool"): "urllib3, as above",
    ("devtag_host.placement.app", "starlette.concurrency"): "starlette: only the ASGI entry point needs it (WSGI not)",
    ("devtag_host.placement.commands", "devtag_host.placement.app"): SERVICE,
    ("devtag_host.placement.commands", "devtag_host.placement.access"): SERVICE + " (token and Host rules)",
    ("devtag_host.placement.commands", "devtag_host.placement.db"): SERVICE,
    ("devtag_host.placement.commands", "devtag_host.placement.schema_upgrade"): SERVICE,
    ("devtag_host.placement.commands", "sqlalchemy.exc"): SERVICE,
    ("devtag_host.placement.commands", "uvicorn"): SERVICE,
    ("devtag_host.placement.commands", "devtag_host.placement.serve_limits"): SERVICE + " (a uvicorn protocol)",
    ("devtag_host.placement.commands", "sqlalchemy.engine"): SERVICE + " (--db URL check, redacted start line)",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(HOST.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Dict[str, Path] = {_module_name(path): path for path in sorted(HOST.rglob("*.py"))}


def _imports(module: str) -> Iterator[Tuple[str, bool]]:
    """(imported module, inside a function?) for every import statement of ``module``."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]

    def targets(node: ast.AST) -> List[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]

    def walk(node: ast.AST, in_function: bool) -> Iterator[Tuple[str, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in targets(child):
                    yield target, in_function
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from walk(child, inner)

    yield from walk(ast.parse(path.read_text(), filename=str(path)), False)


def _own(name: str) -> str:
    """The devtag_host module an import names (``devtag_host.virt.X`` -> ``devtag_host.virt``)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _graph() -> Dict[str, Set[str]]:
    return {
        module: {_own(target) for target, _ in _imports(module) if target.split(".")[0] == "devtag_host"} - {module}
        for module in MODULES
    }


def _cycles(graph: Dict[str, Set[str]]) -> List[Set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[Set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_every_unit_has_its_place_in_the_layers() -> None:
    assert {_unit(module) for module in MODULES} <= set(LAYERS), "add the new package to LAYERS"
    for unit, allowed in LAYERS.items():
        assert allowed <= set(LAYERS), unit
    layered = {unit: set(allowed) for unit, allowed in LAYERS.items()}
    assert _cycles(layered) == [], "LAYERS must be a DAG"


def test_imports_point_only_the_allowed_ways() -> None:
    wrong = []
    for module, imported in _graph().items():
        for target in imported:
            source, destination = _unit(module), _unit(target)
            if source == destination or destination in LAYERS[source]:
                continue
            if (module, destination) in EXCEPTIONS:
                continue
            wrong.append(f"{module} -> {target}")
    assert wrong == [], "imports against LAYERS (tests/test_layering.py):\n" + "\n".join(sorted(wrong))


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    unknown = [sorted(cycle) for cycle in cycles if not any(cycle <= known for known in KNOWN_CYCLES)]
    assert unknown == [], f"import cycles: {unknown}"


def test_imports_inside_functions_have_a_listed_reason() -> None:
    unexplained = sorted(
        {
            (module, _own(target) if target.startswith("devtag_host") else target)
            for module in MODULES
            for target, in_function in _imports(module)
            if in_function
        }
        - set(IN_FUNCTION_IMPORTS)
    )
    assert unexplained == [], "import at the top, or add the heavy dependency's reason to IN_FUNCTION_IMPORTS"


# Own-module imports inside functions (statements), at most this many: each one is a heavy
# dependency kept off the start of every command (libvirt, uvicorn, the service's stack, ...).
MAX_OWN_IMPORTS_IN_FUNCTIONS = 25


def test_few_own_module_imports_inside_functions() -> None:
    found = []
    for module, path in MODULES.items():
        for function in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                own = isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("devtag_host"))
                own = own or (
                    isinstance(node, ast.Import) and any(a.name.startswith("devtag_host") for a in node.names)
                )
                if own and node not in {n for _, n in found}:
                    found.append((f"{module}:{node.lineno}", node))
    where = sorted(name for name, _ in found)
    assert len(where) <= MAX_OWN_IMPORTS_IN_FUNCTIONS, "import at the top (each lazy import needs its reason):\n" + (
        "\n".join(where)
    )


def _loaded_with(module: str) -> Set[str]:
    """What importing ``module`` runs: imports at module level, not in functions nor under TYPE_CHECKING."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: Set[str] = set()

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue  # class bodies run, but none here imports
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                walk(ast.Module(body=child.orelse, type_ignores=[]))
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = ".".join(
                        package[: len(package) - child.level + 1] + ([child.module] if child.module else [])
                    )
                else:
                    base = child.module or ""
                found.update(
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in child.names
                )
            walk(child)

    walk(ast.parse(path.read_text(), filename=str(path)))
    return found


def test_the_parsers_load_without_libvirt() -> None:
    """LIBVIRT for the whole command line: building devtag-host's parser (--help, every verb's
    --help, the man pages written at package build time) loads no libvirt.  A verb whose code
    needs it names its handler "module:function" (attach/commands.py), imported when it runs."""
    from devtag_host.cli import COMMAND_MODULES

    via: Dict[str, str] = {}
    pending = ["devtag_host.cli", *COMMAND_MODULES]
    while pending:
        module = pending.pop()
        parts = module.split(".")
        for imported in [".".join(parts[:n]) for n in range(1, len(parts))] + sorted(_loaded_with(module)):
            if imported.split(".")[0] != "devtag_host":
                if imported.split(".")[0] == "libvirt":
                    chain = [module]
                    while chain[-1] in via:
                        chain.append(via[chain[-1]])
                    raise AssertionError(LIBVIRT + ": libvirt is loaded by " + " <- ".join(chain))
                continue
            own = _own(imported)
            if own not in via and own not in ("devtag_host.cli", *COMMAND_MODULES):
                via[own] = module
                pending.append(own)


# Test support in the package, each with who moves it to tests/support/.
KNOWN_TEST_SUPPORT: Set[str] = set()


def test_the_shipped_package_holds_no_test_support() -> None:
    support = {module for module in MODULES if module.rsplit(".", 1)[-1].endswith(("testing", "conftest"))}
    assert support <= KNOWN_TEST_SUPPORT, "test support lives in tests/support/"


# Errors (CONTRIBUTING.md, "Architecture"): the placement objects raise the domain exceptions of
# placement/exception.py; only the handler layer (errors.RULES, errors.mapped, app.py) knows HTTP.
PLACEMENT_HTTP_MODULES = {"devtag_host.placement.errors", "devtag_host.placement.web", "devtag_host.placement.app"}


def test_placement_objects_know_no_http_errors() -> None:
    wrong = []
    for module, path in MODULES.items():
        if not module.startswith("devtag_host.placement.objects"):
            continue
        for target, _ in _imports(module):
            own = _own(target)
            if own in PLACEMENT_HTTP_MODULES or own.startswith("devtag_host.placement.handlers"):
                wrong.append(f"{module} imports {own}")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Name) and node.id == "PlacementError":
                wrong.append(f"{module}:{node.lineno} uses PlacementError")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "errors":
                wrong.append(f"{module}:{node.lineno} uses errors.{node.attr}")
    assert wrong == [], "raise a domain exception (placement/exception.py), map it in errors.RULES:\n" + "\n".join(
        wrong
    )


# Placement's layers below the HTTP one (CONTRIBUTING.md, "Architecture"): handlers parse,
# check the microversion, call objects and serialize; objects run the SQL and return data
# (no microversion, no wire bytes); the answer's encoding (candidate_encoding) sits between
# them, on the objects' data, with neither SQL nor HTTP.
PLACEMENT_SQL = ("sqlalchemy",)
PLACEMENT_WIRE = ("orjson", "devtag_host.placement.microversion", "devtag_host.placement.candidate_encoding")
PLACEMENT_ENCODING = {"devtag_host.placement.candidate_encoding"}


def _imports_of(module: str) -> Set[str]:
    return {_own(target) if target.startswith("devtag_host") else target for target, _ in _imports(module)}


def test_placement_handlers_run_no_sql_and_objects_write_no_wire_bytes() -> None:
    wrong = []
    for module in MODULES:
        imported = _imports_of(module)
        if module.startswith("devtag_host.placement.handlers") or module in PLACEMENT_ENCODING:
            wrong += [f"{module} imports {name}" for name in imported if name.startswith(PLACEMENT_SQL)]
        if module in PLACEMENT_ENCODING:
            wrong += [f"{module} imports {name}" for name in imported if name in PLACEMENT_HTTP_MODULES]
        if module.startswith("devtag_host.placement.objects"):
            wrong += [f"{module} imports {name}" for name in imported if name.startswith(PLACEMENT_WIRE)]
    assert wrong == [], "SQL in objects/, the answer's bytes above them:\n" + "\n".join(sorted(wrong))


def _is_command_line(module: str) -> bool:
    """The command-line layer: cli.py, the command's entry and each package's verbs (commands.py, verbs.py)."""
    return module in ("devtag_host.cli", "devtag_host.entry") or module.rsplit(".", 1)[-1] in ("commands", "verbs")


def test_only_the_command_line_knows_exit_statuses() -> None:
    """Library code raises kinds of failure (errors.py: InputError, RuntimeFailure, Refused, and
    their domain subclasses); only the command line maps them to exit statuses (cli.exit_status,
    a verb's own ``exit_code``).  No library module defines an exit status, exits, or imports a
    command-line module (whose exceptions carry one)."""
    wrong = []
    for module, path in MODULES.items():
        if _is_command_line(module):
            continue
        for target, _ in _imports(module):
            if target.startswith("devtag_host") and _is_command_line(_own(target)):
                wrong.append(f"{module} imports {_own(target)}")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Name) and node.id in ("exit_code", "SystemExit"):
                wrong.append(f"{module}:{node.lineno} uses {node.id}")
            if isinstance(node, ast.Attribute) and node.attr in ("exit_code", "exit", "_exit"):
                wrong.append(f"{module}:{node.lineno} uses .{node.attr}")
    assert wrong == [], "raise a kind of failure (errors.py), map it in the command line:\n" + "\n".join(wrong)
