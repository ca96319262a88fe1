"""Read a policy file: YAML -> ``GPUPolicy``, with errors that name file, line and field.

A platform engineer who mistypes a field must learn where and how to fix it, so every
failure (unreadable file, YAML syntax, schema) becomes a :class:`PolicyError` listing
``file:line: spec.tenants[0].quota.gpus: <what is wrong>`` entries.

YAML anchors and aliases are refused outright: a policy never needs them, and refusing
them is the simplest complete defence against alias-expansion ("billion laughs") files.
Explicit ``!!tags`` are refused for the same reason (their constructors fail with
arbitrary exceptions), and nesting is capped: PyYAML composes and constructs nodes
recursively, and a file of ``[[[[...`` would otherwise end in a RecursionError rather
than a located error.

A key given twice in one mapping is an error naming both lines: PyYAML keeps the last
one silently, so a ``mode: warn`` dedented by one level from a tenant to ``spec`` would
turn the whole policy to warn with ``policy check`` saying ok.

Errors speak the product's language, not the parsers': a YAML syntax error says what is
wrong with the line (indentation, a tab, an unclosed bracket or quote) from what PyYAML's
error carries (its problem and marks), with the line's text; a schema error says what the
field must be ("must be a list, e.g. [a, b]"), not pydantic's "Input should be a valid
list". Fields are camelCase only, as the docs write them: a snake_case key is refused
with its camelCase name, and an unknown key gets the closest known one ("did you mean").
"""

from __future__ import annotations

import contextlib
import difflib
import types
import typing
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from webhook.policy import model
from webhook.policy.model import API_VERSION, KIND, FieldProblem, GPUPolicy, core, kinds


def default_policy_text() -> str:
    """The example multi-tenant policy shipped inside the package (what `serve`, `review`
    and `manifests` use when no policy file is given)."""
    return (resources.files("webhook") / "defaults" / "policy.yaml").read_text("utf-8")


MAX_POLICY_BYTES = 1 << 20  # a generous policy is tens of KiB; a bigger file is a mistake
MAX_DEPTH = 64  # a policy nests about 8 levels deep

# What the schema's name patterns mean, in words: pydantic would print the regex.
_PATTERN_WORDS = {
    core._DNS_LABEL: "must be a DNS label: lowercase letters, digits and '-', "
                     "starting and ending with a letter or digit (e.g. team-a)",
    core._QUALIFIED: "must be a Kubernetes qualified name, optionally with a DNS prefix "
                     "(e.g. nvidia.com/gpu.product)",
    core._RESOURCE_PATTERN: "must be a resource name or a pattern with * "
                            "(e.g. nvidia.com/mig-*)",
    core._SERVICE_ACCOUNT: "must be namespace/name of a service account "
                           "(e.g. gpu-operator/nvidia-device-plugin)",
    kinds._POINTER: "must be a JSON Pointer into the object, starting with / "
                    "(e.g. /spec/template)",
}
_SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a policy file."""

    path: str  # dotted field path, e.g. spec.tenants[0].quota.gpus ("" for the file)
    line: int | None
    message: str

    def render(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        field = f" {self.path}:" if self.path else ""
        return f"{where}:{field} {self.message}"


class PolicyError(Exception):
    """A policy file that cannot be used, with every problem found in it."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(p.render(source) for p in problems))


