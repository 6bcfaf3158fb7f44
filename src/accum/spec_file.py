"""Job specs from YAML or JSON: the one reader the CLI and the client share.

PyYAML follows YAML 1.1, where a float needs a dot: `lr: 3e-4` and `steps: 1e5` come back as
strings and the API refuses them ("Input should be a valid number"). People write numbers the
way YAML 1.2 (and the dashboard's js-yaml) reads them, so this loader does too.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

SPEC_SUFFIXES = (".yaml", ".yml", ".json")

# YAML 1.2 core schema floats: `3e-4`, `1e5`, `.5`, `1.`, `-2.5E+3` (an exponent needs no dot).
_FLOAT_1_2 = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")


class SpecLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that also reads YAML 1.2's float forms as floats."""


# Integers keep their resolver (added first, checked first): `8` stays an int.
SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_1_2, list("-+.0123456789"))


class SpecFileError(ValueError):
    """A spec file that cannot be read or parsed; the message names the file and the fix."""


def parse_yaml(text: str) -> Any:
    """YAML text as Python values, every number written in it a number."""
    return yaml.load(text, Loader=SpecLoader)  # noqa: S506 - SpecLoader is a SafeLoader


# What usually causes PyYAML's commonest complaints, said as the fix.
_YAML_FIXES = {
    "mapping values are not allowed here": "check the indentation",
    "a tab cannot": "indent with spaces",
    "could not find expected ':'": "write `field: value`",
}
# PyYAML's names of what a problem was inside, in the words of the text a person wrote.
_OPENED = {"flow sequence": "[ list", "flow mapping": "{ mapping", "quoted scalar": "quote",
           "block collection": "indented block", "block mapping": "indented block"}


def yaml_problem(exc: yaml.YAMLError, source: str) -> str:
    """`spec.yaml:3:19: mapping values are not allowed here; check the indentation`: where
    and what, as compilers say it (not PyYAML's `in "<unicode string>"` and excerpt)."""
    mark = getattr(exc, "problem_mark", None)
    problem = str(getattr(exc, "problem", None) or str(exc).splitlines()[0])
    problem = problem.replace("found character '\\t' that cannot start any token",
                              "a tab cannot start a line's text")
    fix = next((f for text, f in _YAML_FIXES.items() if text in problem), None)
    opened, context = getattr(exc, "context_mark", None), str(getattr(exc, "context", "") or "")
    inside = next((words for name, words in _OPENED.items() if name in context), None)
    if not fix and inside and opened is not None:
        fix = f"the {inside} opened at line {opened.line + 1}"
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
    return f"{where}: invalid YAML: {problem}" + (f"; {fix}" if fix else "")


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_variables(text: str, source: str) -> str:
    """`${NAME}` replaced by the environment variable's value, as docker compose reads its
    files (a bare `$` stays as written): a spec can name a folder of this machine
    (`data_root: ${PWD}/.accum/data/corpus`, examples/run_examples.py). An unset one is an error."""
    def value(match: re.Match[str]) -> str:
        name = match[1]
        found = os.environ.get(name, os.getcwd() if name == "PWD" else None)
        if found is None:
            raise SpecFileError(f"spec file {source} uses ${{{name}}}, which is not set: export it "
                                "(examples/run_examples.py sets the examples' own)")
        return found

    return _VARIABLE.sub(value, text)


def parse_spec_text(text: str, source: str, suffix: str = ".yaml") -> dict[str, Any]:
    """A spec mapping from JSON (`suffix` ".json") or YAML text; `source` names it in errors;
    `${NAME}` is the environment variable's value (`expand_variables`)."""
    text = expand_variables(text, source)
    try:
        spec = json.loads(text) if suffix == ".json" else parse_yaml(text)
    except yaml.YAMLError as exc:
        raise SpecFileError(yaml_problem(exc, source)) from exc
    except ValueError as exc:
        raise SpecFileError(f"spec file {source} is not valid {suffix[1:].upper()}: {exc}") from exc
    if not isinstance(spec, dict):
        raise SpecFileError(
            f"spec file {source} must hold a mapping of fields, not {type(spec).__name__}"
        )
    return spec


def read_spec(path: str | Path) -> dict[str, Any]:
    """A job spec from a .yaml, .yml or .json file."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in SPEC_SUFFIXES:
        raise SpecFileError(f"spec file {path} must end in .yaml, .yml or .json")
    try:
        text = file.read_text()
    except OSError as exc:
        raise SpecFileError(f"cannot read spec file {path}: {exc.strerror}") from exc
    return parse_spec_text(text, str(path), suffix)
