"""Python workers under cohort-run, without torch: Ctrl-C reaches them as
KeyboardInterrupt (their finally blocks run), and the summary says the run
was interrupted.

    python_workers.py COHORT_RUN
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import launcher_env  # noqa: F401 (clears what cohort-run would read)

cohort_run = sys.argv[1]

WORKER = """
import os, sys, time
out = sys.argv[1]
rank = os.environ["RANK"]
try:
    open(os.path.join(out, "up-" + rank), "w").close()
    time.sleep(60)
except KeyboardInterrupt:
    open(os.path.join(out, "interrupted-" + rank), "w").close()
finally:
    open(os.path.join(out, "finally-" + rank), "w").close()
"""

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


with tempfile.TemporaryDirectory() as tmp:
    script = os.path.join(tmp, "worker.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(WORKER))
    launcher = subprocess.Popen([cohort_run, "--python", sys.executable, "-n", "3", script, tmp],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, TMPDIR=tmp))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(os.path.exists(os.path.join(tmp, f"up-{r}")) for r in range(3)):
        time.sleep(0.02)
    launcher.send_signal(signal.SIGINT)
    try:
        out, err = launcher.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        # Not left behind: the launcher this test started, by its pid (its
        # ranks go with it: cohort-run's guardian).
        launcher.kill()
        out, err = launcher.communicate()
        failures.append(f"cohort-run did not end within 120 s of SIGINT: {err}")
    check(launcher.returncode == 130, f"exit code {launcher.returncode}: {err}")
    for rank in range(3):
        check(os.path.exists(os.path.join(tmp, f"interrupted-{rank}")), f"rank {rank}: no KeyboardInterrupt: {err}")
        check(os.path.exists(os.path.join(tmp, f"finally-{rank}")), f"rank {rank}: its finally did not run")
    check("interrupted by SIGINT" in err, f"summary: {err}")
    check("failed" not in err, f"summary says failed: {err}")

# --run-path runs the script under what torch's `record` does for torchrun:
# an escaping exception reaches the error file, the summary and cohort-run's
# own error file.
RAISER = """
import os
if os.environ["RANK"] == "1":
    raise ValueError("run-path boom")
"""

with tempfile.TemporaryDirectory() as tmp:
    script = os.path.join(tmp, "raiser.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(RAISER))
    outer = os.path.join(tmp, "outer.json")
    try:
        done = subprocess.run([cohort_run, "--python", sys.executable, "-n", "2", "--run-path", script],
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, TMPDIR=tmp, TORCHELASTIC_ERROR_FILE=outer))
        check(done.returncode == 1, f"--run-path: exit code {done.returncode}: {done.stderr}")
        check("ValueError: run-path boom" in done.stderr, f"--run-path: the summary: {done.stderr}")
        try:
            with open(outer) as f:
                written = json.load(f)
            check(written["message"]["message"] == "ValueError: run-path boom" and
                  "run-path boom" in written["message"]["extraInfo"]["py_callstack"],
                  f"--run-path: cohort-run's error file: {written}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            failures.append(f"--run-path: cohort-run's error file: {e!r}: {done.stderr}")
    except subprocess.TimeoutExpired:
        failures.append("--run-path: cohort-run did not end within 120 s")

for failure in failures:
    print("FAILED:", failure)
sys.exit(1 if failures else 0)
