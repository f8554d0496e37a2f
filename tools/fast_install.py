"""`pip install ARGS`, done by uv when it can: the course's install in half the time.

    .venv/bin/python tools/fast_install.py -e .            # what `make install` runs after install_torch.py
                                                             # (which installs torch through it too)
    .venv/bin/python tools/fast_install.py --dry-run -e .  # print the command it would run, and why
    COURSE_INSTALLER=pip make install                         # pip only, never uv
    .venv/bin/python tools/fast_install.py --uv-requirement # the uv it fetches (make wheelhouse adds it)

Why: pip installs torch and the course's ~150 packages one after the other and byte-compiles them
on one core; uv's pip interface (https://docs.astral.sh/uv/pip/) resolves and links them in parallel.
Measured on a clean clone on the 2-core CI machine: the whole `make test` install took 96 s with pip,
44 s with uv byte-compiling everything, 19 s with uv leaving that to the first import (below); the
same packages at the same versions. uv is taken from PATH, or fetched into the venv with pip (one
~20 MB wheel).

uv does not read pip's configuration, so pip's own settings — what `pip config list` shows, from
pip.conf files or PIP_* variables: index-url, extra-index-url, find-links, no-index, constraint,
trusted-host, cert — become uv flags: a mirror, a company index or an offline wheelhouse
(`PIP_NO_INDEX=1 PIP_FIND_LINKS=...`) work the same. Like pip, uv then takes the best version from
all indexes (`--index-strategy unsafe-best-match`). It byte-compiles what it installs only where
PYTHONDONTWRITEBYTECODE is set (Python cannot cache the bytecode itself there); elsewhere Python
writes each module's bytecode on its first import. The Makefile clears that variable, so `make
install` leaves compiling to the first import: compiling all ~15,000 files of the packages up front
took 31 s of a 50 s install on the 2-core CI machine, and a lesson imports ~3,500 of them (the first
import of the course's libraries after the install took 24 s instead of 9 s, once). If anything about
uv fails, pip does the install: the only cost is the seconds uv took. Standard library only: it runs
before anything else is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

UV_REQUIREMENT = "uv>=0.4,<1"
# pip's list options (whitespace-separated values) and their uv flags
LIST_FLAGS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links",
              "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}
# later sections win, as in pip: a PIP_* variable over [install] over [global]
PRECEDENCE = ("global", "install", ":env:")
TRUE = ("1", "true", "yes", "on")


def pip_settings(listing: str) -> dict[str, str]:
    """``pip config list`` output (``section.key='value'`` lines) -> ``{key: value}``, precedence applied."""
    found: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in PRECEDENCE:
            continue
        rank = PRECEDENCE.index(section)
        if key not in found or rank >= found[key][0]:
            found[key] = (rank, value.strip().strip("'\""))
    return {key: value for key, (_, value) in found.items()}


def uv_flags(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """pip's settings as uv's flags, and the environment variables uv needs (``SSL_CERT_FILE``)."""
    flags, env = [], {}
    if settings.get("no-index", "").lower() in TRUE:
        flags.append("--no-index")
    elif settings.get("index-url"):
        flags += ["--index-url", settings["index-url"]]
    for key, flag in LIST_FLAGS.items():
        for value in settings.get(key, "").split():
            flags += [flag, value]
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"]
    return flags, env


def compile_flag(env) -> list[str]:
    """``--compile-bytecode`` where PYTHONDONTWRITEBYTECODE is set: Python will not cache bytecode on
    import there, so every process would compile what it imports; elsewhere nothing (first import)."""
    return ["--compile-bytecode"] if env.get("PYTHONDONTWRITEBYTECODE") else []


def find_uv(fetch: bool = True) -> str | None:
    """uv on PATH, else in this venv, else fetched into this venv with pip; None if none can be had."""
    here = Path(sys.executable).parent / "uv"
    for candidate in (shutil.which("uv"), str(here) if here.exists() else None):
        if candidate:
            return candidate
    if not fetch:
        return None
    fetched = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", UV_REQUIREMENT],
                             capture_output=True, text=True)
    return str(here) if fetched.returncode == 0 and here.exists() else None


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--uv-requirement"]:  # for `make wheelhouse`: uv goes into the folder too
        print(UV_REQUIREMENT)
        return 0
    dry_run = "--dry-run" in args
    args = [a for a in args if a != "--dry-run"]
    pip = [sys.executable, "-m", "pip", "install", "--quiet", *args]
    if os.environ.get("COURSE_INSTALLER", "auto") == "pip":
        print("install: COURSE_INSTALLER=pip: pip")
        return 0 if dry_run else subprocess.run(pip).returncode
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                             text=True).stdout
    settings = pip_settings(listing)
    if "--index-url" in args or "-i" in args:  # the caller's index replaces pip's (torch's CPU index)
        settings.pop("index-url", None)
    flags, env = uv_flags(settings)
    uv = find_uv(fetch=not dry_run)
    command = [uv or "uv", "pip", "install", "--quiet", "--python", sys.executable, *compile_flag(os.environ),
               "--index-strategy", "unsafe-best-match", *flags, *args]
    if dry_run:
        print(" ".join(command))
        return 0
    if uv is None:
        print("install: uv is not available (not on PATH, and pip could not fetch it): pip installs")
        return subprocess.run(pip).returncode
    if subprocess.run(command, env={**os.environ, **env}).returncode == 0:
        return 0
    print("install: uv failed (its message is above): pip installs instead")
    return subprocess.run(pip).returncode

if __name__ == "__main__":
    sys.exit(main())
