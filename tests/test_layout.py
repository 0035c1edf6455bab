"""The core's layout holds: subpackages named after the stages data flows through, each importing only the
stages before it (no circles), each `__init__` a short statement of what it owns, and the analysis side free
of torch (the analysis image has none)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CORE = PROJECT_ROOT / "finetune_bench"
# The stages in the order data flows; a stage may import the ones before it, never one after.
STAGES = (
    "inputs",
    "sources",
    "measuring",
    "prediction",
    "results",
    "running",
    "integrations",
    "analysis",
    "reporting",
    "frontier",
    "kernels",
)


def _imported_modules(path: Path) -> set[str]:
    """Every `finetune_bench` module `path` imports, at the top or inside a function (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    type_checking = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("finetune_bench"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("finetune_bench"))
    return found


def _stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def _stage_imports() -> dict[tuple[str, str], list[str]]:
    """(importing stage, imported stage) → the files where that happens."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(CORE.rglob("*.py")):
        stage = path.relative_to(CORE).parts[0]
        if stage not in STAGES:
            continue
        for module in _imported_modules(path):
            target = _stage_of(module)
            if target and target != stage:
                edges.setdefault((stage, target), []).append(str(path.relative_to(PROJECT_ROOT)))
    return edges


def test_every_module_belongs_to_a_stage():
    top_level = sorted(p.name for p in CORE.iterdir() if p.suffix == ".py" and p.name != "__init__.py")
    assert top_level == [], f"modules outside any stage: {top_level}"
    packages = sorted(p.name for p in CORE.iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted(STAGES)


def test_each_stage_imports_only_the_stages_before_it():
    backwards = {
        f"{source} imports {target} ({', '.join(sorted(set(files)))})": files
        for (source, target), files in _stage_imports().items()
        if STAGES.index(target) > STAGES.index(source)
    }
    assert not backwards, "imports against the flow:\n" + "\n".join(backwards)


def test_no_module_import_circle_inside_a_stage():
    graph = {}
    for path in CORE.rglob("*.py"):
        module = ".".join(("finetune_bench", *path.relative_to(CORE).with_suffix("").parts)).removesuffix(".__init__")
        graph[module] = {m for m in _imported_modules(path) if m != module}
    modules = set(graph)
    graph = {m: {t for t in targets if t in modules} for m, targets in graph.items()}
    visiting, done, circles = set(), set(), []

    def visit(module: str, trail: list[str]) -> None:
        if module in done:
            return
        if module in visiting:
            circles.append(trail[trail.index(module) :] + [module])
            return
        visiting.add(module)
        for target in sorted(graph[module]):
            visit(target, [*trail, module])
        visiting.discard(module)
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_says_in_a_few_lines_what_it_owns(stage):
    init = CORE / stage / "__init__.py"
    tree = ast.parse(init.read_text())
    docstring = ast.get_docstring(tree)
    assert docstring, f"{init} has no docstring"
    assert len(docstring.splitlines()) <= 3, f"{init}: say it in two or three lines"
    assert len(tree.body) == 1, f"{init} should hold only its docstring (no re-exports, no code)"


def test_analysis_and_reporting_run_without_torch():
    """The analysis task's image has no torch: its task module and everything it imports must load without."""
    modules = [
        ".".join(("finetune_bench", *p.relative_to(CORE).with_suffix("").parts)).removesuffix(".__init__")
        for stage in ("analysis", "reporting", "results", "inputs")
        for p in sorted((CORE / stage).rglob("*.py"))
        if not (stage == "results" and p.name == "store.py")  # the train task's, with its NVML probe
    ]
    script = (
        "import importlib.abc, sys\n"
        "BLOCKED = ('torch', 'triton', 'transformers', 'liger_kernel', 'trl', 'peft')\n"
        "class NotInTheAnalysisImage(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'{name} is not in the analysis image')\n"
        "sys.meta_path.insert(0, NotInTheAnalysisImage())\n"
        f"for module in {[*modules, 'tasks.analysis']!r}:\n"
        "    __import__(module)\n"
        "assert not any(m.split('.')[0] in BLOCKED for m in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


# A module longer than this holds more than one idea: split it along them (docs/architecture.md).
MOST_LINES = 500


def test_no_module_of_the_core_the_tasks_or_the_workflows_is_over_the_mark():
    long = {
        str(path.relative_to(PROJECT_ROOT)): lines
        for folder in (CORE, PROJECT_ROOT / "tasks", PROJECT_ROOT / "workflows")
        for path in sorted(folder.rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MOST_LINES
    }
    assert not long, f"modules over {MOST_LINES} lines: {long}"
