"""accum's Python client: submit and follow training jobs over the accum HTTP API.

    from accum import AccumClient, AccumAPIError

    with AccumClient("http://127.0.0.1:8000", token) as client:
        job = client.submit(spec)
        for event, data in client.stream_events(job["id"]):
            ...

The server itself lives in the ``services`` package and the trainer in ``accumcore``; this
package needs only httpx (and PyYAML for spec files), so a notebook or a CI script can import it without either.
"""

from __future__ import annotations

from accum.client import AccumAPIError, AccumClient, __version__, parse_sse
from accum.spec_file import SpecFileError, parse_yaml, read_spec

__all__ = [
    "AccumAPIError", "AccumClient", "SpecFileError", "__version__", "parse_sse", "parse_yaml",
    "read_spec",
]
