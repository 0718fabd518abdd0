"""Data access and rules: plain typed functions over SQLAlchemy Core.

Every function takes an open ``Connection`` (the caller owns the transaction)
and raises the domain exceptions of ``exception.py`` (never HTTP errors: the
handler layer maps them, ``errors.RULES``), ``ConcurrentUpdate`` when a
provider's generation moved under it.
"""
