"""What a project's `load_dataset` returns when the plan builds its model: local files read into memory, never the
`datasets` machinery (no cache under HF_HOME, no progress bars, no download).

A template's model depends on its data only through the labels (the classifier head) and, for text without a
pretrained tokenizer, the words of the training texts (the vocabulary). The plan swaps the project module's
`load_dataset` for `load_in_memory` while it builds the model, so the template's own code (its split, its checks,
its label and tokenizer functions) runs on the same rows, and its model has the same shape as in training. A data
set on the Hugging Face Hub is refused: the plan never downloads data.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError

SPLITS = ("train", "validation", "test")
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def load_in_memory(path: str, name: str | None = None, *, data_files: Any = None, data_dir: str | None = None,
                   **_: Any):
    from datasets import DatasetDict

    if path in ("csv", "json") and data_files:
        files = data_files if isinstance(data_files, dict) else {"train": data_files}
        return DatasetDict({split: _table(path, Path(str(file))) for split, file in files.items()})
    if path == "imagefolder" and data_dir:
        return _image_folder(Path(data_dir))
    raise AccelkitError(f"the project's data set `{path}` is not local files, and the plan does not download or "
                        "load data sets", hint="plan the model from its config.json instead, or point the project's "
                                               "default data at local files")


def _table(kind: str, file: Path):
    from datasets import Dataset

    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise AccelkitError(f"cannot read the project's data file {file}: {exc.strerror}",
                            hint="fix the path in the project's defaults, or plan from the model's config.json") \
            from None
    if kind == "csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        stripped = text.lstrip()
        rows = json.loads(stripped) if stripped.startswith("[") else \
            [json.loads(line) for line in text.splitlines() if line.strip()]
    columns = list(rows[0]) if rows else []
    return Dataset.from_dict({c: [row.get(c) for row in rows] for c in columns})


def _image_folder(root: Path):
    """Image paths and class labels of an `imagefolder` layout (split/class/image or class/image); no image is
    decoded."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    splits = {s: root / s for s in SPLITS if (root / s).is_dir()} or {"train": root}
    classes = sorted({c.name for folder in splits.values() for c in folder.iterdir() if c.is_dir()})
    features = Features({"image": Value("string"), "label": ClassLabel(names=classes)})
    out = {}
    for split, folder in splits.items():
        images = [(str(f), classes.index(c.name)) for c in sorted(folder.iterdir()) if c.is_dir()
                  for f in sorted(c.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES]
        out[split] = Dataset.from_dict({"image": [p for p, _ in images], "label": [label for _, label in images]},
                                       features=features)
    return DatasetDict(out)
