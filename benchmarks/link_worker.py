"""The worker of benchmarks/multi_worker_link.py: one method's training loop.

`multi_worker_link.py --worker --method METHOD ...` (as `ndq_tf.launch`
starts it on every worker) calls `run_worker`: it builds the method's
strategy (`TRANSPORT`), trains the MLP of `--layers` for `--warmup` +
`--steps` steps, reads its veth end's and TCP's counters and its threads'
CPU time around the timed steps, and prints one `RESULT {json}` line that
the driver parses. The methods and what is measured: multi_worker_link.py.
The PyTorch methods (`torch_*`) run benchmarks/torch_link_worker.py instead.
"""

import inspect
import json
import os
import resource
import statistics
import time

# The transport each ndq_tf method asks for (float32 is TF's own strategy).
TRANSPORT = {
    "float16": "all_reduce",
    "dqsg_ag": "all_gather",
    "dqsg_ar": "all_reduce",
    "dqsg_rs": "reduce_scatter",
    "auto": "auto",
    "ndqsg": "all_gather",
    # Entropy-coded dithered quantization (#35): variable-length payloads,
    # all-gathered or reduce-scattered (the integer all-reduce refuses it).
    "ecdq_ag": "all_gather",
    "ecdq_rs": "reduce_scatter",
    # ndq_tf.PowerSGD: its factors are sums, so all-reduced (as PyTorch's).
    "psgd1": "all_reduce",
    "psgd4": "all_reduce",
    "psgd1_dq": "all_reduce",
    "psgd4_dq": "all_reduce",
}
#: `ndq_tf.PowerSGD`'s (rank, factor codec, fallback codec) of each
#: low-rank method: PyTorch PowerSGD's configuration (float32 factors and
#: float32 for the rest), and dithered factors with ternary DQSG for the
#: rest.
LOW_RANK = {
    "psgd1": (1, "float32", "float32"),
    "psgd4": (4, "float32", "float32"),
    "psgd1_dq": (1, "dqsg:num_levels=3", "dqsg"),
    "psgd4_dq": (4, "dqsg:num_levels=3", "dqsg"),
}
#: The PyTorch DDP methods (benchmarks/torch_link_worker.py): the hook,
#: and PowerSGD's rank.
TORCH_METHODS = ("torch_float32", "torch_fp16", "torch_psgd1", "torch_psgd4")
#: Steps sent uncompressed before the low rank starts, ndq_tf's
#: `start_step` and PyTorch's `start_powerSGD_iter` alike.
START_STEP = 2
METHODS = ("float32",) + tuple(TRANSPORT) + TORCH_METHODS
# Ethernet (14) + IPv4 (20) + TCP (20) header bytes of every frame, plus 12
# of TCP timestamp options when they are on (Linux's default).
HEADER_BYTES = 14 + 20 + 20
TIMESTAMP_BYTES = 12


#: Thread-name prefixes of this process's CPU split (`_thread_cpu`):
#: TensorFlow's op threads, gRPC's (the collectives' transfers), the
#: collective executor's; everything else (Python, Keras) is "other".
THREAD_GROUPS = (("compute", ("tf_Compute", "tf_XLAEigen", "tf_graph")),
                 ("grpc", ("event_engine", "grpc")),
                 ("collectives", ("collective",)))


def _thread_cpu():
  """CPU seconds of this process's live threads per `THREAD_GROUPS` group.

  From `/proc/self/task/*/stat` (user + system ticks); a thread that ends
  between two reads loses its ticks, so the groups may sum to a little less
  than `time.process_time()`.
  """
  tick = os.sysconf("SC_CLK_TCK")
  out = {f"cpu_{name}_s": 0.0 for name, _ in THREAD_GROUPS}
  out["cpu_other_s"] = 0.0
  for tid in os.listdir("/proc/self/task"):
    try:
      with open(f"/proc/self/task/{tid}/stat") as f:
        stat = f.read()
    except OSError:  # The thread ended.
      continue
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    seconds = (int(fields[11]) + int(fields[12])) / tick
    group = next((g for g, prefixes in THREAD_GROUPS
                  if name.startswith(prefixes)), "other")
    out[f"cpu_{group}_s"] += seconds
  return out


