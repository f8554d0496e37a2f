"""The house rules, read from the code: who imports whom, no cycle, no rewrapping, names that mean one thing.

Static: every ``import`` of every module of ``course_utils`` and ``tools`` (inside functions too) is read
with ``ast``; nothing is run.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "course_utils"
CORE = {"model", "data", "losses", "training", "quiet", "validate", "internals", "viz", "checks", "outcomes",
        "generation"}
LESSONS = {"tour": "00", "accumulation": "01", "eos": "02", "padding": "03", "templates": "04",
           "truncation": "05", "nan_detective": "06", "token_weighting": "07", "ddp_grad": "07",
           "capstone": "08", "doctor": "08", "doctor_precision": "08", "doctor_trainer": "08",
           "watch": "08",
           "reasoning": "09", "shipping": "10", "ship": "10"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The modules ``path`` imports, absolute (``from .x import y`` resolved; ``from . import x`` too)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}  # `from . import x` imports a module
    return found


def graph() -> dict[str, set[str]]:
    files = [p for p in (*PACKAGE.rglob("*.py"), *(ROOT / "tools").glob("*.py"))]
    modules = {module_name(p): p for p in files}
    return {m: {i for i in imports(p) if i in modules and i != m} for m, p in modules.items()}


def test_no_import_cycle():
    edges = graph()
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(edges[m]):
            if n.endswith("__init__") or n in ("course_utils", "tools", "course_utils.exercises",
                                               "course_utils.exercises.answers"):
                continue  # a package's __init__ imports nothing of its submodules (lazy re-exports)
            if state.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path, m, n]))
            if n not in state:
                visit(n, [*path, m])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])


def test_core_imports_only_the_core_and_lessons_import_no_other_lesson_nor_the_exercises():
    problems = []
    for m, deps in graph().items():
        if not m.startswith("course_utils."):
            continue
        name = m.split(".", 1)[1]
        for d in deps:
            if d.startswith("tools"):
                problems.append(f"{m} imports the maintainers' {d}")
            target = d.split(".", 1)[1] if d.startswith("course_utils.") else ""
            if name in CORE and target and target.split(".")[0] not in CORE:
                problems.append(f"core module {m} imports {d}")
            if name in LESSONS and target.startswith("exercises"):
                problems.append(f"lesson module {m} imports the graders {d}")
            if name in LESSONS and target in LESSONS and target != name and {name, target} not in (
                    {"token_weighting", "ddp_grad"}, {"capstone", "doctor"}, {"capstone", "watch"},
                    {"doctor", "doctor_precision"}, {"doctor", "doctor_trainer"},
                    {"ship", "shipping"}):
                problems.append(f"lesson module {m} imports another lesson's {d}: move it to the core")
    assert not problems, "\n".join(problems)


def test_nothing_is_rewrapped_by_parameter_name():
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "check_module_arguments" not in text and "check_arguments_by_name" not in text, path


def test_check_means_a_grader_and_graders_live_in_exercises():
    """``check_x`` is an exercise checker and nothing else (a test finds the graders by that prefix)."""
    elsewhere = []
    for path in PACKAGE.rglob("*.py"):
        if "exercises" in path.parts or path.name == "checks.py":  # checks.py: the framework (run_check…)
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name.startswith("check_"):
                elsewhere.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert not elsewhere, f"check_ is for exercise checkers (course_utils/exercises/): rename {elsewhere}"


def test_each_name_is_defined_once_in_the_package():
    """One copy of each idea: a public function name defined in two modules is two versions of it."""
    where: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if "exercises" in path.parts:  # checkers' diagnose/compare helpers are private per lesson
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and node.name != "main":
                where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert not twice, f"defined in more than one module: {twice}"


def test_the_maintainers_tooling_is_not_in_the_learner_package():
    for name in ("build_course_model", "make_exercises", "run_solutions", "robustness", "claims"):
        assert not (PACKAGE / f"{name}.py").exists() and (ROOT / "tools" / f"{name}.py").exists(), name


def _reachable_from_exercise_copies() -> dict[str, object]:
    """Public functions an exercise copy can reach: imported by name from ``course_utils``, or the
    public functions of a ``course_utils`` module it binds (as the give-away probe sees them)."""
    import importlib
    import inspect
    import json

    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "\n".join(line for line in "".join(cell["source"]).splitlines()
                               if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_utils"):
                    module = importlib.import_module(node.module)
                    for alias in node.names:
                        try:  # `from course_utils import accumulation`: a submodule, loaded on import
                            found.update(_public(importlib.import_module(f"{node.module}.{alias.name}")))
                        except ModuleNotFoundError:
                            value = getattr(module, alias.name)
                            if inspect.isfunction(value):
                                found[f"{node.module}.{alias.name}"] = value
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.startswith("course_utils."):
                            found.update(_public(importlib.import_module(alias.name)))
    return found


def _public(module) -> dict[str, object]:
    import inspect

    return {f"{module.__name__}.{n}": f for n, f in vars(module).items()
            if not n.startswith("_") and inspect.isfunction(f) and f.__module__ == module.__name__}


def _holds_a_cause(value, depth: int = 0) -> bool:
    from course_utils.checks import Diagnosis

    if isinstance(value, Diagnosis):
        return True
    if depth < 2 and isinstance(value, dict):
        return bool({"cause", "truth", "answer"} & set(map(str, value))) or any(
            _holds_a_cause(v, depth + 1) for v in value.values())
    if depth < 2 and isinstance(value, (list, tuple)):
        return any(_holds_a_cause(v, depth + 1) for v in value[:8])
    return False


@pytest.mark.slow  # draws one case of every generator the copies reach (~30 s): `make test-slow`, CI
def test_exercise_copies_reach_no_generator_that_returns_a_cause():
    """A diagnosis exercise shows what a practitioner sees; the generator that knows the cause is private
    to its checker's module. Every function the exercise copies reach that draws a case from a seed is
    called, and what it returns must not name the cause (a Diagnosis, or a cause/truth/answer field)."""
    import inspect

    telling = []
    for name, fn in sorted(_reachable_from_exercise_copies().items()):
        params = inspect.signature(fn).parameters
        required = [p for p in params.values() if p.default is inspect.Parameter.empty
                    and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY)]
        if [p.name for p in required] != ["seed"] or name.split(".")[-1].startswith("check_"):
            continue
        if _holds_a_cause(fn(seed=7)):
            telling.append(name)
    assert not telling, f"the exercise copies reach generators that return the cause: {telling}"
