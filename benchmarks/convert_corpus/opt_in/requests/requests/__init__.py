"""An offline stand-in for `requests`, put on the PYTHONPATH of the corpus scripts that download with it
(manifest `standins`): `get(url)` serves the file named like the URL's last part from the folder in
ACCELKIT_CORPUS_OFFLINE_DIR, which materialize.py fills; any other URL is a ConnectionError. Nothing goes out."""

from __future__ import annotations

import io
import os
from pathlib import Path
from urllib.parse import urlparse


class RequestException(OSError):
    pass


class ConnectionError(RequestException):  # noqa: A001 - requests' own name
    pass


class HTTPError(RequestException):
    pass


class Response:
    def __init__(self, url: str, content: bytes) -> None:
        self.url, self.content, self.status_code, self.ok = url, content, 200, True
        self.headers = {"content-length": str(len(content))}
        self.raw = io.BytesIO(content)  # what `tarfile.open(fileobj=response.raw)` reads

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self):
        import json

        return json.loads(self.content)

    def iter_content(self, chunk_size: int = 1024):
        for start in range(0, len(self.content), chunk_size):
            yield self.content[start:start + chunk_size]

    def raise_for_status(self) -> None:
        pass

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def get(url: str, *args, **kwargs) -> Response:
    folder = Path(os.environ.get("ACCELKIT_CORPUS_OFFLINE_DIR", "/nonexistent"))
    path = folder / Path(urlparse(url).path).name
    if not path.is_file():
        raise ConnectionError(f"offline stand-in of requests: no local file for {url} (looked for {path})")
    return Response(url, path.read_bytes())
