"""Tagging a domain's devices on a libvirt connection: the verbs ``tag``, ``untag``, ``devices``, ``demo``."""
