"""OpenStack Placement's own database: taking one over (``placement import``) and writing
one back (``placement export``).

``schema``: upstream's schema and the mapping of its rows to devtag's (pure);
``transfer``: reading and writing both databases; ``verbs`` and ``commands``: the
command line (the parsers, and the handlers that load the database stack).
"""
