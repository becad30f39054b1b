"""What the dashboard may show a token (`api_shim.handlers.ui.session`, pure): a person's name, roles and
the actions the route table lets those roles take; a scanner's credential, the system or nobody refused."""

from __future__ import annotations

import pytest

from api_shim import auth
from api_shim.errors import ApiError
from api_shim.handlers.ui import session

ACTIONS = {"launch": frozenset({auth.USER}), "rescan": frozenset({auth.USER, auth.SYSTEM})}


def person(*roles: str, scan_id: str | None = None) -> auth.Identity:
    return auth.Identity("ann", frozenset(roles), scan_id=scan_id)


def test_a_person_is_told_the_actions_of_their_roles() -> None:
    assert session(person(auth.USER), ACTIONS) == {
        "name": "ann",
        "roles": ["user"],
        "may": ["launch", "rescan"],
    }
    assert session(person(auth.VIEWER), ACTIONS) == {"name": "ann", "roles": ["viewer"], "may": []}
    both = session(person(auth.VIEWER, auth.SYSTEM), ACTIONS)
    assert both == {"name": "ann", "roles": ["system", "viewer"], "may": ["rescan"]}


NOT_A_PERSON = (
    403,
    "authorization failed",
    "The dashboard is for people: this token is a scanner's, or has neither the user nor the viewer role.",
)


@pytest.mark.parametrize(
    ("who", "said"),
    [
        (None, (401, "authentication failed", "Send a valid bearer token.")),
        (person(auth.SYSTEM), NOT_A_PERSON),
        (person(), NOT_A_PERSON),
        (person(auth.USER, scan_id="s1"), NOT_A_PERSON),  # a scanner's credential, whatever its roles
    ],
)
def test_what_is_not_a_person_is_refused(who: auth.Identity | None, said: tuple[int, str, str]) -> None:
    with pytest.raises(ApiError) as refused:
        session(who, ACTIONS)
    assert (refused.value.status, refused.value.reason, refused.value.message) == said
    assert refused.value.headers == ({"WWW-Authenticate": "Bearer"} if said[0] == 401 else None)
