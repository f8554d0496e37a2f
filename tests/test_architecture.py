"""The house rules, read from the code: who imports whom, no cycle, no rewrapping, names that mean one thing.

Static: every ``import`` of every module of ``course_utils`` and ``tools`` (inside functions too) is read
with ``ast``; nothing is run.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "course_utils"
CORE = {"model", "data", "losses", "training", "quiet", "validate", "internals", "viz", "checks", "outcomes",
        "generation", "predictions", "quantization", "grader_process"}
LESSONS = {"tour": "00", "accumulation": "01", "eos": "02", "padding": "03", "templates": "04",
           "truncation": "05", "nan_detective": "06", "token_weighting": "07", "ddp_grad": "07",
           "capstone": "08", "doctor": "08", "watch": "08", "run_rules": "08",
           "reasoning": "09", "shipping": "10", "ship": "10", "packing_arch": "12", "lora_coverage": "13"}
# The doctor is a package (lesson 08's tool): its files import each other, and no other lesson's module
DOCTOR = {"doctor", "doctor.__main__", "doctor.report", "doctor.inputs", "doctor.trl_view", "doctor.checks",
          "doctor.lengths", "doctor.precision", "doctor.trainer", "doctor.reasoning", "doctor.run",
          "doctor.architecture", "doctor.data_checks", "doctor.autopsy", "doctor.catalogue", "doctor.formats"}
# Lesson modules that may import each other: a lesson's two modules, or the capstone and its tools.
# The doctor (lesson 08's tool) measures with the lesson's own function where a check needs one (one copy
# of each idea): lesson 07's token count, lesson 12's packing probe, lesson 13's LoRA coverage; run_rules is
# the watch's and the autopsy's one copy of each rule.
PAIRS = ({"token_weighting", "ddp_grad"}, {"capstone", "doctor"}, {"capstone", "watch"}, {"ship", "shipping"},
         {"doctor", "token_weighting"}, {"doctor", "packing_arch"}, {"doctor", "lora_coverage"},
         {"doctor", "run_rules"}, {"watch", "run_rules"})
MAX_DOCTOR_LINES = 600  # issue 42: no room of the doctor too big to live in


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules=()) -> set[str]:
    """The modules ``path`` imports, absolute (``from .x import y`` resolved; ``from . import x`` too), and
    those it loads with ``importlib.import_module``: a string, or an f-string whose text before the first
    ``{`` is a module prefix (every module of ``modules`` with that prefix: self_test's
    ``f"course_utils.exercises.answers.lesson{lesson}"`` reaches every answers module)."""
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
            submodules = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
            found |= submodules  # `from . import x` imports the module x, not a name of the package
            if len(submodules) < len(node.names) or not modules:
                found.add(base)
        elif _is_import_module(node):
            found |= _dynamic_targets(node.args[0], modules)
    return found


def _is_import_module(node) -> bool:
    return (isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module")


def _dynamic_targets(arg, modules) -> set[str]:
    """The modules an ``import_module(arg)`` may load; a relative or computed name gives none (the package's
    lazy ``__getattr__``, the doctor importing the user's trainer class)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value}
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = arg.values[0].value
        if prefix.startswith("course_utils."):
            return {m for m in modules if m.startswith(prefix)}
    return set()


def graph() -> dict[str, set[str]]:
    files = [p for p in (*PACKAGE.rglob("*.py"), *(ROOT / "tools").glob("*.py"))]
    modules = {module_name(p): p for p in files}
    return {m: {i for i in imports(p, modules) if i in modules and i != m} for m, p in modules.items()}


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
            if name.split(".")[0] in LESSONS and target.startswith("exercises"):
                problems.append(f"lesson module {m} imports the graders {d}")
            me, other = name.split(".")[0], target.split(".")[0]  # a package is one lesson module
            if me in LESSONS and other in LESSONS and other != me and {me, other} not in PAIRS:
                problems.append(f"lesson module {m} imports another lesson's {d}: move it to the core")
    assert not problems, "\n".join(problems)


def test_every_module_of_the_package_is_registered():
    """A new module is placed on purpose: in the core, as a lesson's module (or a file of the doctor), or as
    a lesson's checkers / reference answers. An unknown one fails here, naming where to register it."""
    unknown = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path).removeprefix("course_utils").removeprefix(".")
        known = (name in ("", "exercises", "exercises.answers", "exercises.self_test",
                          "exercises.answers.self_test_bank") or name in CORE
                 or name in LESSONS or name in DOCTOR
                 or re.fullmatch(r"exercises(\.answers)?\.lesson\d\d", name))
        if not known:
            unknown.append(name)
    assert not unknown, (f"unregistered modules {unknown}: add each to CORE, LESSONS or DOCTOR in "
                         "tests/test_architecture.py (and to README's layout)")


def test_the_doctor_package_is_registered_whole_and_its_rooms_are_small():
    files = {module_name(p).removeprefix("course_utils.") for p in (PACKAGE / "doctor").glob("*.py")}
    assert files == DOCTOR, f"doctor files {files ^ DOCTOR} are not (or no longer) registered in DOCTOR"
    big = {f: n for p in (PACKAGE / "doctor").glob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_DOCTOR_LINES
           for f in [p.name]}
    assert not big, f"doctor modules over {MAX_DOCTOR_LINES} lines: {big} — split them by topic"


# Private names imported across files before issue 42, in files other helpers own: each is to become public
# (or move) in its owner's next pass; a new one fails the test below
KNOWN_PRIVATE_IMPORTS = {
    "eos": {"generation._as_list", "generation._check_eos_ids", "generation._check_id",
            "generation._check_token_id", "generation._generate", "generation._vocab"},
    "exercises.lesson07": {"token_weighting._accumulated_grad", "token_weighting._flat_grad",
                           "token_weighting._relative_error"},
    "exercises.lesson10": {"shipping._drift", "shipping._logits"},
    "exercises.self_test": {"checks._report"},
    "exercises.lesson00": {"exercises.answers.lesson00._messages_for"},
    "exercises.lesson09": {"exercises.answers.lesson09._tokenizer"},
}


def test_no_file_calls_another_files_private_names():
    """``from .x import _name`` and ``x._name`` (``x`` a module of the package) across files: a private name
    is private to its file (issue 42: the doctor's siblings were called through underscore names)."""
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    leaks = []
    for path in PACKAGE.rglob("*.py"):
        me = module_name(path).removeprefix("course_utils.")
        package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
        aliases, found = {}, set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
                for a in node.names:
                    if f"{base}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{base}.{a.name}"
                    elif _private(a.name):
                        found.add(f"{base.removeprefix('course_utils.')}.{a.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases):
                found.add(f"{aliases[node.value.id].removeprefix('course_utils.')}.{node.attr}")
        known = KNOWN_PRIVATE_IMPORTS.get(me, set())
        leaks += [f"{path.relative_to(ROOT)} uses {name}" for name in sorted(found - known)]
    assert not leaks, ("make these public (a docstring, checked arguments) or keep them in one file:\n"
                       + "\n".join(leaks))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_dynamic_imports_are_seen_by_the_cycle_test():
    """self_test loads each lesson's reference answers with ``importlib``: the graph holds those edges, so
    the cycle test sees them (an answers module importing self_test back would fail it)."""
    edges = graph()
    answers = {m for m in edges if m.startswith("course_utils.exercises.answers.lesson")}
    assert answers and answers <= edges["course_utils.exercises.self_test"]


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
