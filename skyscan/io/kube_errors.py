"""What a Kubernetes API call raises: one family, `KubeError`, one case per answer a caller acts on,
and the one rule (`is_outage`) that says when the API server is away rather than refusing.

    try:
        await kube.request("DELETE", path)
    except NotFound:
        pass  # gone already

The case follows from the status however the error is made (`KubeError(404, ...)` is a `NotFound`),
so a caller never compares statuses. The outage rule is the operator's (a start attempt interrupted,
not failed; a retry) and the shim's (a 503, not a 500): an answer that says "not now" (408 Request
Timeout, 429 Too Many Requests with its priority-and-fairness queues full, 500 and 503 of an API
server whose etcd is slow or away, 502 and 504 of a proxy or load balancer in front of it), a Status
with no code (a watch cut while the API server restarts), or no answer at all (a connection refused or
cut, a timeout, a credential plugin that failed). Every other answer is `Refused`: asking again gets it
again (501 Not Implemented and the other 5xx included).
"""

from __future__ import annotations

import json

import aiohttp

OUTAGE_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})
# No answer: a connection refused or cut (aiohttp's, or an OSError below it), a timeout.
TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


class KubeError(Exception):
    """A non-2xx answer of the API server: its status, reason phrase and body. Made with any status,
    it is the case for that status (`NotFound`, `Conflict`, `Gone`, `Unavailable`, else `Refused`)."""

    def __new__(cls, status: int, reason: str = "", body: bytes = b"") -> KubeError:
        case = _case(status) if cls is KubeError else cls
        return super().__new__(case)

    def __init__(self, status: int, reason: str = "", body: bytes = b"") -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def message(self) -> str:
        """The message of the Status the API server answered with, else the body as text."""
        text = self.body.decode(errors="replace")
        try:
            found = json.loads(text)
        except ValueError:
            return text
        return str(found.get("message") or text) if isinstance(found, dict) else text

    @property
    def quota_exceeded(self) -> bool:
        """The namespace's ResourceQuota refused the write (used up, or its usage not yet counted)."""
        return self.status == 403 and "quota" in self.message.lower()


class NotFound(KubeError):
    """404: no such object (or namespace)."""


class Conflict(KubeError):
    """409: the object exists already, or changed since the resourceVersion the write named."""


class Gone(KubeError):
    """410: the resourceVersion (a watch's, a list's continue token) is too old to serve."""


class Unavailable(KubeError):
    """An answer that says "not now" (`OUTAGE_STATUSES`): asking again later may succeed."""


class Refused(KubeError):
    """Any other answer (400, 401, 403, 422, 501 ...): asking again gets it again."""


CASES: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 410: Gone}


def _case(status: int) -> type[KubeError]:
    return CASES.get(status) or (Unavailable if status in OUTAGE_STATUSES else Refused)


def is_outage(e: BaseException) -> bool:
    """The API server did not answer, or answered that it cannot now: the one rule of the operator's
    retries and the shim's 503."""
    return isinstance(e, (Unavailable, *TRANSPORT_ERRORS))
