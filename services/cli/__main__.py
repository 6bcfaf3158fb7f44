"""`python -m services.cli ...` is the same as `accum ...` (used to start child processes)."""

from services.cli.main import main

raise SystemExit(main())
