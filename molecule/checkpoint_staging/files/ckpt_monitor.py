"""Lab monitor (runs in the guest): watches staging and the NFS server's own export directory while the copier
works, and records every breach of the copier's promises. Independent of the collection's code on purpose.

    ckpt_monitor.py SETTINGS_JSON

SETTINGS_JSON: {"pairs": [[staging dir, the target's directory on the server side], ...], "manifest": the
writer's manifest, "out": where the findings go (rewritten atomically each second), "interval": seconds}.

The server side (the exported directory on the server's local filesystem) is what is durable, and it can be read
while the NFS service is stopped. Each sample lists staging first, then the target, so that "the target has it"
is seen after "staging lost it". Breaches:
* final_before_complete: a final name (not a dot name) on the target that the manifest does not list yet;
* final_incomplete: a final name on the target whose sizes, when first seen, are not the manifest's;
* removed_early: an entry gone from staging that the manifest does not list (taken before it was complete)
  or whose final name is not on the target.
"""

import json
import os
import sys
import time


def listing(path):
    """{name: size or {relative path: size}} of the non-temporary entries of a directory."""
    out = {}
    try:
        names = os.listdir(path)
    except OSError:
        return out
    for name in names:
        full = os.path.join(path, name)
        try:
            if os.path.isdir(full):
                sizes = {}
                for dirpath, _dirs, files in os.walk(full):
                    for f in files:
                        rel = os.path.relpath(os.path.join(dirpath, f), full)
                        sizes[rel] = os.stat(os.path.join(dirpath, f)).st_size
                out[name] = sizes
            else:
                out[name] = os.stat(full).st_size
        except OSError:
            continue
    return out


def manifest(path):
    out = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    rec = json.loads(line)
                    out[(rec["dir"], rec["name"])] = rec
    except (OSError, ValueError):
        pass
    return out


def staged_names(entries):
    return {n for n in entries if not n.startswith(".") and not n.endswith(".tmp") and not n.endswith(".done")}


def main():
    settings = json.loads(sys.argv[1])
    pairs, out = settings["pairs"], settings["out"]
    found = {"breaches": [], "first_seen": {}, "removed": {}, "partials_seen": {}, "samples": 0, "started": time.time()}
    before = {staging: set() for staging, _target in pairs}
    last_write = 0.0
    while True:
        now = time.time()
        man = manifest(settings["manifest"])
        for staging, target in pairs:
            staged = staged_names(listing(staging))
            on_target = listing(target)
            for name, size in on_target.items():
                key = "%s/%s" % (target, name)
                if name.startswith(".gpunode-partial."):
                    found["partials_seen"][key] = max(found["partials_seen"].get(key, 0),
                                                      size if isinstance(size, int) else sum(size.values()))
                    continue
                if name.startswith(".") or key in found["first_seen"]:
                    continue
                rec = man.get((staging, name))
                found["first_seen"][key] = {"at": now, "size": size}
                if rec is None:
                    found["breaches"].append({"kind": "final_before_complete", "entry": key, "at": now})
                elif isinstance(size, int) and size != rec["bytes"]:
                    found["breaches"].append({"kind": "final_incomplete", "entry": key, "size": size, "want": rec["bytes"]})
                elif isinstance(size, dict) and sorted(size) != sorted(rec["files"]):
                    found["breaches"].append({"kind": "final_incomplete", "entry": key, "files": sorted(size),
                                              "want": sorted(rec["files"])})
            for name in before[staging] - staged:
                key = "%s/%s" % (staging, name)
                found["removed"][key] = now
                if (staging, name) not in man or name not in on_target:
                    found["breaches"].append({"kind": "removed_early", "entry": key, "at": now,
                                              "in_manifest": (staging, name) in man, "on_target": name in on_target})
            before[staging] = staged
        found["samples"] += 1
        if now - last_write >= 1.0:
            tmp = out + ".tmp"
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(found, handle, sort_keys=True)
            os.rename(tmp, out)
            last_write = now
        time.sleep(settings.get("interval", 0.25))


if __name__ == "__main__":
    main()
