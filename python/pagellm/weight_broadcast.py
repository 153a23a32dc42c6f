"""The trainer's end of a weight broadcast to `pagellm serve` (docs/design.md, "Weight
updates", broadcast): the trainer makes a group, the server joins it (with every
tensor-parallel rank it runs), and every training step the trainer broadcasts its new
weights, packed in buckets, while the server's ranks receive them and write their shares in
place.

    from pagellm.client import PagellmClient
    from pagellm.weight_broadcast import WeightBroadcaster
    b = WeightBroadcaster(PagellmClient("http://127.0.0.1:8000"), backend="nccl", device=1)
    b.init()                                  # once
    b.update(model.named_parameters())        # every step
    b.close()

Two transports. "nccl": GPU to GPU (the trainer on another GPU than the server); needs torch
and NCCL (libnccl.so.2 from the nvidia-nccl wheel torch brings, or PAGELLM_NCCL_LIBRARY).
"tcp": through host memory over a socket the trainer listens on; any tensors (torch, numpy,
or RawTensor), any server backend. Standard library only until the "nccl" path imports torch.

Buckets: tensors in the order given, each at the next multiple of 256 bytes of its bucket; a
new bucket starts when the next tensor would end past ``bucket_bytes`` and the bucket holds
one already (the server computes the same layout from the tensor list: pagellm's
plan_broadcast_buckets).
"""
from __future__ import annotations

import ctypes
import glob
import os
import select
import socket
import struct
import threading
from typing import Any, Iterable, List, NamedTuple, Optional, Sequence, Tuple

__all__ = ["WeightBroadcaster", "RawTensor", "plan_buckets", "ALIGNMENT"]

ALIGNMENT = 256
_DTYPE_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}

# The "tcp" wire protocol (src/pagellm/engine/weight_group.h): 16-byte frame headers
# {uint32 type, uint32 0, uint64 payload bytes}, little-endian.
_HELLO, _WELCOME, _BUCKET, _ABORT = 0x50000001, 0x50000002, 0x50000003, 0x80000001
_MAGIC = b"pagellm-weight-group"
_VERSION = 1


class RawTensor(NamedTuple):
    """A tensor given as its bytes: dtype ("bfloat16", "float16", "float32"), shape, and any
    object with the buffer protocol holding numel * element-size bytes."""
    dtype: str
    shape: Tuple[int, ...]
    data: Any


class _Tensor(NamedTuple):
    name: str
    dtype: str
    shape: Tuple[int, ...]
    nbytes: int
    value: Any  # what the transport copies from


def _describe(name: str, value: Any) -> _Tensor:
    if isinstance(value, RawTensor):
        if value.dtype not in _DTYPE_SIZES:
            raise ValueError(f"{name}: dtype {value.dtype!r} is not a weight dtype ({', '.join(_DTYPE_SIZES)})")
        shape = tuple(int(d) for d in value.shape)
        n = _DTYPE_SIZES[value.dtype]
        for d in shape:
            n *= d
        view = memoryview(value.data).cast("B")
        if view.nbytes != n:
            raise ValueError(f"{name}: {view.nbytes} bytes for {value.dtype} {list(shape)} ({n} expected)")
        return _Tensor(name, value.dtype, shape, n, view)
    module = type(value).__module__.split(".")[0]
    if module == "torch":
        import torch
        names = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
        if value.dtype not in names:
            raise ValueError(f"{name}: dtype {value.dtype} is not a weight dtype (bfloat16, float16, float32)")
        t = value.detach().contiguous()
        return _Tensor(name, names[t.dtype], tuple(t.shape), t.numel() * t.element_size(), t)
    if module == "numpy":
        import numpy as np
        a = np.ascontiguousarray(value)
        if a.dtype.name not in _DTYPE_SIZES:
            raise ValueError(f"{name}: dtype {a.dtype} is not a weight dtype ({', '.join(_DTYPE_SIZES)})")
        return _Tensor(name, a.dtype.name, tuple(a.shape), a.nbytes, memoryview(a.reshape(-1).view(np.uint8)))
    raise TypeError(f"{name}: a torch tensor, a numpy array or a RawTensor is needed, got {type(value).__name__}")


