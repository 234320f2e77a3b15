"""An offline stand-in for `six` (not installed here), on the PYTHONPATH of the corpus scripts that import it
(manifest `standins`): the Python 3 names behind `six.moves` that they use."""

from . import moves  # noqa: F401

PY2, PY3 = False, True
string_types, text_type, binary_type, integer_types = (str,), str, bytes, (int,)
