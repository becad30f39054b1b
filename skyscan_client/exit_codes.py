"""The `skyscan` command's exit codes (docs/cli.md)."""

OK = 0
REFUSED = 1  # the service answered an error other than those below (400, 409, 413, 422, 5xx)
USAGE = 2  # bad command line (argparse's own code)
NOT_FOUND = 3  # 404: no such scan
FORBIDDEN = 4  # 401/403: the token is missing, unknown or lacks the role
UNREACHABLE = 5  # no answer from the service, or no URL/token configured
FAILED = 6  # follow: the scan ended without a final result
ABORTED = 7  # follow: the scan was aborted, deleted or replaced
NO_RESULT = 8  # result/plot: the scan has no result yet
NO_PLOT_EXTRA = 9  # plot: icecube-skyreader is not installed (pip install 'skyscan[plot]')
INTERRUPTED = 130  # Ctrl-C
