"""Which scan, and which role, a verified scanner token speaks for (`scanner_identity`)."""

from __future__ import annotations

from typing import Any

from api_shim import auth
from api_shim.scanner_auth import scanner_identity
from skyscan import names

NAMESPACE, SCAN = "skyscan", "0123456789abcdef0123456789abcdef"


def k8s_claims(**overrides: Any) -> dict[str, Any]:
    claims = {
        "namespace": NAMESPACE,
        "serviceaccount": {"name": names.SCANNER_SERVICE_ACCOUNT},
        "secret": {"name": names.scanner_token_secret_name(SCAN)},
    }
    return {"kubernetes.io": claims | overrides}


def test_a_scanner_token_carries_the_system_role_for_its_own_scan_only() -> None:
    identity = scanner_identity(k8s_claims(), NAMESPACE, names.SCANNER_SERVICE_ACCOUNT)
    assert identity is not None
    assert identity.roles == frozenset({auth.SYSTEM}) and identity.scan_id == SCAN


def test_a_scanner_token_from_another_namespace_is_refused() -> None:
    claims = k8s_claims(namespace="elsewhere")
    assert scanner_identity(claims, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT) is None


def test_a_token_of_another_service_account_is_not_a_scanners() -> None:
    claims = k8s_claims(serviceaccount={"name": "default"})
    assert scanner_identity(claims, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT) is None


def test_a_token_bound_to_a_secret_not_of_a_scanner_is_refused() -> None:
    claims = k8s_claims(secret={"name": f"skyscan-{SCAN}-ewms"})
    assert scanner_identity(claims, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT) is None
    assert scanner_identity({}, NAMESPACE, names.SCANNER_SERVICE_ACCOUNT) is None
