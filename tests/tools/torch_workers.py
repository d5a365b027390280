"""PyTorch workers, unchanged, under cohort-run: a gloo all_reduce across 4
ranks, a worker whose exception torch's @record writes to the error
file, which must reach cohort-run's summary, and workers under torch's
file-timer watchdog. Exits 77 (skipped) where
torch cannot be imported.

    torch_workers.py COHORT_RUN
"""
import os
import subprocess
import sys
import tempfile
import textwrap
import launcher_env  # noqa: F401 (clears what cohort-run would read)

cohort_run = sys.argv[1]
# Debian's python3-torch is installed for Debian's interpreter.
python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
if subprocess.run([python, "-c", "import torch.distributed"], capture_output=True).returncode != 0:
    print("torch is not importable: skipped")
    sys.exit(77)

# One write per line: the ranks share cohort-run's stdout, where separate
# writes of a line and its newline (PYTHONUNBUFFERED) could interleave.
ALL_REDUCE = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
os.write(1, f"rank {dist.get_rank()} of {dist.get_world_size()}: {t.item()}\\n".encode())
dist.destroy_process_group()
"""

RECORD = """
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("bad batch from the worker")

if __name__ == "__main__":
    main()
"""

# torch's own file-timer client: the watchdog kills the rank whose timer
# expires (1 s into a 30 s sleep); rank 0, whose timer is released first,
# runs on. Rank 1 sets its timer only once rank 0 has released its own.
WATCHDOG = """
import os, time
import torch.distributed.elastic.timer as timer
timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
released = os.path.join(os.environ["TMPDIR"], "released")
if os.environ["RANK"] == "0":
    with timer.expires(after=5):
        time.sleep(0.1)
    os.write(1, b"rank 0 released its timer\\n")
    open(released, "w").close()
else:
    while not os.path.exists(released):
        time.sleep(0.05)
    with timer.expires(after=1):
        time.sleep(30)
    os.write(1, b"rank 1 released its timer\\n")
time.sleep(30)
"""

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


with tempfile.TemporaryDirectory() as tmp:
    script = os.path.join(tmp, "all_reduce.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(ALL_REDUCE))
    run = subprocess.run([cohort_run, "-n", "4", "--", python, script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TMPDIR=tmp))
    check(run.returncode == 0, f"all_reduce exit code {run.returncode}: {run.stderr}")
    lines = sorted(run.stdout.splitlines())
    check(lines == [f"rank {r} of 4: 10.0" for r in range(4)], f"all_reduce output {lines}")

    # The script alone, as torchrun takes it: cohort-run finds the python3
    # that has torch, even behind one in PATH that has not.
    shadow = os.path.join(tmp, "bin")
    os.mkdir(shadow)
    with open(os.path.join(shadow, "python3"), "w") as f:
        f.write("#!/bin/sh\nexit 1\n")
    os.chmod(os.path.join(shadow, "python3"), 0o755)
    env = dict(os.environ, TMPDIR=tmp, PATH=shadow + os.pathsep + os.path.dirname(python) + os.pathsep + os.environ["PATH"])
    run = subprocess.run([cohort_run, "--nproc_per_node", "4", script], capture_output=True, text=True, timeout=300,
                         env=env)
    check(run.returncode == 0, f"all_reduce as a script: exit code {run.returncode}: {run.stderr}")
    lines = sorted(run.stdout.splitlines())
    check(lines == [f"rank {r} of 4: 10.0" for r in range(4)], f"all_reduce as a script: output {lines}")

    script = os.path.join(tmp, "record_worker.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(RECORD))
    run = subprocess.run([cohort_run, "-n", "2", "--", python, script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TMPDIR=tmp))
    check(run.returncode == 1, f"@record exit code {run.returncode}")
    summary = run.stderr[run.stderr.find("Root cause"):]
    check("message    : ValueError: bad batch from the worker" in summary, f"@record message missing: {run.stderr}")
    check("record_worker.py\", line 6, in main" in summary, f"@record traceback missing: {run.stderr}")

    script = os.path.join(tmp, "watchdog_worker.py")
    with open(script, "w") as f:
        f.write(textwrap.dedent(WATCHDOG))
    run = subprocess.run([cohort_run, "-n", "2", "--", python, script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TMPDIR=tmp, TORCHELASTIC_ENABLE_FILE_TIMER="1"))
    check(run.returncode == 137, f"watchdog exit code {run.returncode}: {run.stderr}")
    check(run.stdout == "rank 0 released its timer\n", f"watchdog output {run.stdout!r}")
    summary = run.stderr[run.stderr.find("Root cause"):]
    check("rank       : 1 " in summary and "SIGKILL" in summary, f"watchdog root cause: {run.stderr}")

for failure in failures:
    print("FAILED:", failure)
sys.exit(1 if failures else 0)
