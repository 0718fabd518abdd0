"""Data access and rules: plain typed functions over SQLAlchemy Core.

Every function takes an open ``Connection`` (the caller owns the transaction)
and raises ``PlacementError`` for what the client did wrong and
``ConcurrentUpdate`` when a provider's generation moved under it.
"""
