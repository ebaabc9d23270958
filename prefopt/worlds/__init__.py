"""Exact testbeds and tasks: worlds whose answer is known or whose gold reward is independent."""

from ._reasoning_gym import ReasoningGymWorld
from .arithmetic import ArithmeticWorld, CalculatorWorld
from .preference import PreferenceWorld
from .review import ReviewWorld
from .tiny_lm import TinyLMWorld

__all__ = [
    "ArithmeticWorld",
    "CalculatorWorld",
    "PreferenceWorld",
    "ReasoningGymWorld",
    "ReviewWorld",
    "TinyLMWorld",
]
