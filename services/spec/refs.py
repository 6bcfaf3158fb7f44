"""Model and dataset references: a catalog name, or `{"name": ..., **options}`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails

from services import catalog
from services.catalog.option_types import OptionError
from services.spec.errors import not_allowed, spec_error
from services.spec.fields import Bool

# Options are free keys next to "name", so "extra" must be allowed here; they are then
# checked against what the catalog entry declares, so a typo still fails with its path.
_REF_CONFIG = ConfigDict(extra="allow", allow_inf_nan=False)


def _check_options(kind: str, name: str, options: Mapping[str, Any]) -> None:
    if not options:
        return
    reason = catalog.check_options(kind, name, options)
    # The catalog owns option ranges (the same checks `build_model` and `build_dataset` make).
    configured = catalog.configured_model if kind == "model" else catalog.configured_dataset
    try:
        configured(name, options)
    except OptionError as exc:  # a typed allow-list (timm:, hf:, plugins): the option's own field
        error = spec_error("unknown_option" if exc.unknown else "option_value", str(exc), exc.allowed)
        raise ValidationError.from_exception_data(
            kind, [InitErrorDetails(type=error, loc=(exc.key,), input=options.get(exc.key))]
        ) from None
    except ValueError as exc:
        if reason:
            entry = catalog.require_model(name) if kind == "model" else catalog.require_dataset(name)
            raise spec_error("unknown_option", reason, list(entry.options)) from None
        raise spec_error("option_value", str(exc)) from None


class ModelRef(BaseModel):
    """A catalog model, with the options its catalog entry declares."""

    model_config = _REF_CONFIG

    name: StrictStr

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @model_validator(mode="after")
    def _known_options(self) -> Self:
        _check_options("model", self.name, self.options)
        return self

    def normalised(self) -> dict[str, Any]:
        return {"name": self.name, **self.options}


class DatasetRef(BaseModel):
    """A catalog dataset; `data_root` (default: the worker's data directory), `download`.

    Your own data (`imagefolder`, `files`, `hf_disk`) needs its `data_root`."""

    model_config = _REF_CONFIG

    name: StrictStr
    data_root: Annotated[StrictStr, Field(min_length=1)] | None = None
    download: Bool = False

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @model_validator(mode="after")
    def _known_options(self) -> Self:
        _check_options("dataset", self.name, self.options)
        if self.data_root is None and self.name in catalog.OWN_DATASETS:
            raise spec_error(
                "missing_data_root",
                f"dataset {self.name!r} reads your data: give data_root, a directory inside an "
                "allowed data root",
            )
        return self

    def normalised(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "data_root": self.data_root,
            "download": self.download,
            **self.options,
        }


def _named(kind: str, require: Callable[[str], Any]) -> Callable[[Any], Any]:
    """Accept `"mlp"` for `{"name": "mlp"}` and reject names this node does not serve at the
    field itself, listing what it serves (`catalog.served_names`)."""

    def convert(value: Any) -> Any:
        if isinstance(value, str):
            value = {"name": value}
        if isinstance(value, Mapping) and isinstance(value.get("name"), str):
            try:
                require(value["name"])
            except ValueError as exc:
                allowed = catalog.served_names(kind)
                if ":" not in value["name"]:
                    raise not_allowed(kind, value["name"], allowed) from None
                raise spec_error("not_allowed", str(exc), allowed) from None
        return value

    return convert


Model = Annotated[
    ModelRef,
    BeforeValidator(_named("model", catalog.require_model), json_schema_input_type=str | ModelRef),
]
Dataset = Annotated[
    DatasetRef,
    BeforeValidator(_named("dataset", catalog.require_dataset), json_schema_input_type=str | DatasetRef),
]
