#!/usr/bin/env bash
# Set up devtag on a fresh Debian 12 machine in one go, then run the demo.
#
#   ./setup.sh             system packages + .venv + `devtag-host demo`
#   ./setup.sh --no-demo   the same without the demo
#
# Needs root or sudo for the system packages.  Safe to run again.
set -euo pipefail
cd "$(dirname "$0")"

run_demo=1
for arg in "$@"; do
    case "$arg" in
        --no-demo) run_demo=0 ;;
        -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
        *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
    esac
done

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

# Why each system package is here: CONTRIBUTING.md, "Dependencies".
apt_packages=(
    python3 python3-venv python3-dev gcc pkg-config      # virtualenv; build libvirt-python
    libvirt-dev libvirt-daemon-driver-qemu               # libvirt, embedded QEMU driver (no daemon)
    qemu-system-x86 qemu-utils                           # real QEMU for the integration tests; qemu-nbd (attach)
    genisoimage xorriso libxml2-utils                    # ISO tools the tests compare against
    udev iproute2                                        # udevadm verify, network namespaces
    postgresql nginx wrk                                 # placement on PostgreSQL, HTTP baselines
    mariadb-server galera-4 rsync                        # placement on MariaDB and a Galera cluster (rsync: SST)
    debhelper dh-python python3-all python3-setuptools lintian  # build and lint the .debs
    rpm                                                  # rpmbuild, for the RPM spec
    debootstrap e2fsprogs                                # the end-to-end test's Debian 12 guest image
    jq dash                                              # the initramfs hook's jq filter and shell, run by its tests
    libvirt-daemon                                       # libvirtd: live-migration hosts; attach storage pool
    libvirt-clients                                      # virsh: the README's quick start (run by a test)
    man-db groff-base mandoc                             # man -l, groff -ww and mandoc -T lint read the man pages
)
missing=()
for package in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup.sh: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# libvirt's QEMU driver runs QEMU as libvirt-qemu even when embedded; the
# libvirt-daemon-system package would create that user, but we need no daemon.
# It must be in group kvm: otherwise libvirt sees /dev/kvm appear and vanish
# between checks and re-probes QEMU on every call (~2 minutes per define).
if ! getent passwd libvirt-qemu >/dev/null; then
    $sudo useradd --system --user-group --no-create-home --home-dir /var/lib/libvirt \
        --shell /usr/sbin/nologin libvirt-qemu
fi
if getent group kvm >/dev/null && ! id -nG libvirt-qemu | grep -qw kvm; then
    $sudo usermod -aG kvm libvirt-qemu
fi

if [ ! -x .venv/bin/python ]; then
    /usr/bin/python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -e '.[host,test]'

# The guest agent must run on the Pythons of current cloud images (3.9+) with
# the jsonschema they ship (3.2 on Ubuntu 22.04 / RHEL 9). Debian 12 has no
# Python 3.9 package; where one exists (e.g. pyenv), tests/agent uses .venv39.
python39=""
for candidate in "$(command -v python3.9 || true)" "$HOME"/.pyenv/versions/3.9*/bin/python3.9; do
    if [ -x "$candidate" ] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 9))' 2>/dev/null; then
        python39=$candidate
        break
    fi
done
if [ -n "$python39" ] && [ ! -x .venv39/bin/python ]; then
    "$python39" -m venv .venv39
    .venv39/bin/pip install -q jsonschema==3.2.0 pyudev pytest pytest-timeout hypothesis
fi

if [ "$run_demo" -eq 1 ]; then
    echo "setup.sh: running the demo: .venv/bin/devtag-host demo" >&2
    demo_status=0
    .venv/bin/devtag-host demo || demo_status=$?
    if [ "$demo_status" -eq 3 ]; then  # refused: devtag-demo is defined already (an earlier run), kept as it is
        echo "setup.sh: devtag-demo is already defined: kept" >&2
    elif [ "$demo_status" -ne 0 ]; then
        exit "$demo_status"
    fi
fi
