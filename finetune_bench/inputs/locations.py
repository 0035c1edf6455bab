"""Where outputs go: a local directory that takes files, or a URL of a filesystem fsspec knows; checked before any
training by every workflow."""

import tempfile

from finetune_bench.inputs.catalog import FILE_URL, check_path_length, local_path
from finetune_bench.inputs.errors import SpecError


def check_writable_location(location: str, key: str) -> None:
    """A local directory that exists and takes files, or one that can be created (its nearest existing
    ancestor is a directory that takes files); a URL (`s3://…`) of a filesystem fsspec knows, left to it. Checked
    before any training, so that nothing is measured into a place that cannot keep it."""
    if "://" in location and not location.startswith(FILE_URL):
        _check_known_protocol(location, key)
        return
    check_path_length(key, location)
    path = local_path(location)
    try:
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise SpecError(f"{key}: {str(existing)!r} is not a directory (got {location!r})")
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise SpecError(f"{key}: cannot write in {location!r} ({exc.strerror or exc})") from None


def _check_known_protocol(url: str, key: str) -> None:
    """A URL whose protocol fsspec knows (whether its package is installed is up to the machine that writes)."""
    import fsspec

    protocol = url.split("://", 1)[0]
    if protocol not in fsspec.available_protocols():
        raise SpecError(
            f"{key}: {url!r} is a URL of an unknown protocol {protocol!r}; use a local directory or an fsspec URL "
            "(s3://, gs://, abfs://, ...)"
        )
