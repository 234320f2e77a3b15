"""Both ranks print 5,000 lines at once (a file barrier in the folder given lines them up): under `python -u`
without whole-line output, about 3% of the lines glue to a line of the other rank."""
import os
import sys
import time

rank, world = os.environ.get("RANK", "0"), int(os.environ.get("WORLD_SIZE", "1"))
folder = sys.argv[1]
open(os.path.join(folder, f"ready-{rank}"), "w").close()
while len([name for name in os.listdir(folder) if name.startswith("ready-")]) < world:
    time.sleep(0.01)
for i in range(5000):
    print(f"LINE rank={rank} i={i} " + "x" * 40)
print(f"rank {rank} done", file=sys.stderr)
