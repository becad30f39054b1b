"""The WMS (EWMS) side: an async client the operator uses, and a local simulator of the service."""
