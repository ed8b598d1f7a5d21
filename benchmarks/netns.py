"""Network namespaces for shaped links: one namespace per worker, a bridge.

`Network` builds N worker namespaces on a bridge with `ip netns` and shapes
every link with `tc ... tbf`, for benchmarks/multi_worker_link.py (run as
root; docs/benchmarks.md). Standard library only.
"""

import shlex
import subprocess

__all__ = [
    "SUBNET",
    "Network",
]

#: The workers' addresses: `SUBNET.1`, `SUBNET.2`, ...
SUBNET = "10.77.0"


def _sh(*cmd, check=True):
  """Runs `cmd`; with `check`, a failure raises with the command's stderr."""
  proc = subprocess.run(cmd, capture_output=True, text=True)
  if check and proc.returncode != 0:
    raise RuntimeError(f"`{shlex.join(cmd)}` exited with {proc.returncode}: "
                       f"{proc.stderr.strip()}")
  return proc


class Network:
  """N worker namespaces on a bridge, each link shaped with tbf at both ends.

  Namespaces and interfaces carry `tag` (e.g. the driver's pid) so that two
  runs on one machine do not collide. Worker i lives in namespace
  `ndq{tag}w{i}` with the address 10.77.0.(i+1) on `vw{tag}_{i}`; its peer
  `vb{tag}_{i}` is a port of the bridge `br0` in namespace `ndq{tag}br`.
  Both ends of each pair are shaped, so each worker's link is limited in
  both directions; both carry frames of at most one MTU (`gso_max_segs 1`).

  `create` may fail half-way (e.g. on a name another run holds); `remove`
  deletes what `create` made, only that, and never raises: call it in a
  `finally`.
  """

  def __init__(self, tag, num_workers):
    self.bridge_ns = f"ndq{tag}br"
    self.worker_ns = [f"ndq{tag}w{i}" for i in range(num_workers)]
    self.worker_dev = [f"vw{tag}_{i}" for i in range(num_workers)]
    self.bridge_dev = [f"vb{tag}_{i}" for i in range(num_workers)]
    self.addresses = [f"{SUBNET}.{i + 1}" for i in range(num_workers)]
    # Per-worker names as `ndq_tf.launch` and the workers format them.
    self.ns_pattern = f"ndq{tag}w{{index}}"
    self.dev_pattern = f"vw{tag}_{{index}}"
    self._namespaces = []  # created, so to delete
    self._pairs = []

  def create(self):
    _sh("ip", "netns", "add", self.bridge_ns)
    self._namespaces.append(self.bridge_ns)
    _sh("ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
    _sh("ip", "-n", self.bridge_ns, "link", "set", "br0", "up")
    for ns, vw, vb, addr in zip(self.worker_ns, self.worker_dev,
                                self.bridge_dev, self.addresses):
      _sh("ip", "netns", "add", ns)
      self._namespaces.append(ns)
      _sh("ip", "link", "add", vw, "type", "veth", "peer", "name", vb)
      self._pairs.append(vw)
      _sh("ip", "link", "set", vw, "netns", ns)
      _sh("ip", "link", "set", vb, "netns", self.bridge_ns)
      _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", vw)
      _sh("ip", "-n", ns, "link", "set", "lo", "up")
      _sh("ip", "-n", ns, "link", "set", vw, "up")
      _sh("ip", "-n", self.bridge_ns, "link", "set", vb, "master", "br0")
      _sh("ip", "-n", self.bridge_ns, "link", "set", vb, "up")
      # One MTU per frame, as on an Ethernet: otherwise TCP hands the veth
      # 64 KB segments, counted with one header each.
      _sh("ip", "-n", ns, "link", "set", vw, "gso_max_segs", "1")
      _sh("ip", "-n", self.bridge_ns, "link", "set", vb, "gso_max_segs", "1")

  def _ends(self):
    """(namespace, device) of both ends of every worker's link."""
    return (list(zip(self.worker_ns, self.worker_dev)) +
            [(self.bridge_ns, dev) for dev in self.bridge_dev])

  def shape(self, rate):
    """Limits every link end to `rate` (a tc rate), or removes the limit."""
    for ns, dev in self._ends():
      if rate is None:
        _sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev,
            "root", check=False)
        continue
      burst = "256kb" if rate.endswith("gbit") else "32kb"
      _sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev,
          "root", "tbf", "rate", rate, "burst", burst, "latency", "50ms")

  def remove(self):
    # Deleting a namespace deletes the veth ends in it, and so their peers;
    # a pair still in this namespace (`create` failed before moving it) is
    # deleted by name (an error, ignored, for the pairs that moved).
    for ns in reversed(self._namespaces):
      _sh("ip", "netns", "del", ns, check=False)
    for dev in self._pairs:
      _sh("ip", "link", "del", dev, check=False)
    self._namespaces, self._pairs = [], []
