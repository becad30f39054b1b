"""The dashboard table's query (`api_shim.handlers.table`, pure): each parameter turned into the find
filter it means, and everything it cannot mean refused as a 400 that names it."""

from __future__ import annotations

import pytest
from multidict import MultiDict

from api_shim.errors import ApiError
from api_shim.find.query import parse
from api_shim.handlers.table import DEFAULT_ROWS, MAX_ROWS, table_ask, table_filter


def q(*pairs: tuple[str, str]) -> MultiDict[str]:
    return MultiDict(pairs)


def test_each_parameter_means_its_filter() -> None:
    assert table_filter(q()) == {"is_deleted": False}
    assert table_filter(q(("deleted", "true"))) == {}
    assert table_filter(q(("deleted", "false"))) == {"is_deleted": False}
    assert table_filter(q(("run_id", "12"), ("event_id", "-3"))) == {
        "event_metadata.run_id": 12, "event_metadata.event_id": -3, "is_deleted": False,
    }  # fmt: skip
    assert table_filter(q(("classifier", "a=1"), ("classifier", "b=x=y"), ("classifier", "c=true"))) == {
        "classifiers.a": 1, "classifiers.b": "x=y", "classifiers.c": True, "is_deleted": False,
    }  # fmt: skip
    assert table_filter(q(("classifier", 'k="1"'))) == {"classifiers.k": "1", "is_deleted": False}
    for text in (
        '{"$gt": 1}',
        "[1]",
        "NaN",
        "1e999",
        '"quoted"',
    ):  # never operators, nor what no classifier is
        expected = "quoted" if text == '"quoted"' else text
        assert table_filter(q(("classifier", f"k={text}")))["classifiers.k"] == expected, text
    assert table_filter(q(("classifier", "k=null"), ("classifier", "f=1.5")))["classifiers.k"] is None
    assert table_filter(q(("since", "10.5"))) == {"timestamp": {"$gte": 10.5}, "is_deleted": False}
    assert table_filter(q(("until", "20"))) == {"timestamp": {"$lt": 20.0}, "is_deleted": False}
    assert table_filter(q(("since", "1"), ("until", "2"), ("deleted", "true"))) == {
        "timestamp": {"$gte": 1.0, "$lt": 2.0}
    }
    bounds = table_filter(q(("run_id", str(2**63 - 1)), ("event_id", str(-(2**63)))))
    assert bounds["event_metadata.run_id"] == 2**63 - 1 and bounds["event_metadata.event_id"] == -(2**63)


def test_the_ask_carries_states_archive_cursor_and_limit() -> None:
    ask = table_ask(q(("state", "ABORTED"), ("state", "SCAN_HAS_FINAL_RESULT"), ("archived", "true"),
                      ("before", "s9"), ("limit", str(MAX_ROWS))))  # fmt: skip
    assert ask.states == {"ABORTED", "SCAN_HAS_FINAL_RESULT"} and ask.archived and ask.before == "s9"
    assert ask.limit == MAX_ROWS and ask.filter == parse({"is_deleted": False})
    plain = table_ask(q())
    assert (plain.states, plain.archived, plain.before, plain.limit) == (
        frozenset(),
        False,
        None,
        DEFAULT_ROWS,
    )
    assert table_ask(q(("limit", "1"))).limit == 1
    assert table_ask(q(("before", "x" * 253))).before == "x" * 253
    assert table_ask(q(("before", "x"))).before == "x"
    assert table_ask(q(*[("state", "A")] * 10)).states == {"A"}
    ten = table_filter(q(*[("classifier", f"k{i}=1") for i in range(10)]))
    assert len(ten) == 11  # ten classifiers, and not deleted


@pytest.mark.parametrize(
    ("pairs", "reason"),
    [
        ([("nope", "1")], "unknown parameters: nope"),
        ([("zz", "1"), ("aa", "2")], "unknown parameters: aa, zz"),
        ([("limit", "0")], "limit: an integer from 1 to 200"),
        ([("limit", str(MAX_ROWS + 1))], "limit: an integer from 1 to 200"),
        ([("limit", "1.5")], "limit: an integer from 1 to 200"),
        ([("limit", "1"), ("limit", "2")], "limit: give it once"),
        ([("run_id", "abc")], f"run_id: an integer from {-(2**63)} to {2**63 - 1}"),
        ([("run_id", str(2**63))], f"run_id: an integer from {-(2**63)} to {2**63 - 1}"),
        ([("event_id", "9" * 20)], f"event_id: an integer from {-(2**63)} to {2**63 - 1}"),
        ([("classifier", "novalue")], "classifier: key=value, a key without `.` or a leading `$`"),
        ([("classifier", "=1")], "classifier: key=value, a key without `.` or a leading `$`"),
        ([("classifier", "$where=1")], "classifier: key=value, a key without `.` or a leading `$`"),
        ([("classifier", "a.b=1")], "classifier: key=value, a key without `.` or a leading `$`"),
        ([("classifier", "k=1")] * 11, "classifier: at most 10"),
        ([("since", "nan")], "since: Unix seconds, a finite number"),
        ([("until", "inf")], "until: Unix seconds, a finite number"),
        ([("until", "soon")], "until: Unix seconds, a finite number"),
        (
            [("state", "aborted")],
            "state: a state or either half of one (e.g. ABORTED, SCAN_HAS_FINAL_RESULT)",
        ),
        ([("state", "A")] * 11, "state: a state or either half of one (e.g. ABORTED, SCAN_HAS_FINAL_RESULT)"),
        ([("state", "A" * 65)], "state: a state or either half of one (e.g. ABORTED, SCAN_HAS_FINAL_RESULT)"),
        ([("archived", "yes")], "archived: true or false"),
        ([("deleted", "1")], "deleted: true or false"),
        ([("before", "")], "before: a scan id"),
        ([("before", "x" * 254)], "before: a scan id"),
    ],
)
def test_what_the_table_refuses(pairs: list[tuple[str, str]], reason: str) -> None:
    with pytest.raises(ApiError) as refused:
        table_ask(q(*pairs))
    assert (refused.value.status, refused.value.reason) == (400, reason)
    known = "Known: archived, before, classifier, deleted, event_id, limit, run_id, since, state, until."
    expected = known if reason.startswith("unknown") else f"The request was rejected: {reason}"
    assert refused.value.message == expected
