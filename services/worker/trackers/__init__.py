"""A job's runs in the experiment trackers its spec names (MLflow, TensorBoard, W&B).

    from services.worker.trackers.job import job_trackers
    callback = job_trackers(settings, sessions, attempt, spec, uploads)  # None: no trackers
    run = build_run(spec, callbacks=[store_callback, callback], ...)
    ...; callback.end("succeeded")

The training process only hands its points over (``callback``, ``handover``); a host process
of the attempt's own (``host``, started with ``spawn``: it never imports torch) delivers them,
one module per tracker (each imports its client only when a job asks for it: the
``trackers`` extra), a batching sink per tracker (``sink``). This package's own module imports
nothing, so the host imports none of the training side. The API never imports this package.
"""
