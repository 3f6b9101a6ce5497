"""gpunode lab: real-kernel QEMU guests shaped like GPU training nodes.

Stdlib only. Run as root. Used by the Molecule scenarios under molecule/ and
by humans:

    python3 tests/lab/lab.py build                         # build or reuse the cached image
    python3 tests/lab/lab.py up --name g1 --shape gpu-node --port 2222
    python3 tests/lab/lab.py ssh g1 -- cat /proc/interrupts
    python3 tests/lab/lab.py info g1                       # JSON: port, key, tap, console log
    python3 tests/lab/lab.py list
    python3 tests/lab/lab.py down --name g1                # or: down --all

Environment:
    GPUNODE_LAB_CACHE         image cache (default /var/cache/gpunode-lab)
    GPUNODE_LAB_STATE         run state: pidfiles, overlays, console logs
                              (default /run/gpunode-lab)
    GPUNODE_LAB_MIRROR        Debian mirror URL (default: from this host's apt sources)
    GPUNODE_LAB_BOOT_TIMEOUT  seconds until a guest must answer SSH (default 300)
    GPUNODE_LAB_ACCEL         tcg (default) or kvm; kvm is used only if a probe boot
                              succeeds within GPUNODE_LAB_KVM_PROBE_TIMEOUT (default 90)
    GPUNODE_LAB_KEEP          image generations kept in the cache (default 3)

Nothing here touches the host's /proc/irq, bootloader or systemd. The only host
addresses used are 127.0.0.1 ports (SSH forwards). Each guest's data NIC sits
on a tap device that QEMU creates and that disappears with the QEMU process; it
carries no address.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Bump when the build procedure in this file changes in a way that changes
# the image (packages.txt and customize.sh are hashed by content).
RECIPE_VERSION = "2"
SUITE = "bookworm"
DISK_SIZE = "4G"

CACHE = Path(os.environ.get("GPUNODE_LAB_CACHE", "/var/cache/gpunode-lab"))
STATE = Path(os.environ.get("GPUNODE_LAB_STATE", "/run/gpunode-lab"))
BOOT_TIMEOUT = int(os.environ.get("GPUNODE_LAB_BOOT_TIMEOUT", "300"))
KVM_PROBE_TIMEOUT = int(os.environ.get("GPUNODE_LAB_KVM_PROBE_TIMEOUT", "90"))
KEEP = int(os.environ.get("GPUNODE_LAB_KEEP", "3"))
# The cold boot that saves a state (once per image and key) may take longer.
SAVE_BOOT_TIMEOUT = int(os.environ.get("GPUNODE_LAB_SAVE_BOOT_TIMEOUT", "900"))
# A cold boot whose console prints nothing for this long before SSH answers is stalled: seen on 2026-12-02, a
# gpu-node stopped at "sched_clock: Marking stable" (2.76 s into the kernel) for over 5 minutes with QEMU spinning
# at 175 % CPU while the host was loaded; the retry booted in 40 s. The slowest healthy pause measured was the
# 60-90 s of soft lockups that initramfs_async=0 took away.
STALL_SECONDS = int(os.environ.get("GPUNODE_LAB_STALL_SECONDS", "180"))
SAVE_ATTEMPTS = 2

TAP_PREFIX = "glab"

# enroot and pyxis source archives (see ../shared/LAB.md). Built on the host
# and installed into the image when present; scenarios that need them skip
# with a reason when they are absent.
VENDOR = Path(os.environ.get("GPUNODE_LAB_VENDOR", str(HERE.parents[2] / "shared" / "vendor")))
VENDOR_ARCHIVES = {"enroot": "enroot-4.1.2-src.tar.gz", "pyxis": "pyxis-0.24.0-src.tar.gz"}
# Host packages for that build (Debian 12's glibc and libslurm match the guest's).
VENDOR_BUILD_PACKAGES = {
    "build-essential": "gcc",
    "libbsd-dev": "/usr/include/bsd/string.h",
    "libslurm-dev": "/usr/include/slurm/spank.h",
    "squashfs-tools": "mksquashfs",
    "busybox-static": "/bin/busybox",
    "make": "make",
}
QEMU = "qemu-system-x86_64"

# Host tools the lab needs: Debian package -> a command it provides.
HOST_PACKAGES = {
    "qemu-system-x86": QEMU,
    "qemu-utils": "qemu-img",
    "debootstrap": "debootstrap",
    "e2fsprogs": "mkfs.ext4",
    "openssh-client": "ssh-keygen",
    "iproute2": "ip",
}

# Image variants built from the same root filesystem.
#   full:          everything in packages.txt
#   no-irqbalance: the same with irqbalance purged (a node without irqbalance)
VARIANTS = {"full": [], "no-irqbalance": ["irqbalance"]}

# initramfs_async=0: unpack the initramfs before the initcalls that follow it.
# Unpacked asynchronously (the default), it races the TSC clocksource switch, a
# stop_machine(): under TCG on 2 host cores the seven spinning vCPUs starve the
# one still decompressing, and a boot took 60-90 s in the kernel instead of 12
# (soft lockups in migration/N; measured on gpu-node, see molecule/README.md).
GUEST_CMDLINE = "console=ttyS0 mitigations=off initramfs_async=0"
KERNEL_CMDLINE = "root=/dev/vda rw " + GUEST_CMDLINE

# systemd-run's timers default to AccuracySec=1min: "--on-active=2" fired up to
# 60 s late (measured: 29 s). Delayed actions in the guest use this.
TIMER_NOW = "--timer-property=AccuracySec=100ms"

# Guest shapes. PCI slots on the root bus are explicit so that interface
# names never move: ens3 = management NIC, 0x5 = disk.
SHAPES = {
    "gpu-node": {
        "description": "2 sockets x 2 cores x 2 threads, 2 NUMA nodes (0-3, 4-7), "
        "6-queue virtio NIC behind a PCI expander bridge on NUMA node 1, irqbalance running",
        "variant": "full",
        "args": [
            "-cpu", "Nehalem",
            "-smp", "8,sockets=2,cores=2,threads=2",
            "-m", "1024",
            "-object", "memory-backend-ram,id=m0,size=512M",
            "-object", "memory-backend-ram,id=m1,size=512M",
            "-numa", "node,nodeid=0,cpus=0-3,memdev=m0",
            "-numa", "node,nodeid=1,cpus=4-7,memdev=m1",
            "-device", "pxb,id=b1,bus_nr=64,numa_node=1,bus=pci.0,addr=0x6",
            "-device", "pci-bridge,id=br1,bus=b1,chassis_nr=1",
        ],
        "queues": 6,
        "vectors": 14,
        "data_nic_bus": "bus=br1,addr=0x1",
        # What the guest sees (asserted by molecule/lab/tests/test_lab.py).
        "expect": {
            "cpus": 8,
            "numa_nodes": {0: "0-3", 1: "4-7"},
            "data_nic": "enp66s1",
            "data_nic_pci": "0000:42:01.0",
            "data_nic_numa_node": 1,
            "irqbalance": True,
        },
    },
    "small-node": {
        "description": "4 CPUs, 1 socket, no SMT, 1 NUMA node, 2-queue virtio NIC "
        "on the root bus, no irqbalance",
        "variant": "no-irqbalance",
        "args": [
            "-cpu", "Nehalem",
            "-smp", "4,sockets=1,cores=4,threads=1",
            "-m", "768",
        ],
        "queues": 2,
        "vectors": 6,
        "data_nic_bus": "bus=pci.0,addr=0x4",
        "expect": {
            "cpus": 4,
            "numa_nodes": {0: "0-3"},
            "data_nic": "ens4",
            "data_nic_pci": "0000:00:04.0",
            "data_nic_numa_node": -1,
            "irqbalance": False,
        },
    },
}
# open-nic is small-node (same keys in the same order, so the QEMU command line and
# the saved states keyed on it do not change) plus the vmxnet3 NIC.
SHAPES["open-nic"] = dict(
    SHAPES["small-node"],
    description="small-node plus a 4-queue vmxnet3 NIC (ens8, PCI 0000:00:08.0) whose "
    "queue IRQs exist only once the interface is opened; ifupdown brings it up at boot "
    "(allow-hotplug), as on a user's host; its user-mode network is cut off (restrict=on)",
    args=SHAPES["small-node"]["args"] + [
        "-netdev", "user,id=open0,restrict=on",
        "-device", "vmxnet3,netdev=open0,bus=pci.0,addr=0x8",
    ],
    expect=dict(SHAPES["small-node"]["expect"], open_nic="ens8", open_nic_pci="0000:00:08.0"),
)

# How a guest's kernel is loaded:
#   direct: QEMU loads the image's vmlinuz/initrd with KERNEL_CMDLINE (+ kernel_args)
#   grub:   QEMU loads GRUB's core image (lnxboot.img + core.img, built in the
#           image from the guest's own GRUB), which reads the guest's
#           /boot/grub/grub.cfg: kernel parameters come from /etc/default/grub
#           and update-grub inside the guest, so a role that edits them is
#           proven by a real reboot.
BOOTS = ("direct", "grub")


class LabError(Exception):
    """A lab operation failed; the message says what and where to look."""


class BootStall(LabError):
    """A cold boot's console went quiet for STALL_SECONDS before SSH answered."""


