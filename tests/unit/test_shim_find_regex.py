"""`$regex` on the linear-time engine: MongoDB's (PCRE's) meaning kept, what needs backtracking refused."""

from __future__ import annotations

import re
import time

import pytest
import re2

from api_shim.find import regex as regex_module
from api_shim.find.regex import RegexError, compile_regex, translate

LIMITS = {"max_length": 1_000, "max_program": 1_000}
FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}

PATTERNS = [
    "^abc$", "abc$", "c$", "^$", "a.c", "^a.c$", "ABC", "^\\w+$", "\\w+\\s+\\w+", "\\bword\\b",
    "a|b$", "[$]", "[^a-c]+$", "colou?r", "\\d{2,3}$", "(?:ab)+", "x # a comment\n y", "[ #]z",
    "a\\ b", "x\\#", "^(\\w+)+!", "(a|aa)+$", "(.*a){20}", "^\\w{8}(\\w+)+!", "(?i:ab)c", "(?m:c$)\\n",
]  # fmt: skip
TEXTS = [
    "", "\n", "abc", "abc\n", "abc\nd", "ABC", "aBc\n", "a b", "a  b\n", "word", "a word here",
    "colour", "color\n", "12", "1234\n", "$", "x#", "xy", "x y", " z", "#z", "ab" * 5 + "c",
    "18bcfe56800x00000000000000000001", "a" * 30, "Abc\nabc\n",
]  # fmt: skip


@pytest.mark.parametrize("options", ["", "i", "m", "s", "x", "ms", "imsx"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_same_answers_as_a_backtracking_engine(pattern: str, options: str) -> None:
    """Python's `re` (ASCII classes) has PCRE's meaning for these; the RE2 translation must agree."""
    flags = re.ASCII
    for letter in options:
        flags |= FLAGS[letter]
    expected = re.compile(pattern, flags)
    regex = compile_regex(pattern, options, **LIMITS)
    for text in TEXTS:
        if len(text) > 20 and pattern in ("^(\\w+)+!", "^\\w{8}(\\w+)+!", "(.*a){20}"):
            continue  # exponential for the backtracking engine: that is the point
        assert regex.search(text) is (expected.search(text) is not None), (pattern, options, text)


@pytest.mark.parametrize(
    ("pattern", "options", "re2_pattern"),
    [
        ("^a$", "", "^a(?:\\n?\\z)"),  # PCRE's `$`: at the end or before a final newline
        ("^a$", "m", "(?m)^a$"),
        ("a\\Z", "", "a(?:\\n?\\z)"),
        ("a b # c\n d", "x", "abd"),
        ("(?x) a b", "", "ab"),  # RE2 has no x flag: applied here, inline too
        ("(?ix: a ) b", "", "(?i:a) b"),
        ("[ #]a", "x", "[ #]a"),  # kept inside a character class
        ("[]$]$", "", "[]$](?:\\n?\\z)"),
        ("\\Q a$ \\E$", "x", "\\Q a$ \\E(?:\\n?\\z)"),  # quoted text is literal
        ("(?#note)a", "", "a"),
        ("(a(?m)b$)c$", "", "(a(?m)b$)c(?:\\n?\\z)"),  # inline m lasts to the end of its group
        ("a", "si", "(?is)a"),
    ],
)
def test_translation(pattern: str, options: str, re2_pattern: str) -> None:
    assert translate(pattern, options) == re2_pattern


@pytest.mark.parametrize(
    ("pattern", "options", "text"),
    [
        ("(a)\\1", "", "invalid escape sequence: \\1 (the linear-time engine refuses backreferences"),
        ("(?P<x>a)(?P=x)", "", "invalid perl operator"),
        ("a(?=b)", "", "invalid perl operator: (?= (the linear-time engine"),
        ("a(?!b)", "", "invalid perl operator: (?!"),
        ("(?<=a)b", "", "invalid perl operator: (?<="),
        ("(?<!a)b", "", "invalid perl operator: (?<!"),
        ("(?>a+)b", "", "invalid perl operator: (?>"),
        ("a++b", "", "bad repetition operator: ++"),
        ("(?(1)a|b)", "", "invalid perl operator"),
        ("(?R)", "", "invalid perl operator"),
        ("(", "", "missing ): ("),
        ("a{1001}", "", "invalid repetition size"),
        ("\ud800", "", "not valid Unicode"),
        ("a", "u", "unsupported $options flag: 'u'"),
        ("a", "g", "unsupported $options flag: 'g'"),
        ("a" * 1_001, "", "pattern longer than 1000 characters"),
        ("(.*a){200}", "", "pattern too complex: its program has 1804 instructions, at most 1000"),
    ],
)
def test_refused(pattern: str, options: str, text: str) -> None:
    with pytest.raises(RegexError) as refused:
        compile_regex(pattern, options, **LIMITS)
    assert text in str(refused.value)


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        ("\\pL{80}", "its program has far more than 1000 instructions, at most 1000"),  # 95,684 with 2 MB
        ("\\p{Greek}{1,999}", "its program has far more than 1000 instructions"),  # 62,940
        ("(?i)\\pL{999}", "its program has far more than 1000 instructions"),  # beyond any budget
    ],
)
def test_a_pattern_far_beyond_the_program_limit_is_refused_in_a_few_milliseconds(
    pattern: str, text: str
) -> None:
    """Each compile holds the event loop (RE2 keeps the GIL): sized under a small memory budget first,
    RE2 gives up early on a huge program (these took 6-23 ms each under the 2 MB a search needs)."""
    best = float("inf")
    for _ in range(5):  # the least of five, in CPU time: the work, not the machine's other load
        start = time.thread_time()
        with pytest.raises(RegexError) as refused:
            compile_regex(pattern, "", **LIMITS)
        best = min(best, time.thread_time() - start)
    assert text in str(refused.value)
    assert best < 0.005, best


