"""The exact RE2 pattern `translate` makes of a PCRE one: where a character class, a quoted run, a
comment or a flag group ends decides which `$` means "end or before a final newline" (`_END`)."""

from __future__ import annotations

from typing import Any

import pytest
import re2

from api_shim.find import regex
from api_shim.find.regex import _END, RegexError, compile_regex, translate

LIMITS = {"max_length": 1_000, "max_program": 1_000}


@pytest.mark.parametrize(
    ("pattern", "options", "translated"),
    [
        # character classes: a `]` first (after `^`) is literal, escapes and POSIX classes inside
        ("[a]$]", "", "[a]" + _END + "]"),
        ("[]]$", "", "[]]" + _END),
        ("[^]$]", "", "[^]$]"),
        ("a[^]$]", "", "a[^]$]"),
        ("[\\]$]", "", "[\\]$]"),
        ("[\\]]$", "", "[\\]]" + _END),
        ("a[\\]]$", "", "a[\\]]" + _END),
        ("[[:alpha:]]$", "", "[[:alpha:]]" + _END),
        ("[[:a:]][[:b:]]$", "", "[[:a:]][[:b:]]" + _END),
        ("[[::]]$", "", "[[::]]" + _END),
        ("[:]x[[:b:]]$", "", "[:]x[[:b:]]" + _END),
        ("[ab]:]$", "", "[ab]:]" + _END),
        ("[^]]$", "", "[^]]" + _END),
        ("[[:a]$:]]", "", "[[:a]$:]]"),  # what stands between [: and :] is never the class's end
        ("x[[:a]$:]]", "", "x[[:a]$:]]"),
        ("[[::]$]", "", "[[::]$]"),
        ("[[:a:]]$[[:b:]]", "", "[[:a:]]" + _END + "[[:b:]]"),
        ("[abc", "", "[abc"),  # unterminated: RE2 reports it
        # \Q...\E: quoted up to \E, or to the end
        ("\\Q\\E$", "", "\\Q\\E" + _END),
        ("\\E\\Qa$\\E$", "", "\\E\\Qa$\\E" + _END),
        ("\\Qa$", "", "\\Qa$"),
        ("\\Qa\\E$\\E", "", "\\Qa\\E" + _END + "\\E"),
        # x: whitespace and # comments (to the line's end, or the pattern's) dropped
        ("a b c", "x", "abc"),
        ("#c\nb\nd", "x", "bd"),
        ("a\n# c\nb$", "x", "ab" + _END),
        ("a #c", "x", "a"),
        # (?#...) comments are dropped up to their own `)`
        ("(a)(?#c)$", "", "(a)" + _END),
        ("(?#c)(a)$", "", "(a)" + _END),
        # flag groups: m and x switched on and off, x never passed on to RE2
        ("(?i)a$", "", "(?i)a" + _END),
        ("(?-m)a$", "m", "(?m)(?-m)a" + _END),
        ("(?i)a$", "m", "(?m)(?i)a$"),  # m stays on through a group that does not name it
        ("(?i)a b", "", "(?i)a b"),
        ("(?-x)a b", "x", "a b"),
        ("(?-x:a b)", "x", "(?:a b)"),
        ("(?i-s:a)", "", "(?i-s:a)"),
        ("a)$", "", "a)" + _END),  # unbalanced: RE2 reports it
    ],
)
def test_translate(pattern: str, options: str, translated: str) -> None:
    assert translate(pattern, options) == translated


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("(?#no end", "missing ) after a (?# comment"),
        ("\ud800", "the pattern is not valid Unicode"),
        ("a)", "unexpected ): a)"),
    ],
)
def test_refusals_say_why(pattern: str, message: str) -> None:
    with pytest.raises(RegexError) as refused:
        compile_regex(pattern, "", **LIMITS)
    assert str(refused.value) == message


def test_a_compiled_pattern_keeps_the_pattern_given() -> None:
    assert compile_regex("a$", "m", **LIMITS).pattern == "a$"


def test_groups_capture_nothing_so_they_cost_no_instructions() -> None:
    grouped = compile_regex("(a)(b)(c)", "", **LIMITS)
    assert grouped.program_size == compile_regex("(?:a)(?:b)(?:c)", "", **LIMITS).program_size
    assert grouped.search("xabc")


def test_the_length_limit_admits_a_pattern_of_exactly_its_length() -> None:
    assert compile_regex("a" * 10, "", max_length=10, max_program=1_000).search("a" * 10)
    with pytest.raises(RegexError, match="pattern longer than 9 characters"):
        compile_regex("a" * 10, "", max_length=9, max_program=1_000)


def test_the_program_limit_admits_a_pattern_of_exactly_its_size() -> None:
    size = compile_regex("a{20}", "", **LIMITS).program_size
    assert compile_regex("a{20}", "", max_length=1_000, max_program=size).program_size == size
    with pytest.raises(RegexError, match=f"its program has {size} instructions, at most {size - 1}"):
        compile_regex("a{20}", "", max_length=1_000, max_program=size - 1)


class PublicOnly:
    """A compiled pattern of a binding without `_regexp.Match`: only the public `search`."""

    def __init__(self, pattern: str) -> None:
        self.compiled = re2.compile(pattern)

    def search(self, text: str) -> Any:
        return self.compiled.search(text)


def test_without_the_bindings_match_the_public_search_answers() -> None:
    search = regex._searcher(PublicOnly("b+c"))
    assert search("abbc") is True
    assert search("abd") is False
