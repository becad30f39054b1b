"""The domain's I/O: the Kubernetes API client (`kube`; its error family and outage rule: `kube_errors`;
kubeconfigs, exec plugins, tokens and TLS: `kubeconfig`), the CRD's install (`install`), payload objects
in the cluster (`payloads`), the PostgreSQL archive of finished scans (`archive`) and its least-privilege
role (`archive_role`), and the scanner Pod's sidecar program (`sidecar`). Everything else in `skyscan`
is pure: the model, names, views and rules these and the processes build on.
"""
