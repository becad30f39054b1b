"""MongoDB's `$regex` + `$options` on a linear-time engine (RE2, PyPI `google-re2`).

PCRE (MongoDB's engine) backtracks: `^(\\w+)+!` takes exponential time. RE2 is linear in the text and
refuses what needs backtracking (backreferences, lookaround, atomic groups, possessive quantifiers,
recursion, conditionals): a `RegexError`, a 400. `translate` keeps PCRE's meaning where RE2 differs:
`$options` `i m s` as inline flags; `x` (whitespace and `#` comments ignored outside classes), from
`$options` or `(?x)`, applied here; `$` without `m`, and `\\Z`, also before a final newline; `(?#...)`
dropped. `\\d \\w \\s \\b` are ASCII, as in MongoDB.

A pattern beyond the caller's length or program size (which bounds one search's work) is refused; its
size is measured first under a small memory budget (`_sizing`) that RE2 stops compiling past, so a
pattern far beyond it (`\\pL{80}`: 95,000 instructions) costs ms of the event loop, not 20+.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import re2

OPTIONS = frozenset("imsx")
_WHITESPACE = frozenset(" \t\n\r\f\v")
_END = r"(?:\n?\z)"  # PCRE's `$` (without m) and `\Z`: end of text or before a final newline
_TOKEN = re.compile(  # what `translate` reads as one piece of a pattern; groups 1-3: a flag group's parts
    r"\(\?([A-Za-z]*)(?:-([A-Za-z]*))?([:)])"  # a flag group: (?on-off) or (?on-off:
    r"|\\Q.*?(?:\\E|\Z)"  # quoted literal text, up to \E (or the end)
    r"|\\.?"  # an escape
    r"|\[\^?\]?(?:\\.|\[:.*?:\]|[^\]])*?(?:\]|\Z)"  # a class: a `]` first is literal; [:alpha:] inside
    r"|\(\?#[^)]*\)?"  # a (?#...) comment
    r"|.",
    re.DOTALL,
)
_UNSUPPORTED = (
    "the linear-time engine refuses backreferences, lookahead/lookbehind, atomic groups, "
    "possessive quantifiers, recursion and conditionals"
)
_PERL_ONLY = ("invalid perl operator", "invalid escape sequence", "bad repetition operator")
_TOO_LARGE = "pattern too large"  # RE2's refusal of a program beyond its memory budget


@functools.cache
def _options(max_mem: int) -> Any:
    """RE2's options with a memory budget per compiled pattern (its program and its automaton cache)."""
    options = re2.Options()
    options.log_errors = False  # refused patterns are the client's business, not the shim's log
    options.never_capture = True  # only whether it matches counts: groups cost time
    options.max_mem = max_mem
    return options


_RE2_OPTIONS = _options(2 << 20)


def _sizing(max_program: int) -> Any:
    """RE2 compiles up to about 16 x `max_program` instructions under these, and stops early past that
    (10,000 fuzzed patterns within 1,000 instructions: the same programs as under `_RE2_OPTIONS`)."""
    return _options(max(256 * max_program, 64 << 10))


class RegexError(ValueError):
    pass


@dataclass(frozen=True)
class Regex:
    """A compiled pattern; `search(text)` answers whether it matches anywhere in `text`."""

    pattern: str
    program_size: int
    search: Callable[[str], bool]


def _searcher(compiled: Any) -> Callable[[str], bool]:
    """Whether `compiled` matches in a text: through the binding's `RE2.Match`, half the cost of the
    public `search` (which also builds a match object) on a manifest's short strings; else `search`."""
    match = getattr(getattr(compiled, "_regexp", None), "Match", None)
    unanchored = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)
    if match is None or unanchored is None:
        return lambda text: compiled.search(text) is not None

    def search(text: str) -> bool:
        encoded = text.encode()
        return bool(match(unanchored, encoded, 0, len(encoded))[0][0] >= 0)

    return search


def translate(pattern: str, options: str = "") -> str:
    """The RE2 pattern with MongoDB's (PCRE's) meaning of `pattern` under `options`."""
    if unknown := sorted(set(options) - OPTIONS):
        raise RegexError(f"unsupported $options flag: {unknown[0]!r} (supported: i, m, s, x)")
    scope = ("m" in options, "x" in options)  # multi-line, extended: the flags in force in this group
    stack: list[tuple[bool, bool]] = []
    flags = "".join(sorted(set(options) - {"x"}))
    out = [f"(?{flags})" if flags else ""]
    i = 0
    while i < len(pattern):
        token = _TOKEN.match(pattern, i)
        assert token is not None  # its last alternative takes any character
        text, i = token[0], token.end()
        if token[3]:  # a flag group: (?on-off) or (?on-off:, its `x` applied here, not by RE2
            on, off = token[1], token[2] or ""
            if token[3] == ":":
                stack.append(scope)
            scope = (("m" in on or scope[0]) and "m" not in off, ("x" in on or scope[1]) and "x" not in off)
            on, off = on.replace("x", ""), off.replace("x", "")
            if token[3] == ":" or on or off:
                out.append("(?" + on + (f"-{off}" if off else "") + token[3])
        elif text.startswith("(?#"):
            if not text.endswith(")"):
                raise RegexError("missing ) after a (?# comment")
        elif text == "(":
            stack.append(scope)
            out.append(text)
        elif text == ")":
            scope = stack.pop() if stack else scope  # unbalanced: RE2 reports it
            out.append(text)
        elif scope[1] and text == "#":  # a comment to the line's end
            close = pattern.find("\n", i)
            i = len(pattern) if close < 0 else close + 1
        elif text == "\\Z" or (text == "$" and not scope[0]):
            out.append(_END)
        elif not (scope[1] and text in _WHITESPACE):
            out.append(text)
    return "".join(out)


def _compiled(translated: str, options: Any, max_program: int) -> Any:
    try:
        return re2.compile(translated, options)
    except re2.error as e:
        detail = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        if detail.startswith(_PERL_ONLY):
            detail += f" ({_UNSUPPORTED})"
        elif detail.startswith(_TOO_LARGE):
            detail = (
                f"pattern too complex: its program has far more than {max_program} instructions, at most "
                f"{max_program} are allowed"
            )
        raise RegexError(detail) from None
    except UnicodeError:
        raise RegexError("the pattern is not valid Unicode") from None
    finally:
        # re2 keeps the last 128 compiled patterns, each with up to `max_mem` of automaton: drop them,
        # so only the patterns of finds in progress hold memory (compiling again costs microseconds).
        re2.purge()


def compile_regex(pattern: str, options: str, *, max_length: int, max_program: int) -> Regex:
    if len(pattern) > max_length:
        raise RegexError(f"pattern longer than {max_length} characters")
    translated = translate(pattern, options)
    size = _compiled(translated, _sizing(max_program), max_program).programsize
    if size > max_program:
        raise RegexError(
            f"pattern too complex: its program has {size} instructions, at most {max_program} are allowed"
        )
    compiled = _compiled(translated, _RE2_OPTIONS, max_program)
    return Regex(pattern, compiled.programsize, _searcher(compiled))