def log(msg: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[lab {stamp}] {msg}", file=sys.stderr, flush=True)


def run(argv, check=True, capture=False, **kw):
    """Run a command; on failure raise LabError with its output."""
    res = subprocess.run(argv, text=True, capture_output=capture, check=False, **kw)
    if check and res.returncode != 0:
        detail = ""
        if capture:
            detail = "\n" + (res.stdout or "")[-2000:] + (res.stderr or "")[-2000:]
        raise LabError(f"command failed (rc={res.returncode}): {shlex.join(map(str, argv))}{detail}")
    return res


# --------------------------------------------------------------------------
# Host prerequisites
# --------------------------------------------------------------------------

def ensure_host_packages(packages=None) -> None:
    """apt-get install the host packages whose commands are missing."""
    wanted = packages or HOST_PACKAGES
    missing = [pkg for pkg, cmd in wanted.items()
               if not (os.path.exists(cmd) if cmd.startswith("/") else shutil.which(cmd))]
    if not missing:
        return
    if os.geteuid() != 0:
        raise LabError(f"missing host packages {missing}; install them or run as root")
    log(f"installing host packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    if run(cmd, check=False, env=env).returncode != 0:
        run(["apt-get", "update"], env=env)
        run(cmd, env=env)


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (debootstrap, tap devices)")


# --------------------------------------------------------------------------
# Image build and cache
# --------------------------------------------------------------------------

def read_packages(name: str = "packages.txt") -> list[str]:
    pkgs = []
    for line in (HERE / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pkgs.append(line)
    return pkgs


def debian_mirror() -> str:
    """The Debian mirror this host's apt uses for SUITE (deb822 or one-line)."""
    env = os.environ.get("GPUNODE_LAB_MIRROR")
    if env:
        return env.rstrip("/")
    candidates = []
    files = sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))
    for path in files:
        for stanza in re.split(r"\n\s*\n", Path(path).read_text()):
            fields = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                key, _sep, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() == "no":
                continue
            if "deb" in fields.get("types", "").split() and SUITE in fields.get("suites", "").split():
                candidates += fields.get("uris", "").split()
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        if not os.path.exists(path):
            continue
        for line in Path(path).read_text().splitlines():
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE:
                candidates.append(words[1])
    if not candidates:
        raise LabError(
            f"no Debian mirror for '{SUITE}' in /etc/apt/sources.list(.d); set GPUNODE_LAB_MIRROR"
        )
    return candidates[0].rstrip("/")


def ssh_key() -> Path:
    """The lab's root SSH key, generated once and kept in the cache dir."""
    key = CACHE / "ssh" / "id_ed25519"
    if not key.exists():
        ensure_host_packages({"openssh-client": "ssh-keygen"})
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = key.with_name(f".tmp-{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpunode-lab", "-f", str(tmp)], capture=True)
        os.replace(f"{tmp}.pub", f"{key}.pub")
        os.replace(tmp, key)
    return key


def cache_key() -> tuple[str, dict]:
    """sha256 over everything that goes into the image."""
    inputs = {
        "recipe_version": RECIPE_VERSION,
        "suite": SUITE,
        "disk_size": DISK_SIZE,
        "variants": VARIANTS,
        "packages.txt": hashlib.sha256((HERE / "packages.txt").read_bytes()).hexdigest(),
        "packages-apt.txt": hashlib.sha256((HERE / "packages-apt.txt").read_bytes()).hexdigest(),
        "customize.sh": hashlib.sha256((HERE / "customize.sh").read_bytes()).hexdigest(),
        "ssh_pubkey": hashlib.sha256(Path(f"{ssh_key()}.pub").read_bytes()).hexdigest(),
        "vendor": vendor_archives(),
    }
    blob = json.dumps(inputs, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16], inputs


