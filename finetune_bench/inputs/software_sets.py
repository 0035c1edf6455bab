"""Software sets as the inputs spell them (`TrainingArgs.software_set`): `""`, the installed packages, or package pins
joined by commas, `liger-kernel==0.8.2` or `liger-kernel==0.8.2,transformers==5.17.0`. What a set may pin, and the
pins' spelling, are checked here; a set is installed and checked against the package index and the installed packages
where sources are prepared (`finetune_bench.sources.software`)."""

import re

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from finetune_bench.inputs.errors import SpecError, refuse_spellings_of_one_value

# The installed packages: what a run imports when its set pins nothing.
INSTALLED = ""
# The packages a set can pin: the project installs them and their code runs on any build of torch.
PINNABLE = (
    "liger-kernel",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "torchao",
    "cut-cross-entropy",
    "datasets",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
)
# The packages that stay the image's, and why.
IMAGE_BOUND = ("torch", "triton", "bitsandbytes")
IMAGE_BOUND_PREFIXES = ("nvidia-", "cuda-")
_IMAGE_BOUND_WHY = (
    "its build is made for the GPU's driver and for torch's CUDA version, so it stays the image's: compare its "
    "releases with an image each (docs/releases.md)"
)
# A pin: a distribution name and an exact version.
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s,=]+)\s*$")


def parse(text: str, key: str = "training_args.software_set") -> dict[str, str]:
    """The set's pins, by canonical package name in name order, each version as PEP 440 normalizes it (`{}` for the
    installed set); every problem of `text` in one SpecError naming `key`."""
    if not isinstance(text, str):
        raise SpecError(f"{key} must be a string of pins such as 'liger-kernel==0.8.2', got {text!r}")
    if not text.strip():
        return {}
    pins: dict[str, str] = {}
    problems = []
    for item in text.split(","):
        match = _PIN.match(item)
        if not match:
            problems.append(
                f"{key} {text!r}: {item.strip()!r} is not a pin; write package==version, e.g. 'liger-kernel==0.8.2' "
                "(pins joined by commas; '' is the installed packages)"
            )
            continue
        name, version = canonicalize_name(match.group(1)), match.group(2)
        if name in IMAGE_BOUND or name.startswith(IMAGE_BOUND_PREFIXES):
            problems.append(f"{key} {text!r}: {name} cannot be pinned in a set: {_IMAGE_BOUND_WHY}")
        elif name not in PINNABLE:
            problems.append(f"{key} {text!r}: {name} is not a package a set can pin; it can pin {', '.join(PINNABLE)}")
        try:
            version = str(Version(version))  # as PEP 440 normalizes it: v0.8.2 and 0.8.2 are one release
        except InvalidVersion:
            problems.append(f"{key} {text!r}: {version!r} is not a version of {name} (PEP 440, e.g. 0.8.2)")
        if name in pins:
            problems.append(f"{key} {text!r}: pins {name} twice")
        pins[name] = version
    if problems:
        raise SpecError(*problems)
    return dict(sorted(pins.items()))


def canonical(text: str) -> str:
    """The set as one spelling (canonical names, name order, no spaces): two spellings of a set are one set."""
    return ",".join(f"{name}=={version}" for name, version in parse(text).items())


def check_syntax(key: str, value: object) -> None:
    """The setting's own rule: a set that parses (whether its releases exist is checked at planning: `check`)."""
    parse(value, key)  # type: ignore[arg-type]


def check_sweep(key: str, values: list) -> None:
    """A sweep whose every value is another set: two spellings of one set would train it twice."""
    refuse_spellings_of_one_value(key, values, canonical, "are the same set")
