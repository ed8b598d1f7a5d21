"""Tensor fusion: many gradients in one codec payload, decoded in a fixed order.

This module is the strategy-agnostic core of every compressed all-reduce in
`ndq_tf.distribute` (`CompressedAllReduce` for `MirroredStrategy`, and the
multi-worker strategy). It knows nothing about devices, replicas or
`tf.distribute`; it only turns a list of tensors into one `int32` wire per
sender, and a list of wires (one per sender, in a fixed order) back into the
list of summed tensors.

Layout (`FusionPlan`)
---------------------
The tensors of one call are flattened, cast to `float32` and concatenated
into one fused buffer, in the order given. When the codec has buckets
(`codec.bucket_size = d`), every tensor is zero-padded to a multiple of `d`
elements, so that **every tensor starts on a bucket boundary and no bucket
spans two tensors**: each bucket's scale (its max) belongs to exactly one
tensor, as if the tensors had been encoded one by one, and a tensor whose
gradient is small is never quantized on the scale of a neighbour whose
gradient is large. The price is at most `d - 1` padding elements per tensor
(zeros, which cost code words but decode to values that are dropped). The
whole buffer is then one codec *segment*: one `encode`, one payload.

Codecs without buckets (`bucket_size=None`: one scale per encoded tensor)
get one segment per tensor instead, so that each tensor keeps its own scale;
the segments' wires are concatenated into the sender's single wire.

Seeds
-----
`derive_seed(base_seed, step, sender)` gives each sender of each step its own
seed (`ndq_tf.ops.fold_seed`, a pure integer hash, bit-exact on every device);
segment `i` of a payload is encoded with `fold_seed(sender_seed, i)`; inside a
segment the codec's counter-based RNG gives element `j` its own stream
position. So the dither depends on (base seed, step, sender, tensor/segment,
element) and never repeats across steps, senders or tensors.

Decode order (`decode_sum`)
---------------------------
Every receiver decodes every sender's wire, in the order the wires are given
(the caller fixes it: replica or worker index), and sums them with
`tf.reduce_sum(tf.stack(...), axis=0)`. A chain of `a + b + c` may be
re-associated differently by Grappler on different devices, so that the
last bits differ; `reduce_sum` over a stacked axis is one kernel with one
order (tests/test_mirrored.py checks the replicas bit for bit): every receiver obtains bitwise the same sum, so mirrored variables stay
identical. Senders whose codec needs side information (nested codecs) are
decoded with side information = the mean of everything decoded before them,
so put the reference senders first (the paper's Algorithm 2); this ordering
rule lives only in `decode_senders`, which can also return the side
information of every sender (`return_side_information=True`) for the
nested senders' own noise measurement; `encode_fused(..., noise_scale=σ)`
passes the per-bucket noise scales to an adaptive nested codec, and
`wire_scales` reads the per-bucket scales back from a wire (negative: a
bucket the adaptive codec sent as DQSG). What a nested sender learns from
its own decode lives in `ndq_tf.distribute.nested_state`.
"""

import collections
import contextlib
import hashlib

import numpy as np
import tensorflow as tf

from ndq_tf import ops as ndq_ops

__all__ = [
    "Chunk",
    "FusionPlan",
    "decode_senders",
    "decode_sum",
    "derive_seed",
    "encode_flat",
    "encode_fused",
    "sum_decoded",
    "sum_senders",
    "wire_scales",
]


#: One chunk of a fused buffer (`FusionPlan.chunks`): its elements
#: `[start, start + length)` and the codec pieces that cover them, each
#: `(segment, piece_start, piece_length, dither_offset)`: `segment` is the
#: index of the plan's segment it belongs to (whose seed it draws from),
#: and `dither_offset` is `piece_start` minus that segment's start.
Chunk = collections.namedtuple("Chunk", ["start", "length", "pieces"])


