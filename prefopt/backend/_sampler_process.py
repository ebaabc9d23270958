"""The native sampler in its own process: sampling runs while the training process updates.

A :class:`SamplerProcess` starts one process (``torch.multiprocessing``, from a
forkserver where there is one, else spawned; never a plain fork of a process whose
threads hold locks) that holds its own copy of the policy, sent once by value, and
answers sampling requests in order. The weights travel through shared memory: the
parent copies its ``state_dict`` into a free slot of a ring of flat shared buffers
(one a dtype, so a few file descriptors) and names the slot in its request; the
child loads it before it samples. A slot is held until its request is answered, so
the parent never writes one the child may still read, and no lock is needed.

A request may carry a generator state (the child samples from it and returns
the state after: the caller's random stream, as if it had sampled itself) or
a seed (the child's own stream); requests and replies travel by value. A child
that dies, even mid-reply, or a request that fails in it raises
:class:`SamplerProcessError` in the parent within ``poll`` seconds, never a hang.
"""

from __future__ import annotations

import copy
import pickle
import time
import traceback

import numpy as np
import torch
import torch.multiprocessing as mp

from .._config import get_config, set_config
from .generation import EncodedPrompts
from .samplers import NativeSampler, Samples

__all__ = ["SamplerProcess", "SamplerProcessError"]


class SamplerProcessError(RuntimeError):
    """The sampler process died, or a sampling request failed in it.

    Examples
    --------
    >>> issubclass(SamplerProcessError, RuntimeError)
    True
    """


def _layout(state: dict) -> tuple[list, dict]:
    """Where each tensor of a ``state_dict`` sits in one flat buffer per dtype."""
    layout, sizes = [], {}
    for name, tensor in state.items():
        dtype = tensor.dtype
        layout.append((name, dtype, sizes.get(dtype, 0), tuple(tensor.shape)))
        sizes[dtype] = sizes.get(dtype, 0) + tensor.numel()
    return layout, sizes


def _views(flat: dict, layout: list) -> dict:
    """The ``state_dict`` a slot's flat buffers hold, as views into them."""
    out = {}
    for name, dtype, offset, shape in layout:
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        out[name] = flat[dtype][offset : offset + n].view(shape)
    return out


def _serve(payload, buffers, layout, requests, replies, threads, config, generator_device,
           device):  # fmt: skip
    """The child's loop: load the named weights, sample, reply; ``None`` ends it."""
    torch.set_num_threads(threads)
    set_config(**config)
    # By value: its own copy (non-persistent buffers too), on the training model's device.
    model = pickle.loads(payload).to(device)
    slots = [_views(flat, layout) for flat in buffers]
    sampler = NativeSampler()
    generator = torch.Generator(device=generator_device)
    while True:
        request = requests.get()
        if request is None:
            return
        number = request["number"]
        try:
            start = time.perf_counter()
            model.load_state_dict(slots[request["slot"]])
            if request["generator_state"] is not None:
                generator.set_state(torch.from_numpy(request["generator_state"]))
            elif request.get("seed") is not None:
                generator.manual_seed(request["seed"])
            ids, mask, index = (
                None if a is None else torch.from_numpy(a).to(device) for a in request["tensors"]
            )
            with torch.inference_mode():
                out = sampler.sample(model, EncodedPrompts(ids, mask), generator=generator,
                                     prompt_index=index, **request["options"])  # fmt: skip
            tensors = (out.response_ids, out.response_mask, out.ended, out.logprobs)
            # By value (numpy), not through shared memory: a reply must not need this
            # process alive to be read.
            replies.send(
                {
                    "number": number,
                    "samples": tuple(t.to("cpu").numpy().copy() for t in tensors),
                    "generator_state": generator.get_state().numpy().copy(),
                    "seconds": time.perf_counter() - start,
                }
            )
        except BaseException:  # noqa: BLE001 - every failure goes back to the parent, said
            replies.send({"number": number, "error": traceback.format_exc()})


def _context(model):
    """Forkserver where the platform has it (Linux, macOS), else spawn.

    Never a plain fork: the training process has threads (torch's pools) whose locks a
    fork copies. The forkserver is a clean process that imports prefopt, the script
    (``__main__``, as spawn would) and the model's module once (preloaded), so every
    later sampler forks from it in milliseconds instead of importing torch anew
    (seconds): a search's or a test suite's many fits pay the start once.
    """
    if "forkserver" in mp.get_all_start_methods():
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(["__main__", __name__, type(model).__module__])
        return context
    return mp.get_context("spawn")


