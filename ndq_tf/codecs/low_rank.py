"""`PowerSGD`: what a low-rank exchange compresses, and with which codecs.

Not a codec: a low-rank exchange keeps state (each replica's residual, the
factor `Q` of every matrix), works on each tensor's shape and needs two
dependent rounds, so it runs in the exchange core
(`ndq_tf.core.low_rank`). This class is its configuration, validated and
serializable like a codec's, and accepted wherever a codec is
(`codec=ndq_tf.PowerSGD(rank=4)`, `codec="powersgd:rank=4"`, a Keras
config dict).

References:
  T. Vogels, S. P. Karimireddy, M. Jaggi. PowerSGD: Practical Low-Rank
  Gradient Compression for Distributed Optimization. NeurIPS 2019.
  PyTorch's `torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py`.
"""

import keras

from ndq_tf.codecs import base
from ndq_tf.codecs import registry

__all__ = ["NAMES", "PowerSGD", "get"]


def get(identifier):
  """`registry.get`, whose names include `powersgd` (`PowerSGD`).

  `"powersgd:rank=4,factor_codec=float16"`: the codec arguments of a spec
  string take short names without arguments; pass a `PowerSGD` for more.
  """
  return registry.get(identifier, NAMES)


def _codec(value, name):
  """A codec that can be summed, from a codec, spec string or config dict."""
  if isinstance(value, PowerSGD):
    codec = value
  else:
    try:
      codec = registry.get(value)
    except ValueError as e:
      raise ValueError(
          f"`{name}` must be a codec, a codec spec string or a codec config "
          f"dict ({e}). Received: {name}={value!r}.") from None
  if isinstance(codec, PowerSGD) or codec.needs_side_information:
    raise ValueError(
        f"`{name}` must be a codec whose decoded payloads can be summed "
        f"(float32, float16, dqsg, qsgd, terngrad, ...): a nested codec "
        f"needs side information, and a low-rank one state. Received: "
        f"{name}={value!r}.")
  return base.check_fixed_length(codec, name, value)


@keras.saving.register_keras_serializable(package="ndq_tf")
class PowerSGD:
  """Low-rank gradients with error feedback (PowerSGD), for both strategies.

  Each weight gradient viewed as a matrix `M` of shape
  `(prod(shape[:-1]), shape[-1])` travels as two factors: `P = M Q`,
  summed over the replicas and orthogonalized, then `Q = Mᵀ P`, averaged;
  the sum returned is `W·P Q̄ᵀ` (the mean of `P Q̄ᵀ` over `W` replicas
  summed). Each replica keeps what the approximation left out, `M − P Q̄ᵀ`,
  and adds it to its next gradient (error feedback), and `Q` warm-starts
  the next step. Vectors, matrices whose `compression_rate` is below
  `min_compression_rate`, and every tensor during the first `start_step`
  exchanges travel with `fallback_codec` in the same step.

  >>> strategy = ndq_tf.MirroredStrategy(
  ...     codec=ndq_tf.PowerSGD(rank=4, start_step=100))

  Args:
    rank: `k >= 1`, the rank of the approximation (PyTorch's
      `matrix_approximation_rank`); a matrix with fewer rows or columns
      uses that many.
    factor_codec: how the factors travel: `"float32"` (PyTorch's
      PowerSGD), `"float16"`, or a dithered codec such as
      `"dqsg:num_levels=3"`; any codec whose payloads can be summed. Error
      feedback absorbs its quantization error.
    fallback_codec: how vectors, low-rate matrices and the warm-up's
      tensors travel; ternary DQSG by default, `"float32"` for PyTorch's
      behaviour.
    start_step: compressed exchanges (steps, for one all-reduce per step)
      sent with `fallback_codec` alone before the low rank starts
      (PyTorch's `start_powerSGD_iter`). PyTorch's default is 1000.
    min_compression_rate: a matrix goes low rank only if
      `rows·cols / ((rows + cols)·k)` is at least this (PyTorch's
      default, 2).
    warm_start: whether each step starts from the last step's `Q`
      (otherwise from a new `±1` draw every step).
    orthogonalization_epsilon: added to every nonzero norm in the
      orthogonalization (PyTorch's option); 0 by default.

  Raises:
    ValueError: a rank below 1, a negative `start_step` or rate, or a
      factor or fallback codec that cannot be summed (nested codecs).
  """

  #: Not a stateless codec (the options and the cost model check this).
  low_rank = True
  needs_side_information = False

  def __init__(self, rank=1, factor_codec="float32", fallback_codec="dqsg",
               start_step=1000, min_compression_rate=2.0, warm_start=True,
               orthogonalization_epsilon=0.0):
    self._rank = base.check_int("rank", rank, 1)
    self._factor_codec = _codec(factor_codec, "factor_codec")
    self._fallback_codec = _codec(fallback_codec, "fallback_codec")
    self._start_step = base.check_int("start_step", start_step, 0)
    self._min_compression_rate = base.check_float(
        "min_compression_rate", min_compression_rate, 0.0, 1e9,
        low_inclusive=True)
    if not isinstance(warm_start, bool):
      raise ValueError(f"`warm_start` must be a bool. Received: "
                       f"warm_start={warm_start!r}.")
    self._warm_start = warm_start
    self._epsilon = base.check_float(
        "orthogonalization_epsilon", orthogonalization_epsilon, 0.0, 1.0,
        low_inclusive=True)

  rank = property(lambda self: self._rank)
  factor_codec = property(lambda self: self._factor_codec)
  fallback_codec = property(lambda self: self._fallback_codec)
  start_step = property(lambda self: self._start_step)
  min_compression_rate = property(lambda self: self._min_compression_rate)
  warm_start = property(lambda self: self._warm_start)
  orthogonalization_epsilon = property(lambda self: self._epsilon)

  @property
  def bucket_size(self):
    """The fallback codec's (the fusion plan of its tensors uses it)."""
    return self._fallback_codec.bucket_size

  def get_config(self):
    return {
        "rank": self._rank,
        "factor_codec": keras.saving.serialize_keras_object(
            self._factor_codec),
        "fallback_codec": keras.saving.serialize_keras_object(
            self._fallback_codec),
        "start_step": self._start_step,
        "min_compression_rate": self._min_compression_rate,
        "warm_start": self._warm_start,
        "orthogonalization_epsilon": self._epsilon,
    }

  @classmethod
  def from_config(cls, config):
    return cls(**config)

  def __repr__(self):
    return (f"PowerSGD(rank={self._rank}, factor_codec="
            f"{self._factor_codec!r}, fallback_codec={self._fallback_codec!r}"
            f", start_step={self._start_step}, min_compression_rate="
            f"{self._min_compression_rate}, warm_start={self._warm_start}, "
            f"orthogonalization_epsilon={self._epsilon})")

  def __eq__(self, other):
    return (type(self) is type(other)
            and repr(self) == repr(other))

  def __hash__(self):
    return hash(repr(self))


#: Short names accepted by `get`: the codecs', and `powersgd`.
NAMES = {**registry.NAMES, "powersgd": PowerSGD}
