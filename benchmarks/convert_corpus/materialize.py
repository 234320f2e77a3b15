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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"
STANDINS = HERE / "standins"  # put on PYTHONPATH: an offline torchvision with random datasets
# stand-ins that would shadow an installed package (requests) or that few scripts need: on their PYTHONPATH only,
# named by the manifest's `standins`
OPT_IN = HERE / "opt_in"
OFFLINE_ENV = "ACCELKIT_CORPUS_OFFLINE_DIR"  # where opt_in/requests finds the files it serves for URLs
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
    env: dict[str, str] = field(default_factory=dict)  # the manifest's `env`, opt-in stand-ins on PYTHONPATH
    # the torchvision stand-in on PYTHONPATH; off for scripts that import transformers, which takes any importable
    # torchvision for the real one and imports far more of it
    torchvision: bool = True


def load_manifest() -> list[dict]:
    return json.loads(MANIFEST.read_text())["scripts"]


def _git(repo: str, *args: str) -> bytes:
    git_dir = MIRRORS / repo.replace("/", "+") / "repo"
    if (git_dir / ".git").is_dir():  # some snapshots are clones with a work tree
        git_dir = git_dir / ".git"
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
    offline = folder / "_offline"  # beside the script's tree, not in it: what the stand-ins serve as downloads
    if entry.get("data"):
        STAND_INS[entry["data"]](cwd, offline)
    env = dict(entry.get("env", {}))
    # the project's own package first (minGPT's `mingpt`, as `pip install -e .` puts it), then opt-in stand-ins
    path = [str(folder / p) for p in entry.get("pythonpath", [])]
    if entry.get("standins"):
        path += [str(OPT_IN / n) for n in entry["standins"]]
        env[OFFLINE_ENV] = str(offline)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    return Materialized(name, script, cwd, entry["args"], entry["needs"], env=env,
                        torchvision=entry.get("torchvision", True))


# -- offline stand-ins for data: small random data in the files and formats the scripts read ---------------------
def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _nanogpt(cwd: Path, offline: Path) -> None:
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


def _chars(cwd: Path, offline: Path) -> None:
    words = _words(6000)
    (cwd / "input.txt").write_text("\n".join(" ".join(words[i:i + 12]) for i in range(0, len(words), 12)) + "\n")


def _shakespeare_chars(cwd: Path, offline: Path) -> None:
    """chargpt samples from the prompt "O God, O God!" at its evaluations: its characters are in the text."""
    _chars(cwd, offline)
    with open(cwd / "input.txt", "a") as text:
        text.write("O God, O God!\n")


def _names(cwd: Path, offline: Path) -> None:
    letters = "abcdefghijklmnopqrstuvwxyz"
    rng = _rng()
    names = ["".join(letters[j] for j in rng.integers(0, 26, size=rng.integers(3, 9))) for _ in range(1500)]
    (cwd / "names.txt").write_text("\n".join(names) + "\n")


def _wikitext(cwd: Path, offline: Path) -> None:
    folder = cwd / "data" / "wikitext-2"
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 4000), ("valid", 800), ("test", 800)):
        words = _words(n)
        (folder / f"{split}.txt").write_text("\n".join(" ".join(words[i:i + 10]) for i in range(0, n, 10)) + "\n")


def _yunjey_text(cwd: Path, offline: Path) -> None:
    (cwd / "data").mkdir(exist_ok=True)
    words = _words(6000)
    (cwd / "data" / "train.txt").write_text("\n".join(" ".join(words[i:i + 10]) for i in range(0, 6000, 10)) + "\n")


def _sine(cwd: Path, offline: Path) -> None:
    import torch

    rng = _rng()
    x = np.arange(200)[None, :] + rng.integers(-80, 80, size=(12, 1))
    torch.save(np.sin(x / 20.0).astype("float64"), cwd / "traindata.pt")


