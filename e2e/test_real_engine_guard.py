"""The closed loop with the real vLLM in the pods: `specfleet-testbed pods --engine-command` runs
`vllm serve` (CPU build, the pair of hack/tiny_model.py: a 768-wide, 8-layer target whose
layers after the first add nothing, drafted for by its 1-layer prefix) behind each kwok pod's
real gateway, Prometheus scrapes both, and the operator's guard acts on what the engine really
did.

The draft's logits are the target's, so greedy clients get every draft accepted and sampled ones
almost none: the acceptance collapse below is the clients' own doing, not a script. With
`guard.routeClasses` the class whose clients sample is routed to a plain pool running the real
vLLM without speculation, while the other class keeps speculating on the fleet's engine, which
never restarts; a trial on the fleet itself brings the class back once its clients are greedy
again. One SpecModel with one replica for the module; its plain pool, kept warm, starts a second
real engine beside the fleet's (4.2-4.4 GiB). The fleet-wide kill switch's flip and trial are the
simulated fleet's to prove (`test_guard`): on the real engine they cost two more engine starts.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from e2e import real_clients, real_engine
from e2e.cluster.harness import LocalCluster, eventually
from e2e.fleet import Background, simulated_pods
from e2e.real_clients import PROMPTS, SAMPLED, Clients, chat_request
from e2e.real_engine_pod import COMMAND
from e2e.test_cluster import prometheus_query
from e2e.test_guard import actions, apply, decision, operator, status, wait_action  # noqa: F401
from e2e.test_real_engine import GATEWAY_TO_ENGINE
from e2e.traffic import serving

NAME = real_clients.NAME
GUARD = {
    "intervalSeconds": 5,
    "windowSeconds": 30,
    "consecutiveBreaches": 2,
    # a trickle: the engine shares 2 cores with the cluster, and in a trial the canary gets
    # half of it; a class's mean TPOT is a measure from this many streams (one stalled stream
    # among two once read a greedy trial at 0.87x)
    "minRequests": 5,
    "minDraftTokens": 30,
    # the pool is warm (its engine starts with the fleet's), so the class moves at its decision:
    # longer than the test's checks on the two engines before its clients turn greedy again,
    # so the class's trial starts once they are
    "cooldownSeconds": 90,
    # a failed trial is tried again after the same cooldown, not twice it (see the test)
    "maxCooldownSeconds": 90,
    # speculation must beat plain decoding, and a trial by releaseMargin more: the pair's greedy
    # speculation (k=3, Intel OpenMP preloaded as real_engine.engine_env does) measured 2.4-3.5x
    # plain decoding on this CPU (bench/real_engine.py --pair), so a greedy trial clears 1.1
    # with room for a loaded machine
    "minSpeedup": 1.0,
    "releaseMargin": 0.1,
    "probationSeconds": 30,
    "blindAfterSeconds": 60,
    # the class alone is routed off, and a trial sends half of it back to the fleet's engine
    "routeClasses": True,
}
SPECMODEL = real_clients.specmodel(
    real_engine.PAIR_SOURCE,
    guard=GUARD,
    # the last node: a second local cluster (a demo beside the tests) fills the first nodes'
    # loopback pod IPs, which are the same in every local cluster
    pod={"replicas": 1, "nodeSelector": {"kubernetes.io/hostname": "kwok-gpu-3"}},
    # a warm pool: its real engine starts beside the fleet's, not after the decision
    plainPool={"minReplicas": 1},
)
RPS = 1.0
MAX_TOKENS = 16
SCENARIO = real_clients.scenario(RPS)
ENGINE_READY_S = 480.0
"""A pod's real engine to answer /health: about two minutes alone on 2 cores, more on busy ones."""
DETECT_S = 4 * (GUARD["windowSeconds"] + GUARD["consecutiveBreaches"] * GUARD["intervalSeconds"])
"""A breach held for consecutiveBreaches evaluations of a full window, four times over: at the
trickle this machine carries, a window may hold too few sampled requests to judge (measured:
26 s once, over 80 s once)."""
ROLLOUT_S = ENGINE_READY_S + 30
"""The new pod's engine, then the old pod's preStop pause and drain."""