def _link_counters(interface):
  """This namespace's counters: its veth end's and TCP's (`/proc/net/snmp`)."""
  counters = {"cpu_s": time.process_time(), **_thread_cpu()}
  if not interface:
    return counters
  for name in ("tx_bytes", "tx_packets", "rx_bytes", "rx_packets"):
    with open(f"/sys/class/net/{interface}/statistics/{name}") as f:
      counters[name] = int(f.read())
  with open("/proc/net/snmp") as f:
    tcp = [line.split() for line in f if line.startswith("Tcp:")]
  tcp = dict(zip(tcp[0][1:], (int(v) for v in tcp[1][1:])))
  counters["tcp_out_segs"] = tcp["OutSegs"]
  counters["tcp_retrans_segs"] = tcp["RetransSegs"]
  return counters


def _header_bytes():
  with open("/proc/sys/net/ipv4/tcp_timestamps") as f:
    timestamps = f.read().strip() != "0"
  return HEADER_BYTES + (TIMESTAMP_BYTES if timestamps else 0)


def split_method(spec):
  """`(method, chunk_elements)` of `METHOD[@CHUNK]`; chunk "default" if none.

  Raises:
    ValueError: naming the spec, for an unknown method or a bad chunk.
  """
  method, at, chunk = spec.partition("@")
  if method not in METHODS or (at and method not in TRANSPORT):
    raise ValueError(
        f"a method must be one of {', '.join(METHODS)}, the ndq_tf ones "
        f"optionally with @CHUNK_ELEMENTS (an integer or none). Received: "
        f"{spec!r}")
  if not at:
    return method, "default"
  if chunk == "none":
    return method, None
  if not chunk.isdigit() or int(chunk) < 1:
    raise ValueError(
        f"the chunk after @ must be a positive integer or none. Received: "
        f"{spec!r}")
  return method, int(chunk)


def min_warmup(spec):
  """Warm-up steps a method needs so that its timed steps are all low rank."""
  method = split_method(spec)[0]
  low_rank = method in LOW_RANK or method.startswith("torch_psgd")
  return START_STEP + 1 if low_rank else 0


def _strategy(args):
  """The method's strategy; None codec for TF's own."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  method, chunk = split_method(args.method)
  if method == "float32":
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=args.timeout))
  import ndq_tf  # pylint: disable=g-import-not-at-top
  dqsg = f"dqsg:num_levels={args.dqsg_levels}"
  kwargs = {}
  if chunk != "default":
    kwargs["chunk_elements"] = chunk
  if method == "float16":
    codec = "float16"
  elif method in LOW_RANK:
    rank, factor_codec, fallback_codec = LOW_RANK[method]
    codec = ndq_tf.PowerSGD(rank=rank, factor_codec=factor_codec,
                            fallback_codec=fallback_codec,
                            start_step=START_STEP)
  elif method == "ndqsg":
    codec = ndq_tf.NestedDitheredCodec(num_levels=3, coarse_ratio=3)
    kwargs.update(reference_codec=dqsg, reference_group=1)
    if "reference_group" not in inspect.signature(
        ndq_tf.MultiWorkerMirroredStrategy).parameters:  # Before #33.
      kwargs["reference_workers"] = kwargs.pop("reference_group")
  elif method.startswith("ecdq"):
    codec = f"ecdq:bits={args.ecdq_bits:g}"
  else:
    codec = dqsg
  transport = TRANSPORT[method]
  parameters = inspect.signature(ndq_tf.MultiWorkerMirroredStrategy).parameters
  if "exchange" in parameters or "transport" in parameters:
    kwargs["exchange" if "exchange" in parameters else "transport"] = transport
  elif transport != "all_gather":
    raise RuntimeError(
        f"--method {args.method} needs transport={transport!r}, and this "
        "ndq_tf.MultiWorkerMirroredStrategy has no `transport` argument "
        "(issue #11): it only all-gathers.")
  return ndq_tf.MultiWorkerMirroredStrategy(
      codec=codec, min_elements=256, cluster_timeout=args.timeout,
      communication_options=tf.distribute.experimental.CommunicationOptions(
          timeout_seconds=args.timeout), **kwargs)


def _model_bits(strategy, method, params, num_workers):
  """The cost model's bits per worker per step, and what it was given."""
  from ndq_tf import theory  # pylint: disable=g-import-not-at-top
  from ndq_tf.core import cost_model  # pylint: disable=g-import-not-at-top
  if method == "float32":
    bits = cost_model.exchange_bits(None, params, num_workers, "float32_ring")
    return bits, {"transport": "float32_ring", "compressed_elements": params,
                  "lossless_elements": 0}
  stats = strategy.compression_stats()
  transport = stats["transport"]
  n = int(stats["compressed_elements"])
  lossless = int(stats["lossless_elements"])
  codecs = strategy.options.sender_codecs(num_workers)
  extra = {}
  if method in LOW_RANK:
    # The cost model has no low-rank exchange: the strategy's own count by
    # it, each round (fallback tensors, P, Q) by its codec and transport,
    # the lossless tensors as a float32 ring, as the model counts them.
    bits = float(stats["model_link_bits"])
    auto = None
    extra = {"rank": int(stats["rank"]),
             "low_rank_fraction": float(stats["low_rank_fraction"])}
  else:
    if transport in ("float32_ring", "float16_ring"):
      bits = cost_model.exchange_bits(None, n, num_workers, transport)
    else:
      bits = cost_model.exchange_bits(codecs, n, num_workers, transport)
    # The small tensors of the same call: TF's lossless float32 ring.
    bits += theory.ring_all_reduce_bits(32 * lossless, num_workers)
    auto = cost_model.auto(codecs, n, num_workers)
  return bits, {"transport": transport, "compressed_elements": n,
                "lossless_elements": lossless, "auto_transport": auto,
                **extra,
                "sent_bits": int(stats["sent_bits"]),
                "payload_bits": int(stats["payload_bits"]),
                # The strategy's own count by the same model, if it has one.
                "link_bits": int(stats.get("model_link_bits", -1)),
                "compressed_exchanges": int(stats["exchange_count"]),
                "uncompressed_gradient_reductions":
                    int(stats["uncompressed_gradient_reductions"]),
                "lossless_fallbacks": int(stats["lossless_fallbacks"])}


