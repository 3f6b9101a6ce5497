# Every /proc/irq/N/smp_affinity_list of the guest, as JSON (run on the guest with python3 -c).
import glob
import json

aff = {}
for path in glob.glob("/proc/irq/[0-9]*/smp_affinity_list"):
    with open(path) as handle:
        aff[path.split("/")[3]] = handle.read().strip()
print(json.dumps(aff, sort_keys=True))
