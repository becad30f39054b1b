"""Skyscan's shared domain: what the operator and the REST shim both know about a scan.

The Scan model and its CRD, the REST state, the names Skyscan gives to things in the cluster, typed
reads of a Scan's status, the scanner's command line and the payload objects. Most modules are pure;
`kube`, `install` and `payloads` talk to the API server.
"""
