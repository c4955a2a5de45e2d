"""Which function carries out a decision: the one its rule's params model names.

A rule's params are its action's validated model (``triscope.remediation.params``; a knobs-file
fallback's is ``filefallback.KnobsFileParams``), so the model's class says which action runs:
``RUNNERS`` maps each class to its action, and :func:`run_action` looks the params' own class up
there.  A test may put another function in an entry's place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from triscope.core.configfile import ConfigModel
from triscope.remediation.actions import (
    ActionContext,
    ActionResult,
    command,
    dependency_fallback,
    rolling_restart,
)
from triscope.remediation.filefallback import KnobsFileParams, switch
from triscope.remediation.isolate import isolate_accelerator
from triscope.remediation.params import (
    CommandParams,
    DependencyFallbackParams,
    IsolateAcceleratorParams,
    RescheduleParams,
    RollingRestartParams,
)
from triscope.remediation.policy import ActionParams
from triscope.remediation.reschedule import reschedule

P = TypeVar("P", bound=ConfigModel)

Runner = Callable[[ActionContext[ActionParams]], ActionResult]
"""An action as the engine calls it: with the decision's context, whose params are the rule's model."""


def runner(model: type[P], action: Callable[[ActionContext[P]], ActionResult]) -> Runner:
    """``action`` (which takes its own params model) as a :data:`Runner`: the context is handed on with
    its params typed as ``model``, the class ``RUNNERS`` found it under."""
    def run(ctx: ActionContext[ActionParams]) -> ActionResult:
        params = ctx.params
        if not isinstance(params, model):
            raise TypeError(f"the {model.__name__} action got {type(params).__name__} params")
        return action(ctx.using(params))
    return run


RUNNERS: dict[type[ConfigModel], Runner] = {
    RollingRestartParams: runner(RollingRestartParams, rolling_restart),
    DependencyFallbackParams: runner(DependencyFallbackParams, dependency_fallback),
    KnobsFileParams: runner(KnobsFileParams, switch),
    RescheduleParams: runner(RescheduleParams, reschedule),
    IsolateAcceleratorParams: runner(IsolateAcceleratorParams, isolate_accelerator),
    CommandParams: runner(CommandParams, command),
}
"""Each params model's action."""


def run_action(ctx: ActionContext[ActionParams]) -> ActionResult:
    """Carry out the decision ``ctx`` holds: the action of its params' class."""
    return RUNNERS[type(ctx.params)](ctx)
