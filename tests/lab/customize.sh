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
source /etc/network/interfaces.d/*

auto lo
iface lo inet loopback

allow-hotplug ens3
iface ens3 inet static
    address 10.0.2.15/24
    gateway 10.0.2.2
EOT
# The open-nic shape's vmxnet3 (PCI slot 8 -> ens8), whose queue IRQs exist
# only once the interface is opened: brought up at boot by ifupdown through
# udev, as a user's host would. On shapes without that NIC this stanza is
# never used.
mkdir -p /etc/network/interfaces.d
cat > /etc/network/interfaces.d/ens8 <<'EOT'
allow-hotplug ens8
iface ens8 inet static
    address 192.168.77.2/24
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

# Persistent journal: a test reads the previous boot with `journalctl -b -1`
# (the boot unit's own log after a real reboot).
mkdir -p /etc/systemd/journald.conf.d /var/log/journal
printf '[Journal]\nStorage=persistent\n' > /etc/systemd/journald.conf.d/gpunode-lab.conf

# Installed for later scenarios, not enabled: each scenario configures and
# starts what it proves. `|| true` per unit: a name that a package does not
# ship is not an error here, the list is checked by molecule/lab.
for unit in slurmd.service slurmctld.service munge.service \
        nfs-server.service nfs-kernel-server.service rpcbind.service rpcbind.socket \
        nfs-client.target nfs-blkmap.service podman.service podman.socket podman-restart.service \
        podman-auto-update.service podman-auto-update.timer podman-clean-transient.service; do
    systemctl disable "$unit" >/dev/null 2>&1 || true
done

# GRUB for the grub-boot shape: the BIOS core image is built here from the
# guest's own GRUB modules (lab.py copies boot/grub-core.lnx out of the image).
# The first grub.cfg is written by update-grub inside a booted guest (grub-probe
# finds no root device in a chroot), see lab.py's grub snapshot step.
mkdir -p /etc/default/grub.d
cat > /etc/default/grub.d/gpunode-lab.cfg <<'EOT'
# gpunode lab: serial console, no menu delay, root on the raw /dev/vda filesystem
GRUB_TIMEOUT=0
GRUB_TERMINAL=console
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="console=ttyS0 mitigations=off"
GRUB_DISABLE_OS_PROBER=true
EOT
grub-mkimage -O i386-pc -o /tmp/grub-core.img -p '(hd0)/boot/grub' \
    biosdisk ext2 linux normal configfile search search_fs_uuid echo test part_msdos
cat /usr/lib/grub/i386-pc/lnxboot.img /tmp/grub-core.img > /boot/grub-core.lnx
rm -f /tmp/grub-core.img

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
