"""``NamedTuple`` as the hook's records use it, without importing ``typing`` at run time.

The Claude Code hook is a new process for every tool call. ``typing`` and the classes its
``NamedTuple`` makes (every field's annotation compiled into a ``ForwardRef``) cost about a
sixth of the hook's start (``bench/hook_startup.py``). Type checkers read
``typing.NamedTuple``::

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from typing import NamedTuple
    else:
        from signoff.hooks._records import NamedTuple

and at run time the same class statement makes what ``typing.NamedTuple`` makes: a
``collections.namedtuple`` with the class's defaults, methods, properties and docstring; its
``__annotations__`` are the strings written in the class (the modules that use it have
``from __future__ import annotations``), as ``typing.NamedTuple`` would keep them.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable

__all__ = ["NamedTuple"]

_OWN = frozenset({"__module__", "__qualname__", "__annotations__"})
_TUPLE_OWN = frozenset(
    "__new__ __init__ __slots__ __getnewargs__ _fields _field_defaults _make _replace _asdict".split()
)
_make_tuple: Callable[..., type] = namedtuple  # called with names known only at run time


class _RecordMeta(type):
    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, object]) -> type:
        if not bases:  # NamedTuple itself
            return super().__new__(mcs, name, bases, namespace)
        annotations = namespace.get("__annotations__", {})
        assert isinstance(annotations, dict)
        fields = list(annotations)
        defaults = [namespace[field] for field in fields if field in namespace]
        if any(field not in namespace for field in fields[len(fields) - len(defaults) :]):
            raise TypeError(f"{name}: a field without a default follows one with a default")
        record = _make_tuple(name, fields, defaults=defaults, module=namespace["__module__"])
        record.__qualname__ = str(namespace.get("__qualname__", name))
        record.__annotations__ = dict(annotations)
        for key, value in namespace.items():
            if key in _TUPLE_OWN:
                raise AttributeError(f"{name}: cannot overwrite the record's own {key}")
            if key not in _OWN and key not in annotations:
                setattr(record, key, value)
        return record


class NamedTuple(metaclass=_RecordMeta):
    """Subclass this as ``typing.NamedTuple``: annotated fields, defaults, methods."""
