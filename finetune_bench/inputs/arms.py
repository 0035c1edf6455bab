"""Arms: what is switched on in a condition, as one sweepable value (`TrainingArgs.arm`).

An arm is `baseline`, `baseline_repeat`, or components joined by `+`:

- `liger`: Liger's kernels with Liger's defaults for the model type (`apply_liger_kernel_to_<type>()`);
- `liger:<kernel>`: that one Liger kernel alone, every other kernel off (an ablation), e.g.
  `liger:rope`, `liger:rms_norm`, `liger:swiglu`, `liger:fused_linear_cross_entropy`; the kernel
  names are the switches of Liger's own patch functions;
- `compile`: the model compiled with `torch.compile` (after Liger, so Liger's kernels are compiled in);
- `switchback`: the decoder's linear layers replaced by bitsandbytes' SwitchBack int8 linear layers
  (the `switchback` extra, bitsandbytes 0.49.2, the last release with them; a CUDA GPU only);
- `cce`: the loss computed by Apple's Cut Cross-Entropy from the last hidden states and the LM head's weight, the
  logits never in the GPU's memory (the criterion `cce` in place of the model's own loss). Only a backend that
  computes the loss itself runs it (`catalog.Backend.computes_loss_itself`). With Liger (`liger:rope+cce`) the
  Liger part must leave Liger's loss kernels off: they and CCE would both compute the loss.

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
COMPILE = "compile"
SWITCHBACK = "switchback"
CCE = CCE_CRITERION  # the component computes the loss as the criterion of the same name does
COMPONENTS = (LIGER, COMPILE, SWITCHBACK, CCE)
# Liger's loss kernels: they only act when the model's own forward computes the loss.
LOSS_KERNELS = ("cross_entropy", "fused_linear_cross_entropy")


class ArmError(ValueError):
    """An arm name that cannot be parsed or run; the message names it."""


@dataclass(frozen=True)
class Arm:
    """A parsed arm: which components are on, and for Liger which kernel alone (None: Liger's defaults)."""

    name: str
    liger: bool = False
    liger_kernel: str | None = None
    compile: bool = False
    switchback: bool = False
    cce: bool = False

    @property
    def is_baseline(self) -> bool:
        """Nothing switched on (`baseline` and `baseline_repeat`)."""
        return not (self.liger or self.compile or self.switchback or self.cce)

    def loss_criterion(self, criterion: str) -> str:
        """The criterion that computes a condition's loss: the `cce` component's in place of `criterion` (which
        validation only lets be `model` or `cce` beside it), else `criterion`."""
        return CCE_CRITERION if self.cce else criterion

    def liger_flags(self, model_type: str) -> dict[str, bool]:
        """Keyword arguments for Liger's patch function of `model_type`: none for Liger's defaults, else
        every switch off but the chosen kernel's."""
        if not self.liger or self.liger_kernel is None:
            return {}
        switches = kernel_switches(model_type)
        if self.liger_kernel not in switches:
            raise ArmError(
                f"arm {self.name!r}: Liger has no {self.liger_kernel!r} kernel for model type {model_type!r}; "
                f"it has {list(switches)}"
            )
        return {switch: switch == self.liger_kernel for switch in switches}


@functools.cache
def _liger_table() -> dict[str, dict[str, bool]]:
    """Liger's table of patch functions: per model type, each on/off switch and its default.

    Read from the source of `liger_kernel.transformers.monkey_patch` (its `MODEL_TYPE_TO_APPLY_LIGER_FN` and the
    functions it names), which importing would take seconds (torch, triton, every model of transformers) on a
    machine that only plans. Should Liger's source stop having that shape, the module is imported instead."""
    try:
        return liger_table_from_source()
    except Exception:  # a shape this reader does not know: ask Liger itself
        return liger_table_from_import()


def liger_table_from_source() -> dict[str, dict[str, bool]]:
    """Liger's table read from its source, without importing it (raises on a shape it does not know)."""
    import ast
    import importlib.util
    from pathlib import Path

    package = importlib.util.find_spec("liger_kernel")
    tree = ast.parse((Path(package.origin).parent / "transformers" / "monkey_patch.py").read_text())
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


def supported_model_types() -> list[str]:
    """Model types Liger can patch, from Liger's own table."""
    return sorted(_liger_table())


@functools.cache
def kernel_switches(model_type: str) -> tuple[str, ...]:
    """The on/off switches of Liger's patch function for `model_type`, read from Liger's own table."""
    return tuple(_liger_table()[model_type])


@functools.cache
def default_kernels(model_type: str) -> tuple[str, ...]:
    """The kernels Liger's patch function for `model_type` switches on by default (the `liger` arm's)."""
    return tuple(name for name, on in _liger_table()[model_type].items() if on)


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
    found: dict[str, str] = {}
    for part in parts:
        component, _, kernel = part.partition(":")
        if component not in COMPONENTS:
            raise ArmError(
                f"arm {name!r}: unknown component {part!r}{closest(component, [*COMPONENTS, BASELINE])}; an arm is "
                f"{BASELINE!r}, {BASELINE_REPEAT!r}, or {' / '.join(COMPONENTS)} joined by '+' "
                "(e.g. 'compile+liger', 'liger:rope')"
            )
        if component in found:
            raise ArmError(f"arm {name!r} names {component!r} twice")
        if kernel and component != LIGER:
            raise ArmError(f"arm {name!r}: only liger takes a kernel (liger:<kernel>), got {part!r}")
        if component == LIGER and ":" in part and kernel not in all_kernels():
            raise ArmError(
                f"arm {name!r}: Liger has no kernel {kernel!r}{closest(kernel, list(all_kernels()))}; "
                f"its kernels: {list(all_kernels())}"
            )
        found[component] = kernel
    if CCE in found and LIGER in found and found[LIGER] in LOSS_KERNELS:
        raise ArmError(
            f"arm {name!r}: Liger's {found[LIGER]} kernel and Cut Cross-Entropy both compute the loss, and one run "
            f"has one loss; compare them as two arms ('liger:{found[LIGER]}', 'cce')"
        )
    return Arm(
        name=name,
        liger=LIGER in found,
        liger_kernel=found.get(LIGER) or None,
        compile=COMPILE in found,
        switchback=SWITCHBACK in found,
        cce=CCE in found,
    )
