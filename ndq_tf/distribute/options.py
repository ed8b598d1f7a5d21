"""`CompressionOptions`: what to compress and how, for every strategy alike.

The analogue of `tf.distribute.experimental.CommunicationOptions` for the
compressed exchange: one validated, serializable object used by
`ndq_tf.CompressedAllReduce`, `ndq_tf.MirroredStrategy` and
`ndq_tf.MultiWorkerMirroredStrategy`, so that the strategies accept the same
codec forms and apply the same rules.

Its fields are declared once, here: their types and defaults in `FIELDS`,
their help in the docstring of `CompressionOptions`. The strategies and
`CompressedAllReduce` take them among their own arguments (`arguments`,
which builds their signatures and help from these), or all at once as
`options=CompressionOptions(...)`.
"""

import inspect
from typing import Any, Mapping, Union

import keras

from ndq_tf import _deprecation
from ndq_tf import codecs as ndq_codecs
from ndq_tf.core import cost_model
from ndq_tf.core import exchanges
from ndq_tf.distribute import arguments as arguments_lib

__all__ = [
    "DEFAULT_CHUNK_ELEMENTS",
    "DEFAULT_MIN_ELEMENTS",
    "DEFAULT_REFERENCE_GROUP",
    "EXCHANGES",
    "FIELDS",
    "CodecLike",
    "CompressionOptions",
    "arguments",
    "coerce_codec",
]

#: What `codec` may be: a codec, a spec string or a config dict.
CodecLike = Union[ndq_codecs.Codec, str, Mapping[str, Any]]

#: The values of `exchange` (`CompressionOptions`): `"auto"` or one of the
#: exchanges (`ndq_tf.core.exchanges.NAMES`).
EXCHANGES = ("auto",) + exchanges.NAMES

# The former name of `EXCHANGES` (deprecated, one release).
__getattr__ = _deprecation.moved_attributes(
    __name__, {"TRANSPORTS": f"{__name__}.EXCHANGES"})

#: Default `min_elements`: smaller tensors travel losslessly. Every tensor
#: starts on a bucket boundary, so a tensor of `n < bucket_size` elements
#: costs a whole bucket; below a few dozen elements compression *adds* bits,
#: and below a few hundred it saves a negligible number of bits on the
#: tensors (biases, norm scales) whose per-element error matters most. The
#: measurement is in docs/distribute.md ("Why `min_elements=256`").
DEFAULT_MIN_ELEMENTS = 256

#: Default `chunk_elements`: a fused buffer of more elements is exchanged
#: in chunks of about this many, so that one chunk's exchange overlaps the
#: next chunk's encode and the previous one's decode. Why this size:
#: docs/distribute.md ("Chunks"), measured in docs/benchmarks.md ("Two
#: workers on fast links; the pipelined exchange").
DEFAULT_CHUNK_ELEMENTS = 2**20

#: Default size of the reference group P1 of a nested codec: half the
#: senders.
DEFAULT_REFERENCE_GROUP = 0.5

#: The fields of `CompressionOptions`, in its positional order: name ->
#: (type, default). Their help is in its docstring's Args section.
FIELDS = {
    "codec": ("CodecLike", arguments_lib.REQUIRED),
    "min_elements": ("int", DEFAULT_MIN_ELEMENTS),
    "seed": ("int", 0),
    "compress_indexed_slices": ("bool", False),
    "reference_codec": ("CodecLike | None", None),
    "reference_group": ("int | float | None", None),
    "adaptive": ("bool | None", None),
    "exchange": ("str", "auto"),
    "chunk_elements": ("int | None", DEFAULT_CHUNK_ELEMENTS),
    "reduce_scatter_levels": ("int | None", None),
    "reduce_scatter_error_feedback": ("bool", False),
}

#: Deprecated names of fields (one release): old name -> field.
RENAMED = {
    "transport": "exchange",
    "reference_replicas": "reference_group",
    "reference_workers": "reference_group",
}

