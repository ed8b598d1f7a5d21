"""The fused buffer's layout: `FusionPlan` and its `Chunk`s.

Many tensors in one `float32` buffer, every tensor starting on a bucket
boundary (`ndq_tf.core.fusion` tells why), split into chunks of whole
buckets that can be encoded and sent apart.
"""

import collections
import hashlib

import numpy as np
import tensorflow as tf

__all__ = [
    "Chunk",
    "FusionPlan",
    "codec_wire_words",
]


#: One chunk of a fused buffer (`FusionPlan.chunks`): its elements
#: `[start, start + length)` and the codec pieces that cover them, each
#: `(segment, piece_start, piece_length, dither_offset)`: `segment` is the
#: index of the plan's segment it belongs to (whose seed it draws from),
#: and `dither_offset` is `piece_start` minus that segment's start.
Chunk = collections.namedtuple("Chunk", ["start", "length", "pieces"])


def codec_wire_words(codec, num_elements):
  """The static `int32` words of `codec`'s wire of `num_elements` values.

  `wire_bits(n) / 32` for a fixed-length codec; for a variable-length one
  (`variable_length`, whose `wire_bits` is an expectation) the longest
  payload, `max_wire_bits(n) / 32`: its wire is that long, the words it
  does not use are zeros (`fusion_codec.used_words`).
  """
  if getattr(codec, "variable_length", False):
    return codec.max_wire_bits(num_elements) // 32
  return codec.wire_bits(num_elements) // 32


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
    return sum(codec_wire_words(codec, length)
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
    return sum(codec_wire_words(codec, length)
               for _, length in self._segments)

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
