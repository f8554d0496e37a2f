"""`make install`'s torch choice (tools/install_torch.py): CPU build unless a GPU or the user asks.

No network: every case passes the GPU and the CPU index's reachability in, or pretends them on the
command line (--gpu, --cpu-index), and --dry-run only prints the pip command.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "install_torch.py"
_spec = importlib.util.spec_from_file_location("install_torch", SCRIPT)
install_torch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install_torch)
REQ = install_torch.pinned_torch()
CPU = install_torch.CPU_INDEX


def _plan(torch="auto", gpu=False, system="Linux", installed=None, cpu_index_ok=True):
    return install_torch.plan(REQ, torch=torch, gpu=gpu, system=system, installed=installed,
                              cpu_index_ok=cpu_index_ok)


def test_the_pin_comes_from_pyproject():
    assert REQ == "torch==2.13.0"


def test_no_gpu_on_linux_installs_the_cpu_build_from_pytorchs_cpu_index():
    args, why = _plan()
    assert args == ["install", REQ, "--index-url", CPU] and "no NVIDIA GPU" in why


def test_a_gpu_or_torch_cuda_uses_the_default_index():
    for args, why in (_plan(gpu=True), _plan(torch="cuda"), _plan(torch="cuda", gpu=True)):
        assert args == ["install", REQ] and "CUDA" in why


def test_torch_cpu_wins_over_a_gpu():
    assert _plan(torch="cpu", gpu=True)[0] == ["install", REQ, "--index-url", CPU]


def test_an_unreachable_cpu_index_falls_back_and_says_so_in_one_line():
    args, why = _plan(cpu_index_ok=False)
    assert args == ["install", REQ]
    assert "cannot be reached" in why and CPU in why and "\n" not in why


def test_an_installed_torch_is_left_alone():
    for torch in install_torch.CHOICES:
        args, why = _plan(torch=torch, installed="2.13.0+cu130")
        assert args is None and "left alone" in why and "2.13.0+cu130" in why


def test_a_wheelhouse_install_probes_nothing_and_takes_the_folders_wheel():
    args, why = install_torch.plan(REQ, torch="auto", gpu=False, system="Linux", installed=None,
                                   cpu_index_ok=False, no_index=True)
    assert args == ["install", REQ] and "PIP_NO_INDEX" in why


def test_macos_uses_the_default_index_whose_wheels_are_cpu_builds():
    assert _plan(system="Darwin")[0] == ["install", REQ]


def test_an_unknown_choice_is_rejected_with_the_choices():
    with pytest.raises(SystemExit, match="auto, cpu, cuda"):
        _plan(torch="rocm")


def _dry_run(*flags, **env):
    out = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", *flags], capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin", **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


@pytest.mark.skipif(sys.platform != "linux", reason="the CPU index is chosen on Linux only")
def test_dry_run_prints_the_pip_command_for_no_gpu_and_gpu():
    why, command = _dry_run("--gpu=no", "--cpu-index=reachable")
    assert why.startswith("torch: no NVIDIA GPU")
    assert command.endswith(f"tools/fast_install.py {REQ} --index-url {CPU}")
    why, command = _dry_run("--gpu=yes")
    assert "NVIDIA GPU found" in why and command.endswith(f"tools/fast_install.py {REQ}")
    why, command = _dry_run("--gpu=no", "--cpu-index=unreachable")
    assert "cannot be reached" in why and command.endswith(f"tools/fast_install.py {REQ}")
    why, command = _dry_run("--gpu=no", "--torch=cuda")
    assert why.startswith("torch: TORCH=cuda") and command.endswith(REQ)
    why, command = _dry_run("--gpu=no", "--cpu-index=reachable", TORCH_CPU_INDEX="http://mirror/cpu")
    assert command.endswith(f"{REQ} --index-url http://mirror/cpu"), "a mirror of the CPU index is used"
    why, command = _dry_run("--gpu=no", "--cpu-index=reachable", "--download=wh")
    assert command.endswith(f"-m pip download --dest wh --quiet {REQ} --index-url {CPU}")


def test_the_makefile_runs_the_choice_before_the_package():
    recipe = (ROOT / "Makefile").read_text()
    torch = recipe.index("tools/install_torch.py --torch=$(TORCH)")
    course = recipe.index("tools/fast_install.py -e .")
    assert torch < course, "the torch build is chosen before the course pulls in a default torch"


# --- tools/fast_install.py: uv with pip's own settings, pip when uv cannot ----------------------------

_fast_spec = importlib.util.spec_from_file_location("fast_install", ROOT / "tools" / "fast_install.py")
fast_install = importlib.util.module_from_spec(_fast_spec)
_fast_spec.loader.exec_module(fast_install)


def test_pips_settings_become_uv_flags_with_pips_precedence():
    listing = ("global.extra-index-url='file:///a/simple file:///b/simple'\n"
               "global.find-links='/wheels'\n"
               ":env:.find-links='/room/wheelhouse'\n"       # PIP_FIND_LINKS wins over pip.conf
               "global.constraint='/etc/pip/c.txt'\n"
               "install.index-url='https://mirror/simple'\n"
               "global.cert='/etc/ssl/ca.crt'\n"
               "global.timeout='60'\n")                       # no uv flag: ignored
    flags, env = fast_install.uv_flags(fast_install.pip_settings(listing))
    assert flags == ["--index-url", "https://mirror/simple", "--extra-index-url", "file:///a/simple",
                     "--extra-index-url", "file:///b/simple", "--find-links", "/room/wheelhouse",
                     "--constraint", "/etc/pip/c.txt"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/ca.crt"}


def test_a_wheelhouse_install_stays_offline_under_uv():
    flags, _ = fast_install.uv_flags(fast_install.pip_settings(
        ":env:.no-index='1'\n:env:.find-links='/room/wheelhouse'\nglobal.index-url='https://pypi.org/simple'\n"))
    assert flags == ["--no-index", "--find-links", "/room/wheelhouse"], "no index at all, as pip would"


def test_bytecode_is_compiled_at_install_only_where_python_will_not_cache_it():
    assert fast_install.compile_flag({"PYTHONDONTWRITEBYTECODE": "1"}) == ["--compile-bytecode"]
    assert fast_install.compile_flag({}) == [], "elsewhere each module is compiled at its first import"
    assert fast_install.compile_flag({"PYTHONDONTWRITEBYTECODE": ""}) == [], "empty means unset, as in Python"


def test_make_clears_pythondontwritebytecode_so_the_venv_caches_bytecode():
    assert re.search(r"^unexport PYTHONDONTWRITEBYTECODE$", (ROOT / "Makefile").read_text(), re.MULTILINE)


def test_fast_install_dry_run_names_uv_and_pip_only_says_pip():
    script = [sys.executable, str(ROOT / "tools" / "fast_install.py"), "--dry-run", "-e", "."]
    run = subprocess.run(script, capture_output=True, text=True, check=True)
    assert " pip install --quiet --python " in run.stdout
    assert run.stdout.rstrip().endswith("-e ."), run.stdout
    run = subprocess.run(script, capture_output=True, text=True, check=True,
                         env={**os.environ, "COURSE_INSTALLER": "pip"})
    assert run.stdout.startswith("install: COURSE_INSTALLER=pip"), run.stdout


def test_environment_yml_installs_the_cpu_build():
    assert f"--extra-index-url {CPU}" in (ROOT / "environment.yml").read_text()


def test_lesson00_environment_check_ignores_the_test_extra():
    from course_utils.tour import pinned_versions

    pins = pinned_versions()
    assert pins["torch"] == "2.13.0" and "playwright" not in pins, "no lesson needs the browser test's extra"


def test_lesson_report_names_the_assertion_of_a_failed_lesson():
    spec = importlib.util.spec_from_file_location("lesson_report", ROOT / "tools" / "lesson_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    out = "FAILED x.ipynb::Cell 14\n\x1b[31mAssertionError\x1b[39m: masking by position and the model stops\n"
    assert report.first_failure(out) == "AssertionError: masking by position and the model stops"