@pytest.mark.parametrize(
    "pattern", ["(?i)\\p{Lu}{3}", "\\PN{2}", "\\p{Han}{12}", "\\w{1,240}7", "(?i)[^k]{40}"]
)
def test_a_pattern_near_the_limit_compiles_to_the_same_program_either_budget(pattern: str) -> None:
    """Sizing under the small budget never refuses what the full one compiles within the limit."""
    full = re2.compile(translate(pattern), regex_module._RE2_OPTIONS).programsize
    assert 600 < full <= 1000
    assert compile_regex(pattern, "", **LIMITS).program_size == full


def test_the_sizing_budget_grows_with_the_program_limit_from_a_floor() -> None:
    """256 bytes an instruction (about 16 x the limit's program), never below 64 KiB; the full budget
    2 MiB; both log nothing and capture nothing."""
    assert regex_module._sizing(1_000).max_mem == 256_000
    assert regex_module._sizing(10).max_mem == 64 << 10
    for options in (regex_module._sizing(10), regex_module._RE2_OPTIONS):
        assert (options.log_errors, options.never_capture) == (False, True)
    assert regex_module._RE2_OPTIONS.max_mem == 2 << 20


@pytest.mark.parametrize("pattern", ["^\\w{8}(\\w+)+!", "^(\\w+)+!", "(a|aa)+$", "(.*a){20}", "(x+x+)+y"])
def test_catastrophic_patterns_take_linear_time(pattern: str) -> None:
    regex = compile_regex(pattern, "", **LIMITS)
    for text in ("a" * 10_000, "18bcfe56800x" + "0" * 10_000, "ab" * 5_000 + "!"):
        start = time.perf_counter()
        regex.search(text)
        assert time.perf_counter() - start < 0.5, (pattern, len(text))


@pytest.mark.parametrize("pattern", ["^abc$", "(?i)É", "é.$", "^\\w+$", "b", "^$", "ü{2}", "(a|aa)+$", "x*"])
def test_the_direct_search_answers_as_the_public_one(pattern: str) -> None:
    """The search through the binding's `RE2.Match` (see `regex._searcher`) is in use and agrees with
    google-re2's public `search`, on ASCII and multi-byte text."""
    regex = compile_regex(pattern, "", **LIMITS)
    assert regex.search.__name__ == "search"  # not the fallback
    public = re2.compile(translate(pattern), regex_module._RE2_OPTIONS)
    for text in ["", "abc", "abc\n", "ÉCOLE", "été", "ab\u00fcü", "üü", "a" * 50, "x\ny", "日本語b", "b日本"]:
        assert regex.search(text) is (public.search(text) is not None), (pattern, text)
