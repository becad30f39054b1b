"""`POST /scans/find`: a MongoDB-style filter over the manifests of live and archived scans. Layers,
each importing only those below: `search` runs a find; `sql` (pure) translates a parsed filter for the
archive; `index` holds scans by the values finds name most; `match` (pure) makes a filter a predicate
and costs it; `query` (pure) checks and parses the filter once; `regex` is `$regex` in linear time.
"""
