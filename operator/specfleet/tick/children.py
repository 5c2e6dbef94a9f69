"""Which children to apply and which to prune, from desired manifests and the watched ones.

Each applied child carries the hash of its desired manifest; a child whose hash matches is left
alone, so a reconcile of an unchanged SpecModel makes no request at all.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specfleet.render import Manifest

APPLIED_HASH = "specfleet.dev/applied-hash"
Body = dict[str, Any]
ChildKey = tuple[str, str]
"""(kind, name) of a child in the SpecModel's namespace."""
SUMMARY_METADATA = ("name", "namespace", "uid", "generation", "labels", "annotations")


@dataclass(frozen=True)
class Changes:
    apply: list[Manifest]
    prune: list[Body]


def key(body: Body) -> ChildKey:
    return body["kind"], body["metadata"]["name"]


def with_applied_hash(manifest: Manifest) -> Manifest:
    serialized = json.dumps(manifest, sort_keys=True)
    digest = hashlib.sha256(serialized.encode()).hexdigest()[:16]
    out: Manifest = json.loads(serialized)  # a copy, several times cheaper than deepcopy
    out["metadata"].setdefault("annotations", {})[APPLIED_HASH] = digest
    return out


def changes(
    desired: list[Manifest], live: dict[ChildKey, Body], recent: dict[ChildKey, str] | None = None
) -> Changes:
    """`desired` carry their applied hash; `live` are this SpecModel's watched children;
    `recent` are hashes this process applied moments ago, which the watch may not show yet."""
    wanted = {key(m): m for m in desired}
    recent = recent or {}
    apply = [
        m
        for k, m in wanted.items()
        if applied_hash(m) not in (applied_hash(live.get(k)), recent.get(k))
    ]
    prune = [body for k, body in live.items() if k not in wanted]
    return Changes(apply=apply, prune=prune)


def applied_hash(body: Body | None) -> str | None:
    if body is None:
        return None
    annotations = body.get("metadata", {}).get("annotations") or {}
    value = annotations.get(APPLIED_HASH)
    return str(value) if value is not None else None


def summary(body: Mapping[str, Any]) -> Body:
    """What reconcile reads of a child or pod: identity, labels and annotations (the applied
    hash), status, and a Deployment's replicas and template labels. Whole objects, held for
    every child of every SpecModel, made the operator's memory grow with pod-spec size."""
    metadata, spec = body.get("metadata", {}), body.get("spec") or {}
    kept_spec = {k: spec[k] for k in ("replicas",) if k in spec}
    if "template" in spec:
        kept_spec["template"] = {"metadata": spec["template"].get("metadata", {})}
    return copy.deepcopy(
        {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": {k: metadata[k] for k in SUMMARY_METADATA if k in metadata},
            "spec": kept_spec,
            "status": body.get("status", {}),
        }
    )
