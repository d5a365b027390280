#!/usr/bin/env python3
"""Checks that every include in src/ and include/cohort/ points down the layers.

usage: layers.py ROOT          check the tree at ROOT
       layers.py --self-test   show that an upward include is caught

Each folder under src/ is a layer, and each public header belongs to the
layer that implements it: a header directly in include/cohort/ by PUBLIC
below, one in a folder include/cohort/<layer>/ (cuda's) to that layer. A
file may include its own layer and the layers below it: those named in
BELOW, and theirs in turn. A folder or public header missing from these
tables is an error too, so a new one is placed deliberately. src/config.hpp
(platform switches) is open to all. Only the cuda layer may include the CUDA
toolkit's headers: the core builds and runs without them.
"""

import re
import sys
import tempfile
from pathlib import Path

# Each layer and the layers it rests on directly (README.md, "Architecture").
BELOW = {
    "os": [],
    "encoding": [],
    "uring": ["os"],
    "process": ["os", "uring"],
    "logs": ["process"],
    "shm": ["os", "encoding"],
    "tensor": ["shm"],
    "queue": ["uring", "tensor"],
    "launch": ["process", "shm"],
    "group": ["logs", "launch"],
    "multiprocessing": ["group", "queue"],
    "cuda": ["queue", "launch"],
}

# The public headers (include/cohort/<name>.hpp) by layer. "base" lies below
# every layer (the export macros, what the headers require, the version);
# "all", the umbrella header, may include every layer.
PUBLIC = {
    "uring": ["io_uring_info", "when_any"],
    "encoding": ["encoding"],
    "process": ["child", "command", "environment", "exit_status", "spawn", "stdio", "thread_name"],
    "logs": ["logs"],
    "shm": ["storage"],
    "tensor": ["tensor"],
    "queue": ["queue", "event"],
    "launch": ["entry_point", "error_file", "launch_hook"],
    "group": ["group", "guardian"],
    "multiprocessing": ["process_error", "spawn_and_join", "pool"],
    "base": ["compiler", "completion_token", "export", "requirements", "timeout", "version"],
    "all": ["cohort"],
}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)

# The layers that may include the CUDA toolkit's headers.
CUDA_LAYERS = {"cuda"}
CUDA_HEADER = re.compile(r"^(cuda|cudart|cudaTypedefs|cuda_runtime|cuda_runtime_api|driver_types|vector_types"
                         r"|builtin_types|library_types|cuda_[a-z0-9_]+)\.h$")


def reachable(layer):
    seen, todo = set(), [layer]
    while todo:
        for below in BELOW[todo.pop()]:
            if below not in seen:
                seen.add(below)
                todo.append(below)
    return seen | {layer, "base"}


def layer_of_public(name):
    for layer, names in PUBLIC.items():
        if name in names:
            return layer
    return None


def target_layer(path):
    """The layer an include path names, "config", or None when it is not cohort's."""
    parts = path.split("/")
    if path == "config.hpp":
        return "config"
    if parts[0] == "cohort" and len(parts) == 2 and parts[1].endswith(".hpp"):
        return layer_of_public(parts[1][:-4]) or "unknown public header " + path
    if parts[0] == "cohort" and len(parts) > 2:
        return parts[1]  # include/cohort/<layer>/..., as cuda's headers are
    if len(parts) == 2 and parts[0] in BELOW:
        return parts[0]
    return None


