#!/usr/bin/env python3
"""Builds another project against cohort, the ways README.md describes.

usage: embed.py subproject SOURCE_ROOT [--cuda]
           tests/embed/meson with cohort as its subproject (a link to
           SOURCE_ROOT in its subprojects/): it builds and runs, though the
           project names no cpp_std, and cohort's tests, benchmarks,
           examples and tools were not built. With --cuda, again with
           cohort-cuda asked for, building and running uses-cohort-cuda.
       embed.py installed SOURCE_ROOT BUILD_ROOT [--cuda]
           installs BUILD_ROOT into a temporary folder (meson install
           --destdir), then builds and runs tests/embed/meson through
           pkg-config and tests/embed/cmake through find_package(cohort),
           the latter with c++ and, where installed, clang++. With --cuda
           (BUILD_ROOT built cohort-cuda), uses-cohort-cuda too, through
           meson and through `pkg-config --libs cohort-cuda` on a command
           line with -Wl,--as-needed.

Each project is tests/embed/<kind>/ plus tests/embed/main.cpp and
tests/embed/uses_cohort_cuda.cpp, copied into a temporary folder; the program
it builds runs /bin/true and `exit 3` through cohort::run and checks their
exit statuses. Built as C++17 (meson's uses-cohort-cpp17), it must stop at
cohort's "cohort needs C++20". uses-cohort-cuda links cohort-cuda and calls
none of its functions (tensor::to reaches it through the core library): the
CUDA layer must be loaded, copying the tensor or saying there is no device.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


class Failure(Exception):
    pass


def run(args, **kwargs):
    print("$", " ".join(str(a) for a in args), flush=True)
    done = subprocess.run([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, **kwargs)
    if done.returncode != 0:
        print(done.stdout)
        raise Failure(f"{Path(str(args[0])).name} exited with {done.returncode}")
    return done.stdout


def project(source_root, kind, into):
    """A copy of the consuming project tests/embed/<kind> in `into`."""
    embed = Path(source_root) / "tests" / "embed"
    shutil.copytree(embed / kind, into)
    shutil.copy(embed / "main.cpp", into / "main.cpp")
    shutil.copy(embed / "uses_cohort_cuda.cpp", into / "uses_cohort_cuda.cpp")
    return into


def refuses_cpp17(build, env=None):
    """The program built as C++17 stops at cohort's #error."""
    print("$ ninja -C", build, "uses-cohort-cpp17", flush=True)
    done = subprocess.run(["ninja", "-C", str(build), "uses-cohort-cpp17"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env)
    if done.returncode == 0 or "cohort needs C++20" not in done.stdout:
        print(done.stdout)
        raise Failure("built as C++17, the program did not stop at \"cohort needs C++20\"")


def run_program(program, env=None):
    said = run([program], env=env)
    print(said, end="")
    if "/bin/true exited with code 0, exit 3 exited with code 3" not in said:
        raise Failure(f"{program.name} said {said!r}")


def run_cuda_program(program, env=None):
    """uses-cohort-cuda found the CUDA layer loaded, though it calls none of its functions."""
    said = run([program], env=env)
    print(said, end="")
    if not (said.startswith("copied to device 2:0") or said.startswith("cohort::tensor::to: no CUDA device: ")):
        raise Failure(f"{program.name} did not load the CUDA layer it links: it said {said!r}")


def as_subproject(source_root, cuda):
    with tempfile.TemporaryDirectory(prefix="cohort-embed-") as tmp:
        tmp = Path(tmp)
        parent = project(source_root, "meson", tmp / "parent")
        (parent / "subprojects").mkdir()
        (parent / "subprojects" / "cohort").symlink_to(Path(source_root).resolve())
        build = tmp / "build"
        # Forced onto the subproject even where a cohort is installed; one
        # unoptimized configuration, the quickest to compile.
        run(["meson", "setup", build, parent, "--force-fallback-for=cohort", "--buildtype=plain"])
        run(["ninja", "-C", build, "-j", "2"])
        run_program(build / "uses-cohort")
        refuses_cpp17(build)

        built = [t for t in json.loads(run(["meson", "introspect", "--targets", build]))
                 if t["subproject"] == "cohort"]
        print("cohort's targets in the subproject:", ", ".join(sorted(t["name"] for t in built)))
        extra = [t["name"] for t in built
                 if any(f"/{folder}/" in t["defined_in"] for folder in ("tests", "tools", "bench", "examples"))]
        if extra:
            raise Failure(f"the subproject defined targets of its tests, tools, benchmarks or examples: {extra}")
        by_default = sorted(t["name"] for t in built if t["build_by_default"])
        if by_default != ["cohort"]:
            raise Failure(f"the subproject builds {by_default} by default, not the library alone")
        folders = [f for f in ("tests", "tools", "bench", "examples") if (build / "subprojects" / "cohort" / f).exists()]
        if folders:
            raise Failure(f"the subproject's build has folders for {folders}")
        log = (build / "meson-logs" / "meson-log.txt").read_text(errors="replace").lower()
        # What meson logs when it looks for them ("... skipped: feature tests
        # disabled" when it does not).
        signs = {"CLI11": ["dependency cli11 found", 'header "cli/cli.hpp"'], "doctest": ["dependency doctest found"]}
        for looked_for, lines in signs.items():
            if any(line in log for line in lines):
                raise Failure(f"the subproject looked for {looked_for}, which only its tools or tests need")

        if cuda:
            build = tmp / "build-cuda"
            run(["meson", "setup", build, parent, "--force-fallback-for=cohort", "--buildtype=plain",
                 "-Dcuda=enabled", "-Dcohort:cuda=enabled"])
            run(["ninja", "-C", build, "-j", "2", "uses-cohort-cuda"])
            run_cuda_program(build / "uses-cohort-cuda")
    print("as a subproject: only the library was built, and the program ran")


def build_options(build_root):
    options = json.loads(run(["meson", "introspect", "--buildoptions", build_root]))
    return {o["name"]: o["value"] for o in options if o["name"] in ("prefix", "libdir", "includedir")}


def installed(source_root, build_root, cuda):
    options = build_options(build_root)
    with tempfile.TemporaryDirectory(prefix="cohort-install-") as tmp:
        tmp = Path(tmp)
        dest = tmp / "dest"
        # The build is already up to date (meson test builds first).
        run(["meson", "install", "-C", build_root, "--destdir", dest, "--no-rebuild", "--quiet"])
        prefix = dest / options["prefix"].lstrip("/")
        libdir = prefix / options["libdir"]
        includedir = prefix / options["includedir"]
        for wanted in (includedir / "cohort" / "cohort.hpp", includedir / "cohort" / "version.hpp",
                       libdir / "pkgconfig" / "cohort.pc",
                       libdir / "cmake" / "cohort" / "cohortConfig.cmake",
                       libdir / "cmake" / "cohort" / "cohortConfigVersion.cmake"):
            if not wanted.is_file():
                raise Failure(f"not installed: {wanted.relative_to(dest)}")
        for unwanted in ("meson.build", "version.hpp.in"):
            if (includedir / "cohort" / unwanted).exists():
                raise Failure(f"installed with the headers: {unwanted}")
        run_env = dict(os.environ, LD_LIBRARY_PATH=str(libdir))

        # pkg-config, with paths of the .pc file taken inside the destdir.
        pc_env = dict(os.environ, PKG_CONFIG_PATH=str(libdir / "pkgconfig"), PKG_CONFIG_SYSROOT_DIR=str(dest))
        pc = (libdir / "pkgconfig" / "cohort.pc").read_text()
        print(pc)
        for line in ("Requires: fmt", "-DASIO_STANDALONE", "-DASIO_HAS_CO_AWAIT=1",
                     "header_only_requires=asio dlpack\n"):
            if line not in pc:
                raise Failure(f"cohort.pc lacks {line!r}")
        if "Requires.private" in pc and not (libdir / "libcohort.a").exists():
            raise Failure("cohort.pc has Requires.private, which only a static link needs, and no static library")
        consumer = project(source_root, "meson", tmp / "pkg-config")
        build = tmp / "pkg-config-build"
        run(["meson", "setup", build, consumer, "--wrap-mode=nofallback"] + (["-Dcuda=enabled"] if cuda else []),
            env=pc_env)
        run(["ninja", "-C", build], env=pc_env)
        run_program(build / "uses-cohort", env=run_env)
        refuses_cpp17(build, env=pc_env)
        if cuda:
            run_cuda_program(build / "uses-cohort-cuda", env=run_env)
            # As README.md has it, on a command line; --as-needed as
            # compilers that pass it by default (Ubuntu's) link.
            flags = run(["pkg-config", "--cflags", "--libs", "cohort-cuda"], env=pc_env).split()
            program = tmp / "uses-cohort-cuda"
            run(["c++", "-std=c++20", "-Wl,--as-needed", consumer / "uses_cohort_cuda.cpp", "-o", program] + flags)
            run_cuda_program(program, env=run_env)

        # CMake's find_package, from the files next to the .pc file; again
        # with clang++ where it is installed, whichever compiler built cohort.
        for compiler in ["c++"] + (["clang++"] if shutil.which("clang++") else []):
            consumer = project(source_root, "cmake", tmp / f"cmake-{compiler}")
            build = tmp / f"cmake-build-{compiler}"
            run(["cmake", "-S", consumer, "-B", build, "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}",
                 f"-DCMAKE_CXX_COMPILER={compiler}"])
            run(["cmake", "--build", build])
            run_program(build / "uses-cohort", env=run_env)
    print("installed: found through pkg-config and through find_package, and the programs ran")


def main():
    try:
        args = sys.argv[1:]
        cuda = args[-1:] == ["--cuda"]
        if cuda:
            args = args[:-1]
        if len(args) == 2 and args[0] == "subproject":
            as_subproject(args[1], cuda)
        elif len(args) == 3 and args[0] == "installed":
            installed(args[1], args[2], cuda)
        else:
            print(__doc__)
            return 2
    except Failure as failure:
        print("embed.py:", failure)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
