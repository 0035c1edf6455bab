"""Arms: what is switched on in a condition, as one sweepable value (`TrainingArgs.arm`).

An arm is `baseline`, `baseline_repeat`, or components joined by `+`:

- `liger`: Liger's kernels with Liger's defaults for the model type (`apply_liger_kernel_to_<type>()`);
- `liger:<kernel>`: that one Liger kernel alone, every other kernel off (an ablation), e.g.
  `liger:rope`, `liger:rms_norm`, `liger:swiglu`, `liger:fused_linear_cross_entropy`; the kernel
  names are the switches of Liger's own patch functions; `liger:<kernel>,<kernel>,...` a set of them;
- `liger-without-loss`: Liger's defaults for the model type with its loss kernels (`cross_entropy`,
  `fused_linear_cross_entropy`) off: its layer kernels only, e.g. beside `cce` (`liger-without-loss+cce`, what
  axolotl users run);
- `compile`: the model compiled with `torch.compile` (after Liger, so Liger's kernels are compiled in);
- `switchback`: the decoder's linear layers replaced by bitsandbytes' SwitchBack int8 linear layers
  (the `switchback` extra, bitsandbytes 0.49.2, the last release with them; a CUDA GPU only);
- `cce`: the loss computed by Apple's Cut Cross-Entropy from the last hidden states and the LM head's weight, the
  logits never in the GPU's memory (the criterion `cce` in place of the model's own loss). Only a backend that
  computes the loss itself runs it (`catalog.Backend.computes_loss_itself`). With Liger (`liger:rope+cce`) the
  Liger part must leave Liger's loss kernels off: they and CCE would both compute the loss.
- `float8`: torchao's float8 training (`torchao.float8.convert_to_float8_training`): the decoder's linear layers
  compute their matmuls in float8 with dynamic scales, the LM head stays in the model's dtype. Full fine-tunes on a
  GPU of compute capability 8.9 or newer (an H100, an L4, ...); torchao's float8 is meant to be compiled
  (`float8+compile`): eager, its casts cost more than the float8 matmuls gain.

`baseline_repeat` trains exactly like `baseline`; listing both asks for an A/A comparison, whose
spread is the noise floor a real difference must clear. Every other arm is compared with `baseline`.
"""

import functools
import inspect
from dataclasses import dataclass

from finetune_bench.inputs.errors import closest
from finetune_bench.inputs.loss_paths import CCE_CRITERION

BASELINE = "baseline"
BASELINE_REPEAT = "baseline_repeat"
LIGER = "liger"
LIGER_WITHOUT_LOSS = "liger-without-loss"
COMPILE = "compile"
SWITCHBACK = "switchback"
CCE = CCE_CRITERION  # the component computes the loss as the criterion of the same name does
FLOAT8 = "float8"
COMPONENTS = (LIGER, LIGER_WITHOUT_LOSS, COMPILE, SWITCHBACK, CCE, FLOAT8)
# What the float8 component needs: torchao, and a GPU with float8 matmuls (compute capability 8.9: Ada, Hopper).
FLOAT8_MODULE = "torchao"
FLOAT8_INSTALL_HINT = "pip install torchao"
FLOAT8_MIN_CAPABILITY = (8, 9)
# Liger's loss kernels: they only act when the model's own forward computes the loss.
LOSS_KERNELS = ("cross_entropy", "fused_linear_cross_entropy")
# The first transformers release whose decoder layers checkpoint their `forward`, with the module's hooks outside the
# checkpoint. Earlier releases checkpoint the layer's `__call__`, FSDP2's hooks inside: torch.compile cannot trace
# those hooks, cannot break its graph inside a checkpoint, and so runs every checkpointed layer uncompiled.
TRANSFORMERS_CHECKPOINTING_FORWARD = "5.23.0"


def uncompiled_layers_problem(
    arm: "Arm", gradient_checkpointing: bool, fsdp: bool, transformers_version: str, where: str = "", source: str = ""
) -> str | None:
    """Why a run of `arm` would compile without its decoder layers (None where it would not): a compiled arm sharded
    by FSDP2 (`fsdp`) with gradient checkpointing, with a transformers release older than
    `TRANSFORMERS_CHECKPOINTING_FORWARD` (its pre-releases count as that release; a version that cannot be read is
    not refused). `source` says where the version was read (the installed package, a software set's pin)."""
    from packaging.version import InvalidVersion, Version

    if not (arm.compile and gradient_checkpointing and fsdp):
        return None
    try:
        release = Version(transformers_version).release
    except InvalidVersion:
        return None
    if release >= Version(TRANSFORMERS_CHECKPOINTING_FORWARD).release:
        return None
    return (
        f"arm {arm.name!r} with training_args.gradient_checkpointing and parallelism 'fsdp'{where}: transformers "
        f"{transformers_version}{f' ({source})' if source else ''} checkpoints each decoder layer's __call__, FSDP2's "
        "hooks inside the checkpoint, where torch.compile cannot trace them, so every decoder layer would run "
        f"uncompiled (docs/multi-gpu.md); install transformers {TRANSFORMERS_CHECKPOINTING_FORWARD} or later (or pin "
        f"it in training_args.software_set), or set training_args.gradient_checkpointing false"
    )


