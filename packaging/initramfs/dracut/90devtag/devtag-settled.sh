#!/bin/sh
# devtag: publish the disks' role tags (/dev/disk/by-tag/ROLE); sourced by
# dracut's initqueue after udev settled, on every pass until the root device is there.
[ -x /usr/lib/devtag/devtag-initramfs ] && /usr/lib/devtag/devtag-initramfs