def plan_buckets(sizes: Sequence[int], bucket_bytes: int) -> List[Tuple[int, List[int]]]:
    """[(bucket bytes, [offset of each tensor])] for tensors of ``sizes`` bytes, in order."""
    if bucket_bytes < 1:
        raise ValueError("bucket_bytes must be at least 1")
    buckets: List[Tuple[int, List[int]]] = []
    for n in sizes:
        if buckets:
            end, offsets = buckets[-1]
            at = (end + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
            if at + n <= bucket_bytes:
                offsets.append(at)
                buckets[-1] = (at + n, offsets)
                continue
        buckets.append((n, [0]))
    return buckets


def _find_nccl() -> str:
    configured = os.environ.get("PAGELLM_NCCL_LIBRARY")
    if configured:
        return configured
    try:
        import nvidia.nccl  # the wheel torch depends on
        for root in list(getattr(nvidia.nccl, "__path__", [])):
            found = glob.glob(os.path.join(root, "lib", "libnccl.so*"))
            if found:
                return sorted(found)[0]
    except ImportError:
        pass
    return "libnccl.so.2"


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class _Nccl:
    """The few NCCL calls the trainer's end makes, through ctypes."""

    UINT8 = 1  # ncclUint8

    def __init__(self, path: Optional[str] = None):
        self.path = path or _find_nccl()
        try:
            self.lib = ctypes.CDLL(self.path)
        except OSError as e:
            raise RuntimeError(f"cannot load NCCL from {self.path!r}: {e} "
                               "(set PAGELLM_NCCL_LIBRARY to libnccl.so.2)") from None
        lib = self.lib
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(_UniqueId)]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, _UniqueId, ctypes.c_int]
        lib.ncclBroadcast.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
        lib.ncclCommAbort.argtypes = [ctypes.c_void_p]

    def check(self, result: int, call: str) -> None:
        if result != 0:
            raise RuntimeError(f"{call} failed: {self.lib.ncclGetErrorString(result).decode()} (NCCL {result})")

    def unique_id(self) -> bytes:
        uid = _UniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        # All 128 bytes (reading the c_char field would stop at its first zero byte).
        return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))

    def init_rank(self, world_size: int, uid: bytes, rank: int) -> ctypes.c_void_p:
        comm = ctypes.c_void_p()
        u = _UniqueId()
        ctypes.memmove(ctypes.addressof(u), uid, 128)
        self.check(self.lib.ncclCommInitRank(ctypes.byref(comm), world_size, u, rank), "ncclCommInitRank")
        return comm


class _Call(threading.Thread):
    """An HTTP call in a thread (the server blocks while the trainer sends)."""

    def __init__(self, fn, *args, **kwargs):
        super().__init__(daemon=True)
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.result: Any = None
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self.result = self.fn(*self.args, **self.kwargs)
        except BaseException as e:  # handed to the caller
            self.error = e

    def outcome(self) -> Any:
        self.join()
        if self.error is not None:
            raise self.error
        return self.result


