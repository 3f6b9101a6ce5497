"""The lab guests are what the role scenarios assume they are.

Each test runs once per guest (testinfra ``host`` fixture, hosts from
Molecule's inventory) and compares what the guest's kernel reports with the
shape it was booted as. Expectations are written out here, not taken from
tests/lab/lab.py, so a change in the QEMU command line that alters the
topology fails this scenario.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "molecule" / "_shared"))
from labtest import GUEST_READ, LAB  # noqa: E402  (loads tests/lab/lab.py once for every scenario)

MGMT_PCI = "0000:00:03.0"

EXPECT = {
    "gpu-node": {
        "online": "0-7",
        "nodes": {"node0": "0-3", "node1": "4-7"},
        # QEMU numbers SMT siblings adjacently.
        "siblings": {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3", 4: "4-5", 5: "4-5", 6: "6-7", 7: "6-7"},
        "packages": {0: "0", 1: "0", 2: "0", 3: "0", 4: "1", 5: "1", 6: "1", 7: "1"},
        "data_nic": "enp66s1",
        "data_pci": "0000:42:01.0",
        "data_numa_node": "1",
        "data_local_cpulist": "4-7",
        "queues": 6,
        "irqbalance": True,
    },
    "small-node": {
        "online": "0-3",
        "nodes": {"node0": "0-3"},
        "siblings": {0: "0", 1: "1", 2: "2", 3: "3"},
        "packages": {0: "0", 1: "0", 2: "0", 3: "0"},
        "data_nic": "ens4",
        "data_pci": "0000:00:04.0",
        # Without NUMA information in the firmware tables the kernel reports -1.
        "data_numa_node": "-1",
        "data_local_cpulist": "0-3",
        "queues": 2,
        "irqbalance": False,
    },
}
# small-node plus the vmxnet3 whose IRQs exist only once ifupdown opened it at boot.
EXPECT["open-nic"] = dict(EXPECT["small-node"], open_nic="ens8", open_pci="0000:00:08.0")
# small-node booted through its own GRUB (lab.py up --boot grub).
EXPECT["grub-node"] = dict(EXPECT["small-node"], boot="grub")

# One round trip per guest: everything the tests read from sysfs and procfs.
PROBE = r"""
import glob, json, os, re
PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
""" + GUEST_READ + r"""
f = {"nodes": {}, "cpus": {}, "nics": {}, "interrupts": {}}
f["online"] = rd("/sys/devices/system/cpu/online")
for n in glob.glob("/sys/devices/system/node/node[0-9]*"):
    f["nodes"][os.path.basename(n)] = rd(n + "/cpulist")
for c in glob.glob("/sys/devices/system/cpu/cpu[0-9]*"):
    f["cpus"][os.path.basename(c)[3:]] = {
        "siblings": rd(c + "/topology/thread_siblings_list"),
        "package": rd(c + "/topology/physical_package_id"),
    }
for dev in glob.glob("/sys/class/net/*/device"):
    ifname = dev.split("/")[4]
    child = os.path.realpath(dev)
    pci = child
    while pci != "/" and not PCI.match(os.path.basename(pci)):
        pci = os.path.dirname(pci)
    if pci == "/":
        continue
    msi = pci + "/msi_irqs"
    f["nics"][ifname] = {
        "pci": os.path.basename(pci),
        "device": os.path.basename(child),
        "driver": os.path.basename(os.path.realpath(dev + "/driver")),
        "numa_node": rd(pci + "/numa_node"),
        "local_cpulist": rd(pci + "/local_cpulist"),
        "msi_irqs": sorted(int(i) for i in os.listdir(msi)) if os.path.isdir(msi) else [],
    }
with open("/proc/interrupts") as fh:
    for line in fh:
        parts = line.split()
        if parts and parts[0].rstrip(":").isdigit():
            f["interrupts"][parts[0].rstrip(":")] = parts[-1]
