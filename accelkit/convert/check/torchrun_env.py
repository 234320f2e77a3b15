"""Whether an original is a torchrun-style script (it can only start under a launcher's environment), and the
environment of a 1-process torchrun that `--check` runs such an original in.

A script that reads `os.environ["LOCAL_RANK"]` with no fallback, or makes its process group from the environment
(`init_process_group("gloo")`: no rank, world size, init_method or store), stops on a plain `python script.py`
(KeyError 'LOCAL_RANK'; "environment variable RANK expected"). `torchrun --nproc-per-node 1` runs it: RANK=0,
LOCAL_RANK=0, WORLD_SIZE=1 and a rendezvous address. A script that also looks for the variables itself
(`os.environ.get("RANK", -1)`, `"RANK" in os.environ`), as nanoGPT does, has a single-process path of its own:
it runs as it is, and is given no launcher's environment (which would send it down its multi-GPU branch).
"""

from __future__ import annotations

import ast
import socket

LAUNCHER_VARS = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                           "MASTER_ADDR", "MASTER_PORT"})
ENV_GROUP_KEYWORDS = frozenset({"rank", "world_size", "init_method", "store"})  # any of them: not env://


def needs_launcher(source: str) -> bool:
    """True when the script reads the launcher's environment (or makes its group from it) with no fallback."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    required = looked_for = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            required |= _constant(node.slice) in LAUNCHER_VARS
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name.endswith("init_process_group") and not any(k.arg in ENV_GROUP_KEYWORDS for k in node.keywords) \
                    and len(node.args) < 2:  # positional: backend, then init_method
                required = True
            elif (name.endswith("environ.get") or name.endswith("getenv")) and node.args \
                    and _constant(node.args[0]) in LAUNCHER_VARS:
                looked_for = True  # a default, or a value tested for None: the script's own fallback
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and _constant(node.left) in LAUNCHER_VARS and any(_is_environ(c) for c in node.comparators):
            looked_for = True
    return required and not looked_for


def one_process_env() -> dict[str, str]:
    """What `torchrun --nproc-per-node 1` gives its one worker (a free local port for the rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
            "NODE_RANK": "0", "ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def _is_environ(node: ast.AST) -> bool:
    return _dotted(node) in {"os.environ", "environ"}


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _constant(node: ast.AST) -> object:
    return node.value if isinstance(node, ast.Constant) else None
