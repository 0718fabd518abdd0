"""One instance's metadata site: every URL path it answers, with its bytes.

Built once per instance change from the very files of its config drive
(:func:`devtag_host.configdrive.instance_files`), plus the index documents
that only exist over HTTP (``/openstack``, ``/latest/meta-data/``, ...), so a
request is a dictionary lookup.  The layout is Nova's:

* ``/openstack`` -> the OpenStack versions, one a line;
* ``/openstack/<version>/`` -> the files of that version;
* ``/openstack/<version>/<file>`` -> the config drive's file;
* ``/`` -> the EC2 versions; ``/<version>/meta-data/...`` the EC2 tree that
  cloud-init's EC2 reader walks; ``/<version>/user-data``.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Tuple

from ..metadata.instance import (
    EC2_VERSIONS,
    LATEST,
    OPENSTACK_VERSIONS,
    Instance,
    ec2_meta_data,
    instance_files,
)

JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"
OCTETS = b"application/octet-stream"


@dataclass(frozen=True)
class Page:
    content_type: bytes
    body: bytes
    headers: Tuple[Tuple[bytes, bytes], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The response headers, built once: the request path only sends them.
        length = str(len(self.body)).encode("ascii")
        object.__setattr__(self, "headers", ((b"content-type", self.content_type), (b"content-length", length)))


Site = Dict[str, Page]


def _text(lines: List[str]) -> Page:
    return Page(TEXT, "\n".join(lines).encode("utf-8"))


def _ec2_tree(site: Site, base: str, tree: Mapping[str, Any], public_keys: Tuple[Tuple[str, str], ...]) -> None:
    """Index and leaves of an EC2 meta-data (sub)tree under ``base`` (ending in '/')."""
    index = []
    for key, value in tree.items():
        if key == "public-keys":
            index.append("public-keys/")
            _ec2_public_keys(site, f"{base}public-keys/", public_keys)
        elif isinstance(value, Mapping):
            index.append(f"{key}/")
            _ec2_tree(site, f"{base}{key}/", value, ())
        else:
            index.append(key)
            text = "\n".join(str(v) for v in value) if isinstance(value, list) else str(value)
            site[base + key] = Page(TEXT, text.encode("utf-8"))
    page = _text(index)
    site[base] = page
    site[base.rstrip("/")] = page


def _ec2_public_keys(site: Site, base: str, public_keys: Tuple[Tuple[str, str], ...]) -> None:
    # EC2's odd shape: "0=name" in the index, then "0/openssh-key".
    page = _text([f"{index}={name}" for index, (name, _key) in enumerate(public_keys)])
    site[base] = page
    site[base.rstrip("/")] = page
    for index, (_name, key) in enumerate(public_keys):
        entry = _text(["openssh-key"])
        site[f"{base}{index}/"] = entry
        site[f"{base}{index}"] = entry
        site[f"{base}{index}/openssh-key"] = Page(TEXT, key.encode("utf-8"))


def build_site(instance: Instance) -> Site:
    """Every path of ``instance``'s metadata site (the instance is validated first)."""
    files = instance_files(instance)
    site: Site = {}
    openstack_versions = [*OPENSTACK_VERSIONS, LATEST]
    versions_page = _text(openstack_versions)
    site["/openstack"] = versions_page
    site["/openstack/"] = versions_page
    for version in openstack_versions:
        prefix = f"openstack/{version}/"
        names = [path[len(prefix) :] for path in files if path.startswith(prefix)]
        listing = _text(names)
        site[f"/{prefix}"] = listing
        site[f"/{prefix.rstrip('/')}"] = listing
        for name in names:
            site[f"/{prefix}{name}"] = Page(JSON if name.endswith(".json") else OCTETS, files[prefix + name])
    for path, content in files.items():
        if path.startswith("openstack/content/"):
            site["/" + path] = Page(OCTETS, content)
    ec2_versions = [*EC2_VERSIONS, LATEST]
    site["/"] = _text(ec2_versions)
    tree = ec2_meta_data(instance)
    for version in ec2_versions:
        entries = ["meta-data/"] + (["user-data"] if instance.user_data is not None else [])
        site[f"/{version}/"] = _text(entries)
        site[f"/{version}"] = site[f"/{version}/"]
        _ec2_tree(site, f"/{version}/meta-data/", tree, instance.public_keys)
        if instance.user_data is not None:
            site[f"/{version}/user-data"] = Page(OCTETS, instance.user_data)
    return site
