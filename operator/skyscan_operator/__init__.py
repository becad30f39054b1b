"""The Skyscan operator (`skyscan-operator`): kopf handlers feed a watch-backed store; the controller
plans each scan with the pure `planner` and carries the plan out with `apply` (Jobs, Secrets, the WMS).
"""
