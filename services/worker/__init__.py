"""accum's Celery GPU worker: turns queued jobs into trained models.

Start one with ``accum worker --queues default`` or ``python -m services.worker --queues
default``. The API never imports this package: what both need (broker configuration, the
enqueue path, the lease reaper) lives in ``services.dispatch``. Torch is imported by the
attempt's training modules, which ``runner.train`` loads when a job starts.
"""
