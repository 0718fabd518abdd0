"""The compute node's side of placement: what this libvirt host has and can do.

* :mod:`.emulation_traits` -- libvirt domain capabilities -> ``COMPUTE_STORAGE_BUS_*``,
  ``COMPUTE_GRAPHICS_MODEL_*``, ``COMPUTE_NET_VIF_MODEL_*``, ``COMPUTE_ARCH_*``,
  ``HW_ARCH_*`` (pure; the trait vocabulary the scheduler's prefilter uses too).
* :mod:`.host_facts` -- the node's resources, CPU traits and domain capabilities, read from libvirt.
* :mod:`.reporter` -- makes placement agree with the facts (through
  :mod:`devtag_host.placement_client`); :mod:`.commands` -- ``placement report``.
"""
