"""`six.moves`: Python 3's modules under their six names (`from six.moves import urllib`)."""

import urllib  # noqa: F401
import urllib.parse  # noqa: F401
import urllib.request  # noqa: F401
from functools import reduce  # noqa: F401

range, zip, map, input = range, zip, map, input  # noqa: A001
