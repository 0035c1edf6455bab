"""Secrets the user's environment holds (a W&B key, a Hugging Face token, any Flyte secret), found by their
names, and how any text or record is cleaned of their values before it is stored, logged or shown."""

import os
import re
from typing import Any

# Names of settings or environment variables that hold credentials.
SECRET_NAME = re.compile(
    r"api_?key|secret|password|passwd|credential|private_?key|access_?key|(^|_)token($|_)|(^|_)auth($|_)",
    re.IGNORECASE,
)
# flytekit hands a task its secrets as environment variables with this prefix.
FLYTE_SECRET_PREFIX = "_FSEC_"
# Short values (a "1", a "true") are not worth redacting and would mangle everything.
MIN_SECRET_LENGTH = 8
REDACTED = "[redacted]"


def secret_values(extra: tuple[str | None, ...] = ()) -> list[str]:
    """The values of the credentials in the environment (and `extra`), longest first."""
    values = {
        value for name, value in os.environ.items() if name.startswith(FLYTE_SECRET_PREFIX) or SECRET_NAME.search(name)
    }
    values.update(v for v in extra if v)
    return sorted((v for v in values if len(v) >= MIN_SECRET_LENGTH), key=len, reverse=True)


def redact(value: Any, secrets: list[str] | None = None) -> Any:
    """`value` with every occurrence of a secret (`secrets`, or those of the environment) replaced, in
    strings, dict keys and values, lists."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {redact(k, secrets): redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, secrets) for v in value]
    return value
