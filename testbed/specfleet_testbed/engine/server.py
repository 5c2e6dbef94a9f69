"""The OpenAI-compatible HTTP server (aiohttp) in front of the engine core.

Routes (both engines unless noted): `GET /health` (503 until `startup_delay`
has passed and while draining, then 200 with an empty body), `GET /version`,
`GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`,
`GET /metrics` (vLLM: Prometheus text; TensorRT-LLM: JSON iteration stats,
drained on read), `GET /ping` and `GET /load` (vLLM), `GET /health_generate` and
`GET /prometheus/metrics` (TensorRT-LLM, the latter only with
`return_perf_metrics: true`).

The class of a request is the `x-specfleet-class` header (configurable); a
missing or unknown class means the scenario's first class. Without a scenario
every request gets `DEFAULT_ACCEPTANCE` and `DEFAULT_OUTPUT_TOKENS`.

In-process use (tests):

    async with serve(parse_vllm([...]), SimOptions(time_scale=0.001)) as sim:
        client = AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="x")
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from specfleet.scenario import DEFAULT_DRAFT_MATCH_RATE, Effects, Scenario
from specfleet.scenario.timing import TimingModel
from specfleet_testbed.engine import responses as R
from specfleet_testbed.engine.args import EngineConfig
from specfleet_testbed.engine.core import Clock, EngineCore, Event, GenRequest, Sequence
from specfleet_testbed.engine.metrics import TrtllmIterationStats, TrtllmMetrics, VllmMetrics
from specfleet_testbed.engine.text import (
    PlannedOutput,
    arguments_for_schema,
    count_chat_prompt_tokens,
    count_text_prompt_tokens,
    filler_pieces,
    split_pieces,
)

__all__ = [
    "DEFAULT_ACCEPTANCE",
    "DEFAULT_OUTPUT_TOKENS",
    "EngineSimulator",
    "SimOptions",
    "serve",
]

DEFAULT_ACCEPTANCE = 0.7
DEFAULT_OUTPUT_TOKENS = 128


def _dumps(obj: Any) -> str:
    """Compact JSON, as the engines send it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class SimOptions:
    scenario: Scenario | None = None
    class_header: str = "x-specfleet-class"
    time_scale: float = 1.0
    seed: int | None = None  # None: the scenario's seed (else 0)
    startup_delay: float = 0.0  # wall seconds before /health turns 200
    epoch: float | None = None  # Unix time of scenario t=0 (default: start)
    effects: Effects | None = None  # explicit override of the scenario's effects
    shutdown_timeout: float = 5.0
    timing: TimingModel = field(default_factory=TimingModel)


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param


@dataclass
class _Request:
    chat: bool
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool
    continuous_usage: bool
    n: int
    max_tokens: int
    prompt_tokens: int
    tools: list[dict[str, Any]]
    tool_choice: Any
    response_format: dict[str, Any] | None