# What `get_config` stores under other names than the fields' (the keys of
# release 0.1.0, which its `from_config` needs): field -> key.
_STORED_AS = {"exchange": "transport"}

_CODEC_METHODS = ("encode", "decode", "to_wire", "from_wire", "wire_bits")


def coerce_codec(codec, name="codec"):
  """A codec instance from a codec, a spec string or a Keras config dict.

  Args:
    codec: an `ndq_tf` codec, a spec string for `ndq_tf.codecs.get`
      (`"dqsg:num_levels=3"`) or a config dict from `ndq_tf.codecs.serialize`.
    name: the argument's name, for error messages.

  Returns:
    The codec.

  Raises:
    TypeError: for a codec *class* (the message suggests the call), `None`,
      or an object without the codec methods.
    ValueError: for a string or dict that is not a codec spec.
  """
  if inspect.isclass(codec):
    raise TypeError(
        f"`{name}` must be a codec instance, not a class. Received: "
        f"{name}={codec.__module__}.{codec.__qualname__}; call it: "
        f"{name}={codec.__name__}().")
  if isinstance(codec, (str, dict)):
    try:
      codec = ndq_codecs.get(codec)
    except (ValueError, TypeError) as e:
      raise ValueError(
          f"`{name}` is not a codec spec ({e}). Received: {name}={codec!r}."
      ) from None
  if getattr(codec, "low_rank", False) and not inspect.isclass(codec):
    return codec  # `ndq_tf.PowerSGD`: the exchange core runs it.
  missing = [m for m in _CODEC_METHODS if not callable(getattr(codec, m, None))]
  if codec is None or missing:
    raise TypeError(
        f"`{name}` must be an ndq_tf codec (e.g. ndq_tf.DitheredCodec("
        f"num_levels=3)), a spec string (e.g. 'dqsg:num_levels=3') or a "
        f"codec config dict. Received: {name}={codec!r} of type "
        f"{type(codec).__name__}.")
  return codec


def _check_int(value, name, low=None, high=None):
  if isinstance(value, bool) or not isinstance(value, int) or (
      low is not None and value < low) or (high is not None and value >= high):
    bounds = []
    if low is not None:
      bounds.append(f">= {low}")
    if high is not None:
      bounds.append(f"< {high}")
    raise ValueError(
        f"`{name}` must be an integer {' and '.join(bounds)}. Received: "
        f"{name}={value!r}.")
  return value


