#!/usr/bin/env python3
"""Checks bench/repeat against benches whose figures are known in advance:
    bench_repeat.py <bench/repeat>
Exits 1, saying what differed, when a summary is not what the runs printed."""

import subprocess
import sys
import tempfile
import os

repeat = sys.argv[1]
failures = []


def check(what, got, want):
    if got != want:
        failures.append(f"{what}:\n  got:  {got!r}\n  want: {want!r}")


# Run i prints i * 10 ms, a ratio of 1.i, a range, a comma-grouped count and
# words holding digits, and the square of i; every run prints a constant line, run 2 one more.
bench = r'''
i=$COHORT_BENCH_RUN
echo "took $((i * 10)) ms, ratio 1.$i (0.9-1.$((i + 1))x) on x86_64, p50 1,00$i"
echo "K=32 fixed 5"
if [ "$i" = 2 ]; then echo "once -4"; fi
echo "round 1: $((i + 3))"
echo "round 1: $((10 - i))"
echo "square $((i * i))"
printf "%6s ms\\n" "$((i * 900))"
'''
done = subprocess.run([repeat, "--runs", "3", "--", "sh", "-c", bench], capture_output=True, text=True)
check("exit status of passing runs", done.returncode, 0)
check("header", done.stdout.startswith("== sh -c ") and ": 3 of 3 runs\n" in done.stdout, True)
body = done.stdout.split(": 3 of 3 runs\n", 1)[-1].splitlines()
check("summary", body, [
    "took 20 (10-30) ms, ratio 1.2 (1.1-1.3) (0.9-1.3 (1.2-1.4)x) on x86_64, p50 1,002 (1,001-1,003)",
    "K=32 fixed 5",
    "once -4   [in 1 of 3 runs]",
    # Two lines of the same text pair up by their order in each run.
    "round 1: 5 (4-6)",
    "round 1: 8 (7-9)",
    "square 4 (1-9)",  # the median, not the mean
    "   1800 (900-2700) ms",  # padded to a width that changes between runs
])

# A failing run: the status says so, its output is named, the others are
# still summarized; --keep keeps every run's output.
with tempfile.TemporaryDirectory() as keep:
    failing = ('echo "value $((COHORT_BENCH_RUN * 2))"; if [ "$COHORT_BENCH_RUN" = 3 ]; then echo late; fi; '
               'exit $((COHORT_BENCH_RUN == 2))')
    done = subprocess.run([repeat, "--runs", "3", "--keep", keep, "--", "sh", "-c", failing],
                          capture_output=True, text=True)
    check("exit status with a failed run", done.returncode, 1)
    check("the failed run named", "run 2 failed (1)" in done.stderr, True)
    check("the failed runs counted", done.stdout.splitlines()[0].endswith(": 2 of 3 runs (1 failed, left out)"),
          True)
    check("the others summarized", done.stdout.splitlines()[1:],
          ["value 4 (2-6)", "late   [in 1 of the 2 runs that did not fail]"])
    check("outputs kept", sorted(os.listdir(keep)), ["sh-1-1.txt", "sh-1-2.txt", "sh-1-3.txt"])

# Two benches take turns: run 1 of each before run 2 of either.
with tempfile.TemporaryDirectory() as d:
    log = os.path.join(d, "order")
    a = f'echo a$COHORT_BENCH_RUN >> {log}'
    b = f'echo b$COHORT_BENCH_RUN >> {log}'
    subprocess.run([repeat, "--runs", "2", "--", "sh", "-c", a, "--", "sh", "-c", b], capture_output=True)
    with open(log) as f:
        check("turns", f.read().split(), ["a1", "b1", "a2", "b2"])

# --only keeps the matching lines.
done = subprocess.run([repeat, "--runs", "2", "--only", "^keep", "--", "sh", "-c",
                       'echo "keep $COHORT_BENCH_RUN"; echo "drop $COHORT_BENCH_RUN"'], capture_output=True, text=True)
check("--only", done.stdout.splitlines()[1:], ["keep 1.5 (1-2)"])

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("bench/repeat summarized every case as expected")