@dataclass
class RealFleet:
    cluster: LocalCluster
    namespace: str
    engine_start_s: float

    @contextmanager
    def clients(self, seconds: float) -> Iterator[tuple[Clients, Background]]:
        """Traffic in the background for `seconds`, stopped at the end of the block."""
        clients, traffic = real_clients.in_background(
            self.cluster, self.namespace, RPS, seconds, MAX_TOKENS
        )
        try:
            yield clients, traffic
        finally:
            clients.stop.set()

    def by_class(self, metric: str) -> dict[str, float]:
        query = f'sum by (class) ({metric}{{namespace="{self.namespace}"}})'
        return {
            r["metric"].get("class", ""): float(r["value"][1])
            for r in prometheus_query(self.cluster, query)
        }

    def serving_pods(self) -> list[dict[str, Any]]:
        return self._pods(
            f"app.kubernetes.io/instance={NAME},app.kubernetes.io/name!=specfleet-engine-plain"
        )

    def plain_pods(self) -> list[dict[str, Any]]:
        """The plain pool's (no gateway, outside the SpecModel's Service)."""
        return self._pods(f"app.kubernetes.io/instance={NAME},specfleet.dev/pool=plain")

    def _pods(self, selector: str) -> list[dict[str, Any]]:
        pods = self.cluster.kubectl_json("get", "pods", "-n", self.namespace, "-l", selector)
        return [p for p in pods["items"] if serving(p)]


@pytest.fixture(scope="module")
def fleet(
    local_cluster: LocalCluster,
    operator: Any,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealFleet]:
    real_engine.build()
    namespace = f"e2e-real-engine-guard-{int(time.time())}"
    local_cluster.kubectl("create", "namespace", namespace)
    eventually(
        lambda: local_cluster.run_kubectl("get", "sa", "default", "-n", namespace).returncode == 0,
        "the namespace's default ServiceAccount",
    )
    apply(local_cluster, namespace, SPECMODEL)
    options = ("--engine-command", COMMAND, "--ready-timeout", str(ENGINE_READY_S))
    work = tmp_path_factory.mktemp("real-fleet")
    started = time.monotonic()
    try:
        with simulated_pods(local_cluster, namespace, SCENARIO, work, options):
            real = RealFleet(local_cluster, namespace, 0.0)
            eventually(real.serving_pods, "a pod Ready with its real engine", ENGINE_READY_S)
            real.engine_start_s = time.monotonic() - started
            print(f"real engine pod Ready after {real.engine_start_s:.0f}s")
            yield real
    finally:
        local_cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_gateway_class_counters_in_prometheus_equal_the_engines_own(fleet: RealFleet) -> None:
    [pod] = fleet.serving_pods()
    client = OpenAI(
        base_url=f"http://{pod['status']['podIP']}:8080/v1", api_key="unused", max_retries=0
    )
    before = {name: fleet.by_class(name) for pair in GATEWAY_TO_ENGINE.items() for name in pair}
    sent = dict.fromkeys(PROMPTS, 0.0)
    for klass in PROMPTS:
        for temperature in (0.0, SAMPLED):
            request = chat_request(klass, temperature, MAX_TOKENS)
            client.chat.completions.create(**request)
            list(client.chat.completions.create(stream=True, **request))
            sent[klass] += 2

    def delta(name: str) -> dict[str, float]:
        now = fleet.by_class(name)
        return {k: v - before[name].get(k, 0.0) for k, v in now.items()}

    eventually(
        lambda: (
            delta("specfleet_requests_total") == sent
            and sum(delta("vllm:request_success_total").values()) == sum(sent.values())
        ),
        f"Prometheus to scrape {sent} requests from the gateway and the engine",
        30,
    )
    for ours, theirs in GATEWAY_TO_ENGINE.items():
        per_class = delta(ours)
        assert set(per_class) == {"code", "chat"}, (ours, per_class)
        assert per_class["code"] > 0 and per_class["chat"] > 0, (ours, per_class)
        assert sum(per_class.values()) == sum(delta(theirs).values()), (ours, per_class, theirs)


