"""The node side of the pull-back: runs as a short Ray job, prints the evidence as frames.

Stdlib and Ray only (sent as ``python -c <source> <request JSON>``: a node needs no miles_amd).
The frames and checks: ``docs/cluster.md`` ("How the pull-back works").
"""

import base64
import errno
import hashlib
import json
import os
import re
import stat
import sys

FRAME, END, ERROR = "MILES_AMD_PULL ", "MILES_AMD_PULL_END ", "MILES_AMD_PULL_ERROR "
# The gate's caps (miles_amd.files EVENT_FILE, RECORD_FILE), repeated here: this
# file runs on a node without miles_amd (a test checks they agree).
CAPS = {"tensorboard": 256 << 20, "ci_history": 64 << 20}


def expand(path):
    return re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(path))


def read_dir(root, subdirs, offsets):
    """Every regular file under ``root/<subdir>``: size, sha256 and the bytes past offset
    (all of them when the held prefix no longer matches). A link below ``root`` or a file over
    its subdir's cap is an error, as the gate's readers refuse it."""
    root = expand(root)
    if not os.path.isdir(root):
        return {"error": f"no evidence dir {root} on node"}
    files = []
    for sub in subdirs:
        top = os.path.join(root, sub)
        if os.path.islink(top):
            return {"error": f"{sub} is a symbolic link on the node; the pull-back follows none"}
        for dirpath, dirs, names in os.walk(top):  # followlinks=False
            for name in sorted(names) + [
                d for d in dirs if os.path.islink(os.path.join(dirpath, d))
            ]:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                data = read_regular(path, rel, CAPS.get(sub, 0))
                if isinstance(data, dict):
                    return data
                if data is None:
                    continue
                offset, held_sha = offsets.get(rel, (0, ""))
                if offset > len(data) or hashlib.sha256(data[:offset]).hexdigest() != held_sha:
                    offset = 0  # the file was rewritten, not appended to: send it whole
                files.append(
                    {
                        "path": rel,
                        "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "offset": offset,
                        "data": base64.b64encode(data[offset:]).decode("ascii"),
                    }
                )
    return {"root": root, "files": files}


def read_regular(path, rel, cap):
    """The bytes of ``path`` (opened ``O_NOFOLLOW | O_NONBLOCK``, then ``fstat``); None for a
    FIFO, socket or device; an error dict for a link or a file over ``cap``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return {"error": f"{rel} is a symbolic link on the node; the pull-back follows none"}
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if info.st_size > cap:
            return {"error": f"{rel} is {info.st_size} bytes, over the {cap}-byte cap"}
        chunks, left = [], info.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def main(request):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    strategy = NodeAffinitySchedulingStrategy(node_id=request["node_id"], soft=False)
    task = ray.remote(num_cpus=0, max_retries=0)(read_dir).options(scheduling_strategy=strategy)
    result = ray.get(task.remote(request["root"], request["subdirs"], request["offsets"]))
    if "error" in result:
        print(ERROR + json.dumps({"reason": result["error"]}), flush=True)
        return 1
    for entry in result["files"]:
        print(FRAME + json.dumps(entry), flush=True)
    print(END + json.dumps({"files": len(result["files"]), "root": result["root"]}), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(json.loads(sys.argv[1])))
    except Exception as exc:
        print(ERROR + json.dumps({"reason": f"{type(exc).__name__}: {exc}"}), flush=True)
        sys.exit(1)
