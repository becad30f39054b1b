"""Pure parts of `make up`: configuration precedence, the env file, and recognising our processes."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skyscan_local import stack as localstack
from skyscan_operator.settings import OperatorSettings


def test_the_environment_overrides_local_defaults_but_not_what_the_stack_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SKYSCAN_TEARDOWN_DELAY_SECONDS", "9")
    monkeypatch.setenv("SKYSCAN_NAMESPACE", "elsewhere")
    monkeypatch.setenv("SKYSCAN_SCANNER_SIM_RECO_SECONDS", "2")  # not a local default: passed on too
    monkeypatch.setenv("SKYSCAN_USER_TOKEN", "from a sourced .skyscan/env")
    env = localstack.merged(
        {"SKYSCAN_TEARDOWN_DELAY_SECONDS": "3", "SKYSCAN_BACKLOG_TICK_SECONDS": "1"},
        {"SKYSCAN_NAMESPACE": "skyscan"},
        {"SKYSCAN_BACKLOG_TICK_SECONDS": "0.3"},
    )
    assert env["SKYSCAN_TEARDOWN_DELAY_SECONDS"] == "9"
    assert env["SKYSCAN_BACKLOG_TICK_SECONDS"] == "0.3"
    assert env["SKYSCAN_NAMESPACE"] == "skyscan"
    assert env["SKYSCAN_SCANNER_SIM_RECO_SECONDS"] == "2"
    assert "SKYSCAN_USER_TOKEN" not in env  # so sourcing the env file does not restart anything


def test_local_settings_are_the_documented_ones() -> None:
    shim = localstack.LOCAL_DEFAULTS["shim"]
    assert shim["SKYSCAN_KNOWN_CLUSTERS"] == '{"osg": 100, "sub-2": 100, "local": 5}'
    assert shim["SKYSCAN_TAGS"] == '["3.4.0", "4.0.0", "4.1.2", "4.2.0", "dev-branch-abc1234"]'
    assert shim["SKYSCAN_MIN_TAG"] == "4.0.0"
    assert localstack.LOCAL_DEFAULTS["operator"]["SKYSCAN_BACKLOG_TICK_SECONDS"] == "1"


def test_every_local_cluster_reaches_the_wms_by_a_real_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local WMS simulator knows the real WMS's clusters only: what a local scan may ask for is
    asked by one of them (`local` and `sub-2` by alias)."""
    for name, value in localstack.LOCAL_DEFAULTS["operator"].items():
        monkeypatch.setenv(name, value)
    operator = OperatorSettings()
    assert set(operator.known_clusters) == {"osg", "sub-2", "local"}
    assert {operator.wms_cluster(name) for name in operator.known_clusters} == {"osg"}
    assert operator.wms_cluster_schedds == {"osg": "grid-submitter.icecube.wisc.edu"}


def test_the_env_file_holds_exactly_the_documented_variables_and_sources_in_a_shell(tmp_path: Path) -> None:
    state = {"ports": {"shim": 8080, "wms": 8081, "operator_metrics": 9090},
             "tokens": {"user": "u$1", "system": "s'2", "reference": "r 3", "viewer": "v 4"},
             "kubeconfig": "/k/config",
             "archive_dsn": "postgresql://u:pw@127.0.0.1:5/skyscan"}  # fmt: skip
    path = localstack.write_env(tmp_path, localstack.env_lines(state, "skyscan"))
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    keys = " ".join(localstack.ENV_KEYS)
    out = subprocess.run(
        ["bash", "-c", f'source {shlex.quote(str(path))}; for k in {keys}; do echo "$k=${{!k}}"; done'],
        capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]},
    ).stdout.splitlines()  # fmt: skip
    assert out == [
        "SKYSCAN_URL=http://127.0.0.1:8080",
        "SKYSCAN_USER_TOKEN=u$1",
        "SKYSCAN_SYSTEM_TOKEN=s'2",
        "SKYSCAN_REFERENCE_TOKEN=r 3",
        "SKYSCAN_VIEWER_TOKEN=v 4",
        "SKYSCAN_WMS_URL=http://127.0.0.1:8081",
        "KUBECONFIG=/k/config",
        "SKYSCAN_NAMESPACE=skyscan",
        "SKYSCAN_ARCHIVE_DSN=postgresql://u:pw@127.0.0.1:5/skyscan",
        "SKYSCAN_OPERATOR_METRICS_URL=http://127.0.0.1:9090/metrics",
    ]
    assert len(path.read_text().splitlines()) == len(localstack.ENV_KEYS)


def test_a_recorded_pid_counts_only_while_it_runs_the_recorded_command() -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    proc = subprocess.Popen(argv)
    try:
        record = {"pid": proc.pid, "argv": argv}
        deadline = time.monotonic() + 10  # until the child has exec'd, /proc shows the parent's argv
        while not localstack.alive(record) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert localstack.alive(record)
        assert not localstack.alive({"pid": proc.pid, "argv": [*argv, "other"]})  # a recycled pid
        localstack.stop_process(record, timeout=5)
        assert proc.poll() is not None and not localstack.alive(record)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_component_restarts_when_the_ca_its_kubeconfig_names_changes(tmp_path: Path) -> None:
    """A renewed control-plane CA: components that read the old one at start could no longer talk to
    the API server, so their configuration counts the kubeconfig and the CA file it names."""
    (tmp_path / "ca.crt").write_text("old CA")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [{name: c, cluster: {certificate-authority: ca.crt}}]")
    files = localstack.kubeconfig_files(str(kubeconfig))
    assert files == (kubeconfig, tmp_path / "ca.crt")

    def config() -> str:
        return localstack.Component("shim", ["shim"], {}, lambda: True, files).config

    before = config()
    assert config() == before
    (tmp_path / "ca.crt").write_text("renewed CA")
    assert config() != before
