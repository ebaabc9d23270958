"""The arithmetic world: generated sums with exact answers, a verifiable reward.

Most post-training runs with reinforcement learning today score a response
with a checker that knows the answer (a "verifiable reward"), as DeepSeekMath
(Shao et al. 2024) and Tulu 3 (Lambert et al. 2024) do on maths problems.
This world is such a task at the size of a test: problems such as ``"37+45="``
whose exact answer (``"82"``) a reward reads from the problem itself or from
an ``answer`` column, a character-level tokenizer built locally and a tiny
GPT-2 (or Llama- or Qwen2-shaped) config sized to it.
"""

from ._calculator import CalculatorWorld
from ._world import ArithmeticWorld

__all__ = ["ArithmeticWorld", "CalculatorWorld"]
