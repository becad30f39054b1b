"""Skyscan's local harness (never part of the product): a control plane from binaries, the local
stack, the WMS and scanner simulators and the demo. Installed by `make venv` from `local/`."""
