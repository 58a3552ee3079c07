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
from dataclasses import dataclass
from typing import Any, Callable, Iterator


class UnknownNameError(KeyError):
    """Raised for a name that is not in a registry; the message lists what is."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


@dataclass(frozen=True)
class Entry:
    """A registered factory with a one-line summary for listings."""

    name: str
    factory: Callable[..., Any]
    summary: str


class Registry:
    """A name -> factory map with helpful errors.

    Args:
        kind: what the registry holds ("model", "guide", "dataset"), used in messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, summary: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``factory`` under ``name`` (names are unique)."""

        def decorator(factory: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries and self._entries[name].factory is not factory:
                raise ValueError(f"{self.kind} name {name!r} is already registered")
            lines = (factory.__doc__ or "").strip().splitlines()
            self._entries[name] = Entry(name, factory, summary or (lines[0] if lines else ""))
            return factory

        return decorator

    def entry(self, name: str) -> Entry:
        """The entry for ``name``; an unknown name raises :class:`UnknownNameError`."""
        if not isinstance(name, str) or name not in self._entries:
            close = difflib.get_close_matches(str(name), list(self._entries), n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}.{hint} Known {self.kind}s: {', '.join(self.names())}"
            )
        return self._entries[name]

    def get(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Build the entry ``name`` with the given arguments."""
        return self.entry(name).factory(*args, **kwargs)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def items(self) -> Iterator[Entry]:
        return (self._entries[n] for n in self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)


MODELS = Registry("model")
GUIDES = Registry("guide")
DATASETS = Registry("dataset")
