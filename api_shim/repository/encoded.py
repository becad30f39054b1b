"""REST reads of live Scans served as bytes: each REST form of a Scan version encoded once.

A GET of a scan answers one form of it (its manifest or a projection of it, its status, its request...),
a pure function of one version of the Scan and of what its key adds: the settings a form reads are fixed
for the life of the shim, and anything else it depends on (the ids of the scan's rescans, other Scans)
is part of its key. So a form is built and encoded once per version the cache holds, and a GET of an
unchanged scan answers the kept bytes: no model validation, no view, no JSON encoding, no unpacking.

Only the version the cache holds now is ever answered: a write through this shim lands in the cache at
once (`ScanCache.observe`), so the next read builds anew (read-your-writes), and a copy that is not the
cache's (an archived scan, which a mark changes without a new resourceVersion) is never kept. The forms
of one scan live in one entry, replaced when its version moves on; entries are dropped least recently
read first beyond `BUDGET_BYTES`, so memory stays bounded whatever clients read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from api_shim.repository.cache import ScanCache
from skyscan.scan_record import ScanRecord, resource_version

Form = tuple[Hashable, ...]  # which form: its view, then whatever else it depends on
BUDGET_BYTES = 512 * 1024  # ~300 scans' manifest and status: the scans clients poll (RSS grows by about this)
FORM_OVERHEAD = 260  # bytes a kept form costs beyond its body (its key, slots, the bytes header: measured)
FORMS_PER_SCAN = 16  # projections are the client's choice: past this many, a new one is not kept


class Kept(NamedTuple):
    body: bytes
    deleted: bool  # the scan is soft-deleted (a read without include_deleted answers 404)


@dataclass
class _Entry:
    version: int
    deleted: bool
    forms: dict[Form, bytes] = field(default_factory=dict)
    size: int = 0


class EncodedForms:
    def __init__(self, cache: ScanCache, budget: int = BUDGET_BYTES) -> None:
        self._cache = cache
        self._budget = budget
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # scan name -> its current version's forms
        self._size = 0
        self.builds = 0  # forms built and kept (a read that found none): what tests and profiles count

    def get(self, name: str, form: Form, version: int | None = None) -> Kept | None:
        """The kept form of the version of `name` the cache holds now (and is `version`, when given);
        None when none is kept."""
        entry = self._entries.get(name)
        now = self._cache.version(name)
        if entry is None or entry.version != now or (version is not None and version != now):
            return None
        body = entry.forms.get(form)
        if body is None:
            return None
        self._entries.move_to_end(name)
        return Kept(body, entry.deleted)

    def put(self, scan: dict[str, Any], form: Form, body: bytes) -> None:
        """Keep `body` as `form` of `scan`, if `scan` is the version the cache holds (else it is dropped:
        an archived copy, or a version the cache has already moved past)."""
        record = ScanRecord(scan)
        if record.archived_at is None:
            self.keep(record.name, resource_version(scan), record.deleted, form, body)

    def keep(self, name: str, version: int, deleted: bool, form: Form, body: bytes) -> None:
        """Keep `body` as `form` of version `version` of `name`, if that is the version the cache holds."""
        if not version or self._cache.version(name) != version:
            return
        if len(body) > self._budget // 8:  # a manifest holding large metadata: a few would fill the budget
            return
        entry = self._entries.get(name)
        if entry is None or entry.version != version:
            self._drop(name)
            entry = self._entries[name] = _Entry(version, deleted)
        elif form in entry.forms or len(entry.forms) >= FORMS_PER_SCAN:
            return
        entry.forms[form] = body
        entry.size += len(body) + FORM_OVERHEAD
        self._size += len(body) + FORM_OVERHEAD
        self.builds += 1
        self._entries.move_to_end(name)
        while self._size > self._budget and len(self._entries) > 1:
            self._drop(next(iter(self._entries)))

    def _drop(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is not None:
            self._size -= entry.size

    @property
    def size(self) -> int:
        """Bytes accounted to the kept forms."""
        return self._size
