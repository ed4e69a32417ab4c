"""The node side of the pull-back: runs as a short Ray job, prints the evidence as frames.

Self-contained on purpose (the standard library and Ray only): ``miles_amd.run.pullback``
sends this file's source as the entrypoint ``python -c <source> <request JSON>``, so a node
needs no miles_amd install. The entrypoint connects to its own cluster (``ray.init()``),
runs one task pinned to the evidence node (``NodeAffinitySchedulingStrategy(soft=False)``:
the task fails rather than run elsewhere) that reads every file under the requested dirs
once and returns, per file, its size and sha256 (of the bytes it read) and the bytes from
the offset the client already holds (all of it when the client's bytes are no longer the
file's prefix, by sha256: a file rewritten rather than appended to), through the object
store; the entrypoint prints one ``MILES_AMD_PULL`` frame per file (base64) and a closing
``MILES_AMD_PULL_END`` with the file count, so a cut log is detectable. A failure prints
``MILES_AMD_PULL_ERROR`` and exits 1.

``${VAR}`` in the dir is expanded on the node exactly as Ray expands runtime-env values
(``os.path.expandvars``, then an unset ``${VAR}`` becomes empty), so it names the dir the job
wrote. Only regular files are read; symlinks are skipped.
"""

import base64
import hashlib
import json
import os
import re
import sys

FRAME, END, ERROR = "MILES_AMD_PULL ", "MILES_AMD_PULL_END ", "MILES_AMD_PULL_ERROR "


def expand(path):
    return re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(path))


def read_dir(root, subdirs, offsets):
    """Every regular file under ``root/<subdir>``: size, sha256 and the bytes past offset."""
    root = expand(root)
    if not os.path.isdir(root):
        return {"error": f"no evidence dir {root} on node"}
    files = []
    for sub in subdirs:
        top = os.path.join(root, sub)
        for dirpath, _dirs, names in os.walk(top):
            for name in sorted(names):
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as handle:
                    data = handle.read()
                rel = os.path.relpath(path, root)
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
