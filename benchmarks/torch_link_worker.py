"""The PyTorch worker of benchmarks/multi_worker_link.py: DDP on the same links.

`multi_worker_link.py --worker --method torch_*` (started by `ndq_tf.launch`
in the same namespaces, with the same `TF_CONFIG`) calls `run_worker`: the
MLP of `--layers` as `torch.nn.Linear` layers with ReLUs, the same global
batch and SGD (learning rate 0.01) as link_worker.py's TensorFlow loop,
wrapped in `DistributedDataParallel` over gloo, with a communication hook:

* `torch_float32`: none (DDP's float32 all-reduce of every bucket);
* `torch_fp16`: `default_hooks.fp16_compress_hook`;
* `torch_psgd1`, `torch_psgd4`: `powerSGD_hook.powerSGD_hook` with
  `PowerSGDState(matrix_approximation_rank=1 or 4,
  start_powerSGD_iter=link_worker.START_STEP)` and its other defaults
  (error feedback, warm start, `min_compression_rate=2`), and every
  gradient in one DDP bucket (`bucket_cap_mb` above the model's float32
  size; the float32 and fp16 methods keep DDP's default buckets).

Why one bucket: the PowerSGD hook chains three all-reduces per bucket
(uncompressed tensors, P, Q), the later two issued from the earlier one's
future callback, on a gloo thread, while the autograd thread issues the next
bucket's first all-reduce. gloo matches collectives by their issue order, and
with two buckets that order differs between workers whenever the link's
timing does: with DDP's default buckets (1 MiB, then 25 MiB: two buckets on
the default 4.99M MLP) a worker aborted on the shaped links with
`op.preamble.length <= op.nbytes. 7168 vs 3072 ... collective mismatch` (a
chunk of bucket 0's Q against one of bucket 1's biases) and the other saw
`Connection reset by peer`. In one bucket the three run in one order, after
the backward pass, as the TensorFlow loop's exchange does.

The rendezvous is a `tcp://` store at worker 0's address and port of
`TF_CONFIG`; gloo binds the worker's own interface (`GLOO_SOCKET_IFNAME`: its
veth end, or `lo` with `--loopback`). Each step also sums the loss over the
workers (`all_reduce` of one scalar), as the TensorFlow loop's
`strategy.reduce` does. The same counters are read around the timed steps
(`link_worker._link_counters`) and the same `RESULT {json}` line printed.

Model bytes: what the hook puts into gloo's ring all-reduces, `2(P-1)/P` of
their bits per worker: every gradient as float32 or float16; for PowerSGD,
`P` (`n·k`) and `Q` (`m·k`) of each matrix it compresses (`view(shape[0],
-1)`, compressed when `(n + m)·k·min_compression_rate < n·m`, as the hook's
`_should_compress`) and the other tensors, all float32.

Needs PyTorch (`pip install torch`, or the project's `torch` extra); the
driver skips these methods without it.
"""

import datetime
import json
import os
import resource
import statistics
import time

import link_worker  # benchmarks/link_worker.py, next to this script

#: The DDP communication hook of each method: None, "fp16", or a rank.
HOOKS = {"torch_float32": None, "torch_fp16": "fp16", "torch_psgd1": 1,
         "torch_psgd4": 4}
#: PyTorch PowerSGD's default `min_compression_rate`.
MIN_COMPRESSION_RATE = 2


def _ring_bits(bits, num_workers):
  """Bits one worker sends in a ring all-reduce of `bits`: `2(P-1)/P`."""
  return 2.0 * (num_workers - 1) / num_workers * bits


def model_bits(shapes, hook, num_workers):
  """The hook's bits per worker per step, and its elements sent low rank.

  Args:
    shapes: the parameters' shapes (PyTorch's: `[out, in]` for a weight).
    hook: a `HOOKS` value.
    num_workers: `P`.
  """
  sizes = [_numel(s) for s in shapes]
  if hook is None or hook == "fp16":
    width = 32 if hook is None else 16
    return _ring_bits(width * sum(sizes), num_workers), 0
  factors, uncompressed, low_rank = 0, 0, 0
  for shape, size in zip(shapes, sizes):
    if len(shape) > 1:
      n, m = shape[0], size // shape[0]
      k = min(n, m, hook)
      if (n + m) * k * MIN_COMPRESSION_RATE < n * m:
        factors += (n + m) * k
        low_rank += size
        continue
    uncompressed += size
  # One bucket, three all-reduces: the uncompressed tensors, P, Q.
  return _ring_bits(32 * (factors + uncompressed), num_workers), low_rank


