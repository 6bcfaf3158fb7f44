"""Admission: the ordered checks a job spec passes at submit (the API) and again at a job's
start (the worker's pre-flight); ``pipeline.py`` holds the list and the two entries,
``checks.py`` the checks, ``context.py`` what they read. Imports nothing here (torch-free, no
FastAPI): the API and the worker import ``services.admission.pipeline``."""