def component_notes(arm_names: list[str]) -> list[str]:
    """What the plan says about arms that run but not as their components are meant to (e.g. float8 eager)."""
    notes = []
    for name in dict.fromkeys(arm_names):
        arm = parse_arm(name)
        if arm.float8 and not arm.compile:
            notes.append(
                f"arm {name!r}: torchao's float8 training is meant to run compiled; eager, its casts and scales cost "
                f"more than its float8 matmuls gain (torchao's documentation), so expect it slower than the baseline. "
                f"'{FLOAT8}+{COMPILE}' is the fast form"
            )
    return notes


class ArmError(ValueError):
    """An arm name that cannot be parsed or run; the message names it."""


@dataclass(frozen=True)
class Arm:
    """A parsed arm: which components are on, and for Liger which kernels (`liger_kernels`; empty: Liger's
    defaults for the model type, without its loss kernels when `liger_without_loss`)."""

    name: str
    liger: bool = False
    liger_kernels: tuple[str, ...] = ()
    liger_without_loss: bool = False
    compile: bool = False
    switchback: bool = False
    cce: bool = False
    float8: bool = False

    @property
    def is_baseline(self) -> bool:
        """Nothing switched on (`baseline` and `baseline_repeat`)."""
        return not (self.liger or self.compile or self.switchback or self.cce or self.float8)

    @property
    def components(self) -> tuple[str, ...]:
        """The components switched on, each as `COMPONENTS` names it (`liger:<kernels>` counts as `liger`)."""
        on = {
            LIGER: self.liger and not self.liger_without_loss,
            LIGER_WITHOUT_LOSS: self.liger_without_loss,
            COMPILE: self.compile,
            SWITCHBACK: self.switchback,
            CCE: self.cce,
            FLOAT8: self.float8,
        }
        return tuple(component for component in COMPONENTS if on[component])

    def liger_kernel_names(self, model_type: str) -> tuple[str, ...]:
        """The Liger kernels the arm switches on for `model_type` (none outside a liger arm)."""
        if not self.liger:
            return ()
        if self.liger_kernels:
            return self.liger_kernels
        kernels = default_kernels(model_type)
        return tuple(k for k in kernels if k not in LOSS_KERNELS) if self.liger_without_loss else kernels

    def loss_criterion(self, criterion: str) -> str:
        """The criterion that computes a condition's loss: the `cce` component's in place of `criterion` (which
        validation only lets be `model` or `cce` beside it), else `criterion`."""
        return CCE_CRITERION if self.cce else criterion

    def liger_flags(self, model_type: str) -> dict[str, bool]:
        """Keyword arguments for Liger's patch function of `model_type`: none for Liger's defaults, else every
        switch off but the chosen kernels' (Liger's defaults but its loss kernels for `liger-without-loss`)."""
        if not self.liger or not (self.liger_kernels or self.liger_without_loss):
            return {}
        switches = kernel_switches(model_type)
        missing = [kernel for kernel in self.liger_kernels if kernel not in switches]
        if missing:
            raise ArmError(
                f"arm {self.name!r}: Liger has no {' / '.join(map(repr, missing))} kernel for model type "
                f"{model_type!r}; it has {list(switches)}"
            )
        chosen = self.liger_kernel_names(model_type)
        return {switch: switch in chosen for switch in switches}


@functools.cache
def _liger_table(root: str = "") -> dict[str, dict[str, bool]]:
    """Liger's table of patch functions: per model type, each on/off switch and its default. `root`: the directory
    a software set's liger-kernel is installed in (`sources.software.liger_root`; "": the installed one).

    Read from the source of `liger_kernel.transformers.monkey_patch` (its `MODEL_TYPE_TO_APPLY_LIGER_FN` and the
    functions it names), which importing would take seconds (torch, triton, every model of transformers) on a
    machine that only plans. Should Liger's source stop having that shape, the module is imported instead."""
    try:
        return liger_table_from_source(root)
    except Exception:  # a shape this reader does not know: ask Liger itself
        if root:  # another release than this process imports: only its source can say
            raise
        return liger_table_from_import()


