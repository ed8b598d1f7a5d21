"""Validation of the Python arguments of ops and codecs.

One rule and one message for every integer argument, so that every layer
raises the same `ValueError` (naming the argument, the rule and the value
received). The bottom layer's: codecs and everything above import it from
here.
"""

import numpy as np

__all__ = ["check_int"]


def check_int(name, value, low, high=None, power_of_two=False):
  """Validates an integer argument; returns it as a Python `int`.

  Args:
    name: the argument's name, for the message.
    value: a Python or NumPy integer (not a bool).
    low: the least valid value.
    high: the largest valid value, or None for no bound.
    power_of_two: whether `value` must also be a power of two.

  Returns:
    `int(value)`.

  Raises:
    ValueError: ``"`bins` must be a power of two in [1, 256]. Received:
      bins=3."`` and the like.
  """
  ok = (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        and value >= low and (high is None or value <= high)
        and not (power_of_two and (value < 1 or value & (value - 1))))
  if not ok:
    kind = "a power of two" if power_of_two else "an integer"
    rule = f">= {low}" if high is None else f"in [{low}, {high}]"
    raise ValueError(
        f"`{name}` must be {kind} {rule}. Received: {name}={value!r}.")
  return int(value)
