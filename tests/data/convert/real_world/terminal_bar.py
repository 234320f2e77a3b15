"""The project's own console helpers: a progress bar drawn on the terminal with sys.stdout, with its own timing state
(read by nothing else), and a log helper that also appends to a file (not only printing)."""
import sys
import time

BAR = 30
last_tick = time.time()
started = last_tick


def elapsed(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    return "%dm%02ds" % (minutes, seconds) if minutes else "%ds" % seconds


def draw_bar(current, total, msg=None):
    global last_tick, started
    if current == 0:
        started = time.time()
    done = int(BAR * (current + 1) / total)
    parts = [" [", "=" * done, "." * (BAR - done), "]"]
    now = time.time()
    parts.append(" step %s | total %s" % (elapsed(now - last_tick), elapsed(now - started)))
    last_tick = now
    if msg:
        parts.append(" | " + msg)
    sys.stdout.write("".join(parts))
    sys.stdout.write("\r" if current < total - 1 else "\n")
    sys.stdout.flush()


def log_to_file(line, path="train_log.txt"):
    print(line)
    with open(path, "a") as f:
        f.write(line + "\n")
