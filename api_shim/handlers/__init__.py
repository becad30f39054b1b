"""The REST handlers, one module per resource; `api_shim.routes` declares which route runs which.

Each handler parses the request, reads Scans from the cache or calls the write sequences of
`api_shim.writes`, and answers. Auth, roles and replaced-scan redirects are applied around it by
`api_shim.app.guard`.
"""