class _NoAliasLoader(yaml.SafeLoader):
    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.MarkedYAMLError(
                None, None, "YAML aliases (*name) are not allowed in a policy file; "
                "write the value out", event.start_mark,
            )
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if getattr(event, "tag", None) not in (None, "!"):
            # Explicit tags (!!binary, !!python/..., !!timestamp x) reach constructors that
            # fail with arbitrary exceptions; plain YAML types are all a policy uses.
            raise yaml.MarkedYAMLError(
                None, None, f"YAML tags ({event.tag}) are not allowed in a policy file",
                event.start_mark,
            )
        if self._depth >= MAX_DEPTH:
            raise yaml.MarkedYAMLError(
                None, None, f"nested more than {MAX_DEPTH} levels deep; a policy never is",
                event.start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_file(path: str | Path) -> GPUPolicy:
    """Load and validate the policy at ``path``; raise PolicyError with located problems."""
    return load_text(read_file(path), str(path))


def read_file(path: str | Path) -> str:
    """The text of a policy (or policy test) file, size-capped; PolicyError if unusable."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_POLICY_BYTES + 1)
    except OSError as exc:
        raise PolicyError(
            source, [Problem("", None, f"cannot read the file: {exc.strerror}")]) from None
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyError(
            source, [Problem("", None, f"file is larger than {MAX_POLICY_BYTES} bytes")]
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(
            source, [Problem("", None, f"not UTF-8 text ({exc.reason})")]) from None
    return text


def load_text(text: str, source: str = "<policy>") -> GPUPolicy:
    """Validate policy YAML given as text."""
    return load_document(text, source, GPUPolicy, KIND)


Model = TypeVar("Model", bound=BaseModel)


def load_document(text: str, source: str, model: type[Model], kind: str) -> Model:
    """One YAML document validated as ``model`` (whose ``apiVersion`` is API_VERSION and
    ``kind`` is ``kind``), with every problem located; shared by the policy and the
    policy test suites (``webhook.tools.policysuite``)."""
    try:
        docs = [d for d in yaml.compose_all(text, Loader=_NoAliasLoader) if not _empty(d)]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise PolicyError(source, [Problem("", line, _syntax(exc, text))]) from None
    except yaml.YAMLError as exc:
        raise PolicyError(source, [Problem("", None, f"YAML syntax: {exc}")]) from None
    if not docs:
        raise PolicyError(source, [Problem("", None, "the file is empty; "
                                           f"expected a {kind} document")])
    if len(docs) > 1:
        raise PolicyError(source, [Problem("", docs[1].start_mark.line + 1,
                                           f"one {'policy' if kind == KIND else kind} per file: "
                                           "split the documents")])
    node = docs[0]
    duplicates = _duplicate_keys(node, [])
    if duplicates:
        raise PolicyError(source, duplicates)
    try:
        raw = yaml.SafeLoader(text).construct_document(node)
    except yaml.MarkedYAMLError as exc:  # an unknown !!tag, an unhashable key, ...
        mark = exc.problem_mark or exc.context_mark
        raise PolicyError(source, [Problem("", mark.line + 1 if mark else None,
                                           f"YAML: {exc.problem or exc.context}")]) from None
    except (yaml.YAMLError, ValueError, OverflowError) as exc:  # 2024-13-45 as a date, ...
        raise PolicyError(source, [Problem("", None, f"YAML: {exc}")]) from None
    if not isinstance(raw, dict):
        raise PolicyError(source, [Problem("", node.start_mark.line + 1,
                                           f"expected a mapping with apiVersion: {API_VERSION}, "
                                           f"kind: {kind}")])
    try:
        # By alias only: the YAML is camelCase, as the docs write it. A snake_case key
        # (the Python name) is an unknown field, told its camelCase spelling.
        return model.model_validate(raw, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise PolicyError(source, [_problem(e, node, model) for e in exc.errors()]) from None


def _syntax(exc: yaml.MarkedYAMLError, text: str) -> str:
    """A YAML syntax error in words, from what PyYAML's error carries: its problem
    ("expected <block end>, but found '?'"), where it was found and, for an unclosed
    bracket or quote, where that began. The offending line is quoted."""
    problem = exc.problem or exc.context or ""
    mark, start = exc.problem_mark, exc.context_mark
    opened = f" at line {start.line + 1}" if start is not None else ""
    if problem.startswith("expected <block end>") or problem.startswith(
            "expected <block mapping start>"):
        hint = ("this line is indented differently from the lines before it: the keys of "
                "one mapping, and the items of one list, must start in the same column. "
                "Line it up with the key it sits beside, or indent it under the one it "
                "belongs to")
    elif problem == "mapping values are not allowed here":
        hint = ("a ':' where no key can start: the line is indented deeper than the key "
                "before it (line it up), or a value holds ': ' (quote the value)")
    elif "'\\t'" in problem:  # PyYAML writes the tab escaped
        hint = "a tab indents this line; YAML indents with spaces only: use spaces"
    elif problem.startswith("expected ',' or ']'"):
        hint = f"a list opened with '['{opened} is not closed: add the ']'"
    elif problem.startswith("expected ',' or '}'"):
        hint = f"a mapping opened with '{{'{opened} is not closed: add the '}}'"
    elif "<stream end>" in problem and "flow" in (exc.context or ""):
        hint = ("a list or mapping opened with '[' or '{' is not closed before the end of "
                "the file: add the ']' or '}'")
    elif "end of stream" in problem and "quoted" in (exc.context or ""):
        hint = f"a quoted string opened{opened} is never closed: add the closing quote"
    elif problem == "could not find expected ':'":
        hint = ("a key without ':' (write key: value), or a value carried onto the next "
                "line without quotes")
    else:
        hint = (f"{problem or 'invalid YAML'}; check the indentation and quoting of this "
                "line and the one before it")
    if mark is None:
        return f"YAML syntax: {hint}"
    lines = text.splitlines()
    here = lines[mark.line].rstrip() if mark.line < len(lines) else ""
    shown = f'"{here[:80]}"' if here.strip() else "the end of the file"
    return f"YAML syntax: {hint} (column {mark.column + 1} of {shown})"


def _duplicate_keys(node: yaml.Node, loc: list[object]) -> list[Problem]:
    """Every key given more than once in the same mapping, at the line of its repeat.

    Iterative would be no safer: nesting is already capped at MAX_DEPTH while composing."""
    out: list[Problem] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if isinstance(name, str):
                line = key.start_mark.line + 1
                if name in first:
                    out.append(Problem(
                        _dotted([*loc, name]), line,
                        f"duplicate key {name!r} (first at line {first[name]}): YAML keeps "
                        "only the last one; remove one, or indent it under the mapping it "
                        "belongs to"))
                else:
                    first[name] = line
            out.extend(_duplicate_keys(value, [*loc, name if name is not None else "?"]))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out.extend(_duplicate_keys(item, [*loc, i]))
    return out


def _empty(node: yaml.Node | None) -> bool:
    """A document with nothing in it: a bare ``---`` (generated YAML often ends with one)
    composes to an empty null scalar rather than to no document."""
    return node is None or (isinstance(node, yaml.ScalarNode)
                            and node.tag == "tag:yaml.org,2002:null" and node.value == "")


# pydantic's words for a wrong type, in the schema's: what the field must be, with an
# example where one helps. Keyed by pydantic's error type.
_TYPE_WORDS = {
    "list_type": "must be a list, e.g. [a, b] (or one item per line, each after '- ')",
    "dict_type": "must be a mapping of key: value lines",
    "model_type": "must be a mapping of key: value lines",
    "model_attributes_type": "must be a mapping of key: value lines",
    "string_type": "must be a string",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "set_type": "must be a list, e.g. [a, b]",
    "frozen_set_type": "must be a list, e.g. [a, b]",
}
# ... and the bounds: pydantic's ctx names the limit.
_BOUND_WORDS = {
    "greater_than": "must be more than {gt}",
    "greater_than_equal": "must be {ge} or more",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "too_short": "must have at least {min_length} item(s)",
    "too_long": "must have at most {max_length} items",
    "string_too_short": "must be at least {min_length} character(s) long",
    "string_too_long": "must be at most {max_length} characters long",
    "string_pattern_mismatch": "must match the pattern {pattern}",
}


def _problem(error: object, root: yaml.Node, top: type[BaseModel] = GPUPolicy) -> Problem:
    assert isinstance(error, dict)
    loc = [p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, FieldProblem):
        loc.extend(cause.loc)  # point at the field to fix, not the model that checked it
    path = _dotted(loc)
    message = str(error["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    kind = error.get("type")
    value = error.get("input")
    if kind in _TYPE_WORDS:
        message = _TYPE_WORDS[str(kind)]
        if not isinstance(value, _SCALARS):
            message += f" (got {_shape(value)})"
    elif kind in _BOUND_WORDS:
        with contextlib.suppress(KeyError, IndexError):  # a ctx without the bound: as is
            message = _BOUND_WORDS[str(kind)].format(**{k: _plain(v) for k, v in ctx.items()})
    elif message.startswith("Input should be "):
        message = "must be " + message[len("Input should be "):]  # one of the choices
    if kind == "string_pattern_mismatch" and ctx.get("pattern") in _PATTERN_WORDS:
        message = _PATTERN_WORDS[ctx["pattern"]]
    if (kind not in ("value_error", "extra_forbidden", "missing")
            and isinstance(value, _SCALARS) and repr(value) not in message):
        message += f" (got {value!r})"  # the bad value, so the fix is obvious
    if kind == "extra_forbidden":
        message = _unknown_field(str(loc[-1]), _fields_at(top, loc[:-1]))
    elif kind == "literal_error" and loc == ["apiVersion"]:
        message = f"must be {API_VERSION!r} (got {error.get('input')!r})"
    elif kind == "missing":
        message = "required field is missing"
    return Problem(path, _line(root, loc), message)


def _shape(value: object) -> str:
    """What a non-scalar value is, in YAML's words."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "nothing" if value is None else type(value).__name__


def _plain(v: object) -> object:
    return int(v) if isinstance(v, float) and v == int(v) else v


def _unknown_field(key: str, known: list[str]) -> str:
    """An unknown key: its camelCase name if it is a snake_case spelling of a field, the
    right spelling if it differs only in case, else the closest known field, if any."""
    names = known or sorted(set(_field_names().values()))
    by_lower = {n.lower(): n for n in names}
    camel = to_camel(key) if "_" in key else None
    for guess in (camel, key):
        if guess is None:
            continue
        right = by_lower.get(guess.lower()) or _field_names().get(guess.lower())
        if right and right != key:
            if guess is camel:
                return (f"unknown field {key!r}: policy fields are camelCase, as in "
                        f"policies/README.md: write {right!r}")
            return f"unknown field {key!r}: did you mean {right!r}?"
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    if close:
        return f"unknown field {key!r}: did you mean {close[0]!r}?"
    return f"unknown field {key!r}: check the spelling against policies/README.md"


def _fields_at(top: type[BaseModel], loc: list[object]) -> list[str]:
    """The field names (YAML spelling) of the model at ``loc``, or [] when ``loc`` leads
    through something that is not a model (a free-form mapping)."""
    node: Any = top
    for part in loc:
        node = _unwrap(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = next((f for n, f in node.model_fields.items()
                          if (f.alias or n) == part), None)
            if field is None:
                return []
            node = field.annotation
        elif typing.get_origin(node) in (list, tuple, set, frozenset) and isinstance(part, int):
            node = (typing.get_args(node) or (Any,))[0]
        elif typing.get_origin(node) is dict:
            node = (typing.get_args(node) or (Any, Any))[-1]
        else:
            return []
    node = _unwrap(node)
    if isinstance(node, type) and issubclass(node, BaseModel):
        return sorted((f.alias or n) for n, f in node.model_fields.items())
    return []


def _unwrap(node: Any) -> Any:
    """``X`` from ``Annotated[X, ...]`` and ``X | None``."""
    while True:
        origin = typing.get_origin(node)
        if origin is typing.Annotated:
            node = typing.get_args(node)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(node) if a is not type(None)]
            if len(args) != 1:
                return node
            node = args[0]
        else:
            return node


@cache
def _field_names() -> dict[str, str]:
    """Every field name the schema knows, by its lowercase spelling: a key that differs
    only in case (``reservationTtlSeconds``) gets the right spelling in its error."""
    out: dict[str, str] = {}
    for obj in vars(model).values():
        if isinstance(obj, type) and issubclass(obj, BaseModel):
            for name, info in obj.model_fields.items():
                alias = info.alias or name
                out.setdefault(alias.lower(), alias)
    return out


def _dotted(loc: list[object]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _line(node: yaml.Node, loc: list[object]) -> int | None:
    """The 1-based line of the deepest YAML node along ``loc`` (the field's own line if it
    exists, its parent's if it is missing)."""
    for depth, part in enumerate(loc):
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == part:
                    # A key's own line for the last step: a block value starts below it.
                    child = k if depth == len(loc) - 1 else v
                    break
        elif (isinstance(node, yaml.SequenceNode) and isinstance(part, int)
              and 0 <= part < len(node.value)):
            child = node.value[part]
        if child is None:
            break
        node = child
    return node.start_mark.line + 1

