"""PyTriton's inference-function decorators: ``batch``, ``sample``, ``pad_batch``, ``group_by_values``,
``group_by_keys``, ``first_value``, ``fill_optionals``.

A bound function is called with a list of requests (dicts of input name -> array). ``@batch`` and
``@sample`` turn that into keyword arrays; the others reshape what flows between them. They stack
in PyTriton's order, outermost first: ``@fill_optionals`` / ``@group_by_keys`` (on request lists),
``@batch``, then ``@group_by_values`` / ``@pad_batch`` / ``@first_value`` (on stacked arrays).

Every decorator works on plain and ``async def`` functions: when the wrapped function returns an
awaitable (or a generator, for decoupled models), the wrapper returns one too and applies its
post-processing later. Wrappers of async functions carry ``_ferry_async`` so the callable backend
runs them on an event loop. Decorators that need the model's config read the binding that the
callable backend makes current during a call.
"""

from __future__ import annotations

import functools
import inspect
from bisect import bisect_left
from typing import Any, Callable

import numpy as np

from serving_pod.backends.callable import current_binding, is_async_callable


class DecoratorError(ValueError):
    """A decorator met inputs or outputs it cannot handle; the message says which and why."""


def _wraps(func: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def apply(wrapper: Callable[..., Any]) -> Callable[..., Any]:
        functools.update_wrapper(wrapper, func)
        wrapper._ferry_async = is_async_callable(func)  # type: ignore[attr-defined]
        return wrapper

    return apply


def _then(result: Any, finish: Callable[[Any], Any]) -> Any:
    """``finish(result)`` now, or after awaiting it, or on each item a generator yields."""
    if inspect.isawaitable(result):
        async def later() -> Any:
            return finish(await result)

        return later()
    if inspect.isasyncgen(result):
        async def each_async() -> Any:
            async for item in result:
                yield finish(item)

        return each_async()
    if inspect.isgenerator(result):
        return (finish(item) for item in result)
    return finish(result)


def _gather(results: list[Any], finish: Callable[[list[Any]], Any]) -> Any:
    """``finish`` on several call results, awaiting those that are awaitable."""
    if any(inspect.isgenerator(r) or inspect.isasyncgen(r) for r in results):
        raise DecoratorError("this decorator cannot split streaming (generator) functions into several calls")
    if any(inspect.isawaitable(r) for r in results):
        async def later() -> Any:
            return finish([await r if inspect.isawaitable(r) else r for r in results])

        return later()
    return finish(results)


def _output_names() -> list[str]:
    bound = current_binding()
    return [t.name for t in bound.outputs] if bound is not None else []


def _as_dict(outputs: Any, where: str) -> dict[str, np.ndarray]:
    """A function's outputs as a dict; a list/tuple is matched to the declared outputs in order."""
    if isinstance(outputs, dict):
        return {name: np.asarray(value) for name, value in outputs.items()}
    if isinstance(outputs, (list, tuple)):
        names = _output_names()
        if len(outputs) != len(names):
            raise DecoratorError(
                f"{where}: the function returned {len(outputs)} outputs as a list, the model declares "
                f"{len(names)} ({', '.join(names) or 'unknown outside a bound model'})"
            )
        return {name: np.asarray(value) for name, value in zip(names, outputs)}
    raise DecoratorError(f"{where}: the function must return a dict of output arrays, got {type(outputs).__name__}")


def _rows(request: dict[str, np.ndarray], where: str) -> int:
    for value in request.values():
        if np.ndim(value) == 0:
            raise DecoratorError(f"{where}: input arrays need a batch dimension, got a scalar")
        return int(np.shape(value)[0])
    raise DecoratorError(f"{where}: a request has no inputs")


def batch(func: Callable[..., Any]) -> Callable[..., Any]:
    """Stack the requests' inputs along dim 0, call ``func(**arrays)``, split its outputs back per request.

    All requests must carry the same input names (use ``@group_by_keys`` first when they may not).
    Every output must have as many rows as the requests hold in all, else ``DecoratorError``.
    """

    @_wraps(func)
    def wrapper(requests: list[dict[str, np.ndarray]], *args: Any, **kwargs: Any) -> Any:
        requests = list(requests)
        if not requests:
            return []
        names = set(requests[0])
        for request in requests[1:]:
            if set(request) != names:
                raise DecoratorError(
                    f"@batch: cannot batch requests with different inputs: {sorted(names)} and "
                    f"{sorted(request)} (put @group_by_keys before @batch)"
                )
        sizes = [_rows(request, "@batch") for request in requests]
        if len(requests) == 1:
            stacked = dict(requests[0])
        else:
            stacked = {name: np.concatenate([request[name] for request in requests]) for name in requests[0]}
        return _then(func(*args, **kwargs, **stacked), lambda outputs: _split(outputs, sizes))

    return wrapper


def _split(outputs: Any, sizes: list[int]) -> list[dict[str, np.ndarray]]:
    named = _as_dict(outputs, "@batch")
    total = sum(sizes)
    wrong = {name: list(np.shape(value)) for name, value in named.items() if np.ndim(value) == 0 or value.shape[0] != total}
    if wrong:
        shown = ", ".join(f"'{name}' has shape {shape}" for name, shape in wrong.items())
        raise DecoratorError(
            f"@batch: output batch sizes do not add up: {shown}; expected {total} rows "
            f"(requests of sizes {sizes})"
        )
    results, start = [], 0
    for size in sizes:
        results.append({name: value[start:start + size] for name, value in named.items()})
        start += size
    return results


def sample(func: Callable[..., Any]) -> Callable[..., Any]:
    """Call ``func(**inputs)`` once per request (for models without batching); each call answers one request."""

    @_wraps(func)
    def wrapper(requests: list[dict[str, np.ndarray]], *args: Any, **kwargs: Any) -> Any:
        calls = [func(*args, **kwargs, **request) for request in requests]
        if len(calls) == 1:
            return _then(calls[0], lambda outputs: [_as_dict(outputs, "@sample")])
        return _gather(calls, lambda results: [_as_dict(r, "@sample") for r in results])

    return wrapper


def group_by_keys(func: Callable[..., Any]) -> Callable[..., Any]:
    """Call ``func`` once per group of requests with the same input names; results keep the request order."""

    @_wraps(func)
    def wrapper(requests: list[dict[str, np.ndarray]], *args: Any, **kwargs: Any) -> Any:
        groups: dict[tuple[str, ...], list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(tuple(sorted(request)), []).append(index)
        order = list(groups.values())
        calls = [func([requests[i] for i in indices], *args, **kwargs) for indices in order]

        def merge(results: list[Any]) -> list[Any]:
            merged: list[Any] = [None] * len(requests)
            for indices, answers in zip(order, results):
                for index, answer in zip(indices, answers):
                    merged[index] = answer
            return merged

        return _gather(calls, merge)

    return wrapper


def group_by_values(*keys: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Split a stacked batch into groups of rows with equal values of ``keys``; call ``func`` per group.

    Use after ``@batch``. Outputs are reassembled in the original row order; every group's output
    must have as many rows as the group and the same trailing dims as the other groups.
    """
    if not keys:
        raise DecoratorError("@group_by_values needs at least one input name")

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @_wraps(func)
        def wrapper(*args: Any, **inputs: Any) -> Any:
            missing = [k for k in keys if k not in inputs]
            if missing:
                raise DecoratorError(f"@group_by_values: input(s) {missing} are not in the batch ({sorted(inputs)}); use it after @batch")
            rows = _rows(inputs, "@group_by_values")
            groups: dict[tuple[bytes, ...], list[int]] = {}
            for row in range(rows):
                groups.setdefault(tuple(_value_key(inputs[k][row]) for k in keys), []).append(row)
            order = [np.asarray(indices) for indices in groups.values()]
            calls = [func(*args, **{n: v[indices] for n, v in inputs.items()}) for indices in order]
            return _gather(calls, lambda results: _reassemble(results, order, rows))

        return wrapper

    return decorate


def _value_key(value: Any) -> bytes:
    array = np.asarray(value)
    if array.dtype.kind in "OSU":
        return repr(array.tolist()).encode()
    return str(array.shape).encode() + array.tobytes()


def _reassemble(results: list[Any], order: list[np.ndarray], rows: int) -> dict[str, np.ndarray]:
    named = [_as_dict(result, "@group_by_values") for result in results]
    merged: dict[str, np.ndarray] = {}
    for name, first in named[0].items():
        for indices, result in zip(order, named):
            part = result.get(name)
            if part is None or part.shape[:1] != (len(indices),) or part.shape[1:] != first.shape[1:]:
                raise DecoratorError(
                    f"@group_by_values: output '{name}' of a group of {len(indices)} rows has shape "
                    f"{None if part is None else list(part.shape)}; expected [{len(indices)}, "
                    f"{', '.join(map(str, first.shape[1:]))}] like the other groups"
                )
        merged[name] = np.empty((rows,) + first.shape[1:], dtype=first.dtype)
        for indices, result in zip(order, named):
            merged[name][indices] = result[name]
    return merged


def pad_batch(func: Callable[..., Any]) -> Callable[..., Any]:
    """Repeat the last row so the batch reaches the next preferred batch size (or max_batch_size).

    Use after ``@batch``. Outputs with the padded row count are trimmed back to the real rows, so
    ``@batch`` can split them (outputs already trimmed by the function pass unchanged).
    """

    @_wraps(func)
    def wrapper(*args: Any, **inputs: Any) -> Any:
        bound = current_binding()
        if bound is None:
            raise DecoratorError("@pad_batch reads the model config: call it through a bound model")
        config = bound.config
        rows = _rows(inputs, "@pad_batch")
        sizes = sorted(config.batcher.preferred_batch_size) if config.batcher is not None else []
        sizes.append(config.effective_max_batch_size)
        target = sizes[min(bisect_left(sizes, rows), len(sizes) - 1)]
        padded = inputs
        if target > rows:
            padded = {n: np.concatenate([v, np.repeat(v[-1:], target - rows, axis=0)]) for n, v in inputs.items()}

        def trim(outputs: Any) -> Any:
            named = _as_dict(outputs, "@pad_batch")
            return {n: v[:rows] if np.ndim(v) and v.shape[0] == target else v for n, v in named.items()}

        return _then(func(*args, **padded), trim)

    return wrapper


def first_value(*keys: str, squeeze_single_values: bool = True, strict: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Replace the inputs ``keys`` by their first row (a scalar when it holds one value).

    Works after ``@batch`` (on keyword arrays) or on request lists. With ``strict``, rows that
    differ raise ``DecoratorError`` (use ``@group_by_values`` first). Batching models only.
    """

    def replace(inputs: dict[str, Any]) -> dict[str, Any]:
        replaced = dict(inputs)
        for key in keys:
            if key not in inputs:
                continue
            values = np.asarray(inputs[key])
            if strict and len(values) > 1 and any(_value_key(v) != _value_key(values[0]) for v in values[1:]):
                raise DecoratorError(
                    f"@first_value: the rows of input '{key}' differ ({values.tolist()!r}); group the "
                    f"batch with @group_by_values('{key}') or pass strict=False"
                )
            first = values[0]
            if squeeze_single_values and np.ndim(first) and all(d == 1 for d in np.shape(first)):
                first = np.squeeze(first)[()]
            replaced[key] = first
        return replaced

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @_wraps(func)
        def wrapper(*args: Any, **inputs: Any) -> Any:
            bound = current_binding()
            if bound is not None and not bound.config.batching:
                raise DecoratorError("@first_value can only be used with models that batch (max_batch_size > 0)")
            if inputs:
                return func(*args, **replace(inputs))
            requests, *rest = args
            return func([replace(request) for request in requests], *rest)

        return wrapper

    return decorate


def fill_optionals(**defaults: np.ndarray) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add missing optional inputs to each request from ``defaults`` (arrays without the batch dim)."""
    for key, value in defaults.items():
        if not isinstance(value, np.ndarray):
            raise DecoratorError(f"@fill_optionals: default for '{key}' must be a numpy array, got {type(value).__name__}")

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @_wraps(func)
        def wrapper(requests: list[dict[str, np.ndarray]], *args: Any, **kwargs: Any) -> Any:
            bound = current_binding()
            batching = bound is None or bound.config.batching
            for request in requests:  # each call gets fresh request dicts: filling in place is safe
                for key, value in defaults.items():
                    if key not in request:
                        rows = _rows(request, "@fill_optionals") if batching else 0
                        request[key] = np.tile(value, (rows,) + (1,) * value.ndim) if batching else value
            return func(requests, *args, **kwargs)

        return wrapper

    return decorate
