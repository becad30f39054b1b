"""The REST handlers, one module per resource; `api_shim.routes` declares which route runs which.

Each handler parses the request, reads or changes scans through the repository (`Scans`, its
`ScanWrites`), and answers; auth, roles and replaced-scan redirects are applied around it by
`api_shim.app.guard`. `scan` (a scan as a whole: launch, request, rescan, read, delete, status,
logs), `manifest`, `results`, `startup` (the scanner's startup.json), `wms` (its workflow and
workers), `events` (its changes as Server-Sent Events), `find` (`POST /scans/find`, the backlog),
`service` (health, the OpenAPI document).
"""
