"""``sys.argv`` as an in-process python model sees it: ``[""]``, as in Triton's stub process.

Triton runs each instance in ``triton_python_backend_stub``, whose embedded interpreter has ``sys.argv == [""]``:
Triton's QA models call ``unittest.main("model", exit=False)``, which parses ``sys.argv``. Here models share the
server's process, whose ``sys.argv`` holds the server's flags (unittest refuses them and exits). ``install`` puts a
``list`` subclass in ``sys.argv`` holding the server's arguments: code of a model (a frame of a module
``python_model.load_model_module`` made is on the stack: the model's methods, the threads it starts, what they call)
reads and edits a list of its own, ``[""]`` at first, and all other code the server's, unchanged.

A C function that reads a list's items directly (``str.join``, ``PySequence_Fast``) sees the server's arguments.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

#: package name prefix of the modules ``python_model.load_model_module`` makes
MODEL_PACKAGE_PREFIX = "_ferry_model_"

#: each model module's own ``sys.argv`` (by the package of its instance)
_views: dict[str, list[str]] = {}

_READERS = (
    "__getitem__", "__len__", "__iter__", "__reversed__", "__contains__", "__repr__", "__eq__", "__ne__", "__lt__",
    "__le__", "__gt__", "__ge__", "__add__", "__mul__", "__rmul__", "copy", "count", "index",
    "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "__setitem__", "__delitem__",
)


def _view() -> list[str] | None:
    """The ``sys.argv`` of the model whose code called in (2 frames up), or None for the server's."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if type(name) is str and name.startswith(MODEL_PACKAGE_PREFIX):
            package = name.partition(".")[0]
            view = _views.get(package)
            if view is None:
                view = _views[package] = [""]
            return view
        frame = frame.f_back
    return None


def _delegate(name: str) -> Callable[..., Any]:
    method = getattr(list, name)

    def delegated(self: list, *args: Any) -> Any:
        view = _view()
        return method(self if view is None else view, *args)

    delegated.__name__ = name
    return delegated


class ModelArgv(list):
    """``sys.argv`` once ``install``-ed (module docstring)."""

    __slots__ = ()

    def __iadd__(self, other: Any) -> "ModelArgv":  # ``sys.argv += [...]`` keeps this object in ``sys.argv``
        view = _view()
        list.extend(self if view is None else view, other)
        return self

    def __imul__(self, count: int) -> "ModelArgv":
        view = _view()
        target = self if view is None else view
        target[:] = list.__mul__(target, count)
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickled (multiprocessing) as the server's plain list
        return list, (list(list.__iter__(self)),)

    __hash__ = None  # type: ignore[assignment]


for _name in _READERS:
    setattr(ModelArgv, _name, _delegate(_name))


def install() -> None:
    """Give model code its own ``sys.argv`` (idempotent; the server's arguments stay in place for other code)."""
    if not isinstance(sys.argv, ModelArgv):
        sys.argv = ModelArgv(sys.argv)


def forget(package: str) -> None:
    """Drop the ``sys.argv`` of an unloaded model's package."""
    _views.pop(package, None)
