"""The documentation: a README a newcomer reads in ten minutes whose links lead somewhere, and a site
(docs/) whose generated parts match the code: every setting of every component with its current
default, every REST route (skyscan_local.docs_reference). `make docs` builds the site strict."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from api_shim.settings import ShimSettings
from skyscan_local import docs_reference
from skyscan_local import stack as localstack
from skyscan_local.scanner_pod import ScannerSimSettings
from skyscan_local.wms_controls import SimulatorSettings
from skyscan_operator.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SETTINGS_PAGE = (ROOT / "docs" / "settings.md").read_text()
LOCAL_STACK_PAGE = (ROOT / "docs" / "development" / "local-stack.md").read_text()
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_generated_parts_are_current() -> None:
    assert docs_reference.main(["--check"]) == 0, "run `make docs-reference`"


@pytest.mark.parametrize("settings", [OperatorSettings, ShimSettings, SimulatorSettings, ScannerSimSettings])
def test_every_setting_is_on_the_settings_page_with_its_default(settings: type[BaseSettings]) -> None:
    for name in settings.model_fields:
        variable = docs_reference.variable(settings, name)
        row = f"| `{variable}` | {docs_reference.shown(docs_reference.default_of(settings, name))} |"
        assert row in SETTINGS_PAGE, f"docs/settings.md lacks the row for {variable}: {row}"


def test_a_default_is_shown_as_the_environment_spells_it() -> None:
    shown = docs_reference.shown
    assert [shown(None), shown(""), shown(True), shown(8), shown({"a": 1}), shown([])] == [
        "unset",
        '`""`',
        "`true`",
        "`8`",
        '`{"a": 1}`',
        "`[]`",
    ]


def test_a_cell_keeps_its_table_and_its_angle_brackets() -> None:
    assert docs_reference.cell("a | b <tag> `<x>`") == "a \\| b &lt;tag> `<x>`"


def test_every_local_setting_is_on_the_local_stack_page() -> None:
    for component in localstack.LOCAL_DEFAULTS.values():
        for variable in component:
            assert f"| `{variable}` |" in LOCAL_STACK_PAGE, variable
    for key in localstack.ENV_KEYS:
        assert f"| `{key}` |" in LOCAL_STACK_PAGE, key


def test_the_readme_is_read_in_ten_minutes() -> None:
    assert len(README.splitlines()) < 300


def test_the_readmes_links_lead_to_files_and_headings_that_exist() -> None:
    for target in LINK.findall(README):
        if re.match(r"[a-z]+:", target):
            continue  # external: not fetched
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), target
        if anchor:
            slugs = {
                re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
                for heading in re.findall(r"^#+ (.*)$", (ROOT / path).read_text(), re.M)
            }
            assert anchor in slugs, target
