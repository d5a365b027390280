"""Fails unless the README quotes the given source file verbatim, so the
tour the README shows is the one the build compiles."""
import sys

readme, source = (open(path, encoding="utf-8").read() for path in sys.argv[1:3])
if "```cpp\n" + source + "```" not in readme:
    sys.exit(f"{sys.argv[1]} does not quote {sys.argv[2]} verbatim")
