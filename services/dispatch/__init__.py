"""Dispatch: how a job's nudge reaches a worker. Torch-free; used by the API and the worker.

- ``broker``: the Celery app's configuration (queue names, ``TASK_NAME``, long-job settings);
- ``enqueue``: ``enqueue_job(settings, job_id, queue)``, the one publish path;
- ``unsent``, ``priority``, ``redis_publish``: publishing in submit order, priorities, the Redis envelope;
- ``sqlite_transport``: the embedded SQLite broker.

The reaper and retention, which keep the house (expired leases, lost workers, old jobs), live in
``services.housekeeping``.

It never imports ``services.worker`` (the worker imports it): the API process loads no worker
code (``tests/api/test_main.py``). Import the module you need; this package imports nothing.
"""
