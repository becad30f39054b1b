"""What a scan request may put in the scanner's environment (`api_shim.launch`): names on the allow-list
only, the canonical field over its deprecated alias."""

from __future__ import annotations

from typing import Any

import pytest

from api_shim.errors import ApiError
from api_shim.launch import _scanner_env
from api_shim.rest_models import ScanRequestBody


def body(**fields: Any) -> ScanRequestBody:
    return ScanRequestBody.model_construct(**fields)


def test_allowed_variables_pass_and_the_canonical_field_wins_over_its_alias() -> None:
    ours = {"SKYSCAN_LOG": "DEBUG"}
    assert (
        _scanner_env(body(scanner_server_env_from_user=ours, scanner_server_env={"X": 1}), frozenset())
        == ours
    )
    assert _scanner_env(body(scanner_server_env=ours), frozenset()) == ours
    assert _scanner_env(body(), frozenset()) == {}
    omp = {"OMP_NUM_THREADS": 2}
    assert _scanner_env(body(scanner_server_env_from_user=omp), frozenset({"OMP_*"})) == omp


@pytest.mark.parametrize("name", ["HTTPS_PROXY", "OMP_NUM_THREADS", "SKYSCAN_SKYDRIVER_AUTH"])
def test_a_variable_off_the_allow_list_is_refused_400_naming_it(name: str) -> None:
    with pytest.raises(ApiError) as refused:
        _scanner_env(body(scanner_server_env_from_user={"SKYSCAN_LOG": "x", name: "v"}), frozenset({"X"}))
    assert refused.value.status == 400
    assert refused.value.reason == f"cannot set '{name}' in the scanner's environment"
    assert refused.value.message == (
        "A scan may set the scanner's own SKYSCAN_ tuning variables and the names this deployment allows "
        "(SKYSCAN_SCANNER_ENV_ALLOWED); variables such as proxies, CA bundles or PATH would change where "
        "the scanner sends its credential or what it runs."
    )
