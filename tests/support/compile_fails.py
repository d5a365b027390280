#!/usr/bin/env python3
"""Checks that a source is refused by the compiler, for the reason it names.

usage: compile_fails.py SOURCE -- COMPILER [ARGS...]

SOURCE holds a line `// expected error: TEXT`. The check passes when
compiling SOURCE (syntax only) fails and the compiler's output holds TEXT;
it fails when the source compiles, or fails for another reason.
"""

import re
import subprocess
import sys
from pathlib import Path

EXPECTED = re.compile(r"^// expected error: (.+)$", re.M)


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    source = Path(argv[1])
    found = EXPECTED.search(source.read_text())
    if not found:
        print(f"{source}: no `// expected error:` line", file=sys.stderr)
        return 2
    expected = found.group(1).strip()
    compiler = argv[3:]
    done = subprocess.run(compiler + ["-fsyntax-only", str(source)], capture_output=True, text=True)
    output = done.stdout + done.stderr
    if done.returncode == 0:
        print(f"{source} compiled; it should have been refused with: {expected}", file=sys.stderr)
        return 1
    if expected not in output:
        print(f"{source} was refused, but not with: {expected}\n{output}", file=sys.stderr)
        return 1
    print(f"{source} refused: {expected}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
