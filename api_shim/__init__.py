"""The Skyscan REST shim: the scan service's REST interface, served from Scan custom resources.

Run it with `skyscan-shim serve` (configuration: `SKYSCAN_*` variables, see `settings.py`); make a
local bearer token with `skyscan-shim make-token --file tokens.json --name me --roles user,system`.

Its layers, each importing only those below it (import-linter holds them, `pyproject.toml`):
- `app`: the factory, the guard around every route (auth, roles, confinement, redirects), the CLI;
- `access` (the access log) and `routes` (the route table, the interface's and the reference's paths);
- `handlers/`: one module per resource, parsing a request and answering it;
- `metrics` (Prometheus) and `openapi` (the document, from the routes and the models);
- `plumbing`: the Shim's state, `Route`, request parsing, kept forms, answers;
- `repository/`: the scans repository, closed; only `Scans` (and its value types) leave it;
- `scanner_auth`: the scanners' per-scan credentials;
- `auth` (who is calling), `bodies` (request bodies, held and bounded), `launch` (POST /scan
  normalisation, pure), `settings` (`SKYSCAN_*`);
- `find/`: `/scans/find`, from the parsed filter to the answer's bytes;
- `errors` (error bodies), `oidc` (bearer JWTs), `rest_models` (REST request and response models),
  `sizes` (data sizes as the reference parses them), `view` (REST views of a Scan, pure);
- `wire_names`: the reference's names beside the interface's.
"""

import sys

# httpx's package import loads its command-line client (rich, click, pygments: ~50 ms of the shim's
# cold start) unless that fails; the shim (the OIDC discovery client) never runs it.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "not importable"
