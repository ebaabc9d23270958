"""The state of one run, kept off the estimator's fitted attributes."""

from __future__ import annotations

import threading

import numpy as np
import torch

from ..backend import distributed

__all__ = ["RunState", "one_fit_at_a_time"]

_FITTING = threading.Lock()


class RunState:
    """What a run needs, besides the fitted model, to take its next step.

    The random streams (a torch generator for sampling and minibatch order, a
    numpy generator for the prompt stream), the optimiser, the endless
    reshuffled stream of prompt rows, the step at which this ``fit`` call began
    (the learning-rate schedule counts from it) and one-time warnings already
    given. A checkpoint is the estimator's fitted attributes plus
    :meth:`state_dict`; constructor parameters are never part of it.

    Parameters
    ----------
    generator : torch.Generator
        Draws samples and minibatch orders.
    rng : numpy.random.RandomState
        Shuffles the prompt stream.
    optimizer : torch.optim.Optimizer, default=None
        The optimiser of the trained parameters.
    start_step : int, default=0
        ``n_iter_`` when this ``fit`` call began.

    Examples
    --------
    >>> import numpy as np, torch
    >>> run = RunState(generator=torch.Generator().manual_seed(0),
    ...                rng=np.random.RandomState(0))
    >>> rows = run.next_rows(3, n_rows=2)
    >>> sorted(rows.tolist()[:2])
    [0, 1]
    >>> again = RunState(generator=torch.Generator(), rng=np.random.RandomState(1))
    >>> again.load_state_dict(run.state_dict())
    >>> bool((again.next_rows(5, n_rows=2) == run.next_rows(5, n_rows=2)).all())
    True
    """

    def __init__(self, *, generator, rng, optimizer=None, start_step: int = 0):
        self.generator = generator
        self.rng = rng
        self.optimizer = optimizer
        self.start_step = int(start_step)
        self.stream = np.zeros(0, dtype=np.int64)
        self.warned: set[str] = set()

    def next_rows(self, n: int, n_rows: int) -> np.ndarray:
        """The next ``n`` rows of an endless stream over ``n_rows`` rows, reshuffled each pass.

        Parameters
        ----------
        n : int
            Rows to take.
        n_rows : int
            Size of the data.

        Returns
        -------
        rows : ndarray of shape (n,)
        """
        # Every prompt once per pass, in a new order each pass (Huang et al. 2024).
        while len(self.stream) < n:
            self.stream = np.r_[self.stream, self.rng.permutation(n_rows)]
        out, self.stream = self.stream[:n], self.stream[n:]
        return out

    def warn_once(self, key: str) -> bool:
        """``True`` the first time ``key`` is seen in this run.

        Parameters
        ----------
        key : str
            Names the warning.

        Returns
        -------
        first : bool
        """
        first = key not in self.warned
        self.warned.add(key)
        return first

    def state_dict(self) -> dict:
        """Everything needed to continue the run exactly: tensors, arrays and numbers.

        Returns
        -------
        state : dict
        """
        name, keys, pos, has_gauss, cached = self.rng.get_state()
        # Distributed fits (a collective): every rank's sampling stream, row r for rank r.
        ranks = distributed.per_rank(self.generator.get_state())
        return {
            "generator": self.generator.get_state(),
            "rank_generators": ranks,
            "rng": {
                "name": name,
                "keys": np.asarray(keys),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            },
            "stream": np.asarray(self.stream, dtype=np.int64),
            "optimizer": None if self.optimizer is None else self.optimizer.state_dict(),
            "start_step": self.start_step,
            "warned": sorted(self.warned),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned.

        Parameters
        ----------
        state : dict
            A state from :meth:`state_dict`.
        """
        generator = state["generator"]
        ranks = state.get("rank_generators")
        n = distributed.world_size()
        if ranks is not None and len(ranks) != n:
            raise ValueError(
                f"This checkpoint was written by a run on {len(ranks)} rank(s); resume it on "
                f"{len(ranks)} (this run has {n}), since each rank's random stream is its own."
            )
        if ranks is not None:
            generator = ranks[distributed.rank()].clone()  # set_state reads a whole storage
        self.generator.set_state(torch.as_tensor(generator, dtype=torch.uint8))
        rng = state["rng"]
        self.rng.set_state(
            (
                rng["name"],
                np.asarray(rng["keys"], dtype=np.uint32),
                rng["pos"],
                rng["has_gauss"],
                rng["cached_gaussian"],
            )
        )
        self.stream = np.asarray(state["stream"], dtype=np.int64)
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.start_step = int(state["start_step"])
        self.warned = set(state.get("warned", ()))


class one_fit_at_a_time:
    """Refuse a second concurrent ``fit`` of one estimator object (two threads).

    Two threads fitting one object would interleave their writes to its fitted
    attributes and the torch modules they hold: a crash inside torch, or mixed
    state returned as if nothing happened. The guard is re-entrant within one
    thread (a subclass's ``fit`` calling its parent's), and released when the
    fit ends, normally or by an error.

    Parameters
    ----------
    estimator : object
        The estimator being fitted.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> est = SimpleNamespace()
    >>> with one_fit_at_a_time(est):
    ...     with one_fit_at_a_time(est):  # the same thread: allowed
    ...         pass
    >>> est._fitting
    False
    """

    def __init__(self, estimator):
        self.estimator = estimator

    def __enter__(self):
        # One attribute: False when idle, (thread id, depth) while a fit runs.
        state = self.estimator.__dict__
        me = threading.get_ident()
        with _FITTING:
            owner, depth = state.get("_fitting") or (None, 0)
            if owner not in (None, me):
                raise RuntimeError(
                    f"This {type(self.estimator).__name__} is already being fitted (in another "
                    "thread); two fits of one object would corrupt it. Fit a clone "
                    "(sklearn.base.clone) instead."
                )
            state["_fitting"] = (me, depth + 1)
        return self

    def __exit__(self, *exc):
        state = self.estimator.__dict__
        with _FITTING:
            owner, depth = state.get("_fitting") or (None, 1)
            state["_fitting"] = (owner, depth - 1) if depth > 1 else False
        return False