def test_sampling_clients_route_their_class_to_a_plain_real_engine_and_a_trial_brings_it_back(
    fleet: RealFleet,
) -> None:
    cluster, namespace = fleet.cluster, fleet.namespace
    with fleet.clients(3600) as (clients, traffic):
        timings = {"first engine start": fleet.engine_start_s}
        wait_evaluated(fleet, "code", lambda rate: rate >= 0.9)
        [speculative] = fleet.serving_pods()

        clients.temperature["code"] = SAMPLED
        flipped = time.monotonic()
        wait_action(cluster, namespace, NAME, "class_speculation_off", DETECT_S)
        timings["detection"] = time.monotonic() - flipped
        off = decision(cluster, namespace, NAME, "class_speculation_off")
        assert off["evidence"]["class"] == "code", off
        assert off["evidence"]["acceptanceRate"] < real_clients.FLOOR, off
        routed_at = time.monotonic()
        eventually(
            lambda: class_states(fleet) == {"code": "plain", "chat": "speculating"},
            "code routed to the plain pool's real engine, Ready",
            ENGINE_READY_S,
        )
        timings["plain pool"] = time.monotonic() - routed_at
        [plain] = fleet.plain_pods()
        assert "--speculative-config" not in engine_args(plain)
        # the engines' own counters: the plain engine serves code and drafts nothing, the
        # fleet's engine still drafts for chat
        fleet_before, plain_before = engine_counts(speculative), engine_counts(plain)
        eventually(
            lambda: engine_counts(plain)["requests"] >= plain_before["requests"] + 3,
            "code's requests answered by the plain engine",
            60,
        )
        eventually(
            lambda: engine_counts(speculative)["drafted"] > fleet_before["drafted"],
            "the fleet's engine drafting for chat",
            60,
        )
        assert engine_counts(plain)["drafted"] == 0
        st = status(cluster, namespace, NAME)
        assert st["killSwitch"]["state"] == "released" and st["speculationActive"] is True
        assert fleet.serving_pods()[0]["metadata"]["uid"] == speculative["metadata"]["uid"]

        clients.temperature["code"] = 0.0
        greedy = time.monotonic()
        wait_action(cluster, namespace, NAME, "class_trial_started", GUARD["cooldownSeconds"])
        back = wait_class_back(fleet, GUARD["maxCooldownSeconds"] + 2 * DETECT_S)
        timings["greedy to back"] = time.monotonic() - greedy
        assert back["evidence"]["acceptanceRate"] >= 0.9, back
        assert "kill_switch_engaged" not in actions(cluster, namespace, NAME)
        assert fleet.serving_pods()[0]["metadata"]["uid"] == speculative["metadata"]["uid"]
        report = traffic.result(stop=True)
        print("seconds:", {k: round(v) for k, v in timings.items()}, "requests:", report.ok)
        assert sum(report.failed.values()) == 0, report.errors[:5]
        assert report.ok["code"] > 0 and report.ok["chat"] > 0


def wait_class_back(fleet: RealFleet, timeout: float) -> dict[str, Any]:
    """Code's speculation back on: its first trial's, or (a trial that started while the clients
    still sampled failed rightly) the next one's."""

    def back() -> dict[str, Any] | None:
        decisions = status(fleet.cluster, fleet.namespace, NAME).get("decisions", [])
        return next((d for d in decisions if d["action"] == "class_speculation_on"), None)

    eventually(back, "code's trial on the fleet's real engine to show it pays", timeout)
    found = back()
    assert found is not None
    return found


def class_states(fleet: RealFleet) -> dict[str, str]:
    found = status(fleet.cluster, fleet.namespace, NAME).get("classSpeculation") or []
    return {c["name"]: c["state"] for c in found}


def engine_counts(pod: dict[str, Any]) -> dict[str, float]:
    """The engine's own requests answered and draft tokens proposed, off its /metrics."""
    url = f"http://{pod['status']['podIP']}:8000/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    counts = {"requests": 0.0, "drafted": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total":
                counts["requests"] += sample.value
            elif sample.name == "vllm:spec_decode_num_draft_tokens_total":
                counts["drafted"] += sample.value
    return counts


def wait_evaluated(fleet: RealFleet, klass: str, healthy: Any) -> None:
    """Until the guard's last evaluation gives `klass` an acceptance rate `healthy` accepts."""

    def rate() -> float | None:
        classes = status(fleet.cluster, fleet.namespace, NAME).get("classes") or []
        value = next((c.get("acceptanceRate") for c in classes if c["name"] == klass), None)
        return value if value is not None and healthy(value) else None

    eventually(rate, f"the guard to see {klass}'s greedy acceptance", DETECT_S)


def engine_args(pod: dict[str, Any]) -> list[str]:
    engine = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")
    args: list[str] = engine.get("args", [])
    return args
