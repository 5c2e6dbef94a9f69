"""`specfleet-testbed ...`: the engine simulator and the stand-in kubelet."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from specfleet_testbed.engine.server import EngineSimulator


@click.group()
def main() -> None:
    """Fakes for running specfleet without GPUs: engines and the kubelet of kwok's pods."""


def _listen(value: str | None, host: str | None, port: int | None, engine: str) -> tuple[str, int]:
    if value is None:
        default_host = "0.0.0.0" if engine == "vllm" else "localhost"
        return host or default_host, port or 8000
    h, sep, p = value.rpartition(":")
    if not sep or not p.isdigit():
        raise click.BadParameter("expected HOST:PORT", param_hint="--listen")
    return h.strip("[]") or "0.0.0.0", int(p)


@main.command(
    "engine",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--engine",
    "engine",
    type=click.Choice(["vllm", "tensorrt-llm"]),
    required=True,
    help="Which engine to impersonate.",
)
@click.option("--listen", help="HOST:PORT (default: the engine args' --host/--port).")
@click.option(
    "--scenario",
    type=click.Path(exists=True, dir_okay=False),
    envvar="SPECFLEET_SIM_SCENARIO",
    help="Scenario YAML (acceptance, output lengths, tool calls, rollout effects).",
)
@click.option(
    "--class-header",
    default="x-specfleet-class",
    show_default=True,
    help="Request header naming the prompt class.",
)
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    envvar="SPECFLEET_SIM_TIME_SCALE",
    help="Wall seconds per simulated second (0.01 runs 100x faster).",
)
@click.option(
    "--seed", type=int, envvar="SPECFLEET_SIM_SEED", help="RNG seed (default: the scenario's)."
)
@click.option(
    "--startup-delay",
    type=click.FloatRange(min=0),
    default=0.0,
    envvar="SPECFLEET_SIM_STARTUP_DELAY",
    help="Wall seconds before /health turns 200 (503 until then).",
)
@click.option(
    "--epoch",
    type=float,
    envvar="SPECFLEET_SIM_EPOCH",
    help="Unix time of scenario t=0 (share it across pods; default: process start).",
)
@click.option(
    "--effects",
    envvar="SPECFLEET_SIM_EFFECTS",
    help="JSON effects that override the scenario's, e.g. '{\"tpot_factor\": 1.5}'.",
)
@click.option(
    "--lenient-args",
    is_flag=True,
    help="Accept engine flags vLLM 0.33.0 does not know (the real engine rejects them).",
)
@click.option(
    "--shutdown-timeout",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="On SIGTERM, seconds in-flight requests get to finish "
    "(a vLLM command line's own --shutdown-timeout wins).",
)
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
def engine_cmd(
    engine: str,
    listen: str | None,
    scenario: str | None,
    class_header: str,
    time_scale: float,
    seed: int | None,
    startup_delay: float,
    epoch: float | None,
    effects: str | None,
    lenient_args: bool,
    shutdown_timeout: float,
    engine_args: tuple[str, ...],
) -> None:
    """An OpenAI-compatible server that behaves like vLLM 0.33.0 or TensorRT-LLM
    1.2.1 on the wire. Everything after `--` is the engine's own command line."""
    # imported here so that other `specfleet` commands do not pay for aiohttp
    from pydantic import ValidationError

    from specfleet.scenario import Effects, ScenarioError, load_scenario
    from specfleet_testbed.engine.args import EngineArgsError, parse_engine_args, warn_ignored
    from specfleet_testbed.engine.server import EngineSimulator, SimOptions

    try:
        config = parse_engine_args(engine, engine_args, lenient=lenient_args)  # type: ignore[arg-type]
    except EngineArgsError as err:
        prog = "vllm serve" if engine == "vllm" else "trtllm-serve"
        click.echo(f"{prog}: error: {err}", err=True)
        sys.exit(2)
    warn_ignored(config)
    try:
        loaded = load_scenario(scenario) if scenario else None
        override = Effects.model_validate(json.loads(effects)) if effects else None
    except ScenarioError as err:
        raise click.UsageError(f"--scenario: {err}") from None
    except (json.JSONDecodeError, ValidationError) as err:
        raise click.UsageError(f"--effects: {err}") from None
    host, port = _listen(listen, config.host, config.port, engine)
    options = SimOptions(
        scenario=loaded,
        class_header=class_header,
        time_scale=time_scale,
        seed=seed,
        startup_delay=startup_delay,
        epoch=epoch,
        effects=override,
        shutdown_timeout=config.shutdown_timeout
        if config.shutdown_timeout is not None
        else shutdown_timeout,
    )
    asyncio.run(_run(EngineSimulator(config, options), host, port))


async def _run(sim_: EngineSimulator, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await sim_.start(host, port)
    spec, names = sim_.config.speculation, ", ".join(sim_.config.served_model_names)
    click.echo(
        f"specfleet-testbed: {sim_.config.engine} serving {names} "
        f"on {sim_.url} (speculation: {f'{spec.method} k={spec.k}' if spec else 'off'})",
        err=True,
    )
    await stop.wait()
    await sim_.drain()
    await sim_.close()


@main.command("pods")
@click.option("--namespace", default=None, help="Only this namespace (default: all).")
@click.option("--scenario", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--time-scale", type=click.FloatRange(min=0, min_open=True), default=1.0)
@click.option("--epoch", type=float, default=None, help="Unix time of scenario t=0.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/tmp/specfleet-sim-pods"),
    show_default=True,
)
@click.option(
    "--engine-command",
    default="",
    help="Run this (split like a shell) instead of the simulator, as `ENGINE_COMMAND --listen "
    "IP:PORT -- ENGINE_ARGS`: a real engine behind each pod's gateway.",
)
@click.option(
    "--engine-command-for",
    "engine_pods",
    default=None,
    metavar="LABEL=VALUE[,VALUE...]",
    help="Only pods with one of these values of the label run --engine-command; the others the "
    "simulator (default: every pod), e.g. specfleet.dev/arm=baseline,speculative.",
)
@click.option(
    "--ready-timeout",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds a pod's engine gets to answer /health before the pod is left not Ready.",
)
@click.option(
    "--guidellm",
    envvar="SPECFLEET_GUIDELLM",
    default=None,
    help="The guidellm command an experiment's load tests run (default: guidellm on PATH).",
)
def pods_cmd(
    namespace: str | None,
    scenario: Path | None,
    time_scale: float,
    epoch: float | None,
    workdir: Path,
    engine_command: str,
    engine_pods: str | None,
    ready_timeout: float,
    guidellm: str | None,
) -> None:
    """Run the simulator (or a given engine) and gateway for every Running kwok pod of a
    SpecModel, at its IP."""
    from kubernetes import client, config  # only this command talks to a cluster

    from specfleet_testbed.kubelet import PodRuntime, SimSettings

    config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    settings = SimSettings(
        workdir,
        scenario,
        time_scale,
        epoch if epoch is not None else time.time(),
        namespace,
        engine_command=tuple(shlex.split(engine_command)),
        engine_pods=_label_values(engine_pods) if engine_pods else None,
        ready_timeout=ready_timeout,
        guidellm=guidellm,
    )
    PodRuntime(client.ApiClient(), settings).run(stop)


def _label_values(text: str) -> tuple[str, frozenset[str]]:
    label, found, values = text.partition("=")
    if not found or not label or not values:
        raise click.BadParameter(
            f"{text!r}: give LABEL=VALUE[,VALUE...]", param_hint="--engine-command-for"
        )
    return label, frozenset(values.split(","))
