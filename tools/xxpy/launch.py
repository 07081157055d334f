"""The environment a rank runs in: tools/env.sh, sourced."""
import os
import subprocess

from . import TOOLS

ENV_SH = os.path.join(TOOLS, "env.sh")


def sourced_env():
    """The environment after `source tools/env.sh`, as every rank sees it."""
    out = subprocess.run(["bash", "-c", 'source "$1" && env -0', "bash", ENV_SH],
                         check=True, capture_output=True).stdout
    return dict(kv.split("=", 1) for kv in out.decode().split("\0") if "=" in kv)