class CompressionOptions:
  """What the compressed exchange compresses, and with which codecs.

  Example:

  >>> options = CompressionOptions("dqsg:num_levels=3", min_elements=1024)
  >>> CompressionOptions.from_config(options.get_config()) == options
  True

  The strategies and `ndq_tf.CompressedAllReduce` take these fields as
  their own arguments, or all at once as `options=`. The senders are the
  replicas of `ndq_tf.MirroredStrategy` and the workers of
  `ndq_tf.MultiWorkerMirroredStrategy`.

  Args:
    codec: the gradient codec: an `ndq_tf` codec, a spec string
      (`"dqsg:num_levels=3"`) or a config dict; or `ndq_tf.PowerSGD`
      (`"powersgd:rank=4"`), low-rank factors with error feedback.
    min_elements: tensors with fewer elements travel losslessly (int >= 1).
    seed: base seed of the dither, an integer in `[-2**31, 2**31)`.
    compress_indexed_slices: densify `IndexedSlices` (embedding gradients)
      of a static dense shape and compress them; off by default (a sparse
      update is usually smaller than a dense compressed one).
    reference_codec: nested `codec` only (required then): the codec of the
      reference group P1, the senders decoded first; without side
      information, with `codec`'s `bucket_size`.
    reference_group: nested `codec` only: size of the reference group P1
      (senders `0 .. |P1| - 1`), an int count `>= 1` or a fraction of the
      senders in `(0, 1)`; default 0.5.
    adaptive: nested `codec` only: every nested sender encodes with its own
      measured noise, saved with the model like the step counter (see
      `ndq_tf.core.nested_state`). None: True iff `codec.alpha == "mmse"`
      (which needs it).
    exchange: how the payloads are exchanged: `"all_gather"` (every
      receiver gets every sender's payload and decodes each),
      `"all_reduce"` (the senders agree on shared scales and their codes
      are summed as integers, or float16/bfloat16/float32 values by a
      float ring;
      only for the codecs whose payloads add up, `Codec.summed_form`),
      `"reduce_scatter"` (bucketed codecs, nested groups too: each sender's
      shard `j` goes to receiver `j`, which sums the shards and
      re-quantizes the sum with DQSG (an entropy-coded codec with itself)
      for an all-gather; bits and decode
      work flat in the number of senders,
      `ndq_tf.core.exchanges.reduce_scatter`; across processes not in the
      adaptive nested mode), or `"auto"` (default): per exchange, the one a
      time model of bits and decode work says is fastest
      (`resolve_transport`, `ndq_tf.core.cost_model.auto`, logged once).
      See docs/scaling.md.
    chunk_elements: a fused buffer of more elements than this is encoded,
      sent, decoded and summed in chunks of about this many (whole
      buckets), so that the chunks' stages overlap; the result is bit for
      bit the one without chunks (`FusionPlan.chunks`). None: one chunk.
      Default `DEFAULT_CHUNK_ELEMENTS`.
    reduce_scatter_levels: `exchange="reduce_scatter"` only: the
      `num_levels` of the DQSG that re-quantizes the reduced shards; None:
      `codec.num_levels` for a `DitheredCodec`, at least 2 (the sum of the
      shards has a wider range than one gradient; docs/algorithms.md). Not
      for a variable-length codec (`EntropyCodedDitheredCodec`), which
      re-codes the shards itself.
    reduce_scatter_error_feedback: `exchange="reduce_scatter"` only: each
      receiver adds its last re-quantization's residual to its reduced
      shard before re-quantizing it, so stage 2's errors do not accumulate
      over steps (`ndq_tf.core.exchanges.feedback`; default False).
    group_argument: the name `reference_group` has in error messages; not
      part of the config.
    transport: deprecated name of `exchange` (warns once; passing both is
      an error).
    reference_replicas: deprecated name of `reference_group` (warns once;
      passing both is an error).
    reference_workers: deprecated name of `reference_group` (warns once;
      passing both is an error).

  Raises:
    TypeError: if `codec` or `reference_codec` is not a codec (a class,
      `None`, an object without the codec methods).
    ValueError: for bad values, with the argument's name and value.
  """

  def __init__(self, *args, **kwargs):
    # The signature (`_ARGUMENTS`) is built from `FIELDS` below the class.
    values, _ = _ARGUMENTS.bind(self, args, kwargs)
    codec = coerce_codec(values["codec"], "codec")
    self._min_elements = _check_int(values["min_elements"], "min_elements",
                                    low=1)
    self._seed = _check_int(values["seed"], "seed", low=-2**31, high=2**31)
    indexed_slices = values["compress_indexed_slices"]
    if not isinstance(indexed_slices, bool):
      raise ValueError(
          f"`compress_indexed_slices` must be a bool. Received: "
          f"compress_indexed_slices={indexed_slices!r}.")
    self._compress_indexed_slices = indexed_slices
    self._group_argument = values["group_argument"]
    self._codec = codec
    (self._reference_codec, self._reference_group,
     self._adaptive) = self._check_reference(
         codec, values["reference_codec"], values["reference_group"],
         values["adaptive"])
    exchange = self._exchange = self._check_exchange(values["exchange"])
    levels = values["reduce_scatter_levels"]
    if levels is not None:
      _check_int(levels, "reduce_scatter_levels", low=1, high=2**15)
      if exchange != "reduce_scatter":
        raise ValueError(
            f"`reduce_scatter_levels` is only for exchange="
            f"'reduce_scatter'. Received: reduce_scatter_levels="
            f"{levels!r}, exchange={exchange!r}.")
      if getattr(codec, "variable_length", False):
        raise ValueError(
            f"`reduce_scatter_levels` sets stage 2's DQSG, and a "
            f"variable-length codec re-codes the reduced shards itself. "
            f"Received: reduce_scatter_levels={levels!r}, codec={codec!r}.")
    self._reduce_scatter_levels = levels
    feedback = values["reduce_scatter_error_feedback"]
    if not isinstance(feedback, bool):
      raise ValueError(
          f"`reduce_scatter_error_feedback` must be a bool. Received: "
          f"reduce_scatter_error_feedback={feedback!r}.")
    if feedback and exchange != "reduce_scatter":
      raise ValueError(
          f"`reduce_scatter_error_feedback` is only for exchange="
          f"'reduce_scatter'. Received: reduce_scatter_error_feedback=True, "
          f"exchange={exchange!r}.")
    self._reduce_scatter_error_feedback = feedback
    chunk_elements = values["chunk_elements"]
    self._chunk_elements = (None if chunk_elements is None else _check_int(
        chunk_elements, "chunk_elements", low=1))
    self._rounds = None
    if self.low_rank is not None:
      # What the low-rank exchange's rounds run with (`round_options`).
      self._rounds = tuple(
          type(self).from_config(dict(self.get_config(), codec=c))
          for c in (codec.fallback_codec, codec.factor_codec))

  def _check_exchange(self, exchange):
    if exchange not in EXCHANGES:
      raise ValueError(
          f"`exchange` must be one of {', '.join(map(repr, EXCHANGES))}. "
          f"Received: exchange={exchange!r}.")
    low_rank = self.low_rank
    for codec in ((low_rank.fallback_codec, low_rank.factor_codec)
                  if low_rank is not None else (self._codec,)):
      why = (None if exchange == "auto" else
             exchanges.get(exchange).refusal(codec, self.nested))
      if why:
        raise ValueError(
            f"exchange={exchange!r} cannot sum the payloads of "
            f"codec={codec!r}: {why}.")
    return exchange

  @property
  def exchange(self):
    """`"auto"`, `"all_gather"`, `"all_reduce"` or `"reduce_scatter"`."""
    return self._exchange

  @property
  def transport(self):
    """`exchange`, under the name the exchange core and telemetry read."""
    return self._exchange

  @property
  def reduce_scatter_levels(self):
    """Stage 2's `num_levels` under `"reduce_scatter"` (None: the default)."""
    return self._reduce_scatter_levels

  @property
  def reduce_scatter_error_feedback(self):
    """Whether stage 2 feeds its residual back (`exchanges.feedback`)."""
    return self._reduce_scatter_error_feedback

  @property
  def chunk_elements(self):
    """About how many elements per chunk of the exchange (None: one chunk)."""
    return self._chunk_elements

  def resolve_transport(self, num_senders, num_elements, **model):
    """The transport of an exchange of `num_elements` values among senders.

    `"auto"` picks `ndq_tf.core.cost_model.auto`: the exchange the time
    model says is fastest for this many senders and values (`model`: its
    `on_cpu` and `shared_memory`, from the senders' devices). Every sender
    resolves the same static numbers, so all of them pick the same (the
    exchange's fingerprint checks it).

    Returns:
      `"all_gather"`, `"all_reduce"` or `"reduce_scatter"`.
    """
    if self._exchange != "auto":
      return self._exchange
    return cost_model.auto(self.sender_codecs(num_senders), num_elements,
                          num_senders, **model)

  def _check_reference(self, codec, reference_codec, group, adaptive):
    """Validates the nested-group arguments (the paper's Algorithm 2)."""
    name = self._group_argument
    if not getattr(codec, "needs_side_information", False):
      if reference_codec is not None or group is not None or adaptive:
        raise ValueError(
            f"`reference_codec`, `{name}` and `adaptive` are only for a "
            f"nested `codec` (one that needs side information). Received: "
            f"codec={codec!r}, reference_codec={reference_codec!r}, "
            f"{name}={group!r}, adaptive={adaptive!r}.")
      return None, None, False
    if reference_codec is None:
      raise ValueError(
          f"A nested `codec` ({codec!r}) needs side information: pass "
          f"`reference_codec` (e.g. ndq_tf.DitheredCodec(num_levels=3)), the "
          f"codec of the reference senders decoded first, and optionally "
          f"`{name}` (a count or a fraction of the senders; default "
          f"{DEFAULT_REFERENCE_GROUP}). Received: reference_codec=None.")
    reference_codec = coerce_codec(reference_codec, "reference_codec")
    # Nested groups keep fixed-length codes (entropy-coded ones later).
    ndq_codecs.base.check_fixed_length(reference_codec, "reference_codec",
                                       reference_codec)
    if getattr(reference_codec, "needs_side_information", False):
      raise ValueError(
          f"`reference_codec` must not need side information (the reference "
          f"senders are decoded first). Received: "
          f"reference_codec={reference_codec!r}.")
    if reference_codec.bucket_size != codec.bucket_size:
      raise ValueError(
          f"`reference_codec` must have the bucket size of `codec` (one "
          f"fusion plan serves both). Received: reference_codec.bucket_size="
          f"{reference_codec.bucket_size} and codec.bucket_size="
          f"{codec.bucket_size}.")
    if group is None:
      group = DEFAULT_REFERENCE_GROUP
    if isinstance(group, bool) or not (
        (isinstance(group, int) and group >= 1) or
        (isinstance(group, float) and 0 < group < 1)):
      raise ValueError(
          f"`{name}` must be an int >= 1 or a float in (0, 1). Received: "
          f"{name}={group!r}.")
    mmse = getattr(codec, "alpha", None) == "mmse"
    if adaptive is None:
      adaptive = mmse
    if not isinstance(adaptive, bool):
      raise ValueError(
          f"`adaptive` must be a bool or None. Received: adaptive={adaptive!r}.")
    if mmse and not adaptive:
      raise ValueError(
          f"`alpha='mmse'` is only defined in the adaptive mode: pass "
          f"adaptive=True (or leave it None). Received: codec={codec!r}, "
          f"adaptive=False.")
    if adaptive:
      if not getattr(codec, "accepts_noise_scale", False):
        raise ValueError(
            f"`adaptive=True` needs a codec whose encode takes `noise_scale` "
            f"(ndq_tf.NestedDitheredCodec). Received: codec={codec!r}.")
      if codec.coarse_ratio % 2 == 0:
        raise ValueError(
            f"`adaptive=True` needs an odd `coarse_ratio` (the codec's DQSG "
            f"fallback is symmetric). Received: codec={codec!r}.")
    return reference_codec, group, adaptive

  @property
  def codec(self):
    return self._codec

  @property
  def min_elements(self):
    return self._min_elements

  @property
  def seed(self):
    return self._seed

  @property
  def compress_indexed_slices(self):
    return self._compress_indexed_slices

  @property
  def reference_codec(self):
    """The codec of the reference group P1 (None without a nested codec)."""
    return self._reference_codec

  @property
  def reference_group(self):
    """Size of P1: an int count or a fraction (None without a nested codec)."""
    return self._reference_group

  @property
  def adaptive(self):
    """Whether nested senders encode with their own measured noise."""
    return self._adaptive

  @property
  def nested(self):
    """Whether `codec` is nested (senders split into P1 and P2)."""
    return self._reference_codec is not None

  def reference_count(self, num_senders):
    """Size of P1 among `num_senders` senders (0 without a nested codec).

    A count is used as is; a fraction `f` gives `max(1, round(f·P))`, at
    most `P - 1`. 0 with fewer than 2 senders (nothing is exchanged).

    Raises:
      ValueError: if an int count leaves no nested sender (`count >= P`).
    """
    group = self._reference_group
    if group is None or num_senders < 2:
      return 0
    if isinstance(group, float):
      return min(num_senders - 1, max(1, int(round(group * num_senders))))
    if group >= num_senders:
      name = self._group_argument
      raise ValueError(
          f"`{name}` must leave at least one nested sender among the "
          f"{num_senders} senders (1 <= count < {num_senders}). Received: "
          f"{name}={group!r}.")
    return group

  def sender_codecs(self, num_senders):
    """The codec of every sender, in decode order (P1 first, then P2).

    With a low-rank `codec` (`ndq_tf.PowerSGD`), its fallback codec.
    """
    if self.low_rank is not None:
      return [self.low_rank.fallback_codec] * num_senders
    count = self.reference_count(num_senders)
    return ([self._reference_codec] * count
            + [self._codec] * (num_senders - count))

  @property
  def low_rank(self):
    """The `ndq_tf.PowerSGD` of a low-rank `codec`, else None."""
    return self._codec if getattr(self._codec, "low_rank", False) else None

  @property
  def round_options(self):
    """A low-rank codec's `(fallback, factor)` options, else None.

    The same options with `codec` the fallback codec (the round of the
    vectors, low-rate matrices and warm-up steps) and the factor codec
    (the rounds of `P` and `Q`); `ndq_tf.core.low_rank` runs each round
    as an exchange with these.
    """
    return self._rounds

  def get_config(self):
    """The constructor arguments, codecs as Keras configs (JSON-able).

    `exchange` is stored as `"transport"`, the key release 0.1.0 reads;
    `from_config` takes either.
    """
    config = {
        "codec": keras.saving.serialize_keras_object(self._codec),
        "min_elements": self._min_elements,
        "seed": self._seed,
        "compress_indexed_slices": self._compress_indexed_slices,
        "transport": self._exchange,
        "chunk_elements": self._chunk_elements,
    }
    if self._reduce_scatter_levels is not None:
      config["reduce_scatter_levels"] = self._reduce_scatter_levels
    if self._reduce_scatter_error_feedback:
      config["reduce_scatter_error_feedback"] = True
    if self.nested:
      config["reference_codec"] = keras.saving.serialize_keras_object(
          self._reference_codec)
      config["reference_group"] = self._reference_group
      config["adaptive"] = self._adaptive
    return config

  @classmethod
  def from_config(cls, config, group_argument="reference_group"):
    return cls(**stored_config(config), group_argument=group_argument)

  def __eq__(self, other):
    if not isinstance(other, CompressionOptions):
      return NotImplemented
    return self.get_config() == other.get_config()

  def __hash__(self):
    return hash(repr(self))

  def __repr__(self):
    nested = ""
    if self.nested:
      nested = (f", reference_codec={self._reference_codec!r}, "
                f"reference_group={self._reference_group!r}, "
                f"adaptive={self._adaptive}")
    return (f"CompressionOptions(codec={self._codec!r}, min_elements="
            f"{self._min_elements}, seed={self._seed}, compress_indexed_slices="
            f"{self._compress_indexed_slices}{nested}, exchange="
            f"{self._exchange!r}, chunk_elements={self._chunk_elements}"
            + (f", reduce_scatter_levels={self._reduce_scatter_levels}"
               if self._reduce_scatter_levels is not None else "")
            + (", reduce_scatter_error_feedback=True"
               if self._reduce_scatter_error_feedback else "") + ")")


