"""Every rank draws a tqdm-like progress bar (`\r` redraws, no newline: the bar is unfinished), then rank 1 exits
with status 3 while rank 0 waits: the supervisor's lines that follow must each start a line of the log."""

import os
import sys
import time

for percent in (10, 45):
    sys.stderr.write(f"\r{percent:3d}%|{'#' * (percent // 10)}")
    sys.stderr.flush()
if os.environ.get("RANK") == "1":
    sys.exit(3)
time.sleep(60)
