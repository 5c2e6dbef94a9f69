"""A kwok pod's engine as the real vLLM: `specfleet-testbed pods --engine-command` runs this
with the simulator's interface, `--listen IP:PORT -- ENGINE_ARGS` (the pod's own args), and it
becomes `vllm serve` with those args mapped to the local tiny model (`real_engine.local_args`)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from e2e import real_engine

COMMAND = shlex.join(
    ["env", f"PYTHONPATH={real_engine.REPO}", sys.executable, "-m", "e2e.real_engine_pod"]
)
"""The value of `specfleet-testbed pods --engine-command`."""


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True, help="IP:PORT")
    parser.add_argument("engine_args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    host, port = options.listen.rsplit(":", 1)
    rendered = options.engine_args[1:] if options.engine_args[:1] == ["--"] else options.engine_args
    build = real_engine.build()
    args = real_engine.local_args(rendered, build, host, int(port))
    command = [str(build.vllm), "serve", *args]
    print(shlex.join(command), flush=True)
    os.execve(command[0], command, real_engine.engine_env(build))


if __name__ == "__main__":
    main(sys.argv[1:])