def _cora_files(folder: Path, nodes: int) -> None:
    """cora.content (id, binary features, class) and cora.cites (id pairs), LINQS's tab-separated layout."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = _rng()
    ids = rng.choice(100_000, size=nodes, replace=False)
    classes = ["Theory", "Neural_Networks", "Rule_Learning"]
    rows = []
    for node in ids:
        features = rng.integers(0, 2, size=24)
        features[rng.integers(0, 24)] = 1  # no empty row
        rows.append("\t".join([str(node), *map(str, features), classes[rng.integers(0, 3)]]))
    (folder / "cora.content").write_text("\n".join(rows) + "\n")
    edges = [f"{ids[a]}\t{ids[b]}" for a, b in rng.integers(0, len(ids), size=(nodes * 3, 2)) if a != b]
    (folder / "cora.cites").write_text("\n".join(edges) + "\n")


def _cora(cwd: Path, offline: Path) -> None:
    _cora_files(cwd / "cora", 120)


def _cora_download(cwd: Path, offline: Path) -> None:
    """LINQS's cora.tgz (a `cora/` folder), served by the opt-in `requests` stand-in; 1,800 nodes because
    pytorch/examples' gcn keeps the first 1,500 of a permutation for test and validation."""
    import tarfile

    _cora_files(offline / "cora", 1800)
    with tarfile.open(offline / "cora.tgz", "w:gz") as tgz:
        tgz.add(offline / "cora", arcname="cora")


def _save_images(folder: Path, count: int, size: tuple[int, int], seed: int) -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        pixels = rng.integers(0, 256, size=(*size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:04d}.jpg")


def _bsds300(cwd: Path, offline: Path) -> None:
    """BSDS300's layout (dataset/BSDS300/images/train|test/*.jpg) with random images just over the 256-pixel crop
    pytorch/examples' super_resolution takes (the real ones are 481x321)."""
    images = cwd / "dataset" / "BSDS300" / "images"
    _save_images(images / "train", 32, (260, 260), 1)
    _save_images(images / "test", 8, (260, 260), 2)


def _style_image(cwd: Path, offline: Path) -> None:
    """A random style image (the ImageFolder content images come from the torchvision stand-in)."""
    _save_images(cwd / "data" / "images", 4, (64, 64), 3)
    from PIL import Image

    Image.fromarray(_rng().integers(0, 256, size=(64, 64, 3), dtype=np.uint8)).save(cwd / "style.jpg")


def _fineweb(cwd: Path, offline: Path) -> None:
    """build-nanogpt's edu_fineweb10B shards (uint16 GPT-2 token ids, .npy) and a HellaSwag val file of a few
    examples in its jsonl layout, so its every-250-steps evaluation at step 0 reads no download."""
    shards = cwd / "edu_fineweb10B"
    shards.mkdir(exist_ok=True)
    rng = _rng()
    for name, n in (("edufineweb_val_000000", 20_000), ("edufineweb_train_000001", 40_000),
                    ("edufineweb_train_000002", 40_000)):
        np.save(shards / f"{name}.npy", rng.integers(0, 50_257, size=n, dtype=np.uint16))
    folder = cwd / "hellaswag"
    folder.mkdir(exist_ok=True)
    lines = []
    for i in range(8):
        words = _words(40)
        lines.append(json.dumps({"ind": i, "ctx": " ".join(words[:12]), "label": int(rng.integers(0, 4)),
                                 "endings": [" ".join(words[12 + 7 * k:19 + 7 * k]) for k in range(4)],
                                 "split": "val"}))
    (folder / "hellaswag_val.jsonl").write_text("\n".join(lines) + "\n")


def _mnist_idx(cwd: Path, offline: Path) -> None:
    """MNIST's four gzipped idx files (datasets/mnist/, vinhkhuc's data_util layout) at MNIST's full counts, which
    its reader hard-codes; only the first 200 rows are random, the rest zero (a few kB gzipped)."""
    import gzip

    folder = cwd / "datasets" / "mnist"
    folder.mkdir(parents=True, exist_ok=True)
    rng = _rng()
    for prefix, count in (("train", 60_000), ("t10k", 10_000)):
        images = np.zeros((count, 28 * 28), dtype=np.uint8)
        images[:200] = rng.integers(0, 256, size=(200, 28 * 28), dtype=np.uint8)
        labels = np.zeros(count, dtype=np.uint8)
        labels[:200] = rng.integers(0, 10, size=200, dtype=np.uint8)
        header = np.array([2051, count, 28, 28], dtype=">i4").tobytes()
        (folder / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + images.tobytes(), 1))
        header = np.array([2049, count], dtype=">i4").tobytes()
        (folder / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(header + labels.tobytes(), 1))


STAND_INS = {"nanogpt": _nanogpt, "chars": _chars, "shakespeare-chars": _shakespeare_chars, "names": _names,
             "wikitext": _wikitext, "yunjey-text": _yunjey_text, "sine": _sine, "cora": _cora,
             "cora-download": _cora_download, "bsds300": _bsds300, "style-image": _style_image, "fineweb": _fineweb,
             "mnist-idx": _mnist_idx}


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
