"""The Skyscan REST shim: the scan service's REST interface, served from Scan custom resources.

Run it with `skyscan-shim serve` (configuration: `SKYSCAN_*` variables, see `settings.py`); make a
local bearer token with `skyscan-shim make-token --file tokens.json --name me --roles user,system`.

Modules: `app` (factory, auth/redirect guard, CLI), `routes` (the route table), `handlers/` (one
module per resource), `plumbing` (the Shim state, Route, request parsing), `writes` (multi-step write
sequences), `view` (the REST manifest and other views of a Scan, pure), `launch` (POST /scan
normalisation, pure), `models` (request/response models, error wording), `openapi`, `cache`
(list+watch of Scans), `store` (Scan writes with conflict retries), `filters` (the /scans/find
matcher), `auth`, `errors`, `sizes` (the tag catalog is the domain's: `skyscan.tags`).
"""

import sys

# httpx's package import loads its command-line client (rich, click, pygments: ~50 ms of the shim's
# cold start) unless that fails; the shim (the OIDC discovery client) never runs it.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "not importable"
