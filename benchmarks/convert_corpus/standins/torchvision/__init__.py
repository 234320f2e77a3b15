"""An offline stand-in for torchvision, used only by the convert corpus benchmark (benchmarks/convert_corpus.py).

The corpus runs public training scripts without downloading anything: their datasets become small random data of
the right shapes, their transforms simple tensor functions, their model zoo small real networks. Only what the
corpus scripts use is here; it is no replacement for torchvision anywhere else.
"""

from . import datasets, models, transforms, utils  # noqa: F401

__version__ = "0.0-accelkit-standin"