def vendor_archives() -> dict:
    """{name: sha256} of the enroot/pyxis archives that are present and match SHA256SUMS."""
    sums = {}
    with contextlib.suppress(OSError):
        for line in (VENDOR / "SHA256SUMS").read_text().splitlines():
            words = line.split()
            if len(words) == 2:
                sums[words[1].lstrip("*")] = words[0]
    found = {}
    for name, archive in VENDOR_ARCHIVES.items():
        path = VENDOR / archive
        if not path.is_file():
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if sums.get(archive) != digest:
            raise LabError(f"{path}: sha256 {digest} does not match {VENDOR / 'SHA256SUMS'}")
        found[name] = digest
    return found


def build_vendor(rootfs: Path, step) -> dict:
    """Build enroot and pyxis on the host (glibc, no musl submodules) into rootfs.

    The recipe is the one ../shared/LAB.md records. Returns what was installed.
    """
    found = vendor_archives()
    if not found:
        log(f"no enroot/pyxis archives in {VENDOR}: the image has neither")
        return {}
    ensure_host_packages(VENDOR_BUILD_PACKAGES)
    installed = {}
    with tempfile.TemporaryDirectory(prefix="gpunode-vendor-") as tmp:
        for name in found:
            step(["tar", "-xzf", str(VENDOR / VENDOR_ARCHIVES[name]), "-C", tmp])
        if "enroot" in found:
            src = next(Path(tmp).glob("enroot-*"))
            env = dict(os.environ, CPPFLAGS="-D_GNU_SOURCE= -include bsd/string.h")
            common = ["make", "-C", str(src), "FORCE_GLIBC=1", "DEPS=", "prefix=", "exec_prefix=/usr",
                      "datarootdir=/usr/share", "-o", "deps"]
            step(common, env=env)
            step([*common, "install", f"DESTDIR={rootfs}"], env=env)
            installed["enroot"] = "/usr/bin/enroot"
        if "pyxis" in found:
            src = next(Path(tmp).glob("pyxis-*"))
            step(["make", "-C", str(src)])
            step(["make", "-C", str(src), "install", f"DESTDIR={rootfs}"])
            installed["pyxis"] = "/usr/local/lib/slurm/spank_pyxis.so"
    return installed


def image_dir(key: str) -> Path:
    return CACHE / "images" / key


@contextlib.contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mnt = line.split()[4].replace("\\040", " ")
            if mnt.startswith(prefix):
                found.append(mnt)
    return sorted(found, key=len, reverse=True)


def remove_build_dir(path: Path) -> None:
    """Remove a (possibly interrupted) build dir, unmounting anything inside first."""
    for mnt in mounts_under(path):
        run(["umount", "-l", mnt], check=False)
    if mounts_under(path):
        raise LabError(f"cannot unmount everything under {path}")
    shutil.rmtree(path, ignore_errors=True)


def build(force: bool = False) -> tuple[Path, bool]:
    """Build the image for the current inputs, or reuse the cached one.

    Returns (image dir, True if it was built now).
    """
    require_root()
    CACHE.mkdir(parents=True, exist_ok=True)
    key, inputs = cache_key()
    final = image_dir(key)
    if (final / "manifest.json").exists() and not force:
        return final, False
    with locked(CACHE / ".build.lock"):
        if (final / "manifest.json").exists() and not force:
            return final, False   # another process built it while we waited
        # Leftovers of interrupted builds are never used: only a renamed,
        # complete directory with a manifest counts as cached.
        for stale in (CACHE / "images").glob(".tmp-*"):
            log(f"removing interrupted build {stale}")
            remove_build_dir(stale)
        ensure_host_packages()
        (CACHE / "images").mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=CACHE / "images"))
        try:
            _build_into(tmp, key, inputs)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            remove_build_dir(tmp)
            raise
        prune_images(keep=final)
    return final, True


