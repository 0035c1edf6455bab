"""What the image builder would build, rendered without Docker: flytekit's default builder writes its build context
(the Dockerfile and the requirements it installs), and every third-party module the tasks import is installed."""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest
from flytekit.image_spec.default_builder import create_docker_context

from images import analysis_image, training_image
from images.images import LOCK_FILE, PROJECT_ROOT

# What runs in a pod: the package, the tasks and the workflows (scripts/ and tests/ never do).
POD_CODE = ("finetune_bench", "tasks", "workflows", "images")


@pytest.fixture(scope="module")
def training_context(tmp_path_factory) -> Path:
    context = tmp_path_factory.mktemp("training-image")
    create_docker_context(training_image, context)
    return context


def _requirements(context: Path) -> dict[str, str]:
    text = next(context.glob("requirements*.txt")).read_text()
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+)$", text, flags=re.M)}


def test_the_training_image_installs_the_locked_cuda_torch_and_the_elastic_plugin(training_context):
    requirements = _requirements(training_context)
    locked = re.search(r"^torch==(\S+)$", LOCK_FILE.read_text(), flags=re.M).group(1)
    # PyPI's Linux wheel of the pinned torch: a CUDA build (its nvidia-* runtime wheels come as its dependencies),
    # the same version the tests run; no CPU-only index, no local build label
    assert requirements["torch"] == locked and "+" not in locked
    dockerfile = (training_context / "Dockerfile").read_text()
    assert "download.pytorch.org/whl/cpu" not in dockerfile and "--no-deps -r" not in dockerfile
    for name in ("triton", "transformers", "trl", "liger-kernel", "flytekitplugins-kfpytorch", "kubernetes"):
        assert name in requirements, name
    # the project itself, from the copied source
    assert "uv pip install --no-deps /root" in dockerfile
    assert "python=3.11" in dockerfile


def _third_party_imports() -> set[str]:
    """Top-level modules imported anywhere in the code that runs in a pod, other than its own and the stdlib's."""
    own = {"finetune_bench", "tasks", "workflows", "images", "tests"}
    modules = set()
    for folder in POD_CODE:
        for path in (PROJECT_ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in own and m not in sys.stdlib_module_names}


def test_every_module_the_pods_import_is_in_the_training_image(training_context):
    requirements = set(_requirements(training_context))
    distributions = importlib.metadata.packages_distributions()
    # installed only with the optional `switchback` extra (its arm says so when it is missing)
    optional = {"bitsandbytes"}
    missing = {}
    for module in sorted(_third_party_imports() - optional):
        names = {d.lower().replace("_", "-") for d in distributions.get(module, [])}
        if not names & {r.replace("_", "-") for r in requirements}:
            missing[module] = sorted(names) or "not installed here"
    assert not missing, f"imported in pod code but not installed by the training image: {missing}"


def test_the_analysis_image_renders_without_the_gpu_stack(tmp_path):
    create_docker_context(analysis_image, tmp_path)
    requirements = _requirements(tmp_path)
    assert "torch" not in requirements and "liger-kernel" not in requirements
    assert {"pandas", "seaborn", "flytekit"} <= set(requirements)


def _analysis_image_modules() -> set[str]:
    """The modules the analysis image's pods load: where each of its tasks (and dynamic nodes) is defined."""
    import importlib

    from flytekit.core.base_task import PythonTask

    modules = set()
    for name in ("workflows.benchmark", "workflows.frontier", "workflows.kernels"):
        module = importlib.import_module(name)
        for loaded in [module, *(sys.modules[m] for m in list(sys.modules) if m.startswith(("tasks.", "workflows.")))]:
            for value in vars(loaded).values():
                if isinstance(value, PythonTask) and getattr(value, "container_image", None) is analysis_image:
                    modules.add(value.instantiated_in or value.task_function.__module__)
    return modules


_WITHOUT_THE_TRAINING_STACK = """
import importlib, importlib.abc, json, sys, traceback
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {training_only!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, Missing())
failed = {{}}
for module in {modules!r}:
    try:
        importlib.import_module(module)
    except Exception:
        failed[module] = traceback.format_exc()[-1500:]
print(json.dumps(failed))
"""


def test_every_module_the_analysis_image_loads_imports_without_the_training_stack():
    """The analysis image has no torch: a pod of one of its tasks imports the task's module without it (an Elastic
    task, say, cannot even be defined there). One process imports them all, one after the other, with the training
    stack unimportable from its start: a module that needs any of it fails as it would in a pod of its own."""
    import json
    import os
    import subprocess

    from images.images import TRAINING_ONLY

    modules = _analysis_image_modules()
    assert {"tasks.analysis", "tasks.train", "tasks.frontier"} <= modules
    training_only = {name.replace("-", "_") for name in TRAINING_ONLY}
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    code = _WITHOUT_THE_TRAINING_STACK.format(training_only=training_only, modules=sorted(modules))
    done = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1500:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert failed == {}, "\n".join(f"{module}: {tail}" for module, tail in failed.items())
