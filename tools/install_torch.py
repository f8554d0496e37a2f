"""Install the pinned torch into the course's venv, choosing the build on purpose (`make install` runs this).

    .venv/bin/python tools/install_torch.py              # what `make install` does
    .venv/bin/python tools/install_torch.py --dry-run    # print the decision and the install command only
    TORCH=cuda make install                                 # ask for the default index's (CUDA) build
    .venv/bin/python tools/install_torch.py --download wheelhouse   # what `make wheelhouse` does

Why: on Linux, `pip install torch==X` from PyPI is the CUDA build — ~3 GB of NVIDIA libraries on a
laptop without a GPU. PyTorch's install selector documents the CPU wheels' own index
(https://download.pytorch.org/whl/cpu); the CPU install of the course is under 2 GB.

The choice, in order:
1. a torch already in the venv is left alone (whatever build the user put there);
2. ``TORCH=cpu`` or ``TORCH=cuda`` is obeyed;
3. ``TORCH=auto`` (the default): an NVIDIA GPU (``nvidia-smi`` runs) → the default index; otherwise, on
   Linux, the CPU index. macOS and Windows wheels on PyPI are CPU builds already → the default index.
Where the CPU index cannot be reached (an offline mirror, a proxy), the default index is used and
one line says so. With ``PIP_NO_INDEX=1`` (installing from a wheelhouse) nothing is probed: pip takes
the torch wheel that ``make wheelhouse`` put in the folder.
Standard library only: it runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

# TORCH_CPU_INDEX: a mirror of PyTorch's CPU index (a company proxy, a local copy) used instead.
CPU_INDEX = os.environ.get("TORCH_CPU_INDEX") or "https://download.pytorch.org/whl/cpu"
ROOT = Path(__file__).resolve().parent.parent
CHOICES = ("auto", "cpu", "cuda")


def pinned_torch(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The torch requirement pinned in pyproject.toml (``torch==2.13.0``): one source for the version."""
    deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    pins = [d for d in deps if d.replace(" ", "").lower().startswith("torch==")]
    if len(pins) != 1:
        raise SystemExit(f"{pyproject}: expected one exact torch pin (torch==X.Y.Z), found {pins} — the "
                         "build choice needs a version — pin torch in [project] dependencies.")
    return pins[0].replace(" ", "")


def has_nvidia_gpu() -> bool:
    """True when ``nvidia-smi`` exists and succeeds (a driver and at least one GPU)."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def index_reachable(url: str = CPU_INDEX, timeout: float = 5.0) -> bool:
    """True when the wheel index answers (a HEAD of its torch page) within ``timeout`` seconds."""
    try:
        request = urllib.request.Request(f"{url}/torch/", method="HEAD")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status < 400
    except (OSError, ValueError):
        return False


def installed_torch() -> str | None:
    """The torch version already installed in this interpreter's environment, else None."""
    if importlib.util.find_spec("torch") is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def plan(requirement: str, *, torch: str, gpu: bool, system: str, installed: str | None,
         cpu_index_ok: bool, no_index: bool = False) -> tuple[list[str] | None, str]:
    """Decide: ``(pip arguments or None, one line saying what and why)``. Pure: every input is passed in."""
    if torch not in CHOICES:
        raise SystemExit(f"TORCH={torch!r} is not a choice — the installer knows {', '.join(CHOICES)} — "
                         "run e.g. `make install TORCH=cpu`.")
    if installed is not None:
        return None, f"torch {installed} is already in the venv: left alone (make clean to choose again)"
    default = ["install", requirement]
    cpu = ["install", requirement, "--index-url", CPU_INDEX]
    if no_index:  # a room without network: the wheelhouse holds the build `make wheelhouse` chose
        return default, f"PIP_NO_INDEX is set: {requirement} from the wheel folder (PIP_FIND_LINKS)"
    if torch == "cuda":
        return default, f"TORCH=cuda: {requirement} from the default index (on Linux, the CUDA build)"
    if torch == "auto" and gpu:
        return default, f"NVIDIA GPU found: {requirement} from the default index (the CUDA build)"
    if torch == "auto" and system != "Linux":
        return default, f"{system}: {requirement} from the default index (its wheels are CPU builds)"
    if not cpu_index_ok:
        return default, (f"the CPU wheel index {CPU_INDEX} cannot be reached: {requirement} from the "
                         "default index instead (on Linux it may be the multi-GB CUDA build)")
    reason = "TORCH=cpu" if torch == "cpu" else "no NVIDIA GPU"
    return cpu, f"{reason}: {requirement} CPU build from {CPU_INDEX}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Install the pinned torch, CPU build unless a GPU is here.")
    parser.add_argument("--torch", default=os.environ.get("TORCH") or "auto", choices=CHOICES,
                        help="which build (default: $TORCH or auto)")
    parser.add_argument("--dry-run", action="store_true", help="print the decision and the pip command only")
    parser.add_argument("--gpu", choices=("detect", "yes", "no"), default="detect",
                        help="pretend a GPU is (not) present (for --dry-run and tests)")
    parser.add_argument("--cpu-index", choices=("probe", "reachable", "unreachable"), default="probe",
                        help="pretend the CPU index is (un)reachable (for --dry-run and tests)")
    parser.add_argument("--download", metavar="DIR",
                        help="download the chosen wheel into DIR instead of installing (`make wheelhouse`)")
    args = parser.parse_args(argv)
    requirement = pinned_torch()
    gpu = has_nvidia_gpu() if args.gpu == "detect" else args.gpu == "yes"
    system = platform.system()
    installed = None if args.dry_run or args.download else installed_torch()
    no_index = os.environ.get("PIP_NO_INDEX", "").lower() in ("1", "true", "yes", "on")
    needs_probe = (args.torch != "cuda" and not gpu and system == "Linux" and installed is None
                   and not no_index)
    cpu_index_ok = (args.cpu_index == "reachable" or
                    (args.cpu_index == "probe" and needs_probe and index_reachable()))
    pip_args, why = plan(requirement, torch=args.torch, gpu=gpu, system=system, installed=installed,
                         cpu_index_ok=cpu_index_ok, no_index=no_index)
    print(f"torch: {why}")
    if pip_args is None:
        return 0
    if args.download:
        command = [sys.executable, "-m", "pip", "download", "--dest", args.download, "--quiet", *pip_args[1:]]
    else:  # uv when it can, with pip's settings; pip when it cannot (tools/fast_install.py)
        command = [sys.executable, str(ROOT / "tools" / "fast_install.py"), *pip_args[1:]]
    if args.dry_run:
        print(" ".join(command))
        return 0
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