def _build_into(out: Path, key: str, inputs: dict) -> None:
    t0 = time.monotonic()
    rootfs = out / "rootfs"
    buildlog = out / "build.log"
    mirror = debian_mirror()
    pkgs = read_packages()
    debs = CACHE / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    log(f"building image {key}: debootstrap {SUITE} from {mirror} ({len(pkgs)} packages); log: {buildlog}")

    def step(argv, **kw):
        with open(buildlog, "a") as fh:
            fh.write(f"\n$ {shlex.join(map(str, argv))}\n")
            fh.flush()
            res = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, text=True, check=False, **kw)
        if res.returncode != 0:
            tail = "".join(buildlog.read_text().splitlines(keepends=True)[-40:])
            raise LabError(f"build step failed (rc={res.returncode}): {shlex.join(map(str, argv))}\n{tail}")

    step([
        "debootstrap", "--variant=minbase", f"--cache-dir={debs}",
        f"--include={','.join(pkgs)}", SUITE, str(rootfs), mirror,
    ])
    log(f"debootstrap done after {time.monotonic() - t0:.0f}s")

    sshdir = rootfs / "root" / ".ssh"
    sshdir.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(f"{ssh_key()}.pub", sshdir / "authorized_keys")
    shutil.copyfile(HERE / "customize.sh", rootfs / "tmp" / "customize.sh")
    policy = rootfs / "usr" / "sbin" / "policy-rc.d"   # never start services in the chroot
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    run(["mount", "-t", "proc", "proc", str(rootfs / "proc")])
    try:
        apt_pkgs = read_packages("packages-apt.txt")
        if apt_pkgs:
            # apt's archive cache is the build cache, so a rebuild downloads nothing new.
            archives = rootfs / "var" / "cache" / "apt" / "archives"
            archives.mkdir(parents=True, exist_ok=True)
            run(["mount", "--bind", str(debs), str(archives)])
            try:
                env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C")
                step(["chroot", str(rootfs), "apt-get", "update", "-qq"], env=env)
                step(["chroot", str(rootfs), "apt-get", "install", "-y", "-q", "--no-install-recommends", *apt_pkgs],
                     env=env)
            finally:
                run(["umount", str(archives)], check=False)
            log(f"apt-get install of {len(apt_pkgs)} packages done after {time.monotonic() - t0:.0f}s")
        step(["chroot", str(rootfs), "/bin/sh", "/tmp/customize.sh"])
        vendor = build_vendor(rootfs, step)
        shutil.copyfile(rootfs / "boot" / "grub-core.lnx", out / "grub-core.lnx")
        kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
        if len(kernels) != 1:
            raise LabError(f"expected one kernel in the image, found {kernels}")
        kver = kernels[0].name[len("vmlinuz-"):]
        shutil.copyfile(kernels[0], out / "vmlinuz")
        shutil.copyfile(rootfs / "boot" / f"initrd.img-{kver}", out / "initrd.img")
        pkglist = subprocess.run(
            ["chroot", str(rootfs), "dpkg-query", "-W", "-f", "${Package}\t${Version}\n"],
            capture_output=True, text=True, check=True,
        ).stdout
        (out / "packages.lock").write_text(pkglist)
        variants = {}
        for name, purge in VARIANTS.items():
            if purge:
                step(["chroot", str(rootfs), "dpkg", "--purge", *purge])
            disk = out / f"{name}.img"
            (rootfs / "tmp" / "customize.sh").unlink(missing_ok=True)
            policy.unlink(missing_ok=True)
            run(["umount", str(rootfs / "proc")])
            try:
                step(["truncate", "-s", DISK_SIZE, str(disk)])
                step([
                    "mkfs.ext4", "-q", "-F", "-L", "gpunode-lab",
                    "-E", "lazy_itable_init=0,lazy_journal_init=0",
                    "-d", str(rootfs), str(disk),
                ])
            finally:
                run(["mount", "-t", "proc", "proc", str(rootfs / "proc")])
                policy.write_text("#!/bin/sh\nexit 101\n")
                policy.chmod(0o755)
            disk.chmod(0o444)
            variants[name] = {"disk": disk.name, "purged": purge}
            log(f"variant {name}: {disk.name} done after {time.monotonic() - t0:.0f}s")
    finally:
        for mnt in mounts_under(rootfs):
            run(["umount", "-l", mnt], check=False)
    shutil.rmtree(rootfs)
    manifest = {
        "key": key,
        "inputs": inputs,
        "mirror": mirror,
        "kernel": kver,
        "variants": variants,
        "vendor": vendor,
        "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "build_seconds": round(time.monotonic() - t0),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"image {key} built in {manifest['build_seconds']}s (kernel {kver})")


def prune_images(keep: Path) -> None:
    """Keep the newest KEEP image generations (other clones may use older ones)."""
    images = sorted(
        (p for p in (CACHE / "images").iterdir() if not p.name.startswith(".") and p != keep),
        key=lambda p: p.stat().st_mtime, reverse=True,
    )
    for old in images[max(KEEP - 1, 0):]:
        log(f"pruning old image {old}")
        shutil.rmtree(old, ignore_errors=True)


def current_image() -> Path:
    """The cached image for the current inputs, building it if needed."""
    key = cache_key()[0]
    final = image_dir(key)
    if (final / "manifest.json").exists():
        return final
    return build()[0]


# --------------------------------------------------------------------------
# Guests
# --------------------------------------------------------------------------

def tap_name(name: str) -> str:
    """Short (IFNAMSIZ 15), unique per instance name and state dir."""
    return TAP_PREFIX + hashlib.sha256(f"{STATE}/{name}".encode()).hexdigest()[:8]


def mac(shape: str, nic: int) -> str:
    """Per shape, not per guest: a restored guest must have the saved MACs.
    Guests never share a network (each has its own slirp and tap)."""
    h = hashlib.sha256(shape.encode()).digest()
    return f"52:54:00:{h[0]:02x}:{h[1]:02x}:{nic:02x}"


def inst_dir(name: str) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", name):
        raise LabError(f"bad instance name {name!r}: use letters, digits, '-', '_', '.'")
    return STATE / name


def load_instance(name: str) -> dict | None:
    path = inst_dir(name) / "instance.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def instances() -> list[str]:
    if not STATE.is_dir():
        return []
    return sorted(p.name for p in STATE.iterdir() if p.is_dir())


def pid_alive(pid: int | None, marker: str | None = None) -> bool:
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
        return False
    return marker is None or marker in cmdline


def read_pid(d: Path) -> int | None:
    try:
        return int((d / "qemu.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def console_tail(name: str, lines: int = 60) -> str:
    path = inst_dir(name) / "console.log"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no console log at {path})"
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return f"---- last {len(tail)} lines of {path} ----\n" + "\n".join(tail) + "\n---- end of console log ----"


def qemu_argv(name: str, shape: str, port: int, image: Path, accel: str,
              kernel_args: str = "", boot: str = "direct", incoming: Path | None = None) -> list[str]:
    """QEMU's command line. Apart from the instance paths, the tap name and the
    SSH port, it depends only on (shape, image, accel, kernel_args, boot), so a
    saved state of that key restores into any instance (see saved_state)."""
    d = inst_dir(name)
    spec = SHAPES[shape]
    tap = tap_name(name)
    accel_arg = "kvm" if accel == "kvm" else "tcg,thread=multi"
    if boot == "grub":
        kernel = ["-kernel", str(image / "grub-core.lnx")]
    else:
        append = KERNEL_CMDLINE + (f" {kernel_args}" if kernel_args else "")
        kernel = ["-kernel", str(image / "vmlinuz"), "-initrd", str(image / "initrd.img"), "-append", append]
    return [
        QEMU,
        "-name", f"gpunode-lab-{name}",
        "-machine", "pc",
        "-accel", accel_arg,
        "-nodefaults", "-no-user-config",
        "-display", "none",
        *spec["args"],
        *kernel,
        "-drive", f"file={d / 'disk.qcow2'},if=none,id=d0,format=qcow2,cache=unsafe",
        "-device", "virtio-blk-pci,drive=d0,bus=pci.0,addr=0x5",
        "-netdev", f"user,id=mgmt,hostfwd=tcp:127.0.0.1:{port}-:22",
        "-device", f"virtio-net-pci,netdev=mgmt,mac={mac(shape, 1)},bus=pci.0,addr=0x3",
        "-netdev", f"tap,id=data,ifname={tap},script=no,downscript=no,queues={spec['queues']}",
        "-device", f"virtio-net-pci,netdev=data,mq=on,vectors={spec['vectors']},"
                   f"mac={mac(shape, 2)},{spec['data_nic_bus']}",
        "-serial", f"file:{d / 'console.log'}",
        "-monitor", f"unix:{d / 'monitor.sock'},server=on,wait=off",
        "-pidfile", str(d / "qemu.pid"),
        *(["-incoming", f"exec:cat {shlex.quote(str(incoming))}"] if incoming else []),
        "-daemonize",
    ]


def normalized_argv(argv: list[str], name: str, port: int) -> list[str]:
    """argv with what differs between instances replaced by placeholders."""
    d, tap = str(inst_dir(name)), tap_name(name)
    out = []
    for arg in argv:
        if arg.startswith("exec:cat "):
            continue
        arg = arg.replace(d, "@DIR@").replace(tap, "@TAP@").replace(f"127.0.0.1:{port}-", "127.0.0.1:@PORT@-")
        out.append(arg.replace(f"gpunode-lab-{name}", "gpunode-lab-@NAME@"))
    return [a for a in out if a != "-incoming"]


def hmp(sock: Path, command: str, timeout: float = 30.0) -> str:
    """One HMP monitor command over QEMU's unix socket; returns its output."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        buf = b""
        while not buf.endswith(b"(qemu) "):
            chunk = s.recv(65536)
            if not chunk:
                raise LabError(f"monitor {sock} closed")
            buf += chunk
        s.sendall(command.encode() + b"\n")
        buf = b""
        while not buf.endswith(b"(qemu) "):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", buf.decode(errors="replace")).replace("\r", "")
    lines = text.splitlines()
    # The monitor echoes the command line first and ends with the next prompt.
    return "\n".join(line for line in lines[1:] if line.strip() != "(qemu)").strip()


def wait_migration(sock: Path, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        out = hmp(sock, "info migrate")
        status = re.search(r"Migration status: (\S+)", out)
        if status and status.group(1) == "completed":
            return
        if status and status.group(1) in ("failed", "cancelled"):
            raise LabError(f"{what}: migration {status.group(1)}:\n{out}")
        if time.monotonic() > deadline:
            raise LabError(f"{what}: migration not completed within {timeout:.0f}s:\n{out}")
        time.sleep(0.2)


def ssh_base(port: int, key: Path) -> list[str]:
    return [
        "ssh", "-i", str(key), "-p", str(port),
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
        "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15",
        "root@127.0.0.1",
    ]


def ssh_banner(port: int, timeout: float = 5.0) -> bool:
    """True when the guest's sshd (not just QEMU's port forward) answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def wait_for_ssh(name: str, inst: dict, deadline: float, poll: float = 2.0, stall: float | None = None) -> None:
    """Wait for SSH; with ``stall``, raise BootStall when the console has not grown for that many seconds."""
    key = Path(inst["identity_file"])
    console = inst_dir(name) / "console.log"
    size, changed = -1, time.monotonic()
    while True:
        if not pid_alive(inst["pid"]):
            raise LabError(f"guest {name}: QEMU exited during boot\n{console_tail(name)}")
        if stall:
            now_size = console.stat().st_size if console.exists() else 0
            if now_size != size:
                size, changed = now_size, time.monotonic()
            elif time.monotonic() - changed > stall:
                raise BootStall(f"guest {name}: the console printed nothing for {stall:.0f}s and SSH does not answer "
                                f"(a stalled boot)\n{console_tail(name)}")
        if ssh_banner(inst["port"]):
            try:
                res = subprocess.run(
                    [*ssh_base(inst["port"], key), "true"], capture_output=True, text=True, timeout=60, check=False,
                )
                if res.returncode == 0:
                    break
            except subprocess.TimeoutExpired:
                pass
        if time.monotonic() > deadline:
            raise LabError(f"guest {name}: no SSH on 127.0.0.1:{inst['port']} within the boot timeout\n{console_tail(name)}")
        time.sleep(poll)
    # Let the boot finish (irqbalance, networking) so tests see a settled guest.
    remaining = max(int(deadline - time.monotonic()), 10)
    try:
        res = subprocess.run(
            [*ssh_base(inst["port"], key),
             f"timeout {remaining} systemctl is-system-running --wait; systemctl --failed --no-legend"],
            capture_output=True, text=True, timeout=remaining + 60, check=False,
        )
        state = (res.stdout.splitlines() or ["unknown"])[0].strip()
    except subprocess.TimeoutExpired:
        state = "timeout"
    if state not in ("running", "degraded"):
        raise LabError(f"guest {name}: boot did not finish (state {state!r})\n{console_tail(name)}")
    if state == "degraded":
        log(f"guest {name}: degraded, failed units:\n{res.stdout}")


def start_qemu(name: str, shape: str, port: int, image: Path, accel: str, hostname: str,
               kernel_args: str = "", boot: str = "direct", state: Path | None = None) -> dict:
    """Start QEMU for an instance: a cold boot, or (state given) a restore of a saved state."""
    d = inst_dir(name)
    variant = SHAPES[shape]["variant"]
    for f in ("disk.qcow2", "console.log", "qemu.pid", "monitor.sock"):
        (d / f).unlink(missing_ok=True)
    if state:
        backing, fmt = state / "disk.qcow2", "qcow2"
    else:
        backing, fmt = image / f"{variant}.img", "raw"
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", fmt, "-b", str(backing), str(d / "disk.qcow2")], capture=True)
    argv = qemu_argv(name, shape, port, image, accel, kernel_args, boot, incoming=state / "state.bin" if state else None)
    if state:
        saved = json.loads((state / "manifest.json").read_text())["argv"]
        if normalized_argv(argv, name, port) != saved:
            raise LabError(f"saved state {state} was taken with another QEMU command line; remove it to re-save")
    (d / "qemu.argv").write_text(shlex.join(argv) + "\n")
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if res.returncode != 0:
        raise LabError(f"guest {name}: QEMU did not start (rc={res.returncode}):\n{res.stderr}{res.stdout}")
    pid = read_pid(d)
    tap = tap_name(name)
    # The tap exists as long as QEMU holds it. No address, no IPv6 link-local:
    # the host sends nothing into it.
    run(["ip", "link", "set", "dev", tap, "addrgenmode", "none"], capture=True)
    run(["ip", "link", "set", "dev", tap, "up"], capture=True)
    if state:
        # The saved machine was stopped; run it once the incoming stream is in.
        wait_migration(d / "monitor.sock", 120, f"guest {name}: restore of {state}")
        hmp(d / "monitor.sock", "cont")
    inst = {
        "name": name,
        "shape": shape,
        "hostname": hostname,
        "kernel_args": kernel_args,
        "boot": boot,
        "restored_from": str(state) if state else None,
        "address": "127.0.0.1",
        "port": port,
        "user": "root",
        "identity_file": str(ssh_key()),
        "tap": tap,
        "queues": SHAPES[shape]["queues"],
        "pid": pid,
        "accel": accel,
        "image": str(image),
        "variant": variant,
        "state_dir": str(d),
        "console_log": str(d / "console.log"),
        "monitor": str(d / "monitor.sock"),
        "expect": SHAPES[shape]["expect"],
    }
    (d / "instance.json").write_text(json.dumps(inst, indent=2) + "\n")
    return inst


def kvm_usable(image: Path) -> bool:
    """Opt-in KVM: only if /dev/kvm is hardware KVM and a probe guest boots (cached per host+image).

    kvm-pvm (a software hypervisor that runs a stock kernel at about 0.5 MIPS)
    and a CPU without vmx/svm are refused without a probe boot.
    """
    if not os.path.exists("/dev/kvm") or os.path.exists("/sys/module/kvm_pvm"):
        return False
    with contextlib.suppress(OSError):
        flags = re.findall(r"(?m)^flags\s*:.*$", Path("/proc/cpuinfo").read_text())
        if flags and not re.search(r"\b(vmx|svm)\b", flags[0]):
            return False
    probe_file = STATE / f"kvm-probe-{image.name}-{os.uname().release}.json"
    if probe_file.exists():
        return json.loads(probe_file.read_text())["ok"]
    name = "kvm-probe"
    log(f"probing KVM with a guest boot (up to {KVM_PROBE_TIMEOUT}s)")
    ok = False
    try:
        up(name, "small-node", free_port(), accel="kvm", timeout=KVM_PROBE_TIMEOUT, probe=True, cold=True)
        ok = True
    except LabError as exc:
        log(f"KVM probe failed, using TCG: {str(exc).splitlines()[0]}")
    finally:
        down(name)
    probe_file.write_text(json.dumps({"ok": ok}) + "\n")
    return ok


def state_key(shape: str, accel: str, kernel_args: str, boot: str) -> str:
    """The saved state's name: a different base command line is a different state (a restore of a state saved with
    another one would fail the command-line check)."""
    return f"{shape}-{accel}-{boot}-" + hashlib.sha256(f"{GUEST_CMDLINE}|{kernel_args}".encode()).hexdigest()[:8]


def qemu_version() -> str:
    return run([QEMU, "--version"], capture=True).stdout.splitlines()[0].strip()


def guest_ssh(inst: dict, command: str, timeout: int = 120, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([*ssh_base(inst["port"], Path(inst["identity_file"])), command],
                         capture_output=True, text=True, timeout=timeout, check=False)
    if check and res.returncode != 0:
        raise LabError(f"guest {inst['name']}: {command!r} -> rc {res.returncode}\n{res.stdout}{res.stderr}")
    return res


def saved_state(image: Path, shape: str, accel: str, kernel_args: str, boot: str, timeout: int) -> Path:
    """The saved booted state for this key, booting and saving it once if needed.

    Cached beside the image (a new image generation or QEMU version gets new
    states): <image>/states/<key>/{state.bin, disk.qcow2, manifest.json}. Saved
    right after a cold boot settled, with the neutral hostname gpunode-lab and
    no SSH session open (slirp connections are not migrated).
    """
    key = state_key(shape, accel, kernel_args, boot)
    final = image / "states" / key
    version = qemu_version()
    if (final / "manifest.json").exists():
        if json.loads((final / "manifest.json").read_text()).get("qemu") == version:
            return final
    # One save at a time, whatever the key: a cold boot under TCG needs the
    # machine's cores (four at once on 2 cores missed a 300 s boot timeout).
    with locked(image / "states" / ".save.lock"):
        if (final / "manifest.json").exists():
            if json.loads((final / "manifest.json").read_text()).get("qemu") == version:
                return final
            shutil.rmtree(final)
        name = f"save-{key}"[:63]
        t0 = time.monotonic()
        port = free_port()
        log(f"saving a booted {shape} ({boot} boot{', ' + kernel_args if kernel_args else ''}): cold boot of {name}")
        try:
            for attempt in range(1, SAVE_ATTEMPTS + 1):
                try:
                    inst = up(name, shape, port, accel=accel, timeout=max(timeout, SAVE_BOOT_TIMEOUT), hostname="gpunode-lab",
                              kernel_args=kernel_args, boot="direct" if boot == "grub" else boot, cold=True)
                    break
                except BootStall as exc:
                    if attempt == SAVE_ATTEMPTS:
                        raise
                    log(f"{exc.args[0].splitlines()[0]}; cold boot again (attempt {attempt + 1} of {SAVE_ATTEMPTS})")
                    port = free_port()
            if boot == "grub":
                _switch_to_grub(inst, image, kernel_args, max(timeout, SAVE_BOOT_TIMEOUT))
            d = inst_dir(name)
            sock = d / "monitor.sock"
            hmp(sock, "migrate_set_parameter max-bandwidth 20G")
            hmp(sock, "stop")
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=image / "states"))
            hmp(sock, f'migrate "exec:cat > {tmp / "state.bin"}"')
            wait_migration(sock, 300, f"save of {name}")
            argv = normalized_argv(shlex.split((d / "qemu.argv").read_text()), name, port)
            kill_pid(read_pid(d) or 0, str(d / "qemu.pid"))
            # QEMU flushed the overlay at the end of the migration; it is the
            # saved disk (a few MiB over the image, which it names as backing file).
            shutil.copyfile(d / "disk.qcow2", tmp / "disk.qcow2")
            (tmp / "manifest.json").write_text(json.dumps({
                "key": key, "shape": shape, "accel": accel, "kernel_args": kernel_args, "boot": boot,
                "qemu": version, "argv": argv,
                "saved": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "seconds": round(time.monotonic() - t0, 1),
            }, indent=2) + "\n")
            os.rename(tmp, final)
        finally:
            down(name)
            for stale in (image / "states").glob(f".tmp-{key}-*"):
                shutil.rmtree(stale, ignore_errors=True)
        log(f"saved {final} in {time.monotonic() - t0:.0f}s")
    return final


