#!/usr/bin/env bash
# Build the devtag-agent and devtag-host .deb packages from this checkout.
#
#   packaging/build-debs.sh [--agent-only] [OUTDIR]     (default OUTDIR: dist/)
#
# --agent-only builds just devtag-agent (Architecture: all), without vendoring
# the host libraries: what the end-to-end test installs into its guest.
#
# On a clean clone run ./setup.sh first: it installs the build dependencies
# and makes the project's .venv, which vendors the host libraries (without it
# this stops with one line saying so; --agent-only needs no .venv where
# python3-argparse-manpage >= 4.5 is installed, as on Debian 13).  Runs
# lintian on the result.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=binary
if [ "${1:-}" = "--agent-only" ]; then
    build=all
    shift
fi
out=$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The source: the files git knows, as they are in the working tree.
mkdir "$work/devtag"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - --ignore-failed-read) \
    | tar -C "$work/devtag" -xf -
cp -a "$work/devtag/packaging/debian" "$work/devtag/debian"

if [ "$build" = binary ]; then
    "$repo/packaging/vendor-host-libraries.sh" "$work/devtag" "$work/devtag/debian/vendor"
fi
# argparse-manpage writes the man pages at build time (debian/rules): the .venv's, as Debian 12 has
# only 1.2.2. Without a .venv (--agent-only) the build uses the system's (Debian 13: 4.5).
if [ -x "$repo/.venv/bin/python" ]; then
    tool=$("$repo/.venv/bin/python" -c 'import argparse_manpage, os; print(os.path.dirname(argparse_manpage.__file__))')
    mkdir -p "$work/devtag/debian/build-tools" && cp -a "$tool" "$work/devtag/debian/build-tools/"
fi

(cd "$work/devtag" && dpkg-buildpackage --no-sign --build="$build" >"$work/build.log" 2>&1) || {
    tail -40 "$work/build.log" >&2
    echo "build-debs.sh: dpkg-buildpackage failed (log above)" >&2
    exit 1
}
cp "$work"/*.deb "$out"/
echo "built:" && ls -1 "$out"/*.deb
if command -v lintian >/dev/null; then
    lintian --fail-on error --suppress-tags-from-file "$repo/packaging/debian/lintian-suppressions" "$out"/devtag-*.deb
fi
