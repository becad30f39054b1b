"""The README documents every setting of every component, with its current default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from api_shim.settings import ShimSettings
from skyscan_local import stack as localstack
from skyscan_local.scanner_simulator import ScannerSimSettings
from skyscan_local.wms_simulator import SimulatorSettings
from skyscan_operator.settings import OperatorSettings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def shown(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, dict | list):
        return f"`{json.dumps(value)}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return '`""`' if value == "" else f"`{value}`"


@pytest.mark.parametrize(
    ("settings", "prefix"),
    [
        (OperatorSettings, "SKYSCAN_"),
        (ShimSettings, "SKYSCAN_"),
        (SimulatorSettings, "SKYSCAN_WMS_SIM_"),
        (ScannerSimSettings, "SKYSCAN_SCANNER_SIM_"),
    ],
)
def test_every_setting_is_in_the_readme_with_its_default(settings: type[BaseSettings], prefix: str) -> None:
    for name, field in settings.model_fields.items():
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        row = f"| `{prefix}{name.upper()}` | {shown(default)} |"
        assert row in README, f"README lacks the row for {prefix}{name.upper()}: {row}"


def test_every_local_setting_is_in_the_readme() -> None:
    for component in localstack.LOCAL_DEFAULTS.values():
        for variable in component:
            assert f"`{variable}" in README, variable
    for key in localstack.ENV_KEYS:
        assert f"| `{key}` |" in README, key
