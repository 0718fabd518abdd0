"""Who may do what: OpenStack Placement's default policy, rule for rule.

Every route is ``role:admin or role:service`` but two: ``POST /reshaper`` is
the service's alone, and ``GET /usages`` also lets a reader of the project it
names.  Every rule is project-scoped: a system-scoped request is refused.

The credentials come as upstream's ``noauth2`` reads them: the token is
``user[:project]`` (``X-Project-Id`` names the project if given), the roles
are ``X-Roles`` (comma-separated, as Keystone flattens implied roles), else
``admin`` for the user ``admin``, else none;
``OpenStack-System-Scope`` makes the request system-scoped.  A service started
with a token of its own trusts whoever holds it as an admin unless ``X-Roles``
says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Mapping, Optional, Tuple

_PROVIDER = "/resource_providers/{uuid}"

# (route template, method) -> upstream's rule name
RULES: Dict[Tuple[str, str], str] = {
    ("/resource_providers", "GET"): "placement:resource_providers:list",
    ("/resource_providers", "POST"): "placement:resource_providers:create",
    (_PROVIDER, "GET"): "placement:resource_providers:show",
    (_PROVIDER, "PUT"): "placement:resource_providers:update",
    (_PROVIDER, "DELETE"): "placement:resource_providers:delete",
    ("/resource_classes", "GET"): "placement:resource_classes:list",
    ("/resource_classes", "POST"): "placement:resource_classes:create",
    ("/resource_classes/{name}", "GET"): "placement:resource_classes:show",
    ("/resource_classes/{name}", "PUT"): "placement:resource_classes:update",
    ("/resource_classes/{name}", "DELETE"): "placement:resource_classes:delete",
    (f"{_PROVIDER}/inventories", "GET"): "placement:resource_providers:inventories:list",
    (f"{_PROVIDER}/inventories", "POST"): "placement:resource_providers:inventories:create",
    (f"{_PROVIDER}/inventories", "PUT"): "placement:resource_providers:inventories:update",
    (f"{_PROVIDER}/inventories", "DELETE"): "placement:resource_providers:inventories:delete",
    (f"{_PROVIDER}/inventories/{{resource_class}}", "GET"): "placement:resource_providers:inventories:show",
    (f"{_PROVIDER}/inventories/{{resource_class}}", "PUT"): "placement:resource_providers:inventories:update",
    (f"{_PROVIDER}/inventories/{{resource_class}}", "DELETE"): "placement:resource_providers:inventories:delete",
    (f"{_PROVIDER}/aggregates", "GET"): "placement:resource_providers:aggregates:list",
    (f"{_PROVIDER}/aggregates", "PUT"): "placement:resource_providers:aggregates:update",
    (f"{_PROVIDER}/usages", "GET"): "placement:resource_providers:usages",
    ("/usages", "GET"): "placement:usages",
    ("/traits", "GET"): "placement:traits:list",
    ("/traits/{name}", "GET"): "placement:traits:show",
    ("/traits/{name}", "PUT"): "placement:traits:update",
    ("/traits/{name}", "DELETE"): "placement:traits:delete",
    (f"{_PROVIDER}/traits", "GET"): "placement:resource_providers:traits:list",
    (f"{_PROVIDER}/traits", "PUT"): "placement:resource_providers:traits:update",
    (f"{_PROVIDER}/traits", "DELETE"): "placement:resource_providers:traits:delete",
    ("/allocations", "POST"): "placement:allocations:manage",
    ("/allocations/{consumer}", "GET"): "placement:allocations:list",
    ("/allocations/{consumer}", "PUT"): "placement:allocations:update",
    ("/allocations/{consumer}", "DELETE"): "placement:allocations:delete",
    (f"{_PROVIDER}/allocations", "GET"): "placement:resource_providers:allocations:list",
    ("/allocation_candidates", "GET"): "placement:allocation_candidates:list",
    ("/reshaper", "POST"): "placement:reshaper:reshape",
}

SERVICE_ONLY = frozenset({"placement:reshaper:reshape"})
PROJECT_READER = frozenset({"placement:usages"})


@dataclass(frozen=True)
class Credentials:
    user_id: str
    project_id: str
    roles: FrozenSet[str]
    system_scope: bool = False


def credentials(token: str, headers: Mapping[str, str], trusted: bool = False) -> Credentials:
    """The caller as upstream's noauth2 sees it (``trusted``: the token is the
    service's configured secret, whose holder is an admin by default)."""
    user_id, _sep, project_id = token.partition(":")
    if "x-roles" in headers:
        roles = frozenset(role.strip() for role in headers["x-roles"].split(",") if role.strip())
    elif trusted or user_id == "admin":
        roles = frozenset({"admin"})
    else:
        roles = frozenset()
    # oslo.context prefers X-Project-Id to the X-Tenant-Id noauth2 derives from the token.
    project_id = headers.get("x-project-id") or project_id or user_id
    return Credentials(user_id, project_id, roles, bool(headers.get("openstack-system-scope")))


def allows(rule: str, who: Credentials, project_id: Optional[str] = None) -> bool:
    """Upstream's default check string of ``rule`` for ``who`` (``project_id``: the
    project the request is about, for the project reader rule)."""
    if who.system_scope:  # every rule is scope_types=['project']
        return False
    if rule in SERVICE_ONLY:
        return "service" in who.roles
    if "admin" in who.roles or "service" in who.roles:
        return True
    return rule in PROJECT_READER and "reader" in who.roles and project_id == who.project_id


def refusal(rule: str, who: Credentials) -> str:
    """Upstream's words for a refusal (a scope mismatch names only the rule)."""
    return rule if who.system_scope else f"Policy does not allow {rule} to be performed."
