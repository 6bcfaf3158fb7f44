"""Typed option allow-lists for the model families that take free keyword options (torch-free).

    DROP = Option("number", 0, 1)
    check_declared("model 'timm:resnet18'", {"drop_rate": 0.1}, {"drop_rate": DROP})   # passes
    check_declared("model 'timm:resnet18'", {"checkpoint_path": "/x"}, {...})          # OptionError

The options of `timm:`, `hf:` and plugin models reach library calls as keyword arguments
(`timm.create_model`, a transformers config, a plugin's function); several of those name files
(timm's `checkpoint_path`, `pretrained_cfg_overlay`), so an unknown key is refused, never passed
on (an allow-list, not a deny-list). No declared type is a free string: the one option that names
a file (`weights`, type `data_file`) is an absolute path the API and the worker check against
the data roots (`JobSpec.local_paths`). A plugin declares its own options in the same shape
(`services.catalog.families.plugins.declared_options`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

OptionType = Literal["integer", "number", "boolean", "choice", "data_file"]
OPTION_TYPES: tuple[OptionType, ...] = ("integer", "number", "boolean", "choice", "data_file")


class OptionError(ValueError):
    """An option refused: `key` is the option's name (the field under the model), `unknown`
    whether the name itself is not accepted, `allowed` what would be (the option names for an
    unknown key, the values of a choice)."""

    def __init__(self, key: str, message: str, allowed: list[Any] | None = None, unknown: bool = False) -> None:
        super().__init__(message)
        self.key = key
        self.allowed = allowed
        self.unknown = unknown


@dataclass(frozen=True)
class Option:
    """One accepted option: its type and, for numbers, inclusive bounds; for a choice, the values."""

    type: OptionType
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        """What the option takes, for a refusal and the catalog listing: `integer 1..4096`."""
        if self.type == "choice":
            return f"one of {', '.join(repr(c) for c in self.choices)}"
        if self.type == "data_file":
            return "an absolute path to a file inside a data root"
        if self.type == "boolean":
            return "true or false"
        if self.type in ("integer", "number") and self.low is not None and self.high is not None:
            return f"{self.type} {_number(self.low)}..{_number(self.high)}"
        return self.type

    def accepts(self, value: Any) -> bool:
        if self.type == "boolean":
            return isinstance(value, bool)
        if self.type == "choice":
            return isinstance(value, str) and value in self.choices
        if self.type == "data_file":
            return isinstance(value, str) and value.startswith("/")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.type == "integer" and not isinstance(value, int):
            return False
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)


def _grouped(declared: Mapping[str, Option]) -> str:
    """`integer 1..4096: a, b; true or false: c`: the names grouped by what they take."""
    groups: dict[str, list[str]] = {}
    for name, option in declared.items():
        groups.setdefault(option.describe(), []).append(name)
    return "; ".join(f"{kind}: {', '.join(names)}" for kind, names in groups.items()) or "none"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def check_declared(owner: str, options: Mapping[str, Any], declared: Mapping[str, Option]) -> None:
    """Raise OptionError for the first option of `options` that `declared` does not accept:
    an unknown name (listing every accepted one with its type), or a value of the wrong type
    or out of bounds (naming the type and bounds)."""
    for key in sorted(options):
        option = declared.get(key)
        if option is None:
            close = difflib.get_close_matches(key, list(declared), n=3)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise OptionError(key, f"{owner} does not accept option {key!r}{hint}; accepted options: "
                              f"{_grouped(declared)}", list(declared), unknown=True)
        if not option.accepts(options[key]):
            raise OptionError(key, f"{owner} option {key} must be {option.describe()}; got {options[key]!r}",
                              list(option.choices) or None)


def from_declaration(where: str, raw: Any) -> dict[str, Option]:
    """A plugin's declaration `{"hidden": {"type": "integer", "minimum": 1, "maximum": 4096}}`
    as Options; ValueError naming `where` (the entry point) when it is malformed. `data_file`
    is not offered to plugins: a plugin that reads files takes them under its dataset's data_root."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: an option declaration is a mapping of option name -> {{'type': ...}}")
    declared = {}
    for name, spec in raw.items():
        kind = spec.get("type") if isinstance(spec, Mapping) else None
        if not isinstance(name, str) or kind not in OPTION_TYPES or kind == "data_file":
            raise ValueError(f"{where}: option {name!r} needs a type of: integer, number, boolean, choice")
        choices = tuple(spec.get("choices", ()))
        if kind == "choice" and (not choices or not all(isinstance(c, str) for c in choices)):
            raise ValueError(f"{where}: choice option {name!r} needs choices, a list of strings")
        declared[name] = Option(kind, spec.get("minimum"), spec.get("maximum"), choices)
    return declared


def undeclared(kind: str, name: str, options: Mapping[str, Any], accepted: tuple[str, ...]) -> str | None:
    """None when every key of `options` is in `accepted`, else the reason naming what is."""
    unknown = sorted(set(options) - set(accepted))
    if not unknown:
        return None
    shown = ", ".join(accepted) if accepted else "none"
    return f"{kind} {name!r} does not accept option(s) {', '.join(unknown)}; accepted options: {shown}"


def integer_in(kind: str, name: str, key: str, value: Any, low: int, high: int) -> int:
    """`value` when it is an integer from `low` to `high`, else ValueError naming both."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{kind} {name!r} option {key} must be an integer from {low} to {high}; got {value!r}")
    return value


def check_model_options(name: str, options: Mapping[str, Any], declared: Mapping[str, Option]) -> None:
    """The typed check of a `timm:`, `hf:` or plugin model's options; `weights` (a file)
    only with `pretrained: true`."""
    check_declared(f"model {name!r}", options, declared)
    if "weights" in options and options.get("pretrained") is not True:
        raise OptionError("weights", f"model {name!r} option weights needs pretrained: true")