def _switch_to_grub(inst: dict, image: Path, kernel_args: str, timeout: int) -> None:
    """First GRUB boot: write grub.cfg with update-grub in the directly booted
    guest (grub-probe finds no root device in a chroot), power off, and start
    the same disk through GRUB's core image."""
    name = inst["name"]
    extra = f' {kernel_args}' if kernel_args else ""
    guest_ssh(inst, f"sed -i 's|^GRUB_CMDLINE_LINUX=.*|GRUB_CMDLINE_LINUX=\"{GUEST_CMDLINE}"
              + extra + "\"|' /etc/default/grub.d/gpunode-lab.cfg && update-grub 2>&1 && sync", timeout=300)
    guest_ssh(inst, f"systemd-run {TIMER_NOW} --on-active=1 systemctl poweroff", check=False)
    d = inst_dir(name)
    deadline = time.monotonic() + timeout
    while pid_alive(inst["pid"], str(d / "qemu.pid")):
        if time.monotonic() > deadline:
            raise LabError(f"guest {name}: did not power off\n{console_tail(name)}")
        time.sleep(1)
    argv = qemu_argv(name, inst["shape"], inst["port"], image, inst["accel"], kernel_args, "grub")
    (d / "qemu.argv").write_text(shlex.join(argv) + "\n")
    (d / "qemu.pid").unlink(missing_ok=True)
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if res.returncode != 0:
        raise LabError(f"guest {name}: QEMU (GRUB boot) did not start:\n{res.stderr}")
    inst["pid"] = read_pid(d)
    run(["ip", "link", "set", "dev", inst["tap"], "addrgenmode", "none"], capture=True)
    run(["ip", "link", "set", "dev", inst["tap"], "up"], capture=True)
    wait_for_ssh(name, inst, deadline)
    cmdline = guest_ssh(inst, "cat /proc/cmdline").stdout
    if "BOOT_IMAGE=" not in cmdline:
        raise LabError(f"guest {name}: not booted through GRUB: /proc/cmdline = {cmdline!r}")


