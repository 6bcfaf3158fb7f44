"""accum's Python client: submit and follow training jobs over the accum HTTP API.

    from accum import AccumClient, AccumAPIError

    with AccumClient("http://127.0.0.1:8000", token) as client:
        job = client.submit(spec)
        for event, data in client.stream_events(job["id"]):
            ...

The server itself lives in the ``services`` package and the trainer in ``accumcore``; this
package needs only httpx, so a notebook or a CI script can import it without either.
"""

from __future__ import annotations

from accum.client import AccumAPIError, AccumClient, __version__, parse_sse

__all__ = ["AccumAPIError", "AccumClient", "__version__", "parse_sse"]
