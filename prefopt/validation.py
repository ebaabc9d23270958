"""Parameter constraints: what a constructor's arguments may be, checked in ``fit``.

Every prefopt estimator declares a class attribute ``_parameter_constraints``,
``{name: [constraint, ...]}`` (a value is valid when it satisfies one of them) or
``{name: "no_validation"}``, and its ``fit`` calls :func:`validate_params`. This
is scikit-learn's convention, with prefopt's own small constraint module instead
of scikit-learn's private parameter-validation module: that one is not part of
scikit-learn's public API and may change in any release, while a user
algorithm must be able to validate its parameters with public names only.
The messages are scikit-learn's, word for word (``The 'k' parameter of
RLOOPolicy must be an int in the range [2, inf). Got 1 instead.``).

A constraint is one of:

- an :class:`Interval`, an :class:`Options` or :class:`StrOptions`, or any
  :class:`Constraint` (a subclass may reword its message, as GRPO's ``k``);
- a type: any instance of it (``str``, ``os.PathLike``, a base class);
- ``None``: the value ``None``; ``callable``: any callable;
- the strings ``"boolean"`` (``bool`` or ``numpy.bool_``), ``"verbose"`` (an
  int >= 0 or a boolean), ``"random_state"`` (an int in [0, 2**32 - 1], a
  ``numpy.random.RandomState`` or ``None``) and ``"array-like"`` (a list, tuple,
  array... but not a scalar or a string).
"""

from __future__ import annotations

import math
import operator
from numbers import Integral, Real

import numpy as np

__all__ = [
    "Constraint",
    "Interval",
    "InvalidParameterError",
    "Options",
    "StrOptions",
    "validate_parameter_constraints",
    "validate_params",
]


class InvalidParameterError(ValueError, TypeError):
    """A parameter of a class, method or function has an invalid type or value.

    A ``ValueError`` and a ``TypeError`` both, as scikit-learn's error of the same
    name, so code that catches either keeps working.

    Examples
    --------
    >>> from prefopt.validation import InvalidParameterError
    >>> issubclass(InvalidParameterError, ValueError)
    True
    """


def _type_name(t) -> str:
    """A type as an error message names it (``int``, ``float``, ``module.Class``)."""
    if t.__module__ == "builtins":
        return t.__qualname__
    if t is Real:
        return "float"
    if t is Integral:
        return "int"
    return f"{t.__module__}.{t.__qualname__}"


def _either(constraints) -> str:
    """``"a, b or c"``: what one of several constraints asks, as the message words it."""
    words = [str(c) for c in constraints]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