_ARGUMENTS = None  # Set by `arguments` below, once the docstring exists.


def stored_config(config, **stored_as):
  """A `get_config` dict with its stored keys renamed to the fields'.

  Args:
    config: the dict (not modified).
    **stored_as: more `field=key` pairs than `exchange="transport"`, e.g.
      `reference_group="reference_replicas"`.

  Raises:
    ValueError: if a field is there under both names.
  """
  config = dict(config)
  for field, key in dict(_STORED_AS, **stored_as).items():
    if key in config:
      if field in config:
        raise ValueError(
            f"A config holds `{field}` under both its names. Received: "
            f"{field}={config[field]!r} and {key}={config[key]!r}.")
      config[field] = config.pop(key)
  return config


def config_under_keys(config, **stored_as):
  """`config` with the fields in `stored_as` renamed to their stored keys.

  The inverse of `stored_config`, for the strategies' own keys (e.g.
  `reference_group="reference_workers"`); `get_config` already stores
  `exchange` as `"transport"`.

  Args:
    config: a `get_config` dict (not modified).
    **stored_as: `field=key` pairs.
  """
  config = dict(config)
  for field, key in stored_as.items():
    if field in config:
      config[key] = config.pop(field)
  return config


def arguments(who, *entries, keyword_only=None, renamed=()):
  """The `arguments_lib.Arguments` of a constructor taking these fields.

  Args:
    who: the constructor's public name, for messages.
    *entries: in positional order, the name of a field (its type, default
      and help are the ones declared here) or an `arguments_lib.Argument`
      (the constructor's own, or a field declared otherwise).
    keyword_only: the name of the first keyword-only argument.
    renamed: the deprecated names of fields accepted (`RENAMED`).
  """
  docs = arguments_lib.args_section(CompressionOptions.__doc__)
  entries = [arguments_lib.Argument(e, *FIELDS[e], docs[e])
             if isinstance(e, str) else e for e in entries]
  return arguments_lib.Arguments(who, entries, keyword_only=keyword_only,
                                 renamed={old: RENAMED[old] for old in renamed})


