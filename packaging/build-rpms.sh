#!/usr/bin/env bash
# Build the devtag-agent and devtag-host RPMs from this checkout.
#
#   packaging/build-rpms.sh [OUTDIR]     (default OUTDIR: dist/)
#
# Works on RPM distributions and, for CI, on Debian with the `rpm` package
# (`--nodeps`: Debian has no RPM build dependencies to check).  The host
# package's vendored libraries come from the project's .venv, for its Python.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)
version=$(sed -n 's/^Version: *//p' "$repo/packaging/rpm/devtag.spec")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{SOURCES,SPECS,BUILD,RPMS,SRPMS} "$work/devtag-$version"

(cd "$repo" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf - --ignore-failed-read) \
    | tar -C "$work/devtag-$version" -xf -
tar -C "$work" -czf "$work/SOURCES/devtag-$version.tar.gz" "devtag-$version"

"$repo/packaging/vendor-host-libraries.sh" "$work/devtag-$version" "$work/vendor"
tar -C "$work/vendor" -czf "$work/SOURCES/devtag-host-vendor-$version.tar.gz" .

nodeps=()
command -v dpkg >/dev/null && nodeps=(--nodeps)
rpmbuild -bb "${nodeps[@]}" --define "_topdir $work" "$repo/packaging/rpm/devtag.spec" >"$work/build.log" 2>&1 || {
    tail -40 "$work/build.log" >&2
    echo "build-rpms.sh: rpmbuild failed (log above)" >&2
    exit 1
}
find "$work/RPMS" -name '*.rpm' -exec cp {} "$out"/ \;
echo "built:" && ls -1 "$out"/*.rpm