class Constraint:
    """Base of the constraints: ``is_satisfied_by(value)`` and a ``str`` for the message.

    Subclass it for a rule the other constraints cannot state; ``str(constraint)``
    completes the sentence "The 'name' parameter of Estimator must be ...".

    Examples
    --------
    >>> from prefopt.validation import Constraint, validate_parameter_constraints
    >>> class Even(Constraint):
    ...     def is_satisfied_by(self, value):
    ...         return isinstance(value, int) and value % 2 == 0
    ...     def __str__(self):
    ...         return "an even int"
    >>> validate_parameter_constraints({"n": [Even()]}, {"n": 3}, caller_name="Toy")
    Traceback (most recent call last):
    ...
    prefopt.validation.InvalidParameterError: The 'n' parameter of Toy must be an even int. Got 3 instead.
    """  # noqa: E501

    def is_satisfied_by(self, value) -> bool:
        """Whether ``value`` satisfies the constraint.

        Parameters
        ----------
        value : object
            The value of the parameter.

        Returns
        -------
        satisfied : bool
        """
        raise NotImplementedError(f"{type(self).__name__} must define is_satisfied_by(value).")

    def __str__(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define __str__.")


class _InstancesOf(Constraint):
    def __init__(self, type_):
        self.type = type_

    def is_satisfied_by(self, value) -> bool:
        return isinstance(value, self.type)

    def __str__(self) -> str:
        return f"an instance of {_type_name(self.type)!r}"


class _NoneConstraint(Constraint):
    def is_satisfied_by(self, value) -> bool:
        return value is None

    def __str__(self) -> str:
        return "None"


class _Callables(Constraint):
    def is_satisfied_by(self, value) -> bool:
        return callable(value)

    def __str__(self) -> str:
        return "a callable"


class _ArrayLikes(Constraint):
    def is_satisfied_by(self, value) -> bool:
        # What numpy can make an array of, except a scalar (a string included).
        arraylike = hasattr(value, "__len__") or hasattr(value, "shape")
        return (arraylike or hasattr(value, "__array__")) and not np.isscalar(value)

    def __str__(self) -> str:
        return "an array-like"


class _AnyOf(Constraint):
    """One of several constraints, worded as one ("a, b or c")."""

    def __init__(self, *constraints):
        self.constraints = constraints

    def is_satisfied_by(self, value) -> bool:
        return any(c.is_satisfied_by(value) for c in self.constraints)

    def __str__(self) -> str:
        return _either(self.constraints)


class Options(Constraint):
    """A finite set of values of one type.

    Parameters
    ----------
    type : type
        The type a value must have.
    options : set
        The valid values.

    Examples
    --------
    >>> from prefopt.validation import Options
    >>> Options(int, {2, 4}).is_satisfied_by(4), Options(int, {2, 4}).is_satisfied_by(3)
    (True, False)
    """

    def __init__(self, type, options):  # noqa: A002 (scikit-learn's name)
        self.type = type
        self.options = options

    def is_satisfied_by(self, value) -> bool:
        """Whether ``value`` is one of the options, of the type.

        Parameters
        ----------
        value : object
            Compared with ``==`` to each option, once its type is checked.

        Returns
        -------
        satisfied : bool
        """
        return isinstance(value, self.type) and value in self.options

    def __str__(self) -> str:
        options = ", ".join(repr(o) for o in self.options)
        return f"a {_type_name(self.type)} among {{{options}}}"


class StrOptions(Options):
    """A finite set of strings.

    Parameters
    ----------
    options : set of str
        The valid strings.

    Examples
    --------
    >>> from prefopt.validation import StrOptions
    >>> StrOptions({"adam"}).is_satisfied_by("adam"), str(StrOptions({"adam"}))
    (True, "a str among {'adam'}")
    """

    def __init__(self, options):
        super().__init__(str, options)


class Interval(Constraint):
    """Numbers of one type in a range.

    Parameters
    ----------
    type : {numbers.Integral, numbers.Real}
        ``Integral`` accepts ints only; ``Real`` accepts ints and floats.
    left, right : int, float or None
        The bounds; ``None`` is unbounded on that side.
    closed : {"left", "right", "both", "neither"}
        Which bounds belong to the interval.

    Examples
    --------
    >>> from numbers import Integral, Real
    >>> from prefopt.validation import Interval
    >>> Interval(Integral, 2, None, closed="left").is_satisfied_by(2)
    True
    >>> Interval(Real, 0, 1, closed="neither").is_satisfied_by(1.0)
    False
    >>> print(Interval(Real, 0, None, closed="left"))
    a float in the range [0.0, inf)
    """

    def __init__(self, type, left, right, *, closed):  # noqa: A002 (scikit-learn's name)
        if type not in (Integral, Real):
            raise ValueError(f"type must be numbers.Integral or numbers.Real; got {type!r}.")
        if closed not in ("left", "right", "both", "neither"):
            raise ValueError(
                f"closed must be 'left', 'right', 'both' or 'neither'; got {closed!r}."
            )
        for side, bound in (("left", left), ("right", right)):
            if bound is not None and not isinstance(bound, type):
                raise TypeError(f"{side}={bound!r} must be None or {_type_name(type)}.")
        if left is not None and right is not None and right <= left:
            raise ValueError(f"right must be above left; got left={left}, right={right}.")
        self.type = type
        self.left = left
        self.right = right
        self.closed = closed

    def __contains__(self, value) -> bool:
        if not isinstance(value, Integral) and math.isnan(value):
            return False
        below = operator.lt if self.closed in ("left", "both") else operator.le
        above = operator.gt if self.closed in ("right", "both") else operator.ge
        if self.left is not None and below(value, self.left):
            return False
        return not (self.right is not None and above(value, self.right))

    def is_satisfied_by(self, value) -> bool:
        """Whether ``value`` has the type and lies in the range.

        Parameters
        ----------
        value : object
            A number of the interval's type; a nan is outside every interval.

        Returns
        -------
        satisfied : bool
        """
        return isinstance(value, self.type) and value in self

    def __str__(self) -> str:
        kind = "an int" if self.type is Integral else "a float"
        left = "-inf" if self.left is None else self.left
        right = "inf" if self.right is None else self.right
        if self.type is not Integral:  # bounds given as ints read as floats: [0.0, inf)
            left = float(left) if isinstance(left, Real) else left
            right = float(right) if isinstance(right, Real) else right
        opening = "[" if self.closed in ("left", "both") else "("
        closing = "]" if self.closed in ("right", "both") else ")"
        return f"{kind} in the range {opening}{left}, {right}{closing}"


_NAMED = {
    "boolean": lambda: _AnyOf(_InstancesOf(bool), _InstancesOf(np.bool_)),
    "verbose": lambda: _AnyOf(
        Interval(Integral, 0, None, closed="left"), _InstancesOf(bool), _InstancesOf(np.bool_)
    ),
    "random_state": lambda: _AnyOf(
        Interval(Integral, 0, 2**32 - 1, closed="both"),
        _InstancesOf(np.random.RandomState),
        _NoneConstraint(),
    ),
    "array-like": _ArrayLikes,
}


def _make(constraint) -> Constraint:
    """The :class:`Constraint` a declaration stands for (see the module's docstring)."""
    if isinstance(constraint, Constraint):
        return constraint
    if isinstance(constraint, str) and constraint in _NAMED:
        return _NAMED[constraint]()
    if constraint is None:
        return _NoneConstraint()
    if constraint is callable:
        return _Callables()
    if isinstance(constraint, type):
        return _InstancesOf(constraint)
    raise ValueError(
        f"Unknown constraint {constraint!r}: use an Interval, Options, StrOptions, a type, "
        f"None, callable, or one of {sorted(_NAMED)}."
    )


def validate_parameter_constraints(constraints: dict, params: dict, caller_name: str) -> None:
    """Check each value of ``params`` against its entry in ``constraints``.

    Parameters
    ----------
    constraints : dict
        ``{name: list of constraints}`` (a value is valid when one of them holds)
        or ``{name: "no_validation"}``. A parameter without an entry is not checked.
    params : dict
        ``{name: value}``.
    caller_name : str
        Who takes the parameters (``"RLOOPolicy"``, ``"SFTPolicy.sample"``), for the message.

    Raises
    ------
    InvalidParameterError
        For the first value no constraint of its entry accepts.

    Examples
    --------
    >>> from numbers import Integral
    >>> from prefopt.validation import Interval, validate_parameter_constraints
    >>> validate_parameter_constraints(
    ...     {"k": [Interval(Integral, 2, None, closed="left")]}, {"k": 1}, caller_name="Toy")
    Traceback (most recent call last):
    ...
    prefopt.validation.InvalidParameterError: The 'k' parameter of Toy must be an int in the range [2, inf). Got 1 instead.
    """  # noqa: E501
    for name, value in params.items():
        declared = constraints.get(name, "no_validation")
        if isinstance(declared, str) and declared == "no_validation":
            continue
        checks = [_make(c) for c in declared]
        if not any(check.is_satisfied_by(value) for check in checks):
            raise InvalidParameterError(
                f"The {name!r} parameter of {caller_name} must be {_either(checks)}. "
                f"Got {value!r} instead."
            )


def validate_params(estimator) -> None:
    """Check an estimator's constructor parameters against its ``_parameter_constraints``.

    What ``fit`` calls first. The parameters are ``get_params(deep=False)``; a class
    without ``_parameter_constraints`` is not checked.

    Parameters
    ----------
    estimator : estimator
        An instance whose class declares ``_parameter_constraints``.

    Raises
    ------
    InvalidParameterError
        Naming the first parameter that breaks its constraints, and what it must be.

    Examples
    --------
    >>> from sklearn.base import BaseEstimator
    >>> from numbers import Real
    >>> from prefopt.validation import Interval, validate_params
    >>> class Toy(BaseEstimator):
    ...     _parameter_constraints = {"alpha": [Interval(Real, 0, None, closed="left")]}
    ...     def __init__(self, *, alpha=1.0):
    ...         self.alpha = alpha
    >>> validate_params(Toy(alpha=0.5))
    >>> validate_params(Toy(alpha=-1))
    Traceback (most recent call last):
    ...
    prefopt.validation.InvalidParameterError: The 'alpha' parameter of Toy must be a float in the range [0.0, inf). Got -1 instead.
    """  # noqa: E501
    validate_parameter_constraints(
        getattr(type(estimator), "_parameter_constraints", {}),
        estimator.get_params(deep=False),
        caller_name=type(estimator).__name__,
    )
