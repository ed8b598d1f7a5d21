"""Encode and decode of a fused buffer: one `int32` wire per sender.

`encode_fused`/`encode_flat` turn a sender's tensors (or its fused buffer,
or one chunk of it) into its wire, each codec segment with its own seed
(`segment_seed`); `decode_senders` decodes every sender's
wire in the fixed order, with side information for the nested senders.
`ndq_tf.core.fusion` has the layout, the seeds and the order.
"""

import contextlib

import tensorflow as tf

from ndq_tf import ops as ndq_ops
from ndq_tf.core import fusion_plan
from ndq_tf.core import fusion_sum

__all__ = [
    "decode_senders",
    "decode_sum",
    "derive_seed",
    "encode_flat",
    "encode_fused",
    "segment_seed",
    "used_words",
    "wire_scales",
]


def derive_seed(base_seed, step, sender, segment=None):
  """The seed of one sender's payload at one step (or of one segment of it).

  Args:
    base_seed: shape-`[2]` integer tensor (the all-reduce's base seed).
    step: integer scalar, the aggregation counter.
    sender: integer scalar, the sender's fixed index (replica or worker).
    segment: None: the payload's seed; an index: the seed of that codec
      segment of the payload (`segment_seed`, as `encode_flat` folds it).

  Returns:
    A shape-`[2]` `int32` tensor; distinct `(step, sender)` pairs give
    unrelated seeds.
  """
  seed = ndq_ops.fold_seed(ndq_ops.fold_seed(base_seed, step), sender)
  return seed if segment is None else segment_seed(seed, segment)


def segment_seed(sender_seed, segment):
  """The seed of codec segment `segment` of one sender's payload.

  The one place the per-segment fold is written: `encode_flat` and the
  decodes draw each segment's dither from it, and an exchange that encodes
  the segment itself (the integer all-reduce's one bucketed segment) asks
  for the same seed (`derive_seed(..., segment=)`), so a sender's
  dither is the same under every exchange.

  Args:
    sender_seed: shape-`[2]` integer tensor, the sender's seed at this step
      (`derive_seed`).
    segment: integer, the segment's index in the payload.

  Returns:
    A shape-`[2]` `int32` tensor, `fold_seed(sender_seed, segment)`.
  """
  return ndq_ops.fold_seed(sender_seed, segment)


def encode_fused(codec, tensors, seed, plan=None, noise_scale=None):
  """Encodes several tensors into one sender's `int32` wire.

  Flattens, casts to `float32`, pads (see `FusionPlan`), concatenates,
  `codec.encode`s every segment with `segment_seed(seed, segment_index)` and
  concatenates the segments' `codec.to_wire` outputs.

  Example:

  >>> plan = FusionPlan.from_tensors(grads, codec.bucket_size)
  >>> wire = encode_fused(codec, grads, seed, plan)   # int32 [wire_words]

  Args:
    codec: an `ndq_tf` codec.
    tensors: list of floating point tensors with static shapes.
    seed: shape-`[2]` integer tensor, this sender's seed at this step.
    plan: the `FusionPlan` of `tensors`; built from them when None.
    noise_scale: adaptive nested codecs only (`codec.accepts_noise_scale`):
      `float32` `[plan.total_size // plan.bucket_size]`, one `σ_z` per
      bucket of the fused buffer (NaN: unknown, the bucket falls back to
      DQSG); see `ndq_tf.NestedDitheredCodec`. None: the fixed mode.

  Returns:
    A 1-D `int32` tensor of `plan.wire_words(codec)` elements.
  """
  if plan is None:
    plan = fusion_plan.FusionPlan.from_tensors(tensors, codec.bucket_size)
  _check_plan(codec, plan)
  return encode_flat(codec, plan.flatten(tensors), seed, plan,
                     noise_scale=noise_scale)


