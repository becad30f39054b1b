"""Objects packed small (pure): pickled, then deflated against a dictionary.

The shim's Scan cache and the operator's store hold every live Scan but read few of them at a time,
so they keep each one packed and unpack a fresh copy per read. The dictionary is the first object
packed: Scans share most of their keys and many of their values, so each later one deflates to little
more than what is its own (~150 bytes for a waiting Scan, against ~1.5 KiB pickled and ~5.5 KiB as
decoded dicts). Pickle, not JSON:
only what this process packed is ever unpacked, and pickle writes three times and reads twice as fast.
Raw deflate at level 1 with an 8 KiB window and small hash tables keeps each deflate's state at ~40
KiB; the state primed with the dictionary is copied for each object rather than primed again.
"""

from __future__ import annotations

import pickle
import zlib
from typing import Any

LEVEL = 1
WINDOW_BITS = -13  # negative: raw deflate, no header or checksum
MEM_LEVEL = 4


class Packer:
    def __init__(self, also: Any = None) -> None:
        """`also`: an object like the later ones that the first may not be; its pickle joins the
        dictionary (e.g. the status most Scans come to have, where the first one packed has none)."""
        self._also = b"" if also is None else pickle.dumps(also, pickle.HIGHEST_PROTOCOL)
        self._primed: tuple[zlib._Compress, zlib._Decompress] | None = None

    def pack(self, obj: Any) -> bytes:
        pickled = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        if self._primed is None:
            zdict = pickled + self._also
            self._primed = (
                zlib.compressobj(LEVEL, zlib.DEFLATED, WINDOW_BITS, MEM_LEVEL, zdict=zdict),
                zlib.decompressobj(WINDOW_BITS, zdict=zdict),
            )
        deflate = self._primed[0].copy()
        return deflate.compress(pickled) + deflate.flush()

    def unpack(self, packed: bytes) -> Any:
        """A fresh copy of what `pack` packed (by this Packer)."""
        if self._primed is None:
            raise ValueError("nothing was packed yet")
        return pickle.loads(self._primed[1].copy().decompress(packed))