print(json.dumps(f))
"""


@pytest.fixture(scope="module")
def name(host):
    return host.backend.get_hostname()


@pytest.fixture(scope="module")
def expect(name):
    return EXPECT[name]


@pytest.fixture(scope="module")
def guest(host):
    return json.loads(host.check_output("python3 -c %s", PROBE))


@pytest.fixture(scope="module")
def data_nic(guest, expect):
    return guest["nics"][expect["data_nic"]]


def test_online_cpus_match_the_shape(guest, expect):
    assert guest["online"] == expect["online"]
    assert len(guest["cpus"]) == len(expect["siblings"])


def test_numa_nodes_have_the_expected_cpu_lists(guest, expect):
    assert guest["nodes"] == expect["nodes"]


def test_smt_sibling_pairs(guest, expect):
    siblings = {int(cpu): v["siblings"] for cpu, v in guest["cpus"].items()}
    assert siblings == expect["siblings"]


def test_cpus_sit_on_the_expected_sockets(guest, expect):
    packages = {int(cpu): v["package"] for cpu, v in guest["cpus"].items()}
    assert packages == expect["packages"]


def test_only_the_management_and_data_nics_exist(guest, expect):
    assert sorted(guest["nics"]) == sorted(["ens3", expect["data_nic"]] + ([expect["open_nic"]] if "open_nic" in expect else []))
    assert guest["nics"]["ens3"]["pci"] == MGMT_PCI


def test_data_nic_pci_address_and_driver(data_nic, expect):
    assert data_nic["pci"] == expect["data_pci"]
    assert re.fullmatch(r"virtio\d+", data_nic["device"])
    assert data_nic["driver"] == "virtio_net"


def test_data_nic_numa_node(data_nic, expect):
    assert data_nic["numa_node"] == expect["data_numa_node"]
    assert data_nic["local_cpulist"] == expect["data_local_cpulist"]


def test_data_nic_queue_count(host, expect):
    out = host.check_output("ethtool -l %s", expect["data_nic"])
    combined = [int(n) for n in re.findall(r"(?m)^Combined:\s+(\d+)$", out)]
    assert combined == [expect["queues"], expect["queues"]], out   # maximum, current


def test_queue_irqs_are_the_pci_functions_msi_irqs(guest, data_nic, expect):
    names = {irq: guest["interrupts"].get(str(irq)) for irq in data_nic["msi_irqs"]}
    virtio = data_nic["device"]
    wanted = {f"{virtio}-config"}
    for q in range(expect["queues"]):
        wanted |= {f"{virtio}-input.{q}", f"{virtio}-output.{q}"}
    assert sorted(names.values()) == sorted(wanted), names


def test_irqbalance_presence(host, expect):
    irqbalance = host.service("irqbalance")
    if expect["irqbalance"]:
        assert host.package("irqbalance").is_installed
        assert irqbalance.is_enabled
        assert irqbalance.is_running
    else:
        assert not host.package("irqbalance").is_installed
        assert host.run("pgrep -x irqbalance").rc == 1


def test_management_nic_is_static_and_reaches_the_controller(host):
    assert "10.0.2.15/24" in host.check_output("ip -br addr show dev ens3")


def test_host_side_tap_is_multiqueue_and_carries_no_address(name, expect):
    """Controller-side: the instance's tap, as later traffic tests find it."""
    lab = LAB
    inst = lab.load_instance(f"{os.environ['MOLECULE_SCENARIO_NAME']}-{name}")
    tap = inst["tap"]
    assert len(tap) <= 15
    flags = int(Path(f"/sys/class/net/{tap}/tun_flags").read_text(), 16)
    assert flags & 0x0002, "IFF_TAP"
    assert flags & 0x0100, "IFF_MULTI_QUEUE"
    addrs = json.loads(subprocess.run(["ip", "-j", "addr", "show", "dev", tap],
                                      capture_output=True, text=True, check=True).stdout)
    assert addrs[0]["addr_info"] == []
    # One open tap queue per NIC queue, all held by this guest's QEMU.
    fds = 0
    for fdinfo in Path(f"/proc/{inst['pid']}/fdinfo").iterdir():
        if f"iff:\t{tap}\n" in fdinfo.read_text():
            fds += 1
    assert fds == expect["queues"]


def test_open_nic_was_opened_at_boot_and_its_irqs_exist_only_now(host, guest, expect):
    """vmxnet3 requests its IRQs in ndo_open: named after the interface, one per combined queue plus the event IRQ."""
    if "open_nic" not in expect:
        pytest.skip("no open-time NIC in this shape")
    nic = guest["nics"][expect["open_nic"]]
    assert (nic["pci"], nic["driver"]) == (expect["open_pci"], "vmxnet3")
    names = sorted(guest["interrupts"].get(str(irq)) for irq in nic["msi_irqs"])
    assert names == sorted(["ens8-rxtx-%d" % q for q in range(4)] + ["ens8-event-4"]), names
    addr, ifup = host.check_output("ip -br addr show dev ens8; systemctl is-active ifup@ens8.service").splitlines()
    assert "192.168.77.2/24" in addr and ifup == "active", (addr, ifup)


