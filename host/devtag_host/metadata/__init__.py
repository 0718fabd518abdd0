"""Device metadata: libvirt domain XML -> device model -> ``devices`` document.

Pure functions only; the libvirt I/O lives in :mod:`devtag_host.virt`.
"""

from .device_tags import (
    CONFIG_DRIVE_ALIAS,
    DeviceSelectionError,
    MissingTagError,
    add_tags,
    find_device,
    remove_tags,
    tags_of,
)
from .document import TooManyDevicesError, device_entries, devices_document, published_by_nova
from .domain_xml import TAGS_NAMESPACE, DomainXmlError, parse_domain_xml, tag_entries_xml
from .model import Domain, TagEntry
from .tags import TagError, check_tag, is_valid_tag
from .validation import InvalidDocumentError, is_valid_document, validate_document

__all__ = [
    "CONFIG_DRIVE_ALIAS",
    "TAGS_NAMESPACE",
    "DeviceSelectionError",
    "Domain",
    "DomainXmlError",
    "InvalidDocumentError",
    "MissingTagError",
    "TagEntry",
    "TagError",
    "TooManyDevicesError",
    "add_tags",
    "check_tag",
    "device_entries",
    "devices_document",
    "find_device",
    "is_valid_document",
    "is_valid_tag",
    "parse_domain_xml",
    "published_by_nova",
    "remove_tags",
    "tag_entries_xml",
    "tags_of",
    "validate_document",
]
