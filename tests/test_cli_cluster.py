"""A command that needs a cluster, without one it can use: one line naming what it needs, exit 2,
never a traceback (specfleet.cluster_access)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kopf
import pytest
from click.testing import CliRunner

from conftest import free_port
from specfleet.cli import main
from specfleet.refusal import EXIT_INVALID

REPORT = ["experiment", "report", "exp", "--out"]
RUN = ["run", "--metrics-port", "0"]
"""The operator, its metrics server off; it fails on discovery, before kopf starts."""


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "not-a-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def outside_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kopf, "configure", lambda **_: None)  # `run` would set up logging
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)  # and its level


@pytest.fixture
def closed_port() -> int:
    return free_port()


@pytest.fixture
def refusing_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """An API server that answers every request with `request.param` (401 or 403)."""
    status = int(request.param)

    class Refuse(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(
                {
                    "kind": "Status",
                    "status": "Failure",
                    "reason": "Forbidden" if status == 403 else "Unauthorized",
                    "message": 'specexperiments.specfleet.dev "exp" is forbidden: User "u" '
                    "cannot get resource",
                    "code": status,
                }
            ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.stderr


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.usefixtures("outside_a_pod")
@pytest.mark.parametrize("command", [REPORT, RUN], ids=["experiment report NAME", "run"])
def test_without_a_kubeconfig_it_says_it_needs_a_cluster_and_a_kubeconfig(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    args = [*command, str(tmp_path / "out")] if command is REPORT else command
    code, stderr = invoke(args)
    line = one_line(stderr)
    assert code == EXIT_INVALID
    assert "needs a Kubernetes cluster: no usable kubeconfig" in line
    assert f"$KUBECONFIG={tmp_path / 'none'}" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("outside_a_pod")
@pytest.mark.parametrize("command", [REPORT, RUN], ids=["experiment report NAME", "run"])
def test_with_nothing_listening_it_names_the_server_it_could_not_reach(
    command: list[str], closed_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = f"https://127.0.0.1:{closed_port}"
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", server)))
    args = [*command, str(tmp_path / "out")] if command is REPORT else command
    code, stderr = invoke(args)
    line = one_line(stderr)
    assert code == EXIT_INVALID
    assert f"needs a Kubernetes cluster: nothing answers at {server} (Connection refused)" in line


@pytest.mark.usefixtures("outside_a_pod")
def test_report_names_the_offline_way(
    closed_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = f"https://127.0.0.1:{closed_port}"
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", server)))
    _, stderr = invoke([*REPORT, str(tmp_path / "out")])
    assert one_line(stderr).startswith("error: specfleet experiment report NAME needs")
    assert one_line(stderr).endswith(
        "; --verdict FILE (a verdict or a saved SpecExperiment) needs none"
    )


@pytest.mark.usefixtures("outside_a_pod")
@pytest.mark.parametrize("refusing_server", [401], indirect=True)
@pytest.mark.parametrize("command", [REPORT, RUN], ids=["experiment report NAME", "run"])
def test_refused_credentials_are_named_as_such(
    command: list[str], refusing_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", refusing_server)))
    args = [*command, str(tmp_path / "out")] if command is REPORT else command
    code, stderr = invoke(args)
    line = one_line(stderr)
    assert code == EXIT_INVALID
    assert f"{refusing_server} refused the kubeconfig's credentials" in line
    assert "401 Unauthorized" in line


@pytest.mark.usefixtures("outside_a_pod")
@pytest.mark.parametrize("refusing_server", [403], indirect=True)
def test_a_forbidden_read_quotes_the_api_server(
    refusing_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kubeconfig", refusing_server)))
    code, stderr = invoke([*REPORT, str(tmp_path / "out")])
    line = one_line(stderr)
    assert code == EXIT_INVALID
    assert "the kubeconfig's user may not do this" in line
    assert 'User "u" cannot get resource' in line
