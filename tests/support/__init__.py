"""Test support: throw-away services (PostgreSQL, the placement server), free ports.

Not part of the shipped devtag_host package; benchmarks import it with the
repository on ``sys.path``.
"""
