"""The syntax of a device tag, checked before a tag is stored anywhere.

Tags come from tenants, so the host refuses anything it could not carry safely
through libvirt XML, JSON, udev property values and file names in the guest:

* 1 to 60 characters (Unicode code points), as Nova allows;
* no ``,`` and no ``/`` (Nova's rule: ``,`` separates tags in CLIs, ``/`` is a
  path separator);
* no control characters (C0, DEL, C1), no format characters (zero-width and
  bidirectional overrides that make two tags look alike), no line or paragraph
  separators, no surrogates and no Unicode non-characters: XML 1.0 cannot carry
  several of them, and none of them has a legitimate use in a role name;
* no leading or trailing white space, which no operator can see in a listing.

Everything else (spaces inside, ``=``, quotes, ``$``, non-Latin letters, ...) is
allowed: the guest agent escapes what udev cannot carry verbatim.
"""

from __future__ import annotations

import unicodedata

from ..errors import InputError

MAX_TAG_LENGTH = 60
MAX_TAGS_PER_DEVICE = 64

# Unicode general categories that never belong in a tag (see module docstring).
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Cn"})
_FORBIDDEN_CHARACTERS = frozenset(",/")


class TagError(InputError, ValueError):
    """A tag that breaks the rules above; the message says which rule."""


def _is_noncharacter(code_point: int) -> bool:
    return 0xFDD0 <= code_point <= 0xFDEF or (code_point & 0xFFFE) == 0xFFFE


def check_tag(tag: object) -> str:
    """Return ``tag`` unchanged if it is a valid tag, else raise :class:`TagError`."""
    if not isinstance(tag, str):
        raise TagError(f"a tag must be a string, not {type(tag).__name__}")
    if not 1 <= len(tag) <= MAX_TAG_LENGTH:
        raise TagError(f"tag {tag[:70]!r} must be 1 to {MAX_TAG_LENGTH} characters long, not {len(tag)}")
    if tag != tag.strip():
        raise TagError(f"tag {tag!r} must not start or end with white space")
    for position, char in enumerate(tag):
        if char in _FORBIDDEN_CHARACTERS:
            raise TagError(f"tag {tag!r} contains {char!r} at position {position}; ',' and '/' are not allowed")
        category = unicodedata.category(char)
        if category in _FORBIDDEN_CATEGORIES or _is_noncharacter(ord(char)):
            raise TagError(
                f"tag {tag!r} contains the character U+{ord(char):04X} ({category}) at position {position};"
                " control, format and unassigned characters are not allowed"
            )
    return tag


def is_valid_tag(tag: object) -> bool:
    try:
        check_tag(tag)
    except TagError:
        return False
    return True
