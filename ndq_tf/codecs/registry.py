"""Looking codecs up by name, spec string or Keras config."""

import ast

import keras

from ndq_tf.codecs import base
from ndq_tf.codecs import baselines
from ndq_tf.codecs import dithered
from ndq_tf.codecs import entropy_coded
from ndq_tf.codecs import nested

__all__ = ["get", "serialize", "NAMES"]

#: Short names accepted by `get`, for flags and configuration files.
NAMES = {
    "float32": baselines.Float32Codec,
    "float16": baselines.Float16Codec,
    "bfloat16": baselines.BFloat16Codec,
    "dqsg": dithered.DitheredCodec,
    "ecdq": entropy_coded.EntropyCodedDitheredCodec,
    "half_dithered": dithered.HalfDitheredCodec,
    "ndqsg": nested.NestedDitheredCodec,
    "qsgd": baselines.QSGDCodec,
    "terngrad": baselines.TernGradCodec,
}


def serialize(codec):
  """A codec's Keras config dict (`keras.saving.serialize_keras_object`)."""
  return keras.saving.serialize_keras_object(codec)


def get(identifier, names=None):
  """Returns a codec from a codec, a Keras config dict or a spec string.

  A spec string is a short name optionally followed by `:` and keyword
  arguments, e.g. `"dqsg"`, `"dqsg:num_levels=3,bucket_size=256"`,
  `"ndqsg:num_levels=3,coarse_ratio=3,alpha=0.9"`. Names: float32, float16,
  bfloat16, dqsg, ecdq, half_dithered, ndqsg, qsgd, terngrad.

  Args:
    identifier: a `Codec`, a dict from `serialize`, or a spec string.
    names: the short names and their classes; default `NAMES`
      (`ndq_tf.codecs.get` adds `powersgd`).

  Returns:
    A `Codec`.

  Raises:
    ValueError: for an unknown name or a malformed spec.
  """
  names = NAMES if names is None else names
  kinds = tuple({base.Codec, *names.values()})
  if isinstance(identifier, kinds):
    return identifier
  if isinstance(identifier, dict):
    codec = keras.saving.deserialize_keras_object(identifier)
    if not isinstance(codec, kinds):
      raise ValueError(
          f"`identifier` must describe an ndq_tf codec. Received: "
          f"identifier={identifier!r}.")
    return codec
  if not isinstance(identifier, str):
    raise ValueError(
        f"`identifier` must be a Codec, a config dict or a string. Received: "
        f"identifier={identifier!r}.")
  name, _, args = identifier.partition(":")
  name = name.strip().lower()
  if name not in names:
    raise ValueError(
        f"Unknown codec name {name!r} in identifier={identifier!r}. Valid "
        f"names: {', '.join(sorted(names))}.")
  kwargs = {}
  for item in filter(None, (a.strip() for a in args.split(","))):
    key, sep, value = item.partition("=")
    if not sep:
      raise ValueError(
          f"Malformed codec argument {item!r} in identifier={identifier!r}: "
          f"expected key=value.")
    value = value.strip()
    try:
      kwargs[key.strip()] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      # A bare word is a string option, e.g. `alpha=mmse`.
      if not value.isidentifier():
        raise ValueError(
            f"Malformed value {value!r} for {key!r} in identifier="
            f"{identifier!r}.") from None
      kwargs[key.strip()] = value
  try:
    return names[name](**kwargs)
  except TypeError as e:
    raise ValueError(f"Bad arguments in identifier={identifier!r}: {e}") from e
