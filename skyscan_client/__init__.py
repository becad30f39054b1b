"""The scientist's side of Skyscan: a Python client for the REST interface and the `skyscan` command."""