class SamplerProcess:
    """prefopt's native sampler in a separate process, fed weights through shared memory.

    Parameters
    ----------
    model : torch.nn.Module
        The policy; a copy of it goes to the child, on the policy's device (the
        CPU or a CUDA device: both processes then share the GPU), which loads the
        pushed weights (through the CPU's shared memory) before each request.
    n_buffers : int, default=2
        Weight buffers in the ring: at least the requests in flight plus one.
    threads : int, default=None
        The child's torch threads; ``None``: the parent's ``torch.get_num_threads()``.
    poll : float, default=0.5
        Seconds between the parent's checks that the child is alive while it waits.
    generator_device : str, default="cpu"
        The device of the child's random generator (the run's generator's).
    """

    def __init__(self, model, *, n_buffers: int = 2, threads=None, poll: float = 0.5,
                 generator_device: str = "cpu"):  # fmt: skip
        self.poll = float(poll)
        self.n_buffers = int(n_buffers)
        # The weights travel in one flat shared buffer per dtype and slot (a handful of file
        # descriptors, where one a tensor would pass the forkserver's limit of 256).
        # On a GPU the buffers stay in the CPU's shared memory: a push copies the weights
        # device to host, the child's load host to device (CUDA tensors shared between
        # processes would have to outlive every reader, and a ring of them the same).
        self.device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.layout, sizes = _layout(model.state_dict())
        self.buffers = [
            {dtype: torch.zeros(n, dtype=dtype).share_memory_() for dtype, n in sizes.items()}
            for _ in range(self.n_buffers)
        ]
        self.views = [_views(flat, self.layout) for flat in self.buffers]
        # The parameters keep requires_grad as the training process has them: the child
        # samples under inference_mode anyway, and a frozen weight takes another CPU kernel
        # path (one ulp apart in the log-probs), which would part staleness 0 from a
        # synchronous fit.
        shadow = copy.deepcopy(model).eval()
        payload = pickle.dumps(shadow.cpu())  # by value, once: the child's own copy
        del shadow
        context = _context(model)
        self.requests = context.Queue()
        # Replies through a one-way pipe whose writing end only the child holds: when it
        # dies, even mid-reply, reading ends with EOFError instead of waiting forever.
        self.replies, writer = context.Pipe(duplex=False)
        threads = torch.get_num_threads() if threads is None else int(threads)
        self.process = context.Process(
            target=_serve,
            args=(
                payload,
                self.buffers,
                self.layout,
                self.requests,
                writer,
                threads,
                get_config(),
                str(generator_device),
                str(self.device),
            ),  # fmt: skip
            daemon=True,  # never outlives the parent
            name="prefopt-sampler",
        )
        self.process.start()
        writer.close()
        self.submitted = 0
        self.received: dict = {}
        self.slots: dict = {}  # request number -> the buffer holding its weights

    def _push(self, model, number: int) -> int:
        """Copy ``model``'s weights into a free buffer, held by request ``number``."""
        used = set(self.slots.values())
        slot = next((i for i in range(self.n_buffers) if i not in used), None)
        if slot is None:  # a caller's bug: more requests in flight than buffers
            raise RuntimeError(
                f"{self.n_buffers} sampling requests are in flight, one per weight buffer; "
                "receive one before submitting another."
            )
        self.slots[number] = slot
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                self.views[slot][name].copy_(tensor)
        return slot

    def submit(self, model, prompts, *, generator_state=None, seed=None, prompt_index=None,
               **options) -> int:  # fmt: skip
        """Queue one sampling request with ``model``'s current weights; returns its number.

        The weights are copied into a free buffer of the ring now, so the caller
        may update ``model`` at once. ``generator_state`` (the caller's stream) or
        ``seed`` (the child's own stream, reseeded) set the child's generator
        first; neither: it draws on. ``options`` are
        :meth:`NativeSampler.sample`'s (``max_new_tokens``, ``temperature``, ...).
        """
        self._check_alive()
        number = self.submitted
        self.submitted += 1
        slot = self._push(model, number)
        tensors = (prompts.input_ids, prompts.attention_mask, prompt_index)
        state = None if generator_state is None else generator_state.cpu().numpy().copy()
        self.requests.put(  # by value (numpy): no descriptors to pass, nothing to keep alive
            {
                "number": number,
                "slot": slot,
                "tensors": tuple(
                    None if t is None else torch.as_tensor(t).cpu().numpy().copy() for t in tensors
                ),
                "generator_state": state,
                "seed": seed,
                "options": options,
            }
        )
        return number

    def receive(self, number: int):
        """Wait for request ``number``: ``(Samples, generator state after, seconds)``.

        Raises :class:`SamplerProcessError` when the child died or the request
        failed in it; the wait is bounded by how soon a dead child is noticed
        (``poll`` seconds).
        """
        while number not in self.received:
            try:
                if not self.replies.poll(self.poll):
                    self._check_alive()
                    continue
                reply = self.replies.recv()
            except (EOFError, OSError):  # the child died, perhaps mid-reply
                self._check_alive(wait=True)
                raise
            if "error" in reply:
                self.close()
                raise SamplerProcessError(
                    f"Sampling request {reply['number']} failed in the sampler process "
                    f"(max_staleness): its traceback follows.\n{reply['error']}"
                )
            self.received[reply["number"]] = reply
        reply = self.received.pop(number)
        self.slots.pop(number, None)  # its buffer is free again
        ids, mask, ended, logprobs = (torch.from_numpy(t).to(self.device) for t in reply["samples"])
        state = torch.from_numpy(reply["generator_state"])
        return Samples(ids, mask, ended, logprobs), state, reply["seconds"]

    def _check_alive(self, wait: bool = False) -> None:
        if self.process is None:
            raise SamplerProcessError("The sampler process of this fit was closed.")
        if wait:  # its pipe closed: it is ending
            self.process.join(timeout=5 * self.poll)
        if not self.process.is_alive():
            code = self.process.exitcode
            self.close()
            raise SamplerProcessError(
                f"The sampler process of this fit (max_staleness) ended with exit code {code} "
                "while the fit waited for its samples (killed, out of memory, or crashed); the "
                "fit stops here. Its checkpoint, if any, is intact: fit again to resume, or "
                "set max_staleness=None to sample in the training process."
            )

    def close(self) -> None:
        """End the child (a clean stop, else terminate it); safe to call twice."""
        process = getattr(self, "process", None)
        if process is None:
            return
        if process.is_alive():
            try:
                self.requests.put(None)
            except (OSError, ValueError):
                pass
            process.join(timeout=0.2)  # a clean stop is quick; interpreter exit is not
            if process.is_alive():
                process.terminate()  # it holds nothing to clean up: its tensors are shared
                process.join(timeout=5 * self.poll)
        self.requests.cancel_join_thread()
        self.requests.close()
        self.replies.close()
        self.process = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the queues may be gone
            pass
