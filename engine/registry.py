"""A tiny name -> factory registry, one per kind of part (backbones, composers, expanders, indexes)."""
from __future__ import annotations

from typing import Callable, Dict, Generic, Iterator, Mapping, Optional, Set, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: Dict[str, Callable[..., T]] = {}
        self._reuses: Set[str] = set()

    def register(self, name: str, reuses_loaded: bool = False) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """``reuses_loaded``: the factory is made of other parts of this registry and takes them already loaded
        (a ``loaded`` keyword, from :meth:`create`) instead of loading its own copies."""
        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._items:
                raise KeyError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = factory
            if reuses_loaded:
                self._reuses.add(name)
            return factory

        return deco

    def get(self, name: str) -> Callable[..., T]:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise KeyError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def create(self, name: str, *args, loaded: Optional[Mapping[str, T]] = None, **kwargs) -> T:
        """``name`` made by its factory with these arguments; a factory registered with ``reuses_loaded`` is
        also handed ``loaded`` (the parts of this registry its caller has made already, by name), so one made
        of other parts shares them instead of loading each a second time (the automatic composer)."""
        factory = self.get(name)
        if name in self._reuses:
            kwargs["loaded"] = dict(loaded or {})
        return factory(*args, **kwargs)

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)
