"""The one way rocmdoctor reads a foreign JSON document (a model's config.json, a safetensors header, the
shard index, an answer of the Hugging Face Hub or of the GitHub release API, a lock, a bundle's
metadata, a meta file of a replayed tree, the deep probe's report).

Bounds, enforced before and while parsing, never after:
- size: the caller reads at most `limit + 1` bytes (`rootfs.read_regular`) and a longer document is refused
  before a byte is parsed;
- nesting depth: the typed records below have a fixed shape, and the parts they skip (unknown fields)
  go through msgspec's own recursion guard, whose RecursionError is turned into "nested too deeply";
  untyped documents (`load_value`) are decoded under the same guard;
- integers: msgspec refuses any integer outside 64 bits while it parses (no 5,000-digit int() call), and
  every number that drives arithmetic or allocation carries a range in its record (`Meta(ge=, le=)`);
- item counts: bounded by the size cap, and by `max_length` where a count drives a loop;
- NaN and Infinity are not JSON and are refused by the parser.

Then validation into typed records with one library (msgspec). A bad document is `DocumentError`,
whose text names the document and the field (`$.num_hidden_layers`) and never echoes a huge value.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

MAX_ERROR_CHARS = 300


class DocumentError(ValueError):
    """A foreign document that cannot be used; the message names the document and the field."""

    def __init__(self, source: str, why: str, path: str = "", problem: str = "") -> None:
        self.source = source
        self.why = why
        self.path = path  # "families.gfx1151.assets[0].size" when a field is wrong, else ""
        self.problem = problem  # what is wrong with it, msgspec's words
        super().__init__(f"{source}: {why}")


def _why(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply to be this document"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        # msgspec names the field as "at `$.a.b`": keep that, say it as field
        text = text.replace("- at `", "(field `").rstrip("`") + "`)" if "- at `" in text else text
    elif isinstance(exc, msgspec.DecodeError):
        text = "not valid JSON (" + text.replace("JSON is malformed: ", "") + ")"
    return text[:MAX_ERROR_CHARS]


def decode(data: bytes | str, schema: type[T], source: str, limit: int) -> T:
    """`data` parsed and validated as `schema` (a msgspec Struct, or a container of them)."""
    if len(data) > limit:
        raise DocumentError(source, f"larger than {limit} bytes; not this kind of document")
    try:
        return msgspec.json.decode(data, type=schema)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as exc:
        path, problem = "", ""
        if isinstance(exc, msgspec.ValidationError) and " - at `$" in str(exc):
            problem, _, at = str(exc).rpartition(" - at `$")
            path = at.rstrip("`").lstrip(".")
        raise DocumentError(source, _why(exc), path[:200], problem[:MAX_ERROR_CHARS]) from None


def load_value(data: bytes | str, source: str, limit: int) -> Any:
    """Any JSON value, under the same bounds (size, depth guard, 64-bit integers, no NaN)."""
    return decode(data, Any, source, limit)


def load_object(data: bytes | str, source: str, limit: int) -> dict[str, Any]:
    return decode(data, dict[str, Any], source, limit)


def load_toml(text: str, source: str, limit: int) -> dict[str, Any]:
    """A TOML document (a fleet's own manifest) under the same bounds: size first, then tomllib under
    the recursion guard (nested arrays deep enough overflow its recursive parser)."""
    if len(text) > limit:
        raise DocumentError(source, f"larger than {limit} characters; not this kind of document")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]
        except ModuleNotFoundError:
            raise DocumentError(
                source, "reading TOML on Python 3.10 needs the 'tomli' package (pip install tomli)"
            ) from None
    try:
        return tomllib.loads(text)
    except RecursionError as exc:
        raise DocumentError(source, _why(exc)) from None
    except ValueError as exc:  # TOMLDecodeError, and int()'s refusal of a 5,000-digit integer
        raise DocumentError(source, f"not valid TOML: {str(exc)[:MAX_ERROR_CHARS]}") from None


def to_builtins(record: Any) -> Any:
    return msgspec.to_builtins(record)