class FusionPlan:
  """Static layout of several tensors inside one fused `float32` buffer.

  Every tensor occupies `padded_sizes[i]` elements starting at `offsets[i]`:
  its `sizes[i]` values, then zeros up to the next multiple of the alignment
  (the codec's bucket size), so that a bucket never spans two tensors.

  Example:

  >>> plan = FusionPlan([(3, 4), (5,)], [tf.float32, tf.float16],
  ...                   bucket_size=8)
  >>> plan.offsets, plan.padded_sizes, plan.total_size
  ((0, 16), (16, 8), 24)

  Args:
    shapes: sequence of fully defined shapes (anything `tf.TensorShape`
      accepts), one per tensor.
    dtypes: sequence of floating point dtypes, one per tensor.
    bucket_size: the codec's bucket size (`codec.bucket_size`): every tensor
      starts on a multiple of it. `None` for codecs without buckets: no
      padding, and one codec segment per tensor (see `segments`).

  Raises:
    ValueError: if a shape is not fully defined, the lengths differ, or
      `bucket_size` is not a positive integer or None.
    TypeError: if a dtype is not floating point.
  """

  def __init__(self, shapes, dtypes, bucket_size=None):
    shapes = [tf.TensorShape(s) for s in shapes]
    dtypes = [tf.as_dtype(d) for d in dtypes]
    if len(shapes) != len(dtypes):
      raise ValueError(
          f"`shapes` and `dtypes` must have the same length. Received: "
          f"{len(shapes)} shapes and {len(dtypes)} dtypes.")
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
      if not shape.is_fully_defined():
        raise ValueError(
            f"Every shape must be fully defined. Received: shapes[{i}]="
            f"{shape}.")
      if not dtype.is_floating:
        raise TypeError(
            f"Every dtype must be floating point. Received: dtypes[{i}]="
            f"{dtype.name}.")
    if bucket_size is not None and (
        isinstance(bucket_size, bool) or not isinstance(bucket_size, int)
        or bucket_size < 1):
      raise ValueError(
          f"`bucket_size` must be a positive integer or None. Received: "
          f"bucket_size={bucket_size!r}.")
    self._shapes = tuple(shapes)
    self._dtypes = tuple(dtypes)
    self._bucket_size = bucket_size
    align = bucket_size or 1
    sizes, padded, offsets = [], [], []
    offset = 0
    for shape in shapes:
      n = shape.num_elements()
      p = -(-n // align) * align
      sizes.append(n)
      padded.append(p)
      offsets.append(offset)
      offset += p
    self._sizes = tuple(sizes)
    self._padded_sizes = tuple(padded)
    self._offsets = tuple(offsets)
    self._total_size = offset
    if bucket_size is None:
      self._segments = tuple(
          (o, p) for o, p in zip(offsets, padded) if p > 0)
    else:
      self._segments = ((0, offset),) if offset > 0 else ()

  @property
  def signature(self):
    """A short stable key of the layout: shapes, dtypes and bucket size.

    Two calls with the same tensors share it (and the nested senders' noise
    state); two different buffers never do, even with as many buckets.
    """
    text = repr((tuple(s.as_list() for s in self._shapes),
                 tuple(d.name for d in self._dtypes), self._bucket_size))
    return "plan_" + hashlib.sha256(text.encode()).hexdigest()[:16]

  @classmethod
  def from_tensors(cls, tensors, bucket_size=None):
    """Builds the plan of a list of tensors (their static shapes, dtypes)."""
    return cls([t.shape for t in tensors], [t.dtype for t in tensors],
               bucket_size=bucket_size)

  @property
  def shapes(self):
    return self._shapes

  @property
  def dtypes(self):
    return self._dtypes

  @property
  def bucket_size(self):
    return self._bucket_size

  @property
  def sizes(self):
    """Number of elements of every tensor."""
    return self._sizes

  @property
  def padded_sizes(self):
    """Elements every tensor occupies in the fused buffer (with padding)."""
    return self._padded_sizes

  @property
  def offsets(self):
    """Start of every tensor in the fused buffer."""
    return self._offsets

  @property
  def num_elements(self):
    """Real elements (without padding) of all tensors together."""
    return sum(self._sizes)

  @property
  def total_size(self):
    """Length of the fused buffer, padding included."""
    return self._total_size

  @property
  def segments(self):
    """`(start, length)` of every codec segment of the fused buffer.

    One segment (the whole buffer) for bucketed codecs, one per tensor for
    codecs without buckets.
    """
    return self._segments

  def chunks(self, chunk_elements=None):
    """Splits the buffer into chunks that can be encoded and sent apart.

    Bucketed plans (one segment) split on bucket boundaries into
    `⌈total_size / chunk_elements⌉` chunks of nearly equal numbers of whole
    buckets; a chunk draws the part of the segment's dither that its
    elements take in the whole buffer (`Codec.encode(..., dither_offset=)`),
    so its decode is bit for bit that slice of the whole buffer's decode.
    Plans without buckets group whole segments (tensors) in order, a new
    chunk starting once the current one holds `chunk_elements` or more.

    Args:
      chunk_elements: about how many elements per chunk; None (or at least
        `total_size`): one chunk, the whole buffer.

    Returns:
      A tuple of `Chunk`s in buffer order (empty for an empty plan).

    Raises:
      ValueError: if `chunk_elements` is not a positive integer or None.
    """
    if chunk_elements is not None and (
        isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int)
        or chunk_elements < 1):
      raise ValueError(
          f"`chunk_elements` must be a positive integer or None. Received: "
          f"chunk_elements={chunk_elements!r}.")
    if not self._segments:
      return ()
    if chunk_elements is None or chunk_elements >= self._total_size:
      return (Chunk(0, self._total_size, tuple(
          (i, start, length, 0)
          for i, (start, length) in enumerate(self._segments))),)
    if self._bucket_size is not None:
      d = self._bucket_size
      num_buckets = self._total_size // d
      count = min(num_buckets, -(-self._total_size // chunk_elements))
      bounds = [num_buckets * k // count * d for k in range(count + 1)]
      return tuple(Chunk(a, b - a, ((0, a, b - a, a),))
                   for a, b in zip(bounds[:-1], bounds[1:]))
    chunks, pieces = [], []
    for i, (start, length) in enumerate(self._segments):
      pieces.append((i, start, length, 0))
      if sum(p[2] for p in pieces) >= chunk_elements:
        chunks.append(pieces)
        pieces = []
    if pieces:
      chunks.append(pieces)
    return tuple(Chunk(p[0][1], sum(x[2] for x in p), tuple(p))
                 for p in chunks)

  def chunk_wire_words(self, codec, chunk):
    """Length of one sender's `int32` wire of `chunk` with `codec`."""
    return sum(codec.wire_bits(length) // 32
               for _, _, length, _ in chunk.pieces)

  def split_chunks(self, chunks, totals):
    """`split` of a buffer given as the chunks' parts, without joining them.

    A tensor inside one chunk is a slice of that chunk's part; only a
    tensor that spans chunks is concatenated from its pieces.

    Args:
      chunks: the plan's `chunks(...)`.
      totals: one 1-D float tensor per chunk, of the chunk's length.

    Returns:
      A list of tensors with the plan's shapes and dtypes.
    """
    if len(chunks) == 1:
      return self.split(totals[0])
    out = []
    for shape, dtype, offset, n in zip(self._shapes, self._dtypes,
                                       self._offsets, self._sizes):
      parts = []
      for chunk, total in zip(chunks, totals):
        a = max(offset, chunk.start)
        b = min(offset + n, chunk.start + chunk.length)
        if a < b:
          parts.append(total[a - chunk.start:b - chunk.start])
      if not parts:
        part = tf.zeros([0], totals[0].dtype)
      else:
        part = tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]
      out.append(tf.cast(tf.reshape(part, shape), dtype))
    return out

  def padding_mask(self):
    """`float32` `[total_size]`: 1 at the real elements, 0 at the padding.

    Built from ops (ones and zeros per tensor, one concat), not stored as a
    constant of the buffer's size.
    """
    parts = []
    for size, padded in zip(self._sizes, self._padded_sizes):
      parts.append(tf.ones([size], tf.float32))
      if padded > size:
        parts.append(tf.zeros([padded - size], tf.float32))
    if not parts:
      return tf.zeros([0], tf.float32)
    return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]

  def bucket_counts(self):
    """NumPy `int64` `[total_size // bucket_size]`: real elements per bucket.

    Raises:
      ValueError: for a plan without buckets.
    """
    if self._bucket_size is None:
      raise ValueError("`bucket_counts` needs a plan with buckets. Received: "
                       "bucket_size=None.")
    d = self._bucket_size
    count = np.zeros(self._total_size // d, np.int64)
    for offset, size, padded in zip(self._offsets, self._sizes,
                                    self._padded_sizes):
      first = offset // d
      count[first:first + padded // d] = d
      count[first + padded // d - 1] -= padded - size
    return count

  def wire_words(self, codec):
    """Length of one sender's `int32` wire with `codec`."""
    return sum(codec.wire_bits(length) // 32 for _, length in self._segments)

  def wire_bits(self, codec):
    """Bits of one sender's wire with `codec` (`32 * wire_words`)."""
    return 32 * self.wire_words(codec)

  def float32_bits(self):
    """Bits the same tensors cost as plain `float32` (without padding)."""
    return 32 * self.num_elements

  def flatten(self, tensors, chunk=None):
    """Fuses `tensors` into the padded `float32` buffer of this plan.

    Args:
      tensors: list of tensors of the plan's shapes (any floating dtype).
      chunk: one of `chunks(...)`: only that chunk's elements of the
        buffer (only the tensors it overlaps are read). None: all.

    Returns:
      A 1-D `float32` tensor of `total_size` elements (`chunk.length` for a
      chunk).

    Raises:
      ValueError: if the tensors do not match the plan.
    """
    tensors = list(tensors)
    if len(tensors) != len(self._shapes):
      raise ValueError(
          f"This plan fuses {len(self._shapes)} tensors. Received: "
          f"{len(tensors)} tensors.")
    lo, hi = ((0, self._total_size) if chunk is None
              else (chunk.start, chunk.start + chunk.length))
    parts = []
    for i, t in enumerate(tensors):
      t = tf.convert_to_tensor(t)
      if not t.shape.is_compatible_with(self._shapes[i]):
        raise ValueError(
            f"Tensor {i} must have shape {self._shapes[i]}. Received: shape "
            f"{t.shape}.")
      offset, size = self._offsets[i], self._sizes[i]
      end = offset + self._padded_sizes[i]
      if end <= lo or offset >= hi:
        continue
      a, b = max(offset, lo), min(offset + size, hi)
      if a < b:
        flat = tf.reshape(tf.cast(t, tf.float32), [-1])
        parts.append(flat if (a, b) == (offset, offset + size)
                     else flat[a - offset:b - offset])
      pad = min(end, hi) - max(offset + size, lo)
      if pad > 0:  # Zeros as their own piece: one copy (the concat), not two.
        parts.append(tf.zeros([pad], tf.float32))
    if not parts:
      return tf.zeros([0], tf.float32)
    return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]

  def split(self, fused):
    """Inverse of `flatten`: drops the padding, reshapes and casts back.

    Args:
      fused: 1-D float tensor of `total_size` elements.

    Returns:
      A list of tensors of the plan's shapes and dtypes.
    """
    out = []
    for shape, dtype, offset, n in zip(self._shapes, self._dtypes,
                                       self._offsets, self._sizes):
      part = fused[offset:offset + n]
      out.append(tf.cast(tf.reshape(part, shape), dtype))
    return out

  def __repr__(self):
    return (f"FusionPlan(tensors={len(self._shapes)}, elements="
            f"{self.num_elements}, total_size={self._total_size}, "
            f"bucket_size={self._bucket_size})")


def derive_seed(base_seed, step, sender):
  """The seed of one sender's payload at one step.

  Args:
    base_seed: shape-`[2]` integer tensor (the all-reduce's base seed).
    step: integer scalar, the aggregation counter.
    sender: integer scalar, the sender's fixed index (replica or worker).

  Returns:
    A shape-`[2]` `int32` tensor; distinct `(step, sender)` pairs give
    unrelated seeds.
  """
  return ndq_ops.fold_seed(ndq_ops.fold_seed(base_seed, step), sender)


def encode_fused(codec, tensors, seed, plan=None, noise_scale=None):
  """Encodes several tensors into one sender's `int32` wire.

  Flattens, casts to `float32`, pads (see `FusionPlan`), concatenates,
  `codec.encode`s every segment with `fold_seed(seed, segment_index)` and
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
    plan = FusionPlan.from_tensors(tensors, codec.bucket_size)
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
                           ndq_ops.fold_seed(seed, segment), **kwargs)
    wires.append(codec.to_wire(payload))
  if not wires:
    return tf.zeros([0], tf.int32)
  return tf.concat(wires, axis=0) if len(wires) > 1 else wires[0]


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
    words = codec.wire_bits(length) // 32
    payload = codec.from_wire(wire[wire_offset:wire_offset + words],
                              [length], tf.float32)
    wire_offset += words
    kwargs = {}
    if codec.needs_side_information:
      kwargs["side_information"] = side_information[
          start - base:start - base + length]
    if offset:
      kwargs["dither_offset"] = offset
    parts.append(codec.decode(payload, ndq_ops.fold_seed(seed, segment),
                              **kwargs))
  if not parts:
    return tf.zeros([0], tf.float32)
  return tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]


def _sum(tensors):
  """Deterministic sum: one `reduce_sum` over a stacked axis (see module doc)."""
  if len(tensors) == 1:
    return tensors[0]
  return tf.reduce_sum(tf.stack(tensors, axis=0), axis=0)


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
        side_information = _sum(decoded) / len(decoded)
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
  return sum_decoded(decode_senders(codec, wires, seeds, plan), plan,
                     mean=mean)


def sum_decoded(decoded, plan, mean=False, divisor=None):
  """The second half of `decode_sum`: deterministic sum, then `plan.split`.

  Args:
    decoded: the list `decode_senders` returned.
    plan: the `FusionPlan` the senders encoded with.
    mean: divide the sum (in `float32`, before the cast back to the
      tensors' dtypes) by `divisor`.
    divisor: what `mean` divides by; default the number of senders. A
      multi-worker exchange whose senders each summed several replicas
      passes the number of replicas.

  Returns:
    A list of tensors with the plan's shapes and dtypes.
  """
  return plan.split(sum_senders(decoded, mean=mean, divisor=divisor))


def sum_senders(decoded, mean=False, divisor=None):
  """The deterministic sum of decoded buffers (one per sender, in order).

  Args:
    decoded: the list `decode_senders` returned (whole buffers or one
      chunk's).
    mean: divide the sum (in `float32`) by `divisor`.
    divisor: what `mean` divides by; default the number of senders.

  Returns:
    One 1-D `float32` tensor.
  """
  if not decoded:
    raise ValueError("`wires` must hold at least one sender. Received: [].")
  total = _sum(decoded)
  if mean:
    total = total / float(divisor or len(decoded))
  return total


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
