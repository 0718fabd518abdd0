"""An OpenStack-Placement-compatible service (microversions 1.0-1.39).

Layout, one module per resource in three parallel folders:

* ``schemas/<resource>.py``  -- jsonschema of each request body
* ``objects/<resource>.py``  -- plain typed functions over SQLAlchemy Core
* ``handlers/<resource>.py`` -- HTTP: parse, check microversion, serialize

``db.py`` holds the tables and engines, ``app.py`` the ASGI application,
``microversion.py`` the version history, ``errors.py`` the error codes,
``reporter.py`` the libvirt compute-node reporter and ``commands.py`` the
``devtag-host placement`` verbs.
"""