def encode_flat(codec, fused, seed, plan, noise_scale=None, chunk=None):
  """`encode_fused` of an already fused buffer (`plan.flatten(tensors)`).

  For callers that need the fused buffer themselves too (a nested sender's
  `nested_sender_statistics`), so that it is built once.

  Args:
    codec: an `ndq_tf` codec.
    fused: 1-D `float32` tensor of `plan.total_size` elements, or the
      chunk's `chunk.length` elements (`plan.flatten(tensors, chunk)`).
    seed: shape-`[2]` integer tensor, this sender's seed at this step.
    plan: the `FusionPlan` of the buffer.
    noise_scale: as for `encode_fused` (per bucket of the whole buffer).
    chunk: one of `plan.chunks(...)`: encode only its elements, each with
      the dither it has in the whole buffer. None: the whole buffer.

  Returns:
    A 1-D `int32` tensor of `plan.wire_words(codec)` elements
    (`plan.chunk_wire_words(codec, chunk)` for a chunk).
  """
  _check_plan(codec, plan)
  if noise_scale is not None and plan.bucket_size is None:
    raise ValueError(
        f"`noise_scale` needs a bucketed codec (one value per bucket). "
        f"Received: codec={codec!r} without buckets.")
  wires = []
  base = 0 if chunk is None else chunk.start
  for segment, start, length, offset in _pieces(plan, chunk):
    kwargs = {}
    if noise_scale is not None:
      first = start // plan.bucket_size
      kwargs["noise_scale"] = noise_scale[
          first:first + codec.num_scales(length)]
    if offset:
      kwargs["dither_offset"] = offset
    payload = codec.encode(fused[start - base:start - base + length],
                           segment_seed(seed, segment), **kwargs)
    wires.append(codec.to_wire(payload))
  if not wires:
    return tf.zeros([0], tf.int32)
  return tf.concat(wires, axis=0) if len(wires) > 1 else wires[0]


def used_words(codec, wire, plan, chunk=None):
  """The words of one sender's wire that carry anything (an `int32` scalar).

  A variable-length codec's wire (`codec.variable_length`: one payload,
  since such codecs are bucketed) uses its first `codec.payload_words`
  words and holds zeros after them: a transport may leave those out and
  the receivers put them back (`transports.base.restore`); the decode is
  the same. A fixed-length codec's wire uses all of its words.

  Args:
    codec: the sender's codec.
    wire: its 1-D `int32` wire (`encode_flat`).
    plan: the `FusionPlan` it encoded with.
    chunk: the chunk the wire holds, or None for the whole buffer.
  """
  pieces = _pieces(plan, chunk)
  if not getattr(codec, "variable_length", False):
    return tf.constant(sum(fusion_plan.codec_wire_words(codec, length)
                           for _, _, length, _ in pieces), tf.int32)
  if len(pieces) > 1:
    raise ValueError(
        f"A variable-length codec needs a bucketed plan (one payload per "
        f"wire). Received: codec={codec!r} with a wire of {len(pieces)} "
        f"payloads.")
  if not pieces:
    return tf.constant(0, tf.int32)
  return tf.cast(codec.payload_words(wire), tf.int32)


def _pieces(plan, chunk):
  """The `(segment, start, length, dither_offset)` pieces of `chunk`."""
  if chunk is not None:
    return chunk.pieces
  return tuple((i, start, length, 0)
               for i, (start, length) in enumerate(plan.segments))


def _decode_fused(codec, wire, seed, plan, side_information=None,
                  chunk=None):
  """Decodes one sender's wire into the fused (or chunk's) `float32` buffer."""
  parts = []
  wire_offset = 0
  base = 0 if chunk is None else chunk.start
  for segment, start, length, offset in _pieces(plan, chunk):
    words = fusion_plan.codec_wire_words(codec, length)
    payload = codec.from_wire(wire[wire_offset:wire_offset + words],
                              [length], tf.float32)
    wire_offset += words
    kwargs = {}
    if codec.needs_side_information:
      kwargs["side_information"] = side_information[
          start - base:start - base + length]
    if offset:
      kwargs["dither_offset"] = offset
    parts.append(codec.decode(payload, segment_seed(seed, segment),
                              **kwargs))
  if not parts:
    return tf.zeros([0], tf.float32)
  return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]