def personalize(inst: dict, hostname: str) -> None:
    """What every clone of a saved state shares and must not: hostname and clock.

    The guest clock restarts at the save instant (the image has no NTP);
    /etc/hostname makes the name survive a reboot.
    """
    guest_ssh(inst, f"date -s @{time.time():.3f} >/dev/null && hostname {shlex.quote(hostname)} && "
                    f"echo {shlex.quote(hostname)} > /etc/hostname")
    install_pyc_hook(inst)


# The guest's byte-code cache for modules imported from zip archives (AnsiballZ payloads): see the file's docstring.
# GPUNODE_LAB_PYC=0 leaves it out (for an A/B of the lab's cost).
PYC_HOOK = HERE / "guest" / "gpunode_lab_pyc.py"
PYC_CACHE = "/var/cache/gpunode-lab-pyc"


def install_pyc_hook(inst: dict) -> None:
    """Install the byte-code cache hook (a site .pth line and its module) in the guest, or remove it."""
    site = "/usr/local/lib/python3.11/dist-packages"
    if os.environ.get("GPUNODE_LAB_PYC", "1") == "0":
        guest_ssh(inst, f"rm -rf {site}/gpunode_lab_pyc.pth {site}/gpunode_lab_pyc.py {PYC_CACHE}")
        return
    script = (f"install -d -m 0755 {site} && install -d -m 0700 -o root -g root {PYC_CACHE} && "
              f"cat > {site}/gpunode_lab_pyc.py && echo 'import gpunode_lab_pyc' > {site}/gpunode_lab_pyc.pth")
    res = subprocess.run(ssh_base(inst["port"], Path(inst["identity_file"])) + [script], input=PYC_HOOK.read_text(),
                         capture_output=True, text=True, timeout=60, check=False)
    if res.returncode != 0:
        raise LabError(f"guest {inst['name']}: installing the byte-code cache hook failed: {res.stderr.strip()}")


