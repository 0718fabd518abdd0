"""devtag guest agent: find a VM's NICs and disks by the roles its tenant tagged.

Runs on the distro Pythons of cloud images (3.9+) with only jsonschema, pyudev,
requests and the standard library.
"""

__version__ = "0.1.0"
