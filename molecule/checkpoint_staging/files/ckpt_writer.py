"""Lab checkpoint writer (runs in the guest): writes checkpoints slowly, the way trainers do, in each of the
copier's completion conventions, and records each one's checksum in a manifest before it completes it.

    ckpt_writer.py MANIFEST JOBS_JSON

JOBS_JSON: a list of {"rule": rename|marker|quiescent|sharded, "dir": staging, "name": final name, "mb": size,
"chunk_mb": 2, "pause": seconds between chunks, "gap": seconds between the two writes of a quiescent file,
"shards": n}. The jobs run one after another. A manifest line (fsync'd) is {"name", "rule", "dir", "bytes",
"files": {relative path: sha256}, "at"}; it is written when the data is complete and fsync'd, before the rename,
the marker or the last close, so a copier that takes an entry the manifest does not list took it too early.
Independent of the collection's code on purpose.
"""

import hashlib
import json
import os
import sys
import time

MIB = 1024 * 1024


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_slowly(handle, mib, chunk_mb, pause, digest, seed):
    block = os.urandom(MIB)
    done = 0
    while done < mib:
        n = min(chunk_mb, mib - done)
        for i in range(n):
            data = (b"%s:%d:" % (seed, done + i)) + block[64:]
            data = data[:MIB].ljust(MIB, b"\0")
            handle.write(data)
            digest.update(data)
        done += n
        handle.flush()
        if pause:
            time.sleep(pause)


def record(manifest, job, files, total):
    line = json.dumps({"name": job["name"], "rule": job["rule"], "dir": job["dir"], "bytes": total, "files": files,
                       "at": time.time()}, sort_keys=True)
    with open(manifest, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def one_file(path, job, digest, mib, mode="wb"):
    with open(path, mode) as handle:
        write_slowly(handle, mib, job.get("chunk_mb", 2), job.get("pause", 0.1), digest, job["name"].encode())
        os.fsync(handle.fileno())


def run(manifest, job):
    rule, folder, name = job["rule"], job["dir"], job["name"]
    final = os.path.join(folder, name)
    if rule == "rename":
        digest = hashlib.sha256()
        one_file(final + ".tmp", job, digest, job["mb"])
        record(manifest, job, {"": digest.hexdigest()}, job["mb"] * MIB)
        os.rename(final + ".tmp", final)
        fsync_dir(folder)
    elif rule == "sharded":
        tmp = final + ".tmp"
        os.mkdir(tmp)
        files = {}
        per = job["mb"] // job["shards"]
        for shard in range(job["shards"]):
            rel = "__%d_0.distcp" % shard
            digest = hashlib.sha256()
            one_file(os.path.join(tmp, rel), dict(job, name="%s/%s" % (name, rel)), digest, per)
            files[rel] = digest.hexdigest()
        meta = json.dumps({"shards": job["shards"]}).encode()
        with open(os.path.join(tmp, ".metadata"), "wb") as handle:
            handle.write(meta)
            os.fsync(handle.fileno())
        files[".metadata"] = hashlib.sha256(meta).hexdigest()
        fsync_dir(tmp)
        record(manifest, job, files, per * job["shards"] * MIB + len(meta))
        os.rename(tmp, final)
        fsync_dir(folder)
    elif rule == "marker":
        digest = hashlib.sha256()
        one_file(final, job, digest, job["mb"])
        record(manifest, job, {"": digest.hexdigest()}, job["mb"] * MIB)
        with open(final + ".done", "wb") as handle:
            os.fsync(handle.fileno())
        fsync_dir(folder)
    elif rule == "quiescent":
        digest = hashlib.sha256()
        half = job["mb"] // 2
        one_file(final, job, digest, half)
        time.sleep(job.get("gap", 3))  # closed, not changing, but not complete: shorter than quiet_seconds
        with open(final, "ab") as handle:
            write_slowly(handle, job["mb"] - half, job.get("chunk_mb", 2), job.get("pause", 0.1), digest, name.encode())
            os.fsync(handle.fileno())
            record(manifest, job, {"": digest.hexdigest()}, job["mb"] * MIB)
        fsync_dir(folder)
    else:
        raise SystemExit("unknown rule %r" % rule)


def main():
    manifest, jobs = sys.argv[1], json.loads(sys.argv[2])
    for job in jobs:
        run(manifest, job)
    print("wrote %d checkpoints" % len(jobs))


if __name__ == "__main__":
    main()
