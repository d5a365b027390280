"""Unsets, in this process, every variable cohort-run reads besides its
flags (a Slurm step's, torchrun's PET_ flags and TORCHELASTIC_ settings,
the interpreter's choice, the thread count it defaults), so that the
launchers a test starts see only what the test sets, wherever the suite
runs. Imported for that effect."""
import os

for name in list(os.environ):
    if name.startswith(("SLURM_", "PET_", "TORCHELASTIC_", "TORCH_ELASTIC_")) or name in (
            "PYTHON_EXEC", "COHORT_PYTHON", "OMP_NUM_THREADS"):
        del os.environ[name]
