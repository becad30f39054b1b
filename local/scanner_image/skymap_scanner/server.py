"""`python -m skymap_scanner.server ARGS`: the local scanner image's server (skyscan_local.scanner_server)."""

import sys

from skyscan_local.scanner_server import main

if __name__ == "__main__":
    sys.exit(main())