def run_worker(args):
  """One worker: builds the strategy, trains, prints one RESULT line."""
  if split_method(args.method)[0] in TORCH_METHODS:
    import torch_link_worker  # pylint: disable=g-import-not-at-top
    return torch_link_worker.run_worker(args)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(args.threads)
  tf.config.threading.set_inter_op_parallelism_threads(args.threads)
  strategy = _strategy(args)
  import keras  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  layers = args.layers
  per_replica = args.batch_size // strategy.num_replicas_in_sync
  x = tf.random.stateless_normal([per_replica, layers[0]], seed=[1, 2])
  y = tf.random.stateless_uniform([per_replica], seed=[3, 4],
                                  maxval=layers[-1], dtype=tf.int32)
  with strategy.scope():
    model = keras.Sequential(
        [keras.Input((layers[0],))] +
        [keras.layers.Dense(n, activation="relu") for n in layers[1:-1]] +
        [keras.layers.Dense(layers[-1])])
    optimizer = keras.optimizers.SGD(learning_rate=0.01)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction="sum")
  params = sum(int(tf.size(v)) for v in model.trainable_variables)

  @tf.function
  def train_step():
    def step_fn():
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True)) / args.batch_size
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss
    return strategy.reduce("SUM", strategy.run(step_fn), axis=None)

  # Every worker gets the same command line: its interface is named after
  # its task index.
  task_id = strategy.cluster_resolver.task_id
  num_workers = strategy.num_replicas_in_sync
  interface = args.interface and args.interface.format(index=task_id)
  for _ in range(args.warmup):
    float(train_step())
  times = []
  before = _link_counters(interface)
  for _ in range(args.steps):
    start = time.perf_counter()
    float(train_step())
    times.append(time.perf_counter() - start)
  after = _link_counters(interface)
  per_step = {k: (after[k] - before[k]) / args.steps for k in after}
  model_bits, model = _model_bits(strategy, split_method(args.method)[0],
                                  params, num_workers)
  result = {
      "method": args.method,
      "worker": task_id,
      "num_workers": num_workers,
      "params": params,
      "median_step_s": statistics.median(times),
      "step_times_s": [round(t, 4) for t in times],
      "per_step": per_step,
      "header_bytes": _header_bytes() if interface else None,
      "model_bytes": model_bits / 8,
      "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      **model,
  }
  if split_method(args.method)[0] != "float32":
    # The optimizer's gradient all-reduce is compressed by default, one
    # exchange per step: fewer would mean a timed lossless all-reduce.
    if model["compressed_exchanges"] != args.warmup + args.steps:
      raise RuntimeError(
          f"{model['compressed_exchanges']} compressed exchanges in "
          f"{args.warmup + args.steps} steps: the gradient all-reduce was "
          "not compressed every step.")
  if split_method(args.method)[0] in LOW_RANK and not model["rank"]:
    raise RuntimeError(
        f"the last timed step of {args.method} was not low rank (rank 0): "
        f"--warmup {args.warmup} must be at least {START_STEP + 1}.")
  print("RESULT " + json.dumps(result), flush=True)
  return 0