def up(name: str, shape: str, port: int | None, accel: str | None = None,
       timeout: int | None = None, hostname: str | None = None, probe: bool = False,
       kernel_args: str = "", boot: str = "direct", cold: bool = False) -> dict:
    """Start a guest and wait for SSH: restored from the shape's saved booted
    state (saved once per image, shape, kernel_args and boot), or booted cold."""
    require_root()
    if shape not in SHAPES:
        raise LabError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    if boot not in BOOTS:
        raise LabError(f"unknown boot {boot!r}; known: {', '.join(BOOTS)}")
    if not re.fullmatch(r"[A-Za-z0-9_.,=:/ -]*", kernel_args or ""):
        raise LabError(f"kernel_args {kernel_args!r}: expected space-separated kernel parameters such as 'isolcpus=2 nohz_full=3'")
    hostname = hostname or name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}", hostname):
        raise LabError(f"hostname {hostname!r}: expected letters, digits and '-'")
    ensure_host_packages({k: v for k, v in HOST_PACKAGES.items() if k != "debootstrap"})
    image = current_image()
    if accel is None:
        accel = os.environ.get("GPUNODE_LAB_ACCEL", "tcg")
    if accel not in ("tcg", "kvm"):
        raise LabError(f"GPUNODE_LAB_ACCEL must be tcg or kvm, not {accel!r}")
    if accel == "kvm" and not probe and not kvm_usable(image):
        accel = "tcg"
    state = None
    if not cold:
        state = saved_state(image, shape, accel, kernel_args or "", boot, timeout or BOOT_TIMEOUT)
    d = inst_dir(name)
    if d.exists():
        log(f"instance {name} exists; replacing it")
        down(name)
    port = port or free_port()
    if not port_free(port):
        raise LabError(f"127.0.0.1:{port} is in use; pick another --port")
    STATE.mkdir(parents=True, exist_ok=True, mode=0o700)
    (STATE / "failed" / f"{name}.console.log").unlink(missing_ok=True)
    d.mkdir(mode=0o700)
    t0 = time.monotonic()
    deadline = t0 + (timeout or BOOT_TIMEOUT)
    how = f"restoring {state.name}" if state else f"booting ({boot})"
    log(f"{how}: {name} ({shape}, {accel}) ssh 127.0.0.1:{port}, tap {tap_name(name)}")
    try:
        inst = start_qemu(name, shape, port, image, accel, hostname, kernel_args or "", boot, state)
        wait_for_ssh(name, inst, deadline, poll=0.3 if state else 2.0, stall=STALL_SECONDS if cold and not probe else None)
        personalize(inst, hostname)
    except BaseException:
        if not probe:
            with contextlib.suppress(Exception):
                down(name, keep_logs=True)
        raise
    inst["boot_seconds"] = round(time.monotonic() - t0, 1)
    (d / "instance.json").write_text(json.dumps(inst, indent=2) + "\n")
    log(f"{name} up after {inst['boot_seconds']}s")
    return inst


def netns_with_link(tap: str) -> list[str]:
    res = run(["ip", "-j", "netns", "list"], check=False, capture=True)
    names = []
    with contextlib.suppress(ValueError):
        names = [n["name"] for n in json.loads(res.stdout or "[]")]
    return [ns for ns in names
            if run(["ip", "-n", ns, "link", "show", "dev", tap], check=False, capture=True).returncode == 0]


def remove_tap(tap: str) -> None:
    if os.path.exists(f"/sys/class/net/{tap}"):
        run(["ip", "link", "del", "dev", tap], check=False, capture=True)
    for ns in netns_with_link(tap):   # a test may have moved the tap into its namespace
        run(["ip", "-n", ns, "link", "del", "dev", tap], check=False, capture=True)


def kill_pid(pid: int, marker: str) -> None:
    if not pid_alive(pid, marker):
        return
    os.kill(pid, signal.SIGTERM)
    for _attempt in range(100):
        if not pid_alive(pid, marker):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    for _attempt in range(50):
        if not pid_alive(pid, marker):
            return
        time.sleep(0.1)
    raise LabError(f"QEMU pid {pid} does not die")


def down(name: str, keep_logs: bool = False) -> None:
    """Stop a guest, remove its tap and overlay. Idempotent."""
    d = inst_dir(name)
    marker = str(d / "qemu.pid")       # QEMU's own argv names its pidfile
    inst = None
    with contextlib.suppress(OSError, ValueError):
        inst = load_instance(name)
    kill_pid(read_pid(d) or 0, marker)
    for tap in sorted({tap_name(name), (inst or {}).get("tap") or tap_name(name)}):
        remove_tap(tap)
    if not d.exists():
        return
    if keep_logs:
        # Keep the console log of a failed boot for humans; drop the rest.
        keep = STATE / "failed"
        keep.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            shutil.copyfile(d / "console.log", keep / f"{name}.console.log")
    shutil.rmtree(d, ignore_errors=True)


