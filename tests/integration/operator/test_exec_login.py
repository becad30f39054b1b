"""The operator with a kubeconfig whose user logs in only through an exec credential plugin: both
its own client and kopf's watches authenticate with the plugin's answer, and a Scan gets its Job."""

from __future__ import annotations

from pathlib import Path

from skyscan.io import kube, kubeconfig
from tests import helpers
from tests.conftest import Cluster
from tests.integration.operator.conftest import HOLD, OperatorFactory, create_scan, st, wait_scan


async def test_the_operator_logs_in_through_an_exec_plugin(
    cluster: Cluster, api: kube.Kube, namespace: str, operator: OperatorFactory, tmp_path: Path
) -> None:
    admin = await kubeconfig.Credentials(kubeconfig.endpoint(cluster.kubeconfig)).current()
    status = {"token": admin.token, "clientCertificateData": admin.cert, "clientKeyData": admin.key}
    helpers.exec_plugin(tmp_path)
    helpers.plugin_answers(tmp_path, {"status": status, "lifetime": 3600})
    config = helpers.kubeconfig(kubeconfig.endpoint(cluster.kubeconfig), tmp_path, helpers.PLUGIN_USER)
    operator(**HOLD, SKYSCAN_KUBECONFIG=config)
    name = await create_scan(api, namespace)
    scan = await wait_scan(api, namespace, name, lambda s: bool(st(s).get("job")))  # kopf saw it, we acted
    assert scan["status"]["job"]
    assert helpers.plugin_runs(tmp_path)  # the only credential the operator had
