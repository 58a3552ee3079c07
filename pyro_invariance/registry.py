"""One registry for catalogue entries (models, guides, datasets).

Every catalogue entry registers itself with a decorator, so the CLI, the tutorials and the tests
find it by name::

    @MODELS.register("invariant-mlp", summary="...")
    class InvariantMLP(PyroModule): ...

    model = MODELS.get("invariant-mlp", num_classes=10, ...)

Adding a catalogue entry is one file that uses the decorator and one import line in the
package ``__init__``.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


class UnknownNameError(KeyError):
    """Raised for a name that is not in a registry; the message lists what is."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


@dataclass(frozen=True)
class Entry:
    """A registered factory with a one-line summary for listings, and what else its module declared
    about it without building it (``info``; e.g. a dataset's ``kind``: task name and row type)."""

    name: str
    factory: Callable[..., Any]
    summary: str
    info: dict[str, Any] = field(default_factory=dict)


class Registry:
    """A name -> factory map with helpful errors.

    Args:
        kind: what the registry holds ("model", "guide", "dataset"), used in messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, summary: str = "", **info: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``factory`` under ``name`` (names are unique); ``info`` is kept on the
        :class:`Entry` (datasets declare ``kind=(task name, "images" | "vectors")``)."""

        def decorator(factory: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries and self._entries[name].factory is not factory:
                raise ValueError(f"{self.kind} name {name!r} is already registered")
            lines = (factory.__doc__ or "").strip().splitlines()
            self._entries[name] = Entry(name, factory, summary or (lines[0] if lines else ""), dict(info))
            return factory

        return decorator

    def entry(self, name: str) -> Entry:
        """The entry for ``name``; an unknown name raises :class:`UnknownNameError`."""
        if not isinstance(name, str) or name not in self._entries:
            close = difflib.get_close_matches(str(name), list(self._entries), n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise UnknownNameError(f"unknown {self.kind} {name!r}.{hint} Known {self.kind}s: {', '.join(self.names())}")
        return self._entries[name]

    def get(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Build the entry ``name`` with the given arguments.

        A keyword the entry's factory does not take raises ``TypeError`` in one line that names it,
        suggests the closest valid one and lists them all (Python's own message lists none).
        """
        self.check_keywords(name, kwargs, positional=len(args))
        return self.entry(name).factory(*args, **kwargs)

    def keywords(self, name: str, positional: int = 0) -> list[str] | None:
        """The keyword arguments entry ``name`` takes after ``positional`` positional ones (a guide's
        model), in signature order; ``None`` when its factory takes any (``**kwargs``)."""
        return _keywords(self.entry(name).factory, positional)

    def check_keywords(self, name: str, kwargs: dict[str, Any], positional: int = 0) -> None:
        """Refuse keywords in ``kwargs`` that entry ``name`` does not take (after ``positional``
        positional arguments): one-line ``TypeError`` naming them and listing the valid ones."""
        entry = self.entry(name)
        valid = _keywords(entry.factory, positional)
        unknown = [k for k in kwargs if valid is not None and k not in valid]
        if not unknown:
            return
        close = difflib.get_close_matches(unknown[0], valid or [], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(
            f"{self.kind} {entry.name!r} takes no argument {', '.join(map(repr, unknown))}{hint}; its "
            f"arguments: {', '.join(valid or []) or 'none'}"
        )

    def names(self) -> list[str]:
        return sorted(self._entries)

    def items(self) -> Iterator[Entry]:
        return (self._entries[n] for n in self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)


def _keywords(factory: Callable[..., Any], positional: int) -> list[str] | None:
    """Keyword names of ``factory`` after its first ``positional`` parameters; ``None`` if it takes
    ``**kwargs`` or has no signature (then any keyword may be right)."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for i, p in enumerate(params) if p.kind in named and i >= positional]


MODELS = Registry("model")
GUIDES = Registry("guide")
DATASETS = Registry("dataset")
