"""Debugging helpers: a `jax.jit` whose compiled programs run JAX's checkify checks.

`checkify_pjit(errors)` returns a drop-in replacement for `jax.jit` (AXLearn's name keeps
`pjit`): the function is wrapped in `jax.experimental.checkify.checkify(fun, errors=errors)`,
jitted (the error value is replicated, `out_shardings` apply to the function's own outputs),
and every call (direct, or `lower(...).compile(...)(...)`) raises `checkify.JaxRuntimeError`
naming the failed check and its source line, instead of returning NaNs or out-of-bounds reads
silently.
The trainer's `jit` can be swapped for it while debugging a step.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Union

import jax
from jax.experimental import checkify

# The base class of the errors in checkify's sets (`checkify.nan_checks` holds `NaNError`, ...).
JaxException = next(iter(checkify.nan_checks)).__mro__[1]


class _CheckedCompiled:
    """A compiled checkified program: calls it and raises the error it reports."""

    def __init__(self, compiled: jax.stages.Compiled):
        self._compiled = compiled

    def __call__(self, *args, **kwargs) -> Any:
        """Runs the program; raises `checkify.JaxRuntimeError` on a failed check."""
        error, outputs = self._compiled(*args, **kwargs)
        checkify.check_error(error)
        return outputs


class _CheckedLowered:
    """A lowered checkified program, compiled into a `_CheckedCompiled`."""

    def __init__(self, lowered: jax.stages.Lowered):
        self._lowered = lowered

    def compile(
        self, compiler_options: Optional[dict[str, Union[str, bool]]] = None
    ) -> _CheckedCompiled:
        """Compiles with XLA `compiler_options`.

        Args:
            compiler_options: XLA options, as `jax.stages.Lowered.compile` takes them.

        Returns:
            The compiled program, raising on a failed check when called.
        """
        return _CheckedCompiled(self._lowered.compile(compiler_options=compiler_options))

    def as_text(self) -> str:
        """The lowered program's text (StableHLO)."""
        return self._lowered.as_text()


class CheckifyJitFnWrapper:
    """A jitted checkified function: lowers, compiles and runs it, raising on a failed check."""

    def __init__(self, jitted: Callable):
        self._jitted = jitted

    def __call__(
        self, *args, compiler_options: Optional[dict[str, Union[str, bool]]] = None, **kwargs
    ) -> Any:
        """Lowers, compiles (with `compiler_options`) and runs the function on the arguments."""
        return self.lower(*args, **kwargs).compile(compiler_options)(*args, **kwargs)

    def lower(self, *args, **kwargs) -> _CheckedLowered:
        """Traces and lowers the function for the arguments."""
        return _CheckedLowered(self._jitted.lower(*args, **kwargs))


class CheckifyJitFn(Protocol):
    """The signature of `jax.jit` (and of the function `checkify_pjit` returns)."""

    def __call__(self, fun: Callable, *args, **kwargs) -> CheckifyJitFnWrapper:
        """Returns `fun` jitted with `jax.jit`'s arguments, its checks enabled."""


def checkify_pjit(errors: frozenset[type[JaxException]]) -> CheckifyJitFn:
    """A `jax.jit` whose programs run the given checkify checks.

    Example: `checkify_pjit(checkify.float_checks)(jnp.log)(-1.0)` raises `checkify.JaxRuntimeError`
    naming the NaN and the line that produced it.

    Args:
        errors: The checks to run (`checkify.float_checks`, `checkify.nan_checks`,
            `checkify.index_checks`, `checkify.user_checks`, `checkify.all_checks`, or a union).

    Returns:
        A function taking `jax.jit`'s arguments (`fun`, then `in_shardings=`, `out_shardings=`,
        `donate_argnums=`, ...) and returning a `CheckifyJitFnWrapper`.
    """

    def jit_with_checks(fun: Callable, *args, out_shardings: Any = None, **kwargs):
        checked = checkify.checkify(fun, errors=errors)
        # The error value comes first in the outputs; it is replicated.
        if out_shardings is not None:
            kwargs["out_shardings"] = (None, out_shardings)
        return CheckifyJitFnWrapper(jax.jit(checked, *args, **kwargs))

    return jit_with_checks
