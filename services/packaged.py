"""Files the package ships beside its code: the Alembic migrations and the example job specs.

    from services.packaged import packaged_dir
    packaged_dir("migrations") / "env.py"
    packaged_dir("examples") / "digits_small_cnn.yaml"

In the repository they stay at the top (`migrations/`, `examples/`); pyproject's package-dir
maps them into the wheel as `services/migrations` and `services/examples`, so an installed
accum finds them inside its own package, wherever it runs from. A source tree imported
as-is (PYTHONPATH, or `make install`'s editable install) has no such folders inside
`services/`: there the top-level ones are the same files.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def packaged_dir(name: str) -> Path:
    """The shipped folder `name` ("migrations" or "examples") of this installation."""
    package = Path(str(files("services")))
    inside = package / name
    return inside if inside.is_dir() else package.parent / name
