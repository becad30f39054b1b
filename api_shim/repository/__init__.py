"""The scans repository: where every scan is, and how it is read and changed there (`Scans`).

Its parts are private to it: `scans` (the repository), `writes` (the write sequences it makes),
`cache` (the watch-backed live copy), `store` (Scan writes with conflict retries), `freshness`
(read-your-writes across replicas), `versions` (the Scan versions a request wrote), `encoded` (REST
forms kept per version), `sharing` (one run of concurrent identical work), `listing` (a LIST's items
decoded one at a time), `table` (the dashboard's pages of scans, newest first).
"""

from api_shim.repository.encoded import Form, Kept
from api_shim.repository.scans import Scans, WatchFigures
from api_shim.repository.store import Obj
from api_shim.repository.table import TableAsk, TablePage
from api_shim.repository.writes import ScanWrites

__all__ = ["Form", "Kept", "Obj", "ScanWrites", "Scans", "TableAsk", "TablePage", "WatchFigures"]
