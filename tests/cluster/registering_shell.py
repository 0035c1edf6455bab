"""What a module defines when a registering shell imports it: Python code run in a fresh process, in the project's
root, with the shell's environment `env` and none of the project's or W&B's variables of this one."""

import json
import os
import subprocess
import sys

from images.images import PROJECT_ROOT


def printed_by_a_registering_shell(code: str, **env: str):
    """The JSON value the last line `code` prints holds, `code` run by a fresh interpreter in a shell with `env`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FINETUNE_BENCH_", "WANDB_"))}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, env={**clean, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
