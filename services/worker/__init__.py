"""accum's Celery GPU worker: turns queued jobs into trained models.

Torch-free at import (the API imports ``app``, ``enqueue`` and ``reaper``); the runner and
everything that imports torch are loaded inside the task. Start one with
``accum worker --queues default`` or ``python -m services.worker --queues default``.
"""
