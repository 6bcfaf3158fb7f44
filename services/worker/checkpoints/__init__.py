"""A job's checkpoints on the worker, in one room: from the trainer's file to the next
attempt's restore.

    stores.py    the artifact store (one per process: ``artifact_store``) and the node cache
    uploads.py   ``CheckpointUploads``: staging file -> store in the background, then its row
    shards.py    ``ShardedUploads``: a sharded (FSDP) checkpoint, every rank storing its own
                 files, the row once all are stored (and a consolidated file when small)
    fetch.py     ``fetch_checkpoint``: a stored checkpoint (a file, or a sharded one's every
                 file) into the node cache
    orphans.py   objects no row lists, swept before an attempt trains
    resume.py    ``checkpoint_uploads`` (an attempt's uploader), ``prepare_resume`` (the node
                 made ready, the checkpoint fetched into the cache, sha256 checked)
    metrics.py   Prometheus instruments of the store traffic (upload, fetch, delete)

The trainer writes ``<step>.pt`` (sharded: ``<step>/``) into the staging directory (``accumcore``); the store callback
(``services.worker.callbacks``) submits it and writes its row and prunes; outages are waited out
by ``services.worker.retry``.
"""