class EngineSimulator:
    """One simulated engine process: config + scenario → HTTP app."""

    def __init__(self, config: EngineConfig, options: SimOptions | None = None) -> None:
        self.config = config
        self.options = options or SimOptions()
        scenario = self.options.scenario
        timing = self.options.timing
        if scenario is not None:
            o = scenario.timing
            timing = timing.with_overrides(
                target_forward_ms=o.target_forward_ms,
                per_token_compute=o.per_token_compute,
                prefill_ms_per_token=o.prefill_ms_per_token,
                draft_cost=o.draft_cost,
                step_overhead=o.step_overhead,
            )
        self.timing = timing
        seed = self.options.seed
        self.seed = seed if seed is not None else (scenario.seed if scenario else 0)
        self.clock = Clock(self.options.time_scale, self.options.epoch)
        self.vllm = config.engine == "vllm"
        self.fingerprint = R.vllm_fingerprint(config)
        self.metrics: VllmMetrics | TrtllmMetrics = (
            VllmMetrics(config) if self.vllm else TrtllmMetrics(config)
        )
        self.iteration_stats = TrtllmIterationStats(config)
        self.engine = EngineCore(
            config,
            timing,
            self.clock,
            seed=self.seed,
            observers=[self.metrics, self.iteration_stats],
            tpot_factor=lambda: self.effects().tpot_factor,
            ttft_factor=lambda: self.effects().ttft_factor,
        )
        self._counter = 0
        self._started_at = time.monotonic()
        self.draining = False
        self.inflight = 0
        self._idle = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.host = "127.0.0.1"
        self.port = 0
        self.app = self._make_app()

    # ------------------------------------------------------------------ state

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ready(self) -> bool:
        waited = time.monotonic() - self._started_at
        return waited >= self.options.startup_delay and not self.draining

    def effects(self) -> Effects:
        """Effects in force now: the scenario's (by args or time), then the override."""
        scenario = self.options.scenario
        effects = Effects()
        if scenario is not None:
            effects = scenario.effects_for(
                self.config.args, self.config.config_text, self.clock.now()
            )
        if self.options.effects is not None:
            effects = effects.merged(self.options.effects)
        return effects

    def _request_id(self, prefix: str, stream: bool) -> str:
        """vLLM: `<prefix>-<uuid hex>`; TensorRT-LLM streams use its integer request id."""
        if stream and not self.vllm:
            return f"{prefix}-{self._counter}"
        return R.new_id(prefix)

    def _rng(self) -> random.Random:
        self._counter += 1
        return random.Random(f"{self.seed}:{self._counter}")

    # ------------------------------------------------------------------- app

    def _make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/metrics", self._metrics)
        if self.vllm:
            app.router.add_route("*", "/ping", self._health)
            app.router.add_get("/load", self._load)
        else:
            app.router.add_get("/health_generate", self._health_generate)
            if self.config.return_perf_metrics:
                app.router.add_get("/prometheus/metrics", self._prometheus)
        return app

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        scrape = self.draining and request.path in ("/metrics", "/prometheus/metrics")
        if request.path not in ("/health", "/ping") and not self.ready and not scrape:
            return web.Response(status=503)  # loading, or draining (a last scrape still works)
        if (
            self.vllm
            and self.config.api_keys
            and request.path.startswith("/v1")
            and request.method != "OPTIONS"
        ):
            auth = request.headers.get("Authorization", "")
            if not any(auth == f"Bearer {key}" for key in self.config.api_keys):
                return web.json_response({"error": "Unauthorized"}, status=401, dumps=_dumps)
        response: web.StreamResponse = await handler(request)
        return response

    def _error(self, err: ApiError) -> web.Response:
        body = (R.vllm_error if self.vllm else R.trtllm_error)(
            err.message, err.err_type, err.status, err.param
        )
        return web.json_response(body, status=err.status, dumps=_dumps)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def _load(self, request: web.Request) -> web.Response:
        """vLLM counts requests in flight only with --enable-server-load-tracking."""
        load = self.inflight if self.config.enable_server_load_tracking else 0
        return web.json_response({"server_load": load}, dumps=_dumps)

    async def _version(self, request: web.Request) -> web.Response:
        version = R.VLLM_VERSION if self.vllm else R.TRTLLM_VERSION
        return web.json_response({"version": version}, dumps=_dumps)

    async def _models(self, request: web.Request) -> web.Response:
        body = R.vllm_models(self.config) if self.vllm else R.trtllm_models(self.config)
        return web.json_response(body, dumps=_dumps)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.vllm:
            return web.Response(
                body=self.metrics.exposition(),
                headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
            )
        return web.json_response(self.iteration_stats.drain(), dumps=_dumps)

    async def _prometheus(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.exposition(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def _health_generate(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.Response(status=503)
        gen = GenRequest(
            request_id=R.new_id("health"),
            prompt_tokens=1,
            natural_tokens=[1],
            max_tokens=1,
            alpha=0.0,
        )
        self.engine.submit(gen)
        await gen.queue.get()
        return web.Response(status=200)

    # -------------------------------------------------------------- requests

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ApiError(400, f"JSON decode error: {err}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object")
        return body

    def _parse(self, body: dict[str, Any], *, chat: bool) -> _Request:
        vllm = self.vllm
        model = body.get("model")
        if model is None:
            if not vllm:
                raise ApiError(400, "model: Field required", param="model")
            model = self.config.model_name
        elif vllm and model not in self.config.served_model_names:
            aliases = ", ".join(self.config.served_model_names)
            raise ApiError(
                404,
                f"The model `{model}` does not exist. Valid aliases: {aliases}.",
                "NotFoundError",
                "model",
            )
        response_model = self.config.model_name if vllm else str(model)

        stream = bool(body.get("stream") or False)
        stream_options = body.get("stream_options")
        if stream_options and not stream:
            msg = (
                "Stream options can only be defined when `stream=True`."
                if vllm
                else "stream_options can only be set if stream is true"
            )
            raise ApiError(400, msg, param="stream_options")
        opts = stream_options if isinstance(stream_options, dict) else {}
        if vllm and self.config.enable_force_include_usage:
            include_usage = continuous = True
        else:  # StreamOptions.include_usage defaults to false in vLLM, true in TensorRT-LLM
            sent = stream_options is not None
            include_usage = sent and bool(opts.get("include_usage", not vllm))
            continuous = include_usage and bool(opts.get("continuous_usage_stats", False))

        n = body.get("n") or 1
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ApiError(400, "n must be at least 1", param="n")

        tools: list[dict[str, Any]] = []
        tool_choice: Any = None
        response_format = None
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError(400, "messages: Field required", param="messages")
            tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
            tool_choice = body.get("tool_choice", "auto" if tools else "none")
            if tool_choice not in (None, "none", "auto") and not tools:
                raise ApiError(
                    400, "When using `tool_choice`, `tools` must be set.", param="tool_choice"
                )
            if isinstance(tool_choice, dict):
                name = (tool_choice.get("function") or {}).get("name")
                if name not in {(t.get("function") or {}).get("name") for t in tools}:
                    raise ApiError(
                        400, f"Tool '{name}' has not been passed in `tools`.", param="tool_choice"
                    )
            if vllm:
                self._check_tool_parser(tool_choice)
            rf = body.get("response_format")
            if isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema", "json"):
                response_format = rf
            prompt_tokens = count_chat_prompt_tokens(messages, tools or None)
            requested = body.get("max_completion_tokens")
            if requested is None:
                requested = body.get("max_tokens")
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, str) and prompt:
                prompt_tokens = count_text_prompt_tokens(prompt)
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                prompt_tokens = len(prompt)
            elif isinstance(prompt, list) and len(prompt) > 1:
                raise ApiError(
                    400, "specfleet-testbed: one prompt per request only", param="prompt"
                )
            else:
                raise ApiError(
                    400,
                    "Either prompt or prompt_embeds must be provided and non-empty.",
                    param="prompt",
                )
            requested = body.get("max_tokens", 16 if vllm else None)

        limit_param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        room = self._room(prompt_tokens, requested, limit_param if chat else "max_tokens")
        if vllm:
            _check_greedy(body.get("temperature"), n)
        return _Request(
            chat=chat,
            body=body,
            model=response_model,
            stream=stream,
            include_usage=include_usage,
            continuous_usage=continuous,
            n=n,
            max_tokens=room,
            prompt_tokens=prompt_tokens,
            tools=tools,
            tool_choice=tool_choice,
            response_format=response_format,
        )

    def _check_tool_parser(self, tool_choice: Any) -> None:
        """vLLM parses tool calls only with --tool-call-parser ("auto" also needs
        --enable-auto-tool-choice)."""
        if tool_choice in (None, "none") or self.config.tool_call_parser:
            return
        if tool_choice != "auto":
            what = f'"{tool_choice}"'
            if isinstance(tool_choice, dict):
                what = f'function "{(tool_choice.get("function") or {}).get("name")}"'
            raise ApiError(400, f"tool_choice={what} requires --tool-call-parser to be set")
        if not self.config.enable_auto_tool_choice:
            raise ApiError(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and '
                "--tool-call-parser to be set",
            )

    def _room(self, prompt_tokens: int, requested: Any, param: str) -> int:
        """Output tokens the request may generate; vLLM's length checks, in its order."""
        limit = self.config.max_model_len
        if requested is not None and (
            not isinstance(requested, int) or isinstance(requested, bool) or requested < 1
        ):
            raise ApiError(400, f"{param} must be at least 1, got {requested}.", param=param)
        if self.vllm and requested is not None and requested > limit:
            raise ApiError(
                400,
                f"{param}={requested} cannot be greater than max_model_len={limit}. "
                f"Please request fewer output tokens. (parameter={param}, value={requested})",
                param=param,
            )
        if prompt_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains {prompt_tokens} input tokens, which exceeds this limit even without "
                "any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={prompt_tokens})",
                param="input_tokens",
            )
        room = limit - prompt_tokens
        return max(min(room, requested) if requested is not None else room, 1)

    # ----------------------------------------------------------- planning

    def _plan(self, req: _Request, class_name: str, rng: random.Random) -> PlannedOutput:
        scenario = self.options.scenario
        now = self.clock.now()
        if scenario is not None:
            profile = scenario.classes[class_name]
            natural = scenario.output_tokens(class_name, now)
            rate, validity = profile.tool_call_rate, profile.tool_call_validity
        else:
            natural, rate, validity = DEFAULT_OUTPUT_TOKENS, 0.0, 1.0
        if self.vllm and req.body.get("ignore_eos") is True:
            # vLLM's sampling parameter: no end token, so the answer runs to its limit (`length`)
            natural = req.max_tokens + 1
        override = self.effects().tool_call_validity
        if override is not None:
            validity = override
        valid = rng.random() < validity

        tool = self._pick_tool(req, rate, rng)
        if tool is not None:
            fn = tool.get("function") or {}
            args = arguments_for_schema(fn.get("parameters"), rng, valid=valid)
            return PlannedOutput("tool_call", tuple(split_pieces(args)), valid, str(fn.get("name")))
        if req.response_format is not None:
            rf = req.response_format
            schema = (
                (rf.get("json_schema") or {}).get("schema")
                if rf.get("type") == "json_schema"
                else None
            )
            text = arguments_for_schema(
                schema
                or {
                    "type": "object",
                    "properties": {"answer": {"type": "string"}},
                    "required": ["answer"],
                },
                rng,
                valid=valid,
            )
            return PlannedOutput("json", tuple(split_pieces(text)), valid)
        return PlannedOutput("text", tuple(filler_pieces(natural, rng)))

    def _pick_tool(self, req: _Request, rate: float, rng: random.Random) -> dict[str, Any] | None:
        if not req.tools or req.tool_choice in (None, "none"):
            return None
        choice = req.tool_choice
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            return next(t for t in req.tools if (t.get("function") or {}).get("name") == name)
        if not self.vllm and not self.config.tool_parser:
            return None  # trtllm-serve without --tool_parser never parses tool calls
        if choice == "required" or rng.random() < rate:
            return rng.choice(req.tools)
        return None

    def _api_finish(self, req: _Request, plan: PlannedOutput, engine_reason: str) -> str:
        if (
            engine_reason == "stop"
            and plan.kind == "tool_call"
            and not isinstance(req.tool_choice, dict)
        ):
            return "tool_calls"
        return engine_reason

    # ------------------------------------------------------------ handlers

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            req = self._parse(await self._body(request), chat=chat)
        except ApiError as err:
            return self._error(err)
        rng = self._rng()
        if rng.random() < self.effects().error_rate:
            return self._error(ApiError(500, "Internal server error", "InternalServerError"))
        scenario = self.options.scenario
        header = request.headers.get(self.options.class_header)
        class_name = scenario.resolve_class(header) if scenario else (header or "")
        plans = [self._plan(req, class_name, rng) for _ in range(req.n)]
        if scenario is not None:
            profile = scenario.classes[class_name]
            alpha, decay = scenario.acceptance(class_name, self.clock.now()), profile.position_decay
            match_rate = profile.draft_match_rate
        else:
            alpha, decay, match_rate = DEFAULT_ACCEPTANCE, 1.0, DEFAULT_DRAFT_MATCH_RATE
        alpha = min(1.0, alpha * self.effects().acceptance_factor)
        gen = GenRequest(
            request_id=self._request_id("chatcmpl" if chat else "cmpl", req.stream),
            prompt_tokens=req.prompt_tokens,
            natural_tokens=[len(p.pieces) for p in plans],
            max_tokens=req.max_tokens,
            alpha=alpha,
            decay=decay,
            draft_match_rate=match_rate,
            class_name=class_name,
        )
        self.inflight += 1
        try:
            self.engine.submit(gen)
            if req.stream:
                return await self._stream(request, req, gen, plans)
            return await self._collect(req, gen, plans)
        except asyncio.CancelledError:
            self.engine.abort(gen)
            raise
        finally:
            self.inflight -= 1
            if not self.inflight:
                self._idle.set()

    async def _collect(
        self, req: _Request, gen: GenRequest, plans: list[PlannedOutput]
    ) -> web.Response:
        done = 0
        while done < req.n:
            event = await gen.queue.get()
            if event.finish_reason is not None:
                done += 1
        created = int(time.time())
        choices = [self._choice(req, seq, plans[seq.index]) for seq in gen.sequences]
        completion_tokens = sum(s.generated for s in gen.sequences)
        body: dict[str, Any]
        if self.vllm:
            metrics = R.vllm_per_request_metrics(
                self.config, gen.sequences[0].stats, timing=_timing(gen.sequences[0]), n=req.n
            )
            build = R.vllm_chat_completion if req.chat else R.vllm_completion
            body = build(
                request_id=gen.request_id,
                created=created,
                model=req.model,
                choices=choices,
                prompt_tokens=req.prompt_tokens,
                completion_tokens=completion_tokens,
                metrics=metrics,
                fingerprint=self.fingerprint,
            )
        else:
            build_t = R.trtllm_chat_completion if req.chat else R.trtllm_completion
            body = build_t(
                request_id=gen.request_id,
                created=created,
                model=req.model,
                choices=choices,
                prompt_tokens=req.prompt_tokens,
                completion_tokens=completion_tokens,
            )
        return web.json_response(body, dumps=_dumps)

    def _choice(self, req: _Request, seq: Sequence, plan: PlannedOutput) -> R.ChoiceResult:
        text = plan.text(seq.generated)
        tool_call = None
        if plan.kind == "tool_call" and req.chat:
            tool_call = R.ToolCallResult(R.new_id("chatcmpl-tool"), plan.tool_name or "", text)
        return R.ChoiceResult(
            index=seq.index,
            text=text,
            finish_reason=self._api_finish(req, plan, seq.finish_reason or "abort"),
            tool_call=tool_call,
            tool_call_content="" if _forces_tool(req.tool_choice) else None,
            stats=seq.stats,
            avg_decoded_tokens_per_iter=self._avg_decoded(seq),
        )

    def _avg_decoded(self, seq: Sequence) -> float | None:
        if self.vllm or self.config.speculation is None:
            return None
        return seq.avg_decoded_tokens_per_iter

    async def _stream(
        self, request: web.Request, req: _Request, gen: GenRequest, plans: list[PlannedOutput]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            },
        )
        created = int(time.time())
        writer = _ChunkWriter(self, req, gen, plans, created, resp)
        try:
            await resp.prepare(request)
            done = 0
            first = True
            while done < req.n:
                event = await gen.queue.get()
                if event.finish_reason == "abort":
                    break
                if first:
                    await writer.first()
                    first = False
                await writer.event(event)
                if event.finish_reason is not None:
                    done += 1
            if req.include_usage and done == req.n:
                await writer.usage()
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:  # the client went away: stop generating
            self.engine.abort(gen)
        return resp

    # ------------------------------------------------------------ lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.engine.start()
        self._runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            shutdown_timeout=self.options.shutdown_timeout,
            access_log=None,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.host = host
        self.port = sockets[0].getsockname()[1] if sockets else port

    async def drain(self, grace: float | None = None) -> None:
        """Graceful stop: /health turns 503, in-flight requests get `grace` s to finish."""
        self.draining = True
        grace = self.options.shutdown_timeout if grace is None else grace
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                while self.inflight:
                    self._idle.clear()
                    await self._idle.wait()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.engine.stop()


