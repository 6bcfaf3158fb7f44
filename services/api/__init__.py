"""The accum HTTP API: FastAPI over the job store. It validates, stores, enqueues and reports; it never trains.

Run it with ``uvicorn services.api.main:app`` (or ``--factory services.api.main:create_app``).
"""
