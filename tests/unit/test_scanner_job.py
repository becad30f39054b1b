"""Pure builders: the scanner args, the Job, the Secret and the WMS workflow request."""

from __future__ import annotations

from typing import Any

import pytest

from api_shim.settings import ShimSettings
from skyscan import model, names, scanner_args
from skyscan.scanner_args import scanner_server_args, scanner_server_argv, scanner_server_options
from skyscan_local.scanner_pod import kubelet_expand
from skyscan_local.wms_rules import SimError, validate_workflow_request
from skyscan_operator import scanner_job
from skyscan_operator.scanner_job import kube_literal
from skyscan_operator.settings import OperatorSettings
from tests.unit.test_crd import minimal_spec

S = OperatorSettings(rest_address="http://shim:8080", wms_address="http://wms:8081")


def spec(**changes: object) -> model.ScanSpec:
    return model.ScanSpec.model_validate(minimal_spec(**changes))


def test_scanner_server_args_are_the_reference_string() -> None:
    got = scanner_server_args(spec(recoAlgo="anything", nsides={"1": 2, "3": 4}))
    assert got == (
        "python -m skymap_scanner.server  --reco-algo anything --cache-dir /common-space  "
        "--client-startup-json /common-space/startup.json  --nsides 1:2 3:4  --real-event  "
        "--predictive-scanning-threshold 1.0 "
    )
    assert "--simulated-event" in scanner_server_args(spec(realOrSimulatedEvent="sim"))


def test_skyscans_own_scanner_env_wins_over_the_users() -> None:
    # A Scan made with kubectl skips the REST validation; its spec is read as stored.
    stored = minimal_spec(scannerServerEnvFromUser={
        "SKYSCAN_SKYDRIVER_ADDRESS": "http://127.0.0.1:9999", "SKYSCAN_SKYDRIVER_AUTH": "mine",
        "PYTHONSTARTUP": "/tmp/x.py", "SKYSCAN_PROGRESS_INTERVAL_SEC": 30, "HTTPS_PROXY": "http://evil:3128",
    })  # fmt: skip
    with pytest.raises(ValueError, match="cannot set 'SKYSCAN_SKYDRIVER_ADDRESS'"):
        model.ScanSpec.model_validate(stored)  # refused on the way in
    as_stored = model.ScanSpec.model_validate(stored, context=model.STORED)
    job = scanner_job.build_job("abc", "uid-1", "ns", as_stored, S)
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    by_name = {e["name"]: e for e in env}
    assert len(by_name) == len(env)  # one entry each
    assert by_name["SKYSCAN_SKYDRIVER_ADDRESS"]["value"] == "http://shim:8080"
    assert by_name["SKYSCAN_SKYDRIVER_AUTH"].get("value") != "mine"
    assert "PYTHONSTARTUP" not in by_name and "HTTPS_PROXY" not in by_name  # the allow-list holds here too
    assert by_name["SKYSCAN_PROGRESS_INTERVAL_SEC"]["value"] == "30"  # the scanner's tuning stays the user's