def _numel(shape):
  out = 1
  for d in shape:
    out *= d
  return out


def _cluster():
  """(worker 0's host, its port, this worker's index, the worker count)."""
  config = json.loads(os.environ["TF_CONFIG"])
  workers = config["cluster"]["worker"]
  host, _, port = workers[0].rpartition(":")
  return host, int(port), int(config["task"]["index"]), len(workers)


def run_worker(args):
  """One DDP worker: trains, prints one RESULT line like link_worker's."""
  host, port, rank, num_workers = _cluster()
  interface = args.interface and args.interface.format(index=rank)
  os.environ.setdefault("GLOO_SOCKET_IFNAME", interface or "lo")
  import torch  # pylint: disable=g-import-not-at-top
  import torch.distributed as dist  # pylint: disable=g-import-not-at-top
  from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # pylint: disable=g-import-not-at-top
  from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  torch.set_num_interop_threads(args.threads)
  dist.init_process_group(
      "gloo", init_method=f"tcp://{host}:{port}", rank=rank,
      world_size=num_workers,
      timeout=datetime.timedelta(seconds=args.timeout))
  hook = HOOKS[link_worker.split_method(args.method)[0]]
  layers = args.layers
  torch.manual_seed(0)
  modules = []
  for i, (n_in, n_out) in enumerate(zip(layers[:-1], layers[1:])):
    modules.append(torch.nn.Linear(n_in, n_out))
    if i < len(layers) - 2:
      modules.append(torch.nn.ReLU())
  net = torch.nn.Sequential(*modules)
  buckets = {}
  if hook not in (None, "fp16"):
    # PowerSGD: one bucket, or the buckets' chained all-reduces race (above).
    buckets["bucket_cap_mb"] = (
        sum(p.numel() for p in net.parameters()) * 4 / 2**20 + 1)
  model = torch.nn.parallel.DistributedDataParallel(net, **buckets)
  state = None
  if hook == "fp16":
    model.register_comm_hook(None, default_hooks.fp16_compress_hook)
  elif hook is not None:
    state = powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=hook,
        start_powerSGD_iter=link_worker.START_STEP)
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
  optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
  loss_fn = torch.nn.CrossEntropyLoss()
  per_replica = args.batch_size // num_workers
  generator = torch.Generator().manual_seed(1)
  x = torch.randn(per_replica, layers[0], generator=generator)
  y = torch.randint(0, layers[-1], (per_replica,), generator=generator)
  shapes = [list(p.shape) for p in model.parameters()]
  params = sum(_numel(s) for s in shapes)

  def train_step():
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()  # DDP's hook all-reduces the gradients' buckets.
    optimizer.step()
    loss = loss.detach()
    dist.all_reduce(loss)  # The TF loop's `strategy.reduce` of the loss.
    return float(loss)

  for _ in range(args.warmup):
    train_step()
  times = []
  before = link_worker._link_counters(interface)  # pylint: disable=protected-access
  for _ in range(args.steps):
    start = time.perf_counter()
    train_step()
    times.append(time.perf_counter() - start)
  after = link_worker._link_counters(interface)  # pylint: disable=protected-access
  per_step = {k: (after[k] - before[k]) / args.steps for k in after}
  if state is not None and state.iter != args.warmup + args.steps:
    raise RuntimeError(
        f"PowerSGDState.iter is {state.iter} after {args.warmup + args.steps} "
        "steps: the hook did not run once per step.")
  if state is not None and len(state.p_memory_dict) != 1:
    raise RuntimeError(
        f"PowerSGD compressed {len(state.p_memory_dict)} DDP buckets: the "
        "gradients must be one bucket (see the module docstring).")
  bits, low_rank = model_bits(shapes, hook, num_workers)
  result = {
      "method": args.method,
      "worker": rank,
      "num_workers": num_workers,
      "params": params,
      "median_step_s": statistics.median(times),
      "step_times_s": [round(t, 4) for t in times],
      "per_step": per_step,
      "header_bytes": (link_worker._header_bytes()  # pylint: disable=protected-access
                       if interface else None),
      "model_bytes": bits / 8,
      "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      "transport": ("gloo_ring" if hook is None else
                    "gloo_ring_fp16" if hook == "fp16" else
                    f"gloo_powersgd_rank{hook}"),
      "compressed_elements": params if hook is not None else 0,
      "lossless_elements": params if hook is None else 0,
      "torch_version": torch.__version__,
  }
  if state is not None:
    result.update(rank=hook, low_rank_fraction=low_rank / params)
  print("RESULT " + json.dumps(result), flush=True)
  dist.destroy_process_group()
  return 0
