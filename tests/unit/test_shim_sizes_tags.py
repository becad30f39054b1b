"""Size parsing (the reference's decimal-by-default rules) and image tag resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from api_shim.sizes import InvalidSize, SizeTooLarge, parse_size
from skyscan.tags import TagError, read_catalog_dir, resolve_tag, strip_v


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("1024M", 1_024_000_000), ("8GB", 8_000_000_000), ("8 gb", 8_000_000_000), ("1GB", 1_000_000_000),
        ("4Gi", 4_000_000_000), ("4GiB", 4 * 1024**3), ("2 mebibytes", 2 * 1024**2), ("1.5GB", 1_500_000_000),
        ("42", 42), ("13b", 13), ("5 bytes", 5), ("512k", 512_000), (7, 7), (0, 0),
    ],
)  # fmt: skip
def test_parse_size(given: str | int, expected: int) -> None:
    assert parse_size(given) == expected


@pytest.mark.parametrize("given", ["", "lots", "-5GB", "12XB", "GB", -1, True])
def test_invalid_sizes(given: str | int) -> None:
    with pytest.raises(InvalidSize):
        parse_size(given)


def test_whole_numbers_are_exact_and_unbounded_here() -> None:
    """As humanfriendly: whole numbers are ints (exact), decimals floats; callers check the bound."""
    assert parse_size("9223372036854775807") == 2**63 - 1
    assert parse_size("999999999999PB") == 999_999_999_999 * 10**15
    assert parse_size("3 EiB") == 3 * 1024**6


@pytest.mark.parametrize("given", ["1" * 400 + ".5GB", "9" * 5000])
def test_sizes_too_large_to_compute(given: str) -> None:
    with pytest.raises(SizeTooLarge):
        parse_size(given)


CATALOG = {"3.4.0", "3.1.5", "4.0.0", "4.2.3", "4.10.1", "gcd-handling-fe8ecee"}


@pytest.mark.parametrize(
    ("requested", "resolved"),
    [
        ("latest", "4.10.1"), ("4", "4.10.1"), ("v4", "4.10.1"), ("4.2", "4.2.3"), ("V4.2.3", "4.2.3"),
        ("4.0.0", "4.0.0"), ("gcd-handling-fe8ecee", "gcd-handling-fe8ecee"),
    ],
)  # fmt: skip
def test_resolve_tag(requested: str, resolved: str) -> None:
    assert resolve_tag(requested, CATALOG, "v4.0.0") == resolved


@pytest.mark.parametrize("requested", ["foo", "5", "4.3", "", "v", "4.2.4"])
def test_unknown_tags(requested: str) -> None:
    with pytest.raises(TagError, match=r"^argument docker_tag: image not found$"):
        resolve_tag(requested, CATALOG, "4.0.0")


@pytest.mark.parametrize("requested", ["3.4.0", "3", "3.1", "v3.1.5"])
def test_tags_older_than_the_minimum(requested: str) -> None:
    with pytest.raises(TagError, match=r"older than the minimum supported tag .v4\.0\.0.\. Contact admins"):
        resolve_tag(requested, CATALOG, "4.0.0")


def test_strip_v_only_before_a_version() -> None:
    assert (strip_v("v4.1"), strip_v("vanilla"), strip_v(" 4 ")) == ("4.1", "vanilla", "4")


def test_catalog_directory(tmp_path: Path) -> None:
    for name in ("skymap_scanner:4.1.0", "skymap_scanner:latest-dev", "other:1.0.0"):
        (tmp_path / name).mkdir()
    assert read_catalog_dir(tmp_path) == {"4.1.0", "latest-dev"}
    assert read_catalog_dir(tmp_path / "missing") == set()


@pytest.mark.parametrize("given", ["lots", "-5GB", "12XB", -1, True])
def test_an_invalid_size_names_the_value_given(given: str | int) -> None:
    with pytest.raises(InvalidSize) as refused:
        parse_size(given)
    assert refused.value.args == (given,)


@pytest.mark.parametrize("unit", ["", "b", "KiB", "kb"])
def test_a_size_too_large_to_compute_names_the_value_given(unit: str) -> None:
    given = "9" * 400 + ".5" + unit  # a decimal beyond any float: infinite
    with pytest.raises(SizeTooLarge) as refused:
        parse_size(given)
    assert refused.value.args == (given,)
    digits = "9" * 5000  # more digits than Python converts to an int
    with pytest.raises(SizeTooLarge) as refused:
        parse_size(digits)
    assert refused.value.args == (digits,)
