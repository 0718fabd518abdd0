"""HTTP handlers: parse the call, check the microversion, serialize.

Each handler is a plain function ``(Call) -> Reply`` run in a worker thread.
"""