def liger_table_from_source(root: str = "") -> dict[str, dict[str, bool]]:
    """Liger's table read from its source (the installed release's, or the one under `root`), without importing it
    (raises on a shape it does not know)."""
    import ast
    import importlib.machinery
    import importlib.util
    from pathlib import Path

    if root:
        package = importlib.machinery.PathFinder.find_spec("liger_kernel", [root])
        if package is None:
            raise ModuleNotFoundError(f"no liger_kernel under {root}")
    else:
        package = importlib.util.find_spec("liger_kernel")
    # (a release without an __init__.py is a namespace package: no origin, its directory a search location)
    directory = Path(package.origin).parent if package.origin else Path(next(iter(package.submodule_search_locations)))
    tree = ast.parse((directory / "transformers" / "monkey_patch.py").read_text())
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    (table,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(target, "id", "") == "MODEL_TYPE_TO_APPLY_LIGER_FN" for target in node.targets)
    ]
    switches = {}
    for key, value in zip(table.keys, table.values, strict=True):
        arguments = functions[value.id].args
        positional = arguments.args[len(arguments.args) - len(arguments.defaults) :]
        defaults = dict(zip([a.arg for a in positional], arguments.defaults, strict=True))
        defaults.update(
            (a.arg, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d is not None
        )
        switches[key.value] = {
            name: default.value
            for name, default in defaults.items()
            if isinstance(default, ast.Constant) and isinstance(default.value, bool)
        }
    return switches


def liger_table_from_import() -> dict[str, dict[str, bool]]:
    """Liger's table from the imported module (seconds: torch, triton, transformers' models)."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return {
        model_type: {
            name: p.default for name, p in inspect.signature(function).parameters.items() if isinstance(p.default, bool)
        }
        for model_type, function in MODEL_TYPE_TO_APPLY_LIGER_FN.items()
    }


def supported_model_types(root: str = "") -> list[str]:
    """Model types Liger can patch, from Liger's own table (of the release under `root`: see `_liger_table`)."""
    return sorted(_liger_table(root))


@functools.cache
def kernel_switches(model_type: str, root: str = "") -> tuple[str, ...]:
    """The on/off switches of Liger's patch function for `model_type`, read from Liger's own table."""
    return tuple(_liger_table(root)[model_type])


@functools.cache
def default_kernels(model_type: str, root: str = "") -> tuple[str, ...]:
    """The kernels Liger's patch function for `model_type` switches on by default (the `liger` arm's)."""
    return tuple(name for name, on in _liger_table(root)[model_type].items() if on)


@functools.cache
def all_kernels() -> tuple[str, ...]:
    """Every kernel switch of any model type Liger can patch, in first-seen order."""
    seen: dict[str, None] = {}
    for switches in _liger_table().values():
        seen.update(dict.fromkeys(switches))
    return tuple(seen)


def parse_arm(name: str) -> Arm:
    """The `Arm` an arm name stands for; `ArmError` naming the fault for a name that means nothing."""
    if not isinstance(name, str) or not name:
        raise ArmError(f"an arm is a non-empty name, got {name!r}")
    if name in (BASELINE, BASELINE_REPEAT):
        return Arm(name=name)
    parts = name.split("+")
    found: dict[str, tuple[str, ...]] = {}
    for part in parts:
        component, colon, kernel_list = part.partition(":")
        if component in (BASELINE, BASELINE_REPEAT):
            rest = "+".join(other for other in parts if other != part)
            raise ArmError(
                f"arm {name!r}: {component!r} is an arm of its own, not a component to join with '+' (it switches "
                f"nothing on); write {rest or component!r} instead, and {component!r} as an arm beside it"
            )
        if component not in COMPONENTS:
            raise ArmError(
                f"arm {name!r}: unknown component {part!r}{closest(component, [*COMPONENTS, BASELINE])}; an arm is "
                f"{BASELINE!r}, {BASELINE_REPEAT!r}, or {' / '.join(COMPONENTS)} joined by '+' "
                "(e.g. 'compile+liger', 'liger:rope', 'liger:rope,rms_norm', 'liger-without-loss+cce')"
            )
        if component in found:
            raise ArmError(f"arm {name!r} names {component!r} twice")
        if colon and component != LIGER:
            raise ArmError(f"arm {name!r}: only liger takes kernels (liger:<kernel>[,<kernel>...]), got {part!r}")
        kernels = tuple(kernel_list.split(",")) if colon else ()
        unknown = [kernel for kernel in kernels if kernel not in all_kernels()]
        if unknown:
            hint = closest(unknown[0], list(all_kernels()))
            raise ArmError(
                f"arm {name!r}: Liger has no kernel {' / '.join(map(repr, unknown))}{hint}; its kernels: "
                f"{list(all_kernels())}"
            )
        if len(set(kernels)) < len(kernels):
            raise ArmError(f"arm {name!r} names a Liger kernel twice")
        found[component] = kernels
    if LIGER in found and LIGER_WITHOUT_LOSS in found:
        raise ArmError(
            f"arm {name!r}: {LIGER!r} and {LIGER_WITHOUT_LOSS!r} both choose Liger's kernels; name one of them"
        )
    loss_kernels = [kernel for kernel in found.get(LIGER, ()) if kernel in LOSS_KERNELS]
    if CCE in found and loss_kernels:
        raise ArmError(
            f"arm {name!r}: Liger's {loss_kernels[0]} kernel and Cut Cross-Entropy both compute the loss, and one run "
            f"has one loss; compare them as two arms ('liger:{loss_kernels[0]}', 'cce'), or use "
            f"'{LIGER_WITHOUT_LOSS}+cce'"
        )
    return Arm(
        name=name,
        liger=LIGER in found or LIGER_WITHOUT_LOSS in found,
        liger_kernels=found.get(LIGER, ()),
        liger_without_loss=LIGER_WITHOUT_LOSS in found,
        compile=COMPILE in found,
        switchback=SWITCHBACK in found,
        cce=CCE in found,
        float8=FLOAT8 in found,
    )