def orphan_qemu_pids() -> list[int]:
    """QEMU processes started from this state dir whose instance dir is gone."""
    pids = []
    needle = f"{STATE}/".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(QEMU.encode()) and any(
            a.startswith(needle) and a.endswith(b"/qemu.pid") for a in argv
        ):
            pids.append(int(proc.name))
    return pids


def taps_in_use() -> set[str]:
    used = set()
    for fdinfo in glob.glob("/proc/[0-9]*/fdinfo/*"):
        with contextlib.suppress(OSError):
            for line in Path(fdinfo).read_text().splitlines():
                if line.startswith("iff:"):
                    used.add(line.split()[1])
    return used


def down_all() -> None:
    for name in instances():
        if name == "failed":
            continue
        down(name)
    for pid in orphan_qemu_pids():
        log(f"killing orphaned lab QEMU pid {pid}")
        kill_pid(pid, f"{STATE}/")
    # Stale lab taps (only if nothing holds them open).
    used = taps_in_use()
    for path in glob.glob(f"/sys/class/net/{TAP_PREFIX}*"):
        tap = os.path.basename(path)
        if os.path.exists(f"{path}/tun_flags") and tap not in used:
            log(f"removing stale tap {tap}")
            remove_tap(tap)


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def cmd_build(args) -> int:
    img, built = build(force=args.force)
    manifest = json.loads((img / "manifest.json").read_text())
    if not built:
        log(f"reusing cached image {img} (built {manifest['built']})")
    print(json.dumps({"image": str(img), "key": manifest["key"], "kernel": manifest["kernel"],
                      "reused": not built, "build_seconds": manifest["build_seconds"]}))
    return 0


def cmd_up(args) -> int:
    inst = up(args.name, args.shape, args.port, accel=args.accel, timeout=args.timeout, hostname=args.hostname,
              kernel_args=args.kernel_args, boot=args.boot, cold=args.cold)
    print(json.dumps(inst))
    return 0


def cmd_down(args) -> int:
    require_root()
    if not args.all and not args.name:
        raise LabError("down: give --name NAME (repeatable) or --all")
    errors = []
    targets = args.name or []
    for name in targets:
        try:
            down(name)
        except LabError as exc:
            errors.append(f"{name}: {exc}")
    if args.all:
        down_all()
    if errors:
        raise LabError("; ".join(errors))
    return 0


def cmd_ssh(args) -> int:
    inst = load_instance(args.name)
    if not inst:
        raise LabError(f"no instance {args.name!r} (see: lab.py list)")
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    argv = ssh_base(inst["port"], Path(inst["identity_file"]))
    if not cmd:
        argv.insert(1, "-t")
    os.execvp("ssh", argv + cmd)   # like ssh: the words are joined by the remote shell
    return 1


def cmd_info(args) -> int:
    inst = load_instance(args.name)
    if not inst:
        raise LabError(f"no instance {args.name!r}")
    inst["running"] = pid_alive(inst["pid"], str(inst_dir(args.name) / "qemu.pid"))
    print(json.dumps(inst, indent=2))
    return 0


def cmd_list(args) -> int:
    rows = []
    for name in instances():
        inst = load_instance(name)
        if not inst:
            continue
        alive = pid_alive(inst["pid"], str(inst_dir(name) / "qemu.pid"))
        rows.append(f"{name:24} {inst['shape']:11} 127.0.0.1:{inst['port']:<6} {inst['tap']:13} "
                    f"pid {inst['pid']} {'running' if alive else 'DEAD'}")
    print("\n".join(rows) if rows else "no lab guests")
    return 0


def cmd_console(args) -> int:
    print(console_tail(args.name, args.lines))
    return 0


def cmd_shapes(args) -> int:
    print(json.dumps({k: {"description": v["description"], "queues": v["queues"], "expect": v["expect"]}
                      for k, v in SHAPES.items()}, indent=2))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="lab.py", description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="build or reuse the cached guest image")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    b.set_defaults(func=cmd_build)

    u = sub.add_parser("up", help="boot a guest and wait for SSH")
    u.add_argument("--name", required=True)
    u.add_argument("--shape", required=True, choices=sorted(SHAPES))
    u.add_argument("--port", type=int, default=0, help="127.0.0.1 port for SSH (default: a free one)")
    u.add_argument("--hostname", help="guest hostname (default: the name)")
    u.add_argument("--timeout", type=int, help=f"boot timeout in s (default {BOOT_TIMEOUT})")
    u.add_argument("--accel", choices=["tcg", "kvm"], help="default: $GPUNODE_LAB_ACCEL or tcg")
    u.add_argument("--kernel-args", default="", help="extra kernel parameters, e.g. 'isolcpus=2 nohz_full=3' "
                   "(with --boot grub: the first GRUB_CMDLINE_LINUX)")
    u.add_argument("--boot", default="direct", choices=BOOTS,
                   help="direct: QEMU loads the kernel; grub: the guest's own GRUB and grub.cfg")
    u.add_argument("--cold", action="store_true",
                   help="boot from scratch instead of restoring the saved booted state")
    u.set_defaults(func=cmd_up)

    d = sub.add_parser("down", help="stop guests, remove taps and overlays (idempotent)")
    d.add_argument("--name", action="append", help="instance name (repeatable)")
    d.add_argument("--all", action="store_true", help="every guest of this state dir, plus orphans")
    d.set_defaults(func=cmd_down)

    s = sub.add_parser("ssh", help="ssh into a guest: lab.py ssh NAME [-- CMD...]")
    s.add_argument("name")
    s.add_argument("cmd", nargs=argparse.REMAINDER)
    s.set_defaults(func=cmd_ssh)

    i = sub.add_parser("info", help="JSON facts about a guest (port, key, tap, console log)")
    i.add_argument("name")
    i.set_defaults(func=cmd_info)

    lst = sub.add_parser("list", help="running guests")
    lst.set_defaults(func=cmd_list)

    c = sub.add_parser("console", help="tail of a guest's console log")
    c.add_argument("name")
    c.add_argument("-n", "--lines", type=int, default=60)
    c.set_defaults(func=cmd_console)

    sh = sub.add_parser("shapes", help="the guest shapes and what a guest of each shape shows")
    sh.set_defaults(func=cmd_shapes)

    args = p.parse_args(argv)
    try:
        return args.func(args)
    except LabError as exc:
        print(f"lab.py {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
