"""The random generators an object given to ``fit`` carries, and their states as data.

A stochastic reward (:class:`~prefopt.rewards.NoisyReward`, a reward with its
own ``RandomState``) draws from a generator that advances with every call. A
checkpoint records every such generator's state, found by walking the reward's
attributes, slots, closures, defaults and containers; a resume sets them back,
so a run resumed in a new process (with a freshly built reward) draws the same
numbers as the uninterrupted run.
"""

from __future__ import annotations

import contextlib
import functools
import random
import types

import numpy as np
import torch

_GENERATORS = (np.random.RandomState, np.random.Generator, torch.Generator, random.Random)
# Containers and objects are followed this deep (a generator deeper is not recorded).
_DEPTH = 40


def _children(value):
    """``(name, child)`` pairs of the places a generator may hide inside ``value``."""
    if isinstance(value, dict):
        return [(f"[{k!r}]", v) for k, v in value.items()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, functools.partial):
        return [(".func", value.func), (".args", value.args), (".keywords", value.keywords)]
    if isinstance(value, types.MethodType):
        return [(".__func__", value.__func__), (".__self__", value.__self__)]
    if isinstance(value, types.FunctionType):
        cells = []
        for i, cell in enumerate(value.__closure__ or ()):
            with contextlib.suppress(ValueError):  # an empty cell
                cells.append((f".closure[{i}]", cell.cell_contents))
        return [*cells, (".defaults", value.__defaults__), (".kwdefaults", value.__kwdefaults__)]
    if isinstance(value, (str, bytes, int, float, type, types.ModuleType, torch.Tensor)):
        return []
    if isinstance(value, np.ndarray):
        return []
    out = [(f".{k}", v) for k, v in vars(value).items()] if hasattr(value, "__dict__") else []
    for klass in type(value).__mro__:
        slots = vars(klass).get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                out.append((f".{name}", getattr(value, name)))
    return out


def random_generators(value, path: str = "", seen=None, depth: int = 0) -> dict:
    """Every random generator reachable inside ``value``, by its path.

    Parameters
    ----------
    value : object
        A reward, a labeler, or anything they hold.
    path : str, default=""
        The path of ``value`` itself.

    Returns
    -------
    generators : dict of str to generator
        ``numpy.random.RandomState``, ``numpy.random.Generator``,
        ``torch.Generator`` and ``random.Random`` objects, each once.

    Examples
    --------
    >>> import numpy as np
    >>> class Noisy:
    ...     def __init__(self):
    ...         self.rng = np.random.RandomState(0)
    >>> list(random_generators({"reward": Noisy()}))
    ["['reward'].rng"]
    """
    seen = set() if seen is None else seen
    if id(value) in seen or depth > _DEPTH or value is None:
        return {}
    seen.add(id(value))
    if isinstance(value, _GENERATORS):
        return {path: value}
    out = {}
    for name, child in _children(value):
        out.update(random_generators(child, path + name, seen, depth + 1))
    return out


def generator_state(generator):
    """A generator's state as data (numbers, lists and tensors).

    Parameters
    ----------
    generator : RandomState, Generator, torch.Generator or random.Random

    Returns
    -------
    state : dict

    Examples
    --------
    >>> import numpy as np
    >>> a, b = np.random.RandomState(0), np.random.RandomState(1)
    >>> set_generator_state(b, generator_state(a))
    >>> a.rand() == b.rand()
    True
    """
    if isinstance(generator, np.random.RandomState):
        name, keys, pos, has_gauss, cached = generator.get_state()
        keys = torch.as_tensor(keys.astype(np.int64))
        return {"RandomState": [name, keys, int(pos), int(has_gauss), float(cached)]}
    if isinstance(generator, np.random.Generator):
        return {"Generator": generator.bit_generator.state}
    if isinstance(generator, torch.Generator):
        return {"torch.Generator": generator.get_state()}
    version, internal, gauss = generator.getstate()
    return {"Random": [version, list(internal), gauss]}


def set_generator_state(generator, state: dict) -> None:
    """Set a generator to a state :func:`generator_state` returned.

    Parameters
    ----------
    generator : RandomState, Generator, torch.Generator or random.Random
    state : dict
    """
    if "RandomState" in state:
        name, keys, pos, has_gauss, cached = state["RandomState"]
        keys = np.asarray(torch.as_tensor(keys), dtype=np.uint32)
        generator.set_state((name, keys, int(pos), int(has_gauss), float(cached)))
    elif "Generator" in state:
        generator.bit_generator.state = state["Generator"]
    elif "torch.Generator" in state:
        generator.set_state(torch.as_tensor(state["torch.Generator"], dtype=torch.uint8))
    else:
        version, internal, gauss = state["Random"]
        generator.setstate((version, tuple(internal), gauss))


def random_states(objects: dict) -> dict:
    """The states of every generator inside ``objects`` (name to object), by path.

    Parameters
    ----------
    objects : dict of str to object

    Returns
    -------
    states : dict of str to dict

    Examples
    --------
    >>> import numpy as np
    >>> sorted(random_states({"reward": [np.random.RandomState(0)]}))
    ['reward[0]']
    """
    return {
        name + path: generator_state(generator)
        for name, value in objects.items()
        for path, generator in random_generators(value).items()
    }


def set_random_states(objects: dict, states: dict) -> None:
    """Set the generators inside ``objects`` to the ``states`` :func:`random_states` returned.

    Parameters
    ----------
    objects : dict of str to object
    states : dict of str to dict
    """
    generators = {
        name + path: generator
        for name, value in objects.items()
        for path, generator in random_generators(value).items()
    }
    for path, state in states.items():
        if path in generators:
            set_generator_state(generators[path], state)


@contextlib.contextmanager
def kept_random_states(objects: dict):
    """Run a block (a behaviour probe) and set every generator in ``objects`` back after it.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.RandomState(0)
    >>> with kept_random_states({"r": rng}):
    ...     _ = rng.rand(3)
    >>> rng.rand() == np.random.RandomState(0).rand()
    True
    """
    states = random_states(objects)
    try:
        yield
    finally:
        set_random_states(objects, states)
