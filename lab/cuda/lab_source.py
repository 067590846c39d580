"""The lab's copy of the shipped attention kernels: backends/cuda/kernels with variants.patch applied.

What ships knows nothing of the lab; the lab's variants (-D switches), traces and the CPU emulator's
branch are a patch over the shipped files, applied to a copy here. With no lab macro defined the
copy preprocesses to the shipped tokens, so timing "ship" in the lab times what ships. A patch that
no longer applies stops the lab (regenerate it: see the patch's header).
"""
import functools
import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SHIPPED = os.path.join(ROOT, "backends", "cuda", "kernels")
PATCH = os.path.join(HERE, "variants.patch")


@functools.lru_cache(maxsize=None)
def kernel_dir():
    """A temporary copy of backends/cuda/kernels with the lab's variants patched in (once per process)."""
    d = os.path.join(tempfile.mkdtemp(prefix="attn_lab_"), "kernels")
    shutil.copytree(SHIPPED, d)
    r = subprocess.run(["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-F0", "-d", d, "-i", PATCH],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"lab/cuda/variants.patch does not apply to the shipped kernels:\n{r.stdout}{r.stderr}")
    return d
