"""A kubeconfig whose user logs in with a real exec credential plugin, against the real API server:
the plugin answers a service account's token (TokenRequest API); requests go through, the plugin runs
once while its credential is valid, again once it has expired and once on a 401; the operator's kopf
login uses the same."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import kopf
import pytest

from skyscan.io import kube, kubeconfig
from skyscan.io.kube_errors import KubeError
from skyscan_operator import handlers
from skyscan_operator.controller import Controller
from skyscan_operator.settings import OperatorSettings
from tests import helpers
from tests.conftest import Cluster

REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}


async def whoami(client: kube.Kube) -> str:
    """The user name the API server sees (any authenticated user may ask)."""
    review = await client.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=REVIEW)
    return str(review["status"]["userInfo"]["username"])


@pytest.fixture
async def plugged(cluster: Cluster, api: kube.Kube, namespace: str, tmp_path: Path) -> AsyncIterator[str]:
    """A kubeconfig in tmp_path whose user logs in with the plugin beside it (its command relative to
    the kubeconfig); yields a token of the namespace's default service account for it to answer."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    tokens = kube.core_path("serviceaccounts", namespace, "default", "token")
    answer = await api.request("POST", tokens, body=request)
    helpers.exec_plugin(tmp_path)
    helpers.kubeconfig(kubeconfig.endpoint(cluster.kubeconfig), tmp_path, helpers.PLUGIN_USER)
    yield str(answer["status"]["token"])


async def test_token_file_relative_to_the_kubeconfig(
    cluster: Cluster, plugged: str, namespace: str, tmp_path: Path
) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "token").write_text(plugged + "\n")
    config = helpers.kubeconfig(
        kubeconfig.endpoint(cluster.kubeconfig), tmp_path, {"tokenFile": "secrets/token"}
    )
    async with await kube.connect(config) as client:
        assert await whoami(client) == f"system:serviceaccount:{namespace}:default"


async def test_plugin_runs_once_while_valid_and_again_once_expired(
    plugged: str, namespace: str, tmp_path: Path
) -> None:
    account = f"system:serviceaccount:{namespace}:default"
    async with await kube.connect(str(tmp_path / "kubeconfig")) as client:
        helpers.plugin_answers(tmp_path, {"status": {"token": plugged}, "lifetime": 3600})
        assert set(await asyncio.gather(*(whoami(client) for _ in range(5)))) == {account}
        assert await whoami(client) == account
        assert len(helpers.plugin_runs(tmp_path)) == 1  # one run, however many requests waited for it
        helpers.plugin_answers(tmp_path, {"status": {"token": plugged}, "lifetime": -60})
    async with await kube.connect(str(tmp_path / "kubeconfig")) as client:
        assert await whoami(client) == account
        assert await whoami(client) == account
        assert len(helpers.plugin_runs(tmp_path)) == 3  # each credential expired: a run per request


async def test_a_401_runs_the_plugin_again_once(plugged: str, namespace: str, tmp_path: Path) -> None:
    async with await kube.connect(str(tmp_path / "kubeconfig")) as client:
        helpers.plugin_answers(tmp_path, {"status": {"token": "revoked"}, "lifetime": 3600})
        with pytest.raises(KubeError) as caught:
            await whoami(client)
        assert caught.value.status == 401
        assert len(helpers.plugin_runs(tmp_path)) == 2  # ran, refused, ran again, refused: given up
        helpers.plugin_answers(tmp_path, {"status": {"token": plugged}, "lifetime": 3600})
        assert await whoami(client) == f"system:serviceaccount:{namespace}:default"
        assert len(helpers.plugin_runs(tmp_path)) == 3


async def test_a_failing_plugin_is_a_clear_error(plugged: str, tmp_path: Path) -> None:
    helpers.plugin_answers(tmp_path, {"fail": "error: You must be logged in to the server (token expired)"})
    async with await kube.connect(str(tmp_path / "kubeconfig")) as client:
        said = r"user 'robot': .*plugin.py failed \(exit 3\): error: You must be logged in"
        with pytest.raises(kubeconfig.PluginError, match=said) as e:
            await whoami(client)
    # As the API server not answering: the shim's 503 (api_shim.errors), the operator's retries.
    assert isinstance(e.value, aiohttp.ClientError) and isinstance(e.value, OSError)


async def test_the_operators_kopf_login_runs_the_plugin(plugged: str, tmp_path: Path) -> None:
    helpers.plugin_answers(tmp_path, {"status": {"token": plugged}, "lifetime": 600})
    controller = Controller(OperatorSettings(kubeconfig=str(tmp_path / "kubeconfig")))
    info = await handlers.login(memo=kopf.Memo(controller=controller))
    assert info.token == plugged and info.expiration is not None and info.ca_data
    assert len(helpers.plugin_runs(tmp_path)) == 1