_ARGUMENTS = arguments(
    "ndq_tf.distribute.CompressionOptions", *FIELDS,
    arguments_lib.Argument("group_argument", "str", "reference_group",
                           "the name of `reference_group` in errors."),
    renamed=("transport",))
_ARGUMENTS.apply(CompressionOptions, document=False)

#: The `codec` of the constructors that also take `options`.
CODEC_OR_OPTIONS = arguments_lib.Argument(
    "codec", "CodecLike | None", None,
    "the gradient codec: an `ndq_tf` codec, a spec string "
    "(`\"dqsg:num_levels=3\"`) or a config dict; leave it None when "
    "passing `options`.")

#: Their `options`.
OPTIONS = arguments_lib.Argument(
    "options", "CompressionOptions | None", None,
    "all the fields of `ndq_tf.distribute.CompressionOptions` at once "
    "(`codec` and the arguments above that are its fields), instead of "
    "passing them one by one; passing both is an error.")


def from_arguments(who, values, given, options=None):
  """The `CompressionOptions` of a constructor's bound arguments.

  Args:
    who: the constructor's public name, for messages.
    values: every argument's value (`Arguments.bind`); the fields among
      them make the options unless `options` is given.
    given: the arguments the caller passed.
    options: the `options` argument: a `CompressionOptions`, or None.

  Raises:
    TypeError: if `options` is not a `CompressionOptions`.
    ValueError: if `options` and fields are both given, naming both.
  """
  if options is None:
    return CompressionOptions(**{k: v for k, v in values.items()
                                 if k in FIELDS})
  if not isinstance(options, CompressionOptions):
    raise TypeError(
        f"`options` of {who} must be an ndq_tf.distribute.CompressionOptions."
        f" Received: options={options!r} of type {type(options).__name__}.")
  fields = {k: v for k, v in given.items() if k in FIELDS}
  if fields:
    raise ValueError(
        f"Pass the compression settings of {who} either as `options` or as "
        f"arguments ({', '.join(f'`{k}`' for k in fields)}), not both. "
        f"Received: options={options!r} and "
        + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ".")
  return options
