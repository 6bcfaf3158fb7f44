"""Print what `pip install accum[EXTRAS]` asks for, from pyproject.toml, one requirement a line.

    python3 docker/requirements.py pyproject.toml s3                  # the API image
    python3 docker/requirements.py pyproject.toml worker,models,s3,gpu,trackers,finetune  # the worker image

The images install these with constraints.txt in a layer of their own (kept until pyproject or
the pins change), then the wheel with --no-deps: one dependency list, pyproject's. Extras that
name accum itself (`accum[worker]`) are followed. Standard library only: it runs in the image.
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(project: dict, extras: list[str]) -> list[str]:
    wanted, seen, pending = list(project["dependencies"]), set(), list(extras)
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in project["optional-dependencies"][extra]:
            own = re.fullmatch(rf"{project['name']}\[([\w,\s-]+)\]", text.strip())
            if own:
                pending.extend(e.strip() for e in own.group(1).split(","))
            else:
                wanted.append(text)
    return sorted(set(wanted))


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as file:
        project = tomllib.load(file)["project"]
    extras = [e for e in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if e]
    print("\n".join(requirements(project, extras)))
