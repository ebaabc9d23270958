"""Exact testbeds and tasks: worlds whose answer is known or whose gold reward is independent."""

from .arithmetic import ArithmeticWorld, CalculatorWorld
from .preference import PreferenceWorld
from .review import ReviewWorld
from .tiny_lm import TinyLMWorld

__all__ = ["ArithmeticWorld", "CalculatorWorld", "PreferenceWorld", "ReviewWorld", "TinyLMWorld"]
