"""An offline stand-in for `seaborn` (not installed here), on the PYTHONPATH of the corpus scripts that import it
(manifest `standins`): `lmplot` as a plain matplotlib scatter of the frame's x/y columns, one colour per `hue`,
returning an object whose `savefig` writes the figure (the only use the corpus makes of it)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


class _Grid:
    def __init__(self, figure):
        self.figure = figure

    def savefig(self, path, **kwargs):
        self.figure.savefig(path, **kwargs)
        plt.close(self.figure)


def lmplot(x, y, data, hue=None, **kwargs):
    figure, axes = plt.subplots()
    groups = data.groupby(hue) if hue else [(None, data)]
    for _, group in groups:
        axes.scatter(group[x], group[y], s=4)
    return _Grid(figure)
