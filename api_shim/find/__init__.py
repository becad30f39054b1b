"""`POST /scans/find`: a MongoDB-style filter over the manifests of live and archived scans.

Layers, each importing only those below it:
- `search`: running a find (budget, slices, the live scans, the archive, the answer's bytes);
- `sql`: the archive's candidates for a parsed filter, as a SQL condition (pure);
- `index`: scans by the values at the paths finds name most, and which of those a filter needs;
- `match`: a parsed filter as a predicate over manifests, and its cost (pure);
- `query`: the filter checked and parsed once into a typed tree (pure);
- `regex`: MongoDB's `$regex` on a linear-time engine.
"""
