"""cohort-info from the outside: its report, the arguments it refuses, and
a failure it names where no descriptor is left for asio's reactor.

    cohort_info.py COHORT_INFO
"""
import os
import resource
import subprocess
import sys

cohort_info = sys.argv[1]
failures = []


def run(args, env=None, nofile=None):
    def limited():
        if nofile is not None:
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

    return subprocess.run([cohort_info] + args, env=env, preexec_fn=limited, capture_output=True, text=True,
                          timeout=60)


def check(what, holds, result):
    if not holds:
        failures.append(f"{what}: status {result.returncode}\n--- stdout\n{result.stdout}--- stderr\n{result.stderr}")


plain = run([])
lines = plain.stdout.splitlines()
check("the report names the version and the kernel",
      plain.returncode == 0 and len(lines) >= 3 and lines[0].startswith("cohort ") and lines[1].startswith("kernel: "),
      plain)
if len(lines) >= 3 and lines[2] == "io_uring: on":
    operations = [line.split(":", 1) for line in lines[3:]]
    check("each operation is yes, or says what stands in for it",
          [name.strip() for name, _ in operations] == ["waitid", "poll", "read", "futex", "cancel"] and
          all(value.strip() == "yes" or value.strip().startswith("no (") for _, value in operations), plain)
else:
    check("a ring that is off says why", len(lines) == 3 and lines[2].startswith("io_uring: off ("), plain)

off = run([], env=dict(os.environ, COHORT_IO_URING="0"))
check("COHORT_IO_URING=0 turns the ring off and says so",
      off.returncode == 0 and "io_uring: off (COHORT_IO_URING=0)" in off.stdout, off)

version = run(["--version"])
check("--version prints the report's first line alone",
      version.returncode == 0 and lines and version.stdout == lines[0] + "\n", version)

stray = run(["--bogus"])
check("an unknown argument is refused with status 2, named, and the usage",
      stray.returncode == 2 and stray.stdout == "" and "unexpected argument '--bogus'" in stray.stderr and
      "usage: cohort-info" in stray.stderr, stray)

two = run(["foo", "bar"])
check("of two unknown arguments, the first is named", two.returncode == 2 and "unexpected argument 'foo'" in two.stderr,
      two)

extra = run(["--help", "more"])
check("an argument after --help is refused", extra.returncode == 2 and "unexpected argument 'more'" in extra.stderr,
      extra)

starved = run([], nofile=4)
check("no descriptor for the reactor: status 1 and a message naming the limit, not an abort",
      starved.returncode == 1 and "RLIMIT_NOFILE is 4" in starved.stderr and "terminate" not in starved.stderr,
      starved)

if os.path.exists("/dev/full"):
    with open("/dev/full", "w") as full:
        lost = subprocess.run([cohort_info], stdout=full, capture_output=False, stderr=subprocess.PIPE, text=True,
                              timeout=60)
    check("a report that cannot be written is status 1, saying why",
          lost.returncode == 1 and "writing to stdout" in lost.stderr and "No space left" in lost.stderr, lost)

if failures:
    print("\n\n".join(failures))
    sys.exit(1)
print("cohort-info: all checks hold")
