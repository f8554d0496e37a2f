"""The wheel a user installs holds the whole package, and the unit tests pass against it.

An editable install (``make install``) sees every file of the checkout, so a package missing from
``pyproject.toml`` goes unnoticed until someone installs the wheel: ``course_utils.answers`` once was.
Here the project is built into a wheel, unpacked into a folder outside the checkout, and the unit tests
of the learner package run from a copy of ``tests/`` in another folder, with that folder first on the
path — they must import the installed ``course_utils``, never the checkout's.
"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a wheel build and ~1 min of unit tests: `make test-slow` (and CI)

ROOT = Path(__file__).resolve().parent.parent
# The package's own unit tests: they need neither the repository's notebooks nor its tooling.
UNIT_TESTS = ("test_core.py", "test_data_and_train.py", "test_outcomes.py", "test_eos.py", "test_padding.py",
              "test_templates.py", "test_watch.py")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(ROOT)], check=True, cwd=out)
    (path,) = out.glob("*.whl")
    return path


def test_the_wheel_holds_every_package_of_the_checkout(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "course_utils").rglob("*.py")
                if "__pycache__" not in p.parts}
    missing = [p for p in sorted(packages) if not any(n.startswith(p + "/") for n in names)]
    assert not missing, f"the wheel lacks {missing}: add them to [tool.setuptools.packages.find]"
    for model in ("course_model", "course_model_llama"):
        assert f"course_utils/{model}/model.safetensors" in names, f"the {model} weights ship in the wheel"
    assert not any(n.startswith(("tools/", "tests/")) for n in names), "maintainer tooling stays out"


def test_unit_tests_pass_against_the_installed_wheel(wheel, tmp_path):
    site, tests = tmp_path / "site", tmp_path / "tests"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                    "--target", str(site), str(wheel)], check=True)
    tests.mkdir()
    for name in ("conftest.py", *UNIT_TESTS):
        shutil.copy(ROOT / "tests" / name, tests / name)
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    where = subprocess.run([sys.executable, "-c", "import course_utils; print(course_utils.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), f"the test must import the installed package, got {where}"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                          "-W", "ignore::DeprecationWarning", str(tests)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