def _forces_tool(tool_choice: Any) -> bool:
    """A named tool or "required": the answer must be a tool call."""
    return tool_choice == "required" or isinstance(tool_choice, dict)


def _check_greedy(temperature: Any, n: int) -> None:
    """vLLM's SamplingParams: temperature 0 means greedy, and greedy allows one choice."""
    if isinstance(temperature, int | float) and temperature < 1e-5 and n > 1:
        raise ApiError(400, f"n must be 1 when using greedy sampling, got {n}.")


def _timing(seq: Sequence) -> dict[str, float | None]:
    """vLLM's per-request timing fields (build_per_request_timing_metrics)."""
    n = seq.generated
    decode = seq.last_token_t - seq.first_token_t
    inference = seq.last_token_t - seq.scheduled_t
    return {
        "time_to_first_token_ms": (seq.first_token_t - seq.scheduled_t) * 1000.0,
        "generation_time_ms": decode * 1000.0,
        "queue_time_ms": (seq.scheduled_t - seq.queued_t) * 1000.0,
        "mean_itl_ms": decode / (n - 1) * 1000.0 if n > 1 else None,
        "tokens_per_second": n / inference if inference > 0 else None,
    }


class _ChunkWriter:
    """Turns engine events into the engine's SSE chunks."""

    def __init__(
        self,
        sim: EngineSimulator,
        req: _Request,
        gen: GenRequest,
        plans: list[PlannedOutput],
        created: int,
        resp: web.StreamResponse,
    ) -> None:
        self.sim, self.req, self.gen, self.plans = sim, req, gen, plans
        self.created, self.resp = created, resp
        self.vllm = sim.vllm
        self.tool_ids = {
            i: R.new_id("chatcmpl-tool") for i, p in enumerate(plans) if p.kind == "tool_call"
        }

    async def send(self, chunk: dict[str, Any], trailing_space: bool = False) -> None:
        data = "data: " + _dumps(chunk) + (" " if trailing_space else "") + "\n\n"
        await self.resp.write(data.encode())

    def _fingerprint(self, finish: str | None) -> str | None:
        """vLLM stamps a stream's last message: the finish chunk unless a usage chunk follows."""
        return self.sim.fingerprint if finish and not self.req.include_usage else None

    def _usage(self, first: bool = False) -> dict[str, Any] | None:
        if not self.req.continuous_usage:
            return None
        done = 0 if first else sum(s.generated for s in self.gen.sequences)
        if self.vllm:
            return R.vllm_continuous_usage(self.req.prompt_tokens, done)
        return R.trtllm_continuous_usage(self.req.prompt_tokens, done)

    def _chat(self, index: int, delta: dict[str, Any], finish: str | None, *,
              seq: Sequence | None = None, first: bool = False) -> dict[str, Any]:  # fmt: skip
        if self.vllm:
            return R.vllm_chat_chunk(
                request_id=self.gen.request_id, created=self.created, model=self.req.model,
                index=index, delta=delta, finish_reason=finish, first=first,
                usage=self._usage(first), fingerprint=self._fingerprint(finish),
            )  # fmt: skip
        return R.trtllm_chat_chunk(
            request_id=self.gen.request_id, created=self.created,
            model=self.req.model, index=index, delta=delta, finish_reason=finish,
            avg_decoded_tokens_per_iter=self.sim._avg_decoded(seq) if seq else None,
            usage=self._usage(first),
        )  # fmt: skip

    async def first(self) -> None:
        """The role chunk(s) vLLM / TensorRT-LLM send before the first content."""
        if not self.req.chat:
            return
        role = {"role": "assistant", "content": ""} if self.vllm else {"role": "assistant"}
        for i in range(self.req.n):
            await self.send(
                self._chat(i, dict(role), None, first=True), trailing_space=not self.vllm
            )

    async def event(self, event: Event) -> None:
        req, plan = self.req, self.plans[event.index]
        seq = self.gen.sequences[event.index]
        piece = "".join(plan.pieces[event.start : event.start + event.count])
        finish = None
        if event.finish_reason is not None:
            finish = self.sim._api_finish(req, plan, event.finish_reason)
        if not req.chat:
            await self.send(self._completion(event.index, piece, finish, seq))
            return
        if plan.kind == "tool_call":
            deltas = self._tool_deltas(event, piece)
            for j, delta in enumerate(deltas):
                last = j == len(deltas) - 1
                await self.send(self._chat(event.index, delta, finish if last else None, seq=seq))
            return
        delta = {"content": piece} if self.vllm else {"content": piece, "reasoning_content": ""}
        await self.send(self._chat(event.index, delta, finish, seq=seq))

    def _completion(
        self, index: int, text: str, finish: str | None, seq: Sequence
    ) -> dict[str, Any]:
        if self.vllm:
            return R.vllm_completion_chunk(
                request_id=self.gen.request_id, created=self.created, model=self.req.model,
                index=index, text=text, finish_reason=finish, usage=self._usage(),
                fingerprint=self._fingerprint(finish),
            )  # fmt: skip
        return R.trtllm_completion_chunk(
            request_id=self.gen.request_id, created=self.created,
            model=self.req.model, index=index, text=text, finish_reason=finish,
            avg_decoded_tokens_per_iter=self.sim._avg_decoded(seq), usage=self._usage(),
        )  # fmt: skip

    def _tool_deltas(self, event: Event, piece: str) -> list[dict[str, Any]]:
        """vLLM: the first delta names the function and starts its arguments, later ones carry
        arguments; TensorRT-LLM: a name delta (empty arguments), then argument deltas that
        repeat `type`."""
        i = event.index
        deltas: list[dict[str, Any]] = []
        if event.start == 0:
            function: dict[str, Any] = {
                "name": self.plans[i].tool_name,
                "arguments": piece if self.vllm else "",
            }
            call = {"id": self.tool_ids[i], "type": "function", "index": 0, "function": function}
            deltas.append({"tool_calls": [call]})
            if self.vllm:
                return deltas
        args: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
        if not self.vllm:
            args = {"type": "function", **args}
        deltas.append({"tool_calls": [args]})
        return deltas

    async def usage(self) -> None:
        req, gen = self.req, self.gen
        completion = sum(s.generated for s in gen.sequences)
        object_type = "chat.completion.chunk" if req.chat else "text_completion"
        if self.vllm:
            seq = gen.sequences[0]
            metrics = R.vllm_per_request_metrics(
                self.sim.config, seq.stats, timing=_timing(seq), n=req.n
            )
            chunk = R.vllm_usage_chunk(
                request_id=gen.request_id, created=self.created, model=req.model,
                prompt_tokens=req.prompt_tokens, completion_tokens=completion,
                metrics=metrics, fingerprint=self.sim.fingerprint, object_type=object_type,
            )  # fmt: skip
        else:
            chunk = R.trtllm_usage_chunk(
                request_id=gen.request_id, created=self.created, model=req.model,
                prompt_tokens=req.prompt_tokens, completion_tokens=completion,
                object_type=object_type,
            )  # fmt: skip
        await self.send(chunk)


@contextlib.asynccontextmanager
async def serve(
    config: EngineConfig, options: SimOptions | None = None, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[EngineSimulator]:
    """Run a simulator in-process on `host:port` (port 0: any free port)."""
    sim = EngineSimulator(config, options)
    await sim.start(host, port)
    try:
        yield sim
    finally:
        await sim.close()
