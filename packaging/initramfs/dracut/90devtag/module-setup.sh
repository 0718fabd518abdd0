#!/bin/bash
# devtag: device role tags in the initramfs (dracut module).
# Installs the devtag-initramfs script, its jq filter, the udev rule and the
# tools they use, and runs the script from the initqueue once udev has
# settled (again on each pass while the root device is missing).

check() {
    # Included whenever jq is there (dnf/apt install jq); never needed for the host itself.
    require_binaries jq base64 gzip head tail wc mv rm blkid || return 1
    return 0
}

depends() {
    echo udev-rules
    return 0
}

installkernel() {
    hostonly='' instmods qemu_fw_cfg sr_mod isofs vfat nls_cp437 nls_ascii
}

install() {
    inst_multiple jq base64 gzip head tail wc mv rm blkid mount umount cat mkdir
    inst_simple /usr/lib/devtag/devtag-initramfs /usr/lib/devtag/devtag-initramfs
    inst_simple /usr/lib/devtag/devtag-initramfs.jq /usr/lib/devtag/devtag-initramfs.jq
    inst_rules 70-devtag.rules
    inst_hook initqueue/settled 50 "$moddir/devtag-settled.sh"
    # the initqueue must run for the hook to run (with systemd it runs only when asked)
    dracut_need_initqueue
}
