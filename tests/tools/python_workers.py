"""Python workers under cohort-run, without torch: Ctrl-C reaches them as
KeyboardInterrupt (their finally blocks run), and the summary says the run
was interrupted.

    python_workers.py COHORT_RUN
"""
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

for failure in failures:
    print("FAILED:", failure)
sys.exit(1 if failures else 0)
