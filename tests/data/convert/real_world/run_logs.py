"""minGPT's `mingpt/utils.py` shape: a config node and the run's bookkeeping (a work folder, the command line and
the config written as files), imported by bookkeeping_helper.py and not converted."""
import json
import os
import sys


class Node:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def to_dict(self):
        return {k: v.to_dict() if isinstance(v, Node) else v for k, v in self.__dict__.items()}


def setup_logging(config):
    work_dir = config.work_dir
    os.makedirs(work_dir, exist_ok=True)
    with open(os.path.join(work_dir, "args.txt"), "w") as f:
        f.write(" ".join(sys.argv))
    with open(os.path.join(work_dir, "config.json"), "w") as f:
        f.write(json.dumps(config.to_dict(), indent=4))
