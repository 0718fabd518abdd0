"""devtag guest agent: find a VM's NICs and disks by the roles its tenant tagged.

Runs on the distro Pythons of cloud images (3.9+) with only jsonschema, pyudev,
requests and the standard library.  For applications::

    import devtag_agent

    devtag_agent.lookup("squidcache", type="disk")[0].devnode   # '/dev/vdb'
    devtag_agent.lookup("nfvfunc1", type="nic")[0].ifname        # 'ens4'
    devtag_agent.list_devices()                                  # every tagged device

The command line is ``devtag-agent`` (:mod:`devtag_agent.cli`); how tags are
published through udev is described in ``docs/agent.md``.
"""

from .lookup import NoState, TaggedDevice, list_devices, lookup

__version__ = "0.1.0"

__all__ = ["NoState", "TaggedDevice", "__version__", "list_devices", "lookup"]