def test_job_has_the_reference_shape() -> None:
    job = scanner_job.build_job("abc", "uid-1", "ns", spec(scannerServerMemoryBytes=2_000_000_000), S)
    assert job["metadata"]["name"] == "skyscan-abc"
    assert job["metadata"]["labels"]["skyscan.io/scan-id"] == "abc"
    assert job["metadata"]["annotations"] == {"argocd.argoproj.io/sync-options": "Prune=false"}
    assert job["metadata"]["ownerReferences"] == [names.owner_reference("abc", "uid-1")]
    assert job["metadata"]["ownerReferences"][0]["controller"] is True
    js = job["spec"]
    assert (js["backoffLimit"], js["activeDeadlineSeconds"], js["ttlSecondsAfterFinished"]) == (
        0,
        172800,
        600,
    )
    pod = js["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    # Its own account with no bindings, no API token mounted.
    assert pod["serviceAccountName"] == "skyscan-scanner" and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["image"] == "icecube/skymap_scanner:4.1.2"
    assert container["resources"] == {
        "limits": {"memory": "2000000000", "cpu": "1.0"},
        "requests": {"memory": "2000000000", "cpu": "0.1", "ephemeral-storage": "8G"},
    }
    assert {"name": "ewms", "secret": {"secretName": "skyscan-abc-ewms"}} in pod["volumes"]


def test_every_container_of_the_scanner_pod_is_restricted_unless_the_deployment_says_otherwise() -> None:
    pod = scanner_job.build_job("abc", "uid-1", "ns", spec(), S)["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    for container in (*pod["containers"], *pod["initContainers"]):
        context = container["securityContext"]
        assert context["runAsNonRoot"] and context["readOnlyRootFilesystem"], container["name"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
        assert {"limits", "requests"} <= container["resources"].keys(), container["name"]
    (scanner,) = pod["containers"]
    assert {"name": "tmp", "mountPath": "/tmp"} in scanner["volumeMounts"]  # its only writable places
    assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]
    # An image that needs root or a writable root: as it says, the sidecar still restricted.
    loose = scanner_job.build_job(
        "abc", "uid-1", "ns", spec(), S.model_copy(update={"scanner_restricted": False})
    )
    pod = loose["spec"]["template"]["spec"]
    assert "securityContext" not in pod["containers"][0] and pod["initContainers"][0]["securityContext"]
    assert all(v["name"] != "tmp" for v in pod["volumes"])


def test_user_env_comes_first_as_strings() -> None:
    env_from_user = {"SKYSCAN_LOG": True, "SKYSCAN_LOG_THIRD_PARTY": None, "SKYSCAN_RESULT_INTERVAL_SEC": 3}
    job = scanner_job.build_job("abc", "u", "ns", spec(scannerServerEnvFromUser=env_from_user), S)
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names[:4] == [*env_from_user, "SKYSCAN_EWMS_JSON"]
    values = {e["name"]: e.get("value") for e in env}
    assert [values[k] for k in env_from_user] == ["True", "None", "3"]


def test_the_scanner_env_is_an_allow_list() -> None:
    """Proxies, CA bundles, PATH and interpreter hooks would redirect the scanner's credential or what
    it runs: only the scanner's own tuning variables pass, and names a deployment adds."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "https_proxy", "NO_PROXY", "REQUESTS_CA_BUNDLE",
                 "SSL_CERT_FILE", "CURL_CA_BUNDLE", "PATH", "HOME", "BASH_ENV", "ENV", "GCONV_PATH",
                 "LD_PRELOAD", "PYTHONPATH", "PYTHONSTARTUP"):  # fmt: skip
        assert not model.scanner_env_allowed(name), name
    for name in ("SKYSCAN_SKYDRIVER_AUTH", "SKYSCAN_EWMS_JSON", "SKYSCAN_MQ_CLIENT_LOG", "skyscan_log"):
        assert not model.scanner_env_allowed(name), name


def test_the_scanners_own_tuning_variables_pass_and_no_other_of_its_names() -> None:
    """skymap_scanner.server's ServerEnvConfig: log levels, report intervals, runtime predictions and the
    kill switch's poll pass. Its addresses, credentials and directories do not, nor an older scanner's
    broker (SKYSCAN_BROKER_ADDRESS would send its message queue elsewhere): a pattern, not SKYSCAN_*."""
    for name in ("SKYSCAN_LOG", "SKYSCAN_LOG_THIRD_PARTY", "SKYSCAN_PROGRESS_INTERVAL_SEC",
                 "SKYSCAN_PROGRESS_RUNTIME_PREDICTION_WINDOW_RATIO",
                 "SKYSCAN_PROGRESS_RUNTIME_PREDICTION_WINDOW_MIN", "SKYSCAN_RESULT_INTERVAL_SEC",
                 "SKYSCAN_KILL_SWITCH_CHECK_INTERVAL"):  # fmt: skip
        assert model.scanner_env_allowed(name), name
    for name in ("SKYSCAN_BROKER_ADDRESS", "SKYSCAN_BROKER_AUTH", "SKYSCAN_BROKER_CLIENT",
                 "SKYSCAN_CACHE_DIR", "SKYSCAN_OUTPUT_DIR", "SKYSCAN_DEBUG_DIR",
                 "SKYSCAN_MQ_TIMEOUT_FROM_CLIENTS", "SKYSCAN_N", "SKYSCAN_LOGX", "SKYSCAN_PROGRESS_",
                 "SKYSCAN_"):  # fmt: skip
        assert not model.scanner_env_allowed(name), name


def test_a_deployment_adds_names_and_prefixes_but_never_a_reserved_name() -> None:
    assert not model.scanner_env_allowed("OMP_NUM_THREADS")
    assert model.scanner_env_allowed("OMP_NUM_THREADS", {"OMP_NUM_THREADS"})
    assert model.scanner_env_allowed("OMP_NUM_THREADS", {"OMP_*"})
    assert not model.scanner_env_allowed("OMPX", {"OMP_*"}) and not model.scanner_env_allowed("OMP", {"OMP_"})
    assert not model.scanner_env_allowed("LD_PRELOAD", {"LD_PRELOAD"})  # reserved whatever a deployment says
    assert not model.scanner_env_allowed("SKYSCAN_SKYDRIVER_AUTH", {"SKYSCAN_*", "*"})
    assert model.scanner_env_allowed("SKYSCAN_BROKER_ADDRESS", {"SKYSCAN_*"})  # the deployment's choice
    # Both components read the list, each entry a name or a prefix ending in `*`.
    for entries in (["A-B"], ["OMP_**"], ["*X"], [""]):
        with pytest.raises(ValueError):
            OperatorSettings(rest_address="http://shim:8080", scanner_env_allowed=entries)
        with pytest.raises(ValueError):
            ShimSettings(scanner_env_allowed=entries)
    assert ShimSettings(scanner_env_allowed=["OMP_*", "X"]).scanner_env_allowed == ["OMP_*", "X"]


def test_the_operator_holds_the_allow_list_for_a_scan_made_with_kubectl() -> None:
    stored = model.ScanSpec.model_validate(
        minimal_spec(scannerServerEnvFromUser={"OMP_NUM_THREADS": 4, "HTTP_PROXY": "http://evil"})
    )  # no reserved name: the API server and the operator's model take it; the allow-list is settings'
    allowing = S.model_copy(update={"scanner_env_allowed": ["OMP_*"]})
    for settings, expected in ((S, set()), (allowing, {"OMP_NUM_THREADS"})):
        env = scanner_job.build_job("abc", "u", "ns", stored, settings)["spec"]["template"]["spec"][
            "containers"
        ][0]
        assert {e["name"] for e in env["env"]} & {"OMP_NUM_THREADS", "HTTP_PROXY"} == expected
    assert scanner_job.user_env(stored, S)[1] == ["OMP_NUM_THREADS", "HTTP_PROXY"]
    assert scanner_job.user_env(stored, allowing)[1] == ["HTTP_PROXY"]


def test_env_values_an_exec_cannot_carry_are_refused() -> None:
    with pytest.raises(ValueError, match="pattern"):
        spec(scannerServerEnvFromUser={"SKYSCAN_LOG": "INFO\x00--x"})
    with pytest.raises(ValueError, match="4096"):
        spec(scannerServerEnvFromUser={"SKYSCAN_LOG": "x" * 4097})
    assert spec(scannerServerEnvFromUser={"SKYSCAN_LOG": "x" * 4096})


def test_the_manifests_string_and_the_jobs_args_are_one_list() -> None:
    """One function groups the arguments; the Job runs them as a list (one element per value) and the
    manifest joins the same groups in the reference's spacing."""
    s = spec(recoAlgo="millipede_wilks", nsides={"512": 24, "8": 0, "64": 12}, realOrSimulatedEvent="sim")
    argv = scanner_server_argv(s)
    assert argv == [a for option in scanner_server_options(s) for a in option]
    assert argv == scanner_server_args(s).split()
    assert argv[argv.index("--reco-algo") + 1] == "millipede_wilks"
    assert argv[argv.index("--nsides") + 1 : argv.index("--simulated-event")] == ["8:0", "64:12", "512:24"]
    job = scanner_job.build_job("abc", "u", "ns", s, S)
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == argv


@pytest.mark.parametrize(
    "changes",
    [
        {"recoAlgo": "millipede_wilks --cache-dir /etc --client-startup-json /tmp/pwn"},
        {"recoAlgo": "$(SKYSCAN_SKYDRIVER_AUTH)"},
        {"recoAlgo": "-x"},
        {"recoAlgo": "a" * 65},
        {"recoAlgo": ""},
        {"nsides": {"8 --x": 0}},
        {"nsides": {"": 0}},
        {"nsides": {"abc": 0}},
        {"nsides": {"08": 0}},
        {"nsides": {"+8": 0}},
        {"nsides": {"-8": 0}},
        {"nsides": {"0": 0}},
        {"nsides": {"8.0": 0}},
        {"nsides": {"9" * 1000: 0}},
        {"nsides": {"8193": 0}},
        {"nsides": {str(n): 0 for n in range(1, 18)}},
        {"nsides": {"8": -1}},
        {"nsides": {"8": 12 * 8192**2 + 1}},
    ],
)
def test_scanner_arguments_have_a_grammar(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        spec(**changes)


def test_scanner_arguments_within_the_grammar_are_taken() -> None:
    s = spec(recoAlgo="splinempe_pointed", nsides={"1": 0, "8": 0, "64": 12, "512": 24, "8192": 12 * 8192**2})
    assert scanner_server_argv(s)[4] == "splinempe_pointed"
    assert len(spec(nsides={str(2**i): i for i in range(14)}).nsides) == 14


def as_the_process_sees_it(
    container: dict[str, Any], secrets: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """A container's args and env after the kubelet's expansion (`secrets`: the secretKeyRef values)."""
    env: dict[str, str] = {}
    for e in container["env"]:
        env[e["name"]] = secrets[e["name"]] if "valueFrom" in e else kubelet_expand(e["value"], env)
    return [kubelet_expand(a, env) for a in container["args"]], env


def test_a_dollar_reaches_the_scanner_literally() -> None:
    """The kubelet expands $(VAR) in a container's command, args and env values: whatever a user (or a
    deployment) wrote, the scanner gets those characters, never the variable's value; its credential is
    one. Unescaped, the same text would become the token (the last assertion)."""
    hostile = "$(SKYSCAN_SKYDRIVER_AUTH)"
    assert kube_literal(hostile) == "$$(SKYSCAN_SKYDRIVER_AUTH)" and kube_literal("a$$b") == "a$$$$b"
    user = {"SKYSCAN_LOG": hostile, "SKYSCAN_RESULT_INTERVAL_SEC": "a$$b$", "SKYSCAN_LOG_THIRD_PARTY": "$(X"}
    s = spec(scannerServerEnvFromUser=user)
    s = s.model_copy(update={"reco_algo": hostile})  # past the grammar, which refuses it: escaped anyway
    deployment = {"SKYSCAN_KILL_SWITCH_CHECK_INTERVAL": "$(SKYSCAN_SKYDRIVER_SCAN_ID)"}
    settings = S.model_copy(update={"scanner_env": deployment})
    pod = scanner_job.build_job("abc", "u", "ns", s, settings)["spec"]["template"]["spec"]
    (scanner,), (sidecar,) = pod["containers"], pod["initContainers"]
    secrets = {"SKYSCAN_SKYDRIVER_AUTH": "the-token"}
    argv, env = as_the_process_sees_it(scanner, secrets)
    assert argv == scanner_server_argv(s) and argv[argv.index("--reco-algo") + 1] == hostile
    assert {k: env[k] for k in user} == user
    assert {k: env[k] for k in deployment} == deployment
    assert "the-token" not in argv and list(env.values()).count("the-token") == 1
    assert as_the_process_sees_it(sidecar, secrets)[0] == sidecar["args"] == [scanner_job.STARTUP_JSON]
    assert kubelet_expand(hostile, secrets) == "the-token"


def test_the_kubelets_expansion_as_the_simulator_plays_it() -> None:
    env = {"A": "1", "B": "$(A)"}
    cases = {"$(A)": "1", "$$(A)": "$(A)", "$$$(A)": "$1", "$(C)": "$(C)", "$(A": "$(A", "x$": "x$",
             "$x": "$x", "a$$b": "a$b", "$(B)": "$(A)", "": ""}  # fmt: skip
    for value, expected in cases.items():
        assert kubelet_expand(value, env) == expected, value


def test_each_scanner_reads_its_own_token() -> None:
    s = S.model_copy(update={"scanner_pod_annotations": {"a": "b"}})
    job = scanner_job.build_job("abc", "u", "ns", spec(), s)
    assert job["spec"]["template"]["metadata"]["annotations"] == {"a": "b"}
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    secret = {"name": "skyscan-abc-scanner", "key": "token"}
    assert env["SKYSCAN_SKYDRIVER_AUTH"]["valueFrom"] == {"secretKeyRef": secret}
    assert names.scan_id_of_scanner_secret(secret["name"]) == "abc"
    assert names.scan_id_of_scanner_secret("skyscan-abc-ewms") is None


def test_the_token_request_is_bound_to_the_scans_secret() -> None:
    body = scanner_job.token_request("skyscan-abc-scanner", "uid-9", scanner_job.credential_lifetime(S))
    assert body["spec"]["audiences"] == ["skyscan-scanner"]
    assert body["spec"]["boundObjectRef"] == {
        "apiVersion": "v1", "kind": "Secret", "name": "skyscan-abc-scanner", "uid": "uid-9"
    }  # fmt: skip
    assert body["spec"]["expirationSeconds"] > S.job_active_deadline_seconds
    secret = scanner_job.credential_secret("abc", "uid-1", "ns")
    assert secret["metadata"]["ownerReferences"] == [names.owner_reference("abc", "uid-1")]
    assert "data" not in secret and "stringData" not in secret  # the token is added once issued


def test_workflow_request_follows_the_reference_and_passes_wms_validation() -> None:
    clusters = [
        {"location": "sub-2", "nWorkers": 4},
        {"location": "osg", "nWorkers": 9},
        {"location": "osg", "nWorkers": 1},
    ]
    body = scanner_job.workflow_request(
        "abc", "uid-1", spec(requestClusters=clusters, debugMode=["client-logs"]), S
    )
    validate_workflow_request(body, {"osg", "sub-2"})
    (task,) = body["tasks"]
    # sub-2 is asked as osg (EWMS's own alias, SKYSCAN_WMS_CLUSTERS_ALIAS's default), and once: the WMS
    # rejects duplicates
    assert task["cluster_locations"] == ["osg"]
    unaliased = S.model_copy(update={"wms_clusters_alias": {}})
    body = scanner_job.workflow_request("abc", "uid-1", spec(requestClusters=clusters), unaliased)
    assert body["tasks"][0]["cluster_locations"] == ["sub-2", "osg"]
    assert task["n_workers"] == 4  # the first cluster's count, as the reference does
    env = task["pilot_config"]["environment"]
    assert env["EWMS_PILOT_TASK_TIMEOUT"] == 600 and env["EWMS_PILOT_DUMP_TASK_OUTPUT"] == "True"
    assert env["SKYSCAN_REQUEST_ID"] == "uid-1"
    assert "http://shim:8080/scan/abc/startup.json" in task["init_args"]
    assert task["task_image"].endswith("skymap_scanner:4.1.2")


def test_the_wms_double_rejects_what_the_real_one_rejects() -> None:
    body = scanner_job.workflow_request("abc", "u", spec(), S)
    body["tasks"][0]["pilot_config"]["environment"]["EWMS_PILOT_TASK_IMAGE"] = "x"
    with pytest.raises(SimError, match="EWMS_PILOT_TASK_IMAGE"):
        validate_workflow_request(body, {"osg"})
    with pytest.raises(SimError, match="condor cluster location not found"):
        validate_workflow_request(scanner_job.workflow_request("abc", "u", spec(), S), {"local"})
    with pytest.raises(SimError, match="additional properties"):
        validate_workflow_request({**scanner_job.workflow_request("abc", "u", spec(), S), "x": 1}, {"osg"})


def test_ewms_connection_waits_for_activation() -> None:
    profiles = [
        {"alias": "to-client-queue", "mqid": "a1", "is_activated": True}
        | {"auth_token": "t", "broker_type": "r", "broker_address": "b"},
        {"alias": "from-client-queue", "mqid": "a2", "is_activated": False}
        | {"auth_token": None, "broker_type": None, "broker_address": None},
    ]
    assert scanner_job.ewms_connection(profiles) is None
    profiles[1].update(is_activated=True, auth_token="u", broker_type="r", broker_address="b")
    got = scanner_job.ewms_connection(profiles)
    assert got == {
        "toclient": {"name": "a1", "auth_token": "t", "broker_type": "r", "broker_address": "b"},
        "fromclient": {"name": "a2", "auth_token": "u", "broker_type": "r", "broker_address": "b"},
    }


def test_scanner_pods_trust_only_the_shims_ca_when_one_is_configured() -> None:
    """Scanners send the shim their token: over TLS, verified against the CA the operator mounts."""
    plain = scanner_job.build_job("abc", "u", "ns", spec(), S)["spec"]["template"]["spec"]
    assert "rest-ca" not in {v["name"] for v in plain["volumes"]}
    s = S.model_copy(update={"rest_address": "https://shim.ns.svc:8080", "rest_ca_configmap": "shim-ca"})
    pod = scanner_job.build_job("abc", "u", "ns", spec(), s)["spec"]["template"]["spec"]
    assert {"name": "rest-ca", "configMap": {"name": "shim-ca"}} in pod["volumes"]
    for container in (pod["containers"][0], pod["initContainers"][0]):  # the scanner and its sidecar
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == "/etc/skyscan/rest-ca/ca.crt"
        assert env["SKYSCAN_SKYDRIVER_ADDRESS"] == "https://shim.ns.svc:8080"
        assert {"name": "rest-ca", "mountPath": "/etc/skyscan/rest-ca", "readOnly": True} in container[
            "volumeMounts"
        ]
    assert not S.model_copy(update={"rest_address": "http://127.0.0.1:8080"}).rest_in_clear
    assert S.rest_in_clear and not s.rest_in_clear


def test_nsides_sort_as_numbers_and_any_other_key_after_them_by_name() -> None:
    pairs = scanner_args.sorted_nsides({"64": 4, "b": 1, "8": 12, "a": 2, "512": 0})
    assert list(pairs) == [("8", 12), ("64", 4), ("512", 0), ("a", 2), ("b", 1)]


def test_the_scanner_gets_exactly_skyscans_variables_after_the_users_allowed_ones() -> None:
    with_env = spec(scannerServerEnvFromUser={"SKYSCAN_LOG": "DEBUG", "HTTPS_PROXY": "http://evil:3128"})
    settings = S.model_copy(update={"scanner_env": {"SKYSCAN_EXTRA": "1"}})
    assert scanner_job.scanner_env("abc", with_env, settings) == [
        {"name": "SKYSCAN_LOG", "value": "DEBUG"},
        {"name": "SKYSCAN_EWMS_JSON", "value": "/etc/skyscan-ewms/ewms.json"},
        {"name": "SKYSCAN_SKYDRIVER_ADDRESS", "value": "http://shim:8080"},
        {"name": "SKYSCAN_SKYDRIVER_SCAN_ID", "value": "abc"},
        {"name": "SKYSCAN_EXTRA", "value": "1"},
        {"name": "SKYSCAN_EWMS_PILOT_LOG", "value": "WARNING"},
        {"name": "SKYSCAN_MQ_CLIENT_LOG", "value": "WARNING"},
        scanner_job.scanner_auth_env("abc"),
    ]


def test_every_string_the_kubelet_would_expand_is_escaped_and_nothing_is_added() -> None:
    container = {
        "name": "c",
        "command": ["sh", "$(A)"],
        "args": ["$(B)"],
        "env": [{"name": "X", "value": "$(C)"}, {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "s"}}}],
    }
    assert scanner_job.kube_literals(container) == {
        "name": "c",
        "command": ["sh", "$$(A)"],
        "args": ["$$(B)"],
        "env": [{"name": "X", "value": "$$(C)"}, {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "s"}}}],
    }
    assert scanner_job.kube_literals({"name": "bare"}) == {"name": "bare"}


def test_a_reserved_variable_is_refused_naming_every_reserved_prefix() -> None:
    with pytest.raises(ValueError) as refused:
        spec(scannerServerEnvFromUser={"LD_PRELOAD": "/x.so"})
    prefixes = ", ".join(model.RESERVED_ENV_PREFIXES)
    assert (
        f"cannot set 'LD_PRELOAD': Skyscan sets the scanner's own variables (reserved prefixes: {prefixes})"
        in (str(refused.value))
    )
