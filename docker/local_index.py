"""Serve this machine's file:// pip indexes over HTTP on loopback, for `docker build`.

    python3 docker/local_index.py 58101   # prints PIP_EXTRA_INDEX_URL's value; serves until killed

pip inside a build cannot read the host's disk, but with the host's network it reaches
127.0.0.1: each file:///ROOT/simple index named in pip's configuration (extra-index-url) is
served from ROOT on its own port (FIRST_PORT, FIRST_PORT + 1, ...), so the wheels the tests use
(torch and its CUDA libraries) are not downloaded again. Fixed ports keep the build argument,
and so Docker's layer cache, the same from run to run. Prints nothing when there is no such index.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def file_indexes() -> list[Path]:
    found = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.extra-index-url"],
                           capture_output=True, text=True, check=False).stdout.split()
    return [Path(urlsplit(url).path) for url in found if url.startswith("file://")]


def main() -> None:
    first_port = int(sys.argv[1])
    urls, servers = [], []
    for offset, index in enumerate(file_indexes()):
        handler = functools.partial(QuietHandler, directory=str(index.parent))
        server = ThreadingHTTPServer(("127.0.0.1", first_port + offset), handler)
        servers.append(server)
        urls.append(f"http://127.0.0.1:{first_port + offset}/{index.name}")
    print(" ".join(urls), flush=True)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
