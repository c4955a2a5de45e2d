"""Per-app callback registration for the page modules.

Dash's global ``@dash.callback`` hands every callback to the *first* app built in the process, so
a second app (tests, ``triscope run`` next to a WSGI server) would have none.  Page modules
decorate their callbacks with ``page_callback(...)`` instead (same arguments as ``app.callback``);
``create_app`` attaches them to each app it builds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_CALLBACKS: list[tuple[tuple[Any, ...], dict[str, Any], Callable[..., Any]]] = []


def page_callback(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        _CALLBACKS.append((args, kwargs, func))
        return func

    return deco


def attach(app: Any) -> int:
    for args, kwargs, func in _CALLBACKS:
        app.callback(*args, **kwargs)(func)
    return len(_CALLBACKS)
