#!/bin/sh
# Runs inside the guest root filesystem (chroot, /proc mounted) during
# `tests/lab/lab.py build`, after debootstrap. This file is part of the image
# cache key: editing it makes the next build produce a new image.
set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C

# Management NIC (virtio at PCI slot 3 -> ens3) on QEMU user networking.
# Static addressing: QEMU's slirp always hands out 10.0.2.15, and a static
# stanza saves the DHCP round trip at every boot under TCG. allow-hotplug
# (not auto) lets udev bring ens3 up as soon as it appears; with "auto",
# ifupdown-pre.service runs `udevadm settle` first (about 6 s under TCG).
cat > /etc/network/interfaces <<'EOT'
# gpunode lab guest. The data NIC (enp66s1 on gpu-node, ens4 on small-node)
# is left unconfigured on purpose: tests configure it themselves.
auto lo
iface lo inet loopback

allow-hotplug ens3
iface ens3 inet static
    address 10.0.2.15/24
    gateway 10.0.2.2
EOT
echo 'nameserver 10.0.2.3' > /etc/resolv.conf

# Root on the virtio disk; rw from the kernel command line, so no fsck pass.
echo '/dev/vda / ext4 defaults,noatime 0 0' > /etc/fstab
echo 'gpunode-lab' > /etc/hostname   # overridden per guest by systemd.hostname=
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > /etc/hosts

# SSH: key-only root login for the controller.
mkdir -p /etc/ssh/sshd_config.d
cat > /etc/ssh/sshd_config.d/gpunode-lab.conf <<'EOT'
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
EOT
chmod 0700 /root/.ssh
chmod 0600 /root/.ssh/authorized_keys

# Journal in memory only: less disk I/O under TCG, nothing to rotate.
mkdir -p /etc/systemd/journald.conf.d
printf '[Journal]\nStorage=volatile\n' > /etc/systemd/journald.conf.d/gpunode-lab.conf

# A small initramfs: only what mounts /dev/vda. Unpacking and probing the
# default "most" module set costs many seconds of emulated CPU at every boot.
mkdir -p /etc/initramfs-tools/conf.d
echo 'MODULES=list' > /etc/initramfs-tools/conf.d/gpunode-lab.conf
printf 'virtio_pci\nvirtio_blk\next4\n' >> /etc/initramfs-tools/modules
update-initramfs -u -k all

# Units that only cost boot time or wake the guest up later: periodic jobs,
# a getty on a VGA console the guest does not have.
systemctl mask \
    apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer \
    e2scrub_all.timer e2scrub_reap.service fstrim.timer \
    sysstat-collect.timer sysstat-summary.timer \
    systemd-networkd-wait-online.service getty@tty1.service

apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