def check(root):
    root = Path(root)
    problems = []
    files = []
    for folder in sorted((root / "src").iterdir()):
        if folder.is_dir():
            if folder.name not in BELOW:
                problems.append(f"src/{folder.name}/ is not a layer: add it to BELOW in {Path(__file__).name}")
                continue
            files += [(f, folder.name) for f in sorted(folder.rglob("*")) if f.suffix in (".hpp", ".cpp", ".cu")]
    public = root / "include" / "cohort"
    for header in sorted(public.glob("*.hpp")):
        layer = layer_of_public(header.stem)
        if layer is None:
            problems.append(f"include/cohort/{header.name} has no layer: add it to PUBLIC in {Path(__file__).name}")
            continue
        files.append((header, layer))
    for sub in sorted(p for p in public.iterdir() if p.is_dir()):
        if sub.name not in BELOW:
            problems.append(f"include/cohort/{sub.name}/ is not a layer")
            continue
        files += [(f, sub.name) for f in sorted(sub.rglob("*.hpp"))]
    for file, layer in files:
        allowed = {"base"} if layer == "base" else set(BELOW) | {"all", "base"} if layer == "all" else reachable(layer)
        for path in INCLUDE.findall(file.read_text(errors="replace")):
            if CUDA_HEADER.match(path) and layer not in CUDA_LAYERS:
                problems.append(f"{file.relative_to(root)} ({layer}) includes {path}, a CUDA header outside the cuda layer")
                continue
            target = target_layer(path)
            if target is None or target == "config":
                continue
            if target.startswith("unknown"):
                problems.append(f"{file.relative_to(root)}: includes {target}")
            elif target not in allowed:
                problems.append(f"{file.relative_to(root)} ({layer}) includes {path} ({target}), a layer above it")
    return problems, len(files)


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "src" / "os").mkdir(parents=True)
        (root / "src" / "group").mkdir()
        (root / "include" / "cohort").mkdir(parents=True)
        (root / "src" / "group" / "g.cpp").write_text('#include "os/x.hpp"\n')
        (root / "src" / "os" / "x.hpp").write_text("#pragma once\n")
        # The cuda layer: its public headers in a folder of their own, its
        # sources free to include the toolkit's headers and the layers below.
        (root / "src" / "cuda").mkdir()
        (root / "include" / "cohort" / "cuda").mkdir()
        (root / "src" / "cuda" / "c.cpp").write_text(
            '#include "cohort/cuda/device.hpp"\n#include "os/x.hpp"\n#include <cuda_runtime_api.h>\n#include <cuda.h>\n')
        (root / "include" / "cohort" / "cuda" / "device.hpp").write_text('#include "cohort/export.hpp"\n')
        clean, _ = check(root)
        (root / "src" / "os" / "x.hpp").write_text('#pragma once\n#include "group/g.hpp"\n')
        (root / "include" / "cohort" / "child.hpp").write_text("#include <cohort/group.hpp>\n")
        (root / "src" / "stray").mkdir()
        (root / "src" / "group" / "uses_cuda.cpp").write_text('#include "cohort/cuda/device.hpp"\n')
        (root / "src" / "group" / "driver.cpp").write_text("#include <cuda.h>\n")
        (root / "include" / "cohort" / "cuda" / "up.hpp").write_text("#include <cohort/group.hpp>\n")
        (root / "include" / "cohort" / "stray").mkdir()
        found, _ = check(root)
    expected = ["src/os/x.hpp (os) includes group/g.hpp (group)",
                "include/cohort/child.hpp (process) includes cohort/group.hpp (group)",
                "src/stray/ is not a layer",
                "src/group/uses_cuda.cpp (group) includes cohort/cuda/device.hpp (cuda)",
                "src/group/driver.cpp (group) includes cuda.h, a CUDA header outside the cuda layer",
                "include/cohort/cuda/up.hpp (cuda) includes cohort/group.hpp (group)",
                "include/cohort/stray/ is not a layer"]
    missed = [e for e in expected if not any(p.startswith(e) for p in found)]
    if clean or missed:
        print("layers.py self-test failed: clean tree reported", clean, "; missed", missed)
        return 1
    print("layers.py self-test: an upward include, a public header reaching up, a stray folder,"
          " the core reaching the cuda layer or CUDA's headers, and a cuda header reaching up are caught")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    problems, count = check(sys.argv[1])
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) out of layer order")
        return 1
    print(f"{count} files: every include points down the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
