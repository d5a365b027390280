#!/usr/bin/env python3
"""Runs copies of one test program at once, each round after round, and
fails when any run fails: for faults that show only under parallel load
(a test process that crashes one run in hundreds, say). Each failing run's
exit status and the end of its output are printed.

    parallel_copies.py [--copies K] [--rounds R] [--timeout S] PROGRAM [ARG...]

Each run starts a session of its own; one past its timeout is killed with
its whole process group, and counts as failed.
"""

import argparse
import os
import signal
import subprocess
import sys
import threading


def run_once(command, timeout):
    """The run's exit status (or None when it timed out) and its output."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=timeout)
        return child.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        output, _ = child.communicate()
        return None, output


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one run may take")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    if not options.command:
        parser.error("no program to run")
    if options.copies < 1 or options.rounds < 1:
        parser.error("--copies and --rounds are at least 1")

    failures = []
    lock = threading.Lock()

    def copy(index):
        for round_number in range(options.rounds):
            status, output = run_once(options.command, options.timeout)
            if status != 0:
                with lock:
                    failures.append((index, round_number, status, output))

    threads = [threading.Thread(target=copy, args=(i,)) for i in range(options.copies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    runs = options.copies * options.rounds
    for index, round_number, status, output in failures:
        if status is None:
            how = f"timed out after {options.timeout:g} s"
        elif status < 0:
            how = f"killed by {signal.Signals(-status).name}"
        else:
            how = f"exit code {status}"
        tail = output.decode(errors="replace")[-4000:]
        print(f"--- copy {index}, round {round_number}: {how}\n{tail}")
    print(f"{len(failures)} of {runs} runs failed ({options.copies} copies at once, {options.rounds} rounds each)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
