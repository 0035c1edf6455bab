"""`union run --remote` as a user types it, with the cluster cut out: run as a script (a fresh process), it runs
union's own CLI on the given arguments, with every call that would reach a cluster or Docker replaced:

- the image build: union's own image builder (the one the project registers with) prepares what it would submit,
  and nothing is built: its spec (`spec.json`: the Python packages, the image's ENV, the commands) and the files it
  copies into the image, unpacked as the image's /root (`<out>/images/<name>/`);
- the upload of the fast-registration bundle: a copy into `<out>/blobs/`;
- the registration: the serialized entities (what the CLI would send to the control plane) written to
  `<out>/entities/{tasks,workflows}/<name>.pb`;
- the execution: the inputs the CLI converted (the `--inputs-file` values and the defaults) written as the
  workflow's literal inputs to `<out>/inputs.pb`.

    python tests/cluster/register.py OUT -- run --remote workflows/benchmark.py benchmarking_experiment ...
"""

import json
import shutil
import sys
from collections import OrderedDict
from pathlib import Path

from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.launch_plan import LaunchPlan
from flytekit.core.type_engine import TypeEngine
from flytekit.image_spec.image_spec import ImageBuildEngine
from flytekit.models import task as task_models
from flytekit.models.admin.workflow import WorkflowSpec
from flytekit.models.core.identifier import Identifier, ResourceType
from flytekit.models.literals import Literal, LiteralMap
from flytekit.remote.remote import FlyteRemote
from flytekit.tools.translator import get_serializable
from union.ucimage._image_builder import UCImageSpecBuilder


class Registered(Exception):
    """Raised once the inputs are written: nothing after it would run without a cluster."""


def main(out: Path, cli_args: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    images: dict[str, dict] = {}
    defaults: dict[str, Literal] = {}

    def build(spec):
        context = out / "images" / spec.name
        if spec.name not in images:
            shutil.rmtree(context, ignore_errors=True)
            (context / "submitted").mkdir(parents=True)
            spec_path, archive, _ = UCImageSpecBuilder()._validate_configuration(
                spec, context / "submitted", spec.image_name()
            )
            shutil.copy(spec_path, context / "spec.json")
            (context / "root").mkdir()
            if archive is not None:
                shutil.unpack_archive(archive, context / "root")
            shutil.rmtree(context / "submitted")
            images[spec.name] = {"id": spec.id, "image": spec.image_name(), "context": str(context)}
        return spec.image_name()

    def upload_file(self, to_upload, project=None, domain=None, filename_root=None):
        blobs = out / "blobs"
        blobs.mkdir(exist_ok=True)
        target = blobs / to_upload.name
        shutil.copy(to_upload, target)
        return b"", str(target)

    def register_workflow(
        self, entity, serialization_settings=None, version=None, default_launch_plan=True, options=None
    ):
        serialization_settings.version = version
        entities = OrderedDict()
        get_serializable(entities, serialization_settings, entity, options)
        # the default launch plan, which the control plane creates with the workflow: its inputs' defaults
        launch_plan = get_serializable(OrderedDict(), serialization_settings, LaunchPlan.get_or_create(entity))
        defaults.update({name: p.default for name, p in launch_plan.spec.default_inputs.parameters.items()})
        for spec in entities.values():
            if isinstance(spec, task_models.TaskSpec):
                kind, template = "tasks", spec.template
            elif isinstance(spec, WorkflowSpec):
                kind, template = "workflows", spec.template
            else:
                continue
            folder = out / "entities" / kind
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{template.id.name}.pb").write_bytes(spec.to_flyte_idl().SerializeToString())
        (out / "registered.json").write_text(
            json.dumps({"workflow": entity.name, "version": version, "images": images}, indent=2)
        )
        return Identifier(ResourceType.WORKFLOW, "p", "d", entity.name, version)

    def run_remote(remote, entity, project, domain, inputs, run_level_params, type_hints=None):
        ctx = FlyteContextManager.current_context()
        # as FlyteRemote.execute converts them (a value the CLI already made a literal is sent as it is), and as the
        # control plane starts an execution: the launch plan's defaults for the inputs not given
        given = {
            name: value
            if isinstance(value, Literal)
            else TypeEngine.to_literal(ctx, value, type_hints[name], TypeEngine.to_literal_type(type_hints[name]))
            for name, value in inputs.items()
        }
        literals = LiteralMap({**{n: d for n, d in defaults.items() if d is not None}, **given})
        (out / "inputs.pb").write_bytes(literals.to_flyte_idl().SerializeToString())
        raise Registered()

    ImageBuildEngine.build = staticmethod(build)
    FlyteRemote.upload_file = upload_file
    FlyteRemote.register_workflow = register_workflow
    import flytekit.clis.sdk_in_container.run as run_module

    run_module.run_remote = run_remote
    from union.cli._main import main as union_main

    try:
        union_main(cli_args, standalone_mode=False)
    except (Registered, SystemExit, Exception) as stop:  # union's CLI wraps what run_remote raises
        if not (out / "inputs.pb").exists():
            raise
        print(f"registered ({type(stop).__name__})")
    return 0 if (out / "inputs.pb").exists() else 1


if __name__ == "__main__":
    separator = sys.argv.index("--")
    sys.exit(main(Path(sys.argv[1]), sys.argv[separator + 1 :]))
