"""Materialize the convert corpus: each script of manifest.json, at its pinned commit, from the git mirrors that
the search tool's `fetch` brought (/work/.mirror/OWNER+NAME/repo, or ACCELKIT_CORPUS_MIRRORS), into a folder of
its own, with offline stand-ins for its data. Nothing is downloaded: a missing mirror is reported, not fetched.

    python benchmarks/convert_corpus/materialize.py OUT_DIR [NAME ...]
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"
STANDINS = HERE / "standins"  # put on PYTHONPATH: an offline torchvision with random datasets
MIRRORS = Path(os.environ.get("ACCELKIT_CORPUS_MIRRORS", "/work/.mirror"))
MAX_FILES = 400  # files copied from a script's tree at most
MAX_BYTES = 400_000


@dataclass
class Materialized:
    name: str
    script: Path | None  # None: not materialized (see `why`)
    cwd: Path | None
    args: list[str]
    needs: list[str]
    why: str = ""


def load_manifest() -> list[dict]:
    return json.loads(MANIFEST.read_text())["scripts"]


def _git(repo: str, *args: str) -> bytes:
    git_dir = MIRRORS / repo.replace("/", "+") / "repo"
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True).stdout


def materialize(entry: dict, out: Path) -> Materialized:
    name, repo, commit = entry["name"], entry["repo"], entry["commit"]
    folder = out / name
    try:
        listing = _git(repo, "ls-tree", "-r", "-l", commit, "--", entry["tree"] or ".").decode().splitlines()
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        return Materialized(name, None, None, entry["args"], entry["needs"], f"no mirror of {repo} at {commit[:10]} "
                                                                            f"({exc})")
    files = []
    for line in listing:
        meta, path = line.split("\t", 1)
        size = meta.split()[-1]
        # the code and the small files beside it (configs, `results/.gitkeep` folders the scripts write into)
        if size.isdigit() and int(size) <= MAX_BYTES and "/test" not in f"/{path}" and not path.startswith("."):
            files.append(path)
    if entry["path"] not in files:
        files.append(entry["path"])
    for path in files[:MAX_FILES] + ([entry["path"]] if entry["path"] not in files[:MAX_FILES] else []):
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        text = _git(repo, "show", f"{commit}:{path}")
        if path == entry["path"]:
            source = text.decode()
            for old, new in entry.get("patch", []):
                source = source.replace(old, new)
            text = source.encode()
        target.write_bytes(text)
    script = folder / entry["path"]
    cwd = script.parent
    if entry.get("data"):
        STAND_INS[entry["data"]](cwd)
    return Materialized(name, script, cwd, entry["args"], entry["needs"])


# -- offline stand-ins for data: small random data in the files and formats the scripts read ---------------------
def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _nanogpt(cwd: Path) -> None:
    folder = cwd / "data" / "shakespeare_char"
    folder.mkdir(parents=True, exist_ok=True)
    chars = sorted(set("abcdefghijklmnopqrstuvwxyz \n.,"))
    for split, n in (("train", 20_000), ("val", 4_000)):
        _rng().integers(0, len(chars), size=n, dtype=np.uint16).tofile(folder / f"{split}.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    (folder / "meta.pkl").write_bytes(pickle.dumps(meta))


def _words(n: int) -> list[str]:
    vocab = ["the", "model", "learns", "a", "word", "of", "data", "and", "then", "it", "trains", "on", "text"]
    return [vocab[i] for i in _rng().integers(0, len(vocab), size=n)]


def _chars(cwd: Path) -> None:
    words = _words(6000)
    (cwd / "input.txt").write_text("\n".join(" ".join(words[i:i + 12]) for i in range(0, len(words), 12)) + "\n")


def _shakespeare_chars(cwd: Path) -> None:
    """chargpt samples from the prompt "O God, O God!" at its evaluations: its characters are in the text."""
    _chars(cwd)
    with open(cwd / "input.txt", "a") as text:
        text.write("O God, O God!\n")


def _names(cwd: Path) -> None:
    letters = "abcdefghijklmnopqrstuvwxyz"
    rng = _rng()
    names = ["".join(letters[j] for j in rng.integers(0, 26, size=rng.integers(3, 9))) for _ in range(1500)]
    (cwd / "names.txt").write_text("\n".join(names) + "\n")


def _wikitext(cwd: Path) -> None:
    folder = cwd / "data" / "wikitext-2"
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 4000), ("valid", 800), ("test", 800)):
        words = _words(n)
        (folder / f"{split}.txt").write_text("\n".join(" ".join(words[i:i + 10]) for i in range(0, n, 10)) + "\n")


def _yunjey_text(cwd: Path) -> None:
    (cwd / "data").mkdir(exist_ok=True)
    words = _words(6000)
    (cwd / "data" / "train.txt").write_text("\n".join(" ".join(words[i:i + 10]) for i in range(0, 6000, 10)) + "\n")


def _sine(cwd: Path) -> None:
    import torch

    rng = _rng()
    x = np.arange(200)[None, :] + rng.integers(-80, 80, size=(12, 1))
    torch.save(np.sin(x / 20.0).astype("float64"), cwd / "traindata.pt")


def _cora(cwd: Path) -> None:
    folder = cwd / "cora"
    folder.mkdir(exist_ok=True)
    rng = _rng()
    ids = rng.choice(100_000, size=120, replace=False)
    classes = ["Theory", "Neural_Networks", "Rule_Learning"]
    rows = []
    for node in ids:
        features = rng.integers(0, 2, size=24)
        features[rng.integers(0, 24)] = 1  # no empty row
        rows.append("\t".join([str(node), *map(str, features), classes[rng.integers(0, 3)]]))
    (folder / "cora.content").write_text("\n".join(rows) + "\n")
    edges = [f"{ids[a]}\t{ids[b]}" for a, b in rng.integers(0, len(ids), size=(300, 2)) if a != b]
    (folder / "cora.cites").write_text("\n".join(edges) + "\n")


STAND_INS = {"nanogpt": _nanogpt, "chars": _chars, "shakespeare-chars": _shakespeare_chars, "names": _names,
             "wikitext": _wikitext, "yunjey-text": _yunjey_text, "sine": _sine, "cora": _cora}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    wanted = set(argv[1:])
    for entry in load_manifest():
        if wanted and entry["name"] not in wanted:
            continue
        done = materialize(entry, out)
        print(f"{done.name:28} {done.script or 'NOT MATERIALIZED: ' + done.why}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
