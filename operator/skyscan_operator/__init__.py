"""The Skyscan operator (`skyscan-operator`): kopf handlers feed a watch-backed store; the controller
plans each scan with the pure `planner` and carries the plan out with its `executor` (Jobs, Secrets, the WMS).
"""

import sys

# kopf imports kubernetes_asyncio's models whenever it can (~36 MiB of the operator's memory), only
# to recognise them in handler results; we pass plain dicts, so it stays out even where installed.
sys.modules.setdefault("kubernetes_asyncio", None)  # type: ignore[arg-type]  # None: "not importable"
# httpx's package import loads its command-line client (rich, click, pygments: ~3 MiB) unless that
# fails; the operator (the WMS client) never runs it.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
