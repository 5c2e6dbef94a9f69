"""Shared test helpers: examples, a valid base SpecModel, deep merge (the product's own,
`specfleet.documents.merge`)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from specfleet.documents import merge

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
INVALID_CASES = yaml.safe_load((ROOT / "tests/data/invalid/specmodels.yaml").read_text())


def free_port() -> int:
    """A loopback port nothing listens on (closed again: the caller binds it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def specmodel_doc(**spec: Any) -> dict[str, Any]:
    """A minimal valid SpecModel document, with `spec` merged over it."""
    base = {
        "apiVersion": "specfleet.dev/v1alpha1",
        "kind": "SpecModel",
        "metadata": {"name": "m", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": {"engine": {"name": "vllm"}, "model": {"source": "org/model"}},
    }
    return merge(base, {"spec": spec})


def experiment_doc(**spec: Any) -> dict[str, Any]:
    """A minimal valid SpecExperiment document of SpecModel `m`, with `spec` merged over it."""
    base = {
        "apiVersion": "specfleet.dev/v1alpha1",
        "kind": "SpecExperiment",
        "metadata": {"name": "x", "namespace": "ns", "uid": "uid-x", "generation": 1},
        "spec": {"specModelRef": {"name": "m"}, "minRequestsPerClass": 100, "gpuHourPrice": 4.0},
    }
    return merge(base, {"spec": spec})


@pytest.fixture
def doc() -> dict[str, Any]:
    return specmodel_doc()