class WeightBroadcaster:
    """Rank 0 of a weight group whose other ranks are the server behind ``client`` (a
    pagellm.client.PagellmClient): one, or one per tensor-parallel rank of the server
    (ranks 1..N, N from GET /v1/models), each receiving every bucket.

    backend: "nccl" (torch CUDA tensors on ``device``, GPU to GPU) or "tcp" (host memory;
    ``master_address``:``master_port`` is where this process listens, port 0: any free one).
    bucket_bytes: the most bytes per broadcast (a larger tensor gets a bucket of its own);
    the "nccl" path holds one bucket of device memory, the "tcp" one of host memory.
    """

    def __init__(self, client: Any, backend: str = "nccl", *, device: Any = None,
                 bucket_bytes: int = 512 << 20, group_name: str = "pagellm",
                 master_address: str = "127.0.0.1", master_port: int = 0,
                 timeout: float = 300.0, nccl_library: Optional[str] = None):
        if backend not in ("nccl", "tcp"):
            raise ValueError(f"backend must be 'nccl' or 'tcp', got {backend!r}")
        if bucket_bytes < 1:
            raise ValueError("bucket_bytes must be at least 1")
        self.client = client
        self.backend = backend
        self.device = device
        self.bucket_bytes = int(bucket_bytes)
        self.group_name = group_name
        self.master_address = master_address
        self.master_port = master_port
        self.timeout = timeout
        self.nccl_library = nccl_library
        self.updates = 0
        self.engine_ranks = 1  # the server's tensor-parallel ranks (set by init)
        self._socks: List[socket.socket] = []
        self._comm = None
        self._nccl: Optional[_Nccl] = None

    # ---- the group ------------------------------------------------------------------
    def init(self) -> dict:
        """Makes the group and has the server join it; returns the server's answer."""
        if self._socks or self._comm is not None:
            raise RuntimeError("the weight group is made already")
        self.engine_ranks = 1
        for entry in self.client.models().get("data", []):
            if entry.get("parent") is None:  # the base model (adapters name it as parent)
                self.engine_ranks = int(entry.get("tensor_parallel_size", 1))
        if self.backend == "tcp":
            return self._init_tcp()
        return self._init_nccl()

    def _init_tcp(self) -> dict:
        family = socket.AF_INET6 if ":" in self.master_address else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.master_address, self.master_port))
            listener.listen(self.engine_ranks)
            port = listener.getsockname()[1]
            call = _Call(self.client.init_weights_group, backend="tcp", master_address=self.master_address,
                         master_port=port, rank_offset=1, world_size=1 + self.engine_ranks,
                         group_name=self.group_name, timeout_seconds=self.timeout)
            call.start()
            listener.settimeout(0.2)
            socks: dict = {}
            try:
                while len(socks) < self.engine_ranks:
                    try:
                        conn, _ = listener.accept()
                    except socket.timeout:
                        if not call.is_alive():
                            call.outcome()  # the server refused before connecting: raise its error
                            raise RuntimeError("the server answered without joining the weight group")
                        continue
                    conn.settimeout(self.timeout)
                    ftype, payload = _recv_frame(conn)
                    rank, refusal = self._check_hello(ftype, payload)
                    if not refusal and rank in socks:
                        refusal = f"rank {rank} joined twice"
                    if refusal:
                        _send_frame(conn, _ABORT, refusal.encode())
                        conn.close()
                        call.join()
                        raise RuntimeError(f"weight group: the server's hello was refused: {refusal}")
                    _send_frame(conn, _WELCOME, struct.pack("<I", _VERSION))
                    socks[rank] = conn
                answer = call.outcome()
            except BaseException:
                for conn in socks.values():
                    conn.close()
                raise
            for conn in socks.values():
                conn.setblocking(False)
            self._socks = [socks[r] for r in sorted(socks)]
            return answer
        finally:
            listener.close()

    def _check_hello(self, ftype: int, payload: bytes) -> Tuple[int, str]:
        """The rank a server rank's hello names, and why it is refused ("" if it is not)."""
        if ftype != _HELLO:
            return -1, f"expected a hello, got message type {ftype:#x}"
        at = 0

        def take(n: int) -> bytes:
            nonlocal at
            if at + n > len(payload):
                raise ValueError("short hello")
            out = payload[at:at + n]
            at += n
            return out
        try:
            magic = take(struct.unpack("<Q", take(8))[0])
            version, rank, size = struct.unpack("<Iii", take(12))
            name = take(struct.unpack("<Q", take(8))[0]).decode()
        except (ValueError, UnicodeDecodeError):
            return -1, "malformed hello"
        world = 1 + self.engine_ranks
        if magic != _MAGIC:
            return rank, "not a pagellm engine"
        if version != _VERSION:
            return rank, f"the trainer speaks weight-group version {_VERSION}, the engine {version}"
        if not 1 <= rank < world or size != world:
            return rank, f"the engine joined as rank {rank} of {size}, the trainer's group has {world} ranks"
        if name != self.group_name:
            return rank, f"the engine names the group {name!r}, the trainer {self.group_name!r}"
        return rank, ""

    def _init_nccl(self) -> dict:
        import torch
        dev = torch.device("cuda") if self.device is None else torch.device(self.device)
        if dev.type != "cuda":
            raise ValueError(f"the nccl backend needs a CUDA device, got {dev}")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self._nccl = _Nccl(self.nccl_library)
        uid = self._nccl.unique_id()
        world = 1 + self.engine_ranks
        call = _Call(self.client.init_weights_group, backend="nccl", unique_id=uid, rank_offset=1,
                     world_size=world, group_name=self.group_name)
        call.start()
        try:
            with torch.cuda.device(dev):
                self._comm = self._nccl.init_rank(world, uid, 0)  # waits for the server's ranks
        except RuntimeError as e:
            call.join(30)
            if call.error is not None:  # the server's reason says more than NCCL's
                raise call.error from e
            raise
        return call.outcome()

    def close(self) -> dict:
        """Leaves the group (the server leaves it too)."""
        answer = self.client.destroy_weights_group()
        self._drop()
        return answer

    def _drop(self, abort: bool = False) -> None:
        for conn in self._socks:
            conn.close()
        self._socks = []
        if self._comm is not None and self._nccl is not None:
            (self._nccl.lib.ncclCommAbort if abort else self._nccl.lib.ncclCommDestroy)(self._comm)
            self._comm = None

    # ---- updates --------------------------------------------------------------------
    def update(self, named_tensors: Iterable[Tuple[str, Any]], mode: str = "wait") -> dict:
        """Broadcasts the tensors (in order) while the server receives and writes them;
        returns the server's report (weights_version, tensors_updated, seconds, ...). A
        rejected update raises the server's error (the server still drains the buckets)."""
        if not self._socks and self._comm is None:
            raise RuntimeError("no weight group: call init() first")
        tensors = [_describe(n, t) for n, t in named_tensors]
        if not tensors:
            raise ValueError("an update needs at least one tensor")
        buckets = plan_buckets([t.nbytes for t in tensors], self.bucket_bytes)
        listed = [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in tensors]
        call = _Call(self.client.update_weights_from_broadcast, listed, self.bucket_bytes, mode, self.group_name)
        call.start()
        number = self.updates
        self.updates += 1
        try:
            if self.backend == "tcp":
                self._send_tcp(tensors, buckets, number, call)
            else:
                self._send_nccl(tensors, buckets, call)
            return call.outcome()
        except BaseException as e:
            error = call.error if (not call.is_alive() and call.error is not None) else e
            # A rejected update the server drained leaves the group in step; anything else
            # (the server answered without reading the buckets, a transport failure) may
            # leave bytes in flight, so the group is given up on both sides.
            if "received and dropped" not in str(error):
                self._drop(abort=True)
                try:
                    self.client.destroy_weights_group()
                except Exception:
                    pass
            if error is e:
                raise
            raise error from None

    def _send_tcp(self, tensors, buckets, number: int, call: _Call) -> None:
        # Each bucket is one frame to every server rank: the header, the update and bucket
        # numbers, then every tensor's bytes at its offset (zeros between), sent piece by
        # piece without a copy.
        first = 0
        for index, (nbytes, offsets) in enumerate(buckets):
            pieces = [struct.pack("<IIQQQ", _BUCKET, 0, 16 + nbytes, number, index)]
            at_end = 0
            for j, at in enumerate(offsets):
                t = tensors[first + j]
                if at > at_end:
                    pieces.append(bytes(at - at_end))
                src = t.value
                if type(src).__module__.split(".")[0] == "torch":
                    import torch
                    src = memoryview(src.cpu().reshape(-1).view(torch.uint8).numpy())
                pieces.append(src)
                at_end = at + t.nbytes
            first += len(offsets)
            for conn in self._socks:
                for piece in pieces:
                    self._send_all(conn, piece, call)

    def _send_all(self, conn: socket.socket, data, call: _Call) -> None:
        view = memoryview(data).cast("B")
        if not view.nbytes:
            return
        while view:
            _, writable, _ = select.select([], [conn], [], 0.2)
            if not writable:
                if not call.is_alive():
                    call.outcome()
                    raise RuntimeError("the server answered before receiving the whole update")
                continue
            sent = conn.send(view)
            view = view[sent:]

    def _send_nccl(self, tensors, buckets, call: _Call) -> None:
        import torch
        dev = self.device
        largest = max(n for n, _ in buckets)
        with torch.cuda.device(dev):
            stream = torch.cuda.current_stream(dev)
            staging = torch.empty(max(largest, 1), dtype=torch.uint8, device=dev)
            first = 0
            for nbytes, offsets in buckets:
                for j, at in enumerate(offsets):
                    t = tensors[first + j]
                    src = t.value.to(dev, non_blocking=True).reshape(-1).view(torch.uint8)
                    staging[at:at + t.nbytes].copy_(src)
                first += len(offsets)
                self._nccl.check(self._nccl.lib.ncclBroadcast(
                    ctypes.c_void_p(staging.data_ptr()), ctypes.c_void_p(staging.data_ptr()), nbytes,
                    _Nccl.UINT8, 0, self._comm, ctypes.c_void_p(stream.cuda_stream)), "ncclBroadcast")
            done = torch.cuda.Event()
            done.record(stream)
            while not done.query():
                if not call.is_alive() and call.error is not None:
                    # The server answered an error. If it drained the buckets, the
                    # broadcast completes at once; otherwise NCCL would wait forever.
                    for _ in range(100):
                        if done.query():
                            return
                        call.join(0.01)
                    raise call.error
                call.join(0.01)


def _send_frame(conn: socket.socket, ftype: int, payload: bytes) -> None:
    conn.sendall(struct.pack("<IIQ", ftype, 0, len(payload)) + payload)


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the server closed the weight-group connection")
        out += chunk
    return bytes(out)


def _recv_frame(conn: socket.socket) -> Tuple[int, bytes]:
    ftype, _, n = struct.unpack("<IIQ", _recv_exact(conn, 16))
    if n > (1 << 20):
        raise ConnectionError(f"a {n}-byte message where a hello was due")
    return ftype, _recv_exact(conn, n)
