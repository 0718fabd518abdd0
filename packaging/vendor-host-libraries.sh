#!/usr/bin/env bash
# Install devtag and its "host" extra, except libvirt-python (the distribution's
# python3-libvirt must match the host's libvirt), into TARGET: the libraries the
# devtag-host packages vendor (packaging/README.md says why).
#
#   packaging/vendor-host-libraries.sh SOURCE_TREE TARGET
#
# Uses the project's .venv (its pip, and its Python for the compiled wheels).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source_tree=$1
target=$2
if [ ! -x "$repo/.venv/bin/python" ]; then
    echo "$(basename "$0"): $repo/.venv is missing: run ./setup.sh first (it installs the build" \
        "dependencies and makes .venv, whose pip and Python vendor the host libraries);" \
        "build-debs.sh --agent-only needs neither" >&2
    exit 1
fi
requirements=$("$repo/.venv/bin/python" - <<'PY'
from importlib.metadata import requires
from packaging.requirements import Requirement
for line in requires("devtag") or []:
    requirement = Requirement(line)
    if requirement.marker and requirement.marker.evaluate({"extra": "host"}) and requirement.name != "libvirt-python":
        print(str(requirement).split(";")[0].strip())
PY
)
# shellcheck disable=SC2086 # one requirement per word
"$repo/.venv/bin/pip" install --quiet --disable-pip-version-check --no-compile \
    --target "$target" "$source_tree" $requirements
rm -rf "$target/bin"