def decode_senders(codecs, wires, seeds, plan,
                   return_side_information=False, chunk=None, devices=None):
  """Decodes every sender's wire, in the given order, into fused buffers.

  The one place that fixes the decode order. Sender `i` is decoded with
  `codecs[i]`; when that codec needs side information (a nested codec), it
  gets the mean of all buffers decoded before it, so reference senders
  (codecs without side information) must come first.

  Args:
    codecs: a codec, or a list with one codec per sender.
    wires: list of 1-D `int32` wires, one per sender, in the fixed order.
    seeds: list of the senders' seeds (same order).
    plan: the `FusionPlan` the senders encoded with.
    return_side_information: also return the side information every sender
      was decoded with (None for senders that need none), e.g. for
      `nested_sender_statistics`.
    chunk: one of `plan.chunks(...)`, if the wires hold only that chunk
      (`encode_flat(..., chunk=)`); the buffers are then the chunk's.
    devices: the device to decode each sender on (its side information
      is made there too); None: the current device for all.

  Returns:
    A list of 1-D `float32` tensors of `plan.total_size` elements (the
    chunk's length for a chunk), one per sender (padding included); with
    `return_side_information`, the pair `(decoded, side_information)` of
    two such lists.

  Raises:
    ValueError: if the lengths differ or a sender needing side information
      comes before any sender that does not.
  """
  wires, seeds = list(wires), list(seeds)
  if not isinstance(codecs, (list, tuple)):
    codecs = [codecs] * len(wires)
  if not len(codecs) == len(wires) == len(seeds):
    raise ValueError(
        f"`codecs`, `wires` and `seeds` must have one entry per sender. "
        f"Received: {len(codecs)} codecs, {len(wires)} wires and "
        f"{len(seeds)} seeds.")
  decoded, side = [], []
  for sender, (codec, wire, seed) in enumerate(zip(codecs, wires, seeds)):
    _check_plan(codec, plan)
    with (tf.device(devices[sender]) if devices is not None
          else contextlib.nullcontext()):
      side_information = None
      if codec.needs_side_information:
        if not decoded:
          raise ValueError(
              f"Sender {sender} uses {type(codec).__name__}, which needs "
              f"side information, but no sender was decoded before it: order "
              f"the senders so that at least one reference sender (a codec "
              f"without side information) comes first.")
        side_information = fusion_sum.sum_stacked(decoded) / len(decoded)
      side.append(side_information)
      decoded.append(_decode_fused(codec, wire, seed, plan, side_information,
                                   chunk))
  if return_side_information:
    return decoded, side
  return decoded


def decode_sum(codec, wires, seeds, plan, mean=False):
  """Decodes every sender in fixed order and returns the summed tensors.

  Every receiver that calls this with the same wires, seeds and plan gets
  bitwise identical results, on any device.

  Example:

  >>> summed = decode_sum(codec, [wire_0, wire_1], [seed_0, seed_1], plan)

  Args:
    codec: an `ndq_tf` codec, or a list with one codec per sender (e.g.
      reference senders first, then nested ones; see `decode_senders`).
    wires: list of 1-D `int32` wires, one per sender, in the fixed order.
    seeds: list of the senders' seeds, same order.
    plan: the `FusionPlan` the senders encoded with.
    mean: divide the sum by the number of senders (in `float32`, before the
      cast back to the tensors' dtypes).

  Returns:
    A list of tensors with the plan's shapes and dtypes.
  """
  return fusion_sum.sum_decoded(decode_senders(codec, wires, seeds, plan),
                                plan, mean=mean)


def wire_scales(codec, wire, plan, chunk=None):
  """The per-bucket `float32` scales inside one sender's wire.

  For an adaptive nested codec, a negative scale marks a bucket sent as
  DQSG (see `ndq_tf.NestedDitheredCodec`).

  Args:
    codec: the sender's bucketed codec.
    wire: its 1-D `int32` wire (from `encode_fused`).
    plan: the `FusionPlan` it encoded with.
    chunk: the chunk the wire holds (`encode_flat(..., chunk=)`), or None.

  Returns:
    `float32` `[plan.total_size // plan.bucket_size]` (the chunk's buckets
    for a chunk).
  """
  _check_plan(codec, plan)
  if plan.bucket_size is None:
    raise ValueError(
        f"`wire_scales` needs a bucketed codec. Received: codec={codec!r}.")
  parts = []
  wire_offset = 0
  for _, _, length, _ in _pieces(plan, chunk):
    words = codec.num_words(length)
    scales = codec.num_scales(length)
    parts.append(tf.bitcast(
        wire[wire_offset + words:wire_offset + words + scales], tf.float32))
    wire_offset += words + scales
  if not parts:
    return tf.zeros([0], tf.float32)
  return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]


def _check_plan(codec, plan):
  if plan.bucket_size != codec.bucket_size:
    raise ValueError(
        f"The plan was made for bucket_size={plan.bucket_size} but the codec "
        f"{codec!r} has bucket_size={codec.bucket_size}: build the plan with "
        f"`FusionPlan.from_tensors(tensors, codec.bucket_size)`.")