def test_guest_is_restored_and_made_its_own(host, name, expect):
    """Restored from the saved booted state, then given its own hostname and the host's clock."""
    inst = LAB.load_instance(f"{os.environ['MOLECULE_SCENARIO_NAME']}-{name}")
    assert inst["restored_from"] and Path(inst["restored_from"], "state.bin").is_file()
    assert inst["boot"] == expect.get("boot", "direct")
    hostname, guest_now, cmdline = host.check_output("cat /etc/hostname; date +%s.%N; cat /proc/cmdline").splitlines()
    assert hostname == name
    assert abs(float(guest_now) - time.time()) < 30, "guest clock not set after the restore"
    if expect.get("boot") == "grub":
        assert cmdline.startswith("BOOT_IMAGE=/boot/vmlinuz-") and "root=UUID=" in cmdline, cmdline
    else:
        assert "BOOT_IMAGE" not in cmdline and "root=/dev/vda" in cmdline, cmdline


UNITS_NOT_ENABLED = ("slurmd", "slurmctld", "munge", "nfs-server", "podman", "podman.socket", "podman-auto-update")
COMMANDS = ("slurmd", "munged", "podman", "busybox", "grub-mkconfig", "exportfs", "mount.nfs", "cpupower", "numactl",
            "mpstat", "iperf3", "stress-ng", "jq", "mksquashfs", "zstd", "pigz", "parallel", "fuse-overlayfs", "curl")


@pytest.fixture(scope="module")
def image(host):
    """One round trip (each testinfra command costs an Ansible run under TCG): unit states, commands, files."""
    script = " ; ".join(
        ["echo unit %s $(systemctl is-enabled %s 2>/dev/null || true) $(systemctl is-active %s 2>/dev/null || true)"
         % (u, u, u) for u in UNITS_NOT_ENABLED]
        + ["echo cmd %s $(command -v %s >/dev/null && echo yes || echo no)" % (c, c) for c in COMMANDS]
        + ["echo file grub $(test -f /boot/grub-core.lnx && echo yes || echo no)",
           "echo file pyxis $(test -f /usr/local/lib/slurm/spank_pyxis.so && echo yes || echo no)",
           "echo enroot $(enroot version 2>/dev/null || echo none)",
           "echo journal $(test -d /var/log/journal/$(cat /etc/machine-id) && echo yes || echo no)"])
    out = {}
    for line in host.check_output("sh -c %s", script).splitlines():
        words = line.split()
        out[(words[0], words[1]) if words[0] in ("unit", "cmd", "file") else words[0]] = words[2:] if words[0] == "unit" else (
            words[2] if len(words) > 2 else words[1])
    return out


def test_image_has_what_later_scenarios_need_installed_but_not_enabled(image):
    for unit in UNITS_NOT_ENABLED:
        enabled, active = (image[("unit", unit)] + ["", ""])[:2]
        assert enabled in ("disabled", "masked"), (unit, enabled)
        assert active != "active", (unit, active)
    missing = [c for c in COMMANDS if image[("cmd", c)] != "yes"]
    assert not missing, missing
    assert image[("file", "grub")] == "yes"
    manifest = json.loads(Path(LAB.current_image(), "manifest.json").read_text())
    if manifest["vendor"]:
        assert image["enroot"] == "4.1.2"
        assert image[("file", "pyxis")] == "yes"


def test_journal_is_persistent(image):
    assert image["journal"] == "yes"


PYC_CHECK = r"""
import json, os, subprocess, sys, zipfile
work = "/tmp/lab-pyc-check"
os.makedirs(work, exist_ok=True)
token = os.urandom(8).hex()
src = "def f(x):\n    return (x, %r, __file__)\n" % token
archive = os.path.join(work, "m.zip")
with zipfile.ZipFile(archive, "w") as zf:
    zf.writestr("labpyc_%s.py" % token, src)
probe = "import sys; sys.path.insert(0, %r); import labpyc_%s as m; print(repr(m.f(1)))" % (archive, token)
before = set(os.listdir("/var/cache/gpunode-lab-pyc"))
first = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
added = set(os.listdir("/var/cache/gpunode-lab-pyc")) - before
second = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
nobody = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c", probe], capture_output=True, text=True).stdout
mode = oct(os.stat("/var/cache/gpunode-lab-pyc").st_mode & 0o777)
print(json.dumps({"first": first, "second": second, "nobody": nobody, "added": len(added), "mode": mode, "token": token}))
"""


def test_zip_imports_keep_their_byte_code_and_behave_the_same(host):
    """The lab's byte-code cache for AnsiballZ payloads (tests/lab/guest/gpunode_lab_pyc.py): a module imported
    from a zip archive is compiled once and cached under root's 0700 directory; the cached import behaves exactly
    like the first one, and a process that cannot use the cache (nobody) imports it as usual."""
    out = json.loads(host.check_output("python3 -c %s" % shlex.quote(PYC_CHECK)))
    assert out["added"] == 1, out
    assert out["first"] == out["second"] == out["nobody"] and out["token"] in out["first"], out
    assert "m.zip/labpyc_" in out["first"], out
    assert out["mode"] == "0o700", out
