"""Skyscan's shared domain: what the operator and the REST shim both know about a scan.

The Scan model and its CRD, the REST state, the names Skyscan gives to things in the cluster, typed
reads of a Scan's status, the scanner's command line, the payload objects, the image tag catalog and the
rules a scan request is held to (`policy`, whoever made the Scan). Most modules are pure;
`kube`, `install` and `payloads` talk to the API server.
"""
