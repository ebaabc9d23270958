"""The ``__init__`` of a policy, made from the common parameters' table (``_params.py``).

:func:`make_init` writes the keyword-only ``__init__`` a built-in (or a user's
algorithm) declares with only the defaults it changes and its own parameters;
:func:`store_params` is the one line a hand-written ``__init__`` needs. Kept apart
from the table, so that the table grows by entries alone.
"""

from __future__ import annotations

from ._params import COMMON_PARAMETERS

# The types a default may have: literals, stored verbatim and never shared mutably.
_LITERALS = (type(None), bool, int, float, str)


def make_init(**declared):
    """An ``__init__`` taking every common parameter and the algorithm's own.

    The built-in algorithms write ``__init__ = make_init(...)`` with only what
    they change; a user's algorithm may do the same. The function made is what
    one would write by hand: keyword-only, a literal default per parameter,
    each argument stored verbatim (no validation: ``fit`` validates).

    Parameters
    ----------
    **declared : None, bool, int, float or str
        A name of :data:`COMMON_PARAMETERS` with the algorithm's own default
        (where it differs from the table), or a new parameter of the algorithm
        with its default. New parameters follow ``beta`` in the signature, in
        the order given.

    Returns
    -------
    __init__ : function
        Its ``differs`` attribute holds the common defaults it changes, and
        ``own`` the names of the algorithm's own parameters.

    Examples
    --------
    >>> import inspect
    >>> init = make_init(k=4, n_minibatches=2)
    >>> parameters = inspect.signature(init).parameters
    >>> list(parameters)[:5]
    ['self', 'model', 'tokenizer', 'beta', 'k']
    >>> parameters["n_minibatches"].default, parameters["n_epochs"].default
    (2, 1)
    >>> init.differs, init.own
    ({'n_minibatches': 2}, ['k'])
    """
    for name, value in declared.items():
        if type(value) not in _LITERALS:
            raise TypeError(
                f"make_init: {name}={value!r} is not a literal (None, bool, int, float or str); "
                "a default is stored verbatim and must not be shared between estimators."
            )
        table = COMMON_PARAMETERS.get(name)
        if table is not None and type(value) is type(table.default) and value == table.default:
            raise ValueError(
                f"make_init: {name}={value!r} is the common default already; declare only "
                "the defaults an algorithm changes."
            )
    own = [name for name in declared if name not in COMMON_PARAMETERS]
    common = list(COMMON_PARAMETERS)
    at = common.index("beta") + 1
    names = [*common[:at], *own, *common[at:]]
    # Generated as dataclasses generate __init__: a real function with an explicit
    # keyword-only signature, which get_params introspects and Python checks on each call.
    source = f"def __init__(self, *, {', '.join(names)}):\n"
    source += "".join(f"    self.{name} = {name}\n" for name in names)
    namespace: dict = {}
    exec(source, {}, namespace)
    init = namespace["__init__"]
    init.__kwdefaults__ = {
        name: declared[name] if name in declared else COMMON_PARAMETERS[name].default
        for name in names
    }
    init.__doc__ = "Store the parameters as given (scikit-learn's rule); ``fit`` validates them."
    init.differs = {name: value for name, value in declared.items() if name not in own}
    init.own = own
    return init


def store_params(estimator, params: dict) -> None:
    """Store ``__init__``'s arguments verbatim, as scikit-learn requires (no validation).

    Parameters
    ----------
    estimator : estimator
        The estimator being constructed.
    params : dict
        ``locals()`` of its ``__init__``.

    Examples
    --------
    >>> class Toy:
    ...     def __init__(self, *, a=1):
    ...         store_params(self, locals())
    >>> Toy(a=2).a
    2
    """
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)
