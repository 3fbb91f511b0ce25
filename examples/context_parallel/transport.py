"""How K/V blocks travel around the ring: one call, ``shift``, for every rank this process drives.

Contract of ``shift(sends, recvs, streams)`` (``sends[r]`` and ``recvs[r]``: lists of contiguous
arrays of rank r, ``streams[r]``: its communication stream), for each rank r of ``local_ranks``:

* rank r's ``sends[r][i]`` reaches rank (r+1) mod N's ``recvs[r+1][i]`` (so ``recvs[r]`` fills
  from rank r-1), byte for byte;
* the transfer starts after everything queued before on ``streams`` of both ranks, and
  everything queued afterwards on those streams waits for it (a send buffer may be overwritten,
  a receive buffer read, by later work of that stream);
* the host does not wait: it only queues.

``LocalTransport`` keeps every rank in this process (one device or several) and moves blocks by
device copies; ``NcclTransport`` by NCCL's (RCCL's on ROCm) send/recv through CuPy.

The choice for NCCL: ONE process drives all N devices, with a group call (``groupStart`` ..
``groupEnd``) around every rank's send and receive of a step.  The ring driver then is the same
loop over local ranks for the simulation and for NCCL, on the emulator and on GPUs; the
communicators come from ``NcclCommunicator.initAll`` with no launcher or unique-id exchange;
and one host thread queuing a few calls per rank and step is nothing next to steps of
milliseconds.  A process-per-GPU launch (several hosts) differs only in the communicator, one
local rank a process: ``NcclTransport.one_rank``.
"""

from __future__ import annotations


class LocalTransport:
    """All N ranks in this process: rank r lives on ``devices[r]`` (the same device for all, to
    simulate a ring on one device, or one each).  A step's copies run on one transport stream of
    ``devices[0]`` that waits for every rank's stream first and is waited for by each afterwards:
    both sides of every transfer ordered as NCCL orders them."""

    def __init__(self, devices: list):
        self.devices = list(devices)
        self.n_ranks = len(self.devices)
        self.local_ranks = list(range(self.n_ranks))
        self._stream = self.devices[0].stream()

    def device(self, rank: int):
        return self.devices[rank]

    def shift(self, sends: dict, recvs: dict, streams: dict) -> None:
        n, hub = self.n_ranks, self.devices[0]
        for r in self.local_ranks:
            ready = self.devices[r].event()
            self.devices[r].record(ready, streams[r])
            hub.wait(self._stream, ready)
        for r in self.local_ranks:
            src = sends[(r - 1) % n]
            if len(src) != len(recvs[r]):
                raise ValueError(f"rank {(r - 1) % n} sends {len(src)} blocks, rank {r} receives {len(recvs[r])}")
            for s, d in zip(src, recvs[r]):
                hub.copy(d, s, self._stream)
        done = hub.event()
        hub.record(done, self._stream)
        for r in self.local_ranks:
            self.devices[r].wait(streams[r], done)


class NcclTransport:
    """NCCL send/recv through ``cupy.cuda.nccl`` (RCCL under CuPy's ROCm build: the same API).
    ``comms[r]``: the communicator of local rank r; ``devices[r]``: its CupyDevice."""

    def __init__(self, n_ranks: int, devices: dict, comms: dict):
        from cupy.cuda import nccl
        self.nccl = nccl
        self.n_ranks = n_ranks
        self.devices, self.comms = devices, comms
        self.local_ranks = sorted(devices)

    @classmethod
    def single_process(cls, ordinals: list[int]) -> "NcclTransport":
        """Rank r on GPU ``ordinals[r]``, every rank driven by this process."""
        from cupy.cuda import nccl

        from .devices import CupyDevice
        comms = nccl.NcclCommunicator.initAll(list(ordinals))
        return cls(len(ordinals), {r: CupyDevice(o) for r, o in enumerate(ordinals)}, dict(enumerate(comms)))

    @classmethod
    def one_rank(cls, n_ranks: int, rank: int, unique_id: tuple, ordinal: int) -> "NcclTransport":
        """This process's one rank of a process-per-GPU ring (``unique_id``: rank 0's
        ``nccl.get_unique_id()``, handed to every process by the launcher)."""
        from cupy.cuda import nccl

        from .devices import CupyDevice
        device = CupyDevice(ordinal)
        with device.device:
            comm = nccl.NcclCommunicator(n_ranks, unique_id, rank)
        return cls(n_ranks, {rank: device}, {rank: comm})

    def device(self, rank: int):
        return self.devices[rank]

    def shift(self, sends: dict, recvs: dict, streams: dict) -> None:
        n, nccl = self.n_ranks, self.nccl
        nccl.groupStart()
        try:
            for r in self.local_ranks:
                comm = self.comms[r]
                for buf in sends[r]:
                    comm.send(buf.data.ptr, buf.nbytes, nccl.NCCL_UINT8, (r + 1) % n, streams[r].ptr)
                for buf in recvs[r]:
                    comm.recv(buf.data.ptr, buf.nbytes, nccl.NCCL_UINT8, (r - 1) % n, streams[r].ptr)
        finally:
            nccl.groupEnd()
