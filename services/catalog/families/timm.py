"""`timm:<name>`: any timm model (torch-free: the name and options checked here, the model
built by `own_models.build_timm`, which also refuses a name timm does not know).

Options are a typed allow-list: the audit of 2026-11 (issue 25) found free `timm:` options
passed to `timm.create_model`, so `checkpoint_path` loaded any file the worker could read
(another owner's cached checkpoint, `/etc/passwd` quoted in the job's error). A key not listed
here is refused at submit (422 at `model.<key>`, the accepted options listed) and again on the
worker, which parses the stored spec through the same checks. Weights of another job come only
through `init_from`, which checks the owner.
"""

from __future__ import annotations

import re
from typing import Any

from services.catalog.entries import ModelInfo, NameRefused, namespace_family
from services.catalog.option_types import Option, check_model_options

MAX_IMAGE_SIDE = 4096
FRACTION = Option("number", 0, 1)

TIMM_OPTIONS: dict[str, Option] = {
    "pretrained": Option("boolean"),
    "weights": Option("data_file"),  # checked against the data roots: JobSpec.local_paths
    "drop_rate": FRACTION,
    "drop_path_rate": FRACTION,
    "global_pool": Option("choice", choices=("avg", "max", "avgmax", "catavgmax", "token")),
    "img_size": Option("integer", 1, MAX_IMAGE_SIDE),
}
DESCRIPTION = (
    "timm:<name>: any timm model (timm.list_models()), randomly initialised; pretrained: true "
    "loads the node's cached weights or `weights` (a file under a data root); options: "
    f"{', '.join(TIMM_OPTIONS)}"
)
_TIMM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


def find(name: str) -> ModelInfo:
    rest = name.partition(":")[2]
    if not _TIMM_NAME.fullmatch(rest):
        raise NameRefused(" (a timm name is letters, digits, '_', '.', '-')")
    return ModelInfo(name=name, description=f"timm model {rest}", task="classification",
                     source="timm", options=tuple(TIMM_OPTIONS))


def configure(info: ModelInfo, options: dict[str, Any]) -> ModelInfo:
    check_model_options(info.name, options, TIMM_OPTIONS)
    return info


FAMILY = namespace_family(
    "timm", description=DESCRIPTION, options=TIMM_OPTIONS, patterns=("timm:<name>",), find=find,
    configure=configure, builder="services.catalog.builders.own_models:build_timm",
)
