"""One distribution, three import packages.

* ``devtag_agent`` (guest-agent/) -- the guest agent; needs only jsonschema
  and pyudev (pycdlib too, to read an ISO config drive without mounting it),
  so image builders can use distro packages.
* ``devtag_schema`` (schema/)     -- the JSON Schema both sides load.
* ``devtag_host`` (host/)         -- host tools; ``pip install devtag[host]``.
"""

import atexit
import os
import shutil
import tempfile

from setuptools import find_packages, setup

# A checkout this user cannot write (another user's tree, a read-only mount): the build's
# scratch files (devtag.egg-info, build/) go to a temporary directory instead of the tree.
OPTIONS = {}
if not os.access(os.path.dirname(os.path.abspath(__file__)), os.W_OK):
    SCRATCH = tempfile.mkdtemp(prefix="devtag-build-")
    atexit.register(shutil.rmtree, SCRATCH, True)
    OPTIONS = {"egg_info": {"egg_base": SCRATCH}, "build": {"build_base": os.path.join(SCRATCH, "build")}}

HOST_PACKAGES = find_packages("host")
AGENT_PACKAGES = find_packages("guest-agent")

package_dir = {"devtag_schema": "schema"}
package_dir.update({name: "host/" + name.replace(".", "/") for name in HOST_PACKAGES})
package_dir.update({name: "guest-agent/" + name.replace(".", "/") for name in AGENT_PACKAGES})

setup(
    name="devtag",
    version="0.1.0",
    description="Virtual device role tagging for libvirt/KVM clouds: host metadata and guest agent",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    package_dir=package_dir,
    options=OPTIONS,
    packages=["devtag_schema", *HOST_PACKAGES, *AGENT_PACKAGES],
    package_data={"devtag_schema": ["*.json"], "devtag_host.examples": ["*.xml"]},
    install_requires=[
        # The guest agent's dependencies, both distro-packaged.
        "jsonschema>=3.2",
        "pyudev>=0.21",
    ],
    extras_require={
        # The agent reads an ISO config drive with pycdlib when it is installed and mounts it
        # otherwise (Debian 11 has no python3-pycdlib): a recommendation, not a requirement.
        "iso": ["pycdlib>=1.11"],
        "host": [
            "libvirt-python>=9.0",
            "defusedxml>=0.7.1",
            "jsonschema-rs>=0.20",
            "pycdlib>=1.14",
            "starlette>=0.37",
            "uvicorn>=0.29",  # placement: its WSGI adapter, for keystonemiddleware
            "httptools>=0.6",  # both servers' HTTP layer (devtag_host.http1)
            "uvloop>=0.19",
            "sqlalchemy>=2.0",
            "alembic>=1.13",
            "psycopg[binary]>=3.1",
            "PyMySQL>=1.1",  # placement on MariaDB/MySQL (pure Python)
            "os-traits>=3.0",
            "os-resource-classes>=1.1",
            "orjson>=3.9",  # placement: large allocation-candidate documents
            "prometheus-client>=0.17",  # both servers' --metrics-listen
            "requests>=2.25",  # devtag_host.placement_client
            "argparse-manpage>=4.5",  # devtag-host --man and the packages' man pages
        ],
        "test": [
            "pytest>=8,<9.2",  # 9.2 no longer reads the node ids xdist 3.8 names its groups in
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.5",  # `pytest -n 2`: the guests on one core, the rest on either
            "hypothesis>=6.100",
            "httpx>=0.27",
            "ruff==0.17.5",
            "mypy>=1.10",  # configured in pyproject.toml ([tool.mypy])
            # Debian's cloud-init is unpacked (not installed) for the config drive and
            # metadata server tests; its readers import these besides requests.
            "configobj>=5.0",
            "pyyaml>=6.0",
            # The stock OpenStack client, run against the placement service.
            "osc-placement>=4.0",
            "python-openstackclient>=6.0",
            # Upstream itself, for the differential tests (tests/placement/test_differential.py),
            # and Nova, whose scheduler report client drives a compute node against both.
            "openstack-placement>=16.0",
            "nova>=31.0",
            # tests/placement/test_keystone.py (marker "keystone"): a real Keystone, and the
            # middleware placement serve --auth-strategy keystone runs.
            "keystone>=26.0",
            "keystonemiddleware>=10.0",
            # Runs upstream's gabbi files (shipped in openstack-placement) over HTTP (marker "gabbi").
            "gabbi>=4.0",
            "oslotest>=5.0",  # imported by upstream's gabbi fixtures
            "pyroute2>=0.7",  # the peer benchmarks/neighbour_table.py measures (its test runs it small)
        ],
        # placement serve --auth-strategy keystone: tokens validated by Keystone.
        "keystone": ["keystonemiddleware>=10.0"],
        # The reference implementation for benchmarks/placement_*.py (also in "test"), and
        # the PostgreSQL driver it needs there (it reads cursor.lastrowid, which psycopg 3 lacks).
        # pyroute2: the peer of benchmarks/neighbour_table.py (the metadata server's netlink mirror).
        "bench": ["openstack-placement>=16.0", "psycopg2-binary>=2.9", "pyroute2>=0.7"],
        # tests/vm/test_image.py (marker "image"): builds a guest image with packaging/dib/devtag-agent.
        "image": ["diskimage-builder>=3.30"],
    },
    # devtag-agent is a plain script, not an entry point: setuptools' launcher for distro
    # builds would look the entry point up through importlib.metadata on every boot run.
    scripts=["guest-agent/devtag-agent"],
    entry_points={
        "console_scripts": [
            "devtag-host=devtag_host.entry:main",
        ]
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
        "Topic :: System :: Systems Administration",
    ],
)
