"""Housekeeping: the reaper (expired leases, lost workers, unsent jobs) and retention (old jobs and
their artifacts), apart from dispatch (sending jobs to workers)."""
